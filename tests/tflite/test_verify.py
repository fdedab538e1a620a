"""The flatbuffers verifier nnhal runs on every .tflite (nnhal.tflite.verify): one hostile file
per check flatbuffers' C++ verifier makes, each in a table or field the importer itself never
reads or reads without noticing, refused in one line as ai-edge-litert refuses it; what that
verifier accepts (a union type it does not know) is accepted; and the schema layout the
verifier reads is the one of the ``tflite`` package's generated classes."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import struct

import numpy as np
import pytest
import tflite
from oracle import available, verdicts
from tfl import Graph, build

from nnhal.errors import ModelFileError
from nnhal.tflite import read_tflite
from nnhal.tflite.layout import TABLES
from nnhal.tflite.verify import MAX_TABLES

F = np.float32


def _concat() -> bytes:
    """CONCATENATION with axis -2 written in its options (0, the default, would be left out):
    read with the default options it means the same, so only the verifier can tell."""
    g = Graph()
    x = g.input((2, 3), F, name="x")
    y = g.tensor((4, 3), F, name="y")
    g.op("CONCATENATION", [x, g.const(np.ones((2, 3), F))], [y],
         ("ConcatenationOptions", dict(Axis=-2)))
    g.output(y)
    return build(g)


def _field(table: object, k: int) -> int:
    """The byte position of field ``k`` of a generated table (0 when absent)."""
    off = table._tab.Offset(4 + 2 * k)
    return table._tab.Pos + off if off else 0


def _vtable_entry(table: object, k: int) -> int:
    """The byte position of field ``k``'s entry in the vtable of a generated table."""
    pos = table._tab.Pos
    return pos - struct.unpack_from("<i", table._tab.Bytes, pos)[0] + 4 + 2 * k


def _patch(data: bytes, pos: int, fmt: str, value: int) -> bytes:
    b = bytearray(data)
    struct.pack_into(fmt, b, pos, value)
    return bytes(b)


def _model(data: bytes) -> tflite.Model:
    return tflite.Model.GetRootAs(data)


def _description() -> tuple[bytes, int, int]:
    """A model, the position of its description's offset, and of the string itself."""
    data = _concat()
    at = _field(_model(data), 3)
    return data, at, at + struct.unpack_from("<I", data, at)[0]


def _string_not_terminated() -> bytes:
    data, _, s = _description()
    return _patch(data, s + 4 + struct.unpack_from("<I", data, s)[0], "<B", ord("x"))


def _string_past_the_end() -> bytes:
    data, _, s = _description()
    return _patch(data, s, "<I", len(data))


def _string_not_aligned() -> bytes:
    data, at, _ = _description()
    return _patch(data, at, "<I", struct.unpack_from("<I", data, at)[0] + 1)


def _offset_outside() -> bytes:
    data, at, _ = _description()
    return _patch(data, at, "<I", 1 << 30)


def _options(data: bytes) -> tflite.Operator:
    return _model(data).Subgraphs(0).Operators(0)


def _union_of_another_table() -> bytes:
    """CONCATENATION's options typed as ReshapeOptions: its first field, the axis -2, is then
    an offset past 2^31. nnhal reads another table's options as absent (defaults), as TFLite
    does, but the verifier checks the table as its type says."""
    data = _concat()
    from tflite.BuiltinOptions import BuiltinOptions
    return _patch(data, _field(_options(data), 3), "<B", BuiltinOptions.ReshapeOptions)


def _scalar_not_aligned() -> bytes:
    """ConcatenationOptions.axis (an int32) moved one byte in its vtable."""
    data = _concat()
    opts = _options(data).BuiltinOptions()
    entry = opts.Pos - struct.unpack_from("<i", data, opts.Pos)[0] + 4
    return _patch(data, entry, "<H", struct.unpack_from("<H", data, entry)[0] + 1)


def _vtable_of_odd_size() -> bytes:
    data = _concat()
    opts = _options(data).BuiltinOptions()
    vt = opts.Pos - struct.unpack_from("<i", data, opts.Pos)[0]
    return _patch(data, vt, "<H", struct.unpack_from("<H", data, vt)[0] + 1)


def _table_not_aligned() -> bytes:
    data = _concat()
    at = _field(_options(data), 4)
    return _patch(data, at, "<I", struct.unpack_from("<I", data, at)[0] + 2)


def _too_many_tables() -> bytes:
    """Model.buffers repointed to a vector, appended at the end, of MAX_TABLES buffers: the
    model's own (copied after it, since offsets only point forward), then one empty Buffer
    table named again and again. With the model's other tables, that is more than
    flatbuffers' verifier allows, in a 4 MB file whose tensors still find their data."""
    data = _concat()
    model = _model(data)
    at = _field(model, 4)
    start = (len(data) + 3) // 4 * 4
    n = MAX_TABLES
    tail = bytearray()
    base = start + 4 + 4 * n
    targets = []
    for k in range(model.BuffersLength()):  # vtable, table (soffset, data offset), vector
        content = model.Buffers(k).DataAsNumpy()
        content = content.tobytes() if isinstance(content, np.ndarray) else b""
        table = base + len(tail) + 8
        targets.append(table)
        tail += struct.pack("<HHHH", 6, 8, 4, 0) + struct.pack("<iI", 8, 4)
        tail += struct.pack("<I", len(content)) + content.ljust((len(content) + 3) // 4 * 4,
                                                                 b"\0")
    empty = base + len(tail) + 4
    tail += struct.pack("<HHi", 4, 4, 4)
    targets += [empty] * (n - len(targets))
    elements = start + 4 + 4 * np.arange(n, dtype=np.int64)
    vec = np.concatenate(([n], np.int64(targets) - elements)).astype("<u4")
    out = bytearray(data.ljust(start, b"\0")) + vec.tobytes() + tail
    struct.pack_into("<I", out, at, start - at)
    return bytes(out)


HOSTILE = {
    "string_not_terminated": _string_not_terminated,
    "string_past_the_end": _string_past_the_end,
    "string_not_aligned": _string_not_aligned,
    "offset_outside_the_file": _offset_outside,
    "union_table_checked_as_its_type": _union_of_another_table,
    "scalar_not_aligned": _scalar_not_aligned,
    "vtable_of_odd_size": _vtable_of_odd_size,
    "table_not_aligned": _table_not_aligned,
    "more_than_a_million_tables": _too_many_tables,
}


@pytest.fixture(scope="module")
def litert_verdicts() -> dict[str, str]:
    if not available():
        return {}
    names = list(HOSTILE)
    return dict(zip(names, verdicts([HOSTILE[n]() for n in names])))


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_what_flatbuffers_verifier_refuses_is_refused_in_one_line(kind: str, litert_verdicts
                                                                  ) -> None:
    with pytest.raises(ModelFileError, match="corrupted or truncated flatbuffer") as e:
        read_tflite(HOSTILE[kind](), name="m.tflite")
    assert str(e.value).startswith("m.tflite: ") and "\n" not in str(e.value)
    if litert_verdicts:
        assert "not a valid Flatbuffer" in litert_verdicts[kind]


#: What each hostile file is refused for: the first failure in flatbuffers' order, as the
#: field by field walk finds it (the checks made for many fields or tables at once fall
#: back to it when one fails).
NAMED = {
    "string_not_terminated": "Model field 3: string not terminated at byte 48",
    "string_past_the_end": "Model field 3: vector runs past the end of the file at byte 48",
    "string_not_aligned": "Model field 3: vector not aligned at byte 49",
    "offset_outside_the_file": "Model field 3: offset points outside the file at byte "
                               "1073741856",
    "union_table_checked_as_its_type": "ReshapeOptions field 0: offset 0 or past 2^31 at "
                                       "byte 280",
    "scalar_not_aligned": "ConcatenationOptions field 0: scalar not aligned at byte 281",
    "vtable_of_odd_size": "ConcatenationOptions: vtable of odd size at byte 270",
    "table_not_aligned": "ConcatenationOptions: table not aligned at byte 278",
}


@pytest.mark.parametrize("kind", list(NAMED))
def test_the_refusal_names_the_first_failing_field(kind: str) -> None:
    with pytest.raises(ModelFileError) as e:
        read_tflite(HOSTILE[kind](), name="m.tflite")
    assert str(e.value) == f"m.tflite: corrupted or truncated flatbuffer: {NAMED[kind]}"


def test_a_union_type_the_schema_does_not_know_is_accepted_unread() -> None:
    """flatbuffers' generated verifiers accept an unknown union type (a newer schema's)."""
    data = _concat()
    data = _patch(data, _field(_options(data), 3), "<B", 250)
    read_tflite(data)
    if available():
        assert verdicts([data]) == ["ok"]


_SIZES = {"Bool": 1, "Int8": 1, "Uint8": 1, "Int16": 2, "Uint16": 2, "Int32": 4, "Uint32": 4,
          "Float32": 4, "Int64": 8, "Uint64": 8, "Float64": 8}


def _generated_slot(body: str) -> str | None:
    """The layout kind of one generated accessor's body (None for helpers)."""
    table = re.search(r"from tflite\.(\w+) import", body)
    flags = re.search(r"number_types\.(\w+?)Flags, (\w)", body)
    if "self._tab.Union(" in body:
        return "<>"
    if "self._tab.Vector(o)" in body and table:
        return f"[{table.group(1)}]"
    if "self._tab.String(" in body:
        return "s"
    if "Indirect(o + self._tab.Pos)" in body and table:
        return table.group(1)
    if flags and flags.group(2) in "ao":  # vector element (a + ...) or field (o + ...)
        size = _SIZES[flags.group(1)]
        return f"[{size}]" if flags.group(2) == "a" else str(size)
    return None


def test_the_layout_is_the_generated_classes() -> None:
    """Every table of the ``tflite`` package, slot by slot, is what TABLES says; each union
    slot follows its one-byte type and names an enum whose members are tables."""
    generated: dict[str, str] = {}
    for m in pkgutil.iter_modules(tflite.__path__):
        module = importlib.import_module(f"tflite.{m.name}")
        cls = getattr(module, m.name, None)
        if cls is None or not hasattr(cls, "Init"):
            continue
        slots: dict[int, str] = {}
        for body in inspect.getsource(module).split(f"    # {m.name}\n")[1:]:
            off = re.search(r"self\._tab\.Offset\((\d+)\)", body)
            kind = _generated_slot(body) if off else None
            if kind is not None:
                slots.setdefault((int(off.group(1)) - 4) // 2, kind)
        generated[m.name] = " ".join(slots.get(k, "-") for k in range(max(slots, default=-1)
                                                                        + 1))
    ours = {name: re.sub(r"<\w+>", "<>", kinds) for name, kinds in TABLES.items()}
    assert {k: v for k, v in generated.items() if v} == ours
    for kinds in TABLES.values():
        slots = kinds.split()
        for k, kind in enumerate(slots):
            if kind.startswith("<"):
                assert slots[k - 1] == "1"
                enum = getattr(importlib.import_module(f"tflite.{kind[1:-1]}"), kind[1:-1])
                members = [n for n, v in vars(enum).items() if isinstance(v, int) and v]
                assert members and all(n in generated for n in members)
