"""CAST, QUANTIZE and DEQUANTIZE."""

import numpy as np
import pytest

from nnhal.hal.types import OperandType as T
from nnhal.hal.types import OperationType as O
from nnhal.ops.catalog import SIGNATURES
from nnhal.ops.resolver import OpError
from nnhal.ops.signature import V1_0, V1_2, V1_3
from nnhal.ops.testing import omitted, output, run_op, tensor

F32, F16, I32, B8 = T.TENSOR_FLOAT32, T.TENSOR_FLOAT16, T.TENSOR_INT32, T.TENSOR_BOOL8
U8, S8 = T.TENSOR_QUANT8_ASYMM, T.TENSOR_QUANT8_ASYMM_SIGNED


def test_cast_float_to_int32_truncates():
    (out,) = run_op(O.CAST, [tensor(F32, [-2.7, -0.5, 0.9, 3.99])], [output(I32, [4])])
    np.testing.assert_array_equal(out, [-2, 0, 0, 3])
    assert out.dtype == np.int32


def test_cast_to_quant8_saturates_then_truncates():
    (f,) = run_op(O.CAST, [tensor(F32, [-3.0, 0.7, 254.9, 300.0])], [output(U8, [4], 0.5, 7)])
    np.testing.assert_array_equal(f, [0, 0, 254, 255])
    (i,) = run_op(O.CAST, [tensor(I32, [-1, 128, 1000])], [output(U8, [3], 1.0, 0)])
    np.testing.assert_array_equal(i, [0, 128, 255])


def test_cast_ignores_quantization_params():
    (out,) = run_op(O.CAST, [tensor(U8, [0, 200], 0.5, 100)], [output(F32, [2])])
    np.testing.assert_array_equal(out, [0.0, 200.0])


def test_cast_float32_to_float16_and_int_to_float():
    (h,) = run_op(O.CAST, [tensor(F32, [1.5, 65504.0])], [output(F16, [2])])
    assert h.dtype == np.float16
    np.testing.assert_array_equal(h, np.array([1.5, 65504.0], np.float16))
    (f,) = run_op(O.CAST, [tensor(I32, [-3, 7])], [output(F32, [2])])
    np.testing.assert_array_equal(f, [-3.0, 7.0])


def test_cast_identity_types():
    (b,) = run_op(O.CAST, [tensor(B8, [True, False])], [output(B8, [2])])
    np.testing.assert_array_equal(b, [True, False])
    (s,) = run_op(O.CAST, [tensor(T.TENSOR_QUANT16_SYMM, [-300, 5], 0.1, 0)],
                  [output(T.TENSOR_QUANT16_SYMM, [2], 0.1, 0)])
    np.testing.assert_array_equal(s, [-300, 5])
    assert s.dtype == np.int16


def test_cast_invalid_pairs_rejected():
    with pytest.raises(OpError):
        run_op(O.CAST, [tensor(B8, [True])], [output(I32, [1])])
    with pytest.raises(OpError):
        run_op(O.CAST, [tensor(S8, [1], 1.0, 0)], [output(F32, [1])])


def test_cast_mismatching_declared_shape_rejected():
    with pytest.raises(OpError):
        run_op(O.CAST, [tensor(I32, [[1, 2, 3], [4, 5, 6]])], [output(I32, [100])])


def test_quantize_rounds_half_away_and_saturates():
    x = tensor(F32, [-1.25, -0.25, 0.25, 0.75, 100.0, -100.0])
    (out,) = run_op(O.QUANTIZE, [x], [output(U8, [6], 0.5, 2)])
    # x / 0.5 = -2.5, -0.5, 0.5, 1.5, 200, -200 -> rounded -3, -1, 1, 2, 200, -200; + 2.
    np.testing.assert_array_equal(out, [0, 1, 3, 4, 202, 0])
    (s,) = run_op(O.QUANTIZE, [tensor(F16, [-100.0, 0.25, 100.0])], [output(S8, [3], 0.5, -1)])
    np.testing.assert_array_equal(s, [-128, 0, 127])


def test_quantize_zero_sized():
    (out,) = run_op(O.QUANTIZE, [tensor(F32, np.zeros((0, 2)))], [output(U8, [0, 2], 0.5, 0)])
    assert out.shape == (0, 2) and out.dtype == np.uint8


def test_quantize_rejects_bad_types():
    with pytest.raises(OpError):
        run_op(O.QUANTIZE, [tensor(F32, [1.0])], [output(I32, [1])])


def test_dequantize():
    (f,) = run_op(O.DEQUANTIZE, [tensor(U8, [0, 128, 255], 0.5, 128)], [output(F32, [3])])
    np.testing.assert_array_equal(f, [-64.0, 0.0, 63.5])
    (h,) = run_op(O.DEQUANTIZE, [tensor(S8, [-128, 0], 0.25, -28)], [output(F16, [2])])
    assert h.dtype == np.float16
    np.testing.assert_array_equal(h, np.array([-25.0, 7.0], np.float16))
    (q,) = run_op(O.DEQUANTIZE, [tensor(T.TENSOR_QUANT8_SYMM, [-4, 4], 0.5, 0)],
                  [output(F32, [2])])
    np.testing.assert_array_equal(q, [-2.0, 2.0])


def test_dequantize_per_channel():
    x = tensor(T.TENSOR_QUANT8_SYMM_PER_CHANNEL, [[2, 2, 2], [-4, -4, -4]],
               channel_scales=[0.5, 0.25], channel_dim=0)
    (out,) = run_op(O.DEQUANTIZE, [x], [output(F32, [2, 3])])
    np.testing.assert_array_equal(out, [[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    y = tensor(T.TENSOR_QUANT8_SYMM_PER_CHANNEL, [[2, 2], [4, 4]],
               channel_scales=[1.0, 0.5], channel_dim=1)
    (out1,) = run_op(O.DEQUANTIZE, [y], [output(F32, [2, 2])])
    np.testing.assert_array_equal(out1, [[2.0, 1.0], [4.0, 2.0]])


def test_dequantize_rejects():
    with pytest.raises(OpError):
        run_op(O.DEQUANTIZE, [tensor(U8, [1], 0.5, 0)], [output(I32, [1])])
    with pytest.raises(OpError):
        run_op(O.DEQUANTIZE, [tensor(F32, [1.0])], [output(F32, [1])])
    with pytest.raises(OpError):
        run_op(O.DEQUANTIZE, [tensor(U8, np.zeros((1, 1, 1, 1, 1)), 0.5, 0)],
               [output(F32, [1, 1, 1, 1, 1])])
    with pytest.raises(OpError):  # per-channel scales must match the channel count
        run_op(O.DEQUANTIZE, [tensor(T.TENSOR_QUANT8_SYMM_PER_CHANNEL, [1, 2, 3],
                                     channel_scales=[1.0, 2.0], channel_dim=0)],
               [output(F32, [3])])


def test_signature_variants_and_versions():
    """Every CAST pair of the numeric types (1.2) plus the 1.3 identity casts; DEQUANTIZE's
    FLOAT16 output is 1.2 even for the 1.0 input type."""
    cast = {(v.types["T"], v.types["U"]): v.since for v in SIGNATURES[O.CAST].variants}
    assert len(cast) == 21 and cast[(F16, U8)] == V1_2 and cast[(S8, S8)] == V1_3
    assert (I32, I32) in cast and cast[(I32, I32)] == V1_2
    deq = {(v.types["T"], v.types["U"]): v.since for v in SIGNATURES[O.DEQUANTIZE].variants}
    assert deq[(U8, F32)] == V1_0 and deq[(U8, F16)] == V1_2 and deq[(S8, F32)] == V1_3


def test_omitted_input_rejected():
    for op, out in ((O.CAST, output(F32)), (O.QUANTIZE, output(U8, None, 0.5, 0)),
                    (O.DEQUANTIZE, output(F32))):
        with pytest.raises(OpError, match="cannot be omitted"):
            run_op(op, [omitted(U8 if op == O.DEQUANTIZE else F32)], [out])
