"""C programs built with the system compiler against NeuralNetworks.h and the library, run
with nothing but LD_LIBRARY_PATH set: the library starts Python itself."""

import json
import subprocess
import textwrap
from pathlib import Path

import pytest
from capi_helpers import build_program, clean_env, run_program

from nnhal.capi.build import NAME
from nnhal.capi.header import EXTENSION_FUNCTIONS, FUNCTIONS


def _run(name, libdir, tmp_path):
    r = run_program(build_program(name, libdir, tmp_path), libdir)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "FAIL" not in r.stdout
    return r.stdout


def test_models(libdir, tmp_path):
    """ADD (float, quant8), CONV_2D, timing, output shapes, events, fenced dependencies,
    bursts, a reusable execution, memory from an fd and from a descriptor."""
    out = _run("models", libdir, tmp_path)
    for what in ("compute", "startCompute", "startComputeWithDependencies", "burstCompute",
                 "reusable compute", "memory from fd",
                 "memory from a descriptor, copied to an fd memory",
                 "quant8 add", "conv2d", "while loop"):
        assert f"ok {what}\n" in out


def test_eight_threads(libdir, tmp_path):
    assert "threads 8 executions 160 errors 0" in _run("threads", libdir, tmp_path)


def test_invalid_arguments(libdir, tmp_path):
    assert "ok: 0 failures" in _run("errors", libdir, tmp_path)


def test_soname_and_exports(libdir):
    lib = libdir / NAME
    r = subprocess.run(["readelf", "-dW", "--dyn-syms", str(lib)], capture_output=True,
                       text=True, check=False)
    if r.returncode != 0:
        pytest.skip("no readelf")
    assert "Library soname: [libneuralnetworks.so]" in r.stdout
    assert "NEEDED" in r.stdout and "libpython" not in r.stdout  # found at run time
    exported = set()
    for line in r.stdout.splitlines():
        f = line.split()
        if len(f) >= 8 and f[3] in ("FUNC", "OBJECT") and f[4] == "GLOBAL" and f[6] != "UND":
            exported.add(f[7].split("@")[0])
    assert exported == {name for _, name, _ in [*FUNCTIONS, *EXTENSION_FUNCTIONS]}


@pytest.mark.parametrize("case", ["static libpython", "no environment"])
def test_no_python_is_a_clear_error(case, tmp_path, monkeypatch):
    """A library built against a static Python, or installed outside any site-packages with
    no python baked in, says so on stderr and every call returns OP_FAILED: no crash."""
    import sys

    from nnhal.capi import build

    if case == "static libpython":
        monkeypatch.setattr(build, "libpython", lambda: "")
        exe_baked = sys.executable
    else:
        exe_baked = ""
    libdir = tmp_path / "lib"
    assert build.compile_library(libdir / NAME, exe_baked) is None
    r = run_program(build_program("nopython", libdir, tmp_path), libdir)
    assert r.returncode == 0
    assert r.stdout == "create 5\nfinish 5\n"
    want = ("without a shared libpython" if case == "static libpython"
            else "cannot find the Python environment")
    assert want in r.stderr and r.stderr.count("\n") == 1  # said once, in one line


def test_cli_names_the_library_the_tests_use(libdir):
    """`nnhal ndk --libdir` (this checkout's nnhal) prints the folder these tests link with,
    alone on its last line; --includedir the header's folder."""
    import os
    import sys
    from pathlib import Path

    import nnhal
    from nnhal.capi.build import INCLUDE_DIR

    # The same nnhal these tests imported: the installed one under CI's `pytest`, this
    # checkout under `python -m pytest`.
    top = str(Path(nnhal.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": top}

    def ndk(flag):
        r = subprocess.run([sys.executable, "-m", "nnhal.cli", "ndk", flag], capture_output=True,
                           text=True, check=True, cwd=top, env=env)
        return r.stdout.splitlines()[-1]

    assert ndk("--libdir") == str(libdir)
    assert ndk("--includedir") == str(INCLUDE_DIR)
    assert (INCLUDE_DIR / "NeuralNetworks.h").is_file()
    assert (INCLUDE_DIR / "NeuralNetworksExtensions.h").is_file()


def test_feature_level_8_from_c(libdir, tmp_path):
    """A client compiled against the generated header: the runtime and the reference device
    at feature level 8 (1000008), and both addExtensionAttribute functions with their codes.
    The "hints" device is a plug-in (a dist-info on PYTHONPATH) that logs what it is given,
    so the hints are seen where the driver gets them: TokenValuePairs with the table."""
    site = tmp_path / "site"
    dist = site / "hintsplugin-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: hintsplugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(textwrap.dedent("""
        [nnhal.drivers]
        hints = hint_device:logged
    """))
    log = tmp_path / "hints.jsonl"
    exe = build_program("hints", libdir, tmp_path)
    env = clean_env(libdir)
    env["PYTHONPATH"] = f"{site}:{Path(__file__).resolve().parents[1] / 'runtime'}"
    env["NNHAL_TEST_HINTS_LOG"] = str(log)
    r = subprocess.run([str(exe)], capture_output=True, text=True, env=env, cwd=tmp_path,
                       timeout=300, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ok: 0 failures" in r.stdout and "FAIL" not in r.stdout
    seen = [json.loads(line) for line in log.read_text().splitlines()]
    prepare = next(s for s in seen if s["kind"] == "prepare" and s["hints"])
    (name, prefix), = prepare["table"]
    assert name == "com.example.hints" and prefix >= 1
    assert prepare["hints"] == [[prefix << 16 | 7, "0102"], [prefix << 16 | 8, ""]]
    run = next(s for s in seen if s["kind"] == "sync")
    assert run["hints"] == [[prefix << 16 | 3, b"abc".hex()]]
    assert run["table"] == [["com.example.hints", prefix]]
