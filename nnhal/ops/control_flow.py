"""Control flow: IF and WHILE run referenced subgraphs by index (HAL 1.3).

Operands flowing through them may have unknown dimensions or rank: the callee plans check what
they receive at run time. These definitions validate; a backend runs them itself (the reference
executor on an explicit stack of frames, so nesting depth is not bounded by Python recursion).
"""

from __future__ import annotations

import math

from nnhal.hal.types import OperandType, OperationType
from nnhal.ops.resolver import OpContext, OperandInfo, OperationDef, register
from nnhal.ops.signature import ANY, V1_3, Slot, sig, variants

T = OperandType
O = OperationType

_OUTPUTS = [Slot("outputs", ANY, repeated=True, doc="the subgraph's outputs")]

SIGNATURES = [
    sig(O.IF, [Slot("condition", T.TENSOR_BOOL8, doc="shape [1]"),
               Slot("then_branch", T.SUBGRAPH, doc="run when the condition is true"),
               Slot("else_branch", T.SUBGRAPH, doc="run when the condition is false"),
               Slot("inputs", ANY, repeated=True, at_least=0, doc="the branch's inputs")],
        _OUTPUTS, variants(V1_3, {})),
    sig(O.WHILE, [Slot("condition", T.SUBGRAPH, doc="one TENSOR_BOOL8 [1] output"),
                  Slot("body", T.SUBGRAPH, doc="input-output and state values out"),
                  Slot("inputs", ANY, repeated=True,
                       doc="input-output, then state-only, then input-only values")],
        _OUTPUTS, variants(V1_3, {})),
]


def _compatible(a: OperandInfo, b: OperandInfo, shapes: bool = True) -> bool:
    """Same type and quantization; shapes agree wherever both are known."""
    if a.type != b.type:
        return False
    if a.type in (T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED, T.TENSOR_QUANT8_SYMM,
                  T.TENSOR_QUANT16_ASYMM, T.TENSOR_QUANT16_SYMM) and \
            (a.scale != b.scale or a.zero_point != b.zero_point):
        return False
    if not shapes or a.shape is None or b.shape is None:
        return True
    if len(a.shape) != len(b.shape):
        return False
    return all(x == 0 or y == 0 or x == y for x, y in zip(a.shape, b.shape))


def _subgraph(ctx: OpContext, index: int) -> object:
    info = ctx.inputs[index]
    ctx.require(info.value is not None and 0 <= int(info.value) < len(ctx.subgraphs),
                f"input {index} references a missing subgraph")
    return ctx.subgraphs[int(info.value)]


def _check_signature(ctx: OpContext, name: str, infos: list[OperandInfo],
                     actual: list[OperandInfo], shapes: bool = True) -> None:
    ctx.require(len(infos) == len(actual),
                f"{name} has {len(infos)} operands where {len(actual)} are passed")
    for k, (a, b) in enumerate(zip(infos, actual)):
        ctx.require(_compatible(a, b, shapes),
                    f"{name} operand {k} does not match the operation's")


@register(O.IF)
class If(OperationDef):
    def validate(self, ctx: OpContext) -> None:
        cond = ctx.inputs[0]
        ctx.require(cond.shape is None or math.prod(cond.shape or (1,)) in (0, 1)
                    and len(cond.shape) <= 1, "condition must have shape [1]")
        for branch in (1, 2):
            sg = _subgraph(ctx, branch)
            _check_signature(ctx, f"branch subgraph {branch}", sg.input_infos, ctx.inputs[3:])
            _check_signature(ctx, f"branch subgraph {branch} outputs", sg.output_infos,
                             ctx.outputs)


@register(O.WHILE)
class While(OperationDef):
    def validate(self, ctx: OpContext) -> None:
        cond = _subgraph(ctx, 0)
        body = _subgraph(ctx, 1)
        m = len(ctx.outputs)
        k = len(body.output_infos) - m
        n = len(body.input_infos) - m - k
        ctx.require(k >= 0 and n >= 0, "body subgraph does not fit the operation's operands")
        outer = ctx.inputs[2:]
        _check_signature(ctx, "body subgraph", body.input_infos, outer)
        _check_signature(ctx, "condition subgraph", cond.input_infos, outer)
        _check_signature(ctx, "body subgraph outputs", body.output_infos, outer[:m + k])
        # Loop-carried values may change shape across iterations: types must agree, not shapes.
        _check_signature(ctx, "WHILE outputs", ctx.outputs, outer[:m], shapes=False)
        ctx.require(len(cond.output_infos) == 1 and cond.output_infos[0].type == T.TENSOR_BOOL8,
                    "condition subgraph must have one TENSOR_BOOL8 output")
