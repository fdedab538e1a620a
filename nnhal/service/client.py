"""``RemoteDevice``: an IDevice whose every call crosses a Unix socket to ``nnhal serve``.

One connection per device: calls are sent under one lock and wait for their reply. Whoever
waits reads: a caller whose reply has not come and who finds nobody reading reads the socket
itself (decoding every message in order, so fences and objects a reply names exist before the
next message is read, and handing other callers' replies over by call id), and passes the
reading on when its own reply came. A synchronous call thus costs no thread hand-off. A
background thread reads only while callbacks or fences are outstanding and no caller reads.
Callbacks come back as NOTIFY messages and are called exactly once, on a callback thread (a
callback may itself call the device).

**Death.** When the socket ends or breaks, every pending call returns DEVICE_UNAVAILABLE at
once, every pending callback is notified with it, every fence the service would complete goes
to error, and later calls fail the same way without touching the socket. A service that ends
the connection itself says why first (ERROR with call id 0): then the status is the one it
gave, RESOURCE_EXHAUSTED_TRANSIENT when it is busy (all its client slots taken: open the
device again later), and a warning says so.

**Bounds.** Nothing the client waits for waits for ever. Connecting and every quick call
(queries, launches, allocation, copies, burst set-up) are bounded by ``timeout_s``
(``NNHAL_REMOTE_TIMEOUT_S``, 30 s); what runs the driver (executions on the socket or the
rings, getSupportedOperations, a prepare's or an execution's callback, a returned fence) by
``long_timeout_s`` (``NNHAL_REMOTE_LONG_TIMEOUT_S``, 300 s), or, when the call has a
deadline, by the time left to it plus ``timeout_s``. A service that lets a bound pass is
taken as hung: the call returns MISSED_DEADLINE_TRANSIENT (it had a deadline) or
DEVICE_UNAVAILABLE, a warning names the call and the bound, and the connection is closed
as on death (so later calls fail at once instead of each waiting out its bound). Sends are
bounded by ``timeout_s`` too (a service that stops reading). A reply that does not decode,
or results that cannot belong to the request (counts, shapes past its buffers), is
GENERAL_FAILURE; an event that does not decode breaks the connection: never an exception.

**Memories** are sent with their descriptor the first time a connection sees them, then by
identifier; when the client drops one, the service is told to forget it (FORGET, sent with
the next message). Objects the service holds for this client (prepared models, bursts,
executions, buffers) are released the same way when their proxies are dropped (RELEASE).
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import select
import socket
import struct
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from nnhal.core.version import FeatureLevel, UnknownVersion
from nnhal.drivers.common.request_checks import Recent, same_request, snapshot_request
from nnhal.hal.fence import FenceState, SyncFence
from nnhal.hal.interfaces import (
    IBuffer,
    IBurst,
    IDevice,
    IExecution,
    IFencedExecutionCallback,
    IPreparedModel,
    IPreparedModelCallback,
)
from nnhal.hal.types import (
    NO_TIMING,
    BufferDesc,
    BufferRole,
    Capabilities,
    DeviceType,
    ErrorStatus,
    ExecutionConfig,
    ExecutionPreference,
    Extension,
    MeasureTiming,
    MemoryPool,
    Model,
    OutputShape,
    PrepareModelConfig,
    Priority,
    Request,
    Timing,
)
from nnhal.hidl import IExecutionCallback, IHidlPreparedModel, fmq
from nnhal.memory import SharedMemory
from nnhal.service import wire as w
from nnhal.service.ring import ChannelPair, PacketTooLarge, RingError, RingTimeout
from nnhal.service.transport import Closed, Looker, Receiver, TimedOut, send_message
from nnhal.service.wire import Kind, Reader, WireError, Writer

log = logging.getLogger("nnhal.service")

UNAVAILABLE = ErrorStatus.DEVICE_UNAVAILABLE
TIMEOUT_ENV, LONG_TIMEOUT_ENV = "NNHAL_REMOTE_TIMEOUT_S", "NNHAL_REMOTE_LONG_TIMEOUT_S"
#: Defaults of the two bounds (see the module docstring): a quick call answers in
#: microseconds, so 30 s is only ever passed by a service that hangs; 300 s covers any
#: execution or analysis this project's drivers run (the loop timeout is at most 15 s).
TIMEOUT_S, LONG_TIMEOUT_S = 30.0, 300.0


def _bound_of(given: float | None, env: str, default: float) -> float:
    """A bound in seconds: given, else from the environment, else the default; a value that
    is not a positive number is refused (ValueError naming it)."""
    if given is None:
        raw = os.environ.get(env)
        if not raw:
            return default
        try:
            given = float(raw)
        except ValueError:
            raise ValueError(f"{env}={raw!r}: not a number of seconds") from None
    if isinstance(given, bool) or not isinstance(given, (int, float)) or \
            not 0 < given < 1e9 or given != given:
        raise ValueError(f"timeout {given!r}: not a positive number of seconds")
    return float(given)
#: A repeated synchronous execution looks for its reply (poll, yield) from this long before
#: the shortest of its recent round trips until this long after the longest, sleeping until
#: the look begins, so that the reply finds the caller awake (see Connection._await_reply).
#: The sleep ends by a timer, and waking an idle virtual core for it takes up to about 100 us
#: itself: 150 us before often found the caller still waking.
REPLY_LOOK_S = 300e-6
#: Round trips of the repeated message remembered for that (the window follows their spread),
#: and the widest spread looked over, as a fraction of the shortest: past it, the look ends
#: there and a later reply is blocked on (an outlier must not make every call spin).
REPLY_TRIPS, REPLY_SPREAD = 8, 0.25
#: Messages whose round trips are remembered (Connection._trips).
REPLY_MESSAGES = 4
#: The longest look for a reply, however wide the spread of the round trips (a long
#: execution's spread would otherwise be spun through: 50 ms of a 200 ms one).
REPLY_LOOK_MAX_S = 2e-3
_FD_SETSIZE = 1024  # select() takes no descriptor past it
_REPLY = Kind.REPLY
_NO_POOLS: list[Any] = []  # a Recent's mapped pools, which same_request does not read
_TIMING_FROM = w.TIMING.unpack_from
_TIMING_SIZE = w.TIMING.size
_HEADER_PACK = w.HEADER.pack
#: Each kind's name, for the bounds every call makes (an enum's ``name`` is a Python-level
#: property in 3.11: a call more on every execution).
_NAMES = {k: k.name for k in Kind}
Decode = Callable[[Reader], Any]
Fail = Callable[[ErrorStatus], Any]


class _Bound:
    """When a wait ends (``time.monotonic``), what it waits for, and the status then."""

    __slots__ = ("end", "what", "status", "seconds")

    def __init__(self, seconds: float, what: str, status: ErrorStatus = UNAVAILABLE):
        self.seconds, self.what, self.status = seconds, what, status
        self.end = time.monotonic() + seconds


class _Slot:
    __slots__ = ("decode", "fail", "done", "result", "new_mems", "bound")

    def __init__(self, decode: Decode, fail: Fail, bound: _Bound):
        self.decode, self.fail = decode, fail
        self.done = False
        self.result: Any = None
        self.new_mems: list[SharedMemory] = []
        self.bound = bound


class _LastRequest:
    """The last request a sender encoded and what it encoded to, found again when the next
    request is the same (same argument values and pool memories: ``same_request``, the
    drivers' own recent-request check), so a repeated request is not encoded again.

    Why here too: this side must not trust its caller's request object to be unchanged (it
    may be edited in place between calls), and encoding is the client's work per call; the
    service decodes once per distinct bytes (ClientSession.decoded) and the driver validates
    once per distinct request (PreparedModelBase._recent), each for its own side.

    ``weak``: the memories are not kept alive by being remembered (a connection must not
    hold the service's mappings of memories its client dropped); a burst, which caches its
    memories anyway, keeps them."""

    __slots__ = ("weak", "_entry")

    def __init__(self, weak: bool):
        self.weak = weak
        self._entry: tuple[Request, list[Any], Any, Any] | None = None

    def get(self, request: Any, extra: Any = None) -> Any:
        """The value remembered for ``request`` (and ``extra``, compared by identity), or
        None."""
        entry = self._entry
        if entry is None or entry[3] is not extra:
            return None
        snap, mems, value, _ = entry
        if self.weak:
            refs, mems = mems, []
            for ref in refs:  # (a loop, not a comprehension: no call more in 3.11)
                mem = ref()
                if mem is None:
                    return None
                mems.append(mem)
        return value if same_request(request, Recent(snap, mems, _NO_POOLS, None)) else None

    def put(self, request: Any, value: Any, extra: Any = None) -> None:
        """Remember ``value`` for a request whose every pool is a shared memory (else
        forget)."""
        self._entry = None
        mems = []
        for pool in request.pools:
            mem = pool.hidl_memory if type(pool) is MemoryPool and pool.token is None \
                else pool
            if type(mem) is not SharedMemory:
                return  # a token or an empty pool: not remembered
            mems.append(weakref.ref(mem) if self.weak else mem)
        snap = snapshot_request(request)
        self._entry = (Request(snap.inputs, snap.outputs, []), mems, value, extra)

    def remembered(self) -> bool:
        return self._entry is not None

    def clear(self) -> None:
        self._entry = None


class _Encoded:
    """What a connection remembers of the request it encoded last (_LastRequest's value):
    its bytes, the last execution message made from them (``message``: its arguments and its
    body, one tuple replaced whole, read without the lock by exec_again), and the decoded
    reply found to fit the request (``fitted``: the identity of a _RepeatedResults result),
    so a repeated reply is not checked against the request again."""

    __slots__ = ("request", "message", "fitted")

    def __init__(self, request: bytes):
        self.request = request
        self.message: tuple[tuple[Any, ...], bytes] | None = None
        self.fitted: Any = None


def _notice(head: bytes) -> ErrorStatus | None:
    """The status of a service's notice that it ends the connection (ERROR with call id 0)
    at the head of ``head``, else None."""
    try:
        kind, call_id, body_len, _ = w.unpack_header(head[:w.HEADER_SIZE])
        if kind != Kind.ERROR or call_id != 0 or len(head) < w.HEADER_SIZE + 4:
            return None
        return w.get_status(Reader(memoryview(head)[w.HEADER_SIZE:]))
    except Exception:  # noqa: BLE001 - not a notice
        return None


class Connection:
    """The socket to one service, its reader thread and the tables of a connection."""

    def __init__(self, path: str, timeout_s: float = TIMEOUT_S,
                 long_timeout_s: float = LONG_TIMEOUT_S):
        self.path = path
        self.timeout_s, self.long_timeout_s = timeout_s, long_timeout_s
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout_s)
        end = time.monotonic() + timeout_s
        while True:
            try:
                self.sock.connect(path)
                break
            except BlockingIOError:
                # The service's backlog is full (it is busy accepting): a Unix socket says so
                # at once instead of waiting; wait for room, within the timeout.
                if time.monotonic() >= end:
                    self.sock.close()
                    raise TimeoutError(f"connecting: the service's listen backlog stayed "
                                       f"full for {timeout_s:g} s") from None
                time.sleep(0.01)
            except OSError:
                self.sock.close()
                raise
        self.sock.settimeout(None)
        # A service that stops reading must not block a sender for ever.
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO,
                             struct.pack("ll", int(timeout_s), int(timeout_s % 1 * 1e6)))
        self.receiver = Receiver(self.sock, tick=min(0.25, max(0.001, timeout_s / 8)))
        self.lock = threading.Lock()
        self.dead = False
        #: The status calls get once dead: DEVICE_UNAVAILABLE, or the one the service gave
        #: when it ended the connection itself (ERROR with call id 0; busy: TRANSIENT).
        self.death = UNAVAILABLE
        self.ids = itertools.count(1)
        self.pending: dict[int, _Slot] = {}
        self.callbacks: dict[int, tuple[str, Any]] = {}
        self.fences: dict[int, tuple[SyncFence, RemoteFencedCallback]] = {}
        self.fence_ids = itertools.count(1)
        #: The bounds of the callbacks and returned fences outstanding: ("cb", call id) or
        #: ("fence", fence id).
        self.bounds: dict[tuple[str, int], _Bound] = {}
        self.mem_ids: weakref.WeakKeyDictionary[SharedMemory, tuple[int, Any]] = \
            weakref.WeakKeyDictionary()
        self.next_mem = itertools.count(1)
        self._encoding_new: list[SharedMemory] = []
        #: The last request an execution message was encoded from, with its bytes and the
        #: last such message (see put_exec): one recognition of "the request of last time"
        #: per call on this side.
        self._last_request = _LastRequest(weak=True)
        self.shapes_replies = _RepeatedResults(w.TIMING.size)
        self.sent_again = 0  # executions sent the short way (exec_again)
        #: The last round trips of the repeated message, seconds (none: not known).
        self._again_took: deque[float] = deque(maxlen=REPLY_TRIPS)
        #: The round trips of the last few messages sent again, by their bytes: a client that
        #: alternates between requests (two models, or one execution among other calls)
        #: finds its message's round trips again when the message comes back.
        self._trips: dict[bytes, deque[float]] = {}
        self.looker = Looker()  # used by the thread that reads (_await_reply)
        self.looked = 0  # ... that looked for their reply (_await_reply)
        self.found = 0  # ... whose reply came while looking
        self._look = select.poll()
        self._look.register(self.sock, select.POLLIN)
        self.events: deque[tuple[Kind, Any]] = deque()
        self.notifier = ThreadPoolExecutor(1, thread_name_prefix="nnhal-remote-callback")
        # The reading role: the thread that reads now (None: nobody), under ``cond``; callers
        # wait on ``cond`` for their reply or the role, the background thread on ``idle``.
        # ``role``: the lock of both (taken bare where nobody is waited for: Condition's own
        # enter and exit are two Python calls more on every execution).
        self.role = role = threading.Lock()
        self.cond = threading.Condition(role)
        self.idle = threading.Condition(role)
        self.reading: int | None = None
        self.waiters = 0  # callers in cond.wait: nobody to notify when 0
        self.background = threading.Thread(target=self._background,
                                           name=f"nnhal-remote {path}", daemon=True)
        self.background.start()

    # ---- bounds ------------------------------------------------------------------------
    def quick(self, kind: Kind) -> _Bound:
        return _Bound(self.timeout_s, _NAMES[kind])

    def long(self, kind: Kind, deadline: Any = None) -> _Bound:
        """The bound of a call that runs the driver: the time left to its deadline plus the
        quick bound, else the long bound."""
        if type(deadline) is int:
            left = deadline / 1e9 - time.monotonic()
            return _Bound(max(left, 0.0) + self.timeout_s, _NAMES[kind],
                          ErrorStatus.MISSED_DEADLINE_TRANSIENT)
        return _Bound(self.long_timeout_s, _NAMES[kind])

    def _next_end(self, slot: _Slot | None) -> float | None:
        """The earliest end a reader must wake at: its own call's, the callbacks' and the
        fences'."""
        if not self.bounds:  # the common case: a call alone
            return None if slot is None else slot.bound.end
        ends = [b.end for b in list(self.bounds.values())]
        if slot is not None:
            ends.append(slot.bound.end)
        return min(ends) if ends else None

    def _expire(self) -> None:
        """A bound passed: the service is taken as hung. What passed its bound gets its own
        status, everything else DEVICE_UNAVAILABLE as on death."""
        now = time.monotonic()
        late: list[tuple[Any, _Bound]] = []
        with self.lock:
            if self.dead:
                return
            for call_id, slot in list(self.pending.items()):
                if slot.bound.end <= now:
                    late.append((self.pending.pop(call_id), slot.bound))
            for key, b in list(self.bounds.items()):
                if b.end <= now:
                    late.append((key, b))
        if not late:
            return
        first = late[0][1]
        log.warning("%s: %s not answered within %.3g s: the service is taken as hung and "
                    "the connection closed", self.path, first.what, first.seconds)
        for item, b in late:
            if isinstance(item, _Slot):
                self._finish(item, item.fail(b.status))
            elif item[0] == "cb":
                cb = self.callbacks.pop(item[1], None)
                self.bounds.pop(item, None)
                if cb is not None:
                    self._notify(cb, b.status, None)
            else:
                self.bounds.pop(item, None)
                entry = self.fences.pop(item[1], None)
                if entry is not None:
                    fence, fcb = entry
                    fcb._finish((b.status, NO_TIMING, NO_TIMING))
                    fence.set_error()
        self._die()

    # ---- memories and releases ------------------------------------------------------------
    def _memory_ref(self, mem: SharedMemory) -> tuple[int, bool]:
        known = self.mem_ids.get(mem)
        if known is not None:
            return known[0], False
        ident = next(self.next_mem)
        fin = weakref.finalize(mem, self._queue_event, Kind.FORGET, ident)
        fin.atexit = False
        self.mem_ids[mem] = (ident, fin)
        self._encoding_new.append(mem)
        return ident, True

    def put_exec(self, wr: Writer, handle: int, request: Any, measure: Any, deadline: Any,
                 loop: Any) -> None:
        """An execution's arguments (with the lock held). The request's bytes are remembered
        when it defines no memory (every memory known to the service), with the last whole
        body made from them (an _Encoded): the same request (same argument values, same
        memories) reuses its bytes, and with the same handle and the same arguments, of the
        same types, the whole body."""
        key = (handle, type(measure), measure, type(deadline), deadline, type(loop), loop)
        known = self._last_request.get(request)
        message = known.message if known is not None else None
        if message is not None and message[0] == key:
            wr.buf += message[1]
            return
        start = len(wr.buf)
        wr.u32(handle)
        if known is not None:
            wr.buf += known.request
        else:
            at, new = len(wr.buf), len(self._encoding_new)
            w.put_request(wr, request)
            if len(self._encoding_new) == new:
                known = _Encoded(bytes(wr.buf[at:]))
                self._last_request.put(request, known)
            else:  # defines a memory: the next names it by identifier
                self._last_request.clear()
        wr.i32(measure, "measure")
        wr.opt_i64(deadline, "deadline")
        wr.opt_i64(loop, "loopTimeout")
        if known is not None and self._last_request.remembered():
            body = bytes(wr.buf[start:])
            known.message = (key, body)
            trips = self._trips.pop(body, None)  # (re-inserted: the newest last)
            if trips is None:
                trips = deque(maxlen=REPLY_TRIPS)
                if len(self._trips) >= REPLY_MESSAGES:
                    del self._trips[next(iter(self._trips))]
            self._trips[body] = trips
            self._again_took = trips
        else:  # a message not sent again: its round trip is not looked for
            self._again_took = deque(maxlen=REPLY_TRIPS)

    def _unlearn(self, mems: list[SharedMemory]) -> None:
        self._last_request.clear()
        for mem in mems:
            entry = self.mem_ids.pop(mem, None)
            if entry is not None:
                entry[1].detach()

    def _queue_event(self, kind: Kind, payload: Any) -> None:
        """From finalizers (any thread, maybe one holding the lock): queue, flush if free."""
        if self.dead:
            return
        self.events.append((kind, payload))
        if self.lock.acquire(blocking=False):
            try:
                self._flush_events()
            finally:
                self.lock.release()

    def _flush_events(self) -> None:
        """Send the queued releases (with the lock held)."""
        if not self.events or self.dead:
            return
        releases, forgets, uncache = [], [], []
        while self.events:
            try:
                kind, payload = self.events.popleft()
            except IndexError:
                break
            (releases if kind == Kind.RELEASE else forgets if kind == Kind.FORGET
             else uncache).append(payload)
        try:
            if releases:
                wr = Writer()
                wr.u32s(releases, "handles")
                send_message(self.sock, Kind.RELEASE, 0, wr.buf)
            if forgets:
                wr = Writer()
                wr.u32(len(forgets))
                for ident in forgets:
                    wr.u64(ident)
                send_message(self.sock, Kind.FORGET, 0, wr.buf)
            for burst, ident in uncache:
                wr = Writer()
                wr.u32(burst)
                wr.u64(ident)
                send_message(self.sock, Kind.BURST_UNCACHE, 0, wr.buf)
        except Closed:
            self._broken_send()

    def release(self, handle: int) -> None:
        self._queue_event(Kind.RELEASE, handle)

    # ---- calls ---------------------------------------------------------------------------
    def _broken_send(self) -> None:
        """A send failed (the peer is gone, or stopped reading for ``timeout_s``): the stream
        may hold part of a message, so the connection ends (with the lock held: the socket is
        shut down, and the reader sees the end and fails everything)."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def call(self, kind: Kind, encode: Callable[[Writer], None], decode: Decode, fail: Fail,
             callback: tuple[str, Any] | None = None,
             after_send: Callable[[], None] | None = None, bound: _Bound | None = None,
             callback_bound: _Bound | None = None) -> Any:
        """Send one call and wait for its reply (decoded by ``decode`` on the reader thread)
        until ``bound`` (default: the quick bound); ``fail(status)`` is the result when the
        call cannot be made, the service dies or lets the bound pass. ``callback_bound``:
        how long the callback may wait for its notification."""
        slot = _Slot(decode, fail, bound or self.quick(kind))
        with self.lock:
            if self.dead:
                return self._unsent(callback, fail, self.death)
            call_id = next(self.ids)
            wr = Writer(self._memory_ref)
            self._encoding_new = []
            try:
                encode(wr)
                if len(wr.buf) > w.MAX_BODY:
                    raise WireError(f"message of {len(wr.buf)} bytes exceeds {w.MAX_BODY}")
            except WireError as e:
                log.info("%s: %s not sent: %s", self.path, kind.name, e)
                self._unlearn(self._encoding_new)
                return self._unsent(callback, fail, ErrorStatus.INVALID_ARGUMENT)
            slot.new_mems = self._encoding_new
            self._encoding_new = []
            self.pending[call_id] = slot
            if callback is not None:  # its bound first: a reader that sees it reads to it
                self.bounds[("cb", call_id)] = callback_bound or self.long(kind)
                self.callbacks[call_id] = callback
            self._flush_events()
            try:
                send_message(self.sock, kind, call_id, wr.buf, wr.fds)
            except Closed:
                self._broken_send()  # the reader sees the end and fails everything pending
        if after_send is not None:
            after_send()
        return self._wait(slot)

    def exec_again(self, kind: Kind, handle: int, request: Any, measure: Any, deadline: Any,
                   loop: Any) -> tuple[ErrorStatus, list[OutputShape], Timing] | None:
        """The common case of a synchronous execution in one piece: the last execution's
        message again (put_exec's rule), on a connection nobody else uses, its reply read
        and decoded here. None (nothing sent): take the general way (call)."""
        if self.reading is not None or self.waiters or self.events or self.dead:
            return None
        last = self._last_request.get(request)
        message = last.message if last is not None else None
        if message is None or message[0] != (handle, type(measure), measure, type(deadline),
                                             deadline, type(loop), loop):
            return None
        slot = _Slot(self.shapes_replies, _shapes_fail,
                     self.long(kind, deadline) if deadline is not None else
                     _Bound(self.long_timeout_s, _NAMES[kind]))  # (long's common case)
        with self.lock:
            if self.dead or self.events:
                return None
            call_id = next(self.ids)
            self.pending[call_id] = slot
            self.sent_again += 1
            sent = time.perf_counter()
            try:
                send_message(self.sock, kind, call_id, message[1])
            except Closed:
                self._broken_send()  # the reader sees the end and fails everything pending
        me = threading.get_ident()
        with self.role:
            mine = self.reading is None
            if mine:
                self.reading = me
        if not mine:
            return self._wait(slot)
        try:
            if not self.receiver.pending():
                self._await_reply(sent)
            replies = self.shapes_replies
            known = replies.data
            if known is not None and replies.result is last.fitted:
                # The reply of last time, bar its timing: recognised by its bytes.
                try:
                    got = self.receiver.take(
                        _HEADER_PACK(w.MAGIC, w.VERSION, _REPLY, call_id,
                                     len(known) + _TIMING_SIZE, 0, 0) + known,
                        _TIMING_SIZE,
                        slot.bound.end if not self.bounds else self._next_end(slot))
                except (TimedOut, Closed, WireError, OSError):
                    got = None  # the general way below meets it again and says so
                if got is not None:
                    self.pending.pop(call_id, None)
                    self._again_took.append(time.perf_counter() - sent)
                    return replies.again(got[1])
            while not slot.done:
                msg = self._next_message(slot)
                if msg is None:
                    break
                rkind, rid, body, fds = msg
                if rid == call_id and rkind is _REPLY and not fds:
                    self.pending.pop(call_id, None)
                    self._again_took.append(time.perf_counter() - sent)
                    try:
                        result = replies.get(body, _shapes_result)
                    except Exception:  # noqa: BLE001 - a reply that does not decode
                        return _shapes_fail(ErrorStatus.GENERAL_FAILURE)
                    if replies.result is last.fitted:
                        return result  # the very result found to fit this request before
                    fitting = _fitting(result, request)
                    if fitting is result:
                        last.fitted = replies.result
                    return fitting
                self._dispatch_message(*msg)  # anything else: as the general reader does
        finally:
            if self.reading == me:
                self._pass_reading()
        return slot.result

    def _unsent(self, callback: tuple[str, Any] | None, fail: Fail,
                status: ErrorStatus) -> Any:
        """A call that never reached the service: its callback (which the service would have
        notified) is notified here, once."""
        if callback is not None:
            self._notify(callback, status, None)
        return fail(status)

    # ---- reading -------------------------------------------------------------------------
    def _finish(self, slot: _Slot, result: Any) -> None:
        with self.cond:
            if not slot.done:
                slot.result, slot.done = result, True
                if self.waiters:
                    self.cond.notify_all()

    def _wait(self, slot: _Slot) -> Any:
        """Wait for ``slot``'s reply, reading the socket whenever nobody else does."""
        me = threading.get_ident()
        with self.cond:
            while True:
                if slot.done:
                    return slot.result
                if self.reading is None:
                    self.reading = me
                    break
                left = slot.bound.end - time.monotonic()
                if left <= 0:
                    break
                self.waiters += 1
                try:
                    self.cond.wait(left)
                finally:
                    self.waiters -= 1
        if self.reading != me:  # the bound passed while another thread read
            self._expire()
            return slot.result
        try:
            while not slot.done and self._read_one(slot):
                pass
        finally:
            self._pass_reading()
        return slot.result

    def _await_reply(self, sent: float) -> None:
        """Before blocking on the reply of a repeated execution: look for it from
        REPLY_LOOK_S before the shortest of the message's recent round trips after ``sent``
        until REPLY_LOOK_S after the longest (at most REPLY_SPREAD past the shortest, and
        at most REPLY_LOOK_MAX_S of looking), sleeping until the look begins.

        A caller blocked in the kernel is woken by the reply, and on a virtual machine that
        wake-up (and the service's send that causes it) costs tens of microseconds: 30 us
        each way on this project's 2-core VM, where two processes trading a byte over a
        socket take 62-68 us blocking and 4-5 us looking. Looking over the spread of recent
        round trips, not around the last one, finds a reply whose time moves from call to call
        (MobileNet's driver time moves by +-8% here). A short call looks from the start; a
        reply that comes during the sleep ends it, one that comes after the look is blocked
        on as before (up to a millisecond more of looking when the socket's descriptor is
        past select's range)."""
        trips = tuple(self._again_took)  # one copy: another caller may clear it meanwhile
        if not trips or not self.looker.wanted():  # (a busy machine: block at once)
            return
        self.looked += 1
        lo = min(trips)
        hi = min(max(trips), lo * (1 + REPLY_SPREAD))
        now = time.perf_counter()
        nap = sent + lo - REPLY_LOOK_S - now
        if nap > 0:
            fd = self.sock.fileno()
            try:
                if 0 <= fd < _FD_SETSIZE:  # microseconds
                    ready = select.select([fd], [], [], nap)[0]
                else:  # whole milliseconds, rounded down: looks a little longer
                    ready = self._look.poll(int(nap * 1000))
            except (OSError, ValueError):  # closed meanwhile: the read says so
                return
            if ready:
                return
        end = min(sent + hi + REPLY_LOOK_S, time.perf_counter() + REPLY_LOOK_MAX_S)
        if self.looker.until(self.receiver.ready, end):
            self.found += 1

    def _pass_reading(self) -> None:
        """Give the reading up: to a caller still waiting, or to the background thread when
        callbacks or fences are outstanding."""
        with self.role:
            self.reading = None
            if self.waiters:
                self.cond.notify_all()
            if self.callbacks or self.fences or self.dead:
                self.idle.notify()

    def _background(self) -> None:
        me = threading.get_ident()
        while True:
            with self.cond:
                while not self.dead and (self.reading is not None
                                         or not (self.callbacks or self.fences)):
                    self.idle.wait()
                if self.dead:
                    return
                self.reading = me
            try:
                self._read_one(None)
            finally:
                self._pass_reading()

    def _read_one(self, slot: _Slot | None) -> bool:
        """Read and dispatch one message (by the thread that reads, for ``slot``'s call or
        for the callbacks and fences); False when the connection ended or a bound passed."""
        msg = self._next_message(slot)
        if msg is None:
            return False
        self._dispatch_message(*msg)
        return True

    def _next_message(self, slot: _Slot | None
                      ) -> tuple[Kind, int, memoryview, list[int]] | None:
        """The next message (by the thread that reads); None when the connection ended or
        the earliest bound passed (then the connection ends too: see _expire)."""
        while True:
            try:
                return self.receiver.next(
                    w.MAX_BODY, slot.bound.end if slot is not None and not self.bounds
                    else self._next_end(slot), False)
            except TimedOut:
                self._expire()
                if self.dead or (slot is not None and slot.done):
                    return None
                # nothing had passed its bound after all (it was answered meanwhile): on
            except (Closed, WireError, OSError):
                self._die()
                return None

    def _dispatch_message(self, kind: Kind, call_id: int, body: memoryview,
                          fds: list[int]) -> None:
        r = Reader(body, fds)
        try:
            self._dispatch(kind, call_id, r)
        except Exception as e:  # noqa: BLE001 - an event that does not decode
            log.warning("%s: a %s message that does not decode (%s): the connection is "
                        "closed", self.path, getattr(kind, "name", kind), e)
            self._die()
        finally:
            r.close_unused()

    def _dispatch(self, kind: Kind, call_id: int, r: Reader) -> None:
        if kind == Kind.ERROR and call_id == 0:  # the service ends the connection: why
            status = _status_or(r, ErrorStatus.GENERAL_FAILURE)
            log.warning("%s: the service closed the connection: %s", self.path,
                        "busy (all its client slots are taken; open the device again later)"
                        if status == ErrorStatus.RESOURCE_EXHAUSTED_TRANSIENT else status.name)
            self._die(status)
            return
        if kind == Kind.REPLY or kind == Kind.ERROR:
            slot = self.pending.pop(call_id, None)
            if slot is None:
                return
            if kind == Kind.ERROR:
                status = _status_or(r, ErrorStatus.GENERAL_FAILURE)
                # A call refused before it ran defined nothing; one that failed running may
                # have kept its memories (docs/wire.md): forget them either way (an unknown
                # id is ignored) and define them afresh.
                for mem in slot.new_mems:
                    entry = self.mem_ids.get(mem)
                    if entry is not None:
                        self.events.append((Kind.FORGET, entry[0]))
                self._unlearn(slot.new_mems)
                self.bounds.pop(("cb", call_id), None)
                cb = self.callbacks.pop(call_id, None)
                if cb is not None:
                    self._notify(cb, status, None)
                self._finish(slot, slot.fail(status))
                return
            try:
                result = slot.decode(r)
                r.finish()
            except Exception:  # noqa: BLE001 - a reply that does not decode
                result = slot.fail(ErrorStatus.GENERAL_FAILURE)
            self._finish(slot, result)
        elif kind in (Kind.NOTIFY_PREPARED, Kind.NOTIFY_EXECUTION):
            cb = self.callbacks.pop(call_id, None)
            self.bounds.pop(("cb", call_id), None)
            if cb is None:
                return
            try:
                if kind == Kind.NOTIFY_PREPARED:
                    status = w.get_status(r)
                    pm = RemotePreparedModel(self, r.u32()) if r.bool() else None
                    r.finish()
                    self._notify(cb, status, pm)
                else:
                    status = w.get_status(r)
                    shapes, timing = w.get_shapes(r), w.get_timing(r)
                    r.finish()
                    self._notify(cb, status, (shapes, timing))
            except Exception:  # noqa: BLE001 - a notification that does not decode
                self._notify(cb, ErrorStatus.GENERAL_FAILURE, None)
        elif kind == Kind.FENCE_STATE:
            fence_id, state, info = w.get_fence_state(r)
            r.finish()
            entry = self.fences.pop(fence_id, None)
            self.bounds.pop(("fence", fence_id), None)
            if entry is not None:
                fence, fcb = entry
                fcb._finish(info if info is not None else (
                    ErrorStatus.NONE if state == w.FENCE_SIGNALED else
                    ErrorStatus.GENERAL_FAILURE, NO_TIMING, NO_TIMING))
                fence.signal() if state == w.FENCE_SIGNALED else fence.set_error()

    def _notify(self, cb: tuple[str, Any], status: ErrorStatus, payload: Any) -> None:
        which, callback = cb

        def run() -> None:
            try:
                if which == "prepared":
                    callback.notify(status, payload)
                else:
                    shapes, timing = payload if payload is not None else ([], NO_TIMING)
                    callback.notify(status, shapes, timing)
            except Exception:  # noqa: BLE001 - a client callback's failure stays with it
                pass

        try:
            self.notifier.submit(run)
        except RuntimeError:  # closed: notify here
            run()

    def _die(self, status: ErrorStatus = UNAVAILABLE) -> None:
        """End the connection: everything pending and later fails with ``status``."""
        with self.lock:
            if self.dead:
                return
            self.dead = True
            self.death = status
            pending, self.pending = self.pending, {}
            callbacks, self.callbacks = self.callbacks, {}
            fences, self.fences = self.fences, {}
            self.bounds = {}
            self.events.clear()
        try:
            self.sock.close()
        except OSError:
            pass
        self.receiver.close()
        for slot in pending.values():
            self._finish(slot, slot.fail(status))
        for cb in callbacks.values():
            self._notify(cb, status, None)
        for fence, fcb in fences.values():
            fcb._finish((status, NO_TIMING, NO_TIMING))
            fence.set_error()
        self.notifier.shutdown(wait=False)
        with self.cond:
            self.cond.notify_all()
            self.idle.notify_all()

    def check_alive(self) -> bool:
        """False once the service is gone, noticed even while nobody reads (an end of
        stream waiting on the socket, or the service's notice that it ends the connection:
        ERROR with call id 0, as a busy service sends)."""
        if self.dead:
            return False
        status: ErrorStatus | None = None
        with self.cond:
            if self.reading is not None:
                return not self.dead
            try:
                head = self.sock.recv(w.HEADER_SIZE + 4, socket.MSG_PEEK | socket.MSG_DONTWAIT)
                status = UNAVAILABLE if head == b"" else _notice(head)
            except BlockingIOError:
                pass
            except OSError:
                status = UNAVAILABLE
        if status is not None:
            self._die(status)
        return not self.dead

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        me = threading.get_ident()
        with self.cond:  # a thread reading sees the end and stops
            self.waiters += 1
            try:
                self.cond.wait_for(lambda: self.reading in (None, me), timeout=5.0)
            finally:
                self.waiters -= 1
        self._die()
        if threading.current_thread() is not self.background:
            self.background.join(5.0)

    # ---- fences --------------------------------------------------------------------------
    def put_wait_for(self, wr: Writer, wait_for: Any, later: list) -> None:
        """waitFor fences: id, state now, the readiness descriptor; those still active get a
        FENCE_STATE when they complete (registered after the call is sent: ``later``)."""
        try:
            fences = list(wait_for)
        except TypeError:
            raise WireError("waitFor: not a sequence") from None
        wr.u32(len(fences))
        for fence in fences:
            if not isinstance(fence, SyncFence):
                raise WireError("waitFor: not a sync fence")
            fence_id = next(self.fence_ids)
            state = fence.state
            wr.u64(fence_id)
            wr.u8(int(state))
            fd = fence.fileno()
            wr.u8(1 if fd >= 0 else 0)
            if fd >= 0:
                wr.fd(fd)
            if state == FenceState.ACTIVE:
                later.append((fence, fence_id))

    def watch(self, later: list) -> None:
        for fence, fence_id in later:
            fence.add_done_callback(lambda f, i=fence_id: self._fence_done(f, i))

    def _fence_done(self, fence: SyncFence, fence_id: int) -> None:
        if self.reading == threading.get_ident():
            # Never block the reader on the send lock (a sender may wait for the service,
            # which may wait for this reader): send from the callback thread.
            try:
                self.notifier.submit(self._send_fence_state, fence, fence_id)
            except RuntimeError:
                pass  # the connection is dead
            return
        self._send_fence_state(fence, fence_id)

    def _send_fence_state(self, fence: SyncFence, fence_id: int) -> None:
        wr = Writer()
        w.put_fence_state(wr, fence_id, w.FENCE_SIGNALED if fence.state == FenceState.SIGNALED
                          else w.FENCE_ERROR, None)
        with self.lock:
            if self.dead:
                return
            try:
                send_message(self.sock, Kind.FENCE_STATE, 0, wr.buf)
            except Closed:
                pass

    def fenced(self, bound: _Bound) -> Decode:
        """The decoder of a fenced call's reply; its returned fence goes to error if the
        service does not complete it within ``bound``."""
        return lambda r: self.get_fenced(r, bound)

    def get_fenced(self, r: Reader, bound: _Bound
                   ) -> tuple[ErrorStatus, SyncFence | None, IFencedExecutionCallback | None]:
        status = w.get_status(r)
        if not r.bool():
            return (status if status != ErrorStatus.NONE else ErrorStatus.GENERAL_FAILURE,
                    None, None)
        fence_id = r.u64()
        if fence_id in self.fences:  # the fence it names already would never complete
            raise WireError(f"fence id {fence_id} returned twice")
        if r.bool():
            os.close(r.fd("fence"))  # the service's readiness mirror; ours is local
        fence, cb = SyncFence(), RemoteFencedCallback()
        # By the thread that reads: no lock needed (and the reader never waits for the send
        # lock, which a sender blocked on a full socket may hold).
        self.bounds[("fence", fence_id)] = bound
        self.fences[fence_id] = (fence, cb)
        return status, fence, cb


def _status_or(r: Reader, default: ErrorStatus) -> ErrorStatus:
    try:
        s = w.get_status(r)
        r.finish()
        return s
    except WireError:
        return default


# ---- failure shapes -------------------------------------------------------------------------

def _shapes_fail(s: ErrorStatus) -> tuple[ErrorStatus, list[OutputShape], Timing]:
    return s, [], NO_TIMING


#: The most elements an output can have: a request's buffer length is a u32 of bytes.
_MAX_ELEMENTS = 0xFFFF_FFFF


def _fitting(result: tuple[ErrorStatus, list[OutputShape], Timing], request: Any
             ) -> tuple[ErrorStatus, list[OutputShape], Timing]:
    """``result`` when it can be the result of ``request`` (None: its outputs are not known
    here), else GENERAL_FAILURE: shapes only with NONE or OUTPUT_INSUFFICIENT_SIZE, one per
    output, no output larger than a buffer can be, a sufficient one no larger than its
    buffer, of the rank and the dimensions the request gave. A hostile or broken service
    must not hand its caller sizes that make it fail when it allocates or reshapes."""
    status, shapes, _ = result
    if not shapes:
        return result
    bad = None
    if status not in (ErrorStatus.NONE, ErrorStatus.OUTPUT_INSUFFICIENT_SIZE):
        bad = f"{len(shapes)} output shapes with status {status.name}"
    outputs = getattr(request, "outputs", None) if request is not None else None
    if bad is None and isinstance(outputs, (list, tuple)) and len(shapes) != len(outputs):
        bad = f"{len(shapes)} output shapes for {len(outputs)} outputs"
    for i, shape in enumerate(shapes if bad is None else ()):
        dims = shape.dimensions
        if math.prod(dims) > _MAX_ELEMENTS:
            bad = f"output {i}: dimensions {dims[:8]} past any buffer"
            break
        arg = outputs[i] if isinstance(outputs, (list, tuple)) else None
        given = getattr(arg, "dimensions", None)
        if isinstance(given, (list, tuple)) and given and (
                len(given) != len(dims) or any(g and g != d for g, d in zip(given, dims))):
            bad = f"output {i}: dimensions {dims[:8]} where the request gave {list(given)}"
            break
        length = getattr(getattr(arg, "location", None), "length", 0)
        if shape.is_sufficient and status == ErrorStatus.NONE and type(length) is int and \
                length and not getattr(arg, "has_no_value", False) and \
                math.prod(dims) > length:
            bad = f"output {i}: {math.prod(dims)} elements in a buffer of {length} bytes"
            break
    if bad is None:
        return result
    log.warning("a service's results do not fit the request (%s): GENERAL_FAILURE", bad)
    return ErrorStatus.GENERAL_FAILURE, [], NO_TIMING


def _shapes_result(data: Any) -> tuple[ErrorStatus, list[OutputShape], Timing]:
    """A whole reply body as a shapes result (as w.get_shapes_result checks it)."""
    r = Reader(data)
    out = w.get_shapes_result(r)
    r.finish()
    return out


class _RepeatedResults:
    """Execution results (status, output shapes, timing) decoded once per distinct bytes: a
    repeated execution's results repeat (the socket's replies and the rings' result packets
    alike). Why: decoding and allocating the shapes is the client's work per reply, and a
    reply must still be decoded strictly (the service is not trusted); bytes equal to bytes
    that decoded are the same result. ``tail``: bytes at the end that are the timing (the
    socket's replies, w.TIMING), which a measured execution changes every time: compared
    apart and decoded alone. Each caller gets its own copy of the shapes. Used by one
    reading thread at a time."""

    __slots__ = ("data", "result", "timing", "tail")

    def __init__(self, tail: int = 0) -> None:
        self.tail = tail
        self.data: bytes | None = None
        #: (status, shapes) of ``data``, one tuple per distinct bytes: its identity says
        #: "the very result decoded before" (see Connection.exec_again).
        self.result: tuple[ErrorStatus, list[OutputShape]] | None = None
        self.timing: Timing = NO_TIMING

    def get(self, data: Any, decode: Callable[[Any], tuple[ErrorStatus, list[OutputShape],
                                                           Timing]]
            ) -> tuple[ErrorStatus, list[OutputShape], Timing]:
        """The result ``data`` decodes to (``decode`` runs only for new bytes; what it
        raises passes)."""
        n = len(data) - self.tail
        if self.result is None or n <= 0 or data[:n] != self.data:
            status, shapes, timing = decode(data)
            self.data, self.result, self.timing = bytes(data[:n]), (status, shapes), timing
        elif self.tail:
            timing = Timing(*_TIMING_FROM(data, n))
        else:
            timing = self.timing
        status, shapes = self.result
        copies = []  # (a loop, not a comprehension: no call more in 3.11)
        for s in shapes:
            copies.append(OutputShape(list(s.dimensions), s.is_sufficient))
        return status, copies, timing

    def again(self, tail: bytes) -> tuple[ErrorStatus, list[OutputShape], Timing]:
        """The result of the bytes decoded last (``data``) followed by the timing ``tail``
        (Receiver.take found them)."""
        status, shapes = self.result  # type: ignore[misc]
        copies = []  # (a loop, not a comprehension: no call more in 3.11)
        for s in shapes:
            copies.append(OutputShape(list(s.dimensions), s.is_sufficient))
        return status, copies, Timing(*_TIMING_FROM(tail))

    def __call__(self, r: Reader) -> tuple[ErrorStatus, list[OutputShape], Timing]:
        """As a reply decoder: the whole body (_shapes_result)."""
        result = self.get(r.view, _shapes_result)
        r.pos = len(r.view)
        return result


class _FittingCallback:
    """An execution callback whose shapes are checked against the request first."""

    def __init__(self, callback: Any, request: Any):
        self.callback, self.request = callback, request

    def notify(self, status: ErrorStatus, shapes: list[OutputShape], timing: Timing) -> None:
        status, shapes, timing = _fitting((status, shapes, timing), self.request)
        self.callback.notify(status, shapes, timing)


class RemoteFencedCallback(IFencedExecutionCallback):
    """The info arrives with the returned fence's FENCE_STATE (the service reads it when the
    fence completes); before that, GENERAL_FAILURE as the HAL says."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._info: tuple[ErrorStatus, Timing, Timing] = (ErrorStatus.GENERAL_FAILURE,
                                                          NO_TIMING, NO_TIMING)

    def get_execution_info(self, timeout_s: float | None = 0.0
                           ) -> tuple[ErrorStatus, Timing, Timing]:
        if timeout_s != 0.0:
            self._done.wait(timeout_s)
        return self._info if self._done.is_set() else (ErrorStatus.GENERAL_FAILURE,
                                                       NO_TIMING, NO_TIMING)

    def _finish(self, info: tuple[ErrorStatus, Timing, Timing]) -> None:
        if not self._done.is_set():
            self._info = info
            self._done.set()


class _Remote:
    """A service object of this connection, released when the proxy is dropped."""

    def __init__(self, conn: Connection, handle: int):
        self.conn = conn
        self.handle = handle
        self._fin = weakref.finalize(self, conn.release, handle)
        self._fin.atexit = False

    def close(self) -> None:
        self._fin()


def _handle_result(conn: Connection, cls: type) -> Decode:
    def decode(r: Reader) -> tuple[ErrorStatus, Any]:
        status = w.get_status(r)
        obj = cls(conn, r.u32()) if r.bool() else None
        if status == ErrorStatus.NONE and obj is None:
            status = ErrorStatus.GENERAL_FAILURE
        return status, obj
    return decode


def _pair_fail(s: ErrorStatus) -> tuple[ErrorStatus, None]:
    return s, None


def _fenced_fail(s: ErrorStatus) -> tuple[ErrorStatus, None, None]:
    return s, None, None


class RemoteExecution(_Remote, IExecution):
    #: The request it was created for (its results are checked against it).
    request: Any = None

    def compute(self, deadline: int | None = None
                ) -> tuple[ErrorStatus, list[OutputShape], Timing]:
        def enc(wr: Writer) -> None:
            wr.u32(self.handle)
            wr.opt_i64(deadline, "deadline")
        return _fitting(self.conn.call(Kind.COMPUTE, enc, self.conn.shapes_replies,
                                       _shapes_fail,
                                       bound=self.conn.long(Kind.COMPUTE, deadline)),
                        self.request)

    def compute_fenced(self, wait_for: Sequence[SyncFence], deadline: int | None = None,
                       timeout_after_fence: int | None = None
                       ) -> tuple[ErrorStatus, SyncFence | None, IFencedExecutionCallback | None]:
        later: list = []

        def enc(wr: Writer) -> None:
            wr.u32(self.handle)
            self.conn.put_wait_for(wr, wait_for, later)
            wr.opt_i64(deadline, "deadline")
            wr.opt_i64(timeout_after_fence, "timeoutAfterFence")
        bound = self.conn.long(Kind.COMPUTE_FENCED, deadline)
        return self.conn.call(Kind.COMPUTE_FENCED, enc, self.conn.fenced(bound), _fenced_fail,
                              after_send=lambda: self.conn.watch(later), bound=bound)


class RemoteBuffer(_Remote, IBuffer):
    token = 0

    def copy_to(self, dst: Any) -> ErrorStatus:
        def enc(wr: Writer) -> None:
            wr.u32(self.handle)
            wr.memory(dst, "dst")
        return self.conn.call(Kind.COPY_TO, enc, w.get_status, lambda s: s)

    def copy_from(self, src: Any, dimensions: Sequence[int] = ()) -> ErrorStatus:
        def enc(wr: Writer) -> None:
            wr.u32(self.handle)
            wr.memory(src, "src")
            wr.u32s(dimensions, "dimensions")
        return self.conn.call(Kind.COPY_FROM, enc, w.get_status, lambda s: s)


class _CacheHold:
    """Keeps a memory cached in a remote burst while referenced (BURST_UNCACHE when dropped)."""

    __slots__ = ("_fin", "__weakref__")

    def __init__(self, conn: Connection, burst: int, ident: int):
        self._fin = weakref.finalize(self, conn._queue_event, Kind.BURST_UNCACHE,
                                     (burst, ident))
        self._fin.atexit = False

    def release(self) -> None:
        self._fin()

    @property
    def released(self) -> bool:
        return not self._fin.alive


def _put_exec(conn: Connection, wr: Writer, handle: int, request: Any, measure: Any,
              deadline: Any, loop: Any) -> None:
    """An execution's arguments (see Connection.put_exec)."""
    conn.put_exec(wr, handle, request, measure, deadline, loop)


def _create_reusable(conn: Connection, kind: Kind, handle: int, request: Any, measure: Any,
                     loop: Any) -> tuple[ErrorStatus, IExecution | None]:
    """createReusableExecution of a prepared model or a burst (``kind`` says which)."""
    def enc(wr: Writer) -> None:
        wr.u32(handle)
        w.put_request(wr, request)
        wr.i32(measure, "measure")
        wr.opt_i64(loop, "loopTimeout")
    status, ex = conn.call(kind, enc, _handle_result(conn, RemoteExecution), _pair_fail)
    if ex is not None:
        ex.request = snapshot_request(request)
    return status, ex


class _BurstChannel:
    """BURST_EXECUTE on the socket: the path of requests the rings do not carry."""

    def __init__(self, conn: Connection, handle: int):
        self.conn, self.handle = conn, handle

    def execute(self, request: Request, measure: Any, deadline: Any, loop: Any
                ) -> tuple[ErrorStatus, list[OutputShape], Timing]:
        return _fitting(self.conn.call(
            Kind.BURST_EXECUTE,
            lambda wr: _put_exec(self.conn, wr, self.handle, request, measure, deadline, loop),
            self.conn.shapes_replies, _shapes_fail,
            bound=self.conn.long(Kind.BURST_EXECUTE, deadline)), request)


#: Data bytes of each of a burst's two rings. A request or result that does not fit (with its
#: headers) cannot use them: the request goes over the socket, the result is GENERAL_FAILURE.
RING_CAPACITY = 1 << 16
_REQ_HEAD, _RES_HEAD = w.BURST_REQUEST, w.BURST_RESULT
_REQ_TAG, _RES_TAG = w.BURST_REQUEST_TAG, w.BURST_RESULT_TAG
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1


class _RingChannel:
    """A burst's executions on its two shared-memory rings (docs/fmq.md): one record out on
    the request ring, one back on the result ring, no socket traffic.

    One execution is in flight at a time (the HAL allows no more on a burst): ``execute``
    holds a lock from the write of the request to the read of its result. While it waits it
    watches the connection, so a dead service ends the wait with DEVICE_UNAVAILABLE within
    about 100 ms. Once the rings cannot be trusted (a record that does not check, a result
    the service flags CLOSING) the channel closes them and returns None from then on: the
    burst uses the socket.
    """

    def __init__(self, conn: Connection, pair: ChannelPair):
        self.conn = conn
        self.requests, self.results = pair.client_side()
        self.pair = pair
        self.lock = threading.Lock()
        self.seq = 0
        self.broken = False
        self.closing = False
        self._results = _RepeatedResults()  # result packets decoded once per bytes

    def alive(self) -> bool:
        # The ring asks while it sleeps (about every 50 ms): the connection looks at its
        # socket, since nobody may be reading it while a burst runs on rings.
        return not self.closing and self.conn.check_alive()

    def execute(self, packet: bytes, deadline: Any, loop: Any
                ) -> tuple[ErrorStatus, list[OutputShape], Timing] | None:
        """The result of the execution of an FMQ request packet, or None when the rings cannot
        carry it (then the caller sends it on the socket, which also gives unusual arguments
        their canonical status)."""
        flags = 0
        if deadline is not None:
            if type(deadline) is not int or not _I64_MIN <= deadline <= _I64_MAX:
                return None
            flags |= w.BURST_HAS_DEADLINE
        if loop is not None:
            if type(loop) is not int or not _I64_MIN <= loop <= _I64_MAX:
                return None
            flags |= w.BURST_HAS_LOOP_TIMEOUT
        with self.lock:
            if self.broken:
                return None
            if self.conn.dead:
                return self.conn.death, [], NO_TIMING
            self.seq = seq = self.seq + 1
            bound = self.conn.long(Kind.BURST_EXECUTE, deadline)
            try:
                self.requests.write(_REQ_HEAD.pack(_REQ_TAG, flags, seq, deadline or 0,
                                                   loop or 0) + packet,
                                    timeout=self.conn.timeout_s, alive=self.alive)
            except PacketTooLarge:
                return None
            except RingTimeout:
                return self._hung(_Bound(self.conn.timeout_s, "burst ring (request)"))
            except RingError:
                return self._lost()
            try:
                record = self.results.read(timeout=max(bound.end - time.monotonic(), 0.001),
                                           alive=self.alive)
            except RingTimeout:
                return self._hung(bound)
            except RingError:
                return self._lost()
            if len(record) < _RES_HEAD.size:
                return self._lost()
            tag, rflags, rseq = _RES_HEAD.unpack_from(record)
            if tag != _RES_TAG or rflags & ~w.BURST_CLOSING or rseq != seq:
                return self._lost()
            try:
                result = self._results.get(record[_RES_HEAD.size:], fmq.unpack_result)
            except fmq.FmqDecodeError:
                return self._lost()
            if rflags & w.BURST_CLOSING:
                self._break()
            return result

    def _hung(self, bound: _Bound) -> tuple[ErrorStatus, list[OutputShape], Timing]:
        """The service let the bound pass on the rings: taken as hung (Connection._expire)."""
        log.warning("%s: %s not answered within %.3g s: the service is taken as hung and "
                    "the connection closed", self.conn.path, bound.what, bound.seconds)
        self._break()
        self.conn._die()
        return bound.status, [], NO_TIMING

    def _lost(self) -> tuple[ErrorStatus, list[OutputShape], Timing]:
        """The rings failed mid-execution: the service died, or they are corrupt."""
        status = self.conn.death if self.conn.dead else ErrorStatus.GENERAL_FAILURE
        self._break()
        return status, [], NO_TIMING

    def _break(self) -> None:
        self.broken = True
        self.pair.close()

    def close(self) -> None:
        self.closing = True  # an execution in flight gives up within about 100 ms
        with self.lock:
            self._break()


class RemoteBurst(_Remote, IBurst):
    """A served burst. With rings (``pair``), an execution whose pools are all shared memories
    crosses on them; its memories are cached in the burst first (one BURST_CACHE each, the
    first time) and named by their connection ids. Other executions use BURST_EXECUTE."""

    def __init__(self, conn: Connection, handle: int, pair: ChannelPair | None = None):
        super().__init__(conn, handle)
        self.channel = _BurstChannel(conn, handle)
        self.rings = _RingChannel(conn, pair) if pair is not None else None
        self._holds: weakref.WeakValueDictionary[int, _CacheHold] = \
            weakref.WeakValueDictionary()
        # memory -> (its pool identifier, the hold that keeps it cached while it lives)
        self._slots: weakref.WeakKeyDictionary[SharedMemory, tuple[int, _CacheHold]] = \
            weakref.WeakKeyDictionary()
        # (snapshot of the last request sent on the rings, its measure, its packet): the
        # burst's counterpart of Connection._last_request (the packet is encoded once per
        # distinct request; the service and the driver check it on their sides)
        self._last = _LastRequest(weak=False)

    def close(self) -> None:
        if self.rings is not None:  # first: the service answers an execution in flight
            self.rings.close()
        super().close()

    def cache_memory(self, memory: Any) -> Any:
        if not isinstance(memory, SharedMemory) or memory.closed:
            return None
        known = self.conn.mem_ids.get(memory)
        if known is not None:
            hold = self._holds.get(known[0])
            if hold is not None:
                return hold
        ident: list[int] = []

        def enc(wr: Writer) -> None:
            wr.u32(self.handle)
            start = len(wr.buf)
            wr.memory(memory)
            ident.append(int.from_bytes(wr.buf[start + 1:start + 9], "little"))
        status = self.conn.call(Kind.BURST_CACHE, enc, w.get_status, lambda s: s)
        if status != ErrorStatus.NONE or not ident:
            return None
        hold = _CacheHold(self.conn, self.handle, ident[0])
        self._holds[ident[0]] = hold
        return hold

    def _slot_ids(self, pools: Any) -> list[int] | None:
        """The pool identifiers of a request's pools, caching each new memory; None when a
        pool is not a shared memory the rings can name (a token, an empty pool)."""
        slots = []
        known = self._slots
        for pool in pools:
            if type(pool) is MemoryPool:
                if pool.token is not None:
                    return None
                pool = pool.hidl_memory
            if not isinstance(pool, SharedMemory) or pool.closed:
                return None
            entry = known.get(pool)
            if entry is None:
                hold = self.cache_memory(pool)
                ref = self.conn.mem_ids.get(pool)
                if hold is None or ref is None or ref[0] > 0x7FFF_FFFF:
                    return None
                entry = known[pool] = (ref[0], hold)
            slots.append(entry[0])
        return slots

    def execute(self, request: Request, measure: MeasureTiming = MeasureTiming.NO,
                deadline: int | None = None, loop_timeout: int | None = None
                ) -> tuple[ErrorStatus, list[OutputShape], Timing]:
        rings = self.rings
        if rings is not None and not rings.broken:
            packet = self._packet(request, measure)
            if packet is not None:
                result = rings.execute(packet, deadline, loop_timeout)
                if result is not None:
                    return _fitting(result, request)
        return self.channel.execute(request, measure, deadline, loop_timeout)

    def _packet(self, request: Request, measure: Any) -> bytes | None:
        """The FMQ request packet of ``request``; None when the rings cannot carry it.

        A burst repeats its request: the last packet is kept (its memories with it: the burst
        caches them anyway) and reused when the request and ``measure`` are the same again."""
        packet = self._last.get(request, measure)
        if packet is not None:
            return packet
        if type(request) is not Request:
            return None
        slots = self._slot_ids(request.pools)
        if slots is None:
            return None
        try:
            packet = fmq.pack_request(request, measure, slots)
        except (fmq.FmqEncodeError, struct.error, TypeError, ValueError):
            return None
        self._last.put(request, packet, measure)
        return packet

    def create_reusable_execution(self, request: Request,
                                  measure: MeasureTiming = MeasureTiming.NO,
                                  loop_timeout: int | None = None
                                  ) -> tuple[ErrorStatus, IExecution | None]:
        return _create_reusable(self.conn, Kind.BURST_CREATE_REUSABLE, self.handle, request,
                                measure, loop_timeout)

    def execute_with_config(self, request: Request, config: ExecutionConfig,
                            deadline: int | None = None
                            ) -> tuple[ErrorStatus, list[OutputShape], Timing]:
        """With hints: BURST_EXECUTE_WITH_CONFIG on the socket (the rings carry the 1.2
        packet, which has no room for hints). Without: a plain execution, rings included."""
        if not w.has_hints(config, "execution_hints"):
            return self.execute(request, config.measure, deadline, config.loop_timeout)

        def enc(wr: Writer) -> None:
            wr.u32(self.handle)
            w.put_request(wr, request)
            w.put_execution_config(wr, config)
            wr.opt_i64(deadline, "deadline")
        return _fitting(self.conn.call(
            Kind.BURST_EXECUTE_WITH_CONFIG, enc, self.conn.shapes_replies, _shapes_fail,
            bound=self.conn.long(Kind.BURST_EXECUTE_WITH_CONFIG, deadline)), request)


class RemotePreparedModel(_Remote, IPreparedModel, IHidlPreparedModel):
    """A served prepared model. HAL 1.3's callback call crosses the wire as it is (EXECUTE:
    the launch status comes back at once, the result as NOTIFY_EXECUTION); the service
    answers it with the HIDL face's adapter over the driver."""

    def execute(self, request: Request, measure: MeasureTiming, deadline: int | None,
                loop_timeout: int | None, callback: IExecutionCallback) -> ErrorStatus:
        if callback is None or not hasattr(callback, "notify"):
            return ErrorStatus.INVALID_ARGUMENT
        return self.conn.call(
            Kind.EXECUTE,
            lambda wr: _put_exec(self.conn, wr, self.handle, request, measure, deadline,
                                 loop_timeout),
            w.get_status, lambda s: s, callback=("execution", _FittingCallback(callback, request)),
            callback_bound=self.conn.long(Kind.EXECUTE, deadline))

    def execute_synchronously(self, request: Request, measure: MeasureTiming = MeasureTiming.NO,
                              deadline: int | None = None, loop_timeout: int | None = None
                              ) -> tuple[ErrorStatus, list[OutputShape], Timing]:
        again = self.conn.exec_again(Kind.EXECUTE_SYNCHRONOUSLY, self.handle, request, measure,
                                     deadline, loop_timeout)
        if again is not None:
            return again
        return _fitting(self.conn.call(
            Kind.EXECUTE_SYNCHRONOUSLY,
            lambda wr: _put_exec(self.conn, wr, self.handle, request, measure, deadline,
                                 loop_timeout),
            self.conn.shapes_replies, _shapes_fail,
            bound=self.conn.long(Kind.EXECUTE_SYNCHRONOUSLY, deadline)), request)

    def execute_fenced(self, request: Request, wait_for: Sequence[SyncFence],
                       measure: MeasureTiming = MeasureTiming.NO, deadline: int | None = None,
                       loop_timeout: int | None = None, duration: int | None = None
                       ) -> tuple[ErrorStatus, SyncFence | None, IFencedExecutionCallback | None]:
        later: list = []

        def enc(wr: Writer) -> None:
            wr.u32(self.handle)
            w.put_request(wr, request)
            self.conn.put_wait_for(wr, wait_for, later)
            wr.i32(measure, "measure")
            wr.opt_i64(deadline, "deadline")
            wr.opt_i64(loop_timeout, "loopTimeout")
            wr.opt_i64(duration, "duration")
        bound = self.conn.long(Kind.EXECUTE_FENCED, deadline)
        return self.conn.call(Kind.EXECUTE_FENCED, enc, self.conn.fenced(bound), _fenced_fail,
                              after_send=lambda: self.conn.watch(later), bound=bound)

    def configure_execution_burst(self) -> tuple[ErrorStatus, IBurst | None]:
        """A served burst with its two rings (CONFIGURE_BURST_RINGS); without them when they
        cannot be made here (CONFIGURE_BURST)."""
        try:
            pair = ChannelPair.create(RING_CAPACITY)
        except (RingError, OSError):
            return self.conn.call(Kind.CONFIGURE_BURST, lambda wr: wr.u32(self.handle),
                                  _handle_result(self.conn, RemoteBurst), _pair_fail)

        def enc(wr: Writer) -> None:
            wr.u32(self.handle)
            for fd in pair.fds():
                wr.fd(fd)

        def dec(r: Reader) -> tuple[ErrorStatus, RemoteBurst | None]:
            status = w.get_status(r)
            if not r.bool():
                return (status if status != ErrorStatus.NONE else ErrorStatus.GENERAL_FAILURE,
                        None)
            handle = r.u32()
            served = r.bool()
            return status, RemoteBurst(self.conn, handle, pair if served else None)
        status, burst = self.conn.call(Kind.CONFIGURE_BURST_RINGS, enc, dec, _pair_fail)
        if burst is None or burst.rings is None:
            pair.close()  # the service keeps its own descriptors of the rings it serves
        return status, burst

    def create_reusable_execution(self, request: Request,
                                  measure: MeasureTiming = MeasureTiming.NO,
                                  loop_timeout: int | None = None
                                  ) -> tuple[ErrorStatus, IExecution | None]:
        return _create_reusable(self.conn, Kind.CREATE_REUSABLE, self.handle, request,
                                measure, loop_timeout)

    # AIDL v4's calls. A config without hints or extension table asks for no more than the
    # plain call, and is sent as one: its fast paths (the repeated-request encodings, the
    # burst rings) stay the only hot paths. With hints, the *_WITH_CONFIG message reaches the
    # served driver's own *_with_config method.
    def execute_synchronously_with_config(self, request: Request, config: ExecutionConfig,
                                          deadline: int | None = None
                                          ) -> tuple[ErrorStatus, list[OutputShape], Timing]:
        if not w.has_hints(config, "execution_hints"):
            return self.execute_synchronously(request, config.measure, deadline,
                                              config.loop_timeout)

        def enc(wr: Writer) -> None:
            wr.u32(self.handle)
            w.put_request(wr, request)
            w.put_execution_config(wr, config)
            wr.opt_i64(deadline, "deadline")
        kind = Kind.EXECUTE_SYNCHRONOUSLY_WITH_CONFIG
        return _fitting(self.conn.call(kind, enc, self.conn.shapes_replies, _shapes_fail,
                                       bound=self.conn.long(kind, deadline)), request)

    def execute_fenced_with_config(self, request: Request, wait_for: Sequence[SyncFence],
                                   config: ExecutionConfig, deadline: int | None = None,
                                   duration: int | None = None
                                   ) -> tuple[ErrorStatus, SyncFence | None,
                                              IFencedExecutionCallback | None]:
        if not w.has_hints(config, "execution_hints"):
            return self.execute_fenced(request, wait_for, config.measure, deadline,
                                       config.loop_timeout, duration)
        later: list = []

        def enc(wr: Writer) -> None:
            wr.u32(self.handle)
            w.put_request(wr, request)
            self.conn.put_wait_for(wr, wait_for, later)
            w.put_execution_config(wr, config)
            wr.opt_i64(deadline, "deadline")
            wr.opt_i64(duration, "duration")
        kind = Kind.EXECUTE_FENCED_WITH_CONFIG
        bound = self.conn.long(kind, deadline)
        return self.conn.call(kind, enc, self.conn.fenced(bound), _fenced_fail,
                              after_send=lambda: self.conn.watch(later), bound=bound)

    def create_reusable_execution_with_config(self, request: Request, config: ExecutionConfig
                                              ) -> tuple[ErrorStatus, IExecution | None]:
        if not w.has_hints(config, "execution_hints"):
            return self.create_reusable_execution(request, config.measure,
                                                  config.loop_timeout)

        def enc(wr: Writer) -> None:
            wr.u32(self.handle)
            w.put_request(wr, request)
            w.put_execution_config(wr, config)
        status, ex = self.conn.call(Kind.CREATE_REUSABLE_WITH_CONFIG, enc,
                                    _handle_result(self.conn, RemoteExecution), _pair_fail)
        if ex is not None:
            ex.request = snapshot_request(request)
        return status, ex


class RemoteDevice(IDevice):
    """An IDevice served by ``nnhal serve`` at ``path``; OSError if nothing answers there
    (TimeoutError when its listen backlog stays full for ``timeout_s``).

    ``timeout_s`` bounds connecting and every quick call, ``long_timeout_s`` what runs the
    driver without a deadline (see the module docstring); None: from
    ``$NNHAL_REMOTE_TIMEOUT_S`` / ``$NNHAL_REMOTE_LONG_TIMEOUT_S``, else 30 s / 300 s.
    ValueError for a bound that is not a positive number of seconds."""

    def __init__(self, path: str | os.PathLike[str], name: str | None = None, *,
                 timeout_s: float | None = None, long_timeout_s: float | None = None):
        self.path = str(path)
        self.name = name or f"remote:{self.path}"
        self.conn = Connection(self.path, _bound_of(timeout_s, TIMEOUT_ENV, TIMEOUT_S),
                               _bound_of(long_timeout_s, LONG_TIMEOUT_ENV, LONG_TIMEOUT_S))
        self._feature_level: FeatureLevel | None = None

    @property
    def alive(self) -> bool:
        return self.conn.check_alive()

    def close(self) -> None:
        self.conn.close()

    def _simple(self, kind: Kind, decode: Decode, fail: Fail) -> Any:
        return self.conn.call(kind, lambda wr: None, decode, fail)

    def get_capabilities(self) -> tuple[ErrorStatus, Capabilities | None]:
        def dec(r: Reader) -> tuple[ErrorStatus, Capabilities | None]:
            status = w.get_status(r)
            return status, (w.get_capabilities(r) if r.bool() else None)
        return self._simple(Kind.GET_CAPABILITIES, dec, _pair_fail)

    def get_supported_operations(self, model: Model) -> tuple[ErrorStatus, list[bool]]:
        def dec(r: Reader) -> tuple[ErrorStatus, list[bool]]:
            status = w.get_status(r)
            return status, [r.bool() for _ in range(r.count("supported", 1))]
        return self.conn.call(Kind.GET_SUPPORTED_OPERATIONS, lambda wr: w.put_model(wr, model),
                              dec, lambda s: (s, []),
                              bound=self.conn.long(Kind.GET_SUPPORTED_OPERATIONS))

    def get_type(self) -> tuple[ErrorStatus, DeviceType]:
        def dec(r: Reader) -> tuple[ErrorStatus, DeviceType]:
            status, t = w.get_status(r), r.u32()
            try:
                return status, DeviceType(t)
            except ValueError:
                raise WireError(f"device type {t}") from None
        return self._simple(Kind.GET_TYPE, dec, lambda s: (s, DeviceType.OTHER))

    def get_version_string(self) -> tuple[ErrorStatus, str]:
        return self._simple(Kind.GET_VERSION_STRING, lambda r: (w.get_status(r), r.str()),
                            lambda s: (s, ""))

    def get_supported_extensions(self) -> tuple[ErrorStatus, list[Extension]]:
        def dec(r: Reader) -> tuple[ErrorStatus, list[Extension]]:
            status = w.get_status(r)
            return status, [w.get_extension(r) for _ in range(r.count("extensions", 8))]
        return self._simple(Kind.GET_SUPPORTED_EXTENSIONS, dec, lambda s: (s, []))

    @property
    def feature_level(self) -> FeatureLevel:  # type: ignore[override]
        """The served driver's feature level (GET_FEATURE_LEVEL, asked once). While the
        service cannot say (dead, busy, a reply that does not decode): V1_3, what every
        served driver answers, asked again next time."""
        level = self._feature_level
        if level is None:
            def dec(r: Reader) -> tuple[ErrorStatus, FeatureLevel | None]:
                status, v = w.get_status(r), r.u32("feature level")
                try:
                    return status, FeatureLevel.of_level(v)
                except UnknownVersion:
                    raise WireError(f"feature level {v}") from None
            status, level = self._simple(Kind.GET_FEATURE_LEVEL, dec, _pair_fail)
            if status != ErrorStatus.NONE or level is None:
                return FeatureLevel.V1_3
            self._feature_level = level
        return level

    def get_number_of_cache_files_needed(self) -> tuple[ErrorStatus, int, int]:
        return self._simple(Kind.GET_NUMBER_OF_CACHE_FILES,
                            lambda r: (w.get_status(r), r.u32(), r.u32()), lambda s: (s, 0, 0))

    def prepare_model(self, model: Model, preference: ExecutionPreference = (
                          ExecutionPreference.FAST_SINGLE_ANSWER),
                      priority: Priority = Priority.MEDIUM, deadline: int | None = None,
                      model_cache: Sequence[Any] = (), data_cache: Sequence[Any] = (),
                      token: bytes = b"", callback: IPreparedModelCallback | None = None
                      ) -> ErrorStatus:
        def enc(wr: Writer) -> None:
            w.put_model(wr, model)
            wr.i32(preference, "preference")
            wr.i32(priority, "priority")
            wr.opt_i64(deadline, "deadline")
            w.put_handles(wr, model_cache, "modelCache")
            w.put_handles(wr, data_cache, "dataCache")
            w.put_token(wr, token)
        return self._prepare_checked(Kind.PREPARE_MODEL, enc, callback, deadline)

    def _prepare_checked(self, kind: Kind, enc: Callable[[Writer], None],
                         callback: Any, deadline: Any) -> ErrorStatus:
        if callback is None or not hasattr(callback, "notify"):
            return ErrorStatus.INVALID_ARGUMENT
        return self.conn.call(kind, enc, w.get_status, lambda s: s,
                              callback=("prepared", callback),
                              callback_bound=self.conn.long(kind, deadline))

    def prepare_model_with_config(self, model: Model, config: PrepareModelConfig,
                                  callback: IPreparedModelCallback) -> ErrorStatus:
        """With hints: PREPARE_MODEL_WITH_CONFIG, which reaches the served driver's
        prepare_model_with_config. Without (nothing more than prepare_model asks): that."""
        if not w.has_hints(config, "compilation_hints"):
            return self.prepare_model(model, config.preference, config.priority,
                                      config.deadline, config.model_cache, config.data_cache,
                                      config.cache_token, callback)

        def enc(wr: Writer) -> None:
            w.put_model(wr, model)
            w.put_prepare_config(wr, config)
        return self._prepare_checked(Kind.PREPARE_MODEL_WITH_CONFIG, enc, callback,
                                     getattr(config, "deadline", None))

    def prepare_model_from_cache(self, deadline: int | None, model_cache: Sequence[Any],
                                 data_cache: Sequence[Any], token: bytes,
                                 callback: IPreparedModelCallback) -> ErrorStatus:
        def enc(wr: Writer) -> None:
            wr.opt_i64(deadline, "deadline")
            w.put_handles(wr, model_cache, "modelCache")
            w.put_handles(wr, data_cache, "dataCache")
            w.put_token(wr, token)
        return self._prepare_checked(Kind.PREPARE_MODEL_FROM_CACHE, enc, callback, deadline)

    def allocate(self, desc: BufferDesc, prepared_models: Sequence[IPreparedModel],
                 input_roles: Sequence[BufferRole], output_roles: Sequence[BufferRole]
                 ) -> tuple[ErrorStatus, IBuffer | None, int]:
        def enc(wr: Writer) -> None:
            w.put_buffer_desc(wr, desc)
            handles = []
            for pm in prepared_models:
                if not isinstance(pm, RemotePreparedModel) or pm.conn is not self.conn:
                    raise WireError("a prepared model of another device")
                handles.append(pm.handle)
            wr.u32s(handles, "preparedModels")
            for role in wr.count(input_roles, "inputRoles"):
                w.put_role(wr, role)
            for role in wr.count(output_roles, "outputRoles"):
                w.put_role(wr, role)

        def dec(r: Reader) -> tuple[ErrorStatus, IBuffer | None, int]:
            status = w.get_status(r)
            if not r.bool():
                return (status if status != ErrorStatus.NONE else ErrorStatus.GENERAL_FAILURE,
                        None, 0)
            buf = RemoteBuffer(self.conn, r.u32())
            buf.token = r.u32()
            return status, buf, buf.token
        return self.conn.call(Kind.ALLOCATE, enc, dec, lambda s: (s, None, 0))

    def __repr__(self) -> str:
        state = "" if self.alive else ", busy" if self.conn.death == \
            ErrorStatus.RESOURCE_EXHAUSTED_TRANSIENT else ", dead"
        return f"RemoteDevice({self.path!r}{state})"
