"""Basic RNN family: RNN (one step), UNIDIRECTIONAL_SEQUENCE_RNN and
BIDIRECTIONAL_SEQUENCE_RNN.

state_t = activation(x_t W^T + aux_t Waux^T + state_{t-1} R^T + bias). The input (and
auxiliary input) contribution of the whole sequence is one matmul; only the recurrence loops
over time. Float16 is computed in float32 and rounded once.
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
O = OperationType

_BIRNN_REQ = (0, 1, 2, 3, 4, 5, 6, 7, 8, 12, 13, 14)


def _check_weights(w: np.ndarray, r: np.ndarray, b: np.ndarray, input_size: int,
                   where: str = "") -> int:
    if w.ndim != 2 or w.shape[1] != input_size:
        raise OpError(f"{where}weights have shape {w.shape}, expected [units, {input_size}]")
    units = w.shape[0]
    if r.shape != (units, units):
        raise OpError(f"{where}recurrent weights have shape {r.shape}, expected "
                      f"{(units, units)}")
    if b.shape != (units,):
        raise OpError(f"{where}bias has shape {b.shape}, expected {(units,)}")
    return units


def run_rnn(x: np.ndarray, w: np.ndarray, r: np.ndarray, b: np.ndarray, h0: np.ndarray,
            act: int, aux: np.ndarray | None = None, waux: np.ndarray | None = None,
            reverse: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Time-major x [T, B, I] -> (outputs [T, B, units], last state [B, units])."""
    steps, batch = x.shape[0], x.shape[1]
    units = w.shape[0]
    pre = (x.reshape(steps * batch, x.shape[2]) @ w.T).reshape(steps, batch, units) + b
    if aux is not None and waux is not None:
        pre += (aux.reshape(steps * batch, aux.shape[2]) @ waux.T).reshape(steps, batch, units)
    rt = r.T
    h = h0
    out = np.empty((steps, batch, units), dtype=np.float32)
    for t in (range(steps - 1, -1, -1) if reverse else range(steps)):
        h = C.apply_float_activation(pre[t] + h @ rt, act)
        out[t] = h
    return out, h


def _validate_common(ctx: OpContext, tensors: list[int], act_index: int) -> OperandType:
    t = ctx.inputs[0].type
    ctx.require(t in C.FLOAT_TYPES, f"unsupported input type {t.name}")
    check_tensor_types(ctx, t, tensors)
    C.check_activation(ctx, act_index)
    for k, out in enumerate(ctx.outputs):
        ctx.require(out.type == t, f"output {k} must be {t.name}")
    return t


@register(O.RNN)
class Rnn(OperationDef):
    def validate(self, ctx: OpContext) -> None:
        ctx.expect_counts(6, 2)
        require_inputs(ctx, range(6))
        _validate_common(ctx, [0, 1, 2, 3, 4], 5)
        for i, rank in ((0, 2), (1, 2), (2, 2), (3, 1), (4, 2)):
            check_rank(ctx, i, rank)
        units = known_dim(ctx.inputs[1], 0)
        for i, k in ((2, 0), (2, 1), (3, 0), (4, 1)):
            d = known_dim(ctx.inputs[i], k)
            ctx.require(not units or d in (0, units), f"input {i} dim {k} must be {units}")

    def prepare(self, ctx: OpContext):
        shape = (known_dim(ctx.inputs[0], 0), known_dim(ctx.inputs[1], 0))
        return [shape, shape]

    def kernel(self, ctx: OpContext):
        dt = ctx.outputs[0].type.dtype

        def run(ins, rt):
            x, w, r, b, h0 = (f32(v) for v in ins[:5])
            if x.ndim != 2:
                raise OpError("RNN input must be 2-D")
            units = _check_weights(w, r, b, x.shape[1])
            if h0.shape != (x.shape[0], units):
                raise OpError(f"hidden state must have shape {(x.shape[0], units)}")
            _, h = run_rnn(x[None], w, r, b, h0, C.activation_code(ins[5]))
            h = h.astype(dt)
            return [h, h.copy()]

        return with_required(run, range(6))


@register(O.UNIDIRECTIONAL_SEQUENCE_RNN)
class UnidirectionalSequenceRnn(OperationDef):
    def validate(self, ctx: OpContext) -> None:
        ctx.expect_counts(7, (1, 2))
        require_inputs(ctx, range(7))
        _validate_common(ctx, [0, 1, 2, 3, 4], 5)
        ctx.require(ctx.inputs[6].type == T.INT32, "timeMajor must be INT32")
        tm = ctx.const(6)
        ctx.require(tm is None or int(tm) in (0, 1), "timeMajor must be 0 or 1")
        for i, rank in ((0, 3), (1, 2), (2, 2), (3, 1), (4, 2)):
            check_rank(ctx, i, rank)

    def prepare(self, ctx: OpContext):
        x = ctx.inputs[0]
        units = known_dim(ctx.inputs[1], 0)
        if x.shape is None or len(x.shape) != 3:
            return [None] * len(ctx.outputs)
        shapes = [tuple(x.shape[:2]) + (units,)]
        if len(ctx.outputs) == 2:
            tm = ctx.const(6)
            batch = 0 if tm is None else x.shape[1 if int(tm) else 0]
            shapes.append((batch, units))
        return shapes

    def kernel(self, ctx: OpContext):
        dt = ctx.outputs[0].type.dtype
        n_out = len(ctx.outputs)

        def run(ins, rt):
            x, w, r, b, h0 = (f32(v) for v in ins[:5])
            tm = int(ins[6])
            if tm not in (0, 1):
                raise OpError("timeMajor must be 0 or 1")
            if x.ndim != 3:
                raise OpError("input must be 3-D")
            xt = x if tm else np.swapaxes(x, 0, 1)
            units = _check_weights(w, r, b, x.shape[2])
            if h0.shape != (xt.shape[1], units):
                raise OpError(f"hidden state must have shape {(xt.shape[1], units)}")
            out, h = run_rnn(xt, w, r, b, h0, C.activation_code(ins[5]))
            res = [(out if tm else np.swapaxes(out, 0, 1)).astype(dt)]
            if n_out == 2:
                res.append(h.astype(dt))
            return res

        return with_required(run, range(7))


@register(O.BIDIRECTIONAL_SEQUENCE_RNN)
class BidirectionalSequenceRnn(OperationDef):
    """Forward and backward RNNs; auxiliary input with weights cross-links, without weights
    it replaces the backward cell's input (parallel linking, HAL 1.3)."""

    def validate(self, ctx: OpContext) -> None:
        ctx.expect_counts(15, (1, 2, 3, 4))
        require_inputs(ctx, _BIRNN_REQ)
        _validate_common(ctx, list(range(12)), 12)
        ctx.require(ctx.inputs[13].type == T.BOOL, "timeMajor must be BOOL")
        ctx.require(ctx.inputs[14].type == T.BOOL, "mergeOutputs must be BOOL")
        merge = ctx.const(14)
        if merge is not None:
            ctx.require(len(ctx.outputs) in ((1, 3) if bool(merge) else (2, 4)),
                        "output count does not match mergeOutputs")
        for i, rank in ((0, 3), (1, 2), (2, 2), (3, 1), (4, 2), (5, 2), (6, 2), (7, 1),
                        (8, 2)):
            check_rank(ctx, i, rank)

    def prepare(self, ctx: OpContext):
        x = ctx.inputs[0]
        fw, bw = known_dim(ctx.inputs[1], 0), known_dim(ctx.inputs[5], 0)
        merged = len(ctx.outputs) in (1, 3)
        if x.shape is None or len(x.shape) != 3:
            return None
        seq = tuple(x.shape[:2])
        tm = ctx.const(13)
        batch = 0 if tm is None else seq[1 if bool(tm) else 0]
        if merged:
            shapes = [seq + ((fw + bw) if fw and bw else 0,)]
        else:
            shapes = [seq + (fw,), seq + (bw,)]
        if len(ctx.outputs) in (3, 4):
            shapes += [(batch, fw), (batch, bw)]
        return shapes

    def kernel(self, ctx: OpContext):
        dt = ctx.outputs[0].type.dtype
        n_out = len(ctx.outputs)
        merged = n_out in (1, 3)

        def run(ins, rt):
            tm = bool(ins[13])
            x = f32(ins[0])
            if x.ndim != 3:
                raise OpError("input must be 3-D")
            xt = x if tm else np.swapaxes(x, 0, 1)
            aux = f32(ins[9]) if has_value(ins[9]) else None
            fwa = f32(ins[10]) if has_value(ins[10]) else None
            bwa = f32(ins[11]) if has_value(ins[11]) else None
            if (fwa is None) != (bwa is None):
                raise OpError("forward and backward aux weights must be both present or absent")
            if fwa is not None and aux is None:
                raise OpError("aux weights given without an aux input")
            if aux is not None:
                if aux.ndim != 3:
                    raise OpError("aux input must be 3-D")
                aux = aux if tm else np.swapaxes(aux, 0, 1)
                if aux.shape[:2] != xt.shape[:2]:
                    raise OpError("aux input must match the input's time and batch sizes")
            cross = aux is not None and fwa is not None
            bw_x = aux if (aux is not None and not cross) else xt
            fw_w, fw_r, fw_b, fw_h = (f32(v) for v in ins[1:5])
            bw_w, bw_r, bw_b, bw_h = (f32(v) for v in ins[5:9])
            batch = xt.shape[1]
            fu = _check_weights(fw_w, fw_r, fw_b, xt.shape[2], "forward: ")
            bu = _check_weights(bw_w, bw_r, bw_b, bw_x.shape[2], "backward: ")
            for wa, u, name in ((fwa, fu, "forward"), (bwa, bu, "backward")):
                if cross and wa.shape != (u, aux.shape[2]):
                    raise OpError(f"{name} aux weights have shape {wa.shape}")
            if fw_h.shape != (batch, fu) or bw_h.shape != (batch, bu):
                raise OpError("hidden state shapes do not match")
            act = C.activation_code(ins[12])
            fo, fh = run_rnn(xt, fw_w, fw_r, fw_b, fw_h, act, aux if cross else None, fwa)
            bo, bh = run_rnn(bw_x, bw_w, bw_r, bw_b, bw_h, act, aux if cross else None, bwa,
                             reverse=True)

            def layout(y: np.ndarray) -> np.ndarray:
                return (y if tm else np.swapaxes(y, 0, 1)).astype(dt)

            res = [layout(np.concatenate([fo, bo], axis=2))] if merged else [layout(fo),
                                                                              layout(bo)]
            if n_out in (3, 4):
                res += [fh.astype(dt), bh.astype(dt)]
            return res

        return with_required(run, _BIRNN_REQ)
