"""Converters of the recurrent operations. TFLite's kernels update their state in place
(variable tensors) where the HAL passes it in and out as operands: a state that is a model
input becomes the variable, and the state outputs are copies of it after the operator."""

from __future__ import annotations

import numpy as np
import tflite
from tflite.TensorType import TensorType as TT

from nnhal.hal.types import OperandLifeTime
from nnhal.tflite.export_context import Converter, ExportOpContext, Unexportable, fused_act

BO = tflite.BuiltinOperator
RNN_CONVERTERS: dict[str, Converter] = {}


def _stateful(cx: ExportOpContext) -> None:
    raise Unexportable("not exported yet: its 61 operands (four states, auxiliary inputs) are "
                       "not mapped onto TFLite's 48")


def _states(cx: ExportOpContext, inputs: list[int]) -> list[int]:
    """TFLite's recurrent kernels update their state in place (variable tensors); the HAL
    passes it in as an operand. A state that is a model input becomes such a variable."""
    out = []
    for j in inputs:
        if cx.info(j).lifetime != OperandLifeTime.SUBGRAPH_INPUT:
            raise Unexportable(f"its state (input {j}) is not a model input, and TFLite keeps the "
                               f"state in a variable tensor")
        t = cx.t(j)
        cx.w.sg.tensors[t].is_variable = True
        out.append(t)
    return out


def _state_out(cx: ExportOpContext, state: int, k: int) -> None:
    """HAL output ``k`` is the state after the operation: a copy of the variable tensor."""
    if k < len(cx.outs):
        shape = cx.out_shape(k)
        cx.emit(BO.RESHAPE, [state, cx.ints(shape)], [cx.o(k)], "ReshapeOptions",
                NewShape=shape)


def _rnn(cx: ExportOpContext) -> None:
    (state,) = _states(cx, [4])
    out = cx.o(1)
    cx.emit(BO.RNN, [cx.t(0), cx.t(1), cx.t(2), cx.t(3), state], [out], "RNNOptions",
            FusedActivationFunction=fused_act(cx, 5))
    _state_out(cx, state, 0)


def _sequence_rnn(cx: ExportOpContext) -> None:
    (state,) = _states(cx, [4])
    cx.emit(BO.UNIDIRECTIONAL_SEQUENCE_RNN, [cx.t(0), cx.t(1), cx.t(2), cx.t(3), state],
            [cx.o(0)], "SequenceRNNOptions", FusedActivationFunction=fused_act(cx, 5),
            TimeMajor=bool(cx.scalar(6)))
    _state_out(cx, state, 1)


def _bidirectional_rnn(cx: ExportOpContext) -> None:
    fw, bw = _states(cx, [4, 8])
    merged = bool(cx.scalar(14))
    outputs = 1 if merged else 2
    ins = [cx.t(j) for j in range(4)] + [fw] + [cx.t(j) for j in range(5, 8)] + [bw]
    ins += [cx.t(j) for j in range(9, 12)]
    cx.emit(BO.BIDIRECTIONAL_SEQUENCE_RNN, ins, [cx.o(k) for k in range(outputs)],
            "BidirectionalSequenceRNNOptions", TimeMajor=bool(cx.scalar(13)),
            FusedActivationFunction=fused_act(cx, 12), MergeOutputs=merged)
    _state_out(cx, fw, outputs)
    _state_out(cx, bw, outputs + 1)


def _svdf(cx: ExportOpContext) -> None:
    (state,) = _states(cx, [4])
    cx.emit(BO.SVDF, [cx.t(0), cx.t(1), cx.t(2), cx.t(3), state], [cx.o(1)], "SVDFOptions",
            Rank=cx.scalar(5), FusedActivationFunction=fused_act(cx, 6))
    _state_out(cx, state, 0)


def _lstmact(cx: ExportOpContext, j: int) -> int:
    """The LSTM activation is already TFLite's ActivationFunctionType (4 = tanh), not a
    FuseCode; the HAL's 6 (sigmoid) has no TFLite value."""
    v = cx.scalar(j)
    if v not in (0, 1, 2, 3, 4):
        raise Unexportable(f"LSTM activation {v} has no TFLite equivalent")
    return int(v)


def _lstm_inputs(cx: ExportOpContext, norms: int) -> list[int]:
    """The 24 TFLite LSTM inputs: the HAL's first 20 (same order), then the layer norms."""
    out_state, cell_state = _states(cx, [18, 19])
    ins = [cx.t(j) for j in range(18)] + [out_state, cell_state]
    return ins + [cx.t(j) if cx.present(j) else -1 for j in range(norms, norms + 4)]


def _lstm(cx: ExportOpContext) -> None:
    ins = _lstm_inputs(cx, 23)
    cx.emit(BO.LSTM, ins, [cx.o(3)], "LSTMOptions", FusedActivationFunction=_lstmact(cx, 20),
            CellClip=float(cx.scalar(21)), ProjClip=float(cx.scalar(22)), KernelType=0)
    # The scratch buffer's contents are the driver's own: zeros here.
    cx.emit(BO.FILL, [cx.ints(cx.out_shape(0)), cx.w.constant(np.float32(0), None,
                                                                f"z{len(cx.w.sg.tensors)}",
                                                                TT.FLOAT32)], [cx.o(0)])
    _state_out(cx, ins[18], 1)
    _state_out(cx, ins[19], 2)


def _sequence_lstm(cx: ExportOpContext) -> None:
    ins = _lstm_inputs(cx, 24)
    cx.emit(BO.UNIDIRECTIONAL_SEQUENCE_LSTM, ins, [cx.o(0)],
            "UnidirectionalSequenceLSTMOptions", FusedActivationFunction=_lstmact(cx, 20),
            CellClip=float(cx.scalar(21)), ProjClip=float(cx.scalar(22)),
            TimeMajor=bool(cx.scalar(23)))
    _state_out(cx, ins[18], 1)
    _state_out(cx, ins[19], 2)


RNN_CONVERTERS.update(RNN=_rnn, UNIDIRECTIONAL_SEQUENCE_RNN=_sequence_rnn, SVDF=_svdf,
                  BIDIRECTIONAL_SEQUENCE_RNN=_bidirectional_rnn,
                  LSTM=_lstm, UNIDIRECTIONAL_SEQUENCE_LSTM=_sequence_lstm)
for _name in ("BIDIRECTIONAL_SEQUENCE_LSTM",):
    RNN_CONVERTERS[_name] = _stateful
