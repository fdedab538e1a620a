"""The XLA driver (``nnhal[xla]``): whole models lowered to JAX and compiled ahead of time by
XLA, on a GPU when JAX finds one, else on the CPU.

Importing this package never imports JAX; the device loads it when opened.
:func:`unavailable` says why the device cannot run, or None.
"""

from nnhal.drivers.xla.device import XlaDevice
from nnhal.drivers.xla.engine import unavailable
from nnhal.drivers.xla.prepared_model import XlaPreparedModel

__all__ = ["XlaDevice", "XlaPreparedModel", "unavailable"]
