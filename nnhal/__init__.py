"""nnhal: the Android Neural Networks HAL 1.3 in Python, with a numpy Session on top.

``nnhal.Session``, ``nnhal.TensorInfo`` and the runtime's classes (``nnhal.Model``,
``nnhal.Compilation``...) are loaded on first use, so that importing any lower layer
(``nnhal.hal``, ``nnhal.errors``...) does not import every driver.
"""

from typing import Any

from nnhal.errors import (
    ExecutionError,
    InputError,
    InvalidModelError,
    ModelFileError,
    NdkError,
    NnhalError,
    UnsupportedModelError,
)

__all__ = ["Burst", "Compilation", "Event", "Execution", "ExecutionError", "InputError",
           "InvalidModelError", "Memory", "MemoryDesc", "Model", "ModelFileError", "NdkError",
           "NnhalError", "Session", "TensorInfo", "UnsupportedModelError"]

#: The NNAPI runtime's classes (nnhal.runtime), loaded on first use.
_RUNTIME = ("Burst", "Compilation", "Event", "Execution", "Memory", "MemoryDesc", "Model")


def __getattr__(name: str) -> Any:
    if name in ("Session", "TensorInfo"):
        from nnhal import session

        return getattr(session, name)
    if name in _RUNTIME:
        from nnhal import runtime

        # nnhal.Model: the NDK's ANeuralNetworksModel (nnhal.runtime.NdkModel), not the HAL's
        # model structure (nnhal.hal.types.Model).
        return getattr(runtime, "NdkModel" if name == "Model" else name)
    raise AttributeError(f"module 'nnhal' has no attribute {name!r}")
