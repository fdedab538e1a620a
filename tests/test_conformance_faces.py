"""Conformance and mutations through either face (``--hal 1.3``, ``--hal aidl``), and the skip
rule for cases above HAL 1.3 that use what nnhal does not declare yet.

The wiring is checked with a stand-in for ``nnhal.aidl`` whose ``through_aidl`` counts every
call it passes on, so it runs before the AIDL face exists; the runs through the real face
``pytest.importorskip("nnhal.aidl")``.
"""

from __future__ import annotations

import json
import shutil
import sys
import types
from collections import Counter
from pathlib import Path

import pytest
from helpers import served
from test_conformance_cli import add_case, assert_one_line, run_cli, write_cases

from nnhal.conformance import iter_cases, run
from nnhal.conformance.runner import NOT_IMPLEMENTED, Options
from nnhal.conformance.specs import default_specs_dir
from nnhal.core.version import FeatureLevel
from nnhal.drivers.reference import ReferenceDevice
from nnhal.hal.interfaces import IDevice

SHARED = default_specs_dir()
SHARED_AIDL = SHARED.parent / "conformance-aidl"
DRIVER_MODES = ("general", "dynamic_shape", "quantization_coupling", "memory_domain", "fenced",
                "caching")
RUNTIME_MODES = ("runtime", "partitioned", "capi")
#: A sample of the shared cases over the version folders: 10 cases, well under a second a mode.
SAMPLE = "add_*quant8*"


@pytest.fixture
def specs(tmp_path: Path) -> Path:
    d = tmp_path / "specs"
    write_cases(d / "V1_0" / "add.json.gz", [add_case("tiny_add"), add_case("tiny_add_2")])
    return d


@pytest.fixture
def clean_registry(fresh_runtime):
    """Entries a run registers (``NAME@aidl`` for mode capi) and the devices the library's
    runtime lists end with the test (see ``fresh_runtime`` in conftest.py)."""


def _capi_available() -> bool:
    from nnhal.capi.build import compiler, library_dir

    return shutil.which(compiler()[0]) is not None and library_dir()[0] is not None


# ---- arguments ------------------------------------------------------------------------------

@pytest.mark.parametrize("command", ["conformance", "mutations"])
@pytest.mark.parametrize("value", ["1.2", "AIDL", ""])
def test_a_bad_hal_is_one_line_and_exit_2(capsys, specs, command, value):
    rc, out, err = run_cli(capsys, command, "--specs", str(specs), "--hal", value)
    assert rc == 2
    assert_one_line(rc, err, f"nnhal {command}", "--hal", "invalid choice")


@pytest.mark.parametrize("command", ["conformance", "mutations"])
def test_an_absent_aidl_face_is_one_line_and_exit_2(capsys, specs, command, monkeypatch):
    monkeypatch.setitem(sys.modules, "nnhal.aidl", None)  # import fails, as before it exists
    rc, out, err = run_cli(capsys, command, "--specs", str(specs), "--hal", "aidl")
    assert rc == 2 and out == ""
    assert_one_line(rc, err, f"nnhal {command}", "--hal aidl", "AIDL face is not available")


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_the_report_names_the_face(capsys, specs, tmp_path, jobs):
    report = tmp_path / "r.json"
    rc, out, err = run_cli(capsys, "conformance", "--specs", str(specs), "--json", str(report),
                           "--quiet", "--jobs", jobs)
    assert rc == 0, err
    assert out.startswith("face: --hal 1.3: HAL 1.3")
    data = json.loads(report.read_text())
    assert data["hal"] == "1.3" and data["hal_face"].startswith("--hal 1.3")
    assert data["modes"]["general"]["passed"] == 2


# ---- every mode through the face (a counting stand-in for nnhal.aidl) -----------------------

def _forwarder(name: str):
    def call(self, *args, **kwargs):
        self.calls[name] += 1
        return getattr(self.inner, name)(*args, **kwargs)
    return call


def _counting_face(level: FeatureLevel | None = None) -> tuple[types.ModuleType, list]:
    """A module standing in for nnhal.aidl: ``through_aidl`` wraps a device in a proxy that
    counts the calls it passes on (and reports ``level`` when given)."""
    made: list = []

    def init(self, inner):
        self.inner, self.calls = inner, Counter()
        made.append(self)

    names = sorted(IDevice.__abstractmethods__ | {"prepare_model_with_config"})
    Proxy = type("Proxy", (IDevice,), {
        "__init__": init, **{n: _forwarder(n) for n in names},
        "feature_level": property(lambda self: level or self.inner.feature_level),
        "close": lambda self: self.inner.close()})
    module = types.ModuleType("nnhal.aidl")
    module.through_aidl = Proxy  # type: ignore[attr-defined]
    return module, made


@pytest.mark.parametrize("mode", DRIVER_MODES + RUNTIME_MODES)
def test_every_mode_reaches_the_device_through_the_face(mode, specs, monkeypatch,
                                                        clean_registry):
    if mode == "capi" and not _capi_available():
        pytest.skip("no C compiler or libneuralnetworks.so")
    module, made = _counting_face()
    monkeypatch.setitem(sys.modules, "nnhal.aidl", module)
    cases = list(iter_cases(specs))
    dev = ReferenceDevice()
    try:
        report = run(dev, cases, [mode], Options(face="aidl"), progress=False)
    finally:
        dev.close()
    counts = report.to_json()["modes"][mode]
    assert counts["failed"] == 0 and counts["passed"] + counts["not_applicable"] == 2, counts
    assert report.to_json()["hal"] == "aidl"
    inner = Counter(type(p.inner).__name__ for p in made)
    prepared = sum(p.calls["prepare_model"] + p.calls["prepare_model_with_config"]
                   for p in made)
    if mode == "quantization_coupling":  # float cases: not applicable, nothing prepared
        assert inner == {"ReferenceDevice": 1}
        return
    assert prepared >= 2, {type(p.inner).__name__: p.calls for p in made}
    if mode == "partitioned":  # the test driver is reached through the face too
        assert inner["HalfDevice"] == 2 and inner["ReferenceDevice"] == 1
    elif mode == "capi":  # the library opens "reference@aidl": a device of its own, wrapped
        assert inner["ReferenceDevice"] == 2
        prep = [p.calls["prepare_model"] + p.calls["prepare_model_with_config"] for p in made]
        assert prep[0] == 0 < prep[1]
    else:
        assert inner == {"ReferenceDevice": 1}


def test_mutations_reach_the_device_through_the_face(capsys, specs, monkeypatch):
    module, made = _counting_face()
    monkeypatch.setitem(sys.modules, "nnhal.aidl", module)
    rc, out, err = run_cli(capsys, "mutations", "--specs", str(specs), "--hal", "aidl",
                           "--limit", "3")
    assert rc == 0, out + err
    assert out.startswith("face: --hal aidl: AIDL HAL")
    assert len(made) == 1 and made[0].calls["prepare_model"] >= 2
    assert made[0].calls["get_supported_operations"] >= 2


# ---- the skip rule for cases beyond today's operations -------------------------------------

class Level8(ReferenceDevice):
    """The reference driver reporting feature level 8, as the drivers will."""

    feature_level = FeatureLevel.AIDL_V4


class Level4(ReferenceDevice):
    feature_level = FeatureLevel.V1_3


def _case(name: str, version: str | None, op: str = "ADD", operand_type: str | None = None):
    c = add_case(name)
    c["minSupportedVersion"] = version
    c["model"]["main"]["operations"][0]["type"] = op
    if operand_type:
        for o in c["model"]["main"]["operands"]:
            if o["type"] == "TENSOR_FLOAT32":
                o["type"] = operand_type
    return c


def _rule_cases(tmp_path: Path) -> list:
    specs = tmp_path / "rule"
    write_cases(specs / "MIXED" / "cases.json.gz", [
        _case("new_op", "AIDL_V2", "NOT_KNOWN_YET"),
        _case("new_types", "AIDL_V3", operand_type="TENSOR_BOOL8"),  # ADD on bool: undeclared
        _case("declared", "AIDL_V2"),                # a later level, everything declared: runs
        _case("old_new_op", "V1_3", "NOT_KNOWN_YET"),      # never skipped so: broken, failed
        _case("old_new_types", "V1_3", operand_type="TENSOR_BOOL8"),  # runs, and fails
    ])
    return list(iter_cases(specs))


def _results(report) -> dict[str, tuple[str, str]]:
    return {c["name"]: (c["result"], c["message"]) for c in report.cases}


def test_undeclared_cases_above_1_3_are_skipped_as_not_implemented(tmp_path):
    dev = Level8()
    try:
        report = run(dev, _rule_cases(tmp_path), ["general"], progress=False)
    finally:
        dev.close()
    got = _results(report)
    assert got["new_op"] == ("skipped", NOT_IMPLEMENTED + "NOT_KNOWN_YET (an operation nnhal "
                                                          "does not declare)")
    result, message = got["new_types"]
    assert result == "skipped" and message.startswith(NOT_IMPLEMENTED + "ADD: ")
    assert "TENSOR_BOOL8" in message and "not implemented yet" in message
    assert got["declared"][0] == "passed"
    assert got["old_new_op"][0] == "failed" and "NOT_KNOWN_YET" in got["old_new_op"][1]
    assert got["old_new_types"][0] == "failed"
    data = report.to_json()
    assert data["not_implemented"] == {"general": {"ADD": 1, "NOT_KNOWN_YET": 1}}
    summary = report.summary()
    assert "mode general: 1 passed, 2 failed, 2 skipped (2 not implemented yet)" in summary
    assert "  NOT_KNOWN_YET: 1 case run(s)" in summary


def test_a_level_4_device_or_face_skips_them_for_their_level(tmp_path):
    cases = _rule_cases(tmp_path)
    for dev, opts, where in ((Level4(), Options(), "the device is at feature level 4"),
                             (Level8(), Options(face="1.3"),
                              "the device is at feature level 4 (HAL 1.3) through --hal 1.3 "
                              "(itself at feature level 8 (AIDL v4))")):
        try:
            report = run(dev, cases, ["general"], opts, progress=False)
        finally:
            dev.close()
        got = _results(report)
        for name in ("new_op", "new_types", "declared"):
            result, message = got[name]
            assert result == "skipped" and message.startswith("needs feature level")
            assert where in message
        assert report.to_json()["not_implemented"] == {}


@pytest.mark.skipif(not SHARED_AIDL.exists(), reason=f"no AIDL cases at {SHARED_AIDL}")
def test_the_shared_aidl_cases_pass_or_are_skipped_per_operation_at_level_8():
    """Every case of the shared AIDL folder passes at level 8: nothing is undeclared now."""
    cases = list(iter_cases(SHARED_AIDL))
    dev = Level8()
    try:
        report = run(dev, cases, ["general"], progress=False)
    finally:
        dev.close()
    general = report.to_json()["modes"]["general"]
    assert len(cases) == 185
    assert general["failed"] == general["not_applicable"] == general["skipped"] == 0
    assert general["passed"] == 185
    assert not report.not_implemented().get("general")


# ---- shared cases through either face, in process and served -------------------------------

@pytest.fixture
def face(request):
    if request.param == "aidl":
        pytest.importorskip("nnhal.aidl")
    return request.param


def _sample_run(capsys, tmp_path, face, device, modes):
    report = tmp_path / "r.json"
    args = ["conformance", "--specs", str(SHARED), "--filter", SAMPLE, "--hal", face,
            "--device", device, "--quiet", "--json", str(report)]
    for m in modes:
        args += ["--mode", m]
    rc, out, err = run_cli(capsys, *args)
    assert rc == 0, out + err
    data = json.loads(report.read_text())
    assert data["hal"] == face and out.startswith(f"face: --hal {face}")
    for m in modes:
        c = data["modes"][m]
        assert c["failed"] == 0 and c["passed"] > 0, (m, c)
    return data


@pytest.mark.skipif(not SHARED.exists(), reason=f"no conformance data at {SHARED}")
@pytest.mark.parametrize("face", ["1.3", "aidl"], indirect=True)
@pytest.mark.parametrize("modes", [DRIVER_MODES, RUNTIME_MODES])
def test_shared_sample_in_every_mode(capsys, tmp_path, face, modes, clean_registry):
    if "capi" in modes and not _capi_available():
        modes = tuple(m for m in modes if m != "capi")
    _sample_run(capsys, tmp_path, face, "reference", modes)


@pytest.mark.skipif(not SHARED.exists(), reason=f"no conformance data at {SHARED}")
@pytest.mark.parametrize("face", ["1.3", "aidl"], indirect=True)
def test_shared_sample_against_a_served_driver(capsys, tmp_path, face, clean_registry):
    sock = tmp_path / "ref.sock"
    modes = ("general", "fenced", "runtime") + (("capi",) if _capi_available() else ())
    with served(sock):
        _sample_run(capsys, tmp_path, face, f"remote:{sock}", modes)


@pytest.mark.parametrize("face", ["1.3", "aidl"], indirect=True)
def test_mutations_through_the_face_reject_every_mutant(capsys, specs, face):
    rc, out, err = run_cli(capsys, "mutations", "--specs", str(specs), "--hal", face,
                           "--limit", "20")
    assert rc == 0, out + err
    assert out.startswith(f"face: --hal {face}")
    assert " 0 accepted, 0 wrong status, 0 crashes, 0 hangs" in out
