"""A driver's burst (canonical IBurst): executions in rapid succession.

**Memory cache.** ``cache_memory(memory)`` maps the memory now and returns a :class:`CacheHold`.
While any reference to the hold lives, the burst keeps the mapping, keyed by the identity of the
memory object, and executions whose pools are all cached skip resolving them. Calling the same
memory again returns the same hold. Dropping the hold (or ``hold.release()``) releases the
entry: the burst's reference to the memory goes at once, the table slot with it (or, when the
burst's table is busy in that very moment, on the burst's next call).

**One execution at a time.** The canonical IBurst allows at most one execution at a time and
must be thread-safe. Upstream's client-side adapter fails a second concurrent call with
GENERAL_FAILURE; this driver instead *serializes*: a concurrent ``execute`` (or ``compute`` of
an execution made by this burst) validates its request at once (a bad request is
INVALID_ARGUMENT immediately), then waits for the running one to finish, or until its own
deadline passes, in which case it returns MISSED_DEADLINE_TRANSIENT. No call ever sees another
call's state half-done.

:meth:`DriverBurst.execute_packet` runs a request carried in a 1.2 FMQ packet
(:mod:`nnhal.hidl.fmq`) and answers with a result packet.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from collections.abc import Mapping

import numpy as np

from nnhal.drivers.common.execution import ReusableExecution
from nnhal.drivers.common.request_checks import request_key
from nnhal.drivers.common.runs import PreparedRunner, Result, run_exclusive
from nnhal.hal.checks import check_execution_args
from nnhal.hal.interfaces import IBurst, IExecution
from nnhal.hal.request_pool import RequestPool
from nnhal.hal.types import (
    NO_TIMING,
    ErrorStatus,
    MeasureTiming,
    MemoryPool,
    Request,
)
from nnhal.hidl.fmq import FmqDecodeError, pack_result, unpack_request
from nnhal.memory import SharedMemory
from nnhal.validation import validate_loop_timeout, validate_measure


class _Entry:
    """One cached memory: the memory itself (which pins its id), its mapping and its hold."""

    __slots__ = ("key", "memory", "array", "size", "hold")

    def __init__(self, memory: SharedMemory, array: np.ndarray):
        self.key = id(memory)
        self.memory: SharedMemory | None = memory
        self.array: np.ndarray | None = array
        self.size = memory.size
        self.hold: weakref.ref[CacheHold] | None = None


class CacheHold:
    """Keeps one memory cached in a burst for as long as this object is referenced."""

    __slots__ = ("_finalizer", "__weakref__")

    def __init__(self, burst: DriverBurst, entry: _Entry):
        # The finalizer refers to the burst weakly: a hold never keeps a burst alive.
        self._finalizer = weakref.finalize(self, _entry_dropped, weakref.ref(burst), entry)

    def release(self) -> None:
        """Stop caching now (idempotent); otherwise it happens when the hold is dropped."""
        self._finalizer()

    @property
    def released(self) -> bool:
        return not self._finalizer.alive


def _entry_dropped(burst_ref: weakref.ref[DriverBurst], entry: _Entry) -> None:
    # May run from the garbage collector inside any code, even a burst method holding the
    # cache lock on this thread: never block here, defer the table update if the lock is busy.
    entry.memory = None
    entry.array = None
    burst = burst_ref()
    if burst is None:
        return
    burst._dropped.append(entry)
    if burst._cache_lock.acquire(blocking=False):
        try:
            burst._purge()
        finally:
            burst._cache_lock.release()


class DriverBurst(IBurst):
    """IBurst of a driver, for one prepared model."""

    def __init__(self, pm: PreparedRunner):
        self._pm = pm
        self._cache: dict[int, _Entry] = {}
        self._cache_lock = threading.Lock()
        self._dropped: deque[_Entry] = deque()
        #: Held by the one execution running on this burst (shared with its executions).
        self.execution_lock = threading.Lock()

    # ---- memory cache -----------------------------------------------------------------------
    def _purge(self) -> None:
        """Remove released entries from the table (caller holds the cache lock)."""
        while self._dropped:
            entry = self._dropped.popleft()
            if self._cache.get(entry.key) is entry:
                del self._cache[entry.key]

    def cache_memory(self, memory: object) -> CacheHold | None:
        """Map ``memory`` and keep it cached while the returned hold lives; None if it is not
        a memory this driver can map (the canonical interface allows no hold)."""
        mem = memory.hidl_memory if isinstance(memory, MemoryPool) else memory
        if not isinstance(mem, SharedMemory):
            return None
        try:
            array = mem.array()
        except Exception:  # noqa: BLE001 - unmappable: nothing to cache
            return None
        if mem.immutable:  # sealed against writing: never a request's memory
            return None
        with self._cache_lock:
            self._purge()
            entry = self._cache.get(id(mem))
            if entry is not None and entry.memory is mem and entry.hold is not None:
                hold = entry.hold()
                if hold is not None:
                    return hold
            entry = _Entry(mem, array)
            hold = CacheHold(self, entry)
            entry.hold = weakref.ref(hold)
            self._cache[entry.key] = entry
            return hold

    @property
    def cached_count(self) -> int:
        """How many memories are cached now."""
        with self._cache_lock:
            self._purge()
            return len(self._cache)

    def _cached(self, pool: object) -> _Entry | None:
        mem = pool.hidl_memory if type(pool) is MemoryPool else pool
        entry = self._cache.get(id(mem))
        if entry is None:
            return None
        # Read the mapping before checking identity: a concurrent release clears the memory
        # first, so a matching memory means the array read just before is still its mapping.
        array = entry.array
        if array is None or entry.memory is not mem or mem.closed:
            return None
        return entry

    def resolve_pools(self, request: Request) -> tuple[list[RequestPool], list[int]]:
        """Mapped pools and sizes: from the cache when every pool is cached, else resolved by
        the prepared model as for any execution."""
        arrays: list[RequestPool] = []
        sizes: list[int] = []
        for pool in request.pools:
            entry = self._cached(pool)
            array = entry.array if entry is not None else None
            if array is None:
                return self._pm.resolve_pools(request)
            arrays.append(array)
            sizes.append(entry.size)  # type: ignore[union-attr]
        return arrays, sizes

    def holds_for(self, request: Request) -> list[CacheHold]:
        """The live holds of the request's cached memories."""
        holds = []
        for pool in request.pools:
            entry = self._cached(pool)
            hold = entry.hold() if entry is not None and entry.hold is not None else None
            if hold is not None:
                holds.append(hold)
        return holds

    # ---- execution ----------------------------------------------------------------------------
    def execute(self, request: Request, measure: MeasureTiming = MeasureTiming.NO,
                deadline: int | None = None, loop_timeout: int | None = None) -> Result:
        """Each request is validated, but a request whose argument values and resolved
        pools equal those of one validated before (kept by the prepared model, see
        :meth:`~nnhal.drivers.common.prepared_model.PreparedModelBase.bind`) is not
        validated again: the validation depends on nothing else (the pools' sizes are those of
        the same mapped memories; measure and loop timeout are still checked)."""
        started = time.monotonic_ns()
        pm = self._pm
        recent = getattr(pm, "recent", None)
        try:
            # The request the prepared model ran last (by any path), with the same memories:
            # checked and bound already, its pools mapped to the arrays a lookup would give.
            found = recent(request, measure, deadline, loop_timeout) if recent else None
        except Exception:  # noqa: BLE001 - checked the usual way below
            found = None
        if found is not None:
            if deadline is not None:
                if started > deadline:
                    return ErrorStatus.MISSED_DEADLINE_PERSISTENT, [], NO_TIMING
            else:
                lock = self.execution_lock
                if lock.acquire(blocking=False):  # no one running: no deadline to wait to
                    try:
                        return pm.run(request, found.pools, measure,  # type: ignore[call-arg]
                                      None, loop_timeout, started, found.bound)
                    finally:
                        lock.release()
            return run_exclusive(self.execution_lock, pm, request, found.pools, measure,
                                 deadline, loop_timeout, started, found.bound)
        try:
            check_execution_args(request, measure, deadline, loop_timeout)
            pools, sizes = self.resolve_pools(request)
            key = request_key(request)
            bound = getattr(pm, "bound", None)
            prepared = bound(key, pools) if bound is not None else None
            if prepared is not None:
                validate_measure(measure)
                validate_loop_timeout(loop_timeout)
            else:
                pools = pm.check_request(request, measure, loop_timeout,
                                         resolve=lambda _: (pools, sizes))
                bind = getattr(pm, "bind", None)
                prepared = bind(request, pools, key) if bind is not None else None
        except Exception as e:  # noqa: BLE001 - every bad argument is INVALID_ARGUMENT
            pm.device.log(f"invalid burst request: {e}")
            return ErrorStatus.INVALID_ARGUMENT, [], NO_TIMING
        if deadline is not None and started > deadline:
            return ErrorStatus.MISSED_DEADLINE_PERSISTENT, [], NO_TIMING
        return run_exclusive(self.execution_lock, pm, request, pools,
                             MeasureTiming(measure), deadline, loop_timeout, started, prepared)

    def create_reusable_execution(self, request: Request,
                                  measure: MeasureTiming = MeasureTiming.NO,
                                  loop_timeout: int | None = None
                                  ) -> tuple[ErrorStatus, IExecution | None]:
        return ReusableExecution.create(self._pm, request, measure, loop_timeout, burst=self)

    def execute_packet(self, packet: bytes, memories: Mapping[int, object]) -> bytes:
        """Run the request of a 1.2 FMQ request packet; ``memories`` maps each pool
        identifier to its memory. Returns the result packet; a malformed packet or an unknown
        identifier gives an INVALID_ARGUMENT result. Never raises."""
        try:
            request, slots, measure = unpack_request(packet)
            request.pools = [memories[slot] for slot in slots]
        except (FmqDecodeError, LookupError, TypeError) as e:
            self._pm.device.log(f"invalid burst packet: {e}")
            return pack_result(ErrorStatus.INVALID_ARGUMENT, [], NO_TIMING)
        status, shapes, timing = self.execute(request, measure)
        try:
            return pack_result(status, shapes, timing)
        except ValueError:
            return pack_result(ErrorStatus.GENERAL_FAILURE, [], NO_TIMING)
