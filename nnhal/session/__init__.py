"""A numpy Session over the HAL: prepare a model once, run it with arrays by name."""

from nnhal.session.info import TensorInfo
from nnhal.session.session import Session, load_model

__all__ = ["Session", "TensorInfo", "load_model"]
