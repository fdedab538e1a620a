"""Round-trip latency of a burst's two packets between two processes: the shared-memory ring
(spinning, and blocking on the eventfd at once) against a Unix SOCK_SEQPACKET socketpair.

The client writes the FMQ request packet of one ADD [1,16] (2 inputs, 1 output, 3 pools: 14
datums, 336 bytes) and waits for the FMQ result packet (5 datums, 120 bytes) that a peer process
sends back as soon as it has read the request. Transport only: nobody decodes or executes.
The modes run in interleaved rounds so that the machine's noise falls on all of them alike.
Prints figures; asserts nothing.

    python benchmarks/bench_ring.py [--rounds 10] [--per-round 2000]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from nnhal.hal.types import (
    DataLocation,
    ErrorStatus,
    MeasureTiming,
    OutputShape,
    Request,
    RequestArgument,
    Timing,
)
from nnhal.hidl.fmq import pack_request, pack_result
from nnhal.service.ring import ChannelPair

ROOT = Path(__file__).resolve().parent.parent
#: mode -> (spin, yield_every) on both sides; ring-spin is the default (2000 polls, yielding
#: the core every 4), ring-spin-noyield never yields, ring-block sleeps at once
MODES = {"ring-spin": (2000, 4), "ring-spin-noyield": (2000, 0), "ring-block": (0, 0)}


def packets() -> tuple[bytes, bytes]:
    arg = RequestArgument(False, DataLocation(0, 0, 64), [1, 16])
    request = Request([arg, RequestArgument(False, DataLocation(1, 0, 64), [1, 16])],
                      [RequestArgument(False, DataLocation(2, 0, 64), [1, 16])], [0, 1, 2])
    return (pack_request(request, MeasureTiming.NO, [0, 1, 2]),
            pack_result(ErrorStatus.NONE, [OutputShape([1, 16], True)], Timing()))


def load() -> str:
    return "load {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def percentile(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


def start_peer(mode: str) -> tuple[subprocess.Popen, socket.socket, ChannelPair | None]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    proc = subprocess.Popen([sys.executable, __file__, "--peer", mode, str(theirs.fileno())],
                            pass_fds=[theirs.fileno()], cwd=ROOT,
                            env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                                [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])))
    theirs.close()
    pair = None
    if mode != "socket":
        pair = ChannelPair.create(1 << 16, spin=MODES[mode][0],
                                  yield_every=MODES[mode][1])
        socket.send_fds(ours, [b"fds"], pair.fds())
    ours.settimeout(30)
    assert ours.recv(16) == b"ready"
    ours.settimeout(None)
    return proc, ours, pair


def run_round(mode: str, sock: socket.socket, pair: ChannelPair | None, request: bytes,
              n: int) -> list[float]:
    """n round trips; microseconds each."""
    clock = time.perf_counter_ns
    out = []
    if pair is None:
        send, recv = sock.send, sock.recv
        for _ in range(n):
            t0 = clock()
            send(request)
            recv(4096)
            out.append((clock() - t0) / 1e3)
    else:
        to_server, from_server = pair.client_side()
        write, read = to_server.write, from_server.read
        for _ in range(n):
            t0 = clock()
            write(request, 5)
            read(5)
            out.append((clock() - t0) / 1e3)
    return out


def peer(mode: str, fd: int) -> None:
    sock = socket.socket(fileno=fd)
    _, result = packets()
    if mode == "socket":
        sock.send(b"ready")
        while True:
            packet = sock.recv(4096)
            if not packet or packet == b"stop":
                return
            sock.send(result)
    _, fds, _, _ = socket.recv_fds(sock, 16, 4)
    requests, results = ChannelPair.attach(fds, spin=MODES[mode][0],
                                          yield_every=MODES[mode][1]).server_side()
    sock.send(b"ready")

    def alive() -> bool:
        try:
            return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
        except BlockingIOError:
            return True

    while True:
        if not requests.read(None, alive):
            return
        results.write(result, 5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--per-round", type=int, default=2000)
    ap.add_argument("--peer", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.peer:
        peer(args.peer[0], int(args.peer[1]))
        return
    request, result = packets()
    print(f"request packet {len(request)} B, result packet {len(result)} B; "
          f"{args.rounds} interleaved rounds x {args.per_round} round trips; "
          f"{os.cpu_count()} CPUs; {load()}")
    modes = [*MODES, "socket"]
    peers = {m: start_peer(m) for m in modes}
    times: dict[str, list[float]] = {m: [] for m in modes}
    try:
        for m in modes:  # warm-up
            run_round(m, peers[m][1], peers[m][2], request, 200)
        for _ in range(args.rounds):
            for m in modes:
                time.sleep(0.05)  # the previous mode's peer stops spinning and sleeps
                times[m] += run_round(m, peers[m][1], peers[m][2], request, args.per_round)
    finally:
        for proc, sock, pair in peers.values():
            if pair is not None:
                pair.request.write(b"", 1)
            else:
                sock.send(b"stop")
            proc.wait(10)
            sock.close()
    print(f"{'mode':17} {'p50 us':>8} {'p90 us':>8} {'p99 us':>8} {'mean us':>8}  late wake-ups")
    for m in modes:
        xs = times[m]
        pair = peers[m][2]
        late = "" if pair is None else str(pair.result.late_wakeups)
        print(f"{m:17} {statistics.median(xs):8.1f} {percentile(xs, 0.9):8.1f} "
              f"{percentile(xs, 0.99):8.1f} {statistics.fmean(xs):8.1f}  {late}")
    print(load())


if __name__ == "__main__":
    main()
