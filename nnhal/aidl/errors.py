"""AIDL's failure conventions in Python.

A binder call either returns its AIDL return value (out-parameters after it, as a tuple) or
fails with an exception: a driver's failure is a service-specific exception carrying an
``ErrorStatus`` (:class:`ServiceSpecificError`), and a peer that died is a dead-object
transaction error (:class:`DeadObjectError`), which the canonical core calls
``ErrorStatus.DEAD_OBJECT``. Nothing else may cross an AIDL call of this package.
"""

from __future__ import annotations

from nnhal.hal.types import ErrorStatus

__all__ = ["ServiceSpecificError", "DeadObjectError", "invalid", "raise_status"]


class ServiceSpecificError(Exception):
    """AIDL's ServiceSpecificException: the call failed with ``status`` (never NONE or
    DEAD_OBJECT, which are no AIDL ErrorStatus values)."""

    def __init__(self, status: ErrorStatus, message: str = ""):
        self.status = ErrorStatus(status)
        self.message = message
        super().__init__(f"{self.status.name}: {message}" if message else self.status.name)


class DeadObjectError(Exception):
    """The process behind the interface died (binder's DEAD_OBJECT)."""


def invalid(message: str) -> ServiceSpecificError:
    """The error of a bad argument."""
    return ServiceSpecificError(ErrorStatus.INVALID_ARGUMENT, message)


def raise_status(status: ErrorStatus, message: str = "") -> None:
    """Raise what a canonical failure ``status`` is on the AIDL face (nothing for NONE)."""
    if status == ErrorStatus.NONE:
        return
    if status == ErrorStatus.DEAD_OBJECT:
        raise DeadObjectError(message or "the driver died")
    raise ServiceSpecificError(status, message)
