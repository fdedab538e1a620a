"""The shared-memory ring of bursts: round trips, wrap-around, full and oversize, a hostile peer
scribbling on the shared memory, a peer killed while we wait, and FMQ packets through it.

The cross-process tests run this file as the peer (``python test_ring.py MODE SOCKFD``): it
receives the ring fds over a socketpair (SCM_RIGHTS), as the service will.
"""

from __future__ import annotations

import mmap
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from nnhal.hal.types import (
    DataLocation,
    ErrorStatus,
    MeasureTiming,
    OutputShape,
    Request,
    RequestArgument,
    Timing,
)
from nnhal.hidl.fmq import pack_request, pack_result, unpack_request, unpack_result
from nnhal.service.ring import (
    HEADER_SIZE,
    RECORD_HEADER,
    ChannelPair,
    PacketTooLarge,
    Ring,
    RingClosed,
    RingError,
    RingTimeout,
)

ROOT = Path(__file__).resolve().parents[2]


# ---- one process ---------------------------------------------------------------------------

def test_round_trip_sizes():
    with Ring.create(4096) as ring:
        for n in (0, 1, 7, 8, 9, 24, 48, 1000, ring.max_packet):
            packet = bytes(range(256)) * (n // 256) + bytes(range(n % 256))
            ring.write(packet, timeout=0)
            assert ring.read(timeout=0) == packet
        assert ring.max_packet == 4096 - RECORD_HEADER

#: A guard against hanging, not a timing goal (the machine may be loaded).
HANG_S = 10.0


def test_packets_queue_in_order():
    with Ring.create(1024) as ring:
        packets = [bytes([i]) * (i * 5) for i in range(1, 12)]
        for p in packets:
            ring.write(p, timeout=0)
        assert [ring.read(timeout=0) for _ in packets] == packets
        with pytest.raises(RingTimeout):
            ring.read(timeout=0)


def test_wrap_around_splits_headers_and_payloads():
    """Odd sizes over many laps put record headers and payloads across the end of the ring."""
    with Ring.create(256) as ring:
        split_headers = 0
        for i in range(3000):
            n = (i * 37) % (ring.max_packet + 1)
            packet = bytes((i + k) % 251 for k in range(n))
            pos = ring._w % ring.capacity
            split_headers += pos + RECORD_HEADER > ring.capacity
            ring.write(packet, timeout=0)
            assert ring.read(timeout=0) == packet
        assert ring._w > 100 * ring.capacity
        assert split_headers > 0


def test_full_ring_writer_times_out_then_proceeds():
    with Ring.create(128) as ring:
        ring.write(b"a" * 100, timeout=0)
        t0 = time.monotonic()
        with pytest.raises(RingTimeout, match="full"):
            ring.write(b"b" * 20, timeout=0.1)
        assert 0.09 <= time.monotonic() - t0 < HANG_S
        assert ring.read(timeout=0) == b"a" * 100
        ring.write(b"b" * 20, timeout=0)
        assert ring.read(timeout=0) == b"b" * 20


def test_full_ring_writer_is_woken_by_the_reader():
    with Ring.create(128, spin=0) as ring:
        ring.write(b"a" * 100, timeout=0)
        got: list[bytes] = []
        t = threading.Timer(0.05, lambda: got.append(ring.read(timeout=1)))
        t.start()
        t0 = time.monotonic()
        ring.write(b"b" * 60, timeout=5)
        assert time.monotonic() - t0 < HANG_S
        t.join()
        assert got == [b"a" * 100]
        assert ring.read(timeout=0) == b"b" * 60


def test_sleeping_reader_is_woken_by_the_writer():
    with Ring.create(4096, spin=0, recheck=10.0) as ring:
        threading.Timer(0.05, lambda: ring.write(b"late", timeout=1)).start()
        t0 = time.monotonic()
        assert ring.read(timeout=5) == b"late"
        # recheck is 10 s: returning sooner means the eventfd woke us (or the flag race,
        # counted as a late wake-up, which cannot happen with a 10 s recheck and 5 s bound)
        assert time.monotonic() - t0 < HANG_S
        assert ring.late_wakeups == 0


def test_a_skipped_signal_costs_at_most_recheck():
    """A producer that publishes without signalling (the lost wake-up of the flag handshake):
    the sleeping reader still finds the packet at its next look."""
    with Ring.create(4096, spin=0, recheck=0.02) as ring:
        silent = _attach_copy(ring)
        silent._signal = lambda: None  # type: ignore[method-assign]
        threading.Timer(0.05, lambda: silent.write(b"quiet", timeout=1)).start()
        t0 = time.monotonic()
        assert ring.read(timeout=5) == b"quiet"
        assert time.monotonic() - t0 < HANG_S
        assert ring.late_wakeups == 1
        silent.close()


def test_an_idle_reader_looks_less_and_less_often_and_fast_again_after_a_packet():
    """The sleep between looks doubles while nothing comes (2 ms up to max_recheck), so an
    idle ring costs few wake-ups; a wake-up brings it back to the short sleep."""
    with Ring.create(4096, spin=0, recheck=0.002, max_recheck=0.016) as ring:
        with pytest.raises(RingTimeout):
            ring.read(timeout=0.3)
        # 300 ms of 2 ms looks would be about 150 sleeps; doubling to 16 ms makes about 20.
        assert 5 <= ring.naps <= 60, ring.naps
        silent = _attach_copy(ring)
        silent._signal = lambda: None  # type: ignore[method-assign]
        # A skipped signal after a long idle stretch still costs at most one long look.
        threading.Timer(0.1, lambda: silent.write(b"quiet", timeout=1)).start()
        assert ring.read(timeout=5) == b"quiet"
        assert ring.late_wakeups == 1
        silent.close()


def test_oversize_packet_is_rejected_and_the_ring_still_works():
    with Ring.create(256) as ring:
        with pytest.raises(PacketTooLarge, match="exceeds"):
            ring.write(b"x" * (ring.max_packet + 1), timeout=0)
        ring.write(b"ok", timeout=0)
        assert ring.read(timeout=0) == b"ok"


@pytest.mark.parametrize("capacity", [0, 63, 100, 1 << 31, True, 4096.0])
def test_bad_capacity(capacity):
    with pytest.raises(RingError, match="capacity"):
        Ring.create(capacity)


@pytest.mark.parametrize("yield_every", [-1, 3, 6])
def test_bad_yield_every(yield_every):
    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(RingError, match="power of two"):
        Ring.create(256, yield_every=yield_every)
    assert len(os.listdir("/proc/self/fd")) == before  # the fds were closed


def test_closed_ring_raises():
    ring = Ring.create(256)
    ring.close()
    ring.close()
    with pytest.raises(RingClosed):
        ring.read(timeout=0)
    with pytest.raises(RingClosed):
        ring.write(b"x", timeout=0)


def test_read_timeout_and_alive_bound():
    with Ring.create(256) as ring:
        t0 = time.monotonic()
        with pytest.raises(RingTimeout):
            ring.read(timeout=0.1)
        assert 0.09 <= time.monotonic() - t0 < HANG_S
        t0 = time.monotonic()
        with pytest.raises(RingClosed, match="gone"):
            ring.read(timeout=10, alive=lambda: False)
        assert time.monotonic() - t0 < HANG_S


@pytest.mark.parametrize("side", ["reader", "writer"])
def test_a_long_spin_ends_by_time_and_sees_a_dead_peer(side):
    # 10**9 polls would take minutes: the spin's time bound sends the waiter to sleep, where
    # it asks whether the peer lives (on a loaded machine 2000 polls took seconds).
    with Ring.create(128, spin=10**9, spin_s=0.01) as ring:
        t0 = time.monotonic()
        with pytest.raises(RingClosed, match="gone"):
            if side == "reader":
                ring.read(timeout=60, alive=lambda: False)
            else:
                ring.write(b"a" * 100, timeout=0)
                ring.write(b"b" * 100, timeout=60, alive=lambda: False)
        assert time.monotonic() - t0 < HANG_S


def test_blocked_writer_sees_a_dead_peer():
    with Ring.create(128) as ring:
        ring.write(b"a" * 100, timeout=0)
        t0 = time.monotonic()
        with pytest.raises(RingClosed, match="gone"):
            ring.write(b"b" * 100, timeout=10, alive=lambda: False)
        assert time.monotonic() - t0 < HANG_S


@pytest.mark.parametrize("side", ["read", "write"])
def test_close_from_another_thread_ends_a_blocked_call(side):
    ring = Ring.create(128)
    if side == "write":
        ring.write(b"a" * 100, timeout=0)
    errors: list[BaseException] = []

    def blocked():
        try:
            if side == "read":
                ring.read(timeout=10)
            else:
                ring.write(b"b" * 100, timeout=10)
        except BaseException as e:  # the test inspects it
            errors.append(e)

    t = threading.Thread(target=blocked)
    t.start()
    time.sleep(0.1)
    t0 = time.monotonic()
    ring.close()
    t.join(5)
    assert not t.is_alive() and time.monotonic() - t0 < HANG_S
    assert len(errors) == 1 and isinstance(errors[0], RingClosed), errors


# ---- a hostile peer ------------------------------------------------------------------------

def _scribbler(ring: Ring) -> mmap.mmap:
    """The peer's own mapping of the ring's memory (what a hostile process can write)."""
    fd = os.dup(ring.fds()[0])
    try:
        return mmap.mmap(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)


def _attach_copy(ring: Ring) -> Ring:
    mem, ev = ring.fds()
    return Ring.attach(os.dup(mem), os.dup(ev))


@pytest.mark.parametrize("offset,value,match", [
    (0, 0xDEADBEEF, "magic"),
    (4, 2, "version"),
    (8, 4096 * 2, "capacity"),
    (8, 12, "capacity"),
])
def test_corrupt_header_is_refused_at_attach(offset, value, match):
    with Ring.create(4096) as ring:
        mm = _scribbler(ring)
        fmt = "<Q" if offset == 8 else "<I"
        struct.pack_into(fmt, mm, offset, value)
        with pytest.raises(RingError, match=match):
            _attach_copy(ring)
        mm.close()


def test_corrupt_indexes_at_attach():
    with Ring.create(4096) as ring:
        mm = _scribbler(ring)
        struct.pack_into("<Q", mm, 64, 8192)  # write index a lap and more ahead of read
        with pytest.raises(RingError, match="indexes"):
            _attach_copy(ring)
        mm.close()


@pytest.mark.parametrize("write_index", [4097 * 8, 12, 2 ** 64 - 8])
def test_write_index_out_of_bounds(write_index):
    with Ring.create(4096) as ring:
        mm = _scribbler(ring)
        struct.pack_into("<Q", mm, 64, write_index)
        t0 = time.monotonic()
        with pytest.raises(RingError, match="write index"):
            ring.read(timeout=5)
        assert time.monotonic() - t0 < HANG_S
        mm.close()


@pytest.mark.parametrize("field,value,match", [
    (0, 5000, "length"),         # longer than the ring
    (0, 200, "length"),          # longer than what was published
    (4, 8, "bad header"),        # the record names another index
    (12, 1, "bad header"),       # the zero word
    (8, 0, "checksum"),          # the crc
    (16, 0x55, "checksum"),      # a payload byte
])
def test_corrupt_record_raises_quickly(field, value, match):
    with Ring.create(4096) as ring:
        ring.write(b"p" * 40, timeout=0)
        mm = _scribbler(ring)
        if field == 16:
            mm[HEADER_SIZE + 16] = value
        else:
            struct.pack_into("<I", mm, HEADER_SIZE + field, value)
        t0 = time.monotonic()
        with pytest.raises(RingError, match=match):
            ring.read(timeout=5)
        assert time.monotonic() - t0 < HANG_S
        mm.close()


def test_record_from_another_lap_is_refused():
    """A well-formed record (right length and CRC) that names another index: what a stale
    record of the previous lap looks like, or a hostile replay."""
    import zlib
    with Ring.create(4096) as ring:
        mm = _scribbler(ring)
        payload = b"q" * 24
        tag = 4096  # the index of this slot one lap later
        struct.pack_into("<IIII", mm, HEADER_SIZE, len(payload), tag,
                         zlib.crc32(payload, tag ^ len(payload)), 0)
        mm[HEADER_SIZE + 16:HEADER_SIZE + 40] = payload
        struct.pack_into("<Q", mm, 64, 40)
        with pytest.raises(RingError, match="bad header"):
            ring.read(timeout=5)
        mm.close()


def test_published_less_than_a_record_header():
    with Ring.create(4096) as ring:
        mm = _scribbler(ring)
        struct.pack_into("<Q", mm, 64, 8)
        with pytest.raises(RingError, match="less than a record header"):
            ring.read(timeout=5)
        mm.close()


@pytest.mark.parametrize("read_index", [8, 2 ** 63, 3])
def test_corrupt_read_index_stops_the_writer(read_index):
    with Ring.create(4096) as ring:
        mm = _scribbler(ring)
        struct.pack_into("<Q", mm, 128, read_index)
        with pytest.raises(RingError, match="read index"):
            ring.write(b"x", timeout=5)
        mm.close()


def test_random_scribbling_never_crashes_or_hangs():
    """A peer writing random words all over the header and data: every read ends in a packet,
    a timeout or a RingError, quickly."""
    import random
    rng = random.Random(15)
    outcomes = {"packet": 0, "timeout": 0, "error": 0}
    for _ in range(300):
        with Ring.create(256) as ring:
            for k in range(rng.randrange(4)):
                ring.write(bytes([k]) * rng.randrange(60), timeout=0)
            mm = _scribbler(ring)
            for _ in range(rng.randrange(1, 4)):
                off = rng.randrange(0, len(mm) - 8) & ~3
                struct.pack_into("<I", mm, off, rng.getrandbits(32))
            t0 = time.monotonic()
            try:
                for _ in range(5):
                    ring.read(timeout=0)
                    outcomes["packet"] += 1
            except RingTimeout:
                outcomes["timeout"] += 1
            except RingError:
                outcomes["error"] += 1
            assert time.monotonic() - t0 < HANG_S
            mm.close()
    assert outcomes["error"] > 0 and outcomes["packet"] > 0


# ---- bad fds -------------------------------------------------------------------------------

def test_attach_refuses_an_unsealed_memfd():
    fd = os.memfd_create("x", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, HEADER_SIZE + 4096)
    ev = os.eventfd(0)
    with pytest.raises(RingError, match="sealed"):
        Ring.attach(fd, ev)
    with pytest.raises(OSError):  # the ring closed both on failure
        os.fstat(fd)


def test_attach_refuses_a_write_sealed_memfd():
    import fcntl
    fd = os.memfd_create("x", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, HEADER_SIZE + 4096)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
                | fcntl.F_SEAL_WRITE)
    with pytest.raises(RingError, match="cannot be mapped"):
        Ring.attach(fd, os.eventfd(0))


def test_packets_are_bytes_like():
    with Ring.create(4096) as ring:
        ring.write(bytearray(b"ab"), timeout=0)
        ring.write(memoryview(struct.pack("<2I", 1, 2)).cast("I"), timeout=0)
        assert ring.read(timeout=0) == b"ab"
        assert ring.read(timeout=0) == struct.pack("<2I", 1, 2)
        with pytest.raises(RingError, match="not str"):
            ring.write("text", timeout=0)


def test_attach_refuses_wrong_fd_kinds(tmp_path):
    with Ring.create(4096) as ring:
        mem, ev = ring.fds()
        r, w = os.pipe()
        with pytest.raises(RingError, match="not an eventfd"):
            Ring.attach(os.dup(mem), r)
        os.close(w)
        path = tmp_path / "f"
        path.write_bytes(b"\0" * (HEADER_SIZE + 4096))
        fd = os.open(path, os.O_RDWR)
        with pytest.raises(RingError, match="memfd"):
            Ring.attach(fd, os.dup(ev))
        with pytest.raises(RingError, match="ring memory fd"):
            Ring.attach(12345, os.dup(ev))


def test_channel_pair_attach_needs_four_fds():
    with pytest.raises(RingError, match="4 fds"):
        ChannelPair.attach([])


# ---- FMQ packets ---------------------------------------------------------------------------

def test_fmq_packets_through_the_ring():
    request = Request(
        inputs=[RequestArgument(False, DataLocation(0, 0, 64), [1, 16]),
                RequestArgument(True, DataLocation(0, 0, 0), [])],
        outputs=[RequestArgument(False, DataLocation(1, 0, 64), [1, 16])],
        pools=[None, None])
    packet = pack_request(request, MeasureTiming.YES, [7, 9])
    result = pack_result(ErrorStatus.NONE, [OutputShape([1, 16], True)], Timing(12, 34))
    pair = ChannelPair.create(4096)
    try:
        to_server, from_server = pair.client_side()
        requests, results = pair.server_side()
        for _ in range(200):  # laps around the 4 KiB rings
            to_server.write(packet, timeout=0)
            got, slots, measure = unpack_request(requests.read(timeout=0))
            assert (got.inputs, got.outputs, slots, measure) == (
                request.inputs, request.outputs, [7, 9], MeasureTiming.YES)
            results.write(result, timeout=0)
            status, shapes, timing = unpack_result(from_server.read(timeout=0))
            assert (status, shapes, timing) == (
                ErrorStatus.NONE, [OutputShape([1, 16], True)], Timing(12, 34))
    finally:
        pair.close()


# ---- another process -----------------------------------------------------------------------

def _peer_alive(sock: socket.socket):
    def alive() -> bool:
        try:
            return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
        except BlockingIOError:
            return True
        except OSError:
            return False
    return alive


def _start_peer(mode: str, pair: ChannelPair) -> tuple[subprocess.Popen, socket.socket]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, __file__, mode, str(theirs.fileno())],
                            pass_fds=[theirs.fileno()], cwd=ROOT, env=env)
    theirs.close()
    socket.send_fds(ours, [b"fds"], pair.fds())
    ours.settimeout(30)
    assert ours.recv(5) == b"ready"
    return proc, ours


def test_round_trips_with_another_process():
    pair = ChannelPair.create(1024)
    proc, sock = _start_peer("echo", pair)
    try:
        to_server, from_server = pair.client_side()
        alive = _peer_alive(sock)
        for i in range(500):
            packet = bytes([i % 256]) * (i % 300 + 1)
            to_server.write(packet, timeout=10, alive=alive)
            assert from_server.read(timeout=10, alive=alive) == packet[::-1]
        to_server.write(b"", timeout=10)  # stop
        assert proc.wait(30) == 0
    finally:
        proc.kill()
        proc.wait()
        sock.close()
        pair.close()


@pytest.mark.parametrize("with_alive", [True, False])
def test_peer_killed_while_we_wait(with_alive):
    pair = ChannelPair.create(1024)
    proc, sock = _start_peer("hang", pair)
    try:
        threading.Timer(0.2, lambda: os.kill(proc.pid, signal.SIGKILL)).start()
        _, from_server = pair.client_side()
        t0 = time.monotonic()
        if with_alive:
            with pytest.raises(RingClosed):
                from_server.read(timeout=30, alive=_peer_alive(sock))
            # killed at 0.2 s, noticed within the 50 ms alive period (plus a noisy machine)
            assert time.monotonic() - t0 < HANG_S
        else:
            with pytest.raises(RingTimeout):
                from_server.read(timeout=1.0)
            assert time.monotonic() - t0 < HANG_S
        assert proc.wait(10) == -signal.SIGKILL
    finally:
        proc.kill()
        proc.wait()
        sock.close()
        pair.close()


def _peer(mode: str, sock_fd: int) -> int:
    sock = socket.socket(fileno=sock_fd)
    _, fds, _, _ = socket.recv_fds(sock, 16, 4)
    pair = ChannelPair.attach(fds)
    requests, results = pair.server_side()
    sock.sendall(b"ready")
    if mode == "hang":
        time.sleep(60)
        return 1
    alive = _peer_alive(sock)
    while True:
        packet = requests.read(timeout=30, alive=alive)
        if not packet:
            return 0
        results.write(packet[::-1], timeout=30, alive=alive)


if __name__ == "__main__":
    sys.exit(_peer(sys.argv[1], int(sys.argv[2])))
