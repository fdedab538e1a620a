"""One-operator .tflite models (written with tests/tflite/tfl.py) imported and run on the
reference driver against ai-edge-litert on the same inputs: every option kind (padding,
activation, strides, dilation, keep_dims, masks, quantized variants) of a representative set
of builtins."""

from __future__ import annotations

import numpy as np
import pytest
from runner import agree
from tfl import Graph, Quant, build, one_op

from nnhal.errors import UnsupportedModelError
from nnhal.tflite import read_tflite

pytest.importorskip("ai_edge_litert.interpreter")

F = np.float32
R = np.random.default_rng(7)


def w(*shape: int) -> np.ndarray:
    return R.normal(0, 0.5, shape).astype(F)


def conv(pad: int = 0, sw: int = 1, sh: int = 1, act: int = 0, dw: int = 1, dh: int = 1
         ) -> tuple:
    return ("Conv2DOptions", dict(Padding=pad, StrideW=sw, StrideH=sh,
                                  FusedActivationFunction=act, DilationWFactor=dw,
                                  DilationHFactor=dh))


def dw_opts(mult: int, pad: int = 0, s: int = 1, act: int = 0, d: int = 1) -> tuple:
    return ("DepthwiseConv2DOptions", dict(Padding=pad, StrideW=s, StrideH=s,
                                           DepthMultiplier=mult, FusedActivationFunction=act,
                                           DilationWFactor=d, DilationHFactor=d))


def pool(pad: int, s: int, f: int, act: int = 0) -> tuple:
    return ("Pool2DOptions", dict(Padding=pad, StrideW=s, StrideH=s, FilterWidth=f,
                                  FilterHeight=f, FusedActivationFunction=act))


I8 = np.int8
QIN = Quant([0.05], [3])
QOUT = Quant([0.1], [-5])


def q8(shape: tuple, quant: Quant = QIN) -> tuple:
    return (shape, I8, quant)


def per_channel_conv() -> bytes:
    g = Graph()
    x = g.input((1, 6, 6, 3), I8, quant=QIN)
    wq = R.integers(-127, 128, (4, 3, 3, 3)).astype(I8)
    scales = [0.01, 0.02, 0.015, 0.03]
    wt = g.const(wq, quant=Quant(scales, [0] * 4, 0))
    b = g.const(R.integers(-500, 500, 4).astype(np.int32),
                quant=Quant([0.05 * s for s in scales], [0] * 4, 0))
    y = g.tensor((1, 6, 6, 4), I8, quant=Quant([0.2], [1]))
    g.op("CONV_2D", [x, wt, b], [y], conv(0, 1, 1, 1))
    g.output(y)
    return build(g)


def per_channel_depthwise() -> bytes:
    g = Graph()
    x = g.input((1, 5, 5, 2), I8, quant=QIN)
    scales = [0.01, 0.02, 0.03, 0.04]
    wt = g.const(R.integers(-127, 128, (1, 3, 3, 4)).astype(I8), quant=Quant(scales, [0] * 4, 3))
    b = g.const(R.integers(-500, 500, 4).astype(np.int32),
                quant=Quant([0.05 * s for s in scales], [0] * 4, 0))
    y = g.tensor((1, 5, 5, 4), I8, quant=Quant([0.1], [0]))
    g.op("DEPTHWISE_CONV_2D", [x, wt, b], [y], dw_opts(2, 0, 1, 3))
    g.output(y)
    return build(g)


def uint8_conv() -> bytes:
    g = Graph()
    x = g.input((1, 5, 5, 2), np.uint8, quant=Quant([0.04], [128]))
    wt = g.const(R.integers(0, 256, (3, 2, 2, 2)).astype(np.uint8), quant=Quant([0.01], [120]))
    b = g.const(R.integers(-200, 200, 3).astype(np.int32), quant=Quant([0.0004], [0]))
    y = g.tensor((1, 2, 2, 3), np.uint8, quant=Quant([0.05], [100]))
    g.op("CONV_2D", [x, wt, b], [y], conv(1, 2, 2, 0))
    g.output(y)
    return build(g)


def fc_int8() -> bytes:
    g = Graph()
    x = g.input((2, 8), I8, quant=QIN)
    wt = g.const(R.integers(-127, 128, (5, 8)).astype(I8), quant=Quant([0.02], [0]))
    b = g.const(R.integers(-100, 100, 5).astype(np.int32), quant=Quant([0.001], [0]))
    y = g.tensor((2, 5), I8, quant=QOUT)
    g.op("FULLY_CONNECTED", [x, wt, b], [y],
         ("FullyConnectedOptions", dict(FusedActivationFunction=1)))
    g.output(y)
    return build(g)


def fc_int8_per_channel(in_shape: tuple = (2, 8), out_shape: tuple = (2, 5),
                        keep: bool = False, act: int = 0) -> bytes:
    """Per-channel weights, as TensorFlow's full-integer converter writes them."""
    g = Graph()
    x = g.input(in_shape, I8, quant=QIN)
    scales = [0.02, 0.005, 0.03, 0.011, 0.047]
    wt = g.const(R.integers(-127, 128, (5, 8)).astype(I8), quant=Quant(scales, [0] * 5, 0))
    b = g.const(R.integers(-3000, 3000, 5).astype(np.int32),
                quant=Quant([0.05 * s for s in scales], [0] * 5, 0))
    y = g.tensor(out_shape, I8, quant=QOUT)
    g.op("FULLY_CONNECTED", [x, wt, b], [y],
         ("FullyConnectedOptions", dict(FusedActivationFunction=act, KeepNumDims=keep)))
    g.output(y)
    return build(g)


def binary(name: str, opts: str, act: int, a: tuple, b: tuple | np.ndarray,
           out: tuple) -> bytes:
    return one_op(name, [(a, F), b if isinstance(b, np.ndarray) else (b, F)], out,
                  options=(opts, dict(FusedActivationFunction=act)))


def unary(name: str, shape: tuple = (2, 3, 4), options: tuple | None = None,
          dtype: type = F) -> bytes:
    return one_op(name, [(shape, dtype)], shape, options=options)


def ss(begin: list, end: list, strides: list, out: tuple, **masks: int) -> bytes:
    fields = dict(BeginMask=0, EndMask=0, EllipsisMask=0, NewAxisMask=0, ShrinkAxisMask=0)
    fields.update(masks)
    return one_op("STRIDED_SLICE", [((3, 5, 4), F), np.int32(begin), np.int32(end),
                                    np.int32(strides)], out, options=("StridedSliceOptions",
                                                                      fields))


def split_v() -> bytes:
    return one_op("SPLIT_V", [((2, 7, 3), F), np.int32([2, -1, 1]), np.int32(1)],
                  [(2, 2, 3), (2, 4, 3), (2, 1, 3)], options=("SplitVOptions",
                                                              dict(NumSplits=3)),
                  n_outputs=3)


def split() -> bytes:
    return one_op("SPLIT", [np.int32(-1), ((2, 3, 6), F)], [(2, 3, 2)] * 3, F,
                  options=("SplitOptions", dict(NumSplits=3)), n_outputs=3)


def pack() -> bytes:
    g = Graph()
    a, b = g.input((2, 3)), g.input((2, 3))
    y = g.tensor((2, 2, 3), F)
    g.op("PACK", [a, b], [y], ("PackOptions", dict(ValuesCount=2, Axis=1)))
    g.output(y)
    return build(g)


def unpack() -> bytes:
    return one_op("UNPACK", [((2, 3, 4), F)], [(2, 4)] * 3,
                  options=("UnpackOptions", dict(Num=3, Axis=1)), n_outputs=3)


def reducer(name: str, keep: bool, out: tuple, axes: list) -> bytes:
    return one_op(name, [((2, 3, 4), F), np.int32(axes)], out,
                  options=("ReducerOptions", dict(KeepDims=keep)))


def compare(name: str) -> bytes:
    return one_op(name, [((2, 3), F), ((2, 3), F)], (2, 3), out_dtype=np.bool_)


def logical(name: str) -> bytes:
    ins = [((2, 3), np.bool_)] * (1 if name == "LOGICAL_NOT" else 2)
    return one_op(name, ins, (2, 3), out_dtype=np.bool_)


def select() -> bytes:
    return one_op("SELECT", [((2, 3), np.bool_), ((2, 3), F), ((2, 3), F)], (2, 3),
                  out_dtype=F)


def topk() -> bytes:
    g = Graph()
    x = g.input((2, 6))
    k = g.const(np.int32(3))
    v, i = g.tensor((2, 3), F), g.tensor((2, 3), np.int32)
    g.op("TOPK_V2", [x, k], [v, i])
    g.output(v, i)
    return build(g)


def resize(name: str, opts: str, align: bool, half: bool) -> bytes:
    return one_op(name, [((1, 3, 4, 2), F), np.int32([5, 7])], (1, 5, 7, 2),
                  options=(opts, dict(AlignCorners=align, HalfPixelCenters=half)))


CASES = {
    "conv_valid_relu": lambda: one_op("CONV_2D", [((1, 7, 7, 2), F), w(3, 3, 3, 2), w(3)],
                                      (1, 5, 5, 3), options=conv(1, 1, 1, 1)),
    "conv_same_stride2_relu6": lambda: one_op("CONV_2D", [((1, 7, 7, 2), F), w(4, 3, 3, 2),
                                                          w(4)], (1, 4, 4, 4),
                                              options=conv(0, 2, 2, 3)),
    "conv_dilation": lambda: one_op("CONV_2D", [((1, 9, 9, 2), F), w(2, 3, 3, 2), w(2)],
                                    (1, 5, 5, 2),
                                            options=conv(1, 1, 1, 0, 2, 2)),
    "conv_int8_per_channel": per_channel_conv,
    "conv_uint8": uint8_conv,
    "depthwise_mult2_same": lambda: one_op("DEPTHWISE_CONV_2D", [((1, 6, 6, 2), F),
                                                                 w(1, 3, 3, 4), w(4)],
                                           (1, 6, 6, 4), options=dw_opts(2, 0, 1, 1)),
    "depthwise_dilation_valid": lambda: one_op("DEPTHWISE_CONV_2D", [((1, 9, 9, 3), F),
                                                                     w(1, 3, 3, 3), w(3)],
                                               (1, 5, 5, 3), options=dw_opts(1, 1, 1, 0, 2)),
    "depthwise_int8_per_channel": per_channel_depthwise,
    "transpose_conv": lambda: one_op("TRANSPOSE_CONV", [np.int32([1, 8, 8, 3]), w(3, 3, 3, 2),
                                                        ((1, 4, 4, 2), F), w(3)], (1, 8, 8, 3), F,
                                     options=("TransposeConvOptions",
                                              dict(Padding=0, StrideW=2, StrideH=2))),
    "avg_pool_same": lambda: one_op("AVERAGE_POOL_2D", [((1, 5, 5, 2), F)], (1, 3, 3, 2),
                                    options=pool(0, 2, 3)),
    "max_pool_valid_relu": lambda: one_op("MAX_POOL_2D", [((1, 6, 6, 2), F)], (1, 3, 3, 2),
                                          options=pool(1, 2, 2, 1)),
    "l2_pool": lambda: one_op("L2_POOL_2D", [((1, 4, 4, 2), F)], (1, 2, 2, 2),
                              options=pool(1, 2, 2)),
    "max_pool_int8": lambda: one_op("MAX_POOL_2D", [q8((1, 4, 4, 2))], (1, 2, 2, 2),
                                    options=pool(1, 2, 2), out_quant=QIN),
    "fc_keep_num_dims": lambda: one_op("FULLY_CONNECTED", [((2, 3, 4), F), w(5, 4), w(5)],
                                       (2, 3, 5), options=("FullyConnectedOptions",
                                                           dict(KeepNumDims=True))),
    "fc_flatten_relu": lambda: one_op("FULLY_CONNECTED", [((2, 3, 4), F), w(5, 12), None],
                                      (2, 5), options=("FullyConnectedOptions",
                                                       dict(FusedActivationFunction=1))),
    "fc_int8": fc_int8,
    "fc_int8_per_channel": fc_int8_per_channel,
    "fc_int8_per_channel_relu6_rows": lambda: fc_int8_per_channel((2, 3, 8), (6, 5), act=3),
    "fc_int8_per_channel_keep_num_dims": lambda: fc_int8_per_channel((2, 3, 8), (2, 3, 5),
                                                                     keep=True),
    "add_broadcast_relu": lambda: binary("ADD", "AddOptions", 1, (2, 3, 4), w(4), (2, 3, 4)),
    "sub_broadcast": lambda: binary("SUB", "SubOptions", 0, (2, 1, 4), (3, 1), (2, 3, 4)),
    "mul_relu_n1": lambda: binary("MUL", "MulOptions", 2, (2, 3), (2, 3), (2, 3)),
    "div": lambda: one_op("DIV", [((2, 3), F), np.float32([[1.5, -2, 4]])], (2, 3),
                          options=("DivOptions", dict(FusedActivationFunction=0))),
    "add_int8": lambda: one_op("ADD", [q8((2, 3)), q8((2, 3), Quant([0.07], [-2]))], (2, 3),
                               options=("AddOptions", dict(FusedActivationFunction=0)),
                               out_quant=QOUT),
    "maximum": lambda: one_op("MAXIMUM", [((2, 3), F), ((2, 3), F)], (2, 3)),
    "minimum": lambda: one_op("MINIMUM", [((2, 3), F), w(3)], (2, 3)),
    "concat_neg_axis": lambda: one_op("CONCATENATION", [((2, 3), F), ((2, 2), F)], (2, 5),
                                      options=("ConcatenationOptions", dict(Axis=-1))),
    "reshape": lambda: one_op("RESHAPE", [((2, 3, 4), F), np.int32([4, -1])], (4, 6)),
    "squeeze": lambda: one_op("SQUEEZE", [((1, 3, 1, 2), F)], (3, 1, 2),
                              options=("SqueezeOptions", dict(SqueezeDims=[0]))),
    "expand_dims": lambda: one_op("EXPAND_DIMS", [((2, 3), F), np.int32(-1)], (2, 3, 1)),
    "transpose": lambda: one_op("TRANSPOSE", [((2, 3, 4), F), np.int32([2, 0, 1])], (4, 2, 3)),
    "pad": lambda: one_op("PAD", [((2, 3), F), np.int32([[1, 0], [2, 1]])], (3, 6)),
    "pad_int8": lambda: one_op("PAD", [q8((2, 3)), np.int32([[1, 1], [0, 2]])], (4, 5),
                               out_quant=QIN),
    "padv2": lambda: one_op("PADV2", [((2, 3), F), np.int32([[1, 0], [2, 1]]),
                                      np.float32(0.5)], (3, 6)),
    "slice": lambda: one_op("SLICE", [((3, 4, 5), F), np.int32([1, 0, 2]),
                                      np.int32([2, -1, 2])], (2, 4, 2)),
    "strided_slice_masks": lambda: ss([1, 0, 3], [3, 4, 0], [1, 2, -1], (3, 2, 3),
                                      BeginMask=1, EndMask=0),
    "strided_slice_shrink": lambda: ss([1, -1, 0], [2, 0, 4], [1, 1, 2], (3, 2),
                                       ShrinkAxisMask=2, BeginMask=1, EndMask=1),
    "strided_slice_short": lambda: ss([1], [3], [1], (2, 5, 4)),
    "gather": lambda: one_op("GATHER", [((4, 3), F), np.int32([3, 0, 0])], (4, 3, 3)[1:] and
                             (3, 3), options=("GatherOptions", dict(Axis=0))),
    "gather_axis1": lambda: one_op("GATHER", [((2, 5), F), np.int32([4, 1])], (2, 2),
                                   options=("GatherOptions", dict(Axis=1))),
    "split": split,
    "split_v": split_v,
    "pack": pack,
    "unpack": unpack,
    "mean_keep": lambda: reducer("MEAN", True, (2, 1, 4), [1]),
    "sum": lambda: reducer("SUM", False, (3,), [0, 2]),
    "reduce_max_neg_axis": lambda: reducer("REDUCE_MAX", False, (2, 3), [-1]),
    "reduce_prod": lambda: reducer("REDUCE_PROD", True, (1, 3, 1), [0, 2]),
    "softmax_beta": lambda: unary("SOFTMAX", options=("SoftmaxOptions", dict(Beta=0.5))),
    "log_softmax": lambda: unary("LOG_SOFTMAX"),
    "logistic": lambda: unary("LOGISTIC"),
    "tanh": lambda: unary("TANH"),
    "relu": lambda: unary("RELU"),
    "relu6": lambda: unary("RELU6"),
    "relu_n1_to_1": lambda: unary("RELU_N1_TO_1"),
    "elu": lambda: unary("ELU"),
    "hard_swish": lambda: unary("HARD_SWISH"),
    "prelu": lambda: one_op("PRELU", [((1, 2, 3), F), w(3)], (1, 2, 3)),
    "leaky_relu": lambda: unary("LEAKY_RELU", options=("LeakyReluOptions", dict(Alpha=0.2))),
    "abs": lambda: unary("ABS"),
    "exp": lambda: unary("EXP"),
    "neg": lambda: unary("NEG"),
    "sin": lambda: unary("SIN"),
    "floor": lambda: unary("FLOOR"),
    "square": lambda: unary("SQUARE"),
    "logistic_int8": lambda: one_op("LOGISTIC", [q8((2, 3))], (2, 3),
                                    out_quant=Quant([1 / 256], [-128])),
    "equal": lambda: compare("EQUAL"),
    "less": lambda: compare("LESS"),
    "greater_equal": lambda: compare("GREATER_EQUAL"),
    "logical_and": lambda: logical("LOGICAL_AND"),
    "logical_not": lambda: logical("LOGICAL_NOT"),
    "select": select,
    "arg_max": lambda: one_op("ARG_MAX", [((2, 5), F), np.int32(1)], (2,), np.int32,
                              options=("ArgMaxOptions", dict(OutputType=2))),
    "topk": topk,
    "tile": lambda: one_op("TILE", [((2, 3), F), np.int32([2, 1])], (4, 3)),
    "cast_f_to_i": lambda: one_op("CAST", [((2, 3), F)], (2, 3), np.int32),
    "quantize": lambda: one_op("QUANTIZE", [((2, 3), F)], (2, 3), I8, out_quant=QOUT),
    "requantize_int8_uint8": lambda: one_op("QUANTIZE", [q8((2, 3))], (2, 3), np.uint8,
                                            out_quant=Quant([0.05], [131])),
    "dequantize": lambda: one_op("DEQUANTIZE", [q8((2, 3))], (2, 3), F),
    "resize_bilinear": lambda: resize("RESIZE_BILINEAR", "ResizeBilinearOptions", False,
                                      False),
    "resize_bilinear_align": lambda: resize("RESIZE_BILINEAR", "ResizeBilinearOptions", True,
                                            False),
    "resize_bilinear_half": lambda: resize("RESIZE_BILINEAR", "ResizeBilinearOptions", False,
                                           True),
    "resize_nearest_half": lambda: resize("RESIZE_NEAREST_NEIGHBOR",
                                          "ResizeNearestNeighborOptions", False, True),
    "depth_to_space": lambda: one_op("DEPTH_TO_SPACE", [((1, 2, 3, 8), F)], (1, 4, 6, 2),
                                     options=("DepthToSpaceOptions", dict(BlockSize=2))),
    "space_to_depth": lambda: one_op("SPACE_TO_DEPTH", [((1, 4, 6, 2), F)], (1, 2, 3, 8),
                                     options=("SpaceToDepthOptions", dict(BlockSize=2))),
    "space_to_batch": lambda: one_op("SPACE_TO_BATCH_ND", [((1, 4, 3, 1), F),
                                                           np.int32([2, 2]),
                                                           np.int32([[0, 0], [0, 1]])],
                                     (4, 2, 2, 1)),
    "batch_to_space": lambda: one_op("BATCH_TO_SPACE_ND", [((4, 2, 2, 1), F),
                                                           np.int32([2, 2]),
                                                           np.int32([[0, 0], [0, 0]])],
                                     (1, 4, 4, 1)),
    "l2_normalization": lambda: unary("L2_NORMALIZATION"),
    "lrn": lambda: one_op("LOCAL_RESPONSE_NORMALIZATION", [((1, 2, 2, 6), F)], (1, 2, 2, 6),
                          options=("LocalResponseNormalizationOptions",
                                   dict(Radius=2, Bias=1.0, Alpha=0.5, Beta=0.75))),
    "embedding_lookup": lambda: one_op("EMBEDDING_LOOKUP", [np.int32([2, 0]), ((3, 4), F)],
                                       (2, 4), F),
}

def hashtable() -> bytes:
    g = Graph()
    lookups = g.input((4,), np.int32, name="lookups")
    keys = g.const(np.int32([5, 9, 2]))
    values = g.const(w(3, 2))
    out, hits = g.tensor((4, 2), F), g.tensor((4,), np.uint8)
    g.op("HASHTABLE_LOOKUP", [lookups, keys, values], [out, hits])
    g.output(out, hits)
    return build(g)


def lsh(kind: int) -> bytes:
    g = Graph()
    x = g.input((3, 2), name="x")
    out = g.tensor((4,) if kind == 1 else (8,), np.int32)
    g.op("LSH_PROJECTION", [g.const(w(4, 2)), x, g.const(np.float32([0.5, 1.0, 2.0]))], [out],
         ("LSHProjectionOptions", dict(Type=kind)))
    g.output(out)
    return build(g)


def q(scale: float, zp: int) -> Quant:
    return Quant([scale], [zp])


U8 = np.uint8
QU = Quant([0.04], [128])

CASES.update({
    "avg_pool_int8": lambda: one_op("AVERAGE_POOL_2D", [q8((1, 5, 5, 2))], (1, 3, 3, 2),
                                    options=pool(0, 2, 3), out_quant=QIN),
    "max_pool_uint8": lambda: one_op("MAX_POOL_2D", [((1, 4, 4, 2), U8, QU)], (1, 2, 2, 2),
                                     options=pool(1, 2, 2, 1), out_quant=QU),
    "softmax_int8": lambda: one_op("SOFTMAX", [q8((2, 5))], (2, 5),
                                   options=("SoftmaxOptions", dict(Beta=1.0)),
                                   out_quant=q(1 / 256, -128)),
    "tanh_int8": lambda: one_op("TANH", [q8((2, 5))], (2, 5), out_quant=q(1 / 128, 0)),
    "hard_swish_int8": lambda: one_op("HARD_SWISH", [q8((2, 5))], (2, 5), out_quant=QOUT),
    "relu6_uint8": lambda: one_op("RELU6", [((2, 5), U8, QU)], (2, 5), out_quant=QU),
    "concat_uint8_rescale": lambda: one_op("CONCATENATION", [((2, 3), U8, QU),
                                                             ((2, 2), U8, q(0.08, 120))],
                                           (2, 5), options=("ConcatenationOptions",
                                                            dict(Axis=1)),
                                           out_quant=q(0.05, 128)),
    "concat_int8": lambda: one_op("CONCATENATION", [q8((2, 3)), q8((2, 2))], (2, 5),
                                  options=("ConcatenationOptions", dict(Axis=1)),
                                  out_quant=QIN),
    "reshape_int8": lambda: one_op("RESHAPE", [q8((2, 3, 4)), np.int32([6, 4])], (6, 4),
                                   out_quant=QIN),
    "transpose_uint8": lambda: one_op("TRANSPOSE", [((2, 3, 4), U8, QU), np.int32([1, 0, 2])],
                                      (3, 2, 4), out_quant=QU),
    "strided_slice_int8": lambda: one_op("STRIDED_SLICE", [q8((3, 5)), np.int32([0, 1]),
                                                           np.int32([3, 5]), np.int32([2, 2])],
                                         (2, 2), options=("StridedSliceOptions", dict()),
                                         out_quant=QIN),
    "gather_int8": lambda: one_op("GATHER", [q8((4, 3)), np.int32([1, 3])], (2, 3),
                                  options=("GatherOptions", dict(Axis=0)), out_quant=QIN),
    "mean_int8_keep": lambda: one_op("MEAN", [q8((1, 4, 4, 3)), np.int32([1, 2])],
                                     (1, 1, 1, 3), options=("ReducerOptions",
                                                            dict(KeepDims=True)),
                                     out_quant=QIN),
    "resize_bilinear_int8": lambda: one_op("RESIZE_BILINEAR", [q8((1, 3, 4, 2)),
                                                               np.int32([5, 7])],
                                           (1, 5, 7, 2), options=("ResizeBilinearOptions",
                                                                  dict(HalfPixelCenters=True)),
                                           out_quant=QIN),
    "depth_to_space_uint8": lambda: one_op("DEPTH_TO_SPACE", [((1, 2, 3, 8), U8, QU)],
                                           (1, 4, 6, 2), out_quant=QU,
                                           options=("DepthToSpaceOptions",
                                                    dict(BlockSize=2))),
    "add_uint8_relu": lambda: one_op("ADD", [((2, 3), U8, QU), ((2, 3), U8, q(0.03, 100))],
                                     (2, 3), options=("AddOptions",
                                                      dict(FusedActivationFunction=1)),
                                     out_quant=q(0.05, 10)),
    "mul_int8_broadcast": lambda: one_op("MUL", [q8((2, 3)), q8((3,), q(0.02, 0))], (2, 3),
                                         options=("MulOptions",
                                                  dict(FusedActivationFunction=0)),
                                         out_quant=q(0.01, 2)),
    "sub_int8": lambda: one_op("SUB", [q8((2, 3)), q8((2, 3), q(0.06, -1))], (2, 3),
                               options=("SubOptions", dict(FusedActivationFunction=0)),
                               out_quant=QOUT),
    "quantize_uint8": lambda: one_op("QUANTIZE", [((2, 3), F)], (2, 3), U8, out_quant=QU),
    "dequantize_uint8": lambda: one_op("DEQUANTIZE", [((2, 3), U8, QU)], (2, 3), F),
    "arg_min_int8": lambda: one_op("ARG_MIN", [q8((2, 5)), np.int32(-1)], (2,), np.int32,
                                   options=("ArgMinOptions", dict(OutputType=2))),
    "hashtable_lookup": hashtable,
    "add_n": lambda: one_op("ADD_N", [((2, 3), F), ((2, 3), F), w(2, 3)], (2, 3)),
    "squared_difference": lambda: one_op("SQUARED_DIFFERENCE", [((2, 3), F), w(3)], (2, 3)),
    "lsh_projection_sparse": lambda: lsh(1),
    "lsh_projection_dense": lambda: lsh(2),
})


def _bmm(adj_x: bool = False, adj_y: bool = False) -> tuple:
    return ("BatchMatMulOptions", dict(AdjX=adj_x, AdjY=adj_y))


# The builtins that map to operations of AIDL v2 / v3 (and int8 RSQRT, feature level 7).
CASES.update({
    "batch_matmul": lambda: one_op("BATCH_MATMUL", [((2, 3, 4), F), ((2, 4, 5), F)],
                                   (2, 3, 5), options=_bmm()),
    "batch_matmul_adjoint": lambda: one_op("BATCH_MATMUL", [((2, 2, 4, 3), F),
                                                            ((2, 2, 5, 4), F)],
                                           (2, 2, 3, 5), options=_bmm(True, True)),
    # A smaller rank broadcast with leading 1s (openWakeWord's melspectrogram: [1,1,1,257] x
    # a constant [257, 32]), and a run-time one reshaped.
    "batch_matmul_smaller_rank_constant": lambda: one_op(
        "BATCH_MATMUL", [((1, 1, 3, 6), F),
                         np.random.default_rng(4).uniform(-1, 1, (6, 4)).astype(F)],
        (1, 1, 3, 4), options=_bmm()),
    "batch_matmul_smaller_rank_input": lambda: one_op(
        "BATCH_MATMUL", [((1, 2, 3), F), ((3, 4), F)], (1, 2, 4), options=_bmm()),
    "batch_matmul_int8": lambda: one_op("BATCH_MATMUL", [q8((3, 4)), q8((4, 2), q(0.02, 5))],
                                        (3, 2), options=_bmm(),
                                        out_quant=q(0.5, -3)),
    "pack_int8_last_axis": lambda: one_op("PACK", [q8((2, 3)), q8((2, 3)), q8((2, 3))],
                                          (2, 3, 3), options=("PackOptions",
                                                              dict(ValuesCount=3, Axis=-1)),
                                          out_quant=QIN),
    "mirror_pad_reflect": lambda: one_op("MIRROR_PAD", [((3, 4), F), np.int32([[1, 2], [0, 3]])],
                                         (6, 7), options=("MirrorPadOptions", dict(Mode=0))),
    "mirror_pad_symmetric_uint8": lambda: one_op(
        "MIRROR_PAD", [((1, 3, 4, 2), U8, QU), np.int32([[0, 0], [3, 3], [1, 4], [0, 0]])],
        (1, 9, 9, 2), options=("MirrorPadOptions", dict(Mode=1)), out_quant=QU),
    "reverse_v2": lambda: one_op("REVERSE_V2", [((2, 3, 4), F), np.int32([1])], (2, 3, 4)),
    "reverse_v2_negative_axis_int8": lambda: one_op("REVERSE_V2", [q8((2, 3, 4)),
                                                                   np.int32([-1])],
                                                    (2, 3, 4), out_quant=QIN),
    "reverse_v2_two_axes": lambda: one_op("REVERSE_V2", [((2, 3, 4), F), np.int32([1, 2])],
                                          (2, 3, 4)),
    # zero point -128: every stored value is a real value >= 0, where TFLite's kernel runs
    "rsqrt_int8": lambda: one_op("RSQRT", [q8((2, 5), q(0.05, -128))], (2, 5),
                                 out_quant=q(0.1, -100)),
})

def spatial_mean(dtype: type, keep: bool, axes: list[int], shape: tuple = (2, 5, 3, 4)
                 ) -> bytes:
    """Keras's global average pool, with an output quantization of its own."""
    qin, qout = (QIN, QOUT) if dtype == I8 else (Quant([0.05], [130]), Quant([0.02], [120]))
    out = (shape[0], 1, 1, shape[3]) if keep else (shape[0], shape[3])
    return one_op("MEAN", [(shape, dtype, qin), np.int32(axes)], out,
                  options=("ReducerOptions", dict(KeepDims=keep)), out_quant=qout)


@pytest.mark.parametrize("dtype,keep,axes", [(I8, True, [1, 2]), (I8, False, [2, 1]),
                                             (np.uint8, False, [-3, -2])])
def test_a_requantizing_spatial_mean_is_a_depthwise_convolution(dtype: type, keep: bool,
                                                                axes: list[int]) -> None:
    """The HAL's MEAN keeps its input's quantization; TFLite's may change it. Over height and
    width (as Keras writes it) a depthwise convolution of ones requantizes with one rounding."""
    from nnhal.hal.types import OperationType

    data = spatial_mean(dtype, keep, axes)
    main = read_tflite(data).model.main
    assert OperationType(main.operations[0].type) == OperationType.DEPTHWISE_CONV_2D
    x = np.random.default_rng(9).integers(np.iinfo(dtype).min, np.iinfo(dtype).max + 1,
                                          (2, 5, 3, 4)).astype(dtype)
    agree(data, [x])


def test_a_requantizing_mean_is_a_dense_layer_of_ones() -> None:
    """LayerNorm's int8 MEAN over the features, requantized: one FULLY_CONNECTED unit of
    ones at scale 1/n (a single rescale, as TFLite's), within a step of ai-edge-litert, kept
    dims or not; over another axis (the batch), TRANSPOSEd last first."""
    from nnhal.hal.types import OperationType

    for keep, out_shape in ((True, (2, 4, 4, 1)), (False, (2, 4, 4))):
        data = one_op("MEAN", [q8((2, 4, 4, 3)), np.int32([3])], out_shape,
                      options=("ReducerOptions", dict(KeepDims=keep)), out_quant=QOUT)
        ops = [OperationType(o.type).name for o in read_tflite(data).model.main.operations]
        assert ops == ["RESHAPE", "FULLY_CONNECTED", "RESHAPE"]
        agree(data)
    data = one_op("MEAN", [q8((2, 4, 4, 3)), np.int32([0])], (1, 4, 4, 3),
                  options=("ReducerOptions", dict(KeepDims=True)), out_quant=QOUT)
    ops = [OperationType(o.type).name for o in read_tflite(data).model.main.operations]
    assert ops == ["TRANSPOSE", "RESHAPE", "FULLY_CONNECTED", "RESHAPE"]
    agree(data)


@pytest.mark.parametrize("dtype", [I8, np.uint8])
def test_a_softmax_of_near_constant_logits_goes_through_float(dtype: type) -> None:
    """An input scale so small (as calibrating an untrained Keras model gives) that the HAL's
    integer softmax cannot scale it: DEQUANTIZE, float SOFTMAX, QUANTIZE, as TFLite's int8
    kernel computes exp in float."""
    from nnhal.hal.types import OperationType

    zp = 0 if dtype == I8 else 128
    out_q = Quant([1 / 256], [-128 if dtype == I8 else 0])
    data = one_op("SOFTMAX", [((3, 4), dtype, Quant([7.8e-9], [zp]))], (3, 4),
                  options=("SoftmaxOptions", dict(Beta=1.0)), out_quant=out_q)
    main = read_tflite(data).model.main
    assert [OperationType(o.type).name for o in main.operations] == [
        "DEQUANTIZE", "SOFTMAX", "QUANTIZE"]
    agree(data)


@pytest.mark.parametrize("case", ["int32_scalar_to_1", "int32_1d_to_2d", "gather_scalar_const",
                                  "gather_scalar_input", "gather_scalar_int32"])
def test_what_keras_loops_reshape_and_gather(case: str) -> None:
    """A Keras RNN's WHILE body reshapes int32 counters and gathers a time step by a scalar
    index: the HAL's RESHAPE takes no int32 and its GATHER no scalar (a TFLite scalar is a
    HAL [1])."""
    i32 = np.int32
    data = {
        "int32_scalar_to_1": lambda: one_op("RESHAPE", [((), i32), i32([1])], (1,)),
        "int32_1d_to_2d": lambda: one_op("RESHAPE", [((6,), i32), i32([2, 3])], (2, 3)),
        "gather_scalar_const": lambda: one_op("GATHER", [((4, 3), F), i32(2)], (4,),
                                              options=("GatherOptions", dict(Axis=1))),
        "gather_scalar_input": lambda: one_op("GATHER", [((5, 1, 3), F), ((), i32)], (1, 3)),
        "gather_scalar_int32": lambda: one_op("GATHER", [((5,), i32), ((), i32)], ()),
    }[case]()
    if case == "gather_scalar_input" or case == "gather_scalar_int32":
        params = np.arange(15, dtype=F).reshape(5, 1, 3) if case == "gather_scalar_input" \
            else np.arange(5, dtype=i32) * 7
        agree(data, [params, np.array(3, i32)])
    else:
        agree(data)


def test_an_int32_reshape_the_hal_cannot_express_is_refused_by_name() -> None:
    data = one_op("RESHAPE", [((2, 3), np.int32), np.int32([6])], (6,))
    with pytest.raises(UnsupportedModelError, match=r"#0 RESHAPE: the HAL's RESHAPE does not "
                                                    r"take TENSOR_INT32"):
        read_tflite(data)


POSITIVE = {"log": "LOG", "sqrt": "SQRT", "rsqrt": "RSQRT"}


@pytest.mark.parametrize("case", sorted(CASES))
def test_builtin_agrees_with_litert(case: str) -> None:
    agree(CASES[case]())


@pytest.mark.parametrize("name", sorted(POSITIVE.values()))
def test_positive_domain_agrees_with_litert(name: str) -> None:
    x = np.random.default_rng(3).uniform(0.1, 4, (2, 3, 4)).astype(F)
    agree(unary(name), [x])


def test_pow_agrees_with_litert() -> None:
    rng = np.random.default_rng(4)
    a = rng.uniform(0.1, 3, (2, 3)).astype(F)
    b = rng.uniform(-2, 2, (2, 3)).astype(F)
    agree(one_op("POW", [((2, 3), F), ((2, 3), F)], (2, 3)), [a, b])


@pytest.mark.parametrize("case, words", [
    ("hybrid", "hybrid"), ("broadcast_batch", "batch dimensions"),
    ("rank_mismatch", "batch dimensions"), ("reverse_run_time_axis", "run time"),
])
def test_aidl_builtins_the_hal_cannot_express_are_refused_by_name(case: str, words: str
                                                                  ) -> None:
    make = {
        "hybrid": lambda: one_op("BATCH_MATMUL", [((2, 3), F), q8((3, 4))], (2, 4), F,
                                 options=_bmm()),
        "broadcast_batch": lambda: one_op("BATCH_MATMUL", [((2, 2, 3), F), ((1, 3, 4), F)],
                                          (2, 2, 4), options=_bmm()),
        "rank_mismatch": lambda: one_op("BATCH_MATMUL", [((2, 2, 3), F), ((3, 4), F)],
                                        (2, 2, 4), options=_bmm()),
        "reverse_run_time_axis": lambda: one_op("REVERSE_V2", [((2, 3), F), ((1,), np.int32)],
                                                (2, 3)),
    }[case]
    with pytest.raises(UnsupportedModelError) as e:
        read_tflite(make())
    assert words in str(e.value)


def test_aidl_builtins_raise_the_imported_models_feature_level() -> None:
    from nnhal.analysis import analyse
    from nnhal.core.version import FeatureLevel

    levels = {name: analyse(read_tflite(CASES[name]()).model).min_level
              for name in ("batch_matmul", "pack", "mirror_pad_reflect", "reverse_v2",
                           "rsqrt_int8", "reshape_int8")}
    assert levels == {"batch_matmul": FeatureLevel.AIDL_V2, "pack": FeatureLevel.AIDL_V2,
                      "mirror_pad_reflect": FeatureLevel.AIDL_V3,
                      "reverse_v2": FeatureLevel.AIDL_V3, "rsqrt_int8": FeatureLevel.AIDL_V3,
                      "reshape_int8": FeatureLevel.V1_3}


def test_8bit_binary_operators_at_random_quantizations() -> None:
    """ADD, SUB, MUL, MAXIMUM, MINIMUM (int8 and uint8) and SQUARED_DIFFERENCE (int8) of
    tensors whose three quantizations are drawn at random: every stored value against 16
    others, within one step of ai-edge-litert (exactly: MAXIMUM / MINIMUM, which keep stored
    values whatever the quantization, and SQUARED_DIFFERENCE, the extension's TFLite
    arithmetic), or refused, naming why, where ai-edge-litert's own ADD / MUL overflow (an
    input to output ratio of 256 or more: results 255 steps off) or its SQUARED_DIFFERENCE
    would abort."""
    from runner import Reference, litert, litert_run

    rng = np.random.default_rng(29)
    refused = 0
    for op in ("ADD", "SUB", "MUL", "MAXIMUM", "MINIMUM", "SQUARED_DIFFERENCE"):
        for _ in range(8):
            dt = I8 if rng.random() < 0.6 or op == "SQUARED_DIFFERENCE" else np.uint8
            lo = -128 if dt == I8 else 0
            qs = [Quant([float(np.float32(10 ** rng.uniform(-3.5, 0)))],
                        [int(rng.integers(lo, lo + 256))]) for _ in range(3)]
            opts = (f"{op.title()}Options", dict(FusedActivationFunction=0)) \
                if op in ("ADD", "SUB", "MUL") else None
            data = one_op(op, [((256, 1), dt, qs[0]), ((1, 16), dt, qs[1])], (256, 16),
                          dt, opts, out_quant=qs[2])
            x = np.arange(lo, lo + 256).astype(dt)
            feeds = [x.reshape(256, 1), x[::16].reshape(1, 16).copy()]
            if op == "SQUARED_DIFFERENCE" and \
                    (2 * max(qs[0].scales[0], qs[1].scales[0])) ** 2 >= 2**14 * qs[2].scales[0]:
                # TFLite's Prepare aborts the process here (a multiplier of 1 or more)
                with pytest.raises(UnsupportedModelError, match="multiplier of 1 or more"):
                    read_tflite(data)
                refused += 1
                continue
            want = litert_run(litert(data), feeds)[0]
            ratio = max(qs[0].scales[0], qs[1].scales[0]) if op == "ADD" else \
                qs[0].scales[0] * qs[1].scales[0]
            if op in ("ADD", "MUL") and ratio >= 256 * qs[2].scales[0] * (1 - 1e-6):
                with pytest.raises(UnsupportedModelError, match="overflows its fixed point"):
                    read_tflite(data)
                refused += 1
                continue
            ref = Reference(read_tflite(data))
            try:
                got = ref.run(feeds)[0]
            finally:
                ref.close()
            steps = np.abs(got.astype(np.int32) - want.astype(np.int32)).max()
            exact = op in ("MAXIMUM", "MINIMUM", "SQUARED_DIFFERENCE")
            assert steps <= (0 if exact else 1), (op, qs, steps)
    assert refused >= 1


@pytest.mark.parametrize("approximate", [False, True])
def test_8bit_gelu_is_tfLites_table(approximate: bool) -> None:
    """int8 and uint8 GELU (a transformer's, refused before) import as org.nnhal.tflite's
    GELU, whose 8-bit kernel is TFLite's table of each stored value: every stored value
    exactly as ai-edge-litert, at random quantizations."""
    from runner import Reference, litert, litert_run

    rng = np.random.default_rng(31)
    for _ in range(6):
        dt = I8 if rng.random() < 0.6 else np.uint8
        lo = -128 if dt == I8 else 0
        qi, qo = (Quant([float(np.float32(10 ** rng.uniform(-3, 0)))],
                        [int(rng.integers(lo, lo + 256))]) for _ in range(2))
        data = one_op("GELU", [((256,), dt, qi)], (256,), dt,
                      ("GeluOptions", dict(Approximate=approximate)), out_quant=qo)
        x = np.arange(lo, lo + 256).astype(dt)
        want = litert_run(litert(data), [x])[0]
        ref = Reference(read_tflite(data))
        try:
            np.testing.assert_array_equal(ref.run([x])[0], want, err_msg=f"{qi} {qo}")
        finally:
            ref.close()
