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
from nnhal.ops.lstm import f32, value_given, with_required
from nnhal.ops.resolver import OpContext, OpError, RecurrentDef, register
from nnhal.ops.signature import V1_0, V1_2, V1_3, Slot, sig, variants

T = OperandType
O = OperationType

_F32, _F16 = {"T": T.TENSOR_FLOAT32}, {"T": T.TENSOR_FLOAT16}


def _cell(p: str = "") -> list[Slot]:
    return [Slot(f"{p}weights", "T", doc="[num_units, input_size]"),
            Slot(f"{p}recurrent_weights", "T", doc="[num_units, num_units]"),
            Slot(f"{p}bias", "T"), Slot(f"{p}hidden_state_in", "T")]


_ACTIVATION = Slot("activation", T.INT32, doc="fused activation (FuseCode)")

RNN_SIGNATURE = sig(
    O.RNN, [Slot("input", "T"), *_cell(), _ACTIVATION],
    [Slot("hidden_state_out", "T"), Slot("output", "T")],
    [*variants(V1_0, _F32), *variants(V1_2, _F16)], doc="one basic RNN time step")

UNI_RNN_SIGNATURE = sig(
    O.UNIDIRECTIONAL_SEQUENCE_RNN,
    [Slot("input", "T"), *_cell(), _ACTIVATION, Slot("time_major", T.INT32, doc="0 or 1")],
    [Slot("output", "T"), Slot("hidden_state_out", "T", optional=True, since=V1_3)],
    variants(V1_2, _F32, _F16), doc="basic RNN over a sequence")

BI_RNN_SIGNATURE = sig(
    O.BIDIRECTIONAL_SEQUENCE_RNN,
    [Slot("input", "T"), *_cell("fw_"), *_cell("bw_"),
     Slot("aux_input", "T", omittable=True, doc="cross or parallel linking"),
     Slot("fw_aux_weights", "T", omittable=True), Slot("bw_aux_weights", "T", omittable=True),
     _ACTIVATION, Slot("time_major", T.BOOL), Slot("merge_outputs", T.BOOL)],
    [Slot("fw_output", "T", doc="both directions when merge_outputs"),
     Slot("bw_output", "T", optional=True, doc="absent when merge_outputs (later outputs move "
          "up one)"),
     Slot("fw_hidden_state_out", "T", optional=True, since=V1_3),
     Slot("bw_hidden_state_out", "T", optional=True, since=V1_3)],
    variants(V1_2, _F32, _F16), doc="forward and backward basic RNNs")

SIGNATURES = [RNN_SIGNATURE, UNI_RNN_SIGNATURE, BI_RNN_SIGNATURE]


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


@register(O.RNN)
class Rnn(RecurrentDef):
    def validate(self, ctx: OpContext) -> None:
        C.check_activation(ctx, 5)
        for i, rank in ((0, 2), (1, 2), (2, 2), (3, 1), (4, 2)):
            ctx.expect_rank(i, rank)
        units = ctx.dim(1, 0)
        for i, k in ((2, 0), (2, 1), (3, 0), (4, 1)):
            ctx.require_same(ctx.dim(i, k), units, f"input {i} dim {k} (num_units)")

    def prepare(self, ctx: OpContext):
        shape = (ctx.dim(0, 0) or 0, ctx.dim(1, 0) or 0)
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

        return with_required(run, RNN_SIGNATURE, len(ctx.inputs))


@register(O.UNIDIRECTIONAL_SEQUENCE_RNN)
class UnidirectionalSequenceRnn(RecurrentDef):
    def validate(self, ctx: OpContext) -> None:
        C.check_activation(ctx, 5)
        tm = ctx.const_int(6)
        ctx.require(tm is None or tm in (0, 1), "timeMajor must be 0 or 1")
        for i, rank in ((0, 3), (1, 2), (2, 2), (3, 1), (4, 2)):
            ctx.expect_rank(i, rank)

    def prepare(self, ctx: OpContext):
        x = ctx.inputs[0]
        units = ctx.dim(1, 0) or 0
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

        return with_required(run, UNI_RNN_SIGNATURE, len(ctx.inputs))


@register(O.BIDIRECTIONAL_SEQUENCE_RNN)
class BidirectionalSequenceRnn(RecurrentDef):
    """Forward and backward RNNs; auxiliary input with weights cross-links, without weights
    it replaces the backward cell's input (parallel linking, HAL 1.3)."""

    def validate(self, ctx: OpContext) -> None:
        C.check_activation(ctx, 12)
        merge = ctx.const(14)
        if merge is not None:
            ctx.require(len(ctx.outputs) in ((1, 3) if bool(merge) else (2, 4)),
                        "output count does not match mergeOutputs")
        for i, rank in ((0, 3), (1, 2), (2, 2), (3, 1), (4, 2), (5, 2), (6, 2), (7, 1),
                        (8, 2)):
            ctx.expect_rank(i, rank)

    def prepare(self, ctx: OpContext):
        x = ctx.inputs[0]
        fw, bw = ctx.dim(1, 0) or 0, ctx.dim(5, 0) or 0
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
            aux = f32(ins[9]) if value_given(ins[9]) else None
            fwa = f32(ins[10]) if value_given(ins[10]) else None
            bwa = f32(ins[11]) if value_given(ins[11]) else None
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

        return with_required(run, BI_RNN_SIGNATURE, len(ctx.inputs))
