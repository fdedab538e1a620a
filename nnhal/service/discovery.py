"""Remote device names for the driver registry: ``remote:PATH`` and ``remote:NAME``.

A name with a ``/`` is a socket path; otherwise the name of a service registered in the
runtime directory (:mod:`nnhal.service.registration`).
"""

from __future__ import annotations

from nnhal.errors import NnhalError
from nnhal.hal.interfaces import IDevice
from nnhal.service import registration

PREFIX = "remote:"


def socket_of(name: str) -> str | None:
    """The socket path a ``remote:`` name designates, or None if no service has that name."""
    target = name[len(PREFIX):] if name.startswith(PREFIX) else name
    if "/" in target:
        return target
    entry = registration.find(target)
    return None if entry is None else entry.socket


def remote_reason(name: str) -> str | None:
    """None when the service answers, else why it cannot be opened (one line)."""
    path = socket_of(name)
    if path is None:
        where = registration.runtime_dir()
        return (f"no service named {name[len(PREFIX):]!r} in {where}" if where is not None
                else f"no service named {name[len(PREFIX):]!r} (no runtime directory: "
                     f"set NNHAL_RUNTIME_DIR or XDG_RUNTIME_DIR, or give remote:PATH)")
    entry = registration.Entry(name, path, 0, "", None)  # type: ignore[arg-type]
    if not entry.alive():
        return f"no service answers at {path}"
    return None


def open_remote(name: str) -> IDevice:
    from nnhal.service.client import RemoteDevice

    path = socket_of(name)
    if path is None:
        raise NnhalError(remote_reason(name) or f"unknown service {name}")
    try:
        return RemoteDevice(path, name)
    except OSError as e:
        raise NnhalError(f"cannot connect to {path}: {e.strerror or e}") from None


def remote_names() -> list[str]:
    """``remote:NAME`` of every registered service (alive or not)."""
    return [PREFIX + e.name for e in registration.services()]
