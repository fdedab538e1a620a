"""The service holds only what has arrived and refuses what passes its bounds: message
bodies announced and not sent, bodies past the bound, memories and clients past theirs; a
call refused for its handle defines no memory."""

from __future__ import annotations

import socket
import time

import pytest
from helpers import add_model, served

from nnhal.hal.types import ErrorStatus
from nnhal.memory import SharedMemory
from nnhal.service import wire as w
from nnhal.service.client import RemoteDevice
from nnhal.service.server import Limits
from nnhal.service.transport import Closed, recv_message, send_message

E = ErrorStatus


def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _connect(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(path)
    return s


def _wait(pred, timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.01)
    return pred()


def test_announced_bodies_cost_nothing_until_their_bytes_come(tmp_path):
    with served(tmp_path / "s.sock") as svc:
        before = _rss()
        socks = []
        for i in range(4):  # 4 x 64 MiB announced, 100 bytes sent
            s = _connect(svc.path)
            s.sendall(w.pack_header(w.Kind.GET_SUPPORTED_OPERATIONS, i + 1, 64 << 20, 0)
                      + bytes(100))
            socks.append(s)
        assert _wait(lambda: len(svc.sessions) == 4)
        time.sleep(0.3)  # the readers have read what came
        grown = _rss() - before
        for s in socks:
            s.close()
        assert grown < 32 << 20, f"the service grew by {grown >> 20} MiB"


def test_a_body_past_the_bound_is_refused_and_the_connection_closed(tmp_path):
    with served(tmp_path / "s.sock", limits=Limits(max_body=1 << 20)) as svc:
        s = _connect(svc.path)
        s.sendall(w.pack_header(w.Kind.GET_TYPE, 7, 0xFFFF_FFFF, 0))  # 4 GiB announced
        kind, call_id, body, _ = recv_message(s)
        assert (kind, call_id) == (w.Kind.ERROR, 7)
        assert w.get_status(w.Reader(body)) == E.RESOURCE_EXHAUSTED_PERSISTENT
        with pytest.raises(Closed):
            recv_message(s)
        s.close()
        assert _wait(lambda: not svc.sessions)


def test_clients_past_the_bound_are_told_busy_and_closed(tmp_path):
    with served(tmp_path / "s.sock", limits=Limits(max_clients=2)) as svc:
        a, b = _connect(svc.path), _connect(svc.path)
        assert _wait(lambda: len(svc.sessions) == 2)
        c = _connect(svc.path)
        kind, call_id, body, _ = recv_message(c)  # told why, then closed
        assert (kind, call_id) == (w.Kind.ERROR, 0)
        assert w.get_status(w.Reader(body)) == E.RESOURCE_EXHAUSTED_TRANSIENT
        with pytest.raises(Closed):
            recv_message(c)
        send_message(a, w.Kind.GET_TYPE, 1, b"")
        assert recv_message(a)[0] == w.Kind.REPLY  # the others go on
        for s in (a, b, c):
            s.close()


def _define(wr: w.Writer, mem: SharedMemory, ident: int) -> None:
    """A request defining ``mem`` under ``ident`` (as a client's first use of it)."""
    wr.u32(0)
    wr.u32(0)
    wr.u32(1)
    wr.u8(0)  # pool: Memory
    wr.u8(w.MEM_NEW)
    wr.u64(ident)
    wr.str(mem.name)
    wr.u64(mem.size)
    wr.u64(0)
    wr.fd(mem.fd)


def _exec_defining(handle: int, mem: SharedMemory, ident: int) -> w.Writer:
    wr = w.Writer()
    wr.u32(handle)
    _define(wr, mem, ident)
    wr.i32(0)
    wr.opt_i64(None, "x")
    wr.opt_i64(None, "x")
    return wr


def test_a_call_refused_for_its_handle_defines_no_memory(tmp_path):
    mem = SharedMemory.ashmem(64)
    with served(tmp_path / "s.sock") as svc:
        s = _connect(svc.path)
        for kind in (w.Kind.EXECUTE_SYNCHRONOUSLY, w.Kind.BURST_EXECUTE, w.Kind.EXECUTE):
            wr = _exec_defining(999, mem, 5)
            send_message(s, kind, 3, wr.buf, wr.fds)
            kind_back, call_id, body, _ = recv_message(s)
            assert (kind_back, call_id) == (w.Kind.ERROR, 3)
            assert w.get_status(w.Reader(body)) == E.INVALID_ARGUMENT
            assert svc.objects() == 0  # the memory of id 5 is not kept
        s.close()
    mem.close()


def test_memories_past_the_bound_are_refused(tmp_path):
    mems = [SharedMemory.ashmem(64) for _ in range(3)]
    with served(tmp_path / "s.sock", limits=Limits(max_memories=2)) as svc:
        dev = RemoteDevice(svc.path)
        got = []
        for mem in mems:  # each call defines one more memory (a pool of the model)
            model = add_model((2, 2))
            model.pools = [mem]
            got.append(dev.get_supported_operations(model)[0])
        assert got[2] == E.RESOURCE_EXHAUSTED_PERSISTENT
        assert E.RESOURCE_EXHAUSTED_PERSISTENT not in got[:2]
        assert svc.objects() == 2
        dev.close()
    for m in mems:
        m.close()
