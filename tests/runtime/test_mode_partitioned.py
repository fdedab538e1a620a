"""Mode ``partitioned`` of the conformance runner: the test driver (a seeded half of the
operation types) and a sample of the cases across it and the reference driver."""

from __future__ import annotations

import itertools

import pytest

from nnhal.conformance import default_specs_dir, iter_cases
from nnhal.conformance.cases import build_model
from nnhal.conformance.mode_partitioned import HalfDevice, describe, half_of_types
from nnhal.conformance.runner import FAILED, PASSED, Options, run_case
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
    assert line.startswith(f"partitioned: test driver 'half' (seed 14) claims {n // 2} ")
    assert all(OperationType(t).name in line for t in half_of_types())


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
    hal.close()


