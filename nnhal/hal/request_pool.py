"""What a request pool is once a driver has resolved it: bytes of a shared memory, or a
driver-allocated buffer of a memory domain (a token in the request).

:class:`RequestBuffer` is the buffer as request checking and the executor see it, whatever
driver allocated it: request checking asks whether this request may use it and tells it how an
execution ended; the executor reads inputs from it and writes outputs to it. Drivers and the
executor type against this protocol, never against a driver's own buffer class.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, TypeAlias

import numpy as np

from nnhal.hal.interfaces import IPreparedModel
from nnhal.hal.types import ErrorStatus, Request


class RequestBuffer(Protocol):
    """A driver-allocated buffer used as a request pool."""

    def check_request_use(self, prepared_model: IPreparedModel, request: Request) -> None:
        """Validation time: raise ValidationError when ``request`` on ``prepared_model`` may
        not use this buffer (freed, wrong model or role, incompatible dimensions)."""

    def after_execution(self, prepared_model: IPreparedModel, request: Request,
                        status: ErrorStatus) -> None:
        """Called once after every execution that used the buffer, with its status."""

    def read_input(self, info: Any, shape: Sequence[int]) -> np.ndarray:
        """Execution time: the data of an input (``info`` describes the model's operand);
        raises the executor's RunError when there is none to give."""

    def can_hold(self, arr: np.ndarray) -> bool:
        """Whether an output of ``arr``'s shape fits (may raise RunError instead)."""

    def write_output(self, arr: np.ndarray) -> None:
        """Store an output."""


#: A resolved request pool: the uint8 bytes of a shared memory, or a driver buffer.
RequestPool: TypeAlias = np.ndarray | RequestBuffer
