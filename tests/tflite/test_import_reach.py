"""Issue 27's reach of the importer, on real .tflite files: models TensorFlow's converter made
(tests/tflite/data/make_import_reach.py; saved, so nothing converts at test time) and
MediaPipe's selfie segmentation (from the mediapipe 0.10.14 wheel, Apache-2.0), imported and
run on the reference driver against ai-edge-litert on the same inputs: float outputs within
1e-4 of their range, quantized within one step (runner.tolerance). Hand-built one-operator
files (tfl.py) pin the edge cases: signs, division by zero, rank-one SELECT conditions, the
padding of MediaPipe's transposed convolution against a float64 transcription of its kernel
and against litert running the builtin TRANSPOSE_CONV with the same bias."""

from __future__ import annotations

import contextlib
import struct
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from runner import Reference, agree, assert_agree, litert, litert_run
from tfl import Graph, Quant, build

from nnhal.errors import UnsupportedModelError
from nnhal.hal.types import OperationType
from nnhal.tflite import builtin_support, builtin_table, custom_support, read_tflite, schema
from nnhal.tflite.importer import KINDS

DATA = Path(__file__).resolve().parent / "data"
F, I32 = np.float32, np.int32
O = OperationType

pytest.importorskip("ai_edge_litert.interpreter")


@contextlib.contextmanager
def _without_tflite_extension() -> Iterator[None]:
    """nnhal's shipped extension org.nnhal.tflite taken away for a while."""
    from nnhal.extensions import tflite_builtins
    from nnhal.ops import extensions

    extensions.lookup(tflite_builtins.NAME)  # registered before it is taken away
    extensions.unregister(tflite_builtins.NAME)
    try:
        yield
    finally:
        extensions.register(tflite_builtins.EXTENSION)


def _data(name: str) -> bytes:
    return (DATA / name).read_bytes()


def _hal_ops(imported) -> Counter:
    return Counter(O(op.type).name for op in imported.model.main.operations)


# ---- converter-made models -------------------------------------------------------------------

def test_frame_count_shape_chain_folds_to_constants() -> None:
    """SHAPE -> SPLIT_V -> RESHAPE -> FLOOR_DIV / FLOOR_MOD of a signal's length fold, and
    the slice and reshape after them get the shapes TFLite's Prepare computes (the file
    holds placeholders [1, 1] and [1, 1, 160] there)."""
    data = _data("frame_count.tflite")
    imported = read_tflite(data)
    ops = _hal_ops(imported)
    assert not {"DIV", "FLOOR", "SLICE", "SUB"} & set(ops), ops
    x = np.random.default_rng(3).uniform(-1, 1, (1, 1000)).astype(F)
    frames, count = agree(data, [x])
    assert frames.shape == (1, 6, 160)
    np.testing.assert_array_equal(frames.reshape(-1), x[0, :960])
    assert int(count.reshape(-1)[0]) == 1000 % 160 + 1000 // 160


def test_select_v2_broadcasting_float() -> None:
    data = _data("select_v2_broadcast.tflite")
    assert _hal_ops(read_tflite(data))["SELECT"] == 1
    for seed in range(3):
        agree(data, seed=seed)


def test_select_v2_broadcasting_int8_within_one_step() -> None:
    agree(_data("select_v2_broadcast_int8.tflite"))


def test_upsampling_and_repeats_through_five_dimensions() -> None:
    """Keras' UpSampling2D, tf.repeat and tf.tile of a 4-D tensor, which the converter writes
    through 5-D tensors the HAL's data movement refuses, import as one GATHER per repeated
    axis (worked out on element indices) and agree with ai-edge-litert exactly."""
    data = _data("upsample_repeat.tflite")
    imported = read_tflite(data)
    assert _hal_ops(imported) == Counter({"GATHER": 4})
    x = np.random.default_rng(4).uniform(-1, 1, (1, 4, 5, 3)).astype(F)
    got = agree(data, [x])
    np.testing.assert_array_equal(got[0], x.repeat(2, axis=1).repeat(2, axis=2))
    np.testing.assert_array_equal(got[1], x.repeat(3, axis=2))
    np.testing.assert_array_equal(got[2], x.repeat(2, axis=2))  # (a new axis after W, tiled)


@pytest.mark.parametrize("name", ["dilated_clip.tflite", "dilated_clip_int8.tflite"])
def test_dilated_convolution_and_a_requantizing_clip(name: str) -> None:
    """The converter's dilated convolution (SPACE_TO_BATCH_ND -> CONV_2D -> BATCH_TO_SPACE_ND,
    the middle tensors written with a placeholder batch of 1 that TFLite's Prepare makes 4)
    imports with the batch Prepare computes; an int8 clip to [-1, 1] with an output
    quantization of its own goes through float32 (DEQUANTIZE, RELU1, QUANTIZE). Within the
    tolerance of ai-edge-litert, for three inputs."""
    data = _data(name)
    ops = _hal_ops(read_tflite(data))
    assert ops["SPACE_TO_BATCH_ND"] == ops["BATCH_TO_SPACE_ND"] == 1, ops
    if "int8" in name:
        assert ops["DEQUANTIZE"] == ops["QUANTIZE"] == ops["RELU1"] == 1, ops
    for seed in range(3):
        agree(data, seed=seed)


def test_int8_leaky_relu_and_comparisons_of_two_tensors() -> None:
    """The converter's int8 LeakyReLU imports as PRELU (alpha one step of its own scale), its
    comparisons of two inputs of their own scales as the extension's (TFLite's fixed-point
    ranks, exact), and a bool cast to float as a SELECT: within one step of ai-edge-litert on
    the reference, LiteRT and the runtime, the comparison's output exactly."""
    from nnhal.drivers.litert import unavailable
    from nnhal.session import Session

    data = _data("leaky_compare_int8.tflite")
    imported = read_tflite(data)
    main = imported.model.main.operations
    hal = Counter(O(op.type).name for op in main if op.type < 1 << 16)
    assert hal["PRELU"] == 2 and hal["SELECT"] == 2 and "CAST" not in hal, hal
    assert sorted(op.type & 0xFFFF for op in main if op.type >= 1 << 16) == [21, 22]
    it = litert(data)
    rng = np.random.default_rng(11)
    feeds = [[rng.integers(-128, 128, (2, 16)).astype(np.int8) for _ in range(2)]
             for _ in range(20)]
    devices = ["reference", None] + (["litert"] if unavailable() is None else [])
    for device in devices:
        s = Session(imported, device=device)
        for xs in feeds:
            want = litert_run(it, xs)
            got = list(s.run(dict(zip((i.name for i in s.inputs), xs))).values())
            assert_agree(got, want, f"{device}")
            np.testing.assert_array_equal(got[1], want[1])


def test_floor_div_and_mod_of_tensors() -> None:
    rng = np.random.default_rng(5)
    a = rng.uniform(-50, 50, (2, 5)).astype(F)
    b = rng.choice([-3.5, -1.25, 0.75, 2.0, 7.0], 5).astype(F)
    i = np.array([[-7, 7, -7, 7, 0], [2**31 - 1, -2**31, -1, 1, 100]], I32)
    j = np.array([[2, 2, -2, -2, 3]], I32)
    got = agree(_data("floor_div_mod.tflite"), [a, b, i, j])
    np.testing.assert_array_equal(got[1], i // j)
    np.testing.assert_array_equal(got[2], i % j)


def test_bool_reshape_feeding_if() -> None:
    data = _data("bool_reshape_if.tflite")
    assert _hal_ops(read_tflite(data))["IF"] == 1
    for x in (np.full((1, 6), 0.9, F), np.full((1, 6), 0.1, F),
              np.float32([[0.1, 0.2, 0.7, 0.0, -1.0, 0.3]])):
        agree(data, [x])


def test_refusal_names_every_blocking_operator() -> None:
    """A custom operator, RFFT2D and REAL downstream of it, and an unrelated CUMSUM: without
    nnhal's extension org.nnhal.tflite one message names all four with their indexes and
    why; with it (the default) only the custom operator is left."""
    with _without_tflite_extension(), pytest.raises(UnsupportedModelError) as e:
        read_tflite(_data("refused_rfft2d_custom.tflite"))
    msg = str(e.value)
    assert "4 operator(s)" in msg
    for part in ("#0 CUMSUM: no HAL operation",
                 "#1 BesselI0e: custom operator 'BesselI0e' has no HAL equivalent",
                 "#2 RFFT2D: no HAL equivalent (its inputs come from a refused operator",
                 "#3 REAL: no HAL equivalent"):
        assert part in msg, msg
    with pytest.raises(UnsupportedModelError) as e:
        read_tflite(_data("refused_rfft2d_custom.tflite"))
    msg = str(e.value)
    assert "1 operator(s)" in msg and e.value.items == [
        "#1 BesselI0e: custom operator 'BesselI0e' has no HAL equivalent"], msg


# ---- folding ---------------------------------------------------------------------------------

def _const_binary(name: str, a: np.ndarray, b: np.ndarray) -> bytes:
    """``name`` of two constants, added to an input so that the model has one."""
    g = Graph()
    x = g.input(a.shape, a.dtype)
    folded = g.tensor(np.broadcast_shapes(a.shape, b.shape), a.dtype)
    g.op(name, [g.const(a), g.const(b)], [folded])
    y = g.tensor(folded and np.broadcast_shapes(a.shape, b.shape), a.dtype)
    g.op("ADD", [x, folded], [y], ("AddOptions", {}))
    g.output(y)
    return build(g)


@pytest.mark.parametrize("name", ["FLOOR_DIV", "FLOOR_MOD", "DIV"])
@pytest.mark.parametrize("dtype", [I32, F])
def test_folded_division_is_tflites(name: str, dtype: type) -> None:
    a = np.array([-7, 7, -7, 7, 0, -1, 9], dtype)
    b = np.array([2, 2, -2, -2, 3, 4, -4], dtype)
    if dtype is F:
        a = a + np.float32(0.3)
    data = _const_binary(name, a, b)
    imported = read_tflite(data)
    assert set(_hal_ops(imported)) == {"ADD"}  # the division is a constant now
    agree(data, [np.zeros(a.shape, dtype)])


@pytest.mark.parametrize("name", ["FLOOR_DIV", "FLOOR_MOD", "DIV"])
def test_folded_integer_division_by_zero_is_refused(name: str) -> None:
    data = _const_binary(name, np.array([4, 5], I32), np.array([2, 0], I32))
    with pytest.raises(UnsupportedModelError, match=rf"#0 {name}: {name} of constants divides "
                                                    r"by zero"):
        read_tflite(data)


def test_division_by_a_constant_zero_is_refused() -> None:
    g = Graph()
    x = g.input((3,), I32)
    y = g.tensor((3,), I32)
    g.op("FLOOR_DIV", [x, g.const(np.array([1, 0, 2], I32))], [y])
    g.output(y)
    with pytest.raises(UnsupportedModelError, match="Division by 0"):
        read_tflite(build(g))


def test_split_of_a_shape_folds() -> None:
    """SPLIT (equal parts) of SHAPE, then a RESHAPE that reads one part as its new shape."""
    g = Graph()
    x = g.input((2, 3, 4), F)
    shape = g.tensor((3,), I32)
    g.op("SHAPE", [x], [shape], ("ShapeOptions", dict(OutType=2)))
    parts = [g.tensor((1,), I32) for _ in range(3)]
    g.op("SPLIT", [g.const(np.int32(0)), shape], parts, ("SplitOptions", dict(NumSplits=3)))
    flat = g.tensor((6,), I32)
    g.op("MUL", [parts[0], parts[1]], [flat], ("MulOptions", {}))
    new_shape = g.tensor((2,), I32)
    g.op("CONCATENATION", [flat, parts[2]], [new_shape],
         ("ConcatenationOptions", dict(Axis=0)))
    y = g.tensor((6, 4), F)
    g.op("RESHAPE", [x, new_shape], [y])
    g.output(y)
    data = build(g)
    assert set(_hal_ops(read_tflite(data))) == {"RESHAPE"}
    agree(data)


# ---- lowering, hand-built edge cases ---------------------------------------------------------

def _binary(name: str, a_shape: tuple, b_shape: tuple, dtype: type,
            options: tuple | None = None) -> bytes:
    g = Graph()
    a, b = g.input(a_shape, dtype), g.input(b_shape, dtype)
    y = g.tensor(np.broadcast_shapes(a_shape, b_shape), dtype)
    g.op(name, [a, b], [y], options)
    g.output(y)
    return build(g)


def test_int32_div_truncates_towards_zero_as_tflite() -> None:
    """TFLite's int32 DIV truncates; the HAL's floors: the import adds the correction."""
    data = _binary("DIV", (2, 4), (4,), I32, ("DivOptions", {}))
    a = np.array([[-7, 7, -7, 7], [-8, 0, 2**31 - 1, -2**31]], I32)
    b = np.array([2, -2, -2, 3], I32)
    got = agree(data, [a, b])[0]
    np.testing.assert_array_equal(got, np.trunc(a / b).astype(I32))


def test_float_floor_mod_of_tensors_is_an_extension_operation() -> None:
    """Past |x / y| = 2^24 no HAL form computes TFLite's remainder: refused without nnhal's
    extension org.nnhal.tflite, its FLOOR_MOD with it, bit for bit TFLite's over values
    spread over 40 decades, signs mixed and zero divisors included."""
    data = _binary("FLOOR_MOD", (2, 3), (3,), F)
    with _without_tflite_extension(), pytest.raises(
            UnsupportedModelError, match=r"#0 FLOOR_MOD: float32 FLOOR_MOD of run-time "
                                         r"tensors has no exact HAL form"):
        read_tflite(data)
    rng = np.random.default_rng(5)
    n = 3000
    a = (rng.uniform(-1, 1, (2, n)) * 10.0 ** rng.integers(-20, 20, (2, n))).astype(F)
    b = (rng.uniform(-1, 1, n) * 10.0 ** rng.integers(-10, 10, n)).astype(F)
    a[0, :4], b[:4] = [7.5, -7.5, 0.0, 3.0], [2.0, 2.0, -1.5, 0.0]
    data = _binary("FLOOR_MOD", (2, n), (n,), F)
    imported = read_tflite(data)
    assert imported.model.extension_name_to_prefix[0].name == "org.nnhal.tflite"
    ref = Reference(imported)
    try:
        got = ref.run([a, b])[0]
    finally:
        ref.close()
    np.testing.assert_array_equal(got, litert_run(litert(data), [a, b])[0])


@pytest.mark.parametrize("const", [False, True], ids=["divisor input", "divisor constant"])
def test_float_floor_division_is_exact(const: bool) -> None:
    """Bit for bit TFLite's, on one-decimal operands where the float32 quotient often rounds
    up to an integer (7.8 // 0.6: TFLite's 12, not floor(fl32(13.0)) = 13), and on values
    spread over 40 decades (quotients below 2^24)."""
    name = "FLOOR_DIV"
    rng = np.random.default_rng(11)
    n = 4000
    b = (np.round(rng.uniform(0.1, 3, n), 1) * rng.choice([-1, 1], n)).astype(F)
    a = np.round(rng.uniform(-10, 10, (2, n)), 1).astype(F)
    wide_a = (rng.uniform(-1, 1, n) * 10.0 ** rng.integers(-20, 20, n)).astype(F)
    wide_b = (rng.uniform(0.1, 1, n) * 10.0 ** rng.integers(-10, 10, n)).astype(F)
    keep = (np.abs(wide_a.astype(np.float64) / wide_b) < 2 ** 24) & \
        (np.abs(a[0].astype(np.float64) / wide_b) < 2 ** 24)
    a[1, keep], b[keep] = wide_a[keep], np.where(b[keep] < 0, -wide_b[keep], wide_b[keep])
    g = Graph()
    x = g.input((2, n), F)
    y = g.const(b) if const else g.input((n,), F)
    out = g.tensor((2, n), F)
    g.op(name, [x, y], [out])
    g.output(out)
    data = build(g)
    feeds = [a] if const else [a, b]
    got = agree(data, feeds)[0]
    np.testing.assert_array_equal(got, litert_run(litert(data), feeds)[0])


def test_select_rank_one_condition_picks_rows() -> None:
    """SELECT (version 1) with a condition of one value per row of x."""
    g = Graph()
    c, x, y = g.input((3,), np.bool_), g.input((3, 2, 2), F), g.input((3, 2, 2), F)
    out = g.tensor((3, 2, 2), F)
    g.op("SELECT", [c, x, y], [out])
    g.output(out)
    data = build(g)
    got = agree(data, [np.array([True, False, True]), np.ones((3, 2, 2), F),
                       np.zeros((3, 2, 2), F)])[0]
    np.testing.assert_array_equal(got[:, 0, 0], [1, 0, 1])


def test_select_scalar_condition_picks_a_whole_operand() -> None:
    g = Graph()
    c, x, y = g.input((), np.bool_), g.input((2, 3), F), g.input((2, 3), F)
    out = g.tensor((2, 3), F)
    g.op("SELECT", [c, x, y], [out])
    g.output(out)
    for flag in (True, False):
        agree(build(g), [np.array(flag), np.ones((2, 3), F), np.zeros((2, 3), F)])


def test_select_of_operands_quantized_unlike_the_output_is_refused() -> None:
    g = Graph()
    q = Quant([0.1], [0])
    c = g.input((2,), np.bool_)
    x, y = g.input((2,), np.int8, quant=q), g.input((2,), np.int8, quant=Quant([0.2], [0]))
    out = g.tensor((2,), np.int8, quant=q)
    g.op("SELECT_V2", [c, x, y], [out])
    g.output(out)
    with pytest.raises(UnsupportedModelError, match="copies its stored integers"):
        read_tflite(build(g))


@pytest.mark.parametrize("dtype", [F, I32, np.bool_])
def test_select_v2_broadcasts_every_operand(dtype: type) -> None:
    g = Graph()
    c, x, y = g.input((3, 1), np.bool_), g.input((1, 4), dtype), g.input((4,), dtype)
    out = g.tensor((3, 4), dtype)
    g.op("SELECT_V2", [c, x, y], [out])
    g.output(out)
    for seed in range(2):
        agree(build(g), seed=seed)


def test_select_v2_keeps_signed_zeros() -> None:
    """Widening by adding -0.0 keeps -0.0 (adding +0.0 would not)."""
    g = Graph()
    c, x = g.input((1, 3), np.bool_), g.input((3,), F)
    out = g.tensor((2, 3), F)
    g.op("SELECT_V2", [c, x, g.const(np.zeros((2, 1), F))], [out])
    g.output(out)
    got = agree(build(g), [np.array([[True, True, False]]), np.float32([-0.0, 1.0, 2.0])])[0]
    assert np.signbit(got[:, 0]).all()


def test_bool_reshape_between_ranks() -> None:
    g = Graph()
    x = g.input((2, 3), np.bool_)
    y = g.tensor((3, 1, 2), np.bool_)
    g.op("RESHAPE", [x, g.const(np.int32([3, 1, 2]))], [y])
    g.output(y)
    agree(build(g))


def test_broadcast_to_of_a_tensor() -> None:
    g = Graph()
    x = g.input((3, 1), F)
    y = g.tensor((2, 3, 4), F)
    g.op("BROADCAST_TO", [x, g.const(np.int32([2, 3, 4]))], [y])
    g.output(y)
    agree(build(g))


def test_prelu_whose_alpha_widens_the_output_is_refused() -> None:
    data = _binary("PRELU", (1, 3), (2, 3), F)
    with pytest.raises(UnsupportedModelError, match="the HAL's PRELU keeps the input's shape"):
        read_tflite(data)


# ---- MediaPipe's Convolution2DTransposeBias --------------------------------------------------

def _mediapipe_tconv(x: np.ndarray, w: np.ndarray, b: np.ndarray, padding: int, sw: int,
                     sh: int) -> np.ndarray:
    """MediaPipe's kernel, in float64: SAME pads max(0, f - (in - 1) % s - 1) in all, half
    (rounded down) before; each input pixel scatters its filter-weighted value."""
    n, ih, iw, _ = x.shape
    oc, fh, fw, _ = w.shape
    ph = max(0, fh - (ih - 1) % sh - 1) if padding == 1 else 0
    pw = max(0, fw - (iw - 1) % sw - 1) if padding == 1 else 0
    oh, ow = sh * (ih - 1) + fh - ph, sw * (iw - 1) + fw - pw
    out = np.zeros((n, oh, ow, oc)) + b.astype(np.float64)
    xd, wd = x.astype(np.float64), w.astype(np.float64)
    for y in range(ih):
        for xx in range(iw):
            for fy in range(fh):
                for fx in range(fw):
                    oy, ox = y * sh - ph // 2 + fy, xx * sw - pw // 2 + fx
                    if 0 <= oy < oh and 0 <= ox < ow:
                        out[:, oy, ox, :] += xd[:, y, xx, :] @ wd[:, fy, fx, :].T
    return out


def _tconv_models(x_shape: tuple, w: np.ndarray, b: np.ndarray, padding: int, sw: int,
                  sh: int, extra: bytes = b"") -> tuple[bytes, bytes, tuple]:
    """(the custom operator's model, the builtin TRANSPOSE_CONV twin litert runs, out shape)."""
    expected = _mediapipe_tconv(np.zeros(x_shape, F), w, b, padding, sw, sh).shape
    g = Graph()
    x = g.input(x_shape, F)
    y = g.tensor(expected, F)
    g.op("CUSTOM:Convolution2DTransposeBias", [x, g.const(w), g.const(b)], [y],
         custom_options=struct.pack("<iii", padding, sw, sh) + extra)
    g.output(y)
    twin = Graph()
    x2 = twin.input(x_shape, F)
    y2 = twin.tensor(expected, F)
    twin.op("TRANSPOSE_CONV", [twin.const(np.int32(expected)), twin.const(w), x2, twin.const(b)],
            [y2], ("TransposeConvOptions", dict(Padding=0 if padding == 1 else 1, StrideW=sw,
                                                 StrideH=sh)))
    twin.output(y2)
    return build(g), build(twin), expected


@pytest.mark.parametrize("x_shape, w_shape, padding, sw, sh", [
    ((1, 4, 5, 3), (2, 3, 3, 3), 1, 2, 2),   # SAME, stride 2
    ((2, 5, 4, 2), (3, 4, 2, 2), 1, 3, 1),   # SAME, padding split unevenly
    ((1, 3, 3, 4), (2, 2, 3, 4), 2, 1, 2),   # VALID
    ((1, 3, 4, 1), (1, 3, 3, 1), 0, 2, 2),   # padding "unknown": none, as the kernel does
])
def test_mediapipe_transpose_conv_bias(x_shape, w_shape, padding, sw, sh) -> None:
    rng = np.random.default_rng(sum(x_shape) + padding)
    w = rng.uniform(-1, 1, w_shape).astype(F)
    b = rng.uniform(-1, 1, w_shape[0]).astype(F)
    custom, twin, out_shape = _tconv_models(x_shape, w, b, padding, sw, sh, extra=b"\0" * 4)
    imported = read_tflite(custom)
    assert _hal_ops(imported) == Counter({"TRANSPOSE_CONV_2D": 1})
    x = rng.uniform(-1, 1, x_shape).astype(F)
    ref = Reference(imported)
    try:
        got = ref.run([x])
    finally:
        ref.close()
    expected = _mediapipe_tconv(x, w, b, padding, sw, sh)
    assert got[0].shape == out_shape
    assert_agree(got, [expected.astype(F)], "float64 transcription")
    if padding != 0:
        assert_agree(got, litert_run(litert(twin), [x]), "litert TRANSPOSE_CONV + bias")


@pytest.mark.parametrize("options, why", [
    (struct.pack("<ii", 1, 2), "custom options of 8 bytes"),
    (struct.pack("<iii", 7, 2, 2), "padding 7 is not a TfLitePadding"),
    (struct.pack("<iii", 1, 0, 2), "strides 0 x 2 are not positive"),
])
def test_mediapipe_transpose_conv_bias_bad_options(options: bytes, why: str) -> None:
    g = Graph()
    x = g.input((1, 2, 2, 1), F)
    y = g.tensor((1, 4, 4, 1), F)
    g.op("CUSTOM:Convolution2DTransposeBias", [x, g.const(np.ones((1, 2, 2, 1), F)),
                                               g.const(np.zeros(1, F))], [y],
         custom_options=options)
    g.output(y)
    with pytest.raises(UnsupportedModelError, match=why):
        read_tflite(build(g))


def test_selfie_segmentation_runs() -> None:
    """MediaPipe's selfie segmentation (its decoder's last layer is the custom transposed
    convolution, stride 2 SAME to 256 x 256) against litert running the same HAL model
    exported to TFLite with its builtin TRANSPOSE_CONV, on litert's reference kernels (its
    default XNNPACK kernels differ from them by up to 1.6e-4 on this network, more than the
    tolerance)."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    from nnhal.tflite import write_tflite

    imported = read_tflite(DATA / "selfie_segmentation.tflite")
    assert _hal_ops(imported)["TRANSPOSE_CONV_2D"] == 1
    it = Interpreter(model_content=write_tflite(imported.model),
                     experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
    it.allocate_tensors()
    yy, xx = np.mgrid[0:256, 0:256] / 255.0
    person = ((xx - 0.5) ** 2 / 0.05 + (yy - 0.6) ** 2 / 0.15 < 1) * 0.8 + 0.1
    x = np.repeat(person[None, :, :, None], 3, axis=3).astype(F)
    ref = Reference(imported)
    try:
        got = ref.run([x])
    finally:
        ref.close()
    assert got[0].shape == (1, 256, 256, 1) and got[0].max() > 0.2  # a mask, not all zeros
    assert_agree(got, litert_run(it, [x]), "selfie segmentation")


def test_selfie_segmentation_transpose_conv_weights_against_float64() -> None:
    """The real layer (its weights, bias and options read from the file) on a small input,
    against the float64 transcription of MediaPipe's kernel."""
    from nnhal.tflite.import_fold import fold
    from nnhal.tflite.import_read import read_model

    sg = read_model(schema.load(_data("selfie_segmentation.tflite")))[0]
    fold(sg, set())  # its weights are float16 behind DEQUANTIZE
    op = next(o for o in sg.ops if o.custom)
    w, b = (sg.tensors[i].value for i in op.inputs[1:])
    padding, sw, sh = struct.unpack_from("<iii", op.custom_options)
    assert (padding, sw, sh) == (1, 2, 2)
    custom, _, _ = _tconv_models((1, 6, 5, w.shape[3]), w, b, padding, sw, sh)
    x = np.random.default_rng(2).uniform(-2, 2, (1, 6, 5, w.shape[3])).astype(F)
    ref = Reference(read_tflite(custom))
    try:
        got = ref.run([x])
    finally:
        ref.close()
    assert_agree(got, [_mediapipe_tconv(x, w, b, padding, sw, sh).astype(F)])


# ---- the support table -----------------------------------------------------------------------

def test_builtin_table_classifies_every_builtin() -> None:
    table = builtin_table()
    names = {n for n in schema.BUILTIN_NAMES.values() if not n.startswith("PLACEHOLDER")}
    assert set(table) == names
    kinds = Counter(kind for kind, _ in table.values())
    ext = "extension (org.nnhal.tflite:RFFT2D)"
    assert set(kinds) >= {"HAL operation", "lowered", "folded", "refused", ext}
    assert all(k in KINDS or k.startswith("extension (") for k in kinds)
    mapped, refused = builtin_support()
    assert kinds["refused"] == len(refused) and sum(kinds.values()) - len(refused) == len(mapped)
    for name, kind in (("CONV_2D", "HAL operation"), ("FLOOR_DIV", "lowered"),
                       ("FLOOR_MOD", "lowered"), ("SELECT_V2", "lowered"),
                       ("SHAPE", "folded"), ("RFFT2D", ext), ("UNIQUE", "refused")):
        assert table[name][0] == kind, (name, table[name])
    assert "org.nnhal.tflite:FLOOR_MOD" in table["FLOOR_MOD"][1]
    with _without_tflite_extension():
        assert builtin_table()["RFFT2D"][0] == "refused"
    assert all(why for kind, why in table.values())
    assert "Convolution2DTransposeBias" in custom_support()


def test_cli_prints_the_table_with_counts(capsys) -> None:
    from nnhal.cli import main

    assert main(["ops", "--tflite"]) == 0
    out = capsys.readouterr().out
    kinds = Counter(kind for kind, _ in builtin_table().values())
    assert f"lowered: {kinds['lowered']}" in out and f"refused: {kinds['refused']}" in out
    assert "FLOOR_MOD" in out and "Convolution2DTransposeBias" in out


def test_gather_output_shape_is_inferred_from_its_static_inputs() -> None:
    """BirdNET's framing: a GATHER of a signal by constant frame indices, whose output the
    file holds as a placeholder (-1 in its signature), then a RESHAPE of the frames: the
    GATHER's shape is TFLite Prepare's (params before the axis, indices, params after)."""
    g = Graph()
    x = g.input((1, 12, 2), F)
    idx = g.const(np.array([[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]], I32))
    frames = g.tensor((1, 1, 4, 2), F, signature=(1, -1, 4, 2))
    g.op("GATHER", [x, idx], [frames], ("GatherOptions", dict(Axis=1)))
    flat = g.tensor((1, 3, 8), F)
    g.op("RESHAPE", [frames, g.const(np.array([1, 3, 8], I32))], [flat],
         ("ReshapeOptions", dict(NewShape=[1, 3, 8])))
    g.output(flat)
    data = build(g)
    x_val = np.random.default_rng(2).uniform(-1, 1, (1, 12, 2)).astype(F)
    (got,) = agree(data, [x_val])
    np.testing.assert_array_equal(got, x_val.reshape(1, 3, 8))


def test_chains_through_five_dimensions_by_hand() -> None:
    """A whole axis tiled (a new axis before it), a reshape there and back; a chain whose
    middle is read by another operator too, and one whose picks along an axis depend on
    another, stay refused (naming the rank)."""
    x = np.random.default_rng(6).uniform(-1, 1, (1, 3, 4, 2)).astype(F)

    def chain(moves: list[tuple[str, list[int]]], shared: bool = False) -> bytes:
        g = Graph()
        t = g.input([1, 3, 4, 2])
        middle = None
        for name, arg in moves:
            shape = arg if name == "RESHAPE" else \
                [d * m for d, m in zip(g.tensors[t].shape, arg)]
            out = g.tensor(shape, np.float32)
            g.op(name, [t, g.const(np.int32(arg))], [out])
            middle = middle if middle is not None else out
            t = out
        g.output(t)
        if shared:
            g.output(middle)
        return build(g)

    tiled = chain([("RESHAPE", [1, 1, 3, 4, 2]), ("TILE", [1, 2, 1, 1, 1]),
                   ("RESHAPE", [1, 6, 4, 2])])
    assert _hal_ops(read_tflite(tiled)) == Counter({"GATHER": 1})
    np.testing.assert_array_equal(agree(tiled, [x])[0], np.tile(x, (1, 2, 1, 1)))
    there_and_back = chain([("RESHAPE", [1, 3, 4, 2, 1]), ("RESHAPE", [3, 1, 2, 4])])
    assert _hal_ops(read_tflite(there_and_back)) == Counter({"RESHAPE": 1})
    np.testing.assert_array_equal(agree(there_and_back, [x])[0], x.reshape(3, 1, 2, 4))
    with pytest.raises(UnsupportedModelError, match="rank"):
        read_tflite(chain([("RESHAPE", [1, 1, 3, 4, 2]), ("TILE", [1, 2, 1, 1, 1]),
                           ("RESHAPE", [1, 6, 4, 2])], shared=True))
    # each channel pair repeated, then read as [8, 2]: a pick along W that depends on C
    with pytest.raises(UnsupportedModelError, match="rank"):
        read_tflite(chain([("RESHAPE", [1, 3, 4, 2, 1]), ("TILE", [1, 1, 1, 1, 2]),
                           ("RESHAPE", [1, 3, 8, 2])]))
