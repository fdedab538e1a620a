"""The Fibonacci example package made visible as if installed (fib_site.py)."""

from __future__ import annotations

import sys

import pytest

from .fib_site import fibonacci_service, make_site


@pytest.fixture
def fibonacci_site(tmp_path, monkeypatch, fresh_runtime):
    """The example installed for this test: its extension and its device ``fibonacci``
    discovered through their entry points, a fresh device list, a clean extension registry."""
    from nnhal.drivers import registry
    from nnhal.ops import extensions

    paths = make_site(tmp_path / "site")
    for p in reversed(paths):
        monkeypatch.syspath_prepend(p)
    for name in ("_registered", "_plugins", "_errors", "_declared"):
        monkeypatch.setattr(extensions, name, {})
    monkeypatch.setattr(extensions, "_discovered", False)
    registry.discover(force=True)
    yield paths
    registry._discovered = False
    extensions._discovered = False
    for name in [m for m in sys.modules if m.startswith("nnhal_fibonacci")]:
        del sys.modules[name]


@pytest.fixture(scope="session")
def service(tmp_path_factory):
    """``nnhal serve fibonacci`` in its own process, once for the session."""
    with fibonacci_service(tmp_path_factory.mktemp("fib-served")) as sock:
        yield sock


@pytest.fixture
def remote(service, fresh_runtime, monkeypatch):
    import importlib

    from nnhal.ops import extensions

    devices = importlib.import_module("nnhal.runtime.devices")
    for name in ("_registered", "_plugins", "_errors", "_declared"):
        monkeypatch.setattr(extensions, name, {})
    monkeypatch.setattr(extensions, "_discovered", True)  # nothing installed here
    monkeypatch.setenv(devices.DEVICES_ENV, f"remote:{service}")
    yield f"remote:{service}"


@pytest.fixture(params=["local", "served"])
def fibonacci_device(request):
    """The example's device in this process (installed here), or served (installed only in
    the service's process)."""
    return request.getfixturevalue("fibonacci_site" if request.param == "local" else "remote")
