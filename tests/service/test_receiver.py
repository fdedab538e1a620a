"""The chunked Receiver cuts the same messages out of a stream as recv_message, each with
its own descriptors, however the stream's bytes arrive; descriptors sent against the rules
are refused and closed, never given to another message."""

from __future__ import annotations

import array
import os
import socket
import threading

import pytest

from nnhal.memory import SharedMemory
from nnhal.service import wire as w
from nnhal.service.transport import Closed, Receiver, TooLarge, send_message
from nnhal.service.wire import WireError


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def size_of(fd: int) -> int:
    return os.fstat(fd).st_size


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def test_many_messages_each_with_its_own_descriptors(pair):
    a, b = pair
    mems = [SharedMemory.ashmem(4096 * (i + 1)) for i in range(6)]
    sent = []
    # Small and large bodies, with and without descriptors, all queued before any read, so
    # one read sees several messages (and a large one spans reads).
    bodies = [b"a" * 10, b"b" * 70_000, b"", b"c" * 3, b"d" * 200_000, b"e"]
    for i, body in enumerate(bodies):
        fds = [mems[i].fd] if i % 2 == 0 else []
        sent.append((i + 1, body, [size_of(fd) for fd in fds]))

    def write():
        for i, body in enumerate(bodies):
            send_message(a, w.Kind.GET_TYPE, i + 1, body, [mems[i].fd] if i % 2 == 0 else [])
    t = threading.Thread(target=write)
    t.start()
    rx = Receiver(b, chunk=1 << 16)
    got = []
    for _ in bodies:
        kind, cid, body, fds = rx.next()
        got.append((cid, bytes(body), [size_of(fd) for fd in fds]))
        for fd in fds:
            os.close(fd)
    t.join()
    assert got == sent
    assert not rx.pending()
    for m in mems:
        m.close()


def test_a_read_ending_inside_a_later_message_keeps_its_descriptors_for_it(pair):
    # The first read takes message 1 and the start of message 2 (with 2's descriptors): 1
    # gets none, 2 gets its own.
    a, b = pair
    mem = SharedMemory.ashmem(8192)
    send_message(a, w.Kind.GET_TYPE, 1, b"x" * 100)
    send_message(a, w.Kind.GET_TYPE, 2, b"y" * 50, [mem.fd])
    rx = Receiver(b, chunk=w.HEADER_SIZE + 100 + w.HEADER_SIZE + 10)
    assert rx.next()[1:4:2] == (1, [])
    _, cid, body, fds = rx.next()
    assert cid == 2 and bytes(body) == b"y" * 50 and [size_of(fd) for fd in fds] == [8192]
    os.close(fds[0])
    mem.close()


def test_descriptors_on_a_later_part_of_a_message_are_refused_and_closed(pair):
    a, b = pair
    mem = SharedMemory.ashmem(4096)
    data = w.pack_header(w.Kind.GET_TYPE, 1, 100, 1) + b"z" * 100
    a.sendall(data[:40])  # the first byte goes without the descriptor
    rx = Receiver(b, chunk=32)  # the first read ends before the descriptors are sent
    before = open_fds()
    rx._fill()
    a.sendmsg([data[40:]], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                             array.array("i", [mem.fd]))])
    with pytest.raises(WireError, match="descriptors"):
        rx.next()
    assert open_fds() == before
    mem.close()


def test_descriptors_a_header_does_not_announce_are_closed(pair):
    a, b = pair
    mem = SharedMemory.ashmem(4096)
    hdr = w.pack_header(w.Kind.GET_TYPE, 1, 0, 0)
    a.sendmsg([hdr], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [mem.fd]))])
    before = open_fds()
    with pytest.raises(WireError, match="announces 0 descriptors, 1 arrived"):
        Receiver(b).next()
    assert open_fds() == before
    mem.close()


def test_a_message_past_the_bound_is_skipped_and_the_next_keeps_its_descriptors(pair):
    a, b = pair
    mem, big = SharedMemory.ashmem(4096), SharedMemory.ashmem(8192)

    def write():
        send_message(a, w.Kind.GET_TYPE, 1, b"q" * 100, [big.fd])  # too large, buffered
        send_message(a, w.Kind.GET_TYPE, 2, b"r" * 300_000)        # too large, drained
        send_message(a, w.Kind.GET_TYPE, 3, b"ok", [mem.fd])
    t = threading.Thread(target=write)
    t.start()
    rx = Receiver(b)
    before = open_fds()
    for cid in (1, 2):
        with pytest.raises(TooLarge) as e:
            rx.next(max_body=50)
        assert e.value.call_id == cid
    assert open_fds() == before  # the skipped message's descriptor was closed
    _, cid, body, fds = rx.next(max_body=50)
    assert (cid, bytes(body), [size_of(fd) for fd in fds]) == (3, b"ok", [4096])
    os.close(fds[0])
    t.join()
    mem.close()
    big.close()


def test_end_of_stream(pair):
    a, b = pair
    send_message(a, w.Kind.GET_TYPE, 1, b"abc")
    a.sendall(w.pack_header(w.Kind.GET_TYPE, 2, 10, 0) + b"12")
    a.close()
    rx = Receiver(b)
    assert rx.next()[1] == 1
    with pytest.raises(Closed, match="inside a message"):
        rx.next()
    with pytest.raises(Closed):
        Receiver(b).next()


def test_a_skipped_message_leaves_the_descriptors_of_the_next_in_the_same_read(pair):
    a, b = pair
    mem = SharedMemory.ashmem(4096)
    send_message(a, w.Kind.GET_TYPE, 1, b"q" * 100)
    send_message(a, w.Kind.GET_TYPE, 2, b"ok", [mem.fd])
    rx = Receiver(b)
    with pytest.raises(TooLarge):
        rx.next(max_body=50)
    _, cid, body, fds = rx.next(max_body=50)
    assert (cid, [size_of(fd) for fd in fds]) == (2, [4096])
    os.close(fds[0])
    mem.close()


def test_a_receiver_with_a_kernel_tick_waits_across_ticks_and_keeps_its_end(pair):
    # With SO_RCVTIMEO (the client's tick), a blocking read ends every tick without data:
    # that is neither the end of the stream nor the caller's end.
    import time

    from nnhal.service.transport import TimedOut

    a, b = pair
    rx = Receiver(b, chunk=1 << 10, tick=0.02)
    body = bytes(range(256)) * 20  # larger than the chunk: read growing, across ticks

    def late(delay: float) -> None:
        time.sleep(delay)
        data = w.pack_header(w.Kind.GET_TYPE, 7, len(body), 0) + body
        a.sendall(data[:100])
        time.sleep(0.1)
        a.sendall(data[100:])
    for end in (None, 5.0):
        t = threading.Thread(target=late, args=(0.1,))
        t.start()
        kind, call_id, got, fds = rx.next(end=end and time.monotonic() + end)
        t.join()
        assert (kind, call_id, bytes(got), fds) == (w.Kind.GET_TYPE, 7, body, [])
    start = time.monotonic()
    with pytest.raises(TimedOut):
        rx.next(end=start + 0.15)
    assert time.monotonic() >= start + 0.15


def test_a_look_is_not_made_on_a_busy_machine_nor_after_a_yield_gave_the_core_away(
        monkeypatch):
    # Looking takes a core: not while the load average says none is spare, nor for the next
    # SKIP_LOOKS times after a yield that handed the core to another task for its time slice
    # (that look ends there: the caller blocks and is woken by the message). A clock of its
    # own: the test measures no time.
    from nnhal.service import transport

    clock = [0.0]

    def now() -> float:
        clock[0] += 1e-6
        return clock[0]

    def slow_yield() -> None:
        clock[0] += 2e-3

    polls: list[int] = []

    def poll(_timeout: float) -> list:
        polls.append(1)
        return []
    load = [0.0]
    pressure: list[float | None] = [None]  # None: the kernel gives none
    monkeypatch.setattr(transport.time, "perf_counter", now)
    monkeypatch.setattr(transport.os, "sched_yield", slow_yield)
    monkeypatch.setattr(transport.os, "getloadavg", lambda: (load[0], 0.0, 0.0))
    monkeypatch.setattr(transport, "cpu_pressure", lambda: pressure[0])
    looker = transport.Looker()
    assert looker.wanted()
    assert not looker.until(poll, 5.0)
    assert clock[0] < 0.01 and len(polls) == 2  # one more look after the long yield
    assert [looker.wanted() for _ in range(transport.SKIP_LOOKS + 1)] == \
        [False] * transport.SKIP_LOOKS + [True]
    # A long yield after which the message is there (the core went to the peer's own work):
    # the look paid, and the next ones are made.
    came = iter([[], [1]])
    assert looker.until(lambda _: next(came), clock[0] + 5.0)
    assert looker.wanted()
    # Quick yields (nobody else wants the core): on to the end.
    monkeypatch.setattr(transport.os, "sched_yield", lambda: None)
    polls.clear()
    end = clock[0] + 0.02
    assert not looker.until(poll, end)
    assert clock[0] >= end and len(polls) > 1000
    assert looker.until(lambda _: [1], clock[0] + 1)  # a message ends the look at once
    # Without CPU pressure to read: a load average of the process's cores or more, no look,
    # until read again below them.
    load[0] = float(transport._CORES)
    clock[0] += transport.LOAD_CHECK_S
    assert not looker.wanted()
    load[0] = 0.0
    assert not looker.wanted()  # read every LOAD_CHECK_S only
    clock[0] += transport.LOAD_CHECK_S
    assert looker.wanted()
    # With it, the pressure alone says: a load average past the cores with nothing waiting
    # for a core is the served work's own (its driver's threads, the looks), a low one with
    # tasks waiting is other work starting.
    more = float(transport._CORES + 1)
    for ld, p, wanted in ((more, transport.PRESSURE_BUSY - 1, True),
                          (more, transport.PRESSURE_BUSY, False),
                          (0.0, 50.0, False), (0.0, 0.0, True), (more, None, False)):
        load[0], pressure[0] = ld, p
        clock[0] += transport.LOAD_CHECK_S
        assert looker.wanted() is wanted, (ld, p)


def test_the_cpu_pressure_is_read_where_the_kernel_gives_it(tmp_path, monkeypatch):
    from nnhal.service import transport

    psi = tmp_path / "cpu"
    psi.write_text("some avg10=42.97 avg60=45.01 avg300=18.70 total=3490960699\n"
                   "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    monkeypatch.setattr(transport, "_PRESSURE", str(psi))
    assert transport.cpu_pressure() == 42.97
    psi.write_text("garbage\n")
    assert transport.cpu_pressure() is None
    monkeypatch.setattr(transport, "_PRESSURE", str(tmp_path / "absent"))
    assert transport.cpu_pressure() is None


def test_looks_rest_after_missing_their_message_several_times_in_a_row(monkeypatch):
    # A window that never fits the peer only burns a core: MISSED_LOOKS looks in a row that
    # end without the message, then SKIP_LOOKS not made; one that finds it starts the count
    # again.
    from nnhal.service import transport

    clock = [0.0]

    def now() -> float:
        clock[0] += 1e-5
        return clock[0]
    monkeypatch.setattr(transport.time, "perf_counter", now)
    monkeypatch.setattr(transport.os, "sched_yield", lambda: None)
    monkeypatch.setattr(transport.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    monkeypatch.setattr(transport, "cpu_pressure", lambda: None)
    looker = transport.Looker()

    def miss() -> bool:
        return looker.until(lambda _: [], clock[0] + 1e-3)
    for _ in range(transport.MISSED_LOOKS - 1):
        assert looker.wanted() and not miss()
    assert looker.until(lambda _: [1], clock[0] + 1e-3)  # found: the count starts again
    for _ in range(transport.MISSED_LOOKS - 1):
        assert looker.wanted() and not miss()
    assert looker.wanted()
    assert not miss()  # the MISSED_LOOKS-th in a row
    assert [looker.wanted() for _ in range(transport.SKIP_LOOKS + 1)] == \
        [False] * transport.SKIP_LOOKS + [True]


def test_no_look_is_wanted_when_looking_is_turned_off(monkeypatch):
    from nnhal.service import transport

    monkeypatch.setattr(transport.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    monkeypatch.setattr(transport, "cpu_pressure", lambda: None)
    assert transport.Looker().wanted()
    monkeypatch.setenv(transport.LOOK_ENV, "0")
    looker = transport.Looker()
    assert not any(looker.wanted() for _ in range(100))
    monkeypatch.setenv(transport.LOOK_ENV, "1")
    assert transport.Looker().wanted()


def test_a_look_through_the_receiver_reads_what_came_and_next_returns_it(pair):
    # Receiver.ready is the look's poll: it reads what has arrived (descriptors with it), so
    # next() has nothing left to wait for; the end of the stream is for next() to raise.
    a, b = pair
    rx = Receiver(b)
    assert not rx.ready()
    mem = SharedMemory.ashmem(4096)
    send_message(a, w.Kind.GET_TYPE, 3, b"body", [mem.fd])
    while not rx.ready():
        pass
    assert rx.pending()
    kind, call_id, body, fds = rx.next()
    assert (kind, call_id, bytes(body), len(fds)) == (w.Kind.GET_TYPE, 3, b"body", 1)
    assert size_of(fds[0]) == 4096
    os.close(fds[0])
    mem.close()
    a.close()
    assert rx.ready()
    with pytest.raises(Closed):
        rx.next()


def test_take_consumes_only_the_message_it_expects(pair):
    """Receiver.take (a repeated reply recognised by its bytes) returns the tail of the very
    message it expects, however its bytes arrive, and leaves any other message, shorter or
    the same length, with or without descriptors, to next()."""
    a, b = pair
    rx = Receiver(b, tick=0.05)
    body, tail = b"shapes" * 3, bytes(range(16))
    expected = w.pack_header(w.Kind.REPLY, 7, len(body) + 16, 0) + body
    send_message(a, w.Kind.REPLY, 7, body + tail)
    assert rx.take(expected, 16) == (7, tail)
    # In pieces: the header first, the rest later.
    whole = expected + tail
    t = threading.Timer(0.05, lambda: a.sendall(whole[w.HEADER_SIZE + 3:]))
    a.sendall(whole[:w.HEADER_SIZE + 3])
    t.start()
    assert rx.take(expected, 16) == (7, tail)
    t.join()
    mem = SharedMemory.ashmem(4096)
    others = [(w.Kind.ERROR, 7, b"\0\0\0\0", []),  # shorter: not waited for
              (w.Kind.REPLY, 8, body + tail, []),  # another call's
              (w.Kind.REPLY, 7, body[:-1] + b"X" + tail, []),  # other bytes
              (w.Kind.REPLY, 7, body + tail, [mem.fd])]  # with a descriptor
    for kind, cid, data, fds in others:
        send_message(a, kind, cid, data, fds)
        assert rx.take(expected, 16) is None
        got = rx.next()
        assert (got[0], got[1], bytes(got[2]), len(got[3])) == (kind, cid, data, len(fds))
        for fd in got[3]:
            os.close(fd)
    # Any call id (the service's way): the message's own is returned.
    send_message(a, w.Kind.REPLY, 1234, body + tail)
    assert rx.take(expected, 16, any_call=True) == (1234, tail)
    send_message(a, w.Kind.REPLY, 99, body[:-1] + b"X" + tail)
    assert rx.take(expected, 16, any_call=True) is None
    assert bytes(rx.next()[2]) == body[:-1] + b"X" + tail
    mem.close()
    a.close()  # the end of the stream: raised as next() raises it
    with pytest.raises(Closed):
        rx.take(expected, 16)
