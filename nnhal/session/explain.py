"""Why a driver refused a model, in words: the HAL carries only a status.

Called only after a preparation failed, so a model that prepares pays nothing for it: the
shared analysis then finds the validation message (naming the operand or operation), or the
device's getSupportedOperations names the operations it cannot run.
"""

from __future__ import annotations

from nnhal.analysis import analyse
from nnhal.hal.interfaces import IDevice
from nnhal.hal.types import ErrorStatus, Model, OperationType, is_extension_type
from nnhal.ops.extensions import operation_name
from nnhal.ops.resolver import OpError
from nnhal.validation import ValidationError


def _op_name(t: int) -> str:
    try:
        return OperationType(t).name
    except ValueError:
        return f"operation type {t}"


def explain_rejection(model: Model, device: IDevice, status: ErrorStatus) -> str:
    """One line saying why ``device`` refused ``model`` with ``status``."""
    try:
        graph = analyse(model, own_constants=False)
    except (ValidationError, OpError) as e:
        return f"invalid model: {e}"
    except Exception as e:  # noqa: BLE001 - a model too broken to analyse still gets a line
        return f"invalid model: {type(e).__name__}: {e}"
    if graph.too_large:
        return f"model too large: {graph.too_large[0]}"
    if graph.too_much_work:
        return f"too much work: {graph.too_much_work}"
    try:
        got, supported = device.get_supported_operations(model)
    except Exception:  # noqa: BLE001 - fall back on what the analysis decided
        got, supported = ErrorStatus.GENERAL_FAILURE, []
    if got != ErrorStatus.NONE or len(supported) != len(model.main.operations):
        supported = list(graph.main.supported)

    def name(k: int) -> str:
        t = model.main.operations[k].type
        if not is_extension_type(t):
            return _op_name(t)
        op = operation_name(t, model.extension_name_to_prefix)
        why = graph.reasons.get((-1, k), "")  # an extension operation the analysis refused
        why = why.removeprefix(f"{op}: ")  # an OpError names the operation already
        return op + (f": {why}" if why else "")

    words: list[str | None] = []
    reasons = getattr(device, "operation_reasons", None)  # a driver of this package says why
    if reasons is not None and not all(supported):
        try:
            words = list(reasons(graph))
        except Exception:  # noqa: BLE001 - the operations named without a reason
            words = []

    def reason_of(k: int) -> str:
        said = words[k] if k < len(words) else None
        if not said:
            return ""
        # LiteRT words its reasons "#k NAME: why"; the operation is named here already.
        return ": " + said.removeprefix(f"#{k} {_op_name(model.main.operations[k].type)}: ")

    missing = [f"operation {k} ({name(k)}){reason_of(k)}"
               for k, ok in enumerate(supported) if not ok]
    if missing:
        return "the device does not support " + ", ".join(missing)
    refusal = getattr(device, "refusal", None)  # a driver of this package says why
    if refusal is not None:
        try:
            why = refusal(graph)
        except Exception:  # noqa: BLE001 - no reason to give: the status alone
            why = None
        if why:
            return f"the device refused the model ({ErrorStatus(status).name}): {why}"
    return f"the device refused the model ({ErrorStatus(status).name})"
