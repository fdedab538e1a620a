"""The price of the process boundary: the same reference driver in process and served
(``nnhal serve reference`` in a child process), interleaved round by round.

* one ADD [1,16]: executeSynchronously and burst execute, p50 and p90 per execution;
* MobileNet V1_0 (the conformance case, if present): executeSynchronously, median.

Prints figures with the load average; asserts nothing.

    python benchmarks/bench_service.py [--specs DIR] [--rounds N] [--n N]
"""

from __future__ import annotations

import argparse
import os
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
    OperandType,
    OperationType,
    Priority,
)
from nnhal.service.client import RemoteDevice

ROOT = Path(__file__).resolve().parent.parent


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


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
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
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
    sync = {k: [] for k in devices}
    bursts = {k: [] for k in devices}
    for _ in range(rounds):
        for name, (pm, rb, burst, _) in setups.items():
            sync[name] += timed(lambda pm=pm, rb=rb: pm.execute_synchronously(rb.request), n)
            bursts[name] += timed(lambda b=burst, rb=rb: b.execute(rb.request), n)
    for label, data in (("executeSynchronously", sync), ("burst execute", bursts)):
        for name, xs in data.items():
            xs = xs[n:]  # the first round warms up
            print(f"ADD [1,16] {label:<21} {name:<11} p50 {pct(xs, .5):7.1f} us  "
                  f"p90 {pct(xs, .9):7.1f} us  ({len(xs)} runs)")
    for _, rb, _, _ in setups.values():
        rb.close()


BLOCK = 5


def bench_mobilenet(devices: dict, specs: Path, rounds: int) -> None:
    cases = [c for c in iter_cases(specs, "mobilenet_224_gender_basic_fixed")
             if "V1_0" in str(c.file)]
    if not cases:
        print(f"MobileNet V1_0 case not found under {specs}: skipped")
        return
    m = cases[0].data["model"]
    runs = {}
    for name, dev in devices.items():
        pm = prepare(dev, build_model(m))
        built = build_request(m)
        assert pm.execute_synchronously(built.request)[0] == ErrorStatus.NONE
        runs[name] = (pm, built)
    times: dict[str, list[float]] = {k: [] for k in devices}
    # In blocks of BLOCK runs, the first of each dropped: OpenBLAS threads spin for a while
    # after a matrix product, and the first run after a switch shares the cores with the
    # other side's spinners. (With OPENBLAS_NUM_THREADS=1 both sides measure alike.)
    for _ in range(rounds):
        for name, (pm, built) in runs.items():
            times[name] += timed(lambda pm=pm, b=built: pm.execute_synchronously(b.request),
                                 BLOCK)[1:]
    print(f"BLAS threads: OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}")
    base = statistics.median(times["in process"])
    for name, xs in times.items():
        med = statistics.median(xs)
        print(f"MobileNet V1_0 executeSynchronously {name:<11} median {med / 1e3:8.2f} ms  "
              f"({(med / base - 1) * 100:+.1f}% vs in process, {len(xs)} runs)")
    for _, built in runs.values():
        built.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--specs", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--n", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sock = Path(tmp) / "bench.sock"
        proc = start_service(sock)
        local, remote = ReferenceDevice(), RemoteDevice(sock)
        try:
            devices = {"in process": local, "served": remote}
            print(load())
            bench_add(devices, args.rounds, args.n)
            print(load())
            bench_mobilenet(devices, args.specs or default_specs_dir(), args.rounds)
            print(load())
        finally:
            remote.close()
            local.close()
            proc.terminate()
            proc.wait(10)


if __name__ == "__main__":
    main()
