"""The NDK's Python face (as :mod:`nnhal.runtime.ndk`: codes, ``(code, value)``, sequences)
implemented by calling ``libneuralnetworks.so`` through :mod:`ctypes`, exactly as a C client
calls it: structs laid out in memory, handles as opaque pointers, buffers as addresses and
lengths. The conformance mode ``capi`` swaps it in for :mod:`nnhal.runtime.ndk` so every case
goes through the C library. Only the functions a client of the runtime mode needs take Python
objects here; :func:`load` gives the library with every signature declared.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from nnhal.capi.build import NAME, library_dir
from nnhal.capi.header import EXTENSION_FUNCTIONS, FUNCTIONS
from nnhal.runtime.codes import ResultCode
from nnhal.runtime.model import ANeuralNetworksOperandType
from nnhal.runtime.ndk import ANeuralNetworksSymmPerChannelQuantParams

__all__ = ["ANeuralNetworksOperandType", "ANeuralNetworksSymmPerChannelQuantParams", "load"]

OK = int(ResultCode.NO_ERROR)
_CTYPES = {"int": ctypes.c_int, "int32_t": ctypes.c_int32, "uint32_t": ctypes.c_uint32,
           "uint16_t": ctypes.c_uint16,
           "int64_t": ctypes.c_int64, "uint64_t": ctypes.c_uint64, "size_t": ctypes.c_size_t,
           "bool": ctypes.c_bool, "float": ctypes.c_float,
           "ANeuralNetworksOperationType": ctypes.c_int32, "void": None}


def _ctype(decl: str) -> Any:
    decl = decl.strip()
    name = decl.replace("*", " ").split()[-1]
    t = decl[: len(decl) - len(name)].strip()
    return ctypes.c_void_p if "*" in t else _CTYPES[t]


def declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Set argtypes/restype of every NDK function of ``lib`` from the header's table."""
    for ret, name, params in [*FUNCTIONS, *EXTENSION_FUNCTIONS]:
        fn = getattr(lib, name)
        fn.restype = _CTYPES[ret]
        fn.argtypes = [] if params == "void" else [_ctype(p) for p in params.split(",")]
    return lib


_lock = threading.Lock()
_lib: ctypes.CDLL | None = None


def load(path: str | None = None) -> ctypes.CDLL:
    """The library (``path``, else the one ``nnhal ndk --libdir`` names), declared; ctypes
    releases the GIL around each call, so the library attaches to this interpreter."""
    global _lib
    with _lock:
        if path is not None:
            return declare(ctypes.CDLL(path))
        if _lib is None:
            d, why = library_dir()
            if d is None:
                raise OSError(f"no libneuralnetworks.so: {why}")
            _lib = declare(ctypes.CDLL(str(d / NAME)))
        return _lib


class _OperandType(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int32), ("dimensionCount", ctypes.c_uint32),
                ("dimensions", ctypes.POINTER(ctypes.c_uint32)), ("scale", ctypes.c_float),
                ("zeroPoint", ctypes.c_int32)]


class _ChannelQuant(ctypes.Structure):
    _fields_ = [("channelDim", ctypes.c_uint32), ("scaleCount", ctypes.c_uint32),
                ("scales", ctypes.POINTER(ctypes.c_float))]


class Handle:
    """An opaque C handle, with what the client must keep alive while the library uses it."""

    def __init__(self, ptr: int | None):
        self.ptr = ptr
        self.keep: list[Any] = []
        self.operations = 0

    @property
    def _as_parameter_(self) -> ctypes.c_void_p:
        return ctypes.c_void_p(self.ptr)


def _h(obj: Any) -> Any:
    return obj if isinstance(obj, Handle) or obj is None else Handle(id(obj))


def _u32(seq: Sequence[int]) -> ctypes.Array[ctypes.c_uint32]:
    return (ctypes.c_uint32 * len(seq))(*[int(v) for v in seq])


def _operand_type(t: ANeuralNetworksOperandType | None) -> Any:
    if t is None:
        return None
    dims = _u32(list(t.dimensions))
    s = _OperandType(int(t.type), len(dims),
                     ctypes.cast(dims, ctypes.POINTER(ctypes.c_uint32)) if len(dims) else None,
                     float(t.scale), int(t.zeroPoint))
    s._keep = dims  # type: ignore[attr-defined]
    return ctypes.byref(s)


def _address(buffer: Any, keep: list[Any]) -> int | None:
    """The address of a client buffer (numpy array, bytes, bytearray), kept alive."""
    if buffer is None:
        return None
    if isinstance(buffer, np.ndarray):
        arr = np.ascontiguousarray(buffer)
        keep.append(arr)
        return int(arr.ctypes.data) if arr.nbytes else ctypes.addressof(ctypes.c_char())
    if isinstance(buffer, bytes):
        keep.append(buffer)
        return ctypes.cast(ctypes.c_char_p(buffer), ctypes.c_void_p).value
    arr = np.frombuffer(buffer, np.uint8)
    keep.append(arr)
    return int(arr.ctypes.data)


def _out_handle(code: int, out: ctypes.c_void_p) -> tuple[int, Handle | None]:
    return (code, Handle(out.value)) if code == OK else (code, None)


def library_devices() -> dict[str, int]:
    """{name: C handle} of every device the library lists (ANeuralNetworks_getDevice)."""
    lib = load()
    n = ctypes.c_uint32()
    if lib.ANeuralNetworks_getDeviceCount(ctypes.byref(n)) != OK:
        return {}
    by_name = {}
    for i in range(n.value):
        d, name = ctypes.c_void_p(), ctypes.c_char_p()
        if lib.ANeuralNetworks_getDevice(i, ctypes.byref(d)) != OK or \
                lib.ANeuralNetworksDevice_getName(d, ctypes.byref(name)) != OK:
            continue
        by_name[(name.value or b"").decode(errors="replace")] = d.value
    return by_name


def _find(by_name: dict[str, int], name: str) -> int | None:
    # a driver's HAL name is nnhal-<registry name>
    return by_name.get(name, by_name.get(name.removeprefix("nnhal-")))


def use_device(name: str) -> str | None:
    """Make the library list device ``name``, as a C program is told to: when it is not
    listed, ``name`` is added to ``$NNHAL_DEVICES`` of this process (the variable the
    library's runtime reads, see :mod:`nnhal.runtime.devices`). None when it is listed, else
    why not (one line)."""
    if _find(library_devices(), name) is not None:
        return None
    from nnhal.drivers import registry
    from nnhal.runtime.devices import DEVICES_ENV, named_devices

    why = registry.reason(name)
    if why is not None:
        return f"libneuralnetworks.so cannot open device '{name}': {why}"
    if "," in name:
        return f"device '{name}' has a comma: {DEVICES_ENV} cannot name it"
    names = named_devices()
    if name not in names:
        os.environ[DEVICES_ENV] = ",".join([*names, name])
    listed = library_devices()
    if _find(listed, name) is not None:
        return None
    return (f"libneuralnetworks.so lists no device '{name}' (it lists: "
            f"{', '.join(listed) or 'none'}; {DEVICES_ENV}={os.environ.get(DEVICES_ENV, '')})")


def _devices(devices: Sequence[Any]) -> ctypes.Array[ctypes.c_void_p]:
    """C device handles of runtime devices, matched by name (the library's own list)."""
    by_name = library_devices()

    def find(d: Any) -> int | None:
        if isinstance(d, Handle):
            return d.ptr
        return _find(by_name, str(getattr(d, "name", "")))

    handles = [find(d) for d in devices]
    return (ctypes.c_void_p * len(handles))(*handles)


# ---- models -------------------------------------------------------------------------------

def ANeuralNetworksModel_create() -> tuple[int, Handle | None]:
    out = ctypes.c_void_p()
    return _out_handle(load().ANeuralNetworksModel_create(ctypes.byref(out)), out)


def ANeuralNetworksModel_free(model: Handle | None) -> None:
    load().ANeuralNetworksModel_free(_h(model))


def ANeuralNetworksModel_finish(model: Handle) -> int:
    return load().ANeuralNetworksModel_finish(_h(model))


def ANeuralNetworksModel_addOperand(model: Handle, type: Any) -> int:
    return load().ANeuralNetworksModel_addOperand(_h(model), _operand_type(type))


def ANeuralNetworksModel_setOperandValue(model: Handle, index: int, buffer: Any,
                                         length: int) -> int:
    m = _h(model)
    keep = m.keep if m is not None else []
    return load().ANeuralNetworksModel_setOperandValue(m, index, _address(buffer, keep), length)


def ANeuralNetworksModel_setOperandValueFromMemory(model: Handle, index: int, memory: Handle,
                                                   offset: int, length: int) -> int:
    return load().ANeuralNetworksModel_setOperandValueFromMemory(_h(model), index, _h(memory),
                                                                 offset, length)


def ANeuralNetworksModel_setOperandValueFromModel(model: Handle, index: int,
                                                  value: Handle) -> int:
    return load().ANeuralNetworksModel_setOperandValueFromModel(_h(model), index, _h(value))


def ANeuralNetworksModel_setOperandSymmPerChannelQuantParams(
        model: Handle, index: int, channelQuant: ANeuralNetworksSymmPerChannelQuantParams
) -> int:
    scales = (ctypes.c_float * len(channelQuant.scales))(*channelQuant.scales)
    s = _ChannelQuant(int(channelQuant.channelDim), len(scales),
                      ctypes.cast(scales, ctypes.POINTER(ctypes.c_float)))
    return load().ANeuralNetworksModel_setOperandSymmPerChannelQuantParams(
        _h(model), index, ctypes.byref(s))


def ANeuralNetworksModel_addOperation(model: Handle, type: int, inputs: Sequence[int],
                                      outputs: Sequence[int]) -> int:
    ins, outs = _u32(inputs), _u32(outputs)
    code = load().ANeuralNetworksModel_addOperation(_h(model), type, len(ins), ins, len(outs),
                                                    outs)
    if code == OK and isinstance(model, Handle):
        model.operations += 1
    return code


def ANeuralNetworksModel_identifyInputsAndOutputs(model: Handle, inputs: Sequence[int],
                                                  outputs: Sequence[int]) -> int:
    ins, outs = _u32(inputs), _u32(outputs)
    return load().ANeuralNetworksModel_identifyInputsAndOutputs(_h(model), len(ins), ins,
                                                                len(outs), outs)


def ANeuralNetworksModel_relaxComputationFloat32toFloat16(model: Handle, allow: bool) -> int:
    return load().ANeuralNetworksModel_relaxComputationFloat32toFloat16(_h(model), allow)


def ANeuralNetworksModel_getSupportedOperationsForDevices(
        model: Handle, devices: Sequence[Any]) -> tuple[int, list[bool] | None]:
    n = model.operations if isinstance(model, Handle) else 0
    out = (ctypes.c_bool * max(n, 1))()
    devs = _devices(devices)
    code = load().ANeuralNetworksModel_getSupportedOperationsForDevices(_h(model), devs,
                                                                        len(devs), out)
    return (code, [bool(v) for v in out[:n]]) if code == OK else (code, None)


# ---- compilations, bursts, executions, events, memory -------------------------------------

def ANeuralNetworksCompilation_create(model: Handle) -> tuple[int, Handle | None]:
    out = ctypes.c_void_p()
    return _out_handle(load().ANeuralNetworksCompilation_create(_h(model), ctypes.byref(out)),
                       out)


def ANeuralNetworksCompilation_createForDevices(model: Handle, devices: Sequence[Any]
                                                ) -> tuple[int, Handle | None]:
    out = ctypes.c_void_p()
    devs = _devices(devices)
    return _out_handle(load().ANeuralNetworksCompilation_createForDevices(
        _h(model), devs, len(devs), ctypes.byref(out)), out)


def ANeuralNetworksCompilation_finish(compilation: Handle) -> int:
    return load().ANeuralNetworksCompilation_finish(_h(compilation))


def ANeuralNetworksCompilation_free(compilation: Handle | None) -> None:
    load().ANeuralNetworksCompilation_free(_h(compilation))


def ANeuralNetworksBurst_create(compilation: Handle) -> tuple[int, Handle | None]:
    out = ctypes.c_void_p()
    return _out_handle(load().ANeuralNetworksBurst_create(_h(compilation), ctypes.byref(out)),
                       out)


def ANeuralNetworksBurst_free(burst: Handle | None) -> None:
    load().ANeuralNetworksBurst_free(_h(burst))


def ANeuralNetworksExecution_create(compilation: Handle) -> tuple[int, Handle | None]:
    out = ctypes.c_void_p()
    return _out_handle(load().ANeuralNetworksExecution_create(_h(compilation),
                                                              ctypes.byref(out)), out)


def ANeuralNetworksExecution_free(execution: Handle | None) -> None:
    load().ANeuralNetworksExecution_free(_h(execution))


def ANeuralNetworksExecution_setInput(execution: Handle, index: int, type: Any, buffer: Any,
                                      length: int) -> int:
    e = _h(execution)
    keep = e.keep if e is not None else []
    return load().ANeuralNetworksExecution_setInput(e, index, _operand_type(type),
                                                    _address(buffer, keep), length)


def ANeuralNetworksExecution_setOutput(execution: Handle, index: int, type: Any, buffer: Any,
                                       length: int) -> int:
    if isinstance(buffer, np.ndarray) and not (buffer.flags.c_contiguous and
                                               buffer.flags.writeable):
        return int(ResultCode.BAD_DATA)  # a C client's output is always writable memory
    e = _h(execution)
    keep = e.keep if e is not None else []
    return load().ANeuralNetworksExecution_setOutput(e, index, _operand_type(type),
                                                     _address(buffer, keep), length)


def ANeuralNetworksExecution_compute(execution: Handle) -> int:
    return load().ANeuralNetworksExecution_compute(_h(execution))


def ANeuralNetworksExecution_startCompute(execution: Handle) -> tuple[int, Handle | None]:
    out = ctypes.c_void_p()
    return _out_handle(load().ANeuralNetworksExecution_startCompute(_h(execution),
                                                                    ctypes.byref(out)), out)


def ANeuralNetworksExecution_burstCompute(execution: Handle, burst: Handle) -> int:
    return load().ANeuralNetworksExecution_burstCompute(_h(execution), _h(burst))


def ANeuralNetworksExecution_setMeasureTiming(execution: Handle, measure: bool) -> int:
    return load().ANeuralNetworksExecution_setMeasureTiming(_h(execution), measure)


def ANeuralNetworksExecution_setLoopTimeout(execution: Handle, duration: int) -> int:
    return load().ANeuralNetworksExecution_setLoopTimeout(_h(execution), duration)


def ANeuralNetworksExecution_setReusable(execution: Handle, reusable: bool) -> int:
    return load().ANeuralNetworksExecution_setReusable(_h(execution), reusable)


def ANeuralNetworksExecution_getDuration(execution: Handle, durationCode: int
                                         ) -> tuple[int, int | None]:
    out = ctypes.c_uint64()
    code = load().ANeuralNetworksExecution_getDuration(_h(execution), durationCode,
                                                       ctypes.byref(out))
    return (code, out.value) if code == OK else (code, None)


def ANeuralNetworksExecution_getOutputOperandRank(execution: Handle, index: int
                                                  ) -> tuple[int, int | None]:
    out = ctypes.c_uint32()
    code = load().ANeuralNetworksExecution_getOutputOperandRank(_h(execution), index,
                                                                ctypes.byref(out))
    return (code, out.value) if code == OK else (code, None)


def ANeuralNetworksExecution_getOutputOperandDimensions(execution: Handle, index: int
                                                        ) -> tuple[int, list[int] | None]:
    code, rank = ANeuralNetworksExecution_getOutputOperandRank(execution, index)
    if code != OK:
        return code, None
    out = (ctypes.c_uint32 * max(rank or 0, 1))()
    code = load().ANeuralNetworksExecution_getOutputOperandDimensions(_h(execution), index, out)
    return (code, list(out[:rank])) if code == OK else (code, None)


def _preferred(name: str, compilation: Handle, index: int) -> tuple[int, int | None]:
    out = ctypes.c_uint32()
    code = getattr(load(), name)(_h(compilation), index, ctypes.byref(out))
    return (code, out.value) if code == OK else (code, None)


def ANeuralNetworksCompilation_getPreferredMemoryAlignmentForInput(
        compilation: Handle, index: int) -> tuple[int, int | None]:
    return _preferred("ANeuralNetworksCompilation_getPreferredMemoryAlignmentForInput",
                      compilation, index)


def ANeuralNetworksCompilation_getPreferredMemoryPaddingForInput(
        compilation: Handle, index: int) -> tuple[int, int | None]:
    return _preferred("ANeuralNetworksCompilation_getPreferredMemoryPaddingForInput",
                      compilation, index)


def ANeuralNetworksCompilation_getPreferredMemoryAlignmentForOutput(
        compilation: Handle, index: int) -> tuple[int, int | None]:
    return _preferred("ANeuralNetworksCompilation_getPreferredMemoryAlignmentForOutput",
                      compilation, index)


def ANeuralNetworksCompilation_getPreferredMemoryPaddingForOutput(
        compilation: Handle, index: int) -> tuple[int, int | None]:
    return _preferred("ANeuralNetworksCompilation_getPreferredMemoryPaddingForOutput",
                      compilation, index)


def ANeuralNetworksExecution_enableInputAndOutputPadding(execution: Handle, enable: bool
                                                         ) -> int:
    return load().ANeuralNetworksExecution_enableInputAndOutputPadding(_h(execution),
                                                                       bool(enable))


def ANeuralNetworksEvent_wait(event: Handle) -> int:
    return load().ANeuralNetworksEvent_wait(_h(event))


def ANeuralNetworksEvent_free(event: Handle | None) -> None:
    load().ANeuralNetworksEvent_free(_h(event))


def ANeuralNetworksMemory_createFromFd(size: int, protect: int, fd: int, offset: int
                                       ) -> tuple[int, Handle | None]:
    out = ctypes.c_void_p()
    return _out_handle(load().ANeuralNetworksMemory_createFromFd(size, protect, fd, offset,
                                                                 ctypes.byref(out)), out)


def ANeuralNetworksMemory_free(memory: Handle | None) -> None:
    load().ANeuralNetworksMemory_free(_h(memory))
