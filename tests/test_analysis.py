"""The one analysis pass: each rule and each constant once per prepare; shared and deeply
nested control flow in linear time without recursion limits; models the HAL forbids (no
inputs, no outputs); temporaries too large to hold refused cleanly."""

from __future__ import annotations

import time

import numpy as np
import pytest
from helpers import add_model, float_inputs

from nnhal import analysis
from nnhal.analysis import analyser as analyse_module
from nnhal.hal.builder import ModelBuilder, RequestBuilder
from nnhal.hal.interfaces import PreparedModelCallback
from nnhal.hal.types import (
    DataLocation,
    ErrorStatus,
    Model,
    Operand,
    OperandLifeTime,
    OperandType,
    Operation,
    OperationType,
    Subgraph,
)
from nnhal.ops import catalog

T = OperandType
L = OperandLifeTime
O = OperationType


def prepare(device, model):
    cb = PreparedModelCallback()
    launch = device.prepare_model(model, 1, 1, None, [], [], b"", cb)
    status, pm = cb.wait(30)
    return launch, status, pm


def conv_model() -> Model:
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, [1, 4, 4, 2])
    w = b.constant(T.TENSOR_FLOAT32, np.ones((3, 2, 2, 2), np.float32))
    bias = b.constant(T.TENSOR_FLOAT32, np.zeros(3, np.float32))
    params = [b.scalar(T.INT32, v) for v in (2, 2, 2, 0)]  # VALID, stride 2, no activation
    mid = b.operand(T.TENSOR_FLOAT32, [0, 0, 0, 0])
    b.operation(O.CONV_2D, [x, w, bias, *params], [mid])
    out = b.output(T.TENSOR_FLOAT32, [1, 2, 2, 3])
    b.operation(O.RELU, [mid], [out])
    return b.build()


def test_prepare_checks_and_decodes_once(device, monkeypatch):
    counts = {"structure": 0, "decode": 0, "operation": 0}

    def counting(name, fn):
        def wrapper(*a, **k):
            counts[name] += 1
            return fn(*a, **k)
        return wrapper

    monkeypatch.setattr(analyse_module, "validate_model",
                        counting("structure", analyse_module.validate_model))
    monkeypatch.setattr(analyse_module, "decode_constant",
                        counting("decode", analyse_module.decode_constant))
    monkeypatch.setattr(analyse_module, "check_and_prepare",
                        counting("operation", catalog.check_and_prepare))
    model = conv_model()
    launch, status, pm = prepare(device, model)
    assert launch == status == ErrorStatus.NONE
    constants = [op for op in model.main.operands
                 if op.lifetime in (L.CONSTANT_COPY, L.CONSTANT_REFERENCE)]
    tensors = [op for op in constants if op.dimensions]
    # Equal scalar constants (the three strides of 2) are decoded once between them.
    scalars = {(op.type, model.operand_values[op.location.offset:][:op.location.length])
               for op in constants if not op.dimensions}
    assert len(scalars) == 2 and len(tensors) == 2
    assert counts == {"structure": 1, "decode": len(tensors) + len(scalars), "operation": 2}


def test_equal_scalar_constants_share_one_read_only_info():
    g = analysis.analyse(conv_model()).main
    infos = [g.operands[i] for i in g.operations[0][1][3:]]  # the paddingscheme and strides
    assert [int(i.value) for i in infos] == [2, 2, 2, 0]
    assert infos[0] is infos[1] is infos[2] and infos[3] is not infos[0]
    assert not infos[0].value.flags.writeable and infos[0].shape == ()
    model = conv_model()  # a scale of -0.0 is valid on a scalar and kept as given
    model.main.operands[model.main.operations[0].inputs[4]].scale = -0.0
    infos = [analysis.analyse(model).main.operands[i] for i in model.main.operations[0].inputs]
    assert str(infos[4].scale) == "-0.0" and str(infos[3].scale) == str(infos[5].scale) == "0.0"


def test_validate_and_prepare_never_skips_what_a_subclass_adds():
    """The analysis asks each operation validate_and_prepare: a convolution infers its output
    shape once there, and a subclass that redefines prepare (or validate) gets the plain
    validate-then-prepare back, so its own step still runs, with the same answer."""
    from nnhal.ops.conv import Conv2D
    from nnhal.ops.resolver import OpContext, OperationDef

    calls = []

    class Counted(Conv2D):
        def prepare(self, ctx):
            calls.append("prepare")
            return super().prepare(ctx)

    assert Conv2D.validate_and_prepare is not OperationDef.validate_and_prepare
    assert Counted.validate_and_prepare is OperationDef.validate_and_prepare
    g = analysis.analyse(conv_model()).main
    _, ins, outs = g.operations[0]
    ctx = OpContext(O.CONV_2D, [g.shaped(i) for i in ins], [g.operands[i] for i in outs])
    plain = catalog.lookup(O.CONV_2D)
    assert catalog.check_and_prepare(Counted(), ctx) == catalog.check_and_prepare(plain, ctx)
    assert calls == ["prepare"]
    assert plain.validate_and_prepare(ctx) == [(1, 2, 2, 3)] == plain.prepare(ctx)


def test_a_validate_that_infers_shapes_infers_them_once(monkeypatch):
    """GATHER checks its indices against the inferred shape in validate: the analysis takes
    the shapes validate returns instead of asking prepare again (its indices scanned once)."""
    from nnhal.ops.indexing import Gather

    calls = []
    prepare = Gather.prepare
    monkeypatch.setattr(Gather, "prepare", lambda self, ctx: calls.append(1) or prepare(self, ctx))
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, [4, 3])
    idx = b.constant(T.TENSOR_INT32, np.array([3, 0], np.int32))
    out = b.output(T.TENSOR_FLOAT32, [0, 0])
    b.operation(O.GATHER, [x, b.scalar(T.INT32, 0), idx], [out])
    g = analysis.analyse(b.build()).main
    assert g.shapes[out] == (2, 3) and calls == [1]


def test_output_sizes_are_value_nbytes():
    from nnhal.hal.types import value_nbytes

    for t in T:
        for shape in (None, (), (0,), (2, 0, 3), (5,), (1, 2, 3, 4)):
            want = value_nbytes(t, shape) if t.is_tensor else None
            assert analyse_module._tensor_nbytes(t, shape) == want, (t, shape)


def test_supported_operations_and_plan_read_one_graph():
    graph = analysis.analyse(conv_model())
    assert graph.supported_operations() == [True, True]
    assert graph.main.shapes[7] == (1, 2, 2, 3)  # CONV_2D's output, declared unknown
    assert graph.main.operands[7].shape == (0, 0, 0, 0)


# ---- control flow: shared subgraphs and deep nesting ------------------------------------------

def _operand(t, dims=(), lifetime=L.TEMPORARY_VARIABLE, location=None, consumers=0):
    return Operand(type=t, dimensions=list(dims), number_of_consumers=consumers,
                   lifetime=lifetime, location=location or DataLocation())


def if_chain(depth: int) -> Model:
    """main: IF(cond, 0, 0, cond, x); subgraph k < depth: IF(cond, k+1, k+1, cond, x);
    subgraph ``depth``: x + 1. Both branches of every IF share the next subgraph."""
    one = np.float32(1).tobytes()
    values = one

    def layer(target: int | None, lifetime_in: L, lifetime_out: L) -> Subgraph:
        cond = _operand(T.TENSOR_BOOL8, [1], lifetime_in, consumers=2 if target is not None
                        else 0)
        x = _operand(T.TENSOR_FLOAT32, [1], lifetime_in, consumers=1)
        out = _operand(T.TENSOR_FLOAT32, [1], lifetime_out)
        if target is None:
            c = _operand(T.TENSOR_FLOAT32, [1], L.CONSTANT_COPY, DataLocation(0, 0, 4), 1)
            act = _operand(T.INT32, [], L.CONSTANT_COPY, DataLocation(0, 4, 4), 1)
            cond.number_of_consumers = 0
            return Subgraph([cond, x, c, act, out], [Operation(O.ADD, [1, 2, 3], [4])],
                            [0, 1], [4])
        sub = _operand(T.SUBGRAPH, [], L.SUBGRAPH, DataLocation(0, target, 0), 2)
        return Subgraph([cond, x, sub, out], [Operation(O.IF, [0, 2, 2, 0, 1], [3])],
                        [0, 1], [3])

    values = one + np.int32(0).tobytes()
    referenced = [layer(k + 1, L.SUBGRAPH_INPUT, L.SUBGRAPH_OUTPUT) for k in range(depth)]
    referenced.append(layer(None, L.SUBGRAPH_INPUT, L.SUBGRAPH_OUTPUT))
    main = layer(0, L.SUBGRAPH_INPUT, L.SUBGRAPH_OUTPUT)
    return Model(main=main, referenced=referenced, operand_values=values)


def run_chain(device, depth: int) -> tuple[float, float]:
    model = if_chain(depth)
    t0 = time.perf_counter()
    status, flags = device.get_supported_operations(model)
    assert status == ErrorStatus.NONE and flags == [True]
    launch, status, pm = prepare(device, model)
    t1 = time.perf_counter()
    assert launch == status == ErrorStatus.NONE
    req = RequestBuilder([np.array([True]), np.array([2.5], np.float32)], [4])
    status, shapes, _ = pm.execute_synchronously(req.request)
    assert status == ErrorStatus.NONE
    assert req.output(0, np.float32, [1])[0] == 3.5
    return t1 - t0, time.perf_counter() - t1


def test_shared_subgraphs_are_analysed_once(device):
    """Each IF's two branches are the same next subgraph: walking per reference would take
    2**depth steps (the old driver needed 32 s at depth 18)."""
    analysed, _ = run_chain(device, 40)
    assert analysed < 5.0


def test_nested_control_flow_runs_without_recursion_limits(device):
    import sys

    depth = sys.getrecursionlimit() + 200
    run_chain(device, depth)


# ---- models the HAL forbids, and sizes no device can hold ---------------------------------------

def test_model_without_inputs_or_outputs_is_invalid(device):
    model = add_model()
    model.main.input_indexes = []
    for i in (0, 1):
        model.main.operands[i].lifetime = L.TEMPORARY_VARIABLE
    assert device.get_supported_operations(model)[0] == ErrorStatus.INVALID_ARGUMENT
    launch, status, _ = prepare(device, model)
    assert launch == status == ErrorStatus.INVALID_ARGUMENT
    model = add_model()
    model.main.output_indexes = []
    model.main.operands[3].lifetime = L.TEMPORARY_VARIABLE
    launch, status, _ = prepare(device, model)
    assert launch == status == ErrorStatus.INVALID_ARGUMENT


def tile_model(multiples_as_input: bool) -> Model:
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, [1, 1])
    if multiples_as_input:
        m = b.input(T.TENSOR_INT32, [2])
        out = b.output(T.TENSOR_FLOAT32, [0, 0])
    else:
        m = b.constant(T.TENSOR_INT32, np.array([100_000, 1_000_000], np.int32))
        out = b.output(T.TENSOR_FLOAT32, [0, 0])
    b.operation(O.TILE, [x, m], [out])
    return b.build()


def test_known_huge_temporary_is_refused_at_prepare(device):
    model = tile_model(False)
    status, flags = device.get_supported_operations(model)
    assert status == ErrorStatus.NONE and flags == [False]
    assert "needs 400000000000 bytes" in device.refusals(model)[0]  # nnhal info --plan
    launch, status, _ = prepare(device, model)
    assert launch == status == ErrorStatus.RESOURCE_EXHAUSTED_PERSISTENT


def test_run_time_huge_temporary_is_bounded(device):
    launch, status, pm = prepare(device, tile_model(True))
    assert status == ErrorStatus.NONE
    req = RequestBuilder([np.ones((1, 1), np.float32),
                          np.array([100_000, 1_000_000], np.int32)], [64])
    t0 = time.perf_counter()
    status, _, _ = pm.execute_synchronously(req.request)
    assert status == ErrorStatus.RESOURCE_EXHAUSTED_TRANSIENT
    assert time.perf_counter() - t0 < 10.0  # a guard: refused, not allocated and computed
    req = RequestBuilder([np.ones((1, 1), np.float32), np.array([2, 3], np.int32)], [24])
    status, shapes, _ = pm.execute_synchronously(req.request)
    assert status == ErrorStatus.NONE and shapes[0].dimensions == [2, 3]


@pytest.mark.parametrize("seed", [0])
def test_add_still_runs(device, seed):
    launch, status, pm = prepare(device, add_model())
    x, y = float_inputs(seed)
    req = RequestBuilder([x, y], [16])
    assert pm.execute_synchronously(req.request)[0] == ErrorStatus.NONE
    np.testing.assert_array_equal(req.output(0, np.float32, (2, 2)), x + y)
