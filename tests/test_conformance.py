"""The upstream conformance cases in every mode of the runner, run once per session.

The data lives outside the project (``$NNHAL_CONFORMANCE`` or ``../shared/conformance``); when it
is absent these tests are skipped, saying so. The run is sharded over the machine's cores; the
per-mode report is printed at the end of the pytest session and written to
``conformance-report.json``.
"""

import json
import os
from pathlib import Path

import pytest

from nnhal.conformance import default_specs_dir, iter_cases
from nnhal.conformance.parallel import run_sharded
from nnhal.conformance.runner import FAILED, MODES, PASSED, SKIPPED

SPECS = default_specs_dir()
pytestmark = pytest.mark.skipif(not SPECS.exists(),
                                reason=f"conformance data not found at {SPECS}")
#: The bar: no more than 0.5% of the cases may fail in any mode.
MAX_FAILED_FRACTION = 0.005
REPORT_FILE = Path("conformance-report.json")
SUMMARIES: list[str] = []


@pytest.fixture(scope="module")
def report():
    rep = run_sharded(SPECS, MODES, jobs=max(1, os.cpu_count() or 1), loop_timeout_ms=300)
    REPORT_FILE.write_text(json.dumps(rep.to_json(), indent=1))
    SUMMARIES.append(rep.summary(show_ops=False))
    return rep


def _failed(report, mode, folder=None):
    return [f"{c['name']}: {c['message']}" for c in report.cases
            if c["mode"] == mode and c["result"] == FAILED
            and (folder is None or c["file"].split("/")[-2] == folder)]


def test_v1_0_general_and_mobilenets_have_no_failures(report):
    v10 = [c for c in report.cases if c["mode"] == "general" and "/V1_0/" in f"/{c['file']}"]
    assert len(v10) > 300
    assert all(c["result"] == PASSED for c in v10), [c for c in v10 if c["result"] != PASSED]
    mobilenets = [c for c in report.cases if c["mode"] == "general"
                  and c["name"].startswith("mobilenet")]
    assert {c["name"] for c in mobilenets} == {"mobilenet_224_gender_basic_fixed",
                                               "mobilenet_224_gender_basic_fixed_relaxed"}
    assert all(c["result"] == PASSED for c in mobilenets)


@pytest.mark.parametrize("mode", MODES)
def test_mode_over_whole_suite(report, mode):
    counts = report.modes[mode]
    ran = counts[PASSED] + counts[FAILED] + counts[SKIPPED]
    assert ran > 500
    failed = _failed(report, mode)
    assert len(failed) <= MAX_FAILED_FRACTION * ran, failed[:20]
    # Every operation of HAL 1.3 is implemented: nothing may be skipped as unsupported.
    skipped = [c["name"] for c in report.cases if c["mode"] == mode and c["result"] == SKIPPED]
    assert skipped == [], skipped[:20]


@pytest.mark.parametrize("mode", [m for m in MODES if m not in ("general",
                                                                "quantization_coupling")])
def test_mode_passes_what_general_passes(report, mode):
    general = {(c["file"], c["name"]) for c in report.cases
               if c["mode"] == "general" and c["result"] == PASSED}
    here = {(c["file"], c["name"]) for c in report.cases
            if c["mode"] == mode and c["result"] == PASSED}
    assert general - here == set(), sorted(general - here)[:20]


def test_infinite_loops_end_with_missed_deadline():
    from nnhal.conformance.cases import build_model, build_request
    from nnhal.drivers.reference import ReferenceDevice
    from nnhal.hal.interfaces import PreparedModelCallback
    from nnhal.hal.types import ErrorStatus, ExecutionPreference, MeasureTiming, Priority

    cases = [c for c in iter_cases(SPECS / "V1_3") if c.name.startswith("while_infinite_loop")]
    assert len(cases) == 5
    dev = ReferenceDevice()
    try:
        for case in cases:
            cb = PreparedModelCallback()
            dev.prepare_model(build_model(case.data["model"]),
                              ExecutionPreference.FAST_SINGLE_ANSWER, Priority.MEDIUM, None, [],
                              [], b"", cb)
            status, pm = cb.wait(10)
            assert status == ErrorStatus.NONE
            built = build_request(case.data["model"])
            status, shapes, _ = pm.execute_synchronously(built.request, MeasureTiming.NO, None,
                                                         50_000_000)
            assert status in (ErrorStatus.MISSED_DEADLINE_TRANSIENT,
                              ErrorStatus.MISSED_DEADLINE_PERSISTENT), case.name
            assert shapes == []
            built.close()
    finally:
        dev.close()
