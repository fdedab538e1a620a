"""Upstream's FibonacciExtensionTest as functions over any NDK face: the Python functions of
nnhal.runtime.ndk here, the same calls served (test_served.py). Each returns nothing and
asserts; ``ndk`` is a module-like object with the NDK's functions returning codes."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from nnhal.runtime.codes import ResultCode
from nnhal.runtime.model import ANeuralNetworksOperandType as OT

NAME = "com.example.fibonacci"
INT64, TENSOR_QUANT64_ASYMM, FIBONACCI = 0, 1, 0
TENSOR_FLOAT32, TENSOR_INT32, INT32, ADD = 3, 4, 1, 0
OK, BAD_DATA, OP_FAILED = int(ResultCode.NO_ERROR), int(ResultCode.BAD_DATA), \
    int(ResultCode.OP_FAILED)
N = 10
FIB = [1, 1, 2, 3, 5, 8, 13, 21, 34, 55]


def ok(result: Any) -> Any:
    code, value = result if isinstance(result, tuple) else (result, None)
    assert code == OK, code
    return value


def find_devices(ndk: Any) -> tuple[Any, Any, list[Any]]:
    """(the Fibonacci device, the reference device, every device), as upstream's SetUp."""
    fib = cpu = None
    every = []
    for i in range(ok(ndk.ANeuralNetworks_getDeviceCount())):
        d = ok(ndk.ANeuralNetworks_getDevice(i))
        every.append(d)
        if ok(ndk.ANeuralNetworksDevice_getExtensionSupport(d, NAME)):
            assert fib is None, "several Fibonacci devices"
            fib = d
        elif ok(ndk.ANeuralNetworksDevice_getName(d)) == "reference":
            cpu = d
    assert fib is not None and cpu is not None
    return fib, cpu, every


class Case:
    """One model built call by call, compiled for the Fibonacci and reference devices."""

    def __init__(self, ndk: Any):
        self.ndk = ndk
        self.fib, self.cpu, self.every = find_devices(ndk)
        self.devices = [self.fib, self.cpu]
        self.model = ok(ndk.ANeuralNetworksModel_create())
        self.n = 0

    def ext_operand_type(self, code: int) -> int:
        return ok(self.ndk.ANeuralNetworksModel_getExtensionOperandType(self.model, NAME, code))

    def ext_operation_type(self, code: int) -> int:
        return ok(self.ndk.ANeuralNetworksModel_getExtensionOperationType(self.model, NAME,
                                                                          code))

    def operand(self, t: int, dims: list[int] = ()) -> int:  # type: ignore[assignment]
        ok(self.ndk.ANeuralNetworksModel_addOperand(self.model, OT(t, list(dims))))
        self.n += 1
        return self.n - 1

    def nop(self, t: int, dims: list[int], src: int, dst: int) -> None:
        """ADD of zeros: the operations around the Fibonacci one (the reference's)."""
        zeros = self.operand(t, dims)
        ok(self.ndk.ANeuralNetworksModel_setOperandValue(
            self.model, zeros, np.zeros(dims, np.float32), 4 * int(np.prod(dims))))
        act = self.operand(INT32)
        ok(self.ndk.ANeuralNetworksModel_setOperandValue(self.model, act,
                                                          np.int32(0).tobytes(), 4))
        ok(self.ndk.ANeuralNetworksModel_addOperation(self.model, ADD, [src, zeros, act],
                                                      [dst]))

    def build(self, in_t: int, in_dims: list[int], out_t: int, out_dims: list[int],
              nops: bool = False, params: bytes | None = None) -> None:
        """upstream's createModel: [ADD ->] FIBONACCI [-> ADD]."""
        fin, fout = self.operand(in_t, in_dims), self.operand(out_t, out_dims)
        if params is not None:
            ok(self.ndk.ANeuralNetworksModel_setOperandExtensionData(self.model, fout, params,
                                                                     len(params)))
        mi = self.operand(in_t, in_dims) if nops else fin
        mo = self.operand(out_t, out_dims) if nops else fout
        if nops:
            self.nop(in_t, in_dims, mi, fin)
        ok(self.ndk.ANeuralNetworksModel_addOperation(
            self.model, self.ext_operation_type(FIBONACCI), [fin], [fout]))
        if nops:
            self.nop(out_t, out_dims, fout, mo)
        self.finish([mi], [mo])

    def finish(self, ins: list[int], outs: list[int]) -> None:
        ok(self.ndk.ANeuralNetworksModel_identifyInputsAndOutputs(self.model, ins, outs))
        ok(self.ndk.ANeuralNetworksModel_finish(self.model))

    def supported(self, devices: list[Any] | None = None) -> list[bool]:
        return list(ok(self.ndk.ANeuralNetworksModel_getSupportedOperationsForDevices(
            self.model, devices or self.devices)))

    def compile(self) -> tuple[Any, int]:
        c = ok(self.ndk.ANeuralNetworksCompilation_createForDevices(self.model, self.devices))
        return c, self.ndk.ANeuralNetworksCompilation_finish(c)

    def run(self, x: np.ndarray, out: np.ndarray) -> int:
        c, code = self.compile()
        assert code == OK, code
        e = ok(self.ndk.ANeuralNetworksExecution_create(c))
        ok(self.ndk.ANeuralNetworksExecution_setInput(e, 0, None, x, x.nbytes))
        ok(self.ndk.ANeuralNetworksExecution_setOutput(e, 0, None, out, out.nbytes))
        return self.ndk.ANeuralNetworksExecution_compute(e)


def extension_operand_types(ndk: Any) -> None:
    """INT64 in, TENSOR_QUANT64_ASYMM {scale 0.5, zeroPoint 10} out."""
    c = Case(ndk)
    c.build(c.ext_operand_type(INT64), [], c.ext_operand_type(TENSOR_QUANT64_ASYMM), [N],
            params=struct.pack("=dq", 0.5, 10))
    assert c.supported() == [True]
    out = np.zeros(N, np.int64)
    assert c.run(np.array(N, np.int64), out) == OK
    assert out.tolist() == [f / 0.5 + 10 for f in FIB]


def temporaries(ndk: Any) -> None:
    """float in and out, ADDs around the Fibonacci operation: temporaries cross devices."""
    c = Case(ndk)
    c.build(TENSOR_FLOAT32, [1], TENSOR_FLOAT32, [N], nops=True)
    assert c.supported() == [True, True, True]
    out = np.zeros(N, np.float32)
    assert c.run(np.array([N], np.float32), out) == OK
    assert out.tolist() == FIB


def negative_n(ndk: Any) -> None:
    c = Case(ndk)
    c.build(TENSOR_FLOAT32, [1], TENSOR_FLOAT32, [1])
    assert c.supported() == [True]
    assert c.run(np.array([-1], np.float32), np.zeros(1, np.float32)) == OP_FAILED


def _unsupported(c: Case) -> None:
    assert c.supported() == [False]
    assert c.compile()[1] == BAD_DATA


def invalid_input_type(ndk: Any) -> None:
    c = Case(ndk)
    c.build(TENSOR_INT32, [1], TENSOR_FLOAT32, [1])
    _unsupported(c)


def invalid_output_type(ndk: Any) -> None:
    c = Case(ndk)
    c.build(TENSOR_FLOAT32, [1], TENSOR_INT32, [1])
    _unsupported(c)


def invalid_num_inputs(ndk: Any) -> None:
    c = Case(ndk)
    a, b, out = (c.operand(TENSOR_FLOAT32, [1]) for _ in range(3))
    ok(ndk.ANeuralNetworksModel_addOperation(c.model, c.ext_operation_type(FIBONACCI), [a, b],
                                             [out]))
    c.finish([a, b], [out])
    _unsupported(c)


def invalid_num_outputs(ndk: Any) -> None:
    c = Case(ndk)
    a, o1, o2 = (c.operand(TENSOR_FLOAT32, [1]) for _ in range(3))
    ok(ndk.ANeuralNetworksModel_addOperation(c.model, c.ext_operation_type(FIBONACCI), [a],
                                             [o1, o2]))
    c.finish([a], [o1, o2])
    _unsupported(c)


def invalid_operation(ndk: Any) -> None:
    c = Case(ndk)
    a, out = c.operand(TENSOR_FLOAT32, [1]), c.operand(TENSOR_FLOAT32, [1])
    ok(ndk.ANeuralNetworksModel_addOperation(c.model, c.ext_operation_type(FIBONACCI + 1), [a],
                                             [out]))
    c.finish([a], [out])
    _unsupported(c)


def supported_per_device(ndk: Any) -> None:
    """Only the Fibonacci device supports the Fibonacci operation."""
    c = Case(ndk)
    c.build(TENSOR_FLOAT32, [1], TENSOR_FLOAT32, [1])
    for d in c.every:
        assert c.supported([d]) == [d is c.fib], ok(ndk.ANeuralNetworksDevice_getName(d))


CASES = [extension_operand_types, temporaries, negative_n, invalid_input_type,
         invalid_output_type, invalid_num_inputs, invalid_num_outputs, invalid_operation,
         supported_per_device]
