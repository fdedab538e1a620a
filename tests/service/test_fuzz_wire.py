"""A fuzzer of the wire format against a served reference driver: valid messages (AIDL v4's
calls with hints among them) mutated
(bit flips, truncations, random bodies, wrong descriptor counts, clients vanishing mid-message,
clients that stop mid-message and stay connected, slow writers sending a message in pieces).
The service answers or drops the offending client, never crashes, cuts every stalled client
within its partial-message bound, and once the clients are gone it holds nothing (no
connection, object or budgeted byte) and no descriptor leaked."""

from __future__ import annotations

import array
import itertools
import os
import random
import socket
import threading
import time

import pytest
from helpers import add_model

from nnhal.drivers.reference import ReferenceDevice
from nnhal.hal.types import (
    DataLocation,
    ExecutionConfig,
    ExtensionNameAndPrefix,
    MeasureTiming,
    PrepareModelConfig,
    Request,
    RequestArgument,
    TokenValuePair,
)
from nnhal.memory import SharedMemory
from nnhal.service import wire as w
from nnhal.service.client import RemoteDevice
from nnhal.service.server import Limits, Service
from nnhal.service.wire import Kind, Writer

MESSAGES = 3000
#: The partial-message bound of the fuzzed service: short, so stalled clients go quickly.
PARTIAL_S = 0.5


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def seeds(mem_a: SharedMemory, mem_b: SharedMemory) -> list[tuple[Kind, Writer]]:
    ids = itertools.count(1)
    out = []

    def make(kind, fill):
        wr = Writer(lambda m: (next(ids), True))
        fill(wr)
        out.append((kind, wr))

    model = add_model((2, 2))
    req = Request([RequestArgument(False, DataLocation(0, 0, 16), []),
                   RequestArgument(False, DataLocation(0, 16, 16), [])],
                  [RequestArgument(False, DataLocation(1, 0, 16), [])], [mem_a, mem_b])
    make(Kind.GET_TYPE, lambda wr: None)
    make(Kind.GET_SUPPORTED_OPERATIONS, lambda wr: w.put_model(wr, model))

    def prep(wr):
        w.put_model(wr, model)
        wr.i32(1)
        wr.i32(1)
        wr.opt_i64(None, "d")
        w.put_handles(wr, [], "m")
        w.put_handles(wr, [], "d")
        w.put_token(wr, b"")
    make(Kind.PREPARE_MODEL, prep)
    for kind in (Kind.EXECUTE_SYNCHRONOUSLY, Kind.EXECUTE, Kind.BURST_EXECUTE):
        def ex(wr):
            wr.u32(1)
            w.put_request(wr, req)
            wr.i32(0)
            wr.opt_i64(None, "d")
            wr.opt_i64(None, "l")
        make(kind, ex)
    make(Kind.CONFIGURE_BURST, lambda wr: wr.u32(1))
    # AIDL v4: the feature level and the calls with a config (hints, extension table)
    hints = (TokenValuePair(0x7AAA0001, b"\1\2\3"), TokenValuePair(5, b""))
    table = (ExtensionNameAndPrefix("vendor.ext", 0x7AAA),)
    config = ExecutionConfig(MeasureTiming.YES, 10**9, hints, table)
    make(Kind.GET_FEATURE_LEVEL, lambda wr: None)
    make(Kind.PREPARE_MODEL_WITH_CONFIG, lambda wr: (
        w.put_model(wr, model),
        w.put_prepare_config(wr, PrepareModelConfig(compilation_hints=hints,
                                                    extension_name_to_prefix=table))))
    for kind in (Kind.EXECUTE_SYNCHRONOUSLY_WITH_CONFIG, Kind.BURST_EXECUTE_WITH_CONFIG):
        make(kind, lambda wr: (wr.u32(1), w.put_request(wr, req),
                               w.put_execution_config(wr, config), wr.opt_i64(None, "d")))
    make(Kind.EXECUTE_FENCED_WITH_CONFIG, lambda wr: (
        wr.u32(1), w.put_request(wr, req), wr.u32(0), w.put_execution_config(wr, config),
        wr.opt_i64(None, "d"), wr.opt_i64(None, "d")))
    make(Kind.CREATE_REUSABLE_WITH_CONFIG, lambda wr: (
        wr.u32(1), w.put_request(wr, req), w.put_execution_config(wr, config)))
    make(Kind.COPY_TO, lambda wr: (wr.u32(1), wr.memory(mem_a)))
    make(Kind.FENCE_STATE, lambda wr: w.put_fence_state(wr, 1, w.FENCE_SIGNALED, None))
    make(Kind.RELEASE, lambda wr: wr.u32s([1, 2], "h"))
    return out


def mutate(rng: random.Random, kind: Kind, body: bytes, nfds: int
           ) -> tuple[int, bytes, int, int, bool]:
    """(kind, body, descriptors to attach, nfds in the header, framing kept)."""
    choice = rng.randrange(8)
    b = bytearray(body)
    if choice == 0 and b:  # flip bits
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    elif choice == 1 and b:  # truncate, header consistent
        b = b[:rng.randrange(len(b))]
    elif choice == 2:  # random body
        b = bytearray(rng.randbytes(rng.randrange(64)))
    elif choice == 3:  # overwrite a u32 with a large count
        if len(b) >= 4:
            i = rng.randrange(len(b) - 3)
            b[i:i + 4] = rng.choice([0xFFFFFFFF, 0x7FFFFFFF, 1 << 24, 255]).to_bytes(4, "little")
    elif choice == 4:  # another kind
        kind = rng.choice(list(Kind))
    elif choice == 5:  # one descriptor fewer or more than the body names
        return kind, bytes(b), max(0, nfds + rng.choice([-1, 1])), None, True
    elif choice == 6:  # header lies about descriptors: framing broken
        return kind, bytes(b), nfds, nfds + 1, False
    return kind, bytes(b), nfds, nfds, True


def drain(sock: socket.socket) -> None:
    while True:
        try:
            data, anc, _, _ = sock.recvmsg(1 << 16, socket.CMSG_SPACE(253 * 4),
                                           socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            return
        for level, typ, payload in anc:
            if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(payload[:len(payload) - len(payload) % 4])
                for fd in fds:
                    os.close(fd)
        if not data:
            return


@pytest.mark.parametrize("seed", [1, 2])
def test_fuzzed_messages_never_crash_or_leak(tmp_path, seed):
    device = ReferenceDevice()
    svc = Service(device, tmp_path / "f.sock", limits=Limits(partial_s=PARTIAL_S))
    t = threading.Thread(target=svc.serve_forever, daemon=True)
    t.start()
    mem_a, mem_b = SharedMemory.ashmem(32), SharedMemory.ashmem(16)
    good = RemoteDevice(svc.path)
    good_type = good.get_type()
    base = open_fds()
    rng = random.Random(seed)
    corpus = seeds(mem_a, mem_b)
    sock = None
    sent = 0
    stalled: list[socket.socket] = []  # stopped inside a message, left connected
    slow = 0
    try:
        for _ in range(MESSAGES):
            if sock is None:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.connect(svc.path)
            kind, wr = rng.choice(corpus)
            k, body, nfd, header_nfds, framed = mutate(rng, kind, bytes(wr.buf), len(wr.fds))
            fds = [mem_a.fd if i % 2 == 0 else mem_b.fd for i in range(nfd)]
            hdr = w.HEADER.pack(w.MAGIC, w.VERSION, k, rng.randrange(1 << 16), len(body),
                                header_nfds if header_nfds is not None else nfd, 0)
            data = hdr + body
            how = rng.randrange(40)
            if how == 0:  # vanish mid-message
                data = data[:rng.randrange(len(data) + 1)]
                framed = False
            elif how == 1:  # stop mid-message (at least one byte of it sent) and stay
                data = data[:rng.randrange(1, len(data))]
            pieces = [data]
            if how in (2, 3) and len(data) > 1:  # a slow writer: the message in pieces
                cuts = sorted(rng.sample(range(1, len(data)), min(3, len(data) - 1)))
                pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]
                slow += 1
            try:
                for i, piece in enumerate(pieces):
                    if i:
                        time.sleep(0.002)
                    if fds and i == 0:
                        sock.sendmsg([piece], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                                array.array("i", fds))])
                    else:
                        sock.sendall(piece)
                sent += 1
            except OSError:
                framed = False
            drain(sock)
            if how == 1 and framed:
                stalled.append(sock)
                sock = None
            elif not framed:
                sock.close()
                sock = None
        assert sent > MESSAGES // 2
        # Every client that stopped inside a message is cut within the bound.
        end = time.monotonic() + PARTIAL_S + 15
        for s in stalled:
            s.settimeout(max(0.1, end - time.monotonic()))
            try:
                while s.recv(4096):
                    pass
            except TimeoutError:
                raise AssertionError("a stalled client was not cut") from None
            except OSError:
                pass
        # The service still answers a well-behaved client...
        assert good.get_type() == good_type
        other = RemoteDevice(svc.path)
        assert other.get_type() == good_type
        other.close()
    finally:
        if sock is not None:
            sock.close()
        for s in stalled:
            s.close()
        good.close()
    # ...and once every client is gone it holds nothing, and no descriptor leaked.
    end = time.monotonic() + 10
    while (svc.sessions or svc.objects()) and time.monotonic() < end:
        time.sleep(0.05)
    assert not svc.sessions and svc.objects() == 0 and svc.budget.held == 0
    import gc
    gc.collect()
    end = time.monotonic() + 5
    while open_fds() > base and time.monotonic() < end:
        time.sleep(0.05)
        gc.collect()
    assert open_fds() <= base
    print(f"fuzzer: {sent} messages ({len(stalled)} stalled clients, {slow} slow writers), "
          f"service messages decoded {svc.messages}")
    svc.stop()
    t.join(5)
    device.close()
    mem_a.close()
    mem_b.close()
