"""Per-execution time of a one-ADD model through executeSynchronously, a burst (its memories
cached) and a reusable execution, with ratios; ``--profile`` also prints the top costs of
executeSynchronously under cProfile. Prints figures; asserts nothing.

The request's memories are the usual client ones (RequestBuilder: unsealed ashmem), which each
execution checks for shrinking (one ``pread`` per memory); the last row runs the same request
in memories sealed against shrinking (``SharedMemory.ashmem(..., sealed=True)``), which need
no check. Goals (issue 12): reusable <= 8 us, burst <= 12 us, executeSynchronously <= 15 us.

    python benchmarks/bench_execution.py [--n N] [--rounds R] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import resource
import statistics
import time
from collections.abc import Callable

import numpy as np

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
    Request,
)
from nnhal.memory import SharedMemory

DIMS = [1, 16]


def one_add_model():
    b = ModelBuilder()
    x = b.input(OperandType.TENSOR_FLOAT32, DIMS)
    y = b.input(OperandType.TENSOR_FLOAT32, DIMS)
    act = b.scalar(OperandType.INT32, 0)
    out = b.output(OperandType.TENSOR_FLOAT32, DIMS)
    b.operation(OperationType.ADD, [x, y, act], [out])
    return b.build()


def prepare(device: ReferenceDevice):
    cb = PreparedModelCallback()
    device.prepare_model(one_add_model(), ExecutionPreference.SUSTAINED_SPEED, Priority.MEDIUM,
                         None, [], [], b"", cb)
    status, pm = cb.wait(60)
    if status != ErrorStatus.NONE:
        raise SystemExit(f"prepareModel failed: {status.name}")
    return pm


def time_paths(paths: list[tuple[str, Callable[[], object]]], n: int, rounds: int
               ) -> dict[str, list[float]]:
    """Microseconds per call of each path, one figure per round. Rounds interleave the paths,
    so a change in machine load hits every path alike."""
    for _, fn in paths:
        for _ in range(min(n, 100)):
            fn()
    times: dict[str, list[float]] = {name: [] for name, _ in paths}
    for _ in range(rounds):
        for name, fn in paths:
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            times[name].append((time.perf_counter() - t0) / n * 1e6)
    return times


def install_stand_in_into() -> None:
    """A float32 ADD kernel writing into its output, for this benchmark only (the registered
    ADD definition gets it as an instance attribute; nothing is changed in nnhal.ops)."""
    from nnhal.ops.resolver import definitions

    add = definitions()[int(OperationType.ADD)]

    def kernel_into(ctx):
        if ctx.inputs[0].type != OperandType.TENSOR_FLOAT32 or ctx.const(2) != 0:
            return None

        def into(ins, outs, rt):
            np.add(ins[0], ins[1], out=outs[0])

        return into

    add.kernel_into = kernel_into  # type: ignore[method-assign]


def minor_faults(fn: Callable[[], object], n: int) -> float:
    """Minor page faults per call of ``fn`` (after warm-up), from getrusage."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(n):
        fn()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / n


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def checked(result: tuple) -> None:
    if result[0] != ErrorStatus.NONE:
        raise SystemExit(f"execution failed: {result[0]!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=1000, help="executions per round")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--profile", action="store_true",
                        help="also profile executeSynchronously with cProfile")
    parser.add_argument("--stand-in-into", action="store_true",
                        help="give ADD a stand-in kernel writing into its output (np.add with "
                             "out=, no activation) to show the executor's cost with such kernels")
    args = parser.parse_args()
    if args.stand_in_into:
        install_stand_in_into()

    device = ReferenceDevice()
    a = np.arange(16, dtype=np.float32).reshape(DIMS)
    rb = RequestBuilder([a, a], [a.nbytes])
    sealed_mems: list[SharedMemory] = []
    try:
        pm = prepare(device)
        _, burst = pm.configure_execution_burst()
        holds = [burst.cache_memory(m) for m in rb.request.pools]
        _, execution = pm.create_reusable_execution(rb.request)
        _, burst_execution = burst.create_reusable_execution(rb.request)
        # The same request in memories sealed against shrinking: no size check per run.
        sealed_mems = [SharedMemory.ashmem(m.size, sealed=True) for m in rb.request.pools]
        for src, dst in zip(rb.request.pools, sealed_mems):
            dst.write(0, src.read(0, src.size))
        sealed = Request(rb.request.inputs, rb.request.outputs, list(sealed_mems))
        _, sealed_execution = pm.create_reusable_execution(sealed)
        paths: list[tuple[str, Callable[[], tuple]]] = [
            ("executeSynchronously", lambda: pm.execute_synchronously(rb.request)),
            ("burst.execute (cached)", lambda: burst.execute(rb.request)),
            ("reusable compute", lambda: execution.compute()),
            ("burst reusable compute", lambda: burst_execution.compute()),
            ("executeSynchronously, timed", lambda: pm.execute_synchronously(
                rb.request, MeasureTiming.YES)),
            ("reusable, sealed memories", lambda: sealed_execution.compute()),
        ]
        for _, fn in paths:
            checked(fn())
        np.testing.assert_array_equal(rb.output(0, np.float32, DIMS), a + a)
        np.testing.assert_array_equal(
            sealed_mems[1].array()[:a.nbytes].view(np.float32).reshape(DIMS), a + a)
        print(f"one ADD {DIMS} float32, {args.n} executions x {args.rounds} interleaved rounds"
              f" (load before: {load()})")
        times = time_paths(paths, args.n, args.rounds)
        base_med = statistics.median(times[paths[0][0]])
        base_min = min(times[paths[0][0]])
        print(f"  {'path':<30} {'median us':>10} {'best us':>8}   ratio to executeSynchronously "
              f"(median, best)   minor faults/call")
        for name, fn in paths:
            med, best = statistics.median(times[name]), min(times[name])
            print(f"  {name:<30} {med:10.1f} {best:8.1f}   {med / base_med:5.2f} "
                  f"{best / base_min:5.2f}   {minor_faults(fn, args.n):8.3f}")
        print(f"  (load after: {load()})")
        del holds
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(args.n):
                pm.execute_synchronously(rb.request)
            prof.disable()
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(15)
            print(f"\ncProfile of {args.n} x executeSynchronously (by own time):")
            print(out.getvalue())
    finally:
        for mem in sealed_mems:
            mem.close()
        rb.close()
        device.close()


if __name__ == "__main__":
    main()
