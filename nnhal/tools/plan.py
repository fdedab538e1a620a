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


def refusals(model: Model, compilation: Any) -> dict[int, dict[str, str]]:
    """Main operation index -> {device: why it refuses the operation}, over the devices the
    compilation chose among (a device that cannot say why: its getSupportedOperations
    answer)."""
    from nnhal.runtime.devices import devices as available
    from nnhal.runtime.partition import supported_by

    candidates = compilation.devices if compilation.devices is not None else available()
    support = supported_by(model, candidates)
    out: dict[int, dict[str, str]] = {}
    for dev, flags in zip(candidates, support):
        if all(flags):
            continue
        why = None
        ask = getattr(dev.hal, "refusals", None)
        if callable(ask):
            try:
                why = ask(model)
            except Exception:  # noqa: BLE001 - a driver that cannot say: the flags alone
                why = None
        for k, ok in enumerate(flags):
            if ok:
                continue
            reason = why[k] if why is not None and k < len(why) and why[k] else \
                "getSupportedOperations: not supported"
            prefix = f"#{k} "
            if reason.startswith(prefix) and ": " in reason:  # "#k NAME: why" -> "why"
                reason = reason.split(": ", 1)[1]
            out.setdefault(k, {})[dev.name] = reason
    return out


def placement(steps: Sequence[dict[str, Any]], pinned: bool = False,
              verb: str = "ran on") -> str:
    """Which devices run what, in one line: ``ran on litert (64 operations)`` or ``litert:
    60 operations, reference: 4 (3 steps)``."""
    counts: dict[str, int] = {}
    for s in steps:
        counts[s["device"]] = counts.get(s["device"], 0) + len(s["operations"])
    if len(counts) == 1:
        (device, n), = counts.items()
        return f"{verb} {device} ({operations(n)}" + \
            ("; pinned by --device)" if pinned else ")")
    parts = ", ".join(f"{d}: {operations(n)}" for d, n in counts.items())
    return f"{parts} ({len(steps)} steps)"


def operations(n: int) -> str:
    return f"{n} operation" + ("" if n == 1 else "s")

