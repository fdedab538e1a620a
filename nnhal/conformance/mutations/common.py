"""What every part of the mutation tools shares: the outcomes of a check, the callback timeout,
operand type groups and the byte size of an operand."""

from __future__ import annotations

import numpy as np

from nnhal.hal.types import Operand, OperandType

T = OperandType


#: How long any callback may take before the driver is called hung.
CALLBACK_TIMEOUT_S = 30.0

#: What a driver did with a mutant; only REJECTED is right.
REJECTED, ACCEPTED, WRONG_STATUS, CRASH, HANG = "rejected", "accepted", "wrong_status", \
    "crash", "hang"

#: Scalar operand types and the per-tensor quantized tensor types.
SCALAR_TYPES = (T.FLOAT16, T.FLOAT32, T.INT32, T.UINT32, T.BOOL)
QUANT_TYPES = (T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_SYMM, T.TENSOR_QUANT16_ASYMM,
          T.TENSOR_QUANT16_SYMM)


def byte_size(o: Operand) -> int:
    """Bytes of a fully specified non-extension operand; 0 when unknown."""
    try:
        t = T(o.type)
    except ValueError:
        return 0
    if t in (T.OEM, T.TENSOR_OEM_BYTE, T.SUBGRAPH):
        return 0
    if t.is_scalar:
        return t.byte_size
    if not o.dimensions or 0 in o.dimensions:
        return 0
    return int(np.prod(o.dimensions, dtype=np.int64)) * t.byte_size
