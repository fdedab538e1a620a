"""Native float32 convolution kernels (C, compiled at first use, called through ctypes).

:func:`library` compiles and loads ``kernels.c`` once per process (see :mod:`.build`); when
that is impossible (no compiler, a cache directory that is not private, ``NNHAL_NATIVE=0``)
it returns None and :func:`status` says why, and the callers keep their numpy paths.

:class:`DepthwiseF32` and :class:`ConvDirectF32` are bound once per operation at prepare:
the constant filter laid out for the kernel and kept alive, ctypes argument types set once;
a call passes the data pointers and an int64 geometry array cached per input shape.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
import weakref
from collections.abc import Iterator

import numpy as np

from nnhal.core.native import switched_off
from nnhal.ops.conv_engine import scratch_address as _scratch_address
from nnhal.ops.native import build as _build

log = logging.getLogger("nnhal.ops.native")

_ABI = 5
#: Indices of the geometry array (kernels.c's P_* enum).
_P_COUNT = 16

_lock = threading.Lock()
_state: dict[str, object] = {}


def _load() -> tuple[ctypes.CDLL | None, str]:
    off = switched_off()
    if off:
        return None, off
    try:
        lib, why = _build.build_best()
        if lib is None:
            return None, why
        lib.nnhal_abi_version.restype = ctypes.c_int64
        lib.nnhal_abi_version.argtypes = []
        if lib.nnhal_abi_version() != _ABI:
            return None, f"kernel ABI {lib.nnhal_abi_version()} != {_ABI}"
        sig = [ctypes.c_void_p] * 5 + [ctypes.c_float, ctypes.c_float]
        for name in ("nnhal_dwconv_f32", "nnhal_conv_direct_f32"):
            fn = getattr(lib, name)
            fn.argtypes = sig
            fn.restype = None
        lib.nnhal_dwconv_q8.argtypes = [ctypes.c_void_p] * 9
        lib.nnhal_dwconv_q8.restype = None
        lib.nnhal_dwconv_q8f.argtypes = [ctypes.c_void_p] * 11
        lib.nnhal_dwconv_q8f.restype = None
        lib.nnhal_conv_q8.argtypes = [ctypes.c_void_p] * 11
        lib.nnhal_conv_q8.restype = None
        lib.nnhal_conv_q8_isa.argtypes = []
        lib.nnhal_conv_q8_isa.restype = ctypes.c_int64
        lib.nnhal_dwconv_q8v.argtypes = [ctypes.c_void_p] * 10
        lib.nnhal_dwconv_q8v.restype = ctypes.c_int64
        lib.nnhal_conv_q8_a.argtypes = [ctypes.c_void_p]
        lib.nnhal_conv_q8_a.restype = None
        lib.nnhal_dwconv_q8v_a.argtypes = [ctypes.c_void_p]
        lib.nnhal_dwconv_q8v_a.restype = ctypes.c_int64
        return lib, why
    except Exception as e:  # never let a build problem reach a user
        return None, f"native kernels unavailable: {type(e).__name__}: {e}"


def library() -> ctypes.CDLL | None:
    """The loaded kernels, or None (see :func:`status`); built on first call."""
    if "lib" not in _state:
        with _lock:
            if "lib" not in _state:
                lib, why = _load()
                _state["why"] = why
                _state["lib"] = lib
                quiet = lib is not None or why.startswith("disabled")
                (log.info if quiet else log.warning)("native kernels: %s", why)
    return _state["lib"]  # type: ignore[return-value]


def status() -> str:
    """"loaded from PATH", or why the native kernels are not used."""
    library()
    return str(_state["why"])


def status_if_tried() -> str | None:
    """:func:`status` when loading has been attempted in this process, else None (no build)."""
    return _state.get("why")  # type: ignore[return-value]


@contextlib.contextmanager
def disabled(reason: str = "disabled by the caller") -> Iterator[None]:
    """Operations bound inside the block use the numpy paths (process-wide; for tests and
    benchmarks that need the numpy results, e.g. to build a model from them)."""
    with _lock:
        saved = dict(_state)
        _state.update(lib=None, why=reason)
    try:
        yield
    finally:
        with _lock:
            _state.clear()
            _state.update(saved)


def reset() -> None:
    """Forget the loaded state (tests: the next :func:`library` call loads again)."""
    with _lock:
        _state.clear()


#: id -> (weak reference, data address) of arrays passed to the 8-bit kernels: an array
#: object's address never changes, and ``.ctypes.data`` costs more than a small layer.
_addresses: dict[int, tuple[weakref.ref, int]] = {}


def address(a: np.ndarray) -> int:
    """``a.ctypes.data``, remembered for array views (the executor passes the same arena and
    request views run after run; a view cannot be resized, so its address is fixed)."""
    hit = _addresses.get(id(a))
    if hit is not None and hit[0]() is a:
        return hit[1]
    addr = a.ctypes.data
    if a.base is not None:
        if len(_addresses) > 256:
            _addresses.clear()
        _addresses[id(a)] = (weakref.ref(a), addr)
    return addr


class _Bound:
    """A native kernel bound to one operation's constant filter and clamp."""

    fn_name = ""
    in_dtype = out_dtype = np.dtype(np.float32)
    bias_dtype = np.dtype(np.float32)

    def accepts(self, x: np.ndarray, bias: np.ndarray, out: np.ndarray) -> bool:
        """Whether the arrays of this call have the kernel's dtypes and C-contiguous layout."""
        return (x.dtype == self.in_dtype and out.dtype == self.out_dtype
                and bias.dtype == self.bias_dtype and x.flags.c_contiguous
                and out.flags.c_contiguous and bias.flags.c_contiguous)

    def __init__(self, lib: ctypes.CDLL, filt: np.ndarray, lo: float, hi: float) -> None:
        self._fn = getattr(lib, self.fn_name)
        self.filt = self.pack(np.asarray(filt, dtype=np.float32))
        self._fptr = self.filt.ctypes.data
        self.lo, self.hi = float(lo), float(hi)
        self._geo: dict[tuple, np.ndarray] = {}

    def pack(self, filt: np.ndarray) -> np.ndarray:  # pragma: no cover - overridden
        raise NotImplementedError

    def cout(self) -> int:  # pragma: no cover - overridden
        raise NotImplementedError

    def mult(self, c: int) -> int:
        return 1

    def __call__(self, x: np.ndarray, bias: np.ndarray, out: np.ndarray,
                 stride: tuple[int, int], dilation: tuple[int, int],
                 pads: tuple[int, int, int, int]) -> None:
        """``x`` [N, H, W, C] and ``out`` [N, OH, OW, COUT], ``bias`` [COUT] as
        :meth:`accepts` requires; ``pads`` (top, bottom, left, right)."""
        self._fn(x.ctypes.data, out.ctypes.data, self.geometry(x, out, stride, dilation, pads),
                 self._fptr, bias.ctypes.data, self.lo, self.hi)

    def geometry(self, x: np.ndarray, out: np.ndarray, stride: tuple[int, int],
                 dilation: tuple[int, int], pads: tuple[int, int, int, int]) -> int:
        """The address of the int64 geometry array of this call (cached per shapes)."""
        key = (x.shape, out.shape, stride, dilation, pads)
        geo = self._geo.get(key)
        if geo is None:
            n, h, w, c = x.shape
            _, oh, ow, cout = out.shape
            kh, kw = self.filt_hw
            geo = np.array([n, h, w, c, oh, ow, cout, kh, kw, stride[0], stride[1],
                            dilation[0], dilation[1], pads[0], pads[2], self.mult(c)],
                           dtype=np.int64)
            assert geo.size == _P_COUNT
            if len(self._geo) > 16:
                self._geo.clear()
            self._geo[key] = (geo, geo.ctypes.data)
            return geo.ctypes.data
        return geo[1]


class DepthwiseF32(_Bound):
    """DEPTHWISE_CONV_2D; ``filt`` is the NNAPI filter [1, KH, KW, COUT]."""

    fn_name = "nnhal_dwconv_f32"

    def pack(self, filt: np.ndarray) -> np.ndarray:
        self.filt_hw = (filt.shape[1], filt.shape[2])
        self._cout = filt.shape[3]
        return np.ascontiguousarray(filt.reshape(filt.shape[1:]))

    def mult(self, c: int) -> int:
        return self._cout // c


class ConvDirectF32(_Bound):
    """CONV_2D with one group; ``filt`` is the NNAPI filter [COUT, KH, KW, C], packed as
    [ceil(COUT/8), KH, KW, C, 8] (zero-padded)."""

    fn_name = "nnhal_conv_direct_f32"

    def pack(self, filt: np.ndarray) -> np.ndarray:
        cout, kh, kw, c = filt.shape
        self.filt_hw = (kh, kw)
        nb = (cout + 7) // 8
        padded = np.zeros((nb * 8, kh, kw, c), np.float32)
        padded[:cout] = filt
        return np.ascontiguousarray(padded.reshape(nb, 8, kh, kw, c).transpose(0, 2, 3, 4, 1))


class DepthwiseQ8(DepthwiseF32):
    """8-bit DEPTHWISE_CONV_2D (uint8 or int8 data, per-tensor or per-channel filter): int32
    sums in C, then the requantisation bit-exact with the numpy path of nnhal.ops.conv.

    ``centred`` is the filter minus its zero point [1, KH, KW, COUT] (int32), ``multiplier``
    and ``shift`` scalar or per output channel, ``lo``/``hi`` the integer clamp.

    Where ``requantizer`` (the operation's :class:`nnhal.ops.conv_engine.Requantizer`) has its
    float64 route for the call's bias and this clamp, the C kernel applies that route's
    per-channel tables (vectorised, the same double operations in the same order as the numpy
    passes); elsewhere it runs the reference's int64 fixed-point steps. Which one is taken
    is exactly what the numpy path decides, so both give identical bytes. The route's tables
    are made once per bias (at the first call for a constant bias) and kept.
    """

    fn_name = "nnhal_dwconv_q8"
    bias_dtype = np.dtype(np.int32)

    def __init__(self, lib: ctypes.CDLL, centred: np.ndarray, multiplier: np.ndarray,
                 shift: np.ndarray, in_zero_point: int, out_zero_point: int, lo: int, hi: int,
                 in_dtype: np.dtype, out_dtype: np.dtype, requantizer=None,
                 const_bias: np.ndarray | None = None) -> None:
        self._fn = getattr(lib, self.fn_name)
        self._fnf = lib.nnhal_dwconv_q8f
        self.filt = np.ascontiguousarray(np.asarray(centred, np.int32).reshape(centred.shape[1:]))
        self.filt_hw = (centred.shape[1], centred.shape[2])
        self._cout = cout = centred.shape[3]
        self._fptr = self.filt.ctypes.data
        self.mult_arr = np.ascontiguousarray(np.broadcast_to(
            np.asarray(multiplier, np.int64), (cout,)).astype(np.int32))
        self.shift_arr = np.ascontiguousarray(np.broadcast_to(
            np.asarray(shift, np.int64), (cout,)).astype(np.int32))
        self.in_dtype, self.out_dtype = np.dtype(in_dtype), np.dtype(out_dtype)
        self.q = np.array([in_zero_point, out_zero_point, lo, hi, self.in_dtype == np.int8,
                           self.out_dtype == np.int8], np.int64)
        self._tail = (self.mult_arr.ctypes.data, self.shift_arr.ctypes.data, self.q.ctypes.data)
        self._geo = {}
        self._rq = requantizer
        self._lohi = (int(lo), int(hi))
        self._zin_signed = (int(in_zero_point), int(self.in_dtype == np.int8))
        #: the constant bias object -> its float-route arguments (None: the int64 steps)
        self._const_bias = const_bias
        self._const_args: tuple | None | bool = False
        self._by_route: tuple | None = None
        self._vec = None
        kh, kw = self.filt_hw
        sh = self.shift_arr.astype(np.int64)
        if depthwise_q8_lanes(lib) and cout % 16 == 0 and kh * kw * 255 * 255 < 1 << 24 \
                and int(sh.max()) <= 24 and int(sh.min()) >= -62:
            # nnhal_dwconv_q8v: float32 sums (exact below 2**24), int64 requantisation
            mask = (np.int64(1) << np.maximum(-sh, 0)) - 1
            self._vfilt = np.ascontiguousarray(self.filt, np.float32)
            self._vrq = np.ascontiguousarray(np.stack(
                [self.mult_arr.astype(np.int64), np.maximum(sh, 0), np.maximum(-sh, 0), mask,
                 mask >> 1]))
            self._vq = np.array([in_zero_point, out_zero_point, lo, hi,
                                 self.in_dtype == np.int8], np.int64)
            self._vec = (lib.nnhal_dwconv_q8v_a, self._vfilt.ctypes.data,
                         self._vrq.ctypes.data, self._vq.ctypes.data)
            self._local = threading.local()
            #: the int32 requantisation's tables (no left shift, right shifts up to 30)
            self._vrq32 = None
            if int(sh.max()) <= 0 and int(sh.min()) >= -30:
                self._vrq32 = np.ascontiguousarray(self._vrq[[0, 2, 3, 4]].astype(np.int32))
            self._vbias = None if const_bias is None else self._vec_bias(const_bias)

    def _vec_bias(self, bias: np.ndarray) -> tuple:
        """(int64 bias, int32 bias or None, their pointers): the int32 one where every sum
        plus bias stays in int32 (sums below 2**24 in magnitude) and the tables allow."""
        b64 = np.ascontiguousarray(bias, np.int64)
        b32 = None
        if self._vrq32 is not None and (b64.size == 0 or
                                        int(np.abs(b64).max()) + (1 << 24) < 1 << 31):
            b32 = np.ascontiguousarray(b64, np.int32)
        return (b64, b32, b64.ctypes.data, 0 if b32 is None else b32.ctypes.data,
                0 if b32 is None else self._vrq32.ctypes.data)

    def _route_args(self, bias: np.ndarray) -> tuple | None:
        """The float-route arguments of the C kernel for ``bias``, or None (int64 steps)."""
        if self._rq is None:
            return None
        r = self._rq._route(bias, self._cout, *self._lohi)
        if r is None:
            return None
        hit = self._by_route
        if hit is not None and hit[0] is r:
            return hit[1]
        tabs = [None if t is None else np.ascontiguousarray(t, np.float64)
                for t in (r.scale, r.offset, r.threshold, r.post)]
        q = np.array([*self._zin_signed, r.off % 256], np.int64)
        lohi = np.array([r.lo, r.hi], np.float64)
        ptrs = tuple(0 if t is None else t.ctypes.data for t in tabs)
        args = (*ptrs, q.ctypes.data, lohi.ctypes.data, (tabs, q, lohi))  # last: keep alive
        self._by_route = (r, args)
        return args

    def __call__(self, x, bias, out, stride, dilation, pads) -> None:
        geo = self.geometry(x, out, stride, dilation, pads)
        vec = self._vec
        if vec is not None:
            vb = self._vbias if bias is self._const_bias and self._vbias is not None \
                else self._vec_bias(bias)
            args = getattr(self._local, "a", None)
            if args is None:
                args = self._local.a = (ctypes.c_int64 * 10)(0, 0, 0, vec[1], 0, vec[2],
                                                             vec[3], 0, 0, 0)
            args[0] = address(x)
            args[1] = address(out)
            args[2] = geo
            args[4], args[7], args[8] = vb[2:]
            args[9] = _scratch_address("dwq8_x", x.size, np.float32)
            if vec[0](ctypes.addressof(args)):
                return
        acc = np.empty(self._cout, np.int32)
        if bias is self._const_bias and self._const_args is not False:
            args = self._const_args
        else:
            args = self._route_args(bias)
            if bias is self._const_bias:
                self._const_args = args
        if args is None:
            self._fn(x.ctypes.data, out.ctypes.data, geo, self._fptr, bias.ctypes.data,
                     *self._tail, acc.ctypes.data)
        else:
            self._fnf(x.ctypes.data, out.ctypes.data, geo, self._fptr, *args[:6],
                      acc.ctypes.data)


#: Panel geometry of nnhal_conv_q8 (kernels.c's Q8_MR and Q8_NR).
Q8_MR, Q8_NR = 6, 32


def conv_q8_fast(lib: ctypes.CDLL) -> bool:
    """Whether ``lib``'s 8-bit GEMM convolution was compiled with vector instructions
    (AVX-512 VNNI's byte dot product or AVX2's int16 multiply-add); the plain-C loops are
    exact but slower than the numpy path."""
    return bool(int(lib.nnhal_conv_q8_isa()) & 2)


def conv_q8_gemm(lib: ctypes.CDLL) -> str:
    """Which 8-bit GEMM ``lib`` has: "vnni", "avx2" or "c" (for reports and tests)."""
    isa = int(lib.nnhal_conv_q8_isa())
    return "vnni" if isa & 4 else "avx2" if isa & 2 else "c"


def depthwise_q8_lanes(lib: ctypes.CDLL) -> bool:
    """Whether ``lib`` has the 16-lane 8-bit depthwise kernel (compiled for AVX-512 or
    AVX2)."""
    return bool(int(lib.nnhal_conv_q8_isa()) & 1)


class ConvQ8:
    """8-bit CONV_2D with one group (uint8 or int8 data, per-tensor or per-channel filter)
    as an int8 GEMM in C, requantised by the reference's int64 fixed-point steps: bytes
    identical to the numpy path of nnhal.ops.conv (tests/ops/test_native.py).

    ``centred`` is the filter minus its zero point [COUT, KH, KW, C] (int32; every value must
    fit a signed byte, see :meth:`fits`), packed once for the byte dot product. The input is
    read as unsigned bytes (int8 data + 128), so each sum carries ``-za * sum(filter)``, folded
    with the bias into one int64 correction per channel (once for a constant bias).
    """

    in_dtype = out_dtype = np.dtype(np.int8)
    bias_dtype = np.dtype(np.int32)

    @staticmethod
    def fits(centred: np.ndarray, shift: np.ndarray | int = 0) -> bool:
        """Whether the kernel is exact for this centred filter [COUT, KH, KW, C]: signed
        bytes, int32 sums (K * 255 * 128 below 2**31), and shifts int64 can take."""
        if centred.ndim != 4 or centred.size == 0:
            return False
        k = centred.shape[1] * centred.shape[2] * centred.shape[3]
        kp = (k + 3) // 4 * 4
        sh = np.asarray(shift, np.int64)
        return (int(centred.min()) >= -128 and int(centred.max()) <= 127
                and kp * 255 * 128 < 1 << 31 and int(sh.max()) <= 24 and int(sh.min()) >= -62)

    def __init__(self, lib: ctypes.CDLL, centred: np.ndarray, multiplier: np.ndarray,
                 shift: np.ndarray, in_zero_point: int, out_zero_point: int, lo: int, hi: int,
                 in_dtype: np.dtype, out_dtype: np.dtype,
                 const_bias: np.ndarray | None = None) -> None:
        self._fn = lib.nnhal_conv_q8
        self._fna = lib.nnhal_conv_q8_a
        self._local = threading.local()
        cout, kh, kw, c = centred.shape
        self.filt_hw = (kh, kw)
        self._cout = cout
        k = kh * kw * c
        self.kp = kp = (k + 3) // 4 * 4
        self.coutp = coutp = (cout + Q8_NR - 1) // Q8_NR * Q8_NR
        flat = np.zeros((coutp, kp), np.int8)
        flat[:cout, :k] = np.asarray(centred, np.int32).reshape(cout, k)
        # [COUTP/NR][KP/4][NR][4]: one panel of NR channels, four taps per channel together
        self.filt = np.ascontiguousarray(
            flat.reshape(coutp // Q8_NR, Q8_NR, kp // 4, 4).transpose(0, 2, 1, 3))
        self._fptr = self.filt.ctypes.data
        self.fsum = np.asarray(centred, np.int64).reshape(cout, k).sum(axis=1)
        self.in_dtype, self.out_dtype = np.dtype(in_dtype), np.dtype(out_dtype)
        self.za = int(in_zero_point) + (128 if self.in_dtype == np.int8 else 0)
        mult = np.broadcast_to(np.asarray(multiplier, np.int64), (cout,))
        shift = np.broadcast_to(np.asarray(shift, np.int64), (cout,))
        left, right = np.maximum(shift, 0), np.maximum(-shift, 0)
        mask = (np.int64(1) << right) - 1
        #: {multiplier, left shift, right shift, 2**right - 1, (2**right - 1) >> 1} per
        #: channel, zero-padded to COUTP
        self.rq = np.zeros((5, coutp), np.int64)
        self.rq[:, :cout] = (mult, left, right, mask, mask >> 1)
        self.q = np.array([self.za, out_zero_point, lo, hi, self.in_dtype == np.int8, kp,
                           coutp], np.int64)
        self._tail = (self.rq.ctypes.data, self.q.ctypes.data)
        #: the int32 requantisation's tables (no left shift, right shifts up to 30)
        self.rq32 = None
        if int(shift.max()) <= 0 and int(shift.min()) >= -30:
            self.rq32 = np.ascontiguousarray(self.rq[[0, 2, 3, 4]].astype(np.int32))
        self._geo: dict = {}
        self._const_bias = const_bias
        self._const_corr = None if const_bias is None else self.correction(const_bias)

    def correction(self, bias: np.ndarray) -> tuple:
        """bias - za * sum(filter) per output channel (zero-padded to COUTP): (int64, int32
        or None, their pointers, the int32 tables' pointer); the int32 one where every sum
        (below KP * 255 * 128 in magnitude) plus it stays in int32 and the tables allow."""
        corr = np.zeros(self.coutp, np.int64)
        corr[:self._cout] = np.asarray(bias, np.int64) - self.za * self.fsum
        c32 = None
        if self.rq32 is not None and \
                int(np.abs(corr).max()) + self.kp * 255 * 128 < 1 << 31:
            c32 = corr.astype(np.int32)
        return (corr, c32, corr.ctypes.data, 0 if c32 is None else c32.ctypes.data,
                0 if c32 is None else self.rq32.ctypes.data)

    def mult(self, c: int) -> int:
        return 1

    accepts = _Bound.accepts
    geometry = _Bound.geometry

    def _args(self) -> tuple:
        """This thread's argument array of nnhal_conv_q8_a (and the buffers it points to)."""
        st = getattr(self._local, "a", None)
        if st is None:
            # the packed rows, then (AVX2 builds) the same widened to uint16
            abuf = np.empty(3 * Q8_MR * self.kp, np.uint8)
            acc = np.empty(Q8_MR * self.coutp, np.int32)
            args = (ctypes.c_int64 * 11)(0, 0, 0, self._fptr, 0, *self._tail, abuf.ctypes.data,
                                         acc.ctypes.data, 0, 0)
            st = self._local.a = (args, ctypes.addressof(args), abuf, acc)
        return st

    def __call__(self, x: np.ndarray, bias: np.ndarray, out: np.ndarray,
                 stride: tuple[int, int], dilation: tuple[int, int],
                 pads: tuple[int, int, int, int]) -> None:
        corr = self._const_corr if bias is self._const_bias and self._const_corr is not None \
            else self.correction(bias)
        args, ptr = self._args()[:2]
        args[0] = address(x)
        args[1] = address(out)
        args[2] = self.geometry(x, out, stride, dilation, pads)
        args[4], args[9], args[10] = corr[2:]
        self._fna(ptr)
