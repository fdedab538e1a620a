"""The AIDL NNAPI HAL (android.hardware.neuralnetworks v1-v4) as a face of the canonical core.

``AidlDevice(device)`` serves any canonical :class:`nnhal.hal.IDevice` through the AIDL
interfaces; ``from_aidl(aidl_device)`` makes a driver written against the AIDL interfaces a
canonical device; ``through_aidl(device)`` sends every call of a canonical device across the
AIDL face and back. AIDL's conventions in Python: :mod:`nnhal.aidl.errors`.
"""

from nnhal.aidl.adapted import from_aidl, through_aidl
from nnhal.aidl.errors import DeadObjectError, ServiceSpecificError
from nnhal.aidl.interfaces import (
    VERSION,
    IBuffer,
    IBurst,
    IDevice,
    IExecution,
    IFencedExecutionCallback,
    IPreparedModel,
    IPreparedModelCallback,
)
from nnhal.aidl.served import AidlDevice
from nnhal.aidl.types import *  # noqa: F403
from nnhal.aidl.types import __all__ as _types_all

__all__ = [*_types_all, "VERSION", "AidlDevice", "DeadObjectError", "IBuffer", "IBurst",
           "IDevice", "IExecution", "IFencedExecutionCallback", "IPreparedModel",
           "IPreparedModelCallback", "ServiceSpecificError", "from_aidl", "through_aidl"]
