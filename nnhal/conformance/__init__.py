"""Conformance runner for the upstream NNAPI generated test cases.

The names below load their modules (and numpy and the HAL types with them) on first use, so
that light modules of the package, such as :mod:`.specs` and :mod:`.cliutil`, can be imported
on their own.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nnhal.conformance.cases import (
        Case,
        build_model,
        build_request,
        default_specs_dir,
        iter_cases,
    )
    from nnhal.conformance.runner import MODES, Options, Report, run, run_case

_WHERE = {
    "Case": "cases", "build_model": "cases", "build_request": "cases",
    "default_specs_dir": "specs", "iter_cases": "cases",
    "MODES": "runner", "Options": "runner", "Report": "runner", "run": "runner",
    "run_case": "runner",
}

__all__ = ["MODES", "Case", "Options", "Report", "build_model", "build_request",
           "default_specs_dir", "iter_cases", "run", "run_case"]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"nnhal.conformance.{module}"), name)
    globals()[name] = value
    return value
