"""The price of the process boundary: the same reference driver in process and served
(``nnhal serve reference`` in a child process), interleaved round by round.

* one ADD [1,16]: executeSynchronously and burst execute, p50 and p90 per execution (served
  bursts on their shared-memory rings, and the same burst path over the socket to compare),
  then the CPU cost of each piece of a served burst's round trip;
* MobileNet V1_0 (the conformance case, if present): executeSynchronously, median; and
  with part ``floor``, beside it a bare socket round trip around the same driver execution
  in a minimal child process (one byte out, the driver's time back; no wire format, no
  service, the child's own memory), about the least a blocking transport costs. For each,
  wall time minus the time the driver measured in its own process: the boundary's cost,
  apart from the driver's speed in another process (which moves the ratio by several percent
  from run to run here);
* with part ``timeline``: a served MobileNet's round trip step by step, both processes'
  calls stamped on one clock (where the time beyond the driver goes).

Prints figures with the load average; asserts nothing.

    python benchmarks/bench_service.py [--specs DIR] [--rounds N] [--n N] [--parts LIST]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from nnhal.conformance.cases import build_model, build_request, default_specs_dir, iter_cases
from nnhal.drivers.reference import ReferenceDevice
from nnhal.hal.builder import ModelBuilder, RequestBuilder
from nnhal.hal.interfaces import PreparedModelCallback
from nnhal.hal.types import (
    ErrorStatus,
    ExecutionPreference,
    MeasureTiming,
    OperandType,
    OperationType,
    Priority,
    Timing,
)
from nnhal.service.client import RemoteBurst, RemoteDevice

ROOT = Path(__file__).resolve().parent.parent


def child_env() -> dict[str, str]:
    """This environment with the checkout first on PYTHONPATH; what was there stays after it
    (packages installed beside the interpreter's own, as on a machine the tree was copied to)."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))


def load() -> str:
    """The load average, and the CPU pressure where the kernel gives it (the share of the
    last 10 s in which some task waited for a core: what says whether a core was spare, which
    the service's looks depend on; see nnhal.service.transport.Looker)."""
    from nnhal.service.transport import cpu_pressure

    pressure = cpu_pressure()
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg()) + (
        "" if pressure is None else f", cpu pressure {pressure:.1f}%")


def prepare(device, model):
    cb = PreparedModelCallback()
    device.prepare_model(model, ExecutionPreference.FAST_SINGLE_ANSWER, Priority.MEDIUM, None,
                         [], [], b"", cb)
    status, pm = cb.wait(300)
    assert status == ErrorStatus.NONE, status
    return pm


def add_model():
    b = ModelBuilder()
    x = b.input(OperandType.TENSOR_FLOAT32, [1, 16])
    y = b.input(OperandType.TENSOR_FLOAT32, [1, 16])
    act = b.scalar(OperandType.INT32, 0)
    out = b.output(OperandType.TENSOR_FLOAT32, [1, 16])
    b.operation(OperationType.ADD, [x, y, act], [out])
    return b.build()


def timed(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fn()
        out.append((time.perf_counter_ns() - t0) / 1e3)
    return out


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def start_service(sock: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "nnhal.cli", "serve", "reference",
                             "--socket", str(sock)], cwd=ROOT,
                            env=child_env())
    end = time.monotonic() + 30
    while True:
        try:
            return proc if RemoteDevice(sock).close() is None else proc
        except OSError:
            if time.monotonic() > end or proc.poll() is not None:
                proc.kill()
                raise SystemExit("the service did not start") from None
            time.sleep(0.05)


def bench_add(devices: dict, rounds: int, n: int) -> None:
    a = np.ones((1, 16), np.float32)
    setups = {}
    for name, dev in devices.items():
        pm = prepare(dev, add_model())
        rb = RequestBuilder([a, a], [64])
        status, burst = pm.configure_execution_burst()
        holds = [burst.cache_memory(p) for p in rb.request.pools]
        setups[name] = (pm, rb, burst, holds)
        if isinstance(dev, RemoteDevice):  # the same burst path over the socket, to compare
            status, sock_burst = pm.configure_execution_burst()
            sock_burst.rings.close()
            sock_burst.rings = None
            setups[f"{name} (socket)"] = (None, rb, sock_burst,
                                          [sock_burst.cache_memory(p) for p in rb.request.pools])
    sync = {k: [] for k, v in setups.items() if v[0] is not None}
    bursts = {k: [] for k in setups}
    for _ in range(rounds):  # interleaved: every variant sees the same load
        for name, (pm, rb, burst, _) in setups.items():
            if pm is not None:
                sync[name] += timed(lambda pm=pm, rb=rb: pm.execute_synchronously(rb.request),
                                    n)
            bursts[name] += timed(lambda b=burst, rb=rb: b.execute(rb.request), n)
    for label, data in (("executeSynchronously", sync), ("burst execute", bursts)):
        for name, xs in data.items():
            xs = xs[n:]  # the first round warms up
            print(f"ADD [1,16] {label:<21} {name:<18} p50 {pct(xs, .5):7.1f} us  "
                  f"p90 {pct(xs, .9):7.1f} us  ({len(xs)} runs)")
    for _, rb, burst, holds in setups.values():
        for hold in holds:
            hold.release()
        if isinstance(burst, RemoteBurst):  # an open one keeps a ring thread in the service
            burst.close()
        rb.close()


def burst_pieces(n: int = 2000) -> None:
    """The CPU cost of each piece of a served burst's round trip, all in this process (so no
    wake-up latency): best of 5 x ``n``."""
    import timeit
    import types
    import weakref

    from nnhal.hal.types import NO_TIMING, MeasureTiming, OutputShape
    from nnhal.hidl import fmq
    from nnhal.service import client, server
    from nnhal.service import wire as w
    from nnhal.service.ring import ChannelPair

    a = np.ones((1, 16), np.float32)
    rb = RequestBuilder([a, a], [64])
    req = rb.request
    dev = ReferenceDevice()
    burst = prepare(dev, add_model()).configure_execution_burst()[1]
    pair = ChannelPair.create(client.RING_CAPACITY)
    session = types.SimpleNamespace(memories={1: req.pools[0], 2: req.pools[1]}, peer="bench",
                                    service=types.SimpleNamespace(test_delay=0.0))
    served = server._RingBurst(session, burst, pair)
    remote = client.RemoteBurst.__new__(client.RemoteBurst)  # no connection: pieces only
    remote._last = client._LastRequest(weak=False)
    remote._slots = weakref.WeakKeyDictionary({req.pools[0]: (1, None),
                                               req.pools[1]: (2, None)})
    packet = remote._packet(req, MeasureTiming.NO)
    record = w.BURST_REQUEST.pack(w.BURST_REQUEST_TAG, 0, 1, 0, 0) + packet
    shapes = [OutputShape([1, 16], True)]
    result = fmq.pack_result(burst.execute(req)[0], shapes, NO_TIMING)
    creq, cres = pair.client_side()
    sreq, sres = pair.server_side()

    def ring_round_trip() -> None:
        creq.write(record)
        sreq.read()
        sres.write(result)
        cres.read()

    def best(fn) -> float:
        return min(timeit.repeat(fn, number=n, repeat=5)) / n * 1e6

    pieces = [
        ("client: pack request (first time)", lambda: fmq.pack_request(req, MeasureTiming.NO,
                                                                       [1, 2])),
        ("client: request packet (repeated)", lambda: remote._packet(req, MeasureTiming.NO)),
        ("rings: request + result, write + read", ring_round_trip),
        ("service: unpack request (first time)", lambda: fmq.unpack_request(packet)),
        ("service: serve a repeated record", lambda: served._serve(record)),
        ("  of which the driver's burst execute", lambda: burst.execute(req)),
        ("service: pack result (first time)", lambda: fmq.pack_result(
            fmq.ErrorStatus.NONE, shapes, NO_TIMING)),
        ("client: unpack result (first time)", lambda: fmq.unpack_result(result)),
    ]
    for label, fn in pieces:
        print(f"  {label:<40} {best(fn):7.2f} us")
    pair.close()
    rb.close()
    dev.close()


BLOCK = 5


def mobilenet_model(specs: Path) -> dict | None:
    cases = [c for c in iter_cases(specs, "mobilenet_224_gender_basic_fixed")
             if "V1_0" in str(c.file)]
    return cases[0].data["model"] if cases else None


def floor_child(fd: int, specs: Path) -> None:
    """The bare socket's far end: one byte in, the driver's execution, its time out."""
    sock = socket.socket(fileno=fd)
    m = mobilenet_model(specs)
    dev = ReferenceDevice()
    pm = prepare(dev, build_model(m))
    built = build_request(m)
    assert pm.execute_synchronously(built.request)[0] == ErrorStatus.NONE
    sock.sendall(b"r")
    while sock.recv(1):
        t0 = time.perf_counter_ns()
        pm.execute_synchronously(built.request)
        sock.sendall((time.perf_counter_ns() - t0).to_bytes(8, "little"))


class BareSocket:
    """A child process running the driver behind a bare socket: execute_synchronously is one
    byte out and the driver's time (8 bytes) back, about the least a blocking transport does."""

    def __init__(self, specs: Path):
        self.sock, theirs = socket.socketpair()
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--floor-child", str(theirs.fileno()), "--specs",
             str(specs)], pass_fds=[theirs.fileno()], cwd=ROOT,
            env=child_env())
        theirs.close()
        self.sock.settimeout(300)
        if self.sock.recv(1) != b"r":
            raise SystemExit("the bare socket's child did not start")

    def execute_synchronously(self, _request, _measure=None):
        self.sock.sendall(b"x")
        took = int.from_bytes(self.sock.recv(8, socket.MSG_WAITALL), "little")
        return ErrorStatus.NONE, [], Timing(took // 1000, took // 1000)

    def close(self) -> None:
        self.sock.close()
        self.proc.wait(30)


def bench_mobilenet(devices: dict, specs: Path, rounds: int, floor: bool) -> None:
    m = mobilenet_model(specs)
    if m is None:
        print(f"MobileNet V1_0 case not found under {specs}: skipped")
        return
    runs = {}
    for name, dev in devices.items():
        pm = prepare(dev, build_model(m))
        built = build_request(m)
        assert pm.execute_synchronously(built.request)[0] == ErrorStatus.NONE
        runs[name] = (pm, built)
    bare = BareSocket(specs) if floor else None
    if bare is not None:
        runs["bare socket"] = (bare, build_request(m))
    times: dict[str, list[float]] = {k: [] for k in runs}
    boundary: dict[str, list[float]] = {k: [] for k in runs}
    # In blocks of BLOCK runs, the first of each dropped: OpenBLAS threads spin for a while
    # after a matrix product, and the first run after a switch shares the cores with the
    # other side's spinners. (With OPENBLAS_NUM_THREADS=1 both sides measure alike.)
    names = list(runs)
    for r in range(rounds):  # each side in turn first: a side gains from following another
        for name in names[r % len(names):] + names[:r % len(names)]:
            pm, built = runs[name]
            for i in range(BLOCK):
                t0 = time.perf_counter_ns()
                timing = pm.execute_synchronously(built.request, MeasureTiming.YES)[2]
                took = (time.perf_counter_ns() - t0) / 1e3
                if i:
                    times[name].append(took)
                    boundary[name].append(took - timing.time_in_driver)
    print(f"BLAS threads: OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}")
    base = statistics.median(times["in process"])
    for name, xs in times.items():
        med = statistics.median(xs)
        print(f"MobileNet V1_0 executeSynchronously {name:<11} median {med / 1e3:8.2f} ms  "
              f"({(med / base - 1) * 100:+.1f}% vs in process, {len(xs)} runs)")
    # The driver's speed in another process differs from in process by a few percent, by an
    # amount that moves from run to run (the bare socket's too), as much as the boundary
    # costs: wall time minus the time the driver measured in its own process is the
    # boundary's part alone.
    for name, xs in boundary.items():
        med = statistics.median(xs)
        print(f"MobileNet V1_0 wall minus time in driver {name:<11} median {med:7.1f} us  "
              f"({med / base * 100:.1f}% of in process)")
    conn = devices["served"].conn
    print(f"served: {conn.looked} replies looked for, {conn.found} found while looking")
    if bare is not None:
        bare.close()
    for _, built in runs.values():
        built.close()


#: The calls stamped by part ``timeline`` (their starts and ends), on each side.
TIMELINE_CLIENT = [("nnhal.service.client:RemotePreparedModel.execute_synchronously", "C.exec"),
                   ("nnhal.service.client:Connection.exec_again", "C.again"),
                   ("nnhal.service.client:_LastRequest.get", "C.same"),
                   ("nnhal.service.client:send_message", "C.send"),
                   ("nnhal.service.client:Connection._await_reply", "C.look"),
                   ("nnhal.service.transport:Receiver.take", "C.take"),
                   ("nnhal.service.transport:Receiver._fill", "C.fill"),
                   ("nnhal.service.client:_RepeatedResults.again", "C.result"),
                   ("nnhal.service.client:Connection._pass_reading", "C.pass")]
TIMELINE_SERVICE = [("nnhal.service.transport:Receiver.take", "S.take"),
                    ("nnhal.service.transport:Receiver._fill", "S.fill"),
                    ("nnhal.service.server:ClientSession._sync_again", "S.again"),
                    ("nnhal.service.server:_Watcher.arm", "S.arm"),
                    ("nnhal.service.server:_Watcher.disarm", "S.disarm"),
                    ("nnhal.service.server:ClientSession.get", "S.handle"),
                    ("nnhal.drivers.common.prepared_model:PreparedModelBase."
                     "execute_synchronously", "S.driver"),
                    ("nnhal.service.server:_shapes_body", "S.body"),
                    ("nnhal.service.server:send_message", "S.send")]


def stamp_calls(targets: list[tuple[str, str]], events: list) -> None:
    """Wrap each target (``module:Class.attr`` or ``module:function``) so that its start and
    end append (label + '<' or '>', perf_counter_ns) to ``events``."""
    import importlib

    for target, label in targets:
        module, _, path = target.partition(":")
        owner: object = importlib.import_module(module)
        *outer, name = path.split(".")
        for part in outer:
            owner = getattr(owner, part)
        real = getattr(owner, name)

        def stamped(*a, _real=real, _label=label, **k):
            events.append((_label + "<", time.perf_counter_ns()))
            try:
                return _real(*a, **k)
            finally:
                events.append((_label + ">", time.perf_counter_ns()))
        setattr(owner, name, stamped)


def timeline_service(sock: str, out: str) -> None:
    """Part ``timeline``'s service: the reference driver served with its calls stamped; the
    stamps written to ``out`` (JSON) at SIGTERM."""
    import json
    import signal

    from nnhal.service.server import Service

    events: list = []
    stamp_calls(TIMELINE_SERVICE, events)
    svc = Service(ReferenceDevice(), sock)

    def dump(*_) -> None:
        with open(out, "w") as f:
            json.dump(events, f)
        os._exit(0)
    signal.signal(signal.SIGTERM, dump)
    svc.serve_forever()


def bench_timeline(specs: Path, rounds: int) -> None:
    """Where a served MobileNet synchronous execution's time beyond the driver goes: both
    sides' calls stamped (perf_counter_ns, one clock for both processes), and for the commonest
    sequence of stamps, each step's median. Each stamp costs about a microsecond itself, so
    the steps add up to more than an unstamped round trip; compare steps, not totals."""
    import bisect
    import json

    m = mobilenet_model(specs)
    if m is None:
        print(f"MobileNet V1_0 case not found under {specs}: skipped")
        return
    events: list = []
    stamp_calls(TIMELINE_CLIENT, events)
    with tempfile.TemporaryDirectory() as tmp:
        sock, out = Path(tmp) / "t.sock", Path(tmp) / "stamps.json"
        proc = subprocess.Popen([sys.executable, __file__, "--timeline-service", str(sock),
                                 str(out)], cwd=ROOT, env=child_env())
        end = time.monotonic() + 30
        while True:
            try:
                dev = RemoteDevice(sock)
                break
            except OSError:
                if time.monotonic() > end or proc.poll() is not None:
                    proc.kill()
                    raise SystemExit("the stamped service did not start") from None
                time.sleep(0.05)
        pm = prepare(dev, build_model(m))
        built = build_request(m)
        for _ in range(5):
            pm.execute_synchronously(built.request, MeasureTiming.YES)
        events.clear()
        marks = []
        for _ in range(rounds * BLOCK):
            t0 = time.perf_counter_ns()
            pm.execute_synchronously(built.request, MeasureTiming.YES)
            marks.append((t0, time.perf_counter_ns()))
        dev.close()
        proc.terminate()
        proc.wait(30)
        stamps = sorted([tuple(e) for e in json.loads(out.read_text())] + events,
                        key=lambda e: e[1])
        built.close()
    times = [t for _, t in stamps]
    sequences: dict[tuple, list[list[int]]] = {}
    for t0, t1 in marks:
        seq = stamps[bisect.bisect_left(times, t0):bisect.bisect_right(times, t1)]
        sequences.setdefault(tuple(e[0] for e in seq), []).append([t for _, t in seq])
    labels, runs = max(sequences.items(), key=lambda kv: len(kv[1]))
    print(f"stamped served MobileNet V1_0: the commonest sequence, {len(runs)} of {len(marks)} "
          f"executions (C. client, S. service; <: a call starts, >: it ends)")
    outside = 0.0
    for k, (a, b) in enumerate(zip(labels, labels[1:])):
        med = statistics.median(r[k + 1] - r[k] for r in runs) / 1e3
        if (a, b) == ("S.driver<", "S.driver>"):
            print(f"  {a:>10} -> {b:<10} {med:8.1f} us  (the driver)")
            continue
        outside += med
        print(f"  {a:>10} -> {b:<10} {med:8.1f} us")
    print(f"  steps outside the driver call: {outside:.1f} us")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--specs", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--parts", default="add,pieces,mobilenet",
                        help="comma-separated parts to run (add, pieces, mobilenet, floor: "
                             "the bare socket beside MobileNet, a third process; timeline: "
                             "where a served MobileNet round trip's time goes, step by step)")
    parser.add_argument("--floor-child", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--timeline-service", nargs=2, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.floor_child is not None:
        floor_child(args.floor_child, args.specs or default_specs_dir())
        return
    if args.timeline_service is not None:
        timeline_service(*args.timeline_service)
        return
    parts = set(args.parts.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        sock = Path(tmp) / "bench.sock"
        proc = start_service(sock)
        local, remote = ReferenceDevice(), RemoteDevice(sock)
        try:
            devices = {"in process": local, "served": remote}
            print(load())
            if "add" in parts:
                bench_add(devices, args.rounds, args.n)
                print(load())
            if "pieces" in parts:
                print("served burst round trip, CPU per piece (in process, best of 5):")
                burst_pieces()
                print(load())
            if "mobilenet" in parts:
                bench_mobilenet(devices, args.specs or default_specs_dir(), args.rounds,
                                "floor" in parts)
                print(load())
            if "timeline" in parts:
                bench_timeline(args.specs or default_specs_dir(), args.rounds)
                print(load())
        finally:
            remote.close()
            local.close()
            proc.terminate()
            proc.wait(10)


if __name__ == "__main__":
    main()
