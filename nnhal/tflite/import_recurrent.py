"""Converters of the recurrent builtins (RNN, SVDF, LSTM and their sequence forms): TFLite's
variable tensors, the state these operators keep between invocations, become extra model
inputs and outputs through :meth:`Context.state_in` / :meth:`Context.state_out`."""

from __future__ import annotations

from tflite.TensorType import TensorType as TT

from nnhal.hal.types import OperandType, OperationType
from nnhal.tflite import schema
from nnhal.tflite.import_ctx import Context, Unimportable
from nnhal.tflite.import_ops import _conv
from nnhal.tflite.import_read import OpInfo

T = OperandType
O = OperationType


# ---- recurrent: TFLite variable tensors become state inputs / outputs --------------------------

def _fuse_code(act: int) -> int:
    if act not in schema.ACTIVATIONS:
        raise Unimportable(f"activation {act} is not a HAL FuseCode (TANH / SIGN_BIT)")
    return schema.ACTIVATIONS[act]


def _float_only(ctx: Context, op: OpInfo) -> None:
    if ctx.t(op.inputs[0]).ttype != TT.FLOAT32 or any(
            ctx.t(i).ttype not in (TT.FLOAT32,) for i in op.inputs[1:] if i >= 0):
        raise Unimportable("hybrid or quantized recurrent weights have no HAL equivalent")


@_conv("RNN", "RNN (FuseCode activations; hidden state as model state)")
def _rnn(ctx: Context, op: OpInfo) -> None:
    _float_only(ctx, op)
    code = _fuse_code(ctx.options("RNNOptions").FusedActivationFunction())
    x, wi, wr, b, h = op.inputs[:5]
    ins = [ctx.x(x), ctx.x(wi), ctx.x(wr), ctx.x(b), ctx.state_in(h), ctx.i32(code)]
    ctx.emit(O.RNN, ins, [ctx.state_out(h), ctx.y(op.outputs[0])])


@_conv("UNIDIRECTIONAL_SEQUENCE_RNN", "UNIDIRECTIONAL_SEQUENCE_RNN (time_major; FuseCode "
       "activations)")
def _seq_rnn(ctx: Context, op: OpInfo) -> None:
    _float_only(ctx, op)
    o = ctx.options("SequenceRNNOptions")
    code = _fuse_code(o.FusedActivationFunction())
    x, wi, wr, b, h = op.inputs[:5]
    ins = [ctx.x(x), ctx.x(wi), ctx.x(wr), ctx.x(b), ctx.state_in(h), ctx.i32(code),
           ctx.i32(int(o.TimeMajor()))]
    ctx.emit(O.UNIDIRECTIONAL_SEQUENCE_RNN, ins, [ctx.y(op.outputs[0]), ctx.state_out(h)])


@_conv("SVDF", "SVDF (rank; FuseCode activations; activation state as model state)")
def _svdf(ctx: Context, op: OpInfo) -> None:
    _float_only(ctx, op)
    o = ctx.options("SVDFOptions")
    x, wf, wt, b, state = op.inputs[:5]
    ins = [ctx.x(x), ctx.x(wf), ctx.x(wt), ctx.omitted_like(b, x), ctx.state_in(state),
           ctx.i32(o.Rank()), ctx.i32(_fuse_code(o.FusedActivationFunction()))]
    ctx.emit(O.SVDF, ins, [ctx.state_out(state), ctx.y(op.outputs[0])])


@_conv("BIDIRECTIONAL_SEQUENCE_RNN", "BIDIRECTIONAL_SEQUENCE_RNN (merge_outputs, time_major, "
       "aux input; both hidden states as model state)")
def _bi_rnn(ctx: Context, op: OpInfo) -> None:
    _float_only(ctx, op)
    o = ctx.options("BidirectionalSequenceRNNOptions")
    code = _fuse_code(o.FusedActivationFunction())
    x = op.inputs[0]
    ins_ = list(op.inputs) + [-1] * (12 - len(op.inputs))
    fw_h, bw_h = ins_[4], ins_[8]
    ins = [ctx.x(i) for i in ins_[:4]] + [ctx.state_in(fw_h)]
    ins += [ctx.x(i) for i in ins_[5:8]] + [ctx.state_in(bw_h)]
    ins += [ctx.omitted_like(i, x) for i in ins_[9:12]]
    ins += [ctx.i32(code), ctx.bool_(bool(o.TimeMajor())), ctx.bool_(bool(o.MergeOutputs()))]
    outs = [ctx.y(i) for i in op.outputs]
    ctx.emit(O.BIDIRECTIONAL_SEQUENCE_RNN, ins, outs + [ctx.state_out(fw_h),
                                                        ctx.state_out(bw_h)])


_LSTM_ACTIVATIONS = {0, 1, 3, 4, 6}


def _lstm_inputs(ctx: Context, op: OpInfo, o: object) -> tuple[list[int], int, int]:
    """HAL inputs 0..22 of an LSTM; (inputs, output state tensor, cell state tensor)."""
    _float_only(ctx, op)
    if len(op.inputs) not in (20, 24):
        raise Unimportable(f"{len(op.inputs)} inputs (the full LSTM kernel has 20 or 24)")
    act = o.FusedActivationFunction()
    if act not in _LSTM_ACTIVATIONS:
        raise Unimportable(f"activation {act} is not one the HAL LSTM takes")
    x = op.inputs[0]
    ins = [ctx.x(x)] + [ctx.omitted_like(i, x) for i in op.inputs[1:18]]
    h, c = op.inputs[18], op.inputs[19]
    ins += [ctx.state_in(h), ctx.state_in(c), ctx.i32(act),
            ctx.f32(o.CellClip()), ctx.f32(o.ProjClip())]
    return ins, h, c


def _layer_norm(ctx: Context, op: OpInfo) -> list[int]:
    x = op.inputs[0]
    norms = op.inputs[20:24] if len(op.inputs) == 24 else [-1] * 4
    if all(i < 0 for i in norms):
        return []
    return [ctx.omitted_like(i, x) for i in norms]


@_conv("UNIDIRECTIONAL_SEQUENCE_LSTM", "UNIDIRECTIONAL_SEQUENCE_LSTM (float; peephole, "
       "projection, clipping, layer norm; states as model state)")
def _seq_lstm(ctx: Context, op: OpInfo) -> None:
    o = ctx.options("UnidirectionalSequenceLSTMOptions")
    ins, h, c = _lstm_inputs(ctx, op, o)
    norms = _layer_norm(ctx, op) or [ctx.omitted_like(-1, op.inputs[0])] * 4
    ins += [ctx.bool_(bool(o.TimeMajor()))] + norms
    ctx.emit(O.UNIDIRECTIONAL_SEQUENCE_LSTM, ins,
             [ctx.y(op.outputs[0]), ctx.state_out(h), ctx.state_out(c)])


@_conv("LSTM", "LSTM (full kernel, float; states as model state)")
def _lstm(ctx: Context, op: OpInfo) -> None:
    o = ctx.options("LSTMOptions")
    if o.KernelType() != 0:
        raise Unimportable("the basic LSTM kernel has no HAL equivalent")
    ins, h, c = _lstm_inputs(ctx, op, o)
    ins += _layer_norm(ctx, op)
    units = ctx.t(op.inputs[4]).shape[0]
    batch = ctx.t(op.inputs[0]).shape[0]
    gates = 3 if op.inputs[1] < 0 else 4
    scratch = ctx.tmp(T.TENSOR_FLOAT32, [batch, units * gates])
    ctx.emit(O.LSTM, ins, [scratch, ctx.state_out(h), ctx.state_out(c), ctx.y(op.outputs[0])])
