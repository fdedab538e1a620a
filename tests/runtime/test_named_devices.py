"""``$NNHAL_DEVICES``: devices the registry cannot list (a served driver at ``remote:PATH``)
are listed by the runtime under the name given, after the registered ones; a name that
cannot be opened is left out with a warning; the variable is read again when it changes."""

from __future__ import annotations

import importlib
import logging

import pytest
from helpers import served

from nnhal.runtime import ndk
from nnhal.runtime.codes import ResultCode

#: The module (``nnhal.runtime.devices`` the attribute is the function of that name).
rt = importlib.import_module("nnhal.runtime.devices")
OK = int(ResultCode.NO_ERROR)


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.delenv(rt.DEVICES_ENV, raising=False)
    monkeypatch.setattr(rt, "_devices", None)
    monkeypatch.setattr(rt, "_named_seen", None)
    yield monkeypatch
    for d in rt._devices or []:
        close = getattr(d.hal, "close", None)
        if close is not None:
            close()


def _names() -> list[str]:
    code, n = ndk.ANeuralNetworks_getDeviceCount()
    assert code == OK
    out = []
    for i in range(n):
        code, d = ndk.ANeuralNetworks_getDevice(i)
        assert code == OK
        out.append(ndk.ANeuralNetworksDevice_getName(d)[1])
    return out


def test_named_devices_parsing():
    assert rt.named_devices("") == []
    assert rt.named_devices(" remote:/a.sock , reference,,remote:/a.sock") == [
        "remote:/a.sock", "reference"]


def test_a_served_device_is_listed_under_its_name_once_named(fresh, tmp_path):
    path = tmp_path / "s.sock"
    name = f"remote:{path}"
    with served(path) as svc:
        before = _names()
        assert name not in before
        fresh.setenv(rt.DEVICES_ENV, f"reference,{name}")  # a listed name is not repeated
        after = _names()
        assert after == before + [name]
        dev = next(d for d in rt.devices() if d.name == name)
        seen = svc.messages
        dev.wait()  # a call of the device goes to the service
        assert svc.messages > seen
        assert _names() == after  # unchanged variable: nothing opened again


def test_a_name_that_cannot_be_opened_is_absent_with_a_warning(fresh, tmp_path, caplog):
    name = f"remote:{tmp_path / 'nobody.sock'}"
    before = _names()
    fresh.setenv(rt.DEVICES_ENV, name)
    with caplog.at_level(logging.WARNING, logger="nnhal.runtime"):
        assert _names() == before
        assert _names() == before
    warnings = [r.getMessage() for r in caplog.records if rt.DEVICES_ENV in r.getMessage()]
    assert len(warnings) == 1  # once per value of the variable, not per listing
    assert "no service answers" in warnings[0]
