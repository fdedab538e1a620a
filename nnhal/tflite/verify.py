"""A flatbuffers verifier for .tflite files: the checks flatbuffers' C++ ``Verifier`` makes
before TFLite reads a model (ai-edge-litert refuses a file that fails them with "not a valid
Flatbuffer buffer"), over the schema's layout in :mod:`nnhal.tflite.layout`. Python
flatbuffers has no verifier, and its generated accessors trust every offset.

What is checked, as flatbuffers does: every offset aligned, non-zero, below 2^31 and landing
inside the file; each table's vtable offset aligned and inside the file, its vtable of even
size and whole; each present scalar field aligned to its size and inside the file; each
vector's length word aligned and the whole vector inside the file; strings zero-terminated;
nested tables and the table of each union for its type (a type this schema does not know is
accepted unread, as the generated C++ does); at most 64 nested tables and 1,000,000 tables in
all. Deprecated slots are skipped, as the generated verifiers skip them.

The walk is breadth-first by table type: all tables of one type at one depth are checked at
once with numpy (a file of 50,000 tensors is one batch of 50,000, not 50,000 Python calls),
so the cost is linear in the file and small next to reading it."""

from __future__ import annotations

import importlib

import numpy as np

from nnhal.errors import ModelFileError
from nnhal.tflite.layout import TABLES

#: flatbuffers' Verifier defaults (Verifier::Options).
MAX_DEPTH, MAX_TABLES = 64, 1_000_000
#: FLATBUFFERS_MAX_BUFFER_SIZE: a vector's byte size must stay below it.
_MAX_SIZE = (1 << 31) - 1
#: FLATBUFFERS_MIN_BUFFER_SIZE: root offset, vtable offset and a 4-byte vtable.
_MIN_SIZE = 12

_SLOTS: dict[str, tuple[str, ...]] = {name: tuple(kinds.split()) for name, kinds in
                                      TABLES.items()}


def _union_members(enum: str) -> dict[int, str]:
    cls = getattr(importlib.import_module(f"tflite.{enum}"), enum)
    return {v: k for k, v in vars(cls).items()
            if not k.startswith("_") and isinstance(v, int) and v != 0}


_UNIONS: dict[str, dict[int, str]] = {
    kind[1:-1]: _union_members(kind[1:-1])
    for kinds in _SLOTS.values() for kind in kinds if kind.startswith("<")}


#: Each table's vtable entry per slot (4 + 2k).
_ENTRIES: dict[str, np.ndarray] = {name: 4 + 2 * np.arange(len(slots), dtype=np.int64)
                                   for name, slots in _SLOTS.items()}
#: ``a.any()`` without numpy's Python wrapper around the reduction (the walk tests a
#: hundred small arrays per file).
_any = np.logical_or.reduce


class _Invalid(Exception):
    pass


class _Walk:
    """The checks over arrays of positions. Each step first tests all of its conditions at
    once (one reduction: a valid file passes every one); only when one fails are they tested
    one by one, in flatbuffers' order, to name the first that fails and where."""

    def __init__(self, data: bytes):
        self.n = len(data)
        self.u8 = np.frombuffer(data, np.uint8)
        self._u16 = np.frombuffer(data, "<u2", self.n // 2)
        self._u32 = np.frombuffer(data, "<u4", self.n // 4)
        self._i32 = np.frombuffer(data, "<i4", self.n // 4)
        self.count = 0

    def u16(self, pos: np.ndarray) -> np.ndarray:
        """The uint16 at each (2-aligned, checked) position, as int64."""
        return self._u16[pos // 2].astype(np.int64)

    def u32(self, pos: np.ndarray) -> np.ndarray:
        return self._u32[pos // 4].astype(np.int64)

    def check(self, bad: np.ndarray, where: np.ndarray, what: str) -> None:
        if _any(bad, None):
            raise _Invalid(f"{what} at byte {int(where[np.argmax(bad)])}")

    def inside(self, pos: np.ndarray, size: int | np.ndarray, what: str) -> None:
        """flatbuffers' Verify(elem, len): the range lies in the file."""
        self.check((size >= self.n) | (pos > self.n - size), pos, what)

    def aligned(self, pos: np.ndarray, align: int, what: str) -> None:
        self.check(pos % align != 0, pos, what)

    def _placed(self, pos: np.ndarray, size: int, what: str) -> None:
        """``pos`` aligned to ``size`` (1, 2, 4 or 8) with ``size`` bytes inside the file
        (``size`` is below the file's, which holds at least _MIN_SIZE bytes)."""
        if _any(((pos & (size - 1)) != 0) | (pos > self.n - size), None):
            self.aligned(pos, size, what.format("not aligned"))
            self.inside(pos, size, what.format("outside the file"))

    def offset(self, pos: np.ndarray, what: str) -> np.ndarray:
        """flatbuffers' VerifyOffset: where the offsets at ``pos`` point."""
        self._placed(pos, 4, f"{what}: offset {{}}")
        o = self.u32(pos)
        target = pos + o
        if _any((o == 0) | (o >= 1 << 31) | (target > self.n - 1), None):
            self.check((o == 0) | (o >= 1 << 31), pos, f"{what}: offset 0 or past 2^31")
            self.inside(target, 1, f"{what}: offset points outside the file")
        return target

    def vector(self, pos: np.ndarray, size: int, what: str) -> np.ndarray:
        """flatbuffers' VerifyVectorOrString: the lengths of the vectors at ``pos``."""
        if _any(((pos & 3) != 0) | (pos > self.n - 4), None):
            self.aligned(pos, 4, f"{what}: vector not aligned")
            self.inside(pos, 4, f"{what}: vector length outside the file")
        return self._lengths(pos, size, what)

    def vector_field(self, at: np.ndarray, size: int, what: str
                     ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`offset` then :meth:`vector`: where the vectors the offsets at ``at`` point to
        are, and their lengths; where each offset lands and its length word tested together."""
        self._placed(at, 4, f"{what}: offset {{}}")
        o = self.u32(at)
        target = at + o
        if _any((o == 0) | (o >= 1 << 31) | ((target & 3) != 0) | (target > self.n - 4), None):
            target = self.offset(at, what)
            return target, self.vector(target, size, what)
        return target, self._lengths(target, size, what)

    def _lengths(self, pos: np.ndarray, size: int, what: str) -> np.ndarray:
        """The lengths of the vectors whose length words at ``pos`` are placed, each vector
        whole inside the file."""
        length = self.u32(pos)
        long = length >= _MAX_SIZE // size
        total = 4 + size * length
        if _any(long | (total >= self.n) | (pos > self.n - total), None):
            self.check(long, pos, f"{what}: vector too long")
            self.inside(pos, total, f"{what}: vector runs past the end of the file")
        return length

    def table(self, name: str, pos: np.ndarray, depth: int,
              starts: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        """flatbuffers' VerifyTableStart, then every field of the ``name`` tables at ``pos``
        (``starts``: their vtables and sizes, when the caller checked their starts already)."""
        if not pos.size:
            return
        self.count += pos.size
        if depth > MAX_DEPTH or self.count > MAX_TABLES:
            raise _Invalid(f"more than {MAX_DEPTH} nested or {MAX_TABLES} tables ({name})")
        if starts is None:
            starts = self._starts(pos) or self._starts_one_by_one(name, pos)
        vt, vsize = starts
        slots = _SLOTS.get(name, ())
        if not slots:
            return
        # Every table's vtable entry of every slot at once (0 past the end of its vtable).
        entry = _ENTRIES[name]
        present = vsize[:, None] > entry
        offs = np.where(present, self._u16[np.where(present, vt[:, None] + entry, 0) // 2], 0
                        ).astype(np.int64)
        fields = [k for k in np.flatnonzero(offs.any(axis=0)).tolist() if slots[k] != "-"]
        scalars = [k for k in fields if slots[k].isdigit()]
        # Every scalar field of every table at once; one by one only when one fails.
        size = np.array([int(slots[k]) for k in scalars], np.int64)
        at = pos[:, None] + offs[:, scalars]
        scalars_bad = bool(_any((offs[:, scalars] != 0) & (((at & (size - 1)) != 0) |
                                                          (at > self.n - size)), None))
        # Every vector and string field at once too; field by field (below) when one fails.
        vectors = self._vectors(pos, offs, slots, [k for k in fields if slots[k][0] in "[s"])
        for k in fields:
            kind = slots[k]
            off = offs[:, k]
            has = off != 0
            if kind.isdigit():
                if scalars_bad:
                    self._placed(pos[has] + off[has], int(kind),
                                 f"{name} field {k}: scalar {{}}")
                continue
            if vectors is not None and kind[0] in "[s":
                if kind[0] == "[" and not kind[1:-1].isdigit():
                    self.table(kind[1:-1], self.elements(*vectors[k]), depth + 1)
                continue
            at, what = pos[has] + off[has], f"{name} field {k}"
            if kind == "s":
                target, length = self.vector_field(at, 1, what)
                end = target + 4 + length
                if _any((end > self.n - 1) | (self.u8[np.minimum(end, self.n - 1)] != 0), None):
                    self.inside(end, 1, f"{what}: string not terminated")
                    self.check(self.u8[end] != 0, target, f"{what}: string not terminated")
            elif kind.startswith("[") and kind[1:-1].isdigit():
                self.vector_field(at, int(kind[1:-1]), what)
            elif kind.startswith("["):
                self.table(kind[1:-1], self.elements(*self.vector_field(at, 4, what)),
                           depth + 1)
            elif kind.startswith("<"):
                self.union(kind[1:-1], slots, k, pos[has], vt[has], vsize[has],
                           self.offset(at, what), depth)
            else:
                self.table(kind, self.offset(at, what), depth + 1)

    def _vectors(self, pos: np.ndarray, offs: np.ndarray, slots: tuple[str, ...],
                 fields: list[int]) -> dict[int, tuple[np.ndarray, np.ndarray]] | None:
        """(where the vectors are, their lengths) of each vector or string field in
        ``fields`` of the tables at ``pos``, when every one passes :meth:`vector_field`'s
        checks and each string is terminated: one pass of array arithmetic over all of them
        (a tensor has a shape, a name, a signature...); None when one fails, for the field
        by field walk to name the first failure as flatbuffers would."""
        if not fields:
            return {}
        n = self.n
        ats, sizes = [], []
        for k in fields:
            off = offs[:, k]
            has = off != 0
            ats.append(pos[has] + off[has])
            kind = slots[k]
            sizes.append(1 if kind == "s" else int(kind[1:-1]) if kind[1:-1].isdigit() else 4)
        counts = [a.size for a in ats]
        at = np.concatenate(ats) if len(ats) > 1 else ats[0]
        if _any(((at & 3) != 0) | (at > n - 4), None):
            return None
        o = self.u32(at)
        target = at + o
        if _any((o == 0) | (o >= 1 << 31) | ((target & 3) != 0) | (target > n - 4), None):
            return None
        size = np.repeat(np.array(sizes, np.int64), counts)
        length = self.u32(target)
        total = 4 + size * length
        if _any((length >= _MAX_SIZE // size) | (total >= n) | (target > n - total), None):
            return None
        found, start = {}, 0
        for k, count in zip(fields, counts):
            found[k] = (target[start:start + count], length[start:start + count])
            start += count
        strings = [found[k] for k in fields if slots[k] == "s"]
        if strings:
            end = np.concatenate([t + 4 + n_ for t, n_ in strings])
            if _any((end > n - 1) | (self.u8[np.minimum(end, n - 1)] != 0), None):
                return None
        return found

    def _starts(self, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """(vtable positions, vtable sizes) of the tables at ``pos`` when each table is
        aligned and inside the file with its vtable aligned, inside and whole; else None."""
        n = self.n
        if _any(((pos & 3) != 0) | (pos > n - 4), None):
            return None
        vt = pos - self._i32[pos // 4]
        if _any((vt < 0) | ((vt & 1) != 0) | (vt > n - 2), None):
            return None
        vsize = self.u16(vt)
        if _any(((vsize & 1) != 0) | (vsize >= n) | (vt > n - vsize), None):
            return None
        return vt, vsize

    def _starts_one_by_one(self, name: str, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`_starts`' checks in flatbuffers' order, raising the first that fails."""
        self.aligned(pos, 4, f"{name}: table not aligned")
        self.inside(pos, 4, f"{name}: table outside the file")
        vt = pos - self._i32[pos // 4]
        self.check((vt < 0) | (vt % 2 != 0), pos, f"{name}: vtable misplaced")
        self.inside(vt, 2, f"{name}: vtable outside the file")
        vsize = self.u16(vt)
        self.check(vsize % 2 != 0, vt, f"{name}: vtable of odd size")
        self.inside(vt, vsize, f"{name}: vtable runs past the end of the file")
        return vt, vsize

    def elements(self, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """Where the tables of vectors of tables are (flatbuffers' Vector::Get)."""
        total = int(lengths.sum())
        if self.count + total > MAX_TABLES:
            raise _Invalid(f"more than {MAX_TABLES} tables")
        first = np.repeat(starts + 4 - 4 * np.concatenate(([0], np.cumsum(lengths)[:-1])),
                          lengths)
        at = first + 4 * np.arange(total, dtype=np.int64)
        return at + self.u32(at)

    def union(self, enum: str, slots: tuple[str, ...], k: int, pos: np.ndarray,
              vt: np.ndarray, vsize: np.ndarray, target: np.ndarray, depth: int) -> None:
        """The table of each union value, verified as the type in the slot before says."""
        entry = 4 + 2 * (k - 1)
        off = np.where(vsize > entry, self.u16(np.where(vsize > entry, vt + entry, 0)), 0)
        kind = np.where(off != 0, self.u8[np.where(off != 0, pos + off, 0)], 0)
        # (sorted(set()): np.unique would import numpy.ma, tens of ms on a first open)
        members = [(t, m) for t in sorted(set(kind.tolist()))
                   if (m := _UNIONS[enum].get(t)) is not None]  # NONE and unknown: unread
        # The starts of the tables of every type at once (an operator's options are of many
        # types, a few tables each); one type after the other when one is not sound.
        known = _KNOWN[enum][kind]
        starts = self._starts(target[known])
        done = self._scalar_members(members, kind[known], target[known], starts, depth) \
            if starts is not None else ()
        for t, member in members:
            if member in done:
                continue
            if starts is None:
                self.table(member, target[kind == t], depth + 1)
            else:
                mine = kind[known] == t
                self.table(member, target[kind == t], depth + 1,
                           (starts[0][mine], starts[1][mine]))

    def _scalar_members(self, members: list[tuple[int, str]], kind: np.ndarray,
                        pos: np.ndarray, starts: tuple[np.ndarray, np.ndarray], depth: int
                        ) -> set[str]:
        """The members of a union that hold scalars only (most options tables), verified
        together: every field of every such table at once, by its type's slot sizes, rather
        than one :meth:`table` per type. Their names; none when one fails (each type is then
        walked alone, to name the first failure) or when a count could reach a limit on the
        way (then the walk's order decides which table names it)."""
        if depth + 1 > MAX_DEPTH or self.count + pos.size > MAX_TABLES or \
                any(m not in _NO_TABLES for _, m in members):
            return set()
        batch = [(t, m) for t, m in members if m in _SCALAR_SIZES]
        if not batch:
            return set()
        width = max(_SCALAR_SIZES[m].size for _, m in batch)
        sizes = np.zeros((len(batch) + 1, width), np.int64)  # (the last row: not batched)
        row = np.full(256, len(batch), np.int64)
        for j, (t, m) in enumerate(batch):
            sizes[j, :_SCALAR_SIZES[m].size] = _SCALAR_SIZES[m]
            row[t] = j
        mine = row[kind] < len(batch)
        size = sizes[row[kind[mine]]]
        vt, vsize = starts[0][mine], starts[1][mine]
        entry = 4 + 2 * np.arange(width, dtype=np.int64)
        present = (vsize[:, None] > entry) & (size > 0)
        offs = np.where(present, self._u16[np.where(present, vt[:, None] + entry, 0) // 2], 0
                        ).astype(np.int64)
        at = pos[mine][:, None] + offs
        if _any((offs != 0) & (((at & (size - 1)) != 0) | (at > self.n - size)), None):
            return set()
        self.count += int(np.count_nonzero(mine))
        return {m for _, m in batch}


#: Per union, whether each type byte names a member (a table this schema knows).
_KNOWN: dict[str, np.ndarray] = {}
for _enum, _members in _UNIONS.items():
    _KNOWN[_enum] = np.zeros(256, np.bool_)
    _KNOWN[_enum][list(_members)] = True
_ALL_SLOTS = {**{m: () for members in _UNIONS.values() for m in members.values()}, **_SLOTS}
#: The tables that hold no table (scalars, strings, vectors of scalars): a union of these
#: adds one table per value to the count, whatever the order they are walked in.
_NO_TABLES = {name for name, slots in _ALL_SLOTS.items() if all(
    k.isdigit() or k in ("-", "s") or (k[0] == "[" and k[1:-1].isdigit()) for k in slots)}
#: The tables that hold scalars only (or nothing): each slot's size (0 for a deprecated one).
_SCALAR_SIZES: dict[str, np.ndarray] = {
    name: np.array([int(k) if k.isdigit() else 0 for k in slots], np.int64)
    for name, slots in _ALL_SLOTS.items() if all(k.isdigit() or k == "-" for k in slots)}


def verify(data: bytes, name: str) -> None:
    """Refuses, with one ModelFileError, a file flatbuffers' verifier would refuse."""
    if len(data) < _MIN_SIZE:
        raise ModelFileError(name, f"not a TFLite flatbuffer ({len(data)} bytes)")
    walk = _Walk(data)
    try:
        root = walk.offset(np.zeros(1, np.int64), "root")
        walk.table("Model", root, 1)
    except _Invalid as e:
        raise ModelFileError(name, f"corrupted or truncated flatbuffer: {e}") from None
