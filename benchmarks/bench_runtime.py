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

    python benchmarks/bench_runtime.py [--n N] [--rounds R]
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
from nnhal.runtime import Burst, Compilation, Device, Execution, Model, OperandSpec

SHAPE = [1, 16]


def hal_add():
    b = ModelBuilder()
    x = b.input(OperandType.TENSOR_FLOAT32, SHAPE)
    y = b.input(OperandType.TENSOR_FLOAT32, SHAPE)
    act = b.scalar(OperandType.INT32, 0)
    out = b.output(OperandType.TENSOR_FLOAT32, SHAPE)
    b.operation(OperationType.ADD, [x, y, act], [out])
    return b.build()


def ndk_add() -> Model:
    m = Model()
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

    paths: dict[str, Callable[[], None]] = {
        "driver executeSynchronously": driver,
        "runtime compute (new execution)": runtime_compute,
        "runtime reusable compute": reusable.compute,
        "runtime burstCompute (new execution)": runtime_burst,
    }
    for fn in paths.values():  # warm up, and check they agree
        for _ in range(50):
            fn()
    times: dict[str, list[float]] = {k: [] for k in paths}
    for _ in range(args.rounds):
        for name, fn in paths.items():
            t0 = time.perf_counter()
            for _ in range(args.n):
                fn()
            times[name].append((time.perf_counter() - t0) / args.n * 1e6)
    base = statistics.median(times["driver executeSynchronously"])
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} on "
          f"{os.cpu_count()} cores; {args.rounds} rounds x {args.n}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:<38} {med:8.1f} us  (min {min(ts):.1f})  overhead "
              f"{med - base:+7.1f} us")


if __name__ == "__main__":
    main()
