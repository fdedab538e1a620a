"""The operation reference, rendered from the signatures (``nnhal ops``, docs/operations.md).

Nothing here is written by hand per operation: what a user reads is what validation enforces.
"""

from __future__ import annotations

from collections.abc import Iterable

from nnhal.hal.types import OperationType
from nnhal.ops.catalog import SIGNATURES
from nnhal.ops.signature import ANY, V1_0, Signature, Slot, slot_types, slot_versions

HEADER = """# Operations

Every operation of HAL 1.3 that nnhal runs, generated from the signatures the operations
declare (`nnhal/ops/*.py`, `SIGNATURES`); validation enforces exactly this. Regenerate with
`nnhal ops --markdown > docs/operations.md` (a test checks this file is current).

In the tables: *optional* inputs may be left out (the operation is given fewer inputs);
*omittable* ones may be an operand with lifetime NO_VALUE; *constant* ones must be
CONSTANT_COPY or CONSTANT_REFERENCE; `...` marks a slot that repeats. A type followed by
`(1.x)` is accepted since that HAL version.
"""


_TABLE_HEAD = ("| # | name | types | flags | notes |", "|---|---|---|---|---|")


def _types(slot: Slot, sig: Signature) -> str:
    if slot.type == ANY:
        return "any (as the referenced subgraph declares)"
    types = slot_types(slot, sig) or []
    first = slot_versions(slot, sig)
    since = sig.since
    return ", ".join(t.name + ("" if first.get(t, since) == since else f" ({first[t]})")
                     for t in types)


def _flags(slot: Slot) -> str:
    flags = []
    if slot.optional:
        flags.append("optional" + ("" if slot.since == V1_0 else f" (since {slot.since})"))
    if slot.omittable:
        flags.append("omittable")
    if slot.const:
        flags.append("constant")
    if slot.repeated:
        flags.append(f"repeated, at least {slot.at_least}")
    return ", ".join(flags)


def _rows(slots: Iterable[Slot], sig: Signature) -> list[str]:
    rows = []
    for k, slot in enumerate(slots):
        name = slot.name + (" ..." if slot.repeated else "")
        doc = f" {slot.doc}" if slot.doc else ""
        rows.append(f"| {k} | `{name}` | {_types(slot, sig)} | {_flags(slot)} |{doc} |")
    return rows


def markdown(signatures: dict[OperationType, Signature] | None = None) -> str:
    """The whole reference as Markdown, operations in alphabetical order."""
    sigs = SIGNATURES if signatures is None else signatures
    ops = sorted(sigs, key=lambda o: o.name)
    out = [HEADER, "| operation | since | inputs |", "|---|---|---|"]
    for op in ops:
        sig = sigs[op]
        counts = " or ".join(sorted({_count(f.inputs) for f in sig.forms}))
        out.append(f"| [{op.name}](#{op.name.lower()}) | {sig.since} | {counts} |")
    for op in ops:
        sig = sigs[op]
        out += ["", f"## {op.name}", ""]
        if sig.doc:
            out += [sig.doc, ""]
        versions = sorted({v.since for v in sig.variants})
        out += [f"Operation type {int(op)}; since HAL {sig.since}; type configurations added "
                f"in {', '.join(map(str, versions))}.", ""]
        for form in sig.forms:
            title = f"Inputs ({form.name})" if form.name else "Inputs"
            out += [f"{title}:", "", *_TABLE_HEAD, *_rows(form.inputs, sig), ""]
        out += ["Outputs:", "", *_TABLE_HEAD, *_rows(sig.outputs, sig)]
        names = sorted({k for v in sig.variants for k in v.types})
        if len(names) > 1:
            out += ["", "Type configurations:", "",
                    "| since | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
            out += [f"| {v.since} | " + " | ".join(v.types[n].name for n in names) + " |"
                    for v in sorted(sig.variants, key=lambda v: v.since)]
    return "\n".join(out) + "\n"


def _count(slots: tuple[Slot, ...]) -> str:
    required = sum(1 for s in slots if not s.optional and not s.repeated)
    if any(s.repeated for s in slots):
        return f"{required + min(s.at_least for s in slots if s.repeated)}+"
    total = len(slots)
    return str(total) if total == required else f"{required}-{total}"


def text(names: Iterable[str] = ()) -> str:
    """A terminal listing: one line per operation, or the full slots of the named ones."""
    wanted = [n.upper() for n in names]
    if not wanted:
        lines = []
        for op in sorted(SIGNATURES, key=lambda o: o.name):
            sig = SIGNATURES[op]
            form = sig.forms[0]
            lines.append(f"{op.name:<36} {str(sig.since):<4} "
                         f"({', '.join(s.name for s in form.inputs)})")
        return "\n".join(lines)
    out = []
    for name in wanted:
        try:
            op = OperationType[name]
        except KeyError:
            raise KeyError(f"no operation named {name}") from None
        sig = SIGNATURES.get(op)
        if sig is None:
            raise KeyError(f"{name} declares no signature")
        out.append(f"{op.name} (type {int(op)}, since HAL {sig.since})")
        for form in sig.forms:
            out.append(f"  inputs{' (' + form.name + ')' if form.name else ''}:")
            for k, slot in enumerate(form.inputs):
                flags = _flags(slot)
                out.append(f"    {k:>2} {slot.name:<28} {_types(slot, sig)}"
                           + (f"  [{flags}]" if flags else ""))
        out.append("  outputs:")
        for k, slot in enumerate(sig.outputs):
            out.append(f"    {k:>2} {slot.name:<28} {_types(slot, sig)}")
    return "\n".join(out)
