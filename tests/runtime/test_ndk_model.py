"""NDK model rules, each with the exact result code the C API returns."""

from __future__ import annotations

import os

import numpy as np
from ndk_helpers import F32, I32, OK, add_model

from nnhal.hal.types import OperandLifeTime
from nnhal.runtime import ndk as N
from nnhal.runtime.codes import ResultCode as R

T = N.ANeuralNetworksOperandType


def new_model():
    code, m = N.ANeuralNetworksModel_create()
    assert code == OK
    return m


def test_add_operand_to_finished_model_is_bad_state():
    m = add_model()
    assert N.ANeuralNetworksModel_addOperand(m, T(F32, [1])) == R.BAD_STATE


def test_add_operand_null_type_is_unexpected_null():
    assert N.ANeuralNetworksModel_addOperand(new_model(), None) == R.UNEXPECTED_NULL


def test_add_operand_null_model_is_unexpected_null():
    assert N.ANeuralNetworksModel_addOperand(None, T(F32, [1])) == R.UNEXPECTED_NULL


def test_add_operand_invalid_type_is_bad_data():
    assert N.ANeuralNetworksModel_addOperand(new_model(), T(9999, [1])) == R.BAD_DATA


def test_add_operand_scalar_with_dimensions_is_bad_data():
    assert N.ANeuralNetworksModel_addOperand(new_model(), T(I32, [2])) == R.BAD_DATA


def test_add_operand_quant8_without_scale_is_bad_data():
    assert N.ANeuralNetworksModel_addOperand(new_model(), T(5, [2], 0.0, 0)) == R.BAD_DATA
    assert N.ANeuralNetworksModel_addOperand(new_model(), T(5, [2], 0.5, 300)) == R.BAD_DATA
    assert N.ANeuralNetworksModel_addOperand(new_model(), T(5, [2], 0.5, 3)) == OK


def test_set_operand_value_index_out_of_range_is_bad_data():
    m = new_model()
    assert N.ANeuralNetworksModel_addOperand(m, T(I32)) == OK
    assert N.ANeuralNetworksModel_setOperandValue(m, 1, b"\0" * 4, 4) == R.BAD_DATA
    assert N.ANeuralNetworksModel_setOperandValue(m, -1, b"\0" * 4, 4) == R.BAD_DATA


def test_set_operand_value_wrong_length_is_bad_data():
    m = new_model()
    assert N.ANeuralNetworksModel_addOperand(m, T(F32, [2])) == OK
    assert N.ANeuralNetworksModel_setOperandValue(m, 0, b"\0" * 4, 4) == R.BAD_DATA
    assert N.ANeuralNetworksModel_setOperandValue(m, 0, b"\0" * 8, 8) == OK


def test_set_operand_value_unknown_dimensions_is_bad_data():
    m = new_model()
    assert N.ANeuralNetworksModel_addOperand(m, T(F32, [0])) == OK
    assert N.ANeuralNetworksModel_setOperandValue(m, 0, b"\0" * 4, 4) == R.BAD_DATA


def test_set_operand_value_null_buffer_with_length_is_bad_data():
    m = new_model()
    assert N.ANeuralNetworksModel_addOperand(m, T(F32, [2])) == OK
    assert N.ANeuralNetworksModel_setOperandValue(m, 0, None, 8) == R.BAD_DATA


def test_set_operand_value_null_buffer_zero_length_omits_the_operand():
    m = add_model(finish=False)
    assert N.ANeuralNetworksModel_addOperand(m, T(F32, [1])) == OK
    assert N.ANeuralNetworksModel_setOperandValue(m, 4, None, 0) == OK
    assert m.values[4] == ("none",)


def _model_with_constant(n: int):
    """ADD of input 0 and a constant of n floats, shape [n]."""
    m = new_model()
    for _ in range(2):
        assert N.ANeuralNetworksModel_addOperand(m, T(F32, [n])) == OK
    assert N.ANeuralNetworksModel_addOperand(m, T(I32)) == OK
    assert N.ANeuralNetworksModel_addOperand(m, T(F32, [n])) == OK
    assert N.ANeuralNetworksModel_setOperandValue(m, 2, np.int32(0).tobytes(), 4) == OK
    assert N.ANeuralNetworksModel_addOperation(m, 0, [0, 1, 2], [3]) == OK
    assert N.ANeuralNetworksModel_identifyInputsAndOutputs(m, [0], [3]) == OK
    return m


def _constant_of(m, index: int) -> np.ndarray:
    op = m.hal.main.operands[index]
    if op.lifetime == OperandLifeTime.CONSTANT_COPY:
        raw = m.hal.operand_values[op.location.offset:op.location.offset + op.location.length]
        return np.frombuffer(raw, np.float32)
    return m.hal.pools[op.location.pool_index].read(op.location.offset,
                                                    op.location.length)


def test_small_values_are_copied_when_set():
    m = _model_with_constant(4)  # 16 bytes: copied
    buf = np.ones(4, np.float32)
    assert N.ANeuralNetworksModel_setOperandValue(m, 1, buf, buf.nbytes) == OK
    buf[:] = 7
    assert N.ANeuralNetworksModel_finish(m) == OK
    assert m.hal.main.operands[1].lifetime == OperandLifeTime.CONSTANT_COPY
    assert list(_constant_of(m, 1)) == [1, 1, 1, 1]


def test_large_values_are_referenced_until_finish():
    m = _model_with_constant(64)  # 256 bytes: referenced
    buf = np.ones(64, np.float32)
    assert N.ANeuralNetworksModel_setOperandValue(m, 1, buf, buf.nbytes) == OK
    buf[:] = 7  # the caller's buffer is read at finish
    assert N.ANeuralNetworksModel_finish(m) == OK
    assert m.hal.main.operands[1].lifetime == OperandLifeTime.CONSTANT_REFERENCE
    assert set(np.frombuffer(_constant_of(m, 1), np.float32)) == {7.0}


def test_set_operand_value_from_memory_rules():
    m = _model_with_constant(4)
    fd = os.memfd_create("t")
    os.ftruncate(fd, 32)
    code, mem = N.ANeuralNetworksMemory_createFromFd(32, 3, fd, 0)
    os.close(fd)
    assert code == OK
    f = N.ANeuralNetworksModel_setOperandValueFromMemory
    assert f(m, 1, None, 0, 16) == R.UNEXPECTED_NULL
    assert f(m, 1, mem, 24, 16) == R.BAD_DATA  # beyond the memory
    assert f(m, 1, mem, 0, 12) == R.BAD_DATA  # length of another operand
    assert f(m, 9, mem, 0, 16) == R.BAD_DATA  # no such operand
    assert f(m, 1, mem, 16, 16) == OK
    assert N.ANeuralNetworksModel_finish(m) == OK


def test_set_operand_value_from_model_rules():
    m = new_model()
    assert N.ANeuralNetworksModel_addOperand(m, T(15)) == OK  # ANEURALNETWORKS_MODEL
    assert N.ANeuralNetworksModel_addOperand(m, T(F32, [1])) == OK
    unfinished = add_model(finish=False)
    f = N.ANeuralNetworksModel_setOperandValueFromModel
    assert f(m, 0, unfinished) == R.BAD_STATE  # as upstream: the value model's state
    assert f(m, 0, None) == R.UNEXPECTED_NULL
    assert f(m, 1, add_model()) == R.BAD_DATA  # not a MODEL operand
    assert f(m, 0, add_model()) == OK


def test_symm_per_channel_quant_params_rules():
    m = new_model()
    assert N.ANeuralNetworksModel_addOperand(m, T(11, [3, 2])) == OK
    assert N.ANeuralNetworksModel_addOperand(m, T(F32, [3])) == OK
    P = N.ANeuralNetworksSymmPerChannelQuantParams
    f = N.ANeuralNetworksModel_setOperandSymmPerChannelQuantParams
    assert f(m, 1, P(0, [1.0, 1.0, 1.0])) == R.BAD_DATA  # not per-channel
    assert f(m, 0, P(0, [1.0, 1.0])) == R.BAD_DATA  # 2 scales for 3 channels
    assert f(m, 0, P(2, [1.0, 1.0])) == R.BAD_DATA  # channelDim beyond the rank
    assert f(m, 0, P(0, [1.0, 0.0, 1.0])) == R.BAD_DATA  # a scale of 0
    assert f(m, 0, None) == R.UNEXPECTED_NULL
    assert f(m, 0, P(1, [0.5, 0.25])) == OK


def test_add_operation_rules():
    m = add_model(finish=False)
    f = N.ANeuralNetworksModel_addOperation
    assert f(m, 5000, [0, 1, 2], [3]) == R.BAD_DATA  # no such operation
    assert f(m, 0, [0, 1, 7], [3]) == R.BAD_DATA  # no operand 7
    assert f(m, 0, [0, 1, 2], [2]) == R.BAD_DATA  # output with a value
    assert f(m, 0, None, [3]) == R.UNEXPECTED_NULL
    assert N.ANeuralNetworksModel_finish(m) == OK
    assert f(m, 0, [0, 1, 2], [3]) == R.BAD_STATE


def test_identify_inputs_and_outputs_rules():
    m = add_model(finish=False)
    f = N.ANeuralNetworksModel_identifyInputsAndOutputs
    assert f(m, [0, 9], [3]) == R.BAD_DATA  # out of range
    assert f(m, [0, 2], [3]) == R.BAD_DATA  # a constant as input
    assert f(m, [0, 0], [3]) == R.BAD_DATA  # listed twice
    assert f(m, [0, 1], None) == R.UNEXPECTED_NULL
    assert f(m, [0, 1], [3]) == OK


def test_finish_twice_is_bad_state():
    m = add_model()
    assert N.ANeuralNetworksModel_finish(m) == R.BAD_STATE


def test_finish_of_invalid_model_is_bad_data_then_bad_state():
    m = new_model()
    for _ in range(2):
        assert N.ANeuralNetworksModel_addOperand(m, T(F32, [2])) == OK
    assert N.ANeuralNetworksModel_addOperand(m, T(I32)) == OK
    # Counts and types fit ADD, but its activation (operand 2) never gets a value.
    assert N.ANeuralNetworksModel_addOperation(m, 0, [0, 0, 2], [1]) == OK
    assert N.ANeuralNetworksModel_identifyInputsAndOutputs(m, [0], [1]) == OK
    assert N.ANeuralNetworksModel_finish(m) == R.BAD_DATA
    assert N.ANeuralNetworksModel_addOperand(m, T(F32, [2])) == R.BAD_STATE
    assert N.ANeuralNetworksCompilation_create(m)[0] == R.BAD_STATE


def test_finish_without_operations_is_bad_data():
    m = new_model()
    assert N.ANeuralNetworksModel_addOperand(m, T(F32, [2])) == OK
    assert N.ANeuralNetworksModel_finish(m) == R.BAD_DATA


def test_relax_after_finish_is_bad_state():
    m = add_model()
    assert N.ANeuralNetworksModel_relaxComputationFloat32toFloat16(m, True) == R.BAD_STATE


def test_relax_reaches_the_hal_model():
    m = add_model(finish=False)
    assert N.ANeuralNetworksModel_relaxComputationFloat32toFloat16(m, True) == OK
    assert N.ANeuralNetworksModel_finish(m) == OK
    assert m.hal.relax_computation_float32_to_float16 is True


def test_supported_operations_for_devices_rules(device):
    f = N.ANeuralNetworksModel_getSupportedOperationsForDevices
    assert f(add_model(finish=False), [device])[0] == R.BAD_STATE
    assert f(add_model(), [])[0] == R.BAD_DATA
    assert f(add_model(), [None])[0] == R.UNEXPECTED_NULL
    assert f(add_model(), None)[0] == R.UNEXPECTED_NULL
    assert f(add_model(), [device]) == (OK, [True])


# ---- addOperation checks the signature at once (upstream's ModelBuilder::addOperation) ----

TENSOR_I32 = 4


def _operands(m, *types):
    for t in types:
        assert N.ANeuralNetworksModel_addOperand(m, t) == OK


def test_add_operation_with_too_few_inputs_is_bad_data():
    m = new_model()
    _operands(m, T(F32, [2]), T(F32, [2]))
    assert N.ANeuralNetworksModel_addOperation(m, 0, [0], [1]) == R.BAD_DATA  # ADD takes 3
    # Nothing was added: the same operands still take a valid ADD.
    _operands(m, T(I32))
    assert N.ANeuralNetworksModel_addOperation(m, 0, [0, 0, 2], [1]) == OK


def test_add_operation_with_too_many_outputs_is_bad_data():
    m = new_model()
    _operands(m, T(F32, [2]), T(I32), T(F32, [2]), T(F32, [2]))
    assert N.ANeuralNetworksModel_addOperation(m, 0, [0, 0, 1], [2, 3]) == R.BAD_DATA


def test_add_operation_with_an_input_of_the_wrong_type_is_bad_data():
    m = new_model()
    _operands(m, T(F32, [2]), T(F32, [2]), T(F32, [2]))
    # The activation (input 2) must be an INT32 scalar, not a tensor.
    assert N.ANeuralNetworksModel_addOperation(m, 0, [0, 1, 2], [1]) == R.BAD_DATA


def test_add_operation_with_mixed_tensor_types_is_bad_data():
    m = new_model()
    _operands(m, T(F32, [2]), T(TENSOR_I32, [2]), T(I32), T(F32, [2]))
    assert N.ANeuralNetworksModel_addOperation(m, 0, [0, 1, 2], [3]) == R.BAD_DATA


def test_add_operation_with_an_output_of_the_wrong_type_is_bad_data():
    m = new_model()
    _operands(m, T(F32, [2]), T(I32), T(TENSOR_I32, [2]))
    assert N.ANeuralNetworksModel_addOperation(m, 0, [0, 0, 1], [2]) == R.BAD_DATA


def test_add_operation_before_its_constants_are_set_is_fine():
    """Values may come after addOperation: only counts and types are checked at once."""
    m = new_model()
    _operands(m, T(F32, [2]), T(I32), T(F32, [2]))
    assert N.ANeuralNetworksModel_addOperation(m, 0, [0, 0, 1], [2]) == OK
    assert N.ANeuralNetworksModel_setOperandValue(m, 1, np.int32(0).tobytes(), 4) == OK
    assert N.ANeuralNetworksModel_identifyInputsAndOutputs(m, [0], [2]) == OK
    assert N.ANeuralNetworksModel_finish(m) == OK
