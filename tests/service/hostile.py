"""A fake service for the client's tests: it accepts connections and answers each call as a
policy says (real replies, mutated ones, junk, silence), in a thread of the test process."""

from __future__ import annotations

import os
import random
import socket
import threading
from collections.abc import Callable

from nnhal.drivers.reference import ReferenceDevice
from nnhal.hal.types import ErrorStatus, OutputShape, Timing
from nnhal.service import wire as w
from nnhal.service.transport import Closed, recv_message, send_message
from nnhal.service.wire import Kind, Writer

_CAPS = ReferenceDevice().get_capabilities()[1]


def real_reply(kind: Kind, n_outputs: int = 1) -> bytes:
    """A body a real service could answer ``kind`` with."""
    wr = Writer()
    ok = ErrorStatus.NONE
    if kind == Kind.GET_CAPABILITIES:
        w.put_status(wr, ok)
        wr.u8(1)
        w.put_capabilities(wr, _CAPS)
    elif kind == Kind.GET_SUPPORTED_OPERATIONS:
        w.put_status(wr, ok)
        wr.u32(1)
        wr.u8(1)
    elif kind == Kind.GET_TYPE:
        w.put_status(wr, ok)
        wr.u32(2)
    elif kind == Kind.GET_VERSION_STRING:
        w.put_status(wr, ok)
        wr.str("hostile")
    elif kind == Kind.GET_SUPPORTED_EXTENSIONS:
        w.put_status(wr, ok)
        wr.u32(0)
    elif kind == Kind.GET_NUMBER_OF_CACHE_FILES:
        w.put_status(wr, ok)
        wr.u32(1)
        wr.u32(1)
    elif kind == Kind.GET_FEATURE_LEVEL:
        w.put_status(wr, ok)
        wr.u32(8)
    elif kind in (Kind.EXECUTE_SYNCHRONOUSLY, Kind.COMPUTE, Kind.BURST_EXECUTE,
                  Kind.EXECUTE_SYNCHRONOUSLY_WITH_CONFIG, Kind.BURST_EXECUTE_WITH_CONFIG):
        return w.pack_shapes_result(ok, [OutputShape([4, 4], True)] * n_outputs,
                                    Timing(5, 7))
    elif kind in (Kind.EXECUTE_FENCED, Kind.COMPUTE_FENCED, Kind.EXECUTE_FENCED_WITH_CONFIG):
        w.put_status(wr, ok)
        wr.u8(1)
        wr.u64(1)
        wr.u8(0)
    elif kind in (Kind.ALLOCATE,):
        w.put_status(wr, ok)
        wr.u8(1)
        wr.u32(9)
        wr.u32(3)
    elif kind in (Kind.CREATE_REUSABLE, Kind.CONFIGURE_BURST, Kind.BURST_CREATE_REUSABLE,
                  Kind.CREATE_REUSABLE_WITH_CONFIG):
        w.put_status(wr, ok)
        wr.u8(1)
        wr.u32(5)
    else:  # launches, copies, burst cache: a status
        w.put_status(wr, ok)
    return bytes(wr.buf)


Policy = Callable[[socket.socket, Kind, int], None]


def answer(sock: socket.socket, kind: Kind, call_id: int) -> None:
    """The polite policy: the real reply (and the notification a launch promises)."""
    send_message(sock, Kind.REPLY, call_id, real_reply(kind))
    if kind in (Kind.PREPARE_MODEL, Kind.PREPARE_MODEL_FROM_CACHE,
                Kind.PREPARE_MODEL_WITH_CONFIG):
        wr = Writer()
        w.put_status(wr, ErrorStatus.NONE)
        wr.u8(1)
        wr.u32(1)
        send_message(sock, Kind.NOTIFY_PREPARED, call_id, wr.buf)


def silent(sock: socket.socket, kind: Kind, call_id: int) -> None:
    """Never answers."""


class Hostile:
    """Serves at ``path`` until closed; ``policy`` answers each call."""

    def __init__(self, path: str, policy: Policy = answer, accept: bool = True):
        self.path, self.policy = path, policy
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(0 if not accept else 16)
        self.conns: list[socket.socket] = []
        self.stop = False
        self.threads: list[threading.Thread] = []
        if accept:
            t = threading.Thread(target=self._accept, daemon=True)
            t.start()
            self.threads.append(t)

    def _accept(self) -> None:
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            t.start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            while not self.stop:
                kind, call_id, _, fds = recv_message(conn)
                w.close_fds(fds)
                if kind in w.CALLS:
                    self.policy(conn, kind, call_id)
        except (Closed, OSError, w.WireError):
            pass
        finally:
            try:
                conn.close()
            except OSError:
                pass

    def close(self) -> None:
        self.stop = True
        for c in [self.sock, *self.conns]:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()


def mutate(rng: random.Random, body: bytes) -> bytes:
    """A real reply body broken one way or another."""
    b = bytearray(body)
    how = rng.randrange(6)
    if how == 0 and b:
        return bytes(b[:rng.randrange(len(b))])  # truncated
    if how == 1 and b:
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        return bytes(b)
    if how == 2 and len(b) >= 8:  # a count or a dimension made huge
        at = rng.randrange(4, len(b) - 3)
        b[at:at + 4] = rng.choice([0xFFFF_FFFF, 0x7FFF_FFFF, 1 << 24, 1 << 20]).to_bytes(4,
                                                                                      "little")
        return bytes(b)
    if how == 3:
        return bytes(b) + os.urandom(rng.randint(1, 16))  # trailing bytes
    if how == 4:
        return os.urandom(rng.randint(0, 64))
    return b""
