"""The library as `pip install .` put it into an environment (as CI installs nnhal): built
with the package, found by a C program with only LD_LIBRARY_PATH set, and it finds that
environment's Python and nnhal by itself. Skipped where nnhal is not installed (a checkout
used in place)."""

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest
from capi_helpers import build_program, run_program

import nnhal
from nnhal.capi.build import NAME

SOURCE_ROOT = Path(nnhal.__file__).resolve().parent.parent


def _installed() -> Path:
    try:
        dist = importlib.metadata.distribution("nnhal")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("nnhal is not installed in this environment")
    base = Path(str(dist.locate_file(""))).resolve()
    if base == SOURCE_ROOT:
        pytest.skip("only this checkout's own metadata (no installed nnhal)")
    lib = Path(str(dist.locate_file(f"nnhal/capi/lib/{NAME}")))
    if not lib.is_file():
        files = [str(f) for f in dist.files or []]
        if any(f.endswith(".pth") or "__editable__" in f for f in files):
            pytest.skip("nnhal is installed in editable mode (the library is built on demand)")
        pytest.fail(f"installed nnhal has no {NAME} (was a C compiler missing at install?)")
    return lib.parent


def test_installed_library_runs_a_c_program(tmp_path):
    libdir = _installed()
    include = libdir.parent / "include"
    exe = build_program("models", libdir, tmp_path, include=include)
    r = run_program(exe, libdir)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ok conv2d" in r.stdout


def test_installed_cli_prints_the_installed_folders():
    libdir = _installed()
    nnhal = Path(sys.executable).with_name("nnhal")
    if not nnhal.exists():
        pytest.skip("no nnhal script next to this python")
    out = subprocess.run([str(nnhal), "ndk", "--libdir"], capture_output=True, text=True,
                         check=True, cwd="/").stdout
    assert out.splitlines()[-1] == str(libdir)
