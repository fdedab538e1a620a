"""Execution plans built at prepare time, and the lean per-request run path."""

from nnhal.executor.plan import ModelPlan, RunError, RunState, SubgraphPlan
from nnhal.executor.run import run_request

__all__ = ["RunError", "ModelPlan", "RunState", "SubgraphPlan", "run_request"]
