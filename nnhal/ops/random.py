"""RANDOM_MULTINOMIAL: draw class indices from softmax(logits) per batch row.

The reference uses TensorFlow's Philox generator; conformance only checks the distribution of
the draws, so numpy's generator (seeded from the two seeds, or from entropy when both are 0)
is used. The CDF is built in float64 over the finite logits, as the reference does.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from nnhal.hal.types import OperandType, OperationType
from nnhal.ops.resolver import (
    INTERPRETED_ITERATION,
    OpContext,
    OperationDef,
    OpError,
    Shape,
    elements,
    register,
    visits,
)
from nnhal.ops.signature import V1_2, Slot, sig, variants

T = OperandType

SIGNATURES = [
    sig(OperationType.RANDOM_MULTINOMIAL,
        [Slot("logits", "T", doc="[batches, classes]"),
         Slot("num_samples", T.INT32, doc="draws per row"),
         Slot("seeds", T.TENSOR_INT32, doc="[2]; both 0: random")],
        [Slot("output", T.TENSOR_INT32, doc="[batches, samples] class indices")],
        variants(V1_2, {"T": T.TENSOR_FLOAT16}, {"T": T.TENSOR_FLOAT32})),
]


@register(OperationType.RANDOM_MULTINOMIAL)
class RandomMultinomial(OperationDef):
    def work(self, ctx: OpContext, outputs: Sequence[Shape]) -> int:
        """Each draw searches its row's classes; each row is an interpreted iteration."""
        shape = ctx.inputs[0].shape
        classes = shape[-1] if shape and shape[-1] > 0 else 1
        rows = shape[0] if shape and shape[0] > 0 else 1
        return visits(ctx, outputs) + elements(outputs[0]) * classes + \
            INTERPRETED_ITERATION * rows

    def validate(self, ctx: OpContext) -> None:
        ctx.expect_rank(0, 2)
        ctx.expect_rank(2, 1)
        ctx.expect_rank(0, 2, output=True)
        seeds = ctx.dim(2, 0)
        ctx.require(seeds is None or seeds == 2, "input 2 must hold 2 seeds")
        n = ctx.const_int(1)
        ctx.require(n is None or n >= 0, "sample count must be non-negative")

    def prepare(self, ctx: OpContext):
        inp = ctx.inputs[0]
        n = ctx.const_int(1)
        batches = 0 if inp.shape is None else inp.shape[0]
        return [(batches, 0 if n is None else n)]

    def kernel(self, ctx: OpContext):
        def run(ins, rt):
            logits = np.asarray(ins[0], dtype=np.float32)
            samples = int(np.asarray(ins[1]))
            seeds = np.asarray(ins[2]).reshape(-1)
            if logits.ndim != 2 or samples < 0 or seeds.size != 2:
                raise OpError("RANDOM_MULTINOMIAL: invalid inputs")
            if int(seeds[0]) == 0 and int(seeds[1]) == 0:
                rng = np.random.default_rng()
            else:
                rng = np.random.default_rng([int(s) & 0xFFFFFFFF for s in seeds])
            finite = np.isfinite(logits)
            masked = np.where(finite, logits, -np.inf)
            top = masked.max(axis=1, initial=float(np.finfo(np.float32).min)).astype(np.float64)
            with np.errstate(all="ignore"):
                probs = np.where(finite, np.exp(logits.astype(np.float64) - top[:, None]), 0.0)
            cdf = np.cumsum(probs, axis=1)
            out = np.empty((logits.shape[0], samples), np.int32)
            for b in range(logits.shape[0]):
                target = rng.random(samples) * (cdf[b, -1] if cdf.shape[1] else 0.0)
                pick = np.searchsorted(cdf[b], target, side="right")
                out[b] = np.minimum(pick, max(logits.shape[1] - 1, 0))
            return [out]

        return run
