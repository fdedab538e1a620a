"""Fuzzing the driver with hypothesis: random graphs, byte-corrupted models, random requests.

Whatever comes in, the driver must answer with a HAL status: never raise out of its interface,
never hang (every call runs under a timeout and every execution gets a deadline), call each
callback once, and never write outside an output's region (guard bytes surround each one)
nor into its inputs. The examples are derandomized and bounded so this file stays well under
a minute; ``benchmarks/fuzz_long.py`` runs the same checks for as long as you like.
"""

from __future__ import annotations

import random
import time
import warnings

import numpy as np
import pytest
from helpers import add_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_mutations import conv_model, if_model

from nnhal.conformance import default_specs_dir, iter_cases
from nnhal.conformance.cases import build_model
from nnhal.conformance.mutations import (
    CALLBACK_TIMEOUT_S,
    call_with_timeout,
    execution_paths,
    mutate_bytes,
    mutate_model_bytes,
    random_model,
    random_request,
    random_typed_model,
)
from nnhal.drivers.reference import ReferenceDevice
from nnhal.hal.interfaces import PreparedModelCallback
from nnhal.hal.types import (
    DataLocation,
    ErrorStatus,
    MeasureTiming,
    Model,
    OutputShape,
    Timing,
)

#: Answer within this many seconds or the driver is called hung.
CALL_TIMEOUT = 20.0
#: Every fuzzed execution gets a deadline this far ahead and this loop timeout.
DEADLINE_NS = 5_000_000_000
LOOP_TIMEOUT_NS = 1_000_000_000


def fuzz_settings(n: int) -> settings:
    return settings(max_examples=n, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def dev():
    d = ReferenceDevice()
    yield d
    d.close()


# ---- the checks, shared with benchmarks/fuzz_long.py ---------------------------------------

def check_model_answers(device, model: Model) -> object | None:
    """getSupportedOperations and prepareModel answer with statuses; returns the prepared
    model, if any."""
    status, flags = call_with_timeout(lambda: device.get_supported_operations(model),
                                      CALL_TIMEOUT)
    assert status in (ErrorStatus.NONE, ErrorStatus.INVALID_ARGUMENT)
    if status == ErrorStatus.NONE:
        assert len(flags) == len(model.main.operations)
        assert all(isinstance(f, bool) for f in flags)
    else:
        assert flags == []
    cb = PreparedModelCallback()
    launch = call_with_timeout(lambda: device.prepare_model(model, callback=cb), CALL_TIMEOUT)
    pstatus, prepared = cb.wait(CALLBACK_TIMEOUT_S)
    assert isinstance(launch, ErrorStatus) and isinstance(pstatus, ErrorStatus)
    assert cb.calls == 1
    if launch != ErrorStatus.NONE:
        assert pstatus == launch
    assert (prepared is not None) == (pstatus == ErrorStatus.NONE)
    if status == ErrorStatus.INVALID_ARGUMENT:
        assert pstatus == ErrorStatus.INVALID_ARGUMENT  # gso's rejection is binding
    return prepared


def check_execution(prepared, rng: random.Random, model: Model) -> ErrorStatus:
    """Execute a random request on every path: statuses only, guards intact, inputs intact."""
    fr = random_request(rng, model.main)
    try:
        inputs_before = fr.input_memory.read(0, fr.input_memory.size)
        paths = execution_paths(prepared)
        last = ErrorStatus.NONE
        for name, path in paths.items():
            if name == "fenced" and rng.random() < 0.5:
                continue
            res = call_with_timeout(
                lambda path=path: path(prepared, fr.request, MeasureTiming.YES,
                                       LOOP_TIMEOUT_NS),
                CALL_TIMEOUT)
            assert isinstance(res.status, ErrorStatus)
            assert res.problem == "", (name, res.problem)
            assert isinstance(res.timing, Timing)
            assert all(isinstance(s, OutputShape) for s in res.shapes)
            if res.status in (ErrorStatus.NONE, ErrorStatus.OUTPUT_INSUFFICIENT_SIZE) and \
                    name != "fenced":
                assert len(res.shapes) == len(fr.request.outputs)
            elif res.status != ErrorStatus.NONE:
                assert res.shapes == [] or res.status == ErrorStatus.OUTPUT_INSUFFICIENT_SIZE
            assert fr.guards_intact(), f"{name} wrote outside an output region"
            assert fr.inputs_intact(inputs_before), f"{name} wrote into the inputs"
            last = res.status
        return last
    finally:
        fr.close()


def _close_new_pools(model: Model, base: Model | None = None) -> None:
    keep = {id(p) for p in base.pools} if base is not None else set()
    for p in model.pools:
        if id(p) not in keep:
            p.close()


# ---- random graphs ----------------------------------------------------------------------------

@fuzz_settings(800)
@given(rng=st.randoms(use_true_random=False), typed=st.booleans())
def test_random_models(dev, rng, typed):
    model = (random_typed_model if typed else random_model)(rng)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # float overflow in a kernel is fine
            prepared = check_model_answers(dev, model)
            if prepared is not None:
                check_execution(prepared, rng, model)
    finally:
        _close_new_pools(model)


def test_random_typed_models_are_mostly_valid(dev):
    """The typed generator reaches execution (else the fuzzing above only tests validation)."""
    valid = 0
    for seed in range(60):
        model = random_typed_model(random.Random(seed))
        valid += dev.get_supported_operations(model)[0] == ErrorStatus.NONE
        _close_new_pools(model)
    assert valid >= 30


# ---- byte-level corruption of valid models ---------------------------------------------------

def _base_models() -> list[tuple[str, Model]]:
    bases = [("add", add_model()), ("add_quant", add_model(quant=True)), ("conv", conv_model()),
             ("if", if_model())]
    specs = default_specs_dir()
    if specs.exists():
        cases = [c for c in iter_cases(specs) if not c.expect_failure]
        for c in cases[::400]:
            bases.append((c.name, build_model(c.data["model"])))
    return bases


@pytest.fixture(scope="module")
def bases():
    models = _base_models()
    yield models
    for _, m in models:
        _close_new_pools(m)


@fuzz_settings(600)
@given(data=st.data(), rng=st.randoms(use_true_random=False))
def test_byte_mutated_models(dev, bases, data, rng):
    name, base = data.draw(st.sampled_from(bases), label="base")
    model = mutate_model_bytes(rng, base)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            prepared = check_model_answers(dev, model)
            if prepared is not None:
                check_execution(prepared, rng, model)
    finally:
        _close_new_pools(model, base)


# ---- random and corrupted requests on valid prepared models ----------------------------------

@pytest.fixture(scope="module")
def prepared_bases(dev, bases):
    out = []
    for name, model in bases:
        cb = PreparedModelCallback()
        dev.prepare_model(model, callback=cb)
        status, pm = cb.wait(CALLBACK_TIMEOUT_S)
        if status == ErrorStatus.NONE:
            out.append((name, model, pm))
    assert len(out) >= 4
    return out


_HUGE = [0, 1, 7, 255, 4096, (1 << 31) - 1, 1 << 31, (1 << 32) - 1, 1 << 32, 1 << 63, -1]


@fuzz_settings(800)
@given(data=st.data(), rng=st.randoms(use_true_random=False))
def test_random_requests(prepared_bases, data, rng):
    name, model, pm = data.draw(st.sampled_from(prepared_bases), label="model")
    fr = random_request(rng, model.main)
    try:
        args = fr.request.inputs + fr.request.outputs
        for _ in range(data.draw(st.integers(0, 3), label="corruptions")):
            if not args:
                break
            k = rng.randrange(len(args))
            a = args[k]
            field = rng.choice(["pool_index", "offset", "length", "dims"])
            value = rng.choice(_HUGE)
            if field == "dims":
                a.dimensions = [rng.choice(_HUGE) for _ in range(rng.randint(0, 5))]
            else:
                loc = a.location
                kw = {"pool_index": loc.pool_index, "offset": loc.offset, "length": loc.length}
                kw[field] = value
                a.location = DataLocation(**kw)
        if rng.random() < 0.2:
            blob = fr.input_memory.read(0, fr.input_memory.size)
            fr.input_memory.write(0, mutate_bytes(rng, blob))
        inputs_before = fr.input_memory.read(0, fr.input_memory.size)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            for pname, path in execution_paths(pm).items():
                res = call_with_timeout(
                    lambda path=path: path(pm, fr.request, MeasureTiming.NO, LOOP_TIMEOUT_NS),
                    CALL_TIMEOUT)
                assert isinstance(res.status, ErrorStatus), pname
                assert res.problem == "", (pname, res.problem)
                assert fr.guards_intact(), f"{pname} wrote outside an output region"
                assert fr.inputs_intact(inputs_before), f"{pname} wrote into the inputs"
    finally:
        fr.close()


def test_deadline_bounds_a_fuzzed_execution(prepared_bases):
    """A deadline already close is honoured: the call returns promptly with a status."""
    _, model, pm = prepared_bases[0]
    fr = random_request(random.Random(0), model.main)
    try:
        start = time.monotonic()
        status, _, _ = pm.execute_synchronously(fr.request, MeasureTiming.NO,
                                                time.monotonic_ns() + 1_000_000)
        assert time.monotonic() - start < 5
        assert isinstance(status, ErrorStatus)
        assert fr.guards_intact()
    finally:
        fr.close()


def test_guard_check_detects_a_stray_write():
    """The guard check itself must be able to fail."""
    model = add_model()
    fr = random_request(random.Random(1), model.main)
    try:
        assert fr.guards_intact()
        off, n = fr.regions[0]
        fr.output_memory.write(off, b"\0")
        assert fr.guards_intact()  # inside the output's region: allowed
        fr.output_memory.write(off + n, b"\0")
        assert not fr.guards_intact()
        before = fr.input_memory.read(0, fr.input_memory.size)
        fr.input_memory.write(0, bytes([before[0] ^ 1]))
        assert not fr.inputs_intact(before)
    finally:
        fr.close()
        _close_new_pools(model)


def test_random_values_are_reproducible():
    a, b = random_typed_model(random.Random(5)), random_typed_model(random.Random(5))
    assert repr(a.main) == repr(b.main) and a.operand_values == b.operand_values
    assert np.array_equal(np.frombuffer(a.operand_values, np.uint8),
                          np.frombuffer(b.operand_values, np.uint8))
