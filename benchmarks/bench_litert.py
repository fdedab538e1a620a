"""The LiteRT driver against the reference driver (the capability figures of
``nnhal/drivers/litert/device.py``) and against ai-edge-litert running the same flatbuffer
(the driver's own overhead), in interleaved rounds so that all see the same load.

Models: MobileNetV2 224 float32 and full-integer int8 (random weights, benchmarks/hal_models)
and one ADD [1,16]. Per model it prints the median per-round ratio litert / reference (the
capability figure: lower is better, the reference is 1.0) and litert driver / bare
ai-edge-litert (set_tensor + invoke + get_tensor); then prepareModel against
prepareModelFromCache on MobileNetV2 float32. Prints figures; asserts nothing.

    python benchmarks/bench_litert.py [--rounds N] [--threads T]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a script: make the worktree importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import hal_models  # noqa: E402
from nnhal.drivers.litert import LiteRTDevice  # noqa: E402
from nnhal.drivers.reference import ReferenceDevice  # noqa: E402
from nnhal.hal.builder import ModelBuilder, RequestBuilder  # noqa: E402
from nnhal.hal.interfaces import PreparedModelCallback  # noqa: E402
from nnhal.hal.types import (  # noqa: E402
    ErrorStatus,
    ExecutionPreference,
    Model,
    OperandType,
    OperationType,
    Priority,
)
from nnhal.tflite import write_tflite  # noqa: E402


def load() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())


def prepare(device: object, model: Model) -> object:
    cb = PreparedModelCallback()
    device.prepare_model(model, ExecutionPreference.FAST_SINGLE_ANSWER,  # type: ignore
                         Priority.MEDIUM, None, [], [], b"", cb)
    status, pm = cb.wait(300)
    if status != ErrorStatus.NONE:
        raise SystemExit(f"prepare failed on {device}: {status.name}")
    return pm


def add_model() -> tuple[Model, list[np.ndarray]]:
    b = ModelBuilder()
    x = b.input(OperandType.TENSOR_FLOAT32, (1, 16))
    y = b.input(OperandType.TENSOR_FLOAT32, (1, 16))
    act = b.scalar(OperandType.INT32, 0)
    o = b.output(OperandType.TENSOR_FLOAT32, (1, 16))
    b.operation(OperationType.ADD, [x, y, act], [o])
    rng = np.random.default_rng(0)
    return b.build(), [rng.standard_normal((1, 16)).astype(np.float32) for _ in range(2)]


def timed(fn: Callable[[], object], reps: int) -> float:
    """Seconds per call, best of the calls' mean over ``reps`` calls."""
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def bench(name: str, model: Model, inputs: list[np.ndarray], ref: ReferenceDevice,
          lit: LiteRTDevice, rounds: int, reps: int) -> float:
    from ai_edge_litert.interpreter import Interpreter

    pm_ref, pm_lit = prepare(ref, model), prepare(lit, model)
    rb = RequestBuilder(inputs, model=model)
    bare = Interpreter(model_content=write_tflite(model), num_threads=lit.threads)
    bare.allocate_tensors()
    ins = [d["index"] for d in bare.get_input_details()]
    outs = [d["index"] for d in bare.get_output_details()]

    def run_bare() -> None:
        for i, x in zip(ins, inputs):
            bare.set_tensor(i, x)
        bare.invoke()
        for o in outs:
            bare.get_tensor(o)

    def run_ref() -> None:
        pm_ref.execute_synchronously(rb.request)  # type: ignore[attr-defined]

    def run_lit() -> None:
        pm_lit.execute_synchronously(rb.request)  # type: ignore[attr-defined]

    for fn in (run_ref, run_lit, run_bare):
        fn()
    vs_ref, vs_bare, t_lit, t_ref, t_bare = [], [], [], [], []
    for _ in range(rounds):
        r, li, b = timed(run_ref, reps), timed(run_lit, reps), timed(run_bare, reps)
        vs_ref.append(li / r)
        vs_bare.append(li / b)
        t_lit.append(li)
        t_ref.append(r)
        t_bare.append(b)
    rb.close()
    med = statistics.median
    print(f"{name:22s} reference {med(t_ref) * 1e3:8.3f} ms  litert {med(t_lit) * 1e3:8.3f} ms"
          f"  bare {med(t_bare) * 1e3:8.3f} ms  litert/reference {med(vs_ref):6.3f}"
          f"  litert/bare {med(vs_bare):5.3f}"
          f"  (litert-bare {(med(t_lit) - med(t_bare)) * 1e6:.1f} us)"
          f"  load {load()}", flush=True)
    return med(vs_ref)


def bench_cache(lit: LiteRTDevice, model: Model, rounds: int) -> None:
    """prepareModel against prepareModelFromCache (the live-plan table emptied first, so
    every restore verifies, decodes and builds its interpreter), in this process."""
    import tempfile

    prep, rest = [], []
    with tempfile.TemporaryFile() as mf, tempfile.TemporaryFile() as df:
        token = bytes(range(32))
        for _ in range(rounds):
            t0 = time.perf_counter()
            cb = PreparedModelCallback()
            lit.prepare_model(model, ExecutionPreference.FAST_SINGLE_ANSWER, Priority.MEDIUM,
                              None, [mf], [df], token, cb)
            assert cb.wait(300)[0] == ErrorStatus.NONE
            prep.append(time.perf_counter() - t0)
            lit._cache.forget_live_plans()
            t0 = time.perf_counter()
            cb = PreparedModelCallback()
            lit.prepare_model_from_cache(None, [mf], [df], token, cb)
            assert cb.wait(300)[0] == ErrorStatus.NONE
            rest.append(time.perf_counter() - t0)
    med = statistics.median
    print(f"MobileNetV2 float32 prepare {med(prep) * 1e3:.1f} ms, from cache (cold plan) "
          f"{med(rest) * 1e3:.1f} ms: {med(prep) / med(rest):.1f}x  load {load()}", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--threads", type=int, default=None, help="LiteRT threads (default: cores)")
    args = p.parse_args()
    ref, lit = ReferenceDevice(), LiteRTDevice(threads=args.threads)
    print(f"LiteRT threads {lit.threads}; load {load()}")
    try:
        figures = {}
        model, inputs = add_model()
        figures["add"] = bench("ADD [1,16]", model, inputs, ref, lit, args.rounds, 2000)
        figures["float32"] = bench("MobileNetV2 float32", hal_models.mobilenet_v2_float(),
                                   [hal_models.float_input()], ref, lit, args.rounds, 3)
        m8, x8, _ = hal_models.mobilenet_v2_int8()
        figures["int8"] = bench("MobileNetV2 int8", m8, [x8], ref, lit, args.rounds, 3)
        bench_cache(lit, hal_models.mobilenet_v2_float(), args.rounds)
    finally:
        ref.close()
        lit.close()
    print("capability figures (litert / reference, lower is better): " +
          ", ".join(f"{k} {v:.3f}" for k, v in figures.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
