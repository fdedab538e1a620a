"""Per-operation profile of the small int8 wake-word models (pymicro-wakeword), nnhal against
ai-edge-litert when installed.

Each step's kernel (or ``into`` kernel) of the reference driver's prepared plan is wrapped
with a clock; the figures are per execution (Session.run), with the machine's load printed
beside them. The timing part runs the default Session (the runtime over every device).

    python -m benchmarks.bench_wakeword [runs]
"""

from __future__ import annotations

import importlib.metadata
import sys
import time
from collections.abc import Callable

import numpy as np

import nnhal
from benchmarks.step_clock import clock_steps


def load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def models() -> list[str]:
    try:
        files = importlib.metadata.files("pymicro-wakeword") or []
    except importlib.metadata.PackageNotFoundError:
        return []
    return sorted(str(f.locate()) for f in files if str(f).endswith(".tflite"))


def feeds(session: nnhal.Session, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {i.name: rng.integers(-128, 128, size=i.shape, dtype=np.int8)
            for i in session.inputs}


def profile(path: str, runs: int) -> None:
    """The reference driver's steps, each clocked (the plan is the reference driver's: the
    default Session runs these models whole on LiteRT, which has no per-step clock)."""
    session = nnhal.Session(path, device="reference")
    rng = np.random.default_rng(0)
    x = feeds(session, rng)
    plan = session._prepared.plan.main
    spent, counts, _ = clock_steps(plan)
    session.run(x)
    spent.clear()
    t0 = time.perf_counter()
    for _ in range(runs):
        session.run(x)
    total = (time.perf_counter() - t0) / runs * 1e6
    session.close()
    name = path.rsplit("/", 1)[-1]
    print(f"\n== {name}: {len(plan.steps)} steps, {total:.0f} us per run (profiled); "
          f"load {load()}")
    print(f"  {'operation':<22} {'count':>5} {'us':>8} {'us/op':>7} {'share':>6}")
    for label, s in sorted(spent.items(), key=lambda kv: -kv[1]):
        us = s / runs * 1e6
        print(f"  {label:<22} {counts[label]:5d} {us:8.1f} {us / counts[label]:7.1f} "
              f"{us / total:6.1%}")
    rest = total - sum(spent.values()) / runs * 1e6
    print(f"  {'(outside kernels)':<22} {'':5} {rest:8.1f} {'':7} {rest / total:6.1%}")


def timing(path: str, runs: int) -> None:
    """Unprofiled per-run time, nnhal and (if installed) ai-edge-litert, interleaved."""
    session = nnhal.Session(path)
    x = feeds(session, np.random.default_rng(1))
    fns: list[tuple[str, Callable[[], object]]] = [("nnhal", lambda: session.run(x))]
    try:
        from ai_edge_litert.interpreter import Interpreter
        interp = Interpreter(model_path=path, num_threads=1)
        interp.allocate_tensors()
        det = interp.get_input_details()[0]
        arr = next(iter(x.values()))

        def lite() -> None:
            interp.set_tensor(det["index"], arr)
            interp.invoke()
        fns.append(("litert", lite))
    except ImportError:
        pass
    times: dict[str, list[float]] = {n: [] for n, _ in fns}
    for _ in range(5):
        for n, fn in fns:
            fn()
            t0 = time.perf_counter()
            for _ in range(runs):
                fn()
            times[n].append((time.perf_counter() - t0) / runs * 1e6)
    session.close()
    name = path.rsplit("/", 1)[-1]
    parts = [f"{n} median {np.median(v):.0f} us best {min(v):.0f} us" for n, v in times.items()]
    print(f"{name:<22} " + "; ".join(parts) + f"  (load {load()})")


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    paths = models()
    if not paths:
        print("pymicro-wakeword is not installed: no models to measure")
        return
    for p in paths:
        timing(p, runs)
    for p in paths:
        profile(p, runs)


if __name__ == "__main__":
    main()
