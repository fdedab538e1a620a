"""Upstream's FibonacciExtensionTest from C (programs/fibonacci.c, built against the headers of
``nnhal ndk --includedir``): the example installed in the program's Python (its PYTHONPATH),
and served by ``nnhal serve fibonacci`` in a process of its own while the program's Python
does not have it."""

from __future__ import annotations

import subprocess

from capi_helpers import build_program, clean_env
from extensions.fib_site import fibonacci_service, make_site

from nnhal.runtime.devices import DEVICES_ENV

CASES = ("extension operand types", "temporaries", "negative n", "invalid input type",
         "invalid output type", "invalid operation", "invalid input count",
         "invalid output count")


def _check(r: subprocess.CompletedProcess) -> None:
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ok: 0 failures" in r.stdout and "FAIL" not in r.stdout
    for case in CASES:
        assert f"ok {case}\n" in r.stdout


def test_fibonacci_from_c_with_the_example_installed(libdir, tmp_path):
    exe = build_program("fibonacci", libdir, tmp_path)
    env = dict(clean_env(libdir), PYTHONPATH=":".join(make_site(tmp_path / "site")))
    _check(subprocess.run([str(exe)], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=300, check=False))


def test_fibonacci_from_c_against_a_served_driver(libdir, tmp_path):
    exe = build_program("fibonacci", libdir, tmp_path)
    with fibonacci_service(tmp_path) as sock:
        env = dict(clean_env(libdir), **{DEVICES_ENV: f"remote:{sock}"})
        _check(subprocess.run([str(exe)], capture_output=True, text=True, env=env,
                              cwd=tmp_path, timeout=300, check=False))
