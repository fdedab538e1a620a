"""nnhal's reference driver against TFLite (ai-edge-litert) on the same models, for issue 12's
and issue 29's goals. The peer always runs **the TFLite converter's own file**, never one nnhal
wrote: the MobileNets are converter-made .tflite files (``--models DIR`` with
mobilenet_v1.tflite, mobilenet_v2.tflite, mobilenet_v2_int8.tflite, as
``benchmarks/bench_litert.py``'s ``make_models`` writes them; without it they are made with
TensorFlow into a temporary folder), which nnhal imports (``read_tflite``) and ai-edge-litert
opens by path. Times are taken in interleaved rounds (one nnhal run, one litert run, ...) so
both see the same load, and every figure is printed with /proc/loadavg. Prints figures;
asserts nothing (speed goals live here, not in tests).

Figures (``--only`` names in brackets):
  1. [v1, v2] MobileNet V1 and MobileNetV2 224 float32: nnhal / TFLite (2 threads), median of
     per-round ratios; goal <= 3x.
  2. [int8] full-integer MobileNetV2 (int8 activations, per-channel filters): outputs against
     TFLite's reference kernels (BUILTIN_REF, on the converter's file) in quantization steps
     (goal <= 1), nnhal / TFLite default (2 threads); goal <= 4x. Then, a diagnostic that
     times nothing: the first layer of the HAL-built int8 network (benchmarks/hal_models)
     whose activation differs from BUILTIN_REF's on nnhal's export of that network.
  3. [add] one ADD [1,16]: executeSynchronously, burst, reusable execution, us per call, against
     litert set_tensor + invoke + get_tensor on a converter-made one-ADD file; goals 15 / 12 /
     8 us.
  4. [memory] one MobileNetV2 execution: peak memory against constants + the two largest
     activations (goal <= 2x); minor page faults per execution after the first (goal 0).
  5. [profile] time per operation type of one execution (MobileNet V1, V2 float, V2 int8).

    python benchmarks/bench_vs_tflite.py [--models DIR] [--rounds N] [--quick]
                                         [--only NAME[,NAME...]]
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a script: make the worktree importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import bench_execution, hal_models  # noqa: E402
from benchmarks.step_clock import clock_steps  # noqa: E402
from nnhal.analysis import analyse  # noqa: E402
from nnhal.drivers.reference import ReferenceDevice  # noqa: E402
from nnhal.hal.builder import RequestBuilder  # noqa: E402
from nnhal.hal.interfaces import PreparedModelCallback  # noqa: E402
from nnhal.hal.types import (  # noqa: E402
    ErrorStatus,
    ExecutionPreference,
    MeasureTiming,
    Model,
    OperandLifeTime,
    OperandType,
    Priority,
)
from nnhal.ops import blas  # noqa: E402
from nnhal.tflite import write_tflite  # noqa: E402

V1_CASE = "mobilenet_224_gender_basic_fixed"
NAMES = ("v1", "v2", "int8", "add", "memory", "profile")


def load() -> str:
    """The three load averages of /proc/loadavg."""
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())


class Summary:
    """Rows of the final table: figure, goal, measured, met?"""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str, str]] = []

    def add(self, figure: str, goal: str, measured: str, met: bool | None) -> None:
        self.rows.append((figure, goal, measured,
                          "n/a" if met is None else ("yes" if met else "NO")))

    def print(self) -> None:
        print(f"\n== summary (load {load()}) ==")
        w = [max(len(r[k]) for r in [("figure", "goal", "measured", "met?"), *self.rows])
             for k in range(4)]
        for r in [("figure", "goal", "measured", "met?"), *self.rows]:
            print("  " + "  ".join(c.ljust(n) for c, n in zip(r, w)))


# ---- BLAS threads ----------------------------------------------------------------------------

class Blas:
    """numpy's OpenBLAS thread count for the whole process (through nnhal.ops.blas)."""

    available = blas.available()

    @staticmethod
    def get() -> int | None:
        return blas.get_threads()

    @staticmethod
    def set(n: int) -> None:
        blas.set_threads(n)


BLAS = Blas()


# ---- engines -----------------------------------------------------------------------------

def prepare(device: ReferenceDevice, model: Model):
    cb = PreparedModelCallback()
    device.prepare_model(model, ExecutionPreference.FAST_SINGLE_ANSWER, Priority.MEDIUM, None,
                         [], [], b"", cb)
    status, pm = cb.wait(300)
    if status != ErrorStatus.NONE:
        raise SystemExit(f"prepareModel failed: {status!r}")
    return pm


class NnhalRunner:
    """A prepared model on the reference driver and one request in shared memory; ``run``
    is one executeSynchronously."""

    def __init__(self, device: ReferenceDevice, model: Model, inputs: Sequence[np.ndarray]):
        self.model = model
        self.pm = prepare(device, model)
        self.rb = RequestBuilder.for_model(model, inputs)

    def run(self) -> None:
        status = self.pm.execute_synchronously(self.rb.request, MeasureTiming.NO)[0]
        if status != ErrorStatus.NONE:
            raise SystemExit(f"nnhal execution failed: {status!r}")

    def outputs(self) -> list[np.ndarray]:
        return [self.rb.output(k) for k in range(len(self.model.main.output_indexes))]

    def close(self) -> None:
        self.rb.close()


class LitertRunner:
    """An ai-edge-litert interpreter on a .tflite file (the converter's, for every timed
    figure) or, for a diagnostic, on bytes; ``run`` is set_tensor for each input, invoke,
    get_tensor for each output (outputs in the signature's order)."""

    def __init__(self, source: Path | bytes, inputs: Sequence[np.ndarray], threads: int | None,
                 resolver: object | None = None):
        from ai_edge_litert.interpreter import Interpreter

        kw = {} if resolver is None else {"experimental_op_resolver_type": resolver}
        where = {"model_content": source} if isinstance(source, bytes) else \
            {"model_path": str(source)}
        self.interp = Interpreter(num_threads=threads, **where, **kw)
        self.interp.allocate_tensors()
        dets = self.interp.get_output_details()
        by_name = {d["name"]: d["index"] for d in dets}
        keys = [f"output_{k}" for k in range(len(dets))]
        self.out_idx = [by_name[k] for k in keys] if all(k in by_name for k in keys) else \
            [d["index"] for d in dets]
        self.in_idx = [d["index"] for d in self.interp.get_input_details()]
        self.inputs = list(inputs)

    def run(self) -> list[np.ndarray]:
        it = self.interp
        for i, x in zip(self.in_idx, self.inputs):
            it.set_tensor(i, x)
        it.invoke()
        return [it.get_tensor(i) for i in self.out_idx]


def interleaved(fns: Sequence[Callable[[], object]], rounds: int) -> list[list[float]]:
    """Seconds per call of each function, one per round; each round runs each once in turn."""
    for fn in fns:
        fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(rounds):
        for fn, out in zip(fns, times):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return times


# ---- 1 and 2: whole models -----------------------------------------------------------------

def converter_models(folder: Path | None, tmp: Path) -> Path | None:
    """The folder holding the converter-made MobileNets: ``folder``, or made now into ``tmp``
    with TensorFlow (None, said, when neither is possible)."""
    from benchmarks.bench_litert import MODELS, make_models

    if folder is not None:
        missing = [m for m in MODELS if not (folder / f"{m}.tflite").is_file()]
        if missing:
            raise SystemExit(f"--models {folder}: missing {', '.join(missing)} .tflite")
        return folder
    return tmp if make_models(tmp) else None


def file_model(path: Path, seed: int = 0) -> tuple[Model, list[np.ndarray]]:
    """A converter's .tflite as nnhal imports it, with random inputs of its input types."""
    from nnhal.tflite import read_tflite

    imported = read_tflite(path)
    model = imported.model
    rng = np.random.default_rng(seed)
    inputs = []
    for idx in model.main.input_indexes:
        o = model.main.operands[idx]
        t = OperandType(o.type)
        shape = tuple(int(d) for d in o.dimensions)
        if t.dtype.kind == "f":
            inputs.append(rng.uniform(-1, 1, shape).astype(t.dtype))
        else:
            lim = np.iinfo(t.dtype)
            inputs.append(rng.integers(lim.min, lim.max, shape, endpoint=True).astype(t.dtype))
    return model, inputs


_BUILTIN_REF = r"""
import sys
import numpy as np
from ai_edge_litert.interpreter import Interpreter, OpResolverType
path, arrays = sys.argv[1], np.load(sys.argv[2])
it = Interpreter(model_path=path, num_threads=1,
                 experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
it.allocate_tensors()
for k, d in enumerate(it.get_input_details()):
    it.set_tensor(d["index"], arrays[f"arr_{k}"])
it.invoke()
np.savez(sys.argv[3], *[it.get_tensor(d["index"]) for d in it.get_output_details()])
"""


def builtin_ref_outputs(path: Path, inputs: Sequence[np.ndarray]) -> list[np.ndarray] | None:
    """The outputs of TFLite's reference kernels (BUILTIN_REF) on ``path``, run in a child
    process: on some converter files they abort the process (allocate_tensors on the
    full-integer MobileNetV2 here). None, said, when the child fails."""
    import subprocess

    with tempfile.TemporaryDirectory() as d:
        np.savez(Path(d) / "in.npz", *inputs)
        done = subprocess.run([sys.executable, "-c", _BUILTIN_REF, str(path),
                               str(Path(d) / "in.npz"), str(Path(d) / "out.npz")],
                              capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            print(f"  TFLite's BUILTIN_REF kernels failed on {path.name} (exit status "
                  f"{done.returncode}): no comparison with the reference kernels")
            return None
        with np.load(Path(d) / "out.npz") as out:
            return [out[f"arr_{k}"] for k in range(len(out.files))]


def converter_add(tmp: Path) -> Path | None:
    """The converter's one-ADD [1,16] float32 file (None, said, without TensorFlow)."""
    from benchmarks.bench_litert import make_add

    return make_add(tmp, tuple(bench_execution.DIMS))


def compare_models(name: str, device: ReferenceDevice, path: Path, rounds: int,
                   summary: Summary, goal: float, exact: bool = False,
                   free_device: ReferenceDevice | None = None) -> None:
    """nnhal's import of the converter's file ``path`` on the reference driver against
    ai-edge-litert on that very file."""

    t0 = time.perf_counter()
    model, inputs = file_model(path)
    import_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    ours = NnhalRunner(device, model, inputs)
    prepare_s = time.perf_counter() - t0
    # The same model on a device that leaves BLAS's threads alone, for comparison.
    free = NnhalRunner(free_device, model, inputs) if free_device is not None else None
    lite2 = LitertRunner(path, inputs, 2)
    lite1 = LitertRunner(path, inputs, 1)
    print(f"\n== {name}: {path.name} (the converter's), {len(model.main.operations)} operations "
          f"as imported, {path.stat().st_size / 1e6:.2f} MB (import {import_s:.2f} s, nnhal "
          f"prepare {prepare_s:.2f} s); load {load()}")
    try:
        ours.run()
        mine = ours.outputs()
        theirs = lite2.run()
        for k, (a, b) in enumerate(zip(mine, theirs)):
            if exact:
                d = int(np.abs(a.astype(np.int64) - b.astype(np.int64)).max())
                print(f"  output {k}: max |nnhal - litert default| = {d} steps")
            else:
                print(f"  output {k}: max |nnhal - litert| = {float(np.abs(a - b).max()):.3g} "
                      f"(max |litert| {float(np.abs(b).max()):.3g})")
        if exact:
            ref = builtin_ref_outputs(path, inputs)
            if ref is None:
                summary.add(f"{name}: outputs vs TFLite reference kernels", "<= 1 step",
                            "not measured (BUILTIN_REF aborts on this file)", None)
                ref = []
            worst = 0
            for k, (a, b) in enumerate(zip(mine, ref)):
                d = int(np.abs(a.astype(np.int64) - b.astype(np.int64)).max())
                n = int((a != b).sum())
                worst = max(worst, d)
                print(f"  output {k}: max |nnhal - litert BUILTIN_REF| = {d} steps "
                      f"({n} of {a.size} values differ)")
            if ref:
                summary.add(f"{name}: outputs vs TFLite reference kernels", "<= 1 step",
                            f"{worst} steps", worst <= 1)
        engines = [(f"nnhal (driver: BLAS {device.blas_threads or 'free'})", ours.run)]
        if free is not None:
            engines.append((f"nnhal (BLAS left at {BLAS.get()})", free.run))
        engines += [("litert 2 threads", lite2.run), ("litert 1 thread", lite1.run)]
        times = interleaved([fn for _, fn in engines], rounds)
        t_l2, t_l1 = times[-2], times[-1]
        print(f"  {rounds} interleaved rounds (load after {load()}):")
        print(f"  {'engine':<28} {'median ms':>10} {'best ms':>9} "
              f"{'median ratio to litert 2t':>26}")
        for (label, _), ts in zip(engines, times):
            ratio = statistics.median([a / b for a, b in zip(ts, t_l2)])
            print(f"  {label:<28} {statistics.median(ts) * 1e3:10.2f} {min(ts) * 1e3:9.2f} "
                  f"{ratio:25.2f}x")
        for (label, _), ts in zip(engines[:-2], times[:-2]):
            ratio = statistics.median([a / b for a, b in zip(ts, t_l2)])
            ratio1 = statistics.median([a / b for a, b in zip(ts, t_l1)])
            print(f"  {label}: / litert(2 threads) median {ratio:.2f}x (best/best "
                  f"{min(ts) / min(t_l2):.2f}x); / litert(1 thread) {ratio1:.2f}x")
            summary.add(f"{name}, {label}: / TFLite (2 threads)", f"<= {goal:g}x",
                        f"{ratio:.2f}x (load {load()})", ratio <= goal)
    finally:
        ours.close()
        if free is not None:
            free.close()


def first_divergence(layers: Sequence[hal_models.Layer], quant: hal_models.Quant,
                     x: np.ndarray) -> None:
    """Every activation of the HAL-built int8 network on nnhal and on TFLite's reference
    kernels (on nnhal's export of it: the converter cannot expose every activation of a
    network built here): the first that differs had identical inputs on both, so it shows one
    kernel's own difference. A diagnostic; nothing is timed."""
    from ai_edge_litert.interpreter import OpResolverType

    from nnhal import Session

    model = hal_models.build(layers, quant, expose=True)
    session = Session(model)
    try:
        mine = list(session.run([x]).values())
    finally:
        session.close()
    ref = LitertRunner(write_tflite(model), [x], 1, OpResolverType.BUILTIN_REF).run()
    for k, (layer, a, b) in enumerate(zip(layers, mine, ref)):
        d = np.abs(a.astype(np.int64) - b.astype(np.int64))
        if d.max() > 0:
            print(f"  first activation differing from BUILTIN_REF: layer {k} ({layer.kind}, "
                  f"output {list(layer.shape)}): max {int(d.max())} steps in "
                  f"{int((d > 0).sum())} of {d.size} values; all earlier layers identical")
            return
    print("  every activation identical to BUILTIN_REF")


# ---- 3: one ADD ------------------------------------------------------------------------------

def bench_add(device: ReferenceDevice, n: int, rounds: int, summary: Summary,
              add_path: Path | None) -> None:
    """``add_path``: the converter's one-ADD file the peer runs (None: no peer figures)."""
    dims = bench_execution.DIMS
    pm = bench_execution.prepare(device)
    a = np.arange(16, dtype=np.float32).reshape(dims)
    rb = RequestBuilder([a, a], [a.nbytes])
    lite = LitertRunner(add_path, [a, a], 1) if add_path is not None else None
    _, burst = pm.configure_execution_burst()
    holds = [burst.cache_memory(m) for m in rb.request.pools]
    _, execution = pm.create_reusable_execution(rb.request)
    try:
        paths = [
            ("executeSynchronously", lambda: pm.execute_synchronously(rb.request), 15.0),
            ("burst.execute (cached)", lambda: burst.execute(rb.request), 12.0),
            ("reusable compute", lambda: execution.compute(), 8.0),
        ]
        if lite is not None:
            paths.append(("litert set+invoke+get", lite.run, None))
            np.testing.assert_array_equal(lite.run()[0], a + a)
        for _label, fn, _ in paths[:3]:
            bench_execution.checked(fn())
        print(f"\n== one ADD {dims} float32: {n} calls x {rounds} interleaved rounds; "
              f"load {load()}")
        times = bench_execution.time_paths([(p[0], p[1]) for p in paths], n, rounds)
        lite_med = statistics.median(times[paths[-1][0]]) if lite is not None else float("nan")
        print(f"  {'path':<26} {'median us':>10} {'best us':>8} {'x litert':>9} "
              f"{'minor faults/call':>18}")
        for label, fn, goal in paths:
            med, best = statistics.median(times[label]), min(times[label])
            faults = bench_execution.minor_faults(fn, n)
            print(f"  {label:<26} {med:10.1f} {best:8.1f} {med / lite_med:9.1f} {faults:18.3f}")
            if goal is not None:
                summary.add(f"ADD [1,16] {label}", f"<= {goal:g} us",
                            f"{med:.1f} us median (load {load()})", med <= goal)
        print(f"  (load after {load()})")
    finally:
        del holds
        rb.close()


# ---- 4: memory -------------------------------------------------------------------------------

def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def bench_memory(device: ReferenceDevice, summary: Summary) -> None:
    model = hal_models.mobilenet_v2_float()
    x = hal_models.float_input()
    graph = analyse(model).main
    infos, shapes = graph.operands, graph.shapes
    const_bytes = 0
    act_sizes = []
    for idx, info in enumerate(infos):
        if info is None or not info.type.is_tensor:
            continue
        shape = shapes[idx]
        nbytes = info.type.dtype.itemsize * int(np.prod(shape)) if shape is not None else 0
        if info.lifetime in (OperandLifeTime.CONSTANT_COPY, OperandLifeTime.CONSTANT_REFERENCE):
            const_bytes += nbytes
        elif info.lifetime != OperandLifeTime.NO_VALUE:
            act_sizes.append(nbytes)
    act_sizes.sort(reverse=True)
    top2 = sum(act_sizes[:2])
    budget = const_bytes + top2

    gc.collect()
    rss0 = _rss_bytes()
    tracemalloc.start()
    runner = NnhalRunner(device, model, [x])
    _, prep_peak = tracemalloc.get_traced_memory()
    tracemalloc.reset_peak()
    rss_prepared = _rss_bytes()
    runner.run()  # the first execution: arena created
    first_cur, first_peak = tracemalloc.get_traced_memory()
    rss_first = _rss_bytes()
    runner.run()
    tracemalloc.reset_peak()
    base, _ = tracemalloc.get_traced_memory()
    runner.run()
    _, steady_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss_after = _rss_bytes()
    steady = steady_peak - base
    pool = runner.pm.plan.main.arena_pool
    arena = pool.layout.total if pool is not None else 0
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(10):
        runner.run()
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10
    runner.close()
    mb = 1e6
    print(f"\n== MobileNetV2 float32 memory (load {load()})")
    print(f"  constants {const_bytes / mb:.2f} MB; two largest activations {top2 / mb:.2f} MB "
          f"({act_sizes[0] / mb:.2f} + {act_sizes[1] / mb:.2f}); sum {budget / mb:.2f} MB")
    print(f"  arena {arena / mb:.2f} MB (planned at prepare, allocated at the first execution)")
    print(f"  tracemalloc peak: prepare {prep_peak / mb:.2f} MB; first execution "
          f"{first_peak / mb:.2f} MB above its start; an execution after warm-up "
          f"{steady / mb:.2f} MB above its start")
    print(f"  RSS: +{(rss_prepared - rss0) / mb:.2f} MB at prepare, "
          f"+{(rss_first - rss_prepared) / mb:.2f} MB at the first execution, "
          f"+{(rss_after - rss_first) / mb:.2f} MB over two more")
    held = const_bytes + arena + steady
    first = const_bytes + first_peak
    print(f"  execution peak = constants + arena + transient: {held / mb:.2f} MB = "
          f"{held / budget:.2f}x the sum (first execution: constants + its peak "
          f"{first / mb:.2f} MB = {first / budget:.2f}x); without constants: arena + transient "
          f"{(arena + steady) / mb:.2f} MB = {(arena + steady) / top2:.2f}x the two activations")
    print(f"  minor page faults per execution (10 after warm-up): {faults:.1f}")
    summary.add("MobileNetV2 execution peak / (constants + 2 largest activations)", "<= 2x",
                f"{held / budget:.2f}x (first run {first / budget:.2f}x)", held <= 2 * budget)
    summary.add("MobileNetV2 minor page faults per execution", "0", f"{faults:.1f}",
                faults == 0)


# ---- 5: per-operation profile ----------------------------------------------------------------

def profile(name: str, device: ReferenceDevice, model: Model, inputs: Sequence[np.ndarray],
            runs: int) -> None:
    """Time per operation type: each step's kernel (or ``into`` kernel) wrapped with a clock,
    in this process only; the rest of an execution is the executor's and the driver's."""
    runner = NnhalRunner(device, model, inputs)
    plan = runner.pm.plan.main
    spent, counts, into_steps = clock_steps(plan)
    runner.run()
    spent.clear()
    t0 = time.perf_counter()
    for _ in range(runs):
        runner.run()
    total = (time.perf_counter() - t0) / runs * 1e3
    runner.close()
    kernels = sum(spent.values()) / runs * 1e3
    print(f"\n== profile: {name}, {runs} executions, {total:.2f} ms each "
          f"({into_steps} of {len(plan.steps)} steps write into given outputs); load {load()}")
    print(f"  {'operation':<22} {'count':>5} {'ms':>8} {'share':>6}")
    for label, s in sorted(spent.items(), key=lambda kv: -kv[1]):
        ms = s / runs * 1e3
        print(f"  {label:<22} {counts[label]:5d} {ms:8.2f} {ms / total:6.1%}")
    rest = total - kernels
    print(f"  {'(outside kernels)':<22} {'':5} {rest:8.2f} {rest / total:6.1%}")


# ---- main ------------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=None,
                        help="interleaved rounds per model (default 21, --quick 5)")
    parser.add_argument("--quick", action="store_true", help="fewer rounds and calls")
    parser.add_argument("--only", default=None,
                        help=f"comma-separated figures to run: {', '.join(NAMES)}")
    parser.add_argument("--models", type=Path, default=None,
                        help="folder of the converter-made MobileNets (mobilenet_v1.tflite, "
                             "mobilenet_v2.tflite, mobilenet_v2_int8.tflite; default: made "
                             "with TensorFlow into a temporary folder)")
    parser.add_argument("--blas-threads", type=int, default=None,
                        help="numpy's OpenBLAS threads for the whole run (default: as found)")
    args = parser.parse_args()
    if args.blas_threads is not None:
        if not BLAS.available:
            raise SystemExit("--blas-threads: numpy's OpenBLAS thread control was not found")
        BLAS.set(args.blas_threads)
    rounds = args.rounds or (5 if args.quick else 21)
    only = set(NAMES) if args.only is None else {s.strip() for s in args.only.split(",")}
    unknown = only - set(NAMES)
    if unknown:
        raise SystemExit(f"unknown --only names: {', '.join(sorted(unknown))}; "
                         f"choose from {', '.join(NAMES)}")
    threads = {k: os.environ[k] for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                                          "MKL_NUM_THREADS") if k in os.environ}
    print(f"bench_vs_tflite: rounds {rounds}; numpy {np.__version__}; OpenBLAS threads "
          f"{BLAS.get() if BLAS.available else 'unknown (no control found)'}; environment "
          f"{threads or 'no *_NUM_THREADS'}; cores {os.cpu_count()}; load {load()}")
    from nnhal.ops import native
    print(f"native kernels: {native.status()}")
    summary = Summary()
    device = ReferenceDevice()
    free_device = ReferenceDevice(blas_threads=0)
    tmp = tempfile.TemporaryDirectory()
    folder = converter_models(args.models, Path(tmp.name)) \
        if {"v1", "v2", "int8", "profile"} & only else None
    files = {} if folder is None else {
        "v1": folder / "mobilenet_v1.tflite", "v2": folder / "mobilenet_v2.tflite",
        "int8": folder / "mobilenet_v2_int8.tflite"}
    try:
        if "v1" in only and files:
            compare_models("MobileNet V1 224 float32", device, files["v1"], rounds, summary,
                           3.0, free_device=free_device)
        if "v2" in only and files:
            compare_models("MobileNetV2 224 float32", device, files["v2"], rounds, summary,
                           3.0, free_device=free_device)
        if "int8" in only and files:
            compare_models("MobileNetV2 224 int8", device, files["int8"], rounds, summary,
                           4.0, exact=True, free_device=free_device)
            x = hal_models.float_input()
            layers = hal_models.mobilenet_v2_layers(0)
            quant = hal_models.calibrate(layers, x)
            first_divergence(layers, quant, hal_models.quantize_input(x, quant))
        if "add" in only:
            bench_add(device, 200 if args.quick else 1000, max(rounds // 2, 3), summary,
                      converter_add(Path(tmp.name)))
        if "memory" in only:
            bench_memory(device, summary)
        if "profile" in only and files:
            runs = 3 if args.quick else 10
            for label, key in (("MobileNet V1 float32", "v1"), ("MobileNetV2 float32", "v2"),
                               ("MobileNetV2 int8", "int8")):
                model, inputs = file_model(files[key])
                profile(label, device, model, inputs, runs)
    finally:
        device.close()
        free_device.close()
        tmp.cleanup()
    summary.print()


if __name__ == "__main__":
    main()
