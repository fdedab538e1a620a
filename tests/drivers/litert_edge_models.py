"""One-operation models with edge inputs for every (operation, type variant) the LiteRT driver
may claim, run on the reference driver and on LiteRT (issue 27 item 4).

The pairs come from the signature table (:data:`nnhal.ops.catalog.SIGNATURES`, one pair per
variant) crossed with what the exporter converts, minus what the support rule refuses for
every model (:data:`nnhal.drivers.litert.support.REFUSED` kinds named "every..."), so an
operation the driver starts to claim is a pair here at once, and :data:`GENERATORS` must then
have an entry for it. Each generator takes the variant's type binding and returns cases:
operand specifications (model inputs filled with the type's edge values, constants, scalars,
omitted operands) whose outputs' shapes the reference's inference supplies.

Edge values: float NaN, +-Inf, -0.0, the largest and smallest (subnormal) magnitudes, ties
(x.5); int32 at its limits (overflow); every stored value of an 8-bit quantized type under
extreme scales and zero points at the ends of the range, and scale ratios that make
requantization ties; zero-sized and broadcast shapes; every fused activation.

All cases of one operation are built into one model of independent operations, so the whole
sweep is one analysis, one prepare and one execution per operation and driver.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nnhal.analysis import analyse
from nnhal.extensions.tflite_builtins import EXTENSION
from nnhal.hal.builder import ModelBuilder, SubgraphBuilder
from nnhal.hal.types import (
    ExtensionNameAndPrefix,
    Model,
    OperandType,
    OperationType,
    SymmPerChannelQuantParams,
)
from nnhal.ops.catalog import SIGNATURES
from nnhal.ops.signature import Variant

T, O = OperandType, OperationType
F32, F16, I32, BOOL8 = T.TENSOR_FLOAT32, T.TENSOR_FLOAT16, T.TENSOR_INT32, T.TENSOR_BOOL8
Q8, Q8S, Q8SYM = T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED, T.TENSOR_QUANT8_SYMM
Q8PC, Q16A, Q16S = T.TENSOR_QUANT8_SYMM_PER_CHANNEL, T.TENSOR_QUANT16_ASYMM, T.TENSOR_QUANT16_SYMM
QUANT = (Q8, Q8S, Q8SYM, Q8PC, Q16A, Q16S)
INF, NAN = math.inf, math.nan
I32_MIN, I32_MAX = -2**31, 2**31 - 1

# ---- edge values ---------------------------------------------------------------------------

F32_EDGE = [NAN, INF, -INF, -0.0, 0.0, 1.0, -1.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 0.25, 0.75,
            3.4028235e38, -3.4028235e38, 1.1754944e-38, -1.1754944e-38, 1e20, -1e20, 65504.0,
            88.7, -87.3, 1e-7, 3.0, 6.0, 7.0, -7.0, 100.0, -0.125]
F16_EDGE = [NAN, INF, -INF, -0.0, 0.0, 1.0, -1.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 0.25, 0.75,
            65504.0, -65504.0, 6.104e-5, -6.104e-5, 1000.0, -1000.0, 11.1, -10.4, 3.0, 6.0,
            7.0, -7.0, 100.0, 0.1, -0.125, 4.0]
I32_EDGE = [I32_MIN, I32_MIN + 1, I32_MAX, I32_MAX - 1, -1, 0, 1, 2, 3, -3, 7, -7, 46341, -46341,
            65536, 1 << 30, -(1 << 30), 255, 256, -129, 128, 1000]


def edge_values(t: OperandType, small: bool = False) -> np.ndarray:
    """Every edge value of type ``t`` (stored values for quantized types); ``small``: a subset
    of 16 for the 8-bit types (binary operations pair every value with every other)."""
    if t == F32:
        return np.array(F32_EDGE, np.float32)
    if t == F16:
        return np.array(F16_EDGE, np.float16)
    if t == I32:
        return np.array(I32_EDGE, np.int32)
    if t == BOOL8:
        return np.array([0, 1], np.bool_)
    info = np.iinfo(t.dtype)
    lo, hi = int(info.min), int(info.max)
    if t in (Q16A, Q16S):
        mid = (lo + hi + 1) // 2
        vals = [lo, lo + 1, mid - 1, mid, mid + 1, hi - 1, hi, mid + 100, mid - 100, lo + 7]
        return np.array(vals, t.dtype)
    if small:
        mid = (lo + hi + 1) // 2
        return np.array([lo, lo + 1, lo + 2, lo + 3, mid - 64, mid - 28, mid - 2, mid - 1, mid,
                         mid + 1, mid + 2, mid + 63, hi - 5, hi - 2, hi - 1, hi], t.dtype)
    return np.arange(lo, hi + 1).astype(t.dtype)


def _shift(t: OperandType, q: tuple[float, int]) -> tuple[float, int]:
    """Quantization parameters given for TENSOR_QUANT8_ASYMM, moved to type ``t``."""
    s, z = q
    if t == Q8S:
        return s, z - 128
    if t in (Q8SYM, Q8PC, Q16S):
        return s, 0
    if t == Q16A:
        return s, z * 257
    return s, z


#: Input quantization (scale, zero point) of an operation whose output must match it, as
#: TENSOR_QUANT8_ASYMM: tiny and huge scales, zero points at both ends.
Q_SAME = [(0.5, 128), (1e-4, 255), (100.0, 0), (0.75, 3)]
#: (input, output) quantization where the output's may differ: identity, ratio 1/2 (every odd
#: stored value a tie), ratio 3/2, tiny scales, huge input scale into a tiny output (saturation)
Q_PAIRS = [((0.5, 128), (0.5, 128)), ((0.5, 128), (1.0, 128)), ((0.75, 0), (0.5, 255)),
           ((1e-4, 255), (1e-3, 0)), ((100.0, 0), (0.01, 128)), ((0.02, 250), (0.2, 5))]
#: (input0, input1, output) of binary quantized operations; two put ADD's input to output
#: scale ratio and MUL's product ratio at 256 and beyond; the last two share one tiny and one
#: large scale (where TFLite's quantized comparisons stop ranking stored values exactly).
Q_TRIPLES = [((0.5, 128), (0.5, 128), (0.5, 128)), ((0.5, 128), (0.25, 0), (1.0, 128)),
             ((1e-3, 255), (2e-3, 0), (1e-3, 128)), ((10.0, 0), (0.1, 255), (0.05, 0)),
             ((0.75, 3), (0.75, 250), (1.5, 127)), ((100.0, 200), (1e-4, 60), (1e-2, 0)),
             ((15.99, 0), (16.0, 255), (1.0, 128)), ((16.0, 0), (16.0, 255), (1.0, 128)),
             ((1e-4, 200), (1e-4, 200), (1e-4, 200)), ((2.0, 7), (2.0, 7), (2.0, 7))]


# ---- operand specifications -----------------------------------------------------------------

@dataclass
class In:
    """A model input; values default to the type's edge values, cycled over the shape."""

    t: OperandType
    shape: Sequence[int]
    q: tuple[float, int] = (0.0, 0)
    values: Any = None
    small: bool = False
    channel: tuple[Sequence[float], int] | None = None

    @property
    def fed_shape(self) -> list[int]:
        """The shape fed: a zero-sized input (a request cannot pass one) is fed as one row
        and sliced to zero rows by a SLICE in front of the case's operation."""
        return [1 if d == 0 else d for d in self.shape]

    def value(self, finite: bool = False) -> np.ndarray:
        """The values fed; ``finite``: NaN and the infinities left out of the cycle."""
        shape = self.fed_shape
        size = int(np.prod(shape))
        v = edge_values(self.t, self.small) if self.values is None else \
            np.asarray(self.values).astype(self.t.dtype)
        if finite and v.dtype.kind == "f":
            v = v[np.isfinite(v)]
        return np.resize(v, size).reshape(shape) if v.size else np.zeros(shape, self.t.dtype)


@dataclass
class Const:
    t: OperandType
    value: Any
    shape: Sequence[int] | None = None
    q: tuple[float, int] = (0.0, 0)
    channel: tuple[Sequence[float], int] | None = None


@dataclass
class Omit:
    t: OperandType


@dataclass
class Sub:
    """A referenced subgraph, built by ``build(subgraph builder)``."""

    build: Callable[[SubgraphBuilder], None]


@dataclass
class Out:
    t: OperandType
    q: tuple[float, int] = (0.0, 0)
    channel: tuple[Sequence[float], int] | None = None
    #: Declared when the analysis does not infer it (IF's outputs).
    shape: Sequence[int] | None = None


def scalar(t: OperandType, v: Any) -> Const:
    return Const(t, v)


def i32(v: int) -> Const:
    return Const(T.INT32, v)


def flag(v: bool) -> Const:
    return Const(T.BOOL, v)


def ivec(*v: int) -> Const:
    return Const(I32, np.array(v, np.int32), [len(v)])


@dataclass
class Case:
    """One operation of a sweep: (operation, variant) pair, a name, its operands."""

    pair: str
    name: str
    op: OperationType
    ins: list[Any]
    outs: list[Out]
    #: Output shapes, filled in by :func:`infer_shapes`.
    shapes: list[tuple[int, ...]] = field(default_factory=list)

    @property
    def has_f16(self) -> bool:
        return any(getattr(s, "t", None) == F16 for s in (*self.ins, *self.outs))

    @property
    def nonfinite(self) -> bool:
        """Whether an input is fed NaN or an infinity (then the case also runs finite only)."""
        return any(isinstance(s, In) and s.t in (F32, F16) and
                   not np.isfinite(s.value()).all() for s in self.ins)


def _cq(channel: tuple[Sequence[float], int] | None) -> SymmPerChannelQuantParams | None:
    return None if channel is None else SymmPerChannelQuantParams(list(channel[0]), channel[1])


def add_case(b: ModelBuilder, case: Case, known: bool, finite: bool = False
             ) -> list[np.ndarray]:
    """Add the case's operation (its operands and outputs) to ``b``; the values of the model
    inputs it added, in order. ``known``: declare the inferred output shapes; ``finite``: feed
    no NaN or infinity."""
    ins: list[int] = []
    feeds: list[np.ndarray] = []
    for s in case.ins:
        if isinstance(s, In):
            i = b.input(s.t, s.fed_shape, *s.q, _cq(s.channel))
            feeds.append(s.value(finite))
            if 0 in s.shape:
                z = b.operand(s.t, list(s.shape), *s.q, _cq(s.channel))
                b.operation(O.SLICE, [i, ivec_in(b, [0] * len(s.shape)),
                                      ivec_in(b, list(s.shape))], [z])
                i = z
            ins.append(i)
        elif isinstance(s, Const):
            if s.t.is_scalar:
                ins.append(b.scalar(s.t, s.value))
            else:
                ins.append(b.constant(s.t, s.value, s.shape, *s.q, _cq(s.channel)))
        elif isinstance(s, Omit):
            ins.append(b.omitted(s.t))
        elif isinstance(s, Sub):
            sb = b.subgraph()
            s.build(sb)
            ins.append(b.reference(sb))
        else:
            raise TypeError(s)
    outs = []
    for k, o in enumerate(case.outs):
        dims = list(o.shape) if o.shape is not None else list(case.shapes[k]) if known else []
        if o.t.is_scalar:
            dims = []
        outs.append(b.output(o.t, dims, *o.q, _cq(o.channel)))
    b.operation(case.op, ins, outs)
    return feeds


def ivec_in(b: SubgraphBuilder, v: list[int]) -> int:
    return b.constant(I32, np.array(v, np.int32), [len(v)])


def build(cases: Sequence[Case], known: bool = True, finite: bool = False
          ) -> tuple[Model, list[np.ndarray], list[range]]:
    """One model of the cases' operations side by side; its inputs' values (``finite``: no NaN
    or infinity); per case, the indexes of its operations."""
    b = ModelBuilder()
    feeds: list[np.ndarray] = []
    spans = []
    for c in cases:
        first = len(b.operations)
        feeds += add_case(b, c, known, finite)
        spans.append(range(first, len(b.operations)))
    model = b.build()
    if any(isinstance(c.op, ExtOp) for c in cases):
        model.extension_name_to_prefix = [ExtensionNameAndPrefix(EXTENSION.name, EXT_PREFIX)]
    return model, feeds, spans


def infer_shapes(cases: Sequence[Case]) -> None:
    """Each output's shape as the reference infers it (one analysis for all cases)."""
    model, _, _ = build(cases, known=False)
    g = analyse(model, own_constants=False)
    k = 0
    for c in cases:
        c.shapes = []
        for _ in c.outs:
            shape = g.main.shapes[g.main.outputs[k]]
            c.shapes.append(tuple(shape) if shape is not None else ())
            k += 1


# ---- per operation ---------------------------------------------------------------------------

Gen = Callable[[dict[str, OperandType]], list[tuple[str, list[Any], list[Out]]]]
#: Per operation name: the cases of one variant (its type binding).
GENERATORS: dict[str, Gen] = {}


def gen(*names: str) -> Callable[[Gen], Gen]:
    def deco(f: Gen) -> Gen:
        for n in names:
            GENERATORS[n] = f
        return f
    return deco


def _zero_ok(t: OperandType) -> bool:
    """Whether a zero-sized tensor of type ``t`` can be made (by SLICE, see :class:`In`)."""
    return t in (F32, F16, I32, Q8, Q8S)


def _is_q(t: OperandType) -> bool:
    return t in QUANT


def _fixed_out(op: str, t: OperandType) -> tuple[float, int] | None:
    """Output quantization NNAPI fixes for an operation, if it does."""
    signed = t == Q8S
    if op in ("LOGISTIC", "SOFTMAX"):
        return (1 / 256, -128 if signed else 0)
    if op in ("TANH", "L2_NORMALIZATION"):
        return (1 / 128, 0 if signed else 128)
    return None


def _unary_q(op: str, t: OperandType, same: bool) -> list[tuple[tuple, tuple]]:
    fixed = _fixed_out(op, t)
    pairs = Q_PAIRS if op != "HARD_SWISH" else [p for p in Q_PAIRS if p[0][0] / p[1][0] < 1e3]
    if fixed is not None:
        # and input scales either side of where LOGISTIC (4) and TANH (8) stop agreeing
        edges = [(3.99, 128), (4.0, 128), (7.99, 128), (8.0, 128)]
        return [(_shift(t, qi), fixed) for qi in (*Q_SAME, *edges)]
    if same:
        return [(_shift(t, q), _shift(t, q)) for q in Q_SAME]
    return [(_shift(t, a), _shift(t, b)) for a, b in pairs]


#: Unary operations whose quantized output may have other parameters than the input's.
_FREE_OUT = {"HARD_SWISH", "LOGISTIC", "TANH", "L2_NORMALIZATION", "SOFTMAX", "RSQRT"}


def _unary(op: str, tail: Callable[[OperandType], list[Any]] = lambda t: [],
           shapes: Sequence[Sequence[int] | None] = (None, (0, 3))) -> Gen:
    """An elementwise operation: the edge values as one vector, and a zero-sized tensor."""

    def g(v: dict[str, OperandType]) -> list:
        t = v["T"]
        out = []
        for shape in shapes:
            if shape is not None and 0 in shape and not _zero_ok(t):
                continue
            n = len(edge_values(t)) if shape is None else None
            dims = [n] if shape is None else list(shape)
            tag = "zero-sized" if 0 in dims else "edges"
            if _is_q(t):
                for qi, qo in _unary_q(op, t, op not in _FREE_OUT):
                    out.append((f"{tag} in{qi} out{qo}", [In(t, dims, qi), *tail(t)],
                                [Out(t, qo)]))
                    if 0 in dims:
                        break
            else:
                out.append((tag, [In(t, dims), *tail(t)], [Out(t)]))
        return out
    return g


for _n in ("RELU", "RELU1", "RELU6", "LOGISTIC", "TANH", "HARD_SWISH", "EXP", "LOG", "RSQRT",
           "SIN", "SQRT", "ABS", "NEG", "FLOOR"):
    GENERATORS[_n] = _unary(_n)

GENERATORS["ELU"] = _unary("ELU", lambda t: [scalar(T.FLOAT32 if t == F32 else T.FLOAT16,
                                                    0.5)])
GENERATORS["LOGICAL_NOT"] = lambda v: [("bool", [In(BOOL8, [2])], [Out(BOOL8)])]


@gen("CAST")
def _cast(v: dict[str, OperandType]) -> list:
    t, u = v["T"], v["U"]
    qi = (0.5, 3) if _is_q(t) else (0.0, 0)
    qo = (0.25, 7) if _is_q(u) else (0.0, 0)
    qi, qo = (_shift(t, qi) if _is_q(t) else qi), (_shift(u, qo) if _is_q(u) else qo)
    zero = [("zero-sized", [In(t, [0, 2], qi)], [Out(u, qo)])] if _zero_ok(t) else []
    return [("edges", [In(t, [len(edge_values(t))], qi)], [Out(u, qo)]), *zero]


@gen("QUANTIZE")
def _quantize(v: dict[str, OperandType]) -> list:
    t, u = v["T"], v["U"]
    n = len(edge_values(t))
    qs = [(1.0, 128), (0.5, 0), (0.25, 255), (1e-3, 100), (1000.0, 128), (0.1, 255)]
    return [(f"out{_shift(u, q)}", [In(t, [n])], [Out(u, _shift(u, q))]) for q in qs]


@gen("DEQUANTIZE")
def _dequantize(v: dict[str, OperandType]) -> list:
    t, u = v["T"], v["U"]
    n = len(edge_values(t))
    if t == Q8PC:
        return [("per-channel", [In(t, [2, n], channel=([1e-4, 100.0], 0))], [Out(u)]),
                ("per-channel axis 1", [In(t, [n, 2], channel=([0.5, 3.0], 1))], [Out(u)])]
    return [(f"in{_shift(t, q)}", [In(t, [n], _shift(t, q))], [Out(u)]) for q in Q_SAME]


def _binary(op: str, act: bool) -> Gen:
    """Every edge value against every other (broadcast [n,1] x [1,n]), the same shape, and
    zero-sized broadcasting; each fused activation when the operation has one."""

    def g(v: dict[str, OperandType]) -> list:
        t = v.get("T", BOOL8)
        out_t = BOOL8 if op in _CMP or op.startswith("LOGICAL") else t
        small = _is_q(t)
        n = len(edge_values(t, small))
        acts = range(4) if act and t != I32 else [0] if act else [None]
        result = []
        qs = [((0.0, 0),) * 3] if not _is_q(t) else \
            [tuple(_shift(t, q) for q in tr) for tr in Q_TRIPLES]
        for qa, qb, qo in qs:
            qo = qo if out_t == t else (0.0, 0)
            for a in acts:
                tail = [] if a is None else [i32(a)]
                result.append((f"bcast act={a} q={qa},{qb},{qo}",
                               [In(t, [n, 1], qa, small=small), In(t, [1, n], qb, small=small),
                                *tail], [Out(out_t, qo)]))
        tail = [i32(0)] if act else []
        qa, qb, qo = qs[0]
        qo = qo if out_t == t else (0.0, 0)
        if _zero_ok(t):
                result.append(("zero-sized bcast", [In(t, [0, 1], qa), In(t, [1, 3], qb), *tail],
                           [Out(out_t, qo)]))
        result.append(("rank-4 bcast", [In(t, [2, 1, 3, 1], qa), In(t, [4, 1, 2], qb), *tail],
                       [Out(out_t, qo)]))
        return result
    return g


_CMP = {"EQUAL", "NOT_EQUAL", "GREATER", "GREATER_EQUAL", "LESS", "LESS_EQUAL"}
for _n in ("ADD", "SUB", "MUL", "DIV"):
    GENERATORS[_n] = _binary(_n, True)
for _n in ("POW", "MAXIMUM", "MINIMUM", "LOGICAL_AND", "LOGICAL_OR", *_CMP):
    GENERATORS[_n] = _binary(_n, False)
_prelu_bcast = _binary("PRELU", False)


@gen("PRELU")
def _prelu(v: dict[str, OperandType]) -> list:
    t = v["T"]
    n = len(edge_values(t, True))
    qs = [((0.0, 0),) * 3] if not _is_q(t) else \
        [tuple(_shift(t, q) for q in tr) for tr in Q_TRIPLES]
    return [*_prelu_bcast(v), *[
        (f"channel alpha q={qa},{qb},{qo}", [In(t, [2, 3, n], qa, small=True),
                                             In(t, [n], qb, small=True)], [Out(t, qo)])
        for qa, qb, qo in qs], *[
        (f"same shape q={qa},{qb},{qo}", [In(t, [4, n], qa, small=True),
                                          In(t, [4, n], qb, small=True)], [Out(t, qo)])
        for qa, qb, qo in qs], *_prelu_one_alpha(t)]


def _prelu_one_alpha(t: OperandType) -> list:
    """One constant alpha (the exporter writes TFLite's LEAKY_RELU): float alphas of each
    sign, 0 and above 1; 8-bit ones of one step of their scale (as the importer writes
    LEAKY_RELU), of several steps, and of 0 steps, over the quantization triples."""
    n = len(edge_values(t))
    if not _is_q(t):
        return [(f"one alpha {a}", [In(t, [2, n]), Const(t, np.array([a], t.dtype), [1])],
                 [Out(t)]) for a in (0.2, -0.3, 0.0, 1.5)]
    lo = int(np.iinfo(t.dtype).min)
    out = []
    for qx, _, qo in [tuple(_shift(t, q) for q in tr) for tr in Q_TRIPLES]:
        for scale, stored, zero in ((0.2, lo + 1, lo), (0.01, lo + 1, lo), (0.3, lo, lo + 1),
                                    (0.05, lo + 7, lo + 2), (1.0, lo, lo)):
            alpha = Const(t, np.array([stored], t.dtype), [1], (scale, zero))
            out.append((f"one alpha {scale}x{stored - zero} q={qx},{qo}",
                        [In(t, [2, n], qx), alpha], [Out(t, qo)]))
    return out


@gen("SELECT")
def _select(v: dict[str, OperandType]) -> list:
    t = v["T"]
    n = len(edge_values(t))
    cond = In(BOOL8, [n], values=np.arange(n) % 3 == 0)
    rev = edge_values(t)[::-1]
    if not _is_q(t):
        # constant ones and zeros: the exporter writes a CAST of the condition
        ones, zeros = (Const(t, np.full(n, k, t.dtype), [n]) for k in (1, 0))
        return [("edges", [cond, In(t, [n]), In(t, [n], values=rev)], [Out(t)]),
                ("ones and zeros", [cond, ones, zeros], [Out(t)]),
                ("zeros and ones", [cond, zeros, ones], [Out(t)])]
    return [(f"q={qa},{qb},{qo}", [cond, In(t, [n], qa), In(t, [n], qb, values=rev)],
             [Out(t, qo)]) for qa, qb, qo in
            [tuple(_shift(t, q) for q in tr) for tr in Q_TRIPLES]]


def _q_same(t: OperandType, k: int = 2) -> list[tuple[float, int]]:
    """Quantization of data-movement operations (the output's equals the input's)."""
    return [_shift(t, q) for q in Q_SAME[:k]] if _is_q(t) else [(0.0, 0)]


def _moves(make: Callable[[OperandType], list[tuple[str, Sequence[int], list[Any], int]]]
           ) -> Gen:
    """Data-movement operations: ``make(t)`` gives (name, input shape, other operands, number
    of outputs); the output's quantization is the input's."""

    def g(v: dict[str, OperandType]) -> list:
        t = v["T"]
        result = []
        for q in _q_same(t):
            for name, shape, rest, nout in make(t):
                result.append((f"{name} q={q}", [In(t, shape, q), *rest],
                               [Out(t, q) for _ in range(nout)]))
        return result
    return g


GENERATORS["RESHAPE"] = _moves(lambda t: [("flatten", [2, 3, 4], [ivec(-1)], 1),
                                          ("split dims", [24], [ivec(4, -1, 2)], 1),
                                          ("zero-sized", [0, 3], [ivec(3, 0)], 1)])
GENERATORS["SQUEEZE"] = _moves(lambda t: [("axes", [1, 5, 1], [ivec(0)], 1),
                                          ("omitted", [1, 5, 1, 2], [Omit(I32)], 1)])
GENERATORS["EXPAND_DIMS"] = _moves(lambda t: [("axis 0", [5], [i32(0)], 1),
                                              ("axis -1", [2, 3], [i32(-1)], 1)])
GENERATORS["TRANSPOSE"] = _moves(lambda t: [("perm", [2, 3, 4], [ivec(2, 0, 1)], 1),
                                            ("omitted", [2, 5], [Omit(I32)], 1)])
GENERATORS["SPLIT"] = _moves(lambda t: [("axis 0", [4, 3], [i32(0), i32(2)], 2),
                                        ("axis -1", [2, 6], [i32(-1), i32(3)], 3)])
GENERATORS["SLICE"] = _moves(lambda t: [("size -1", [4, 5], [ivec(1, 0), ivec(2, -1)], 1),
                                        ("empty", [4, 5], [ivec(1, 2), ivec(0, 3)], 1)])
GENERATORS["STRIDED_SLICE"] = _moves(lambda t: [
    ("stride 2", [4, 5], [ivec(0, 1), ivec(4, 5), ivec(2, 1), i32(0), i32(0), i32(0)], 1),
    ("negative stride", [4, 5], [ivec(3, 4), ivec(0, 0), ivec(-1, -2), i32(0), i32(2), i32(0)],
     1),
    ("shrink", [4, 5], [ivec(1, 0), ivec(2, 5), ivec(1, 1), i32(0), i32(0), i32(1)], 1)])
GENERATORS["GATHER"] = _moves(lambda t: [
    ("axis 0", [5, 3], [i32(0), ivec(4, 0, 2, 4)], 1),
    ("axis -1 indices input", [2, 6], [i32(-1), In(I32, [3], values=[5, 0, 3])], 1)])
GENERATORS["TILE"] = _moves(lambda t: [("multiples", [2, 3], [ivec(2, 1)], 1),
                                       ("rank 3", [1, 2, 3], [ivec(1, 3, 2)], 1)])
GENERATORS["PAD"] = _moves(lambda t: [
    ("paddings", [2, 3], [Const(I32, np.array([[1, 0], [0, 2]], np.int32), [2, 2])], 1)])
GENERATORS["DEPTH_TO_SPACE"] = _moves(lambda t: [("block 2", [1, 2, 2, 8], [i32(2)], 1),
                                                 ("nchw", [1, 8, 2, 2], [i32(2), flag(True)], 1)])
GENERATORS["SPACE_TO_DEPTH"] = _moves(lambda t: [("block 2", [1, 4, 4, 2], [i32(2)], 1),
                                                 ("nchw", [1, 2, 4, 4], [i32(2), flag(True)], 1)])
GENERATORS["BATCH_TO_SPACE_ND"] = _moves(lambda t: [("block", [4, 2, 2, 2], [ivec(2, 2)], 1)])
GENERATORS["SPACE_TO_BATCH_ND"] = _moves(lambda t: [
    ("no pad", [1, 4, 4, 2], [ivec(2, 2), Const(I32, np.zeros((2, 2), np.int32), [2, 2])], 1),
    ("pad", [1, 3, 2, 2], [ivec(2, 2), Const(I32, np.array([[1, 0], [1, 1]], np.int32),
                                              [2, 2])], 1)])
GENERATORS["CHANNEL_SHUFFLE"] = _moves(lambda t: [("axis -1", [2, 6], [i32(3), i32(-1)], 1),
                                                  ("axis 0", [6, 2], [i32(2), i32(0)], 1)])


GENERATORS["MIRROR_PAD"] = _moves(lambda t: [
    (f"mode {m}", [3, 4], [Const(I32, np.array([[1, 2], [2, 1]], np.int32), [2, 2]), i32(m)],
     1) for m in (0, 1)])
GENERATORS["REVERSE"] = _moves(lambda t: [("axis 1", [3, 4], [ivec(1)], 1),
                                          ("axis 0", [5, 2], [ivec(0)], 1)])


@gen("PACK")
def _pack(v: dict[str, OperandType]) -> list:
    t = v["T"]
    q = _q_same(t, 1)[0]
    n = len(edge_values(t, True))
    return [(f"axis {a}", [i32(a), In(t, [2, n], q, small=True),
                           In(t, [2, n], q, values=edge_values(t, True)[::-1])], [Out(t, q)])
            for a in (0, 1, 2)]


@gen("BATCH_MATMUL")
def _batch_matmul(v: dict[str, OperandType]) -> list:
    t = v["T"]
    qa, qb, qo = ((0.5, 0), (0.25, 3), (1.0, -5)) if _is_q(t) else ((0.0, 0),) * 3
    return [(f"adj_x={x} adj_y={y}", [In(t, [2, 4, 3] if x else [2, 3, 4], qa),
                                      In(t, [2, 5, 4] if y else [2, 4, 5], qb),
                                      flag(x), flag(y)], [Out(t, qo)])
            for x, y in ((False, False), (True, False), (False, True))]


@gen("PAD_V2")
def _pad_v2(v: dict[str, OperandType]) -> list:
    t, s = v["T"], v["S"]
    pads = Const(I32, np.array([[1, 0], [0, 2]], np.int32), [2, 2])
    if _is_q(t):
        info = np.iinfo(t.dtype)
        return [(f"pad {p} q={q}", [In(t, [2, 3], q), pads, scalar(T.INT32, p)], [Out(t, q)])
                for q in _q_same(t) for p in (int(info.min), int(info.max), q[1])]
    return [(f"pad {p}", [In(t, [2, 3]), pads, scalar(s, p)], [Out(t)])
            for p in (NAN, -INF, -0.0, 2.5)]


@gen("CONCATENATION")
def _concat(v: dict[str, OperandType]) -> list:
    t = v["T"]
    if not _is_q(t):
        return [("axis 1", [In(t, [2, 3]), In(t, [2, 2]), i32(1)], [Out(t)]),
                ("zero-sized part", [In(t, [0, 3]), In(t, [2, 3]), i32(0)], [Out(t)])]
    return [(f"q={qa},{qb},{qo}", [In(t, [2, 8], qa), In(t, [2, 8], qb), i32(1)], [Out(t, qo)])
            for qa, qb, qo in [tuple(_shift(t, q) for q in tr) for tr in Q_TRIPLES]]


@gen("EMBEDDING_LOOKUP")
def _embedding(v: dict[str, OperandType]) -> list:
    t = v["T"]
    q = _q_same(t, 1)[0]
    return [("lookups", [In(I32, [3], values=[2, 0, 2]), In(t, [3, 4], q)], [Out(t, q)])]


@gen("HASHTABLE_LOOKUP")
def _hashtable(v: dict[str, OperandType]) -> list:
    t = v["T"]
    q = _q_same(t, 1)[0]
    return [("missing keys", [In(I32, [4], values=[I32_MIN, 7, -3, 5]),
                              Const(I32, np.array([-3, 0, 7], np.int32), [3]), In(t, [3, 2], q)],
             [Out(t, q), Out(Q8, (1.0, 0))])]


@gen("FILL")
def _fill(v: dict[str, OperandType]) -> list:
    t = v["T"]
    st = v["S"]
    vals = [I32_MIN, I32_MAX] if t == I32 else [NAN, -INF, -0.0]
    return [(f"value {x}", [ivec(2, 3), In(st, [], values=[x])], [Out(t)]) for x in vals]


@gen("TOPK_V2")
def _topk(v: dict[str, OperandType]) -> list:
    t = v["T"]
    n = len(edge_values(t, True))
    q = _q_same(t, 1)[0]
    ties = np.resize(edge_values(t, True)[:3], 2 * n)
    return [("edges k=3", [In(t, [2, n], q, small=True), i32(3)], [Out(t, q), Out(I32)]),
            ("ties k=4", [In(t, [2, n], q, values=ties), i32(4)], [Out(t, q), Out(I32)])]


def _reduce(op: str) -> Gen:
    def g(v: dict[str, OperandType]) -> list:
        t = v["T"]
        n = len(edge_values(t, True))
        keep = (lambda k: i32(k)) if op == "MEAN" else (lambda k: flag(bool(k)))
        result = []
        qs = _unary_q(op, t, op not in _FREE_OUT) if _is_q(t) else [((0.0, 0), (0.0, 0))]
        for qi, qo in qs[:3]:
            result += [
                (f"axis 1 q={qi},{qo}", [In(t, [3, n], qi, small=True), ivec(1), keep(0)],
                 [Out(t, qo)]),
                (f"axes 0,-1 keep q={qi},{qo}", [In(t, [2, 3, n], qi, small=True), ivec(0, -1),
                                                 keep(1)], [Out(t, qo)])]
        result.append(("pairs", [In(t, [n, 2], qs[0][0], small=True), ivec(1), keep(0)],
                       [Out(t, qs[0][1])]))
        return result
    return g


for _n in ("MEAN", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_SUM", "REDUCE_PROD", "REDUCE_ALL",
           "REDUCE_ANY"):
    GENERATORS[_n] = _reduce(_n)


def _arg(v: dict[str, OperandType]) -> list:
    t = v["T"]
    n = len(edge_values(t, True))
    q = _q_same(t, 1)[0]
    return [("axis 1", [In(t, [3, n], q, small=True), i32(1)], [Out(I32)]),
            ("axis 0 pairs", [In(t, [2, n], q, small=True), i32(0)], [Out(I32)]),
            ("ties", [In(t, [2, 4], q, values=np.zeros(8)), i32(-1)], [Out(I32)])]


GENERATORS["ARGMAX"] = GENERATORS["ARGMIN"] = _arg


@gen("RANK")
def _rank(v: dict[str, OperandType]) -> list:
    t = v["T"]
    q = (0.5, 0) if _is_q(t) and t != Q8PC else (0.0, 0)
    ch = ([0.5, 0.25], 0) if t == Q8PC else None
    return [("rank 3", [In(t, [2, 1, 3], _shift(t, q), channel=ch)], [Out(T.INT32)])]


def _softmax(v: dict[str, OperandType]) -> list:
    t = v["T"]
    n = len(edge_values(t, True))
    st = T.FLOAT16 if t == F16 else T.FLOAT32
    qs = _unary_q("SOFTMAX", t, False)[:3] if _is_q(t) else [((0.0, 0), (0.0, 0))]
    result = []
    for qi, qo in qs:
        for beta in (1.0, 1e6) if _is_q(t) else (1.0, 1e-6, 1e6):
            result.append((f"beta {beta} q={qi}", [In(t, [3, n], qi, small=True),
                                                   scalar(st, beta), i32(-1)], [Out(t, qo)]))
    result.append(("axis 0", [In(t, [3, n], qs[0][0], small=True), scalar(st, 1.0), i32(0)],
                   [Out(t, qs[0][1])]))
    return result


GENERATORS["SOFTMAX"] = _softmax


GENERATORS["LOG_SOFTMAX"] = _softmax


@gen("L2_NORMALIZATION")
def _l2norm(v: dict[str, OperandType]) -> list:
    t = v["T"]
    n = len(edge_values(t, True))
    qs = _unary_q("L2_NORMALIZATION", t, False)[:3] if _is_q(t) else [((0.0, 0), (0.0, 0))]
    zeros = np.zeros(8)
    result = []
    for qi, qo in qs:
        result.append((f"edges q={qi}", [In(t, [3, n], qi, small=True), i32(-1)], [Out(t, qo)]))
        result.append((f"zero row q={qi}", [In(t, [2, 4], qi, values=zeros + qi[1])],
                       [Out(t, qo)]))
    return result


@gen("LOCAL_RESPONSE_NORMALIZATION")
def _lrn(v: dict[str, OperandType]) -> list:
    t, st = v["T"], v["S"]
    n = len(edge_values(t))
    return [(f"radius {r} beta {b}", [In(t, [1, 1, 2, n // 2]), i32(r), scalar(st, 1.0),
                                      scalar(st, 1.0), scalar(st, b)], [Out(t)])
            for r, b in ((2, 0.5), (20, 0.75))] + [
        # ordinary values: a large one next to a window of small ones
        ("moderate", [In(t, [1, 1, 2, 5], values=[1e3 if t == F32 else 6e4, 0.5, 0.1, 1, 2, 3,
                                                  4, 5, 6, 7]), i32(2),
                      scalar(st, 1.0), scalar(st, 1.0), scalar(st, 0.5)], [Out(t)])]


@gen("INSTANCE_NORMALIZATION")
def _instance_norm(v: dict[str, OperandType]) -> list:
    t = v["T"]
    st = T.FLOAT16 if t == F16 else T.FLOAT32
    return [("edges", [In(t, [2, 2, 2, 8]), scalar(st, 1.0), scalar(st, 0.5), scalar(st, 1e-3),
                       flag(False)], [Out(t)]),
            ("constant plane", [In(t, [1, 2, 2, 2], values=[3.0] * 8), scalar(st, 2.0),
                                scalar(st, 0.0), scalar(st, 1e-5), flag(False)], [Out(t)])]


def _pool(op: str) -> Gen:
    def g(v: dict[str, OperandType]) -> list:
        t = v["T"]
        qs = _unary_q(op, t, op not in _FREE_OUT)[:3] if _is_q(t) else [((0.0, 0), (0.0, 0))]
        result = []
        for qi, qo in qs:
            for act in range(4):
                result.append((f"explicit pad act={act} q={qi},{qo}",
                               [In(t, [1, 4, 4, 2], qi), *map(i32, (1, 0, 0, 1, 2, 2, 2, 2, act))],
                               [Out(t, qo)]))
            result.append((f"same 3x3 q={qi},{qo}",
                           [In(t, [2, 3, 5, 2], qi), *map(i32, (1, 1, 1, 3, 3, 0))],
                           [Out(t, qo)]))
            result.append((f"valid nchw q={qi},{qo}",
                           [In(t, [1, 2, 4, 4], qi), *map(i32, (2, 2, 2, 2, 2, 0)),
                            flag(True)], [Out(t, qo)]))
        return result
    return g


for _n in ("AVERAGE_POOL_2D", "MAX_POOL_2D", "L2_POOL_2D"):
    GENERATORS[_n] = _pool(_n)


def _resize(op: str) -> Gen:
    def g(v: dict[str, OperandType]) -> list:
        t, st = v["T"], v["S"]
        qs = _unary_q(op, t, op not in _FREE_OUT)[:2] if _is_q(t) else [((0.0, 0), (0.0, 0))]
        result = []
        for qi, qo in qs:
            for ac, hp in ((False, False), (True, False), (False, True)):
                result.append((f"by size ac={ac} hp={hp} q={qi}",
                               [In(t, [1, 2, 3, 2], qi), i32(5), i32(3), flag(False), flag(ac),
                                flag(hp)], [Out(t, qo)]))
            result.append((f"by scale q={qi}", [In(t, [1, 2, 3, 2], qi), scalar(st, 1.5),
                                                scalar(st, 2.5), flag(False)], [Out(t, qo)]))
            result.append((f"downscale nchw q={qi}", [In(t, [1, 2, 4, 5], qi), i32(2), i32(3),
                                                       flag(True)], [Out(t, qo)]))
        return result
    return g


GENERATORS["RESIZE_BILINEAR"] = _resize("RESIZE_BILINEAR")
GENERATORS["RESIZE_NEAREST_NEIGHBOR"] = _resize("RESIZE_NEAREST_NEIGHBOR")


# ---- convolutions and fully connected ---------------------------------------------------------

def _weights(v: dict[str, OperandType], shape: Sequence[int], qi: tuple[float, int],
             fq: tuple[float, int], channel_dim: int, extreme: bool) -> tuple[Const, Const]:
    """Filter and bias constants for a variant: float weights with edge magnitudes, quantized
    ones over the whole range, per-channel scales far apart; ``extreme``: biases of +-2^20
    (larger ones overflow int32 once scaled, which NNAPI leaves undefined)."""
    f = v["F"]
    n = int(np.prod(shape))
    nout = shape[channel_dim]
    if not _is_q(f):
        w = np.resize(np.array([0.5, -1.0, 2.0, -0.25, 1e3, 0.0, -3.0, 1.5], np.float64), n)
        bias = np.resize(np.array([0.5, -1e4, 2.5, 0.0], np.float64), nout)
        return (Const(f, w.astype(f.dtype).reshape(shape), shape),
                Const(f, bias.astype(f.dtype), [nout]))
    info = np.iinfo(f.dtype)
    w = np.resize(np.arange(int(info.min), int(info.max) + 1, 7), n).astype(f.dtype)
    if f == Q8PC:
        scales = np.resize([1e-3, 0.5, 3.0], nout).tolist()
        bvals = np.resize([1 << 20, -7, -(1 << 20), 100] if extreme else
                          [5, -7, 1000, 100], nout)
        return (Const(f, w.reshape(shape), shape, channel=(scales, channel_dim)),
                Const(I32, np.array(bvals, np.int32), [nout], (0.0, 0)))
    bvals = np.resize([1 << 20, -7, -(1 << 20), 100] if extreme else [5, -7, 1000, 100],
                      nout)
    return (Const(f, w.reshape(shape), shape, fq),
            Const(I32, np.array(bvals, np.int32), [nout], (qi[0] * fq[0], 0)))


#: (input, filter, output) quantization of the convolutions, as TENSOR_QUANT8_ASYMM.
Q_CONV = [((0.5, 128), (0.25, 100), (1.0, 128)), ((1e-3, 255), (5e-3, 0), (1e-4, 0)),
          ((10.0, 0), (2.0, 255), (0.5, 255)), ((0.5, 3), (0.5, 128), (64.0, 127))]


def _conv_family(op: str) -> Gen:
    def g(v: dict[str, OperandType]) -> list:
        t, f = v["T"], v["F"]
        result = []
        qs = [((0.0, 0), (0.0, 0), (0.0, 0))] if not _is_q(t) else \
            [(_shift(t, a), _shift(f, b), _shift(t, c)) for a, b, c in Q_CONV]
        for k, (qi, fq, qo) in enumerate(qs):
            extreme = k == 1
            for act in range(4) if k == 0 else (0,):
                tag = f"act={act} q={qi},{fq},{qo}"
                if op == "CONV_2D":
                    w, b = _weights(v, [3, 2, 2, 2], qi, fq, 0, extreme)
                    result.append((f"explicit {tag}", [In(t, [1, 3, 4, 2], qi), w, b,
                                   *map(i32, (1, 0, 0, 1, 1, 2, act))], [Out(t, qo)]))
                    result.append((f"implicit dilated {tag}", [In(t, [1, 5, 5, 2], qi), w, b,
                                   *map(i32, (1, 1, 1, act)), flag(False), i32(2), i32(2)],
                                   [Out(t, qo)]))
                elif op == "DEPTHWISE_CONV_2D":
                    w, b = _weights(v, [1, 2, 2, 4], qi, fq, 3, extreme)
                    result.append((f"explicit {tag}", [In(t, [1, 3, 4, 2], qi), w, b,
                                   *map(i32, (1, 0, 0, 1, 1, 2, 2, act))], [Out(t, qo)]))
                    result.append((f"implicit {tag}", [In(t, [1, 4, 4, 4], qi), w, b,
                                   *map(i32, (1, 2, 2, 1, act))], [Out(t, qo)]))
                elif op == "GROUPED_CONV_2D":
                    w, b = _weights(v, [4, 2, 2, 2], qi, fq, 0, extreme)
                    result.append((f"implicit {tag}", [In(t, [1, 3, 3, 4], qi), w, b,
                                   *map(i32, (1, 1, 1, 2, act)), flag(False)], [Out(t, qo)]))
                elif op == "TRANSPOSE_CONV_2D":
                    w, b = _weights(v, [2, 2, 2, 3], qi, fq, 0, extreme)
                    result.append((f"implicit {tag}", [In(t, [1, 2, 2, 3], qi), w, b,
                                   ivec(1, 4, 4, 2), *map(i32, (1, 2, 2, act)), flag(False)],
                                   [Out(t, qo)]))
                    result.append((f"explicit {tag}", [In(t, [1, 2, 3, 3], qi), w, b,
                                   *map(i32, (1, 0, 0, 1, 2, 2, act)), flag(False)],
                                   [Out(t, qo)]))
                else:  # FULLY_CONNECTED
                    w, b = _weights(v, [3, 8], qi, fq, 0, extreme)
                    result.append((f"{tag}", [In(t, [4, 8], qi), w, b, i32(act)],
                                   [Out(t, qo)]))
        return result
    return g


for _n in ("CONV_2D", "DEPTHWISE_CONV_2D", "GROUPED_CONV_2D", "TRANSPOSE_CONV_2D",
           "FULLY_CONNECTED"):
    GENERATORS[_n] = _conv_family(_n)


# ---- recurrent, hashing, control flow ---------------------------------------------------------

@gen("RNN")
def _rnn(v: dict[str, OperandType]) -> list:
    t = v["T"]
    w = Const(t, np.resize([0.5, -1.0, 2.0, 1e3], 12).reshape(4, 3).astype(t.dtype), [4, 3])
    r = Const(t, np.resize([0.1, -0.2], 16).reshape(4, 4).astype(t.dtype), [4, 4])
    b = Const(t, np.array([0.0, 1.0, -1.0, 0.5], t.dtype), [4])
    return [(f"act={a}", [In(t, [2, 3]), w, r, b, In(t, [2, 4]), i32(a)], [Out(t), Out(t)])
            for a in (0, 1, 2, 3)]


@gen("UNIDIRECTIONAL_SEQUENCE_RNN")
def _seq_rnn(v: dict[str, OperandType]) -> list:
    t = v["T"]
    w = Const(t, np.resize([0.5, -1.0, 2.0, 1e3], 12).reshape(4, 3).astype(t.dtype), [4, 3])
    r = Const(t, np.resize([0.1, -0.2], 16).reshape(4, 4).astype(t.dtype), [4, 4])
    b = Const(t, np.array([0.0, 1.0, -1.0, 0.5], t.dtype), [4])
    return [(f"time_major={m} act={a}", [In(t, [2, 3, 3]), w, r, b, In(t, [3 if m else 2, 4]),
                                         i32(a), i32(m)], [Out(t), Out(t)])
            for m in (0, 1) for a in (0, 1, 2, 3)]


@gen("LSH_PROJECTION")
def _lsh(v: dict[str, OperandType]) -> list:
    h, t = v["H"], v["T"]
    hashes = Const(h, np.array([[0.123, 0.456], [-0.321, 0.789], [1e3, -1e-3]], h.dtype), [3, 2])
    q = (0.5, 128) if _is_q(t) else (0.0, 0)
    weight = Const(h, np.array([0.5, -1.0, 2.0], h.dtype), [3])
    return [(f"type {k}", [hashes, In(t, [3, 2], q), weight, i32(k)], [Out(I32)])
            for k in (2, 3)]


def _if_branch(op: OperationType) -> Callable[[SubgraphBuilder], None]:
    def make(sb: SubgraphBuilder) -> None:
        x, y = sb.input(F32, [len(F32_EDGE)]), sb.input(F32, [len(F32_EDGE)])
        act = sb.scalar(T.INT32, 0)
        out = sb.output(F32, [len(F32_EDGE)])
        sb.operation(op, [x, y, act], [out])
    return make


@gen("IF")
def _if(v: dict[str, OperandType]) -> list:
    n = len(F32_EDGE)
    return [(f"cond {c}", [In(BOOL8, [1], values=[c]), Sub(_if_branch(O.ADD)),
                           Sub(_if_branch(O.MUL)), In(F32, [n]),
                           In(F32, [n], values=F32_EDGE[::-1])], [Out(F32, shape=[n])])
            for c in (True, False)]


# ---- the operations of nnhal's TFLite builtins extension that LiteRT runs ------------------

#: The extension's prefix in the sweep's models.
EXT_PREFIX = 1


@dataclass(frozen=True)
class ExtOp:
    """An operation of org.nnhal.tflite in a case: named as an OperationType is, its value
    the extension's operation type under :data:`EXT_PREFIX`."""

    name: str
    code: int
    #: The type of input 0 where the signature fixes it (generators take it as "T").
    fixed: OperandType | None = None

    def __int__(self) -> int:
        return EXT_PREFIX << 16 | self.code


def extension_operations() -> list[tuple[ExtOp, Any]]:
    """The extension's operations with a TFLite form (``tflite_export``), of plain operand
    types (the complex64 family has tests of its own), with their signatures."""
    found = []
    for o in EXTENSION.operations:
        slots = [*o.signature.forms[0].inputs, *o.signature.outputs]
        plain = all(not isinstance(s.type, tuple) for s in slots)
        if o.tflite_export is not None and plain:
            t0 = slots[0].type
            found.append((ExtOp(o.id.short, o.id.code, None if isinstance(t0, str) else t0),
                          o.signature))
    return found


GENERATORS["SIGN"] = _unary("SIGN")
GENERATORS["CEIL"] = _unary("CEIL")
GENERATORS["ROUND"] = _unary("ROUND")
GENERATORS["COS"] = _unary("COS")
GENERATORS["FLOOR_MOD"] = _binary("FLOOR_MOD", False)
GENERATORS["SQUARED_DIFFERENCE"] = _binary("SQUARED_DIFFERENCE", False)


@gen("GELU")
def _gelu(v: dict[str, OperandType]) -> list:
    t = v.get("T", F32)
    n = len(edge_values(t))
    if not _is_q(t):
        return [(f"approximate={a}", [In(t, [n]), flag(a)], [Out(t)]) for a in (False, True)]
    return [(f"approximate={a} q={qi},{qo}", [In(t, [n], qi), flag(a)], [Out(t, qo)])
            for a in (False, True) for qi, qo in
            [tuple(_shift(t, q) for q in pair) for pair in Q_PAIRS]]


@gen("GATHER_ND")
def _gather_nd(v: dict[str, OperandType]) -> list:
    t = v["T"]
    q = _shift(t, (0.5, 128)) if _is_q(t) else (0.0, 0)
    const = Const(I32, np.array([[0, 1], [3, 2], [1, 0]], np.int32), [3, 2])
    rows = Const(I32, np.array([[3], [0]], np.int32), [2, 1])
    fed = In(I32, [2, 2], values=[2, 0, 0, 2])
    return [(name, [In(t, [4, 3], q), idx], [Out(t, q)])
            for name, idx in (("pairs", const), ("rows", rows), ("run-time indices", fed))]


@gen("CUMSUM")
def _cumsum(v: dict[str, OperandType]) -> list:
    t = v["T"]
    n = len(edge_values(t))
    out = []
    for exclusive in (False, True):
        for reverse in (False, True):
            tail = [flag(exclusive), flag(reverse)]
            out.append((f"exclusive={exclusive} reverse={reverse}",
                        [In(t, [n]), ivec(0), *tail], [Out(t)]))
            out.append((f"axis -1 of [2, 5] exclusive={exclusive} reverse={reverse}",
                        [In(t, [2, 5]), ivec(-1), *tail], [Out(t)]))
    return out


# ---- the sweep -------------------------------------------------------------------------------

def pair_name(op: OperationType | ExtOp, variant: Variant) -> str:
    types = ",".join(f"{k}={t.name.removeprefix('TENSOR_')}" for k, t in variant.types.items())
    name = op.name if isinstance(op, OperationType) else f"{EXTENSION.name}:{op.name}"
    return f"{name}[{types}]" if types else name


def all_pairs(claimable: Callable[[str], bool]) -> list[tuple[OperationType, Variant, str]]:
    """Every (operation, variant) of the signature table whose operation ``claimable``, and
    of the extension's operations that LiteRT runs (:func:`extension_operations`)."""
    return [(op, variant, pair_name(op, variant)) for op, s in SIGNATURES.items()
            if claimable(op.name) for variant in s.variants] + [
        (op, variant, pair_name(op, variant))  # type: ignore[misc]
        for op, s in extension_operations() for variant in s.variants]


def cases_for(op: OperationType, variant: Variant) -> list[Case]:
    g = GENERATORS.get(op.name)
    if g is None:
        return []
    pair = pair_name(op, variant)
    types = dict(variant.types)
    if isinstance(op, ExtOp) and op.fixed is not None:
        types.setdefault("T", op.fixed)
    return [Case(pair, name, op, list(ins), list(outs)) for name, ins, outs in g(types)]


@dataclass
class Result:
    """One case's outcome: whether LiteRT claims it; where its outputs differ on finite inputs
    (or why it failed); and, for a case also fed NaN or infinities, why that run failed and
    where it differs (NNAPI defines no result for them: recorded, not wrong)."""

    case: Case
    claimed: bool
    problems: list[str] = field(default_factory=list)
    nonfinite_errors: list[str] = field(default_factory=list)
    nonfinite_diffs: list[str] = field(default_factory=list)


F16_TOL = 5 * 0.0009765625
F32_ATOL, F32_RTOL = 1e-5, 5 * 1.1920928955078125e-7


#: Float operations whose outputs are sums of input values with non-negative weights: the
#: same operation on |x| gives each output's sum of |terms|.
SUMS = {O.AVERAGE_POOL_2D, O.MEAN, O.REDUCE_SUM, O.RESIZE_BILINEAR}
#: The rounding a float sum may make, relative to its sum of |terms| (the order of the terms
#: is not NNAPI's to fix): 32 units of the last place of float32.
SUM_RTOL = 32 * 2.0**-23


def differences(case: Case, k: int, ref: np.ndarray, got: np.ndarray,
                terms: np.ndarray | None = None) -> str | None:
    """The conformance rules (nnhal.conformance.runner): floats within atol + rtol * |ref| (the
    float16 row when the case has a float16 operand), equal infinities, NaN where the reference
    has NaN; integers and quantized values within 1; booleans exact. ``terms``: per output,
    its sum of |terms| (:data:`SUMS`): a sum whose large terms cancel may differ by the
    rounding of another order of the terms, SUM_RTOL of it (1e4 - 1e4 + 0.001 + 0.002 gives
    0.0029 summed one way, 0.003 another), and anything when that sum of |terms| is beyond the
    float range (3.4e38 + 3.4e38 - 3.4e38 overflows summed in that order: a float sum, as
    NNAPI's CPU path computes it, may give inf or NaN there)."""
    t = case.outs[k].t
    if tuple(ref.shape) != tuple(got.shape):
        return f"output {k}: shape {got.shape}, reference {ref.shape}"
    a, e = got.reshape(-1), ref.reshape(-1)
    if t in (BOOL8, T.BOOL):
        bad = np.nonzero(a != e)[0]
    else:
        a64, e64 = a.astype(np.float64), e.astype(np.float64)
        if t in (F32, F16, T.FLOAT32, T.FLOAT16):
            atol, rtol = (F16_TOL, F16_TOL) if t in (F16, T.FLOAT16) or case.has_f16 else \
                (F32_ATOL, F32_RTOL)
        else:
            atol, rtol = 1.0, 0.0
        with np.errstate(invalid="ignore", over="ignore"):
            ok = (a64 == e64) | (np.isnan(a64) & np.isnan(e64)) | \
                (np.abs(a64 - e64) <= atol + rtol * np.abs(e64))
            if t in (F32, F16):
                # A sum that rounds to the largest finite float one way may round to infinity
                # another: within the tolerance of the limit, either is right.
                big = float(np.finfo(t.dtype).max) * (1 - rtol)
                ok |= np.isinf(a64) & (np.sign(a64) == np.sign(e64)) & (np.abs(e64) >= big)
            if terms is not None:
                sum_abs = terms.reshape(-1).astype(np.float64)
                # beyond the float range the order decides whether a partial sum overflows
                ok |= (np.abs(a64 - e64) <= SUM_RTOL * sum_abs) | np.isinf(sum_abs)
        bad = np.nonzero(~ok)[0]
    if not bad.size:
        return None
    shown = ", ".join(f"[{i}] {a[i]!r} vs {e[i]!r}" for i in bad[:4])
    return f"output {k}: {bad.size} of {a.size} differ: {shown}"


def _run(model: Model, feeds: list[np.ndarray], device: Any) -> list[np.ndarray]:
    from nnhal.session import Session

    with Session(model, device=device) as s:
        out = s.run({info.name: x for info, x in zip(s.inputs, feeds)})
        return [out[info.name] for info in s.outputs]


def sweep(cases: Sequence[Case], reference: Any, litert: Any) -> list[Result]:
    """Run ``cases`` (one operation's) on both drivers: one analysis to infer shapes, one to ask
    the support rule, then the claimed cases as one model on each driver with finite inputs,
    and those fed NaN or infinities once more with them (each case alone when the model as a
    whole fails, to say which)."""
    from nnhal.drivers.litert.support import supported_operations

    if not cases:
        return []
    infer_shapes(cases)
    model, _, spans = build(cases)
    claims = supported_operations(analyse(model, own_constants=False))
    results = [Result(c, all(claims[k] for k in span)) for c, span in zip(cases, spans)]
    claimed = [r for r in results if r.claimed]
    _compare_each(claimed, reference, litert, True)
    _compare_each([r for r in claimed if r.case.nonfinite], reference, litert, False)
    return results


def _compare_each(results: Sequence[Result], reference: Any, litert: Any,
                  finite: bool) -> None:
    if not results:
        return
    try:
        _compare(results, reference, litert, finite)
    except Exception:  # noqa: BLE001 - find which case fails
        for r in results:
            try:
                _compare([r], reference, litert, finite)
            except Exception as e:  # noqa: BLE001
                (r.problems if finite else r.nonfinite_errors).append(
                    f"{type(e).__name__}: {e}")


def _compare(results: Sequence[Result], reference: Any, litert: Any, finite: bool) -> None:
    cases = [r.case for r in results]
    model, feeds, _ = build(cases, finite=finite)
    want = _run(model, feeds, reference)
    got = _run(model, feeds, litert)
    terms: list[np.ndarray | None] = [None] * len(want)
    if finite and cases[0].op in SUMS and any(f.dtype.kind == "f" for f in feeds):
        terms = _run(model, [np.abs(f) if f.dtype.kind == "f" else f for f in feeds], reference)
    found = []
    k = 0
    for r in results:
        for j in range(len(r.case.outs)):
            why = differences(r.case, j, want[k], got[k], terms[k])
            if why is not None:
                found.append((r, why))
            k += 1
    for r, why in found:  # only once both runs succeeded: a retry case by case adds none twice
        (r.problems if finite else r.nonfinite_diffs).append(why)
