"""Recurrent family: LSTM variants, RNN variants, SVDF, LSH_PROJECTION and the integer LSTMs."""

import numpy as np
import pytest

from nnhal.hal.types import OperandType as T
from nnhal.hal.types import OperationType as O
from nnhal.ops import recurrent_fixedpoint as FP
from nnhal.ops.lsh_projection import fingerprint64
from nnhal.ops.resolver import OpError
from nnhal.ops.testing import omitted, output, run_op, tensor

F32, F16 = T.TENSOR_FLOAT32, T.TENSOR_FLOAT16
RNG = np.random.default_rng(7)


def sig(x):
    return 1.0 / (1.0 + np.exp(-x))


# ---- float LSTM helpers -----------------------------------------------------------------------

def make_lstm_weights(n_in, n_cell, n_out, *, cifg=False, peephole=False, proj=False,
                      layer_norm=False, scale=0.4):
    def r(*shape):
        return (RNG.standard_normal(shape) * scale).astype(np.float32)

    w = {g: (r(n_cell, n_in), r(n_cell, n_out), r(n_cell)) for g in "ifco"}
    if cifg:
        del w["i"]
    return {
        "w": w,
        "peep": {g: r(n_cell) for g in ("fo" if cifg else "ifo")} if peephole else None,
        "proj": (r(n_out, n_cell), r(n_out)) if proj else None,
        "ln": {g: r(n_cell) + 1 for g in ("fco" if cifg else "ifco")} if layer_norm else None,
    }


def ref_lstm_step(x, h, c, p, act=np.tanh, cell_clip=0.0, proj_clip=0.0):
    """Textbook LSTM step in float64 (independent of the implementation)."""
    x, h, c = (np.asarray(v, np.float64) for v in (x, h, c))
    pre = {}
    for g, (wx, wh, b) in p["w"].items():
        z = x @ wx.T.astype(np.float64) + h @ wh.T.astype(np.float64)
        if p["peep"] is not None and g in ("i", "f"):
            z = z + p["peep"][g] * c
        pre[g] = (z, b)

    def finish(g, z):
        b = pre[g][1]
        if p["ln"] is not None:
            mu = z.mean(axis=1, keepdims=True)
            sd = np.sqrt(((z - mu) ** 2).mean(axis=1, keepdims=True) + 1e-8)
            return (z - mu) / sd * p["ln"][g] + b
        return z + b

    f = sig(finish("f", pre["f"][0]))
    g = act(finish("c", pre["c"][0]))
    i = 1 - f if "i" not in p["w"] else sig(finish("i", pre["i"][0]))
    c_new = f * c + i * g
    if cell_clip > 0:
        c_new = np.clip(c_new, -cell_clip, cell_clip)
    zo = pre["o"][0] + (p["peep"]["o"] * c_new if p["peep"] is not None else 0)
    o = sig(finish("o", zo))
    hc = o * act(c_new)
    if p["proj"] is not None:
        hc = hc @ p["proj"][0].T.astype(np.float64) + p["proj"][1]
        if proj_clip > 0:
            hc = np.clip(hc, -proj_clip, proj_clip)
    return hc, c_new


def lstm_weight_operands(p, t=F32, *, const=False):
    """Operands 1..17 of LSTM (also the forward/backward blocks of the sequence ops)."""
    def ten(v):
        return tensor(t, v, const=const)

    w = p["w"]
    ops = []
    ops += [ten(w[g][0]) if g in w else omitted(t) for g in "ifco"]
    ops += [ten(w[g][1]) if g in w else omitted(t) for g in "ifco"]
    ops += [ten(p["peep"][g]) if p["peep"] is not None and g in p["peep"] else omitted(t)
            for g in "ifo"]
    ops += [ten(w[g][2]) if g in w else omitted(t) for g in "ifco"]
    ops += [ten(p["proj"][0]), ten(p["proj"][1])] if p["proj"] is not None else [omitted(t)] * 2
    return ops


def ln_operands(p, t=F32):
    if p["ln"] is None:
        return [omitted(t)] * 4
    return [tensor(t, p["ln"][g]) if g in p["ln"] else omitted(t) for g in "ifco"]


def clip_scalar(t, v):
    return tensor(T.FLOAT32 if t == F32 else T.FLOAT16, v)


def run_lstm(x, h, c, p, t=F32, act=4, cell_clip=0.0, proj_clip=0.0, with_ln_inputs=None,
             const=False):
    n_cell = c.shape[1]
    ins = [tensor(t, x)] + lstm_weight_operands(p, t, const=const)
    ins += [tensor(t, h), tensor(t, c), tensor(T.INT32, act), clip_scalar(t, cell_clip),
            clip_scalar(t, proj_clip)]
    if with_ln_inputs or (with_ln_inputs is None and p["ln"] is not None):
        ins += ln_operands(p, t)
    gates = 3 if "i" not in p["w"] else 4
    outs = [output(t, [x.shape[0], gates * n_cell]), output(t, list(h.shape)),
            output(t, list(c.shape)), output(t, list(h.shape))]
    return run_op(O.LSTM, ins, outs)


# ---- LSTM ---------------------------------------------------------------------------------------

def test_lstm_hand_computed_zero_weights():
    # All weights and biases zero: every sigmoid gate is 0.5 and g = tanh(0) = 0,
    # so c' = 0.5 * c and h' = 0.5 * tanh(c').
    z2 = np.zeros((1, 1), np.float32)
    z1 = np.zeros(1, np.float32)
    p = {"w": {g: (z2, z2, z1) for g in "ifco"}, "peep": None, "proj": None, "ln": None}
    scratch, h, c, out = run_lstm(np.array([[3.0]], np.float32), z2, np.ones((1, 1), np.float32),
                                  p)
    np.testing.assert_allclose(c, [[0.5]], rtol=1e-6)
    np.testing.assert_allclose(h, [[0.5 * np.tanh(0.5)]], rtol=1e-6)
    np.testing.assert_array_equal(out, h)
    assert scratch.shape == (1, 4)


@pytest.mark.parametrize("cfg", [
    {},
    {"cifg": True, "peephole": True},
    {"peephole": True, "proj": True},
    {"cifg": True, "peephole": True, "proj": True, "layer_norm": True},
    {"layer_norm": True, "proj": True},
])
def test_lstm_matches_textbook_step(cfg):
    n_in, n_cell = 3, 4
    n_out = 2 if cfg.get("proj") else n_cell
    p = make_lstm_weights(n_in, n_cell, n_out, **cfg)
    x = RNG.standard_normal((2, n_in)).astype(np.float32)
    h = RNG.standard_normal((2, n_out)).astype(np.float32) * 0.3
    c = RNG.standard_normal((2, n_cell)).astype(np.float32) * 0.3
    scratch, h1, c1, out = run_lstm(x, h, c, p, cell_clip=0.6, proj_clip=0.3)
    eh, ec = ref_lstm_step(x, h, c, p, cell_clip=0.6, proj_clip=0.3)
    np.testing.assert_allclose(c1, ec, atol=2e-6)
    np.testing.assert_allclose(h1, eh, atol=2e-6)
    np.testing.assert_array_equal(out, h1)
    assert scratch.shape == (2, (3 if cfg.get("cifg") else 4) * n_cell)
    assert np.abs(c1).max() <= 0.6 + 1e-7


def test_lstm_relu_activation_and_constant_weights():
    p = make_lstm_weights(2, 3, 3)
    x = RNG.standard_normal((1, 2)).astype(np.float32)
    h = np.zeros((1, 3), np.float32)
    c = np.full((1, 3), 0.5, np.float32)

    def relu(v):
        return np.maximum(v, 0)

    _, h1, c1, _ = run_lstm(x, h, c, p, act=1, const=True)
    eh, ec = ref_lstm_step(x, h, c, p, act=relu)
    np.testing.assert_allclose(h1, eh, atol=2e-6)
    np.testing.assert_allclose(c1, ec, atol=2e-6)


def test_lstm_float16():
    p = make_lstm_weights(2, 3, 3)
    p16 = {"w": {g: tuple(a.astype(np.float16) for a in v) for g, v in p["w"].items()},
           "peep": None, "proj": None, "ln": None}
    x = np.array([[0.5, -1.0]], np.float16)
    h = np.zeros((1, 3), np.float16)
    c = np.zeros((1, 3), np.float16)
    _, h1, c1, out = run_lstm(x, h, c, p16, t=F16)
    assert h1.dtype == np.float16 and out.dtype == np.float16
    eh, ec = ref_lstm_step(x, h, c, p16)
    np.testing.assert_allclose(h1.astype(np.float64), eh, atol=2e-3)


def test_lstm_zero_batch():
    p = make_lstm_weights(2, 3, 3)
    scratch, h1, c1, out = run_lstm(np.zeros((0, 2), np.float32), np.zeros((0, 3), np.float32),
                                    np.zeros((0, 3), np.float32), p)
    assert scratch.shape == (0, 12) and h1.shape == (0, 3) and out.shape == (0, 3)


def test_lstm_rejects_half_cifg():
    p = make_lstm_weights(2, 3, 3)
    x = np.zeros((1, 2), np.float32)
    ins = [tensor(F32, x)] + lstm_weight_operands(p)
    ins[5] = omitted(F32)  # recurrent-to-input missing while input-to-input is present
    ins += [tensor(F32, np.zeros((1, 3))), tensor(F32, np.zeros((1, 3))), tensor(T.INT32, 4),
            tensor(T.FLOAT32, 0.0), tensor(T.FLOAT32, 0.0)]
    outs = [output(F32), output(F32), output(F32), output(F32)]
    with pytest.raises(OpError):
        run_op(O.LSTM, ins, outs)


def test_lstm_rejects_bad_activation_and_clip_type():
    p = make_lstm_weights(2, 3, 3)
    base = [tensor(F32, np.zeros((1, 2)))] + lstm_weight_operands(p)
    state = [tensor(F32, np.zeros((1, 3))), tensor(F32, np.zeros((1, 3)))]
    outs = [output(F32)] * 4
    with pytest.raises(OpError):
        run_op(O.LSTM, base + state + [tensor(T.INT32, 5), tensor(T.FLOAT32, 0.0),
                                       tensor(T.FLOAT32, 0.0)], outs)
    with pytest.raises(OpError):  # FLOAT16 clip with float32 tensors
        run_op(O.LSTM, base + state + [tensor(T.INT32, 4), tensor(T.FLOAT16, 0.0),
                                       tensor(T.FLOAT32, 0.0)], outs)
    with pytest.raises(OpError):  # negative cell clip
        run_op(O.LSTM, base + state + [tensor(T.INT32, 4), tensor(T.FLOAT32, -1.0),
                                       tensor(T.FLOAT32, 0.0)], outs)


# ---- sequence LSTMs ---------------------------------------------------------------------------

def run_uni(x, h, c, p, time_major, state_outputs=False):
    ins = [tensor(F32, x)] + lstm_weight_operands(p)
    ins += [tensor(F32, h), tensor(F32, c), tensor(T.INT32, 4), tensor(T.FLOAT32, 0.0),
            tensor(T.FLOAT32, 0.0), tensor(T.BOOL, time_major)] + ln_operands(p)
    outs = [output(F32)] + ([output(F32), output(F32)] if state_outputs else [])
    return run_op(O.UNIDIRECTIONAL_SEQUENCE_LSTM, ins, outs)


def steps_reference(xs, h, c, p):
    outs = []
    for x in xs:
        h, c = ref_lstm_step(x, h, c, p)
        outs.append(h)
    return np.stack(outs), h, c


def test_unidirectional_lstm_time_and_batch_major():
    p = make_lstm_weights(3, 4, 2, peephole=True, proj=True)
    xs = RNG.standard_normal((5, 2, 3)).astype(np.float32)  # [time, batch, input]
    h0 = np.zeros((2, 2), np.float32)
    c0 = np.zeros((2, 4), np.float32)
    exp, eh, ec = steps_reference(xs, h0, c0, p)
    out_tm, h, c = run_uni(xs, h0, c0, p, True, state_outputs=True)
    np.testing.assert_allclose(out_tm, exp, atol=3e-6)
    np.testing.assert_allclose(h, eh, atol=3e-6)
    np.testing.assert_allclose(c, ec, atol=3e-6)
    (out_bm,) = run_uni(np.swapaxes(xs, 0, 1).copy(), h0, c0, p, False)
    np.testing.assert_allclose(out_bm, np.swapaxes(exp, 0, 1), atol=3e-6)


def bidi_inputs(x, p_fw, p_bw, states, *, aux=None, aux_w=None, merge=False, time_major=True):
    ins = [tensor(F32, x)] + lstm_weight_operands(p_fw) + lstm_weight_operands(p_bw)
    ins += [tensor(F32, s) for s in states]
    ins.append(tensor(F32, aux) if aux is not None else omitted(F32))
    if aux_w is None:
        ins += [omitted(F32)] * 8
    else:
        ins += [tensor(F32, w) if w is not None else omitted(F32) for w in aux_w]
    ins += [tensor(T.INT32, 4), tensor(T.FLOAT32, 0.0), tensor(T.FLOAT32, 0.0),
            tensor(T.BOOL, merge), tensor(T.BOOL, time_major)]
    ins += ln_operands(p_fw) + ln_operands(p_bw)
    return ins


def test_bidirectional_lstm_matches_two_unidirectional_runs():
    p_fw = make_lstm_weights(3, 4, 4)
    p_bw = make_lstm_weights(3, 2, 2, cifg=True, peephole=True)
    xs = RNG.standard_normal((4, 1, 3)).astype(np.float32)
    states = [np.zeros((1, 4)), np.zeros((1, 4)), np.zeros((1, 2)), np.zeros((1, 2))]
    fw_exp, fh, fc = steps_reference(xs, states[0], states[1], p_fw)
    bw_exp, bh, bc = steps_reference(xs[::-1], states[2], states[3], p_bw)
    bw_exp = bw_exp[::-1]
    ins = bidi_inputs(xs, p_fw, p_bw, states)
    fo, bo, s0, s1, s2, s3 = run_op(O.BIDIRECTIONAL_SEQUENCE_LSTM, ins, [output(F32)] * 6)
    np.testing.assert_allclose(fo, fw_exp, atol=3e-6)
    np.testing.assert_allclose(bo, bw_exp, atol=3e-6)
    for got, exp in ((s0, fh), (s1, fc), (s2, bh), (s3, bc)):
        np.testing.assert_allclose(got, exp, atol=3e-6)
    (merged,) = run_op(O.BIDIRECTIONAL_SEQUENCE_LSTM,
                       bidi_inputs(xs, p_fw, p_bw, states, merge=True), [output(F32)])
    np.testing.assert_allclose(merged, np.concatenate([fw_exp, bw_exp], axis=2), atol=3e-6)


def test_bidirectional_lstm_parallel_linking_feeds_aux_to_backward():
    p_fw = make_lstm_weights(3, 2, 2)
    p_bw = make_lstm_weights(5, 2, 2)
    xs = RNG.standard_normal((3, 1, 3)).astype(np.float32)
    aux = RNG.standard_normal((3, 1, 5)).astype(np.float32)
    states = [np.zeros((1, 2))] * 4
    bw_exp = steps_reference(aux[::-1], states[2], states[3], p_bw)[0][::-1]
    fo, bo = run_op(O.BIDIRECTIONAL_SEQUENCE_LSTM,
                    bidi_inputs(xs, p_fw, p_bw, states, aux=aux), [output(F32)] * 2)
    np.testing.assert_allclose(bo, bw_exp, atol=3e-6)


def test_bidirectional_lstm_rejects_merge_output_count_mismatch():
    p = make_lstm_weights(3, 2, 2)
    xs = np.zeros((2, 1, 3), np.float32)
    states = [np.zeros((1, 2))] * 4
    with pytest.raises(OpError):
        run_op(O.BIDIRECTIONAL_SEQUENCE_LSTM, bidi_inputs(xs, p, p, states, merge=True),
               [output(F32)] * 2)


# ---- RNN family -------------------------------------------------------------------------------

def test_rnn_hand_computed():
    # out = relu(x W^T + h R^T + b)
    x = [[1.0, 2.0]]
    w = [[1.0, 0.0], [0.5, -1.0]]
    r = [[2.0, 0.0], [0.0, 1.0]]
    b = [0.5, 0.0]
    h = [[1.0, 3.0]]
    ins = [tensor(F32, x), tensor(F32, w), tensor(F32, r), tensor(F32, b), tensor(F32, h),
           tensor(T.INT32, 1)]
    state, out = run_op(O.RNN, ins, [output(F32, [1, 2]), output(F32, [1, 2])])
    # unit 0: 1 + 2 + 0.5 = 3.5; unit 1: 0.5 - 2 + 3 = 1.5
    np.testing.assert_allclose(out, [[3.5, 1.5]])
    np.testing.assert_array_equal(state, out)
    ins[5] = tensor(T.INT32, 3)  # RELU6 does not clip here; check RELU1 instead
    ins[5] = tensor(T.INT32, 2)
    _, out1 = run_op(O.RNN, ins, [output(F32), output(F32)])
    np.testing.assert_allclose(out1, [[1.0, 1.0]])


def test_rnn_rejects_mismatched_bias_and_zero_batch_works():
    w = np.eye(2, dtype=np.float32)
    ins = [tensor(F32, np.zeros((0, 2))), tensor(F32, w), tensor(F32, w),
           tensor(F32, [0.0, 0.0]), tensor(F32, np.zeros((0, 2))), tensor(T.INT32, 0)]
    state, out = run_op(O.RNN, ins, [output(F32), output(F32)])
    assert out.shape == (0, 2)
    ins[3] = tensor(F32, [0.0, 0.0, 0.0])
    with pytest.raises(OpError):
        run_op(O.RNN, ins, [output(F32), output(F32)])


def test_unidirectional_rnn_accumulates_over_time():
    # Identity weights, no activation: state_t = x_t + state_{t-1}.
    eye = np.eye(2, dtype=np.float32)
    xs = np.array([[[1.0, 2.0]], [[3.0, 4.0]], [[5.0, 6.0]]], np.float32)  # time-major
    ins = [tensor(F32, xs), tensor(F32, eye), tensor(F32, eye), tensor(F32, [0.0, 0.0]),
           tensor(F32, [[10.0, 20.0]]), tensor(T.INT32, 0), tensor(T.INT32, 1)]
    out, h = run_op(O.UNIDIRECTIONAL_SEQUENCE_RNN, ins, [output(F32), output(F32)])
    np.testing.assert_allclose(out[:, 0], [[11, 22], [14, 26], [19, 32]])
    np.testing.assert_allclose(h, [[19, 32]])
    ins[0] = tensor(F32, np.swapaxes(xs, 0, 1).copy())
    ins[6] = tensor(T.INT32, 0)
    (out_bm,) = run_op(O.UNIDIRECTIONAL_SEQUENCE_RNN, ins, [output(F32)])
    np.testing.assert_allclose(out_bm[0], [[11, 22], [14, 26], [19, 32]])
    ins[6] = tensor(T.INT32, 2)
    with pytest.raises(OpError):
        run_op(O.UNIDIRECTIONAL_SEQUENCE_RNN, ins, [output(F32)])


def test_bidirectional_rnn_backward_runs_reversed_and_merges():
    eye = np.eye(1, dtype=np.float32)
    xs = np.array([[[1.0]], [[2.0]], [[4.0]]], np.float32)  # [time, batch, 1]
    zero = tensor(F32, [[0.0]])
    ins = [tensor(F32, xs), tensor(F32, eye), tensor(F32, eye), tensor(F32, [0.0]), zero,
           tensor(F32, eye), tensor(F32, eye), tensor(F32, [0.0]), zero,
           omitted(F32), omitted(F32), omitted(F32), tensor(T.INT32, 0),
           tensor(T.BOOL, True), tensor(T.BOOL, False)]
    fo, bo, fh, bh = run_op(O.BIDIRECTIONAL_SEQUENCE_RNN, ins, [output(F32)] * 4)
    np.testing.assert_allclose(fo[:, 0, 0], [1, 3, 7])  # running sums forwards
    np.testing.assert_allclose(bo[:, 0, 0], [7, 6, 4])  # running sums backwards
    np.testing.assert_allclose(fh, [[7]])
    np.testing.assert_allclose(bh, [[7]])
    ins[14] = tensor(T.BOOL, True)
    (merged,) = run_op(O.BIDIRECTIONAL_SEQUENCE_RNN, ins, [output(F32)])
    np.testing.assert_allclose(merged[:, 0], [[1, 7], [3, 6], [7, 4]])
    # Parallel linking: the aux input replaces the backward cell's input.
    ins[14] = tensor(T.BOOL, False)
    ins[9] = tensor(F32, np.array([[[1.0]], [[1.0]], [[1.0]]], np.float32))
    _, bo2 = run_op(O.BIDIRECTIONAL_SEQUENCE_RNN, ins, [output(F32)] * 2)
    np.testing.assert_allclose(bo2[:, 0, 0], [3, 2, 1])


# ---- SVDF ---------------------------------------------------------------------------------------

def test_svdf_hand_computed_rank1():
    # One unit, rank 1, memory 3, input 2. State holds the 3 newest feature activations.
    x = [[1.0, 2.0]]
    wf = [[1.0, 1.0]]          # feature activation = 3
    wt = [[0.5, 1.0, 2.0]]     # oldest .. newest weights
    state = [[10.0, 20.0, 99.0]]  # the last slot is overwritten by the new activation
    ins = [tensor(F32, x), tensor(F32, wf), tensor(F32, wt), tensor(F32, [1.0]),
           tensor(F32, state), tensor(T.INT32, 1), tensor(T.INT32, 0)]
    new_state, out = run_op(O.SVDF, ins, [output(F32, [1, 3]), output(F32, [1, 1])])
    # 0.5 * 10 + 1 * 20 + 2 * 3 + bias 1 = 32
    np.testing.assert_allclose(out, [[32.0]])
    np.testing.assert_allclose(new_state, [[20.0, 3.0, 0.0]])
    ins[3] = omitted(F32)
    ins[6] = tensor(T.INT32, 3)  # RELU6
    _, out6 = run_op(O.SVDF, ins, [output(F32), output(F32)])
    np.testing.assert_allclose(out6, [[6.0]])


def test_svdf_rank2_sums_filters_and_rejects_bad_rank():
    x = [[1.0]]
    wf = [[1.0], [2.0]]        # two filters -> one unit at rank 2
    wt = [[1.0, 1.0], [1.0, 1.0]]
    state = np.zeros((1, 4), np.float32)
    ins = [tensor(F32, x), tensor(F32, wf), tensor(F32, wt), omitted(F32), tensor(F32, state),
           tensor(T.INT32, 2), tensor(T.INT32, 0)]
    _, out = run_op(O.SVDF, ins, [output(F32), output(F32)])
    np.testing.assert_allclose(out, [[3.0]])
    ins[5] = tensor(T.INT32, 3)
    with pytest.raises(OpError):
        run_op(O.SVDF, ins, [output(F32), output(F32)])


# ---- LSH_PROJECTION -----------------------------------------------------------------------------

@pytest.mark.parametrize(("data", "expected"), [
    (b"", 11160318154034397263),
    (b"ab", 12289600257749001502),
    (b"foo", 6150913649986995171),
    (b"hello", 13009744463427800296),
    (b"0123456789ab", 15957476140307106883),
    (bytes(range(20)), 10220892904819695849),
    (bytes(range(40)), 645241335607543436),
    (bytes(range(100)), 4395248839964844437),
    (bytes(range(200)), 525935771297148851),
    (b"a" * 128, (-4747627967806356490) % 2**64),
])
def test_fingerprint64_published_values(data, expected):
    keys = np.frombuffer(data, np.uint8).reshape(1, len(data))
    assert int(fingerprint64(keys)[0]) == expected


def lsh(kind, hashes, x, weight, out_len):
    return run_op(O.LSH_PROJECTION,
                  [tensor(F32, hashes, const=True), tensor(T.TENSOR_INT32, x),
                   tensor(F32, weight) if weight is not None else omitted(F32),
                   tensor(T.INT32, kind)],
                  [output(T.TENSOR_INT32, [out_len])])[0]


def test_lsh_sparse_offsets_and_dense_bits():
    hashes = np.array([[0.123, 0.456], [-0.321, -0.654], [1.234, 5.678]], np.float32)
    x = [[12345, 54321], [67890, 9876]]
    old = lsh(1, hashes, x, None, 3)
    new = lsh(3, hashes, x, None, 3)
    # SPARSE adds k << num_bits to hash function k's signature.
    np.testing.assert_array_equal(new - old, [0, 4, 8])
    assert np.all((old >= 0) & (old < 4))
    dense = lsh(2, hashes, x, [1.0, 1.0], 6)
    assert set(np.unique(dense)) <= {0, 1}
    # Unit weights give the same sign as no weights, so dense bits spell the signatures.
    np.testing.assert_array_equal(dense.reshape(3, 2) @ [2, 1], old)


def test_lsh_rejects_dense_without_weight_and_bad_type():
    hashes = np.zeros((2, 2), np.float32)
    with pytest.raises(OpError):
        lsh(2, hashes, [[1, 2]], None, 4)
    with pytest.raises(OpError):
        lsh(4, hashes, [[1, 2]], None, 2)
    with pytest.raises(OpError):  # 31 bits + ceil(log2(4)) > 32 for SPARSE
        lsh(3, np.zeros((4, 31), np.float32), [[1, 2]], None, 4)


# ---- 16-bit fixed point -------------------------------------------------------------------------

def test_fixedpoint_logistic_and_tanh_track_float():
    raw = np.arange(-32768, 32768, 7, dtype=np.int64)
    real = raw / 2**12  # Q3.12
    lg = FP.logistic16(raw, 3) / 2**15
    th = FP.tanh16(raw, 3) / 2**15
    assert np.max(np.abs(lg - sig(real))) < 5e-4
    assert np.max(np.abs(th - np.tanh(real))) < 5e-4
    assert FP.logistic16(np.array([0]), 3)[0] == 16384
    assert FP.tanh16(np.array([0]), 3)[0] == 0
    assert FP.srdhm16(np.array([-32768]), -32768)[0] == 32767


# ---- integer LSTMs ------------------------------------------------------------------------------

U8, Q16 = T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT16_SYMM


def q16bit_inputs(x, prev_out, prev_cell, w_zp=128, in_scale=1 / 128):
    n_out, n_in = prev_out.shape[1], x.shape[1]
    ws, bs = 0.01, 0.01 / 128
    ins = [tensor(U8, x, in_scale, 128)]
    ins += [tensor(U8, np.full((n_out, n_in), w_zp), ws, w_zp) for _ in range(4)]
    ins += [tensor(U8, np.full((n_out, n_out), w_zp), ws, w_zp) for _ in range(4)]
    ins += [tensor(T.TENSOR_INT32, np.zeros(n_out), bs, 0) for _ in range(4)]
    ins += [tensor(Q16, prev_cell, 2**-11, 0), tensor(U8, prev_out, 1 / 128, 128)]
    return ins


def test_quantized_16bit_lstm_zero_weights():
    # Zero weights: i = f = o = 0.5 and g = 0, so c' = c / 2 and h' = 0.5 * tanh(c').
    x = np.array([[200, 30]], np.uint8)
    prev_cell = np.array([[2048, -4096]], np.int16)  # 1.0 and -2.0 in Q4.11
    prev_out = np.array([[128, 128]], np.uint8)
    cell, out = run_op(O.QUANTIZED_16BIT_LSTM, q16bit_inputs(x, prev_out, prev_cell),
                       [output(Q16, [1, 2], 2**-11, 0), output(U8, [1, 2], 1 / 128, 128)])
    np.testing.assert_array_equal(cell, [[1024, -2048]])
    expected = 128 + np.round(0.5 * np.tanh([0.5, -1.0]) * 128)
    np.testing.assert_allclose(out[0], expected, atol=1)
    assert out.dtype == np.uint8 and cell.dtype == np.int16


def test_quantized_16bit_lstm_rejects_wrong_input_scale():
    x = np.zeros((1, 2), np.uint8)
    ins = q16bit_inputs(x, np.zeros((1, 2), np.uint8), np.zeros((1, 2), np.int16),
                        in_scale=1 / 64)
    with pytest.raises(OpError):
        run_op(O.QUANTIZED_16BIT_LSTM, ins, [output(Q16), output(U8)])


S8, W8 = T.TENSOR_QUANT8_ASYMM_SIGNED, T.TENSOR_QUANT8_SYMM


def qlstm_inputs(prev_cell, *, omit_forget=False):
    n = prev_cell.shape[1]
    ins = [tensor(S8, np.zeros((1, 2)), 0.01, 0)]
    ins += [omitted(W8)]  # CIFG
    ins += [tensor(W8, np.zeros((n, 2)), 0.01, 0) for _ in range(3)]
    ins += [omitted(W8)]
    ins += [tensor(W8, np.zeros((n, n)), 0.01, 0) for _ in range(3)]
    ins += [omitted(Q16)] * 3
    ins += [omitted(T.TENSOR_INT32)] + [tensor(T.TENSOR_INT32, np.zeros(n)) for _ in range(3)]
    ins += [omitted(W8), omitted(T.TENSOR_INT32)]
    ins += [tensor(S8, np.zeros((1, n)), 2**-7, 0), tensor(Q16, prev_cell, 2**-12, 0)]
    ins += [omitted(Q16)] * 4
    ins += [tensor(T.FLOAT32, v) for v in (0.0, 0.0, 0.01, 0.01, 0.01, 0.01)]
    ins += [tensor(T.INT32, 0), tensor(T.FLOAT32, 2**-7)]
    if omit_forget:
        ins[2] = omitted(W8)
    return ins


def test_quantized_lstm_cifg_halves_cell_with_zero_weights():
    # Zero weights: f = 0.5 (16384 in Q0.15), g = 0 and CIFG i = 1 - f, so c' = c / 2.
    prev_cell = np.array([[1000, -1000, 4096]], np.int16)
    outs = [output(S8, [1, 3], 2**-7, 0), output(Q16, [1, 3], 2**-12, 0),
            output(S8, [1, 3], 2**-7, 0)]
    h, c, out = run_op(O.QUANTIZED_LSTM, qlstm_inputs(prev_cell), outs)
    np.testing.assert_array_equal(c, [[500, -500, 2048]])
    np.testing.assert_array_equal(h, out)
    # h = 0.5 * tanh(c) in units of 2^-7 (cell scale 2^-12: 2048 is 0.5).
    np.testing.assert_allclose(h[0], np.round(0.5 * np.tanh(np.array([500, -500, 2048]) / 4096)
                                              * 128), atol=1)


def test_quantized_lstm_rejects_omitted_required_input():
    with pytest.raises(OpError):
        run_op(O.QUANTIZED_LSTM, qlstm_inputs(np.zeros((1, 3), np.int16), omit_forget=True),
               [output(S8), output(Q16), output(S8)])


# ---- signatures: what may be omitted, counts the signature cannot express ---------------------

def _positions(*groups):
    return frozenset(k for g in groups for k in ([g] if isinstance(g, int) else g))


_CELL_OPTIONAL = (1, 5, 9, 10, 11, 12, 16, 17)  # CIFG, peephole, input gate bias, projection


@pytest.mark.parametrize(("op", "count", "expected"), [
    (O.LSTM, 23, _positions(_CELL_OPTIONAL)),
    (O.LSTM, 27, _positions(_CELL_OPTIONAL, range(23, 27))),
    (O.UNIDIRECTIONAL_SEQUENCE_LSTM, 28, _positions(_CELL_OPTIONAL, range(24, 28))),
    (O.BIDIRECTIONAL_SEQUENCE_LSTM, 61,
     _positions(_CELL_OPTIONAL, [k + 17 for k in _CELL_OPTIONAL], range(39, 48), range(53, 61))),
    (O.RNN, 6, frozenset()),
    (O.UNIDIRECTIONAL_SEQUENCE_RNN, 7, frozenset()),
    (O.BIDIRECTIONAL_SEQUENCE_RNN, 15, _positions(9, 10, 11)),
    (O.SVDF, 7, _positions(3)),
    (O.LSH_PROJECTION, 4, _positions(2)),
    (O.QUANTIZED_16BIT_LSTM, 15, frozenset()),
    (O.QUANTIZED_LSTM, 32, _positions(_CELL_OPTIONAL, range(20, 26))),
])
def test_omittable_inputs_are_the_hal_optional_ones(op, count, expected):
    from nnhal.ops.catalog import SIGNATURES
    from nnhal.ops.signature import omittable_positions
    assert omittable_positions(SIGNATURES[op], count) == expected


def test_lstm_takes_23_or_27_inputs_only():
    p = make_lstm_weights(2, 3, 3)
    ins = [tensor(F32, np.zeros((1, 2)))] + lstm_weight_operands(p)
    ins += [tensor(F32, np.zeros((1, 3))), tensor(F32, np.zeros((1, 3))), tensor(T.INT32, 4),
            tensor(T.FLOAT32, 0.0), tensor(T.FLOAT32, 0.0)]
    with pytest.raises(OpError, match="expected 23 or 27 inputs, got 24"):
        run_op(O.LSTM, ins + [omitted(F32)], [output(F32)] * 4)
    # All four layer norm weights omitted: the plain LSTM.
    _, h, _, _ = run_op(O.LSTM, ins + [omitted(F32)] * 4, [output(F32)] * 4)
    assert h.shape == (1, 3)


def test_sequence_lstm_state_outputs_come_together():
    p = make_lstm_weights(3, 2, 2)
    xs = np.zeros((2, 1, 3), np.float32)
    h0 = c0 = np.zeros((1, 2), np.float32)
    uni = [tensor(F32, xs)] + lstm_weight_operands(p)
    uni += [tensor(F32, h0), tensor(F32, c0), tensor(T.INT32, 4), tensor(T.FLOAT32, 0.0),
            tensor(T.FLOAT32, 0.0), tensor(T.BOOL, True)] + ln_operands(p)
    with pytest.raises(OpError, match="got 2"):
        run_op(O.UNIDIRECTIONAL_SEQUENCE_LSTM, uni, [output(F32)] * 2)
    with pytest.raises(OpError, match="got 3"):
        run_op(O.BIDIRECTIONAL_SEQUENCE_LSTM, bidi_inputs(xs, p, p, [h0] * 4), [output(F32)] * 3)


def test_sequence_lstm_rejects_omitted_time_major():
    p = make_lstm_weights(3, 2, 2)
    ins = [tensor(F32, np.zeros((2, 1, 3)))] + lstm_weight_operands(p)
    ins += [tensor(F32, np.zeros((1, 2))), tensor(F32, np.zeros((1, 2))), tensor(T.INT32, 4),
            tensor(T.FLOAT32, 0.0), tensor(T.FLOAT32, 0.0), omitted(T.BOOL)] + ln_operands(p)
    with pytest.raises(OpError, match=r"input 23 \(time_major\) cannot be omitted"):
        run_op(O.UNIDIRECTIONAL_SEQUENCE_LSTM, ins, [output(F32)])


def test_quantized_lstm_omitted_clips_mean_no_clipping():
    prev_cell = np.array([[1000, -1000, 4096]], np.int16)
    outs = [output(S8, [1, 3], 2**-7, 0), output(Q16, [1, 3], 2**-12, 0),
            output(S8, [1, 3], 2**-7, 0)]
    ins = qlstm_inputs(prev_cell)
    ins[24], ins[25] = omitted(T.FLOAT32), omitted(T.FLOAT32)
    _, c, _ = run_op(O.QUANTIZED_LSTM, ins, outs)
    np.testing.assert_array_equal(c, [[500, -500, 2048]])


def test_model_input_without_value_at_run_time():
    """A request may leave a model input without a value: fine where the signature lets the
    slot be omitted, an OpError where it does not."""
    def given_later(t, shape):
        info, _ = tensor(t, np.zeros(shape, t.dtype))
        return info, None  # a model input the request leaves without a value

    x, wf, wt = [[1.0, 2.0]], [[1.0, 1.0]], [[0.5, 1.0, 2.0]]
    ins = [tensor(F32, x), tensor(F32, wf), tensor(F32, wt), given_later(F32, (1,)),
           tensor(F32, [[10.0, 20.0, 99.0]]), tensor(T.INT32, 1), tensor(T.INT32, 0)]
    _, out = run_op(O.SVDF, ins, [output(F32), output(F32)])
    np.testing.assert_allclose(out, [[31.0]])  # no bias
    ins[2] = given_later(F32, (1, 3))
    with pytest.raises(OpError, match="required input 2 has no value"):
        run_op(O.SVDF, ins, [output(F32), output(F32)])
