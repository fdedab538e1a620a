"""The device registry: names, availability with reasons, opening by name."""

from __future__ import annotations

import pytest

from nnhal.drivers import device_registry
from nnhal.drivers.reference import ReferenceDevice
from nnhal.errors import NnhalError


@pytest.fixture
def restore_registry(monkeypatch):
    monkeypatch.setattr(device_registry, "_DEVICES", dict(device_registry._DEVICES))


def test_reference_is_registered_and_available():
    assert "reference" in device_registry.device_names()
    assert device_registry.available()["reference"] is None
    device = device_registry.open_device("reference")
    try:
        assert isinstance(device, ReferenceDevice)
        assert device_registry.open_device("reference") is not device  # a new device each time
    finally:
        device.close()


def test_unknown_name_lists_the_devices():
    with pytest.raises(NnhalError, match="^unknown device 'x'; devices: reference, litert$"):
        device_registry.open_device("x")


def test_an_unavailable_device_says_why_without_importing_it(restore_registry):
    calls = []

    def factory():
        calls.append("factory")
        raise AssertionError("must not be called")

    device_registry.register("litert", factory, lambda: "needs ai-edge-litert (pip install "
                                                        "nnhal[litert])")
    assert device_registry.device_names()[-1] == "litert"
    assert device_registry.available()["litert"] == \
        "needs ai-edge-litert (pip install nnhal[litert])"
    with pytest.raises(NnhalError, match="device 'litert' is not available: needs ai-edge"):
        device_registry.open_device("litert")
    assert calls == []
    with pytest.raises(NnhalError, match="devices: reference, litert"):
        device_registry.open_device("tpu")


def test_a_probe_or_factory_that_breaks_is_a_reason_not_a_crash(restore_registry):
    def probe():
        raise RuntimeError("driver library missing")

    def factory():
        raise ImportError("No module named 'vendor'")

    device_registry.register("broken", factory, probe)
    device_registry.register("noimport", factory)
    assert device_registry.available()["broken"] == "RuntimeError: driver library missing"
    assert device_registry.available()["noimport"] is None
    with pytest.raises(NnhalError, match="'noimport' is not available: No module named"):
        device_registry.open_device("noimport")
