"""The runtime's partition of a model, for ``nnhal info --plan`` and ``nnhal view``: which
device runs each operation when the model is compiled through :mod:`nnhal.runtime` over the
named devices (every available one by default)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nnhal.errors import NdkError, NnhalError
from nnhal.hal.types import Model
from nnhal.runtime.codes import PreferenceCode

PREFERENCES = {"fast": PreferenceCode.FAST_SINGLE_ANSWER,
               "sustained": PreferenceCode.SUSTAINED_SPEED,
               "low-power": PreferenceCode.LOW_POWER}


def compile_plan(model: Model, device_names: Sequence[str] | None = None,
                 preference: str = "fast") -> tuple[list[dict[str, Any]], Any]:
    """(the steps, the finished Compilation; the caller frees it). NnhalError with the
    reason when the model cannot be compiled on those devices."""
    from nnhal.drivers.registry import open_device
    from nnhal.runtime import Compilation, Device
    from nnhal.runtime import NdkModel as RuntimeModel

    try:
        rt = RuntimeModel.from_hal(model)
        devs = None
        if device_names:
            devs = [Device(n, open_device(n)) for n in device_names]
        c = Compilation(rt, devs)
        c.set_preference(int(PREFERENCES[preference]))
        c.finish()
    except NdkError as e:
        raise NnhalError(f"the runtime cannot compile the model: {e}") from None
    return c.plan(), c


def operation_devices(steps: Sequence[dict[str, Any]]) -> dict[int, str]:
    """Main-subgraph operation index -> the device of its step."""
    return {k: s["device"] for s in steps for k in s["operations"]}
