"""What the arena is worth on the MobileNet V1_0 conformance case: the same model prepared with
the arena and without it (``NNHAL_NO_ARENA=1`` at preparation: every temporary a new array at
each run), executions interleaved, with the peak of memory allocated during one execution
(tracemalloc; numpy reports its buffers to it; the arena itself is allocated once, before,
and its size is printed apart) and the minor page faults per execution (getrusage). Prints
figures; asserts nothing.

    python benchmarks/bench_arena.py [--specs DIR] [--rounds R] [--n N]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time
import tracemalloc
from pathlib import Path

from nnhal.conformance.cases import build_model, build_request, default_specs_dir, iter_cases
from nnhal.drivers.reference import ReferenceDevice
from nnhal.executor.plan import NO_ARENA_ENV
from nnhal.hal.interfaces import PreparedModelCallback
from nnhal.hal.types import ErrorStatus, ExecutionPreference, MeasureTiming, Priority


def prepare(device, model, arena: bool):
    saved = os.environ.pop(NO_ARENA_ENV, None)
    if not arena:
        os.environ[NO_ARENA_ENV] = "1"
    try:
        cb = PreparedModelCallback()
        device.prepare_model(model, ExecutionPreference.SUSTAINED_SPEED, Priority.MEDIUM, None,
                             [], [], b"", cb)
        status, pm = cb.wait(300)
    finally:
        os.environ.pop(NO_ARENA_ENV, None)
        if saved is not None:
            os.environ[NO_ARENA_ENV] = saved
    if status != ErrorStatus.NONE:
        raise SystemExit(f"prepareModel failed: {status.name}")
    return pm


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--specs", type=Path, default=None)
    parser.add_argument("--case", default="mobilenet_224_gender_basic_fixed",
                        help="case name pattern (the V1_0 float MobileNet by default)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--n", type=int, default=5, help="executions per round and variant")
    args = parser.parse_args()
    specs = args.specs or default_specs_dir()
    cases = list(iter_cases(specs, args.case))
    if not cases:
        raise SystemExit(f"no case {args.case!r} under {specs}")
    case = cases[0]
    m = case.data["model"]
    device = ReferenceDevice()
    try:
        built = build_request(m)
        pms = {"arena": prepare(device, build_model(m), True),
               "no arena": prepare(device, build_model(m), False)}

        def runner(pm):
            def run():
                status, _, _ = pm.execute_synchronously(built.request, MeasureTiming.NO)
                if status != ErrorStatus.NONE:
                    raise SystemExit(f"execution failed: {status.name}")
            return run

        runs = {name: runner(pm) for name, pm in pms.items()}
        for run in runs.values():
            for _ in range(3):
                run()
        print(f"{case.name}: {args.rounds} interleaved rounds x {args.n} executions per variant"
              f" (load before: {load()})")
        times: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.rounds):
            for name, run in runs.items():
                for _ in range(args.n):
                    t0 = time.perf_counter()
                    run()
                    times[name].append((time.perf_counter() - t0) * 1e3)
        after = load()
        print(f"  {'variant':<10} {'median ms':>10} {'best ms':>8} {'peak alloc KiB':>15} "
              f"{'minor faults/exec':>18}")
        for name, run in runs.items():
            tracemalloc.start()
            run()
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
            run()
            peak = tracemalloc.get_traced_memory()[1] - base
            tracemalloc.stop()
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            for _ in range(10):
                run()
            faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10
            ts = times[name]
            print(f"  {name:<10} {statistics.median(ts):10.2f} {min(ts):8.2f} "
                  f"{peak / 1024:15.1f} {faults:18.1f}")
        pool = pms["arena"].plan.main.arena_pool
        if pool is not None:
            print(f"  arena: {pool.layout.total / 1024:.1f} KiB per arena, "
                  f"{pool.created} created")
        print(f"  (load after: {after})")
    finally:
        device.close()


if __name__ == "__main__":
    main()
