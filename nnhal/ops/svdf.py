"""SVDF: a rank-constrained, stateful fully connected layer over a memory of past frames.

The state holds, per batch and filter, the last memory_size feature activations (oldest
first); like the reference implementation it is laid out [batch, num_filters * memory_size],
where num_filters = num_units * rank.
"""

from __future__ import annotations

import numpy as np

from nnhal.hal.types import OperandType, OperationType
from nnhal.ops import common as C
from nnhal.ops.lstm import (
    check_rank,
    check_tensor_types,
    f32,
    has_value,
    known_dim,
    require_inputs,
    with_required,
)
from nnhal.ops.registry import OpContext, OperationDef, OpError, register

T = OperandType


@register(OperationType.SVDF)
class Svdf(OperationDef):
    def validate(self, ctx: OpContext) -> None:
        ctx.expect_counts(7, 2)
        require_inputs(ctx, (0, 1, 2, 4, 5, 6))
        t = ctx.inputs[0].type
        ctx.require(t in C.FLOAT_TYPES, f"unsupported input type {t.name}")
        check_tensor_types(ctx, t, [0, 1, 2, 3, 4])
        ctx.require(ctx.inputs[5].type == T.INT32, "rank must be INT32")
        C.check_activation(ctx, 6)
        for k, out in enumerate(ctx.outputs):
            ctx.require(out.type == t, f"output {k} must be {t.name}")
        for i, r in ((0, 2), (1, 2), (2, 2), (4, 2)):
            check_rank(ctx, i, r)
        check_rank(ctx, 3, 1, optional=True)
        rank = ctx.const(5)
        if rank is not None:
            rank = int(rank)
            ctx.require(rank > 0, "rank must be positive")
            filters = known_dim(ctx.inputs[1], 0)
            ctx.require(filters % rank == 0, "num_filters must be a multiple of rank")
        filters = known_dim(ctx.inputs[1], 0)
        d = known_dim(ctx.inputs[2], 0)
        ctx.require(not filters or d in (0, filters), "weights_time rows must match filters")
        a, b = known_dim(ctx.inputs[0], 1), known_dim(ctx.inputs[1], 1)
        ctx.require(not a or b in (0, a), "weights_feature columns must match input size")

    def prepare(self, ctx: OpContext):
        batch = known_dim(ctx.inputs[0], 0)
        filters = known_dim(ctx.inputs[1], 0)
        memory = known_dim(ctx.inputs[2], 1)
        rank = ctx.const(5)
        units = filters // int(rank) if rank is not None and int(rank) > 0 else 0
        return [(batch, filters * memory), (batch, units)]

    def kernel(self, ctx: OpContext):
        dt = ctx.outputs[0].type.dtype

        def run(ins, rt):
            x, wf, wt = f32(ins[0]), f32(ins[1]), f32(ins[2])
            bias = f32(ins[3]) if has_value(ins[3]) else None
            state = f32(ins[4])
            rank = int(ins[5])
            act = C.activation_code(ins[6])
            if x.ndim != 2 or wf.ndim != 2 or wt.ndim != 2:
                raise OpError("input and weights must be 2-D")
            batch, input_size = x.shape
            filters = wf.shape[0]
            memory = wt.shape[1]
            if rank <= 0 or filters % rank:
                raise OpError(f"num_filters {filters} is not a positive multiple of rank {rank}")
            units = filters // rank
            if wf.shape[1] != input_size or wt.shape[0] != filters:
                raise OpError("weight shapes do not match the input")
            if bias is not None and bias.shape != (units,):
                raise OpError(f"bias must have shape {(units,)}")
            if state.size != batch * filters * memory:
                raise OpError(f"state must have {batch * filters * memory} elements per run")
            mem = state.reshape(batch, filters, memory).copy()
            # Newest activation goes in the last column.
            mem[:, :, memory - 1] = x @ wf.T
            per_filter = np.einsum("bfm,fm->bf", mem, wt)
            out = per_filter.reshape(batch, units, rank).sum(axis=2)
            if bias is not None:
                out = out + bias
            out = C.apply_float_activation(out, act)
            # Shift the memory left by one frame, dropping the oldest.
            new_state = np.zeros_like(mem)
            new_state[:, :, :-1] = mem[:, :, 1:]
            return [new_state.reshape(state.shape).astype(dt), out.astype(dt)]

        return with_required(run, (0, 1, 2, 4, 5, 6))
