"""Quantized CONV_2D, DEPTHWISE_CONV_2D, GROUPED_CONV_2D, TRANSPOSE_CONV_2D and FULLY_CONNECTED
whose int32 bias lies at the int32 limits: the reference kernels (TFLite's builtin and
reference kernels, the NNAPI CPU executor) hold sum + bias in one int32 accumulator, which
wraps, and shift it left (a multiplier above 1) as an int32 product, which wraps too. nnhal's
reference driver (numpy path and native kernels) and the xla driver must give the same bytes as
TFLite's own kernels on the very file they read.

Measured when this was pinned (ai-edge-litert 2.3): with a multiplier below 1, XNNPACK, TFLite's
builtin kernels and its reference kernels all wrap, byte for byte alike; nnhal saturated, up to
255 steps away. With a multiplier above 1 whose left shift overflows, the builtin kernels and
the reference convolutions wrap; XNNPACK (float32 requantisation) saturates the shifted value
(so the LiteRT driver does not claim such an operation), and TFLite's reference
FULLY_CONNECTED matches neither (the overflow is undefined behaviour in C++): those two are
not compared here.

Skipped, saying so, without ai-edge-litert (the oracle); the xla driver only with JAX.
"""

from __future__ import annotations

import numpy as np
import pytest

from nnhal.hal.builder import ModelBuilder
from nnhal.hal.types import OperandType as T
from nnhal.hal.types import OperationType as O
from nnhal.hal.types import SymmPerChannelQuantParams
from nnhal.ops import common as C
from nnhal.ops import conv, native
from nnhal.tflite import write_tflite

try:
    from ai_edge_litert.interpreter import Interpreter, OpResolverType
except ImportError:  # pragma: no cover - the test extra installs it
    Interpreter = None

needs_litert = pytest.mark.skipif(Interpreter is None,
                                  reason="ai-edge-litert is not installed (the oracle here)")

I32MAX, I32MIN = 2**31 - 1, -2**31
COUT = 36  # the native kernels: four 8-channel vectors and a scalar tail (conv), scalar (dw)
#: Biases at and near the limits, and large ones whose sums stay in int32 (non-saturated
#: results computed from an accumulator far beyond float32's exact range).
LIMITS = [I32MAX, I32MIN, I32MAX - 4000, I32MIN + 4000, 2**30, -2**30, 1 << 29, 0]
#: Biases whose sum, shifted left by 3 (a multiplier of 6), leaves int32.
SHIFTED = [2**28 + 12345, -(2**28) - 999, 2**29 + 7, -(2**29) + 7, 2**30 + 2**27 + 5, I32MAX,
           I32MIN, 100]


def wrap32(v):
    return ((np.asarray(v, np.int64) + 2**31) % 2**32) - 2**31


def test_requantize_int32_sum_wraps_the_sum_and_the_left_shift():
    m, s = C.quantize_multiplier(2.0**-24)
    total = np.array([I32MAX + 1000, I32MIN - 1000, 2**30, -5], np.int64)
    # I32MAX + 1000 wraps to I32MIN + 999: about -128 after the 2**-24 scale
    assert C.requantize_int32_sum(total, m, s).tolist() == [-128, 128, 64, 0]
    m, s = C.quantize_multiplier(6.0)
    assert s == 3
    x = np.array([2**28 + 5, 3 * 2**27, -(2**29) + 7], np.int64)
    expected = C.rounding_divide_by_pot(C.srdhm(wrap32(x << 3), m), 0)
    assert C.requantize_int32_sum(x, m, s).tolist() == expected.tolist()
    assert int(expected[1]) < 0 < int(x[1])  # the shifted value wrapped negative


def build(op: str, kind: str, bias: list[int], shift_left: bool,
          bias_input: bool = False) -> tuple[bytes, dict]:
    """A one-operation .tflite (nnhal's export of a HAL model): ``kind`` "pc" int8 data with a
    per-channel filter, "i8" int8 per-tensor, "u8" uint8; filter values at the type's ends
    so the sums are large; output scale giving a multiplier of about 2**-24 (or 6);
    ``bias_input``: the bias is the model's second input."""
    rng = np.random.default_rng(len(bias) + ord(op[0]) + ord(kind[0]))
    cin = cout = COUT
    bias = (bias * (cout // len(bias) + 1))[:cout]
    if kind == "u8":
        tin = tf = T.TENSOR_QUANT8_ASYMM
        lo, hi, fzp, izp, ozp = 0, 255, 128, 131, 128
    else:
        tin = T.TENSOR_QUANT8_ASYMM_SIGNED
        tf = T.TENSOR_QUANT8_SYMM_PER_CHANNEL if kind == "pc" else tin
        lo, hi, fzp, izp, ozp = -127, 127, 0, 3, -1
    in_s = 1.0 / 64
    fscales = [2.0**-10 * (1 + 0.01 * k) for k in range(cout)] if kind == "pc" else [2.0**-10]
    out_s = in_s * fscales[0] * (1 / 6.0 if shift_left else 2.0**24)
    shapes = {"conv": ([2, 5, 5, cin], (cout, 3, 3, cin), [2, 3, 3, cout]),
              "dw": ([2, 5, 5, cin], (1, 3, 3, cout), [2, 3, 3, cout]),
              "grouped": ([2, 5, 5, cin], (cout, 3, 3, cin // 2), [2, 3, 3, cout]),
              "transpose": ([2, 5, 5, cin], (cout, 3, 3, cin), [2, 7, 7, cout]),
              "fc": ([4, cin], (cout, cin), [4, cout])}
    xshape, wshape, yshape = shapes[op]
    w = np.where(rng.random(wshape) < 0.5, lo, hi).astype(tf.dtype)
    b = ModelBuilder()
    x = b.input(tin, xshape, in_s, izp)
    if kind == "pc":
        cq = SymmPerChannelQuantParams(scales=fscales, channel_dim=3 if op == "dw" else 0)
        f = b.constant(tf, w, channel_quant=cq)
        bscale = 0.0
    else:
        f = b.constant(tf, w, scale=fscales[0], zero_point=fzp)
        bscale = conv.scale_product(in_s, fscales[0])
    bi = b.input(T.TENSOR_INT32, [cout], bscale) if bias_input else \
        b.constant(T.TENSOR_INT32, np.asarray(bias, np.int32), scale=bscale)
    y = b.output(tin, yshape, out_s, ozp)
    i32 = [b.scalar(T.INT32, v) for v in (2, 1, 1, 0)]  # VALID, strides 1, no activation
    if op == "conv":
        b.operation(O.CONV_2D, [x, f, bi, *i32], [y])
    elif op == "dw":
        b.operation(O.DEPTHWISE_CONV_2D, [x, f, bi, *i32[:3], b.scalar(T.INT32, 1), i32[3]],
                    [y])
    elif op == "grouped":
        b.operation(O.GROUPED_CONV_2D, [x, f, bi, *i32[:3], b.scalar(T.INT32, 2), i32[3],
                                        b.scalar(T.BOOL, False)], [y])
    elif op == "transpose":
        shape = b.constant(T.TENSOR_INT32, np.array(yshape, np.int32))
        b.operation(O.TRANSPOSE_CONV_2D, [x, f, bi, shape, *i32, b.scalar(T.BOOL, False)], [y])
    else:
        b.operation(O.FULLY_CONNECTED, [x, f, bi, i32[3]], [y])
    pairs = [C.quantize_multiplier(conv.conv_multiplier(in_s, s, out_s))
             for s in (fscales if kind == "pc" else fscales * cout)]
    return write_tflite(b.build()), dict(
        dtype=tin.dtype, w=w.astype(np.int64) - fzp, izp=izp, ozp=ozp, bias=np.array(bias),
        mult=np.array([p[0] for p in pairs]), shift=np.array([p[1] for p in pairs]))


def saturating_sums_conv(xc: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The exact sums of a 3x3 VALID stride-1 CONV_2D of centred values."""
    return np.stack([np.stack([np.einsum("nhwc,ohwc->no", xc[:, i:i + 3, j:j + 3], w)
                               for j in range(3)], 1) for i in range(3)], 1)


def saturating(op: str, x: np.ndarray, m: dict) -> np.ndarray:
    """What the kernels would give if sum + bias and its left shift saturated in int32
    instead of wrapping (nnhal's old arithmetic)."""
    xc = x.astype(np.int64) - m["izp"]
    w = m["w"]
    if op == "conv":
        sums = saturating_sums_conv(xc, w)
    elif op == "dw":
        sums = np.stack([np.stack([np.einsum("nhwc,hwc->nc", xc[:, i:i + 3, j:j + 3], w[0])
                                   for j in range(3)], 1) for i in range(3)], 1)
    elif op == "grouped":
        h, og = w.shape[3], w.shape[0] // 2
        sums = np.concatenate([saturating_sums_conv(xc[..., g * h:(g + 1) * h],
                                                    w[g * og:(g + 1) * og]) for g in (0, 1)], -1)
    elif op == "transpose":  # each input pixel scatters its taps
        sums = np.zeros((xc.shape[0], 7, 7, w.shape[0]), np.int64)
        for i in range(3):
            for j in range(3):
                sums[:, i:i + 5, j:j + 5] += np.einsum("nhwc,oc->nhwo", xc, w[:, i, j])
    else:
        sums = xc @ w.T
    total = np.clip(sums + m["bias"], I32MIN, I32MAX)
    left = np.maximum(m["shift"], 0)
    total = np.clip(total << left, I32MIN, I32MAX)
    r = C.rounding_divide_by_pot(C.srdhm(total, m["mult"]), np.maximum(-m["shift"], 0))
    lo, hi = C.qrange(T.TENSOR_QUANT8_ASYMM if m["dtype"] == np.uint8
                      else T.TENSOR_QUANT8_ASYMM_SIGNED)
    return np.clip(r + m["ozp"], lo, hi).astype(m["dtype"])


def tflite(data: bytes, x: np.ndarray, kernels) -> np.ndarray:
    it = Interpreter(model_content=data, experimental_op_resolver_type=kernels)
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    return it.get_tensor(it.get_output_details()[0]["index"])


def nnhal_run(data: bytes, x: np.ndarray, device: str) -> np.ndarray:
    from nnhal.session import Session

    s = Session(data, device=device, cache=False)
    try:
        (name,) = [t.name for t in s.inputs]
        return next(iter(s.run({name: x}).values()))
    finally:
        s.close()


def xla_available() -> bool:
    from nnhal.drivers.xla import unavailable
    return unavailable() is None


CASES = [(op, kind) for op in ("conv", "dw", "fc") for kind in ("pc", "i8", "u8")
         if not (op == "fc" and kind == "pc")]
CASES += [(op, kind) for op in ("grouped", "transpose") for kind in ("pc", "u8")]


@needs_litert
@pytest.mark.parametrize("shift_left", [False, True], ids=["limits", "left-shift"])
@pytest.mark.parametrize("op,kind", CASES)
def test_same_bytes_as_tflite_kernels(monkeypatch, op, kind, shift_left):
    data, m = build(op, kind, SHIFTED if shift_left else LIMITS, shift_left)
    dt = m["dtype"]
    info = np.iinfo(dt)
    x = np.random.default_rng(5).integers(info.min, info.max + 1,
                                          [4, COUT] if op == "fc" else [2, 5, 5, COUT]).astype(dt)
    builtin = tflite(data, x, OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    oracles = {"builtin": builtin}
    ref_kernels = getattr(OpResolverType, "BUILTIN_REF", None)  # (not in every release)
    if ref_kernels is not None and not (shift_left and op == "fc"):  # see the docstring
        oracles["reference kernels"] = tflite(data, x, ref_kernels)
    if not shift_left:
        oracles["xnnpack"] = tflite(data, x, OpResolverType.AUTO)
    for name, want in oracles.items():
        np.testing.assert_array_equal(want, builtin, err_msg=f"TFLite {name} differ")
    # The case tests something: saturating arithmetic would give other bytes.
    assert (saturating(op, x, m) != builtin).sum() >= 8
    got = {"reference": nnhal_run(data, x, "reference")}
    if native.library() is not None:  # the numpy path as well as the native kernels
        with monkeypatch.context() as mp:
            mp.setitem(native._state, "lib", None)
            got["reference, numpy path"] = nnhal_run(data, x, "reference")
    if xla_available() and (kind == "pc" or op in ("dw", "fc")):  # (compiles cost ~1 s each)
        got["xla"] = nnhal_run(data, x, "xla")
    for name, out in got.items():
        np.testing.assert_array_equal(out, builtin, err_msg=f"nnhal {name}")


@needs_litert
def test_long_sum_that_leaves_int32_wraps_as_tflite():
    """A FULLY_CONNECTED of 40,000 terms whose exact sum (-2.6e9) leaves int32 with a small
    bias: the reference's int32 sum wraps to a large positive value. nnhal's float64 sums
    are exact, and its fast float64 requantisation (exact only while sum + bias stays in
    int32) must not run for it."""
    n = 40_000
    b = ModelBuilder()
    x = b.input(T.TENSOR_QUANT8_ASYMM, [1, n], 0.5, 0)
    f = b.constant(T.TENSOR_QUANT8_ASYMM, np.zeros((1, n), np.uint8), scale=0.25,
                   zero_point=255)
    bias = b.constant(T.TENSOR_INT32, np.array([1000], np.int32), scale=0.125)
    y = b.output(T.TENSOR_QUANT8_ASYMM, [1, 1], 0.125 * 2**12, 128)
    b.operation(O.FULLY_CONNECTED, [x, f, bias, b.scalar(T.INT32, 0)], [y])
    data = write_tflite(b.build())
    xs = np.full((1, n), 255, np.uint8)
    want = tflite(data, xs, OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    total = n * 255 * -255 + 1000
    assert total < I32MIN and want.tolist() == [[255]]  # wrapped positive, saturated high
    assert nnhal_run(data, xs, "reference").tolist() == [[255]]


def test_litert_driver_refuses_only_a_left_shift_that_may_wrap():
    """XNNPACK saturates where the reference's left shift wraps, so the LiteRT driver does not
    claim a multiplier above 1 whose shifted sum + bias may leave int32; biases at the limits
    with a multiplier below 1 (XNNPACK wraps the sum as the reference does), and a multiplier
    above 1 whose shift cannot leave int32, stay claimed."""
    from nnhal.analysis import analyse
    from nnhal.drivers.litert.support import operation_reasons
    from nnhal.tflite import read_tflite

    for op, kind in CASES:
        for shift_left, bias in ((False, LIMITS), (True, SHIFTED), (True, [5, -7])):
            data, _ = build(op, kind, bias, shift_left)
            # (a GROUPED_CONV_2D comes back from the file as SPLIT, two CONV_2D, CONCATENATION)
            whys = operation_reasons(analyse(read_tflite(data).model, own_constants=False))
            if bias is SHIFTED:
                assert any(w and "XNNPACK requantises in float32" in w for w in whys), (op, kind)
            else:
                assert whys == [None] * len(whys), (op, kind, shift_left, whys)


@needs_litert
def test_xnnpack_leaves_a_bias_given_at_run_time_to_tflite_kernels():
    """Why the LiteRT driver still claims a wrapping left shift whose bias is a model input:
    XNNPACK does not take the operation then, and TFLite's own kernel wraps. A newer
    ai-edge-litert whose XNNPACK takes it fails here: the narrowing must then cover it."""
    from nnhal.analysis import analyse
    from nnhal.drivers.litert.support import operation_reasons
    from nnhal.tflite import read_tflite

    for op, kind in (("conv", "i8"), ("dw", "u8"), ("fc", "u8"), ("transpose", "pc")):
        data, m = build(op, kind, SHIFTED, True, bias_input=True)
        assert operation_reasons(analyse(read_tflite(data).model, own_constants=False)) \
            == [None]
        info = np.iinfo(m["dtype"])
        x = np.random.default_rng(2).integers(
            info.min, info.max + 1, [4, COUT] if op == "fc" else [2, 5, 5, COUT]).astype(
            m["dtype"])
        outs = []
        for kernels in (OpResolverType.AUTO, OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES):
            it = Interpreter(model_content=data, experimental_op_resolver_type=kernels)
            it.allocate_tensors()
            feeds = [x, m["bias"].astype(np.int32)]
            for d in it.get_input_details():
                it.set_tensor(d["index"], feeds[0] if d["dtype"] == m["dtype"] else feeds[1])
            it.invoke()
            outs.append(it.get_tensor(it.get_output_details()[0]["index"]))
        np.testing.assert_array_equal(outs[0], outs[1], err_msg=f"{op} {kind}")
        assert (saturating(op, x, m) != outs[1]).sum() >= 8  # the shift did wrap


@needs_litert
@pytest.mark.parametrize("scale", [2.0**-24, 6.0])
def test_batch_matmul_wraps_as_tflite_kernels(monkeypatch, scale):
    """BATCH_MATMUL int8 with an inner dimension whose sum leaves int32 (100,000 products of
    up to 255 x 127), and a multiplier below 1 or above 1 (its left shift wrapping too): the
    reference driver gives TFLite's builtin kernels' bytes. (The exporter refuses the second
    for LiteRT, whose XNNPACK crashed on such multipliers: written here past that check, for
    TFLite's own kernels only.)"""
    from nnhal.tflite import export_ops

    monkeypatch.setattr(export_ops, "_check_int8_matmul_multiplier", lambda cx: None)
    k = 100_000
    b = ModelBuilder()
    x = b.input(T.TENSOR_QUANT8_ASYMM_SIGNED, [1, 2, k], scale=1.0, zero_point=-128)
    rng = np.random.default_rng(7)
    w = np.where(rng.random((1, k, 3)) < 0.9, 127, -128).astype(np.int8)
    w[0, :, 2] = rng.integers(-128, 128, k)
    y = b.constant(T.TENSOR_QUANT8_ASYMM_SIGNED, w, scale=1.0, zero_point=0)
    out = b.output(T.TENSOR_QUANT8_ASYMM_SIGNED, [1, 2, 3], scale=1.0 / scale, zero_point=0)
    b.operation(O.BATCH_MATMUL, [x, y, b.scalar(T.BOOL, False), b.scalar(T.BOOL, False)],
                [out])
    data = write_tflite(b.build())
    xs = np.full((1, 2, k), 127, np.int8)
    xs[0, 1] = rng.integers(-128, 128, k)
    want = tflite(data, xs, OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    got = nnhal_run(data, xs, "reference")
    assert got.tolist() == want.tolist()
    sums = (xs.astype(np.int64) + 128) @ w.astype(np.int64)
    assert np.abs(sums).max() > I32MAX  # the case is the one that wraps
