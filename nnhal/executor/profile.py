"""Per-operation profiling of executions (``nnhal bench --profile``).

Off by default and free then: the executor chooses a separate, timed run loop once per run
when :data:`ACTIVE` is set (never a test per kernel on the lean path), the runtime times
each step of a partitioned plan, and a driver without per-operation times (LiteRT: the
Python API of ai-edge-litert exposes no op profiler) records its whole run. One profile is
collected at a time, for executions run one after another (what a benchmark does).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

#: The profile being collected, or None (no profiling: the lean paths run).
ACTIVE: Profile | None = None


@dataclass
class Profile:
    """What the profiled executions recorded, in seconds, keyed by the runtime's step (0 for
    a model on one device) and the operation's index in the whole model's main subgraph."""

    #: (step, operation index) -> [operation type, seconds over every run, times run].
    operations: dict[tuple[int, int], list] = field(default_factory=dict)
    #: step -> (device name, seconds over every run) as the runtime timed the step.
    steps: dict[int, tuple[str, float]] = field(default_factory=dict)
    #: step -> seconds a driver without per-operation times spent in its runs.
    driver: dict[int, float] = field(default_factory=dict)
    _step: int = 0
    #: Step-local operation index -> whole-model index (None: the identity); ``_nested``
    #: suppresses what runs inside a step the runtime runs itself (IF/WHILE bodies).
    _map: Sequence[int] | None = None
    _nested: int = 0

    def operation(self, index: int, op_type: str, seconds: float) -> None:
        """An operation of the running (sub-)model ran in ``seconds`` (a driver calls this)."""
        if self._nested:
            return
        if self._map is not None:
            if not 0 <= index < len(self._map):
                return
            index = self._map[index]
        entry = self.operations.get((self._step, index))
        if entry is None:
            self.operations[(self._step, index)] = [op_type, seconds, 1]
        else:
            entry[1] += seconds
            entry[2] += 1

    def whole_run(self, seconds: float) -> None:
        """A driver that cannot time its operations ran its model in ``seconds``."""
        if not self._nested:
            self.driver[self._step] = self.driver.get(self._step, 0.0) + seconds

    def enter_step(self, step: int, operations: Sequence[int]) -> bool:
        """The runtime starts step ``step`` (whole-model ``operations``); False (and nothing
        to record) inside a step the runtime runs itself."""
        if self._nested or self._map is not None:
            self._nested += 1
            return False
        self._step, self._map = step, list(operations)
        return True

    def leave_step(self, entered: bool, device: str, seconds: float) -> None:
        if not entered:
            self._nested -= 1
            return
        _, before = self.steps.get(self._step, (device, 0.0))
        self.steps[self._step] = (device, before + seconds)
        self._step, self._map = 0, None


@contextmanager
def profiling() -> Iterator[Profile]:
    """Collect a profile of the executions run inside the block."""
    global ACTIVE
    if ACTIVE is not None:
        raise RuntimeError("a profile is being collected already")
    ACTIVE = Profile()
    try:
        yield ACTIVE
    finally:
        ACTIVE = None
