"""nnhal: the Android Neural Networks HAL 1.3 in Python, with a numpy Session on top.

``nnhal.Session`` and ``nnhal.TensorInfo`` are loaded on first use, so that importing any
lower layer (``nnhal.hal``, ``nnhal.errors``...) does not import every driver.
"""

from typing import Any

from nnhal.errors import (
    ExecutionError,
    InputError,
    InvalidModelError,
    ModelFileError,
    NnhalError,
    UnsupportedModelError,
)

__all__ = ["ExecutionError", "InputError", "InvalidModelError", "ModelFileError",
           "NnhalError", "Session", "TensorInfo", "UnsupportedModelError"]


def __getattr__(name: str) -> Any:
    if name in ("Session", "TensorInfo"):
        from nnhal import session

        return getattr(session, name)
    raise AttributeError(f"module 'nnhal' has no attribute {name!r}")
