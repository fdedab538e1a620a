"""Helpers of the C API tests: C programs compiled against the library with the system
compiler, run in the environment a C client has."""

import os
import subprocess
from pathlib import Path

from nnhal.capi.build import INCLUDE_DIR, compiler

PROGRAMS = Path(__file__).with_name("programs")


def clean_env(libdir: Path) -> dict[str, str]:
    """What a C client's process has: no PYTHONPATH, no virtual environment, no PYTHONHOME;
    only LD_LIBRARY_PATH points at the library."""
    keep = ("PATH", "HOME", "LANG", "TMPDIR", "NNHAL_CACHE_DIR", "XDG_CACHE_HOME")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env["LD_LIBRARY_PATH"] = str(libdir)
    return env


def build_program(name: str, libdir: Path, out: Path, include: Path = INCLUDE_DIR) -> Path:
    exe = out / name
    cmd = [*compiler(), "-Wall", "-Wextra", "-Werror", f"-I{include}", str(PROGRAMS / f"{name}.c"),
           f"-L{libdir}", "-lneuralnetworks", "-lpthread", "-o", str(exe)]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    return exe


def run_program(exe: Path, libdir: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(exe)], capture_output=True, text=True, env=clean_env(libdir),
                          cwd=exe.parent, timeout=timeout, check=False)
