"""Notifying client callbacks: a client's exception never escapes into the driver, and a
callback that more than one path may complete is notified exactly once."""

from __future__ import annotations

import threading

from nnhal.hal.interfaces import IExecutionCallback, IPreparedModel, IPreparedModelCallback
from nnhal.hal.types import ErrorStatus, OutputShape, Timing


def notify_prepared(callback: IPreparedModelCallback, status: ErrorStatus,
                    prepared: IPreparedModel | None) -> None:
    """``callback.notify(status, prepared)``, swallowing the client's exceptions."""
    try:
        callback.notify(status, prepared)
    except Exception:  # noqa: BLE001 - a failing client callback must not kill the driver
        pass


def notify_execution(callback: IExecutionCallback, status: ErrorStatus,
                     shapes: list[OutputShape], timing: Timing) -> None:
    """``callback.notify(status, shapes, timing)``, swallowing the client's exceptions."""
    try:
        callback.notify(status, shapes, timing)
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
