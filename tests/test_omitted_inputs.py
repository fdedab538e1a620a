"""Every operation, given an input omitted (lifetime NO_VALUE) where its signature does not
allow it, is INVALID_ARGUMENT at prepare — and where the signature allows it, the omission is
not what refuses the model. One real model per operation: the first upstream case using it."""

from __future__ import annotations

import copy

import pytest

from nnhal.conformance import default_specs_dir, iter_cases
from nnhal.conformance.cases import build_model
from nnhal.hal.interfaces import PreparedModelCallback
from nnhal.hal.types import ErrorStatus, Operand, OperandLifeTime, OperandType, OperationType
from nnhal.ops.catalog import signature
from nnhal.ops.signature import input_slots, omittable_positions

SPECS = default_specs_dir()
pytestmark = pytest.mark.skipif(not SPECS.exists(), reason=f"no conformance data at {SPECS}")


def _first_case_per_operation() -> dict[OperationType, dict]:
    found: dict[OperationType, dict] = {}
    if SPECS.exists():
        for case in iter_cases(SPECS):
            if case.expect_failure:
                continue
            for op in case.data["model"]["main"]["operations"]:
                t = OperationType[op["type"]]
                found.setdefault(t, case.data["model"])
    return found


CASES = _first_case_per_operation()


def _omit(model, k: int, j: int):
    """The model with input ``j`` of main operation ``k`` replaced by an omitted operand."""
    m = copy.copy(model)
    main = m.main = copy.deepcopy(model.main)
    old = main.operands[main.operations[k].inputs[j]]
    old.number_of_consumers -= 1
    main.operands.append(Operand(type=old.type, dimensions=list(old.dimensions),
                                 number_of_consumers=1, scale=old.scale,
                                 zero_point=old.zero_point, lifetime=OperandLifeTime.NO_VALUE,
                                 extra_params=old.extra_params))
    main.operations[k].inputs[j] = len(main.operands) - 1
    return m


def _prepare(device, model) -> ErrorStatus:
    cb = PreparedModelCallback()
    launch = device.prepare_model(model, 1, 1, None, [], [], b"", cb)
    status, _ = cb.wait(30)
    assert cb.calls == 1 and launch == status
    return status


@pytest.mark.parametrize("op", sorted(CASES), ids=lambda o: o.name)
def test_omitted_input_is_invalid_where_not_allowed(device, op):
    model = build_model(CASES[op])
    assert _prepare(device, model) == ErrorStatus.NONE
    for k, operation in enumerate(model.main.operations):
        if operation.type != op:
            continue
        n = len(operation.inputs)
        sig = signature(op)
        assert input_slots(sig, n) is not None
        allowed = omittable_positions(sig, n)
        for j, i in enumerate(operation.inputs):
            if j in allowed or model.main.operands[i].type == OperandType.SUBGRAPH:
                continue
            assert _prepare(device, _omit(model, k, j)) == ErrorStatus.INVALID_ARGUMENT, \
                f"{op.name} input {j} omitted was accepted"
        break
