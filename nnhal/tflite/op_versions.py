"""The operator versions TFLite's builtin resolver registers, as ai-edge-litert 2.3 answers
(probed once per builtin: the interpreter resolves an operator code's version before any
kernel runs, and refuses one it does not register, as too new or never valid). A version
past them asks for semantics no runtime here knows, so the importer refuses it (through
:func:`nnhal.tflite.kernel_rules.kernel_refusal`) rather than reading it as an older one.
Builtins TFLite registers at no version (CALL, most STABLEHLO_ ones) are absent: nnhal has
no converter for them either."""

from __future__ import annotations

#: Builtins registered from version 1 up to the key.
_UP_TO: dict[int, str] = {
    1: (
        "ADD_N ASSIGN_VARIABLE ATAN2 BITCAST BITWISE_XOR BROADCAST_ARGS BUCKETIZE CALL_ONCE CEIL "
        "COMPLEX_ABS CONV_3D CONV_3D_TRANSPOSE CUMSUM DENSIFY DILATE ELU EMBEDDING_LOOKUP_SPARSE "
        "EXPAND_DIMS FLOOR HARD_SWISH HASHTABLE HASHTABLE_FIND HASHTABLE_IMPORT HASHTABLE_LOOKUP "
        "HASHTABLE_SIZE IF IMAG L2_POOL_2D LOCAL_RESPONSE_NORMALIZATION LOGICAL_AND LOGICAL_NOT "
        "LOGICAL_OR LSH_PROJECTION MATRIX_DIAG MATRIX_SET_DIAG MULTINOMIAL NEG "
        "NON_MAX_SUPPRESSION_V4 NON_MAX_SUPPRESSION_V5 ONE_HOT POW PRELU RANDOM_STANDARD_NORMAL "
        "RANDOM_UNIFORM RANK READ_VARIABLE REAL REDUCE_ALL REDUCE_ANY REDUCE_WINDOW RELU_0_TO_1 "
        "RELU_N1_TO_1 RESHAPE REVERSE_SEQUENCE RFFT2D RIGHT_SHIFT ROUND SCATTER_ND SEGMENT_SUM "
        "SHAPE SKIP_GRAM SQUARE STABLEHLO_ADD STABLEHLO_AND STABLEHLO_COMPOSITE STABLEHLO_GATHER "
        "STABLEHLO_MAXIMUM STABLEHLO_MINIMUM STABLEHLO_MULTIPLY STABLEHLO_PAD "
        "STABLEHLO_REDUCE_WINDOW STABLEHLO_RNG_BIT_GENERATOR STABLEHLO_SCATTER "
        "STABLEHLO_SHIFT_LEFT UNIQUE UNSORTED_SEGMENT_MAX UNSORTED_SEGMENT_MIN "
        "UNSORTED_SEGMENT_PROD UNSORTED_SEGMENT_SUM VAR_HANDLE WHILE ZEROS_LIKE"
    ),
    2: (
        "COS DEPTH_TO_SPACE DIV EXP FAKE_QUANT FLOOR_MOD GREATER L2_NORMALIZATION LEAKY_RELU "
        "LESS_EQUAL LOG LOG_SOFTMAX RANGE REDUCE_PROD SELECT_V2 SIGN SIN SPACE_TO_DEPTH SQRT "
        "SQUARED_DIFFERENCE SQUEEZE SUM WHERE"
    ),
    3: (
        "ARG_MAX ARG_MIN AVERAGE_POOL_2D BIDIRECTIONAL_SEQUENCE_LSTM BIDIRECTIONAL_SEQUENCE_RNN "
        "FLOOR_DIV GELU GREATER_EQUAL LESS LOGISTIC MAX_POOL_2D MEAN MIRROR_PAD REDUCE_MAX "
        "REDUCE_MIN RELU RELU6 RNN RSQRT SPARSE_TO_DENSE SPLIT_V TANH TILE TOPK_V2 "
        "UNIDIRECTIONAL_SEQUENCE_RNN"
    ),
    4: (
        "BATCH_MATMUL BATCH_TO_SPACE_ND LSTM MAXIMUM MINIMUM NOT_EQUAL RESIZE_BILINEAR "
        "RESIZE_NEAREST_NEIGHBOR REVERSE_V2 SELECT SOFTMAX SPACE_TO_BATCH_ND SVDF "
        "UNIDIRECTIONAL_SEQUENCE_LSTM"
    ),
    5: (
        "ABS EMBEDDING_LOOKUP EQUAL FILL PACK SPLIT SUB TRANSPOSE_CONV"
    ),
    6: (
        "ADD DYNAMIC_UPDATE_SLICE GATHER_ND PAD PADV2 QUANTIZE UNPACK"
    ),
    7: (
        "CONCATENATION DEPTHWISE_CONV_2D"
    ),
    8: (
        "CONV_2D GATHER MUL SLICE STRIDED_SLICE"
    ),
    9: (
        "CAST DEQUANTIZE TRANSPOSE"
    ),
    14: (
        "FULLY_CONNECTED"
    ),
}

#: builtin name -> (lowest, highest) version TFLite registers.
REGISTERED: dict[str, tuple[int, int]] = {
    **{name: (1, hi) for hi, names in _UP_TO.items() for name in names.split()},
    "BROADCAST_TO": (2, 4),  # its version 1 was withdrawn
}


def version_refusal(name: str, version: int) -> str | None:
    """Why TFLite's resolver refuses version ``version`` of builtin ``name``, or None."""
    span = REGISTERED.get(name)
    if span is None or span[0] <= version <= span[1]:
        return None
    return (f"version {version} of {name} is not one TFLite registers ({span[0]} to "
            f"{span[1]})")
