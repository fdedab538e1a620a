"""The device registry: names, availability with reasons, opening by name."""

from __future__ import annotations

import pytest

from nnhal.drivers import registry
from nnhal.drivers.reference import ReferenceDevice
from nnhal.errors import NnhalError


@pytest.fixture
def restore_registry(monkeypatch):
    monkeypatch.setattr(registry, "_DEVICES", dict(registry._DEVICES))


def test_reference_is_registered_and_available():
    assert "reference" in registry.device_names()
    assert registry.available()["reference"] is None
    device = registry.open_device("reference")
    try:
        assert isinstance(device, ReferenceDevice)
        assert registry.open_device("reference") is not device  # a new device each time
    finally:
        device.close()


def test_unknown_name_lists_the_devices():
    with pytest.raises(NnhalError, match="^unknown device 'x'; devices: reference, litert, xla$"):
        registry.open_device("x")


def test_an_unavailable_device_says_why_without_importing_it(restore_registry):
    calls = []

    def factory():
        calls.append("factory")
        raise AssertionError("must not be called")

    registry.register("litert", factory, lambda: "needs ai-edge-litert (pip install "
                                                        "nnhal[litert])")
    assert "litert" in registry.device_names()
    assert registry.available()["litert"] == \
        "needs ai-edge-litert (pip install nnhal[litert])"
    with pytest.raises(NnhalError, match="device 'litert' is not available: needs ai-edge"):
        registry.open_device("litert")
    assert calls == []
    with pytest.raises(NnhalError, match="devices: reference, litert"):
        registry.open_device("tpu")


def test_a_probe_or_factory_that_breaks_is_a_reason_not_a_crash(restore_registry):
    def probe():
        raise RuntimeError("driver library missing")

    def factory():
        raise ImportError("No module named 'vendor'")

    registry.register("broken", factory, probe)
    registry.register("noimport", factory)
    assert registry.available()["broken"] == "RuntimeError: driver library missing"
    assert registry.available()["noimport"] is None
    with pytest.raises(NnhalError, match="'noimport' is not available: No module named"):
        registry.open_device("noimport")


def test_a_device_can_keep_out_of_the_runtimes_default_list(restore_registry):
    probed = []
    registry.register("quiet", ReferenceDevice, lambda: probed.append(1), lambda: False)
    registry.register("loud", ReferenceDevice, None, lambda: True)
    registry.register("broken", ReferenceDevice, None, lambda: 1 / 0)
    names = registry.runtime_names()
    assert "loud" in names and "quiet" not in names and "broken" not in names
    assert probed == []  # kept out before its probe (the costly part) runs
    assert registry.available()["quiet"] is None  # still openable by name


def test_xla_joins_the_runtime_only_with_an_accelerator(monkeypatch, tmp_path):
    import importlib.util

    monkeypatch.setenv("NNHAL_CACHE_DIR", str(tmp_path))  # nothing remembered from elsewhere
    monkeypatch.setattr(registry, "_facts", None)

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in registry._JAX_ACCELERATORS
                        else real(name, *a))
    registry._xla_listed.cache_clear()
    assert "xla" not in registry.runtime_names()
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "jax_plugins" else real(name, *a))
    registry._xla_listed.cache_clear()
    assert registry._xla_listed()
    registry._xla_listed.cache_clear()


def test_the_look_along_the_path_is_taken_again_when_the_path_changed(monkeypatch, tmp_path):
    """Importing nnhal.session looks along sys.path; a path changed since is looked at again
    (an answer for the old path is never taken for the new one)."""
    import sys

    monkeypatch.setenv("NNHAL_CACHE_DIR", str(tmp_path / "cache"))
    sentinel = (True, True)
    monkeypatch.setattr(registry, "_facts", sentinel)
    monkeypatch.setattr(registry, "_facts_path", list(sys.path))
    assert registry._path_facts() is sentinel  # the same path: the answer stands
    monkeypatch.syspath_prepend(str(tmp_path))
    assert registry._path_facts() is not sentinel
    assert registry._facts_path == sys.path
