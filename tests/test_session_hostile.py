"""Session.run against hostile feeds and drivers: every outcome is a result or an NnhalError,
never another exception, a deadlock or an allocation the model never asked for."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping

import numpy as np
import pytest
from helpers import add_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nnhal.errors import ExecutionError, InputError, NnhalError
from nnhal.hal.types import ErrorStatus, OutputShape
from nnhal.memory import MemoryError_, SharedMemory
from nnhal.session import Session

F32 = np.float32
#: Seconds a call may take before it counts as hung (generous: a loaded 2-core machine).
BOUND = 20.0


def bounded(fn, *args):
    """(result, exception) of ``fn(*args)`` run in a thread; fails the test if it hangs."""
    box: dict = {}

    def work():
        try:
            box["result"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - the test inspects it
            box["error"] = e

    t = threading.Thread(target=work, daemon=True)
    t.start()
    t.join(BOUND)
    assert not t.is_alive(), f"{fn.__name__} did not return within {BOUND} s (a deadlock?)"
    return box.get("result"), box.get("error")


@pytest.fixture(scope="module")
def fixed():
    with Session(add_model((2,)), "reference") as s:
        yield s


@pytest.fixture(scope="module")
def dynamic():
    with Session(add_model((0, 3)), "reference") as s:
        yield s


ONES = np.ones(2, F32)


# ---- re-entry and locks ----------------------------------------------------------------------

def test_a_feed_that_reenters_the_session_gets_an_error_not_a_deadlock(fixed):
    class Reenters:
        def __array__(self, dtype=None, copy=None):
            fixed.run([ONES, ONES])
            return ONES

    _, error = bounded(fixed.run, [Reenters(), ONES])
    assert isinstance(error, NnhalError) and "converting the feeds" in str(error)
    assert fixed.run([ONES, ONES])["output_0"].tolist() == [2, 2]  # nothing left locked


def test_no_lock_is_held_while_a_feed_converts(fixed):
    """Another thread may run the session while this run's feed code runs."""
    seen = []

    class WaitsForAnotherRun:
        def __array__(self, dtype=None, copy=None):
            other = threading.Thread(target=lambda: seen.append(fixed.run([ONES, ONES])))
            other.start()
            other.join(BOUND)
            return np.full(2, 5, F32)

    result, error = bounded(fixed.run, [WaitsForAnotherRun(), ONES])
    assert error is None and result["output_0"].tolist() == [6, 6]
    assert len(seen) == 1 and seen[0]["output_0"].tolist() == [2, 2]


def test_a_driver_that_reenters_gets_an_error_not_a_deadlock():
    with Session(add_model((2,))) as s:
        real = s._prepared

        class Reentrant:
            def execute_synchronously(self, request, measure):
                s.reset_state()
                return real.execute_synchronously(request, measure)

        s._prepared = Reentrant()
        try:
            _, error = bounded(s.run, [ONES, ONES])
        finally:
            s._prepared = real
        assert isinstance(error, ExecutionError) and "re-entered" in str(error)
        assert s.run([ONES, ONES])["output_0"].tolist() == [2, 2]


# ---- the feeds' own code ---------------------------------------------------------------------

class Raising:
    def __init__(self, exc):
        self.exc = exc

    def __array__(self, dtype=None, copy=None):
        raise self.exc


class HostileMapping(Mapping):
    """A mapping whose every method may raise or never end."""

    def __init__(self, inner, fail=None, endless=False):
        self.inner, self.fail, self.endless = inner, fail, endless

    def __getitem__(self, key):
        if self.fail is not None:
            raise self.fail
        return self.inner[key]

    def __iter__(self):
        if self.endless:
            while True:
                yield "input_0"
        yield from self.inner

    def __len__(self):
        return len(self.inner)


@pytest.mark.parametrize("feeds", [
    [Raising(ZeroDivisionError("no")), ONES],
    [Raising(RuntimeError("line one\nline two")), ONES],
    [Raising(RecursionError()), ONES],
    HostileMapping({"input_0": ONES, "input_1": ONES}, fail=KeyError("gone")),
    HostileMapping({"input_0": ONES, "input_1": ONES}, fail=OSError(5, "io")),
], ids=["zerodiv", "multiline", "recursion", "keyerror", "oserror"])
def test_whatever_a_feed_raises_is_an_input_error(fixed, feeds):
    _, error = bounded(fixed.run, feeds)
    assert isinstance(error, InputError), repr(error)
    assert "\n" not in str(error)


def test_a_mapping_that_never_ends_is_refused(fixed):
    feeds = HostileMapping({"input_0": ONES, "input_1": ONES}, endless=True)
    _, error = bounded(fixed.run, feeds)
    assert isinstance(error, InputError) and "more inputs" in str(error)


# ---- sizes -----------------------------------------------------------------------------------

def test_a_huge_broadcast_array_is_refused_before_any_copy(dynamic):
    huge = np.broadcast_to(F32(1), (1 << 30, 3))  # 12 GiB claimed in 4 bytes
    started = time.monotonic()
    _, error = bounded(dynamic.run, [huge, huge])
    assert isinstance(error, InputError) and "more than the" in str(error)
    assert time.monotonic() - started < BOUND


def test_a_huge_python_feed_is_refused_before_its_conversion_copies_it(dynamic):
    class Huge:  # float64 values for a float32 input: converting would copy 12 GiB
        def __array__(self, dtype=None, copy=None):
            return np.broadcast_to(np.float64(1), (1 << 29, 3))

    _, error = bounded(dynamic.run, [Huge(), Huge()])
    assert isinstance(error, InputError) and "more than the" in str(error), repr(error)


def test_feeds_too_big_together_are_refused(monkeypatch, dynamic):
    import nnhal.session.session as session_module

    monkeypatch.setattr(session_module, "MAX_FEED_BYTES", 100, raising=False)
    small = np.ones((5, 3), F32)  # 60 bytes each, 120 together
    _, error = bounded(dynamic.run, [small, small])
    assert isinstance(error, InputError) and "together" in str(error)


@pytest.mark.parametrize("exc", [MemoryError_("cannot map"), OSError(28, "No space left"),
                                 MemoryError()])
def test_request_memory_failures_are_execution_errors(monkeypatch, exc):
    def fail(cls, size, *a, **k):
        raise exc

    # On the reference, which binds no arrays: every run goes by request memory (a driver
    # that binds arrays runs the first run without any).
    with Session(add_model((2,)), "reference") as s:
        monkeypatch.setattr(SharedMemory, "ashmem", classmethod(fail))
        _, error = bounded(s.run, [ONES, ONES])
        monkeypatch.undo()
        assert isinstance(error, ExecutionError) and "cannot allocate" in str(error), \
            repr(error)
        assert s.run([ONES, ONES])["output_0"].tolist() == [2, 2]  # the next run works


class Answering:
    """A prepared model that answers what it is told to."""

    def __init__(self, *answer):
        self.answer = answer

    def execute_synchronously(self, request, measure):
        return self.answer


@pytest.mark.parametrize("answer, words", [
    ((ErrorStatus.OUTPUT_INSUFFICIENT_SIZE, [OutputShape([1 << 40], False)], None),
     "more than the"),
    ((ErrorStatus.NONE, [OutputShape([1000], True)], None), "its buffer has"),
    ((ErrorStatus.NONE, [OutputShape([-2], True)], None), "(-2,)"),
    ((ErrorStatus.NONE, [OutputShape(["x"], True)], None), "unreadable shape"),
    ((99, [], None), "status 99"),
    ((ErrorStatus.NONE,), "answered wrongly"),
    (None, "answered wrongly"),
], ids=["grow-huge", "too-big", "negative", "not-int", "status", "short", "none"])
def test_a_wrong_driver_answer_is_an_execution_error(answer, words):
    with Session(add_model((2,))) as s:
        real = s._prepared
        s._prepared = Answering(*answer) if answer is not None else Answering()
        s._prepared.answer = answer
        try:
            _, error = bounded(s.run, [ONES, ONES])
        finally:
            s._prepared = real
        assert isinstance(error, ExecutionError) and words in str(error), repr(error)


# ---- property: any feed is a right answer or an NnhalError ----------------------------------

class Reentering:
    def __init__(self, session, value):
        self.session, self.value = session, value

    def __array__(self, dtype=None, copy=None):
        self.session.run([self.value, self.value])
        return self.value


DTYPES = [np.float32, np.float64, np.float16, np.int32, np.uint8, np.bool_, object]


@st.composite
def feed(draw, session, shape):
    """(a feed, the float32 array it should be read as, or None when it must be refused or
    cannot be known)."""
    kind = draw(st.sampled_from(["exact", "dtype", "shape", "list", "noncontig", "broadcast",
                                 "object", "scalar", "bytes", "none", "generator", "raising",
                                 "reenter", "str", "nested"]))
    n = int(np.prod(shape))
    floats = st.floats(-1e6, 1e6, width=32, allow_subnormal=False)
    values = np.array(draw(st.lists(floats, min_size=n, max_size=n)), F32).reshape(shape)
    if kind == "exact":
        return values, values
    if kind == "dtype":
        dt = draw(st.sampled_from(DTYPES[1:]))
        with np.errstate(over="ignore", invalid="ignore"):
            return values.astype(dt), None
    if kind == "shape":
        extra = draw(st.lists(st.integers(0, 5), min_size=0, max_size=3))
        return np.zeros(tuple(extra), F32), None
    if kind == "list":
        return values.tolist(), values
    if kind == "noncontig":
        wide = np.zeros(shape[:-1] + (shape[-1] * 2,), F32)
        wide[..., ::2] = values
        return wide[..., ::2], values
    if kind == "broadcast":
        big = draw(st.sampled_from([1 << 20, 1 << 31, 1 << 40]))
        return np.broadcast_to(F32(1), (big,) + tuple(shape[1:])), None
    if kind == "object":
        return values.astype(object), None
    if kind == "scalar":
        return draw(st.one_of(st.integers(-10, 10), st.floats(allow_nan=True))), None
    if kind == "bytes":
        return values.tobytes(), None
    if kind == "none":
        return None, None
    if kind == "generator":
        return (float(v) for v in values.reshape(-1)), None
    if kind == "raising":
        return Raising(draw(st.sampled_from([ValueError("v"), TypeError("t"),
                                             MemoryError(), KeyError("k"),
                                             RecursionError()]))), None
    if kind == "reenter":
        return Reentering(session, values), None
    if kind == "str":
        return "1.0", None
    return [values.tolist(), [None]], None


def check_run(session, feeds, expected):
    result, error = bounded(session.run, feeds)
    if error is not None:
        assert isinstance(error, NnhalError), f"{type(error).__name__}: {error}"
        assert "\n" not in str(error)
        return
    if expected is not None:
        np.testing.assert_array_equal(result["output_0"], expected[0] + expected[1])


@st.composite
def feeds_for(draw, session, shape):
    (a, ea), (b, eb) = draw(feed(session, shape)), draw(feed(session, shape))
    expected = (ea, eb) if ea is not None and eb is not None else None
    form = draw(st.sampled_from(["list", "tuple", "dict", "hostile", "wrong"]))
    if form == "list":
        return [a, b], expected
    if form == "tuple":
        return (a, b), expected
    if form == "dict":
        return {"input_0": a, "input_1": b}, expected
    if form == "hostile":
        fail = draw(st.sampled_from([None, KeyError("x"), ValueError("y")]))
        return HostileMapping({"input_0": a, "input_1": b}, fail=fail), \
            expected if fail is None else None
    return draw(st.sampled_from([[a], [a, b, a], {"input_0": a}, {1: a, "input_1": b},
                                 a, None, 3, b"ab"])), None


@settings(max_examples=1000, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_property_any_feed_is_a_right_answer_or_an_nnhal_error(fixed, dynamic, data):
    session, shape = data.draw(st.sampled_from([(fixed, (2,)), (dynamic, (2, 3))]))
    feeds, expected = data.draw(feeds_for(session, shape))
    check_run(session, feeds, expected)


def test_max_feed_bytes_is_the_reference_drivers_tensor_limit():
    from nnhal.drivers.reference import ReferenceDevice
    from nnhal.session.info import MAX_FEED_BYTES

    device = ReferenceDevice()
    try:
        assert MAX_FEED_BYTES == device.max_tensor_bytes
    finally:
        device.close()


# ---- Session's own arguments -----------------------------------------------------------------

@pytest.mark.parametrize("kwargs, words", [
    ({"device": 123}, "device must be"),
    ({"device": object()}, "device must be"),
    ({"devices": "reference"}, "devices must be"),
    ({"devices": [1, 2]}, "devices must be"),
    ({"preference": "x"}, "preference must be one of"),
    ({"preference": 99}, "preference must be one of"),
    ({"priority": 2.5}, "priority must be one of"),
    ({"priority": True}, "priority must be one of"),
    ({"input_names": "ab"}, "input_names must be"),
    ({"output_names": [1]}, "output_names must be"),
])
def test_wrong_session_arguments_are_one_line_errors(kwargs, words):
    with pytest.raises(NnhalError, match=words) as info:
        Session(add_model((2,)), **kwargs)
    assert "\n" not in str(info.value)


def test_enum_values_given_as_ints_are_taken():
    with Session(add_model((2,)), "reference", preference=1, priority=2) as s:
        assert [v.tolist() for v in s.run([ONES, ONES]).values()] == [[2.0, 2.0]]
