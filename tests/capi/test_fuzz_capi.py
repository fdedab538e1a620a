"""Random NDK calls with hostile arguments (NULL, freed and foreign handles, huge and negative
counts, wrong handle kinds, out-of-range enums, short buffers under long counts, descriptors
that are not what they should be) through ctypes into the library, in child processes: none
may die by a signal or hang, every call must answer a defined NDK code, and nothing may be
logged as an unexpected exception. 3 seeds x 4,000 calls, about a second each; feature level
8's two addExtensionAttribute functions weigh eight times, with a device in the child that
supports an extension, so the calls get past the name check."""

import subprocess
import sys
from pathlib import Path

import pytest

from nnhal.capi.build import NAME

SEEDS, CALLS = (11, 12, 13), 4000


@pytest.mark.parametrize("seed", SEEDS)
def test_fuzz_the_c_surface(libdir, tmp_path, seed):
    log = tmp_path / "calls.log"
    top = str(Path(__file__).resolve().parents[2])
    r = subprocess.run([sys.executable, str(Path(__file__).with_name("fuzz_child.py")),
                        str(libdir / NAME), str(seed), str(CALLS), str(log)],
                       capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path,
                       env={"PYTHONPATH": top, "PATH": "/usr/bin:/bin"})
    last = log.read_text().splitlines()[-1:] if log.exists() else []
    assert r.returncode == 0, f"{r.returncode}: {r.stdout}{r.stderr} last call: {last}"
    assert r.stdout.startswith(f"calls {CALLS} ok "), r.stdout
    assert int(r.stdout.split("level8 ")[1].split()[0]) >= 200, r.stdout  # the FL8 calls
    assert r.stderr == "", r.stderr  # no exception logged by the bridge, no traceback
