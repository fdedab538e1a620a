"""Execution plans built at prepare time, and the lean per-request run path."""

from nnhal.executor.plan import ExecutionError, ModelPlan, RunState, SubgraphPlan
from nnhal.executor.run import run_request

__all__ = ["ExecutionError", "ModelPlan", "RunState", "SubgraphPlan", "run_request"]
