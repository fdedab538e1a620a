"""Integer LSTMs: QUANTIZED_16BIT_LSTM (HAL 1.2) and QUANTIZED_LSTM (HAL 1.3).

Both follow the reference integer arithmetic step by step so that results match upstream
exactly: int32 accumulators rescaled with fixed-point multipliers, gate nonlinearities in
16-bit gemmlowp fixed point (see :mod:`nnhal.ops.recurrent_fixedpoint`) and the same
saturation points as the reference kernels.
"""

from __future__ import annotations

import math

import numpy as np

from nnhal.hal.types import OperandType, OperationType
from nnhal.ops import common as C
from nnhal.ops import recurrent_fixedpoint as FP
from nnhal.ops.lstm import expect_rank_if_given, value_given, with_required
from nnhal.ops.resolver import OpContext, OpError, RecurrentDef, register
from nnhal.ops.signature import V1_2, V1_3, Slot, Variant, sig

T = OperandType
_Q8, _S8, _W8 = T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED, T.TENSOR_QUANT8_SYMM
_Q16, _I32 = T.TENSOR_QUANT16_SYMM, T.TENSOR_INT32
_GATES = ("input", "forget", "cell", "output")

QUANTIZED_16BIT_LSTM_SIGNATURE = sig(
    OperationType.QUANTIZED_16BIT_LSTM,
    [Slot("input", _Q8, doc="scale 1/128, zero point 128"),
     *[Slot(f"input_to_{g}", _Q8) for g in _GATES],
     *[Slot(f"recurrent_to_{g}", _Q8) for g in _GATES],
     *[Slot(f"{g}_gate_bias" if g != "cell" else "cell_bias", _I32) for g in _GATES],
     Slot("cell_state_in", _Q16, doc="scale 2^-11"), Slot("output_state_in", _Q8)],
    [Slot("cell_state_out", _Q16), Slot("output_state_out", _Q8)],
    [Variant({}, V1_2)], doc="uint8 LSTM step with a 16-bit cell state")


def _omittable(name: str, t: OperandType, doc: str = "") -> Slot:
    return Slot(name, t, omittable=True, doc=doc)


QUANTIZED_LSTM_SIGNATURE = sig(
    OperationType.QUANTIZED_LSTM,
    [Slot("input", _S8),
     _omittable("input_to_input", _W8, "absent with CIFG"),
     *[Slot(f"input_to_{g}", _W8) for g in _GATES[1:]],
     _omittable("recurrent_to_input", _W8, "absent with CIFG"),
     *[Slot(f"recurrent_to_{g}", _W8) for g in _GATES[1:]],
     *[_omittable(f"cell_to_{g}", _Q16, "peephole") for g in ("input", "forget", "output")],
     _omittable("input_gate_bias", _I32, "absent with CIFG"),
     Slot("forget_gate_bias", _I32), Slot("cell_bias", _I32), Slot("output_gate_bias", _I32),
     _omittable("projection_weights", _W8), _omittable("projection_bias", _I32),
     Slot("output_state_in", _S8), Slot("cell_state_in", _Q16),
     *[_omittable(f"{g}_layer_norm", _Q16) for g in _GATES],
     _omittable("cell_clip", T.FLOAT32, "no clipping when omitted"),
     _omittable("proj_clip", T.FLOAT32, "no clipping when omitted"),
     *[Slot(f"{g}_intermediate_scale", T.FLOAT32) for g in _GATES],
     Slot("hidden_state_zero_point", T.INT32), Slot("hidden_state_scale", T.FLOAT32)],
    [Slot("output_state_out", _S8), Slot("cell_state_out", _Q16), Slot("output", _S8)],
    [Variant({}, V1_3)], doc="int8 LSTM step with optional CIFG, peephole, projection and "
    "layer normalisation")

SIGNATURES = [QUANTIZED_16BIT_LSTM_SIGNATURE, QUANTIZED_LSTM_SIGNATURE]

I32_MIN, I32_MAX = C.INT32_MIN, C.INT32_MAX


def _f32(x: float) -> float:
    return float(np.float32(x))


def _qmul(real: float) -> tuple[int, int]:
    """QuantizeMultiplier (C++ std::round: halves away from zero)."""
    if real == 0.0:
        return 0, 0
    if not math.isfinite(real):
        raise OpError(f"multiplier {real} cannot be quantized")
    frac, shift = math.frexp(real)
    q = int(math.floor(abs(frac) * (1 << 31) + 0.5))
    if frac < 0:
        q = -q
    if q == (1 << 31):
        q //= 2
        shift += 1
    if q > I32_MAX:
        raise OpError(f"multiplier {real} cannot be quantized")
    return q, shift


def _mbqm(x: np.ndarray, mult: int, shift: int) -> np.ndarray:
    """MultiplyByQuantizedMultiplier with the reference's int32 wrap of x << left_shift."""
    x = np.asarray(x, dtype=np.int64)
    if shift > 0:
        x = _wrap32(x << shift)
    return C.rounding_divide_by_pot(C.srdhm(x, mult), max(-shift, 0))


_wrap32 = C.wrap32


def _checked_log2(x: float) -> int | None:
    if not x > 0:
        return None
    lg = np.float32(math.log(np.float32(x))) * (np.float32(1.0) / np.float32(math.log(2.0)))
    r = float(np.round(lg))
    return int(r) if abs(float(lg) - r) < 1e-3 else None


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(abs(a), abs(b))


# ---- QUANTIZED_16BIT_LSTM ----------------------------------------------------------------------

@register(OperationType.QUANTIZED_16BIT_LSTM)
class Quantized16BitLstm(RecurrentDef):
    """Single LSTM step with uint8 activations/weights and a 16-bit (Q4.11) cell state."""

    def validate(self, ctx: OpContext) -> None:
        ins = ctx.inputs
        for i in (0, 14):
            ctx.require(_close(ins[i].scale, 1 / 128) and ins[i].zero_point == 128,
                        f"input {i} must have scale 1/128 and zero point 128")
        w_scale, w_zp = ins[1].scale, ins[1].zero_point
        ctx.require(w_scale != 0, "weights scale must be non-zero")
        for i in range(1, 9):
            ctx.require(ins[i].scale == w_scale and ins[i].zero_point == w_zp,
                        "all weights must share scale and zero point")
        for i in range(9, 13):
            ctx.require(_close(ins[i].scale, _f32(w_scale) / 128) and ins[i].zero_point == 0,
                        "bias scale must be weights scale / 128 with zero point 0")
        ctx.require(ins[13].zero_point == 0, "cell state zero point must be 0")
        ctx.require(_checked_log2(ins[13].scale) == -11,
                    "cell state scale must be 2^-11 (4 integer bits)")
        for i in (0, 1, 2, 3, 4, 5, 6, 7, 8, 13, 14):
            ctx.expect_rank(i, 2)
        for i in range(9, 13):
            ctx.expect_rank(i, 1)

    def prepare(self, ctx: OpContext):
        s13, s14 = ctx.inputs[13].shape, ctx.inputs[14].shape
        return [None if s13 is None else tuple(s13), None if s14 is None else tuple(s14)]

    def kernel(self, ctx: OpContext):
        w_zp = ctx.inputs[1].zero_point
        mult, shift = _qmul(4096.0 * _f32(ctx.inputs[9].scale))

        def run(ins, rt):
            x = ins[0].astype(np.int64)
            prev_out = ins[14].astype(np.int64)
            prev_cell = ins[13].astype(np.int64)
            if x.ndim != 2 or prev_out.ndim != 2 or prev_cell.shape != prev_out.shape:
                raise OpError("input and state shapes do not match")
            batch, n_in = x.shape
            n_out = prev_out.shape[1]
            if prev_out.shape[0] != batch:
                raise OpError("batch sizes differ")
            # Gate order of the reference: input, cell (modulation), forget, output.
            order = ((1, 5, 9), (3, 7, 11), (2, 6, 10), (4, 8, 12))
            wx, wh, bias = [], [], []
            for ix, ih, ib in order:
                a, b, c = ins[ix], ins[ih], ins[ib]
                if a.shape != (n_out, n_in) or b.shape != (n_out, n_out) or c.shape != (n_out,):
                    raise OpError("weight or bias shapes do not match")
                wx.append(a)
                wh.append(b)
                bias.append(c)
            # The reference packs each weight row as [recurrent | input] but multiplies it by
            # the concatenation [input, previous output]; the conformance data encode that.
            weights = np.concatenate([np.concatenate(wh), np.concatenate(wx)], axis=1)
            concat = np.concatenate([x, prev_out], axis=1) - 128
            acc = np.concatenate(bias).astype(np.int64) + concat @ (
                weights.astype(np.int64) - w_zp).T
            acc = FP.sat16(_mbqm(_wrap32(acc), mult, shift))
            gi, gc, gf, go = (acc[:, k * n_out:(k + 1) * n_out] for k in range(4))
            i_gate = FP.logistic16(gi, 3)
            c_gate = FP.tanh16(gc, 3)
            f_gate = FP.logistic16(gf, 3)
            o_gate = FP.logistic16(go, 3)
            i_times_c = FP.srdhm16(i_gate, c_gate)  # Q0.15
            f_times_prev = FP.srdhm16(f_gate, prev_cell)  # Q4.11
            new_cell = FP.saturating_add16(FP.rescale16(i_times_c, 0, 4), f_times_prev)
            out16 = FP.srdhm16(o_gate, FP.tanh16(FP.rescale16(new_cell, 4, 3), 3))
            out8 = np.clip(C.rounding_divide_by_pot(out16, 8), -128, 127) + 128
            return [new_cell.astype(np.int16), out8.astype(np.uint8)]

        return with_required(run, QUANTIZED_16BIT_LSTM_SIGNATURE, len(ctx.inputs))


# ---- QUANTIZED_LSTM (HAL 1.3) --------------------------------------------------------------------

def _inv_sqrt_multiplier(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """GetInvSqrtQuantizedMultiplierExp (reverse_shift -1), per element of int array v."""
    v = np.asarray(v, dtype=np.int64)
    out_m = np.full(v.shape, I32_MAX, dtype=np.int64)
    out_s = np.zeros(v.shape, dtype=np.int64)
    for idx in np.ndindex(v.shape):
        x = int(v[idx])
        if x <= 1:
            continue
        shift = 11
        while x >= (1 << 29):
            x //= 4
            shift += 1
        lz = 32 - x.bit_length()
        pairs = (lz - 1) // 2 - 1
        shift -= pairs
        x <<= 2 * pairs
        f_in = np.int64(x >> 1)
        half_in = C.rounding_divide_by_pot(f_in, 1)
        half_three = (1 << 28) + (1 << 27)
        y = np.int64(1 << 28)
        for _ in range(5):
            y3 = _sat_shift32(C.srdhm(C.srdhm(y, y), y), 6)
            y = _sat_shift32(_wrap32(C.srdhm(half_three, y) - C.srdhm(half_in, y3)), 3)
        m = int(C.srdhm(y, 1518500250))
        if shift < 0:
            m <<= -shift
            shift = 0
        out_m[idx], out_s[idx] = m, -shift
    return out_m, out_s


def _sat_shift32(x: np.ndarray, e: int) -> np.ndarray:
    thr = (1 << (31 - e)) - 1
    x = np.asarray(x, dtype=np.int64)
    return np.where(x > thr, I32_MAX, np.where(x < -thr, I32_MIN, x << e))


def _layer_norm(x: np.ndarray, weights: np.ndarray, bias: np.ndarray, scale_a: int,
                scale_b: int, variance_limit: int) -> np.ndarray:
    """ApplyLayerNorm of the reference on int16 gate pre-activations [batch, n]."""
    n = x.shape[1]
    total = x.sum(axis=1)
    sum_sq = (x * x).sum(axis=1)
    mean = _trunc_div(total * 1024, n)
    variance = sum_sq * ((1 << 20) // n) - mean * mean
    var2 = _trunc_div(variance, 1 << 20)
    var2 = np.where(var2 < 1, variance_limit, var2)
    inv_m, inv_s = _inv_sqrt_multiplier(var2)
    shifted = _wrap32(1024 * x - mean[:, None])
    rescaled = np.empty_like(shifted)
    for b in range(x.shape[0]):
        rescaled[b] = _mbqm(shifted[b], int(inv_m[b]), int(inv_s[b]))
    val3 = _wrap32(_wrap32(rescaled * weights) + bias)
    val4 = _trunc_div(np.where(val3 > 0, val3 + 512, val3 - 512), 1024)
    return FP.sat16(_mbqm(val4, scale_a, scale_b + 12))


def _trunc_div(x: np.ndarray, d: int) -> np.ndarray:
    x = np.asarray(x, dtype=np.int64)
    q = np.abs(x) // d
    return np.where(x < 0, -q, q)


#: Required tensors: a zero-sized value there counts as missing, like an omitted one.
_QLSTM_REQUIRED = (0, 2, 3, 4, 6, 7, 8, 13, 14, 15, 18, 19)


@register(OperationType.QUANTIZED_LSTM)
class QuantizedLstm(RecurrentDef):
    """Integer LSTM step (int8 activations, int16 gates and cell state) with optional CIFG,
    peephole, projection and layer normalisation."""

    def validate(self, ctx: OpContext) -> None:
        for i in (0, 2, 3, 4, 6, 7, 8, 18, 19):
            ctx.expect_rank(i, 2)
        for i in (13, 14, 15):
            ctx.expect_rank(i, 1)
        for i in (1, 5, 16):
            expect_rank_if_given(ctx, i, 2)
        for i in (9, 10, 11, 12, 17, 20, 21, 22, 23):
            expect_rank_if_given(ctx, i, 1)
        cell = ctx.inputs[19]
        shift = _checked_log2(cell.scale)
        ctx.require(shift is not None and shift <= -9,
                    "cell state scale must be a power of two no larger than 2^-9")

    def prepare(self, ctx: OpContext):
        out, cell = ctx.inputs[18].shape, ctx.inputs[19].shape
        out = None if out is None else tuple(out)
        return [out, None if cell is None else tuple(cell), out]

    def kernel(self, ctx: OpContext):
        infos = ctx.inputs
        in_scale, in_zp = _f32(infos[0].scale), infos[0].zero_point
        out_scale, out_zp = _f32(infos[18].scale), infos[18].zero_point
        cell_shift = _checked_log2(infos[19].scale)
        cell_scale = _f32(infos[19].scale)
        w_scale = [_f32(i.scale) for i in infos]
        f32 = np.float32

        def eff(ws: float, xs: float, inter: float) -> tuple[int, int]:
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                return _qmul(float(f32(ws) * f32(xs) / f32(inter)))

        def run(ins, rt):
            def get(i):
                return ins[i] if value_given(ins[i]) else None

            for i in _QLSTM_REQUIRED:
                if get(i) is None:
                    raise OpError(f"required input {i} has no value")
            x = ins[0].astype(np.int64)
            h_prev = ins[18].astype(np.int64)
            c_prev = ins[19].astype(np.int64)
            if x.ndim != 2:
                raise OpError("input must be 2-D")
            batch, n_in = x.shape
            n_units = ins[4].shape[0]
            n_out = ins[8].shape[1] if ins[8].ndim == 2 else -1
            cifg = get(1) is None
            if (get(5) is None) != cifg:
                raise OpError("input-to-input and recurrent-to-input weights must be both "
                              "present or both absent")
            gates = ("f", "c", "o") if cifg else ("i", "f", "c", "o")
            gi = {"i": 0, "f": 1, "c": 2, "o": 3}
            for g in gates:
                wx, wh = ins[1 + gi[g]], ins[5 + gi[g]]
                if wx.shape != (n_units, n_in) or wh.shape != (n_units, n_out):
                    raise OpError(f"{g} gate weight shapes do not match")
            if h_prev.shape != (batch, n_out) or c_prev.shape != (batch, n_units):
                raise OpError("state shapes do not match")
            peep = {g: get(9 + k) for k, g in enumerate("ifo")}
            if cifg and peep["i"] is not None:
                raise OpError("cell-to-input weights given with CIFG")
            has_peep = peep["f"] is not None
            if (peep["o"] is not None) != has_peep or (not cifg and (peep["i"] is not None)
                                                        != has_peep):
                raise OpError("peephole weights must be all present or all absent")
            ln = {g: get(20 + gi[g]) for g in "ifco"}
            if cifg and ln["i"] is not None:
                raise OpError("input layer norm weights given with CIFG")
            ln_present = [ln[g] is not None for g in gates]
            if any(ln_present) and not all(ln_present):
                raise OpError("layer norm weights must be all present or all absent")
            use_ln = all(ln_present)
            bias = {g: get(12 + gi[g]) for g in "ifco"}
            if cifg and bias["i"] is not None:
                raise OpError("input gate bias given with CIFG")
            if not cifg and bias["i"] is None:
                raise OpError("input gate bias is required without CIFG")
            proj_w, proj_b = get(16), get(17)
            for vec in [*peep.values(), *ln.values(), *bias.values()]:
                if vec is not None and vec.shape != (n_units,):
                    raise OpError(f"per-unit vectors must have shape {(n_units,)}")
            if proj_b is not None and proj_b.shape != (n_out,):
                raise OpError(f"projection bias must have shape {(n_out,)}")

            inter = {g: float(ins[26 + gi[g]]) for g in "ifco"}
            if not all(inter[g] > 0 for g in gates):
                raise OpError("intermediate scales must be positive")
            # The clips are optional scalars; no value means no clipping.
            cell_clip = 0.0 if ins[24] is None else float(ins[24])
            proj_clip = 0.0 if ins[25] is None else float(ins[25])
            h_zp = int(ins[30])
            h_scale = float(ins[31])

            def gate(g: str) -> np.ndarray:
                acc = np.zeros((batch, n_units), dtype=np.int64)
                for src, data, zp, scale in ((1, x, in_zp, in_scale),
                                             (5, h_prev, out_zp, out_scale)):
                    w = ins[src + gi[g]].astype(np.int64)
                    m, s = eff(w_scale[src + gi[g]], scale, inter[g])
                    part = (data - zp) @ w.T
                    acc = FP.sat16(_mbqm(_wrap32(part), m, s) + acc)
                if has_peep and g in peep:
                    state = c_prev if g != "o" else new_cell
                    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                        m, s = _qmul(float(f32(2.0 ** cell_shift * w_scale[9 + "ifo".index(g)]
                                               / inter[g])))
                    prod = peep[g].astype(np.int64) * state
                    acc = FP.sat16(_mbqm(prod, m, s) + acc)
                if use_ln:
                    ln_scale = w_scale[20 + gi[g]]
                    a, b = _qmul(ln_scale)
                    limit = min(1, int(10000 * f32(ln_scale)))
                    acc = _layer_norm(acc, ln[g].astype(np.int64), bias[g].astype(np.int64),
                                      a, b, limit)
                return acc

            f_gate = FP.logistic16(gate("f"), 3)
            c_gate = FP.tanh16(gate("c"), 3)
            i_gate = FP.wrap16(32767 - f_gate) if cifg else FP.logistic16(gate("i"), 3)
            fc = FP.wrap16(C.rounding_divide_by_pot(f_gate * c_prev, 15))
            ic = FP.wrap16(C.rounding_divide_by_pot(i_gate * c_gate, 30 + cell_shift))
            new_cell = FP.sat16(fc + ic)
            if cell_clip > 0:
                q_clip = int(np.int16(int(min(max(f32(cell_clip) / f32(cell_scale), -32768.0),
                                              32767.0))))
                new_cell = np.clip(new_cell, -q_clip, q_clip)
            o_gate = FP.logistic16(gate("o"), 3)
            c_tanh = FP.tanh16(new_cell, cell_shift + 15)
            if not h_scale > 0:
                raise OpError("hidden state scale must be positive")
            hm, hs = _qmul(float(f32(2.0 ** -15 / float(f32(h_scale)) * 2.0 ** -15)))
            hidden = np.clip(_mbqm(o_gate * c_tanh, hm, hs) - h_zp, -128, 127)
            if proj_w is not None:
                if proj_w.shape != (n_out, n_units):
                    raise OpError("projection weights shape does not match")
                pw = proj_w.astype(np.int64)
                pb = np.zeros(n_out, dtype=np.int64) if proj_b is None else proj_b.astype(
                    np.int64)
                pb = pb + h_zp * pw.sum(axis=1)
                pm, ps = eff(w_scale[16], h_scale, out_scale)
                acc = _wrap32(pb + hidden @ pw.T)
                out = np.clip(_mbqm(acc, pm, ps) + out_zp, -128, 127)
                if proj_clip > 0:
                    q_clip = int(np.int8(int(min(max(f32(proj_clip) / f32(w_scale[16]), -128.0),
                                                 127.0))))
                    out = np.clip(out, -q_clip, q_clip)
            else:
                if n_out != n_units:
                    raise OpError("output size must equal the number of units without "
                                  "projection")
                out = hidden
            out8 = out.astype(np.int8)
            return [out8, new_cell.astype(np.int16), out8.copy()]

        return with_required(run, QUANTIZED_LSTM_SIGNATURE, len(ctx.inputs))
