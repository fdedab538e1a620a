"""What every part of the mutation tools shares: the outcomes of a check, the callback timeout,
operand type groups, the byte size of an operand, and what the operation signatures say about
an operation's inputs (which may be left out, omitted or added)."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace

from nnhal.hal.types import (
    Operand,
    OperandLifeTime,
    OperandType,
    Operation,
    is_extension_type,
    operand_nbytes,
)
from nnhal.ops.catalog import signature
from nnhal.ops.signature import SignatureError, check, input_slots, omittable_positions

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
    """Bytes of an operand whose values a mutation can write, 0 otherwise: the HAL size
    (:func:`operand_nbytes`), less OEM operands, whose contents only their vendor knows."""
    if o.type in (T.OEM, T.TENSOR_OEM_BYTE):
        return 0
    return operand_nbytes(o) or 0


# ---- what the operation signatures say -----------------------------------------------------

def _fits(op: Operation, ins: Sequence[Operand], outs: Sequence[Operand]) -> bool:
    """Whether operands of these types and lifetimes fit the operation's signature."""
    sig = None if is_extension_type(op.type) else signature(op.type)
    if sig is None:
        return False
    try:
        check(sig, [_typed(o) for o in ins], [_typed(o) for o in outs])
    except (SignatureError, ValueError):
        return False
    return True


def _typed(o: Operand) -> SimpleNamespace:
    return SimpleNamespace(type=T(o.type), lifetime=OperandLifeTime(o.lifetime))


def input_is_required(op: Operation, k: int) -> bool:
    """Whether input ``k`` may not be omitted (NO_VALUE), as the operation's signature says."""
    sig = None if is_extension_type(op.type) else signature(op.type)
    if sig is None or input_slots(sig, len(op.inputs)) is None:
        return k == 0
    return k not in omittable_positions(sig, len(op.inputs))


def removal_may_be_valid(op: Operation, k: int, operands: Sequence[Operand]) -> bool:
    """Whether the operation without input ``k`` may still fit its signature (a trailing
    optional input, one of several repeated tensors): such a mutant need not be invalid."""
    ins = [operands[i] for j, i in enumerate(op.inputs) if j != k]
    return _fits(op, ins, [operands[i] for i in op.outputs])


def addition_may_be_valid(op: Operation, extra: Operand, operands: Sequence[Operand]) -> bool:
    """Whether the operation with ``extra`` appended to its inputs may still fit."""
    ins = [*(operands[i] for i in op.inputs), extra]
    return _fits(op, ins, [operands[i] for i in op.outputs])
