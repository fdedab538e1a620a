"""The devices the runtime sees: every available device of :mod:`nnhal.drivers.registry`,
opened once per process, in registration order (the reference driver first).

A :class:`Device` is ``ANeuralNetworksDevice``: a name, a type, a version string, a feature
level and the driver's IDevice underneath. A caller that already holds an IDevice (the
conformance runner, a test) wraps it with :meth:`Device.of` to compile on exactly that one.

**Death.** A driver may die under the runtime (a served driver whose process is gone). The
runtime knows drivers only through the HAL, so it asks the optional ``alive`` attribute a
driver object may have (:func:`is_dead`); a dead device's DEVICE_UNAVAILABLE becomes the NDK's
DEAD_OBJECT where the runtime cannot recover (see :func:`nnhal.runtime.codes.code_of_status`).
"""

from __future__ import annotations

import threading

from nnhal.errors import NnhalError
from nnhal.hal.interfaces import IDevice
from nnhal.hal.types import Capabilities, DeviceType, ErrorStatus, PerformanceInfo
from nnhal.runtime.codes import RUNTIME_FEATURE_LEVEL, ResultCode, fail


def is_dead(hal: object) -> bool:
    """Whether a driver object says it is dead: its optional ``alive`` attribute is false (a
    driver without one, or whose answer fails, is taken as alive: death is never guessed)."""
    try:
        alive = getattr(hal, "alive", True)
    except Exception:  # noqa: BLE001 - a broken attribute says nothing
        return False
    return alive is False


class Device:
    """ANeuralNetworksDevice: one driver's device as the runtime names it."""

    def __init__(self, name: str, hal: IDevice):
        self.name = name
        self.hal = hal
        status, t = hal.get_type()
        self.type = int(t) if status == ErrorStatus.NONE else 0
        status, version = hal.get_version_string()
        self.version = str(version) if status == ErrorStatus.NONE else ""
        #: Every HAL 1.3 driver is of feature level 4 (Android 11); the NDK of level 5 adds
        #: nothing a 1.3 driver must do, so the runtime reports the level the HAL allows.
        self.feature_level = int(RUNTIME_FEATURE_LEVEL) - 1
        self._capabilities: Capabilities | None = None

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


_lock = threading.Lock()
_devices: list[Device] | None = None


def devices() -> list[Device]:
    """Every available registered device (opened on the first call, kept for the process)."""
    global _devices
    with _lock:
        if _devices is None:
            from nnhal.drivers import registry

            found = []
            for name, why in registry.available().items():
                if why is not None:
                    continue
                try:
                    found.append(Device(name, registry.open_device(name)))
                except (NnhalError, Exception):  # noqa: BLE001 - a broken driver is absent
                    continue
            _devices = found
        return list(_devices)
