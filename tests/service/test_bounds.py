"""The service holds only what has arrived and refuses what passes its bounds: message
bodies announced and not sent, bodies past the bound, memories and clients past theirs; a
call refused for its handle defines no memory."""

from __future__ import annotations

import socket
import time
import tracemalloc

import pytest
from helpers import add_model, served, wait_for

from nnhal.hal.types import ErrorStatus
from nnhal.memory import SharedMemory
from nnhal.service import wire as w
from nnhal.service.client import RemoteDevice
from nnhal.service.server import Limits
from nnhal.service.transport import Closed, recv_message, send_message

E = ErrorStatus


def _held() -> int:
    """Bytes Python holds now (tracemalloc): unlike the RSS, no allocator slack left by
    earlier tests in this process."""
    return tracemalloc.get_traced_memory()[0]


def _connect(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    end = time.monotonic() + 10
    while True:
        try:
            s.connect(path)
            return s
        except BlockingIOError:  # the backlog is full for a moment: the service accepts
            if time.monotonic() > end:
                raise
            time.sleep(0.01)


def test_announced_bodies_cost_nothing_until_their_bytes_come(tmp_path):
    tracemalloc.start()  # what is allocated, whether or not its pages were touched yet
    try:
        with served(tmp_path / "s.sock") as svc:
            before = _held()
            socks = []
            for i in range(4):  # 4 x 64 MiB announced, 100 bytes sent
                s = _connect(svc.path)
                s.sendall(w.pack_header(w.Kind.GET_SUPPORTED_OPERATIONS, i + 1, 64 << 20, 0)
                          + bytes(100))
                socks.append(s)
            assert wait_for(lambda: len(svc.sessions) == 4)
            time.sleep(0.3)  # the readers have read what came
            grown = _held() - before
            for s in socks:
                s.close()
    finally:
        tracemalloc.stop()
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
        assert wait_for(lambda: not svc.sessions)


def test_clients_past_the_bound_are_told_busy_and_closed(tmp_path):
    with served(tmp_path / "s.sock", limits=Limits(max_clients=2)) as svc:
        a, b = _connect(svc.path), _connect(svc.path)
        assert wait_for(lambda: len(svc.sessions) == 2)
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


# ---- clients that stop inside a message, and the bytes all clients hold -------------------

def _closed_by_service(s: socket.socket, timeout: float) -> bool:
    """Whether the service ends ``s`` within ``timeout`` (what it sends first is read)."""
    s.settimeout(timeout)
    end = time.monotonic() + timeout
    try:
        while time.monotonic() < end:
            if s.recv(4096) == b"":
                return True
    except TimeoutError:
        return False
    except OSError:
        return True
    return False


def test_stalled_partial_messages_are_cut_and_an_honest_client_is_served(tmp_path, caplog):
    caplog.set_level("WARNING", logger="nnhal.service")
    with served(tmp_path / "s.sock", limits=Limits(partial_s=1.0)) as svc:
        stalled = []
        for i in range(70):  # 64 admitted, stopped inside a message; 6 told busy
            s = _connect(svc.path)
            header = w.pack_header(w.Kind.GET_TYPE if i % 2 else w.Kind.PREPARE_MODEL,
                                   i + 1, 0 if i % 2 else 4096, 0)
            s.sendall(header[:10] if i % 2 else header + bytes(100))  # half a header / body
            stalled.append(s)
        assert wait_for(lambda: len(svc.sessions) == 64, 10)
        # Within the bound (and generous slack) every one is cut, and the service answers.
        start = time.monotonic()
        served_status = None
        while time.monotonic() - start < 30:
            dev = RemoteDevice(svc.path)
            served_status = dev.get_type()[0]
            dev.close()
            if served_status == E.NONE:
                break
            assert served_status == E.RESOURCE_EXHAUSTED_TRANSIENT  # busy, never dead
            time.sleep(0.1)
        assert served_status == E.NONE
        assert all(_closed_by_service(s, 10) for s in stalled)
        for s in stalled:
            s.close()
    cut = [r for r in caplog.records if "has not come whole" in r.getMessage()]
    assert len(cut) == 64 and all("pid" in r.getMessage() for r in cut)


def test_an_idle_connection_outlives_the_partial_bound(tmp_path):
    with served(tmp_path / "s.sock", limits=Limits(partial_s=0.3)) as svc:
        dev = RemoteDevice(svc.path)
        raw = _connect(svc.path)
        send_message(raw, w.Kind.GET_TYPE, 1, b"")
        assert recv_message(raw)[0] == w.Kind.REPLY
        assert dev.get_type()[0] == E.NONE
        time.sleep(1.5)  # five bounds, between messages
        assert dev.get_type()[0] == E.NONE
        send_message(raw, w.Kind.GET_TYPE, 2, b"")
        assert recv_message(raw)[:2] == (w.Kind.REPLY, 2)
        assert len(svc.sessions) == 2
        raw.close()
        dev.close()


def test_a_slow_steady_body_goes_on_and_a_trickle_is_cut(tmp_path):
    limits = Limits(partial_s=1.0, min_rate=256 << 10)
    with served(tmp_path / "s.sock", limits=limits) as svc:
        slow, trickle = _connect(svc.path), _connect(svc.path)
        size = 2 << 20
        slow.sendall(w.pack_header(w.Kind.GET_SUPPORTED_OPERATIONS, 5, size, 0))
        trickle.sendall(w.pack_header(w.Kind.GET_SUPPORTED_OPERATIONS, 6, size, 0))
        start = time.monotonic()
        for _ in range(8):  # 256 KiB every 0.2 s: longer than partial_s in all
            slow.sendall(bytes(256 << 10))
            try:
                trickle.sendall(b"\0")
            except OSError:
                pass  # cut already
            time.sleep(0.2)
        assert time.monotonic() - start > limits.partial_s
        kind, call_id, body, _ = recv_message(slow)  # answered (the body does not decode)
        assert (kind, call_id) == (w.Kind.ERROR, 5)
        assert w.get_status(w.Reader(body)) == E.INVALID_ARGUMENT
        assert _closed_by_service(trickle, 15)
        slow.close()
        trickle.close()


def test_bodies_past_the_shared_budget_are_refused_transient_and_held_bytes_stay_bounded(tmp_path):
    budget = 32 << 20
    # What Python holds, traced: the process's RSS also counts allocator slack left by earlier
    # tests (glibc's raised mmap threshold, per-thread arenas), which made it order-dependent.
    tracemalloc.start()
    try:
        _refuse_past_the_budget(tmp_path, budget)
    finally:
        tracemalloc.stop()



def _refuse_past_the_budget(tmp_path, budget: int) -> None:
    with served(tmp_path / "s.sock", limits=Limits(max_held=budget)) as svc:
        before = _held()
        socks = []
        chunk = bytes(1 << 20)
        for i in range(8):  # 8 x 24 MiB of 32 MiB bodies, sent and held: 192 MiB without
            s = _connect(svc.path)
            s.sendall(w.pack_header(w.Kind.GET_SUPPORTED_OPERATIONS, i + 1, 32 << 20, 0))
            for _ in range(24):
                s.sendall(chunk)
            socks.append(s)
        assert wait_for(lambda: len(svc.sessions) == 8)
        time.sleep(0.5)  # the readers have read what came
        grown = _held() - before
        assert svc.budget.held <= budget
        assert grown < budget + (24 << 20), f"the service grew by {grown >> 20} MiB"
        statuses = []
        for i, s in enumerate(socks):  # the rest of each body: every call answered
            for _ in range(8):
                s.sendall(chunk)
            kind, call_id, body, _ = recv_message(s)
            assert (kind, call_id) == (w.Kind.ERROR, i + 1)
            statuses.append(w.get_status(w.Reader(body)))
            send_message(s, w.Kind.GET_TYPE, 99, b"")  # and the connection goes on
            assert recv_message(s)[:2] == (w.Kind.REPLY, 99)
        assert statuses.count(E.RESOURCE_EXHAUSTED_TRANSIENT) >= 6
        assert set(statuses) <= {E.RESOURCE_EXHAUSTED_TRANSIENT, E.INVALID_ARGUMENT}
        for s in socks:
            s.close()
        assert wait_for(lambda: not svc.sessions and svc.budget.held == 0)


def test_the_client_turns_a_refused_body_into_a_transient_status(tmp_path):
    with served(tmp_path / "s.sock", limits=Limits(max_held=1 << 20)) as svc:
        dev = RemoteDevice(svc.path)
        model = add_model((2, 2))
        model.operand_values = bytes(2 << 20)  # a 2 MiB body (nothing names the bytes)
        assert dev.get_supported_operations(model)[0] == E.RESOURCE_EXHAUSTED_TRANSIENT
        assert dev.get_type()[0] == E.NONE  # the connection goes on
        dev.close()


def test_the_65th_client_is_told_busy(tmp_path, caplog):
    caplog.set_level("WARNING", logger="nnhal.service")
    with served(tmp_path / "s.sock") as svc:
        held = [_connect(svc.path) for _ in range(64)]
        assert wait_for(lambda: len(svc.sessions) == 64, 10)
        dev = RemoteDevice(svc.path)
        assert dev.get_type()[0] == E.RESOURCE_EXHAUSTED_TRANSIENT
        assert dev.get_capabilities()[0] == E.RESOURCE_EXHAUSTED_TRANSIENT  # later calls too
        assert "busy" in repr(dev)
        assert any("busy" in r.getMessage() for r in caplog.records
                   if r.getMessage().startswith(svc.path))
        dev.close()
        idle = RemoteDevice(svc.path)  # alive tells busy before any call, too
        assert wait_for(lambda: not idle.alive)
        assert idle.get_type()[0] == E.RESOURCE_EXHAUSTED_TRANSIENT
        idle.close()
        for s in held:
            s.close()


@pytest.mark.parametrize("argv,env", [
    (["--partial-timeout", "0"], {}), (["--partial-timeout", "nan"], {}),
    (["--min-rate", "-1"], {}), (["--max-held", "1.5"], {}), (["--max-held", "0"], {}),
    ([], {"NNHAL_SERVE_PARTIAL_S": "soon"}), ([], {"NNHAL_SERVE_MAX_HELD": "-5"}),
])
def test_serve_refuses_bad_bounds_in_one_line(tmp_path, monkeypatch, capsys, argv, env):
    from nnhal import cli
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert cli.main(["serve", "reference", "--socket", str(tmp_path / "s.sock"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("nnhal serve:") and "\n" not in err
    assert not (tmp_path / "s.sock").exists()


@pytest.mark.parametrize("bad", [{"partial_s": 0}, {"min_rate": float("nan")},
                                 {"max_held": 0}, {"max_held": True}, {"partial_s": "1"}])
def test_limits_refuse_values_that_are_not_positive(bad):
    with pytest.raises(ValueError, match="Limits"):
        Limits(**bad)
