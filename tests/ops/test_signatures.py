"""Operation signatures: every declaration is well formed, and the generic check enforces
counts, types, omission and constancy before an operation's own rules run."""

from __future__ import annotations

import pytest

from nnhal.hal.types import OperandLifeTime, OperandType, OperationType
from nnhal.ops.catalog import SIGNATURES, check_operation, lookup
from nnhal.ops.resolver import OpContext, OperandInfo, OpError
from nnhal.ops.signature import ANY, declaration_problems, input_slots

T = OperandType
L = OperandLifeTime


@pytest.mark.parametrize("op", sorted(SIGNATURES), ids=lambda o: o.name)
def test_declaration_is_well_formed(op):
    assert declaration_problems(SIGNATURES[op]) == []


def _infos(op: OperationType, form_index: int) -> tuple[list[OperandInfo], list[OperandInfo]]:
    """Operands fitting the first variant of one form: every slot present once."""
    sig = SIGNATURES[op]
    binding = sig.variants[0].types

    def info(slot, lifetime):
        t = slot.type
        if t == ANY:
            t = T.TENSOR_FLOAT32
        elif isinstance(t, str):
            t = binding[t]
        elif isinstance(t, tuple):
            t = t[0]
        if slot.const:
            lifetime = L.CONSTANT_COPY
        return OperandInfo(type=t, shape=() if t.is_scalar else None, lifetime=lifetime)

    form = sig.forms[form_index]
    ins = [info(s, L.SUBGRAPH_INPUT) for s in form.inputs]
    outs = [info(s, L.SUBGRAPH_OUTPUT) for s in sig.outputs]
    return ins, outs


def _cases():
    for op, sig in sorted(SIGNATURES.items()):
        for f, form in enumerate(sig.forms):
            slots = input_slots(sig, len(form.inputs))
            for k, slot in enumerate(form.inputs):
                if not slot.omittable and slots is not None:
                    yield pytest.param(op, f, k, id=f"{op.name}-{form.name or 'in'}-{k}")


@pytest.mark.parametrize("op,form,k", list(_cases()))
def test_omitted_where_not_allowed_is_invalid(op, form, k):
    ins, outs = _infos(op, form)
    ins[k].lifetime = L.NO_VALUE
    ctx = OpContext(op_type=op, inputs=ins, outputs=outs)
    with pytest.raises(OpError, match="cannot be omitted|must be a constant|expected"):
        check_operation(lookup(op), ctx)


def test_wrong_count_and_type_are_named():
    ins, outs = _infos(OperationType.ADD, 0)
    ctx = OpContext(op_type=OperationType.ADD, inputs=ins[:2], outputs=outs)
    with pytest.raises(OpError, match="ADD: expected 3 inputs, got 2"):
        check_operation(lookup(OperationType.ADD), ctx)
    ins[1] = OperandInfo(type=T.TENSOR_INT32, shape=None)
    ctx = OpContext(op_type=OperationType.ADD, inputs=ins, outputs=outs)
    with pytest.raises(OpError, match=r"ADD: input 1 \(input1\) has type TENSOR_INT32"):
        check_operation(lookup(OperationType.ADD), ctx)


def test_remembered_answers_are_the_answers():
    """check() remembers its answers by operand types and lifetimes: asked again, with the same
    or other operand objects, it answers the same (a level, or the same SignatureError)."""
    from types import SimpleNamespace

    from nnhal.ops.signature import SignatureError, check

    sig = SIGNATURES[OperationType.ADD]
    T, L = OperandType, OperandLifeTime

    def ops(*specs):
        return [SimpleNamespace(type=t, lifetime=lt) for t, lt in specs]

    good = ops((T.TENSOR_FLOAT32, L.SUBGRAPH_INPUT), (T.TENSOR_FLOAT32, L.CONSTANT_COPY),
               (T.INT32, L.CONSTANT_COPY))
    bad = ops((T.TENSOR_FLOAT32, L.SUBGRAPH_INPUT), (T.TENSOR_INT32, L.CONSTANT_COPY),
              (T.INT32, L.CONSTANT_COPY))
    out = ops((T.TENSOR_FLOAT32, L.SUBGRAPH_OUTPUT))
    first = check(sig, good, out)
    assert check(sig, ops(*[(i.type, i.lifetime) for i in good]), out) == first
    messages = []
    for _ in range(2):
        with pytest.raises(SignatureError) as e:
            check(sig, bad, out)
        messages.append(str(e.value))
    assert messages[0] == messages[1] and "input 1" in messages[0]
    # The same types with another lifetime: an input left out, refused as before.
    omitted = ops((T.TENSOR_FLOAT32, L.NO_VALUE), *[(i.type, i.lifetime) for i in good[1:]])
    for _ in range(2):
        with pytest.raises(SignatureError, match="omitted"):
            check(sig, omitted, out)
    assert check(sig, good, out) == first
