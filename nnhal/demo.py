"""``nnhal demo``: a small convolutional model built from HAL types, prepared and executed on
the reference driver, with timings and the driver's capabilities."""

from __future__ import annotations

import time

import numpy as np

from nnhal.drivers.reference import ReferenceDevice
from nnhal.hal.builder import ModelBuilder, RequestBuilder
from nnhal.hal.interfaces import PreparedModelCallback
from nnhal.hal.types import (
    ErrorStatus,
    ExecutionPreference,
    MeasureTiming,
    Model,
    OperandType,
    OperationType,
    Priority,
)

T = OperandType
O = OperationType


def build_demo_model(seed: int = 0) -> Model:
    """input [1,8,8,3] -> CONV_2D 3x3x8 (SAME, ReLU) -> AVERAGE_POOL 2x2 -> RESHAPE
    -> FULLY_CONNECTED 4 -> SOFTMAX."""
    rng = np.random.default_rng(seed)
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, [1, 8, 8, 3])
    w = b.constant(T.TENSOR_FLOAT32, rng.normal(0, 0.5, (8, 3, 3, 3)).astype(np.float32))
    bias = b.constant(T.TENSOR_FLOAT32, rng.normal(0, 0.1, 8).astype(np.float32))
    conv = b.operand(T.TENSOR_FLOAT32, [1, 8, 8, 8])
    b.operation(O.CONV_2D, [x, w, bias, b.scalar(T.INT32, 1), b.scalar(T.INT32, 1),
                            b.scalar(T.INT32, 1), b.scalar(T.INT32, 1)], [conv])
    pool = b.operand(T.TENSOR_FLOAT32, [1, 4, 4, 8])
    b.operation(O.AVERAGE_POOL_2D, [conv, b.scalar(T.INT32, 2), b.scalar(T.INT32, 2),
                                    b.scalar(T.INT32, 2), b.scalar(T.INT32, 2),
                                    b.scalar(T.INT32, 2), b.scalar(T.INT32, 0)], [pool])
    flat = b.operand(T.TENSOR_FLOAT32, [1, 128])
    b.operation(O.RESHAPE, [pool, b.constant(T.TENSOR_INT32, [1, 128])], [flat])
    fc_w = b.constant(T.TENSOR_FLOAT32, rng.normal(0, 0.2, (4, 128)).astype(np.float32))
    fc_b = b.constant(T.TENSOR_FLOAT32, np.zeros(4, np.float32))
    logits = b.operand(T.TENSOR_FLOAT32, [1, 4])
    b.operation(O.FULLY_CONNECTED, [flat, fc_w, fc_b, b.scalar(T.INT32, 0)], [logits])
    probs = b.output(T.TENSOR_FLOAT32, [1, 4])
    b.operation(O.SOFTMAX, [logits, b.scalar(T.FLOAT32, 1.0)], [probs])
    return b.build()


def main() -> int:
    device = ReferenceDevice()
    try:
        model = build_demo_model()
        status, supported = device.get_supported_operations(model)
        print(f"getSupportedOperations: {status.name} {supported}")
        t0 = time.perf_counter()
        cb = PreparedModelCallback()
        device.prepare_model(model, ExecutionPreference.FAST_SINGLE_ANSWER, Priority.MEDIUM,
                             None, [], [], b"", cb)
        status, prepared = cb.wait(30)
        prepare_ms = (time.perf_counter() - t0) * 1e3
        if status != ErrorStatus.NONE or prepared is None:
            print(f"prepareModel failed: {status.name}")
            return 1
        image = np.linspace(-1, 1, 8 * 8 * 3, dtype=np.float32).reshape(1, 8, 8, 3)
        req = RequestBuilder([image], [4 * 4])
        t0 = time.perf_counter()
        status, shapes, timing = prepared.execute_synchronously(req.request, MeasureTiming.YES)
        execute_ms = (time.perf_counter() - t0) * 1e3
        if status != ErrorStatus.NONE:
            print(f"execution failed: {status.name}")
            return 1
        probs = req.output(0, np.float32, shapes[0].dimensions)
        req.close()
        print(f"output shape {shapes[0].dimensions}: {np.array2string(probs, precision=5)}")
        print(f"prepare {prepare_ms:.2f} ms, execute {execute_ms:.3f} ms "
              f"(driver-reported: on device {timing.time_on_device} us, "
              f"in driver {timing.time_in_driver} us)")
        _, caps = device.get_capabilities()
        _, version = device.get_version_string()
        _, dtype = device.get_type()
        print(f"device {device.name} ({version}, {dtype.name})")
        print(f"  relaxed f32->f16 scalar {caps.relaxed_float32_to_float16_performance_scalar}, "
              f"tensor {caps.relaxed_float32_to_float16_performance_tensor}")
        print(f"  IF {caps.if_performance}, WHILE {caps.while_performance}")
        print("  operand types: " + ", ".join(T(p.type).name for p in caps.operand_performance))
        return 0
    finally:
        device.close()
