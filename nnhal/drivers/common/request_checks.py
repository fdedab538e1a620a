"""Checking a request against a prepared model, the same for every execution path.

Synchronous, asynchronous, burst, reusable and fenced executions all go through
:func:`check_request`: it maps the request's pools once (memory to uint8 arrays, tokens to
driver buffers through the device's :class:`~nnhal.drivers.common.tokens.TokenRegistry`),
validates measure and loop timeout, validates the request against the prepared model's main
inputs and outputs, and asks every driver buffer whether the request may use it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from nnhal.drivers.common.tokens import TokenRegistry
from nnhal.hal.interfaces import IPreparedModel
from nnhal.hal.request_pool import RequestBuffer, RequestPool
from nnhal.hal.types import (
    DataLocation,
    MeasureTiming,
    MemoryPool,
    Request,
    RequestArgument,
    Subgraph,
    operand_type,
)
from nnhal.memory import MemoryError_, SharedMemory
from nnhal.validation import (
    BUFFER_POOL,
    ValidationError,
    validate_loop_timeout,
    validate_measure,
    validate_request,
)

#: Maps a request's pools: (pools, sizes), sizes as validate_request takes them.
Resolver = Callable[[Request], tuple[list[RequestPool], list[int]]]


def resolve_pools(request: Request, buffers: TokenRegistry[RequestBuffer]
                  ) -> tuple[list[RequestPool], list[int]]:
    """Map each request pool once: uint8 arrays for memory, buffers for tokens."""
    arrays: list[RequestPool] = []
    sizes: list[int] = []
    for i, pool in enumerate(request.pools):
        mem = pool.hidl_memory if isinstance(pool, MemoryPool) else pool
        token = pool.token if isinstance(pool, MemoryPool) else None
        if token is not None:
            buf = buffers.lookup(token)
            if buf is None:
                raise ValidationError(f"request pool {i}: unknown buffer token {token}")
            arrays.append(buf)
            sizes.append(BUFFER_POOL)
            continue
        if not isinstance(mem, SharedMemory):
            raise ValidationError(f"request pool {i}: not a shared memory or token")
        try:
            arrays.append(mem.mapped())  # its size is checked when the run starts
        except MemoryError_ as e:
            raise ValidationError(f"request pool {i}: {e}") from e
        if mem.immutable:  # mapped read-only: a request's memory is written (outputs)
            raise ValidationError(f"request pool {i}: the memory is sealed against writing")
        sizes.append(mem.size)
    return arrays, sizes


def check_request(prepared_model: IPreparedModel, signature: Subgraph, resolve: Resolver,
                  request: Request, measure: MeasureTiming, loop_timeout: int | None, *,
                  fenced: bool = False) -> list[RequestPool]:
    """Validate a request for ``prepared_model`` (whose main inputs and outputs are
    ``signature``); returns the pools ``resolve`` mapped. A fenced execution needs fully
    specified outputs. Raises ValidationError (or anything a malformed request makes
    validation raise)."""
    if not isinstance(request, Request):
        raise ValidationError("not a Request")
    validate_measure(measure)
    validate_loop_timeout(loop_timeout)
    pools, sizes = resolve(request)
    if fenced or not _plainly_valid(request, _spec_of(signature), sizes):
        validate_request(request, signature, sizes, require_output_dims=fenced)
    for pool in pools:
        if not isinstance(pool, np.ndarray):
            pool.check_request_use(prepared_model, request)
    return pools


#: Per signature (by identity, the signature kept referenced): each input's dimensions,
#: whether it is a tensor and the bytes it needs (-1: not fully known); each output's
#: dimensions.
_Spec = tuple[tuple[tuple[list[int], int], ...], tuple[list[int], ...]]
_SPECS: dict[int, tuple[Subgraph, _Spec]] = {}
_SPECS_CAP = 64


def _spec_of(signature: Subgraph) -> _Spec:
    found = _SPECS.get(id(signature))
    if found is not None and found[0] is signature:
        return found[1]
    ins = []
    for idx in signature.input_indexes:
        op = signature.operands[idx]
        t = operand_type(op.type)
        dims = [int(d) for d in op.dimensions]
        known = t.is_scalar or (t.is_tensor and bool(dims) and 0 not in dims)
        ins.append((dims, t.byte_size * math.prod(dims) if known and not t.is_scalar
                    else t.byte_size if known else -1))
    outs = tuple([int(d) for d in signature.operands[idx].dimensions]
                 for idx in signature.output_indexes)
    spec = (tuple(ins), outs)
    while len(_SPECS) >= _SPECS_CAP:
        try:
            del _SPECS[next(iter(_SPECS))]
        except (StopIteration, KeyError, RuntimeError):
            break
    _SPECS[id(signature)] = (signature, spec)
    return spec


def _plainly_valid(request: Request, spec: _Spec, sizes: list[int]) -> bool:
    """The common case of :func:`validate_request` (not fenced), checked quickly: every
    argument present, with no dimensions or exactly the model's, in a shared-memory pool,
    inside it, and every input of known size with the bytes it needs. True only if
    validate_request would accept the request; False means "validate it fully"."""
    ins, outs = spec
    args = request.inputs
    if len(args) != len(ins) or len(request.outputs) != len(outs):
        return False
    npools = len(sizes)
    for arg, (dims, need) in zip(args, ins):
        if type(arg) is not RequestArgument or arg.has_no_value is not False or need < 0:
            return False
        d = arg.dimensions
        if d and d != dims:
            return False
        loc = arg.location
        p, off, n = loc.pool_index, loc.offset, loc.length
        if not 0 <= p < npools or off < 0 or n < need or off + n > sizes[p]:
            return False  # sizes[p] is -1 for a driver buffer: refused here too
    for arg, dims in zip(request.outputs, outs):
        if type(arg) is not RequestArgument or arg.has_no_value is not False:
            return False
        d = arg.dimensions
        if d and d != dims:
            return False
        loc = arg.location
        p, off, n = loc.pool_index, loc.offset, loc.length
        if not 0 <= p < npools or off < 0 or n < 0 or off + n > sizes[p]:
            return False
    return True


def snapshot_request(request: Request) -> Request:
    """A copy of the request's structure (arguments and pool list; memories are shared)."""
    if not isinstance(request, Request):
        raise ValidationError("not a Request")

    def arg(a: object) -> object:
        if not isinstance(a, RequestArgument):
            return a  # validation rejects it
        return RequestArgument(a.has_no_value, a.location, list(a.dimensions))

    return Request([arg(a) for a in request.inputs], [arg(a) for a in request.outputs],
                   list(request.pools))


def request_key(request: Request) -> tuple[object, ...]:
    """The values of a request's arguments (hasNoValue, location, dimensions) as a hashable
    tuple: two requests with equal keys and the same pools validate alike. Call it only on a
    request whose fields have passed :func:`~nnhal.hal.checks.check_execution_args`."""
    return (tuple((a.has_no_value, a.location.pool_index, a.location.offset, a.location.length,
                   tuple(a.dimensions)) for a in request.inputs),
            tuple((a.has_no_value, a.location.pool_index, a.location.offset, a.location.length,
                   tuple(a.dimensions)) for a in request.outputs))


class BoundRequests:
    """A few requests recently bound for running (whatever the caller binds), found again by
    the values of their arguments and the identity of their resolved pools.

    An entry keeps its resolved pools (the mapped arrays) referenced, so the identity compared
    is never that of a recycled object; at most ``cap`` entries live (the oldest go first).
    Safe from several threads: an entry is never changed once stored.
    """

    def __init__(self, cap: int = 4):
        self._entries: dict[tuple[object, ...], tuple[list[RequestPool], object]] = {}
        self._cap = cap

    def get(self, key: tuple[object, ...], pools: list[RequestPool]) -> object | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        held, bound = entry
        if len(held) != len(pools):
            return None
        for a, b in zip(held, pools):
            if a is not b:
                return None
        return bound

    def put(self, key: tuple[object, ...], pools: list[RequestPool], bound: object) -> None:
        entries = self._entries
        while len(entries) >= self._cap:
            try:
                del entries[next(iter(entries))]
            except (StopIteration, KeyError, RuntimeError):  # another thread got there first
                break
        entries[key] = (list(pools), bound)


class Recent:
    """A request validated and bound for one prepared model, kept to recognise the next
    identical request cheaply (:func:`same_request`): its snapshot, the memories of its pools
    (referenced here, so their identity is never that of a recycled object), their mapped
    arrays and the bound request (whatever the prepared model binds). Never changed once
    made: safe to share between threads."""

    __slots__ = ("request", "memories", "pools", "bound")

    def __init__(self, request: Request, memories: list[SharedMemory],
                 pools: list[RequestPool], bound: object):
        self.request = request
        self.memories = memories
        self.pools = pools
        self.bound = bound

    @staticmethod
    def of(snapshot: Request, pools: list[RequestPool], bound: object) -> Recent | None:
        """The entry for a validated ``snapshot`` whose every pool is a shared memory mapped
        to ``pools``; None when one is not (a token, say)."""
        mems = []
        for pool, arr in zip(snapshot.pools, pools):
            mem = pool.hidl_memory if type(pool) is MemoryPool else pool
            if type(pool) is MemoryPool and pool.token is not None:
                return None
            if type(mem) is not SharedMemory or not isinstance(arr, np.ndarray):
                return None
            mems.append(mem)
        return Recent(snapshot, mems, list(pools), bound)


def same_request(request: object, recent: Recent, _R: type = Request,
                 _RA: type = RequestArgument, _DL: type = DataLocation, _MP: type = MemoryPool,
                 _type: type = type, _int: type = int, _list: type = list,
                 _len: object = len) -> bool:
    """Whether ``request`` has exactly the field types the fast check of
    :func:`~nnhal.hal.checks.check_execution_args` accepts and the very argument values and
    pool memories (none of them closed) of ``recent``'s validated request: then it is valid for
    the same prepared model (validation depends on nothing else; the memories' sizes never
    change) and maps to the same arrays. False means "check it the usual way". One flat
    function, builtins bound as defaults: the type checks and the comparison in one pass."""
    if _type(request) is not _R:
        return False
    snap = recent.request
    ins = request.inputs  # type: ignore[attr-defined]
    outs = request.outputs  # type: ignore[attr-defined]
    pools = request.pools  # type: ignore[attr-defined]
    if _type(ins) is not _list or _type(outs) is not _list or _type(pools) is not _list:
        return False
    mems = recent.memories
    if _len(ins) != _len(snap.inputs) or _len(outs) != _len(snap.outputs) or \
            _len(pools) != _len(mems):  # type: ignore[operator]
        return False
    for args, known in ((ins, snap.inputs), (outs, snap.outputs)):
        for a, s in zip(args, known):
            if _type(a) is not _RA:
                return False
            # ``is``: the snapshot's flags are bools, so anything else (0, None) differs.
            if a.has_no_value is not s.has_no_value:
                return False
            loc = a.location
            k = s.location
            # The snapshot shares the request's (frozen) locations: the very object is the
            # very values, already checked.
            if loc is not k:
                if _type(loc) is not _DL:
                    return False
                p = loc.pool_index
                o = loc.offset
                n = loc.length
                if not _type(p) is _type(o) is _type(n) is _int:
                    return False
                if p != k.pool_index or o != k.offset or n != k.length:
                    return False
            dims = a.dimensions
            if _type(dims) is not _list:
                return False
            if dims:
                for d in dims:
                    if _type(d) is not _int:
                        return False
                if dims != s.dimensions:
                    return False
            elif s.dimensions:
                return False
    for pool, mem in zip(pools, mems):
        if _type(pool) is _MP:
            if pool.hidl_memory is not mem or pool.token is not None:
                return False
        elif pool is not mem:
            return False
        if mem._closed:
            return False
    return True
