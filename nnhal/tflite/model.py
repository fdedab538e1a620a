"""What an imported .tflite is on the HAL side: the Model, plus what the HAL has no place for
(tensor names, and the resource variables a streaming model keeps between invocations)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from nnhal.hal.types import Model


@dataclass(frozen=True)
class StateVariable:
    """A TFLite resource variable carried across runs as one extra model input (its value
    before this run) and one extra model output (its value after): the HAL has no state."""

    name: str
    #: The value before the first run (from the model's initialisation subgraph, else zeros).
    initial: np.ndarray
    #: Position in ``model.main.inputs`` / ``model.main.outputs``.
    input: int
    output: int


@dataclass(frozen=True)
class ImportedModel:
    model: Model
    #: One name per entry of ``model.main.inputs`` / ``outputs`` (state ones included).
    input_names: list[str]
    output_names: list[str]
    state: list[StateVariable] = field(default_factory=list)
    #: Where it came from (a path or "<bytes>"), for messages.
    source: str = ""
    #: Positions in ``model.main.inputs`` / ``outputs`` of the file's scalars (rank-0
    #: tensors): the HAL holds them as [1] (a tensor operand without dimensions has an
    #: unknown rank), a user feeds and gets them as numpy scalars of shape (), as TFLite does.
    scalar_inputs: tuple[int, ...] = ()
    scalar_outputs: tuple[int, ...] = ()
