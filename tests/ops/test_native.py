"""The native float32 convolution kernels (nnhal.ops.native): agreement with the numpy path
and a float64 brute force, the fallbacks, and concurrent first use."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nnhal.hal.types import OperandType, OperationType
from nnhal.ops import conv, native
from nnhal.ops.native import build
from nnhal.ops.testing import output, run_op, tensor

F32 = OperandType.TENSOR_FLOAT32
O = OperationType
ROOT = Path(__file__).resolve().parents[2]

needs_native = pytest.mark.skipif(native.library() is None,
                                  reason=f"native kernels not loaded: {native.status()}")


@pytest.fixture
def numpy_only(monkeypatch):
    """Run with the native kernels reported absent (the numpy fallback)."""
    monkeypatch.setitem(native._state, "lib", None)
    monkeypatch.setitem(native._state, "why", "disabled by the test")


@pytest.fixture
def fresh_state():
    """Forget the loaded library before and after (the next use loads it again)."""
    native.reset()
    yield
    native.reset()


def i32(v: int):
    return tensor(OperandType.INT32, v)


def _geometry(draw, kh, kw, max_hw=9):
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    dh, dw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    # top, bottom, left, right; each smaller than the dilated filter (validation's rule)
    ph, pw = min(2, dh * (kh - 1)), min(2, dw * (kw - 1))
    pads = tuple(draw(st.integers(0, m)) for m in (ph, ph, pw, pw))
    # an input at least as large as the dilated filter once padded
    h = draw(st.integers(max(1, dh * (kh - 1) + 1 - pads[0] - pads[1]), max_hw))
    w = draw(st.integers(max(1, dw * (kw - 1) + 1 - pads[2] - pads[3]), max_hw))
    return (sh, sw), (dh, dw), pads, h, w


def _special(draw, x: np.ndarray) -> np.ndarray:
    """Sprinkle NaN / +-Inf into a few positions of ``x`` (sometimes)."""
    k = draw(st.integers(0, 3))
    flat = x.reshape(-1)
    for _ in range(k):
        flat[draw(st.integers(0, flat.size - 1))] = draw(
            st.sampled_from([np.nan, np.inf, -np.inf]))
    return x


@st.composite
def dw_cases(draw):
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    stride, dil, pads, h, w = _geometry(draw, kh, kw)
    n, c, m = draw(st.integers(1, 2)), draw(st.integers(1, 20)), draw(st.integers(1, 3))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    x = _special(draw, rng.standard_normal((n, h, w, c)).astype(np.float32))
    f = rng.standard_normal((1, kh, kw, c * m)).astype(np.float32)
    b = rng.standard_normal(c * m).astype(np.float32)
    return x, f, b, stride, dil, pads, m, draw(st.integers(0, 3))


@st.composite
def conv_cases(draw):
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    stride, dil, pads, h, w = _geometry(draw, kh, kw)
    n, c, cout = draw(st.integers(1, 2)), draw(st.integers(1, 8)), draw(st.integers(1, 40))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    x = _special(draw, rng.standard_normal((n, h, w + 4 * draw(st.integers(0, 3)), c))
                 .astype(np.float32))
    f = rng.standard_normal((cout, kh, kw, c)).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    return x, f, b, stride, dil, pads, 1, draw(st.integers(0, 3))


def _run(op, case):
    x, f, b, (sh, sw), (dh, dw), pads, m, act = case
    ins = [tensor(F32, x), tensor(F32, f, const=True), tensor(F32, b, const=True)]
    ins += [i32(pads[2]), i32(pads[3]), i32(pads[0]), i32(pads[1]), i32(sw), i32(sh)]
    if op == O.DEPTHWISE_CONV_2D:
        ins.append(i32(m))
    ins += [i32(act), tensor(OperandType.BOOL, False), i32(dw), i32(dh)]
    (r,) = run_op(op, ins, [output(F32)])
    return r


def _brute(op, case):
    """float64 reference: explicit padding, every tap, bias, clamp."""
    x, f, b, (sh, sw), (dh, dw), (pt, pb, pl, pr), m, act = case
    xp = np.pad(x.astype(np.float64), ((0, 0), (pt, pb), (pl, pr), (0, 0)))
    kh, kw = f.shape[1:3]
    oh = (xp.shape[1] - dh * (kh - 1) - 1) // sh + 1
    ow = (xp.shape[2] - dw * (kw - 1) - 1) // sw + 1
    cout = f.shape[3] if op == O.DEPTHWISE_CONV_2D else f.shape[0]
    acc = np.zeros((x.shape[0], oh, ow, cout))
    with np.errstate(invalid="ignore", over="ignore"):
        for i in range(kh):
            for j in range(kw):
                win = xp[:, i * dh: i * dh + (oh - 1) * sh + 1: sh,
                         j * dw: j * dw + (ow - 1) * sw + 1: sw]
                if op == O.DEPTHWISE_CONV_2D:
                    acc += np.repeat(win, m, axis=3) * f[0, i, j]
                else:
                    acc += np.einsum("nhwc,oc->nhwo", win, f[:, i, j].astype(np.float64))
        acc += b
        lo, hi = {0: (-np.inf, np.inf), 1: (0, np.inf), 2: (-1, 1), 3: (0, 6)}[act]
        return np.clip(acc, lo, hi)


def _close(a, b):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, equal_nan=True)


@needs_native
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dw_cases())
def test_depthwise_native_matches_reference(case):
    r = _run(O.DEPTHWISE_CONV_2D, case)
    assert r.dtype == np.float32
    _close(r, _brute(O.DEPTHWISE_CONV_2D, case))


@needs_native
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv_cases())
def test_conv_direct_native_matches_reference(case):
    _close(_run(O.CONV_2D, case), _brute(O.CONV_2D, case))


@needs_native
@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(case=st.one_of(dw_cases().map(lambda c: (O.DEPTHWISE_CONV_2D, c)),
                      conv_cases().map(lambda c: (O.CONV_2D, c))))
def test_native_matches_numpy_path(monkeypatch, case):
    op, c = case
    native_r = _run(op, c)
    with monkeypatch.context() as mp:
        mp.setitem(native._state, "lib", None)
        numpy_r = _run(op, c)
    _close(native_r, numpy_r)


@needs_native
def test_mobilenet_shapes_and_bound_kernel_into():
    """The fast paths (3x3, 8-channel blocks, interior/border split) on MobileNet-like
    shapes, through kernel_into writing into a given output."""
    rng = np.random.default_rng(7)
    for op, case in [
        (O.DEPTHWISE_CONV_2D, (rng.standard_normal((1, 20, 19, 16)), (1, 3, 3, 16), (1, 1),
                               (1, 1, 1, 1), 3)),
        (O.DEPTHWISE_CONV_2D, (rng.standard_normal((2, 21, 20, 24)), (1, 3, 3, 24), (2, 2),
                               (0, 1, 0, 1), 0)),
        (O.CONV_2D, (rng.standard_normal((1, 33, 30, 3)), (16, 3, 3, 3), (2, 2),
                     (0, 1, 0, 1), 3)),
        (O.CONV_2D, (rng.standard_normal((1, 17, 26, 3)), (12, 3, 3, 3), (1, 1),
                     (1, 1, 1, 1), 1)),
    ]:
        x, fshape, stride, pads, act = case
        f = rng.standard_normal(fshape).astype(np.float32)
        b = rng.standard_normal(fshape[3] if op == O.DEPTHWISE_CONV_2D else fshape[0])
        c = (x.astype(np.float32), f, b.astype(np.float32), stride, (1, 1), pads, 1, act)
        _close(_run(op, c), _brute(op, c))


def test_numpy_fallback_is_correct(numpy_only):
    rng = np.random.default_rng(3)
    c = (rng.standard_normal((1, 7, 6, 8)).astype(np.float32),
         rng.standard_normal((1, 3, 3, 8)).astype(np.float32),
         rng.standard_normal(8).astype(np.float32), (1, 1), (1, 1), (1, 1, 1, 1), 1, 3)
    _close(_run(O.DEPTHWISE_CONV_2D, c), _brute(O.DEPTHWISE_CONV_2D, c))
    assert native.status() == "disabled by the test"


# ---- loading and fallbacks ---------------------------------------------------------------

def test_disabled_by_environment(monkeypatch, fresh_state):
    monkeypatch.setenv("NNHAL_NATIVE", "0")
    assert native.library() is None
    assert "NNHAL_NATIVE=0" in native.status()


def test_broken_compiler_falls_back(monkeypatch, tmp_path, fresh_state):
    monkeypatch.setenv("NNHAL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", "false")
    assert native.library() is None
    assert "compiler" in native.status()
    assert not list((tmp_path / "native").glob("*.so"))  # no partial file left behind
    c = (np.ones((1, 4, 4, 2), np.float32), np.ones((1, 3, 3, 2), np.float32),
         np.zeros(2, np.float32), (1, 1), (1, 1), (1, 1, 1, 1), 1, 0)
    r = _run(O.DEPTHWISE_CONV_2D, c)
    assert r[0, 1, 1, 0] == 9.0 and r[0, 0, 0, 0] == 4.0


def test_missing_compiler_falls_back(monkeypatch, tmp_path, fresh_state):
    monkeypatch.setenv("NNHAL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    assert native.library() is None
    assert "unusable" in native.status()


def test_compile_error_falls_back(monkeypatch, tmp_path, fresh_state):
    bad = tmp_path / "bad.c"
    bad.write_text("this is not C\n")
    monkeypatch.setenv("NNHAL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(build, "SOURCE", bad)
    assert native.library() is None
    assert "failed" in native.status()


def test_group_writable_cache_refused(monkeypatch, tmp_path, fresh_state):
    d = tmp_path / "native"
    d.mkdir()
    d.chmod(0o777)
    monkeypatch.setenv("NNHAL_CACHE_DIR", str(tmp_path))
    assert native.library() is None
    assert "writable by group or others" in native.status()


def test_foreign_cache_refused(monkeypatch, tmp_path, fresh_state):
    d = tmp_path / "native"
    d.mkdir(mode=0o700)
    if os.getuid() != 0:
        pytest.skip("changing a directory's owner needs root")
    os.chown(d, 65534, 65534)
    monkeypatch.setenv("NNHAL_CACHE_DIR", str(tmp_path))
    assert native.library() is None
    assert "not owned by this user" in native.status()


def test_unwritable_cache_falls_back(monkeypatch, tmp_path, fresh_state):
    f = tmp_path / "file"
    f.write_text("")
    monkeypatch.setenv("NNHAL_CACHE_DIR", str(f))  # a file where the directory should be
    assert native.library() is None
    assert "cache" in native.status()


@pytest.mark.skipif(native.library() is None, reason="no working C compiler")
def test_cache_is_private_and_reused(monkeypatch, tmp_path, fresh_state):
    monkeypatch.setenv("NNHAL_CACHE_DIR", str(tmp_path))
    assert native.library() is not None
    d = tmp_path / "native"
    assert d.stat().st_mode & 0o777 == 0o700
    (so,) = d.glob("kernels-*.so")
    assert native.status() == f"loaded from {so}"
    mtime = so.stat().st_mtime_ns
    native.reset()
    assert native.library() is not None and so.stat().st_mtime_ns == mtime  # not rebuilt
    assert not list(d.glob(".build-*"))


@pytest.mark.skipif(native.library() is None, reason="no working C compiler")
def test_concurrent_first_use(tmp_path):
    """Two processes compiling into one empty cache at once both load a working library."""
    script = textwrap.dedent("""
        import numpy as np, sys
        from nnhal.ops import conv, native
        lib = native.library()
        assert lib is not None, native.status()
        x = np.ones((1, 5, 5, 8), np.float32)
        k = native.DepthwiseF32(lib, np.ones((1, 3, 3, 8), np.float32), 0.0, 6.0)
        out = np.empty((1, 5, 5, 8), np.float32)
        k(x, np.zeros(8, np.float32), out, (1, 1), (1, 1), (1, 1, 1, 1))
        assert out[0, 2, 2, 0] == 6.0 and out[0, 0, 0, 0] == 4.0, out[0, :, :, 0]
        print(native.status())
    """)
    env = dict(os.environ, NNHAL_CACHE_DIR=str(tmp_path), PYTHONPATH=str(ROOT))
    env.pop("NNHAL_NATIVE", None)
    procs = [subprocess.Popen([sys.executable, "-c", script], env=env, cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for _ in range(3)]
    outs = [p.communicate(timeout=180) for p in procs]
    for p, (so, se) in zip(procs, outs):
        assert p.returncode == 0, se.decode()
        assert so.decode().startswith("loaded from")
    assert len(list((tmp_path / "native").glob("kernels-*.so"))) == 1
    assert not list((tmp_path / "native").glob(".build-*"))


# ---- 8-bit depthwise: identical integers to the numpy path ----------------------------------

U8 = OperandType.TENSOR_QUANT8_ASYMM
S8 = OperandType.TENSOR_QUANT8_ASYMM_SIGNED
PC = OperandType.TENSOR_QUANT8_SYMM_PER_CHANNEL


@st.composite
def q8_cases(draw):
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    stride, dil, pads, h, w = _geometry(draw, kh, kw)
    n, c, m = draw(st.integers(1, 2)), draw(st.integers(1, 20)), draw(st.integers(1, 3))
    t = draw(st.sampled_from([U8, S8]))
    ftype = draw(st.sampled_from([t, PC]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    lo_q, hi_q = (0, 255) if t == U8 else (-128, 127)
    x = rng.integers(lo_q, hi_q + 1, (n, h, w, c)).astype(t.dtype)
    cout = c * m
    if ftype == PC:
        f = rng.integers(-127, 128, (1, kh, kw, cout)).astype(np.int8)
        fq = (0.0, 0)
        cscales = list(rng.uniform(0.001, 0.05, cout).astype(np.float32))
    else:
        f = rng.integers(lo_q, hi_q + 1, (1, kh, kw, cout)).astype(t.dtype)
        fq = (float(rng.uniform(0.001, 0.05)), int(rng.integers(lo_q, hi_q + 1)))
        cscales = None
    in_q = (float(rng.uniform(0.005, 0.1)), int(rng.integers(lo_q, hi_q + 1)))
    out_q = (float(rng.uniform(0.0005, 0.5)), int(rng.integers(lo_q, hi_q + 1)))  # some > 1
    bias = rng.integers(-20000, 20000, cout).astype(np.int32)
    act = draw(st.integers(0, 3))
    return x, f, bias, stride, dil, pads, m, act, t, ftype, fq, cscales, in_q, out_q


def _run_q8(case):
    x, f, b, (sh, sw), (dh, dw), pads, m, act, t, ftype, fq, cscales, in_q, out_q = case
    if ftype == PC:  # the bias scales are implied per channel (given as 0)
        ins = [tensor(t, x, *in_q),
               tensor(PC, f, const=True, channel_scales=cscales, channel_dim=3),
               tensor(OperandType.TENSOR_INT32, b, 0.0, 0, const=True)]
    else:
        ins = [tensor(t, x, *in_q), tensor(t, f, *fq, const=True),
               tensor(OperandType.TENSOR_INT32, b, in_q[0] * fq[0], 0, const=True)]
    ins += [i32(pads[2]), i32(pads[3]), i32(pads[0]), i32(pads[1]), i32(sw), i32(sh), i32(m)]
    ins += [i32(act), tensor(OperandType.BOOL, False), i32(dw), i32(dh)]
    (r,) = run_op(O.DEPTHWISE_CONV_2D, ins, [output(t, None, *out_q)])
    return r


@needs_native
@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(case=q8_cases())
def test_depthwise_q8_native_identical_to_numpy(monkeypatch, case):
    monkeypatch.setattr(conv, "NATIVE_Q8_DEPTHWISE", True)
    native_r = _run_q8(case)
    with monkeypatch.context() as mp:
        mp.setitem(native._state, "lib", None)
        numpy_r = _run_q8(case)
    assert native_r.dtype == numpy_r.dtype == case[8].dtype
    np.testing.assert_array_equal(native_r, numpy_r)


def _q8_case_rng(rng):
    """A random 8-bit depthwise case (plain generator) spread over both requantisation routes:
    output scales from 1e-5 to 2 (right shifts past 12, left shifts), biases from a few to
    past the float route's 2**21 bound, zero points anywhere, RELU / RELU1 / RELU6 / none,
    filters up to 5x5, channels that leave a vector tail."""
    # 40%: the shape of the C kernel's register paths (3x3, unit dilation, multiplier 1,
    # channels a multiple of 8: its interior rows; other multiples of 8: its 8-channel pixels)
    fast = rng.random() < 0.4
    kh, kw = (3, 3) if fast and rng.random() < 0.7 else (int(v) for v in rng.integers(1, 6, 2))
    sh, sw, dh, dw = (int(v) for v in rng.integers(1, 3, 4))
    if fast:
        dh = dw = 1
    ph, pw = min(2, dh * (kh - 1)), min(2, dw * (kw - 1))
    pads = tuple(int(rng.integers(0, m + 1)) for m in (ph, ph, pw, pw))
    h = int(rng.integers(max(1, dh * (kh - 1) + 1 - pads[0] - pads[1]), 13))
    w = int(rng.integers(max(1, dw * (kw - 1) + 1 - pads[2] - pads[3]), 13))
    n, c, m = int(rng.integers(1, 3)), int(rng.integers(1, 41)), int(rng.integers(1, 4))
    if fast:
        c, m = 8 * int(rng.integers(1, 6)), 1
    t = [U8, S8][int(rng.integers(0, 2))]
    ftype = [t, PC][int(rng.integers(0, 2))]
    lo_q, hi_q = (0, 255) if t == U8 else (-128, 127)
    x = rng.integers(lo_q, hi_q + 1, (n, h, w, c)).astype(t.dtype)
    cout = c * m
    if ftype == PC:
        f = rng.integers(-127, 128, (1, kh, kw, cout)).astype(np.int8)
        fq, cscales = (0.0, 0), list(10 ** rng.uniform(-3.5, -1, cout).astype(np.float32))
    else:
        f = rng.integers(lo_q, hi_q + 1, (1, kh, kw, cout)).astype(t.dtype)
        fq, cscales = (float(10 ** rng.uniform(-3.5, -1)), int(rng.integers(lo_q, hi_q + 1))), None
    in_q = (float(10 ** rng.uniform(-2.5, -0.5)), int(rng.integers(lo_q, hi_q + 1)))
    out_q = (float(10 ** rng.uniform(-5, 0.3)), int(rng.integers(lo_q, hi_q + 1)))
    blim = int(2 ** rng.uniform(2, 23))
    bias = rng.integers(-blim, blim + 1, cout).astype(np.int32)
    act = int(rng.integers(0, 4))
    return x, f, bias, (sh, sw), (dh, dw), pads, m, act, t, ftype, fq, cscales, in_q, out_q


@needs_native
def test_depthwise_q8_native_both_routes_identical(monkeypatch):
    """800 random cases, native kernel against the numpy path byte for byte, counting which
    requantisation each native call took: the float64 route with the sign correction, the
    float64 route without it (a clamp at or above the zero point), and the int64 steps; each
    must have been exercised many times."""
    monkeypatch.setattr(conv, "NATIVE_Q8_DEPTHWISE", True)
    taken = {"float_sign": 0, "float_plain": 0, "int64": 0}
    real = native.DepthwiseQ8._route_args

    def spy(self, bias):
        args = real(self, bias)
        taken["int64" if args is None else "float_sign" if args[2] else "float_plain"] += 1
        return args

    monkeypatch.setattr(native.DepthwiseQ8, "_route_args", spy)
    rng = np.random.default_rng(20261123)
    for i in range(800):
        case = _q8_case_rng(rng)
        native_r = _run_q8(case)
        with monkeypatch.context() as mp:
            mp.setitem(native._state, "lib", None)
            numpy_r = _run_q8(case)
        assert native_r.dtype == numpy_r.dtype == case[8].dtype
        np.testing.assert_array_equal(native_r, numpy_r, err_msg=f"case {i}")
    assert min(taken.values()) >= 80, taken


@needs_native
def test_depthwise_q8_runs_native(monkeypatch):
    """The 8-bit case above does take the native kernel (not only the numpy path twice)."""
    monkeypatch.setattr(conv, "NATIVE_Q8_DEPTHWISE", True)
    calls = []
    real = native.DepthwiseQ8.__call__
    monkeypatch.setattr(native.DepthwiseQ8, "__call__",
                        lambda self, *a: calls.append(1) or real(self, *a))
    rng = np.random.default_rng(5)
    case = (rng.integers(0, 256, (1, 9, 8, 16)).astype(np.uint8),
            rng.integers(0, 256, (1, 3, 3, 16)).astype(np.uint8),
            rng.integers(-500, 500, 16).astype(np.int32), (1, 1), (1, 1), (1, 1, 1, 1), 1, 3,
            U8, U8, (0.02, 120), None, (0.05, 128), (0.1, 3))
    r = _run_q8(case)
    assert calls and r.dtype == np.uint8


@needs_native
def test_bound_kernel_into_repeated_calls_and_new_shapes():
    """The bound kernel's repeat path (shapes already checked) against the brute force, for
    new data, a new input shape, and a wrong output shape (still refused)."""
    from nnhal.ops.catalog import check_operation, lookup
    from nnhal.ops.resolver import OpContext, OpError

    rng = np.random.default_rng(11)
    f = rng.standard_normal((1, 3, 3, 16)).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    x0 = rng.standard_normal((1, 10, 9, 16)).astype(np.float32)
    ins = [tensor(F32, x0), tensor(F32, f, const=True), tensor(F32, b, const=True)]
    ins += [i32(1), i32(1), i32(1), i32(1), i32(1), i32(1), i32(1), i32(3)]
    op = O.DEPTHWISE_CONV_2D
    d = lookup(op)
    ctx = OpContext(op_type=op, inputs=[i for i, _ in ins], outputs=[output(F32)])
    check_operation(d, ctx)
    run = d.kernel_into(ctx)
    vals = [v for _, v in ins]
    for shape in [(1, 10, 9, 16), (1, 10, 9, 16), (2, 7, 12, 16), (1, 10, 9, 16)]:
        x = rng.standard_normal(shape).astype(np.float32)
        out = np.full(shape, np.nan, np.float32)
        run([x, *vals[1:]], [out], None)
        c = (x, f, b, (1, 1), (1, 1), (1, 1, 1, 1), 1, 3)
        _close(out, _brute(op, c))
    with pytest.raises(OpError):
        run([x, *vals[1:]], [np.empty((1, 10, 8, 16), np.float32)], None)
