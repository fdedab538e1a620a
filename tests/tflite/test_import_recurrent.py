"""Recurrent builtins (RNN, UNIDIRECTIONAL_SEQUENCE_RNN, SVDF, LSTM,
UNIDIRECTIONAL_SEQUENCE_LSTM): their variable tensors become state inputs / outputs, and
three invocations in a row agree with ai-edge-litert (which keeps the state itself)."""

from __future__ import annotations

import numpy as np
import pytest
from runner import Reference, litert, litert_run, max_error, tolerance
from tfl import Graph, build

from nnhal.tflite import read_tflite

pytest.importorskip("ai_edge_litert.interpreter")

F = np.float32
R = np.random.default_rng(5)


def w(*shape: int) -> np.ndarray:
    return R.normal(0, 0.4, shape).astype(F)


def rnn() -> bytes:
    g = Graph()
    x = g.input((2, 3), name="x")
    h = g.variable((2, 4), name="hidden")
    y = g.tensor((2, 4), F, name="y")
    g.op("RNN", [x, g.const(w(4, 3)), g.const(w(4, 4)), g.const(w(4)), h], [y],
         ("RNNOptions", dict(FusedActivationFunction=1)))
    g.output(y)
    return build(g)


def seq_rnn(time_major: bool, act: int) -> bytes:
    g = Graph()
    shape = (5, 2, 3) if time_major else (2, 5, 3)
    x = g.input(shape, name="x")
    h = g.variable((2, 4), name="hidden")
    y = g.tensor(shape[:2] + (4,), F, name="y")
    g.op("UNIDIRECTIONAL_SEQUENCE_RNN", [x, g.const(w(4, 3)), g.const(w(4, 4)),
                                         g.const(w(4)), h], [y],
         ("SequenceRNNOptions", dict(TimeMajor=time_major, FusedActivationFunction=act)))
    g.output(y)
    return build(g)


def svdf() -> bytes:
    g = Graph()
    x = g.input((2, 3), name="x")
    rank, units, memory = 2, 3, 4
    filters = rank * units
    state = g.variable((2, filters * memory), name="svdf_state")
    y = g.tensor((2, units), F, name="y")
    g.op("SVDF", [x, g.const(w(filters, 3)), g.const(w(filters, memory)), g.const(w(units)),
                  state], [y], ("SVDFOptions", dict(Rank=rank, FusedActivationFunction=1)))
    g.output(y)
    return build(g)


def lstm(name: str, peephole: bool, projection: bool, layer_norm: bool) -> bytes:
    g = Graph()
    batch, n_in, units, n_out, steps = 2, 3, 4, 3 if projection else 4, 3
    seq = name == "UNIDIRECTIONAL_SEQUENCE_LSTM"
    x = g.input((batch, steps, n_in) if seq else (batch, n_in), name="x")
    ins = [x]
    ins += [g.const(w(units, n_in)) for _ in range(4)]
    ins += [g.const(w(units, n_out)) for _ in range(4)]
    ins += [g.const(w(units)) if peephole else -1 for _ in range(3)]
    ins += [g.const(w(units)) for _ in range(4)]
    ins += [g.const(w(n_out, units)), g.const(w(n_out))] if projection else [-1, -1]
    ins += [g.variable((batch, n_out), name="output_state"),
            g.variable((batch, units), name="cell_state")]
    if layer_norm:
        ins += [g.const(w(units) + 1) for _ in range(4)]
    y = g.tensor((batch, steps, n_out) if seq else (batch, n_out), F, name="y")
    fields = dict(FusedActivationFunction=4, CellClip=3.0, ProjClip=2.0 if projection else 0.0)
    if seq:
        g.op(name, ins, [y], ("UnidirectionalSequenceLSTMOptions", dict(fields, TimeMajor=False)))
    else:
        g.op(name, ins, [y], ("LSTMOptions", fields))
    g.output(y)
    return build(g)


def bi_rnn(merge: bool) -> bytes:
    g = Graph()
    x = g.input((2, 5, 3), name="x")
    ins = [x]
    for side in ("fw", "bw"):
        ins += [g.const(w(4, 3)), g.const(w(4, 4)), g.const(w(4)),
                g.variable((2, 4), name=f"{side}_hidden")]
    ins += [-1, -1, -1]  # no auxiliary input
    outs = ([g.tensor((2, 5, 8), F, name="y")] if merge else
            [g.tensor((2, 5, 4), F, name="y"), g.tensor((2, 5, 4), F, name="y_bw")])
    g.op("BIDIRECTIONAL_SEQUENCE_RNN", ins, outs,
         ("BidirectionalSequenceRNNOptions", dict(TimeMajor=False, MergeOutputs=merge,
                                                  FusedActivationFunction=1)))
    g.output(*outs)
    return build(g)


CASES = {
    "bi_rnn_merged": lambda: bi_rnn(True),
    "bi_rnn_split": lambda: bi_rnn(False),
    "rnn": rnn,
    "seq_rnn_batch_major": lambda: seq_rnn(False, 0),
    "seq_rnn_time_major_relu6": lambda: seq_rnn(True, 3),
    "svdf": svdf,
    "lstm": lambda: lstm("LSTM", False, False, False),
    "lstm_peephole_projection": lambda: lstm("LSTM", True, True, False),
    "lstm_layer_norm": lambda: lstm("LSTM", False, False, True),
    "seq_lstm": lambda: lstm("UNIDIRECTIONAL_SEQUENCE_LSTM", False, False, False),
    "seq_lstm_peephole_projection": lambda: lstm("UNIDIRECTIONAL_SEQUENCE_LSTM", True, True,
                                                 False),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_recurrent_builtin_agrees_with_litert_over_three_runs(case: str) -> None:
    global R
    R = np.random.default_rng(sorted(CASES).index(case))  # weights independent of test order
    data = CASES[case]()
    imported = read_tflite(data)
    assert imported.state and imported.input_names[0] == "x"
    n_out = len(imported.output_names) - len(imported.state)
    it = litert(data)
    ref = Reference(imported)
    state = [s.initial for s in imported.state]
    rng = np.random.default_rng(0)
    try:
        for run in range(3):
            d = it.get_input_details()[0]
            x = rng.normal(size=d["shape"]).astype(F)
            expected = litert_run(it, [x])
            got = ref.run([x] + state)
            state = got[n_out:]
            for g_, e in zip(got[:n_out], expected):
                assert g_.shape == e.shape
                assert max_error(g_, e) <= tolerance(e), f"run {run}"
    finally:
        ref.close()
    assert any(np.any(s != 0) for s in state)
