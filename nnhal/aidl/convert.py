"""Canonical <-> AIDL values, checked: a value that cannot be converted is INVALID_ARGUMENT.

Each conversion checks what it reads (types, AIDL's int32/int64 ranges, the -1 conventions,
unions, ``padding``) and nothing more: the canonical rules of a model or request are the
driver's, checked once where the canonical driver checks them. Two facts the AIDL types do
not carry are handled here: ``numberOfConsumers`` (counted from the operations on the way in;
on the way out a canonical model must state it right, since AIDL cannot carry a wrong one to
the driver that would refuse it) and the clocks (AIDL deadlines are on the boot clock, the
core's on the steady clock: the offset is read at each conversion, as it grows while the
device sleeps).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from nnhal.aidl import types as A
from nnhal.aidl.errors import ServiceSpecificError, invalid
from nnhal.hal import types as C
from nnhal.hal.fence import SyncFence
from nnhal.memory import SharedMemory

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
T = TypeVar("T")


# ---- checks -------------------------------------------------------------------------------

def _int(x: object, what: str, lo: int = -2**31, hi: int = INT32_MAX) -> int:
    if isinstance(x, int) and not isinstance(x, bool) and lo <= x <= hi:
        return int(x)
    raise invalid(f"{what} must be an int in [{lo}, {hi}], not {_show(x)}")


def _int64(x: object, what: str, lo: int = -2**63) -> int:
    return _int(x, what, lo, INT64_MAX)


def _bool(x: object, what: str) -> bool:
    if isinstance(x, bool):
        return x
    raise invalid(f"{what} must be a bool, not {_show(x)}")


def _float(x: object, what: str) -> float:
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        try:
            return float(x)
        except OverflowError:
            pass
    raise invalid(f"{what} must be a float, not {_show(x)}")


def _bytes(x: object, what: str) -> bytes:
    if isinstance(x, (bytes, bytearray)):
        return bytes(x)
    raise invalid(f"{what} must be bytes, not {_show(x)}")


def _str(x: object, what: str) -> str:
    if isinstance(x, str):
        return x
    raise invalid(f"{what} must be a str, not {_show(x)}")


def _is(x: object, cls: type[T], what: str) -> T:
    if isinstance(x, cls):
        return x
    raise invalid(f"{what} must be a {cls.__name__}, not {_show(x)}")


def _list(x: object, what: str, each: Callable[[Any, str], T]) -> list[T]:
    if not isinstance(x, (list, tuple)):
        raise invalid(f"{what} must be a list, not {_show(x)}")
    return [each(v, f"{what}[{k}]") for k, v in enumerate(x)]


def _show(x: object) -> str:
    text = repr(x) if isinstance(x, (int, float, bool, type(None))) else type(x).__name__
    return text[:40]


def _dims(x: object, what: str) -> list[int]:
    return _list(x, what, lambda v, w: _int(v, w, 0))


def _ints(x: object, what: str) -> list[int]:
    return _list(x, what, _int)


def checked(fn: Callable[[], T]) -> T:
    """Run a conversion of a value the caller built, whatever it holds: a failure is
    INVALID_ARGUMENT (an object whose attributes are missing, say), never another error."""
    try:
        return fn()
    except ServiceSpecificError:
        raise
    except Exception as e:  # noqa: BLE001 - hostile values: any failure is a bad argument
        raise invalid(f"cannot convert: {type(e).__name__}: {e}"[:200]) from None


# ---- times ---------------------------------------------------------------------------------

def boot_offset() -> int:
    """Boot-clock ns minus steady-clock ns now."""
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME) - time.monotonic_ns()


def _minus_one_or_ns(x: object, what: str) -> int | None:
    v = _int64(x, what, -1)
    return None if v == -1 else v


def deadline_from_aidl(deadline_ns: object, offset: int | None = None) -> int | None:
    """An AIDL deadline (boot clock, -1 for none) as the core's (steady clock, None)."""
    v = _minus_one_or_ns(deadline_ns, "deadlineNs (-1 for none)")
    if v is None:
        return None
    return max(0, v - (boot_offset() if offset is None else offset))


def deadline_to_aidl(deadline: int | None, offset: int | None = None) -> int:
    if deadline is None:
        return A.NO_DEADLINE
    v = _int64(deadline, "deadline", 0)
    return min(INT64_MAX, v + (boot_offset() if offset is None else offset))


def duration_from_aidl(ns: object, what: str = "durationNs") -> int | None:
    """A duration or loop timeout: -1 is "not given" (None), other negatives are invalid."""
    return _minus_one_or_ns(ns, f"{what} (-1 for none)")


def duration_to_aidl(ns: int | None, what: str = "duration") -> int:
    return -1 if ns is None else _int64(ns, what, 0)


def timing_to_aidl(t: C.Timing) -> A.Timing:
    """Canonical µs (UINT64_MAX: not available) as AIDL ns (-1)."""
    def ns(us: int) -> int:
        return -1 if us == C.NO_TIME or us < 0 else min(us * 1000, INT64_MAX)
    return A.Timing(ns(t.time_on_device), ns(t.time_in_driver))


def timing_from_aidl(t: object) -> C.Timing:
    t = _is(t, A.Timing, "timing")

    def us(ns: object, what: str) -> int:
        v = _int64(ns, what, -1)
        return C.NO_TIME if v == -1 else v // 1000
    return C.Timing(us(t.time_on_device_ns, "timeOnDeviceNs"),
                    us(t.time_in_driver_ns, "timeInDriverNs"))


def measure_from_aidl(measure_timing: object) -> C.MeasureTiming:
    return C.MeasureTiming.YES if _bool(measure_timing, "measureTiming") else C.MeasureTiming.NO


# ---- hints, configs ------------------------------------------------------------------------

def _hint(x: object, what: str) -> C.TokenValuePair:
    x = _is(x, C.TokenValuePair, what)
    return C.TokenValuePair(_int(x.token, f"{what}.token", 0), _bytes(x.value, f"{what}.value"))


def _hints(x: object, what: str) -> tuple[C.TokenValuePair, ...]:
    hints = _list(x, what, _hint)
    if len({h.token for h in hints}) != len(hints):
        raise invalid(f"{what} holds a token twice")
    return tuple(hints)


def _prefix(x: object, what: str) -> C.ExtensionNameAndPrefix:
    x = _is(x, C.ExtensionNameAndPrefix, what)
    return C.ExtensionNameAndPrefix(_str(x.name, f"{what}.name"),
                                    _int(x.prefix, f"{what}.prefix", 0, 0xFFFF))


def _prefixes(x: object, what: str) -> list[C.ExtensionNameAndPrefix]:
    return _list(x, what, _prefix)


def execution_config_from_aidl(config: object) -> C.ExecutionConfig:
    c = _is(config, A.ExecutionConfig, "config")
    return C.ExecutionConfig(
        measure_from_aidl(c.measure_timing),
        duration_from_aidl(c.loop_timeout_duration_ns, "loopTimeoutDurationNs"),
        _hints(c.execution_hints, "executionHints"),
        tuple(_prefixes(c.extension_name_to_prefix, "extensionNameToPrefix")))


def execution_config_to_aidl(config: C.ExecutionConfig) -> A.ExecutionConfig:
    return checked(lambda: A.ExecutionConfig(
        config.measure == C.MeasureTiming.YES,
        duration_to_aidl(config.loop_timeout, "loop timeout"),
        _hints(config.execution_hints, "execution hints"),
        tuple(_prefixes(config.extension_name_to_prefix, "extension names"))))


def cache_files(x: object, what: str) -> list[Any]:
    """ParcelFileDescriptor[]: ints or objects with ``fileno()``."""
    def fd(v: object, w: str) -> Any:
        if (isinstance(v, int) and not isinstance(v, bool)) or callable(getattr(v, "fileno",
                                                                                 None)):
            return v
        raise invalid(f"{w} must be a file descriptor, not {_show(v)}")
    return _list(x, what, fd)


def prepare_config_from_aidl(config: object) -> C.PrepareModelConfig:
    c = _is(config, A.PrepareModelConfig, "config")
    return C.PrepareModelConfig(
        _int(c.preference, "preference"), _int(c.priority, "priority"),
        deadline_from_aidl(c.deadline_ns), cache_files(c.model_cache, "modelCache"),
        cache_files(c.data_cache, "dataCache"), _bytes(c.cache_token, "cacheToken"),
        _hints(c.compilation_hints, "compilationHints"),
        _prefixes(c.extension_name_to_prefix, "extensionNameToPrefix"))


def prepare_config_to_aidl(c: C.PrepareModelConfig) -> A.PrepareModelConfig:
    return checked(lambda: A.PrepareModelConfig(
        _int(c.preference, "preference"), _int(c.priority, "priority"),
        deadline_to_aidl(c.deadline), cache_files(c.model_cache, "model cache"),
        cache_files(c.data_cache, "data cache"), _bytes(c.cache_token, "cache token"),
        list(_hints(c.compilation_hints, "compilation hints")),
        _prefixes(c.extension_name_to_prefix, "extension names")))


# ---- models --------------------------------------------------------------------------------

def _location_from_aidl(x: object, what: str) -> C.DataLocation:
    loc = _is(x, A.DataLocation, what)
    if _int64(loc.padding, f"{what}.padding") != 0:
        raise invalid(f"{what}.padding must be 0 in an operand")
    return C.DataLocation(_int(loc.pool_index, f"{what}.poolIndex"),
                          _int64(loc.offset, f"{what}.offset", 0),
                          _int64(loc.length, f"{what}.length", 0))


def _extra(x: object, what: str) -> C.SymmPerChannelQuantParams | bytes | None:
    if x is None or isinstance(x, (bytes, bytearray)):
        return None if x is None else bytes(x)
    q = _is(x, C.SymmPerChannelQuantParams, what)
    return C.SymmPerChannelQuantParams(_list(q.scales, f"{what}.scales", _float),
                                       _int(q.channel_dim, f"{what}.channelDim"))


def _lifetime(x: object, what: str) -> C.OperandLifeTime:
    try:
        return C.OperandLifeTime(_int(x, what))
    except ValueError:
        raise invalid(f"{what}: no OperandLifeTime {x}") from None


def _operation(x: object, what: str) -> C.Operation:
    op = _is(x, C.Operation, what)
    return C.Operation(_int(op.type, f"{what}.type"), _ints(op.inputs, f"{what}.inputs"),
                       _ints(op.outputs, f"{what}.outputs"))


def _subgraph_from_aidl(x: object, what: str) -> C.Subgraph:
    g = _is(x, A.Subgraph, what)
    operations = _list(g.operations, f"{what}.operations", _operation)

    def operand(o: object, w: str) -> C.Operand:
        o = _is(o, A.Operand, w)
        return C.Operand(_int(o.type, f"{w}.type"), _dims(o.dimensions, f"{w}.dimensions"), 0,
                         _float(o.scale, f"{w}.scale"), _int(o.zero_point, f"{w}.zeroPoint"),
                         _lifetime(o.lifetime, f"{w}.lifetime"),
                         _location_from_aidl(o.location, f"{w}.location"),
                         _extra(o.extra_params, f"{w}.extraParams"))
    operands = _list(g.operands, f"{what}.operands", operand)
    for i, n in enumerate(consumers(len(operands), operations)):
        operands[i].number_of_consumers = n
    return C.Subgraph(operands, operations, _ints(g.input_indexes, f"{what}.inputIndexes"),
                      _ints(g.output_indexes, f"{what}.outputIndexes"))


def consumers(count: int, operations: Sequence[C.Operation]) -> list[int]:
    """How many operations read each operand (indexes out of range are the validation's)."""
    n = [0] * count
    for op in operations:
        for i in op.inputs:
            if 0 <= i < count:
                n[i] += 1
    return n


def model_from_aidl(model: object) -> C.Model:
    m = _is(model, A.Model, "model")
    return C.Model(_subgraph_from_aidl(m.main, "main"),
                   _list(m.referenced, "referenced", _subgraph_from_aidl),
                   _bytes(m.operand_values, "operandValues"),
                   _list(m.pools, "pools", lambda v, w: _is(v, SharedMemory, w)),
                   _bool(m.relax_computation_float32_to_float16,
                         "relaxComputationFloat32toFloat16"),
                   _prefixes(m.extension_name_to_prefix, "extensionNameToPrefix"))


def _subgraph_to_aidl(g: C.Subgraph, what: str) -> A.Subgraph:
    g = _is(g, C.Subgraph, what)
    operations = _list(g.operations, f"{what}.operations", _operation)
    raw = _list(g.operands, f"{what}.operands", lambda v, w: _is(v, C.Operand, w))
    count = consumers(len(raw), operations)
    operands = []
    for i, o in enumerate(raw):
        w = f"{what}.operands[{i}]"
        if o.number_of_consumers != count[i]:
            raise invalid(f"{w}: numberOfConsumers is {o.number_of_consumers}, but "
                          f"{count[i]} operations read it")
        loc = _is(o.location, C.DataLocation, f"{w}.location")
        operands.append(A.Operand(
            _int(o.type, f"{w}.type"), _dims(o.dimensions, f"{w}.dimensions"),
            _float(o.scale, f"{w}.scale"), _int(o.zero_point, f"{w}.zeroPoint"),
            _lifetime(o.lifetime, f"{w}.lifetime"),
            A.DataLocation(_int(loc.pool_index, f"{w}.poolIndex"),
                           _int64(loc.offset, f"{w}.offset", 0),
                           _int64(loc.length, f"{w}.length", 0)),
            _extra(o.extra_params, f"{w}.extraParams")))
    return A.Subgraph(operands, operations, _ints(g.input_indexes, f"{what}.inputIndexes"),
                      _ints(g.output_indexes, f"{what}.outputIndexes"))


def model_to_aidl(model: C.Model) -> A.Model:
    def convert() -> A.Model:
        m = _is(model, C.Model, "model")
        return A.Model(_subgraph_to_aidl(m.main, "main"),
                       _list(m.referenced, "referenced", _subgraph_to_aidl),
                       _bytes(m.operand_values, "operandValues"),
                       _list(m.pools, "pools", lambda v, w: _is(v, SharedMemory, w)),
                       _bool(m.relax_computation_float32_to_float16,
                             "relaxComputationFloat32toFloat16"),
                       _prefixes(m.extension_name_to_prefix, "extensionNameToPrefix"))
    return checked(convert)


# ---- requests ------------------------------------------------------------------------------

def _pool_from_aidl(x: object, what: str) -> C.MemoryPool:
    p = _is(x, A.RequestMemoryPool, what)
    if (p.pool is None) == (p.token is None):
        raise invalid(f"{what}: a RequestMemoryPool holds exactly one of pool and token")
    if p.token is not None:
        return C.MemoryPool.of_token(_int(p.token, f"{what}.token"))
    return C.MemoryPool.of(_is(p.pool, SharedMemory, f"{what}.pool"))


def request_from_aidl(request: object) -> C.Request:
    r = _is(request, A.Request, "request")
    pools = _list(r.pools, "pools", _pool_from_aidl)

    def argument(x: object, what: str) -> C.RequestArgument:
        a = _is(x, A.RequestArgument, what)
        loc = _is(a.location, A.DataLocation, f"{what}.location")
        index = _int(loc.pool_index, f"{what}.poolIndex")
        offset = _int64(loc.offset, f"{what}.offset", 0)
        length = _int64(loc.length, f"{what}.length", 0)
        padding = _int64(loc.padding, f"{what}.padding", 0)
        if padding and 0 <= index < len(pools):
            mem = pools[index].hidl_memory
            if mem is None or offset + length + padding > mem.size:
                raise invalid(f"{what}: offset + length + padding is past its pool")
        return C.RequestArgument(_bool(a.has_no_value, f"{what}.hasNoValue"),
                                 C.DataLocation(index, offset, length),
                                 _dims(a.dimensions, f"{what}.dimensions"))
    return C.Request(_list(r.inputs, "inputs", argument), _list(r.outputs, "outputs", argument),
                     pools)


def _pool_to_aidl(p: object, what: str) -> A.RequestMemoryPool:
    if isinstance(p, C.MemoryPool):
        if p.token is not None:
            return A.RequestMemoryPool.of_token(_int(p.token, f"{what}.token"))
        p = p.hidl_memory
    return A.RequestMemoryPool.of(_is(p, SharedMemory, what))


def request_to_aidl(request: C.Request) -> A.Request:
    def argument(x: object, what: str) -> A.RequestArgument:
        a = _is(x, C.RequestArgument, what)
        loc = _is(a.location, C.DataLocation, f"{what}.location")
        return A.RequestArgument(_bool(a.has_no_value, f"{what}.hasNoValue"),
                                 A.DataLocation(_int(loc.pool_index, f"{what}.poolIndex"),
                                                _int64(loc.offset, f"{what}.offset", 0),
                                                _int64(loc.length, f"{what}.length", 0)),
                                 _dims(a.dimensions, f"{what}.dimensions"))

    def convert() -> A.Request:
        r = _is(request, C.Request, "request")
        return A.Request(_list(r.inputs, "inputs", argument),
                         _list(r.outputs, "outputs", argument),
                         _list(r.pools, "pools", _pool_to_aidl))
    return checked(convert)


# ---- results and the rest ------------------------------------------------------------------

def _shape(x: object, what: str) -> C.OutputShape:
    s = _is(x, C.OutputShape, what)
    return C.OutputShape(_dims(s.dimensions, f"{what}.dimensions"),
                         _bool(s.is_sufficient, f"{what}.isSufficient"))


def output_shapes(x: object) -> list[C.OutputShape]:
    return _list(x, "outputShapes", _shape)


def result_to_aidl(status: C.ErrorStatus, shapes: list[C.OutputShape], timing: C.Timing
                   ) -> A.ExecutionResult:
    """A canonical execution's answer on the AIDL face (raises for a failure)."""
    from nnhal.aidl.errors import raise_status

    if status == C.ErrorStatus.OUTPUT_INSUFFICIENT_SIZE:
        return A.ExecutionResult(False, checked(lambda: output_shapes(shapes)), A.NO_TIMING)
    raise_status(status)
    return A.ExecutionResult(True, checked(lambda: output_shapes(shapes)),
                             timing_to_aidl(timing))


def result_from_aidl(result: object
                     ) -> tuple[C.ErrorStatus, list[C.OutputShape], C.Timing]:
    """An AIDL driver's ExecutionResult as the canonical tuple."""
    r = _is(result, A.ExecutionResult, "ExecutionResult")
    shapes = output_shapes(r.output_shapes)
    if not _bool(r.output_sufficient_size, "outputSufficientSize"):
        return C.ErrorStatus.OUTPUT_INSUFFICIENT_SIZE, shapes, C.NO_TIMING
    return C.ErrorStatus.NONE, shapes, timing_from_aidl(r.timing)


def fences(x: object, what: str = "waitFor") -> list[SyncFence]:
    return _list(x, what, lambda v, w: _is(v, SyncFence, w))


def buffer_desc(x: object) -> C.BufferDesc:
    d = _is(x, C.BufferDesc, "desc")
    return C.BufferDesc(_dims(d.dimensions, "desc.dimensions"))


def roles(x: object, what: str) -> list[C.BufferRole]:
    def role(v: object, w: str) -> C.BufferRole:
        r = _is(v, C.BufferRole, w)
        return C.BufferRole(_int(r.model_index, f"{w}.modelIndex", 0),
                            _int(r.io_index, f"{w}.ioIndex", 0),
                            _float(r.frequency, f"{w}.probability"))
    return _list(x, what, role)


def memory(x: object, what: str) -> SharedMemory:
    return _is(x, SharedMemory, what)


def int32(x: object, what: str, lo: int = -2**31, hi: int = INT32_MAX) -> int:
    return _int(x, what, lo, hi)


def int64(x: object, what: str, lo: int = -2**63) -> int:
    return _int64(x, what, lo)


def dims(x: object, what: str) -> list[int]:
    return _dims(x, what)


def token(x: object) -> bytes:
    return _bytes(x, "token")


def is_a(x: object, cls: type[T], what: str) -> T:
    return _is(x, cls, what)


def list_of(x: object, what: str, each: Callable[[Any, str], T]) -> list[T]:
    return _list(x, what, each)
