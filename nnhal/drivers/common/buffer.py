"""Memory domains: IDevice.allocate validation and the driver-managed buffer (IBuffer).

A buffer is split in two objects so that the client's handle decides its lifetime:

* :class:`DriverBuffer` is the IBuffer the client holds. Dropping it (or calling
  :meth:`DriverBuffer.close`) releases the token, after which a request naming the token is
  rejected.
* :class:`BufferCore` holds the state (roles, dimensions, data) and is what the device's token
  registry and a running execution refer to, so an execution already under way never sees the
  data vanish. It is a :class:`~nnhal.hal.request_pool.RequestBuffer`.

The data of an initialized buffer is an immutable numpy snapshot that every write replaces
(never mutates), so readers take the current snapshot under the lock and use it without
holding the lock: concurrent reads never block each other and a concurrent write never tears a
read. A driver whose buffers live in device memory subclasses :class:`BufferCore` (its
snapshot an immutable device array; :meth:`BufferCore._freeze` and :meth:`BufferCore.host`
the transfers) and passes it to :func:`allocate`.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from nnhal.drivers.common.prepared_model import PreparedModelBase
from nnhal.drivers.common.tokens import MAX_TOKEN, TokenRegistry, TokenRegistryFull
from nnhal.executor import RunError
from nnhal.executor.run import encode, read_argument
from nnhal.hal.checks import InvalidArgument, check_allocate_args, check_dimensions
from nnhal.hal.interfaces import IBuffer, IPreparedModel
from nnhal.hal.request_pool import RequestBuffer
from nnhal.hal.types import (
    BufferDesc,
    BufferRole,
    ErrorStatus,
    MemoryPool,
    Operand,
    OperandType,
    Request,
    operand_type,
)
from nnhal.memory import MemoryError_, SharedMemory
from nnhal.validation import ValidationError

_UNSUPPORTED_TYPES = (OperandType.OEM, OperandType.TENSOR_OEM_BYTE, OperandType.SUBGRAPH)

INPUT, OUTPUT = "input", "output"


class AllocateError(Exception):
    """allocate() must fail with ``status``."""

    def __init__(self, status: ErrorStatus, message: str):
        super().__init__(message)
        self.status = status


# ---- dimensions ---------------------------------------------------------------------------

def combine_dims(a: Sequence[int], b: Sequence[int]) -> list[int] | None:
    """The merge of two dimension lists (0 = unknown axis, [] = unknown rank), or None when
    they are incompatible: ranks both known and different, or an axis known in both and
    different."""
    if not a:
        return [int(d) for d in b]
    if not b:
        return [int(d) for d in a]
    if len(a) != len(b):
        return None
    out = []
    for x, y in zip(a, b):
        if x and y and x != y:
            return None
        out.append(int(x or y))
    return out


def _valid_dims(dims: Any) -> list[int] | None:
    """``dims`` as a list of uint32 values, or None when it is not one."""
    try:
        out = list(dims)
    except TypeError:
        return None
    for d in out:
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or not 0 <= d <= MAX_TOKEN:
            return None
    return [int(d) for d in out]


def _fully_specified(t: OperandType, dims: Sequence[int]) -> bool:
    return t.is_scalar or (len(dims) > 0 and 0 not in dims)


def _same_extra(a: object, b: object) -> bool:
    return a == b


# ---- the buffer state ---------------------------------------------------------------------

class BufferCore:
    """The state of one driver-managed buffer; the device's token table points here.

    ``dims`` are the dimensions deduced at allocation (desc merged with every role operand);
    ``current`` are those of the data last written (fully specified when initialized).
    """

    def __init__(self, token: int, operand_type: OperandType, dims: list[int],
                 models: Sequence[IPreparedModel], roles: set[tuple[int, str, int]]):
        self.token = token
        self.type = operand_type
        self.dims = dims
        # Strong references keep the prepared models (and so their ids in ``roles``) alive for
        # as long as the buffer is.
        self._models = tuple(models)
        self._model_ids = frozenset(id(m) for m in models)
        self._roles = frozenset(roles)
        self._lock = threading.Lock()
        self._data: np.ndarray | None = None
        self.freed = False

    # ---- state ------------------------------------------------------------------------------
    @property
    def initialized(self) -> bool:
        return self._data is not None

    def snapshot(self) -> np.ndarray | None:
        with self._lock:
            return self._data

    def _store(self, arr: np.ndarray | None) -> None:
        with self._lock:
            self._data = arr

    def host(self, data: Any) -> np.ndarray:
        """A snapshot as a host array (for copyTo; a device buffer's transfer)."""
        return data

    def _freeze(self, arr: np.ndarray) -> np.ndarray:
        """A private, read-only copy in the form the executor produces (bools as np.bool_)."""
        want = np.dtype(np.bool_) if self.type in (OperandType.BOOL, OperandType.TENSOR_BOOL8) \
            else self.type.dtype
        out = np.array(arr, dtype=want, copy=True)
        out.flags.writeable = False
        return out

    # ---- IBuffer bodies -----------------------------------------------------------------------
    def copy_to(self, dst: Any) -> ErrorStatus:
        if self.freed:
            return ErrorStatus.GENERAL_FAILURE
        if not isinstance(dst, SharedMemory):
            return ErrorStatus.INVALID_ARGUMENT
        data = self.snapshot()
        if data is None:
            return ErrorStatus.GENERAL_FAILURE
        raw = encode(self.host(data))
        if dst.size != raw.size:
            return ErrorStatus.INVALID_ARGUMENT
        try:
            if raw.size:
                dst.array()[:] = raw
        except (MemoryError_, ValueError):
            return ErrorStatus.INVALID_ARGUMENT
        return ErrorStatus.NONE

    def copy_from(self, src: Any, dimensions: Sequence[int]) -> ErrorStatus:
        if self.freed:
            return ErrorStatus.GENERAL_FAILURE
        status = self._copy_from(src, dimensions)
        if status != ErrorStatus.NONE:
            self._store(None)  # a failed copyFrom leaves the buffer uninitialized
        return status

    def _copy_from(self, src: Any, dimensions: Sequence[int]) -> ErrorStatus:
        if not isinstance(src, SharedMemory):
            return ErrorStatus.INVALID_ARGUMENT
        try:
            check_dimensions(dimensions)
        except InvalidArgument:
            return ErrorStatus.INVALID_ARGUMENT
        dims = _valid_dims(dimensions)
        if dims is None:
            return ErrorStatus.INVALID_ARGUMENT
        if self.type.is_scalar:
            if dims:
                return ErrorStatus.INVALID_ARGUMENT
            shape: tuple[int, ...] = ()
        else:
            if 0 in dims:  # given dimensions are the data's own: no unknown axis
                return ErrorStatus.INVALID_ARGUMENT
            merged = combine_dims(self.dims, dims)
            if merged is None or not _fully_specified(self.type, merged):
                return ErrorStatus.INVALID_ARGUMENT
            shape = tuple(merged)
        nbytes = self.type.byte_size * math.prod(shape)
        if src.size != nbytes:
            return ErrorStatus.INVALID_ARGUMENT
        try:
            raw = src.array()
        except MemoryError_:
            return ErrorStatus.INVALID_ARGUMENT
        self._store(self._freeze(read_argument(raw, self.type, shape)))
        return ErrorStatus.NONE

    # ---- use in a request (called by the prepared model and the executor) -------------------
    def _pool_indexes(self, request: Request) -> set[int]:
        return {i for i, p in enumerate(request.pools)
                if isinstance(p, MemoryPool) and p.token is not None and
                int(p.token) == self.token}

    def check_request_use(self, prepared_model: IPreparedModel, request: Request) -> None:
        """Validation time: raise ValidationError when this request may not use the buffer."""
        if self.freed:
            raise ValidationError(f"buffer {self.token} was freed")
        if id(prepared_model) not in self._model_ids:
            raise ValidationError(f"buffer {self.token} was not allocated for this model")
        mine = self._pool_indexes(request)
        used_as_input = used_as_output = False
        for kind, args in ((INPUT, request.inputs), (OUTPUT, request.outputs)):
            for k, arg in enumerate(args):
                if arg.has_no_value or arg.location.pool_index not in mine:
                    continue
                where = f"buffer {self.token} as {kind} {k}"
                if (id(prepared_model), kind, k) not in self._roles:
                    raise ValidationError(f"{where}: no such role was allocated")
                if arg.location.offset != 0 or arg.location.length != 0:
                    raise ValidationError(f"{where}: offset and length must be 0")
                dims = _valid_dims(arg.dimensions)
                if dims is None:
                    raise ValidationError(f"{where}: invalid dimensions")
                if self.type.is_scalar and dims:
                    raise ValidationError(f"{where}: a scalar takes no dimensions")
                if kind == INPUT:
                    data = self.snapshot()
                    against = self.dims if data is None else list(data.shape)
                    used_as_input = True
                else:
                    against = self.dims
                    if used_as_input or used_as_output:
                        raise ValidationError(f"{where}: a buffer used as an output may not be "
                                              f"used as any other argument of the request")
                    used_as_output = True
                if combine_dims(against, dims) is None:
                    raise ValidationError(f"{where}: dimensions {dims} incompatible with "
                                          f"{against}")

    def read_input(self, info: Any, shape: Sequence[int]) -> np.ndarray:
        """Execution time: the current data; an uninitialized buffer fails the execution."""
        data = self.snapshot()
        if data is None:
            raise RunError(ErrorStatus.GENERAL_FAILURE,
                                 f"buffer {self.token} is uninitialized but used as an input")
        if self.type.is_tensor and shape and combine_dims(shape, data.shape) is None:
            raise RunError(ErrorStatus.GENERAL_FAILURE,
                                 f"buffer {self.token} holds shape {list(data.shape)}, the "
                                 f"request needs {list(shape)}")
        return data

    def can_hold(self, arr: np.ndarray) -> bool:
        """An output must fit the buffer's deduced dimensions; otherwise the execution fails
        (GENERAL_FAILURE: the buffer is not too small, its declared shape is wrong)."""
        if self.type.is_tensor and combine_dims(self.dims, arr.shape) is None:
            raise RunError(ErrorStatus.GENERAL_FAILURE,
                                 f"output shape {list(arr.shape)} does not fit buffer "
                                 f"{self.token} of dimensions {self.dims}")
        return True

    def write_output(self, arr: np.ndarray) -> None:
        self._store(self._freeze(arr))

    def after_execution(self, prepared_model: IPreparedModel, request: Request,
                        status: ErrorStatus) -> None:
        """A failed execution leaves every buffer it used as an output uninitialized."""
        if status == ErrorStatus.NONE:
            return
        mine = self._pool_indexes(request)
        if any(not a.has_no_value and a.location.pool_index in mine for a in request.outputs):
            self._store(None)


class DriverBuffer(IBuffer):
    """The IBuffer handed to the client; its token is released when it is closed or dropped."""

    def __init__(self, core: BufferCore, tokens: TokenRegistry[RequestBuffer]):
        self._core = core
        # Holds no reference to self, so dropping the handle runs it.
        self._release = weakref.finalize(self, _release, tokens, core.token)

    @property
    def token(self) -> int:
        return self._core.token

    def copy_to(self, dst: Any) -> ErrorStatus:
        try:
            return self._core.copy_to(dst)
        except Exception:  # noqa: BLE001 - the driver boundary: never raise
            return ErrorStatus.GENERAL_FAILURE

    def copy_from(self, src: Any, dimensions: Sequence[int] = ()) -> ErrorStatus:
        try:
            return self._core.copy_from(src, dimensions)
        except Exception:  # noqa: BLE001
            self._core._store(None)
            return ErrorStatus.GENERAL_FAILURE

    def close(self) -> None:
        """Free the buffer now: its token no longer names it."""
        self._release()


# ---- allocation ---------------------------------------------------------------------------

class AllocatingDevice(Protocol):
    """The device as allocate sees it."""

    def log(self, message: str) -> None: ...


def _release(tokens: TokenRegistry[RequestBuffer], token: int) -> None:
    core = tokens.release(token)
    if isinstance(core, BufferCore):
        core.freed = True


def _role_operand(pm: Any, role: BufferRole, kind: str) -> Operand:
    main = pm.signature
    indexes = main.input_indexes if kind == INPUT else main.output_indexes
    io = role.io_index
    if isinstance(io, bool) or not isinstance(io, (int, np.integer)) or \
            not 0 <= io < len(indexes):
        raise AllocateError(ErrorStatus.INVALID_ARGUMENT,
                            f"{kind} role: io index {io} out of range")
    return main.operands[indexes[io]]


def check_allocate(device: AllocatingDevice, desc: BufferDesc,
                   prepared_models: Sequence[IPreparedModel], input_roles: Sequence[BufferRole],
                   output_roles: Sequence[BufferRole]
                   ) -> tuple[OperandType, list[int], set[tuple[int, str, int]]]:
    """Every rule of IDevice::allocate; returns (type, deduced dims, roles) or raises
    AllocateError."""

    def bad(msg: str) -> AllocateError:
        return AllocateError(ErrorStatus.INVALID_ARGUMENT, msg)

    if not isinstance(desc, BufferDesc):
        raise bad("desc is not a BufferDesc")
    desc_dims = _valid_dims(desc.dimensions)
    if desc_dims is None:
        raise bad(f"invalid desc dimensions {desc.dimensions!r}")
    models = list(prepared_models)
    ins, outs = list(input_roles), list(output_roles)
    if not models:
        raise bad("no prepared models")
    if not ins and not outs:
        raise bad("no roles")
    for i, pm in enumerate(models):
        if not isinstance(pm, PreparedModelBase) or pm.device is not device:
            raise bad(f"prepared model {i} is not one of this device")
    roles: set[tuple[int, str, int]] = set()
    first: Operand | None = None
    dims = desc_dims
    for kind, role_list in ((INPUT, ins), (OUTPUT, outs)):
        for role in role_list:
            if not isinstance(role, BufferRole):
                raise bad(f"{kind} role is not a BufferRole")
            mi = role.model_index
            if isinstance(mi, bool) or not isinstance(mi, (int, np.integer)) or \
                    not 0 <= mi < len(models):
                raise bad(f"{kind} role: model index {mi} out of range")
            try:
                freq = float(role.frequency)
            except (TypeError, ValueError):
                raise bad(f"{kind} role: invalid frequency") from None
            if not 0.0 < freq <= 1.0:  # also rejects NaN
                raise bad(f"{kind} role: frequency {freq} outside (0, 1]")
            pm = models[mi]
            op = _role_operand(pm, role, kind)
            key = (id(pm), kind, int(role.io_index))
            if key in roles:
                raise bad(f"{kind} role {role.io_index} of model {mi} given twice")
            roles.add(key)
            if first is None:
                first = op
                try:
                    t = operand_type(op.type)  # an extension's, resolved by the analysis
                except ValueError:
                    raise AllocateError(ErrorStatus.GENERAL_FAILURE,
                                        f"operand type {op.type} is not supported") from None
                if t in _UNSUPPORTED_TYPES:
                    raise AllocateError(ErrorStatus.GENERAL_FAILURE,
                                        f"operand type {t.name} is not supported")
                if t.is_scalar and desc_dims:
                    raise bad("a scalar role takes no dimensions")
            elif (op.type != first.type or op.scale != first.scale or
                  op.zero_point != first.zero_point or
                  not _same_extra(op.extra_params, first.extra_params)):
                raise bad(f"{kind} role {role.io_index} of model {mi}: operand differs in "
                          f"type, scale, zero point or extra params")
            merged = combine_dims(dims, op.dimensions)
            if merged is None:
                raise bad(f"{kind} role {role.io_index} of model {mi}: dimensions "
                          f"{list(op.dimensions)} incompatible with {dims}")
            dims = merged
    assert first is not None
    return operand_type(first.type), dims, roles


def allocate(device: AllocatingDevice, tokens: TokenRegistry[RequestBuffer], desc: BufferDesc,
             prepared_models: Sequence[IPreparedModel], input_roles: Sequence[BufferRole],
             output_roles: Sequence[BufferRole], *,
             core: Callable[..., BufferCore] = BufferCore
             ) -> tuple[ErrorStatus, IBuffer | None, int]:
    """IDevice::allocate for ``device``, whose buffers ``tokens`` names: (NONE, buffer, token)
    or (status, None, 0). ``core`` makes the buffer's state (called as :class:`BufferCore`
    is), for a driver whose buffers hold device arrays."""
    try:
        check_allocate_args(desc, prepared_models, input_roles, output_roles)
        t, dims, roles = check_allocate(device, desc, prepared_models, input_roles,
                                        output_roles)
        try:
            token, core = tokens.register(
                lambda token: core(token, t, dims, list(prepared_models), roles))
        except TokenRegistryFull as e:
            raise AllocateError(ErrorStatus.GENERAL_FAILURE, str(e)) from None
    except AllocateError as e:
        device.log(f"allocate rejected: {e}")
        return e.status, None, 0
    except Exception as e:  # noqa: BLE001 - the driver boundary: never raise
        device.log(f"allocate rejected: {type(e).__name__}: {e}")
        return ErrorStatus.INVALID_ARGUMENT, None, 0
    return ErrorStatus.NONE, DriverBuffer(core, tokens), token
