"""com.example.fibonacci: nnhal's example vendor extension, and a device that offers it.

Declared as data with :mod:`nnhal.ops.extensions`: two operand types and one operation whose
signature, validation, shape inference and kernel are those of any nnhal operation.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np

from nnhal.drivers.reference import ReferenceDevice
from nnhal.hal.types import ErrorStatus
from nnhal.hal.types import OperandType as T
from nnhal.ops.extensions import ExtensionDef, OperandTypeDef, operation
from nnhal.ops.resolver import OpContext, OperationDef, OpError
from nnhal.ops.signature import Slot

#: The extension's name.
NAME = "com.example.fibonacci"
#: Operand type codes within the extension.
EXAMPLE_INT64 = 0
EXAMPLE_TENSOR_QUANT64_ASYMM = 1
#: Operation codes within the extension.
EXAMPLE_FIBONACCI = 0

#: TENSOR_QUANT64_ASYMM's extension data: {double scale; int64_t zeroPoint}, as C lays it out.
QUANT64_PARAMS = struct.Struct("=dq")
#: The largest n an execution computes (the output holds n elements).
MAX_N = 1 << 20


def quant64_params(scale: float, zero_point: int) -> bytes:
    """The extension data of a TENSOR_QUANT64_ASYMM operand."""
    return QUANT64_PARAMS.pack(scale, zero_point)


def _check_quant64(data: bytes) -> str | None:
    scale, _ = QUANT64_PARAMS.unpack(data)
    if not (math.isfinite(scale) and scale > 0):
        return f"{NAME}:TENSOR_QUANT64_ASYMM needs a positive finite scale, got {scale}"
    return None


INT64 = OperandTypeDef(NAME, EXAMPLE_INT64, "INT64", is_tensor=False, byte_size=8,
                       dtype=np.int64, doc="A signed 64-bit integer scalar.")
TENSOR_QUANT64_ASYMM = OperandTypeDef(
    NAME, EXAMPLE_TENSOR_QUANT64_ASYMM, "TENSOR_QUANT64_ASYMM", is_tensor=True, byte_size=8,
    dtype=np.uint64, params_size=QUANT64_PARAMS.size, check_params=_check_quant64,
    doc="Unsigned 64-bit integers standing for real numbers: (value - zeroPoint) * scale.")


def _n(value: Any) -> int:
    flat = np.asarray(value).reshape(-1)
    if flat.size != 1:
        raise OpError(f"{NAME}:FIBONACCI: n must be one value, got {flat.size}",
                      ErrorStatus.GENERAL_FAILURE)
    x = flat[0]
    if isinstance(x, np.floating) and not np.isfinite(x):
        raise OpError(f"{NAME}:FIBONACCI: n is {x}", ErrorStatus.GENERAL_FAILURE)
    return int(x)


class Fibonacci(OperationDef):
    """The first n Fibonacci numbers, quantized when the output is TENSOR_QUANT64_ASYMM."""

    def validate(self, ctx: OpContext) -> None:
        n = ctx.inputs[0]
        if n.type == T.TENSOR_FLOAT32 and n.shape is not None and all(n.shape):
            ctx.require(math.prod(n.shape) == 1, f"a TENSOR_FLOAT32 n holds one element, "
                        f"not {math.prod(n.shape)}")
        ctx.expect_rank(0, 1, output=True)

    def prepare(self, ctx: OpContext) -> list[tuple[int, ...] | None] | None:
        value = ctx.const(0)
        if value is None:
            return None
        n = _n(value)
        ctx.require(1 <= n <= MAX_N, f"n must be in [1, {MAX_N}], got {n}")
        return [(n,)]

    def kernel(self, ctx: OpContext):  # type: ignore[no-untyped-def]
        out = ctx.outputs[0]
        if out.type == T.TENSOR_FLOAT32:
            dtype, scale, zero_point = np.dtype(np.float32), 1.0, 0
        else:
            dtype = np.dtype(np.uint64)
            scale, zero_point = QUANT64_PARAMS.unpack(out.extension_params or b"")

        def run(ins, rt):  # type: ignore[no-untyped-def]
            n = _n(ins[0])
            if not 1 <= n <= MAX_N:
                raise OpError(f"{NAME}:FIBONACCI: n must be in [1, {MAX_N}], got {n}",
                              ErrorStatus.GENERAL_FAILURE)
            fib = np.empty(n, dtype)
            a = b = dtype.type(1)
            with np.errstate(over="ignore"):
                for i in range(n):
                    fib[i] = a
                    a, b = b, a + b
            if dtype == np.float32:
                return [fib]
            # As upstream's sample driver: value / scale + zeroPoint, in double, truncated.
            return [(fib.astype(np.float64) / scale + zero_point).astype(np.uint64)]

        return run


FIBONACCI = operation(
    NAME, EXAMPLE_FIBONACCI, "FIBONACCI",
    [Slot("n", (INT64, T.TENSOR_FLOAT32), doc="n: an INT64 scalar or a TENSOR_FLOAT32 of "
          "one element")],
    [Slot("output", (TENSOR_QUANT64_ASYMM, T.TENSOR_FLOAT32),
          doc="the first n Fibonacci numbers, a 1-D tensor of n elements")],
    Fibonacci(), doc="Computes the first n Fibonacci numbers.")

#: The extension (the entry point of the group ``nnhal.extensions``).
EXTENSION = ExtensionDef(NAME, (INT64, TENSOR_QUANT64_ASYMM), (FIBONACCI,),
                         doc="Upstream NNAPI's example extension.")


class FibonacciDevice(ReferenceDevice):
    """A device offering com.example.fibonacci and claiming its operations only, as upstream's
    sample Fibonacci driver does: the runtime gives everything else to other devices."""

    extensions = (NAME,)
    version_string = "nnhal-fibonacci-0.1"

    def __init__(self, name: str = "nnhal-fibonacci", **kwargs: Any):
        super().__init__(name, **kwargs)

    def supported(self, graph):  # type: ignore[no-untyped-def]
        return self.claimed(graph, only_extensions=True)


def make_device() -> FibonacciDevice:
    """The entry point of the group ``nnhal.drivers``."""
    return FibonacciDevice()
