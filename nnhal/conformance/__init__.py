"""Conformance runner for the upstream NNAPI generated test cases."""

from nnhal.conformance.cases import (
    Case,
    build_model,
    build_request,
    default_specs_dir,
    iter_cases,
)
from nnhal.conformance.runner import MODES, Options, Report, run, run_case

__all__ = ["MODES", "Case", "Options", "Report", "build_model", "build_request",
           "default_specs_dir", "iter_cases", "run", "run_case"]
