"""Validation of models and requests against the rules of the HAL text."""

from nnhal.validation.model import (
    ValidationError,
    validate_model,
    validate_preference,
    validate_priority,
)
from nnhal.validation.request import (
    BUFFER_POOL,
    validate_loop_timeout,
    validate_measure,
    validate_request,
)

__all__ = ["BUFFER_POOL", "ValidationError", "validate_loop_timeout",
           "validate_measure", "validate_model", "validate_preference", "validate_priority",
           "validate_request"]
