"""The native 8-bit CONV_2D (nnhal.ops.native.ConvQ8, an int8 GEMM in C): bytes identical to
the numpy path and to a straightforward integer implementation of the reference arithmetic,
for random shapes, strides, dilations, paddings, zero points, per-tensor and per-channel
filters, both compiled variants (the byte dot product where the machine has it, the plain-C
loops otherwise)."""

from __future__ import annotations

import numpy as np
import pytest

from nnhal.core.native import cpu_flags
from nnhal.hal.types import OperandType, OperationType
from nnhal.ops import common as C
from nnhal.ops import conv, native
from nnhal.ops.native import build
from nnhal.ops.testing import output, run_op, tensor

U8 = OperandType.TENSOR_QUANT8_ASYMM
S8 = OperandType.TENSOR_QUANT8_ASYMM_SIGNED
PC = OperandType.TENSOR_QUANT8_SYMM_PER_CHANNEL
I32 = OperandType.TENSOR_INT32
O = OperationType

needs_native = pytest.mark.skipif(native.library() is None,
                                  reason=f"native kernels not loaded: {native.status()}")


def i32(v: int):
    return tensor(OperandType.INT32, v)


def random_case(rng: np.random.Generator, fits: bool = True) -> tuple:
    """A random 8-bit CONV_2D: filters 1x1 to 4x4 (1x1 in 40%), strides and dilations 1-2,
    paddings below the dilated filter, 1-70 channels (vector tails), output scales from 1e-5
    to 2 (right shifts past 12, left shifts), biases up to 2**23, any zero points and
    activation. ``fits``: per-tensor filters whose centred values stay signed bytes (the
    kernel's domain; otherwise anything, which the binder must refuse)."""
    one = rng.random() < 0.4
    kh, kw = (1, 1) if one else (int(v) for v in rng.integers(1, 5, 2))
    sh, sw, dh, dw = (int(v) for v in rng.integers(1, 3, 4))
    ph, pw = min(2, dh * (kh - 1)), min(2, dw * (kw - 1))
    pads = tuple(int(rng.integers(0, m + 1)) for m in (ph, ph, pw, pw))
    h = int(rng.integers(max(1, dh * (kh - 1) + 1 - pads[0] - pads[1]), 12))
    w = int(rng.integers(max(1, dw * (kw - 1) + 1 - pads[2] - pads[3]), 12))
    n, c, cout = int(rng.integers(1, 3)), int(rng.integers(1, 71)), int(rng.integers(1, 71))
    t = [U8, S8][int(rng.integers(0, 2))]
    ftype = [t, PC][int(rng.integers(0, 2))]
    lo_q, hi_q = (0, 255) if t == U8 else (-128, 127)
    x = rng.integers(lo_q, hi_q + 1, (n, h, w, c)).astype(t.dtype)
    if ftype == PC:
        f = rng.integers(-128, 128, (cout, kh, kw, c)).astype(np.int8)
        fq, cscales = (0.0, 0), list(10 ** rng.uniform(-3.5, -1, cout).astype(np.float32))
    else:
        zf = int(rng.integers(lo_q, hi_q + 1))
        if fits:
            f = np.clip(rng.integers(-128, 128, (cout, kh, kw, c)) + zf, lo_q, hi_q)
        else:
            f = rng.integers(lo_q, hi_q + 1, (cout, kh, kw, c))
        f = f.astype(t.dtype)
        fq, cscales = (float(10 ** rng.uniform(-3.5, -1)), zf), None
    in_q = (float(10 ** rng.uniform(-2.5, -0.5)), int(rng.integers(lo_q, hi_q + 1)))
    if rng.random() < 0.75:  # results spread over the output range
        typical = in_q[0] * float(np.mean(cscales) if cscales else fq[0]) * 74.0 ** 2 \
            * np.sqrt(kh * kw * c)
        out_q = (float(typical / 40 * 10 ** rng.uniform(-1, 1)), int(rng.integers(lo_q, hi_q + 1)))
        blim = int(74.0 ** 2 * np.sqrt(kh * kw * c) * rng.uniform(0, 3)) + 1
    else:  # extremes: saturation, long shifts, left shifts, large biases
        out_q = (float(10 ** rng.uniform(-5, 0.3)), int(rng.integers(lo_q, hi_q + 1)))
        blim = int(2 ** rng.uniform(2, 23))
    bias = rng.integers(-blim, blim + 1, cout).astype(np.int32)
    act = int(rng.integers(0, 4))
    return x, f, bias, (sh, sw), (dh, dw), pads, act, t, ftype, fq, cscales, in_q, out_q


def conv_inputs(case, channel_dim: int) -> list:
    """The input, filter and bias operands of a case (the filter per-channel along
    channel_dim, or per-tensor with the bias scale the HAL requires)."""
    x, f, b, _, _, _, _, t, ftype, fq, cscales, in_q, _ = case
    if ftype == PC:
        return [tensor(t, x, *in_q),
                tensor(PC, f, const=True, channel_scales=cscales, channel_dim=channel_dim),
                tensor(I32, b, 0.0, 0, const=True)]
    return [tensor(t, x, *in_q), tensor(t, f, *fq, const=True),
            tensor(I32, b, conv.scale_product(in_q[0], fq[0]), 0, const=True)]


def run_case(case) -> np.ndarray:
    _, _, _, (sh, sw), (dh, dw), pads, act, t, _, _, _, _, out_q = case
    ins = conv_inputs(case, 0)
    ins += [i32(pads[2]), i32(pads[3]), i32(pads[0]), i32(pads[1]), i32(sw), i32(sh)]
    ins += [i32(act), tensor(OperandType.BOOL, False), i32(dw), i32(dh)]
    (r,) = run_op(O.CONV_2D, ins, [output(t, None, *out_q)])
    return r


def brute_force(case) -> np.ndarray:
    """The reference arithmetic written out: int64 sums of (x - zin) * (f - zf) over the
    taps inside the input, + bias (wrapping in int32), MultiplyByQuantizedMultiplier per
    channel, + zp, clamp."""
    x, f, b, (sh, sw), (dh, dw), pads, act, t, ftype, fq, cscales, in_q, out_q = case
    n, h, w, c = x.shape
    cout, kh, kw, _ = f.shape
    top, bottom, left, right = pads
    oh = (h + top + bottom - (dh * (kh - 1) + 1)) // sh + 1
    ow = (w + left + right - (dw * (kw - 1) + 1)) // sw + 1
    xc = x.astype(np.int64) - in_q[1]
    fc = f.astype(np.int64) - (0 if ftype == PC else fq[1])
    acc = np.zeros((n, oh, ow, cout), np.int64)
    for oy in range(oh):
        for ox in range(ow):
            for ky in range(kh):
                for kx in range(kw):
                    iy, ix = oy * sh - top + ky * dh, ox * sw - left + kx * dw
                    if 0 <= iy < h and 0 <= ix < w:
                        acc[:, oy, ox] += xc[:, iy, ix] @ fc[:, ky, kx].T
    scales = cscales if ftype == PC else [fq[0]] * cout
    pairs = [C.quantize_multiplier(conv.conv_multiplier(in_q[0], float(s), out_q[0]))
             for s in scales]
    r = C.requantize_int32_sum(acc + b, np.array([p[0] for p in pairs]),
                               np.array([p[1] for p in pairs])) + out_q[1]
    lo, hi = C.quant_activation_range(act, out_q[0], out_q[1], t)
    return np.clip(r, lo, hi).astype(t.dtype)


@pytest.fixture
def spy(monkeypatch):
    """Counts the native kernel's calls."""
    calls = []
    real = native.ConvQ8.__call__
    monkeypatch.setattr(native.ConvQ8, "__call__",
                        lambda self, *a: calls.append(1) or real(self, *a))
    return calls


def _against_numpy(monkeypatch, spy, seed: int, count: int) -> dict:
    """``count`` random cases through the native kernel and the numpy path, byte for byte;
    returns how many calls requantised in int32 lanes and how many by the int64 steps."""
    monkeypatch.setattr(conv, "NATIVE_Q8_CONV", True)
    modes = {"int32": 0, "int64": 0}
    real = native.ConvQ8.correction

    def counting(self, bias):
        r = real(self, bias)
        modes["int64" if r[1] is None else "int32"] += 1
        return r

    monkeypatch.setattr(native.ConvQ8, "correction", counting)
    rng = np.random.default_rng(seed)
    distinct = []
    for i in range(count):
        case = random_case(rng)
        before = len(spy)
        native_r = run_case(case)
        assert len(spy) == before + 1, f"case {i} did not run the native kernel"
        with monkeypatch.context() as mp:
            mp.setitem(native._state, "lib", None)
            numpy_r = run_case(case)
        assert native_r.dtype == numpy_r.dtype == case[7].dtype
        np.testing.assert_array_equal(native_r, numpy_r, err_msg=f"case {i}")
        distinct.append(len(np.unique(native_r)))
    assert np.median(distinct) >= 10, "too few distinct results: the cases test little"
    return modes


@needs_native
def test_native_q8_conv_identical_to_numpy(monkeypatch, spy):
    """300 random cases, byte for byte, each through the native kernel, both of its
    requantisations many times."""
    modes = _against_numpy(monkeypatch, spy, 20261128, 300)
    assert min(modes.values()) >= 20, modes


#: Builds other than this machine's best: AVX2 without AVX-512 (most desktops, AMD before
#: Zen 4: the int16 multiply-add GEMM), AVX-512 without VNNI (the same GEMM, AVX-512's
#: requantisation) and no -march at all (the plain-C loops); the GEMM each must report.
OTHER_BUILDS = {"avx2": (*build.BASE_FLAGS, "-march=haswell"),
                "avx512f": (*build.BASE_FLAGS, "-march=skylake-avx512"), "c": build.BASE_FLAGS}
GEMM_OF = {"avx2": "avx2", "avx512f": "avx2", "c": "c"}


@needs_native
@pytest.mark.parametrize("kind", sorted(OTHER_BUILDS))
def test_other_builds_identical_to_numpy(monkeypatch, spy, kind):
    """The kernels compiled for another instruction set (as on a machine without the byte
    dot product) give the same bytes."""
    flags = OTHER_BUILDS[kind]
    if kind != "c" and kind not in cpu_flags().split():
        pytest.skip(f"this CPU cannot run an {kind} build")
    lib, why = build.build(flags)
    if lib is None:
        pytest.skip(f"{kind} build unavailable: {why}")
    native.reset()
    try:
        monkeypatch.setattr(build, "build_best", lambda: build.build(flags))
        assert native.library() is not None
        assert native.conv_q8_gemm(native.library()) == GEMM_OF[kind]
        assert native.conv_q8_fast(native.library()) == (kind != "c")
        modes = _against_numpy(monkeypatch, spy, 7, 60)
        assert min(modes.values()) >= 2, modes
    finally:
        native.reset()


@needs_native
def test_native_q8_conv_against_brute_force(monkeypatch, spy):
    monkeypatch.setattr(conv, "NATIVE_Q8_CONV", True)
    rng = np.random.default_rng(3)
    for i in range(40):
        case = random_case(rng)
        np.testing.assert_array_equal(run_case(case), brute_force(case), err_msg=f"case {i}")
    assert len(spy) == 40


@needs_native
def test_filter_beyond_signed_bytes_stays_on_numpy(monkeypatch, spy):
    """A per-tensor filter whose centred values leave [-128, 127] is not bound natively, and
    the result is still the reference's."""
    monkeypatch.setattr(conv, "NATIVE_Q8_CONV", True)
    rng = np.random.default_rng(12)
    seen = 0
    while seen < 5:
        case = random_case(rng, fits=False)
        centred = case[1].astype(np.int32) - (0 if case[8] == PC else case[9][1])
        if native.ConvQ8.fits(centred):
            continue
        seen += 1
        np.testing.assert_array_equal(run_case(case), brute_force(case))
    assert not spy


def test_numpy_fallback_matches_brute_force(monkeypatch):
    """Without the native kernels (no compiler), the numpy path is the reference's."""
    monkeypatch.setitem(native._state, "lib", None)
    monkeypatch.setitem(native._state, "why", "disabled by the test")
    rng = np.random.default_rng(4)
    for i in range(15):
        case = random_case(rng)
        np.testing.assert_array_equal(run_case(case), brute_force(case), err_msg=f"case {i}")


# ---- 8-bit depthwise, 16 channels at a time (nnhal_dwconv_q8v) --------------------------------

def random_depthwise(rng: np.random.Generator) -> tuple:
    """A depthwise case of the 16-lane kernel's shape (multiplier 1, channels a multiple of
    16), 3x3 in 70% (its interior rows), else 1x1 to 5x5 with dilations; requantisations
    of both kinds (left shifts, long right shifts and large biases take the int64 steps)."""
    kh, kw = (3, 3) if rng.random() < 0.7 else (int(v) for v in rng.integers(1, 6, 2))
    sh, sw = (int(v) for v in rng.integers(1, 3, 2))
    dh, dw = (1, 1) if (kh, kw) == (3, 3) else (int(v) for v in rng.integers(1, 3, 2))
    ph, pw = min(2, dh * (kh - 1)), min(2, dw * (kw - 1))
    pads = tuple(int(rng.integers(0, m + 1)) for m in (ph, ph, pw, pw))
    h = int(rng.integers(max(1, dh * (kh - 1) + 1 - pads[0] - pads[1]), 12))
    w = int(rng.integers(max(1, dw * (kw - 1) + 1 - pads[2] - pads[3]), 12))
    n, c = int(rng.integers(1, 3)), 16 * int(rng.integers(1, 4))
    t = [U8, S8][int(rng.integers(0, 2))]
    ftype = [t, PC][int(rng.integers(0, 2))]
    lo_q, hi_q = (0, 255) if t == U8 else (-128, 127)
    x = rng.integers(lo_q, hi_q + 1, (n, h, w, c)).astype(t.dtype)
    if ftype == PC:
        f = rng.integers(-127, 128, (1, kh, kw, c)).astype(np.int8)
        fq, cscales = (0.0, 0), list(10 ** rng.uniform(-3.5, -1, c).astype(np.float32))
    else:
        f = rng.integers(lo_q, hi_q + 1, (1, kh, kw, c)).astype(t.dtype)
        fq, cscales = (float(10 ** rng.uniform(-3.5, -1)), int(rng.integers(lo_q, hi_q + 1))), None
    in_q = (float(10 ** rng.uniform(-2.5, -0.5)), int(rng.integers(lo_q, hi_q + 1)))
    if rng.random() < 0.6:
        typical = in_q[0] * float(np.mean(cscales) if cscales else fq[0]) * 74.0 ** 2 * kh
        out_q = (float(typical / 40 * 10 ** rng.uniform(-1, 1)), int(rng.integers(lo_q, hi_q + 1)))
        blim = int(74.0 ** 2 * kh * rng.uniform(0, 3)) + 1
    else:
        out_q = (float(10 ** rng.uniform(-6, 0.3)), int(rng.integers(lo_q, hi_q + 1)))
        blim = int(2 ** rng.uniform(2, 30.9))
    bias = rng.integers(-blim, blim + 1, c).astype(np.int32)
    act = int(rng.integers(0, 4))
    return x, f, bias, (sh, sw), (dh, dw), pads, act, t, ftype, fq, cscales, in_q, out_q


def run_depthwise(case) -> np.ndarray:
    _, _, _, (sh, sw), (dh, dw), pads, act, t, _, _, _, _, out_q = case
    ins = conv_inputs(case, 3)
    ins += [i32(pads[2]), i32(pads[3]), i32(pads[0]), i32(pads[1]), i32(sw), i32(sh), i32(1)]
    ins += [i32(act), tensor(OperandType.BOOL, False), i32(dw), i32(dh)]
    (r,) = run_op(O.DEPTHWISE_CONV_2D, ins, [output(t, None, *out_q)])
    return r


@needs_native
@pytest.mark.parametrize("kind", ["best", "avx2"])
def test_depthwise_16_lanes_identical_to_numpy(monkeypatch, kind):
    """300 random cases of the 16-lane depthwise kernel (this machine's best build, and the
    AVX2 one: two 8-lane halves) against the numpy path, byte for byte, with both of its
    requantisations exercised many times."""
    if kind == "avx2":
        if "avx2" not in cpu_flags().split():
            pytest.skip("this CPU cannot run an AVX2 build")
        lib, why = build.build(OTHER_BUILDS["avx2"])
        if lib is None:
            pytest.skip(f"avx2 build unavailable: {why}")
        native.reset()
        monkeypatch.setattr(build, "build_best", lambda: build.build(OTHER_BUILDS["avx2"]))
        try:
            assert native.conv_q8_gemm(native.library()) == "avx2"
            _depthwise_against_numpy(monkeypatch)
        finally:
            native.reset()
    else:
        _depthwise_against_numpy(monkeypatch)


def _depthwise_against_numpy(monkeypatch) -> None:
    if not native.depthwise_q8_lanes(native.library()):
        pytest.skip("kernels compiled without AVX-512 or AVX2: no 16-lane depthwise kernel")
    monkeypatch.setattr(conv, "NATIVE_Q8_DEPTHWISE", True)
    modes = {"int32": 0, "int64": 0, "other": 0}
    real_bias, real_call = native.DepthwiseQ8._vec_bias, native.DepthwiseQ8.__call__

    def counting(self, bias):
        r = real_bias(self, bias)
        modes["int64" if r[1] is None else "int32"] += 1
        return r

    def call(self, *a):
        if self._vec is None:
            modes["other"] += 1
        return real_call(self, *a)

    monkeypatch.setattr(native.DepthwiseQ8, "_vec_bias", counting)
    monkeypatch.setattr(native.DepthwiseQ8, "__call__", call)
    rng = np.random.default_rng(99)
    for i in range(300):
        case = random_depthwise(rng)
        native_r = run_depthwise(case)
        with monkeypatch.context() as mp:
            mp.setitem(native._state, "lib", None)
            numpy_r = run_depthwise(case)
        np.testing.assert_array_equal(native_r, numpy_r, err_msg=f"case {i}")
    assert modes["int32"] >= 60 and modes["int64"] >= 30, modes


@needs_native
def test_bound_kernels_from_several_threads(monkeypatch):
    """One bound 8-bit CONV_2D and DEPTHWISE_CONV_2D called from four threads at once (each
    thread has its own argument array and scratch): every result is the sequential one."""
    import threading

    from nnhal.ops.catalog import check_operation, lookup
    from nnhal.ops.resolver import OpContext

    monkeypatch.setattr(conv, "NATIVE_Q8_CONV", True)
    rng = np.random.default_rng(8)
    runs = []
    for op, fshape, extra, cdim in ((O.CONV_2D, (48, 3, 3, 32), [], 0),
                                    (O.DEPTHWISE_CONV_2D, (1, 3, 3, 32), [i32(1)], 3)):
        cout = fshape[0] if op == O.CONV_2D else fshape[3]
        ins = [tensor(S8, rng.integers(-128, 128, (1, 20, 20, 32)).astype(np.int8), 0.02, -5),
               tensor(PC, rng.integers(-127, 128, fshape).astype(np.int8), const=True,
                      channel_scales=list(rng.uniform(0.002, 0.01, cout)), channel_dim=cdim),
               tensor(I32, rng.integers(-999, 999, cout).astype(np.int32), 0.0, 0, const=True)]
        ins += [i32(1), i32(1), i32(1), i32(1), i32(1), i32(1), *extra, i32(3)]
        ctx = OpContext(op_type=op, inputs=[i for i, _ in ins],
                        outputs=[output(S8, (1, 20, 20, cout), 0.05, -128)])
        d = lookup(op)
        check_operation(d, ctx)
        runs.append((d.kernel_into(ctx), [v for _, v in ins], cout))
    feeds = [rng.integers(-128, 128, (1, 20, 20, 32)).astype(np.int8) for _ in range(4)]
    expected = []
    for run, vals, cout in runs:
        for x in feeds:
            out = np.empty((1, 20, 20, cout), np.int8)
            run([x, *vals[1:]], [out], None)
            expected.append(out)
    got: dict[tuple[int, int], np.ndarray] = {}
    errors = []

    def worker(t: int) -> None:
        try:
            for _ in range(30):
                for k, (run, vals, cout) in enumerate(runs):
                    out = np.empty((1, 20, 20, cout), np.int8)
                    run([feeds[t], *vals[1:]], [out], None)
                    prev = got.setdefault((k, t), out)
                    if not np.array_equal(prev, out):
                        errors.append((k, t))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    for k in range(2):
        for t in range(4):
            np.testing.assert_array_equal(got[(k, t)], expected[k * 4 + t])


def random_fc(rng: np.random.Generator) -> tuple:
    """An 8-bit FULLY_CONNECTED: batch 1-5, input size 1-300, 1-70 units, weights whose
    centred values stay signed bytes, results spread over the output range (or extremes)."""
    batch, size = int(rng.integers(1, 6)), int(rng.integers(1, 301))
    units = int(rng.integers(1, 71))
    t = [U8, S8][int(rng.integers(0, 2))]
    lo_q, hi_q = (0, 255) if t == U8 else (-128, 127)
    x = rng.integers(lo_q, hi_q + 1, (batch, size)).astype(t.dtype)
    zf = int(rng.integers(lo_q, hi_q + 1))
    wts = np.clip(rng.integers(-128, 128, (units, size)) + zf, lo_q, hi_q).astype(t.dtype)
    in_q = (float(10 ** rng.uniform(-2.5, -0.5)), int(rng.integers(lo_q, hi_q + 1)))
    fq = (float(10 ** rng.uniform(-3.5, -1)), zf)
    if rng.random() < 0.75:
        out_q = (float(in_q[0] * fq[0] * 74.0 ** 2 * np.sqrt(size) / 40 * 10 ** rng.uniform(-1, 1)),
                 int(rng.integers(lo_q, hi_q + 1)))
    else:
        out_q = (float(10 ** rng.uniform(-5, 0.3)), int(rng.integers(lo_q, hi_q + 1)))
    bias = rng.integers(-30000, 30001, units).astype(np.int32)
    return x, wts, bias, int(rng.integers(0, 4)), t, in_q, fq, out_q


def run_fc(case) -> np.ndarray:
    x, wts, b, act, t, in_q, fq, out_q = case
    ins = [tensor(t, x, *in_q), tensor(t, wts, *fq, const=True),
           tensor(I32, b, conv.scale_product(in_q[0], fq[0]), 0, const=True), i32(act)]
    (r,) = run_op(O.FULLY_CONNECTED, ins, [output(t, None, *out_q)])
    return r


@needs_native
def test_fully_connected_identical_to_numpy(monkeypatch, spy):
    """8-bit FULLY_CONNECTED through the native 1x1 convolution: 150 random cases, each
    through the kernel, byte for byte the numpy path's results."""
    monkeypatch.setattr(conv, "NATIVE_Q8_CONV", True)
    rng = np.random.default_rng(31)
    for i in range(150):
        case = random_fc(rng)
        before = len(spy)
        native_r = run_fc(case)
        assert len(spy) == before + 1, f"case {i} did not run the native kernel"
        with monkeypatch.context() as mp:
            mp.setitem(native._state, "lib", None)
            numpy_r = run_fc(case)
        np.testing.assert_array_equal(native_r, numpy_r, err_msg=f"case {i}")
