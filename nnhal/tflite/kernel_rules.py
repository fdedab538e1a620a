"""Rules TFLite's kernels check in Prepare that neither the schema nor the HAL states: bounds
on quantization parameters and options, past which TFLite refuses the model (or, for ADD,
aborts on a TFLITE_CHECK) while the HAL would compute something. One check per builtin,
declared once in :data:`RULES` and run by the importer before the operator is converted, so a
file TFLite cannot run is refused here rather than given a result nothing agrees with."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from tflite.TensorType import TensorType as TT

from nnhal.ops.common import quantize_multiplier
from nnhal.tflite.import_ctx import Context, Refuse
from nnhal.tflite.import_read import OpInfo, TensorInfo

_QUANTIZED = (TT.UINT8, TT.INT8, TT.INT16)
#: TFLite's kernels keep strides in int16.
_INT16_MAX = (1 << 15) - 1


def _scale(t: TensorInfo) -> float:
    """TFLite's legacy per-tensor scale (0 when the tensor has none)."""
    return float(t.scales[0]) if t.quantized else 0.0


def _zero_point(t: TensorInfo) -> int:
    return int(t.zero_points[0]) if t.quantized else 0


def _is_power_of_two(scale: float) -> bool:
    """TFLite's CheckedLog2: log2 within 1e-3 of an integer."""
    log2 = float(np.log2(np.float32(scale)))
    return abs(log2 - round(log2)) < 1e-3


def _add(ctx: Context, op: OpInfo) -> None:
    """Quantized ADD rescales the inputs to twice the larger input scale over 2^20 (int16
    off its all-powers-of-two path: 2^15) and asserts that the output multiplier, that
    scale over the output scale, is a fraction (QuantizeMultiplierSmallerThanOneExp: a
    failed TFLITE_CHECK aborts the process); NNAPI's reference ADD fails on the same bound.
    SUB's Prepare takes a multiplier above 1 too, so SUB has no such rule."""
    a, b, out = (ctx.t(i) for i in (*op.inputs[:2], op.outputs[0]))
    if out.ttype not in _QUANTIZED or not all(t.quantized and t.scales.size == 1
                                              for t in (a, b, out)):
        return
    scales = [np.float32(t.scales[0]) for t in (a, b, out)]
    if not all(np.isfinite(s) and s > 0 for s in scales):
        return  # refused as a tensor type (hal_type)
    if out.ttype == TT.INT16:
        pot = op.options is None or bool(op.options.PotScaleInt16())
        if pot and all(_is_power_of_two(float(s)) for s in scales):
            return  # the power-of-two path shifts, with no multiplier
        left_shift = 15
    else:
        left_shift = 20
    twice_max = float(np.float32(2) * max(scales[0], scales[1]))
    real = twice_max / float(np.float32(1 << left_shift) * scales[2])
    if not 0 < real < 1 or quantize_multiplier(real)[1] > 0:
        raise Refuse(f"output multiplier {real:.3g} (2 x larger input scale / (2^{left_shift}"
                     f" x output scale)) is not below 1, which TFLite's kernel asserts")


def _bias_scale(ctx: Context, op: OpInfo) -> None:
    """GetQuantizedConvolutionMultipler: the bias scale must be the input scale times the
    filter scale within 2% of the output scale (a NaN fails too). TFLite checks it for
    every per-tensor quantized FULLY_CONNECTED and, of the convolutions, for uint8 ones."""
    if len(op.inputs) < 3 or op.inputs[2] < 0:
        return
    x, w, bias, out = (ctx.t(i) for i in (*op.inputs[:3], op.outputs[0]))
    if op.name == "FULLY_CONNECTED":
        if x.ttype not in _QUANTIZED or (w.quantized and w.scales.size > 1):
            return
    elif x.ttype != TT.UINT8:
        return
    diff = abs(_scale(x) * _scale(w) - _scale(bias))
    if not (_scale(out) > 0 and diff / _scale(out) <= 0.02):
        raise Refuse(f"bias scale {_scale(bias):.6g} is not input x filter scale "
                     f"{_scale(x) * _scale(w):.6g} (within 2% of the output scale "
                     f"{_scale(out):.6g}, as TFLite's kernel requires)")


def _convolution(ctx: Context, op: OpInfo) -> None:
    """The bias scale, and strides that fit the int16 TFLite's convolutions keep them in."""
    _bias_scale(ctx, op)
    o = op.options
    for what, stride in (("width", o.StrideW()), ("height", o.StrideH())):
        if stride > _INT16_MAX:
            raise Refuse(f"stride_{what} {stride} is over {_INT16_MAX} (TFLite keeps "
                         f"strides in int16)")


def _concatenation(ctx: Context, op: OpInfo) -> None:
    """int8 CONCATENATION does not requantize: every input has the output's scale and zero
    point (uint8 ones are rescaled, so only int8 has the rule)."""
    out = ctx.t(op.outputs[0])
    if out.ttype != TT.INT8:
        return
    for i in op.inputs:
        t = ctx.t(i)
        if (np.float32(_scale(t)), _zero_point(t)) != (np.float32(_scale(out)),
                                                       _zero_point(out)):
            raise Refuse(f"{t.describe()} has scale {_scale(t):.6g} and zero point "
                         f"{_zero_point(t)}, the output {_scale(out):.6g} and "
                         f"{_zero_point(out)} (TFLite's int8 kernel does not rescale)")


#: Builtin name -> its Prepare rule.
RULES: dict[str, Callable[[Context, OpInfo], None]] = {
    "ADD": _add,
    "FULLY_CONNECTED": _bias_scale,
    "CONV_2D": _convolution,
    "DEPTHWISE_CONV_2D": _convolution,
    "CONCATENATION": _concatenation,
}
