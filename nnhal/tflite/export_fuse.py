"""TFLite operators the HAL cannot hold, found again at export in the HAL form the importer
gives them, so that a .tflite read and written again keeps the operators it had.

The HAL lacks these things converter-made models use, and the importer writes each as
an equivalent chain (:mod:`nnhal.tflite.import_ops`):

- a MEAN over height and width whose output is quantized unlike its input (the HAL's MEAN
  keeps the input's scale): a DEPTHWISE_CONV_2D with a constant filter of 1 / (H * W) over
  the whole image, and a RESHAPE when the axes are dropped;
- a FULLY_CONNECTED with per-channel weights (the HAL's takes per-tensor ones): RESHAPE to a
  1x1 image, 1x1 CONV_2D, RESHAPE back;
- an int8 SOFTMAX of an input too finely scaled for the HAL's integer softmax: DEQUANTIZE,
  float SOFTMAX, QUANTIZE;
- a QUANTIZE of an 8-bit tensor (a requantization, int8 to uint8 say): DEQUANTIZE, QUANTIZE;
- a SPLIT_V: one SLICE per output;
- a SELECT_V2 whose operands broadcast: each widened to the output's shape first, exactly
  (a bool OR-ed with false, an int32 plus 0, a float plus -0.0, a quantized one RESHAPEd and
  TILEd), then SELECT;
- a RESHAPE of bools: SELECT of 1.0 / 0.0, float RESHAPE, NOT_EQUAL 0;
- a float32 FLOOR_DIV: DIV, FLOOR, and one less where Dekker's exact product shows the
  quotient rounded up to an integer (about thirty operations).

Written back as those chains, the model computes the same thing but not as fast: XNNPACK took
about 0.5 ms more CPU time for the 7x7 depthwise convolution of 1280 channels onto one pixel
than for the MEAN it stands for (MobileNetV2 int8: 1.15x the file's 3.3 ms; TFLite's own
kernels run both alike). Each chain found whole, with constants that make it that operator
and intermediates nothing else reads, becomes the TFLite operator again. The results agree
within the rounding of the requantization (the mean's multiplier divided by the count,
softmax's float exponentials), one step at most, which is the conformance tolerance of 8-bit
outputs; on the file's own operators ai-edge-litert gives the file's integers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tflite

from nnhal.analysis import SubgraphGraph
from nnhal.analysis.graph import once_per_graph
from nnhal.hal.types import OperandType, OperationType
from nnhal.tflite.export_context import Converter, ExportOpContext, fused_act
from nnhal.tflite.export_nn import _bias, fully_connected
from nnhal.tflite.schema import FUSED_NONE, PADDING_VALID

O, T = OperationType, OperandType
BO = tflite.BuiltinOperator
_Q8 = (T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED)


@dataclass(frozen=True)
class Fusion:
    """HAL operations ``ops`` (a chain; written where the first is) as one TFLite operator:
    ``convert`` over an operation whose inputs are ``ins`` and outputs ``outs``."""

    name: str
    ops: tuple[int, ...]
    ins: tuple[int, ...]
    outs: tuple[int, ...]
    convert: Converter


def find_fusions(g: SubgraphGraph) -> dict[int, Fusion]:
    """The chains of ``g`` to write as one operator, by the index of each chain's first
    operation. Found once per analysed subgraph (graphs are immutable): the LiteRT support
    probe asks, then the conversion it keeps for the prepare asks again. Fusions are
    immutable; each caller gets its own dict of them."""
    return dict(_find(g))

#: The operation type each kind of chain starts with -> the _Finder method that matches it.
_STARTS = {O.DEPTHWISE_CONV_2D: "mean", O.RESHAPE: "reshaped",
           O.FULLY_CONNECTED: "keep_num_dims", O.DEQUANTIZE: "dequantized",
           O.SLICE: "split_v", O.LOGICAL_OR: "select_v2", O.ADD: "select_v2",
           O.TILE: "select_v2", O.SELECT: "bool_reshape", O.DIV: "floor_div"}


@once_per_graph
def _find(g: SubgraphGraph) -> dict[int, Fusion]:
    f = _Finder(g)
    found: dict[int, Fusion] = {}
    taken: set[int] = set()
    for k, (t, _, _) in enumerate(g.operations):
        if k in taken:
            continue
        match = _STARTS.get(t)
        fusion = getattr(f, match)(k) if match is not None else None
        if fusion is not None and not taken.intersection(fusion.ops):
            found[k] = fusion
            taken.update(fusion.ops)
    return found


class _Finder:
    def __init__(self, g: SubgraphGraph) -> None:
        self.g = g
        self.edges = set(g.outputs) | set(g.inputs)

    @property
    def readers(self) -> dict[int, list[int]]:
        """The subgraph's (made when a chain's start first asks: most candidates are ruled
        out by their own operands before)."""
        return self.g.readers

    @property
    def producers(self) -> dict[int, int]:
        return self.g.producers

    def only_reader(self, i: int, kind: OperationType) -> int | None:
        """The one operation reading operand ``i`` (as its input 0, of type ``kind``), when
        nothing else reads it and it is no subgraph edge."""
        readers = self.readers.get(i, [])
        if len(readers) != 1 or i in self.edges:
            return None
        k = readers[0]
        t, ins, _ = self.g.operations[k]
        return k if t == kind and ins[0] == i and i not in ins[1:] else None

    def const(self, i: int) -> np.ndarray | None:
        info = self.g.operands[i]
        return np.asarray(info.value) if info.is_const else None

    def scalars(self, ins: list[int] | tuple[int, ...], js: range) -> list | None:
        out = []
        for j in js:
            v = self.const(ins[j]) if j < len(ins) else None
            if v is None or v.size != 1:
                return None
            out.append(v.item())
        return out

    def shape(self, i: int) -> list[int] | None:
        s = self.g.shapes[i]
        return None if s is None or not all(d > 0 for d in s) else [int(d) for d in s]

    def options(self, k: int, explicit_at: int) -> tuple[list, list] | None:
        """A CONV_2D (``explicit_at`` 7) or DEPTHWISE_CONV_2D (8) operation's padding and
        the scalars after it (strides, [multiplier,] activation, layout, dilations), with
        the HAL's defaults for those omitted; None unless every one is a constant."""
        ins = self.g.operations[k][1]
        explicit = len(ins) > explicit_at + 2 and \
            self.g.operands[ins[explicit_at]].type == T.INT32
        start = 7 if explicit else 4
        pads = self.scalars(ins, range(3, 7) if explicit else range(3, 4))
        n_after = explicit_at - 1  # strides, [multiplier,] activation, layout, dilations
        rest = []
        for j in range(start, start + n_after):
            if j < len(ins) and not self.g.operands[ins[j]].omitted:
                v = self.scalars(ins, range(j, j + 1))
                if v is None:
                    return None
                rest.append(v[0])
            else:
                rest.append(None)
        return (pads, rest) if pads is not None else None

    # ---- MEAN ----------------------------------------------------------------------------

    def mean(self, k: int) -> Fusion | None:
        """DEPTHWISE_CONV_2D of a constant 1 / (H * W) over the whole [N, H, W, C] image onto
        [N, 1, 1, C] (no bias, padding, activation, multiplier or dilation, NHWC), and the
        RESHAPE to [N, C] after it when there is one: MEAN over axes 1 and 2."""
        g = self.g
        _, ins, outs = g.operations[k]
        x, flt, y = g.operands[ins[0]], g.operands[ins[1]], g.operands[outs[0]]
        xs, ys = self.shape(ins[0]), self.shape(outs[0])
        if x.type not in _Q8 or y.type != x.type or xs is None or ys is None or len(xs) != 4:
            return None
        n, h, w, c = xs
        parsed = self.options(k, 8)
        if parsed is None or ys != [n, 1, 1, c]:
            return None
        pads, (_, _, mult, act, layout, dw, dh) = parsed
        if not (pads == [PADDING_VALID] or pads == [0, 0, 0, 0]) or mult != 1 or \
                act not in (None, FUSED_NONE) or layout or (dw or 1) != 1 or (dh or 1) != 1:
            return None
        fv, bv = self.const(ins[1]), self.const(ins[2])
        if fv is None or bv is None or flt.channel_scales is not None or \
                list(fv.shape) != [1, h, w, c] or fv.size == 0 or np.any(bv != 0):
            return None
        first = int(fv.reshape(-1)[0])
        if np.any(fv != first):
            return None
        if abs((first - flt.zero_point) * flt.scale * h * w - 1.0) > 1e-6:
            return None
        chain, out, keep = (k,), outs[0], True
        r = self.only_reader(outs[0], O.RESHAPE)
        if r is not None and self.shape(g.operations[r][2][0]) == [n, c]:
            chain, out, keep = (k, r), g.operations[r][2][0], False

        def convert(cx: ExportOpContext) -> None:
            cx.emit(BO.MEAN, [cx.t(0), cx.ints([1, 2])], [cx.o()], "ReducerOptions",
                    KeepDims=keep)
        return Fusion("MEAN", chain, (ins[0],), (out,), convert)

    # ---- FULLY_CONNECTED --------------------------------------------------------------------

    def fully_connected(self, k: int) -> Fusion | None:
        """RESHAPE of x to [rows, 1, 1, K], a 1x1 CONV_2D with a constant [O, 1, 1, K] int8
        filter quantized per output channel (NHWC, no padding), and the RESHAPE of its
        [rows, 1, 1, O] result when there is one: FULLY_CONNECTED with those weights."""
        g = self.g
        _, ins, outs = g.operations[k]
        xs, image = self.shape(ins[0]), self.shape(outs[0])
        if xs is None or image is None or len(image) != 4 or image[1:3] != [1, 1]:
            return None
        conv = self.only_reader(outs[0], O.CONV_2D)
        if conv is None:
            return None
        rows, depth = image[0], image[3]
        _, cins, couts = g.operations[conv]
        x, flt = g.operands[ins[0]], g.operands[cins[1]]
        fv = self.const(cins[1])
        if x.type != T.TENSOR_QUANT8_ASYMM_SIGNED or flt.channel_scales is None or \
                flt.channel_dim != 0 or fv is None or fv.ndim != 4 or \
                list(fv.shape[1:]) != [1, 1, depth] or \
                not (g.operands[cins[2]].is_const or g.operands[cins[2]].omitted):
            return None
        units = int(fv.shape[0])
        parsed = self.options(conv, 7)
        if parsed is None or self.shape(couts[0]) != [rows, 1, 1, units]:
            return None
        pads, (_, _, act, layout, _, _) = parsed
        if pads not in ([PADDING_VALID], [0, 0, 0, 0]) or layout:
            return None
        chain, out = (k, conv), couts[0]
        r = self.only_reader(couts[0], O.RESHAPE)
        if r is not None and self.shape(g.operations[r][2][0]) is not None:
            chain, out = (k, conv, r), g.operations[r][2][0]
        out_shape = self.shape(out)
        if out_shape is None:
            return None
        if len(xs) > 2 and xs[-1] == depth and out_shape == xs[:-1] + [units]:
            keep, after = True, None
        elif out_shape == [rows, units]:
            keep, after = False, None
        else:
            keep, after = False, out_shape
        act_in = cins[9] if len(pads) == 4 else cins[6]

        def convert(cx: ExportOpContext) -> None:
            weights = cx.w.constant(cx.const(1).reshape(units, depth), cx.info(1),
                                    f"w{len(cx.w.sg.tensors)}")
            # A bias of zeros (the importer's, where the file had none) is left out again.
            zeros = cx.present(2) and not np.any(cx.const(2))
            bias = -1 if zeros else _bias(cx, 2, 1)
            y = cx.o() if after is None else cx.temp([rows, units], cx.o())
            cx.emit(BO.FULLY_CONNECTED, [cx.t(0), weights, bias], [y],
                    "FullyConnectedOptions", FusedActivationFunction=fused_act(cx, 3),
                    KeepNumDims=keep)
            if after is not None:
                cx.emit(BO.RESHAPE, [y, cx.ints(after)], [cx.o()], "ReshapeOptions",
                        NewShape=after)
        return Fusion("FULLY_CONNECTED", chain, (ins[0], cins[1], cins[2], act_in), (out,),
                      convert)

    def keep_num_dims(self, k: int) -> Fusion | None:
        """FULLY_CONNECTED of x [..., K] onto [rows, units] and the RESHAPE to
        x's [..., units]: one FULLY_CONNECTED with keep_num_dims."""
        g = self.g
        _, ins, outs = g.operations[k]
        xs, ws = self.shape(ins[0]), self.shape(ins[1])
        if xs is None or ws is None or len(xs) < 3 or len(ws) != 2 or xs[-1] != ws[1]:
            return None
        r = self.only_reader(outs[0], O.RESHAPE)
        if r is None:
            return None
        out = g.operations[r][2][0]
        if self.shape(out) != xs[:-1] + [ws[0]]:
            return None
        return Fusion("FULLY_CONNECTED", (k, r), tuple(ins), (out,),
                      lambda cx: fully_connected(cx, keep_num_dims=True))

    # ---- SOFTMAX ---------------------------------------------------------------------------

    def softmax(self, k: int) -> Fusion | None:
        """DEQUANTIZE of an 8-bit tensor, float32 SOFTMAX along the last axis, QUANTIZE to
        the same type at scale 1/256 (zero point -128 for int8, 0 for uint8): the 8-bit
        SOFTMAX, whose output TFLite quantizes that way."""
        g = self.g
        _, ins, outs = g.operations[k]
        x = g.operands[ins[0]]
        if x.type not in _Q8 or g.operands[outs[0]].type != T.TENSOR_FLOAT32:
            return None
        s = self.only_reader(outs[0], O.SOFTMAX)
        if s is None:
            return None
        _, sins, souts = g.operations[s]
        q = self.only_reader(souts[0], O.QUANTIZE)
        xs = self.shape(ins[0])
        beta = self.scalars(sins, range(1, 2))
        axis = self.scalars(sins, range(2, 3)) if len(sins) > 2 else [-1]
        if q is None or xs is None or beta is None or axis is None or \
                axis[0] not in (-1, len(xs) - 1):
            return None
        out = g.operations[q][2][0]
        y = g.operands[out]
        zero = -128 if x.type == T.TENSOR_QUANT8_ASYMM_SIGNED else 0
        if y.type != x.type or y.scale != 1.0 / 256 or y.zero_point != zero or \
                not np.isfinite(beta[0]) or beta[0] <= 0:
            return None

        def convert(cx: ExportOpContext) -> None:
            cx.emit(BO.SOFTMAX, [cx.t(0)], [cx.o()], "SoftmaxOptions", Beta=float(beta[0]))
        return Fusion("SOFTMAX", (k, s, q), (ins[0],), (out,), convert)

    # ---- QUANTIZE of an 8-bit tensor (requantization) -------------------------------------

    def dequantized(self, k: int) -> Fusion | None:
        """What a DEQUANTIZE starts: an 8-bit SOFTMAX, else a requantization."""
        return self.softmax(k) or self.requantize(k)

    def requantize(self, k: int) -> Fusion | None:
        """DEQUANTIZE of an 8-bit tensor to float32 and QUANTIZE of that (nothing else reading
        it) to an 8-bit type: TFLite's QUANTIZE of the 8-bit tensor, which requantizes (the
        importer's form of a converter's int8 -> uint8 QUANTIZE, as a wake-word model's
        output has it)."""
        g = self.g
        _, ins, outs = g.operations[k]
        if g.operands[ins[0]].type not in _Q8 or g.operands[outs[0]].type != T.TENSOR_FLOAT32:
            return None
        q = self.only_reader(outs[0], O.QUANTIZE)
        if q is None:
            return None
        out = g.operations[q][2][0]
        if g.operands[out].type not in _Q8 or self.shape(ins[0]) is None:
            return None

        def convert(cx: ExportOpContext) -> None:
            cx.emit(BO.QUANTIZE, [cx.t(0)], [cx.o()])
        return Fusion("QUANTIZE", (k, q), (ins[0],), (out,), convert)

    # ---- SPLIT_V ---------------------------------------------------------------------------

    def _slice_axis(self, k: int, dims: list[int]) -> tuple[int, int, int] | None:
        """(axis, begin, size) of a SLICE with constant begin and size that takes all of its
        input but along one axis, else None."""
        ins = self.g.operations[k][1]
        begin, size = self.const(ins[1]), self.const(ins[2])
        if begin is None or size is None or begin.size != len(dims) or \
                size.size != len(dims):
            return None
        begin, size = begin.reshape(-1).tolist(), size.reshape(-1).tolist()
        size = [d - b if n == -1 else n for n, b, d in zip(size, begin, dims)]
        cut = [a for a in range(len(dims)) if begin[a] != 0 or size[a] != dims[a]]
        if len(cut) != 1 or size[cut[0]] <= 0:
            return None
        return cut[0], begin[cut[0]], size[cut[0]]

    def split_v(self, k: int) -> Fusion | None:
        """SLICEs of one tensor, each all of it but along one axis, whose pieces tile that
        axis (the importer's form of SPLIT_V, one SLICE per output): SPLIT_V, written where
        the first of them is."""
        g = self.g
        x = g.operations[k][1][0]
        dims = self.shape(x)
        if dims is None or x in g.outputs:
            return None
        mine = self._slice_axis(k, dims)
        if mine is None:
            return None
        pieces: list[tuple[int, int, int]] = []  # (begin, size, operation)
        for r in self.readers.get(x, []):
            t, ins, _ = g.operations[r]
            if t != O.SLICE or ins[0] != x:
                continue
            cut = self._slice_axis(r, dims)
            if cut is not None and cut[0] == mine[0]:
                pieces.append((cut[1], cut[2], r))
        pieces.sort()
        axis = mine[0]
        at = 0
        for begin, size, _ in pieces:
            if begin != at:
                return None
            at += size
        ops = [r for _, _, r in pieces]
        if at != dims[axis] or len(pieces) < 2 or min(ops) != k or len(set(ops)) != len(ops):
            return None
        sizes = [size for _, size, _ in pieces]
        outs = tuple(g.operations[r][2][0] for r in ops)

        def convert(cx: ExportOpContext) -> None:
            cx.emit(BO.SPLIT_V, [cx.t(0), cx.ints(sizes), cx.ints(axis)],
                    [cx.o(j) for j in range(len(outs))], "SplitVOptions",
                    NumSplits=len(outs))
        return Fusion("SPLIT_V", tuple(ops), (x,), outs, convert)

    # ---- SELECT_V2 with broadcasting --------------------------------------------------------

    def reshaped(self, k: int) -> Fusion | None:
        """What a RESHAPE starts: a per-channel FULLY_CONNECTED, else a broadcast SELECT_V2."""
        return self.fully_connected(k) or self.select_v2(k)

    def _widened(self, k: int) -> tuple[int, tuple[int, ...]] | None:
        """(the operand it widens, the operations) when operation ``k`` is one of the
        importer's exact broadcasts of an operand (``import_reach._broadcast``): LOGICAL_OR
        with a constant false, an int32 ADD of 0 or a float ADD of -0.0 (x + -0.0 is x, signed
        zeros and NaN too) with no activation, or an 8-bit TILE (of a RESHAPE that only puts
        1s in front, when nothing else reads it)."""
        g = self.g
        t, ins, outs = g.operations[k]
        x = g.operands[ins[0]] if ins else None
        if t == O.LOGICAL_OR and len(ins) == 2:
            c = self.const(ins[1])
            if c is not None and g.operands[ins[1]].type == T.TENSOR_BOOL8 and not c.any():
                return ins[0], (k,)
        elif t == O.ADD and len(ins) == 3 and x is not None:
            c = self.const(ins[1])
            if c is None or g.operands[ins[1]].type != x.type or \
                    self.scalars(ins, range(2, 3)) != [0] or \
                    g.operands[outs[0]].type != x.type:
                return None
            if x.type == T.TENSOR_INT32 and x.scale == 0 and not c.any():
                return ins[0], (k,)
            if x.type in (T.TENSOR_FLOAT32, T.TENSOR_FLOAT16) and \
                    np.all(c == 0) and np.all(np.signbit(c)):
                return ins[0], (k,)
        elif t == O.TILE and x is not None and x.type in _Q8:
            y = g.operands[outs[0]]
            if y.type != x.type or y.scale != x.scale or y.zero_point != x.zero_point:
                return None
            p = self.producers.get(ins[0])
            if p is not None and g.operations[p][0] == O.RESHAPE and \
                    self.only_reader(ins[0], O.TILE) == k:
                src = g.operations[p][1][0]
                have, padded = self.shape(src), self.shape(ins[0])
                if have is not None and padded is not None and len(padded) >= len(have) and \
                        padded[len(padded) - len(have):] == have and \
                        all(d == 1 for d in padded[:len(padded) - len(have)]):
                    return src, (p, k)
            return ins[0], (k,)
        return None

    def select_v2(self, k: int) -> Fusion | None:
        """A SELECT whose operands are widened to its shape by the importer's broadcasts
        (:meth:`_widened`; ``k`` the first of them, each read by that SELECT alone): TFLite's
        SELECT_V2 of the operands before widening, which broadcasts them itself (the same
        values: each broadcast is exact), written where ``k`` is."""
        g = self.g
        if g.operations[k][0] == O.RESHAPE:
            tile = self.only_reader(g.operations[k][2][0], O.TILE)
            found = self._widened(tile) if tile is not None else None
            if found is None or k not in found[1]:
                return None
        else:
            found = self._widened(k)
            if found is None:
                return None
        widened = g.operations[found[1][-1]][2][0]
        readers = self.readers.get(widened, [])
        if len(readers) != 1 or widened in self.edges:
            return None
        s = readers[0]
        t, sins, souts = g.operations[s]
        if t != O.SELECT or len(sins) != 3:
            return None
        ops, sources = [s], []
        for i in sins:
            p = self.producers.get(i)
            w = self._widened(p) if p is not None and i not in self.edges and \
                self.readers.get(i) == [s] and sins.count(i) == 1 else None
            if w is None:
                sources.append(i)
            else:
                ops.extend(w[1])
                sources.append(w[0])
        if min(ops) != k or len(set(ops)) != len(ops):
            return None
        for i in sources:  # each there before the first operation, where SELECT_V2 goes
            p = self.producers.get(i)
            if p is not None and p >= k:
                return None
        shapes = [self.shape(i) for i in sources]
        out = self.shape(souts[0])
        if out is None or any(sh is None for sh in shapes):
            return None
        try:
            if list(np.broadcast_shapes(*(tuple(sh) for sh in shapes))) != out:
                return None
        except ValueError:
            return None

        def convert(cx: ExportOpContext) -> None:
            cx.emit(BO.SELECT_V2, [cx.t(0), cx.t(1), cx.t(2)], [cx.o()])
        return Fusion("SELECT_V2", tuple(sorted(ops)), tuple(sources), (souts[0],), convert)

    # ---- RESHAPE of bools ------------------------------------------------------------------

    def bool_reshape(self, k: int) -> Fusion | None:
        """SELECT of bools between constant 1.0s and 0.0s, the float32 RESHAPE of that alone,
        NOT_EQUAL of that alone with a constant 0 onto the same shape
        (``import_reach._bool_reshape``, the HAL's RESHAPE taking no bools): RESHAPE of the
        bools."""
        g = self.g
        _, ins, outs = g.operations[k]
        if len(ins) != 3 or g.operands[ins[0]].type != T.TENSOR_BOOL8 or \
                g.operands[outs[0]].type != T.TENSOR_FLOAT32:
            return None
        ones, zeros = self.const(ins[1]), self.const(ins[2])
        if ones is None or zeros is None or not np.all(ones == 1) or np.any(zeros != 0):
            return None
        r = self.only_reader(outs[0], O.RESHAPE)
        if r is None:
            return None
        moved = g.operations[r][2][0]
        q = self.only_reader(moved, O.NOT_EQUAL)
        if q is None:
            return None
        _, qins, qouts = g.operations[q]
        zero = self.const(qins[1]) if len(qins) == 2 else None
        shape = self.shape(qouts[0])
        if zero is None or np.any(zero != 0) or g.operands[qins[1]].type != T.TENSOR_FLOAT32 \
                or shape is None or self.shape(moved) != shape or \
                g.operands[qouts[0]].type != T.TENSOR_BOOL8:
            return None

        def convert(cx: ExportOpContext) -> None:
            cx.emit(BO.RESHAPE, [cx.t(0), cx.ints(shape)], [cx.o()], "ReshapeOptions",
                    NewShape=shape)
        return Fusion("RESHAPE", (k, r, q), (ins[0],), (qouts[0],), convert)

    # ---- FLOOR_DIV of float32 ----------------------------------------------------------------

    def _arith(self, i: int, kind: OperationType, ops: set[int]) -> tuple[int, int] | None:
        """(a, b) of the ``kind`` (ADD, SUB, MUL or DIV) with no activation that writes
        operand ``i``, noted in ``ops``; None if another operation writes it."""
        k = self.producers.get(i)
        if k is None:
            return None
        t, ins, outs = self.g.operations[k]
        if t != kind or len(ins) != 3 or len(outs) != 1 or \
                self.scalars(ins, range(2, 3)) != [0]:
            return None
        ops.add(k)
        return ins[0], ins[1]

    def _binary(self, i: int, kind: OperationType, ops: set[int]) -> tuple[int, int] | None:
        """(a, b) of the two-input ``kind`` (a comparison, LOGICAL_AND / OR) writing ``i``."""
        k = self.producers.get(i)
        if k is None:
            return None
        t, ins, outs = self.g.operations[k]
        if t != kind or len(ins) != 2 or len(outs) != 1:
            return None
        ops.add(k)
        return ins[0], ins[1]

    def _is(self, i: int, value: float) -> bool:
        """Whether operand ``i`` is a float32 constant of one element, ``value``."""
        c = self.const(i)
        return c is not None and self.g.operands[i].type == T.TENSOR_FLOAT32 and \
            c.size == 1 and float(c.reshape(-1)[0]) == value

    def _split_hi(self, lo: int, a: int, ops: set[int]) -> int | None:
        """The high part of Veltkamp's split of ``a`` when ``lo`` is its low part
        (``import_reach._Float.split``: c = a * 4097, hi = c - (c - a), lo = a - hi)."""
        got = self._arith(lo, O.SUB, ops)
        if got is None or got[0] != a:
            return None
        hi = got[1]
        got = self._arith(hi, O.SUB, ops)
        if got is None:
            return None
        c, t = got
        got = self._arith(c, O.MUL, ops)
        if self._arith(t, O.SUB, ops) != (c, a) or got is None or got[0] != a or \
                not self._is(got[1], 4097.0):
            return None
        return hi

    def floor_div(self, k: int) -> Fusion | None:
        """The importer's exact float32 FLOOR_DIV (``import_reach._exact_floor``) whose DIV
        is ``k``: DIV, FLOOR, Dekker's product of the floor and the divisor, the residual's
        comparison and a SELECT of the floor or one less, and the copy into the output
        when nothing else reads the SELECT. TFLite's FLOOR_DIV, which divides in double, is
        the same bit for bit while |x / y| < 2^24 (the importer's claim, tested there), and
        past it within a rounding of float32. But for a zero divisor, where TFLite fails the
        invocation and the chain gives +-inf or NaN: a constant one with a zero is not fused,
        and the exporter's guarded form (``guard_division``) writes the chain."""
        g = self.g
        _, ins, outs = g.operations[k]
        if len(ins) != 3 or len(outs) != 1 or self.scalars(ins, range(2, 3)) != [0]:
            return None
        x, y = ins[0], ins[1]
        if any(g.operands[i].type != T.TENSOR_FLOAT32 for i in (x, y, outs[0])):
            return None
        f = self.only_reader(outs[0], O.FLOOR)
        if f is None:
            return None
        ops = {k, f}
        floor = g.operations[f][2][0]
        sel = next((r for r in self.readers.get(floor, ()) if g.operations[r][0] == O.SELECT
                    and len(g.operations[r][1]) == 3 and g.operations[r][1][2] == floor), None)
        if sel is None:
            return None
        ops.add(sel)
        fix, lower, _ = g.operations[sel][1]
        got = self._arith(lower, O.SUB, ops)
        if got is None or got[0] != floor or not self._is(got[1], 1.0):
            return None
        over = self._binary(fix, O.LOGICAL_OR, ops)
        pos = over and self._binary(over[0], O.LOGICAL_AND, ops)
        neg = over and self._binary(over[1], O.LOGICAL_AND, ops)
        if not pos or not neg:
            return None
        y_pos, y_neg = self._binary(pos[0], O.GREATER, ops), self._binary(neg[0], O.LESS, ops)
        cmp_lt, cmp_gt = self._binary(pos[1], O.LESS, ops), self._binary(neg[1], O.GREATER, ops)
        if not (y_pos and y_neg and cmp_lt and cmp_gt) or y_pos[0] != y or y_neg[0] != y or \
                not self._is(y_pos[1], 0.0) or not self._is(y_neg[1], 0.0) or cmp_lt != cmp_gt:
            return None
        d, e = cmp_lt
        got = self._arith(d, O.SUB, ops)
        if got is None or got[0] != x:
            return None
        p = got[1]
        if self._arith(p, O.MUL, ops) != (floor, y):
            return None
        # e = a_lo * b_lo - (((p - a_hi * b_hi) - a_lo * b_hi) - a_hi * b_lo)
        terms = self._arith(e, O.SUB, ops)
        ll = terms and self._arith(terms[0], O.MUL, ops)
        s3 = terms and self._arith(terms[1], O.SUB, ops)
        hl = s3 and self._arith(s3[1], O.MUL, ops)
        s2 = s3 and self._arith(s3[0], O.SUB, ops)
        lh = s2 and self._arith(s2[1], O.MUL, ops)
        s1 = s2 and self._arith(s2[0], O.SUB, ops)
        hh = s1 and self._arith(s1[1], O.MUL, ops)
        if not (ll and hl and lh and hh) or s1[0] != p:  # type: ignore[index]
            return None
        a_lo, b_lo = ll
        a_hi, b_hi = hh
        if hl != (a_hi, b_lo) or lh != (a_lo, b_hi) or self._split_hi(a_lo, floor, ops) != a_hi:
            return None
        v = self.const(y)
        if v is None:
            if self._split_hi(b_lo, y, ops) != b_hi:
                return None
        elif np.any(v == 0):  # TFLite's FLOOR_DIV fails where the chain gives +-inf or NaN
            return None
        else:  # a constant divisor: split at import, in float32
            hi_c, lo_c = self.const(b_hi), self.const(b_lo)
            v = v.astype(np.float32)
            with np.errstate(over="ignore", invalid="ignore"):
                c = v * np.float32(4097.0)
                want_hi = c - (c - v)
                want_lo = v - want_hi
            if hi_c is None or lo_c is None or hi_c.size != v.size or lo_c.size != v.size or \
                    not np.array_equal(hi_c.reshape(-1), want_hi.reshape(-1), equal_nan=True) \
                    or not np.array_equal(lo_c.reshape(-1), want_lo.reshape(-1),
                                          equal_nan=True):
                return None
        out = g.operations[sel][2][0]
        copy = self.only_reader(out, O.CONCATENATION)
        if copy is not None and len(g.operations[copy][1]) == 2 and \
                self.scalars(g.operations[copy][1], range(1, 2)) == [0]:
            ops.add(copy)
            out = g.operations[copy][2][0]
        if min(ops) != k:
            return None
        for j in ops:  # what the chain computes on the way is read by the chain alone
            for i in g.operations[j][2]:
                if i != out and (i in self.edges or not ops.issuperset(self.readers.get(i, ()))):
                    return None
        shape = self.shape(out)
        if shape is None:
            return None

        def convert(cx: ExportOpContext) -> None:
            cx.emit(BO.FLOOR_DIV, [cx.t(0), cx.t(1)], [cx.o()])
        return Fusion("FLOOR_DIV", tuple(sorted(ops)), (x, y), (out,), convert)
