"""The memory-domain token registry of a device: which driver buffer a request's token names.

Tokens are uint32 on the wire and 0 means "no buffer". A device owns one registry; ``allocate``
registers each new buffer, request checking looks tokens up, and a buffer's handle releases
its token when the client drops it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

#: The largest token (uint32).
MAX_TOKEN = 2**32 - 1

B = TypeVar("B")


class TokenRegistryFull(Exception):
    """Every token is in use."""


class TokenRegistry(Generic[B]):
    """Thread-safe map of positive tokens to buffers; tokens are handed out round robin, so a
    released token is not reused before all others have been."""

    def __init__(self) -> None:
        self._buffers: dict[int, B] = {}
        self._lock = threading.Lock()
        self._last = 0

    def register(self, make: Callable[[int], B]) -> tuple[int, B]:
        """A new token and the buffer ``make(token)`` returns, which the token then names;
        raises TokenRegistryFull when no token is free (``make`` is not called then)."""
        with self._lock:
            last = self._last
            for _ in range(len(self._buffers) + 1):
                last = last % MAX_TOKEN + 1
                if last not in self._buffers:
                    buffer = make(last)
                    self._last = last
                    self._buffers[last] = buffer
                    return last, buffer
        raise TokenRegistryFull("no free buffer token")

    def lookup(self, token: int) -> B | None:
        """The buffer ``token`` names, or None."""
        with self._lock:
            return self._buffers.get(int(token))

    def release(self, token: int) -> B | None:
        """Forget ``token``; returns the buffer it named, or None if it named none."""
        with self._lock:
            return self._buffers.pop(token, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._buffers)
