"""Per-execution overhead of the NNAPI runtime (nnhal.runtime) over calling the driver
directly, on a one-ADD [1, 16] model on the reference driver. Rounds interleave the paths so
that load from other processes hits them alike; prints medians (us) and the load average.
Prints figures; asserts nothing.

- driver: ``executeSynchronously`` of a request built once (inputs written into its memory
  and the output read back each time, as a client of the HAL would);
- runtime compute: a new Execution per run (create, setInput x2, setOutput, compute), as an
  NDK app without reusable executions does;
- runtime reusable: one reusable Execution, compute each time (inputs copied each time);
- runtime burst: a new Execution per run, burstCompute on one Burst.

With ``--specs DIR`` (the conformance cases), the same for the V1_0 MobileNet case: the model
built through the NDK calls as mode ``runtime`` builds it, against the driver with the case's
HAL model and request.

    python benchmarks/bench_runtime.py [--n N] [--rounds R] [--specs ../shared/conformance]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import numpy as np

from nnhal.drivers.reference import ReferenceDevice
from nnhal.hal.builder import ModelBuilder, RequestBuilder
from nnhal.hal.interfaces import PreparedModelCallback
from nnhal.hal.types import (
    ExecutionPreference,
    MeasureTiming,
    OperandType,
    OperationType,
    Priority,
)
from nnhal.runtime import Burst, Compilation, Device, Execution, NdkModel, OperandSpec

SHAPE = [1, 16]


def hal_add():
    b = ModelBuilder()
    x = b.input(OperandType.TENSOR_FLOAT32, SHAPE)
    y = b.input(OperandType.TENSOR_FLOAT32, SHAPE)
    act = b.scalar(OperandType.INT32, 0)
    out = b.output(OperandType.TENSOR_FLOAT32, SHAPE)
    b.operation(OperationType.ADD, [x, y, act], [out])
    return b.build()


def ndk_add() -> NdkModel:
    m = NdkModel()
    t = OperandSpec(int(OperandType.TENSOR_FLOAT32), SHAPE)
    a, b = m.add_operand(t), m.add_operand(t)
    act = m.add_operand(OperandSpec(int(OperandType.INT32)))
    out = m.add_operand(t)
    m.set_operand_value(act, np.int32(0).tobytes())
    m.add_operation(int(OperationType.ADD), [a, b, act], [out])
    m.identify_inputs_and_outputs([a, b], [out])
    m.finish()
    return m


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000, help="executions per path and round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--specs", help="conformance cases: also time the V1_0 MobileNet case")
    args = ap.parse_args()

    hal = ReferenceDevice()
    x = np.arange(16, dtype=np.float32).reshape(SHAPE)
    y = np.ones(SHAPE, np.float32)
    out = np.zeros(SHAPE, np.float32)

    cb = PreparedModelCallback()
    model = hal_add()
    hal.prepare_model(model, ExecutionPreference.FAST_SINGLE_ANSWER, Priority.MEDIUM, None,
                      [], [], b"", cb)
    _, pm = cb.wait(60)
    rb = RequestBuilder.for_model(model, [x, y])
    in_view = rb.input_memory.array()
    out_view = rb.output_memory.array()

    def driver() -> None:
        in_view[:x.nbytes] = x.reshape(-1).view(np.uint8)
        pm.execute_synchronously(rb.request, MeasureTiming.NO, None, None)
        out.reshape(-1).view(np.uint8)[:] = out_view[:out.nbytes]

    comp = Compilation.for_devices(ndk_add(), [Device.of(hal, "reference")])
    comp.finish()
    burst = Burst(comp)
    reusable = Execution(comp)
    reusable.set_reusable(True)
    reusable.set_input(0, None, x)
    reusable.set_input(1, None, y)
    reusable.set_output(0, None, out)

    def new_execution() -> Execution:
        e = Execution(comp)
        e.set_input(0, None, x)
        e.set_input(1, None, y)
        e.set_output(0, None, out)
        return e

    def runtime_compute() -> None:
        new_execution().compute()

    def runtime_burst() -> None:
        new_execution().burst_compute(burst)

    report("one ADD [1, 16]", {
        "driver executeSynchronously": driver,
        "runtime compute (new execution)": runtime_compute,
        "runtime reusable compute": reusable.compute,
        "runtime burstCompute (new execution)": runtime_burst,
    }, args.n, args.rounds)
    if args.specs:
        mobilenet(hal, args.specs, max(5, args.n // 200), args.rounds)


def report(title: str, paths: dict[str, Callable[[], None]], n: int, rounds: int) -> None:
    for fn in paths.values():  # warm up
        for _ in range(min(n, 50)):
            fn()
    times: dict[str, list[float]] = {k: [] for k in paths}
    for _ in range(rounds):
        for name, fn in paths.items():
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            times[name].append((time.perf_counter() - t0) / n * 1e6)
    base = statistics.median(next(iter(times.values())))
    print(f"{title}: load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} on "
          f"{os.cpu_count()} cores; {rounds} rounds x {n}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:<38} {med:10.1f} us  (min {min(ts):.1f})  overhead "
              f"{med - base:+8.1f} us")


def mobilenet(hal: ReferenceDevice, specs: str, n: int, rounds: int) -> None:
    from pathlib import Path

    from nnhal.conformance.cases import build_model, build_request, iter_cases, values_array
    from nnhal.conformance.mode_runtime import build

    case = next(iter_cases(Path(specs), "mobilenet_224_gender_basic_fixed"), None)
    if case is None:
        print("no mobilenet_224_gender_basic_fixed case in", specs)
        return
    m = case.data["model"]
    cb = PreparedModelCallback()
    hal.prepare_model(build_model(m), ExecutionPreference.FAST_SINGLE_ANSWER, Priority.MEDIUM,
                      None, [], [], b"", cb)
    _, pm = cb.wait(600)
    built = build_request(m)

    def driver() -> None:
        pm.execute_synchronously(built.request, MeasureTiming.NO, None, None)

    model, _keep = build(m)
    comp = Compilation.for_devices(model, [Device.of(hal, "reference")])
    comp.finish()
    main = m["main"]
    inputs = [values_array(OperandType[main["operands"][i]["type"]],
                           main["operands"][i]["data"], main["operands"][i]["dimensions"])
              for i in main["inputIndexes"]]
    outs = [np.zeros(built.outputs[k].values.nbytes, np.uint8)
            for k in range(len(main["outputIndexes"]))]

    def runtime_compute() -> None:
        e = Execution(comp)
        for k, a in enumerate(inputs):
            e.set_input(k, None, a)
        for k, o in enumerate(outs):
            e.set_output(k, None, o)
        e.compute()

    report("MobileNet V1_0 (mobilenet_224_gender_basic_fixed)", {
        "driver executeSynchronously": driver,
        "runtime compute (new execution)": runtime_compute,
    }, n, rounds)


if __name__ == "__main__":
    main()
