"""The benchmark's HAL model builders (benchmarks/hal_models.py) make valid models that the
TFLite exporter writes; no timing here."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

# The benchmarks folder is not part of the installed package: found from the checkout, after
# everything installed (so an installed nnhal still wins over the checkout's).
sys.path.append(str(Path(__file__).resolve().parents[1]))
from benchmarks import hal_models as H  # noqa: E402
from nnhal.analysis import analyse  # noqa: E402
from nnhal.hal.types import OperandLifeTime, OperandType, OperationType  # noqa: E402
from nnhal.tflite import read_tflite, write_tflite  # noqa: E402


def _op_counts(model) -> Counter:
    return Counter(OperationType(op.type) for op in model.main.operations)


def test_mobilenet_v2_float_is_the_real_architecture_and_exports():
    model = H.mobilenet_v2_float()
    graph = analyse(model)  # raises on an invalid model
    counts = _op_counts(model)
    assert counts[OperationType.DEPTHWISE_CONV_2D] == 17
    # stem + 16 expansions (the first block has none) + 17 projections + the 1280 head
    assert counts[OperationType.CONV_2D] == 1 + 16 + 17 + 1
    assert counts[OperationType.ADD] == 10
    assert counts[OperationType.AVERAGE_POOL_2D] == 1
    assert counts[OperationType.FULLY_CONNECTED] == 1
    assert counts[OperationType.SOFTMAX] == 1
    out = model.main.output_indexes[0]
    assert graph.main.shapes[out] == (1, 1000)
    imported = read_tflite(write_tflite(model))
    assert _op_counts(imported.model)[OperationType.DEPTHWISE_CONV_2D] == 17


def test_weights_are_seeded():
    a, b = H.mobilenet_v2_layers(3), H.mobilenet_v2_layers(3)
    c = H.mobilenet_v2_layers(4)
    assert np.array_equal(a[0].weights, b[0].weights)
    assert not np.array_equal(a[0].weights, c[0].weights)


def test_mobilenet_v2_int8_is_full_integer_and_exports():
    model, x, quant = H.mobilenet_v2_int8()
    analyse(model)
    assert x.dtype == np.int8 and x.shape == (1, 224, 224, 3)
    ops = model.main.operands
    per_channel = [o for o in ops if o.type == OperandType.TENSOR_QUANT8_SYMM_PER_CHANNEL]
    assert len(per_channel) == 35 + 17
    assert all(o.extra_params.channel_dim == (0 if o.dimensions[0] != 1 else 3)
               for o in per_channel)
    for o in ops:
        if o.lifetime in (OperandLifeTime.TEMPORARY_VARIABLE, OperandLifeTime.SUBGRAPH_INPUT,
                          OperandLifeTime.SUBGRAPH_OUTPUT):
            assert o.type == OperandType.TENSOR_QUANT8_ASYMM_SIGNED
            assert 0 < o.scale and -128 <= o.zero_point <= 127
    assert not any(o.type == OperandType.TENSOR_FLOAT32 for o in ops)
    probs = ops[model.main.output_indexes[0]]
    assert (probs.scale, probs.zero_point) == (1 / 256, -128)
    assert len(model.main.output_indexes) == 2  # softmax, then the logits
    assert len(write_tflite(model)) > 3_000_000


def test_int8_runs_on_litert():
    interp_mod = pytest.importorskip("ai_edge_litert.interpreter")
    model, x, _ = H.mobilenet_v2_int8()
    interp = interp_mod.Interpreter(model_content=write_tflite(model), num_threads=1)
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    outs = [interp.get_tensor(d["index"]) for d in interp.get_output_details()]
    assert all(o.dtype == np.int8 and o.shape == (1, 1000) for o in outs)
