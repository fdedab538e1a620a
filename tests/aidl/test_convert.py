"""Canonical <-> AIDL conversions: round trips, AIDL's -1 and clock conventions, bad values."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nnhal.aidl import convert as cv
from nnhal.aidl import types as A
from nnhal.aidl.errors import ServiceSpecificError
from nnhal.hal import types as C
from nnhal.memory import SharedMemory

u31 = st.integers(0, 2**31 - 1)
dims = st.lists(u31, max_size=4)
POOL = SharedMemory.ashmem(4096)


@st.composite
def subgraphs(draw):
    n = draw(st.integers(1, 6))
    ops = draw(st.lists(st.builds(C.Operation, st.integers(0, 101),
                                  st.lists(st.integers(-1, n), max_size=3),
                                  st.lists(st.integers(0, n - 1), max_size=2)), max_size=4))
    count = cv.consumers(n, ops)
    operands = [C.Operand(draw(st.integers(0, 15)), draw(dims), count[i],
                          draw(st.floats(0, 10, width=32)), draw(st.integers(-128, 255)),
                          draw(st.sampled_from(list(C.OperandLifeTime))),
                          C.DataLocation(draw(st.integers(0, 3)), draw(u31), draw(u31)),
                          draw(st.one_of(st.none(), st.binary(max_size=4), st.builds(
                              C.SymmPerChannelQuantParams,
                              st.lists(st.floats(0.125, 2, width=32), max_size=3), u31))))
                for i in range(n)]
    return C.Subgraph(operands, ops, draw(st.lists(st.integers(0, n - 1), max_size=2)),
                      draw(st.lists(st.integers(0, n - 1), max_size=2)))


models = st.builds(C.Model, subgraphs(), st.lists(subgraphs(), max_size=2),
                   st.binary(max_size=16), st.just([POOL]), st.booleans(),
                   st.lists(st.builds(C.ExtensionNameAndPrefix, st.text(max_size=5),
                                      st.integers(0, 0xFFFF)), max_size=2))
arguments = st.builds(C.RequestArgument, st.booleans(),
                      st.builds(C.DataLocation, st.integers(0, 1), u31, u31), dims)
requests = st.builds(C.Request, st.lists(arguments, max_size=3), st.lists(arguments, max_size=3),
                     st.lists(st.one_of(st.just(C.MemoryPool.of(POOL)),
                                        st.builds(C.MemoryPool.of_token, st.integers(1, 99))),
                              max_size=2))


@settings(max_examples=150, deadline=None)
@given(models)
def test_models_round_trip(model):
    assert cv.model_from_aidl(cv.model_to_aidl(model)) == model


@settings(max_examples=150, deadline=None)
@given(requests)
def test_requests_round_trip(request):
    back = cv.request_from_aidl(cv.request_to_aidl(request))
    assert back == request


@given(st.integers(0, 2**40), st.integers(0, 2**40))
def test_timings_round_trip_and_mean_ns(on_device, in_driver):
    t = C.Timing(on_device, in_driver)
    a = cv.timing_to_aidl(t)
    assert a == A.Timing(on_device * 1000, in_driver * 1000)
    assert cv.timing_from_aidl(a) == t
    assert cv.timing_to_aidl(C.NO_TIMING) == A.Timing(-1, -1)
    assert cv.timing_from_aidl(A.Timing(-1, 1999)) == C.Timing(C.NO_TIME, 1)


@given(st.one_of(st.none(), st.integers(0, 2**62)), st.integers(0, 2**40))
def test_deadlines_round_trip_between_clocks(deadline, offset):
    a = cv.deadline_to_aidl(deadline, offset)
    assert a == (-1 if deadline is None else deadline + offset)
    assert cv.deadline_from_aidl(a, offset) == deadline


def test_deadline_conversion_uses_the_boot_clock():
    import time

    soon = time.clock_gettime_ns(time.CLOCK_BOOTTIME) + 10**9
    steady = cv.deadline_from_aidl(soon)
    assert abs(steady - (time.monotonic_ns() + 10**9)) < 10**8


@pytest.mark.parametrize("bad", [-2, -10**12, 1.5, "1", None, True, 2**63])
def test_times_other_than_minus_one_are_invalid(bad):
    for convert in (cv.deadline_from_aidl, cv.duration_from_aidl):
        with pytest.raises(ServiceSpecificError) as e:
            convert(bad)
        assert e.value.status == C.ErrorStatus.INVALID_ARGUMENT
    with pytest.raises(ServiceSpecificError):
        cv.timing_from_aidl(A.Timing(bad, 0))


def test_unions_padding_and_consumers():
    both = A.Request([], [], [A.RequestMemoryPool(pool=POOL, token=1)])
    with pytest.raises(ServiceSpecificError, match="exactly one"):
        cv.request_from_aidl(both)
    with pytest.raises(ServiceSpecificError, match="exactly one"):
        cv.request_from_aidl(A.Request([], [], [A.RequestMemoryPool()]))
    past = A.RequestArgument(False, A.DataLocation(0, 4000, 64, 64), [])
    with pytest.raises(ServiceSpecificError, match="padding"):
        cv.request_from_aidl(A.Request([past], [], [A.RequestMemoryPool.of(POOL)]))
    ok = A.RequestArgument(False, A.DataLocation(0, 0, 64, 64), [])
    assert cv.request_from_aidl(A.Request([ok], [], [A.RequestMemoryPool.of(POOL)])) \
        .inputs[0].location == C.DataLocation(0, 0, 64)
    g = C.Subgraph([C.Operand(3, [1], 0)], [C.Operation(19, [0], [0])], [0], [0])
    with pytest.raises(ServiceSpecificError, match="numberOfConsumers"):
        cv.model_to_aidl(C.Model(g))
    padded = A.Subgraph([A.Operand(location=A.DataLocation(padding=4))], [], [], [])
    with pytest.raises(ServiceSpecificError, match="padding"):
        cv.model_from_aidl(A.Model(padded))


def test_hints_are_checked():
    dup = A.ExecutionConfig(execution_hints=(C.TokenValuePair(1, b""), C.TokenValuePair(1, b"")))
    with pytest.raises(ServiceSpecificError, match="twice"):
        cv.execution_config_from_aidl(dup)
    cfg = A.ExecutionConfig(True, -1, (C.TokenValuePair(7, b"x"),))
    assert cv.execution_config_from_aidl(cfg) == C.ExecutionConfig(
        C.MeasureTiming.YES, None, (C.TokenValuePair(7, b"x"),))
    assert cv.execution_config_to_aidl(cv.execution_config_from_aidl(cfg)) == cfg
