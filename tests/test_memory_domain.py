"""Memory domains: IDevice.allocate rules, IBuffer copies and state, buffers in requests."""

import gc
import math
import threading

import numpy as np
import pytest
from helpers import add_model

from nnhal.drivers.reference import ReferenceDevice
from nnhal.hal.builder import ModelBuilder
from nnhal.hal.interfaces import PreparedModelCallback
from nnhal.hal.types import (
    BufferDesc,
    BufferRole,
    DataLocation,
    ErrorStatus,
    ExecutionPreference,
    MeasureTiming,
    MemoryPool,
    OperandType,
    OperationType,
    Priority,
    Request,
    RequestArgument,
)
from nnhal.hidl import ExecutionCallback
from nnhal.hidl import execute as execute_1_3
from nnhal.memory import SharedMemory

T = OperandType
E = ErrorStatus


def prepare(device, model):
    cb = PreparedModelCallback()
    launch = device.prepare_model(model, ExecutionPreference.FAST_SINGLE_ANSWER,
                                  Priority.MEDIUM, None, [], [], b"", cb)
    status, pm = cb.wait(10)
    assert launch == E.NONE and status == E.NONE
    return pm


def add_model_scalar_act(t=T.TENSOR_FLOAT32, dims=(2, 2), scale=0.0, zp=0):
    """out = a + b with the activation as a third (scalar INT32) input."""
    b = ModelBuilder()
    x = b.input(t, dims, scale, zp)
    y = b.input(t, dims, scale, zp)
    act = b.input(T.INT32)
    out = b.output(t, dims, scale, zp)
    b.operation(OperationType.ADD, [x, y, act], [out])
    return b.build()


def role(io, model=0, freq=1.0):
    return BufferRole(model, io, freq)


def alloc(device, pms, ins=(), outs=(), dims=()):
    return device.allocate(BufferDesc(list(dims)), list(pms), list(ins), list(outs))


def ok_alloc(device, pms, ins=(), outs=(), dims=()):
    status, buf, token = alloc(device, pms, ins, outs, dims)
    assert status == E.NONE and buf is not None and token > 0
    return buf, token


def mem_of(arr):
    return SharedMemory.from_bytes(np.ascontiguousarray(arr).tobytes())


def read_back(buf, nbytes, dtype=np.float32):
    mem = SharedMemory.ashmem(nbytes)
    try:
        status = buf.copy_to(mem)
        return status, (mem.array().copy().view(dtype) if status == E.NONE else None)
    finally:
        mem.close()


def write(buf, arr, dims=()):
    mem = mem_of(arr)
    try:
        return buf.copy_from(mem, list(dims))
    finally:
        mem.close()


def token_arg(pool_index, dims=(), offset=0, length=0):
    return RequestArgument(False, DataLocation(pool_index, offset, length), list(dims))


@pytest.fixture
def pm(device):
    return prepare(device, add_model())


@pytest.fixture
def pm2(device):
    return prepare(device, add_model())


# ---- allocate validation ----------------------------------------------------------------

def _rejected(result):
    status, buf, token = result
    return status in (E.INVALID_ARGUMENT, E.GENERAL_FAILURE) and buf is None and token == 0


def test_allocate_requires_models_and_roles(device, pm):
    assert _rejected(alloc(device, [], [role(0)]))
    assert _rejected(alloc(device, [pm]))
    assert alloc(device, [pm])[0] == E.INVALID_ARGUMENT


def test_allocate_rejects_foreign_or_missing_prepared_models(device, pm):
    other = ReferenceDevice()
    try:
        foreign = prepare(other, add_model())
        for bad in (None, object(), foreign):
            assert _rejected(alloc(device, [bad], [role(0)]))
            assert _rejected(alloc(device, [bad], (), [role(0)]))
        assert _rejected(alloc(device, [pm, foreign], [role(0)]))
    finally:
        other.close()


def test_allocate_rejects_bad_indexes(device, pm):
    assert _rejected(alloc(device, [pm], [role(0, model=1)]))
    assert _rejected(alloc(device, [pm], (), [role(0, model=1)]))
    assert _rejected(alloc(device, [pm], [role(0, model=-1)]))
    assert _rejected(alloc(device, [pm], [role(2)]))  # two inputs
    assert _rejected(alloc(device, [pm], (), [role(1)]))  # one output
    assert _rejected(alloc(device, [pm], [role(-1)]))


@pytest.mark.parametrize("freq", [0.0, -0.5, 10.0, 1.0000001, math.nan])
def test_allocate_rejects_bad_frequency(device, pm, freq):
    assert _rejected(alloc(device, [pm], [role(0, freq=freq)]))
    assert _rejected(alloc(device, [pm], (), [role(0, freq=freq)]))


def test_allocate_accepts_frequency_bounds(device, pm):
    ok_alloc(device, [pm], [role(0, freq=1.0)])
    ok_alloc(device, [pm], [role(0, freq=1e-6)])


def test_allocate_rejects_repeated_roles(device, pm):
    assert _rejected(alloc(device, [pm], [role(0), role(0)]))
    assert _rejected(alloc(device, [pm], (), [role(0), role(0)]))
    # The same prepared model twice: different model indexes, same role.
    assert _rejected(alloc(device, [pm, pm], [role(0, 0), role(0, 1)]))
    assert _rejected(alloc(device, [pm, pm], (), [role(0, 0), role(0, 1)]))
    # An input and an output role of the same index are different roles.
    ok_alloc(device, [pm], [role(0)], [role(0)])


def _conflicts(device, pm_a, pm_b):
    return [alloc(device, [pm_a, pm_b], [role(0, 0), role(0, 1)]),
            alloc(device, [pm_a, pm_b], [role(0, 0)], [role(0, 1)]),
            alloc(device, [pm_a, pm_b], (), [role(0, 0), role(0, 1)])]


@pytest.mark.parametrize("other", [
    dict(t=T.TENSOR_FLOAT16),                             # type
    dict(t=T.TENSOR_QUANT8_ASYMM, scale=1.0, zp=0),       # type (vs quant below)
    dict(dims=(2, 2, 1)),                                 # rank
    dict(dims=(4, 2)),                                    # dimensions
])
def test_allocate_rejects_conflicting_float_operands(device, pm, other):
    pm_b = prepare(device, add_model_scalar_act(**other))
    assert all(_rejected(r) for r in _conflicts(device, pm, pm_b))


@pytest.mark.parametrize("other", [dict(scale=1.0), dict(zp=10), dict(
    t=T.TENSOR_QUANT8_ASYMM_SIGNED)])
def test_allocate_rejects_conflicting_quant_operands(device, other):
    base = dict(t=T.TENSOR_QUANT8_ASYMM, scale=0.5, zp=0)
    pm_a = prepare(device, add_model_scalar_act(**base))
    pm_b = prepare(device, add_model_scalar_act(**{**base, **other}))
    assert all(_rejected(r) for r in _conflicts(device, pm_a, pm_b))
    # Same operands in two models: fine.
    pm_c = prepare(device, add_model_scalar_act(**base))
    ok_alloc(device, [pm_a, pm_c], [role(0, 0)], [role(0, 1)])


def test_allocate_rejects_desc_conflicts(device, pm):
    for dims in ([2], [2, 2, 1], [3, 2], [2, 3]):
        assert _rejected(alloc(device, [pm], [role(0)], dims=dims))
        assert _rejected(alloc(device, [pm], (), [role(0)], dims=dims))
    ok_alloc(device, [pm], [role(0)], dims=[2, 2])
    ok_alloc(device, [pm], [role(0)], dims=[0, 2])
    assert _rejected(alloc(device, [pm], [role(0)], dims=[-1, 2]))


def test_allocate_scalar_role(device):
    pm = prepare(device, add_model_scalar_act())
    assert _rejected(alloc(device, [pm], [role(2)], dims=[1]))
    buf, _ = ok_alloc(device, [pm], [role(2)])
    assert write(buf, np.int32(1), [1]) == E.INVALID_ARGUMENT
    assert write(buf, np.int32(1)) == E.NONE
    assert read_back(buf, 4, np.int32) [1].tolist() == [1]


def test_tokens_positive_unique_and_released(device, pm):
    handles = [ok_alloc(device, [pm], [role(0)]) for _ in range(5)]
    tokens = [t for _, t in handles]
    assert all(t > 0 for t in tokens) and len(set(tokens)) == 5
    buf, tok = handles[0]
    assert device.buffers.lookup(tok) is not None
    buf.close()
    assert device.buffers.lookup(tok) is None
    assert read_back(buf, 16)[0] != E.NONE
    # Dropping the handle frees it too.
    tok2 = handles[1][1]
    del handles[1], buf
    gc.collect()
    assert device.buffers.lookup(tok2) is None
    live = {t for _, t in handles}
    _, tok3 = ok_alloc(device, [pm], [role(0)])
    assert tok3 not in live


# ---- copies and states ------------------------------------------------------------------

def test_copy_state_transitions(device, pm):
    buf, _ = ok_alloc(device, [pm], [role(0)], [role(0)])
    x = np.arange(4, dtype=np.float32).reshape(2, 2)
    assert read_back(buf, 16)[0] == E.GENERAL_FAILURE       # uninitialized
    assert write(buf, x) == E.NONE                           # dims from the role
    status, got = read_back(buf, 16)
    assert status == E.NONE and got.tolist() == x.reshape(-1).tolist()
    assert read_back(buf, 8)[0] == E.INVALID_ARGUMENT        # wrong size, either way
    assert read_back(buf, 32)[0] == E.INVALID_ARGUMENT
    assert write(buf, x, [2, 2]) == E.NONE
    assert write(buf, x[:1]) == E.INVALID_ARGUMENT           # size mismatch ...
    assert read_back(buf, 16)[0] == E.GENERAL_FAILURE        # ... leaves it uninitialized
    assert write(buf, x) == E.NONE
    for dims in ([4], [2, 2, 1], [1, 4], [0, 2]):
        assert write(buf, x, dims) == E.INVALID_ARGUMENT
    assert read_back(buf, 16)[0] == E.GENERAL_FAILURE
    assert buf.copy_from(b"not memory", []) == E.INVALID_ARGUMENT
    assert buf.copy_to("not memory") == E.INVALID_ARGUMENT


def test_unknown_dimensions_resolved_by_copy_from(device):
    pm = prepare(device, add_model_scalar_act(dims=(0, 2)))
    buf, _ = ok_alloc(device, [pm], [role(0)])
    x = np.arange(6, dtype=np.float32)
    assert write(buf, x) == E.INVALID_ARGUMENT               # dims unknown, none given
    assert write(buf, x, [3, 0]) == E.INVALID_ARGUMENT
    assert write(buf, x, [3, 2]) == E.NONE
    assert read_back(buf, 24)[1].tolist() == x.tolist()
    assert write(buf, x, [2, 2]) == E.INVALID_ARGUMENT       # 16 bytes needed, 24 given


def test_concurrent_copies(device, pm):
    buf, _ = ok_alloc(device, [pm], [role(0)])
    x = np.arange(4, dtype=np.float32)
    assert write(buf, x) == E.NONE
    errors = []

    def reader():
        for _ in range(50):
            status, got = read_back(buf, 16)
            if status != E.NONE or got.tolist() not in (x.tolist(), (x + 1).tolist()):
                errors.append((status, got))

    def writer():
        for i in range(50):
            if write(buf, x + (i % 2)) != E.NONE:
                errors.append("write")

    threads = [threading.Thread(target=reader) for _ in range(6)] + \
        [threading.Thread(target=writer) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads) and errors == []


# ---- buffers in requests ----------------------------------------------------------------

def _run(pm, request, path="sync"):
    if path == "sync":
        status, shapes, _ = pm.execute_synchronously(request, MeasureTiming.NO)
        return status, shapes
    cb = ExecutionCallback()
    launch = execute_1_3(pm, request, MeasureTiming.NO, None, None, cb)
    status, shapes, _ = cb.wait(10)
    assert launch in (E.NONE, status)
    return status, shapes


@pytest.mark.parametrize("path", ["sync", "async"])
def test_execution_through_buffers(device, pm, path):
    a, ta = ok_alloc(device, [pm], [role(0)])
    b, tb = ok_alloc(device, [pm], [role(1)], [role(0)])      # output may feed input 1 later
    x = np.arange(4, dtype=np.float32)
    assert write(a, x) == E.NONE
    assert write(b, np.ones(4, np.float32)) == E.NONE
    out, to = ok_alloc(device, [pm], [role(1)], [role(0)])
    req = Request([token_arg(0), token_arg(1)], [token_arg(2)],
                  [MemoryPool.of_token(ta), MemoryPool.of_token(tb), MemoryPool.of_token(to)])
    status, shapes = _run(pm, req, path)
    assert status == E.NONE and list(shapes[0].dimensions) == [2, 2]
    assert read_back(out, 16)[1].tolist() == (x + 1).tolist()
    # The output buffer is now initialized and may be used as input 1.
    req2 = Request([token_arg(0), token_arg(1)], [token_arg(2)],
                   [MemoryPool.of_token(ta), MemoryPool.of_token(to), MemoryPool.of_token(tb)])
    assert _run(pm, req2, path)[0] == E.NONE
    assert read_back(b, 16)[1].tolist() == (2 * x + 1).tolist()


def _shared_in_out(x):
    mem_in, mem_out = mem_of(x), SharedMemory.ashmem(x.nbytes)
    return mem_in, mem_out


def test_uninitialized_input_fails_and_output_initializes(device, pm):
    buf, tok = ok_alloc(device, [pm], [role(0)], [role(0)])
    x = np.arange(4, dtype=np.float32)
    mem_in, mem_out = _shared_in_out(x)
    try:
        as_input = Request([token_arg(2), token_arg(0, length=16)], [token_arg(1, length=16)],
                           [mem_in, mem_out, MemoryPool.of_token(tok)])
        for path in ("sync", "async"):
            assert _run(pm, as_input, path)[0] == E.GENERAL_FAILURE
        as_output = Request([token_arg(0, length=16), token_arg(0, length=16)], [token_arg(2)],
                            [mem_in, mem_out, MemoryPool.of_token(tok)])
        assert _run(pm, as_output)[0] == E.NONE
        assert read_back(buf, 16)[1].tolist() == (2 * x).tolist()
        assert _run(pm, as_input)[0] == E.NONE
        assert mem_out.array().view(np.float32).tolist() == (3 * x).tolist()
    finally:
        mem_in.close()
        mem_out.close()


def test_failed_execution_leaves_output_uninitialized(device):
    # The model's batch is unknown; the buffer is declared [1, 2]; an input of batch 2 gives an
    # output that does not fit: the execution fails and the buffer is uninitialized.
    pm = prepare(device, add_model_scalar_act(dims=(0, 2)))
    buf, tok = ok_alloc(device, [pm], (), [role(0)], dims=[1, 2])
    assert write(buf, np.zeros(2, np.float32)) == E.NONE
    x = np.arange(4, dtype=np.float32)
    act = np.int32(0)
    mem_in = SharedMemory.from_bytes(x.tobytes() + act.tobytes())
    try:
        args = [token_arg(0, [2, 2], 0, 16), token_arg(0, [2, 2], 0, 16),
                token_arg(0, (), 16, 4)]
        req = Request(args, [token_arg(1)], [mem_in, MemoryPool.of_token(tok)])
        assert _run(pm, req)[0] == E.GENERAL_FAILURE
        assert read_back(buf, 8)[0] == E.GENERAL_FAILURE
        # Request dimensions that disagree with the buffer's are refused at once.
        bad = Request(args, [token_arg(1, [2, 2])], [mem_in, MemoryPool.of_token(tok)])
        assert _run(pm, bad)[0] == E.INVALID_ARGUMENT
        # A fitting input succeeds and initializes it with the actual shape.
        args1 = [token_arg(0, [1, 2], 0, 8), token_arg(0, [1, 2], 0, 8),
                 token_arg(0, (), 16, 4)]
        req1 = Request(args1, [token_arg(1)], [mem_in, MemoryPool.of_token(tok)])
        status, shapes = _run(pm, req1)
        assert status == E.NONE and list(shapes[0].dimensions) == [1, 2]
        assert read_back(buf, 8)[1].tolist() == [0.0, 2.0]
    finally:
        mem_in.close()


def test_unknown_dimension_buffers_through_execution(device):
    pm = prepare(device, add_model_scalar_act(dims=(0, 2)))
    a, ta = ok_alloc(device, [pm], [role(0), role(1)])
    out, to = ok_alloc(device, [pm], (), [role(0)])
    act, tact = ok_alloc(device, [pm], [role(2)])
    x = np.arange(6, dtype=np.float32)
    assert write(a, x, [3, 2]) == E.NONE
    assert write(act, np.int32(0)) == E.NONE
    req = Request([token_arg(0), token_arg(0), token_arg(2)], [token_arg(1)],
                  [MemoryPool.of_token(ta), MemoryPool.of_token(to), MemoryPool.of_token(tact)])
    status, shapes = _run(pm, req)
    assert status == E.NONE and list(shapes[0].dimensions) == [3, 2]
    assert read_back(out, 24)[1].tolist() == (2 * x).tolist()
    assert read_back(out, 16)[0] == E.INVALID_ARGUMENT
    # Input request dimensions must agree with the buffer's current shape.
    bad = Request([token_arg(0, [2, 2]), token_arg(0), token_arg(2)], [token_arg(1)],
                  req.pools)
    assert _run(pm, bad)[0] == E.INVALID_ARGUMENT


def test_illegal_uses_are_refused(device, pm, pm2):
    a, ta = ok_alloc(device, [pm], [role(0)])
    o, to = ok_alloc(device, [pm], (), [role(0)])
    io, tio = ok_alloc(device, [pm], [role(0), role(1)], [role(0)])
    x = np.arange(4, dtype=np.float32)
    for buf in (a, io):
        assert write(buf, x) == E.NONE
    mem_in, mem_out = _shared_in_out(x)
    shared = token_arg(0, length=16)
    out_shared = token_arg(1, length=16)

    def req(ins, outs, *tokens):
        return Request(ins, outs, [mem_in, mem_out, *[MemoryPool.of_token(t) for t in tokens]])

    try:
        cases = [
            (pm2, req([token_arg(2), shared], [out_shared], ta)),        # other model
            (pm, req([shared, token_arg(2)], [out_shared], ta)),         # role is input 0 only
            (pm, req([shared, shared], [token_arg(2)], ta)),             # input used as output
            (pm, req([token_arg(2), shared], [out_shared], to)),         # output used as input
            (pm, req([token_arg(2), shared], [token_arg(2)], tio)),      # input and output
            (pm, req([token_arg(2, offset=4), shared], [out_shared], ta)),
            (pm, req([token_arg(2, length=16), shared], [out_shared], ta)),
            (pm, req([token_arg(2, [3, 3]), shared], [out_shared], ta)),
            (pm, req([token_arg(2), shared], [out_shared], 0)),          # token 0
            (pm, req([token_arg(2), shared], [out_shared], 99999)),      # unknown token
        ]
        for i, (model, r) in enumerate(cases):
            for path in ("sync", "async"):
                assert _run(model, r, path)[0] == E.INVALID_ARGUMENT, (i, path)
        # A buffer may serve several inputs of one request.
        assert _run(pm, req([token_arg(2), token_arg(2)], [out_shared], tio))[0] == E.NONE
        assert mem_out.array().view(np.float32).tolist() == (2 * x).tolist()
        # A freed token is refused.
        a.close()
        assert _run(pm, req([token_arg(2), shared], [out_shared], ta))[0] == \
            E.INVALID_ARGUMENT
    finally:
        mem_in.close()
        mem_out.close()


# ---- the conformance mode ---------------------------------------------------------------

def _add_case(expect_failure=False):
    def operand(lifetime, data, dims=(2, 2), t="TENSOR_FLOAT32", consumers=1):
        return {"name": "", "type": t, "dimensions": list(dims), "scale": 0.0, "zeroPoint": 0,
                "numberOfConsumers": consumers, "lifetime": lifetime, "channelQuant": None,
                "isIgnored": False, "data": data}

    main = {"name": "main",
            "operands": [operand("SUBGRAPH_INPUT", [1, 2, 3, 4]),
                         operand("SUBGRAPH_INPUT", [10, 20, 30, 40]),
                         operand("CONSTANT_COPY", [0], (), "INT32"),
                         operand("SUBGRAPH_OUTPUT", [11, 22, 33, 44], consumers=0)],
            "operations": [{"type": "ADD", "inputs": [0, 1, 2], "outputs": [3]}],
            "inputIndexes": [0, 1], "outputIndexes": [3]}
    data = {"name": "add", "model": {"main": main, "referenced": [], "isRelaxed": False},
            "expectFailure": expect_failure, "expectedMultinomialDistributionTolerance": 0,
            "minSupportedVersion": None}
    from nnhal.conformance.cases import Case

    return Case(file="synthetic", folder="synthetic", name="add", data=data)


def test_mode_runs_a_case_through_buffers_and_frees_them(device):
    from nnhal.conformance.mode_memory_domain import run
    from nnhal.conformance.runner import CaseFailure, Options

    msg = run(device, _add_case(), Options())
    assert "via driver buffers" in msg and "sync" in msg
    gc.collect()
    assert len(device.buffers) == 0
    # A case that should fail but succeeds is a failure of the case.
    with pytest.raises(CaseFailure):
        run(device, _add_case(expect_failure=True), Options())
