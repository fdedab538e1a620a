"""Notifying prepare callbacks: a client's exception never escapes into the driver, and a
callback that more than one path may complete is notified exactly once. (The HIDL face's
execution callback is notified by :mod:`nnhal.hidl`.)"""

from __future__ import annotations

import threading

from nnhal.hal.interfaces import IPreparedModel, IPreparedModelCallback
from nnhal.hal.types import ErrorStatus


def notify_prepared(callback: IPreparedModelCallback, status: ErrorStatus,
                    prepared: IPreparedModel | None) -> None:
    """``callback.notify(status, prepared)``, swallowing the client's exceptions."""
    try:
        callback.notify(status, prepared)
    except Exception:  # noqa: BLE001 - a failing client callback must not kill the driver
        pass


class NotifyOnce:
    """Notifies an IPreparedModelCallback at most once, swallowing client exceptions."""

    def __init__(self, callback: IPreparedModelCallback):
        self.callback = callback
        self.done = False
        self.lock = threading.Lock()

    def __call__(self, status: ErrorStatus, prepared: IPreparedModel | None = None) -> None:
        with self.lock:
            if self.done:
                return
            self.done = True
        notify_prepared(self.callback, status, prepared)
