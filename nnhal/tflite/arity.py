"""What each builtin the importer reads may carry: how many inputs and outputs, which inputs
may be omitted (tensor index -1), and which options table it reads. The counts are those
TFLite's kernels accept in their Prepare, declared once as data and checked for every
operator when a file is read, so an operator with extra inputs is refused rather than
converted with the extras ignored; options of another table are absent to TFLite (its
``builtin_options_as_X`` answers null and the kernel takes the defaults), and so to nnhal."""

from __future__ import annotations

from dataclasses import dataclass

from tflite.BuiltinOptions import BuiltinOptions


@dataclass(frozen=True)
class Arity:
    #: Inclusive bounds on the input count; ``None`` for no upper bound.
    inputs: tuple[int, int | None]
    outputs: tuple[int, int | None] = (1, 1)
    #: Input positions that may be -1 (an optional input left out).
    optional: frozenset[int] = frozenset()
    #: As many outputs as inputs (WHILE's loop variables).
    same: bool = False
    #: The BuiltinOptions table the operator reads; None when it reads none.
    options: str | None = None

    def problem(self, n_in: int, n_out: int) -> str | None:
        """Why these counts are refused, or None."""
        for what, n, (lo, hi) in (("inputs", n_in, self.inputs),
                                  ("outputs", n_out, self.outputs)):
            if n < lo or (hi is not None and n > hi):
                want = f"{lo}" if lo == hi else (f"at least {lo}" if hi is None
                                                 else f"{lo} to {hi}")
                return f"has {n} {what} (TFLite's kernel takes {want})"
        if self.same and n_in != n_out:
            return f"has {n_in} inputs and {n_out} outputs (TFLite's kernel takes as many of each)"
        return None


def _a(n_in: int | tuple[int, int | None], n_out: int | tuple[int, int | None] = 1,
       optional: tuple[int, ...] = (), same: bool = False) -> Arity:
    return Arity(n_in if isinstance(n_in, tuple) else (n_in, n_in),
                 n_out if isinstance(n_out, tuple) else (n_out, n_out),
                 frozenset(optional), same)


_UNARY = ("ABS", "CAST", "DENSIFY", "DEPTH_TO_SPACE", "DEQUANTIZE", "ELU", "EXP", "FLOOR",
          "HARD_SWISH", "L2_NORMALIZATION", "LEAKY_RELU", "LOCAL_RESPONSE_NORMALIZATION", "LOG",
          "LOGICAL_NOT", "LOGISTIC", "LOG_SOFTMAX", "NEG", "QUANTIZE", "RANK", "RELU", "RELU6",
          "RELU_N1_TO_1", "RSQRT", "SHAPE", "SIN", "SOFTMAX", "SPACE_TO_DEPTH", "SQRT", "SQUARE",
          "SQUEEZE", "TANH", "AVERAGE_POOL_2D", "MAX_POOL_2D", "L2_POOL_2D", "READ_VARIABLE")
_BINARY = ("ADD", "SUB", "MUL", "DIV", "FLOOR_DIV", "POW", "MAXIMUM", "MINIMUM", "PRELU",
           "SQUARED_DIFFERENCE", "EQUAL", "NOT_EQUAL", "GREATER", "GREATER_EQUAL", "LESS",
           "LESS_EQUAL", "LOGICAL_AND", "LOGICAL_OR", "ARG_MAX", "ARG_MIN", "EXPAND_DIMS",
           "TRANSPOSE", "GATHER", "TILE", "MEAN", "SUM", "REDUCE_PROD", "REDUCE_MAX",
           "REDUCE_MIN", "REDUCE_ANY", "REDUCE_ALL", "RESIZE_BILINEAR",
           "RESIZE_NEAREST_NEIGHBOR", "FILL", "EMBEDDING_LOOKUP")
#: LSTM inputs TFLite's full kernel allows to be left out: the input gate's weights and
#: bias (CIFG), the peepholes, the projection and the layer normalisation weights.
_LSTM_OPTIONAL = (1, 5, 9, 10, 11, 12, 16, 17, 20, 21, 22, 23)

#: Builtins whose options table is not named after them (the others read
#: ``<CamelCaseName>Options`` when the schema has it, else none).
_OPTIONS = {"AVERAGE_POOL_2D": "Pool2DOptions", "MAX_POOL_2D": "Pool2DOptions",
            "L2_POOL_2D": "Pool2DOptions", "CONV_2D": "Conv2DOptions",
            "DEPTHWISE_CONV_2D": "DepthwiseConv2DOptions",
            "BATCH_TO_SPACE_ND": "BatchToSpaceNDOptions",
            "SPACE_TO_BATCH_ND": "SpaceToBatchNDOptions",
            "BIDIRECTIONAL_SEQUENCE_RNN": "BidirectionalSequenceRNNOptions",
            "L2_NORMALIZATION": "L2NormOptions", "LSH_PROJECTION": "LSHProjectionOptions",
            "BATCH_MATMUL": "BatchMatMulOptions",
            "LSTM": "LSTMOptions", "MAXIMUM": "MaximumMinimumOptions",
            "MINIMUM": "MaximumMinimumOptions", "PADV2": "PadV2Options", "RNN": "RNNOptions",
            "SVDF": "SVDFOptions", "TOPK_V2": "TopKV2Options",
            "UNIDIRECTIONAL_SEQUENCE_LSTM": "UnidirectionalSequenceLSTMOptions",
            "UNIDIRECTIONAL_SEQUENCE_RNN": "SequenceRNNOptions",
            **{n: "ReducerOptions" for n in ("MEAN", "SUM", "REDUCE_PROD", "REDUCE_MAX",
                                             "REDUCE_MIN", "REDUCE_ANY", "REDUCE_ALL")}}


def _with_options(name: str, arity: Arity) -> Arity:
    table = _OPTIONS.get(name, "".join(p.capitalize() for p in name.split("_")) + "Options")
    if not hasattr(BuiltinOptions, table):
        return arity
    return Arity(arity.inputs, arity.outputs, arity.optional, arity.same, table)


#: Builtin name -> what TFLite's kernel accepts, for every builtin the importer reads.
ARITY: dict[str, Arity] = {
    **{name: _a(1) for name in _UNARY},
    **{name: _a(2) for name in _BINARY},
    "ADD_N": _a((2, None)),
    "CONCATENATION": _a((1, None)),
    "PACK": _a((1, None)),
    "BATCH_MATMUL": _a(2),
    "MIRROR_PAD": _a(2),
    "REVERSE_V2": _a(2),
    "UNPACK": _a(1, (1, None)),
    "CONV_2D": _a(3),  # its kernel requires the bias
    "DEPTHWISE_CONV_2D": _a((2, 3)),  # a bias, when listed, may not be -1
    "TRANSPOSE_CONV": _a((3, 4), optional=(3,)),
    "FULLY_CONNECTED": _a((2, 3), (1, 2), optional=(2,)),
    "RESHAPE": _a((1, 2)),
    "PAD": _a((2, 3), optional=(2,)),
    "PADV2": _a((2, 3), optional=(2,)),
    "SLICE": _a(3),
    "STRIDED_SLICE": _a(4),
    "SPLIT": _a(2, (1, None)),
    "SPLIT_V": _a(3, (1, None)),
    "TOPK_V2": _a(2, 2),
    "SELECT": _a(3),
    "SELECT_V2": _a(3),
    "RANGE": _a(3),
    "BATCH_TO_SPACE_ND": _a(3),
    "SPACE_TO_BATCH_ND": _a(3),
    "HASHTABLE_LOOKUP": _a(3, 2),
    "LSH_PROJECTION": _a((2, 3), optional=(2,)),
    "RNN": _a(5),
    "UNIDIRECTIONAL_SEQUENCE_RNN": _a(5),
    "SVDF": _a(5, optional=(3,)),
    "BIDIRECTIONAL_SEQUENCE_RNN": _a(12, (1, 2), optional=(9, 10, 11)),
    "LSTM": _a((20, 24), optional=_LSTM_OPTIONAL),
    "UNIDIRECTIONAL_SEQUENCE_LSTM": _a((20, 24), optional=_LSTM_OPTIONAL),
    "IF": _a((1, None), (0, None)),
    "WHILE": _a((0, None), (0, None), same=True),
    "CALL_ONCE": _a(0, 0),
    "VAR_HANDLE": _a(0, 1),
    "ASSIGN_VARIABLE": _a(2, 0),
}
#: Builtins issue 27's reach added (lowered or folded), kept apart for merges.
ARITY.update({
    "FLOOR_MOD": _a(2),
    "BROADCAST_TO": _a(2),
    "BROADCAST_ARGS": _a(2),
    "ZEROS_LIKE": _a(1),
})
#: Builtins nnhal's extension org.nnhal.tflite stands for (nnhal/extensions/tflite_builtins.py).
ARITY.update({
    "RFFT2D": _a(2),
    "COMPLEX_ABS": _a(1),
    "REAL": _a(1),
    "IMAG": _a(1),
    "CUMSUM": _a(2),
    "SIGN": _a(1),
    "CEIL": _a(1),
    "ROUND": _a(1),
    "COS": _a(1),
})
ARITY = {name: _with_options(name, a) for name, a in ARITY.items()}
