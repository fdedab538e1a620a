"""HAL 1.3 types and interfaces."""

from nnhal.hal.types import *  # noqa: F401,F403
from nnhal.hal.types import __all__ as _types_all

__all__ = list(_types_all)
