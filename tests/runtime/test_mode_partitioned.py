"""Mode ``partitioned`` of the conformance runner: the test driver (a seeded half of the
operation types) and a sample of the cases across it and the reference driver."""

from __future__ import annotations

import itertools

import pytest

from nnhal.conformance import default_specs_dir, iter_cases
from nnhal.conformance.cases import build_model
from nnhal.conformance.mode_partitioned import (
    DEFAULT_SEED,
    MAX_DRAWS,
    HalfDevice,
    describe,
    half_for,
    half_of_types,
)
from nnhal.conformance.runner import FAILED, PASSED, SPLIT_MESSAGE, Options, Report, run_case
from nnhal.drivers.reference import ReferenceDevice
from nnhal.hal.builder import ModelBuilder
from nnhal.hal.interfaces import PreparedModelCallback
from nnhal.hal.types import ErrorStatus, ExecutionPreference, OperationType, Priority
from nnhal.hal.types import OperandType as T
from nnhal.runtime.devices import Device
from nnhal.runtime.partition import assign, group

SPECS = default_specs_dir()


def test_the_half_is_seeded_and_printed():
    assert half_of_types(14) == half_of_types(14)
    assert half_of_types(14) != half_of_types(15)
    n = len([t for t in OperationType if int(t) < 10000])
    assert len(half_of_types()) == n // 2
    line = describe()
    assert line.startswith(f"partitioned: test driver 'half' claims {n // 2} operation types, "
                           f"drawn per case from base seed 14 and the case name")
    assert f"up to {MAX_DRAWS} draws" in line


def test_each_case_has_its_own_reproducible_half():
    a, b = half_of_types(14, "case_a"), half_of_types(14, "case_b")
    assert a == half_of_types(14, "case_a") and a != b
    assert half_of_types(14, "case_a", 1) != a
    assert half_of_types(15, "case_a") != a  # the base seed matters
    assert len(a) == len(half_of_types())


def _three_types() -> object:
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, [2])
    r, t = b.operand(T.TENSOR_FLOAT32, [2]), b.operand(T.TENSOR_FLOAT32, [2])
    out = b.output(T.TENSOR_FLOAT32, [2])
    b.operation(OperationType.RELU, [x], [r])
    b.operation(OperationType.TANH, [r], [t])
    b.operation(OperationType.LOGISTIC, [t], [out])
    return b.build()


def test_the_half_is_redrawn_until_the_model_is_split():
    model = _three_types()
    types, draw = half_for("some case", model)
    ops = {int(OperationType.RELU), int(OperationType.TANH), int(OperationType.LOGISTIC)}
    assert ops & types and ops - types  # both devices get an operation
    for k in range(draw):  # the earlier draws did not split it
        earlier = half_of_types(DEFAULT_SEED, "some case", k)
        assert not (ops & earlier and ops - earlier)
    assert (types, draw) == half_for("some case", model)


def test_the_test_driver_claims_and_prepares_only_its_types():
    relu_only = HalfDevice(frozenset({int(OperationType.RELU)}))
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, [2])
    r = b.operand(T.TENSOR_FLOAT32, [2])
    out = b.output(T.TENSOR_FLOAT32, [2])
    b.operation(OperationType.RELU, [x], [r])
    b.operation(OperationType.TANH, [r], [out])
    model = b.build()
    assert relu_only.get_supported_operations(model) == (ErrorStatus.NONE, [True, False])
    cb = PreparedModelCallback()
    status = relu_only.prepare_model(model, ExecutionPreference.FAST_SINGLE_ANSWER,
                                     Priority.MEDIUM, None, [], [], b"", cb)
    assert status == ErrorStatus.INVALID_ARGUMENT  # a wrong partition fails loudly
    assert cb.wait(5)[0] == ErrorStatus.INVALID_ARGUMENT
    _, caps = relu_only.get_capabilities()
    _, ref_caps = ReferenceDevice().get_capabilities()
    assert caps.performance_of(int(T.TENSOR_FLOAT32)).exec_time < \
        ref_caps.performance_of(int(T.TENSOR_FLOAT32)).exec_time


@pytest.mark.skipif(not SPECS.exists(), reason=f"conformance data not found at {SPECS}")
@pytest.mark.parametrize("pattern", ["mobilenet_224_gender_basic_fixed", "if_simple*",
                                     "while_fib_n_2*", "conv2d_v1_2_zero_sized*",
                                     "strided_slice_invalid*"])
def test_sample_passes_split_across_two_devices(pattern):
    hal = ReferenceDevice()
    cases = list(itertools.islice(iter_cases(SPECS, pattern), 8))
    assert cases, pattern
    results = [(c.name, *run_case(hal, c, "partitioned", Options())) for c in cases]
    assert [r for r in results if r[1] == FAILED] == []
    assert all(r[1] == PASSED for r in results)
    if pattern.startswith("mobilenet"):
        model = build_model(cases[0].data["model"])
        devs = [Device.of(hal, "reference"), Device.of(HalfDevice(half_of_types()), "half")]
        runs = group(model, assign(model, devs, 1))
        assert len(runs) > 1 and {d for d, _ in runs} == {0, 1}  # really split
    if pattern.startswith(("mobilenet", "if_simple", "while_fib")):
        assert all(r[2].startswith(SPLIT_MESSAGE) for r in results), results  # the plan's word
    hal.close()




def test_the_summary_counts_the_split_cases():
    from nnhal.conformance.cases import Case

    rep = Report()
    for k, message in enumerate([SPLIT_MESSAGE + ": compute", "partitioned (one device): x",
                                 SPLIT_MESSAGE + ": compute"]):
        rep.add(Case("f", "V1_3", f"c{k}", {"model": {"main": {"operations": []},
                                                     "referenced": []}}),
                "partitioned", PASSED, message, 0.0)
    assert "split across both devices (plan): 2 of 3 passed" in rep.summary()
