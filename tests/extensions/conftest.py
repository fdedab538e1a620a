"""The Fibonacci example package made visible as if installed (fib_site.py)."""

from __future__ import annotations

import sys

import pytest

from .fib_site import make_site

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
