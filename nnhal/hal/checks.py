"""Python types and numeric ranges of HAL arguments, checked at the driver boundary.

The HAL is a typed interface: a ``uint32_t`` offset cannot be 1.5, a deadline cannot be
``"soon"``, a ``float`` scale cannot be a string. Python lets a client pass anything, so every
entry point of a driver first checks that each field of each structure it was given, and each
plain argument, has a Python type the HAL field can hold and a value within the field's width:

* uint32 (``int``, IntEnum members included, never ``bool``): dimensions, offsets, lengths,
  pool indexes, operand and operation indexes, numberOfConsumers, channelDim, memory domain
  tokens, buffer-role indexes. numpy integers are accepted in ``dimensions`` lists only:
  elsewhere they would reach offset arithmetic, where mixing numpy integer types silently
  gives floats;
* int32: zeroPoint and enum fields (lifetime); operand and operation types are enum values
  whose extension encoding ((prefix << 16) | low, prefix a uint16) uses all 32 bits, so they
  are checked as uint32;
* float: scale, channel scales, role frequency: finite as a float32 (``int`` accepted, ``bool``
  and ``str`` rejected);
* uint64 or ``None``: deadlines, loop timeout and timeout durations (steady-clock ns);
* enum arguments (measure, preference, priority): one of the enum's values;
* bool: ``hasNoValue``, ``relaxComputationFloat32toFloat16``;
* the cache token: ``BYTE_SIZE_OF_CACHE_TOKEN`` bytes;
* lists: ``list`` or ``tuple`` (never a str, a dict, an array or an iterator).

Every function here raises :class:`InvalidArgument` (the entry point answers INVALID_ARGUMENT)
with a message naming the field. They check types and ranges only; the structural and
semantic rules (counts, indexes in range, lifetimes, quantization ranges, ...) stay in
:mod:`nnhal.validation` and the operations. Two structural rules live here because they are
about the shape of the argument itself: the main subgraph must have at least one input and one
output, and a request memory pool is exactly one of a memory and a token.

The per-execution checks (:func:`check_execution_args`) take a fast path of ``type(x) is int``
tests and fall back to the full check, with its message, only when that fails. This module
imports nothing of the driver (only :mod:`nnhal.hal.types` and numpy); a memory's kind is
checked where the driver maps it.
"""

from __future__ import annotations

import math
import reprlib
from typing import Any

import numpy as np

from nnhal.hal.types import (
    BYTE_SIZE_OF_CACHE_TOKEN,
    BufferDesc,
    BufferRole,
    ChannelScales,
    DataLocation,
    ExecutionPreference,
    ExtensionNameAndPrefix,
    ExtensionOperandType,
    MeasureTiming,
    MemoryPool,
    Model,
    Operand,
    OperandLifeTime,
    OperandType,
    Operation,
    Priority,
    Request,
    RequestArgument,
    Subgraph,
    SymmPerChannelQuantParams,
)

__all__ = [
    "InvalidArgument", "UINT32_MAX", "INT32_MIN", "INT32_MAX", "UINT64_MAX",
    "check_model_fields", "check_request_fields", "check_execution_args", "check_deadline",
    "check_duration", "check_loop_timeout", "check_measure", "check_preference",
    "check_priority", "check_token", "check_dimensions", "check_buffer_desc", "check_roles",
    "check_allocate_args",
]

UINT16_MAX = 0xFFFF
UINT32_MAX = 0xFFFF_FFFF
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
UINT64_MAX = (1 << 64) - 1
#: The largest finite float32: a HAL ``float`` field holds nothing larger.
FLOAT32_MAX = float(np.finfo(np.float32).max)

_show = reprlib.Repr()
_show.maxstring = 40
_show.maxother = 40
_show.maxlist = _show.maxtuple = 8
_show.maxlong = 30


class InvalidArgument(Exception):
    """A HAL argument has the wrong Python type or a value outside its field's range."""


def _fail(what: str, expected: str, value: object) -> InvalidArgument:
    return InvalidArgument(f"{what} must be {expected}, got {_show.repr(value)}")


# ---- scalars ---------------------------------------------------------------------------------

def _is_int(x: object) -> bool:
    """A Python int (IntEnum members included), never a bool."""
    return type(x) is int or (isinstance(x, int) and not isinstance(x, bool))


def _uint32(x: object, what: str) -> None:
    if type(x) is int:
        if 0 <= x <= UINT32_MAX:
            return
    elif _is_int(x) and 0 <= x <= UINT32_MAX:  # type: ignore[operator]
        return
    raise _fail(what, "a uint32", x)


def _int32(x: object, what: str) -> None:
    if _is_int(x) and INT32_MIN <= x <= INT32_MAX:  # type: ignore[operator]
        return
    raise _fail(what, "an int32", x)


def _uint16(x: object, what: str) -> None:
    if _is_int(x) and 0 <= x <= UINT16_MAX:  # type: ignore[operator]
        return
    raise _fail(what, "a uint16", x)


def _bool(x: object, what: str) -> None:
    if type(x) is not bool and not isinstance(x, np.bool_):
        raise _fail(what, "a bool", x)


def _float(x: object, what: str) -> None:
    """A HAL ``float``: a finite real that a float32 can hold; int accepted, bool not."""
    if type(x) is float or (isinstance(x, (float, int, np.floating, np.integer))
                            and not isinstance(x, bool)):
        try:
            v = float(x)  # type: ignore[arg-type]
        except OverflowError:  # an int beyond any float
            raise _fail(what, "a finite float", x) from None
        if math.isfinite(v) and abs(v) <= FLOAT32_MAX:
            return
    raise _fail(what, "a finite float", x)


def _list(x: object, what: str) -> None:
    if type(x) is not list and not isinstance(x, (list, tuple)):
        raise _fail(what, "a list", x)


def _uint32_list(xs: object, what: str) -> None:
    _list(xs, what)
    for k, x in enumerate(xs):  # type: ignore[arg-type]
        _uint32(x, f"{what}[{k}]")


def check_dimensions(dims: object, what: str = "dimensions") -> None:
    """A list (or tuple) of uint32; numpy integers are accepted, floats and bools are not."""
    if type(dims) is not list and not isinstance(dims, (list, tuple)):
        raise _fail(what, "a list of uint32", dims)
    for k, d in enumerate(dims):
        if type(d) is int:
            if 0 <= d <= UINT32_MAX:
                continue
        elif (_is_int(d) or isinstance(d, np.integer)) and 0 <= d <= UINT32_MAX:
            continue
        raise _fail(f"{what}[{k}]", "a uint32", d)


def _optional_uint64(x: object, what: str, unit: str) -> None:
    if x is None:
        return
    if type(x) is int:
        if 0 <= x <= UINT64_MAX:
            return
    elif _is_int(x) and 0 <= x <= UINT64_MAX:  # type: ignore[operator]
        return
    raise _fail(what, f"None or a uint64 ({unit})", x)


def check_deadline(deadline: object, what: str = "deadline") -> None:
    """None, or a steady-clock time in ns (time.monotonic_ns()) as a uint64."""
    _optional_uint64(deadline, what, "steady-clock ns")


def check_duration(duration: object, what: str = "timeout duration") -> None:
    """None, or a duration in ns as a uint64."""
    _optional_uint64(duration, what, "ns")


def check_loop_timeout(loop_timeout: object, what: str = "loop timeout duration") -> None:
    """None (the default), or a duration in ns as a uint64; the 15 s maximum is a rule of the
    request validation."""
    _optional_uint64(loop_timeout, what, "ns")


def _enum(x: object, cls: Any, what: str) -> None:
    if type(x) is cls:
        return
    if _is_int(x):
        try:
            cls(x)
            return
        except ValueError:
            pass
    names = ", ".join(f"{m.name}={int(m)}" for m in cls)
    raise _fail(what, f"a {cls.__name__} ({names})", x)


def check_measure(measure: object) -> None:
    _enum(measure, MeasureTiming, "measure")


def check_preference(preference: object) -> None:
    _enum(preference, ExecutionPreference, "preference")


def check_priority(priority: object) -> None:
    _enum(priority, Priority, "priority")


def check_token(token: object, what: str = "cache token") -> bytes:
    """The cache token as bytes: exactly BYTE_SIZE_OF_CACHE_TOKEN bytes (bytes, bytearray,
    any buffer of one-byte items such as a uint8 array, or a list or tuple of ints in
    [0, 255]; never a str or an int)."""
    expected = f"{BYTE_SIZE_OF_CACHE_TOKEN} bytes"
    if isinstance(token, (bytes, bytearray)):
        raw = bytes(token)
    elif isinstance(token, (list, tuple)):
        if not all(_is_int(b) and 0 <= b <= 255 for b in token):
            raise _fail(what, expected, token)
        raw = bytes(token)
    else:
        try:
            view = memoryview(token)  # type: ignore[arg-type]
        except TypeError:
            raise _fail(what, expected, token) from None
        if view.itemsize != 1:
            raise _fail(what, expected, token)
        raw = view.tobytes()
    if len(raw) != BYTE_SIZE_OF_CACHE_TOKEN:
        raise InvalidArgument(f"{what} must be {expected}, got {len(raw)} bytes")
    return raw


# ---- model ---------------------------------------------------------------------------------

def _check_location(loc: object, what: str) -> None:
    if not isinstance(loc, DataLocation):
        raise _fail(what, "a DataLocation", loc)
    _uint32(loc.pool_index, f"{what}.poolIndex")
    _uint32(loc.offset, f"{what}.offset")
    _uint32(loc.length, f"{what}.length")


def _check_operand(op: object, where: str) -> None:
    if not isinstance(op, Operand):
        raise _fail(where, "an Operand", op)
    _uint32(op.type, f"{where}: type")
    check_dimensions(op.dimensions, f"{where}: dimensions")
    _uint32(op.number_of_consumers, f"{where}: numberOfConsumers")
    _float(op.scale, f"{where}: scale")
    _int32(op.zero_point, f"{where}: zeroPoint")
    _int32(op.lifetime, f"{where}: lifetime")
    _check_location(op.location, f"{where}: location")
    extra = op.extra_params
    if extra is None or isinstance(extra, (bytes, bytearray)):
        return
    if not isinstance(extra, SymmPerChannelQuantParams):
        raise _fail(f"{where}: extraParams", "None, channel quantization or bytes", extra)
    _uint32(extra.channel_dim, f"{where}: extraParams.channelQuant.channelDim")
    _list(extra.scales, f"{where}: extraParams.channelQuant.scales")
    scales = extra.scales
    if type(scales) is ChannelScales:  # floats by construction, their bounds known
        if scales.bounds[1] <= FLOAT32_MAX:  # False for NaN and infinities too
            return
    elif set(map(type, scales)) <= {float}:
        # One vectorised check for the common case (a filter has thousands of channels);
        # anything else is checked one by one below, which names the bad entry.
        arr = np.asarray(scales, dtype=np.float64)
        if bool(np.all(np.abs(arr) <= FLOAT32_MAX)):  # False for NaN and infinities too
            return
    for k, s in enumerate(scales):
        _float(s, f"{where}: extraParams.channelQuant.scales[{k}]")


def _u32(x: object) -> bool:
    """:func:`_uint32`'s rule as a predicate (no message to build)."""
    return (type(x) is int or (isinstance(x, int) and not isinstance(x, bool))) and \
        0 <= x <= UINT32_MAX  # type: ignore[operator]


def _u32_list(xs: object) -> bool:
    return (type(xs) is list or isinstance(xs, (list, tuple))) and \
        all(_u32(x) for x in xs)  # type: ignore[union-attr]


def _uint32s(xs: object) -> bool:
    """:func:`_u32_list`, with no call per item when the items are plain ints."""
    if type(xs) is list:
        for x in xs:
            if type(x) is not int or not 0 <= x <= UINT32_MAX:
                break
        else:
            return True
    return _u32_list(xs)


#: The Python types an operand's type and lifetime usually have: ints and the HAL's enums
#: (never bool), for which :func:`_operand_ok` needs no call per field.
_INT_FIELDS = frozenset({int, OperandType, OperandLifeTime, ExtensionOperandType})


def _operand_ok(op: object) -> bool:
    """Whether :func:`_check_operand` passes, decided without building its messages (one
    string per field, which cost a model of thousands of operands milliseconds); False
    sends the operand through :func:`_check_operand`, which names what is wrong. Operands
    with channel quantization always go there.

    First in one expression over the usual types (exact ints or the HAL's enums, a list of
    ints, a float, bytes or no extra parameters: every field in range); anything else is
    decided field by field (:func:`_operand_fields_ok`)."""
    if type(op) is not Operand:
        return False
    loc, t, lt, zp, n = op.location, op.type, op.lifetime, op.zero_point, \
        op.number_of_consumers
    dims, scale, extra = op.dimensions, op.scale, op.extra_params
    if type(loc) is DataLocation and type(dims) is list and type(scale) is float and \
            (extra is None or type(extra) is bytes) and type(t) in _INT_FIELDS and \
            type(lt) in _INT_FIELDS and type(n) is int and type(zp) is int:
        p, o, length = loc.pool_index, loc.offset, loc.length
        # Non-negative ints below 2**32 exactly when their bitwise or is.
        if type(p) is int and type(o) is int and type(length) is int and \
                0 <= (t | n | p | o | length) <= UINT32_MAX and \
                INT32_MIN <= zp <= INT32_MAX and INT32_MIN <= lt <= INT32_MAX and \
                math.isfinite(scale) and abs(scale) <= FLOAT32_MAX and _uint32s(dims):
            return True
    return _operand_fields_ok(op)


def _operand_fields_ok(op: Operand) -> bool:
    """:func:`_operand_ok`'s answer field by field, for any types."""
    extra, loc, scale = op.extra_params, op.location, op.scale
    if not (extra is None or isinstance(extra, (bytes, bytearray))) or \
            type(loc) is not DataLocation or type(scale) is not float or \
            not (math.isfinite(scale) and abs(scale) <= FLOAT32_MAX):
        return False
    zp, lt = op.zero_point, op.lifetime
    return (_u32(op.type) and _u32(op.number_of_consumers) and _u32_list(op.dimensions)
            and type(zp) is int and INT32_MIN <= zp <= INT32_MAX
            and _is_int(lt) and INT32_MIN <= lt <= INT32_MAX  # type: ignore[operator]
            and _u32(loc.pool_index) and _u32(loc.offset) and _u32(loc.length))


def _check_subgraph(sg: object, name: str) -> None:
    if not isinstance(sg, Subgraph):
        raise _fail(name, "a Subgraph", sg)
    _list(sg.operands, f"{name}: operands")
    _list(sg.operations, f"{name}: operations")
    _uint32_list(sg.input_indexes, f"{name}: inputIndexes")
    _uint32_list(sg.output_indexes, f"{name}: outputIndexes")
    for i, op in enumerate(sg.operands):
        if not _operand_ok(op):
            _check_operand(op, f"{name} operand {i}")
    for k, operation in enumerate(sg.operations):
        if type(operation) is Operation and _u32(operation.type) and \
                _uint32s(operation.inputs) and _uint32s(operation.outputs):
            continue
        where = f"{name} operation {k}"
        if not isinstance(operation, Operation):
            raise _fail(where, "an Operation", operation)
        _uint32(operation.type, f"{where}: type")
        _uint32_list(operation.inputs, f"{where}: inputs")
        _uint32_list(operation.outputs, f"{where}: outputs")


def check_model_fields(model: object) -> None:
    """Every field of a Model, of its subgraphs (walked in a loop, never recursively), of
    their operands and operations; and a main subgraph with at least one input and output.

    Pools are checked to be a list here; that each is a memory the driver can map is checked
    where the driver maps them.
    """
    if not isinstance(model, Model):
        raise _fail("model", "a Model", model)
    if not isinstance(model.operand_values, (bytes, bytearray, memoryview)):
        raise _fail("model operandValues", "bytes", model.operand_values)
    _list(model.pools, "model pools")
    _bool(model.relax_computation_float32_to_float16, "model relaxComputationFloat32toFloat16")
    _list(model.extension_name_to_prefix, "model extensionNameToPrefix")
    for k, ext in enumerate(model.extension_name_to_prefix):
        where = f"model extensionNameToPrefix[{k}]"
        if not isinstance(ext, ExtensionNameAndPrefix):
            raise _fail(where, "an ExtensionNameAndPrefix", ext)
        if not isinstance(ext.name, str):
            raise _fail(f"{where}.name", "a str", ext.name)
        _uint16(ext.prefix, f"{where}.prefix")
    _list(model.referenced, "model referenced")
    _check_subgraph(model.main, "main")
    for i, sg in enumerate(model.referenced):
        _check_subgraph(sg, f"subgraph {i}")
    if not model.main.input_indexes:
        raise InvalidArgument("main subgraph: a model must have at least one input")
    if not model.main.output_indexes:
        raise InvalidArgument("main subgraph: a model must have at least one output")


# ---- request -------------------------------------------------------------------------------

def _check_argument(arg: object, where: str) -> None:
    """The full check of one request argument, with the message naming the field."""
    if not isinstance(arg, RequestArgument):
        raise _fail(where, "a RequestArgument", arg)
    _bool(arg.has_no_value, f"{where}: hasNoValue")
    loc = arg.location
    if not isinstance(loc, DataLocation):
        raise _fail(f"{where}: location", "a DataLocation", loc)
    _uint32(loc.pool_index, f"{where}: location.poolIndex")
    _uint32(loc.offset, f"{where}: location.offset")
    _uint32(loc.length, f"{where}: location.length")
    check_dimensions(arg.dimensions, f"{where}: dimensions")


def _check_arguments(args: object, kind: str) -> None:
    if type(args) is not list and not isinstance(args, (list, tuple)):
        raise _fail(f"request {kind}s", "a list", args)
    for k, arg in enumerate(args):
        _check_argument(arg, f"request {kind} {k}")


def check_request_fields(request: object) -> None:
    """Every field of a Request: arguments (hasNoValue, location, dimensions) and pools (a
    MemoryPool is exactly one of a memory and a uint32 token; a bare memory object is checked
    where the driver maps it)."""
    if type(request) is not Request and not isinstance(request, Request):
        raise _fail("request", "a Request", request)
    _check_arguments(request.inputs, "input")
    _check_arguments(request.outputs, "output")
    pools = request.pools
    if type(pools) is not list and not isinstance(pools, (list, tuple)):
        raise _fail("request pools", "a list", pools)
    for i, pool in enumerate(pools):
        if type(pool) is MemoryPool or isinstance(pool, MemoryPool):
            token = pool.token
            if token is None:
                if pool.hidl_memory is None:
                    raise InvalidArgument(f"request pool {i}: a MemoryPool must hold a memory "
                                          f"or a token, it holds neither")
            elif pool.hidl_memory is not None:
                raise InvalidArgument(f"request pool {i}: a MemoryPool holds a memory or a "
                                      f"token, not both")
            else:
                _uint32(token, f"request pool {i}: token")
        elif pool is None:
            raise _fail(f"request pool {i}", "a memory or a MemoryPool", pool)


def _execution_args_ok(request: Any, measure: Any, deadline: Any, loop_timeout: Any,
                       _R: type = Request, _RA: type = RequestArgument, _DL: type = DataLocation,
                       _MP: type = MemoryPool, _NO: Any = MeasureTiming.NO,
                       _YES: Any = MeasureTiming.YES, _type: type = type, _int: type = int,
                       _bool: type = bool, _list: type = list, _isinstance: Any = isinstance,
                       _u32: int = UINT32_MAX, _u64: int = UINT64_MAX) -> bool:
    """The fast path of :func:`check_execution_args`: True when every field has exactly the
    usual type (Request, lists, RequestArgument, bool, DataLocation of ints, dimensions of
    ints, memories or MemoryPools, a MeasureTiming or 0 or 1, int or None times) and value.
    False means "look closer", not "invalid". One flat function with builtins bound as
    defaults (local lookups): about 1.5 us for two inputs and one output on this project's
    2-core host."""
    if _type(request) is not _R:
        return False
    ins = request.inputs
    outs = request.outputs
    pools = request.pools
    if _type(ins) is not _list or _type(outs) is not _list or _type(pools) is not _list:
        return False
    for args in (ins, outs):
        for arg in args:
            if _type(arg) is not _RA:
                return False
            loc = arg.location
            dims = arg.dimensions
            if _type(loc) is not _DL or _type(arg.has_no_value) is not _bool or \
                    _type(dims) is not _list:
                return False
            p = loc.pool_index
            o = loc.offset
            n = loc.length
            # Three ints, each in [0, 2**32): their bitwise or is too, and only then.
            if not (_type(p) is _type(o) is _type(n) is _int and 0 <= (p | o | n) <= _u32):
                return False
            for d in dims:
                if _type(d) is not _int or not 0 <= d <= _u32:
                    return False
    for pool in pools:
        if _type(pool) is _MP:
            token = pool.token
            if token is None:
                if pool.hidl_memory is None:
                    return False
            elif pool.hidl_memory is not None or _type(token) is not _int or \
                    not 0 <= token <= _u32:
                return False
        elif pool is None or _isinstance(pool, _MP):
            return False
    if measure is not _NO and measure is not _YES and \
            not (_type(measure) is _int and (measure == 0 or measure == 1)):
        return False
    if deadline is not None and not (_type(deadline) is _int and 0 <= deadline <= _u64):
        return False
    if loop_timeout is not None and not (_type(loop_timeout) is _int and
                                         0 <= loop_timeout <= _u64):
        return False
    return True


def check_execution_args(request: object, measure: object, deadline: object,
                         loop_timeout: object) -> None:
    """The arguments every execution entry point takes: request, measure, deadline and loop
    timeout (pass ``None`` for the ones a method does not have)."""
    if _execution_args_ok(request, measure, deadline, loop_timeout):
        return
    check_request_fields(request)
    check_measure(measure)
    check_deadline(deadline)
    check_loop_timeout(loop_timeout)


# ---- memory domains ------------------------------------------------------------------------

def check_buffer_desc(desc: object) -> None:
    if not isinstance(desc, BufferDesc):
        raise _fail("desc", "a BufferDesc", desc)
    check_dimensions(desc.dimensions, "desc dimensions")


def check_roles(roles: object, what: str) -> None:
    """A list of BufferRole: uint32 model and io indexes, a finite float frequency (its
    (0, 1] range is a rule of allocate)."""
    _list(roles, what)
    for k, role in enumerate(roles):  # type: ignore[arg-type]
        where = f"{what}[{k}]"
        if not isinstance(role, BufferRole):
            raise _fail(where, "a BufferRole", role)
        _uint32(role.model_index, f"{where}.modelIndex")
        _uint32(role.io_index, f"{where}.ioIndex")
        _float(role.frequency, f"{where}.probability")


def check_allocate_args(desc: object, prepared_models: object, input_roles: object,
                        output_roles: object) -> None:
    """IDevice::allocate's arguments; that each prepared model is one of this driver's is
    checked by the driver."""
    check_buffer_desc(desc)
    _list(prepared_models, "preparedModels")
    check_roles(input_roles, "inputRoles")
    check_roles(output_roles, "outputRoles")
