"""The XLA driver (``nnhal[xla]``): whole models lowered to JAX and compiled ahead of time by
XLA, on a GPU when JAX finds one, else on the CPU.

Importing this package never imports JAX; the device loads it when opened.
:func:`unavailable` says why the device cannot run, or None.
"""

from nnhal.drivers.xla import quantized as _quantized

_quantized.register()  # before anything reads the lowerings' table

from nnhal.drivers.xla.device import XlaDevice  # noqa: E402
from nnhal.drivers.xla.engine import unavailable  # noqa: E402
from nnhal.drivers.xla.prepared_model import XlaPreparedModel  # noqa: E402

__all__ = ["XlaDevice", "XlaPreparedModel", "unavailable"]
