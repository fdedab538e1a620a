"""The .tflite import by stage (verifier, tables to records, operators to HAL), against a
baseline checkout, in the same rounds: each figure is the main thread's CPU time
(``time.thread_time``: the pool's writer thread and whatever else the machine runs are left
out), the cold one the first import in a fresh process (imports done, ``gc.freeze()`` after
them), the warm one the median of repeats in that process without the pool's copy; then the
calls one import makes (cProfile: Python functions, and C functions). Prints figures with the
load; asserts nothing.

    python benchmarks/bench_import.py --baseline /work/wt-base MODEL.tflite ...
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

_CHILD = r'''
import json, os, statistics, sys, tempfile, time
os.environ["NNHAL_CACHE_DIR"] = tempfile.mkdtemp()
from nnhal import Session  # noqa: F401  (what a user imports)
import nnhal.tflite.importer as I
import nnhal.hal.builder as B
from nnhal.memory.frame import Frame
from nnhal.tflite import schema
from nnhal.tflite.import_read import read_model
from pathlib import Path
import gc
gc.freeze()
path, reps, profile = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
I.analyse = lambda *a, **k: None  # the analysis is another stage (nnhal.analysis)


def once(source, pool=True):
    clock = time.thread_time
    t0 = clock()
    lf = schema.load(source, path)
    t1 = clock()
    subgraphs = read_model(lf)
    t2 = clock()
    mb = I.ModelBuilder()
    if pool:
        mb.use_source(lf.frame if lf.frame is not None else lf.data)
    waited = [0.0]
    build = mb.build

    def timed_build():
        t = clock()
        try:
            return build()
        finally:
            waited[0] = clock() - t
    mb.build = timed_build
    with lf.guard():
        imp = I._Importer(lf.name, subgraphs, mb)
        token = I.import_ext.CURRENT.set(imp.extensions)
        try:
            imp.run()
        finally:
            I.import_ext.CURRENT.reset(token)
    t3 = clock()
    return {"verifier (load)": t1 - t0, "tables to records": t2 - t1,
            "operators to HAL": t3 - t2 - waited[0], "all but the pool": t3 - t0 - waited[0]}


if profile:
    import cProfile, pstats
    data = open(path, "rb").read()
    pr = cProfile.Profile()
    pr.enable()
    once(data, pool=False)
    pr.disable()
    stats = pstats.Stats(pr).stats
    print(json.dumps({"Python calls": sum(v[1] for k, v in stats.items() if k[0] != "~"),
                      "C calls": sum(v[1] for k, v in stats.items() if k[0] == "~")}))
else:
    out = {"cold " + k: v * 1e3 for k, v in once(Frame.read(Path(path))).items()}
    B.BACKGROUND_BYTES = 1 << 62  # warm: no writer thread, no pool copy
    B.ModelBuilder.build = lambda self: B.Model(main=self.build_subgraph())
    data = open(path, "rb").read()
    warm = [once(data, pool=False) for _ in range(reps)]
    for k in warm[0]:
        out["warm " + k] = statistics.median(w[k] for w in warm) * 1e3
    print(json.dumps(out))
'''


def _run(root: str, model: str, reps: int, profile: bool) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=root)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    done = subprocess.run([sys.executable, "-c", _CHILD, model, str(reps), str(int(profile))],
                          env=env, cwd=root, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise SystemExit(f"{root}: {done.stderr[-2000:]}")
    return json.loads(lines[0])


def _load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="+")
    p.add_argument("--rounds", type=int, default=8, help="fresh processes per checkout")
    p.add_argument("--reps", type=int, default=10, help="warm imports per process")
    p.add_argument("--baseline", help="another checkout, timed in the same rounds")
    args = p.parse_args()
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    roots = [here] + ([os.path.abspath(args.baseline)] if args.baseline else [])
    for model in args.models:
        results: dict[str, list[dict[str, float]]] = {r: [] for r in roots}
        for k in range(args.rounds):
            for root in roots if k % 2 == 0 else roots[::-1]:
                results[root].append(_run(root, model, args.reps, False))
        calls = {r: _run(r, model, 1, True) for r in roots}
        print(f"{os.path.basename(model)}: main-thread CPU ms, medians of {args.rounds} "
              f"processes (load {_load()})")
        head = "".join(f"{os.path.basename(r):>14}" for r in roots)
        print(f"  {'':28}{head}" + ("   this / baseline (median of rounds)" if args.baseline
                                    else ""))
        for key in results[here][0]:
            meds = [statistics.median(x[key] for x in results[r]) for r in roots]
            line = f"  {key:28}" + "".join(f"{m:14.2f}" for m in meds)
            if args.baseline:
                ratio = statistics.median(a[key] / b[key] for a, b in
                                          zip(results[here], results[roots[1]]) if b[key])
                line += f"   {ratio:.3f}"
            print(line)
        for key in calls[here]:
            print(f"  {key:28}" + "".join(f"{calls[r][key]:14d}" for r in roots))


if __name__ == "__main__":
    main()
