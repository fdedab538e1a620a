"""Opening a model costs work in proportion to its operations, never to its weights:
reading (``read_tflite``), analysing and exporting (``write_tflite``) a chain of per-channel
int8 convolutions run the same number of Python calls whatever the channel count (the
weights grow 64-fold), and about four times as many for four times the layers. Counted
with a profile hook, never timed. And the LiteRT driver's support rules (an export's worth of
work) run once per analysed graph, not again at prepare."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from nnhal.hal.builder import ModelBuilder
from nnhal.hal.types import Model, SymmPerChannelQuantParams
from nnhal.hal.types import OperandType as T
from nnhal.hal.types import OperationType as O
from nnhal.tflite import read_tflite, write_tflite


def conv_chain(layers: int, channels: int) -> Model:
    """``layers`` 1x1 int8 CONV_2D with per-channel filters, [1, 4, 4, channels] each."""
    rng = np.random.default_rng(layers * 1000 + channels)
    b = ModelBuilder()
    shape = [1, 4, 4, channels]
    x = b.input(T.TENSOR_QUANT8_ASYMM_SIGNED, shape, 0.5, 0)
    for k in range(layers):
        scales = list(map(float, rng.uniform(0.001, 0.01, channels)))
        w = b.constant(T.TENSOR_QUANT8_SYMM_PER_CHANNEL,
                       rng.integers(-127, 128, (channels, 1, 1, channels), dtype=np.int8),
                       channel_quant=SymmPerChannelQuantParams(scales, 0))
        bias = b.constant(T.TENSOR_INT32, rng.integers(-100, 100, channels, dtype=np.int32))
        y = b.output(T.TENSOR_QUANT8_ASYMM_SIGNED, shape, 0.5, 0) if k == layers - 1 else \
            b.operand(T.TENSOR_QUANT8_ASYMM_SIGNED, shape, 0.5, 0)
        b.operation(O.CONV_2D, [x, w, bias, b.scalar(T.INT32, 1), b.scalar(T.INT32, 1),
                                b.scalar(T.INT32, 1), b.scalar(T.INT32, 0)], [y])
        x = y
    return b.build()


def calls(fn) -> int:
    """Python function calls made while ``fn`` runs (this thread)."""
    n = 0

    def hook(frame, event, arg):
        nonlocal n
        if event == "call":
            n += 1

    old = sys.getprofile()
    sys.setprofile(hook)
    try:
        fn()
    finally:
        sys.setprofile(old)
    return n


def open_work(layers: int, channels: int) -> int:
    """Calls to export a fresh HAL model (analysing it) and read the file back (converting,
    building and analysing the imported model)."""
    model = conv_chain(layers, channels)
    data = write_tflite(model)  # warm: first-use caches and imports are not the model's work
    read_tflite(data)
    model = conv_chain(layers, channels)
    return calls(lambda: read_tflite(write_tflite(model)))


def test_reading_and_exporting_do_no_work_per_weight():
    """64 times the channels (4096 times the filter bytes, 64 times the scales): no more
    Python calls. Per-element work (a loop over scales, a list of weights) would multiply."""
    small, big = open_work(3, 4), open_work(3, 256)
    assert big <= small * 1.05 + 100, (small, big)


def test_reading_and_exporting_are_linear_in_the_operations():
    one, four = open_work(4, 8), open_work(16, 8)
    assert 3 * one <= four <= 4.5 * one, (one, four)


def test_litert_support_rules_run_once_per_graph():
    """getSupportedOperations and prepareModel on the LiteRT driver read the same analysed
    graph; the exporter's probe behind its support rules runs for the first only."""
    pytest.importorskip("ai_edge_litert")
    import nnhal.drivers.litert.support as support
    from nnhal import Session

    probes = []
    real = support._export_refusals

    def counted(graph):
        probes.append(graph)
        return real(graph)

    support._export_refusals = counted
    try:
        with Session(conv_chain(2, 8), devices=["litert"]) as s:
            assert s.device_name == "litert"
    finally:
        support._export_refusals = real
    assert len(probes) == 1


def test_litert_prepare_writes_what_its_support_probe_converted():
    """The probe behind the LiteRT driver's support rules is the driver's own export,
    converted once: prepareModel serialises that conversion instead of converting again, and
    writes exactly the bytes a fresh export writes."""
    pytest.importorskip("ai_edge_litert")
    import nnhal.tflite.exporter as exporter
    from nnhal import Session
    from nnhal.analysis import analyse

    conversions, written = [], []
    real_convert, real_serialise = exporter.convert_model, exporter.serialise

    def counted(*a, **k):
        conversions.append(a[0])
        return real_convert(*a, **k)

    def kept(model, **k):
        written.append(real_serialise(model, **k))
        return written[-1]

    model = conv_chain(3, 8)
    import nnhal.drivers.litert.support as support
    support_convert = support.convert_model
    exporter.convert_model = support.convert_model = counted
    exporter.serialise = kept
    try:
        with Session(model, devices=["litert"]) as s:
            assert s.device_name == "litert"
    finally:
        exporter.convert_model, support.convert_model = real_convert, support_convert
        exporter.serialise = real_serialise
    assert len(conversions) == 1 and len(written) == 1
    fresh = write_tflite(model, graph=analyse(model, own_constants=False), data_outside=True,
                         exact_resize=True)
    assert written[0] == fresh


def test_weights_after_the_flatbuffer_are_the_same_model():
    """``data_outside`` (what the LiteRT driver writes) puts the weights after the flatbuffer,
    16-aligned, each Buffer naming its offset and size: nnhal reads the same model back, and
    ai-edge-litert computes exactly what it computes from the usual layout."""
    model = conv_chain(3, 64)
    inside, outside = write_tflite(model), write_tflite(model, data_outside=True)
    again = read_tflite(outside).model
    assert [(o.type, o.inputs, o.outputs) for o in again.main.operations] == \
        [(o.type, o.inputs, o.outputs) for o in read_tflite(inside).model.main.operations]
    import tflite

    root = tflite.Model.GetRootAsModel(outside, 0)
    placed = [root.Buffers(k) for k in range(root.BuffersLength())]
    placed = [(b.Offset(), b.Size()) for b in placed if b.Size()]
    assert len(placed) == 6 and all(b.DataLength() == 0 for b in
                                    (root.Buffers(k) for k in range(root.BuffersLength())))
    ends = sorted(placed)
    assert all(off % 16 == 0 and off + size <= len(outside) for off, size in ends)
    assert all(a[0] + a[1] <= b[0] for a, b in zip(ends, ends[1:]))  # no overlap
    assert sum(size for _, size in placed) == 3 * (64 * 64 + 64 * 4)
    interpreter = pytest.importorskip("ai_edge_litert.interpreter")
    x = np.random.default_rng(0).integers(-128, 128, (1, 4, 4, 64), dtype=np.int8)
    outs = []
    for data in (inside, outside):
        it = interpreter.Interpreter(model_content=data)
        it.allocate_tensors()
        it.set_tensor(it.get_input_details()[0]["index"], x)
        it.invoke()
        outs.append(it.get_tensor(it.get_output_details()[0]["index"]).copy())
    assert np.array_equal(outs[0], outs[1])
