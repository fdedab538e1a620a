"""Broadcasting comparisons: EQUAL, NOT_EQUAL, GREATER, GREATER_EQUAL, LESS, LESS_EQUAL.

Quantized inputs are compared on their real values (each dequantised with its own scale and
zero point in float32), as the reference driver does since HAL 1.3, so the two inputs may
carry different quantization parameters.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from nnhal.hal.types import OperandType, OperationType
from nnhal.ops import common as C
from nnhal.ops.elementwise import BroadcastBinary, table_lookup
from nnhal.ops.resolver import OpContext, OperandInfo, register
from nnhal.ops.signature import V1_2, V1_3, Slot, sig, variants

T = OperandType
O = OperationType

COMPARE_TYPES = (T.TENSOR_BOOL8, T.TENSOR_FLOAT16, T.TENSOR_FLOAT32, T.TENSOR_INT32,
                 *C.QUANT8_TYPES)

#: Each comparison's numpy function (the reference's kernel; the TFLite importer's and
#: exporter's rewrites and the TFLite extension's comparisons compute with these too).
COMPARE_FUNCS: dict[OperationType, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    O.EQUAL: np.equal, O.NOT_EQUAL: np.not_equal, O.GREATER: np.greater,
    O.GREATER_EQUAL: np.greater_equal, O.LESS: np.less, O.LESS_EQUAL: np.less_equal,
}

_INPUTS = [Slot("input0", "T"),
           Slot("input1", "T", doc="broadcast against input0; quantization may differ")]
_VARIANTS = [*variants(V1_2, *({"T": t} for t in (T.TENSOR_BOOL8, T.TENSOR_FLOAT16,
                                                 T.TENSOR_FLOAT32, T.TENSOR_INT32,
                                                 T.TENSOR_QUANT8_ASYMM))),
             *variants(V1_3, {"T": T.TENSOR_QUANT8_ASYMM_SIGNED})]

SIGNATURES = [sig(op, _INPUTS, [Slot("output", T.TENSOR_BOOL8)], _VARIANTS) for op in COMPARE_FUNCS]


def real_table(info: OperandInfo) -> np.ndarray:
    """float32 real value of every stored value of an 8-bit quantized type."""
    qmin, qmax = C.qrange(info.type)
    q = np.arange(qmin, qmax + 1, dtype=np.int32)
    with np.errstate(all="ignore"):
        return (q - np.int32(info.zero_point)).astype(np.float32) * np.float32(info.scale)


def stored_for_rows(fn: Callable[[np.ndarray, np.ndarray], np.ndarray], q: np.ndarray,
                    constant_first: bool) -> dict[bytes, int]:
    """Per row of results over the stored values ``q`` (its bytes): the stored value k that,
    compared by ``fn`` with each of them (k on the constant's side), gives that row, the
    first where rows repeat. A comparison with a constant becomes one with these stored
    values, in the other operand's own quantization, which ranks as the stored values do:
    one lookup per distinct constant value, not a search of every candidate."""
    ints = fn(q[:, None], q[None, :]) if constant_first else fn(q[None, :], q[:, None])
    found: dict[bytes, int] = {}
    for k in range(len(q) - 1, -1, -1):
        found[ints[k].tobytes()] = int(q[k])
    return found


def real_values(info: OperandInfo) -> np.ndarray:
    """float32 real values of a constant 8-bit quantized operand, as :func:`real_table`."""
    with np.errstate(all="ignore"):
        return ((np.asarray(info.value).astype(np.int32) - np.int32(info.zero_point))
                .astype(np.float32) * np.float32(info.scale))


class _Compare(BroadcastBinary):
    def kernel(self, ctx: OpContext):
        fn = COMPARE_FUNCS[self.op_type]
        a, b = ctx.inputs[0], ctx.inputs[1]
        if a.type in C.QUANT8_TYPES:
            qmin = C.qrange(a.type)[0]
            ra, rb = real_table(a), real_table(b)
            return lambda ins, rt: [fn(table_lookup(ra, ins[0], qmin),
                                       table_lookup(rb, ins[1], qmin))]
        return lambda ins, rt: [np.asarray(fn(ins[0], ins[1]), dtype=np.bool_)]


for _op in COMPARE_FUNCS:
    register(_op)(type(f"_{_op.name.title().replace('_', '')}", (_Compare,), {}))
