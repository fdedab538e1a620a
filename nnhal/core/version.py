"""One ordered scale of NNAPI versions: feature levels 1-8.

HIDL HAL 1.0-1.3 are feature levels 1-4 and the AIDL HAL v1-v4 are 5-8. Each level has
several spellings that the outside world uses (the NDK's ``ANEURALNETWORKS_FEATURE_LEVEL_N``
values, the interface's name, the conformance cases' ``minSupportedVersion``, the HAL's
``1.2``); they all live here, so a version is compared and converted in one place and adding a
level is one new member.

Members compare by level with each other only: comparing with an int (an NDK value or a level
number) is a TypeError rather than a silently wrong answer.
"""

from __future__ import annotations

import enum
from typing import NamedTuple


class UnknownVersion(ValueError):
    """A spelling or NDK value that names no feature level."""


class _Facts(NamedTuple):
    level: int
    ndk: int
    interface: str
    text: str
    label: str


_HIDL = "android.hardware.neuralnetworks@"
_AIDL = "android.hardware.neuralnetworks-V"


class FeatureLevel(enum.Enum):
    """A feature level; the member's name is the conformance cases' spelling (``V1_2``)."""

    V1_0 = _Facts(1, 27, _HIDL + "1.0", "1.0", "HAL 1.0")
    V1_1 = _Facts(2, 28, _HIDL + "1.1", "1.1", "HAL 1.1")
    V1_2 = _Facts(3, 29, _HIDL + "1.2", "1.2", "HAL 1.2")
    V1_3 = _Facts(4, 30, _HIDL + "1.3", "1.3", "HAL 1.3")
    AIDL_V1 = _Facts(5, 31, _AIDL + "1", "AIDL v1", "AIDL v1")
    AIDL_V2 = _Facts(6, 1000006, _AIDL + "2", "AIDL v2", "AIDL v2")
    AIDL_V3 = _Facts(7, 1000007, _AIDL + "3", "AIDL v3", "AIDL v3")
    AIDL_V4 = _Facts(8, 1000008, _AIDL + "4", "AIDL v4", "AIDL v4")

    @property
    def level(self) -> int:
        """The feature level, 1-8 (``ANEURALNETWORKS_FEATURE_LEVEL_<level>``)."""
        return self.value.level

    @property
    def ndk(self) -> int:
        """The NDK's value for this level (what ``getFeatureLevel`` returns)."""
        return self.value.ndk

    @property
    def interface(self) -> str:
        """The driver interface of this level (HIDL package or AIDL library)."""
        return self.value.interface

    @property
    def aidl_version(self) -> int | None:
        """The AIDL interface version of this level (``getInterfaceVersion()``), None for HIDL."""
        head, sep, tail = self.value.interface.rpartition("-V")
        return int(tail) if sep else None

    @property
    def label(self) -> str:
        """For people: ``HAL 1.3``, ``AIDL v2``."""
        return self.value.label

    @property
    def spelling(self) -> str:
        """The conformance cases' ``minSupportedVersion`` spelling."""
        return self.name

    def __str__(self) -> str:
        """The HAL's own spelling: ``1.2`` (what the operation reference prints), ``AIDL v2``."""
        return self.value.text

    def describe(self) -> str:
        """For messages: ``feature level 4 (HAL 1.3)``, ``feature level 6 (AIDL v2)``."""
        return f"feature level {self.level} ({self.label})"

    # Comparisons read each member's facts directly (``_value_``, the enum's own slot): the
    # ``level`` property costs two Python calls a side, and an analysis compares a level per
    # operation.
    def __lt__(self, other: object) -> bool:
        if not isinstance(other, FeatureLevel):
            return NotImplemented
        return self._value_.level < other._value_.level

    def __le__(self, other: object) -> bool:
        if not isinstance(other, FeatureLevel):
            return NotImplemented
        return self._value_.level <= other._value_.level

    def __gt__(self, other: object) -> bool:
        if not isinstance(other, FeatureLevel):
            return NotImplemented
        return self._value_.level > other._value_.level

    def __ge__(self, other: object) -> bool:
        if not isinstance(other, FeatureLevel):
            return NotImplemented
        return self._value_.level >= other._value_.level

    def __repr__(self) -> str:
        return f"<FeatureLevel.{self.name}: {self.level}>"

    @classmethod
    def parse(cls, spelling: object) -> FeatureLevel:
        """The level a spelling names: ``V1_2``, ``AIDL_V2``, ``1.2``, ``HAL 1.2``, ``AIDL v2``
        or the interface name; anything else (including a non-string) raises UnknownVersion."""
        if isinstance(spelling, str):
            found = _BY_SPELLING.get(spelling.strip())
            if found is not None:
                return found
        known = ", ".join(m.name for m in cls)
        raise UnknownVersion(f"unknown NNAPI version {spelling!r} (known: {known})")

    @classmethod
    def of_level(cls, level: object) -> FeatureLevel:
        """The member of feature level ``level`` (1-8)."""
        found = _BY_LEVEL.get(level) if _is_int(level) else None
        if found is None:
            raise UnknownVersion(f"no feature level {level!r} (known: 1 to {len(_BY_LEVEL)})")
        return found

    @classmethod
    def from_ndk(cls, value: object) -> FeatureLevel:
        """The member whose NDK value is ``value`` (27-31, 1000006-1000008)."""
        found = _BY_NDK.get(value) if _is_int(value) else None
        if found is None:
            known = ", ".join(str(m.ndk) for m in cls)
            raise UnknownVersion(f"{value!r} is no NDK feature level (known: {known})")
        return found

    @classmethod
    def of_aidl(cls, version: object) -> FeatureLevel:
        """The member of AIDL interface version ``version`` (1-4)."""
        found = _BY_AIDL.get(version) if _is_int(version) else None
        if found is None:
            raise UnknownVersion(f"no AIDL interface version {version!r} "
                                 f"(known: {', '.join(map(str, _BY_AIDL))})")
        return found

    @classmethod
    def latest(cls) -> FeatureLevel:
        return max(cls)


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


_BY_SPELLING: dict[str, FeatureLevel] = {}
for _m in FeatureLevel:
    for _s in (_m.name, str(_m), _m.label, _m.interface):
        _BY_SPELLING[_s] = _m
_BY_LEVEL = {m.level: m for m in FeatureLevel}
_BY_NDK = {m.ndk: m for m in FeatureLevel}
_BY_AIDL = {m.aidl_version: m for m in FeatureLevel if m.aidl_version is not None}
del _m, _s
