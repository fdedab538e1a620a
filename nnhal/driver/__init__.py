"""The reference CPU driver."""

from nnhal.driver.device import ReferenceDevice
from nnhal.driver.prepared_model import ReferencePreparedModel

__all__ = ["ReferenceDevice", "ReferencePreparedModel"]
