"""RANDOM_MULTINOMIAL."""

import numpy as np
import pytest

from nnhal.hal.types import OperandType as T
from nnhal.hal.types import OperationType as O
from nnhal.ops.resolver import OpError
from nnhal.ops.testing import omitted, output, run_op, tensor

F32, F16, I32 = T.TENSOR_FLOAT32, T.TENSOR_FLOAT16, T.TENSOR_INT32


def test_draws_follow_the_logits():
    logits = tensor(F32, [[0.0, -np.inf, 0.0], [-np.inf, 5.0, -np.inf]])
    (out,) = run_op(O.RANDOM_MULTINOMIAL, [logits, tensor(T.INT32, 50), tensor(I32, [1, 2])],
                    [output(I32, [2, 50])])
    assert out.shape == (2, 50) and out.dtype == np.int32
    assert set(out[0].tolist()) <= {0, 2} and set(out[1].tolist()) == {1}


def test_float16_logits_and_invalid_operands():
    (out,) = run_op(O.RANDOM_MULTINOMIAL,
                    [tensor(F16, [[1.0, 1.0]]), tensor(T.INT32, 3), tensor(I32, [0, 0])],
                    [output(I32, [1, 3])])
    assert out.shape == (1, 3)
    with pytest.raises(OpError, match=r"input 2 \(seeds\) cannot be omitted"):
        run_op(O.RANDOM_MULTINOMIAL, [tensor(F32, [[1.0]]), tensor(T.INT32, 1), omitted(I32)],
               [output(I32, [1, 1])])
    with pytest.raises(OpError, match=r"input 1 \(num_samples\) has type FLOAT32"):
        run_op(O.RANDOM_MULTINOMIAL,
               [tensor(F32, [[1.0]]), tensor(T.FLOAT32, 1.0), tensor(I32, [1, 2])],
               [output(I32, [1, 1])])
    with pytest.raises(OpError, match="2 seeds"):
        run_op(O.RANDOM_MULTINOMIAL,
               [tensor(F32, [[1.0]]), tensor(T.INT32, 1), tensor(I32, [1, 2, 3])],
               [output(I32, [1, 1])])
    with pytest.raises(OpError, match="non-negative"):
        run_op(O.RANDOM_MULTINOMIAL,
               [tensor(F32, [[1.0]]), tensor(T.INT32, -1), tensor(I32, [1, 2])],
               [output(I32, [1, 1])])
