"""The interface face a conformance or mutations run reaches its device through (``--hal``).

A face maps a canonical device to the device the modes drive, so that every call of a run
crosses that face and back, with no per-driver code:

- ``1.3``: HAL 1.3, the shape of nnhal's canonical interfaces (callback-style prepare and
  execute), so the device is called as it is; the face carries feature levels up to 4, so a
  case of a later level is skipped for its version whatever the driver could do.
- ``aidl``: the AIDL HAL (v1-v4, feature levels 5-8): :func:`nnhal.aidl.through_aidl`, every
  call turned into the AIDL interfaces' call and back.

Light (standard library and the version scale only): the command line checks ``--hal``
before numpy and the drivers load; :mod:`nnhal.aidl` is imported only when its face is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nnhal.core.version import FeatureLevel

if TYPE_CHECKING:
    from nnhal.hal.interfaces import IDevice

#: The HAL 1.3 face's name is the version's own spelling (``1.3``), the default.
DEFAULT_FACE = str(FeatureLevel.V1_3)
#: The faces ``--hal`` takes, the default first.
FACES = (DEFAULT_FACE, "aidl")
#: The highest feature level each face can carry.
HIGHEST = {DEFAULT_FACE: FeatureLevel.V1_3, "aidl": FeatureLevel.AIDL_V4}
_LABELS = {DEFAULT_FACE: f"{FeatureLevel.V1_3.label} (nnhal's canonical interfaces, called "
                         "directly)",
           "aidl": "AIDL HAL (nnhal.aidl.through_aidl: every call crosses the AIDL interfaces)"}


def describe(face: str) -> str:
    """For reports: what ``--hal <face>`` puts between the runner and the device."""
    return _LABELS[face]


def problem(face: str) -> str | None:
    """None when ``face`` can be used here, else why not (one line)."""
    if face not in FACES:
        return f"unknown face {face!r}; --hal takes {', '.join(FACES)}"
    if face == "aidl":
        try:
            import nnhal.aidl  # noqa: F401 - only whether it loads
        except ImportError as e:
            return f"the AIDL face is not available (nnhal.aidl: {e})"
    return None


def through(face: str | None, device: IDevice) -> IDevice:
    """``device`` as the modes drive it through ``face`` (None: the device itself). The
    result keeps the device's ``name``, by which the runtime modes name it."""
    if face is None or face == DEFAULT_FACE:
        return device
    if face != "aidl":
        raise ValueError(problem(face))
    from nnhal.aidl import through_aidl

    faced = through_aidl(device)
    name = getattr(device, "name", None)
    if name is not None and getattr(faced, "name", None) is None:
        try:
            faced.name = name  # type: ignore[attr-defined]
        except AttributeError:  # a wrapper with slots: the runtime names it by its type
            pass
    return faced


def level_through(face: str | None, level: FeatureLevel) -> FeatureLevel:
    """The feature level a device of ``level`` has when reached through ``face``."""
    return level if face is None else min(level, HIGHEST[face])


def library_name(face: str | None, name: str) -> str:
    """The name under which ``libneuralnetworks.so`` opens device ``name`` through ``face``
    (mode capi: the library's runtime opens its devices by name from the registry, in this
    process): ``name`` itself for the HAL 1.3 face, else ``name@face``, registered here as
    the device opened by name and wrapped by :func:`through`."""
    if face is None or face == DEFAULT_FACE:
        return name
    from nnhal.drivers import registry

    # A driver's own name is nnhal-<registry name> (as the library matches them).
    base = name if name in registry.device_names() or name.startswith("remote:") else \
        name.removeprefix("nnhal-")
    faced = f"{base}@{face}"
    if faced not in registry.device_names():
        registry.register(faced, lambda: through(face, registry.open_device(base)),
                          lambda: registry.reason(base) or problem(face))
    return faced
