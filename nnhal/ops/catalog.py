"""Every operation of HAL 1.3: its signature (data) and its definition (validate, shape
inference, reference kernel), looked up by operation type.

This module imports every family module, so it is what the rest of nnhal reads; family
modules import only ``resolver``, ``signature`` and ``common``, never this one.
"""

from __future__ import annotations

from nnhal.core.version import FeatureLevel
from nnhal.hal.types import OperationType
from nnhal.ops import (
    activations,
    arithmetic,
    cast,
    comparison,
    control_flow,
    conv,
    detection,
    elementwise,
    indexing,
    logical,
    lsh_projection,
    lstm,
    matmul,
    normalization,
    pooling,
    quantized_lstm,
    random,
    reduce,
    resize,
    rnn,
    roi,
    shape,
    softmax,
    svdf,
)
from nnhal.ops.resolver import OpContext, OperationDef, OpError, Shape, definitions
from nnhal.ops.signature import V1_0, Signature, SignatureError, check

FAMILIES = (activations, arithmetic, cast, comparison, control_flow, conv, detection,
            elementwise, indexing, logical, lsh_projection, lstm, matmul, normalization, pooling,
            quantized_lstm, random, reduce, resize, rnn, roi, shape, softmax, svdf)

_DEFINITIONS: dict[int, OperationDef] = definitions()
SIGNATURES: dict[OperationType, Signature] = {
    s.op: s for family in FAMILIES for s in getattr(family, "SIGNATURES", ())}


def lookup(op_type: int) -> OperationDef | None:
    """The definition of an operation type, or None when nnhal does not implement it."""
    return _DEFINITIONS.get(int(op_type))


def signature(op_type: int) -> Signature | None:
    return SIGNATURES.get(OperationType(op_type))


def registered() -> dict[int, OperationDef]:
    return dict(_DEFINITIONS)


def check_operation(definition: OperationDef, ctx: OpContext) -> FeatureLevel:
    """Every rule of one operation: its signature, then its own ``validate``. Raises OpError.

    Returns the lowest feature level at which the operation, as given, exists (what its
    signature says), so the analysis computes a model's minimum version while it checks."""
    level = _signature_level(ctx)
    definition.validate(ctx)
    return level


def check_and_prepare(definition: OperationDef, ctx: OpContext
                      ) -> tuple[FeatureLevel, list[Shape] | None]:
    """:func:`check_operation` and the operation's inferred output shapes (its ``prepare``),
    as the analysis asks: an operation whose validate infers them infers them once
    (:meth:`~nnhal.ops.resolver.OperationDef.validate_and_prepare`). Raises OpError."""
    level = _signature_level(ctx)
    return level, definition.validate_and_prepare(ctx)


def _signature_level(ctx: OpContext) -> FeatureLevel:
    sig = SIGNATURES.get(ctx.op_type)
    if sig is None:
        return V1_0
    try:
        return check(sig, ctx.inputs, ctx.outputs)
    except SignatureError as e:
        raise OpError(str(e)) from None
