"""Drivers as services: a driver served on a Unix socket (``nnhal serve``), reached through
:class:`~nnhal.service.client.RemoteDevice`, over the wire format of docs/wire.md.

Devices named ``remote:PATH`` (a socket) or ``remote:NAME`` (a service registered in the
runtime directory) are opened through :func:`open_remote`; the driver registry loads this
package for those names only.
"""

from __future__ import annotations

from nnhal.service.discovery import open_remote, remote_names, remote_reason

__all__ = ["open_remote", "remote_names", "remote_reason"]
