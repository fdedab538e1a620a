"""Float LSTM family: LSTM (one time step), UNIDIRECTIONAL_SEQUENCE_LSTM and
BIDIRECTIONAL_SEQUENCE_LSTM.

All three share one cell (:class:`LstmCell`) that supports CIFG, peephole connections,
projection with clipping, cell clipping, layer normalisation and an auxiliary input. The
input contribution of a whole sequence is one matmul; only the recurrent part loops over
time steps (vectorised over the batch). Float16 models are computed in float32, like the
reference implementation, and rounded once at the end.

Optional operands may be NO_VALUE or, when they are model inputs, arrive without a value at
execution time; so which variant (CIFG, peephole, ...) runs is decided from the values at run
time, while validation only checks what is known statically.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nnhal.core.version import FeatureLevel
from nnhal.hal.types import OperandLifeTime, OperandType, OperationType
from nnhal.ops.resolver import OpContext, OperandInfo, OpError, RecurrentDef, register
from nnhal.ops.signature import (
    V1_0,
    V1_2,
    V1_3,
    Signature,
    Slot,
    Variant,
    omittable_positions,
    sig,
)

T = OperandType
O = OperationType

#: Activation codes accepted for the cell input/output activation g (TfLiteFusedActivation).
_ACT_CODES = (0, 1, 2, 3, 4, 6)
_LAYER_NORM_EPS = np.float32(1e-8)


# ---- signatures ---------------------------------------------------------------------------------
# "T" is the tensor type, "S" the type of the clip scalars (FLOAT16 goes with TENSOR_FLOAT16).

_F32 = {"T": T.TENSOR_FLOAT32, "S": T.FLOAT32}
_F16 = {"T": T.TENSOR_FLOAT16, "S": T.FLOAT16}


def _opt(name: str, doc: str = "") -> Slot:
    """A tensor input that may be omitted (NO_VALUE)."""
    return Slot(name, "T", omittable=True, doc=doc)


def _cell_slots(p: str = "") -> list[Slot]:
    """The 17 weight and bias inputs of one LSTM cell, named with prefix ``p`` (fw_, bw_)."""
    return [
        _opt(f"{p}input_to_input", "absent with CIFG"),
        Slot(f"{p}input_to_forget", "T"), Slot(f"{p}input_to_cell", "T"),
        Slot(f"{p}input_to_output", "T", doc="[num_units, input_size]"),
        _opt(f"{p}recurrent_to_input", "absent with CIFG"),
        Slot(f"{p}recurrent_to_forget", "T"), Slot(f"{p}recurrent_to_cell", "T"),
        Slot(f"{p}recurrent_to_output", "T", doc="[num_units, output_size]"),
        _opt(f"{p}cell_to_input", "peephole"), _opt(f"{p}cell_to_forget", "peephole"),
        _opt(f"{p}cell_to_output", "peephole"),
        _opt(f"{p}input_gate_bias", "absent with CIFG"),
        Slot(f"{p}forget_gate_bias", "T"), Slot(f"{p}cell_bias", "T"),
        Slot(f"{p}output_gate_bias", "T"),
        _opt(f"{p}projection_weights"), _opt(f"{p}projection_bias"),
    ]


def _layer_norm_slots(p: str = "", since: FeatureLevel = V1_0) -> list[Slot]:
    """The four layer normalisation weights (all present or all omitted)."""
    return [Slot(f"{p}{g}_layer_norm", "T", omittable=True, since=since)
            for g in ("input", "forget", "cell", "output")]


_ACTIVATION = Slot("activation", T.INT32, doc="g: 0 none, 1 relu, 3 relu6, 4 tanh, 6 sigmoid")
_CLIPS = [Slot("cell_clip", "S", doc="0 disables"), Slot("proj_clip", "S", doc="0 disables")]
_CELL_INPUTS = [Slot("input", "T"), *_cell_slots(),
                Slot("output_state_in", "T"), Slot("cell_state_in", "T"), _ACTIVATION, *_CLIPS]

LSTM_SIGNATURE = sig(
    O.LSTM,
    {"plain": _CELL_INPUTS, "layer_norm": [*_CELL_INPUTS, *_layer_norm_slots(since=V1_2)]},
    [Slot("scratch_buffer", "T"), Slot("output_state_out", "T"), Slot("cell_state_out", "T"),
     Slot("output", "T")],
    [Variant(_F32, V1_0), Variant(_F16, V1_2)],
    doc="one LSTM time step")

UNI_LSTM_SIGNATURE = sig(
    O.UNIDIRECTIONAL_SEQUENCE_LSTM,
    [*_CELL_INPUTS, Slot("time_major", T.BOOL), *_layer_norm_slots()],
    [Slot("output", "T"),
     Slot("output_state_out", "T", optional=True, since=V1_3, doc="with cell_state_out"),
     Slot("cell_state_out", "T", optional=True, since=V1_3)],
    [Variant(_F32, V1_2), Variant(_F16, V1_2)],
    doc="LSTM over a sequence; 1 or 3 outputs")

BI_LSTM_SIGNATURE = sig(
    O.BIDIRECTIONAL_SEQUENCE_LSTM,
    [Slot("input", "T"), *_cell_slots("fw_"), *_cell_slots("bw_"),
     Slot("fw_output_state_in", "T"), Slot("fw_cell_state_in", "T"),
     Slot("bw_output_state_in", "T"), Slot("bw_cell_state_in", "T"),
     _opt("aux_input", "cross or parallel linking"),
     *[_opt(f"{d}_aux_to_{g}") for d in ("fw", "bw") for g in ("input", "forget", "cell",
                                                                 "output")],
     _ACTIVATION, *_CLIPS, Slot("merge_outputs", T.BOOL), Slot("time_major", T.BOOL),
     *_layer_norm_slots("fw_"), *_layer_norm_slots("bw_")],
    [Slot("fw_output", "T", doc="both directions when merge_outputs"),
     Slot("bw_output", "T", optional=True, doc="absent when merge_outputs (later outputs move "
          "up one)"),
     *[Slot(n, "T", optional=True, since=V1_3) for n in (
         "fw_output_state_out", "fw_cell_state_out", "bw_output_state_out",
         "bw_cell_state_out")]],
    [Variant(_F32, V1_2), Variant(_F16, V1_2)],
    doc="forward and backward LSTMs; 1, 2, 5 or 6 outputs")

SIGNATURES = [LSTM_SIGNATURE, UNI_LSTM_SIGNATURE, BI_LSTM_SIGNATURE]


# ---- shared helpers (also used by the RNN family) ------------------------------------------

def value_given(x: np.ndarray | None) -> bool:
    """True when an optional operand carries a value at execution time (no value arrives as
    None, or as an empty tensor when the model gives the operand as a zero-sized input)."""
    return x is not None and x.size > 0


def maybe_absent(info: OperandInfo) -> bool:
    """Whether an optional operand may turn out to have no value at execution time."""
    # A request may leave any model input without a value.
    return info.omitted or info.lifetime == OperandLifeTime.SUBGRAPH_INPUT


def expect_rank_if_given(ctx: OpContext, i: int, rank: int) -> None:
    """The rank of an omittable input, checked only when it is sure to carry a value."""
    if not maybe_absent(ctx.inputs[i]):
        ctx.expect_rank(i, rank)


def sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.float32(1.0) / (np.float32(1.0) + np.exp(-x))


def apply_activation(x: np.ndarray, code: int) -> np.ndarray:
    """TfLite ApplyActivationToVector for the codes LSTM accepts."""
    if code == 0:
        return x
    if code == 1:
        return np.maximum(x, np.float32(0.0))
    if code == 2:
        return np.clip(x, np.float32(-1.0), np.float32(1.0))
    if code == 3:
        return np.clip(x, np.float32(0.0), np.float32(6.0))
    if code == 4:
        return np.tanh(x)
    if code == 6:
        return sigmoid(x)
    raise OpError(f"unsupported LSTM activation {code}")


def f32(x: np.ndarray | None) -> np.ndarray | None:
    return None if x is None else np.asarray(x, dtype=np.float32)


def with_required(run, signature: Signature, count: int):
    """Wrap a kernel so that an input the signature does not let be omitted, left without a
    value at execution time (a model input the request omits), raises OpError."""
    omittable = omittable_positions(signature, count)
    idx = tuple(k for k in range(count) if k not in omittable)

    def checked(ins, rt):
        for i in idx:
            if ins[i] is None:
                raise OpError(f"required input {i} has no value")
        return run(ins, rt)

    return checked


def norm_rows(x: np.ndarray) -> np.ndarray:
    """MeanStddevNormalization over the last axis (per batch row)."""
    n = x.shape[-1]
    if n == 0:
        return x
    mean = np.sum(x, axis=-1, keepdims=True, dtype=np.float32) / np.float32(n)
    d = x - mean
    var = np.sum(d * d, axis=-1, keepdims=True, dtype=np.float32) / np.float32(n)
    return d / np.sqrt(var + _LAYER_NORM_EPS)


# ---- the LSTM cell -----------------------------------------------------------------------------

@dataclass
class LstmCell:
    """Weights of one LSTM direction, stacked so that one matmul feeds every gate.

    Gates are stacked in the order (input, forget, cell, output); the input gate is absent
    with CIFG.
    """

    cifg: bool
    n_cell: int
    n_input: int
    n_output: int
    wx: np.ndarray  # [n_in, G*n_cell]
    wh: np.ndarray  # [n_output, G*n_cell]
    waux: np.ndarray | None  # [n_aux, G*n_cell]
    bias: np.ndarray  # [G*n_cell]
    peephole: tuple[np.ndarray | None, np.ndarray, np.ndarray] | None  # (ci, cf, co)
    layer_norm: list[np.ndarray] | None  # one per gate in stacking order
    proj_w: np.ndarray | None  # [n_cell, n_output]
    proj_b: np.ndarray | None

    @property
    def gates(self) -> int:
        return 3 if self.cifg else 4


def build_cell(get, idx: dict[str, int | None], input_size: int, aux_size: int | None,
               where: str = "") -> LstmCell:
    """Build a cell from operand values. ``get(i)`` returns float32 or None (no value).

    ``idx`` maps weight names to input indices (missing keys mean the operand does not
    exist in this operation). ``aux_size`` is the auxiliary input width when an auxiliary
    input feeds this cell through aux weights, else None.
    """
    def g(name: str) -> np.ndarray | None:
        i = idx.get(name)
        if i is None:
            return None
        v = get(i)
        return v if value_given(v) else None

    def need(name: str) -> np.ndarray:
        v = g(name)
        if v is None:
            raise OpError(f"{where}required operand {name} has no value")
        return v

    def shape_is(v: np.ndarray, shape: tuple[int, ...], name: str) -> None:
        if v.shape != shape:
            raise OpError(f"{where}{name} has shape {v.shape}, expected {shape}")

    i2o = need("i2o")
    if i2o.ndim != 2:
        raise OpError(f"{where}input-to-output weights must be 2-D")
    n_cell = i2o.shape[0]
    shape_is(i2o, (n_cell, input_size), "i2o")
    r2o = need("r2o")
    if r2o.ndim != 2 or r2o.shape[0] != n_cell:
        raise OpError(f"{where}recurrent-to-output weights have shape {r2o.shape}")
    n_output = r2o.shape[1]

    i2i, r2i = g("i2i"), g("r2i")
    if (i2i is None) != (r2i is None):
        raise OpError(f"{where}input-to-input and recurrent-to-input weights must be both "
                      "present or both absent")
    cifg = i2i is None
    names = ("f", "c", "o") if cifg else ("i", "f", "c", "o")
    wx, wh = [], []
    for n in names:
        a = need("i2" + n)
        shape_is(a, (n_cell, input_size), "i2" + n)
        b = need("r2" + n)
        shape_is(b, (n_cell, n_output), "r2" + n)
        wx.append(a)
        wh.append(b)

    waux = None
    if aux_size is not None:
        ws = []
        for n in names:
            a = need("aux2" + n)
            shape_is(a, (n_cell, aux_size), "aux2" + n)
            ws.append(a)
        if cifg and g("aux2i") is not None:
            raise OpError(f"{where}aux input-to-input weights given with CIFG")
        waux = np.concatenate(ws, axis=0).T.copy()

    ci, cf, co = g("c2i"), g("c2f"), g("c2o")
    for v, n in ((ci, "c2i"), (cf, "c2f"), (co, "c2o")):
        if v is not None:
            shape_is(v, (n_cell,), n)
    if cf is None and co is None and ci is None:
        peephole = None
    elif cf is not None and co is not None and (ci is not None or cifg):
        peephole = (None if cifg else ci, cf, co)
    else:
        raise OpError(f"{where}peephole weights must be all present or all absent")

    ib = g("bi")
    if cifg:
        if ib is not None:
            raise OpError(f"{where}input gate bias given with CIFG")
    else:
        if ib is None:
            raise OpError(f"{where}input gate bias is required without CIFG")
        shape_is(ib, (n_cell,), "bi")
    biases = []
    for n in names:
        v = ib if n == "i" else need("b" + n)
        shape_is(v, (n_cell,), "b" + n)
        biases.append(v)

    pw, pb = g("proj"), g("projb")
    if pw is not None:
        shape_is(pw, (n_output, n_cell), "projection weights")
    elif n_output != n_cell:
        raise OpError(f"{where}output size {n_output} differs from {n_cell} cells "
                      "without projection")
    if pb is not None:
        if pw is None:
            raise OpError(f"{where}projection bias without projection weights")
        shape_is(pb, (n_output,), "projection bias")

    lns = {n: g("ln" + n) for n in ("i", "f", "c", "o")}
    for n, v in lns.items():
        if v is not None:
            shape_is(v, (n_cell,), "ln" + n)
    if cifg and lns["i"] is not None:
        raise OpError(f"{where}input layer norm weights given with CIFG")
    present = [lns[n] is not None for n in names]
    if all(present):
        layer_norm = [lns[n] for n in names]
    elif not any(present):
        layer_norm = None
    else:
        raise OpError(f"{where}layer norm weights must be all present or all absent")

    return LstmCell(
        cifg=cifg, n_cell=n_cell, n_input=input_size, n_output=n_output,
        wx=np.concatenate(wx, axis=0).T.copy(), wh=np.concatenate(wh, axis=0).T.copy(),
        waux=waux, bias=np.concatenate(biases), peephole=peephole, layer_norm=layer_norm,
        proj_w=None if pw is None else pw.T.copy(), proj_b=pb)


def run_cell(cell: LstmCell, x: np.ndarray, h0: np.ndarray, c0: np.ndarray, act: int,
             cell_clip: float, proj_clip: float, aux: np.ndarray | None = None,
             reverse: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Run a time-major sequence x [T, B, I] through the cell.

    Returns (outputs [T, B, n_output], last output state, last cell state, scratch buffer
    [B, G*n_cell] of the last step laid out gate-major like the reference).
    """
    steps, batch = x.shape[0], x.shape[1]
    n = cell.n_cell
    gcount = cell.gates
    # Input contribution of every step at once.
    pre_x = (x.reshape(steps * batch, x.shape[2]) @ cell.wx).reshape(steps, batch, gcount * n)
    if aux is not None and cell.waux is not None:
        aux_part = aux.reshape(steps * batch, aux.shape[2]) @ cell.waux
        pre_x += aux_part.reshape(steps, batch, gcount * n)
    if cell.layer_norm is None:
        pre_x += cell.bias
    h = h0.astype(np.float32, copy=True)
    c = c0.astype(np.float32, copy=True)
    out = np.empty((steps, batch, cell.n_output), dtype=np.float32)
    scratch = np.zeros((gcount, batch, n), dtype=np.float32)
    order = range(steps - 1, -1, -1) if reverse else range(steps)
    off = 0 if cell.cifg else 1  # index of the forget gate in the stack
    for t in order:
        z = pre_x[t] + h @ cell.wh
        gates = [z[:, k * n:(k + 1) * n] for k in range(gcount)]
        if cell.peephole is not None:
            ci, cf, _ = cell.peephole
            if not cell.cifg:
                gates[0] = gates[0] + ci * c
            gates[off] = gates[off] + cf * c
        if cell.layer_norm is not None:
            for k in range(gcount - 1):  # the output gate is normalised after the peephole
                gates[k] = norm_rows(gates[k]) * cell.layer_norm[k] + cell.bias[k * n:(k + 1) * n]
        f = sigmoid(gates[off])
        g = apply_activation(gates[off + 1], act)
        i = np.float32(1.0) - f if cell.cifg else sigmoid(gates[0])
        c = f * c + i * g
        if cell_clip > 0:
            c = np.clip(c, np.float32(-cell_clip), np.float32(cell_clip))
        o = gates[off + 2]
        if cell.peephole is not None:
            o = o + cell.peephole[2] * c
        if cell.layer_norm is not None:
            k = gcount - 1
            o = norm_rows(o) * cell.layer_norm[k] + cell.bias[k * n:(k + 1) * n]
        o = sigmoid(o)
        gc = apply_activation(c, act)
        hc = o * gc
        if cell.proj_w is not None:
            y = hc @ cell.proj_w
            if cell.proj_b is not None:
                y = y + cell.proj_b
            if proj_clip > 0:
                y = np.clip(y, np.float32(-proj_clip), np.float32(proj_clip))
        else:
            y = hc
        out[t] = y
        h = y
        if cell.cifg:
            scratch[0], scratch[1], scratch[2] = gc, np.float32(1.0) - f, hc
        else:
            scratch[0], scratch[1], scratch[2], scratch[3] = i, gc, f, hc
    # The reference scratch buffer is gate-major memory viewed as [batch, G * n_cell].
    return out, h, c, scratch.reshape(batch, gcount * n)


def _clip_value(v: object, name: str) -> float:
    c = float(np.asarray(v, dtype=np.float32))
    if not c >= 0:  # also rejects NaN
        raise OpError(f"{name} must be non-negative, got {c}")
    return c


# ---- index maps ---------------------------------------------------------------------------------

_WEIGHT_NAMES = ("i2i", "i2f", "i2c", "i2o", "r2i", "r2f", "r2c", "r2o", "c2i", "c2f", "c2o",
                 "bi", "bf", "bc", "bo", "proj", "projb")


def _cell_index(base: int, ln_base: int | None, aux_base: int | None = None) -> dict[str, int]:
    idx = {name: base + k for k, name in enumerate(_WEIGHT_NAMES)}
    if ln_base is not None:
        idx.update({"lni": ln_base, "lnf": ln_base + 1, "lnc": ln_base + 2, "lno": ln_base + 3})
    if aux_base is not None:
        idx.update({"aux2i": aux_base, "aux2f": aux_base + 1, "aux2c": aux_base + 2,
                    "aux2o": aux_base + 3})
    return idx


def _validate_cell_shapes(ctx: OpContext, idx: dict[str, int], signature: Signature) -> None:
    """Static checks of ranks and mutually known dimensions of one cell's weights (omittable
    ones only when they are sure to have a value)."""
    omittable = omittable_positions(signature, len(ctx.inputs))
    for name, i in idx.items():
        rank = 2 if name[:2] in ("i2", "r2", "au") or name == "proj" else 1
        if i in omittable:
            expect_rank_if_given(ctx, i, rank)
        else:
            ctx.expect_rank(i, rank)
    n_cell = ctx.dim(idx["i2o"], 0)
    for name in ("i2f", "i2c", "r2f", "r2c", "r2o", "bf", "bc", "bo"):
        ctx.require_same(ctx.dim(idx[name], 0), n_cell, f"{name} rows (num_units)")


def _check_activation(ctx: OpContext, i: int) -> None:
    act = ctx.const_int(i)
    ctx.require(act is None or act in _ACT_CODES, f"input {i} has invalid activation {act}")


def _const_cell(ctx: OpContext, idx: dict[str, int], input_size: int,
                aux_size: int | None) -> LstmCell | None:
    """Prebuild the cell at prepare time when every weight is constant or NO_VALUE."""
    for i in idx.values():
        info = ctx.inputs[i]
        if not (info.is_const or info.lifetime == OperandLifeTime.NO_VALUE):
            return None
    try:
        return build_cell(lambda i: f32(ctx.const(i)), idx, input_size, aux_size)
    except OpError:
        return None  # reported at execution time with the actual shapes


# ---- LSTM -----------------------------------------------------------------------------------

_LSTM_IDX = _cell_index(1, None)
_LSTM_IDX_LN = _cell_index(1, 23)


@register(O.LSTM)
class Lstm(RecurrentDef):
    """One LSTM time step; 23 inputs (HAL 1.0) or 27 with layer normalisation (HAL 1.2)."""

    def validate(self, ctx: OpContext) -> None:
        for i, rank in ((0, 2), (18, 2), (19, 2)):
            ctx.expect_rank(i, rank)
        _validate_cell_shapes(ctx, _LSTM_IDX_LN if len(ctx.inputs) == 27 else _LSTM_IDX,
                              LSTM_SIGNATURE)
        _check_activation(ctx, 20)
        for i in (21, 22):
            v = ctx.const_float(i)
            ctx.require(v is None or v >= 0, f"input {i} (clip) must be non-negative")

    def prepare(self, ctx: OpContext):
        ins = ctx.inputs
        batch = ctx.dim(0, 0) or 0
        n_cell = ctx.dim(4, 0) or 0
        n_out = ctx.dim(8, 1) or 0
        gates = 0
        if ins[1].omitted:
            gates = 3
        elif not maybe_absent(ins[1]):
            gates = 4
        return [(batch, gates * n_cell), (batch, n_out), (batch, n_cell), (batch, n_out)]

    def kernel(self, ctx: OpContext):
        idx = _LSTM_IDX_LN if len(ctx.inputs) == 27 else _LSTM_IDX
        dt = ctx.outputs[0].type.dtype
        input_size = ctx.dim(0, 1)
        pre = _const_cell(ctx, idx, input_size, None) if input_size else None

        def run(ins, rt):
            x = f32(ins[0])
            if x.ndim != 2:
                raise OpError("LSTM input must be 2-D")
            cell = pre if pre is not None and pre.n_input == x.shape[1] else build_cell(
                lambda i: f32(ins[i]), idx, x.shape[1], None)
            h0, c0 = _states(ins[18], ins[19], x.shape[0], cell)
            act = int(ins[20])
            if act not in _ACT_CODES:
                raise OpError(f"unsupported LSTM activation {act}")
            out, h, c, scratch = run_cell(cell, x[None], h0, c0, act,
                                          _clip_value(ins[21], "cell_clip"),
                                          _clip_value(ins[22], "proj_clip"))
            return [scratch.astype(dt), h.astype(dt), c.astype(dt), out[0].astype(dt)]

        return with_required(run, LSTM_SIGNATURE, len(ctx.inputs))


def _states(h0: np.ndarray, c0: np.ndarray, batch: int, cell: LstmCell,
            where: str = "") -> tuple[np.ndarray, np.ndarray]:
    h0, c0 = f32(h0), f32(c0)
    if h0 is None or h0.shape != (batch, cell.n_output):
        raise OpError(f"{where}output state must have shape {(batch, cell.n_output)}")
    if c0 is None or c0.shape != (batch, cell.n_cell):
        raise OpError(f"{where}cell state must have shape {(batch, cell.n_cell)}")
    return h0, c0


def _to_time_major(x: np.ndarray, time_major: bool) -> np.ndarray:
    if x.ndim != 3:
        raise OpError("sequence input must be 3-D")
    return x if time_major else np.swapaxes(x, 0, 1)


# ---- UNIDIRECTIONAL_SEQUENCE_LSTM ---------------------------------------------------------------

_UNI_IDX = _cell_index(1, 24)


@register(O.UNIDIRECTIONAL_SEQUENCE_LSTM)
class UnidirectionalSequenceLstm(RecurrentDef):
    """LSTM unrolled over a sequence; since HAL 1.3 it may also output the final states."""

    def validate(self, ctx: OpContext) -> None:
        ctx.require(len(ctx.outputs) != 2, "the final output and cell states come together: "
                    "expected 1 or 3 outputs, got 2")
        for i, rank in ((0, 3), (18, 2), (19, 2)):
            ctx.expect_rank(i, rank)
        _validate_cell_shapes(ctx, _UNI_IDX, UNI_LSTM_SIGNATURE)
        _check_activation(ctx, 20)

    def prepare(self, ctx: OpContext):
        ins = ctx.inputs
        n_out = ctx.dim(8, 1) or 0
        n_cell = ctx.dim(4, 0) or 0
        tm = ctx.const(23)
        if ins[0].shape is None:
            out0 = None
        else:
            out0 = tuple(ins[0].shape[:2]) + (n_out,) if len(ins[0].shape) == 3 else None
        batch = 0
        if tm is not None and ins[0].shape is not None and len(ins[0].shape) == 3:
            batch = ins[0].shape[1 if bool(tm) else 0]
        shapes = [out0]
        if len(ctx.outputs) == 3:
            shapes += [(batch, n_out), (batch, n_cell)]
        return shapes

    def kernel(self, ctx: OpContext):
        dt = ctx.outputs[0].type.dtype
        input_size = ctx.dim(0, 2)
        pre = _const_cell(ctx, _UNI_IDX, input_size, None) if input_size else None
        n_outputs = len(ctx.outputs)

        def run(ins, rt):
            time_major = bool(ins[23])
            x = _to_time_major(f32(ins[0]), time_major)
            cell = pre if pre is not None and pre.n_input == x.shape[2] else build_cell(
                lambda i: f32(ins[i]), _UNI_IDX, x.shape[2], None)
            h0, c0 = _states(ins[18], ins[19], x.shape[1], cell)
            act = int(ins[20])
            if act not in _ACT_CODES:
                raise OpError(f"unsupported LSTM activation {act}")
            out, h, c, _ = run_cell(cell, x, h0, c0, act, _clip_value(ins[21], "cell_clip"),
                                    _clip_value(ins[22], "proj_clip"))
            res = [_from_time_major(out, time_major).astype(dt)]
            if n_outputs == 3:
                res += [h.astype(dt), c.astype(dt)]
            return res

        return with_required(run, UNI_LSTM_SIGNATURE, len(ctx.inputs))


def _from_time_major(y: np.ndarray, time_major: bool) -> np.ndarray:
    return y if time_major else np.ascontiguousarray(np.swapaxes(y, 0, 1))


# ---- BIDIRECTIONAL_SEQUENCE_LSTM ---------------------------------------------------------------

_BI_FW = _cell_index(1, 53, 40)
_BI_BW = _cell_index(18, 57, 44)
_BI_FW_STATE = (35, 36)
_BI_BW_STATE = (37, 38)
_BI_AUX = 39


@register(O.BIDIRECTIONAL_SEQUENCE_LSTM)
class BidirectionalSequenceLstm(RecurrentDef):
    """Forward and backward LSTMs over one sequence, with optional auxiliary input
    (cross-linking with aux weights, parallel linking without) and merged outputs."""

    def validate(self, ctx: OpContext) -> None:
        # The signature allows 1 to 6 outputs; the four final states come together.
        ctx.require(len(ctx.outputs) in (1, 2, 5, 6),
                    f"expected 1, 2, 5 or 6 outputs, got {len(ctx.outputs)}")
        merge = ctx.const(51)
        if merge is not None:
            ctx.require(len(ctx.outputs) in ((1, 5) if bool(merge) else (2, 6)),
                        "output count does not match merge_outputs")
        ctx.expect_rank(0, 3)
        expect_rank_if_given(ctx, _BI_AUX, 3)
        for i in _BI_FW_STATE + _BI_BW_STATE:
            ctx.expect_rank(i, 2)
        _validate_cell_shapes(ctx, _BI_FW, BI_LSTM_SIGNATURE)
        _validate_cell_shapes(ctx, _BI_BW, BI_LSTM_SIGNATURE)
        _check_activation(ctx, 48)

    def prepare(self, ctx: OpContext):
        ins = ctx.inputs
        merged = len(ctx.outputs) in (1, 5)
        fw_out, bw_out = ctx.dim(8, 1) or 0, ctx.dim(25, 1) or 0
        fw_cell, bw_cell = ctx.dim(4, 0) or 0, ctx.dim(21, 0) or 0
        seq = None
        if ins[0].shape is not None and len(ins[0].shape) == 3:
            seq = tuple(ins[0].shape[:2])
        tm = ctx.const(52)
        batch = 0
        if seq is not None and tm is not None:
            batch = seq[1] if bool(tm) else seq[0]
        if merged:
            width = fw_out + bw_out if fw_out and bw_out else 0
            shapes = [None if seq is None else seq + (width,)]
        else:
            shapes = [None if seq is None else seq + (fw_out,),
                      None if seq is None else seq + (bw_out,)]
        if len(ctx.outputs) >= 5:
            shapes += [(batch, fw_out), (batch, fw_cell), (batch, bw_out), (batch, bw_cell)]
        return shapes

    def kernel(self, ctx: OpContext):
        dt = ctx.outputs[0].type.dtype
        n_outputs = len(ctx.outputs)
        merged = n_outputs in (1, 5)

        def run(ins, rt):
            time_major = bool(ins[52])
            x = _to_time_major(f32(ins[0]), time_major)
            aux = f32(ins[_BI_AUX]) if value_given(ins[_BI_AUX]) else None
            has_aux_w = {d: value_given(ins[idx["aux2f"]]) for d, idx in (("fw", _BI_FW),
                                                                            ("bw", _BI_BW))}
            if has_aux_w["fw"] != has_aux_w["bw"]:
                raise OpError("forward and backward aux weights must be both present or absent")
            if has_aux_w["fw"] and aux is None:
                raise OpError("aux weights given without an aux input")
            if aux is not None:
                aux = _to_time_major(aux, time_major)
                if aux.shape[:2] != x.shape[:2]:
                    raise OpError("aux input must match the input's time and batch sizes")
            cross = aux is not None and has_aux_w["fw"]
            bw_x = aux if (aux is not None and not cross) else x
            aux_size = aux.shape[2] if cross else None
            fw = build_cell(lambda i: f32(ins[i]), _BI_FW, x.shape[2], aux_size, "forward: ")
            bw = build_cell(lambda i: f32(ins[i]), _BI_BW, bw_x.shape[2], aux_size,
                            "backward: ")
            batch = x.shape[1]
            act = int(ins[48])
            if act not in _ACT_CODES:
                raise OpError(f"unsupported LSTM activation {act}")
            cclip = _clip_value(ins[49], "cell_clip")
            pclip = _clip_value(ins[50], "proj_clip")
            fh0, fc0 = _states(ins[35], ins[36], batch, fw, "forward: ")
            bh0, bc0 = _states(ins[37], ins[38], batch, bw, "backward: ")
            fo, fh, fc, _ = run_cell(fw, x, fh0, fc0, act, cclip, pclip,
                                     aux if cross else None)
            bo, bh, bc, _ = run_cell(bw, bw_x, bh0, bc0, act, cclip, pclip,
                                     aux if cross else None, reverse=True)
            if merged:
                res = [_from_time_major(np.concatenate([fo, bo], axis=2), time_major)
                       .astype(dt)]
            else:
                res = [_from_time_major(fo, time_major).astype(dt),
                       _from_time_major(bo, time_major).astype(dt)]
            if n_outputs >= 5:
                res += [fh.astype(dt), fc.astype(dt), bh.astype(dt), bc.astype(dt)]
            return res

        return with_required(run, BI_LSTM_SIGNATURE, len(ctx.inputs))
