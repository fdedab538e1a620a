"""The one request layout (nnhal.hal.request_layout): every caller lays requests out through
it, growth is bounded for each, and a fuzzed layout never overlaps, overflows or crashes."""

from __future__ import annotations

import random
import re
import time
from pathlib import Path

import numpy as np
import pytest

from nnhal.hal.builder import ModelBuilder, RequestBuilder
from nnhal.hal.request_layout import ALIGN, ArgSlot, LayoutError, RequestLayout, place
from nnhal.hal.types import ErrorStatus, OutputShape, Timing
from nnhal.hal.types import OperandType as T
from nnhal.hal.types import OperationType as O
from nnhal.memory import SharedMemory
from nnhal.runtime.partition import Step
from nnhal.runtime.plan import PlanPrepared

ROOT = Path(__file__).resolve().parents[1] / "nnhal"


class _Absurd:
    """A step's driver that always says its output needs 2**42 float32 elements."""

    def __init__(self) -> None:
        self.calls = 0

    def execute_synchronously(self, request, measure, deadline=None, loop_timeout=None):
        self.calls += 1
        return ErrorStatus.OUTPUT_INSUFFICIENT_SIZE, [OutputShape([1 << 21, 1 << 21], False)], \
            Timing()


def test_a_step_drivers_absurd_size_is_a_failure_not_an_allocation():
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, [0])
    y = b.output(T.TENSOR_FLOAT32, [0])
    b.operation(O.RELU, [x], [y])
    model = b.build()
    driver = _Absurd()
    plan = PlanPrepared(model.main, [Step(object(), [0], [x], [y], model, driver)], model=model)
    asked: list[int] = []
    take = plan._take

    def recording_take(size: int) -> SharedMemory:
        asked.append(size)
        return take(size)

    plan._take = recording_take  # type: ignore[method-assign]
    env = {x: (np.zeros(4, np.uint8), [1])}
    started = time.monotonic()
    status = plan.run_env(env, None, None)
    assert status == ErrorStatus.GENERAL_FAILURE
    assert driver.calls == 1
    assert max(asked) <= 1 << 32, asked
    assert time.monotonic() - started < 10


def test_the_session_bound_still_refuses_growth():
    layout = RequestLayout([ArgSlot(4)], [ArgSlot(4)], max_output_bytes=1 << 20)
    try:
        with pytest.raises(LayoutError, match="more than"):
            layout.grow([2 << 20])
        assert layout.out_sizes == [4]
    finally:
        layout.close()


def test_caller_pools_come_first_and_own_memory_is_made_only_when_used():
    mine = SharedMemory.ashmem(256)
    layout = RequestLayout([ArgSlot(8, pool=mine, offset=64), ArgSlot(omitted=True)],
                           [ArgSlot(16, pool=mine, offset=128)])
    try:
        assert layout.input_memory is None and layout.output_memory is None
        assert layout.request.pools == [mine]
        assert layout.request.inputs[0].location.pool_index == 0
        assert layout.request.inputs[1].has_no_value
    finally:
        layout.close()
        assert not mine.closed  # a caller's pool stays the caller's
        mine.close()


def test_request_builder_is_the_layout():
    assert issubclass(RequestBuilder, RequestLayout)
    rb = RequestBuilder([np.arange(3, dtype=np.float32)], [12])
    try:
        rb.output_view(0)[:] = np.arange(3, dtype=np.float32).view(np.uint8)
        assert rb.output(0, np.float32, [3]).tolist() == [0.0, 1.0, 2.0]
    finally:
        rb.close()


def test_no_second_request_layout_is_left():
    pattern = re.compile(r"class (RequestLayout|_Packer)\b|def _lay_outputs\(")
    found = sorted(str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py")
                   if pattern.search(p.read_text()))
    assert found == ["hal/request_layout.py"]


def _own_size(s: ArgSlot) -> int:
    return s.size if s.pool is None and not s.omitted else 0


def _fuzz_one(rng: random.Random, pool: SharedMemory) -> None:
    def slot() -> ArgSlot:
        r = rng.random()
        if r < 0.15:
            return ArgSlot(omitted=True)
        if r < 0.3:
            off = rng.randrange(0, 192)
            return ArgSlot(rng.randrange(0, 64), pool=pool, offset=off)
        return ArgSlot(rng.choice([0, 1, 3, 4, 63, 64, 65, 200]), tuple(rng.choices(range(4), k=2)))

    ins = [slot() for _ in range(rng.randrange(0, 5))]
    outs = [slot() for _ in range(rng.randrange(1, 5))]
    bound = rng.choice([1 << 10, 1 << 16, 1 << 32])
    try:
        layout = RequestLayout(ins, outs, max_output_bytes=bound,
                               both_pools=rng.random() < 0.5)
    except LayoutError:
        assert place([_own_size(s) for s in outs])[1] > bound
        return
    try:
        for _round in range(3):
            req = layout.request
            sizes = [getattr(p, "size", 0) for p in req.pools]
            spans: dict[int, list[tuple[int, int]]] = {}
            for arg, s in zip([*req.inputs, *req.outputs], [*ins, *outs]):
                assert arg.has_no_value == s.omitted
                if s.omitted:
                    continue
                loc = arg.location
                assert 0 <= loc.pool_index < len(req.pools)
                assert loc.offset + loc.length <= sizes[loc.pool_index]
                if s.pool is None:
                    assert loc.offset % ALIGN == 0
                    spans.setdefault(loc.pool_index, []).append((loc.offset, loc.length))
            for found in spans.values():
                found.sort()
                for (a, n), (b, _m) in zip(found, found[1:]):
                    assert a + n <= b  # no two arguments share bytes
            for k, s in enumerate(ins):
                if s.pool is None and not s.omitted:
                    layout.input_view(k)[:] = k + 1
            for k, s in enumerate(outs):
                if s.pool is None and not s.omitted:
                    n = layout.out_sizes[k]
                    layout.output_view(k)[:] = k + 7
                    assert (layout.read_output(k, np.uint8, [n]) == k + 7).all()
                    with pytest.raises(LayoutError):
                        layout.output_view(k, n + 1)
            needs = [rng.choice([None, 0, 5, 300, 1 << 40]) for _ in outs]
            before = list(layout.out_sizes)
            try:
                layout.grow(needs)
            except LayoutError:
                want = [max(b, n or 0) if s.pool is None and not s.omitted
                        else b for b, n, s in zip(before, needs, outs)]
                assert place(want)[1] > bound
                return
            assert all(a >= b for a, b in zip(layout.out_sizes, before))
    finally:
        layout.close()


def test_fuzzed_layouts_never_overlap_overflow_or_crash():
    rng = random.Random(26)
    pool = SharedMemory.ashmem(256)
    started = time.monotonic()
    try:
        for _ in range(5000):
            _fuzz_one(rng, pool)
    finally:
        pool.close()
    assert time.monotonic() - started < 60
