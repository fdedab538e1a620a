"""Mode ``runtime`` of the conformance runner on a sample of the cases (the whole suite runs in
tests/test_conformance.py): plain models, control flow with referenced constants, per-channel
quantization, MobileNet, and cases that must fail. Skipped without the conformance data."""

from __future__ import annotations

import itertools

import pytest

from nnhal.conformance import default_specs_dir, iter_cases
from nnhal.conformance.runner import FAILED, PASSED, Options, run_case
from nnhal.drivers.reference import ReferenceDevice

SPECS = default_specs_dir()
pytestmark = pytest.mark.skipif(not SPECS.exists(),
                                reason=f"conformance data not found at {SPECS}")


@pytest.fixture(scope="module")
def hal():
    dev = ReferenceDevice()
    yield dev
    dev.close()


@pytest.mark.parametrize("pattern", ["add_v1_2*", "if_constant_reference*", "while_fib_n_2*",
                                     "conv2d_per_channel*", "mobilenet_224_gender_basic_fixed",
                                     "strided_slice_invalid*"])
def test_sample_passes_in_mode_runtime(hal, pattern):
    cases = list(itertools.islice(iter_cases(SPECS, pattern), 12))
    assert cases, pattern
    results = [(c.name, *run_case(hal, c, "runtime", Options(runtime_create=True)))
               for c in cases]
    failed = [r for r in results if r[1] == FAILED]
    assert failed == []
    assert all(r[1] == PASSED for r in results)
    if pattern == "strided_slice_invalid*":
        assert all("failed as expected" in r[2] for r in results)
    else:
        assert all("createForDevices + create" in r[2] for r in results)
