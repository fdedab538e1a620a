"""Time per operation type inside one process: each step's kernel (or ``into`` kernel) of a
prepared plan wrapped with a clock. For the benchmarks' profiles only; never in the driver."""

from __future__ import annotations

import time
from collections.abc import Callable


def clock_steps(plan: object) -> tuple[dict[str, float], dict[str, int], int]:
    """Wrap every step of ``plan`` (a SubgraphPlan); returns the seconds spent per operation
    type (filled as the plan runs), the step count per type, and how many steps write into
    given outputs."""
    spent: dict[str, float] = {}
    counts: dict[str, int] = {}

    def timed(label: str, fn: Callable) -> Callable:
        clock = time.perf_counter

        def wrapper(*args):
            t0 = clock()
            try:
                return fn(*args)
            finally:
                spent[label] = spent.get(label, 0.0) + clock() - t0
        return wrapper

    into_steps = 0
    for step in plan.steps:  # type: ignore[attr-defined]
        label = step.op_type.name
        counts[label] = counts.get(label, 0) + 1
        if step.into is not None:
            step.into = timed(label, step.into)
            into_steps += 1
        elif step.kernel is not None:
            step.kernel = timed(label, step.kernel)
    return spent, counts, into_steps
