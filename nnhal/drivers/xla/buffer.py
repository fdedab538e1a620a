"""The XLA driver's memory domain: an IBuffer whose data is a device array (a ``jax.Array``
on the driver's device, in GPU memory on a GPU).

Every rule, state and check is the common buffer's (:class:`~nnhal.drivers.common.buffer.
BufferCore`: roles, dimensions, initialised state, a failed execution leaving its output
buffers uninitialised); only where the data lives differs:

* an execution's output written to the buffer is the executable's own result, kept on the
  device as it is (no transfer);
* an execution reading the buffer as an input passes that device array to the executable
  as it is (no transfer, no copy);
* ``copyFrom`` moves the host bytes to the device once, ``copyTo`` moves them back.

Device arrays are immutable, so the snapshot rule of the common buffer (every write replaces
the data, readers use the snapshot they took) holds as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from nnhal.drivers.common.buffer import BufferCore
from nnhal.hal.interfaces import IPreparedModel
from nnhal.hal.types import OperandType


class DeviceBufferCore(BufferCore):
    """A memory-domain buffer holding a device array; ``put`` moves a host array to the
    device (the executable's own transfer)."""

    def __init__(self, token: int, operand_type: OperandType, dims: list[int],
                 models: Sequence[IPreparedModel], roles: set[tuple[int, str, int]], *,
                 put: Callable[[np.ndarray], Any]):
        super().__init__(token, operand_type, dims, models, roles)
        self._put = put

    def host(self, data: Any) -> np.ndarray:
        return np.asarray(data)

    def _freeze(self, arr: Any) -> Any:
        if isinstance(arr, np.ndarray):  # copyFrom's bytes: one transfer to the device
            return self._put(super()._freeze(arr))
        return arr  # an execution's output: already a device array (immutable)

    def on_device(self) -> bool:
        """Whether the data is a device array (what the tests check: never a host copy)."""
        data = self.snapshot()
        return data is not None and not isinstance(data, np.ndarray)
