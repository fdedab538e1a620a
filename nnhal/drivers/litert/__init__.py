"""The LiteRT driver: whole models exported to TFLite and run by ai-edge-litert (XNNPACK).

Importing this package never imports ai-edge-litert; an interpreter is built (and the
package loaded) only when a model is prepared. :func:`unavailable` says why the device
cannot run, or None.
"""

from nnhal.drivers.litert.device import LiteRTDevice
from nnhal.drivers.litert.engine import unavailable
from nnhal.drivers.litert.prepared_model import LiteRTPreparedModel

__all__ = ["LiteRTDevice", "LiteRTPreparedModel", "unavailable"]
