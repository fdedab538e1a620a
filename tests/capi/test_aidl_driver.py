"""A driver written against the AIDL interfaces alone (``tests/aidl/minimal_driver.py``) runs
the cases it supports from C, in process and served by ``nnhal serve`` in a process of its own,
with no adapter of its own: the registry opens it through ``nnhal.aidl.from_aidl``."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import wait_for

from nnhal.conformance import default_specs_dir, iter_cases, run
from nnhal.conformance.runner import FAILED, PASSED
from nnhal.core.version import FeatureLevel
from nnhal.drivers import registry

AIDL_TESTS = Path(__file__).resolve().parents[1] / "aidl"
SPECS = default_specs_dir()
pytestmark = pytest.mark.skipif(not SPECS.exists(), reason=f"no conformance data at {SPECS}")


@pytest.fixture
def minimal(monkeypatch):
    """The minimal AIDL driver registered for this test only."""
    monkeypatch.syspath_prepend(str(AIDL_TESTS))
    monkeypatch.setattr(registry, "_DEVICES", dict(registry._DEVICES))
    from minimal_driver import NAME, register

    register()
    return NAME


def _cases():
    """The float cases of ADD, MUL and SUB: the minimal driver's whole repertoire (their
    quantized cases are unsupported there, so not run)."""
    return [c for p in ("add*", "mul*", "sub*") for c in itertools.islice(iter_cases(SPECS, p), 60)
            if "quant" not in c.name]


def _check(report, modes):
    failed = [c for c in report.cases if c["result"] == FAILED]
    assert not failed, failed[:3]
    for mode in modes:
        passed = sum(c["result"] == PASSED and c["mode"] == mode for c in report.cases)
        assert passed >= 20, (mode, passed)  # 22 of these cases are float ADD/MUL/SUB it runs


def test_minimal_aidl_driver_from_c_in_process(libdir, minimal, fresh_runtime):
    dev = registry.open_device(minimal)
    try:
        assert dev.feature_level is FeatureLevel.AIDL_V4
        _check(run(dev, _cases(), ["capi"], progress=False), ["capi"])
    finally:
        dev.close()


def test_minimal_aidl_driver_served_in_its_own_process(libdir, fresh_runtime, tmp_path):
    """``nnhal serve aidl-minimal`` in another process (the driver a plug-in, as a vendor would
    ship it), then the cases through RemoteDevice, the runtime and the C library."""
    site = tmp_path / "site"
    dist = site / "minimalaidl-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: minimalaidl\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(textwrap.dedent("""
        [nnhal.drivers]
        aidl-minimal = minimal_driver:MinimalDevice
    """))
    import nnhal

    top = Path(nnhal.__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(AIDL_TESTS), str(top)])}
    sock = tmp_path / "minimal.sock"
    proc = subprocess.Popen([sys.executable, "-m", "nnhal.cli", "serve", "aidl-minimal",
                             "--socket", str(sock), "--runtime-dir", str(tmp_path / "run")],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert wait_for(sock.exists, 60), proc.stderr.read().decode() if proc.poll() else ""
        dev = registry.open_device(f"remote:{sock}")
        try:
            assert dev.feature_level is FeatureLevel.AIDL_V4  # the served AIDL driver's v4
            modes = ["general", "runtime", "capi"]
            _check(run(dev, _cases(), modes, progress=False), modes)
        finally:
            dev.close()
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
