"""``nnhal serve``: one driver as a service on a Unix socket (docs/wire.md is the protocol).

Each client's messages are read and decoded in order by one reader at a time (so memories and
fences a message defines exist before the next message is read); on a call, the reader hands
the reading to another thread of the client's pool and runs the call itself, so a long prepare
or execution never blocks the client's other calls. Everything a client holds
(prepared models, bursts, executions, buffers, memories, fences, cache holds) sits in its own
:class:`ClientSession` tables and is dropped when it disconnects. All input is hostile: a message
that does not decode gets an ERROR reply with INVALID_ARGUMENT, one past a bound an ERROR
with RESOURCE_EXHAUSTED_*, one that breaks the framing drops that client; nothing a client
sends stops the service.
"""

from __future__ import annotations

import ctypes
import enum
import grp
import logging
import os
import pwd
import select
import signal
import socket
import stat
import struct
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nnhal.core.version import FeatureLevel
from nnhal.hal.fence import FenceState, SyncFence
from nnhal.hal.interfaces import (
    IDevice,
    IPreparedModel,
    IPreparedModelCallback,
)
from nnhal.hal.types import (
    NO_TIMING,
    ErrorStatus,
    ExecutionConfig,
    ExecutionPreference,
    MeasureTiming,
    OutputShape,
    PrepareModelConfig,
    Priority,
    Request,
    Timing,
)
from nnhal.hidl import IExecutionCallback, fmq
from nnhal.hidl import execute as execute_1_3
from nnhal.memory import SharedMemory
from nnhal.service import registration
from nnhal.service import wire as w
from nnhal.service.ring import ChannelPair, PacketTooLarge, RingClosed, RingError
from nnhal.service.transport import (
    Budget,
    Closed,
    Looker,
    OverBudget,
    Pace,
    Receiver,
    TimedOut,
    TooLarge,
    send_message,
)
from nnhal.service.wire import Kind, Reader, ResourceLimit, WireError, Writer

log = logging.getLogger("nnhal.service")

#: A test-only hook: seconds the service sleeps before each prepare, execution and burst
#: execution (read once at start; 0 in production, where it costs one comparison).
TEST_DELAY_ENV = "NNHAL_SERVICE_TEST_DELAY_S"


@dataclass(frozen=True)
class Limits:
    """The service's bounds (per client, but ``max_held``); past each, a clear error status
    or the connection closed (docs/wire.md, *Bounds of the service*)."""

    max_body: int = w.MAX_BODY
    max_outstanding: int = 64
    max_prepared: int = 256
    max_mapped: int = 4 << 30
    max_memories: int = 1024
    #: Clients connected at once (past it a new connection is told ERROR(call id 0,
    #: RESOURCE_EXHAUSTED_TRANSIENT) and closed: the client reports the service busy).
    max_clients: int = 64
    #: Seconds a message may go without a byte once its first came, and the least rate
    #: (bytes/s) it must keep after that (transport.Pace): past either the connection is
    #: closed (a warning names the client). Between messages a connection may idle for ever.
    partial_s: float = 30.0
    min_rate: float = 64 << 10
    #: Bytes held in incomplete message bodies over all clients together: a body that would
    #: pass it is read and dropped and its call answered RESOURCE_EXHAUSTED_TRANSIENT.
    max_held: int = 1 << 30

    def __post_init__(self) -> None:
        for name in ("partial_s", "min_rate"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 1e12:
                raise ValueError(f"Limits.{name}={v!r}: not a positive number")
        if isinstance(self.max_held, bool) or not isinstance(self.max_held, int) or \
                self.max_held <= 0:
            raise ValueError(f"Limits.max_held={self.max_held!r}: not a positive integer")


#: Environment defaults of ``nnhal serve``'s --partial-timeout, --min-rate, --max-held.
LIMIT_ENV = {"partial_s": "NNHAL_SERVE_PARTIAL_S", "min_rate": "NNHAL_SERVE_MIN_RATE",
             "max_held": "NNHAL_SERVE_MAX_HELD"}


#: Seconds a call runs before the watcher passes the reading on to let the client's next
#: message in (only when the client sent one meanwhile).
HANDOFF_S = 0.002

#: Seconds the reading thread keeps looking for a client's next message after a reply, at
#: least and at most. It looks when one of the client's two previous messages came within
#: NEXT_CALL_LOOK_MAX_S of a reply (one pause, e.g. the client working between two series of
#: calls, does not end the looking), for twice the longer of those two gaps (a look that
#: ends too early measures the next gap long, and so widens the next look), within these
#: bounds. A client calling back to back then finds the thread awake: waking a sleeping
#: thread (and an idle vCPU) costs tens of microseconds on a virtual machine each way,
#: several percent of a served MobileNet. A client's gap is its own work between two calls
#: plus both hand-overs: 60-250 us for a loop of MobileNet executions on this project's
#: 2-core VM, depending on whether the client itself was awake for the reply.
NEXT_CALL_LOOK_S = 150e-6
NEXT_CALL_LOOK_MAX_S = 1e-3

#: Seconds a send to a client may block (it does not read) before the client is dropped.
SEND_TIMEOUT_S = 5

_PM, _BURST, _EXEC, _BUFFER = "prepared model", "burst", "execution", "buffer"
_NONE, _INSUFFICIENT = ErrorStatus.NONE, ErrorStatus.OUTPUT_INSUFFICIENT_SIZE
_SYNC = Kind.EXECUTE_SYNCHRONOUSLY
_HEADER = w.HEADER


class _Fail(Exception):
    """A call refused before reaching the driver (bad handle, bound): the status to reply."""

    def __init__(self, status: ErrorStatus, why: str):
        super().__init__(why)
        self.status = status


class ClientSession:
    """One connected client: its tables, its reader and its call threads."""

    def __init__(self, service: Service, sock: socket.socket, peer: str):
        self.service = service
        self.device = service.device
        self.sock = sock
        self.receiver = Receiver(sock, pace=Pace(service.limits.partial_s,
                                                 service.limits.min_rate),
                                 budget=service.budget)
        self.peer = peer
        self.limits = service.limits
        self.send_lock = threading.Lock()
        self.lock = threading.Lock()
        self.handles: dict[int, tuple[str, Any]] = {}
        self.memories: dict[int, SharedMemory] = {}
        self.mapped = 0
        self.fences: dict[int, SyncFence] = {}  # waitFor fences the client will complete
        self.holds: dict[tuple[int, int], Any] = {}  # burst cache holds
        self.tokens: set[int] = set()  # memory-domain tokens this client allocated
        self.outstanding = 0
        self.next_handle = 1
        self.closed = False
        #: Execution messages already decoded, by their bytes (those that define no memory
        #: and carry no fds): a client repeating a request is not decoded again. Why: this is
        #: the service's check of what the client sent (a trust boundary: bytes equal to
        #: bytes that decoded strictly decode alike while the memories and tokens they name
        #: stay, so it is cleared when one goes); what the request means is the driver's to
        #: check, once per distinct request (PreparedModelBase._recent).
        self.decoded: dict[tuple[Kind, bytes], tuple] = {}
        #: The last message that ran the short way (_sync_again): its bytes with call id 0,
        #: and its key in ``decoded`` (which says whether it still decodes to the same call),
        #: for the thread that reads (run).
        self._again: tuple[bytes, tuple[Kind, bytes]] | None = None
        #: The reading thread's look for the client's next message (_look_for_next).
        self.looker = Looker()
        #: When the call being run by the thread that reads started (nobody reads meanwhile).
        self.unread_since: float | None = None
        #: Tells the watcher whether the client sent something (or hung up) during a call.
        self.poller = select.poll()
        self.poller.register(sock, select.POLLIN)
        # A client that stops reading must not block the driver's threads that notify it.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO,
                        struct.pack("ll", SEND_TIMEOUT_S, 0))
        self.calls = ThreadPoolExecutor(self.limits.max_outstanding + 1,
                                        thread_name_prefix="nnhal-call")

    # ---- tables ---------------------------------------------------------------------------
    def objects(self) -> int:
        with self.lock:
            return len(self.handles) + len(self.memories) + len(self.fences) + len(self.holds)

    def add(self, kind: str, obj: Any) -> int:
        with self.lock:
            if self.closed:
                raise _Fail(ErrorStatus.DEVICE_UNAVAILABLE, "client gone")
            if kind == _PM and sum(k == _PM for k, _ in self.handles.values()) >= \
                    self.limits.max_prepared:
                raise _Fail(ErrorStatus.RESOURCE_EXHAUSTED_PERSISTENT,
                            f"more than {self.limits.max_prepared} prepared models")
            h = self.next_handle
            self.next_handle = h + 1 if h < 0xFFFF_FFFF else 1
            self.handles[h] = (kind, obj)
            return h

    def get(self, kind: str, handle: int) -> Any:
        entry = self.handles.get(handle)
        if entry is None or entry[0] != kind:
            raise _Fail(ErrorStatus.INVALID_ARGUMENT, f"no {kind} of handle {handle}")
        return entry[1]

    def memory(self, ident: int) -> SharedMemory | None:
        return self.memories.get(ident)

    def token_filter(self, token: int) -> int:
        """A client may name only the buffers it allocated: another client's token is 0, which
        no buffer has (the driver then refuses the request as it would any bad token)."""
        return token if token in self.tokens else 0

    def release(self, handle: int) -> None:
        with self.lock:
            entry = self.handles.pop(handle, None)
            if entry is not None and entry[0] == _BURST:
                for key in [k for k in self.holds if k[0] == handle]:
                    self.holds.pop(key)
        if entry is not None and entry[0] == _BUFFER:
            self.tokens.discard(getattr(entry[1], "token", -1))
            self.decoded.clear()
            _close(entry[1])

    # ---- I/O ------------------------------------------------------------------------------
    def send(self, kind: int, call_id: int, writer: Writer | None = None) -> None:
        if writer is None:
            self.send_body(kind, call_id, b"")
        else:
            self.send_body(kind, call_id, writer.buf, writer.fds)

    def send_body(self, kind: int, call_id: int, body: bytes | bytearray,
                  fds: list[int] | tuple[()] = ()) -> None:
        with self.send_lock:
            if self.closed:
                return
            try:
                send_message(self.sock, kind, call_id, body, fds)
            except Closed:
                # Gone, or not reading for SEND_TIMEOUT_S: drop it (its reader ends, and
                # everything it held is released), so it cannot hold a driver thread.
                try:
                    self.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def error(self, call_id: int, status: ErrorStatus) -> None:
        wr = Writer()
        w.put_status(wr, status)
        self.send(Kind.ERROR, call_id, wr)

    def run(self) -> None:
        """Read messages in order and run each call right here: a quick call's reply then
        costs no thread hand-off. While a call runs, nobody reads; a call that may wait for
        the client (fenced) passes the reading to another thread first, and the service's
        watcher passes it on once a call has run HANDOFF_S and the client has sent more, so
        a long call never holds the client's next message for longer than about that. After
        a reply it looks for the next message a while before sleeping when the client came
        back quickly once of the last two times (NEXT_CALL_LOOK_S, NEXT_CALL_LOOK_MAX_S)."""
        done = True
        replied: float | None = None  # when this thread last replied
        # How long after a reply the client's last message came, and the one before (None:
        # not within NEXT_CALL_LOOK_MAX_S).
        gap: float | None = None
        was_gap: float | None = None
        try:
            while not self.closed:
                if replied is not None and (gap is not None or was_gap is not None) and \
                        not self.receiver.pending():
                    self._look_for_next(replied, max(gap or 0.0, was_gap or 0.0))
                again, got = self._again, None
                try:
                    if again is not None:
                        # The short way's message again, bar its call id: compared whole
                        # instead of cut out of the stream (Receiver.take).
                        got = self.receiver.take(again[0], 0, None, True)
                    if got is not None:
                        kind, call_id, body, fds = _SYNC, got[0], again[1][1], []
                    else:
                        kind, call_id, body, fds = self.receiver.next(self.limits.max_body,
                                                                      drop_large=False)
                except TooLarge as e:
                    # Refused before a byte of it is held; the rest of it is not read either:
                    # the connection ends (a client never sends past the bound).
                    log.info("%s: %s", self.peer, e)
                    self.error(e.call_id, ErrorStatus.RESOURCE_EXHAUSTED_PERSISTENT)
                    return
                except OverBudget as e:
                    # Read and dropped: the connection goes on. An event has no call to
                    # refuse (and ERROR with call id 0 ends a connection): it ends this one.
                    log.info("%s: %s", self.peer, e)
                    if e.kind not in w.CALLS:
                        self.error(0, ErrorStatus.RESOURCE_EXHAUSTED_TRANSIENT)
                        return
                    self.error(e.call_id, ErrorStatus.RESOURCE_EXHAUSTED_TRANSIENT)
                    continue
                except TimedOut as e:  # a client stopped inside a message
                    log.warning("%s: closed: %s", self.peer, e)
                    return
                except (Closed, WireError) as e:
                    log.debug("%s: disconnected: %s", self.peer, e)
                    return
                self.service.messages += 1
                if replied is not None:
                    took = time.perf_counter() - replied
                    was_gap, gap = gap, took if took < NEXT_CALL_LOOK_MAX_S else None
                    replied = None
                if kind is _SYNC and not fds:
                    key = again[1] if got is not None else (_SYNC, bytes(body))
                    args = self.decoded.get(key)
                    if args is not None:  # a repeated synchronous execution: the short way
                        if got is None:
                            self._again = (_HEADER.pack(w.MAGIC, w.VERSION, _SYNC, 0,
                                                        len(key[1]), 0, 0) + key[1], key)
                        del body
                        kept = self._sync_again(call_id, args)
                        if kept is False:
                            done = False  # the watcher gave the reading to another thread
                            return
                        if kept:
                            replied = time.perf_counter()
                        continue
                job = self.dispatch(kind, call_id, memoryview(body) if got is not None else body,
                                    fds)
                del body  # not held while waiting for the next message (Limits.max_held)
                if job is None:
                    continue
                if job[0] in _WAITS_FOR_CLIENT:
                    if not self._pass_reading():
                        return
                    done = False
                    self._call(*job)
                    return
                with self.lock:
                    self.unread_since = time.monotonic()
                self.service.watcher.arm(self)
                if not self._call(*job, reading=True):
                    done = False  # the watcher gave the reading to another thread meanwhile
                    return
                replied = time.perf_counter()
        finally:
            if done:
                self.close()

    def _sync_again(self, call_id: int, args: tuple) -> bool | None:
        """Run a synchronous execution whose message was decoded before (ClientSession.decoded)
        on the reading thread, in one piece: a repeated execution is the service's steady
        traffic, and after the driver's run its code runs with cold caches, where each step
        costs several times what it costs warm. What differs from dispatch and _call is only
        what is skipped (decoding, the Writer): the bound on outstanding calls
        (_admit), the handle's check (the handler's own, _execute_sync), the
        watcher's hand-off and the statuses of a refusal or a failure (_call) are theirs.
        None: refused (answered ERROR), else as _call's result."""
        if not self._admit(call_id, reading=True):
            return None
        return self._call(_SYNC, call_id, args, True, _execute_sync)

    def _look_for_next(self, since: float, gap: float) -> None:
        """Poll for the client's next message until twice ``gap`` (the client's recent
        return) after ``since``, within NEXT_CALL_LOOK_S and NEXT_CALL_LOOK_MAX_S, yielding
        the core between looks (the client may be waking on it)."""
        if not self.looker.wanted():
            return
        self.service.looks += 1
        look = min(NEXT_CALL_LOOK_MAX_S, max(NEXT_CALL_LOOK_S, 2 * gap))
        if self.looker.until(self.receiver.ready, since + look):
            self.service.found += 1

    def _pass_reading(self) -> bool:
        """Start another thread reading this client's messages; False when shut down."""
        try:
            self.calls.submit(self.run)
        except RuntimeError:  # shut down meanwhile: the client is gone
            return False
        return True

    def hand_off_when_due(self, now: float) -> float | None:
        """For the watcher, woken by a message during a call: pass the reading on once the
        call has run HANDOFF_S. Returns when to look again (the call is not due yet), or None
        (passed on, or nothing waits: the call ended, or a newer call armed the socket)."""
        with self.lock:
            since = self.unread_since
            if since is None or not (self.receiver.pending() or self.poller.poll(0)):
                return None
            if now - since < HANDOFF_S:
                return since + HANDOFF_S
            self.unread_since = None
        self._pass_reading()
        return None

    def dispatch(self, kind: Kind, call_id: int, body: memoryview, fds: list[int]
                 ) -> tuple[Kind, int, tuple] | None:
        """Decode one message; handle an event or a refusal here; a call to run: returned."""
        key = (kind, bytes(body)) if not fds and kind in _MEMO_KINDS else None
        args = self.decoded.get(key) if key is not None else None
        if args is not None:
            return (kind, call_id, args) if self._admit(call_id) else None
        room = self.limits.max_mapped - self.mapped
        r = Reader(body, fds, self.memory, max_new_bytes=room)
        try:
            decode = _DECODERS.get(kind)
            if decode is None:
                raise WireError(f"{kind.name} is not a message a client sends")
            args = decode(self, r)
            r.finish()
            if r.defined and len(self.memories) + len(r.defined) > self.limits.max_memories:
                _untake(args)
                raise ResourceLimit(f"more than {self.limits.max_memories} memories")
        except ResourceLimit as e:
            r.discard()
            log.info("%s: %s", self.peer, e)
            if kind in w.CALLS:
                self.error(call_id, ErrorStatus.RESOURCE_EXHAUSTED_PERSISTENT)
            return
        except Exception as e:  # noqa: BLE001 - a message that does not decode, whatever it is
            r.discard()
            log.info("%s: bad %s message: %s", self.peer, getattr(kind, "name", kind), e)
            if kind in w.CALLS:
                self.error(call_id, ErrorStatus.INVALID_ARGUMENT)
            return
        if kind in w.CALLS:
            # Refused here, before its memories are kept: a refused call defines nothing
            # (docs/wire.md).
            refusal = self._handle_refusal(kind, args)
            if refusal is not None:
                self.error(call_id, refusal)
            if refusal is not None or not self._admit(call_id):
                _untake(args)
                r.discard()
                return
            at = _FENCES_AT.get(kind)
            if at is not None:
                # Its waitFor fences are known from here, before the next message is read:
                # the call runs on another thread once the reading is passed on, and the
                # client's FENCE_STATE for a fence may be right behind the call.
                try:
                    args = (*args[:at], self.wait_fences(args[at]), *args[at + 1:])
                except _Fail as e:
                    log.info("%s: %s refused: %s", self.peer, kind.name, e)
                    with self.lock:
                        self.outstanding -= 1
                    self.error(call_id, e.status)
                    _untake(args)
                    r.discard()
                    return
        r.commit()
        with self.lock:
            for ident, mem in r.defined.items():
                self.memories[ident] = mem
                self.mapped += mem.size
        if kind not in w.CALLS:
            self._event(kind, args)
            return
        if key is not None and not r.defined:
            # The same bytes decode to the same call until a memory or token they name goes.
            if len(self.decoded) >= _MEMO_SIZE:
                self.decoded.clear()
            self.decoded[key] = args
        return kind, call_id, args

    def _admit(self, call_id: int, reading: bool = False) -> bool:
        """Count one more outstanding call, else refuse it past the bound (ERROR
        RESOURCE_EXHAUSTED_TRANSIENT; False): every call's one admission. ``reading``: the
        call runs on the thread that reads, from now (the watcher passes the reading on when
        it runs long and the client sends more meanwhile)."""
        with self.lock:
            refused = self.outstanding >= self.limits.max_outstanding
            if not refused:
                self.outstanding += 1
                if reading:
                    self.unread_since = time.monotonic()
        if refused:
            self.error(call_id, ErrorStatus.RESOURCE_EXHAUSTED_TRANSIENT)
            return False
        if reading:
            self.service.watcher.arm(self)
        return True

    def _handle_refusal(self, kind: Kind, args: tuple) -> ErrorStatus | None:
        """INVALID_ARGUMENT when a call names a handle that is not one of this client's of
        the right kind (the handler would refuse it too, but after its memories were kept)."""
        which = _HANDLE_KIND.get(kind)
        if which is None:
            return None
        handles = args[1] if kind == Kind.ALLOCATE else (args[0],)
        with self.lock:
            for h in handles:
                entry = self.handles.get(h)
                if entry is None or entry[0] != which:
                    log.info("%s: %s refused: no %s of handle %d", self.peer, kind.name,
                             which, h)
                    return ErrorStatus.INVALID_ARGUMENT
        return None

    def _call(self, kind: Kind, call_id: int, args: tuple, reading: bool = False,
              handler: Callable[..., Writer | bytes | None] | None = None) -> bool:
        """Run one call (its slot taken) and reply: every call's one way from its handler to
        its answer. ``handler``: in place of the kind's (_HANDLERS); it returns the reply (a
        Writer, or the body's bytes) or None (it answered itself). A handler that raises
        _Fail was refused (its status, INVALID_ARGUMENT for a handle not of this client's
        of the right kind); any other exception is GENERAL_FAILURE: either goes back as
        ERROR. ``reading``: the caller is the thread that reads, which stops counting as
        busy before the reply (the client's next message, sent on the reply, must not look
        to the watcher like one waiting behind a long call); returns whether it still reads
        (False: the watcher passed the reading on)."""
        reply: Writer | bytes | None = None
        status = _NONE
        kept = True
        try:
            reply = (handler or _HANDLERS[kind])(self, call_id, *args)
        except _Fail as e:
            log.info("%s: %s refused: %s", self.peer, kind.name, e)
            status = e.status
        except Exception as e:  # noqa: BLE001 - a driver or encoding failure is a status
            log.warning("%s: %s failed: %s: %s", self.peer, kind.name, type(e).__name__, e)
            status = ErrorStatus.GENERAL_FAILURE
        finally:
            # Before replying: a client that calls again on the reply is not "too many".
            with self.lock:
                self.outstanding -= 1
                if reading:
                    kept, self.unread_since = self.unread_since is not None, None
                    if kept:  # still the reader: nobody else can have armed it meanwhile
                        self.service.watcher.disarm(self)
        if status is not _NONE:
            self.error(call_id, status)
        elif type(reply) is bytes:
            self.send_body(Kind.REPLY, call_id, reply)
        elif reply is not None:
            self.send(Kind.REPLY, call_id, reply)  # type: ignore[arg-type]
        return kept

    def _event(self, kind: Kind, args: tuple) -> None:
        if kind == Kind.FENCE_STATE:
            fence_id, state, _info = args
            with self.lock:
                fence = self.fences.pop(fence_id, None)
            if fence is not None:
                fence.signal() if state == w.FENCE_SIGNALED else fence.set_error()
        elif kind == Kind.RELEASE:
            for h in args[0]:
                self.release(h)
        elif kind == Kind.FORGET:
            self.decoded.clear()
            with self.lock:
                for ident in args[0]:
                    mem = self.memories.pop(ident, None)
                    if mem is not None:
                        self.mapped -= mem.size
        elif kind == Kind.BURST_UNCACHE:
            with self.lock:
                hold = self.holds.pop((args[0], args[1]), None)
            _release_hold(hold)

    def close(self) -> None:
        """Drop everything the client held (the count goes back to zero)."""
        with self.send_lock:
            with self.lock:
                if self.closed:
                    return
                self.closed = True
                fences = list(self.fences.values())
                handles = list(self.handles.values())
                holds = list(self.holds.values())
                self.fences.clear()
                self.handles.clear()
                self.holds.clear()
                self.memories.clear()
                self.mapped = 0
                self.tokens.clear()
                self.decoded.clear()
            self.service.watcher.remove(self)
            try:
                # Shut down first: a thread blocked reading this socket keeps it open through
                # a bare close, and the client would never see the end.
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                self.sock.close()
            except OSError:
                pass
            self.receiver.close()
        for f in fences:  # an execution waiting on the client's fence fails, never hangs
            f.set_error()
        for hold in holds:
            _release_hold(hold)
        for kind, obj in handles:
            if kind == _BUFFER:
                _close(obj)
        self.calls.shutdown(wait=False)
        self.service._gone(self)

    # ---- fences ---------------------------------------------------------------------------
    def wait_fences(self, specs: list[tuple[int, int]]) -> list[SyncFence]:
        """A fenced call's waitFor fences, those still active registered for the client's
        FENCE_STATE (by the thread that reads, as the call is decoded: see dispatch); all or
        none (_Fail for an id in use or given twice)."""
        fences, active = [], {}
        for fence_id, state in specs:
            fence = SyncFence()
            if state == w.FENCE_SIGNALED:
                fence.signal()
            elif state == w.FENCE_ERROR:
                fence.set_error()
            elif fence_id in active:
                raise _Fail(ErrorStatus.INVALID_ARGUMENT, "fence id given twice")
            else:
                active[fence_id] = fence
            fences.append(fence)
        if active:
            with self.lock:
                if not self.fences.keys().isdisjoint(active):
                    raise _Fail(ErrorStatus.INVALID_ARGUMENT, "fence id reused")
                self.fences.update(active)
        return fences

    def fenced_reply(self, call_id: int, result: tuple) -> None:
        status, fence, callback = result
        wr = Writer()
        if status != ErrorStatus.NONE or fence is None:
            w.put_status(wr, status if status != ErrorStatus.NONE else
                         ErrorStatus.GENERAL_FAILURE)
            wr.u8(0)
            self.send(Kind.REPLY, call_id, wr)
            return
        fence_id = self.service.new_fence_id()
        w.put_status(wr, ErrorStatus.NONE)
        wr.u8(1)
        wr.u64(fence_id)
        has_fd = fence.fileno() >= 0
        wr.u8(1 if has_fd else 0)
        if has_fd:
            wr.fd(fence.fileno())
        self.send(Kind.REPLY, call_id, wr)

        def done(f: SyncFence) -> None:  # after the reply: the client knows the id by then
            info = None
            if callback is not None:
                try:
                    info = callback.get_execution_info()
                except Exception:  # noqa: BLE001
                    info = (ErrorStatus.GENERAL_FAILURE, NO_TIMING, NO_TIMING)
            ev = Writer()
            w.put_fence_state(ev, fence_id, w.FENCE_SIGNALED if f.state == FenceState.SIGNALED
                              else w.FENCE_ERROR, info)
            self.send(Kind.FENCE_STATE, 0, ev)

        fence.add_done_callback(done)


def _close(obj: Any) -> None:
    close = getattr(obj, "close", None)
    if callable(close):
        try:
            close()
        except Exception:  # noqa: BLE001
            pass


def _release_hold(hold: Any) -> None:
    release = getattr(hold, "release", None)
    if callable(release):
        try:
            release()
        except Exception:  # noqa: BLE001
            pass


# ---- callbacks that cross back -------------------------------------------------------------

class _PreparedCallback(IPreparedModelCallback):
    """Sends NOTIFY_PREPARED once; closes the call's cache descriptors after notifying."""

    def __init__(self, session: ClientSession, call_id: int, fds: list[int]):
        self.session, self.call_id, self.fds = session, call_id, fds
        self.lock = threading.Lock()
        self.done = False

    def notify(self, status: ErrorStatus, prepared_model: IPreparedModel | None) -> None:
        with self.lock:
            if self.done:
                return
            self.done = True
        s = self.session
        if s.service.test_delay:
            time.sleep(s.service.test_delay)
        handle = None
        status = ErrorStatus(status)
        if status == ErrorStatus.NONE and prepared_model is not None:
            try:
                handle = s.add(_PM, prepared_model)
            except _Fail as e:
                status = e.status
        elif status == ErrorStatus.NONE:
            status = ErrorStatus.GENERAL_FAILURE
        wr = Writer()
        w.put_status(wr, status)
        wr.u8(0 if handle is None else 1)
        if handle is not None:
            wr.u32(handle)
        s.send(Kind.NOTIFY_PREPARED, self.call_id, wr)
        w.close_fds(self.fds)
        self.fds = []


class _ExecutionCallback(IExecutionCallback):
    def __init__(self, session: ClientSession, call_id: int):
        self.session, self.call_id = session, call_id
        self.lock = threading.Lock()
        self.done = False

    def notify(self, status: ErrorStatus, output_shapes: list[OutputShape],
               timing: Timing) -> None:
        with self.lock:
            if self.done:
                return
            self.done = True
        if self.session.service.test_delay:
            time.sleep(self.session.service.test_delay)
        wr = Writer()
        try:
            w.put_status(wr, status)
            w.put_shapes(wr, output_shapes)
            w.put_timing(wr, timing)
        except (WireError, ValueError):
            wr = Writer()
            w.put_status(wr, ErrorStatus.GENERAL_FAILURE)
            w.put_shapes(wr, [])
            w.put_timing(wr, NO_TIMING)
        self.session.send(Kind.NOTIFY_EXECUTION, self.call_id, wr)


# ---- bursts on shared-memory rings ---------------------------------------------------------

#: Bursts served on rings per client; past it a burst is configured without rings (its
#: executions use BURST_EXECUTE) rather than refused: each costs a thread and two mappings.
MAX_RING_BURSTS = 64
#: The largest ring a client may give (each record is copied out whole: this bounds what a
#: client makes the service allocate; the client's rings are 64 KiB).
MAX_RING_CAPACITY = 1 << 20
#: Polls of the request ring before the serving thread sleeps (ring.py's default).
RING_SPIN = 2000
#: Decoded request packets a burst keeps (a burst repeats a handful of requests).
_DECODED_MAX = 16
_NO_SHAPES: list[OutputShape] = []


class _RingBurst:
    """A driver burst whose executions arrive on a request ring and leave on a result ring.

    One thread per burst reads a record (docs/fmq.md: a burst header, then an FMQ request
    packet), maps its pool identifiers to the client's memories, runs the driver's burst and
    writes the result record. Everything in the rings is hostile: a record that is not a burst
    request, or a packet that does not decode strictly, gets an INVALID_ARGUMENT result flagged
    CLOSING and ends the thread (the client then uses the socket); nothing ends the service.
    The thread also ends when the burst is released or the client leaves (``alive`` is polled
    while it sleeps), and closes the rings. The socket calls on the burst (BURST_EXECUTE,
    BURST_CACHE, BURST_CREATE_REUSABLE, BURST_EXECUTE_WITH_CONFIG) reach the driver's burst
    through the same methods.
    """

    def __init__(self, session: ClientSession, burst: Any, pair: ChannelPair):
        self.session, self.burst, self.pair = session, burst, pair
        self.handle = 0
        # packet bytes -> (request with its pools, ((slot, memory), ...), measure): the rings'
        # counterpart of ClientSession.decoded (the packet decoded strictly once per bytes,
        # its memories checked to be the same each time)
        self._decoded: dict[bytes, tuple[Request, tuple, Any]] = {}
        # (status, shapes, timing, packet) of the last result packed: a burst's results
        # repeat, and packing is the service's work per result (as _last_reply on the socket)
        self._last_result: tuple[Any, list[OutputShape], Any, bytes] | None = None

    # the IBurst calls that still come over the socket
    def execute(self, *args: Any) -> Any:
        return self.burst.execute(*args)

    def cache_memory(self, memory: Any) -> Any:
        return self.burst.cache_memory(memory)

    def create_reusable_execution(self, *args: Any) -> Any:
        return self.burst.create_reusable_execution(*args)

    def execute_with_config(self, *args: Any) -> Any:
        return self.burst.execute_with_config(*args)

    def start(self, handle: int) -> None:
        self.handle = handle
        threading.Thread(target=self.run, name=f"nnhal-burst {self.session.peer} {handle}",
                         daemon=True).start()

    def alive(self) -> bool:
        """False once the burst is released or the client is gone."""
        s = self.session
        entry = s.handles.get(self.handle)
        return not s.closed and entry is not None and entry[1] is self

    def run(self) -> None:
        requests, results = self.pair.server_side()
        alive = self.alive
        try:
            while True:
                try:
                    record = requests.read(alive=alive)
                except RingClosed:
                    return
                except RingError as e:  # the client wrote something that is not a record
                    log.info("%s: burst %d: %s", self.session.peer, self.handle, e)
                    results.write(self._closing(0), alive=alive)
                    return
                try:
                    out, closing = self._serve(record)
                except Exception as e:  # noqa: BLE001 - the client must not wait forever
                    log.warning("%s: burst %d failed: %s: %s", self.session.peer,
                                self.handle, type(e).__name__, e)
                    out, closing = self._closing(0, ErrorStatus.GENERAL_FAILURE), True
                try:
                    results.write(out, alive=alive)
                except PacketTooLarge:  # shapes past the result ring: a failure, not a hang
                    seq = w.BURST_RESULT.unpack_from(out)[2]
                    results.write(self._result(seq, ErrorStatus.GENERAL_FAILURE, _NO_SHAPES,
                                               NO_TIMING), alive=alive)
                if closing:
                    return
        except RingError:  # the result ring is unusable or the client left: nothing to tell
            pass
        except Exception as e:  # noqa: BLE001 - never the service's end
            log.warning("%s: burst %d failed: %s: %s", self.session.peer, self.handle,
                        type(e).__name__, e)
        finally:
            self.pair.close()
            self._decoded.clear()

    @staticmethod
    def _closing(seq: int, status: ErrorStatus = ErrorStatus.INVALID_ARGUMENT) -> bytes:
        """The last result record: ``status``, and no more requests are read."""
        return w.BURST_RESULT.pack(w.BURST_RESULT_TAG, w.BURST_CLOSING, seq) + \
            fmq.pack_result(status, _NO_SHAPES, NO_TIMING)

    def _serve(self, record: bytes) -> tuple[bytes, bool]:
        """(result record, whether the burst ends) of one request record."""
        hdr = w.BURST_REQUEST
        if len(record) < hdr.size:
            log.info("%s: burst %d: a record of %d bytes", self.session.peer, self.handle,
                     len(record))
            return self._closing(0), True
        tag, flags, seq, deadline, loop = hdr.unpack_from(record)
        if tag != w.BURST_REQUEST_TAG or flags & ~3 or \
                (deadline and not flags & w.BURST_HAS_DEADLINE) or \
                (loop and not flags & w.BURST_HAS_LOOP_TIMEOUT):
            log.info("%s: burst %d: bad request header", self.session.peer, self.handle)
            return self._closing(seq), True
        packet = record[hdr.size:]
        memories = self.session.memories
        entry = self._decoded.get(packet)
        if entry is not None:
            for slot, mem in entry[1]:
                if memories.get(slot) is not mem:  # forgotten since: decode afresh
                    entry = None
                    break
        if entry is None:
            try:
                req, slots, measure = fmq.unpack_request(packet)
            except fmq.FmqDecodeError as e:
                log.info("%s: burst %d: %s", self.session.peer, self.handle, e)
                return self._closing(seq), True
            pools = []
            for slot in slots:
                mem = memories.get(slot)
                if mem is None:  # neither cached nor sent on this connection: refused
                    return self._result(seq, ErrorStatus.INVALID_ARGUMENT, _NO_SHAPES,
                                        NO_TIMING), False
                pools.append(mem)
            entry = (Request(req.inputs, req.outputs, pools), tuple(zip(slots, pools)),
                     measure)
            if len(self._decoded) >= _DECODED_MAX:
                self._decoded.clear()
            self._decoded[packet] = entry
        _delay(self.session)
        try:
            status, shapes, timing = self.burst.execute(
                entry[0], entry[2], deadline if flags & w.BURST_HAS_DEADLINE else None,
                loop if flags & w.BURST_HAS_LOOP_TIMEOUT else None)
        except Exception as e:  # noqa: BLE001 - a driver failure is a status
            log.warning("%s: burst %d: driver failed: %s: %s", self.session.peer, self.handle,
                        type(e).__name__, e)
            status, shapes, timing = ErrorStatus.GENERAL_FAILURE, _NO_SHAPES, NO_TIMING
        return self._result(seq, status, shapes, timing), False

    def _result(self, seq: int, status: Any, shapes: Any, timing: Any) -> bytes:
        if status != ErrorStatus.NONE and status != ErrorStatus.OUTPUT_INSUFFICIENT_SIZE:
            shapes = _NO_SHAPES
        last = self._last_result
        if _repeats(last, status, shapes, timing):  # a burst's results repeat too
            packet = last[3]  # type: ignore[index]
        else:
            try:
                packet = fmq.pack_result(status, shapes, timing)
                self._last_result = (status, _copy_shapes(shapes), timing, packet)
            except (fmq.FmqEncodeError, TypeError, ValueError):
                packet = fmq.pack_result(ErrorStatus.GENERAL_FAILURE, _NO_SHAPES, NO_TIMING)
        return w.BURST_RESULT.pack(w.BURST_RESULT_TAG, 0, seq) + packet


def _copy_shapes(shapes: Any) -> list[OutputShape]:
    """A private copy (OutputShape is mutable): what the cached packet encodes."""
    return [OutputShape(list(s.dimensions), bool(s.is_sufficient)) for s in shapes]


# ---- decoding (reader thread) ----------------------------------------------------------------

def _fence_specs(r: Reader) -> list[tuple[int, int]]:
    specs = []
    for _ in range(r.count("waitFor", 10)):
        fence_id = r.u64()
        state = r.tag(w.FENCE_ERROR, "fence state")
        if r.bool():
            os.close(r.fd("fence"))  # the readiness mirror: the state comes as FENCE_STATE
        specs.append((fence_id, state))
    return specs


def _exec_args(s: ClientSession, r: Reader) -> tuple:
    return (r.u32(), w.get_request(r, s.token_filter), _measure(r), r.opt_i64("deadline"),
            r.opt_i64("loopTimeout"))


_DECODERS: dict[Kind, Callable[[ClientSession, Reader], tuple]] = {
    Kind.GET_CAPABILITIES: lambda s, r: (),
    Kind.GET_TYPE: lambda s, r: (),
    Kind.GET_VERSION_STRING: lambda s, r: (),
    Kind.GET_SUPPORTED_EXTENSIONS: lambda s, r: (),
    Kind.GET_NUMBER_OF_CACHE_FILES: lambda s, r: (),
    Kind.GET_SUPPORTED_OPERATIONS: lambda s, r: (w.get_model(r),),
    Kind.PREPARE_MODEL: lambda s, r: (w.get_model(r), _enum(ExecutionPreference, r.i32()),
                                      _enum(Priority, r.i32()), r.opt_i64("deadline"),
                                      w.get_handles(r, "modelCache"),
                                      w.get_handles(r, "dataCache"), w.get_token(r)),
    Kind.PREPARE_MODEL_FROM_CACHE: lambda s, r: (r.opt_i64("deadline"),
                                                 w.get_handles(r, "modelCache"),
                                                 w.get_handles(r, "dataCache"),
                                                 w.get_token(r)),
    Kind.ALLOCATE: lambda s, r: (w.get_buffer_desc(r), r.u32s("preparedModels"),
                                 [w.get_role(r) for _ in range(r.count("inputRoles", 16))],
                                 [w.get_role(r) for _ in range(r.count("outputRoles", 16))]),
    Kind.EXECUTE: _exec_args,
    Kind.EXECUTE_SYNCHRONOUSLY: _exec_args,
    Kind.EXECUTE_FENCED: lambda s, r: (r.u32(), w.get_request(r, s.token_filter),
                                       _fence_specs(r), _measure(r), r.opt_i64("deadline"),
                                       r.opt_i64("loopTimeout"), r.opt_i64("duration")),
    Kind.CONFIGURE_BURST: lambda s, r: (r.u32(),),
    Kind.CONFIGURE_BURST_RINGS: lambda s, r: _ring_args(r),
    Kind.CREATE_REUSABLE: lambda s, r: (r.u32(), w.get_request(r, s.token_filter), _measure(r),
                                        r.opt_i64("loopTimeout")),
    Kind.BURST_EXECUTE: _exec_args,
    Kind.BURST_CREATE_REUSABLE: lambda s, r: (r.u32(), w.get_request(r, s.token_filter),
                                              _measure(r), r.opt_i64("loopTimeout")),
    Kind.BURST_CACHE: lambda s, r: (r.u32(), _memory_with_id(r)),
    Kind.COMPUTE: lambda s, r: (r.u32(), r.opt_i64("deadline")),
    Kind.COMPUTE_FENCED: lambda s, r: (r.u32(), _fence_specs(r), r.opt_i64("deadline"),
                                       r.opt_i64("timeoutAfterFence")),
    Kind.COPY_TO: lambda s, r: (r.u32(), r.memory()),
    Kind.COPY_FROM: lambda s, r: (r.u32(), r.memory(), r.u32s("dimensions")),
    Kind.FENCE_STATE: lambda s, r: w.get_fence_state(r),
    Kind.RELEASE: lambda s, r: (r.u32s("handles"),),
    Kind.FORGET: lambda s, r: ([r.u64() for _ in range(r.count("memories", 8))],),
    Kind.BURST_UNCACHE: lambda s, r: (r.u32(), r.u64()),
    Kind.GET_FEATURE_LEVEL: lambda s, r: (),
    Kind.PREPARE_MODEL_WITH_CONFIG: lambda s, r: (w.get_model(r), w.get_prepare_config(r)),
    Kind.EXECUTE_SYNCHRONOUSLY_WITH_CONFIG: lambda s, r: (
        r.u32(), w.get_request(r, s.token_filter), w.get_execution_config(r),
        r.opt_i64("deadline")),
    Kind.EXECUTE_FENCED_WITH_CONFIG: lambda s, r: (
        r.u32(), w.get_request(r, s.token_filter), _fence_specs(r), w.get_execution_config(r),
        r.opt_i64("deadline"), r.opt_i64("duration")),
    Kind.CREATE_REUSABLE_WITH_CONFIG: lambda s, r: (
        r.u32(), w.get_request(r, s.token_filter), w.get_execution_config(r)),
    Kind.BURST_EXECUTE_WITH_CONFIG: lambda s, r: (
        r.u32(), w.get_request(r, s.token_filter), w.get_execution_config(r),
        r.opt_i64("deadline")),
}


def _untake(args: tuple) -> None:
    """A decoded message refused before its call: its descriptors are closed with the
    message (Reader.discard), so the ring descriptors' own closer must not close them."""
    for a in args:
        if isinstance(a, _RingFds):
            a.take()


class _RingFds:
    """The four ring descriptors of a CONFIGURE_BURST_RINGS message, closed unless taken (a
    call refused after decoding, e.g. too many outstanding, must not leak them)."""

    def __init__(self, fds: list[int]):
        self._fin = weakref.finalize(self, w.close_fds, fds)
        self._fin.atexit = False
        self._fds = fds

    def take(self) -> list[int]:
        self._fin.detach()
        return self._fds

    def close(self) -> None:
        self._fin()


def _ring_args(r: Reader) -> tuple[int, _RingFds]:
    pm = r.u32()
    fds = [r.fd("burst ring") for _ in range(4)]
    r.finish()  # nothing can fail after this: the descriptors are the call's from here
    return pm, _RingFds(fds)


def _memory_with_id(r: Reader) -> tuple[int, SharedMemory]:
    """A memory and its connection id (a burst caches it under that id)."""
    start = r.pos
    tag = r.tag(w.MEM_KNOWN, "memory")
    ident = r.u64()
    r.pos = start
    del tag
    return ident, r.memory()


# ---- calls (call threads) ----------------------------------------------------------------------

#: The last execution reply packed, but its timing: (status, shapes (a private copy), None,
#: the bytes before the timing). Why: a repeated execution's status and shapes repeat, while a
#: measured one's timing changes every time, so the timing is packed afresh (16 bytes) and the
#: rest reused; the encoding is the work saved (the request itself is decoded once per bytes
#: in ClientSession.decoded and checked by the driver). One tuple replaced whole, so threads
#: may share it.
_last_reply: tuple[Any, list[OutputShape], None, bytes] | None = None


def _repeats(last: tuple | None, status: Any, shapes: Any, timing: Any) -> bool:
    """``last`` (status, shapes, timing, packed) holds this very result: the same status and
    timing (None: not compared), and a list of OutputShape with the same int dimensions and
    flags, so that it packs to the same bytes (a burst's ring results and the socket's replies
    alike)."""
    if last is None or last[0] is not status or \
            not (timing is last[2] or (type(timing) is Timing and timing == last[2])) or \
            type(shapes) is not list or len(shapes) != len(last[1]):
        return False
    for s, k in zip(shapes, last[1]):
        if type(s) is not OutputShape or type(s.dimensions) is not list or \
                s.dimensions != k.dimensions or bool(s.is_sufficient) is not k.is_sufficient:
            return False
        for d in s.dimensions:
            if type(d) is not int:
                return False
    return True


def _shapes_body(result: tuple) -> bytes:
    """The reply body of an execution's result (status, shapes, timing)."""
    global _last_reply
    status, shapes, timing = result
    if status is not _NONE and status not in (_NONE, _INSUFFICIENT):
        shapes = []
    last = _last_reply
    if type(timing) is Timing and _repeats(last, status, shapes, None):
        try:
            return last[3] + w.TIMING.pack(timing.time_on_device,  # type: ignore[index]
                                           timing.time_in_driver)
        except struct.error:  # out of range: refused the checked way below
            pass
    packed = w.pack_shapes_result(status, shapes, timing)
    if type(status) is ErrorStatus and type(timing) is Timing and type(shapes) is list and \
            all(type(x) is OutputShape and type(x.dimensions) is list for x in shapes):
        _last_reply = (status, _copy_shapes(shapes), None, packed[:-w.TIMING.size])
    return packed


def _shapes_reply(result: tuple) -> Writer:
    wr = Writer()
    wr.buf += _shapes_body(result)
    return wr


def _status_reply(status: Any) -> Writer:
    wr = Writer()
    w.put_status(wr, status)
    return wr


def _handle_reply(s: ClientSession, kind: str, result: tuple) -> Writer:
    status, obj = result
    wr = Writer()
    if status == ErrorStatus.NONE and obj is not None:
        handle = s.add(kind, obj)
        w.put_status(wr, status)
        wr.u8(1)
        wr.u32(handle)
    else:
        w.put_status(wr, status if status != ErrorStatus.NONE else ErrorStatus.GENERAL_FAILURE)
        wr.u8(0)
    return wr


def _delay(s: ClientSession) -> None:
    if s.service.test_delay:
        time.sleep(s.service.test_delay)


def _get_capabilities(s: ClientSession, cid: int) -> Writer:
    status, caps = s.device.get_capabilities()
    wr = Writer()
    w.put_status(wr, status)
    wr.u8(0 if caps is None else 1)
    if caps is not None:
        w.put_capabilities(wr, caps)
    return wr


def _get_supported(s: ClientSession, cid: int, model: Any) -> Writer:
    status, supported = s.device.get_supported_operations(model)
    wr = Writer()
    w.put_status(wr, status)
    for b in wr.count(supported, "supported"):
        wr.bool(b)
    return wr


def _get_type(s: ClientSession, cid: int) -> Writer:
    status, t = s.device.get_type()
    wr = Writer()
    w.put_status(wr, status)
    wr.u32(t)
    return wr


def _get_version(s: ClientSession, cid: int) -> Writer:
    status, v = s.device.get_version_string()
    wr = Writer()
    w.put_status(wr, status)
    wr.str(v)
    return wr


def _get_extensions(s: ClientSession, cid: int) -> Writer:
    status, exts = s.device.get_supported_extensions()
    wr = Writer()
    w.put_status(wr, status)
    for e in wr.count(exts, "extensions"):
        w.put_extension(wr, e)
    return wr


def _get_cache_files(s: ClientSession, cid: int) -> Writer:
    status, n_model, n_data = s.device.get_number_of_cache_files_needed()
    wr = Writer()
    w.put_status(wr, status)
    wr.u32(n_model)
    wr.u32(n_data)
    return wr


def _prepare(s: ClientSession, cid: int, model: Any, preference: int, priority: int,
             deadline: int | None, mc: list[int], dc: list[int], token: bytes | None) -> Writer:
    cb = _PreparedCallback(s, cid, [fd for fd in mc + dc if fd >= 0])
    try:
        launch = s.device.prepare_model(model, preference, priority, deadline, mc, dc, token,
                                        cb)
    except Exception:  # noqa: BLE001
        launch = ErrorStatus.GENERAL_FAILURE
    if launch != ErrorStatus.NONE:
        cb.notify(launch, None)  # the HAL notifies on a failed launch: exactly once here
    return _status_reply(launch)


def _prepare_from_cache(s: ClientSession, cid: int, deadline: int | None, mc: list[int],
                        dc: list[int], token: bytes | None) -> Writer:
    cb = _PreparedCallback(s, cid, [fd for fd in mc + dc if fd >= 0])
    try:
        launch = s.device.prepare_model_from_cache(deadline, mc, dc, token, cb)
    except Exception:  # noqa: BLE001
        launch = ErrorStatus.GENERAL_FAILURE
    if launch != ErrorStatus.NONE:
        cb.notify(launch, None)
    return _status_reply(launch)


def _allocate(s: ClientSession, cid: int, desc: Any, pms: list[int], ins: list, outs: list
              ) -> Writer:
    models = [s.get(_PM, h) for h in pms]
    status, buffer, token = s.device.allocate(desc, models, ins, outs)
    wr = Writer()
    if status == ErrorStatus.NONE and buffer is not None:
        handle = s.add(_BUFFER, buffer)
        s.tokens.add(int(token))
        s.decoded.clear()
        w.put_status(wr, status)
        wr.u8(1)
        wr.u32(handle)
        wr.u32(token)
    else:
        w.put_status(wr, status if status != ErrorStatus.NONE else ErrorStatus.GENERAL_FAILURE)
        wr.u8(0)
    return wr


def _execute(s: ClientSession, cid: int, pm: int, request: Any, measure: int,
             deadline: int | None, loop: int | None) -> Writer:
    prepared = s.get(_PM, pm)
    cb = _ExecutionCallback(s, cid)
    try:  # the HIDL face's call over the served (canonical) prepared model
        launch = execute_1_3(prepared, request, measure, deadline, loop, cb)
    except Exception:  # noqa: BLE001
        launch = ErrorStatus.GENERAL_FAILURE
    if launch != ErrorStatus.NONE:
        cb.notify(launch, [], NO_TIMING)
    return _status_reply(launch)


def _execute_sync(s: ClientSession, cid: int, pm: int, request: Any, measure: int,
                  deadline: int | None, loop: int | None) -> bytes:
    """The reply body as bytes (no Writer): also the short way's handler (_sync_again)."""
    prepared = s.get(_PM, pm)
    if s.service.test_delay:  # (_delay inline: a call less on every repeated execution)
        time.sleep(s.service.test_delay)
    return _shapes_body(prepared.execute_synchronously(request, measure, deadline, loop))


def _execute_fenced(s: ClientSession, cid: int, pm: int, request: Any,
                    fences: list[SyncFence], measure: int, deadline: int | None,
                    loop: int | None, duration: int | None) -> None:
    prepared = s.get(_PM, pm)
    s.fenced_reply(cid, prepared.execute_fenced(request, fences, measure, deadline, loop,
                                                duration))


def _configure_burst(s: ClientSession, cid: int, pm: int) -> Writer:
    return _handle_reply(s, _BURST, s.get(_PM, pm).configure_execution_burst())


def _configure_burst_rings(s: ClientSession, cid: int, pm: int, ring_fds: _RingFds) -> Writer:
    try:
        prepared = s.get(_PM, pm)
        with s.lock:
            served = sum(type(o) is _RingBurst for _, o in s.handles.values())
        pair = None
        if served < MAX_RING_BURSTS:
            try:
                pair = ChannelPair.attach(ring_fds.take(), spin=RING_SPIN)
                if max(pair.request.capacity, pair.result.capacity) > MAX_RING_CAPACITY:
                    pair.close()
                    raise RingError(f"ring capacity past {MAX_RING_CAPACITY}")
            except RingError as e:  # not a pair of rings: the peer is broken or hostile
                log.info("%s: burst rings refused: %s", s.peer, e)
                raise _Fail(ErrorStatus.INVALID_ARGUMENT, str(e)) from None
    finally:
        ring_fds.close()  # a no-op once taken
    try:
        status, burst = prepared.configure_execution_burst()
        wr = Writer()
        if status != ErrorStatus.NONE or burst is None:
            w.put_status(wr, status if status != ErrorStatus.NONE else
                         ErrorStatus.GENERAL_FAILURE)
            wr.u8(0)
            return wr
        served_burst = _RingBurst(s, burst, pair) if pair is not None else burst
        handle = s.add(_BURST, served_burst)
    except BaseException:
        if pair is not None:
            pair.close()
        raise
    if pair is not None:
        served_burst.start(handle)  # type: ignore[union-attr]
    w.put_status(wr, ErrorStatus.NONE)
    wr.u8(1)
    wr.u32(handle)
    wr.u8(1 if pair is not None else 0)
    return wr


def _create_reusable(s: ClientSession, cid: int, pm: int, request: Any, measure: int,
                     loop: int | None) -> Writer:
    return _handle_reply(s, _EXEC, s.get(_PM, pm).create_reusable_execution(request, measure,
                                                                             loop))


def _burst_execute(s: ClientSession, cid: int, burst: int, request: Any, measure: int,
                   deadline: int | None, loop: int | None) -> Writer:
    b = s.get(_BURST, burst)
    _delay(s)
    return _shapes_reply(b.execute(request, measure, deadline, loop))


def _burst_reusable(s: ClientSession, cid: int, burst: int, request: Any, measure: int,
                    loop: int | None) -> Writer:
    return _handle_reply(s, _EXEC, s.get(_BURST, burst).create_reusable_execution(
        request, measure, loop))


def _burst_cache(s: ClientSession, cid: int, burst: int, mem: tuple[int, SharedMemory]) -> Writer:
    b = s.get(_BURST, burst)
    ident, memory = mem
    hold = b.cache_memory(memory)
    if hold is None:
        return _status_reply(ErrorStatus.INVALID_ARGUMENT)
    with s.lock:
        if s.closed or burst not in s.handles:
            stale = hold
        else:
            stale = s.holds.get((burst, ident))
            s.holds[(burst, ident)] = hold
    if stale is not None and stale is not hold:
        _release_hold(stale)
    return _status_reply(ErrorStatus.NONE)


def _compute(s: ClientSession, cid: int, ex: int, deadline: int | None) -> Writer:
    execution = s.get(_EXEC, ex)
    _delay(s)
    return _shapes_reply(execution.compute(deadline))


def _compute_fenced(s: ClientSession, cid: int, ex: int, fences: list[SyncFence],
                    deadline: int | None, timeout: int | None) -> None:
    execution = s.get(_EXEC, ex)
    s.fenced_reply(cid, execution.compute_fenced(fences, deadline, timeout))


def _copy_to(s: ClientSession, cid: int, buf: int, mem: SharedMemory) -> Writer:
    return _status_reply(s.get(_BUFFER, buf).copy_to(mem))


def _copy_from(s: ClientSession, cid: int, buf: int, mem: SharedMemory, dims: list[int]) -> Writer:
    return _status_reply(s.get(_BUFFER, buf).copy_from(mem, dims))


# ---- AIDL v4: the feature level, and the calls with a config (each reaches the driver's own
# *_with_config method, so a served driver sees the hints exactly as the client gave them)

def _get_feature_level(s: ClientSession, cid: int) -> Writer:
    level = getattr(s.device, "feature_level", FeatureLevel.V1_3)
    if not isinstance(level, FeatureLevel):
        raise _Fail(ErrorStatus.GENERAL_FAILURE, f"the driver's feature level is {level!r}")
    wr = Writer()
    w.put_status(wr, ErrorStatus.NONE)
    wr.u32(level.level)
    return wr


def _prepare_with_config(s: ClientSession, cid: int, model: Any,
                         config: PrepareModelConfig) -> Writer:
    cb = _PreparedCallback(s, cid, [fd for fd in [*config.model_cache, *config.data_cache]
                                    if fd >= 0])  # type: ignore[operator]
    try:
        launch = s.device.prepare_model_with_config(model, config, cb)
    except Exception:  # noqa: BLE001
        launch = ErrorStatus.GENERAL_FAILURE
    if launch != ErrorStatus.NONE:
        cb.notify(launch, None)  # the HAL notifies on a failed launch: exactly once here
    return _status_reply(launch)


def _execute_sync_with_config(s: ClientSession, cid: int, pm: int, request: Any,
                              config: ExecutionConfig, deadline: int | None) -> Writer:
    prepared = s.get(_PM, pm)
    _delay(s)
    return _shapes_reply(prepared.execute_synchronously_with_config(request, config, deadline))


def _execute_fenced_with_config(s: ClientSession, cid: int, pm: int, request: Any,
                                fences: list[SyncFence], config: ExecutionConfig,
                                deadline: int | None, duration: int | None) -> None:
    prepared = s.get(_PM, pm)
    s.fenced_reply(cid, prepared.execute_fenced_with_config(request, fences, config, deadline,
                                                            duration))


def _create_reusable_with_config(s: ClientSession, cid: int, pm: int, request: Any,
                                 config: ExecutionConfig) -> Writer:
    return _handle_reply(s, _EXEC, s.get(_PM, pm).create_reusable_execution_with_config(
        request, config))


def _burst_execute_with_config(s: ClientSession, cid: int, burst: int, request: Any,
                               config: ExecutionConfig, deadline: int | None) -> Writer:
    b = s.get(_BURST, burst)
    _delay(s)
    return _shapes_reply(b.execute_with_config(request, config, deadline))


_HANDLERS: dict[Kind, Callable[..., Writer | bytes | None]] = {
    Kind.GET_CAPABILITIES: _get_capabilities,
    Kind.GET_SUPPORTED_OPERATIONS: _get_supported,
    Kind.GET_TYPE: _get_type,
    Kind.GET_VERSION_STRING: _get_version,
    Kind.GET_SUPPORTED_EXTENSIONS: _get_extensions,
    Kind.GET_NUMBER_OF_CACHE_FILES: _get_cache_files,
    Kind.PREPARE_MODEL: _prepare,
    Kind.PREPARE_MODEL_FROM_CACHE: _prepare_from_cache,
    Kind.ALLOCATE: _allocate,
    Kind.EXECUTE: _execute,
    Kind.EXECUTE_SYNCHRONOUSLY: _execute_sync,
    Kind.EXECUTE_FENCED: _execute_fenced,
    Kind.CONFIGURE_BURST: _configure_burst,
    Kind.CONFIGURE_BURST_RINGS: _configure_burst_rings,
    Kind.CREATE_REUSABLE: _create_reusable,
    Kind.BURST_EXECUTE: _burst_execute,
    Kind.BURST_CREATE_REUSABLE: _burst_reusable,
    Kind.BURST_CACHE: _burst_cache,
    Kind.COMPUTE: _compute,
    Kind.COMPUTE_FENCED: _compute_fenced,
    Kind.COPY_TO: _copy_to,
    Kind.COPY_FROM: _copy_from,
    Kind.GET_FEATURE_LEVEL: _get_feature_level,
    Kind.PREPARE_MODEL_WITH_CONFIG: _prepare_with_config,
    Kind.EXECUTE_SYNCHRONOUSLY_WITH_CONFIG: _execute_sync_with_config,
    Kind.EXECUTE_FENCED_WITH_CONFIG: _execute_fenced_with_config,
    Kind.CREATE_REUSABLE_WITH_CONFIG: _create_reusable_with_config,
    Kind.BURST_EXECUTE_WITH_CONFIG: _burst_execute_with_config,
}


def _enum(cls: type[enum.IntEnum], value: int) -> int:
    """A value as its member when it is one (drivers compare members by identity on their
    fast paths), else as it came: the driver refuses it as it would in process."""
    try:
        return cls(value)
    except ValueError:
        return value


def _measure(r: Reader) -> int:
    return _enum(MeasureTiming, r.i32())


#: The kind of handle each call names first (ALLOCATE: its list of prepared models).
_HANDLE_KIND: dict[Kind, str] = {
    **dict.fromkeys((Kind.EXECUTE, Kind.EXECUTE_SYNCHRONOUSLY, Kind.EXECUTE_FENCED,
                     Kind.CONFIGURE_BURST, Kind.CONFIGURE_BURST_RINGS, Kind.CREATE_REUSABLE,
                     Kind.ALLOCATE, Kind.EXECUTE_SYNCHRONOUSLY_WITH_CONFIG,
                     Kind.EXECUTE_FENCED_WITH_CONFIG, Kind.CREATE_REUSABLE_WITH_CONFIG), _PM),
    **dict.fromkeys((Kind.BURST_EXECUTE, Kind.BURST_CREATE_REUSABLE, Kind.BURST_CACHE,
                     Kind.BURST_EXECUTE_WITH_CONFIG), _BURST),
    **dict.fromkeys((Kind.COMPUTE, Kind.COMPUTE_FENCED), _EXEC),
    **dict.fromkeys((Kind.COPY_TO, Kind.COPY_FROM), _BUFFER),
}

#: Calls whose decoding is remembered by their bytes (ClientSession.decoded), and how many.
_MEMO_KINDS = frozenset({Kind.EXECUTE, Kind.EXECUTE_SYNCHRONOUSLY, Kind.BURST_EXECUTE})
_MEMO_SIZE = 64

#: Calls that may wait for a message of the client (its fences): never run unread.
_WAITS_FOR_CLIENT = frozenset({Kind.EXECUTE_FENCED, Kind.COMPUTE_FENCED,
                               Kind.EXECUTE_FENCED_WITH_CONFIG})
#: Where in those calls' decoded arguments their waitFor fences are (registered as decoded).
_FENCES_AT = {Kind.EXECUTE_FENCED: 2, Kind.COMPUTE_FENCED: 1, Kind.EXECUTE_FENCED_WITH_CONFIG: 2}


# ---- the service ---------------------------------------------------------------------------------

class _Watcher:
    """One thread per service that passes a client's reading on when a call runs long and
    the client sent more meanwhile.

    It sleeps in epoll on the clients' sockets. A socket is armed (one-shot) only while its
    reading thread runs a call, and disarmed when the call ends: a synchronous client, which
    sends nothing while it waits, never wakes it (a watcher that looked every HANDOFF_S took
    the GIL from the driver's call each time, about 2% of a 3 ms call). A message arriving
    during a call wakes it once; it passes the reading on once that call has run HANDOFF_S.
    """

    def __init__(self, service: Service):
        self.service = service
        self.ep = select.epoll()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.ep.register(self._wake_r, select.EPOLLIN)
        self.lock = threading.Lock()
        self.by_fd: dict[int, ClientSession] = {}
        self.flagged: list[ClientSession] = []  # a call started with the next message read ahead
        self.stopped = False
        self.closed = False
        self.wakes = 0  # times the thread woke (tests: none while a synchronous call runs)
        self.thread = threading.Thread(target=self._run, name="nnhal-watcher", daemon=True)

    def add(self, session: ClientSession) -> None:
        with self.lock:
            if self.closed:
                return
            fd = session.sock.fileno()
            self.by_fd[fd] = session
            self.ep.register(fd, _DISARMED)

    def _fd(self, session: ClientSession) -> int | None:
        """The session's socket, if registered here (with the lock held)."""
        fd = session.sock.fileno()
        return fd if fd >= 0 and self.by_fd.get(fd) is session else None

    def remove(self, session: ClientSession) -> None:
        """Before the session's socket closes (its number may be reused)."""
        with self.lock:
            fd = self._fd(session)
            if fd is not None:
                del self.by_fd[fd]
                try:
                    self.ep.unregister(fd)
                except (OSError, ValueError):
                    pass

    def arm(self, session: ClientSession) -> None:
        """A call starts on the reading thread: wake on the client's next message."""
        with self.lock:  # (_fd inlined here and in disarm: before and after every call)
            fd = session.sock.fileno()
            if fd >= 0 and self.by_fd.get(fd) is session:
                try:
                    self.ep.modify(fd, _ARMED)
                except OSError:
                    pass
            if session.receiver.pending():  # read ahead already: no event will come for it
                self.flagged.append(session)
                self._nudge()

    def disarm(self, session: ClientSession) -> None:
        with self.lock:
            fd = session.sock.fileno()
            if fd >= 0 and self.by_fd.get(fd) is session:
                try:
                    self.ep.modify(fd, _DISARMED)
                except OSError:
                    pass

    def _nudge(self) -> None:
        """Wake the thread (with the lock held: the pipe is open until close)."""
        if not self.closed:
            try:
                os.write(self._wake_w, b"x")
            except OSError:  # full: it wakes anyway
                pass

    def stop(self) -> None:
        with self.lock:
            self.stopped = True
            self._nudge()

    def close(self) -> None:
        """After stop and the sessions' close: the thread ends, then its descriptors go."""
        if self.thread.is_alive():
            self.thread.join(5)
        with self.lock:
            if self.closed:
                return
            self.closed = True
            self.by_fd.clear()
            self.ep.close()
            w.close_fds((self._wake_r, self._wake_w))

    def _run(self) -> None:
        due: dict[ClientSession, float] = {}  # sessions to look at, and when
        while not self.stopped:
            timeout = max(0.0, min(due.values()) - time.monotonic()) if due else -1
            events = self.ep.poll(timeout)
            self.wakes += 1
            with self.lock:
                for fd, _ in events:
                    if fd == self._wake_r:
                        try:
                            os.read(self._wake_r, 4096)
                        except OSError:
                            pass
                    elif fd in self.by_fd:
                        due.setdefault(self.by_fd[fd], 0.0)
                for s in self.flagged:
                    due.setdefault(s, 0.0)
                self.flagged.clear()
            now = time.monotonic()
            for s, when in list(due.items()):
                if when <= now:
                    later = s.hand_off_when_due(now)
                    if later is None:
                        del due[s]
                    else:
                        due[s] = later


#: A registered socket that reports nothing but a hang-up (once, being one-shot).
_DISARMED = select.EPOLLONESHOT
#: ... and one that reports the client's next message (once).
_ARMED = select.EPOLLIN | select.EPOLLONESHOT


def no_new_privs() -> str | None:
    """Set PR_SET_NO_NEW_PRIVS on this process; None when done, else why not."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
            return os.strerror(ctypes.get_errno())
        return None
    except (OSError, AttributeError) as e:
        return str(e)


def _peer_ok(sock: socket.socket, gid: int | None) -> tuple[bool, str]:
    try:
        pid, uid, pgid = struct.unpack("3i", sock.getsockopt(
            socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    except OSError as e:
        return False, f"no peer credentials: {e}"
    who = f"pid {pid} uid {uid}"
    if uid == os.getuid():
        return True, who
    if gid is not None:
        if pgid == gid:
            return True, who
        try:
            if pwd.getpwuid(uid).pw_name in grp.getgrgid(gid).gr_mem:
                return True, who
        except KeyError:
            pass
    return False, who


class Service:
    """One device served on one Unix socket."""

    def __init__(self, device: IDevice, path: str | os.PathLike[str], *,
                 group: str | None = None, limits: Limits | None = None):
        self.device = device
        self.path = str(path)
        self.limits = limits or Limits()
        self.budget = Budget(self.limits.max_held)
        self.gid = None if group is None else _group_id(group)
        self.sessions: set[ClientSession] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        self._fence_ids = 0
        self.messages = 0
        self.looks = 0  # looks a reading thread made for a next message after a reply
        self.found = 0  # ... and found it there
        self.test_delay = float(os.environ.get(TEST_DELAY_ENV) or 0.0)
        self.sock = self._listen()
        self.watcher = _Watcher(self)
        # A served driver's threads now, not on its first client's request (an in-process
        # device starts them on first use: nnhal.drivers.common.device.DeviceBase).
        start = getattr(getattr(device, "workers", None), "start", None)
        if callable(start):
            start()

    def _listen(self) -> socket.socket:
        p = Path(self.path)
        if p.is_socket() or p.is_symlink():
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(self.path)
                raise OSError(f"{self.path}: a service already answers there")
            except (ConnectionRefusedError, FileNotFoundError):
                p.unlink()  # a stale socket of a service that died
            finally:
                probe.close()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            sock.bind(self.path)
        finally:
            os.umask(old)
        if self.gid is not None:
            os.chown(self.path, -1, self.gid)
            os.chmod(self.path, 0o660)
        else:
            os.chmod(self.path, 0o600)
        sock.listen(64)
        return sock

    def new_fence_id(self) -> int:
        with self._lock:
            self._fence_ids += 1
            return self._fence_ids

    def objects(self) -> int:
        """Objects held for clients, over every connected client."""
        with self._lock:
            sessions = list(self.sessions)
        return sum(s.objects() for s in sessions)

    def _gone(self, session: ClientSession) -> None:
        with self._lock:
            self.sessions.discard(session)

    def serve_forever(self) -> None:
        self.watcher.thread.start()
        try:
            while not self._stop.is_set():
                ready, _, _ = select.select([self.sock, self._wake_r], [], [])
                if self._wake_r in ready:
                    break
                try:
                    conn, _ = self.sock.accept()
                except OSError:
                    continue
                ok, who = _peer_ok(conn, self.gid)
                if not ok:
                    log.warning("refused client %s", who)
                    conn.close()
                    continue
                with self._lock:
                    full = len(self.sessions) >= self.limits.max_clients
                if full:
                    log.warning("refused client %s: %d clients connected already", who,
                                self.limits.max_clients)
                    _tell_busy(conn)
                    continue
                session = ClientSession(self, conn, who)
                with self._lock:
                    self.sessions.add(session)
                self.watcher.add(session)
                threading.Thread(target=session.run, name=f"nnhal-client {who}",
                                 daemon=True).start()
        finally:
            self._shutdown()

    def stop(self) -> None:
        self._stop.set()
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def _shutdown(self) -> None:
        self.watcher.stop()
        try:
            self.sock.close()
        except OSError:
            pass
        try:
            if stat.S_ISSOCK(os.lstat(self.path).st_mode):
                os.unlink(self.path)
        except OSError:
            pass
        with self._lock:
            sessions = list(self.sessions)
        for s in sessions:
            s.close()
        self.watcher.close()
        w.close_fds((self._wake_r, self._wake_w))


def _tell_busy(conn: socket.socket) -> None:
    """Close a connection the service has no room for, telling the client why first: ERROR
    with call id 0 (no call has it) and RESOURCE_EXHAUSTED_TRANSIENT. It never blocks: a
    new socket's buffer holds the 28 bytes, and one that does not is closed unsaid."""
    wr = Writer()
    w.put_status(wr, ErrorStatus.RESOURCE_EXHAUSTED_TRANSIENT)
    try:
        conn.setblocking(False)
        send_message(conn, Kind.ERROR, 0, wr.buf)
    except (Closed, OSError):
        pass
    conn.close()


def _group_id(group: str) -> int:
    try:
        return int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
    except KeyError:
        raise OSError(f"unknown group {group!r}") from None


def serve(driver: str, socket_path: str | None = None, runtime_dir: str | None = None,
          group: str | None = None, name: str | None = None,
          ready: Callable[[Service], None] | None = None, limits: Limits | None = None) -> int:
    """Run ``nnhal serve``: open the driver, listen, register, serve until SIGTERM/SIGINT."""
    from nnhal.drivers.registry import open_device

    why = no_new_privs()
    if why is not None:
        log.warning("cannot set no_new_privs: %s", why)
    name = name or driver
    rdir = registration.runtime_dir(runtime_dir)
    if socket_path is None:
        if rdir is None:
            raise OSError("no --socket and no runtime directory ($XDG_RUNTIME_DIR unset; "
                          "give --runtime-dir)")
        registration.check_dir(rdir)
        socket_path = str(rdir / f"{name}.sock")
    device = open_device(driver)
    try:
        service = Service(device, os.path.abspath(socket_path), group=group, limits=limits)
        previous = {sig: signal.signal(sig, lambda *_: service.stop())
                    for sig in (signal.SIGTERM, signal.SIGINT)}
        entry = None
        try:
            if rdir is not None:  # last: a registered service answers and stops cleanly
                entry = registration.register(rdir, name, service.path, driver)
            if ready is not None:
                ready(service)
            service.serve_forever()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if entry is not None:
                registration.unregister(entry)
    finally:
        close = getattr(device, "close", None)
        if callable(close):
            close()
    return 0
