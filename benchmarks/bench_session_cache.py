"""Open to first result in a fresh process: ``Session(path)`` + one ``run`` against
ai-edge-litert's ``Interpreter(path)`` + ``allocate_tensors`` + one ``invoke`` on the same
(converter's own) file, the same threads (every core, the LiteRT driver's default).

Each round starts, interleaved, one process of each kind:

* ``litert``: the bare interpreter on the file;
* ``cold``: nnhal with empty caches (a new ``NNHAL_CACHE_DIR``: no Session cache entry, no
  driver cache, no native kernels);
* ``warm``: nnhal with the caches an earlier process left (the Session cache's restore).

Imports are excluded: each process imports what its path uses (``nnhal.session``, the
runtime, the drivers, ``ai_edge_litert.interpreter``) before the clock starts; ``--lazy``
imports only ``nnhal.session`` so the modules the Session imports on first use are timed too.
Processes get a bytecode cache (``PYTHONPYCACHEPREFIX``) as an installed nnhal has, whatever
``PYTHONDONTWRITEBYTECODE`` says here. The figure is the median of per-round ratios
(goal: warm <= 1.2x, cold <= 2x), with /proc/loadavg. ``--breakdown`` adds one warm process
that times the restore's stages apart. Asserts nothing.

``--force`` caches models under the size the Session skips (to measure whether that pays).

    python benchmarks/bench_session_cache.py [MODEL.tflite ...] [--rounds N] [--lazy] [--breakdown]
                                    [--force]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODELS = ["/work/bench-models/mobilenet_v2.tflite",
                  "/work/bench-models/mobilenet_v2_int8.tflite"]

_PRE_NNHAL = """
from nnhal.session import Session
import numpy as np
"""
_PRE_ALL = _PRE_NNHAL + """
import nnhal.session.cache, nnhal.runtime, nnhal.runtime.plan, nnhal.drivers.litert.engine
import nnhal.drivers.litert, nnhal.drivers.reference, nnhal.tflite, nnhal.service.discovery
import blake3
from ai_edge_litert.interpreter import Interpreter, OpResolverType
"""

_FEEDS = """
def feeds(infos):
    rng = np.random.default_rng(0)
    out = []
    for shape, dtype in infos:
        shape = [d or 1 for d in shape]
        dt = np.dtype(dtype)
        out.append(rng.standard_normal(shape).astype(dt) if dt.kind == "f" else
                   rng.integers(np.iinfo(dt).min, np.iinfo(dt).max, shape, dtype=dt))
    return out
"""

_NNHAL = """
import json, sys, time
t0 = time.perf_counter()
s = Session(sys.argv[1], cache=True if sys.argv[2:] == ["force"] else None)
t1 = time.perf_counter()
x = feeds([(i.shape or (1,), i.dtype) for i in s.inputs])
t2 = time.perf_counter()
out = s.run(x)
t3 = time.perf_counter()
first = next(iter(out.values()))
print(json.dumps({"open": t1 - t0, "run": t3 - t2, "restored": s.restored,
                  "device": s.device_name, "sum": float(np.sum(first.astype(np.float64)))}))
"""

_LITERT = """
import json, os, sys, time
import numpy as np
from ai_edge_litert.interpreter import Interpreter
t0 = time.perf_counter()
it = Interpreter(model_path=sys.argv[1], num_threads=os.cpu_count() or 1)
it.allocate_tensors()
t1 = time.perf_counter()
ins = it.get_input_details()
x = feeds([(tuple(d["shape"]), d["dtype"]) for d in ins])
t2 = time.perf_counter()
for d, v in zip(ins, x):
    it.set_tensor(d["index"], v)
it.invoke()
out = it.get_tensor(it.get_output_details()[0]["index"])
t3 = time.perf_counter()
print(json.dumps({"open": t1 - t0, "run": t3 - t2,
                  "sum": float(np.sum(out.astype(np.float64)))}))
"""

#: The restore's stages, each timed apart in a process whose caches are warm.
_BREAKDOWN = """
import json, sys, time
from nnhal.session import cache as sc
from nnhal.runtime.devices import devices
path = sys.argv[1]
t = {}
c = time.perf_counter(); data = open(path, "rb").read(); t["read file"] = time.perf_counter() - c
c = time.perf_counter(); d = sc.content_digest(data); t["BLAKE3"] = time.perf_counter() - c
c = time.perf_counter(); store = sc.Store.default(); t["store + key"] = time.perf_counter() - c
c = time.perf_counter(); store.file_digest(path); t["remembered digest"] = time.perf_counter() - c
c = time.perf_counter(); sc.code_fingerprint(); t["code fingerprint"] = time.perf_counter() - c
c = time.perf_counter(); devs = devices(); t["open devices"] = time.perf_counter() - c
c = time.perf_counter(); s = Session(path); t["Session(path), the above done"] = \\
    time.perf_counter() - c
x = feeds([(i.shape or (1,), i.dtype) for i in s.inputs])
c = time.perf_counter(); s.run(x); t["first run"] = time.perf_counter() - c
t["restored"] = s.restored
print(json.dumps(t))
"""


def load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def child(code: str, path: str, cache_dir: str, pycache: str, force: bool = False) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
               NNHAL_CACHE_DIR=cache_dir, PYTHONPYCACHEPREFIX=pycache,
               TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("NNHAL_CACHE_KEY_FILE", None)
    done = subprocess.run([sys.executable, "-c", code, path, *(["force"] if force else [])],
                          capture_output=True, text=True,
                          env=env, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"child failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def med(xs) -> float:
    return statistics.median(list(xs))


def bench(path: str, rounds: int, lazy: bool, breakdown: bool, pycache: str,
          force: bool = False) -> None:
    pre = _PRE_NNHAL if lazy else _PRE_ALL
    nnhal_code = pre + _FEEDS + _NNHAL
    peer_code = _FEEDS + _LITERT
    with tempfile.TemporaryDirectory() as warm_dir:
        first = child(nnhal_code, path, warm_dir, pycache, force)  # fills the caches (and pycache)
        child(peer_code, path, warm_dir, pycache)
        if first["restored"]:
            print("(the first process restored: caches were not empty)")
        rec: dict[str, list[dict]] = {"litert": [], "cold": [], "warm": []}
        for _ in range(rounds):
            rec["litert"].append(child(peer_code, path, warm_dir, pycache))
            with tempfile.TemporaryDirectory() as cold_dir:
                rec["cold"].append(child(nnhal_code, path, cold_dir, pycache, force))
            rec["warm"].append(child(nnhal_code, path, warm_dir, pycache, force))
        stages = child(pre + _FEEDS + _BREAKDOWN, path, warm_dir, pycache) if breakdown \
            else None
    peer = [r["open"] + r["run"] for r in rec["litert"]]
    name = Path(path).name
    print(f"{name}: ai-edge-litert Interpreter(path)+allocate+invoke {med(peer) * 1e3:.1f} ms "
          f"(open {med(r['open'] for r in rec['litert']) * 1e3:.1f}, invoke "
          f"{med(r['run'] for r in rec['litert']) * 1e3:.1f})  load {load()}")
    for kind in ("cold", "warm"):
        rs = rec[kind]
        ours = [r["open"] + r["run"] for r in rs]
        ratio = med(o / p for o, p in zip(ours, peer))
        restored = sum(bool(r["restored"]) for r in rs)
        same = all(abs(r["sum"] - p["sum"]) <= 1e-3 * max(1.0, abs(p["sum"]))
                   for r, p in zip(rs, rec["litert"]))
        print(f"  nnhal {kind}: Session(path)+run {med(ours) * 1e3:.1f} ms (open "
              f"{med(r['open'] for r in rs) * 1e3:.1f}, first run "
              f"{med(r['run'] for r in rs) * 1e3:.1f}) = {ratio:.2f}x the bare interpreter "
              f"(goal {'1.2' if kind == 'warm' else '2'}x); on {rs[0]['device']}; "
              f"{restored}/{len(rs)} restored; first output's sum "
              f"{'matches' if same else 'DIFFERS'}  load {load()}", flush=True)
    if stages is not None:
        restored = stages.pop("restored")
        print("  warm stages (apart, in one process; restored: "
              f"{restored}): " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in stages.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=DEFAULT_MODELS)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--lazy", action="store_true",
                    help="time the modules the Session imports on first use too")
    ap.add_argument("--breakdown", action="store_true")
    ap.add_argument("--force", action="store_true",
                    help="Session(path, cache=True): cache models under MIN_BYTES too")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as pycache:
        for m in args.models:
            if not Path(m).is_file():
                print(f"{m}: not found, skipped")
                continue
            t0 = time.perf_counter()
            bench(m, args.rounds, args.lazy, args.breakdown, pycache, args.force)
            print(f"  ({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
