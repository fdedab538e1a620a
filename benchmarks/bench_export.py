"""The LiteRT driver's two export stages, timed apart: the support probe (the conversion
``nnhal.drivers.litert.support`` runs for getSupportedOperations and keeps for the prepare)
and the serialisation (``nnhal.tflite.export_fb.serialise`` of that conversion, in the file's
frame as the driver writes it). Prints figures with the load; asserts nothing.

Each sample is a fresh process (imports excluded, ``gc.freeze()`` after them) that reads and
analyses the model, then times the probe and the serialisation once each, cold (their
first run in the process: what one open pays), then ``--reps`` times warm on fresh reads
(the minimum), and counts the Python calls of each (cProfile: a figure the machine's load
does not move). With ``--baseline DIR`` (another checkout) its samples interleave with this
checkout's, and the ratios are medians of per-round ratios. Times are the process's CPU
time of the main thread (less swayed by other work than the wall clock).

    python benchmarks/bench_export.py [--rounds 5] [--reps 5] [--baseline DIR] MODEL...
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

_CHILD = r'''
import sys, os, time, tempfile, gc, json, cProfile, pstats
os.environ["NNHAL_CACHE_DIR"] = tempfile.mkdtemp()
from nnhal.analysis import analyse
from nnhal.drivers.litert import support
from nnhal.tflite import read_tflite
from nnhal.tflite.export_fb import serialise
from nnhal.tflite.exporter import _converted, _frame_locator
gc.freeze()
path, reps = sys.argv[1], int(sys.argv[2])
clock = time.thread_time


def fresh():
    imported = read_tflite(path)
    return imported, analyse(imported.model, own_constants=False)


def both():
    imported, graph = fresh()
    t = clock()
    support._find_reasons(graph)
    probe = clock() - t
    converted = _converted[graph][1]  # kept by the probe, as the prepare takes it
    framed = _frame_locator(imported.model)
    t = clock()
    serialise(converted, data_outside=True, frame=framed)
    return probe, clock() - t


cold = both()
warm = [both() for _ in range(reps)]
calls = []
for stage in (0, 1):
    imported, graph = fresh()
    pr = cProfile.Profile()
    if stage == 0:
        pr.enable(); support._find_reasons(graph); pr.disable()
    else:
        support._find_reasons(graph)
        converted, framed = _converted[graph][1], _frame_locator(imported.model)
        pr.enable(); serialise(converted, data_outside=True, frame=framed); pr.disable()
    calls.append(pstats.Stats(pr).total_calls)
print(json.dumps({"probe": cold[0] * 1e3, "serialise": cold[1] * 1e3,
                  "probe warm": min(w[0] for w in warm) * 1e3,
                  "serialise warm": min(w[1] for w in warm) * 1e3,
                  "probe calls": calls[0], "serialise calls": calls[1]}))
'''
_KEYS = ("probe", "serialise", "probe warm", "serialise warm")


def _sample(tree: Path, model: str, reps: int) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    done = subprocess.run([sys.executable, "-c", _CHILD, model, str(reps)], env=env,
                          cwd=tree, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"{tree}: {model}: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--rounds", type=int, default=5, help="fresh processes per checkout")
    ap.add_argument("--reps", type=int, default=5, help="warm repetitions per process")
    ap.add_argument("--baseline", type=Path, help="another checkout, timed interleaved")
    args = ap.parse_args()
    here = Path(__file__).resolve().parent.parent
    print(f"export stages, main-thread CPU ms (load {_load()})")
    for model in args.models:
        mine: list[dict[str, float]] = []
        base: list[dict[str, float]] = []
        for _ in range(args.rounds):
            mine.append(_sample(here, model, args.reps))
            if args.baseline is not None:
                base.append(_sample(args.baseline, model, args.reps))
        print(f"{Path(model).name}: calls probe {mine[0]['probe calls']}, serialise "
              f"{mine[0]['serialise calls']}" + (
                  f" (baseline {base[0]['probe calls']}, {base[0]['serialise calls']})"
                  if base else ""))
        for key in (*_KEYS, "sum"):
            def get(s: dict[str, float], key: str = key) -> float:
                return s["probe"] + s["serialise"] if key == "sum" else s[key]
            line = f"  {key:15s} {statistics.median(get(s) for s in mine):7.2f}"
            if base:
                ratio = statistics.median(get(m) / get(b) for m, b in zip(mine, base))
                line += (f"  baseline {statistics.median(get(s) for s in base):7.2f}"
                         f"  ratio {ratio:.3f}")
            print(line)
        print(f"  load {_load()}")


if __name__ == "__main__":
    main()
