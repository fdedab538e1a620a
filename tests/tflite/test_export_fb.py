"""The exporter's flatbuffer writer (nnhal.tflite.export_fb): its lean builder writes the very
bytes flatbuffers.Builder writes, for real models of many operator and option kinds."""

from __future__ import annotations

from pathlib import Path

import flatbuffers
import pytest

from nnhal.analysis import analyse
from nnhal.errors import NnhalError
from nnhal.tflite.export_fb import serialise
from nnhal.tflite.exporter import convert_model
from nnhal.tflite.importer import read_tflite

DATA = Path(__file__).parent / "data"
MODELS = ["bmm_int8.tflite", "bool_reshape_if.tflite", "floor_div_mod.tflite",
          "mirror_pad_int8.tflite", "pack_f32.tflite",
          "reverse_int8.tflite", "select_v2_broadcast_int8.tflite",
          "selfie_segmentation.tflite"]


@pytest.mark.parametrize("name", MODELS)
def test_the_lean_builder_writes_flatbuffers_bytes(name):
    try:
        imported = read_tflite(DATA / name)
    except NnhalError as e:  # an extension this build lacks
        pytest.skip(f"{name}: {e}")
    graph = analyse(imported.model, own_constants=False)
    for exact in (False, True):
        converted, refused = convert_model(graph, list(imported.input_names),
                                           list(imported.output_names), exact_resize=exact)
        if refused:
            pytest.skip(f"{name}: not exportable: {refused[0]}")
        for outside in (False, True):
            want = serialise(converted, data_outside=outside, builder=flatbuffers.Builder)
            assert serialise(converted, data_outside=outside) == want, (name, exact, outside)


def test_out_of_range_scalars_still_raise():
    from nnhal.tflite.export_fb import ModelDef, OperatorDef, SubgraphDef, TensorDef

    sg = SubgraphDef("main", [TensorDef("x", [1], 0), TensorDef("y", [1], 0)],
                     [OperatorDef(0, [0], [1], "AddOptions", {"FusedActivationFunction": 300})],
                     [0], [1])
    with pytest.raises(Exception):  # noqa: B017,PT011 - flatbuffers' error or struct's
        serialise(ModelDef([sg]), builder=flatbuffers.Builder)
    with pytest.raises(Exception):  # noqa: B017,PT011
        serialise(ModelDef([sg]))


def test_per_channel_scales_written_from_arrays_are_the_same_bytes():
    """Per-channel scales (filters, and the biases' implicit ones) go to the builder as arrays
    when the exporter set them (TensorDef.arrays): the very bytes of the lists' path."""
    import numpy as np

    from nnhal.hal.builder import ModelBuilder
    from nnhal.hal.types import OperandType as T
    from nnhal.hal.types import OperationType as O
    from nnhal.hal.types import SymmPerChannelQuantParams

    rng = np.random.default_rng(7)
    b = ModelBuilder()
    x = b.input(T.TENSOR_QUANT8_ASYMM_SIGNED, [1, 4, 4, 3], 0.5, 1)
    for k in range(2):
        scales = [float(s) for s in rng.uniform(1e-3, 1e-2, 3).astype(np.float32)]
        w = b.constant(T.TENSOR_QUANT8_SYMM_PER_CHANNEL,
                       rng.integers(-127, 128, (3, 1, 1, 3), dtype=np.int8),
                       channel_quant=SymmPerChannelQuantParams(scales, 0))
        bias = b.constant(T.TENSOR_INT32, rng.integers(-100, 100, 3, dtype=np.int32))
        y = (b.output if k else b.operand)(T.TENSOR_QUANT8_ASYMM_SIGNED, [1, 4, 4, 3], 0.25, -3)
        b.operation(O.CONV_2D, [x, w, bias, *(b.scalar(T.INT32, v) for v in (1, 1, 1, 0))],
                    [y])
        x = y
    graph = analyse(b.build(), own_constants=False)
    converted, refused = convert_model(graph, ["x"], ["y"])
    assert not refused
    with_arrays = [t for t in converted.subgraphs[0].tensors if t.quant_arrays() is not None]
    assert len(with_arrays) == 4  # two filters, two biases
    for outside in (False, True):
        want = serialise(converted, data_outside=outside, builder=flatbuffers.Builder)
        assert serialise(converted, data_outside=outside) == want
    # A list replaced after the fact is what is written, not the arrays of the old one.
    t = with_arrays[0]
    t.scales = [s * 2 for s in t.scales]
    assert t.quant_arrays() is None
    assert serialise(converted) == serialise(converted, builder=flatbuffers.Builder)


@pytest.mark.parametrize("small_first", [False, True])
def test_constants_placed_in_a_frame_hold_their_bytes(tmp_path, small_first):
    """In a frame (nnhal.memory.frame), constants that do not lie there are written after the
    tables: the small ones with the tables in one write, a large one on its own. Each Buffer
    must then point at its very bytes, whatever the order of small and large ones."""
    import numpy as np
    import tflite

    from nnhal.hal.builder import ModelBuilder
    from nnhal.hal.types import OperandType as T
    from nnhal.hal.types import OperationType as O
    from nnhal.memory.frame import MIN_FRAMED
    from nnhal.tflite.export_fb import _SMALL_CONSTANT
    from nnhal.tflite.exporter import _frame_locator, write_tflite

    rng = np.random.default_rng(5)
    # [large, small, small, small] or [small, small, large, large] constants.
    dims = [16, 8, 33_000] if small_first else [512, 640, 10]
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, [2, dims[0]])
    for k in (1, 2):
        y = (b.output if k == 2 else b.operand)(T.TENSOR_FLOAT32, [2, dims[k]])
        b.operation(O.FULLY_CONNECTED, [
            x, b.constant(T.TENSOR_FLOAT32,
                          rng.standard_normal((dims[k], dims[k - 1])).astype(np.float32)),
            b.constant(T.TENSOR_FLOAT32, rng.standard_normal(dims[k]).astype(np.float32)),
            b.scalar(T.INT32, 0)], [y])
        x = y
    path = tmp_path / "m.tflite"
    path.write_bytes(write_tflite(b.build()))
    assert path.stat().st_size > MIN_FRAMED
    imported = read_tflite(path)
    converted, refused = convert_model(analyse(imported.model, own_constants=False),
                                       ["x"], ["y"])
    assert not refused
    framed = _frame_locator(imported.model)
    assert framed is not None
    frame, _ = framed
    sizes = [d.nbytes for d in converted.buffers if len(d)]
    large = [n > _SMALL_CONSTANT for n in sizes]
    assert large == ([False, False, True, True] if small_first else
                     [True, False, False, False])
    out = serialise(converted, data_outside=True, frame=(frame, lambda d: None))
    assert out is frame.buffer
    model = tflite.Model.GetRootAsModel(out, 0)
    for k, want in enumerate(converted.buffers):
        buf = model.Buffers(k)
        if not len(want):
            assert buf.Offset() == 0
            continue
        got = bytes(out[buf.Offset():buf.Offset() + buf.Size()])
        assert got == np.ascontiguousarray(want).tobytes(), k
