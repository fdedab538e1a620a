"""The served figures of two code trees side by side, interleaved block by block, so that both
see the same load (on a shared machine the load moves the served round trip by more than a
change does from one run to the next).

Each tree gets a worker process (its own ``nnhal serve reference`` child and its own client
code, imported from that tree) driven over a pipe; round by round each worker runs a block of
served MobileNet V1_0 executions (the conformance case), then of synchronous ADD [1,16]
executions, then of burst executions on the rings, the first tree first in even rounds and
last in odd ones. Run it twice with the trees swapped: a tree's position still favours it by
a few microseconds at times.

    python benchmarks/bench_trees.py OLD_TREE NEW_TREE [--rounds N] [--specs DIR]

Prints, per tree, the medians (sync ADD p50, ring burst p50, MobileNet's wall time minus the
time its driver measured, and that as a share of the driver's own median time) with the load
average before and after. Asserts nothing. ``git worktree add /tmp/base main`` makes a tree
of the code before a change.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

MOBILENET_BLOCK, ADD_BLOCK = 4, 100


def load() -> str:
    pressure = None
    try:
        with open("/proc/pressure/cpu", "rb") as f:  # (this script may run any tree's code)
            pressure = float(f.readline().split(b"avg10=", 1)[1].split(None, 1)[0])
    except (OSError, IndexError, ValueError):
        pass
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg()) + (
        "" if pressure is None else f", cpu pressure {pressure:.1f}%")


def worker(specs: Path) -> None:
    """Run in a tree (its root the working directory and PYTHONPATH): answer block commands
    on stdin."""
    import tempfile

    import numpy as np

    sys.path[0] = str(Path.cwd() / "benchmarks")  # the tree's, not this script's
    from bench_service import add_model, mobilenet_model, prepare, start_service

    from nnhal.conformance.cases import build_model, build_request
    from nnhal.hal.builder import RequestBuilder
    from nnhal.hal.types import MeasureTiming
    from nnhal.service.client import RemoteDevice

    with tempfile.TemporaryDirectory() as tmp:
        proc = start_service(Path(tmp) / "bench.sock")
        dev = RemoteDevice(Path(tmp) / "bench.sock")
        try:
            m = mobilenet_model(specs)
            if m is None:
                raise SystemExit(f"MobileNet V1_0 case not found under {specs}")
            pm, built = prepare(dev, build_model(m)), build_request(m)
            add_pm = prepare(dev, add_model())
            a = np.ones((1, 16), np.float32)
            rb = RequestBuilder([a, a], [64])
            burst = add_pm.configure_execution_burst()[1]
            holds = [burst.cache_memory(p) for p in rb.request.pools]
            pm.execute_synchronously(built.request)
            add_pm.execute_synchronously(rb.request)
            burst.execute(rb.request)
            print("ready", flush=True)
            for line in sys.stdin:
                what, n = line.split()
                out: list = []
                for i in range(int(n) + 1):  # the first of each block warms up
                    t0 = time.perf_counter_ns()
                    if what == "mobilenet":
                        timing = pm.execute_synchronously(built.request, MeasureTiming.YES)[2]
                    elif what == "add":
                        add_pm.execute_synchronously(rb.request)
                    elif what == "burst":
                        burst.execute(rb.request)
                    else:
                        return
                    took = (time.perf_counter_ns() - t0) / 1e3
                    if i:
                        out.append([took - timing.time_in_driver, timing.time_in_driver]
                                   if what == "mobilenet" else took)
                print(json.dumps(out), flush=True)
        finally:
            for hold in locals().get("holds", []):
                hold.release()
            if "burst" in locals():
                burst.close()
            dev.close()
            proc.terminate()
            proc.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trees", nargs=2, type=Path)
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--specs", type=Path, default=None)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.specs)
        return
    from nnhal.conformance.cases import default_specs_dir

    specs = (args.specs or default_specs_dir()).resolve()
    trees = [t.resolve() for t in args.trees]
    workers = []
    for tree in trees:
        p = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--worker", str(tree), str(tree),
             "--specs", str(specs)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            cwd=tree, env=dict(os.environ, PYTHONPATH=str(tree)))
        if p.stdout.readline().strip() != "ready":  # type: ignore[union-attr]
            raise SystemExit(f"{tree}: the worker did not start")
        workers.append(p)

    def ask(p: subprocess.Popen, what: str, n: int) -> list:
        p.stdin.write(f"{what} {n}\n")  # type: ignore[union-attr]
        p.stdin.flush()  # type: ignore[union-attr]
        return json.loads(p.stdout.readline())  # type: ignore[union-attr]

    got = {t: {"mobilenet": [], "add": [], "burst": []} for t in trees}
    print(load())
    for r in range(args.rounds):
        order = list(zip(trees, workers))
        for what, n in (("mobilenet", MOBILENET_BLOCK), ("add", ADD_BLOCK),
                        ("burst", ADD_BLOCK)):
            for tree, p in order if r % 2 == 0 else order[::-1]:
                got[tree][what] += ask(p, what, n)
    for p in workers:
        p.stdin.write("quit 0\n")  # type: ignore[union-attr]
        p.stdin.flush()  # type: ignore[union-attr]
        p.wait(30)
    print(load())
    for tree in trees:
        d = got[tree]
        beyond = statistics.median(x[0] for x in d["mobilenet"])
        driver = statistics.median(x[1] for x in d["mobilenet"])
        print(f"{tree}: sync ADD p50 {statistics.median(d['add']):.1f} us, ring burst p50 "
              f"{statistics.median(d['burst']):.1f} us, MobileNet beyond the driver "
              f"{beyond:.1f} us ({beyond / driver * 100:.1f}% of the driver's {driver / 1e3:.2f}"
              f" ms; {len(d['mobilenet'])} runs)")


if __name__ == "__main__":
    main()
