"""Which operations the LiteRT driver supports: exactly those that export to .tflite and run
right in ai-edge-litert (XNNPACK), per operation, from the analysed graph.

An operation is supported when the exporter (nnhal.tflite) converts it and none of the rules
below refuses it. The exporter checks every TFLite operator it writes against
:mod:`nnhal.tflite.kernel_rules` (the importer's table), so an operation on which TFLite's
kernel would abort the host process (a failed TFLITE_CHECK) or crash is refused here too.
Every other rule comes from ``benchmarks/survey_litert.py``, which runs every
conformance case through write_tflite and ai-edge-litert and classifies what fails; a rule
is decided from the operation's own operand types, shapes, lifetimes and parameter values,
never from a case name. When the survey could not show an operation kind right, it is refused.
A light model that needs an operation only XNNPACK computes wrong runs with XNNPACK off
(:func:`builtin_kernels`). :data:`REFUSED` lists, per operation type, each refused kind with
its reason (for the driver's docs and the issue note).
"""

from __future__ import annotations

import functools
import importlib.metadata
from collections.abc import Iterable

import numpy as np

from nnhal.analysis import ModelGraph, SubgraphGraph, about
from nnhal.analysis.graph import once_per_graph
from nnhal.hal.types import OPERATION_TYPE_NAMES, OperandType, OperationType
from nnhal.ops import common as C
from nnhal.ops.catalog import SIGNATURES
from nnhal.ops.conv import ConvRequant, conv_multipliers, input_bound
from nnhal.tflite.export_context import SubgraphWriter
from nnhal.tflite.export_fb import ModelDef, SubgraphDef
from nnhal.tflite.export_fuse import find_fusions
from nnhal.tflite.export_ops import CONVERTERS
from nnhal.tflite.exporter import convert_model, keep_converted

O = OperationType
T = OperandType

#: Per operation type: (kind of case refused, why). Exporter refusals are listed as the
#: exporter words them; the rest are what ai-edge-litert does with the exported model.
REFUSED: dict[str, list[tuple[str, str]]] = {
    "WHILE": [("every WHILE", "the HAL loop timeout cannot be enforced: a loop inside litert "
               "cannot be interrupted")],
    "LSTM": [("every LSTM", "no conformance case of it runs right exported (omitted optional "
              "operands reach TFLite's kernel as empty tensors and it fails at allocation); "
              "unverified, so refused")],
    "UNIDIRECTIONAL_SEQUENCE_LSTM": [("every UNIDIRECTIONAL_SEQUENCE_LSTM", "as LSTM: no case "
                                      "runs right exported; refused")],
    "SVDF": [("every SVDF", "a non-zero state input gives wrong results (TFLite's SVDF keeps "
              "its own state); only all-zero states agree, which prepare cannot know")],
    "BIDIRECTIONAL_SEQUENCE_RNN": [
        ("every BIDIRECTIONAL_SEQUENCE_RNN", "crash-prone: TFLite's kernel aborts the whole "
         "process (a failed check) when the auxiliary input or weights are absent; the only "
         "cases that pass feed them as model inputs, which a request may omit")],
    "RESHAPE": [("shape given at run time with the output shape unknown at prepare",
                 "XNNPACK fails to reshape its runtime at allocation")],
    "SQUEEZE": [("axes given at run time with the output shape unknown at prepare",
                 "XNNPACK fails to reshape its runtime at allocation")],
    "*": [("an omittable input (TRANSPOSE perm, LSH_PROJECTION weight, SVDF bias, LSTM and "
           "RNN optional operands...) computed at run time (a model input, or a temporary, "
           "which a step of a split model gets as a model input)",
           "the request may omit it, and a TFLite model cannot leave an input out at run "
           "time (TRANSPOSE then fails, LSH_PROJECTION gives wrong results, LSTM fails)"),
          ("an operand of unknown rank", "TFLite tensors need a rank"),
          ("an ARGMAX / ARGMIN / MEAN / REDUCE_* / SQUEEZE / STRIDED_SLICE whose TFLite "
           "result may have rank 0 and whose output shape is unknown at prepare",
           "TFLite gives shape [] where the HAL gives [1]; the exporter reshapes to [1] only "
           "when it knows the output is [1]")],
    # Exporter refusals (nnhal.tflite), as seen in the survey:
    "ROI_ALIGN": [("every", "no TFLite builtin equivalent (a HAL-only operation)")],
    "ROI_POOLING": [("every", "no TFLite builtin equivalent (a HAL-only operation)")],
    "GENERATE_PROPOSALS": [("every", "no TFLite builtin equivalent (a HAL-only operation)")],
    "BOX_WITH_NMS_LIMIT": [("every", "no TFLite builtin equivalent (a HAL-only operation)")],
    "AXIS_ALIGNED_BBOX_TRANSFORM": [("every", "no TFLite builtin equivalent (HAL-only)")],
    "HEATMAP_MAX_KEYPOINT": [("every", "no TFLite builtin equivalent (a HAL-only operation)")],
    "QUANTIZED_16BIT_LSTM": [("every", "no TFLite builtin equivalent (a HAL-only operation)")],
    "QUANTIZED_LSTM": [("every", "no TFLite builtin equivalent (a HAL-only operation)")],
    "DETECTION_POSTPROCESSING": [("every", "TFLite has it only as a custom operator")],
    "RANDOM_MULTINOMIAL": [("every", "TFLite's MULTINOMIAL draws other random numbers")],
    "BIDIRECTIONAL_SEQUENCE_LSTM": [("every", "not exported: its 61 operands are not mapped "
                                     "onto TFLite's 48")],
    "LSH_PROJECTION": [("projection type 1 (SPARSE_DEPRECATED)", "exporter: no TFLite "
                        "equivalent")],
    # The operations of AIDL v2 / v3 and quantized RSQRT (tests/drivers/test_litert_aidl_ops.py
    # compares each claimed kind with the reference on edge inputs):
    "BATCH_MATMUL": [("TENSOR_INT32", "exporter: TFLite's BATCH_MATMUL has no int32 kernel"),
                     ("an input dimension unknown at prepare", "an empty input (a 0 "
                      "dimension at run time) fails in XNNPACK (it cannot reshape its "
                      "runtime), where the HAL gives an empty result")],
    "MIRROR_PAD": [("paddings given at run time, on ai-edge-litert before 2.3",
                    "older TFLite kernels do not bound run-time paddings (2.3's fails the "
                    "invocation as the HAL fails the execution; measured)"),
                   ("REFLECT with an input dimension unknown at prepare", "TFLite fails "
                    "REFLECT of an empty dimension even with zero padding, where the HAL "
                    "gives an empty result")],
    "REVERSE": [("axis given at run time", "exporter: TFLite counts a negative axis from "
                 "the end, where the HAL fails the execution")],
    "RSQRT": [("quantized, with 1 / (sqrt(input scale) x output scale) outside [2^-11, 2^29]",
               "exporter: TFLite's fixed point overflows (garbage results); inside, its "
               "int8 kernel gives the HAL's values")],
}

# ---- what the edge sweep measured (tests/drivers/test_litert_edges.py, issue 27 item 4) -----
# Each operation was run on the reference and on ai-edge-litert over edge inputs (-0.0, the
# largest floats, int32's limits, every 8-bit stored value under extreme scales and zero
# points, ties, zero-sized and broadcast shapes, every fused activation; and NaN and +-Inf).
# Policy: NNAPI defines its operations over real numbers and says nothing of NaN or infinite
# inputs (upstream's CPU path leaves them to TFLite's kernels), so a difference that needs a
# NaN or infinite input narrows nothing (the sweep records it: NONFINITE_DIFFERENCES there).
# A difference on finite inputs always narrows, also where the exact result or an intermediate
# overflows (exp(88.7), a variance of 3.4e38), unless it is the rounding of the defined sum
# in another order of its terms (a pool's, a mean's: NNAPI fixes no order), which the sweep
# allows. Where it depends on run-time values, prepare cannot know, so the (operation, type)
# is refused whole; where it depends on what prepare sees (quantization parameters, shapes),
# only that is refused.
# Subnormal inputs are left out: XNNPACK flushes them to zero, as most NNAPI accelerators do.
# Float32 RESIZE_BILINEAR is claimed in the driver's export form (write_tflite exact_resize:
# MUL 0.5, RESIZE_BILINEAR, MUL 2): XNNPACK's a + (b - a) t overflows on finite inputs beyond
# +-1.7e38 (-inf where the reference gives 0), on half the input it cannot. Left over: halving
# makes values below 2^-125 (2.4e-38) subnormal, so they flush to zero where plain XNNPACK
# keeps those from 2^-126 up; the measured absolute difference from the reference stays under
# 5e-38 (plain XNNPACK's, from its flushed intermediates: 2.5e-38), far inside the tolerance.
_F = ("TENSOR_FLOAT32", "TENSOR_FLOAT16")
_F32 = ("TENSOR_FLOAT32",)
#: Per operation: the input-0 types refused for a difference on finite run-time values, and
#: what differs.
EDGE_FLOAT: dict[str, tuple[tuple[str, ...], str]] = {
    "EXP": (_F32, "XNNPACK's exp overflows to inf below the float32 limit (exp(88.7): inf, "
                  "not 3.33e38)"),
    "LOG": (_F32, "log(3.4e38) gives inf, not 88.72"),
    "RSQRT": (_F, "rsqrt(+-0) gives NaN, not +-inf"),
    "SIN": (_F32, "sin of +-3.4e38 and +-1e20 gives NaN"),
    "SQRT": (_F32, "sqrt(3.4e38) gives 2.77e19, not 1.84e19"),
    "INSTANCE_NORMALIZATION": (_F32, "a plane with +-3.4e38 gives beta everywhere where the "
                               "reference gives finite values (the variance overflows)"),
    "LOCAL_RESPONSE_NORMALIZATION": (_F, "the sums of squares are running sums: a large value "
                                     "(1e3 in float32, 6e4 in float16) next to a window of "
                                     "small ones cancels them (0.4 where the reference gives "
                                     "0.3997)"),
    "UNIDIRECTIONAL_SEQUENCE_RNN": (_F32, "a state that overflows float32 gives NaN where the "
                                    "reference gives inf, 0 / -1 where it gives NaN or 1"),
    "COS": (_F32, "cos of +-3.4e38 and +-1e20 gives NaN (org.nnhal.tflite's COS)"),
}

# ---- XNNPACK off ----------------------------------------------------------------------------
# The sweep run again with XNNPACK off (ai-edge-litert's BUILTIN_WITHOUT_DEFAULT_DELEGATES:
# TFLite's builtin kernels alone) finds the differences of XNNPACK_EDGES gone, and a few
# others instead (BUILTIN_WRONG). A model that needs an operation of XNNPACK_EDGES, and has
# nothing the builtin kernels compute wrong and nothing XNNPACK is there for (HEAVY, and no
# more than LIGHT_WORK in all), runs with XNNPACK off: whole on this driver, where it would
# otherwise be split around that operation (tens of microseconds a run on a model of a few).
#: The EDGE_FLOAT differences that are XNNPACK's own.
XNNPACK_EDGES = frozenset({"EXP", "LOG", "RSQRT", "SIN", "SQRT", "COS"})
#: Per operation: (the kind, what differs) that TFLite's builtin kernels compute wrong on
#: finite inputs where XNNPACK computes them right; a model with one keeps XNNPACK.
BUILTIN_WRONG: dict[str, tuple[str, str]] = {
    "ADD": ("8-bit quantized", "saturates the other way (0 where the reference gives 255) "
            "at input scales 200 times the output's"),
    "MUL": ("8-bit quantized", "saturates the other way (255 where the reference gives 0)"),
    "BATCH_MATMUL": ("TENSOR_FLOAT32", "a sum that overflows gives NaN, not -inf"),
    "QUANTIZE": ("TENSOR_FLOAT32 input", "3.4e38 quantizes to the lowest value, not the "
                 "highest"),
}
#: Operations XNNPACK is there for: a model with one keeps XNNPACK.
HEAVY = frozenset({"CONV_2D", "DEPTHWISE_CONV_2D", "GROUPED_CONV_2D", "TRANSPOSE_CONV_2D",
                   "FULLY_CONNECTED", "BATCH_MATMUL", "AVERAGE_POOL_2D", "MAX_POOL_2D",
                   "L2_POOL_2D"})
#: The most work (the analysis' estimate, element visits) a model run with XNNPACK off has.
LIGHT_WORK = 1 << 20

for _name, (_types, _why) in EDGE_FLOAT.items():
    _kind = " or ".join(_types) + " input"
    REFUSED.setdefault(_name, []).append(
        (_kind + (" in a model that keeps XNNPACK" if _name in XNNPACK_EDGES else ""), _why))
#: Per operation: (the kind refused, what differed) of the narrowings decided from what
#: prepare sees; each is also in REFUSED.
EDGE_RULES: dict[str, tuple[str, str]] = {
    "CAST": ("TENSOR_INT32 to TENSOR_QUANT8_ASYMM", "TFLite wraps out-of-range values (-1 "
             "gives 255) where NNAPI saturates to [0, 255]"),
    "TOPK_V2": ("any type", "ties come out lowest index first where the reference (as NNAPI's "
                "CPU executor) gives the highest first"),
    "LSH_PROJECTION": ("TENSOR_FLOAT16 input with projection type 3 (SPARSE)",
                       "another bucket than the reference's (11, not 9)"),
    "PRELU": ("an input that broadcasts against alpha (the output larger than the input), or "
              "a shape not known at prepare", "litert fails to prepare the model"),
    "RESHAPE": ("an input whose shape is not fully known at prepare (zero-sized at run time)",
                "litert fails to prepare a zero-sized reshape"),
    "ADD": ("8-bit quantized with an input scale at least 256 times the output's",
            "wrong results (255 where the reference saturates to 0): ratio 255.9 agrees, 256 "
            "does not"),
    "MUL": ("TENSOR_QUANT8_ASYMM with the product of the input scales at least 256 times "
            "the output's", "wrong results (255 where the reference saturates to 0): ratio "
            "255.9 agrees, 256 does not (TENSOR_QUANT8_ASYMM_SIGNED agrees)"),
    "LOGISTIC": ("8-bit quantized with an input scale of 4 or more", "the reference's "
                 "fixed-point input radius (NNAPI's CPU arithmetic) saturates what TFLite's "
                 "table does not: scale 4 is 4 steps off, 8 and up give 0.5 for input 0 where "
                 "the reference gives 0; 3.99 agrees"),
    "LOG_SOFTMAX": ("TENSOR_FLOAT32 with a beta above 1 (or not constant)", "TFLite's "
                    "LOG_SOFTMAX has no beta: the exporter multiplies first, and beta x "
                    "overflows (beta 1e6 on 3.4e38: NaN where the reference gives 0 and -inf)"),
    "TANH": ("8-bit quantized with an input scale of 8 or more", "as LOGISTIC: input 0 gives 0 "
             "where the reference gives -1; 7.99 agrees"),
    **{op: ("8-bit quantized with a requantisation multiplier above 1 whose left shift of "
            "sum + bias may leave int32", "XNNPACK requantises in float32 and saturates where "
            "the reference kernels' int32 shift wraps: up to 255 steps off "
            "(tests/ops/test_conv_bias_limits.py)")
       for op in ("CONV_2D", "DEPTHWISE_CONV_2D", "GROUPED_CONV_2D", "TRANSPOSE_CONV_2D",
                  "FULLY_CONNECTED")},
}
for _name, _entry in EDGE_RULES.items():
    REFUSED.setdefault(_name, []).append(_entry)

for _name in ("RNN", "UNIDIRECTIONAL_SEQUENCE_RNN", "BIDIRECTIONAL_SEQUENCE_RNN", "SVDF",
              "LSTM", "UNIDIRECTIONAL_SEQUENCE_LSTM"):
    REFUSED.setdefault(_name, []).append(("state input not a model input", "exporter: TFLite "
                                          "keeps the state in a variable tensor"))

_ALWAYS = {"WHILE", "LSTM", "UNIDIRECTIONAL_SEQUENCE_LSTM", "SVDF", "BIDIRECTIONAL_SEQUENCE_RNN"}
_RANK0 = {"ARGMAX", "ARGMIN", "MEAN", "REDUCE_ALL", "REDUCE_ANY", "REDUCE_MAX", "REDUCE_MIN",
          "REDUCE_PROD", "REDUCE_SUM", "SQUEEZE", "STRIDED_SLICE"}


def refused_reasons() -> dict[str, list[tuple[str, str]]]:
    """Per operation type, every refused kind and its reason ("*": rules for every type)."""
    return {k: list(v) for k, v in REFUSED.items()}


def supported_operations(graph: ModelGraph) -> list[bool]:
    """Per operation of the main subgraph: whether the LiteRT driver runs it right (an IF is
    supported only when every operation of the subgraphs it reaches is)."""
    return [why is None for why in _main_reasons(graph)]


def operation_reasons(graph: ModelGraph) -> list[str | None]:
    """Per operation of the main subgraph: None when the LiteRT driver runs it, else one line
    saying why not."""
    return _main_reasons(graph)


def refusal(graph: ModelGraph) -> str | None:
    """None when every operation of every subgraph is supported, else one line naming the
    first refused operation and why."""
    for why in _main_reasons(graph):
        if why is not None:
            return why
    return None


@once_per_graph
def builtin_kernels(graph: ModelGraph) -> bool:
    """Whether the model runs with XNNPACK off (see XNNPACK_EDGES): it needs an operation only
    XNNPACK computes wrong, and has none the builtin kernels compute wrong (BUILTIN_WRONG) or
    XNNPACK is there for (HEAVY), and little work (LIGHT_WORK)."""
    if graph.work > LIGHT_WORK:
        return False
    needed = False
    for g in (graph.main, *graph.referenced):
        for t, ins, _ in g.operations:
            name = _op_name(graph, t)
            if name in HEAVY:
                return False
            t_in = g.operands[ins[0]].type if ins else None
            if name in BUILTIN_WRONG and t_in is not None and (
                    t_in in _Q8 if name in ("ADD", "MUL") else t_in == T.TENSOR_FLOAT32):
                return False
            edge = EDGE_FLOAT.get(name)
            if name in XNNPACK_EDGES and edge is not None and t_in is not None and \
                    t_in.name in edge[0] and not _edge_unreached(graph, g, name, ins):
                needed = True
    return needed


#: Operations whose (float) output is never below zero when their inputs are not (the
#: first input: unary ones; every input: the rest, with no fused activation).
_KEEP_NON_NEGATIVE = frozenset({"MEAN", "REDUCE_SUM", "REDUCE_MAX", "REDUCE_MIN", "ADD", "MUL",
                                "MAX_POOL_2D", "AVERAGE_POOL_2D", "RESHAPE", "SQUEEZE",
                                "CONCATENATION", "TRANSPOSE", "SQRT"})
_NON_NEGATIVE = frozenset({"RELU", "RELU6", "ABS", "EXP", "LOGISTIC"})


def _non_negative(graph: ModelGraph, g: SubgraphGraph, i: int, depth: int = 8) -> bool:
    """Whether float operand ``i`` is never below zero (NaN aside): a constant without
    negatives, a square (MUL of an operand by itself), RELU / ABS / EXP..., or what
    _KEEP_NON_NEGATIVE makes of such inputs. A sketch of a range analysis, enough for the
    variance of a normalisation (MEAN of squared differences)."""
    info = g.operands[i]
    if info.is_const:
        v = np.asarray(info.value, np.float64)
        return bool(v.size) and not bool(np.any(v < 0))
    k = g.producers.get(i)
    if k is None or depth == 0:
        return False
    t, ins, _ = g.operations[k]
    name = _op_name(graph, t)
    if name in _NON_NEGATIVE:
        return True
    if name == "MUL" and ins[0] == ins[1] and _no_activation(g, ins[2]):
        return True
    if name not in _KEEP_NON_NEGATIVE:
        return False
    if name in ("ADD", "MUL") and not _no_activation(g, ins[2]):
        return False
    data = ins[:-1] if name == "CONCATENATION" else ins[:2] if name in ("ADD", "MUL") \
        else ins[:1]
    return all(_non_negative(graph, g, j, depth - 1) for j in data)


def _no_activation(g: SubgraphGraph, i: int) -> bool:
    info = g.operands[i]
    return info.is_const and int(np.asarray(info.value).reshape(-1)[0]) == 0


def _edge_unreached(graph: ModelGraph, g: SubgraphGraph, name: str, ins: list[int]) -> bool:
    """Whether an EDGE_FLOAT difference cannot be reached: RSQRT's (at +-0) where its input is
    a non-negative value plus a positive constant (a normalisation's variance + epsilon), so
    a transformer's LayerNorm need not split a model around LiteRT."""
    if name != "RSQRT" or g.operands[ins[0]].type != T.TENSOR_FLOAT32:
        return False  # (float16: a subnormal epsilon may flush to zero)
    k = g.producers.get(ins[0])
    if k is None:
        return False
    t, add_ins, _ = g.operations[k]
    if _op_name(graph, t) != "ADD" or not _no_activation(g, add_ins[2]):
        return False
    a, b = add_ins[0], add_ins[1]
    for c, x in ((a, b), (b, a)):
        info = g.operands[c]
        if info.is_const:
            v = np.asarray(info.value, np.float64)
            tiny = float(np.finfo(np.float32).tiny)
            if v.size and bool(np.all(np.isfinite(v) & (v >= tiny))) and \
                    _non_negative(graph, g, x):
                return True
    return False


def divides(graph: ModelGraph) -> bool:
    """Whether the model has an int32 DIV whose divisor may be 0 at run time (not a constant
    without zeros), or a float32 floor division the exporter writes as FLOOR_DIV
    (:mod:`nnhal.tflite.export_fuse`) by a run-time divisor: TFLite's FLOOR_DIV fails the
    invocation on a zero where the HAL gives 0 (or +-inf, NaN), so such a run is run again
    on the guarded form (``EnginePool.guarded``)."""
    for g in (graph.main, *graph.referenced):
        if any(f.name == "FLOOR_DIV" and not g.operands[f.ins[1]].is_const
               for f in find_fusions(g).values()):
            return True
        for t, ins, _ in g.operations:
            if t != O.DIV or len(ins) < 2 or g.operands[ins[0]].type != T.TENSOR_INT32:
                continue
            y = g.operands[ins[1]]
            if not y.is_const or not np.all(np.asarray(y.value) != 0):
                return True
    return False


# ---- the rules ----------------------------------------------------------------------------

def _main_reasons(graph: ModelGraph) -> list[str | None]:
    """Per main operation, why it is refused (None: supported)."""
    return list(_reasons_once(graph))


@once_per_graph
def _reasons_once(graph: ModelGraph) -> tuple[str | None, ...]:
    """:func:`_find_reasons`, once per graph: a prepare asks again (``refusal``) what the
    support query asked of the same analysed graph, and the answer is an export's worth of
    work."""
    return tuple(_find_reasons(graph))


def _find_reasons(graph: ModelGraph) -> list[str | None]:
    export = _export_refusals(graph)
    sub_reason: dict[int, str | None] = {}

    def subgraph_reason(ref: int, seen: frozenset[int]) -> str | None:
        if ref in seen:
            return f"subgraph {ref} is recursive"
        if ref not in sub_reason:
            sgg = graph.referenced[ref]
            found = None
            for why in _reasons(graph, sgg, export.get(ref, {}),
                                lambda r: subgraph_reason(r, seen | {ref})):
                if why is not None:
                    found = f"subgraph {ref} {why}"
                    break
            sub_reason[ref] = found
        return sub_reason[ref]

    reasons = _reasons(graph, graph.main, export.get(-1, {}),
                       lambda r: subgraph_reason(r, frozenset()))
    # Whatever the operation: a main input a request may omit has no TFLite counterpart.
    optional = set(graph.main.inputs) - graph.required_inputs
    if optional:
        for k, (t, ins, _) in enumerate(graph.main.operations):
            hit = optional.intersection(ins)
            if hit and reasons[k] is None:
                reasons[k] = (f"#{k} {_op_name(graph, t)}: input operand {min(hit)} may be "
                              f"omitted by a request; a TFLite graph has no omitted inputs")
    return reasons


def _op_name(graph: ModelGraph, t: int) -> str:
    name = OPERATION_TYPE_NAMES.get(t)
    if name is not None:
        return name
    found = graph.extension_ops.get(int(t))
    return found[0].short if found is not None else f"extension operation {t:#x}"


_POOLS = ("AVERAGE_POOL_2D", "MAX_POOL_2D", "L2_POOL_2D")
#: The largest pooling (its work estimate, :attr:`SubgraphGraph.work`) claimed. Measured with
#: ai-edge-litert 2.3 here: its pools visit about 1e9 window elements a second, both in
#: ``allocate_tensors`` and in each ``invoke`` (a PAD of a million columns into a MAX_POOL
#: 65,536 wide: 6.1e10, four minutes), where the reference's visit about 1e10. A real model's
#: pools are far below (MobileNet's global pool: 6e4).
MAX_POOL_WORK = 10**9


def _reasons(graph: ModelGraph, g: SubgraphGraph, exported: dict[int, str],
             sub: object) -> list[str | None]:
    out: list[str | None] = []
    for k, (t, ins, outs) in enumerate(g.operations):
        name = OPERATION_TYPE_NAMES.get(t)
        if name is None:
            found = graph.extension_ops.get(int(t))
            if found is None or _exporter_of(found[0]) is None:
                out.append(f"#{k} extension operation {t:#x}: not exportable")
            else:  # written as the TFLite builtin it stands for: the probe's verdict
                why = exported.get(k)
                if why is None and ins:
                    why = _edge_float(graph, found[0].short, g.operands[ins[0]].type)
                out.append(None if why is None else f"#{k} {found[0].name}: {why}")
            continue
        why = _rule(graph, g, name, list(ins), list(outs))
        if why is None and name in _POOLS and k < len(g.work) and g.work[k] > MAX_POOL_WORK:
            why = (f"a window of about {about(g.work[k], 2)} element visits: ai-edge-litert visits "
                   f"about 1e9 a second at prepare and again at each run, the reference ten "
                   f"times that")
        if why is None and k in exported:
            why = exported[k]
        if why is None and name in ("IF", "WHILE"):
            for i in ins:
                info = g.operands[i]
                if info.type == T.SUBGRAPH and info.value is not None:
                    r = sub(int(info.value))  # type: ignore[operator]
                    if r is not None:
                        why = f"reaches {r}"
                        break
        out.append(None if why is None else f"#{k} {name}: {why}")
    return out


def _exporter_of(op_id: object) -> object | None:
    """The ``tflite_export`` of an extension operation (None: it has no TFLite form)."""
    from nnhal.ops.extensions import lookup

    ext = lookup(op_id.extension)  # type: ignore[attr-defined]
    operation = ext.operation(op_id.code) if ext is not None else None  # type: ignore[attr-defined]
    return getattr(operation, "tflite_export", None)


def _export_refusals(graph: ModelGraph) -> dict[int, dict[int, str]]:
    """Per subgraph (-1 main), per operation index: the exporter's refusal. A refusal not tied
    to one operation (inputs / outputs) marks every operation of that subgraph."""
    if not graph.referenced:
        return {-1: _main_export_refusals(graph)}
    state = _ExportProbe(graph)
    result: dict[int, dict[int, str]] = {}
    for sgg in graph.subgraphs:
        state.refused = []
        names = [f"x{k}" for k in range(len(sgg.inputs))]
        onames = [f"y{k}" for k in range(len(sgg.outputs))]
        try:
            SubgraphWriter(state, sgg, SubgraphDef("probe"), names, onames, 0).run()
        except Exception as e:  # noqa: BLE001 - an exporter bug must read as a refusal
            state.refused.append(f"inputs: exporter failed: {type(e).__name__}: {e}")
        result[sgg.index] = _per_operation(state.refused, sgg)
    return result


def _main_export_refusals(graph: ModelGraph) -> dict[int, str]:
    """The probe of a model without subgraphs: the driver's own export, converted (not
    serialised) and kept for its prepare to write (one conversion, not two), with each
    operation of a chain it writes as one operator judged again on its own (a partition may
    cut the chain)."""
    main = graph.main
    chained = {k for f in find_fusions(main).values() for k in f.ops}
    names = [f"input_{k}" for k in range(len(main.inputs))]
    onames = [f"output_{k}" for k in range(len(main.outputs))]
    try:
        converted, refused = convert_model(graph, names, onames, exact_resize=True)
    except Exception as e:  # noqa: BLE001 - an exporter bug must read as a refusal
        converted, refused = None, [f"inputs: exporter failed: {type(e).__name__}: {e}"]
    per = {k: why for k, why in _per_operation(refused, main).items() if k not in chained}
    if chained:
        state = _ExportProbe(graph)
        writer = SubgraphWriter(state, main, SubgraphDef("probe"), names, onames, 0)
        writer.only = chained
        try:
            writer.run()
        except Exception as e:  # noqa: BLE001
            state.refused.append(f"inputs: exporter failed: {type(e).__name__}: {e}")
        for k, why in _per_operation(state.refused, main).items():
            per.setdefault(k, why)
    if converted is not None and not refused:
        keep_converted(graph, converted, exact_resize=True)
    return per


def _per_operation(refused: list[str], sgg: SubgraphGraph) -> dict[int, str]:
    """The exporter's refusals of ``sgg`` by operation index (a referenced subgraph's own
    refusals are judged with that subgraph)."""
    per: dict[int, str] = {}
    prefix = "" if sgg.index == -1 else f"subgraph {sgg.index} "
    for item in refused:
        if not item.startswith(prefix):
            continue
        rest = item[len(prefix):]
        if rest.startswith("#"):
            head, _, why = rest.partition(" ")
            per.setdefault(int(head[1:]), "exporter: " + why.partition(": ")[2])
        else:
            for k in range(len(sgg.operations)):
                per.setdefault(k, "exporter: " + rest)
    return per


class _ExportProbe:
    """Just enough of the exporter's state for a SubgraphWriter (ExportState protocol): the
    referenced subgraphs an IF / WHILE converter asks for are written once each."""

    def __init__(self, graph: ModelGraph) -> None:
        self.model = ModelDef()
        self.referenced = graph.referenced
        self.refused: list[str] = []
        self.converters = CONVERTERS
        self.exact_resize = True  # the driver's export (device.compile_now)
        self.guard_division = False
        self.extension_ops = graph.extension_ops
        self._done: dict[tuple[int, int], int] = {}

    @staticmethod
    def fusions(g: SubgraphGraph) -> dict:
        """No chains: each operation is judged on its own, as a partition may cut a chain the
        export would write as one operator (and that chain falls back to its operations)."""
        return {}

    def subgraph(self, ref: int, passthrough: int = 0) -> int:
        key = (ref, passthrough)
        if key not in self._done:
            self._done[key] = -1
            sg = SubgraphDef(f"subgraph_{ref}")
            self.model.subgraphs.append(sg)
            self._done[key] = len(self.model.subgraphs) - 1
            saved, self.refused = self.refused, []
            SubgraphWriter(self, self.referenced[ref], sg, None, None, passthrough).run()
            self.refused = saved
        return self._done[key]


@functools.lru_cache(maxsize=1024)
def _omittable_positions(op: OperationType, n: int) -> tuple[int, ...]:
    """The input positions an operation of ``n`` inputs may omit (its signature's: static,
    so found once per operation type and count)."""
    s = SIGNATURES.get(op)
    if s is None:
        return ()
    found: set[int] = set()
    for form in s.forms:
        if any(slot.repeated for slot in form.inputs):
            continue
        found |= {j for j, slot in enumerate(form.inputs[:n]) if slot.omittable}
    return tuple(sorted(found))


def _const(g: SubgraphGraph, i: int) -> np.ndarray | None:
    info = g.operands[i]
    return np.asarray(info.value) if info.is_const else None


def _rule(graph: ModelGraph, g: SubgraphGraph, name: str, ins: list[int],
          outs: list[int]) -> str | None:
    """Why the survey-derived rules refuse this operation, or None."""
    if name in _ALWAYS:
        return REFUSED[name][0][1]
    shapes = g.shapes
    for i in (*ins, *outs):
        if shapes[i] is None:  # (known for almost every operand: the one test first)
            info = g.operands[i]
            if info.type.is_tensor and not info.omitted:
                return f"operand #{i} has an unknown rank; TFLite tensors need a rank"
    op = OperationType[name]
    for j in _omittable_positions(op, len(ins)):
        # A temporary too: the runtime hands a step of a split model its temporaries as
        # model inputs, and the step's prepare must accept what this claim promised.
        info = g.operands[ins[j]]
        if not info.is_const and not info.omitted:
            return (f"input {j} may be omitted by the request (it is computed at run time, "
                    f"and a step of a split model gets it as a model input), and a TFLite "
                    f"model cannot leave an input out")
    if name in ("RESHAPE", "SQUEEZE") and len(ins) > 1:
        shape = g.shapes[outs[0]]
        if not g.operands[ins[1]].is_const and not g.operands[ins[1]].omitted and \
                (shape is None or 0 in shape):
            return REFUSED[name][0][1]
    if name == "BATCH_MATMUL" and _maybe_empty(g, ins[:2]):
        return REFUSED[name][1][1]
    if name == "MIRROR_PAD":
        if not g.operands[ins[1]].is_const and not _litert_bounds_mirror_pad():
            return REFUSED[name][0][1]
        if _scalar(g, ins[2]) == 0 and _maybe_empty(g, ins[:1]):
            return REFUSED[name][1][1]
    why = _edge_rule(graph, g, name, ins, outs)
    if why is not None:
        return why
    out_shape = g.shapes[outs[0]]
    if name in _RANK0 and (out_shape is None or 0 in out_shape) and \
            _rank0(g, name, ins, outs):
        # A known output shape is safe: TFLite's result has rank 0 only when the HAL's is [1],
        # and for that the exporter reshapes to [1].
        return ("TFLite may give a rank-0 result where the HAL gives shape [1], and the "
                "output shape is not known at prepare to reshape it")
    return None


@functools.cache
def _litert_bounds_mirror_pad() -> bool:
    """Whether the installed ai-edge-litert checks MIRROR_PAD's run-time paddings (2.3 does)."""
    try:
        found = importlib.metadata.version("ai-edge-litert")
    except importlib.metadata.PackageNotFoundError:
        return False
    parts = []
    for p in found.split(".")[:2]:
        digits = "".join(c for c in p if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts) >= (2, 3)


def _maybe_empty(g: SubgraphGraph, ins: list[int]) -> bool:
    """Whether an input's shape has a dimension known only at run time (possibly 0)."""
    return any(g.shapes[i] is None or 0 in g.shapes[i] for i in ins)


_Q8 = (T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED)


def _edge_float(graph: ModelGraph, name: str, t_in: OperandType) -> str | None:
    """EDGE_FLOAT's refusal of an operation (a HAL one, or the extension's of that short
    name), unless the model runs with XNNPACK off and the difference is XNNPACK's."""
    edge = EDGE_FLOAT.get(name)
    if edge is None or t_in.name not in edge[0] or (
            name in XNNPACK_EDGES and builtin_kernels(graph)):
        return None
    return f"{t_in.name} input: {edge[1]}"


def _edge_rule(graph: ModelGraph, g: SubgraphGraph, name: str, ins: list[int],
               outs: list[int]) -> str | None:
    """The narrowings the edge sweep measured (see EDGE_FLOAT and REFUSED)."""
    t_in = g.operands[ins[0]].type
    why = _edge_float(graph, name, t_in)
    if why is not None and not _edge_unreached(graph, g, name, ins):
        return why
    if name == "CAST":
        if t_in == T.TENSOR_INT32 and g.operands[outs[0]].type == T.TENSOR_QUANT8_ASYMM:
            return EDGE_RULES[name][1]
    elif name == "TOPK_V2":
        return EDGE_RULES[name][1]
    elif name == "LSH_PROJECTION":
        if g.operands[ins[1]].type == T.TENSOR_FLOAT16 and _scalar(g, ins[3]) != 2:
            return EDGE_RULES[name][1]
    elif name == "PRELU":
        x, a = g.shapes[ins[0]], g.shapes[ins[1]]
        if x is None or a is None or len(a) > len(x) or 0 in x or 0 in a or \
                any(d not in (1, x[len(x) - len(a) + k]) for k, d in enumerate(a)):
            return EDGE_RULES[name][1]
    elif name == "RESHAPE":
        shape = g.shapes[ins[0]]
        if shape is None or 0 in shape:
            return EDGE_RULES[name][1]
    elif (name == "ADD" and t_in in _Q8) or (name == "MUL" and t_in == T.TENSOR_QUANT8_ASYMM):
        a, b = g.operands[ins[0]].scale, g.operands[ins[1]].scale
        if (max(a, b) if name == "ADD" else a * b) >= 256 * g.operands[outs[0]].scale:
            return EDGE_RULES[name][1]
    elif name == "LOG_SOFTMAX" and t_in == T.TENSOR_FLOAT32:
        beta = _const(g, ins[1])
        if beta is None or float(beta.reshape(-1)[0]) > 1.0:
            return EDGE_RULES[name][1]
    elif name in ("LOGISTIC", "TANH") and t_in in _Q8:
        if g.operands[ins[0]].scale >= (4.0 if name == "LOGISTIC" else 8.0):
            return EDGE_RULES[name][1]
    elif name in _TERMS and t_in in _Q8 and _left_shift_may_wrap(g, name, ins, outs):
        return EDGE_RULES[name][1]
    return None


#: The filter dimensions one output of each accumulating operation sums over.
_TERMS = {"CONV_2D": (1, 2, 3), "DEPTHWISE_CONV_2D": (1, 2), "GROUPED_CONV_2D": (1, 2, 3),
          "TRANSPOSE_CONV_2D": (1, 2, 3), "FULLY_CONNECTED": (1,)}


def _left_shift_may_wrap(g: SubgraphGraph, name: str, ins: list[int], outs: list[int]) -> bool:
    """Whether a quantized convolution's or dense layer's multiplier above 1 may shift
    sum + bias out of int32 (where the reference kernels wrap and XNNPACK saturates):
    the largest |sum + bias| the operand types and constants allow, shifted left by the
    largest shift. A multiplier below 1 (every real model measured) never shifts left.
    XNNPACK takes these operations only with a constant filter and bias: otherwise TFLite's
    own kernel runs, which wraps as the reference does (measured on ai-edge-litert 2.3 with
    either one a model input; tests/ops/test_conv_bias_limits.py checks it still holds)."""
    x, f, b, y = g.operands[ins[0]], g.operands[ins[1]], g.operands[ins[2]], g.operands[outs[0]]
    if not (f.is_const and b.is_const):
        return False
    try:
        scales = f.channel_scales if f.type == T.TENSOR_QUANT8_SYMM_PER_CHANNEL else [f.scale]
        if float(np.max(conv_multipliers(x.scale, scales, y.scale), initial=0.0)) < 0.5:
            return False  # no channel shifts left (one vectorised test; the usual case)
        left = int(np.max(ConvRequant(x, f, y).shift))
    except (ValueError, TypeError, OverflowError, ZeroDivisionError):
        return True  # validation words what is wrong; claim nothing unsure
    if left <= 0:
        return False
    shape = g.shapes[ins[1]]
    if shape is None or len(shape) <= max(_TERMS[name]) or 0 in shape:
        return True
    terms = int(np.prod([shape[d] for d in _TERMS[name]]))
    zf = 0 if f.type == T.TENSOR_QUANT8_SYMM_PER_CHANNEL else f.zero_point
    fmax = int(np.abs(np.asarray(f.value, np.int64) - zf).max(initial=0))
    bmax = int(np.abs(np.asarray(b.value, np.int64)).max(initial=0))
    return (terms * input_bound(x) * fmax + bmax) << left > C.INT32_MAX


def _scalar(g: SubgraphGraph, i: int) -> int | None:
    v = _const(g, i)
    return None if v is None or v.size != 1 else int(v.reshape(-1)[0])


def _rank0(g: SubgraphGraph, name: str, ins: list[int], outs: list[int]) -> bool:
    """Whether TFLite's result of this operation may have rank 0 (unsure: True when the HAL
    output is [1])."""
    in_shape = g.shapes[ins[0]]
    out_shape = g.shapes[outs[0]]
    unsure = out_shape is None or len(out_shape) == 1
    if in_shape is None:
        return unsure
    rank = len(in_shape)
    if name in ("ARGMAX", "ARGMIN"):
        return rank == 1
    if name == "STRIDED_SLICE":
        mask = _scalar(g, ins[6]) if len(ins) > 6 else 0
        if mask is None:
            return unsure
        return all(mask >> d & 1 for d in range(rank))
    if name == "SQUEEZE":
        if len(ins) < 2 or g.operands[ins[1]].omitted:
            if 0 in in_shape:
                return unsure
            return all(d == 1 for d in in_shape)
        axes = _const(g, ins[1])
        if axes is None:
            return unsure
        return _covers(axes.reshape(-1), rank)
    # MEAN and REDUCE_*: (input, axes, keep_dims)
    keep = _scalar(g, ins[2]) if len(ins) > 2 else 0
    axes = _const(g, ins[1])
    if keep is None or axes is None:
        return unsure
    return not keep and _covers(axes.reshape(-1), rank)


def _covers(axes: Iterable[int], rank: int) -> bool:
    return len({int(a) % rank for a in axes} if rank else set()) == rank
