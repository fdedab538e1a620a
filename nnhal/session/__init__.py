"""A numpy Session over the HAL: prepare a model once, run it with arrays by name.

Importing this package imports what opening a default Session uses: the Session cache, the
runtime and its plans, the drivers the registry builds in, the service discovery the device
listing asks, and ai-edge-litert's interpreter when it is installed (the engine of the LiteRT
device, on which the default Session runs what it can). A Session's open then does the work
of opening, not of importing, as ``from ai_edge_litert.interpreter import Interpreter`` loads
that engine before its ``Interpreter(path)``; ``nnhal`` itself still loads this package only
on first use of ``nnhal.Session``. The Session cache's code fingerprint is computed on a thread
meanwhile (:func:`nnhal.session.cache.fingerprint_early`).
"""

from nnhal.session.cache import fingerprint_early

fingerprint_early()  # on a thread while the rest of this package and its engines load

from nnhal.session.info import TensorInfo  # noqa: E402
from nnhal.session.session import Session, load_model  # noqa: E402

__all__ = ["Session", "TensorInfo", "load_model"]


def _preload() -> None:
    import nnhal.drivers.litert
    import nnhal.drivers.reference
    import nnhal.runtime
    import nnhal.runtime.plan
    import nnhal.service.discovery
    import nnhal.session.cache  # noqa: F401
    from nnhal.drivers.litert.engine import unavailable
    from nnhal.drivers.registry import look_along_path

    unavailable()  # imports ai-edge-litert when it can (a failure is the device's to report)
    look_along_path()  # whether plug-in drivers may be installed, as the imports just looked


_preload()
