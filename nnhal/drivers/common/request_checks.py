"""Checking a request against a prepared model, the same for every execution path.

Synchronous, asynchronous, burst, reusable and fenced executions all go through
:func:`check_request`: it maps the request's pools once (memory to uint8 arrays, tokens to
driver buffers through the device's :class:`~nnhal.drivers.common.tokens.TokenRegistry`),
validates measure and loop timeout, validates the request against the prepared model's main
inputs and outputs, and asks every driver buffer whether the request may use it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from nnhal.drivers.common.tokens import TokenRegistry
from nnhal.hal.interfaces import IPreparedModel
from nnhal.hal.request_pool import RequestBuffer, RequestPool
from nnhal.hal.types import MeasureTiming, MemoryPool, Request, RequestArgument, Subgraph
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
    validate_request(request, signature, sizes, require_output_dims=fenced)
    for pool in pools:
        if not isinstance(pool, np.ndarray):
            pool.check_request_use(prepared_model, request)
    return pools


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
