"""Mode ``capi`` of the conformance runner on a sample (tests/test_conformance.py runs it
over the whole suite): each case built and run through libneuralnetworks.so with ctypes, as
a C client calls it. Skipped without the conformance data."""

import itertools

import pytest

from nnhal.conformance import default_specs_dir, iter_cases
from nnhal.conformance.runner import PASSED, Options, run_case
from nnhal.drivers.reference import ReferenceDevice

SPECS = default_specs_dir()
pytestmark = pytest.mark.skipif(not SPECS.exists(),
                                reason=f"conformance data not found at {SPECS}")


@pytest.fixture(scope="module")
def hal(libdir):
    dev = ReferenceDevice()
    yield dev
    dev.close()


@pytest.mark.parametrize("pattern", ["add_v1_2*", "if_constant_reference*", "while_fib_n_2*",
                                     "conv2d_per_channel*", "depthwise_conv2d_quant8*",
                                     "strided_slice_invalid*"])
def test_sample_passes_through_the_c_library(hal, pattern):
    cases = list(itertools.islice(iter_cases(SPECS, pattern), 8))
    assert cases, pattern
    results = [(c.name, *run_case(hal, c, "capi", Options())) for c in cases]
    assert [r for r in results if r[1] != PASSED] == []
    if pattern == "strided_slice_invalid*":
        assert all("failed as expected" in r[2] for r in results)
