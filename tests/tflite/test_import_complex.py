"""Data movement of complex64 through org.nnhal.tflite (BirdNET's STFT: RFFT2D, SQUEEZE, CAST
to float32): imported as the extension's operations where the HAL's forms take no extension
operand, run by the reference driver and, exported back as the TFLite builtins, by LiteRT;
compared with ai-edge-litert on the original file. Bad operations are refused, not run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import assert_reference_refuses
from runner import assert_agree, litert, litert_run

from nnhal.session import Session
from nnhal.tflite import read_tflite

pytest.importorskip("ai_edge_litert.interpreter")

DATA = Path(__file__).resolve().parent / "data"
MOVEMENT = DATA / "complex_movement.tflite"
F = np.float32


def _ext_ops(imported) -> list[str]:  # type: ignore[no-untyped-def]
    from nnhal.hal.types import is_extension_type
    from nnhal.ops.extensions import operation_name

    table = imported.model.extension_name_to_prefix
    return [operation_name(op.type, table) for op in imported.model.main.operations
            if is_extension_type(op.type)]


def _x(shape, seed: int) -> np.ndarray:  # type: ignore[no-untyped-def]
    return np.random.default_rng(seed).uniform(-3, 3, shape).astype(F)


def test_converter_model_imports_and_agrees_on_every_path() -> None:
    imported = read_tflite(MOVEMENT)
    ops = _ext_ops(imported)
    assert "org.nnhal.tflite:CAST" in ops and "org.nnhal.tflite:RESHAPE" in ops, ops
    from nnhal.tools.info import plan_info

    steps = plan_info(imported)
    assert [s["device"] for s in steps] == ["litert"], steps  # exported whole
    for device in ("reference", "litert", None):
        with (Session(str(MOVEMENT), device) if device else Session(str(MOVEMENT))) as s:
            for seed in range(3):
                x = _x((3, 4, 16), seed)
                want = litert_run(litert(str(MOVEMENT)), [x])
                assert_agree(list(s.run([x]).values()), want, f"{device} seed {seed}")


def _movement_graph(name: str):  # type: ignore[no-untyped-def]
    """RFFT2D of x [2, 1, 8] (complex64 [2, 1, 5]), one data movement, then REAL."""
    from tfl import Graph, build
    from tflite.TensorType import TensorType as TT

    g = Graph()
    x = g.input((2, 1, 8), F)
    z = g.tensor((2, 1, 5), TT.COMPLEX64)
    g.op("RFFT2D", [x, g.const(np.array([1, 8], np.int32))], [z])
    if name == "SQUEEZE":
        shape = (2, 5)
        y = g.tensor(shape, TT.COMPLEX64)
        g.op("SQUEEZE", [z], [y], ("SqueezeOptions", {"SqueezeDims": [1]}))
    elif name == "EXPAND_DIMS":
        shape = (2, 1, 1, 5)
        y = g.tensor(shape, TT.COMPLEX64)
        g.op("EXPAND_DIMS", [z, g.const(np.array(-2, np.int32))], [y])
    elif name == "TRANSPOSE":
        shape = (5, 1, 2)
        y = g.tensor(shape, TT.COMPLEX64)
        g.op("TRANSPOSE", [z, g.const(np.array([2, 1, 0], np.int32))], [y])
    else:
        shape = (2, 1, 3)
        y = g.tensor(shape, TT.COMPLEX64)
        g.op("SLICE", [z, g.const(np.array([0, 0, 1], np.int32)),
                       g.const(np.array([-1, 1, 3], np.int32))], [y])
    r = g.tensor(shape, F)
    g.op("REAL", [y], [r])
    g.output(r)
    return build(g)


@pytest.mark.parametrize("name", ["SQUEEZE", "EXPAND_DIMS", "TRANSPOSE", "SLICE"])
def test_each_movement_agrees_with_litert_on_both_drivers(name: str) -> None:
    data = _movement_graph(name)
    assert f"org.nnhal.tflite:{name}" in _ext_ops(read_tflite(data))
    x = _x((2, 1, 8), 7)
    want = litert_run(litert(data), [x])
    for device in ("reference", "litert"):
        with Session(data, device) as s:
            got = list(s.run([x]).values())
        assert_agree(got, want, f"{name} on {device}")
        np.testing.assert_allclose(got[0], want[0], rtol=0, atol=1e-5)


def test_squeeze_of_float_stays_the_hal_operation() -> None:
    """The HAL's form runs on more devices: only complex64 goes to the extension."""
    from tfl import Graph, build

    g = Graph()
    x = g.input((2, 1, 3), F)
    y = g.tensor((2, 3), F)
    g.op("SQUEEZE", [x], [y], ("SqueezeOptions", {"SqueezeDims": [1]}))
    g.output(y)
    assert _ext_ops(read_tflite(build(g))) == []


# ---- the extension's own rules, on hand-made HAL models ---------------------------------------

def _hal(code: int, params, in_dims=(2, 1, 5), out_dims=(2, 5)):  # type: ignore[no-untyped-def]
    """A HAL model: complex64 input -> extension operation ``code`` (of org.nnhal.tflite,
    prefix 1) with constant ``params`` -> complex64 output."""
    from nnhal.hal.builder import ModelBuilder
    from nnhal.hal.types import ExtensionNameAndPrefix
    from nnhal.hal.types import OperandType as T

    c64 = 1 << 16
    mb = ModelBuilder()
    x = mb.input(c64, list(in_dims))
    ins = [x]
    for p in params:
        ins.append(mb.scalar(T.INT32, p) if isinstance(p, int) else
                   mb.constant(T.TENSOR_INT32, np.asarray(p, np.int32)))
    y = mb.output(c64, list(out_dims))
    mb.operation(1 << 16 | code, ins, [y])
    model = mb.build()
    model.extension_name_to_prefix = [ExtensionNameAndPrefix("org.nnhal.tflite", 1)]
    return model


@pytest.mark.parametrize("code, params, out_dims", [
    (12, [[0]], (1, 5)),            # SQUEEZE of an axis of size 2
    (12, [[3]], (2, 5)),            # SQUEEZE axis out of range
    (12, [[1, 1]], (2, 5)),         # SQUEEZE axis twice
    (13, [[3, 3]], (3, 3)),         # RESHAPE to another element count
    (13, [[-1, 5]], (2, 5)),        # RESHAPE with -1
    (14, [4], (2, 1, 5, 1)),        # EXPAND_DIMS axis out of range
    (15, [[0, 0, 1]], (2, 2, 1)),   # TRANSPOSE not a permutation
    (15, [[1, 0]], (1, 2)),         # TRANSPOSE of the wrong length
    (16, [[0, 0, 3], [2, 1, 3]], (2, 1, 3)),  # SLICE past the end
    (16, [[0, 0], [2, 1]], (2, 1)),           # SLICE with too few values
], ids=["squeeze-size-2", "squeeze-range", "squeeze-twice", "reshape-count", "reshape-minus1",
        "expand-range", "transpose-repeat", "transpose-length", "slice-past", "slice-rank"])
def test_bad_movements_are_refused_not_run(code, params, out_dims) -> None:
    assert_reference_refuses(_hal(code, params, out_dims=out_dims))


def test_a_good_hal_squeeze_runs() -> None:
    model = _hal(12, [[1]])
    z = (np.arange(10) + 1j * np.arange(10)).astype(np.complex64).reshape(2, 1, 5)
    with Session(model, "reference") as s:
        got = list(s.run([z]).values())[0]
    np.testing.assert_array_equal(got, z.reshape(2, 5))


STFT = DATA / "stft_net.tflite"


def test_birdnet_like_front_end_runs_as_litert_runs_it() -> None:
    """The converter writes every shape below a run-time framing as a placeholder ([1, 1, ...]
    where shape_signature says -1): the importer infers them (GATHER, EXPAND_DIMS, RFFT2D,
    SQUEEZE, TRANSPOSE, CONV_2D, PAD, pooling, CONCATENATION, MEAN, FULLY_CONNECTED), so SHAPE
    arithmetic below folds and the model runs on either driver, LiteRT whole."""
    from nnhal.tools.info import plan_info

    imported = read_tflite(STFT)
    assert {"org.nnhal.tflite:RFFT2D", "org.nnhal.tflite:SQUEEZE",
            "org.nnhal.tflite:CAST"} <= set(_ext_ops(imported))
    assert [s["device"] for s in plan_info(imported)] == ["litert"]
    it = litert(str(STFT))
    for device in ("reference", "litert", None):
        with (Session(str(STFT), device) if device else Session(str(STFT))) as s:
            for seed in range(3):
                x = np.random.default_rng(seed).uniform(-1, 1, (1, 512)).astype(F)
                assert_agree(list(s.run([x]).values()), litert_run(it, [x]),
                             f"{device} seed {seed}")


def test_a_computed_dimension_that_cannot_be_inferred_becomes_unknown() -> None:
    """Below a shape inferred unlike the file's placeholder, an operator the importer cannot
    infer (here REVERSE_V2 after a BATCH_MATMUL it has no rule for) gets 0 (unknown) in each
    computed dimension, never the stale placeholder; the analysis infers the real one."""
    from tfl import Graph, build

    g = Graph()
    x = g.input((2, 6), F)
    # the placeholder [1, 6] where the real shape, from the constant slice size, is [2, 6]
    y = g.tensor((1, 6), F, signature=(-1, 6))
    g.op("SLICE", [x, g.const(np.array([0, 0], np.int32)), g.const(np.array([2, 6], np.int32))],
         [y])
    w = g.const(np.eye(6, dtype=F))
    z = g.tensor((1, 6), F, signature=(-1, 6))
    g.op("BATCH_MATMUL", [y, w], [z])
    r = g.tensor((1, 6), F, signature=(-1, 6))
    g.op("REVERSE_V2", [z, g.const(np.array([1], np.int32))], [r])
    g.output(r)
    data = build(g)
    xs = np.arange(12, dtype=F).reshape(2, 6)
    with Session(data, "reference") as s:
        got = list(s.run([xs]).values())[0]
    np.testing.assert_array_equal(got, xs[:, ::-1])
    np.testing.assert_array_equal(got, litert_run(litert(data), [xs])[0])


# ---- hostile files: what TFLite computes or refuses, never a result of the declared shapes ----

def _complex_reshape(shape_input: str, out: tuple[int, ...] = (2, 5)) -> bytes:
    """RFFT2D of x [2, 1, 8] (complex64 [2, 1, 5]), RESHAPE to ``out`` by a shape input that
    is a constant ([2, 5] "good", [5, 2] "other"), a tensor nothing writes ("unwritten"),
    then REAL."""
    from tfl import Graph, build
    from tflite.TensorType import TensorType as TT

    g = Graph()
    x = g.input((2, 1, 8), F)
    z = g.tensor((2, 1, 5), TT.COMPLEX64)
    g.op("RFFT2D", [x, g.const(np.array([1, 8], np.int32))], [z])
    shape = g.tensor((2,), np.int32) if shape_input == "unwritten" else g.const(
        np.int32([2, 5] if shape_input == "good" else [5, 2]))
    y = g.tensor(out, TT.COMPLEX64)
    g.op("RESHAPE", [z, shape], [y])
    r = g.tensor(out, F)
    g.op("REAL", [y], [r])
    g.output(r)
    return build(g)


def test_complex_reshape_takes_tflites_target_not_the_declared_shape() -> None:
    """TFLite's RESHAPE overwrites the declared output shape with its target: a file whose
    declared shape disagrees (same element count) is refused rather than given the declared
    shape; the agreeing file runs as litert runs it."""
    from nnhal.errors import UnsupportedModelError

    good = _complex_reshape("good")
    x = _x((2, 1, 8), 3)
    with Session(good, "reference") as s:
        assert_agree(list(s.run([x]).values()), litert_run(litert(good), [x]), "good")
    other = _complex_reshape("other")
    assert litert_run(litert(other), [x])[0].shape == (5, 2)  # TFLite's result's shape
    with pytest.raises(UnsupportedModelError, match=r"new shape \[5, 2\] is not the output's "
                                                    r"declared \[2, 5\]") as e:
        read_tflite(other, name="m.tflite")
    assert "\n" not in str(e.value)


def test_reshape_shape_input_that_nothing_writes_is_refused() -> None:
    """TFLite's Invoke refuses an operator input without data, even the RESHAPE shape input
    an importer could ignore; nnhal refuses the file, for complex64 and float32 alike."""
    from tfl import Graph, build

    from nnhal.errors import UnsupportedModelError

    g = Graph()
    x = g.input((6,), F)
    y = g.tensor((2, 3), F)
    g.op("RESHAPE", [x, g.tensor((2,), np.int32)], [y])
    g.output(y)
    for data in (_complex_reshape("unwritten"), build(g)):
        with pytest.raises(UnsupportedModelError, match="is read before any operator writes"):
            read_tflite(data, name="m.tflite")
        with pytest.raises((RuntimeError, ValueError), match="lacks data"):
            it = litert(data)
            it.set_tensor(it.get_input_details()[0]["index"],
                          np.zeros(it.get_input_details()[0]["shape"], F))
            it.invoke()


def test_an_operator_writing_a_complex64_tensor_with_data_is_refused() -> None:
    """The writer check covers tensors of every type, not only those nnhal holds values of,
    and a complex64 buffer shorter than its tensor is refused as TFLite refuses it."""
    from tfl import Graph, build
    from tflite.TensorType import TensorType as TT

    from nnhal.errors import ModelFileError

    for n, message in ((10, r"\(RFFT2D\) writes tensor 1 't1', a constant"),
                       (1, "has 8 bytes of data")):
        g = Graph()
        x = g.input((2, 1, 8), F)
        z = g.tensor((2, 1, 5), TT.COMPLEX64)
        g.tensors[z].value = np.zeros(n, np.complex64)  # RFFT2D's output given data
        g.op("RFFT2D", [x, g.const(np.array([1, 8], np.int32))], [z])
        r = g.tensor((2, 1, 5), F)
        g.op("REAL", [z], [r])
        g.output(r)
        with pytest.raises(ModelFileError, match=message) as e:
            read_tflite(build(g), name="m.tflite")
        assert "\n" not in str(e.value)


def _claimed(kind: str) -> bytes:
    """One builtin the extension claims, with what TFLite's Prepare refuses."""
    from tfl import Graph, build
    from tflite.TensorType import TensorType as TT

    g = Graph()
    if kind in ("imag_of_float", "cumsum_int64_axis", "cumsum_two_axes"):
        x = g.input((2, 8), F)
        y = g.tensor((2, 8), F)
        if kind == "imag_of_float":
            g.op("IMAG", [x], [y])
        else:
            axis = np.int64([1]) if kind == "cumsum_int64_axis" else np.int32([0, 1])
            g.op("CUMSUM", [x, g.const(axis)], [y], ("CumsumOptions", {}))
        g.output(y)
        return build(g)
    x = g.input((2, 1, 8) if kind != "rfft2d_of_rank_1" else (8,), F)
    lengths = {"rfft2d_fft_length_odd": [1, 6]}.get(kind, [1, 8])
    out = {"rfft2d_output_not_its_fft_length": (2, 1, 9), "rfft2d_of_rank_1": (1, 5)}.get(
        kind, (2, 1, 4 if kind == "rfft2d_fft_length_odd" else 5))
    z = g.tensor(out, TT.COMPLEX64)
    g.op("RFFT2D", [x, g.const(np.array(lengths, np.int32))], [z])
    r = g.tensor(out, F)
    g.op("REAL", [z], [r])
    g.output(r)
    return build(g)


@pytest.mark.parametrize("kind", ["imag_of_float", "cumsum_int64_axis", "cumsum_two_axes",
                                  "rfft2d_fft_length_odd", "rfft2d_output_not_its_fft_length",
                                  "rfft2d_of_rank_1"])
def test_claimed_builtins_tflite_refuses_are_refused_at_import(kind: str) -> None:
    """Found by the import fuzz test on the converter-made seeds: the extension's rules
    (types, fft_length, the output RFFT2D gives) checked as the operator is read, as
    TFLite's Prepare checks them, not only when a driver prepares the model."""
    from oracle import verdicts

    from nnhal.errors import UnsupportedModelError

    data = _claimed(kind)
    with pytest.raises(UnsupportedModelError) as e:
        read_tflite(data, name="m.tflite")
    assert "\n" not in str(e.value)
    if kind != "rfft2d_output_not_its_fft_length":
        # (TFLite resizes that output to what fft_length gives, which the operators after
        # it may refuse, as a mutant's RESHAPE did; nnhal refuses the declared shape.)
        assert verdicts([data])[0] != "ok", kind
    assert verdicts([_claimed("rfft2d_ok")]) == ["ok"]
