"""The Python half of ``libneuralnetworks.so``: C arguments in, :mod:`nnhal.runtime.ndk` calls.

The C library passes every argument as a Python int (pointers as addresses, floats as
floats) and returns the int it gets back; this module reads the client's structs and arrays
with :mod:`ctypes`, within the counts and lengths the client gave, writes the out-parameters,
and maps handles. Handles are numbers from a table, never addresses of Python objects: a
freed, foreign or mistyped handle is a failed lookup (BAD_DATA), and a handle is never
reused. Every rule of the API stays in :mod:`nnhal.runtime.ndk`; what is here is only what
the C calling convention adds (NULL out-pointers and arrays, C strings). Nothing raises: an
unexpected exception is logged and returned as OP_FAILED.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import itertools
import logging
import mmap
import os
import threading
from collections.abc import Callable
from typing import Any

from nnhal.runtime import (
    Burst,
    Compilation,
    Event,
    Execution,
    Memory,
    MemoryDesc,
    NdkModel,
    ndk,
)
from nnhal.runtime.codes import BYTE_SIZE_OF_CACHE_TOKEN, ResultCode
from nnhal.runtime.extensions import MAX_ATTRIBUTE_BYTES
from nnhal.runtime.model import ANeuralNetworksOperandType

log = logging.getLogger("nnhal.capi")

OK = int(ResultCode.NO_ERROR)
NULL = int(ResultCode.UNEXPECTED_NULL)
BAD = int(ResultCode.BAD_DATA)
FAILED = int(ResultCode.OP_FAILED)
#: Handles are multiples of 16 from here: pointer-like for clients, never valid addresses
#: of anything we own, never reused.
_HANDLE_BASE = 0x7E57_0000_0000


class _OperandTypeStruct(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int32), ("dimensionCount", ctypes.c_uint32),
                ("dimensions", ctypes.c_void_p), ("scale", ctypes.c_float),
                ("zeroPoint", ctypes.c_int32)]


class _ChannelQuantStruct(ctypes.Structure):
    _fields_ = [("channelDim", ctypes.c_uint32), ("scaleCount", ctypes.c_uint32),
                ("scales", ctypes.c_void_p)]


class _Handles:
    """handle number <-> runtime object."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next = itertools.count(1)
        self._objects: dict[int, Any] = {}
        self._numbers: dict[int, int] = {}  # id(object) -> handle, for objects seen twice

    def add(self, obj: Any) -> int:
        with self._lock:
            h = self._numbers.get(id(obj))
            if h is not None and self._objects.get(h) is obj:
                return h
            h = _HANDLE_BASE + 16 * next(self._next)
            self._objects[h] = obj
            self._numbers[id(obj)] = h
            return h

    def get(self, h: int) -> Any:
        """The object, None for NULL, and a marker the ndk layer refuses for anything else."""
        if not h:
            return None
        obj = self._objects.get(h, _UNKNOWN)
        return obj

    def pop(self, h: int) -> Any:
        with self._lock:
            obj = self._objects.pop(h, None)
            if obj is not None:
                self._numbers.pop(id(obj), None)
            return obj

    def __len__(self) -> int:
        return len(self._objects)


class _Unknown:
    """A handle that is not in the table: every ndk type check refuses it (BAD_DATA)."""


_UNKNOWN = _Unknown()
handles = _Handles()
_strings: dict[str, ctypes.Array[ctypes.c_char]] = {}  # device names/versions: live forever


def _export(fn: Callable[..., int]) -> Callable[..., int]:
    """The C library calls this by name: never raise, log what was not expected."""

    @functools.wraps(fn)
    def call(*args: Any) -> int:
        try:
            return int(fn(*args))
        except Exception as e:  # noqa: BLE001 - nothing may cross into C
            log.error("%s: %s: %s", fn.__name__, type(e).__name__, e)
            return FAILED

    return call


#: The most elements one array argument may count (operand indexes, devices, dependencies,
#: dimensions, scales): far beyond any model, far below a count that would exhaust memory.
MAX_ELEMENTS = 1 << 20
#: The longest C string read (a cache directory): PATH_MAX.
MAX_STRING = 4096
#: The longest extension data read from C (an operand's extraParams.extension).
MAX_EXTENSION_DATA = 1 << 20
_PAGE = mmap.PAGESIZE
_IOV_MAX = 1024


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_libc = ctypes.CDLL(None, use_errno=True)
_vm_readv = getattr(_libc, "process_vm_readv", None)
if _vm_readv is not None:
    _vm_readv.restype = ctypes.c_ssize_t
    _vm_readv.argtypes = [ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_ulong,
                          ctypes.POINTER(_IoVec), ctypes.c_ulong, ctypes.c_ulong]


def _readable(addr: int, n: int) -> bool:
    """Whether ``n`` bytes at ``addr`` can be read without a fault: one byte of each page read
    through the kernel (process_vm_readv on this process answers EFAULT where a load would be
    SIGSEGV). A count longer than the client's buffer is then BAD_DATA when it runs off the
    mapping; where the kernel refuses the call (seccomp), every address is taken as readable."""
    if n <= 0:
        return True
    if addr <= 0 or addr + n > 1 << 64:
        return False
    if _vm_readv is None:
        return True
    pid = os.getpid()
    first_page = addr // _PAGE * _PAGE
    for k in range(first_page, addr + n, _PAGE * _IOV_MAX):  # stops at the first fault
        chunk = [max(addr, p) for p in range(k, min(addr + n, k + _PAGE * _IOV_MAX), _PAGE)]
        local_buf = ctypes.create_string_buffer(len(chunk))
        local = _IoVec(ctypes.cast(local_buf, ctypes.c_void_p), len(chunk))
        remote = (_IoVec * len(chunk))(*[_IoVec(a, 1) for a in chunk])
        got = _vm_readv(pid, ctypes.byref(local), 1, remote, len(chunk), 0)
        if got < 0 and ctypes.get_errno() in (errno.ENOSYS, errno.EPERM):
            return True
        if got != len(chunk):
            return False
    return True


def _client(addr: int, n: int, what: str) -> None:
    """Refuse (BAD_DATA) ``n`` bytes of client memory at ``addr`` that cannot be read."""
    if not _readable(addr, n):
        raise _Code(BAD, f"{what}: {n} bytes at {addr:#x} are not the client's memory")


def _bytes_at(addr: int, n: int) -> memoryview:
    """A view of ``n`` bytes of client memory (no copy; read or written only within n)."""
    _client(addr, n, "buffer")
    return memoryview((ctypes.c_char * n).from_address(addr)).cast("B")


def _array(ctype: Any, addr: int, n: int, what: str) -> Any:
    """``n`` elements of ``ctype`` at ``addr``, the count and the memory checked first."""
    if n > MAX_ELEMENTS:
        raise _Code(BAD, f"{what}: count {n} exceeds {MAX_ELEMENTS}")
    if n and not addr:
        raise _Code(NULL, f"{what}: NULL array of {n} elements")
    _client(addr, n * ctypes.sizeof(ctype), what)
    return (ctype * n).from_address(addr)


def _u32s(addr: int, n: int) -> list[int]:
    return list(_array(ctypes.c_uint32, addr, n, "index array")) if n else []


def _handles_at(addr: int, n: int) -> list[Any]:
    return [handles.get(h or 0) for h in _array(ctypes.c_void_p, addr, n, "handle array")] \
        if n else []


def _struct(ctype: Any, addr: int) -> Any:
    _client(addr, ctypes.sizeof(ctype), ctype.__name__)
    return ctype.from_address(addr)


def _string_at(addr: int) -> str:
    """A NUL-terminated C string of at most MAX_STRING bytes, read a page at a time."""
    out = b""
    while len(out) < MAX_STRING:
        n = min(_PAGE - (addr + len(out)) % _PAGE, MAX_STRING - len(out))
        _client(addr + len(out), n, "string")
        chunk = ctypes.string_at(addr + len(out), n)
        end = chunk.find(b"\0")
        if end >= 0:
            return (out + chunk[:end]).decode(errors="surrogateescape")
        out += chunk
    raise _Code(BAD, f"string: no NUL within {MAX_STRING} bytes")


def _put(ctype: Any, addr: int, value: Any) -> None:
    _struct(ctype, addr).value = value


def _put_handle(addr: int, code: int, obj: Any) -> int:
    _put(ctypes.c_void_p, addr, handles.add(obj) if code == OK else None)
    return code


def _operand_type(addr: int) -> ANeuralNetworksOperandType | None:
    if not addr:
        return None
    s = _struct(_OperandTypeStruct, addr)
    n = int(s.dimensionCount)
    if n and not s.dimensions:
        raise _Code(BAD, "operand type with dimensionCount > 0 and NULL dimensions")
    return ANeuralNetworksOperandType(int(s.type), _u32s(s.dimensions or 0, n), float(s.scale),
                                      int(s.zeroPoint))


class _Code(Exception):
    """A result code decided while reading C arguments."""

    def __init__(self, code: int, message: str):
        self.code = code
        super().__init__(message)


def _checked(fn: Callable[..., int]) -> Callable[..., int]:
    @functools.wraps(fn)
    def call(*args: Any) -> int:
        try:
            return fn(*args)
        except _Code as e:
            log.debug("%s: %s", fn.__name__, e)
            return e.code

    return _export(call)


def _needs(*pointers: int) -> None:
    """Required pointers: not NULL, and pointing at memory (checked before anything is done,
    so a bad out-pointer never leaves an object made and lost)."""
    if not all(pointers):
        raise _Code(NULL, "a required pointer is NULL")
    for p in pointers:
        _client(p, 1, "pointer")


# ---- runtime and devices ------------------------------------------------------------------

@_checked
def ANeuralNetworks_getRuntimeFeatureLevel() -> int:
    return ndk.ANeuralNetworks_getRuntimeFeatureLevel()


@_checked
def ANeuralNetworks_getDefaultLoopTimeout() -> int:
    return ndk.ANeuralNetworks_getDefaultLoopTimeout()


@_checked
def ANeuralNetworks_getMaximumLoopTimeout() -> int:
    return ndk.ANeuralNetworks_getMaximumLoopTimeout()


@_checked
def ANeuralNetworks_getDeviceCount(out: int) -> int:
    _needs(out)
    code, n = ndk.ANeuralNetworks_getDeviceCount()
    if code == OK:
        _put(ctypes.c_uint32, out, n)
    return code


@_checked
def ANeuralNetworks_getDevice(index: int, out: int) -> int:
    _needs(out)
    code, dev = ndk.ANeuralNetworks_getDevice(index)
    return _put_handle(out, code, dev)


def _c_string(text: str) -> int:
    buf = _strings.get(text)
    if buf is None:
        buf = _strings.setdefault(text, ctypes.create_string_buffer(text.encode()))
    return ctypes.addressof(buf)


@_checked
def ANeuralNetworksDevice_getName(device: int, out: int) -> int:
    _needs(out)
    code, name = ndk.ANeuralNetworksDevice_getName(handles.get(device))
    if code == OK:
        _put(ctypes.c_void_p, out, _c_string(name))
    return code


@_checked
def ANeuralNetworksDevice_getType(device: int, out: int) -> int:
    _needs(out)
    code, t = ndk.ANeuralNetworksDevice_getType(handles.get(device))
    if code == OK:
        _put(ctypes.c_int32, out, int(t))
    return code


@_checked
def ANeuralNetworksDevice_getVersion(device: int, out: int) -> int:
    _needs(out)
    code, v = ndk.ANeuralNetworksDevice_getVersion(handles.get(device))
    if code == OK:
        _put(ctypes.c_void_p, out, _c_string(v))
    return code


@_checked
def ANeuralNetworksDevice_getFeatureLevel(device: int, out: int) -> int:
    _needs(out)
    code, level = ndk.ANeuralNetworksDevice_getFeatureLevel(handles.get(device))
    if code == OK:
        _put(ctypes.c_int64, out, int(level))
    return code


@_checked
def ANeuralNetworksDevice_wait(device: int) -> int:
    return ndk.ANeuralNetworksDevice_wait(handles.get(device))


# ---- models -------------------------------------------------------------------------------

@_checked
def ANeuralNetworksModel_create(out: int) -> int:
    _needs(out)
    return _put_handle(out, *ndk.ANeuralNetworksModel_create())


def _free(name: str) -> Callable[[int], int]:
    def free(h: int) -> int:
        obj = handles.get(h)
        if obj is None or obj is _UNKNOWN:
            return OK
        if not ndk_type_ok(name, obj):
            return OK  # a handle of another kind: the NDK's free ignores it, so do we
        handles.pop(h)
        getattr(ndk, name)(obj)
        return OK

    free.__name__ = name
    return _checked(free)


#: The runtime class each free takes: by class, not by class name, so that a rename of a
#: runtime class cannot silently make a free ignore its own handles.
_FREES = {"ANeuralNetworksModel_free": NdkModel,
          "ANeuralNetworksCompilation_free": Compilation,
          "ANeuralNetworksBurst_free": Burst,
          "ANeuralNetworksExecution_free": Execution,
          "ANeuralNetworksEvent_free": Event,
          "ANeuralNetworksMemory_free": Memory,
          "ANeuralNetworksMemoryDesc_free": MemoryDesc}


def ndk_type_ok(name: str, obj: Any) -> bool:
    """Whether ``obj`` is what ``name``'s free takes."""
    return type(obj) is _FREES[name]


ANeuralNetworksModel_free = _free("ANeuralNetworksModel_free")
ANeuralNetworksCompilation_free = _free("ANeuralNetworksCompilation_free")
ANeuralNetworksBurst_free = _free("ANeuralNetworksBurst_free")
ANeuralNetworksExecution_free = _free("ANeuralNetworksExecution_free")
ANeuralNetworksEvent_free = _free("ANeuralNetworksEvent_free")
ANeuralNetworksMemory_free = _free("ANeuralNetworksMemory_free")
ANeuralNetworksMemoryDesc_free = _free("ANeuralNetworksMemoryDesc_free")


@_checked
def ANeuralNetworksModel_finish(model: int) -> int:
    return ndk.ANeuralNetworksModel_finish(handles.get(model))


@_checked
def ANeuralNetworksModel_addOperand(model: int, type_: int) -> int:
    m = handles.get(model)
    if m is None:
        return NULL
    _needs(type_)
    return ndk.ANeuralNetworksModel_addOperand(m, _operand_type(type_))


@_checked
def ANeuralNetworksModel_setOperandValue(model: int, index: int, buffer: int,
                                         length: int) -> int:
    view = _bytes_at(buffer, length) if buffer else None
    return ndk.ANeuralNetworksModel_setOperandValue(handles.get(model), index, view, length)


@_checked
def ANeuralNetworksModel_setOperandValueFromMemory(model: int, index: int, memory: int,
                                                   offset: int, length: int) -> int:
    return ndk.ANeuralNetworksModel_setOperandValueFromMemory(
        handles.get(model), index, handles.get(memory), offset, length)


@_checked
def ANeuralNetworksModel_setOperandValueFromModel(model: int, index: int, value: int) -> int:
    return ndk.ANeuralNetworksModel_setOperandValueFromModel(handles.get(model), index,
                                                             handles.get(value))


@_checked
def ANeuralNetworksModel_setOperandSymmPerChannelQuantParams(model: int, index: int,
                                                             params: int) -> int:
    m = handles.get(model)
    if m is None:
        return NULL
    _needs(params)
    s = _struct(_ChannelQuantStruct, params)
    n = int(s.scaleCount)
    if n and not s.scales:
        return NULL
    scales = [float(x) for x in _array(ctypes.c_float, s.scales, n, "scales")] if n else []
    return ndk.ANeuralNetworksModel_setOperandSymmPerChannelQuantParams(
        m, index, ndk.ANeuralNetworksSymmPerChannelQuantParams(int(s.channelDim), scales))


@_checked
def ANeuralNetworksModel_addOperation(model: int, type_: int, n_in: int, inputs: int,
                                      n_out: int, outputs: int) -> int:
    m = handles.get(model)
    if m is None:
        return NULL
    _needs(inputs, outputs)
    return ndk.ANeuralNetworksModel_addOperation(m, type_, _u32s(inputs, n_in),
                                                 _u32s(outputs, n_out))


@_checked
def ANeuralNetworksModel_identifyInputsAndOutputs(model: int, n_in: int, inputs: int,
                                                  n_out: int, outputs: int) -> int:
    m = handles.get(model)
    if m is None:
        return NULL
    _needs(inputs, outputs)
    return ndk.ANeuralNetworksModel_identifyInputsAndOutputs(m, _u32s(inputs, n_in),
                                                             _u32s(outputs, n_out))


@_checked
def ANeuralNetworksModel_relaxComputationFloat32toFloat16(model: int, allow: int) -> int:
    return ndk.ANeuralNetworksModel_relaxComputationFloat32toFloat16(handles.get(model),
                                                                     bool(allow))


@_checked
def ANeuralNetworksModel_getSupportedOperationsForDevices(model: int, devices: int, n: int,
                                                          out: int) -> int:
    m = handles.get(model)
    if m is None:
        return NULL
    _needs(devices, out)
    code, ops = ndk.ANeuralNetworksModel_getSupportedOperationsForDevices(
        m, _handles_at(devices, n))
    if code == OK:
        arr = _array(ctypes.c_bool, out, len(ops), "supportedOps")
        for i, ok in enumerate(ops):
            arr[i] = bool(ok)
    return code


# ---- vendor extensions (NeuralNetworksExtensions.h) ----------------------------------------

@_checked
def ANeuralNetworksDevice_getExtensionSupport(device: int, name: int, out: int) -> int:
    d = handles.get(device)
    if d is None or not name:
        return NULL
    _needs(out)
    code, supported = ndk.ANeuralNetworksDevice_getExtensionSupport(d, _string_at(name))
    if code == OK:
        _put(ctypes.c_bool, out, bool(supported))
    return code


def _extension_type(fn: Callable[..., tuple[int, Any]], model: int, name: int, code: int,
                    out: int) -> int:
    m = handles.get(model)
    if m is None or not name:
        return NULL
    _needs(out)
    result, value = fn(m, _string_at(name), code)
    if result == OK:
        _put(ctypes.c_int32, out, value - (1 << 32) if value >= 1 << 31 else value)
    return result


@_checked
def ANeuralNetworksModel_getExtensionOperandType(model: int, name: int, code: int,
                                                 out: int) -> int:
    return _extension_type(ndk.ANeuralNetworksModel_getExtensionOperandType, model, name, code,
                           out)


@_checked
def ANeuralNetworksModel_getExtensionOperationType(model: int, name: int, code: int,
                                                   out: int) -> int:
    return _extension_type(ndk.ANeuralNetworksModel_getExtensionOperationType, model, name,
                           code, out)


@_checked
def ANeuralNetworksModel_setOperandExtensionData(model: int, index: int, data: int,
                                                 length: int) -> int:
    m = handles.get(model)
    if m is None:
        return NULL
    if data and length > MAX_EXTENSION_DATA:
        return BAD  # before reading: no operand's extension data is that long
    view = _bytes_at(data, length) if data and length else (b"" if data else None)
    return ndk.ANeuralNetworksModel_setOperandExtensionData(m, index, view, length)


# ---- compilations -------------------------------------------------------------------------

@_checked
def ANeuralNetworksCompilation_create(model: int, out: int) -> int:
    m = handles.get(model)
    if m is None:
        return NULL
    _needs(out)
    return _put_handle(out, *ndk.ANeuralNetworksCompilation_create(m))


@_checked
def ANeuralNetworksCompilation_createForDevices(model: int, devices: int, n: int,
                                                out: int) -> int:
    m = handles.get(model)
    if m is None:
        return NULL
    _needs(devices, out)
    return _put_handle(out, *ndk.ANeuralNetworksCompilation_createForDevices(
        m, _handles_at(devices, n)))


@_checked
def ANeuralNetworksCompilation_setPreference(c: int, preference: int) -> int:
    return ndk.ANeuralNetworksCompilation_setPreference(handles.get(c), preference)


@_checked
def ANeuralNetworksCompilation_setPriority(c: int, priority: int) -> int:
    return ndk.ANeuralNetworksCompilation_setPriority(handles.get(c), priority)


@_checked
def ANeuralNetworksCompilation_setTimeout(c: int, duration: int) -> int:
    return ndk.ANeuralNetworksCompilation_setTimeout(handles.get(c), duration)


@_checked
def ANeuralNetworksCompilation_setCaching(c: int, cache_dir: int, token: int) -> int:
    d = _string_at(cache_dir) if cache_dir else None
    t = bytes(_bytes_at(token, BYTE_SIZE_OF_CACHE_TOKEN)) if token else None
    return ndk.ANeuralNetworksCompilation_setCaching(handles.get(c), d, t)


def _attribute(name: int, data: int, length: int) -> tuple[str | None, Any]:
    """An extension attribute's name and data from C: the data is read only within a length
    the runtime can accept (a longer one reaches it as no bytes, refused by its length)."""
    text = _string_at(name) if name else None
    if not data:
        return text, None
    return text, _bytes_at(data, length) if length <= MAX_ATTRIBUTE_BYTES else b""


@_checked
def ANeuralNetworksCompilation_addExtensionAttribute(c: int, name: int, code: int, data: int,
                                                     length: int) -> int:
    comp = handles.get(c)
    if comp is None or not name or (not data and length):
        return NULL  # before reading anything, as the NDK checks NULLs first
    text, value = _attribute(name, data, length)
    return ndk.ANeuralNetworksCompilation_addExtensionAttribute(comp, text, code, value, length)


@_checked
def ANeuralNetworksCompilation_finish(c: int) -> int:
    return ndk.ANeuralNetworksCompilation_finish(handles.get(c))


# ---- bursts and executions ----------------------------------------------------------------

@_checked
def ANeuralNetworksBurst_create(c: int, out: int) -> int:
    comp = handles.get(c)
    if comp is None:
        return NULL
    _needs(out)
    return _put_handle(out, *ndk.ANeuralNetworksBurst_create(comp))


@_checked
def ANeuralNetworksExecution_create(c: int, out: int) -> int:
    comp = handles.get(c)
    if comp is None:
        return NULL
    _needs(out)
    return _put_handle(out, *ndk.ANeuralNetworksExecution_create(comp))


def _set_pointer(name: str, execution: int, index: int, type_: int, buffer: int,
                 length: int) -> int:
    view = _bytes_at(buffer, length) if buffer else None
    return getattr(ndk, name)(handles.get(execution), index, _operand_type(type_), view, length)


@_checked
def ANeuralNetworksExecution_setInput(e: int, index: int, type_: int, buffer: int,
                                      length: int) -> int:
    return _set_pointer("ANeuralNetworksExecution_setInput", e, index, type_, buffer, length)


@_checked
def ANeuralNetworksExecution_setOutput(e: int, index: int, type_: int, buffer: int,
                                       length: int) -> int:
    return _set_pointer("ANeuralNetworksExecution_setOutput", e, index, type_, buffer, length)


@_checked
def ANeuralNetworksExecution_setInputFromMemory(e: int, index: int, type_: int, memory: int,
                                                offset: int, length: int) -> int:
    return ndk.ANeuralNetworksExecution_setInputFromMemory(
        handles.get(e), index, _operand_type(type_), handles.get(memory), offset, length)


@_checked
def ANeuralNetworksExecution_setOutputFromMemory(e: int, index: int, type_: int, memory: int,
                                                 offset: int, length: int) -> int:
    return ndk.ANeuralNetworksExecution_setOutputFromMemory(
        handles.get(e), index, _operand_type(type_), handles.get(memory), offset, length)


@_checked
def ANeuralNetworksExecution_compute(e: int) -> int:
    return ndk.ANeuralNetworksExecution_compute(handles.get(e))


@_checked
def ANeuralNetworksExecution_startCompute(e: int, out: int) -> int:
    ex = handles.get(e)
    if ex is None:
        return NULL
    _needs(out)
    return _put_handle(out, *ndk.ANeuralNetworksExecution_startCompute(ex))


@_checked
def ANeuralNetworksExecution_startComputeWithDependencies(e: int, deps: int, n: int,
                                                          duration: int, out: int) -> int:
    ex = handles.get(e)
    if ex is None:
        return NULL
    _needs(out)
    if n and not deps:
        return NULL
    return _put_handle(out, *ndk.ANeuralNetworksExecution_startComputeWithDependencies(
        ex, _handles_at(deps, n), duration))


@_checked
def ANeuralNetworksExecution_burstCompute(e: int, burst: int) -> int:
    return ndk.ANeuralNetworksExecution_burstCompute(handles.get(e), handles.get(burst))


@_checked
def ANeuralNetworksExecution_setMeasureTiming(e: int, measure: int) -> int:
    return ndk.ANeuralNetworksExecution_setMeasureTiming(handles.get(e), bool(measure))


@_checked
def ANeuralNetworksExecution_getDuration(e: int, code: int, out: int) -> int:
    ex = handles.get(e)
    if ex is None:
        return NULL
    _needs(out)
    rc, ns = ndk.ANeuralNetworksExecution_getDuration(ex, code)
    if rc == OK:
        _put(ctypes.c_uint64, out, int(ns))
    return rc


@_checked
def ANeuralNetworksExecution_setTimeout(e: int, duration: int) -> int:
    return ndk.ANeuralNetworksExecution_setTimeout(handles.get(e), duration)


@_checked
def ANeuralNetworksExecution_setLoopTimeout(e: int, duration: int) -> int:
    return ndk.ANeuralNetworksExecution_setLoopTimeout(handles.get(e), duration)


@_checked
def ANeuralNetworksExecution_getOutputOperandRank(e: int, index: int, out: int) -> int:
    ex = handles.get(e)
    if ex is None:
        return NULL
    _needs(out)
    rc, rank = ndk.ANeuralNetworksExecution_getOutputOperandRank(ex, index)
    if rc == OK:
        _put(ctypes.c_uint32, out, int(rank))
    return rc


@_checked
def ANeuralNetworksExecution_getOutputOperandDimensions(e: int, index: int, out: int) -> int:
    ex = handles.get(e)
    if ex is None:
        return NULL
    _needs(out)
    rc, dims = ndk.ANeuralNetworksExecution_getOutputOperandDimensions(ex, index)
    if rc == OK:
        arr = _array(ctypes.c_uint32, out, len(dims), "dimensions")
        for i, d in enumerate(dims):
            arr[i] = int(d)
    return rc


@_checked
def ANeuralNetworksExecution_setReusable(e: int, reusable: int) -> int:
    return ndk.ANeuralNetworksExecution_setReusable(handles.get(e), bool(reusable))


@_checked
def ANeuralNetworksExecution_addExtensionAttribute(e: int, name: int, code: int, data: int,
                                                   length: int) -> int:
    ex = handles.get(e)
    if ex is None or not name or (not data and length):
        return NULL
    text, value = _attribute(name, data, length)
    return ndk.ANeuralNetworksExecution_addExtensionAttribute(ex, text, code, value, length)


@_checked
def ANeuralNetworksExecution_enableInputAndOutputPadding(e: int, enable: int) -> int:
    return ndk.ANeuralNetworksExecution_enableInputAndOutputPadding(handles.get(e),
                                                                    bool(enable))


def _preferred(call: Callable[[Any, int], tuple[int, Any]], c: int, index: int,
               out: int) -> int:
    """getPreferredMemory{Alignment,Padding}For{Input,Output}: the value into ``*out``."""
    comp = handles.get(c)
    if comp is None:
        return NULL
    _needs(out)
    rc, value = call(comp, index)
    if rc == OK:
        _put(ctypes.c_uint32, out, int(value))
    return rc


@_checked
def ANeuralNetworksCompilation_getPreferredMemoryAlignmentForInput(c: int, index: int,
                                                                      out: int) -> int:
    return _preferred(ndk.ANeuralNetworksCompilation_getPreferredMemoryAlignmentForInput, c, index,
                      out)


@_checked
def ANeuralNetworksCompilation_getPreferredMemoryPaddingForInput(c: int, index: int,
                                                                    out: int) -> int:
    return _preferred(ndk.ANeuralNetworksCompilation_getPreferredMemoryPaddingForInput, c, index,
                      out)


@_checked
def ANeuralNetworksCompilation_getPreferredMemoryAlignmentForOutput(c: int, index: int,
                                                                       out: int) -> int:
    return _preferred(ndk.ANeuralNetworksCompilation_getPreferredMemoryAlignmentForOutput, c, index,
                      out)


@_checked
def ANeuralNetworksCompilation_getPreferredMemoryPaddingForOutput(c: int, index: int,
                                                                     out: int) -> int:
    return _preferred(ndk.ANeuralNetworksCompilation_getPreferredMemoryPaddingForOutput, c, index,
                      out)


# ---- events -------------------------------------------------------------------------------

@_checked
def ANeuralNetworksEvent_wait(event: int) -> int:
    return ndk.ANeuralNetworksEvent_wait(handles.get(event))


@_checked
def ANeuralNetworksEvent_createFromSyncFenceFd(fd: int, out: int) -> int:
    _needs(out)
    return _put_handle(out, *ndk.ANeuralNetworksEvent_createFromSyncFenceFd(fd))


@_checked
def ANeuralNetworksEvent_getSyncFenceFd(event: int, out: int) -> int:
    ev = handles.get(event)
    if ev is None:
        return NULL
    _needs(out)
    rc, fd = ndk.ANeuralNetworksEvent_getSyncFenceFd(ev)
    _put(ctypes.c_int, out, int(fd) if rc == OK else -1)
    return rc


# ---- memory -------------------------------------------------------------------------------

@_checked
def ANeuralNetworksMemory_createFromFd(size: int, protect: int, fd: int, offset: int,
                                       out: int) -> int:
    _needs(out)
    return _put_handle(out, *ndk.ANeuralNetworksMemory_createFromFd(size, protect, fd, offset))


@_checked
def ANeuralNetworksMemory_createFromDesc(desc: int, out: int) -> int:
    d = handles.get(desc)
    if d is None:
        return NULL
    _needs(out)
    return _put_handle(out, *ndk.ANeuralNetworksMemory_createFromDesc(d))


@_checked
def ANeuralNetworksMemory_copy(src: int, dst: int) -> int:
    return ndk.ANeuralNetworksMemory_copy(handles.get(src), handles.get(dst))


@_checked
def ANeuralNetworksMemoryDesc_create(out: int) -> int:
    _needs(out)
    return _put_handle(out, *ndk.ANeuralNetworksMemoryDesc_create())


@_checked
def ANeuralNetworksMemoryDesc_addInputRole(desc: int, c: int, index: int,
                                           frequency: float) -> int:
    return ndk.ANeuralNetworksMemoryDesc_addInputRole(handles.get(desc), handles.get(c), index,
                                                      frequency)


@_checked
def ANeuralNetworksMemoryDesc_addOutputRole(desc: int, c: int, index: int,
                                            frequency: float) -> int:
    return ndk.ANeuralNetworksMemoryDesc_addOutputRole(handles.get(desc), handles.get(c),
                                                       index, frequency)


@_checked
def ANeuralNetworksMemoryDesc_setDimensions(desc: int, rank: int, dims: int) -> int:
    d = handles.get(desc)
    if d is None:
        return NULL
    if rank and not dims:
        return NULL
    return ndk.ANeuralNetworksMemoryDesc_setDimensions(d, _u32s(dims, rank))


@_checked
def ANeuralNetworksMemoryDesc_finish(desc: int) -> int:
    return ndk.ANeuralNetworksMemoryDesc_finish(handles.get(desc))
