"""The reference driver against ai-edge-litert on the converter's own .tflite files.

For each model: ``Session(path, device="reference")`` and ai-edge-litert's ``Interpreter`` on
the same original file, with the reference's thread count (one BLAS thread, one worker:
``NNHAL_BLAS_THREADS``, default 1) for both, timed interleaved (one nnhal run, one LiteRT run,
per round); prints the median of the per-round ratios with /proc/loadavg, and checks the
outputs (identical bytes for integer outputs, the largest difference for float ones).

``--profile`` adds the reference's time per operation type (each bound step's kernel wrapped
in a timer; medians over the rounds), the table issue 29's item 6 asks for.

    python benchmarks/bench_reference_vs_litert.py [MODEL.tflite ...] [--rounds N] [--profile]
        [--build native|avx2|c]

``--build`` compiles the native kernels for another instruction set than this machine's best
(``avx2``: -march=haswell, AVX2 without AVX-512, as on most desktops and AMD before Zen 4;
``c``: no -march, the plain-C loops), to see the speed there without such a machine.

Without models it runs the converter-made MobileNet files of /work/bench-models when present
(made by ``benchmarks/bench_litert.py``'s ``make_models``).
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a script: make the worktree importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nnhal.ops import native  # noqa: E402
from nnhal.ops.native import build as native_build  # noqa: E402
from nnhal.session import Session  # noqa: E402

DEFAULT_DIR = Path("/work/bench-models")
BUILDS = {"native": native_build.NATIVE_FLAGS,
          "avx2": (*native_build.BASE_FLAGS, "-march=haswell"), "c": native_build.BASE_FLAGS}
DEFAULT_MODELS = ("mobilenet_v2_int8.tflite", "mobilenet_v2.tflite",
                  "mobilenet_v1_int8.tflite", "mobilenet_v1.tflite")


def load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def feed_for(info, rng: np.random.Generator) -> np.ndarray:
    shape = [d or 1 for d in info.shape]
    if np.issubdtype(info.dtype, np.integer):
        lim = np.iinfo(info.dtype)
        return rng.integers(lim.min, lim.max, size=shape, endpoint=True).astype(info.dtype)
    return rng.uniform(-1, 1, size=shape).astype(info.dtype)


def _step_name(step) -> str:
    """Operation type, with the filter size for convolutions (1x1 and 3x3 differ a lot)."""
    return step.op_type.name


def instrument(session: Session, totals: dict[str, list[float]]) -> None:
    """Wrap every bound step of the reference's main plan in a timer adding to ``totals``."""
    plan = session._prepared.plan.main
    infos = plan.graph.operands
    for step in plan.steps:
        name = step.op_type.name
        if name in ("CONV_2D", "DEPTHWISE_CONV_2D") and len(step.inputs) > 1:
            f = infos[step.inputs[1]].shape
            if f is not None:
                name += f" {f[1]}x{f[2]}"
        if step.into is not None:
            inner = step.into

            def timed(ins, outs, rt, _inner=inner, _name=name):
                t = time.perf_counter()
                _inner(ins, outs, rt)
                totals[_name][-1] += time.perf_counter() - t

            step.into = timed
        elif step.kernel is not None:
            inner = step.kernel

            def timed_k(ins, rt, _inner=inner, _name=name):
                t = time.perf_counter()
                r = _inner(ins, rt)
                totals[_name][-1] += time.perf_counter() - t
                return r

            step.kernel = timed_k


def bench(path: Path, rounds: int, threads: int, profile: bool) -> float:
    from ai_edge_litert.interpreter import Interpreter

    session = Session(path, device="reference")
    totals: dict[str, list[float]] = collections.defaultdict(lambda: [0.0])
    if profile:
        instrument(session, totals)
    rng = np.random.default_rng(0)
    feeds = [feed_for(i, rng) for i in session.inputs]
    interp = Interpreter(model_path=str(path), num_threads=threads)
    interp.allocate_tensors()
    ins = interp.get_input_details()
    outs = interp.get_output_details()

    def run_litert() -> list[np.ndarray]:
        for d, x in zip(ins, feeds):
            interp.set_tensor(d["index"], x)
        interp.invoke()
        return [interp.get_tensor(d["index"]) for d in outs]

    ours = list(session.run(feeds).values())
    theirs = run_litert()
    check = []
    for a, b in zip(ours, theirs):
        a, b = np.asarray(a), np.asarray(b)
        if np.issubdtype(b.dtype, np.integer):
            diff = np.abs(a.astype(np.int64) - b.astype(np.int64))
            check.append(f"{int((diff > 0).sum())} of {diff.size} differ (max {int(diff.max())})")
        else:
            check.append(f"max |diff| {float(np.abs(a - b).max()):.2e}")
    for v in totals.values():
        v[-1] = 0.0
    t_n, t_l, ratios = [], [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        session.run(feeds)
        t1 = time.perf_counter()
        run_litert()
        t2 = time.perf_counter()
        t_n.append(t1 - t0)
        t_l.append(t2 - t1)
        ratios.append((t1 - t0) / (t2 - t1))
        for v in totals.values():
            v.append(0.0)
    session.close()
    r = statistics.median(ratios)
    print(f"{path.name:28s} reference {statistics.median(t_n) * 1e3:7.2f} ms  litert "
          f"{statistics.median(t_l) * 1e3:6.2f} ms  ratio {r:5.2f}x (per-round median; "
          f"range {min(ratios):.2f}-{max(ratios):.2f})  outputs: {'; '.join(check)}  "
          f"load {load()}", flush=True)
    if profile:
        med = {k: statistics.median(v[:-1]) * 1e3 for k, v in totals.items()}
        whole = statistics.median(t_n) * 1e3
        for k, v in sorted(med.items(), key=lambda kv: -kv[1]):
            print(f"    {k:24s} {v:7.2f} ms  {100 * v / whole:5.1f}%")
        print(f"    {'(sum of steps)':24s} {sum(med.values()):7.2f} ms")
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", type=Path)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--profile", action="store_true", help="time per operation type")
    ap.add_argument("--build", choices=sorted(BUILDS), default="native",
                    help="the native kernels' instruction set (default: this machine's)")
    args = ap.parse_args()
    if args.build != "native":
        flags = BUILDS[args.build]
        native_build.build_best = lambda: native_build.build(flags)
    lib = native.library()
    print(f"native kernels: {native.status()}; 8-bit GEMM: "
          f"{native.conv_q8_gemm(lib) if lib is not None else 'none (numpy)'}")
    models = args.models or [DEFAULT_DIR / m for m in DEFAULT_MODELS
                             if (DEFAULT_DIR / m).exists()]
    if not models:
        sys.exit("no models given and none in /work/bench-models")
    threads = max(1, int(os.environ.get("NNHAL_BLAS_THREADS", "1")))
    print(f"load before: {load()}   threads {threads}   rounds {args.rounds}")
    for path in models:
        bench(path, args.rounds, threads, args.profile)
    print(f"load after: {load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
