"""Open to first result, from a fresh process: ``Session(path)`` + one ``run`` against
ai-edge-litert's ``Interpreter(path)`` + ``allocate_tensors`` + one ``invoke`` on the same
file (the converter's own, never one nnhal wrote), with the same threads. Prints figures and
the load; asserts nothing (issue 29's "quick opens"; the goal is 2x or less).

Each round runs, for each model in turn, one fresh process per engine; a process imports its
engine first (``from nnhal import Session`` / ``from ai_edge_litert.interpreter import
Interpreter``: imports excluded), then times the open and the first result. nnhal is timed
twice: as a user's process does it ("open"), and with the modules the open loads on first
use (the runtime, the drivers, ai-edge-litert) imported beforehand ("warm imports"), so the
import share of a first open shows. Every nnhal process gets an empty ``NNHAL_CACHE_DIR``:
these are uncached opens. Figures are medians over rounds; ratios the median of per-round
ratios.

``--breakdown`` adds, per model, one more fresh process that times the stages of the open
(reading the file, converting, building the HAL model, the analysis, partitioning, the
support queries, export, the interpreter, the first run), how often each ran, and how many
analyses the open ran (``nnhal.analysis.analyses()``: one is the goal).

    python benchmarks/bench_open_stages.py [--rounds N] [--breakdown] [--baseline DIR]
                                           MODEL.tflite [...]

``--baseline DIR`` times the nnhal of another checkout (``git worktree add DIR <commit>``)
in the same rounds, for before/after figures under the same load.

Without models: MobileNetV2 float32 and int8 from ``--models DIR`` (see bench_litert.py),
else the models of the ``test`` extra.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: One open in a fresh process. argv: engine (nnhal, nnhal-warm, litert), model path,
#: threads. Prints one JSON line: open seconds, first-run seconds (nnhal only: the open
#: and the run are timed apart; litert's invoke is part of its figure).
_CHILD = r"""
import json, os, sys, time
engine, path, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
import numpy as np
if engine == "litert":
    from ai_edge_litert.interpreter import Interpreter
    t0 = time.perf_counter()
    it = Interpreter(model_path=path, num_threads=threads)
    it.allocate_tensors()
    for d in it.get_input_details():
        it.set_tensor(d["index"], np.zeros(d["shape"], d["dtype"]))
    t1 = time.perf_counter()
    it.invoke()
    t2 = time.perf_counter()
    print(json.dumps({"open": t1 - t0, "run": t2 - t1, "total": t2 - t0}))
    sys.exit(0)
from nnhal import Session
if engine == "nnhal-warm":
    import ai_edge_litert.interpreter, nnhal.runtime, nnhal.drivers.litert  # noqa
    import nnhal.drivers.reference  # noqa
mods = len(sys.modules)
t0 = time.perf_counter()
s = Session(path)
feeds = [np.zeros([d or 1 for d in i.shape], i.dtype) for i in s.inputs]
t1 = time.perf_counter()
s.run(feeds)
t2 = time.perf_counter()
print(json.dumps({"open": t1 - t0, "run": t2 - t1, "total": t2 - t0,
                  "imported": len(sys.modules) - mods, "device": s.device_name,
                  "nnhal": __import__("nnhal").__file__}))
"""

#: The stages of one nnhal open, timed in a fresh process by wrapping the functions that do
#: them (module:qualified name, label; a label's time includes the stages below it).
STAGES = [
    ("nnhal.tflite.importer:read_tflite", "read_tflite"),
    ("nnhal.tflite.schema:load", "  file + verifier"),
    ("nnhal.tflite.verify:verify", "    verifier"),
    ("nnhal.tflite.import_read:read_model", "  tables to records"),
    ("nnhal.tflite.importer:_Importer._convert_ops", "  operators to HAL"),
    ("nnhal.hal.builder:ModelBuilder.build", "  HAL model built"),
    ("nnhal.analysis.analyser:_analyse", "analysis (each one run)"),
    ("nnhal.runtime.compilation:Compilation.finish", "runtime compilation"),
    ("nnhal.runtime.devices:devices", "  devices opened / listed"),
    ("nnhal.runtime.partition:supported_by", "  getSupportedOperations"),
    ("nnhal.drivers.litert.support:_export_refusals", "    litert: export probe"),
    ("nnhal.drivers.common.device:DeviceBase.prepare_model", "  prepareModel"),
    ("nnhal.tflite.exporter:write_tflite", "    export"),
    ("nnhal.tflite.export_fb:serialise", "      serialise"),
    ("nnhal.drivers.litert.engine:Engine.__init__", "    interpreter + allocate"),
]

_BREAKDOWN = r"""
import importlib, json, sys, time
from collections import defaultdict
path, stages = sys.argv[1], json.loads(sys.argv[2])
import numpy as np
from nnhal import Session
import ai_edge_litert.interpreter, nnhal.runtime, nnhal.drivers.litert, nnhal.tflite  # noqa
import nnhal.tflite.importer, nnhal.drivers.reference  # noqa
from nnhal.analysis import analyses
total, calls = defaultdict(float), defaultdict(int)

def wrap(target, label):
    modname, _, attr = target.partition(":")
    try:
        mod = importlib.import_module(modname)
        owner = mod
        for part in attr.split(".")[:-1]:
            owner = getattr(owner, part)
        name = attr.split(".")[-1]
        orig = getattr(owner, name)
    except (ImportError, AttributeError):
        return  # this version has no such function
    def timed(*a, **k):
        t = time.perf_counter()
        try:
            return orig(*a, **k)
        finally:
            total[label] += time.perf_counter() - t
            calls[label] += 1
    setattr(owner, name, timed)
    if owner is mod:  # and every module that imported it by name
        for m in list(sys.modules.values()):
            d = getattr(m, "__dict__", None)
            if isinstance(d, dict):
                for k, v in list(d.items()):
                    if v is orig:
                        setattr(m, k, timed)

for target, label in stages:
    wrap(target, label)
n0 = analyses()
t0 = time.perf_counter()
s = Session(path)
t1 = time.perf_counter()
s.run([np.zeros([d or 1 for d in i.shape], i.dtype) for i in s.inputs])
t2 = time.perf_counter()
print(json.dumps({"open": t1 - t0, "run": t2 - t1, "analyses": analyses() - n0,
                  "device": s.device_name,
                  "stages": {k: [total[k], calls[k]] for k in total}}))
"""

med = statistics.median


def load() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _env(cache: str, root: Path = ROOT) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH")) if p)
    env["NNHAL_CACHE_DIR"] = cache
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    return env


def child(code: str, args: list[str], root: Path = ROOT) -> dict:
    with tempfile.TemporaryDirectory(prefix="nnhal-open-") as cache:
        # cwd: ``python -c`` puts the current folder first on sys.path, before PYTHONPATH.
        done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                              text=True, env=_env(cache, root), timeout=600, cwd=root)
    if done.returncode != 0:
        raise SystemExit(f"a child failed ({args[:2]}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def default_models(models_dir: str | None) -> list[Path]:
    if models_dir:
        return [Path(models_dir) / f"{n}.tflite" for n in ("mobilenet_v2", "mobilenet_v2_int8")]
    sys.path.insert(0, str(ROOT))
    from benchmarks.bench_models import packaged_models

    return packaged_models()


def bench(paths: list[Path], rounds: int, threads: int, baseline: Path | None) -> None:
    engines = ["litert", "nnhal", "nnhal-warm"] + (["baseline"] if baseline else [])
    times: dict[tuple[Path, str], list[dict]] = {(p, e): [] for p in paths for e in engines}
    print(f"load before: {load()}", flush=True)
    for e in engines:  # untimed: compiled bytecode written, files in the page cache
        child(_CHILD, ["nnhal" if e == "baseline" else e, str(paths[0]), str(threads)],
              baseline if e == "baseline" and baseline else ROOT)
    for _ in range(rounds):
        for p in paths:
            for e in engines:
                root = baseline if e == "baseline" and baseline else ROOT
                kind = "nnhal" if e == "baseline" else e
                times[(p, e)].append(child(_CHILD, [kind, str(p), str(threads)], root))
    print(f"load after:  {load()}   ({rounds} rounds, fresh processes, {threads} threads, "
          f"imports excluded; ms, medians; ratios: median of per-round ratios to litert)")
    head = f"{'model':34s} {'KiB':>6s} {'litert':>7s} {'nnhal':>7s} {'ratio':>6s} " \
           f"{'warm':>7s} {'ratio':>6s} {'1st run':>7s}"
    print(head + (f" {'baseline':>8s} {'ratio':>6s}" if baseline else "") + "  device")
    for p in paths:
        lit, nn, warm = (times[(p, e)] for e in engines[:3])
        line = f"{p.name[:34]:34s} {p.stat().st_size // 1024:6d} " \
               f"{med(x['total'] for x in lit) * 1e3:7.1f}"
        for got in (nn, warm):
            line += f" {med(x['total'] for x in got) * 1e3:7.1f} " \
                    f"{med(a['total'] / b['total'] for a, b in zip(got, lit)):5.2f}x"
        line += f" {med(x['run'] for x in nn) * 1e3:7.1f}"
        if baseline:
            base = times[(p, "baseline")]
            line += f" {med(x['total'] for x in base) * 1e3:8.1f} " \
                    f"{med(a['total'] / b['total'] for a, b in zip(base, lit)):5.2f}x"
        print(f"{line}  {nn[-1]['device']} ({nn[-1]['imported']} modules imported by the open)")


def breakdown(paths: list[Path], baseline: Path | None, rounds: int) -> None:
    print(f"\nstages of one open, fresh processes, imports warm, medians of {rounds} "
          f"(load {load()}; ms, calls)")
    roots = [ROOT, *([baseline] if baseline else [])]
    for p in paths:
        got: dict[Path, list[dict]] = {r: [] for r in roots}
        for _ in range(rounds):
            for root in roots:
                got[root].append(child(_BREAKDOWN, [str(p), json.dumps(STAGES)], root))
        head = f"{p.name}:"
        for root in roots:
            rs = got[root]
            head += (f"  {'baseline' if root != ROOT else 'this'}: Session(path) "
                     f"{med(r['open'] for r in rs) * 1e3:.1f}, first run "
                     f"{med(r['run'] for r in rs) * 1e3:.1f}, analyses {rs[-1]['analyses']}")
        print(f"{head}  (device {got[ROOT][-1]['device']})")
        for _, label in STAGES:
            cells = []
            for root in roots:
                rs = [r["stages"].get(label) for r in got[root]]
                cells.append(f"{med(x[0] if x else 0.0 for x in rs) * 1e3:7.1f}  "
                             f"x{max((x[1] if x else 0) for x in rs):<3d}")
            print(f"    {label:34s} " + "   ".join(cells))
    print(f"(load after: {load()})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", type=Path)
    ap.add_argument("--models", dest="models_dir", help="folder of mobilenet_v2[_int8].tflite")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--breakdown", action="store_true", help="time each stage of one open")
    ap.add_argument("--baseline", type=Path, help="another checkout's nnhal, timed alongside")
    args = ap.parse_args()
    paths = args.models or default_models(args.models_dir)
    if not paths:
        print("no models")
        return 0
    bench(paths, args.rounds, args.threads, args.baseline)
    if args.breakdown:
        breakdown(paths, args.baseline, max(1, args.rounds // 2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
