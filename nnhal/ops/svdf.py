"""SVDF: a rank-constrained, stateful fully connected layer over a memory of past frames.

The state holds, per batch and filter, the last memory_size feature activations (oldest
first); like the reference implementation it is laid out [batch, num_filters * memory_size],
where num_filters = num_units * rank.
"""

from __future__ import annotations

import numpy as np

from nnhal.hal.types import OperandType, OperationType
from nnhal.ops import common as C
from nnhal.ops.lstm import expect_rank_if_given, f32, value_given, with_required
from nnhal.ops.resolver import OpContext, OpError, RecurrentDef, register
from nnhal.ops.signature import V1_0, V1_2, Slot, sig, variants

T = OperandType

SVDF_SIGNATURE = sig(
    OperationType.SVDF,
    [Slot("input", "T"), Slot("weights_feature", "T", doc="[num_filters, input_size]"),
     Slot("weights_time", "T", doc="[num_filters, memory_size]"),
     Slot("bias", "T", omittable=True, doc="[num_units]"), Slot("state_in", "T"),
     Slot("rank", T.INT32, doc="num_filters = num_units * rank"),
     Slot("activation", T.INT32, doc="fused activation (FuseCode)")],
    [Slot("state_out", "T"), Slot("output", "T")],
    [*variants(V1_0, {"T": T.TENSOR_FLOAT32}), *variants(V1_2, {"T": T.TENSOR_FLOAT16})],
    doc="rank-constrained stateful fully connected layer")

SIGNATURES = [SVDF_SIGNATURE]


@register(OperationType.SVDF)
class Svdf(RecurrentDef):
    def validate(self, ctx: OpContext) -> None:
        C.check_activation(ctx, 6)
        for i, r in ((0, 2), (1, 2), (2, 2), (4, 2)):
            ctx.expect_rank(i, r)
        expect_rank_if_given(ctx, 3, 1)
        filters = ctx.dim(1, 0)
        rank = ctx.const_int(5)
        if rank is not None:
            ctx.require(rank > 0, "rank must be positive")
            ctx.require((filters or 0) % rank == 0, "num_filters must be a multiple of rank")
        ctx.require_same(ctx.dim(2, 0), filters, "weights_time rows (num_filters)")
        ctx.require_same(ctx.dim(1, 1), ctx.dim(0, 1), "weights_feature columns (input_size)")

    def prepare(self, ctx: OpContext):
        batch = ctx.dim(0, 0) or 0
        filters = ctx.dim(1, 0) or 0
        memory = ctx.dim(2, 1) or 0
        rank = ctx.const_int(5)
        units = filters // rank if rank is not None and rank > 0 else 0
        return [(batch, filters * memory), (batch, units)]

    def kernel(self, ctx: OpContext):
        dt = ctx.outputs[0].type.dtype

        def run(ins, rt):
            x, wf, wt = f32(ins[0]), f32(ins[1]), f32(ins[2])
            bias = f32(ins[3]) if value_given(ins[3]) else None
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

        return with_required(run, SVDF_SIGNATURE, len(ctx.inputs))
