"""The devices nnhal can open by name, for the Session and the commands.

Each entry is a factory plus an availability probe, both called only when asked: a driver that
needs an optional package (a LiteRT-backed one needs ``ai-edge-litert``) registers a probe that
returns the reason it cannot run instead of failing at import, so listing devices never
imports what is not installed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from nnhal.errors import NnhalError
from nnhal.hal.interfaces import IDevice

#: A probe returns None when the device can be opened, else the reason (one line) it cannot.
Probe = Callable[[], "str | None"]


@dataclass(frozen=True)
class _Entry:
    factory: Callable[[], IDevice]
    probe: Probe | None = None


_DEVICES: dict[str, _Entry] = {}


def register(name: str, factory: Callable[[], IDevice], probe: Probe | None = None) -> None:
    """Make ``name`` openable; ``factory`` and ``probe`` are called lazily (replaces an entry
    of the same name)."""
    _DEVICES[name] = _Entry(factory, probe)


def device_names() -> list[str]:
    """Every registered device name, available or not, in registration order."""
    return list(_DEVICES)


def _reason(entry: _Entry) -> str | None:
    if entry.probe is None:
        return None
    try:
        return entry.probe()
    except Exception as e:  # noqa: BLE001 - a probe that breaks means "not available"
        return f"{type(e).__name__}: {e}"


def available() -> dict[str, str | None]:
    """{name: None if it can be opened, else the reason it cannot}."""
    return {name: _reason(entry) for name, entry in _DEVICES.items()}


def open_device(name: str) -> IDevice:
    """A new device object (the caller closes it, if it has ``close``); NnhalError naming the
    known devices for an unknown name, or the reason for an unavailable one."""
    entry = _DEVICES.get(name)
    if entry is None:
        raise NnhalError(f"unknown device '{name}'; devices: {', '.join(_DEVICES)}")
    why = _reason(entry)
    if why is not None:
        raise NnhalError(f"device '{name}' is not available: {why}")
    try:
        return entry.factory()
    except ImportError as e:
        raise NnhalError(f"device '{name}' is not available: {e}") from None


def _reference() -> IDevice:
    from nnhal.drivers.reference import ReferenceDevice

    return ReferenceDevice()


register("reference", _reference)


def _litert() -> IDevice:
    from nnhal.drivers.litert import LiteRTDevice

    return LiteRTDevice()


def _litert_unavailable() -> str | None:
    from nnhal.drivers.litert import unavailable

    return unavailable()


register("litert", _litert, _litert_unavailable)
