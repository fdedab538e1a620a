"""The arena planner and the executor's use of it.

Kernels writing into given memory are provided here, for the test only, by wrapping the
existing float32 ADD and MUL kernels (the wrapper checks the contract: C-contiguous outputs
of the right dtype and shape that never share memory with an input of the same call).
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nnhal.analysis import analyse
from nnhal.executor import ModelPlan, RunState
from nnhal.executor.arena import ALIGNMENT, plan_offsets
from nnhal.hal.builder import ModelBuilder, RequestBuilder
from nnhal.hal.types import ErrorStatus, OperandType, OperationType
from nnhal.ops.resolver import definitions

T, O = OperandType, OperationType
DIMS = (2, 3)


class IntoLog:
    """What the test kernels saw: calls and contract violations."""

    def __init__(self) -> None:
        self.calls = 0
        self.violations: list[str] = []
        self.yield_thread = False


def _wrap(defn: object, log: IntoLog):
    def kernel_into(ctx):
        if ctx.inputs[0].type != T.TENSOR_FLOAT32:
            return None
        kern = type(defn).kernel(defn, ctx)

        def into(ins, outs, rt):
            log.calls += 1
            for o in outs:
                if not o.flags.c_contiguous or o.dtype != np.float32 or \
                        tuple(o.shape) != tuple(ctx.outputs[0].shape):
                    log.violations.append(f"bad out {o.dtype} {o.shape}")
                for x in ins:
                    if isinstance(x, np.ndarray) and np.shares_memory(o, x):
                        log.violations.append("output aliases an input")
            if log.yield_thread:
                time.sleep(0)  # let another thread run between reading and writing
            outs[0][...] = kern(ins, rt)[0]

        return into

    return kernel_into


@pytest.fixture
def into_log(monkeypatch):
    log = IntoLog()
    defs = definitions()
    for op in (O.ADD, O.MUL):
        defn = defs[int(op)]
        monkeypatch.setattr(defn, "kernel_into", _wrap(defn, log), raising=False)
    return log


# ---- the planner alone -------------------------------------------------------------------------

def _check_layout(sizes, lifetimes, offsets, total):
    for off, size in zip(offsets, sizes):
        assert off % ALIGNMENT == 0
        assert off + size <= total
    for a in range(len(sizes)):
        for b in range(a + 1, len(sizes)):
            live_together = lifetimes[a][0] <= lifetimes[b][1] and \
                lifetimes[b][0] <= lifetimes[a][1]
            apart = offsets[a] + sizes[a] <= offsets[b] or offsets[b] + sizes[b] <= offsets[a]
            if live_together:
                assert apart, (a, b, sizes, lifetimes, offsets)


@st.composite
def _step_dags(draw):
    """A random DAG of steps: step k reads some earlier steps' outputs and writes one tensor;
    lifetimes follow (producer, last reader)."""
    n = draw(st.integers(1, 14))
    sizes = [draw(st.integers(1, 5000)) for _ in range(n)]
    last = list(range(n))
    for k in range(1, n):
        for j in draw(st.lists(st.integers(0, k - 1), max_size=3)):
            last[j] = max(last[j], k)
    return sizes, [(k, last[k]) for k in range(n)]


@given(_step_dags())
@settings(max_examples=300, deadline=None)
def test_planner_never_overlaps_live_tensors(dag):
    sizes, lifetimes = dag
    offsets, total = plan_offsets(sizes, lifetimes)
    _check_layout(sizes, lifetimes, offsets, total)
    assert total <= sum(-(-s // ALIGNMENT) * ALIGNMENT for s in sizes)


def test_planner_shares_memory_between_disjoint_lifetimes():
    # A chain t0 -> t1 -> t2 -> t3: each tensor is read by the next step only.
    sizes = [1000] * 4
    lifetimes = [(0, 1), (1, 2), (2, 3), (3, 3)]
    offsets, total = plan_offsets(sizes, lifetimes)
    _check_layout(sizes, lifetimes, offsets, total)
    assert total == 2 * 1024  # two slots of 1000 bytes aligned to 1024, used alternately
    assert offsets[0] == offsets[2] and offsets[1] == offsets[3]
    assert offsets[0] != offsets[1]


def test_planner_reuses_a_freed_big_slot_for_small_tensors():
    sizes = [4096, 100, 100]
    lifetimes = [(0, 0), (1, 2), (2, 2)]
    offsets, total = plan_offsets(sizes, lifetimes)
    _check_layout(sizes, lifetimes, offsets, total)
    assert total == 4096


# ---- models ------------------------------------------------------------------------------------

def _chain_model(length: int = 4, reshape_out: bool = False):
    """x, y -> t1 = x + y -> t2 = t1 * y -> ... ; the output is the last value (through a
    RESHAPE of a planned temporary when ``reshape_out``)."""
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, DIMS)
    y = b.input(T.TENSOR_FLOAT32, DIMS)
    act = b.scalar(T.INT32, 0)
    cur = x
    for k in range(length):
        last = k == length - 1 and not reshape_out
        nxt = b.output(T.TENSOR_FLOAT32, DIMS) if last else b.operand(T.TENSOR_FLOAT32, DIMS)
        b.operation(O.ADD if k % 2 == 0 else O.MUL, [cur, y, act], [nxt])
        cur = nxt
    if reshape_out:
        shape = b.constant(T.TENSOR_INT32, np.array(DIMS, np.int32))
        out = b.output(T.TENSOR_FLOAT32, DIMS)
        b.operation(O.RESHAPE, [cur, shape], [out])
    return b.build()


def _chain_expected(x, y, length):
    cur = x
    for k in range(length):
        cur = (cur + y) if k % 2 == 0 else (cur * y)
    return cur


def _inputs(seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(DIMS).astype(np.float32) for _ in range(2)]


def test_chain_is_planned_and_runs_twice_alike(into_log):
    plan = ModelPlan(analyse(_chain_model(6)))
    pool = plan.main.arena_pool
    assert pool is not None
    # Five temporaries of 24 bytes in a chain: two aligned slots suffice.
    assert pool.layout.total == 2 * ALIGNMENT
    x, y = _inputs(1)
    first = plan.run([x, y], RunState())[0]
    second = plan.run([x, y], RunState())[0]
    np.testing.assert_array_equal(first, second)
    np.testing.assert_allclose(first, _chain_expected(x, y, 6), rtol=1e-6)
    assert into_log.calls == 12 and not into_log.violations
    assert pool.created == 1  # the second run reused the first one's arena


def test_no_arena_env_prepares_without_an_arena(into_log, monkeypatch):
    """NNHAL_NO_ARENA=1 (for measuring the arena's worth): no arena, same results."""
    from nnhal.executor.plan import NO_ARENA_ENV

    x, y = _inputs(3)
    with_arena = ModelPlan(analyse(_chain_model(6)))
    monkeypatch.setenv(NO_ARENA_ENV, "1")
    without = ModelPlan(analyse(_chain_model(6)))
    monkeypatch.setenv(NO_ARENA_ENV, "0")
    assert ModelPlan(analyse(_chain_model(6))).main.arena_pool is not None
    assert with_arena.main.arena_pool is not None and without.main.arena_pool is None
    assert without.main.direct_outputs == with_arena.main.direct_outputs
    np.testing.assert_array_equal(without.run([x, y], RunState())[0],
                                  with_arena.run([x, y], RunState())[0])
    assert not into_log.violations


def test_outputs_are_not_arena_memory(into_log):
    for reshape_out in (False, True):
        plan = ModelPlan(analyse(_chain_model(4, reshape_out=reshape_out)))
        assert plan.main.arena_pool is not None
        if reshape_out:
            assert plan.main.copy_out == (0,)
        x, y = _inputs(2)
        first = plan.run([x, y], RunState())[0]
        kept = first.copy()
        x2, y2 = _inputs(3)
        second = plan.run([x2, y2], RunState())[0]
        np.testing.assert_array_equal(first, kept)  # run 2 did not write into run 1's output
        np.testing.assert_allclose(second, _chain_expected(x2, y2, 4), rtol=1e-6)
        arena = plan.main.arena_pool._free[0]
        assert not np.shares_memory(first, arena.buffer)
        assert not np.shares_memory(second, arena.buffer)
    assert not into_log.violations


def _reshape_alias_model():
    """t1 = x + y (planned); r = RESHAPE(t1) (a view of t1, not planned); t2 = x * y (planned,
    must not take t1's memory while r is still to be read); out = r + t2."""
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, DIMS)
    y = b.input(T.TENSOR_FLOAT32, DIMS)
    act = b.scalar(T.INT32, 0)
    shape = b.constant(T.TENSOR_INT32, np.array(DIMS, np.int32))
    t1 = b.operand(T.TENSOR_FLOAT32, DIMS)
    r = b.operand(T.TENSOR_FLOAT32, DIMS)
    t2 = b.operand(T.TENSOR_FLOAT32, DIMS)
    out = b.output(T.TENSOR_FLOAT32, DIMS)
    b.operation(O.ADD, [x, y, act], [t1])
    b.operation(O.RESHAPE, [t1, shape], [r])
    b.operation(O.MUL, [x, y, act], [t2])
    b.operation(O.ADD, [r, t2, act], [out])
    return b.build()


def test_views_through_other_kernels_keep_their_memory_alive(into_log):
    plan = ModelPlan(analyse(_reshape_alias_model()))
    layout = plan.main.arena_pool.layout
    offsets = {idx: off for idx, off, _, _ in layout.slots}
    assert len(offsets) == 2 and len(set(offsets.values())) == 2
    x, y = _inputs(4)
    out = plan.run([x, y], RunState())[0]
    np.testing.assert_allclose(out, (x + y) + (x * y), rtol=1e-6)
    assert not into_log.violations


@st.composite
def _random_models(draw):
    """A random DAG of ADD / MUL / RESHAPE steps over [2, 3] float32 values; every value
    no later step reads is a model output."""
    n = draw(st.integers(1, 10))
    kinds = [draw(st.sampled_from(["ADD", "MUL", "RESHAPE"])) for _ in range(n)]
    reads = []
    for k in range(n):
        count = 1 if kinds[k] == "RESHAPE" else 2
        reads.append([draw(st.integers(0, k + 1)) for _ in range(count)])  # 0, 1: x, y
    extra_out = [draw(st.booleans()) for _ in range(n)]
    return kinds, reads, extra_out


def _build_random(kinds, reads, extra_out):
    n = len(kinds)
    read_later = {v for rs in reads for v in rs}
    b = ModelBuilder()
    vals = [b.input(T.TENSOR_FLOAT32, DIMS), b.input(T.TENSOR_FLOAT32, DIMS)]
    act = b.scalar(T.INT32, 0)
    shape = b.constant(T.TENSOR_INT32, np.array(DIMS, np.int32))
    outputs = []
    for k in range(n):
        v = k + 2
        is_out = extra_out[k] or v not in read_later
        vals.append(b.output(T.TENSOR_FLOAT32, DIMS) if is_out
                    else b.operand(T.TENSOR_FLOAT32, DIMS))
        if is_out:
            outputs.append(v)
        ins = [vals[i] for i in reads[k]]
        if kinds[k] == "RESHAPE":
            b.operation(O.RESHAPE, [ins[0], shape], [vals[v]])
        else:
            b.operation(getattr(O, kinds[k]), [*ins, act], [vals[v]])
    return b.build(), outputs


def _eval_random(kinds, reads, outputs, x, y):
    vals = [x, y]
    for kind, rs in zip(kinds, reads):
        a = vals[rs[0]]
        vals.append(a.copy() if kind == "RESHAPE" else
                    (a + vals[rs[1]]) if kind == "ADD" else (a * vals[rs[1]]))
    return [vals[v] for v in outputs]


@given(_random_models())
@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_random_dags_compute_right_with_the_arena(into_log, model):
    kinds, reads, extra_out = model
    built, outputs = _build_random(kinds, reads, extra_out)
    plan = ModelPlan(analyse(built))
    pool = plan.main.arena_pool
    if pool is not None:  # the layout never overlaps tensors live at the same step
        producer, last = {}, {}
        for pos, step in enumerate(plan.main.steps):
            for i in step.inputs:
                last[i] = pos
            for i in step.outputs:
                producer[i] = pos
        slots = pool.layout.slots
        assert all(built.main.operands[idx].lifetime == 0 for idx, *_ in slots)  # temporaries
        _check_layout([4 * 6] * len(slots),
                      [(producer[idx], last.get(idx, producer[idx])) for idx, *_ in slots],
                      [off for _, off, *_ in slots], pool.layout.total)
    for seed in (5, 6):
        x, y = _inputs(seed)
        got = plan.run([x, y], RunState())
        want = _eval_random(kinds, reads, outputs, x, y)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
        for g in got:
            assert pool is None or not np.shares_memory(g, pool._free[0].buffer)
    assert not into_log.violations


# ---- concurrency ------------------------------------------------------------------------------

def test_concurrent_runs_do_not_share_an_arena(into_log):
    plan = ModelPlan(analyse(_chain_model(8)))
    into_log.yield_thread = True
    errors: list[str] = []

    def worker(seed: int) -> None:
        x, y = _inputs(seed)
        want = _chain_expected(x, y, 8)
        for _ in range(150):
            got = plan.run([x, y], RunState())[0]
            if not np.allclose(got, want, rtol=1e-5):
                errors.append(f"thread {seed} got a wrong answer")
                return

    threads = [threading.Thread(target=worker, args=(s,)) for s in (10, 11, 12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert not into_log.violations
    assert 1 <= plan.main.arena_pool.created <= 3


def test_concurrent_driver_executions(into_log):
    from nnhal.drivers.reference import ReferenceDevice
    from nnhal.hal.interfaces import PreparedModelCallback
    from nnhal.hal.types import ExecutionPreference, Priority

    into_log.yield_thread = True
    device = ReferenceDevice()
    try:
        cb = PreparedModelCallback()
        device.prepare_model(_chain_model(6), ExecutionPreference.SUSTAINED_SPEED,
                             Priority.MEDIUM, None, [], [], b"", cb)
        status, pm = cb.wait(60)
        assert status == ErrorStatus.NONE
        errors: list[str] = []

        def worker(seed: int) -> None:
            x, y = _inputs(seed)
            rb = RequestBuilder([x, y], [x.nbytes])
            try:
                _, execution = pm.create_reusable_execution(rb.request)
                want = _chain_expected(x, y, 6)
                for k in range(60):
                    res = execution.compute() if k % 2 else pm.execute_synchronously(rb.request)
                    got = rb.output(0, np.float32, DIMS)
                    if res[0] != ErrorStatus.NONE or not np.allclose(got, want, rtol=1e-5):
                        errors.append(f"thread {seed}: {res[0]!r}")
                        return
            finally:
                rb.close()

        threads = [threading.Thread(target=worker, args=(s,)) for s in (20, 21)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        assert not into_log.violations
    finally:
        device.close()


# ---- request plans: direct outputs, cached validation ----------------------------------------

@pytest.fixture
def device():
    from nnhal.drivers.reference import ReferenceDevice

    dev = ReferenceDevice()
    yield dev
    dev.close()


def _prepare(device, model):
    from nnhal.hal.interfaces import PreparedModelCallback
    from nnhal.hal.types import ExecutionPreference, Priority

    cb = PreparedModelCallback()
    device.prepare_model(model, ExecutionPreference.SUSTAINED_SPEED, Priority.MEDIUM, None,
                         [], [], b"", cb)
    status, pm = cb.wait(60)
    assert status == ErrorStatus.NONE
    return pm


def test_reusable_execution_writes_outputs_straight_into_the_pool(into_log, device):
    pm = _prepare(device, _chain_model(4))
    x, y = _inputs(30)
    rb = RequestBuilder([x, y], [x.nbytes])
    try:
        status, execution = pm.create_reusable_execution(rb.request)
        assert status == ErrorStatus.NONE
        assert execution._prepared.given  # the last ADD writes into the output pool
        for seed in (31, 32):
            x, y = _inputs(seed)
            loc0, loc1 = rb.request.inputs[0].location, rb.request.inputs[1].location
            rb.input_memory.write(loc0.offset, x.tobytes())
            rb.input_memory.write(loc1.offset, y.tobytes())
            status, shapes, _ = execution.compute()
            assert status == ErrorStatus.NONE and shapes[0].dimensions == list(DIMS)
            np.testing.assert_allclose(rb.output(0, np.float32, DIMS),
                                       _chain_expected(x, y, 4), rtol=1e-6)
        assert not into_log.violations
    finally:
        rb.close()


def test_an_output_overlapping_an_input_is_not_written_directly(into_log, device):
    from nnhal.hal.types import DataLocation, Request, RequestArgument
    from nnhal.memory import SharedMemory

    pm = _prepare(device, _chain_model(4))
    x, y = _inputs(40)
    mem = SharedMemory.ashmem(128)
    other = SharedMemory.mmap_fd(mem.fd, 128)  # the same bytes through a second memory
    try:
        mem.write(0, x.tobytes())
        mem.write(64, y.tobytes())
        for pools, out_pool in (([mem], 0), ([mem, other], 1)):
            request = Request(inputs=[RequestArgument(False, DataLocation(0, 0, 24), []),
                                      RequestArgument(False, DataLocation(0, 64, 24), [])],
                              outputs=[RequestArgument(False, DataLocation(out_pool, 64, 24),
                                                       [])],
                              pools=pools)
            mem.write(64, y.tobytes())
            status, execution = pm.create_reusable_execution(request)
            assert status == ErrorStatus.NONE
            assert not execution._prepared.given  # y's bytes: written after the run only
            assert execution.compute()[0] == ErrorStatus.NONE
            got = np.frombuffer(mem.read(64, 24), np.float32).reshape(DIMS)
            np.testing.assert_allclose(got, _chain_expected(x, y, 4), rtol=1e-6)
        assert not into_log.violations
    finally:
        other.close()
        mem.close()


def test_burst_cached_validation_sees_changed_values(device):
    from nnhal.hal.types import DataLocation

    pm = _prepare(device, _chain_model(2))
    x, y = _inputs(50)
    rb = RequestBuilder([x, y], [x.nbytes])
    try:
        _, burst = pm.configure_execution_burst()
        holds = [burst.cache_memory(m) for m in rb.request.pools]
        req = rb.request
        assert burst.execute(req)[0] == ErrorStatus.NONE
        assert burst.execute(req)[0] == ErrorStatus.NONE  # validated once, then found again
        good = req.outputs[0].location
        req.outputs[0].location = DataLocation(1, 0, 10_000)  # beyond the pool now
        assert burst.execute(req)[0] == ErrorStatus.INVALID_ARGUMENT
        req.outputs[0].location = good
        req.inputs[0].dimensions = [3, 2]  # disagrees with the model
        assert burst.execute(req)[0] == ErrorStatus.INVALID_ARGUMENT
        req.inputs[0].dimensions = []
        assert burst.execute(req, loop_timeout=10**18)[0] == ErrorStatus.INVALID_ARGUMENT
        small = RequestBuilder([x], [4])  # the same argument values over other memories
        try:
            req.pools = [rb.input_memory, small.output_memory]
            assert burst.execute(req)[0] == ErrorStatus.INVALID_ARGUMENT
        finally:
            req.pools = [rb.input_memory, rb.output_memory]
            small.close()
        assert burst.execute(req)[0] == ErrorStatus.NONE
        np.testing.assert_allclose(rb.output(0, np.float32, DIMS), _chain_expected(x, y, 2),
                                   rtol=1e-6)
        del holds
    finally:
        rb.close()


def test_arena_memory_is_touched_once_and_reused(into_log):
    import resource

    b = ModelBuilder()  # 64 KiB temporaries: fresh allocations would fault each time
    dims = (128, 128)
    xi = b.input(T.TENSOR_FLOAT32, dims)
    yi = b.input(T.TENSOR_FLOAT32, dims)
    act = b.scalar(T.INT32, 0)
    cur = xi
    for k in range(4):
        nxt = b.output(T.TENSOR_FLOAT32, dims) if k == 3 else b.operand(T.TENSOR_FLOAT32, dims)
        b.operation(O.ADD, [cur, yi, act], [nxt])
        cur = nxt
    plan = ModelPlan(analyse(b.build()))
    assert plan.main.arena_pool is not None
    assert len(plan.main.arena_pool.layout.slots) == 3
    x, y = _inputs(60)[0].reshape(-1)[0], np.float32(0.5)
    for _ in range(5):
        plan.run([np.full(dims, x, np.float32), np.full(dims, y, np.float32)], RunState())
    assert plan.main.arena_pool.created == 1
    arena = plan.main.arena_pool.take()
    plan.main.arena_pool.give(arena)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    views = list(arena.views.values())
    for v in views:  # the arena's pages are all there already
        v[...] = 1.0
    assert resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before < 4


@st.composite
def _requests(draw):
    """A valid request for the model below with up to three fields changed."""
    from nnhal.hal.types import DataLocation, Request, RequestArgument

    fields = [[False, 0, 0, 24, []], [False, 0, 32, 24, []], [False, 1, 0, 24, []]]
    sizes = [128, 128]
    for _ in range(draw(st.integers(0, 3))):
        k = draw(st.integers(0, 3))
        if k == 3:
            sizes[draw(st.integers(0, 1))] = draw(st.sampled_from([-1, 0, 24, 40, 56]))
            continue
        f = draw(st.integers(0, 4))
        fields[k][f] = draw([st.booleans(), st.integers(0, 2), st.sampled_from([0, 8, 100, 110]),
                             st.sampled_from([0, 4, 23, 64]),
                             st.sampled_from([list(DIMS), [3, 2], [2, 3, 1], [2, 0], [0, 3]])][f])
    args = [RequestArgument(h, DataLocation(p, o, n), d) for h, p, o, n, d in fields]
    return Request(args[:2], args[2:], []), sizes


@given(_requests(), st.sampled_from([(2, 3), (2, 0)]))
@settings(max_examples=400, deadline=None)
def test_the_quick_request_check_accepts_only_what_validation_accepts(case, out_dims):
    from nnhal.drivers.common.request_checks import _plainly_valid, _spec_of
    from nnhal.validation import ValidationError, validate_request

    request, sizes = case
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, DIMS)
    y = b.input(T.TENSOR_FLOAT32, DIMS)
    act = b.scalar(T.INT32, 0)
    out = b.output(T.TENSOR_FLOAT32, out_dims)
    b.operation(O.ADD, [x, y, act], [out])
    signature = b.build().main
    if _plainly_valid(request, _spec_of(signature), sizes):
        validate_request(request, signature, sizes)  # must not raise
    else:
        try:
            validate_request(request, signature, sizes)
        except ValidationError:
            pass
