"""Shared conformance cases through the AIDL face: the reference and LiteRT drivers through
through_aidl, and the AIDL-only minimal driver opened from the registry, under the runtime."""

import itertools

import pytest
from minimal_driver import NAME, MinimalDevice, register

from nnhal.aidl import through_aidl
from nnhal.conformance import default_specs_dir, iter_cases, run
from nnhal.conformance.runner import FAILED, PASSED
from nnhal.core.version import FeatureLevel
from nnhal.drivers import registry

SPECS = default_specs_dir()
pytestmark = pytest.mark.skipif(not SPECS.exists(), reason=f"no conformance data at {SPECS}")


def _sample(folder, n):
    return list(itertools.islice(iter_cases(SPECS / folder), n))


def _check(report, least):
    failed = [c for c in report.cases if c["result"] == FAILED]
    assert not failed, failed[:5]
    assert sum(c["result"] == PASSED for c in report.cases) >= least


def test_reference_through_aidl():
    from nnhal.drivers.reference import ReferenceDevice

    dev = ReferenceDevice()
    try:
        cases = _sample("V1_0", 25) + _sample("V1_2", 15)
        _check(run(through_aidl(dev), cases, ["general", "dynamic_shape", "memory_domain",
                                              "fenced", "caching", "runtime"], progress=False),
               200)
    finally:
        dev.close()


def test_litert_through_aidl():
    pytest.importorskip("ai_edge_litert")
    from nnhal.drivers.litert import LiteRTDevice

    dev = LiteRTDevice()
    try:
        _check(run(through_aidl(dev), _sample("V1_0", 20), ["general"], progress=False), 10)
    finally:
        dev.close()


def test_minimal_aidl_driver_from_the_registry_under_the_runtime(monkeypatch):
    monkeypatch.setattr(registry, "_DEVICES", dict(registry._DEVICES))  # ends with the test
    register()
    dev = registry.open_device(NAME)
    assert dev.feature_level is FeatureLevel.AIDL_V4 and dev.aidl.__class__ is MinimalDevice
    cases = [c for c in iter_cases(SPECS / "V1_0") if c.name.split("_")[0] in ("add", "mul")]
    report = run(dev, cases, ["general", "runtime"], progress=False)
    _check(report, 8)


def test_a_fifteenth_of_the_suite_in_every_mode_through_aidl(fresh_runtime):
    """CI's sample (a fifteenth) of the whole sweep through the AIDL face, every mode and folder;
    the full sweep is `nnhal conformance --hal aidl` with every --mode."""
    from nnhal.conformance.runner import MODES, SKIPPED, Options
    from nnhal.drivers.reference import ReferenceDevice

    cases = list(iter_cases(SPECS, shard=(7, 15)))
    assert len(cases) > 250
    dev = ReferenceDevice()
    try:  # as `nnhal conformance --hal aidl` runs it (mode capi opens "reference@aidl")
        report = run(dev, cases, list(MODES), Options(face="aidl"), progress=False)
    finally:
        dev.close()
    assert report.to_json()["hal"] == "aidl"
    failed = [(c["mode"], c["name"], c["message"]) for c in report.cases if c["result"] == FAILED]
    assert not failed, failed[:5]
    assert not [c for c in report.cases if c["result"] == SKIPPED]
    for mode in MODES:
        assert report.modes[mode][PASSED] > (10 if mode == "quantization_coupling" else 250)


AIDL_SPECS = SPECS.parent / "conformance-aidl"


@pytest.mark.skipif(not AIDL_SPECS.exists(), reason=f"no AIDL cases at {AIDL_SPECS}")
def test_the_shared_aidl_cases_in_every_mode_through_aidl(fresh_runtime):
    """Feature levels 6-7 (BATCH_MATMUL, PACK, MIRROR_PAD, REVERSE, RESHAPE of INT32): all 185
    cases on the level-8 reference driver through the AIDL face, in every mode."""
    from nnhal.conformance.runner import MODES, SKIPPED, Options
    from nnhal.drivers.reference import ReferenceDevice

    cases = list(iter_cases(AIDL_SPECS))
    assert len(cases) == 185
    dev = ReferenceDevice()
    try:
        report = run(dev, cases, list(MODES), Options(face="aidl"), progress=False)
    finally:
        dev.close()
    bad = [(c["mode"], c["name"], c["message"]) for c in report.cases
           if c["result"] in (FAILED, SKIPPED)]
    assert not bad, bad[:5]
    for mode in MODES:
        assert report.modes[mode][PASSED] == (19 if mode == "quantization_coupling" else 185)


@pytest.mark.skipif(not AIDL_SPECS.exists(), reason=f"no AIDL cases at {AIDL_SPECS}")
def test_the_shared_aidl_cases_on_litert_through_aidl():
    """The LiteRT driver claims every AIDL case but the int32 BATCH_MATMULs (TFLite has no
    int32 kernel), and each case it claims passes (nnhal.drivers.litert.support)."""
    pytest.importorskip("ai_edge_litert")
    from nnhal.conformance.runner import SKIPPED
    from nnhal.drivers.litert import LiteRTDevice

    dev = LiteRTDevice()
    try:
        report = run(through_aidl(dev), list(iter_cases(AIDL_SPECS)), ["general"],
                     progress=False)
    finally:
        dev.close()
    assert not [c for c in report.cases if c["result"] == FAILED]
    skipped = sorted(c["name"] for c in report.cases if c["result"] == SKIPPED)
    assert skipped == sorted(f"batch_matmul_{k}_int32" for k in (
        "LHSAdjoint", "RHSAdjoint", "Simple", "TwoBatchSize")), skipped
    assert report.modes["general"][PASSED] == 181
