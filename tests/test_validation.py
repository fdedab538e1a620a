"""Invalid models and requests get INVALID_ARGUMENT from every entry point, never an exception."""

import copy

import numpy as np
import pytest
from helpers import add_model, float_inputs

from nnhal.hal.builder import ModelBuilder, RequestBuilder
from nnhal.hal.interfaces import PreparedModelCallback
from nnhal.hal.types import (
    ChannelScales,
    DataLocation,
    ErrorStatus,
    ExecutionPreference,
    MeasureTiming,
    MemoryPool,
    Operand,
    OperandLifeTime,
    OperandType,
    Operation,
    OperationType,
    Priority,
    RequestArgument,
    Subgraph,
    SymmPerChannelQuantParams,
)
from nnhal.hidl import ExecutionCallback
from nnhal.hidl import execute as execute_1_3
from nnhal.memory import SharedMemory

T = OperandType
L = OperandLifeTime


def _mutations():
    def op_type(m):
        m.main.operands[0].type = 99

    def quant_scale(m):
        m.main.operands[0].scale = 0.0

    def quant_zero_point(m):
        m.main.operands[0].zero_point = 300

    def float_with_scale(m):
        m.main.operands[0].scale = 0.5

    def scalar_with_dims(m):
        m.main.operands[2].dimensions = [1]

    def lifetime_invalid(m):
        m.main.operands[0].lifetime = 42

    def copy_beyond_values(m):
        m.main.operands[2].location = DataLocation(0, 4096, 4)

    def copy_wrong_length(m):
        m.main.operands[2].location = DataLocation(0, 0, 2)

    def input_with_location(m):
        m.main.operands[0].location = DataLocation(0, 0, 4)

    def reference_bad_pool(m):
        m.main.operands[2].lifetime = L.CONSTANT_REFERENCE
        m.main.operands[2].location = DataLocation(3, 0, 4)

    def operation_type(m):
        m.main.operations[0].type = 5000

    def oem_operation(m):
        m.main.operations[0].type = 10000

    def input_index_range(m):
        m.main.operations[0].inputs[0] = 17

    def output_index_range(m):
        m.main.operations[0].outputs[0] = 17

    def too_few_inputs(m):
        m.main.operations[0].inputs.pop()
        m.main.operands[2].number_of_consumers = 0

    def too_many_outputs(m):
        m.main.operands.append(Operand(T.TENSOR_FLOAT32, [2, 2],
                                       lifetime=L.SUBGRAPH_OUTPUT))
        m.main.operations[0].outputs.append(4)
        m.main.output_indexes.append(4)

    def wrong_input_type(m):
        m.main.operands[2].type = T.FLOAT32

    def consumers_wrong(m):
        m.main.operands[0].number_of_consumers = 3

    def input_removed(m):
        m.main.input_indexes.pop()

    def input_duplicated(m):
        m.main.input_indexes.append(m.main.input_indexes[0])

    def output_removed(m):
        m.main.output_indexes.clear()

    def no_writer(m):
        m.main.operands.append(Operand(T.TENSOR_FLOAT32, [2], number_of_consumers=0))

    def written_twice(m):
        m.main.operations.append(copy.deepcopy(m.main.operations[0]))
        for i in m.main.operations[0].inputs:
            m.main.operands[i].number_of_consumers += 1

    def order_broken(m):
        # out = a + b; out2 = out + a, with the operations swapped.
        m.main.operands[3].lifetime = L.TEMPORARY_VARIABLE
        m.main.output_indexes = [4]
        m.main.operands.append(Operand(T.TENSOR_FLOAT32, [2, 2], lifetime=L.SUBGRAPH_OUTPUT))
        m.main.operands[3].number_of_consumers = 1
        m.main.operands[0].number_of_consumers += 1
        m.main.operands[2].number_of_consumers += 1
        m.main.operations.insert(0, Operation(int(OperationType.ADD), [3, 0, 2], [4]))

    def subgraph_reference_range(m):
        m.main.operands.append(Operand(T.SUBGRAPH, [], lifetime=L.SUBGRAPH,
                                       location=DataLocation(0, 5, 0)))

    def cycle(m):
        sg_ref = Operand(T.SUBGRAPH, [], lifetime=L.SUBGRAPH, location=DataLocation(0, 0, 0))
        m.referenced.append(Subgraph([sg_ref], [], [], []))

    def rank_too_high(m):
        for i in (0, 1, 3):
            m.main.operands[i].dimensions = [1, 1, 1, 2, 2]

    def per_channel_bad_scales(m):
        m.main.operands[0].type = T.TENSOR_QUANT8_SYMM_PER_CHANNEL
        m.main.operands[0].extra_params = SymmPerChannelQuantParams([1.0], 0)

    # Frozen scales (as the importer makes them) are checked by their bounds: each bad kind.
    # An input (no value) with a location: each field alone, and a DataLocation subclass.
    def input_location_pool(m):
        m.main.operands[0].location = DataLocation(1, 0, 0)

    def input_location_offset(m):
        m.main.operands[0].location = DataLocation(0, 8, 0)

    def input_location_subclass(m):
        class Other(DataLocation):
            pass
        m.main.operands[0].location = Other(0, 0, 0)

    def per_channel_frozen_nan_scale(m):
        m.main.operands[0].type = T.TENSOR_QUANT8_SYMM_PER_CHANNEL
        m.main.operands[0].extra_params = SymmPerChannelQuantParams(
            ChannelScales([1.0, float("nan")]), 0)

    def per_channel_frozen_zero_scale(m):
        m.main.operands[0].type = T.TENSOR_QUANT8_SYMM_PER_CHANNEL
        m.main.operands[0].extra_params = SymmPerChannelQuantParams(ChannelScales([0.5, 0.0]), 0)

    def per_channel_frozen_infinite_scale(m):
        m.main.operands[0].type = T.TENSOR_QUANT8_SYMM_PER_CHANNEL
        m.main.operands[0].extra_params = SymmPerChannelQuantParams(
            ChannelScales([float("inf"), 1.0]), 0)

    def per_channel_frozen_scale_past_float32(m):
        m.main.operands[0].type = T.TENSOR_QUANT8_SYMM_PER_CHANNEL
        m.main.operands[0].extra_params = SymmPerChannelQuantParams(ChannelScales([1e39, 1.0]), 0)

    def per_channel_frozen_scale_count(m):
        m.main.operands[0].type = T.TENSOR_QUANT8_SYMM_PER_CHANNEL
        m.main.operands[0].extra_params = SymmPerChannelQuantParams(ChannelScales([1.0]), 0)

    return {k: v for k, v in locals().items() if callable(v)}


MUTATIONS = _mutations()
#: Mutations that break quantization parameters apply to the quant8 variant of the model.
QUANT_MUTATIONS = {"quant_scale", "quant_zero_point"}


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_invalid_model_rejected(device, name):
    model = add_model(quant=name in QUANT_MUTATIONS)
    assert device.get_supported_operations(model)[0] == ErrorStatus.NONE
    MUTATIONS[name](model)
    status, supported = device.get_supported_operations(model)
    assert status == ErrorStatus.INVALID_ARGUMENT, name
    assert supported == []
    cb = PreparedModelCallback()
    launch = device.prepare_model(model, ExecutionPreference.FAST_SINGLE_ANSWER,
                                  Priority.MEDIUM, None, [], [], b"", cb)
    status, prepared = cb.wait(10)
    assert launch == ErrorStatus.INVALID_ARGUMENT
    assert status == ErrorStatus.INVALID_ARGUMENT and prepared is None
    assert cb.calls == 1


def test_valid_model_accepted(device):
    status, supported = device.get_supported_operations(add_model())
    assert status == ErrorStatus.NONE and supported == [True]


@pytest.mark.parametrize("preference, priority", [(7, Priority.LOW), (0, 9)])
def test_invalid_preference_or_priority(device, preference, priority):
    cb = PreparedModelCallback()
    launch = device.prepare_model(add_model(), preference, priority, None, [], [], b"", cb)
    assert launch == ErrorStatus.INVALID_ARGUMENT
    assert cb.wait(5)[0] == ErrorStatus.INVALID_ARGUMENT and cb.calls == 1


def _prepared(device, model=None):
    cb = PreparedModelCallback()
    device.prepare_model(model or add_model(), ExecutionPreference.FAST_SINGLE_ANSWER,
                         Priority.MEDIUM, None, [], [], b"", cb)
    status, pm = cb.wait(10)
    assert status == ErrorStatus.NONE
    return pm


def _request_mutations():
    def pool_index(r):
        r.inputs[0] = RequestArgument(False, DataLocation(9, 0, 16), [])

    def offset_beyond(r):
        r.inputs[0] = RequestArgument(False, DataLocation(0, 10_000, 16), [])

    def length_beyond(r):
        r.outputs[0] = RequestArgument(False, DataLocation(1, 0, 10_000), [])

    def length_too_small(r):
        r.inputs[0] = RequestArgument(False, DataLocation(0, 0, 4), [])

    def dims_disagree(r):
        r.inputs[0].dimensions = [4, 1]

    def rank_disagree(r):
        r.inputs[0].dimensions = [2, 2, 1]

    def too_few_inputs(r):
        r.inputs.pop()

    def too_many_outputs(r):
        r.outputs.append(r.outputs[0])

    def no_value_with_location(r):
        r.inputs[0].has_no_value = True

    def unknown_token(r):
        r.pools.append(MemoryPool.of_token(12345))
        r.outputs[0] = RequestArgument(False, DataLocation(2, 0, 0), [])

    def not_memory(r):
        r.pools[0] = b"bytes are not shared memory"

    return {k: v for k, v in locals().items() if callable(v)}


REQUEST_MUTATIONS = _request_mutations()


@pytest.mark.parametrize("name", sorted(REQUEST_MUTATIONS))
def test_invalid_request_rejected_sync_and_async(device, name):
    pm = _prepared(device)
    a, b = float_inputs(0)
    rb = RequestBuilder([a, b], [16])
    REQUEST_MUTATIONS[name](rb.request)
    status, shapes, timing = pm.execute_synchronously(rb.request, MeasureTiming.YES)
    assert status == ErrorStatus.INVALID_ARGUMENT and shapes == [] and not timing.available
    cb = ExecutionCallback()
    launch = execute_1_3(pm, rb.request, MeasureTiming.NO, None, None, cb)
    assert launch == ErrorStatus.INVALID_ARGUMENT
    assert cb.wait(5)[0] == ErrorStatus.INVALID_ARGUMENT and cb.calls == 1
    rb.close()


def test_loop_timeout_above_maximum_rejected(device):
    pm = _prepared(device)
    rb = RequestBuilder(list(float_inputs(0)), [16])
    status, _, _ = pm.execute_synchronously(rb.request, MeasureTiming.NO, None, 16 * 10**9)
    assert status == ErrorStatus.INVALID_ARGUMENT


def test_constant_beyond_pool_rejected(device):
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, [64])
    c = b.constant(T.TENSOR_FLOAT32, np.ones(64, np.float32))  # 256 bytes: goes to a pool
    out = b.output(T.TENSOR_FLOAT32, [64])
    b.operation(OperationType.ADD, [x, c, b.scalar(T.INT32, 0)], [out])
    model = b.build()
    assert model.main.operands[c].lifetime == L.CONSTANT_REFERENCE
    assert device.get_supported_operations(model)[0] == ErrorStatus.NONE
    model.pools[0] = SharedMemory.ashmem(128)  # now too small for the constant
    assert device.get_supported_operations(model)[0] == ErrorStatus.INVALID_ARGUMENT


def test_declared_extension_is_valid_but_unsupported(device):
    from nnhal.hal.types import ExtensionNameAndPrefix, make_extension_type

    op_ext = add_model()
    op_ext.extension_name_to_prefix = [ExtensionNameAndPrefix("com.example.ops", 1)]
    op_ext.main.operations[0].type = make_extension_type(1, 5)
    assert device.get_supported_operations(op_ext) == (ErrorStatus.NONE, [False])
    operand_ext = add_model()
    operand_ext.extension_name_to_prefix = [ExtensionNameAndPrefix("com.example.types", 7)]
    operand_ext.main.operands[0].type = make_extension_type(7, 3)
    assert device.get_supported_operations(operand_ext) == (ErrorStatus.NONE, [False])


def test_undeclared_extension_is_invalid(device):
    from nnhal.hal.types import make_extension_type

    model = add_model()
    model.main.operations[0].type = make_extension_type(1, 5)
    assert device.get_supported_operations(model)[0] == ErrorStatus.INVALID_ARGUMENT


def test_declared_output_shape_contradicting_inputs_rejected_at_prepare(device):
    # The fuzzer found a TRANSPOSE_CONV_2D whose stride made a 16M-row output while the model
    # declared [1, 2, 5, 5]: the conflict must be refused at prepare, not computed first.
    model = add_model(dims=(2, 2), out_dims=(3, 2))
    cb = PreparedModelCallback()
    device.prepare_model(model, ExecutionPreference.FAST_SINGLE_ANSWER, Priority.MEDIUM, None,
                         [], [], b"", cb)
    status, prepared = cb.wait(10)
    assert status == ErrorStatus.INVALID_ARGUMENT and prepared is None and cb.calls == 1
    # Unknown declared dimensions are filled in, not contradicted.
    assert _prepared(device, add_model(dims=(2, 2), out_dims=(0, 2))) is not None
