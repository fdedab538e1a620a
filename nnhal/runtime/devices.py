"""The devices the runtime sees: every available device of
:mod:`nnhal.drivers.registry` that it lists by default (``registry.runtime_names``: XLA only
where JAX has an accelerator), opened once per process, in registration order (the
reference driver first), then the devices named in ``$NNHAL_DEVICES``.

**Named devices.** The registry lists the services registered in the runtime directory
(``remote:NAME``) but cannot list a socket nobody registered. A client names such devices
in ``NNHAL_DEVICES``, comma-separated, spelled as ``--device`` spells them
(``remote:/run/x.sock``, ``remote:NAME``, any registry name): each is opened through the
registry and listed under that name after the registered ones. The variable is how a C
program (``libneuralnetworks.so`` runs this runtime) reaches a served driver, as it has no
other way to name one. It is read again whenever it changes, so a name added while the
process runs appears at the end of the list (indexes of the devices listed before stay);
a name that cannot be opened is left out with one warning on the ``nnhal.runtime`` log,
and tried again only when the variable changes.

A :class:`Device` is ``ANeuralNetworksDevice``: a name, a type, a version string, a feature
level and the driver's IDevice underneath. A caller that already holds an IDevice (the
conformance runner, a test) wraps it with :meth:`Device.of` to compile on exactly that one.

**Death.** A driver may die under the runtime (a served driver whose process is gone). The
runtime knows drivers only through the HAL, so it asks the optional ``alive`` attribute a
driver object may have (:func:`is_dead`); a dead device's DEVICE_UNAVAILABLE becomes the NDK's
DEAD_OBJECT where the runtime cannot recover (see :func:`nnhal.runtime.codes.code_of_status`).
"""

from __future__ import annotations

import logging
import os
import threading

from nnhal.core.version import FeatureLevel
from nnhal.errors import NnhalError
from nnhal.hal.interfaces import IDevice
from nnhal.hal.types import Capabilities, DeviceType, ErrorStatus, PerformanceInfo
from nnhal.runtime.codes import ResultCode, fail
from nnhal.runtime.extensions import supported_extensions


def is_dead(hal: object) -> bool:
    """Whether a driver object says it is dead: its optional ``alive`` attribute is false (a
    driver without one, or whose answer fails, is taken as alive: death is never guessed)."""
    try:
        alive = getattr(hal, "alive", True)
    except Exception:  # noqa: BLE001 - a broken attribute says nothing
        return False
    return alive is False


def feature_level_of(hal: object) -> FeatureLevel:
    """The feature level of the interface a driver object is reached through
    (:attr:`IDevice.feature_level`); an object that names no level of the scale speaks the
    interface a driver speaks unless it says otherwise, HAL 1.3 (level 4)."""
    try:
        level = getattr(hal, "feature_level", None)
    except Exception:  # noqa: BLE001 - a broken attribute names no level
        level = None
    return level if isinstance(level, FeatureLevel) else IDevice.feature_level


class Device:
    """ANeuralNetworksDevice: one driver's device as the runtime names it."""

    def __init__(self, name: str, hal: IDevice):
        self.name = name
        self.hal = hal
        status, t = hal.get_type()
        self.type = int(t) if status == ErrorStatus.NONE else 0
        status, version = hal.get_version_string()
        self.version = str(version) if status == ErrorStatus.NONE else ""
        self.feature_level = feature_level_of(hal)
        self._capabilities: Capabilities | None = None
        self._extensions: list[str] | None = None

    @classmethod
    def of(cls, hal: IDevice, name: str | None = None) -> Device:
        """A device over a driver object the caller already holds."""
        return cls(name or type(hal).__name__, hal)

    @property
    def capabilities(self) -> Capabilities | None:
        if self._capabilities is None:
            status, caps = self.hal.get_capabilities()
            self._capabilities = caps if status == ErrorStatus.NONE else None
        return self._capabilities

    @property
    def extensions(self) -> list[str]:
        """The names of the extensions the driver supports (asked once)."""
        if self._extensions is None:
            self._extensions = supported_extensions(self.hal)
        return self._extensions

    def performance(self, operand_type: int, relaxed: bool) -> PerformanceInfo:
        """The driver's performance for tensors of a type (worst when unknown)."""
        caps = self.capabilities
        if caps is None:
            return PerformanceInfo(float("inf"), float("inf"))
        if relaxed and operand_type == 3:  # TENSOR_FLOAT32 computed as float16
            return caps.relaxed_float32_to_float16_performance_tensor
        return caps.performance_of(operand_type) or PerformanceInfo(float("inf"), float("inf"))

    @property
    def dead(self) -> bool:
        """The driver underneath is known dead (see :func:`is_dead`)."""
        return is_dead(self.hal)

    def wait(self) -> None:
        """ANeuralNetworksDevice_wait: a live in-process driver is always ready; a dead one
        never comes back through this object (DEAD_OBJECT, not a wait forever)."""
        if self.dead:
            raise fail(ResultCode.DEAD_OBJECT, f"device {self.name} is dead")
        status, _ = self.hal.get_type()
        if status != ErrorStatus.NONE:
            raise fail(ResultCode.UNAVAILABLE_DEVICE, f"device {self.name} is not available")

    def __repr__(self) -> str:
        return f"Device({self.name!r}, type={DeviceType(self.type).name if self.type else 0})"


#: Devices to list besides the registered ones, comma-separated (see the module's doc).
DEVICES_ENV = "NNHAL_DEVICES"

log = logging.getLogger("nnhal.runtime")
_lock = threading.Lock()
_devices: list[Device] | None = None
_named_seen: str | None = None  # the value of DEVICES_ENV the list reflects


def named_devices(value: str | None = None) -> list[str]:
    """The device names ``$NNHAL_DEVICES`` (or ``value``) gives, in order, without repeats."""
    text = os.environ.get(DEVICES_ENV, "") if value is None else value
    return list(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))


def devices() -> list[Device]:
    """Every available registered device the registry lists for the runtime
    (:func:`~nnhal.drivers.registry.runtime_names`), then every device ``$NNHAL_DEVICES``
    names (each opened once, kept for the process)."""
    global _devices, _named_seen
    from nnhal.drivers import registry

    with _lock:
        if _devices is None:
            found = []
            for name in registry.runtime_names():
                try:
                    found.append(Device(name, registry.open_device(name)))
                except (NnhalError, Exception):  # noqa: BLE001 - a broken driver is absent
                    continue
            _devices = found
        value = os.environ.get(DEVICES_ENV, "")
        if value != _named_seen:
            _named_seen = value
            listed = {d.name for d in _devices}
            for name in named_devices(value):
                if name in listed:
                    continue
                try:
                    _devices.append(Device(name, registry.open_device(name)))
                    listed.add(name)
                except Exception as e:  # noqa: BLE001 - a device that cannot open is absent
                    log.warning("%s: %s", DEVICES_ENV, e if isinstance(e, NnhalError) else
                                f"device '{name}': {type(e).__name__}: {e}")
        return list(_devices)
