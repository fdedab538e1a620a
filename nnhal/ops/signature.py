"""Operation signatures: what each operation accepts, declared once as data.

Each operation family module exports ``SIGNATURES``, one :class:`Signature` per operation it
defines. The declaration is read by model validation (counts, types, omitted and constant
inputs are checked here, before the operation's own ``validate`` sees the operands), by the
mutation generator, by ``nnhal ops`` and ``docs/operations.md``, and by importers that need to
know what a slot means. Kernels are not part of it, so any backend can run the same operation.

A signature lists its inputs as one or more *forms* (CONV_2D has an explicit-padding and an
implicit-padding form) and its outputs. Slot types are either concrete operand types or the
name of a *type variable*; each :class:`Variant` binds every variable to one operand type and
says since which feature level that configuration exists.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter

from nnhal.core.version import FeatureLevel
from nnhal.hal.types import OperandLifeTime, OperandType, OperationType

T = OperandType


#: Short names for the signature tables, the scale's own members.
V1_0, V1_1, V1_2, V1_3 = (FeatureLevel.V1_0, FeatureLevel.V1_1, FeatureLevel.V1_2,
                          FeatureLevel.V1_3)

#: A slot's type: a type variable bound by the variant, a concrete type, a set of types, or
#: ``ANY`` (control flow operands take whatever the referenced subgraph declares). An
#: extension's signatures may also name its operand types (``nnhal.ops.extensions``).
SlotType = str | OperandType | tuple[OperandType, ...]
ANY = "*"


@dataclass(frozen=True, slots=True)
class Slot:
    """One input or output position.

    ``optional``: a trailing input the operation may be given without (fewer inputs);
    ``omittable``: may be an operand of lifetime NO_VALUE; ``const``: must be a constant;
    ``repeated``: this slot stands for ``at_least`` or more consecutive operands;
    ``since``: the feature level that added the slot (trailing optional inputs).
    """

    name: str
    type: SlotType
    optional: bool = False
    omittable: bool = False
    const: bool = False
    repeated: bool = False
    at_least: int = 1
    since: FeatureLevel = V1_0
    doc: str = ""


@dataclass(frozen=True, slots=True)
class Form:
    """One accepted input list."""

    name: str
    inputs: tuple[Slot, ...]

    def counts(self) -> tuple[int, int | None]:
        """(fewest, most) inputs of this form; most is None when a slot repeats."""
        fewest = 0
        most: int | None = 0
        for s in self.inputs:
            if s.repeated:
                fewest += s.at_least
                most = None
            elif not s.optional:
                fewest += 1
                most = None if most is None else most + 1
            elif most is not None:
                most += 1
        return fewest, most


@dataclass(frozen=True, slots=True)
class Variant:
    """A supported type configuration: every type variable bound, and since when."""

    types: Mapping[str, OperandType]
    since: FeatureLevel = V1_0


@dataclass(frozen=True)
class Signature:
    """Everything an operation accepts, as data (see the module docstring)."""

    op: OperationType
    forms: tuple[Form, ...]
    outputs: tuple[Slot, ...]
    variants: tuple[Variant, ...] = (Variant({}),)
    doc: str = ""

    @property
    def since(self) -> FeatureLevel:
        return min(v.since for v in self.variants)


def sig(op: OperationType, inputs: Sequence[Slot] | Mapping[str, Sequence[Slot]],
        outputs: Sequence[Slot], variants: Iterable[Variant] = (), doc: str = "") -> Signature:
    """Shorthand: ``inputs`` is one slot list, or ``{form name: slot list}``."""
    if isinstance(inputs, Mapping):
        forms = tuple(Form(name, tuple(slots)) for name, slots in inputs.items())
    else:
        forms = (Form("", tuple(inputs)),)
    return Signature(op, forms, tuple(outputs), tuple(variants) or (Variant({}),), doc)


def variants(since: FeatureLevel, *rows: Mapping[str, OperandType]) -> list[Variant]:
    """Several variants of one version: ``variants(V1_2, {"T": F16}, {"T": Q8})``."""
    return [Variant(dict(r), since) for r in rows]


def declaration_problems(signature: Signature) -> list[str]:
    """What is wrong with a declaration itself (a test runs this over every operation)."""
    problems = []
    name = signature.op.name
    for form in (*signature.forms, Form("outputs", signature.outputs)):
        repeated = [s for s in form.inputs if s.repeated]
        if len(repeated) > 1 or (repeated and any(s.optional for s in form.inputs)):
            problems.append(f"{name} {form.name}: one repeated slot at most, and no optional one "
                            f"beside it")
        seen_optional = False
        for s in form.inputs:
            if s.optional:
                seen_optional = True
            elif seen_optional and not s.repeated:
                problems.append(f"{name} {form.name}: required slot {s.name} after an optional")
        for s in form.inputs:
            if isinstance(s.type, str) and s.type != ANY:
                for v in signature.variants:
                    if s.type not in v.types:
                        problems.append(f"{name}: variant {dict(v.types)} leaves {s.type} "
                                        f"(slot {s.name}) unbound")
    return problems


# ---- checking -----------------------------------------------------------------------------

class SignatureError(Exception):
    """The operands do not fit any form and variant of the signature."""


_CONSTANT = (OperandLifeTime.CONSTANT_COPY, OperandLifeTime.CONSTANT_REFERENCE)


def _spread(form: Form, n: int) -> list[Slot] | None:
    """The slot of each of ``n`` inputs under ``form``; None if the count does not fit.

    Optional slots are trailing; a repeated slot takes whatever the fixed slots leave.
    """
    slots = form.inputs
    for r, s in enumerate(slots):
        if s.repeated:
            before, after = slots[:r], slots[r + 1:]
            take = n - len(before) - len(after)
            return None if take < s.at_least else [*before, *[s] * take, *after]
    required = sum(1 for s in slots if not s.optional)
    return list(slots[:n]) if required <= n <= len(slots) else None


def _spread_outputs(outputs: tuple[Slot, ...], n: int) -> list[Slot] | None:
    return _spread(Form("", outputs), n)


def _allowed(slot: Slot, binding: Mapping[str, OperandType]) -> tuple[OperandType, ...] | None:
    """Types a slot accepts under a binding; None means any."""
    t = slot.type
    if t == ANY:
        return None
    if isinstance(t, str):
        return (binding[t],)
    if isinstance(t, OperandType):
        return (t,)
    return t


def _key(t: object) -> object:
    """What a slot's types are compared with: the HAL type, or an extension operand type's
    definition (the same whatever prefix a model gives its extension)."""
    return getattr(t, "definition", t)


def _describe(types: tuple[OperandType, ...] | None) -> str:
    return "any type" if types is None else " or ".join(t.name for t in types)


#: check()'s answers by (signature, presence, input types and lifetimes, output types): a
#: model repeats a few operand patterns (and an import and its analysis check the same
#: operations), so most checks are one lookup. Bounded: cleared when full.
_CHECKED: dict[tuple, tuple[Signature, FeatureLevel | str]] = {}
_CHECKED_MAX = 4096


def check(signature: Signature, inputs: Sequence[object], outputs: Sequence[object],
          presence: bool = True) -> FeatureLevel:
    """The lowest feature level at which the operands fit one form and one variant; raise
    :class:`SignatureError` when they fit none.

    The level is the variant's and that of every slot given (a trailing optional input added
    later raises it), so a model's minimum version is the highest level its operations return.
    ``inputs`` and ``outputs`` need ``type`` and ``lifetime`` attributes (operand infos).
    ``presence=False`` checks counts and types only: the NDK's addOperation comes before the
    values (constant or omitted) are necessarily set.
    """
    key = _check_key(signature, inputs, outputs, presence)
    if key is not None:
        try:
            found = _CHECKED.get(key)
        except TypeError:  # a lifetime that is no number: checked, not remembered
            key = found = None
        if found is not None and found[0] is signature:
            if isinstance(found[1], str):
                raise SignatureError(found[1])
            return found[1]
    try:
        level = _check(signature, inputs, outputs, presence)
    except SignatureError as e:
        if key is not None:
            _remember(key, signature, str(e))
        raise
    if key is not None:
        _remember(key, signature, level)
    return level


def _check_key(signature: Signature, inputs: Sequence[object], outputs: Sequence[object],
               presence: bool) -> tuple | None:
    """check()'s memo key: the signature, presence, each input's type and lifetime and each
    output's type; None (not remembered) unless every type is a plain HAL one (an
    extension's types are checked each time). The attributes are read in C (attrgetter):
    the analysis asks once per operation."""
    try:
        ins = tuple(map(_TYPE_AND_LIFETIME, inputs))
    except AttributeError:  # objects without a lifetime (the NDK's check of types only)
        ins = tuple((i.type, getattr(i, "lifetime", -1)) for i in inputs)  # type: ignore
    outs = tuple(map(_TYPE, outputs))
    for t, _ in ins:
        if type(t) is not OperandType:
            return None
    for t in outs:
        if type(t) is not OperandType:
            return None
    return (id(signature), presence, ins, outs)


#: What check() reads of each operand for its memo key.
_TYPE_AND_LIFETIME = attrgetter("type", "lifetime")
_TYPE = attrgetter("type")


def _remember(key: tuple, signature: Signature, answer: FeatureLevel | str) -> None:
    if len(_CHECKED) >= _CHECKED_MAX:
        _CHECKED.clear()
    _CHECKED[key] = (signature, answer)


def _check(signature: Signature, inputs: Sequence[object], outputs: Sequence[object],
           presence: bool) -> FeatureLevel:
    name = signature.op.name
    candidates = [s for f in signature.forms if (s := _spread(f, len(inputs))) is not None]
    if not candidates:
        counts = sorted({_count_text(f) for f in signature.forms})
        raise SignatureError(f"{name}: expected {' or '.join(counts)} inputs, got {len(inputs)}")
    out_slots = _spread_outputs(signature.outputs, len(outputs))
    if out_slots is None:
        raise SignatureError(f"{name}: expected {_count_text(Form('', signature.outputs))} "
                             f"outputs, got {len(outputs)}")
    first_error: str | None = None
    lowest: FeatureLevel | None = None
    for slots in candidates:
        problem = _check_presence(name, slots, inputs) if presence else None
        if problem is None:
            fit = _check_types(signature, slots, inputs, out_slots, outputs)
            if isinstance(fit, FeatureLevel):
                lowest = fit if lowest is None else min(lowest, fit)
                continue
            problem = fit
        first_error = first_error or problem
    if lowest is not None:
        return lowest
    raise SignatureError(first_error)


def _count_text(form: Form) -> str:
    fewest, most = form.counts()
    if most is None:
        return f"at least {fewest}"
    return str(fewest) if fewest == most else f"{fewest} to {most}"


def _check_presence(name: str, slots: Sequence[Slot], inputs: Sequence[object]) -> str | None:
    for k, (slot, info) in enumerate(zip(slots, inputs)):
        lifetime = getattr(info, "lifetime", None)
        if lifetime == OperandLifeTime.NO_VALUE:
            if not slot.omittable:
                return f"{name}: input {k} ({slot.name}) cannot be omitted"
        elif slot.const and lifetime not in _CONSTANT:
            return f"{name}: input {k} ({slot.name}) must be a constant"
    return None


def _check_types(signature: Signature, slots: Sequence[Slot], inputs: Sequence[object],
                 out_slots: Sequence[Slot], outputs: Sequence[object]) -> FeatureLevel | str:
    """The lowest level of the variants that fit every operand; otherwise the mismatch of the
    variant that fits the longest prefix (input 0 first), which names the operand most likely
    wrong."""
    name = signature.op.name
    pairs = [("input", k, s, i) for k, (s, i) in enumerate(zip(slots, inputs))] + \
            [("output", k, s, o) for k, (s, o) in enumerate(zip(out_slots, outputs))]
    best = (-1, "")
    lowest: FeatureLevel | None = None
    for variant in signature.variants:
        if lowest is not None and variant.since >= lowest:
            continue
        for n, (where, k, slot, info) in enumerate(pairs):
            allowed = _allowed(slot, variant.types)
            got = _key(info.type)  # type: ignore[attr-defined]
            if allowed is not None and got not in allowed:
                if n > best[0]:
                    best = (n, f"{name}: {where} {k} ({slot.name}) has type {got.name}, "
                               f"expected {_describe(allowed)}")
                break
        else:
            lowest = variant.since
    if lowest is not None:
        return max([lowest, *(s.since for s in slots), *(s.since for s in out_slots)])
    if best[0] == 0 and len(signature.variants) > 1:
        firsts = slot_types(slots[0], signature) if slots else None
        got = _key(inputs[0].type).name  # type: ignore[attr-defined]
        return (f"{name}: input 0 ({slots[0].name}) has type {got}, expected "
                f"{_describe(tuple(firsts or ()))}")
    return best[1]


# ---- reading ------------------------------------------------------------------------------

def slot_types(slot: Slot, signature: Signature) -> list[OperandType] | None:
    """Every type a slot takes across the variants; None means any."""
    seen: dict[OperandType, None] = {}
    for v in signature.variants:
        allowed = _allowed(slot, v.types)
        if allowed is None:
            return None
        for t in allowed:
            seen.setdefault(t)
    return list(seen)


def slot_versions(slot: Slot, signature: Signature) -> dict[OperandType, FeatureLevel]:
    """The first feature level in which the slot takes each of its types."""
    first: dict[OperandType, FeatureLevel] = {}
    for v in signature.variants:
        for t in _allowed(slot, v.types) or ():
            since = max(v.since, slot.since)
            if t not in first or since < first[t]:
                first[t] = since
    return first


def input_slots(signature: Signature, count: int) -> list[Slot] | None:
    """The slot of each input of an operation given ``count`` inputs (first form that fits)."""
    for form in signature.forms:
        slots = _spread(form, count)
        if slots is not None:
            return slots
    return None


def omittable_positions(signature: Signature, count: int) -> frozenset[int]:
    """Input positions that some form of this count lets be omitted."""
    positions: set[int] = set()
    for form in signature.forms:
        slots = _spread(form, count)
        if slots is not None:
            positions.update(k for k, s in enumerate(slots) if s.omittable)
    return frozenset(positions)
