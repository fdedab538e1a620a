"""Prepare and execute times for the MobileNet cases (V1_0 float, V1_1 relaxed), and the
per-execution time of a one-ADD model. Prints figures; asserts nothing (speed goals live here,
not in tests).

    python benchmarks/bench_driver.py [--specs DIR] [--repeat N]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from nnhal.conformance.cases import build_model, build_request, default_specs_dir, iter_cases
from nnhal.drivers.reference import ReferenceDevice
from nnhal.hal.builder import ModelBuilder, RequestBuilder
from nnhal.hal.interfaces import PreparedModelCallback
from nnhal.hal.types import (
    ErrorStatus,
    ExecutionPreference,
    MeasureTiming,
    OperandType,
    OperationType,
    Priority,
)


def prepare(device, model):
    cb = PreparedModelCallback()
    device.prepare_model(model, ExecutionPreference.FAST_SINGLE_ANSWER, Priority.MEDIUM, None,
                         [], [], b"", cb)
    status, pm = cb.wait(120)
    assert status == ErrorStatus.NONE, status
    return pm


def median_ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def bench_mobilenet(device, specs: Path, repeat: int) -> None:
    cases = [c for c in iter_cases(specs, "mobilenet*")]
    if not cases:
        print(f"MobileNet cases not found under {specs}: skipped")
        return
    for case in cases:
        m = case.data["model"]
        prepare_ms = median_ms(lambda m=m: prepare(device, build_model(m)), repeat)
        pm = prepare(device, build_model(m))
        built = build_request(m)

        def run(pm=pm, built=built):
            status, _, _ = pm.execute_synchronously(built.request, MeasureTiming.NO)
            assert status == ErrorStatus.NONE

        run()
        exec_ms = median_ms(run, repeat)
        print(f"{case.name:<36} prepare {prepare_ms:8.2f} ms   execute {exec_ms:8.2f} ms")


def bench_add(device, repeat: int) -> None:
    b = ModelBuilder()
    x = b.input(OperandType.TENSOR_FLOAT32, [1, 16])
    y = b.input(OperandType.TENSOR_FLOAT32, [1, 16])
    act = b.scalar(OperandType.INT32, 0)
    out = b.output(OperandType.TENSOR_FLOAT32, [1, 16])
    b.operation(OperationType.ADD, [x, y, act], [out])
    pm = prepare(device, b.build())
    a = np.ones((1, 16), np.float32)
    rb = RequestBuilder([a, a], [64])
    n = max(200, repeat * 100)
    for _ in range(50):
        pm.execute_synchronously(rb.request)
    t0 = time.perf_counter()
    for _ in range(n):
        pm.execute_synchronously(rb.request)
    per_us = (time.perf_counter() - t0) / n * 1e6
    print(f"{'one ADD [1,16] executeSynchronously':<36} {per_us:8.1f} us per execution")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--specs", type=Path, default=None)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    device = ReferenceDevice()
    try:
        bench_mobilenet(device, args.specs or default_specs_dir(), args.repeat)
        bench_add(device, args.repeat)
    finally:
        device.close()


if __name__ == "__main__":
    main()
