"""The reference CPU driver."""

from nnhal.drivers.reference.device import ReferenceDevice
from nnhal.drivers.reference.prepared_model import ReferencePreparedModel

__all__ = ["ReferenceDevice", "ReferencePreparedModel"]
