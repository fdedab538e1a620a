"""Rules TFLite's kernels check in Prepare (or Eval) that neither the schema nor the HAL
states: bounds on quantization parameters and options past which TFLite refuses the model,
or, worse, aborts the whole process on a failed ``TFLITE_CHECK``, while the HAL would compute
something. Declared once, in :data:`RULES`, over a neutral view of one TFLite operator
(:class:`RuleOp`), and read twice: by the importer before an operator is converted (a file
TFLite cannot run is refused, not given a result nothing agrees with), and by the exporter
after each HAL operation is written (so the LiteRT driver, which runs ai-edge-litert in its
host process, never claims an operation that would take that process down)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
from tflite.TensorType import TensorType as TT

from nnhal.ops.common import quantize_multiplier
from nnhal.tflite.op_versions import version_refusal

_QUANTIZED = (TT.UINT8, TT.INT8, TT.INT16)
#: TFLite's kernels keep strides in int16.
_INT16_MAX = (1 << 15) - 1
#: The smallest normal float32.
_FLOAT32_TINY = np.finfo(np.float32).tiny


class RuleTensor(NamedTuple):
    """What a rule reads of one TFLite tensor: its type and per-tensor or per-axis
    quantization (empty arrays when it has none), and how to name it in a message.
    (Immutable; a named tuple, as :class:`RuleOp`: made for every tensor of every operator
    checked, at a third of a frozen dataclass's cost.)"""

    ttype: int
    scales: np.ndarray
    zero_points: np.ndarray
    label: str
    #: Its dimensions as known before TFLite's Prepare (0 where unknown), or None.
    shape: tuple[int, ...] | None = None

    @property
    def quantized(self) -> bool:
        return self.scales.size > 0

    @property
    def scale(self) -> float:
        """TFLite's legacy per-tensor scale (0 when the tensor has none)."""
        return float(self.scales[0]) if self.quantized else 0.0

    @property
    def zero_point(self) -> int:
        return int(self.zero_points[0]) if self.zero_points.size else 0


class RuleOp(NamedTuple):
    """One TFLite operator as a rule sees it: None for an absent optional input; ``option``
    reads a field of its options table by the schema's accessor name (StrideW,
    PotScaleInt16...), with a default when the table or the field is absent."""

    name: str
    inputs: list[RuleTensor | None]
    outputs: list[RuleTensor]
    option: Callable[[str, Any], Any]
    #: Its operator code's version (None for a custom operator).
    version: int | None = 1


def rule_tensor(ttype: int, scales: Any, zero_points: Any, label: str,
                shape: Any = None) -> RuleTensor:
    """A :class:`RuleTensor` from whatever sequences (or None) the caller holds."""
    return RuleTensor(int(ttype), _EMPTY_F64 if scales is None else
                      np.asarray(scales, np.float64).reshape(-1),
                      _EMPTY_I64 if zero_points is None else
                      np.asarray(zero_points, np.int64).reshape(-1), label,
                      None if shape is None else _dims(shape))


def _dims(shape: Any) -> tuple[int, ...]:
    """``shape`` as non-negative Python ints (an unknown -1 as 0)."""
    dims = tuple(map(int, shape))
    return tuple(max(d, 0) for d in dims) if dims and min(dims) < 0 else dims


_EMPTY_F64 = np.empty(0, np.float64)
_EMPTY_F64.flags.writeable = False
_EMPTY_I64 = np.empty(0, np.int64)
_EMPTY_I64.flags.writeable = False


def _is_power_of_two(scale: float) -> bool:
    """TFLite's CheckedLog2: log2 within 1e-3 of an integer."""
    log2 = float(np.log2(np.float32(scale)))
    return abs(log2 - round(log2)) < 1e-3


def _per_tensor(*ts: RuleTensor | None) -> bool:
    """Every tensor given and quantized per tensor with a finite positive scale (else the
    type mapping refuses it, or the rule does not apply)."""
    return all(t is not None and t.scales.size == 1 and np.isfinite(np.float32(t.scale))
               and np.float32(t.scale) > 0 for t in ts)


def _add(op: RuleOp) -> str | None:
    """Quantized ADD rescales the inputs to twice the larger input scale over 2^20 (int16
    off its all-powers-of-two path: 2^15) and asserts that the output multiplier, that
    scale over the output scale, is a fraction (QuantizeMultiplierSmallerThanOneExp: a
    failed TFLITE_CHECK aborts the process); NNAPI's reference ADD fails on the same bound.
    SUB's Prepare takes a multiplier above 1 too, so SUB has no such rule."""
    a, b, out = op.inputs[0], op.inputs[1], op.outputs[0]
    if out.ttype not in _QUANTIZED or not _per_tensor(a, b, out):
        return None
    scales = [np.float32(t.scale) for t in (a, b, out)]  # type: ignore[union-attr]
    if out.ttype == TT.INT16:
        if bool(op.option("PotScaleInt16", True)) and all(
                _is_power_of_two(float(s)) for s in scales):
            return None  # the power-of-two path shifts, with no multiplier
        left_shift = 15
    else:
        left_shift = 20
    twice_max = float(np.float32(2) * max(scales[0], scales[1]))
    real = twice_max / float(np.float32(1 << left_shift) * scales[2])
    if not 0 < real < 1 or quantize_multiplier(real)[1] > 0:
        return (f"output multiplier {real:.3g} (2 x larger input scale / (2^{left_shift} x "
                f"output scale)) is not below 1, which TFLite's kernel asserts")
    return None


def _sub(op: RuleOp) -> str | None:
    """Quantized SUB divides each input scale by twice the larger one, computed in float32,
    and asserts each quotient above 0 (QuantizeMultiplierSmallerThanOneExp): past half of
    float32's maximum that doubled scale is infinite, the quotients 0, and the process
    aborts."""
    a, b, out = op.inputs[0], op.inputs[1], op.outputs[0]
    if out.ttype not in _QUANTIZED or not _per_tensor(a, b, out):
        return None
    twice = np.float32(2) * max(np.float32(a.scale), np.float32(b.scale))  # type: ignore
    if not np.isfinite(twice):
        return (f"twice the larger input scale overflows float32 ({float(twice)}), which "
                f"TFLite's kernel asserts finite")
    if out.ttype != TT.INT16 and not np.isfinite(np.float32(1 << 20) * np.float32(out.scale)):
        # Found by the fuzz (int8): the output scale times 2^20 overflows float32 and the
        # process aborts.
        return (f"the output scale {out.scale:.3g} times 2^20 overflows float32, on which "
                f"TFLite's kernel aborts")
    return None


def _normal_scales(op: RuleOp) -> str | None:
    """Every operator: a quantized tensor's scale must be a normal float32. A subnormal one
    (below 2^-126, about 1.18e-38) makes ai-edge-litert's requantizing QUANTIZE crash with
    SIGSEGV (found by tests/drivers/test_litert_abort.py's fuzz; no kernel check guards it),
    and nothing a model means needs one."""
    for t in (*op.inputs, *op.outputs):
        if t is None or not t.scales.size:  # not quantized
            continue
        if t.scales.size == 1:  # per tensor (most): no array arithmetic
            one = abs(float(np.float32(t.scales[0])))
            if 0 < one < _FLOAT32_TINY:
                return (f"{t.label} has a subnormal float32 scale {float(t.scales[0]):.3g}, "
                        f"on which TFLite's kernels crash")
            continue
        s = np.abs(t.scales.astype(np.float32))
        if s.min() >= _FLOAT32_TINY:  # every scale normal (most): one reduction (NaN: below)
            continue
        bad = (s > 0) & (s < _FLOAT32_TINY)
        if bad.any():
            return (f"{t.label} has a subnormal float32 scale "
                    f"{float(t.scales[np.argmax(bad)]):.3g}, on which TFLite's kernels crash")
    return None


def _bias_scale(op: RuleOp) -> str | None:
    """GetQuantizedConvolutionMultipler: the bias scale must be the input scale times the
    filter scale within 2% of the output scale (a NaN fails too). TFLite checks it for
    every per-tensor quantized FULLY_CONNECTED and, of the convolutions, for uint8 ones."""
    if len(op.inputs) < 3 or op.inputs[2] is None:
        return None
    x, w, bias = op.inputs[:3]
    out = op.outputs[0]
    if x is None or w is None:
        return None
    if op.name == "FULLY_CONNECTED":
        if x.ttype not in _QUANTIZED or w.scales.size > 1:
            return None
    elif x.ttype != TT.UINT8:
        return None
    diff = abs(x.scale * w.scale - bias.scale)
    if not (out.scale > 0 and diff / out.scale <= 0.02):
        return (f"bias scale {bias.scale:.6g} is not input x filter scale "
                f"{x.scale * w.scale:.6g} (within 2% of the output scale {out.scale:.6g}, as "
                f"TFLite's kernel requires)")
    return None


def _convolution(op: RuleOp) -> str | None:
    """The bias scale, strides and SAME paddings that fit the int16 TFLite's convolutions
    keep them in."""
    why = _bias_scale(op)
    if why is not None:
        return why
    for what, key in (("width", "StrideW"), ("height", "StrideH")):
        stride = int(op.option(key, 1))
        if stride > _INT16_MAX:
            return f"stride_{what} {stride} is over {_INT16_MAX} (TFLite keeps strides in int16)"
    filt = op.inputs[1] if len(op.inputs) > 1 else None
    if filt is None or filt.shape is None or len(filt.shape) != 4:
        return None
    # CONV_2D's filter is [out, h, w, in], DEPTHWISE_CONV_2D's [1, h, w, out].
    return _same_padding(op, filt.shape[1], filt.shape[2], int(op.option("DilationHFactor", 1)),
                         int(op.option("DilationWFactor", 1)))


def _pool(op: RuleOp) -> str | None:
    """A SAME padding that fits the int16 TFLite's pooling keeps it in."""
    return _same_padding(op, int(op.option("FilterHeight", 1)), int(op.option("FilterWidth", 1)),
                         1, 1)


#: TFLite's Padding enum: SAME.
_SAME = 0
#: The largest (k - 1) d whose SAME padding per side fits int16 on any input.
_WINDOW_OK = 2 * _INT16_MAX + 1


def _same_padding(op: RuleOp, kh: int, kw: int, dh: int, dw: int) -> str | None:
    """TFLite's Prepare computes a SAME window's padding per side (half the total, the odd one
    apart) and refuses it past int16, where its kernels keep it: a window tens of thousands
    wide over a small input. Unknown input sizes are Prepare's to check.
    The total is below the dilated window, (k - 1) d + 1 (the output's last window starts
    before the input ends), so a window of at most 2^16 dilated taps passes at once."""
    if (kh - 1) * dh <= _WINDOW_OK and (kw - 1) * dw <= _WINDOW_OK:
        return None
    if int(op.option("Padding", _SAME)) != _SAME:
        return None
    x = op.inputs[0] if op.inputs else None
    if x is None or x.shape is None or len(x.shape) != 4:
        return None
    for what, size, k, stride, dilation in (
            ("height", x.shape[1], kh, int(op.option("StrideH", 1)), dh),
            ("width", x.shape[2], kw, int(op.option("StrideW", 1)), dw)):
        if size <= 0 or k <= 0 or stride <= 0 or dilation <= 0:
            continue
        out = (size + stride - 1) // stride
        total = max((out - 1) * stride + (k - 1) * dilation + 1 - size, 0)
        if total // 2 > _INT16_MAX:
            return (f"its SAME padding of {total // 2} along the {what} is over {_INT16_MAX} "
                    f"(TFLite keeps paddings in int16)")
    return None


def _concatenation(op: RuleOp) -> str | None:
    """int8 CONCATENATION does not requantize: every input has the output's scale and zero
    point (uint8 ones are rescaled, so only int8 has the rule)."""
    out = op.outputs[0]
    if out.ttype != TT.INT8:
        return None
    for t in op.inputs:
        if t is None:
            continue
        if (np.float32(t.scale), t.zero_point) != (np.float32(out.scale), out.zero_point):
            return (f"{t.label} has scale {t.scale:.6g} and zero point {t.zero_point}, the "
                    f"output {out.scale:.6g} and {out.zero_point} (TFLite's int8 kernel does "
                    f"not rescale)")
    return None


#: The most dimensions TFLite's broadcasting binary kernels take (their reference forms;
#: measured on ai-edge-litert 2.3: 8 run, 9 abort the process in Eval, for every type
#: XNNPACK does not take over).
_BROADCAST_DIMS = 8
_BROADCASTING = frozenset({
    "ADD", "SUB", "MUL", "DIV", "SQUARED_DIFFERENCE", "FLOOR_DIV", "FLOOR_MOD", "POW",
    "MAXIMUM", "MINIMUM", "EQUAL", "NOT_EQUAL", "LESS", "LESS_EQUAL", "GREATER",
    "GREATER_EQUAL", "LOGICAL_AND", "LOGICAL_OR", "PRELU"})


def _broadcast_rank(op: RuleOp) -> str | None:
    """A binary operator whose two inputs differ in shape (or may: a dimension unknown)
    broadcasts in Eval over at most 8 dimensions; past them TFLite aborts the process."""
    if len(op.inputs) < 2 or op.inputs[0] is None or op.inputs[1] is None:
        return None
    a, b = op.inputs[0].shape, op.inputs[1].shape
    if a is None or b is None:
        return None
    rank = max(len(a), len(b))
    if rank > _BROADCAST_DIMS and (tuple(a) != tuple(b) or 0 in a):
        return (f"{op.name} broadcasting {rank} dimensions (TFLite's broadcasting kernels "
                f"take at most {_BROADCAST_DIMS} and abort the process past them)")
    return None


#: Operators whose two inputs TFLite's Prepare requires to be of one type.
_SAME_INPUT_TYPES = frozenset({
    "ADD", "SUB", "MUL", "DIV", "FLOOR_DIV", "FLOOR_MOD", "MAXIMUM", "MINIMUM",
    "SQUARED_DIFFERENCE", "POW", "EQUAL", "NOT_EQUAL", "LESS", "LESS_EQUAL", "GREATER",
    "GREATER_EQUAL"})
#: Operators whose every input and output TFLite's Prepare requires to be of one type.
_ALL_SAME_TYPES = frozenset({"CONCATENATION", "PACK"})
_INDEX_TYPES = (TT.INT32, TT.INT64)
#: (operator, input) -> the types TFLite's kernel takes for that index input (a shape,
#: axes, positions, bounds): another is refused in Prepare, never read as numbers.
_INDEX_INPUTS: dict[tuple[str, int], tuple[int, ...]] = {
    ("GATHER", 1): (TT.INT16, *_INDEX_TYPES),
    ("CUMSUM", 1): (TT.INT32,),
    ("SPLIT", 0): (TT.INT32,),
    ("SPLIT_V", 1): _INDEX_TYPES,
    ("SPLIT_V", 2): (TT.INT32,),
    **{(name, 1): _INDEX_TYPES for name in (
        "MEAN", "SUM", "REDUCE_PROD", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_ANY",
        "REDUCE_ALL", "PAD", "PADV2", "MIRROR_PAD", "TRANSPOSE", "TILE", "EXPAND_DIMS")},
    **{("STRIDED_SLICE", k): _INDEX_TYPES for k in (1, 2, 3)},
    **{("SLICE", k): _INDEX_TYPES for k in (1, 2)},
}
#: The same per operator: its index inputs' (position, types), in position order.
_INDEX_POSITIONS: dict[str, list[tuple[int, tuple[int, ...]]]] = {}
for (_name, _k), _allowed in sorted(_INDEX_INPUTS.items()):
    _INDEX_POSITIONS.setdefault(_name, []).append((_k, _allowed))

#: Operators whose options count their inputs (False) or outputs (True), as TFLite's Prepare
#: checks: (the options field, whether it counts outputs).
_COUNTED = {"PACK": ("ValuesCount", False), "SPLIT": ("NumSplits", True),
            "SPLIT_V": ("NumSplits", True), "UNPACK": ("Num", True)}


def _types(op: RuleOp) -> str | None:
    """The type and count agreements TFLite's Prepare checks (nnhal would otherwise compute,
    or fold at import, what TFLite refuses: an index input read as float, mixed-type
    arithmetic, a PACK of other inputs than its options count)."""
    name = op.name
    if name in _SAME_INPUT_TYPES and len(op.inputs) == 2:
        a, b = op.inputs
        if a is not None and b is not None and a.ttype != b.ttype:
            return f"{a.label} and {b.label} differ in type, which TFLite's kernel refuses"
    elif name in _ALL_SAME_TYPES and op.inputs:
        ts = [t for t in (*op.inputs, *op.outputs) if t is not None]
        odd = next((t for t in ts if t.ttype != ts[0].ttype), None)
        if odd is not None:
            return (f"{odd.label} differs in type from {ts[0].label}, which TFLite's kernel "
                    f"refuses")
    counted = _COUNTED.get(name)
    if counted is not None:
        field, outputs = counted
        n = len(op.outputs if outputs else op.inputs)
        said = int(op.option(field, 0))
        if said != n:
            return (f"its options' {field} is {said} for {n} "
                    f"{'outputs' if outputs else 'inputs'}, which TFLite's kernel refuses")
    if name == "SHAPE" and op.outputs:
        # TFLite's Prepare gives the output this type, whatever the file declares.
        out_type = int(op.option("OutType", TT.INT32))
        if out_type not in _INDEX_TYPES or out_type != op.outputs[0].ttype:
            return (f"its options' out_type {out_type} is not int32 or int64 or not the "
                    f"type of {op.outputs[0].label}")
    for k, allowed in _INDEX_POSITIONS.get(name, ()):
        t = op.inputs[k] if k < len(op.inputs) else None
        if t is not None and t.ttype not in allowed:
            return f"{t.label} (input {k}) is of a type TFLite's kernel refuses there"
    return None


#: Builtin name -> its rule: None when TFLite's kernel runs the operator, else why not
#: (:func:`kernel_refusal` applies these and the rules every operator has).
RULES: dict[str, Callable[[RuleOp], str | None]] = {
    "ADD": _add,
    "SUB": _sub,
    "FULLY_CONNECTED": _bias_scale,
    "CONV_2D": _convolution,
    "DEPTHWISE_CONV_2D": _convolution,
    "AVERAGE_POOL_2D": _pool,
    "MAX_POOL_2D": _pool,
    "L2_POOL_2D": _pool,
    "CONCATENATION": _concatenation,
}


def kernel_refusal(op: RuleOp) -> str | None:
    """Why TFLite's kernel would refuse (or abort on) this operator, or None."""
    why = None if op.version is None else version_refusal(op.name, op.version)
    why = why or _normal_scales(op) or _types(op)
    if why is None and op.name in RULES:
        why = RULES[op.name](op)
    if why is None and op.name in _BROADCASTING:
        why = _broadcast_rank(op)
    return why
