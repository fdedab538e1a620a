"""The model commands on the command line: bad input is one line on stderr and a non-zero
exit, never a traceback; good input works end to end (those tests need the importer and skip,
saying so, until it is there).

Each command runs as ``python -m nnhal.cli`` in a fresh process from the repository root.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from nnhal import cli
from nnhal.errors import InputError, ModelFileError

ROOT = Path(__file__).resolve().parents[2]


def nnhal(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nnhal.cli", *argv], cwd=ROOT, text=True,
                          capture_output=True, timeout=timeout, check=False)


def assert_one_line(done: subprocess.CompletedProcess[str], prefix: str, *words: str,
                    status: int = 2) -> str:
    assert done.returncode == status, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(prefix + ": "), lines[0]
    for w in words:
        assert w in lines[0], (w, lines[0])
    assert done.stdout == ""
    return lines[0]


def packaged_model(dist: str, name: str) -> Path:
    try:
        files = importlib.metadata.files(dist) or []
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{dist} is not installed (the test extra)")
    for f in files:
        if str(f).endswith(name):
            return Path(f.locate())
    pytest.skip(f"{dist} has no {name}")


def wakeword() -> Path:
    return packaged_model("pymicro-wakeword", "okay_nabu.tflite")


def needs_importer() -> None:
    import nnhal.tflite

    if not hasattr(nnhal.tflite, "read_tflite"):
        pytest.skip("nnhal.tflite.read_tflite (the importer) is not merged yet")


# ---- bad files --------------------------------------------------------------------------------

@pytest.mark.parametrize("command", ["info", "view"])
def test_missing_file(tmp_path, command):
    missing = tmp_path / "nowhere.tflite"
    extra = ["-o", str(tmp_path / "g.html")] if command == "view" else []
    assert_one_line(nnhal(command, str(missing), *extra), f"nnhal {command}", str(missing),
                    "no such file")
    assert not (tmp_path / "g.html").exists()


@pytest.mark.parametrize("command", ["info", "view"])
def test_not_a_flatbuffer(tmp_path, command):
    path = tmp_path / "notes.tflite"
    path.write_text("these are not the bytes you are looking for\n")
    extra = ["-o", str(tmp_path / "g.svg")] if command == "view" else []
    assert_one_line(nnhal(command, str(path), *extra), f"nnhal {command}", str(path),
                    "not a TFLite flatbuffer")


def test_truncated_real_model(tmp_path):
    path = tmp_path / "cut.tflite"
    path.write_bytes(wakeword().read_bytes()[:100])
    assert_one_line(nnhal("info", str(path)), "nnhal info", str(path), "truncated")


def test_unknown_schema_version(tmp_path):
    import flatbuffers
    from tflite.Model import ModelAddVersion, ModelEnd, ModelStart

    b = flatbuffers.Builder(64)
    ModelStart(b)
    ModelAddVersion(b, 2)
    b.Finish(ModelEnd(b), file_identifier=b"TFL3")
    path = tmp_path / "old.tflite"
    path.write_bytes(bytes(b.Output()))
    assert_one_line(nnhal("info", str(path)), "nnhal info", str(path), "schema version 2")


def test_a_folder_is_not_a_model(tmp_path):
    assert_one_line(nnhal("info", str(tmp_path)), "nnhal info", str(tmp_path), "directory")


# ---- bad arguments ----------------------------------------------------------------------------

def test_unknown_option(tmp_path):
    (tmp_path / "m.tflite").write_bytes(b"junk")
    line = assert_one_line(nnhal("info", "--frobnicate", str(tmp_path / "m.tflite")),
                           "nnhal info", "--frobnicate")
    assert "unrecognized" in line


def test_missing_argument():
    assert_one_line(nnhal("view", "README.md"), "nnhal view", "-o/--output")


def test_unknown_command():
    assert_one_line(nnhal("frobnicate"), "nnhal", "frobnicate", "invalid choice")


def test_unknown_picture_format_is_said_before_reading_the_model(tmp_path):
    junk = tmp_path / "junk.tflite"  # reading it would say "not a TFLite flatbuffer"
    junk.write_bytes(b"junk")
    assert_one_line(nnhal("view", str(junk), "-o", str(tmp_path / "g.gif")), "nnhal view",
                    "g.gif", "'.gif'", ".html")


def test_help_is_fast_and_loads_no_numpy():
    code = ("import sys; from nnhal.cli import main; rc = main(['--help']); "
            "print('RC', rc, 'numpy' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, text=True,
                          capture_output=True, timeout=60, check=False)
    assert done.stdout.strip().endswith("RC 0 False"), done.stdout + done.stderr
    for command in ("run", "info", "bench", "view"):
        assert command in done.stdout


# ---- errors escaping a command (in process) -------------------------------------------------

def _raising(exc: BaseException):
    def main(args):
        raise exc
    return main


@pytest.mark.parametrize(("exc", "status"), [
    (ModelFileError("m.tflite", "truncated"), 2),
    (InputError("input 'x': expected float32, got float64"), 1),
])
def test_nnhal_errors_are_one_line(monkeypatch, capsys, tmp_path, exc, status):
    from nnhal.tools import info

    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.tflite").write_bytes(b"junk")
    monkeypatch.setattr(info, "main", _raising(exc))
    assert cli.main(["info", "m.tflite"]) == status
    out, err = capsys.readouterr()
    assert err == f"nnhal info: {exc}\n" and out == ""


def test_interrupt_exits_130_quietly(monkeypatch, capsys, tmp_path):
    from nnhal.tools import info

    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.tflite").write_bytes(b"junk")
    monkeypatch.setattr(info, "main", _raising(KeyboardInterrupt()))
    assert cli.main(["info", "m.tflite"]) == 130
    assert capsys.readouterr() == ("", "")


# ---- real models (need the importer) ----------------------------------------------------------

def test_info_on_a_real_model():
    needs_importer()
    done = nnhal("info", "--json", str(wakeword()))
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["operation_count"] > 0 and data["parameters"] > 0
    assert data["inputs"] and data["outputs"]
    assert any(d["name"] == "reference" and d["available"] for d in data["devices"])
    text = nnhal("info", str(wakeword()))
    assert text.returncode == 0, text.stderr
    assert "reference:" in text.stdout and "CONV_2D" in text.stdout


@pytest.mark.parametrize("suffix", [".html", ".svg", ".dot"])
def test_view_on_a_real_model(tmp_path, suffix):
    needs_importer()
    from nnhal.tflite import read_tflite  # type: ignore[attr-defined]

    model = wakeword()
    imported = read_tflite(str(model))
    out = tmp_path / f"graph{suffix}"
    done = nnhal("view", str(model), "-o", str(out))
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    n = len(imported.model.main.operations)
    assert text.count(f" #{n - 1}") >= 1 and f" #{n}\\n" not in text
    for name in imported.input_names:
        assert name in text
    if suffix == ".svg":
        ET.fromstring(text.split("\n", 1)[1])
