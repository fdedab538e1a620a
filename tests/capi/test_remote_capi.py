"""Mode ``capi`` against a served driver: libneuralnetworks.so lists ``remote:PATH`` once it
is named in ``$NNHAL_DEVICES`` (as a C program names it), and the cases go client → C
library → service. A bad ``remote:`` path is one clear line, not a failure per case."""

from __future__ import annotations

import importlib
import itertools
import os
import subprocess

import pytest
from capi_helpers import build_program, clean_env
from helpers import served

from nnhal.capi import ctypes_ndk
from nnhal.cli import main
from nnhal.conformance import default_specs_dir, iter_cases
from nnhal.conformance.runner import FAILED, PASSED, Options, run_case
from nnhal.drivers import registry

#: The module (``nnhal.runtime.devices`` the attribute is the function of that name).
rt_devices = importlib.import_module("nnhal.runtime.devices")
SPECS = default_specs_dir()
needs_specs = pytest.mark.skipif(not SPECS.exists(),
                                 reason=f"conformance data not found at {SPECS}")


@pytest.fixture
def fresh_runtime(libdir, fresh_runtime):
    """conftest's ``fresh_runtime`` (devices listed anew, nothing a test opens outlives it),
    here only where the library can be built."""
    yield


@needs_specs
def test_capi_cases_pass_through_the_served_device(fresh_runtime, tmp_path, monkeypatch):
    path = tmp_path / "ref.sock"
    name = f"remote:{path}"
    with served(path) as svc:
        prepared = []
        real_prepare = svc.device.prepare_model

        def counting_prepare(*args, **kw):
            prepared.append(1)
            return real_prepare(*args, **kw)

        monkeypatch.setattr(svc.device, "prepare_model", counting_prepare)
        dev = registry.open_device(name)
        try:
            assert name not in ctypes_ndk.library_devices()
            cases = [c for p in ("add_v1_2*", "conv2d_v1_2*", "if_simple*")
                     for c in itertools.islice(iter_cases(SPECS, p), 3)]
            assert len(cases) >= 6
            assert not any(c.expect_failure for c in cases)
            before = svc.messages
            results = [(c.name, *run_case(dev, c, "capi", Options())) for c in cases]
            assert [r for r in results if r[1] != PASSED] == []
            # The C client found the device under its remote name, named in the environment...
            assert os.environ[rt_devices.DEVICES_ENV] == name
            assert name in ctypes_ndk.library_devices()
            # ...and the models were prepared by the service (the runner's own connection
            # prepares nothing in mode capi: every compilation is the C library's).
            assert len(prepared) >= len(cases)
            assert svc.messages > before + len(cases)
        finally:
            dev.close()


def test_a_device_the_library_cannot_open_is_one_reason(fresh_runtime, tmp_path):
    name = f"remote:{tmp_path / 'nobody.sock'}"
    why = ctypes_ndk.use_device(name)
    assert why is not None and "\n" not in why
    assert "no service answers" in why and name in why
    assert rt_devices.DEVICES_ENV not in os.environ  # not named to the library
    assert name not in ctypes_ndk.library_devices()


@needs_specs
def test_cli_bad_remote_path_with_mode_capi_is_one_line(tmp_path, capsys):
    code = main(["conformance", "--specs", str(SPECS), "--mode", "capi", "--filter",
                 "add_v1_2*", "--quiet", "--device", f"remote:{tmp_path / 'nobody.sock'}"])
    out, err = capsys.readouterr()
    assert code == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1
    assert "no service answers" in err and "UNEXPECTED_NULL" not in err
    assert "Traceback" not in err


@needs_specs
def test_mode_capi_names_an_unlisted_device_in_one_failure(fresh_runtime, tmp_path):
    """A device the library cannot list fails the case with the reason, not UNEXPECTED_NULL."""

    class Named:
        name = f"remote:{tmp_path / 'gone.sock'}"

    case = next(iter(iter_cases(SPECS, "add_v1_2*")))
    result, message = run_case(Named(), case, "capi", Options())  # type: ignore[arg-type]
    assert result == FAILED
    assert "cannot open device" in message and "UNEXPECTED_NULL" not in message


def test_a_c_program_reaches_a_served_driver_through_the_environment(libdir, tmp_path):
    """A C program (its own process, Python started by the library) given
    ``NNHAL_DEVICES=remote:PATH`` finds the device by that name and computes on it."""
    path = tmp_path / "c.sock"
    name = f"remote:{path}"
    exe = build_program("remote", libdir, tmp_path)
    with served(path) as svc:
        without = subprocess.run([str(exe), name], capture_output=True, text=True,
                                 env=clean_env(libdir), timeout=300, check=False)
        assert without.returncode == 1 and f"FAIL no device {name}" in without.stdout
        seen = svc.messages
        env = dict(clean_env(libdir), **{rt_devices.DEVICES_ENV: name})
        r = subprocess.run([str(exe), name], capture_output=True, text=True, env=env,
                           timeout=300, check=False)
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"ok add on {name}" in r.stdout
        assert svc.messages > seen  # the program's runtime talked to the service
