"""``nnhal conformance`` and ``nnhal mutations`` fail loudly and cleanly on bad input.

Bad arguments (a missing or empty specs folder, a filter matching nothing, a --json path that
cannot be written) give a non-zero exit and one line on stderr, before any case runs. Bad data
(a file that is not gzip JSON, not a JSON list, a case missing a field) is reported per file
and case, counted as failed, and the run goes on, then exits non-zero. Never a traceback.
Everything here is built in tmp_path; the upstream data is not needed.
"""

from __future__ import annotations

import copy
import gzip
import json
import os
import time
from pathlib import Path

import pytest

from nnhal.cli import main


def _operand(t: str, lifetime: str, dims: list[int], data: list | None = None,
             consumers: int = 0) -> dict:
    return {"name": "op", "type": t, "dimensions": dims, "scale": 0.0, "zeroPoint": 0,
            "numberOfConsumers": consumers, "lifetime": lifetime, "channelQuant": None,
            "isIgnored": False, "data": data or []}


def add_case(name: str = "tiny_add") -> dict:
    """out = a + b on two float32 [2] inputs; passes on the reference driver."""
    f = "TENSOR_FLOAT32"
    main_sg = {"name": "main",
               "operands": [_operand(f, "SUBGRAPH_INPUT", [2], [1.0, 2.0], 1),
                            _operand(f, "SUBGRAPH_INPUT", [2], [3.0, 4.0], 1),
                            _operand("INT32", "CONSTANT_COPY", [], [0], 1),
                            _operand(f, "SUBGRAPH_OUTPUT", [2], [4.0, 6.0])],
               "operations": [{"type": "ADD", "inputs": [0, 1, 2], "outputs": [3]}],
               "inputIndexes": [0, 1], "outputIndexes": [3]}
    return {"name": name, "model": {"main": main_sg, "referenced": [], "isRelaxed": False},
            "expectFailure": False, "expectedMultinomialDistributionTolerance": 0,
            "minSupportedVersion": None}


def write_cases(path: Path, cases: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as fh:
        json.dump(cases, fh)
    return path


@pytest.fixture
def good_specs(tmp_path: Path) -> Path:
    specs = tmp_path / "specs"
    write_cases(specs / "V1_0" / "add.json.gz", [add_case("tiny_add"), add_case("tiny_add_2")])
    return specs


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_line(rc: int, err: str, *words: str) -> None:
    assert rc != 0
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for w in words:
        assert w in lines[0], (w, lines[0])


# ---- arguments ------------------------------------------------------------------------------

@pytest.mark.parametrize("command", ["conformance", "mutations"])
def test_missing_specs(capsys, tmp_path, command):
    rc, out, err = run_cli(capsys, command, "--specs", str(tmp_path / "nowhere"))
    assert_one_line(rc, err, f"nnhal {command}", "nowhere")
    assert out == ""


@pytest.mark.parametrize("command", ["conformance", "mutations"])
def test_empty_specs_folder(capsys, tmp_path, command):
    (tmp_path / "empty" / "V1_0").mkdir(parents=True)
    (tmp_path / "empty" / "V1_0" / "readme.txt").write_text("no cases here")
    rc, out, err = run_cli(capsys, command, "--specs", str(tmp_path / "empty"))
    assert_one_line(rc, err, "no case files")
    assert out == ""


@pytest.mark.parametrize("command", ["conformance", "mutations"])
def test_filter_matching_nothing(capsys, good_specs, command):
    rc, out, err = run_cli(capsys, command, "--specs", str(good_specs), "--filter", "conv2d*")
    assert_one_line(rc, err, "no case matches --filter 'conv2d*'", str(good_specs))
    assert out == ""


def test_filter_matching_nothing_in_parallel(capsys, good_specs):
    rc, out, err = run_cli(capsys, "conformance", "--specs", str(good_specs), "--filter", "x*",
                           "--jobs", "2")
    assert_one_line(rc, err, "no case matches --filter 'x*'")


def test_specs_missing_by_default(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("NNHAL_CONFORMANCE", str(tmp_path / "absent"))
    rc, out, err = run_cli(capsys, "conformance")
    assert_one_line(rc, err, "absent", "--specs")


@pytest.mark.parametrize("args", [["--mode", "nope"], ["--jobs", "0"], ["--shard", "3/2"],
                                  ["--shard", "x"]])
def test_other_bad_arguments(capsys, good_specs, args):
    rc, out, err = run_cli(capsys, "conformance", "--specs", str(good_specs), *args)
    assert_one_line(rc, err, "nnhal conformance")


def test_mutations_bad_shard(capsys, good_specs):
    rc, out, err = run_cli(capsys, "mutations", "--specs", str(good_specs), "--shard", "2/2")
    assert_one_line(rc, err, "nnhal mutations", "--shard")


def _json_targets(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "a_folder").mkdir()
    return {"missing folder": tmp_path / "missing" / "report.json",
            "file as folder": tmp_path / "a_file" / "report.json",
            "file under a file": tmp_path / "a_file" / "deeper" / "report.json",
            "a folder": tmp_path / "a_folder"}


@pytest.mark.parametrize("kind", ["missing folder", "file as folder", "file under a file",
                                  "a folder"])
@pytest.mark.parametrize("jobs", ["1", "2"])
def test_unwritable_json_is_refused_before_running(capsys, good_specs, tmp_path, kind, jobs):
    target = _json_targets(tmp_path)[kind]
    t0 = time.monotonic()
    rc, out, err = run_cli(capsys, "conformance", "--specs", str(good_specs), "--json",
                           str(target), "--jobs", jobs)
    assert time.monotonic() - t0 < 10.0  # a guard: refused before the cases, not after
    assert_one_line(rc, err, "cannot write --json", str(target))
    assert out == ""  # no case ran: no report


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_json_in_read_only_folder_is_refused(capsys, good_specs, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        rc, out, err = run_cli(capsys, "conformance", "--specs", str(good_specs), "--json",
                               str(ro / "report.json"))
    finally:
        ro.chmod(0o755)
    assert_one_line(rc, err, "cannot write --json")
    assert out == ""


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs /proc")
def test_json_where_nothing_can_be_created_is_refused(capsys, good_specs):
    rc, out, err = run_cli(capsys, "conformance", "--specs", str(good_specs), "--json",
                           "/proc/nnhal-report.json")
    assert_one_line(rc, err, "cannot write --json")
    assert out == ""


def test_writable_json_probe_leaves_nothing_behind(capsys, good_specs, tmp_path):
    target = tmp_path / "report.json"
    rc, out, err = run_cli(capsys, "conformance", "--specs", str(good_specs), "--json",
                           str(target), "--filter", "none*")
    assert rc != 0 and not target.exists()


# ---- data ----------------------------------------------------------------------------------

def test_good_cases_pass(capsys, good_specs, tmp_path):
    report = tmp_path / "report.json"
    rc, out, err = run_cli(capsys, "conformance", "--specs", str(good_specs), "--json",
                           str(report), "--quiet")
    assert rc == 0, (out, err)
    data = json.loads(report.read_text())
    assert data["modes"]["general"]["passed"] == 2 and data["broken"] == []


def _broken_specs(tmp_path: Path) -> Path:
    specs = tmp_path / "specs"
    v = specs / "V1_0"
    write_cases(v / "a_good.json.gz", [add_case("good_one")])
    v.joinpath("b_not_gzip.json.gz").write_bytes(b"this is not gzip")
    with gzip.open(v / "c_not_json.json.gz", "wt") as fh:
        fh.write("{not json")
    write_cases(v / "d_not_list.json.gz", {"name": "x"})
    truncated = gzip.compress(json.dumps([add_case()]).encode())[:40]
    v.joinpath("e_truncated.json.gz").write_bytes(truncated)
    no_model = add_case("no_model")
    del no_model["model"]
    no_lifetime = add_case("no_lifetime")
    del no_lifetime["model"]["main"]["operands"][1]["lifetime"]
    bad_dims = add_case("bad_dims")
    bad_dims["model"]["main"]["operands"][0]["dimensions"] = "two"
    bad_type = add_case("bad_type")
    bad_type["model"]["main"]["operations"][0]["type"] = "NOT_AN_OPERATION"
    no_main = add_case("no_main")
    del no_main["model"]["main"]
    referenced_not_list = add_case("referenced_not_list")
    referenced_not_list["model"]["referenced"] = {"a": 1}
    bad_values = add_case("bad_values")
    bad_values["model"]["main"]["operands"][2]["data"] = ["zero"]
    nameless = copy.deepcopy(add_case())
    del nameless["name"]
    write_cases(v / "f_cases.json.gz", [no_model, no_lifetime, bad_dims, bad_type, no_main,
                                        referenced_not_list, bad_values, nameless, 42,
                                        add_case("good_two")])
    return specs


BROKEN_FILES = ["b_not_gzip", "c_not_json", "d_not_list", "e_truncated"]
BROKEN_CASES = ["no_model", "no_lifetime", "bad_dims", "bad_type", "no_main",
                "referenced_not_list", "bad_values", "case #7", "case #8"]


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_broken_files_and_cases_are_reported_and_fail_the_run(capsys, tmp_path, jobs):
    specs = _broken_specs(tmp_path)
    report = tmp_path / "report.json"
    rc, out, err = run_cli(capsys, "conformance", "--specs", str(specs), "--json", str(report),
                           "--jobs", jobs, "--mode", "general", "--mode", "dynamic_shape",
                           "--quiet")
    broken = len(BROKEN_FILES) + len(BROKEN_CASES)
    assert_one_line(rc, err, f"{broken} case(s) could not be loaded")
    assert "Traceback" not in out
    for name in BROKEN_FILES:
        assert f"{name}.json.gz (whole file)" in out
    for name in BROKEN_CASES:
        assert f"f_cases.json.gz {name}:" in out, name
    assert "(case #0) case: 'model' missing" in out
    data = json.loads(report.read_text())
    assert len(data["broken"]) == broken
    for mode in ("general", "dynamic_shape"):
        assert data["modes"][mode]["passed"] == 2
        assert data["modes"][mode]["failed"] == broken
    failed = {c["name"] for c in data["cases"] if c["result"] == "failed"}
    assert set(BROKEN_CASES) <= failed


def test_broken_cases_respect_the_filter(capsys, tmp_path):
    specs = _broken_specs(tmp_path)
    rc, out, err = run_cli(capsys, "conformance", "--specs", str(specs), "--filter", "bad_*",
                           "--quiet")
    assert rc != 0 and "Traceback" not in out + err
    assert "bad_dims" in out and "bad_values" in out and "no_model" not in out
    # Unreadable files may hold matching cases: they are always reported.
    assert "b_not_gzip.json.gz (whole file)" in out


def test_one_unreadable_file_as_specs(capsys, tmp_path):
    f = tmp_path / "lonely.json.gz"
    f.write_bytes(b"\x1f\x8b garbage")
    rc, out, err = run_cli(capsys, "conformance", "--specs", str(f), "--quiet")
    assert_one_line(rc, err, "could not be loaded")
    assert "lonely.json.gz (whole file): not gzip JSON" in out


def test_mutations_report_broken_cases(capsys, tmp_path):
    specs = _broken_specs(tmp_path)
    rc, out, err = run_cli(capsys, "mutations", "--specs", str(specs), "--limit", "3")
    assert_one_line(rc, err, "nnhal mutations", "could not be loaded")
    assert "model mutations" in out and "b_not_gzip.json.gz (whole file)" in out


# ---- --device -------------------------------------------------------------------------------

@pytest.mark.parametrize("command", ["conformance", "mutations"])
def test_unknown_device_is_one_line(capsys, good_specs, command):
    rc, out, err = run_cli(capsys, command, "--specs", str(good_specs), "--device", "nope")
    assert_one_line(rc, err, f"nnhal {command}", "unknown device 'nope'", "reference")
    assert out == ""


@pytest.mark.parametrize("command", ["conformance", "mutations"])
def test_unavailable_device_says_why(capsys, good_specs, command, monkeypatch):
    from nnhal.drivers import registry

    monkeypatch.setattr(registry, "_DEVICES", dict(registry._DEVICES))
    registry.register("litert", lambda: None, lambda: "ai-edge-litert is not importable")
    rc, out, err = run_cli(capsys, command, "--specs", str(good_specs), "--device", "litert")
    assert_one_line(rc, err, "not available", "ai-edge-litert is not importable")


def test_conformance_on_litert(capsys, good_specs):
    from nnhal.drivers.litert import unavailable

    if unavailable() is not None:
        pytest.skip(f"LiteRT driver unavailable: {unavailable()}")
    rc, out, err = run_cli(capsys, "conformance", "--specs", str(good_specs), "--device",
                           "litert", "--quiet")
    assert rc == 0 and "2 passed, 0 failed" in out


# ---- versions -------------------------------------------------------------------------------

def _versioned_specs(tmp_path: Path) -> Path:
    """A case of today's level, and two of later levels whose operation this nnhal lacks."""
    specs = tmp_path / "specs"
    later = []
    for version, name in (("AIDL_V2", "batch_matmul_like"), ("AIDL_V3", "mirror_pad_like")):
        c = add_case(name)
        c["minSupportedVersion"] = version
        c["model"]["main"]["operations"][0]["type"] = "NOT_KNOWN_YET"
        later.append(c)
    now = add_case("add_of_1_3")
    now["minSupportedVersion"] = "V1_3"
    write_cases(specs / "MIXED" / "cases.json.gz", [now, *later])
    return specs


@pytest.fixture
def hal_1_3_device(tmp_path, monkeypatch) -> str:
    """A plug-in device (a dist-info on sys.path and PYTHONPATH, so --jobs shards open it
    too) that speaks HAL 1.3: the reference driver reports AIDL v4, above every case."""
    import textwrap

    from nnhal.drivers import registry

    site = tmp_path / "site"
    (site / "hal13_nn-1.0.dist-info").mkdir(parents=True)
    (site / "hal13_nn-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: hal13-nn\nVersion: 1.0\n")
    (site / "hal13_nn-1.0.dist-info" / "entry_points.txt").write_text(
        "[nnhal.drivers]\nhal13 = hal13_nn:make\n")
    (site / "hal13_nn.py").write_text(textwrap.dedent("""
        from nnhal.core.version import FeatureLevel
        from nnhal.drivers.reference import ReferenceDevice

        class Hal13Device(ReferenceDevice):
            feature_level = FeatureLevel.V1_3

        def make():
            return Hal13Device()
    """))
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    monkeypatch.setattr(registry, "_DEVICES", dict(registry._DEVICES))
    registry.discover(force=True)
    return "hal13"


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_cases_above_the_devices_level_are_skipped_saying_why(capsys, tmp_path, jobs,
                                                             hal_1_3_device):
    report = tmp_path / "report.json"
    rc, out, err = run_cli(capsys, "conformance", "--specs", str(_versioned_specs(tmp_path)),
                           "--mode", "general", "--json", str(report), "--jobs", jobs,
                           "--device", hal_1_3_device, "--quiet")
    assert rc == 0, (out, err)
    assert "Traceback" not in out + err and "could not be loaded" not in out
    assert "1 passed, 0 failed, 2 skipped" in out
    assert "needs feature level 6 (AIDL v2); the device is at feature level 4 (HAL 1.3)" in out
    assert "needs feature level 7 (AIDL v3)" in out
    cases = {c["name"]: c for c in json.loads(report.read_text())["cases"]}
    assert cases["add_of_1_3"]["result"] == "passed"
    assert cases["mirror_pad_like"]["result"] == "skipped"
    assert cases["mirror_pad_like"]["message"].startswith("needs feature level 7")


@pytest.mark.parametrize("bad", ["V9_9", "v1_3", 3, ["V1_0"]])
def test_an_unknown_min_supported_version_is_a_broken_case(capsys, tmp_path, bad):
    specs = tmp_path / "specs"
    c = add_case("odd_version")
    c["minSupportedVersion"] = bad
    write_cases(specs / "V1_0" / "cases.json.gz", [c, add_case("fine")])
    rc, out, err = run_cli(capsys, "conformance", "--specs", str(specs), "--mode", "general",
                           "--quiet")
    assert_one_line(rc, err, "1 case(s) could not be loaded")
    assert f"odd_version: (case #0) minSupportedVersion: unknown NNAPI version {bad!r}" in out
    assert "1 passed, 1 failed, 0 skipped" in out
