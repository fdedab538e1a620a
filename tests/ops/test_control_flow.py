"""IF and WHILE through the driver, with hand-built subgraphs."""

import numpy as np
import pytest

from nnhal.drivers.reference import ReferenceDevice
from nnhal.hal.builder import RequestBuilder
from nnhal.hal.interfaces import PreparedModelCallback
from nnhal.hal.types import (
    DataLocation,
    ErrorStatus,
    MeasureTiming,
    Model,
    Operand,
    OperandLifeTime,
    OperandType,
    Operation,
    OperationType,
    Subgraph,
)

T = OperandType
L = OperandLifeTime
O = OperationType


def _f32(dims, lifetime, consumers=0):
    return Operand(T.TENSOR_FLOAT32, list(dims), consumers, lifetime=lifetime)


def _add_const_subgraph(value_offset: int, dims=(1,)) -> Subgraph:
    """out = in + constant (from operandValues at value_offset)."""
    ops = [_f32(dims, L.SUBGRAPH_INPUT, 1),
           Operand(T.TENSOR_FLOAT32, [1], 1, lifetime=L.CONSTANT_COPY,
                   location=DataLocation(0, value_offset, 4)),
           Operand(T.INT32, [], 1, lifetime=L.CONSTANT_COPY, location=DataLocation(0, 8, 4)),
           _f32(dims, L.SUBGRAPH_OUTPUT)]
    return Subgraph(ops, [Operation(int(O.ADD), [0, 1, 2], [3])], [0], [3])


def _values() -> bytes:
    # offset 0: 1.0f, offset 4: 100.0f, offset 8: int32 0, offset 12: 10.0f
    return (np.array([1.0, 100.0], np.float32).tobytes() + np.int32(0).tobytes()
            + np.float32(10.0).tobytes())


def _prepare(model):
    dev = ReferenceDevice()
    cb = PreparedModelCallback()
    dev.prepare_model(model, 1, 1, None, [], [], b"", cb)
    status, pm = cb.wait(10)
    return dev, status, pm


def _if_model(out_dims=(1,)) -> Model:
    main = Subgraph(
        [Operand(T.TENSOR_BOOL8, [1], 1, lifetime=L.SUBGRAPH_INPUT),
         Operand(T.SUBGRAPH, [], 1, lifetime=L.SUBGRAPH, location=DataLocation(0, 0, 0)),
         Operand(T.SUBGRAPH, [], 1, lifetime=L.SUBGRAPH, location=DataLocation(0, 1, 0)),
         _f32((1,), L.SUBGRAPH_INPUT, 1), _f32(out_dims, L.SUBGRAPH_OUTPUT)],
        [Operation(int(O.IF), [0, 1, 2, 3], [4])], [0, 3], [4])
    return Model(main=main, referenced=[_add_const_subgraph(0), _add_const_subgraph(4)],
                 operand_values=_values())


@pytest.mark.parametrize("cond, expected", [(True, 6.0), (False, 105.0)])
def test_if_picks_branch(cond, expected):
    dev, status, pm = _prepare(_if_model())
    assert status == ErrorStatus.NONE
    rb = RequestBuilder([np.array([cond], np.uint8), np.array([5.0], np.float32)], [4])
    status, shapes, _ = pm.execute_synchronously(rb.request)
    assert status == ErrorStatus.NONE and shapes[0].dimensions == [1]
    assert rb.output(0, np.float32, (1,)).tolist() == [expected]
    dev.close()


def test_if_output_of_unknown_dimension():
    dev, status, pm = _prepare(_if_model(out_dims=(0,)))
    assert status == ErrorStatus.NONE
    rb = RequestBuilder([np.array([1], np.uint8), np.array([1.0], np.float32)], [4])
    status, shapes, _ = pm.execute_synchronously(rb.request)
    assert status == ErrorStatus.NONE and shapes[0].dimensions == [1]
    dev.close()


def test_if_branch_signature_mismatch_rejected():
    model = _if_model()
    model.referenced[1].operands[0].type = T.TENSOR_INT32
    dev = ReferenceDevice()
    assert dev.get_supported_operations(model)[0] == ErrorStatus.INVALID_ARGUMENT
    dev.close()


def _while_model(limit_offset: int) -> Model:
    """i = input; while i < limit: i = i + 1."""
    cond = Subgraph(
        [_f32((1,), L.SUBGRAPH_INPUT, 1),
         Operand(T.TENSOR_FLOAT32, [1], 1, lifetime=L.CONSTANT_COPY,
                 location=DataLocation(0, limit_offset, 4)),
         Operand(T.TENSOR_BOOL8, [1], 0, lifetime=L.SUBGRAPH_OUTPUT)],
        [Operation(int(O.LESS), [0, 1], [2])], [0], [2])
    main = Subgraph(
        [Operand(T.SUBGRAPH, [], 1, lifetime=L.SUBGRAPH, location=DataLocation(0, 0, 0)),
         Operand(T.SUBGRAPH, [], 1, lifetime=L.SUBGRAPH, location=DataLocation(0, 1, 0)),
         _f32((1,), L.SUBGRAPH_INPUT, 1), _f32((1,), L.SUBGRAPH_OUTPUT)],
        [Operation(int(O.WHILE), [0, 1, 2], [3])], [2], [3])
    return Model(main=main, referenced=[cond, _add_const_subgraph(0)], operand_values=_values())


def test_while_counts_up():
    dev, status, pm = _prepare(_while_model(limit_offset=12))   # limit 10
    assert status == ErrorStatus.NONE
    rb = RequestBuilder([np.array([2.5], np.float32)], [4])
    status, _, _ = pm.execute_synchronously(rb.request)
    assert status == ErrorStatus.NONE
    assert rb.output(0, np.float32, (1,)).tolist() == [10.5]
    dev.close()


def test_while_loop_timeout_gives_missed_deadline():
    dev, status, pm = _prepare(_while_model(limit_offset=4))   # limit 100
    rb = RequestBuilder([np.array([-1e9], np.float32)], [4])    # ~1e9 iterations
    status, shapes, timing = pm.execute_synchronously(rb.request, MeasureTiming.YES, None,
                                                      20_000_000)
    assert status in (ErrorStatus.MISSED_DEADLINE_TRANSIENT,
                      ErrorStatus.MISSED_DEADLINE_PERSISTENT)
    assert shapes == [] and not timing.available
    dev.close()


def test_subgraph_cycle_rejected():
    model = _while_model(limit_offset=12)
    # The body refers back to itself through a SUBGRAPH operand.
    model.referenced[1].operands.append(
        Operand(T.SUBGRAPH, [], 0, lifetime=L.SUBGRAPH, location=DataLocation(0, 1, 0)))
    dev = ReferenceDevice()
    assert dev.get_supported_operations(model)[0] == ErrorStatus.INVALID_ARGUMENT
    dev.close()


# ---- the signature: counts and types before the subgraph rules ---------------------------------

class _Sg:
    def __init__(self, inputs, outputs):
        self.input_infos, self.output_infos = inputs, outputs


def _ctx(op, ins, outs, subgraphs):
    from nnhal.ops.resolver import OpContext
    return OpContext(op_type=op, inputs=ins, outputs=outs, subgraphs=subgraphs)


def _info(t, shape=(1,), lifetime=L.TEMPORARY_VARIABLE, value=None):
    from nnhal.ops.resolver import OperandInfo
    return OperandInfo(type=t, shape=shape, lifetime=lifetime, value=value)


def test_if_signature():
    from nnhal.ops.catalog import check_operation, lookup
    from nnhal.ops.resolver import OpError
    f32 = _info(T.TENSOR_FLOAT32)
    ref = [_info(T.SUBGRAPH, (), L.SUBGRAPH, k) for k in (0, 1)]
    cond = _info(T.TENSOR_BOOL8)
    # No branch inputs at all (n = 0) is a valid IF.
    sgs = [_Sg([], [f32]), _Sg([], [f32])]
    check_operation(lookup(O.IF), _ctx(O.IF, [cond, *ref], [f32], sgs))
    with pytest.raises(OpError, match=r"IF: input 0 \(condition\) has type TENSOR_INT32"):
        check_operation(lookup(O.IF), _ctx(O.IF, [_info(T.TENSOR_INT32), *ref], [f32], sgs))
    with pytest.raises(OpError, match=r"IF: input 2 \(else_branch\) has type TENSOR_FLOAT32"):
        check_operation(lookup(O.IF), _ctx(O.IF, [cond, ref[0], f32], [f32], sgs))
    with pytest.raises(OpError, match=r"IF: expected at least 1 outputs, got 0"):
        check_operation(lookup(O.IF), _ctx(O.IF, [cond, *ref], [], sgs))
    # A branch input may not be an omitted operand.
    sgs = [_Sg([f32], [f32]), _Sg([f32], [f32])]
    gone = _info(T.TENSOR_FLOAT32, None, L.NO_VALUE)
    with pytest.raises(OpError, match=r"IF: input 3 \(inputs\) cannot be omitted"):
        check_operation(lookup(O.IF), _ctx(O.IF, [cond, *ref, gone], [f32], sgs))


def test_while_signature():
    from nnhal.ops.catalog import check_operation, lookup
    from nnhal.ops.resolver import OpError
    f32 = _info(T.TENSOR_FLOAT32)
    ref = [_info(T.SUBGRAPH, (), L.SUBGRAPH, k) for k in (0, 1)]
    sgs = [_Sg([f32], [_info(T.TENSOR_BOOL8)]), _Sg([f32], [f32])]
    check_operation(lookup(O.WHILE), _ctx(O.WHILE, [*ref, f32], [f32], sgs))
    with pytest.raises(OpError, match=r"WHILE: expected at least 3 inputs, got 2"):
        check_operation(lookup(O.WHILE), _ctx(O.WHILE, ref, [f32], sgs))
    with pytest.raises(OpError, match=r"WHILE: input 1 \(body\) has type TENSOR_FLOAT32"):
        check_operation(lookup(O.WHILE), _ctx(O.WHILE, [ref[0], f32, f32], [f32], sgs))
