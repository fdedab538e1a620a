"""The exporter's flat description of a .tflite, and its serialisation with flatbuffers.Builder
through the ``tflite`` package's generated builder functions (no hand-written encoding).

Converters fill plain lists (tensors, operators, buffers); only :func:`serialise` touches the
builder, which must create every child (string, vector, table) before its parent.

Constant data is most of a model's bytes, so it is never handled element by element nor
copied on the way: a buffer is kept as the exporter's read-only array (a view of the
analysis' constant), and serialising copies it once, into a builder sized up front so that
it never grows (each doubling would copy everything written so far).
"""

from __future__ import annotations

import functools
import importlib
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import flatbuffers
import numpy as np
import tflite

from nnhal.memory.frame import Frame
from nnhal.tflite.schema import FILE_IDENTIFIER, SCHEMA_VERSION

#: Builtin codes above this go in the 32-bit field; the 8-bit one holds this placeholder.
_PLACEHOLDER_FOR_GREATER_OP_CODES = 127
#: Constant buffers start on this boundary (what TFLite's own writer does for SIMD loads).
_BUFFER_ALIGN = 16


@dataclass
class TensorDef:
    name: str
    shape: list[int]
    type: int  # tflite TensorType
    buffer: int = 0  # 0: no data (buffer 0 is the empty sentinel)
    scales: list[float] | None = None
    zero_points: list[int] | None = None
    quantized_dimension: int = 0
    #: -1 where a dimension is unknown (``shape`` then holds 1 there).
    shape_signature: list[int] | None = None
    #: State a stateful kernel (RNN, SVDF...) updates in place.
    is_variable: bool = False
    #: (scales, zero_points, their float64 and int64 arrays) as :func:`channel_quant` set
    #: them: the arrays stand for the lists while those are the very same objects (per-channel
    #: lists run to thousands of numbers, and each conversion costs tens of microseconds).
    arrays: tuple[Any, ...] | None = field(default=None, repr=False, compare=False)

    def quant_arrays(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The scales and zero points as arrays when :func:`channel_quant` set them and they
        are still the ones set; else None."""
        a = self.arrays
        if a is not None and a[0] is self.scales and a[1] is self.zero_points:
            return a[2], a[3]
        return None


def channel_quant(t: TensorDef, scales: np.ndarray, dim: int = 0) -> None:
    """Per-channel scales (zero points 0) along ``dim`` for ``t``, as lists and as arrays."""
    arr = np.asarray(scales, dtype=np.float64).reshape(-1)
    t.scales = arr.tolist()
    t.zero_points = [0] * len(t.scales)
    t.quantized_dimension = int(dim)
    t.arrays = (t.scales, t.zero_points, arr, np.zeros(arr.size, np.int64))


@dataclass
class OperatorDef:
    code: int  # BuiltinOperator
    inputs: list[int]
    outputs: list[int]
    options_name: str | None = None  # e.g. "Conv2DOptions"
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class SubgraphDef:
    name: str
    tensors: list[TensorDef] = field(default_factory=list)
    operators: list[OperatorDef] = field(default_factory=list)
    inputs: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)

    def add_tensor(self, t: TensorDef) -> int:
        self.tensors.append(t)
        return len(self.tensors) - 1


@dataclass
class ModelDef:
    subgraphs: list[SubgraphDef] = field(default_factory=list)
    #: Constant data: bytes, or a C-contiguous array nobody writes to (no copy is made).
    buffers: list[bytes | np.ndarray] = field(default_factory=lambda: [b""])
    description: str = "nnhal"
    #: (signature key, [(name, tensor index)] inputs, outputs) of subgraph 0.
    signature: tuple[str, list[tuple[str, int]], list[tuple[str, int]]] | None = None

    def add_buffer(self, data: bytes | np.ndarray) -> int:
        """A buffer holding ``data``: bytes, or an array that stays unchanged until the model
        is serialised (kept as it is, not copied)."""
        if isinstance(data, np.ndarray):
            data = np.ascontiguousarray(data)
        else:
            data = bytes(data)
        self.buffers.append(data)
        return len(self.buffers) - 1


class _Builder(flatbuffers.Builder):
    """flatbuffers.Builder with its hot paths lean: the very same bytes (the same alignment,
    vtable sharing and layout), without the per-scalar range checks, nesting assertions and
    one-byte padding loops that make up most of a model's table time. Values are range
    checked by ``struct`` instead (an out-of-range one raises struct.error). The builder is
    sized up front (see :func:`serialise`); growing falls back to the base class."""

    def Prep(self, size: int, additionalBytes: int) -> None:  # noqa: N802, N803
        if size > self.minalign:
            self.minalign = size
        head = self.head
        pad = -(len(self.Bytes) - head + additionalBytes) & (size - 1)
        if head < pad + size + additionalBytes:
            super().Prep(size, additionalBytes)  # grows the buffer
            return
        if pad:
            head -= pad
            self.Bytes[head:head + pad] = bytes(pad)
            self.head = head

    def _slot(self, pack: Any, width: int, slot: int, x: Any, d: Any) -> None:
        if x != d:
            self.Prep(width, 0)
            self.head -= width
            pack(self.Bytes, self.head, x)
            self.current_vtable[slot] = len(self.Bytes) - self.head

    def PrependBoolSlot(self, o: int, x: Any, d: Any) -> None:  # noqa: N802
        self._slot(_BOOL.pack_into, 1, o, x, d)

    def PrependInt8Slot(self, o: int, x: Any, d: Any) -> None:  # noqa: N802
        self._slot(_I8.pack_into, 1, o, x, d)

    def PrependUint8Slot(self, o: int, x: Any, d: Any) -> None:  # noqa: N802
        self._slot(_U8.pack_into, 1, o, x, d)

    def PrependInt16Slot(self, o: int, x: Any, d: Any) -> None:  # noqa: N802
        self._slot(_I16.pack_into, 2, o, x, d)

    def PrependUint16Slot(self, o: int, x: Any, d: Any) -> None:  # noqa: N802
        self._slot(_U16.pack_into, 2, o, x, d)

    def PrependInt32Slot(self, o: int, x: Any, d: Any) -> None:  # noqa: N802
        self._slot(_I32.pack_into, 4, o, x, d)

    def PrependUint32Slot(self, o: int, x: Any, d: Any) -> None:  # noqa: N802
        self._slot(_U32.pack_into, 4, o, x, d)

    def PrependInt64Slot(self, o: int, x: Any, d: Any) -> None:  # noqa: N802
        self._slot(_I64.pack_into, 8, o, x, d)

    def PrependUint64Slot(self, o: int, x: Any, d: Any) -> None:  # noqa: N802
        self._slot(_U64.pack_into, 8, o, x, d)

    def PrependFloat32Slot(self, o: int, x: Any, d: Any) -> None:  # noqa: N802
        self._slot(_F32.pack_into, 4, o, x, d)

    def PrependFloat64Slot(self, o: int, x: Any, d: Any) -> None:  # noqa: N802
        self._slot(_F64.pack_into, 8, o, x, d)

    def PrependUOffsetTRelative(self, off: int) -> None:  # noqa: N802
        self.Prep(4, 0)
        here = len(self.Bytes) - self.head
        if off > here:
            raise flatbuffers.builder.OffsetArithmeticError(
                "flatbuffers: Offset arithmetic error.")
        self.head -= 4
        _U32.pack_into(self.Bytes, self.head, here - off + 4)

    def PrependUOffsetTRelativeSlot(self, o: int, x: int, d: int) -> None:  # noqa: N802
        if x != d:
            self.PrependUOffsetTRelative(x)
            self.current_vtable[o] = len(self.Bytes) - self.head

    def StartObject(self, numfields: int) -> None:  # noqa: N802
        self.current_vtable = [0] * numfields
        self.objectEnd = len(self.Bytes) - self.head
        self.nested = True

    def EndObject(self) -> int:  # noqa: N802
        """The object's soffset and its vtable, shared with an equal one written before."""
        self.nested = False
        self.Prep(4, 0)
        self.head -= 4  # the soffset, written below
        buf = self.Bytes
        object_offset = len(buf) - self.head
        vtable = self.current_vtable
        n = len(vtable)
        while n and not vtable[n - 1]:
            n -= 1  # trailing absent fields: not written
        fields = [object_offset - e if e else 0 for e in vtable[:n]]
        object_size = object_offset - self.objectEnd
        # The base class's key: the field offsets last to first, then the object's size.
        key = (*reversed(fields), object_size)
        found = self.vtables.get(key)
        object_start = len(buf) - object_offset
        if found is None:
            head = self.head - 2 * (n + 2)
            struct.pack_into(f"<{n + 2}H", buf, head, 2 * (n + 2), object_size, *fields)
            self.head = head
            _I32.pack_into(buf, object_start, (len(buf) - head) - object_offset)
            self.vtables[key] = len(buf) - head
        else:
            self.head = object_start
            _I32.pack_into(buf, object_start, found - object_offset)
        self.current_vtable = None
        return object_offset

    def StartVector(self, elemSize: int, numElems: int, alignment: int) -> int:  # noqa: N802, N803
        self.nested = True
        self.vectorNumElems = numElems
        self.Prep(4, elemSize * numElems)
        self.Prep(alignment, elemSize * numElems)
        return len(self.Bytes) - self.head

    def EndVector(self, numElems: int | None = None) -> int:  # noqa: N802, N803
        self.nested = False
        self.head -= 4
        _U32.pack_into(self.Bytes, self.head, self.vectorNumElems)
        self.vectorNumElems = None
        return len(self.Bytes) - self.head

    def CreateString(self, s: str | bytes, encoding: str = "utf-8",  # noqa: N802
                     errors: str = "strict") -> int:
        x = s.encode(encoding, errors) if isinstance(s, str) else bytes(s)
        n = len(x)
        head = self.head
        buf = self.Bytes
        pad = (head - len(buf) - n - 1) & 3  # what Prep(4, n + 1) pads
        if head < pad + n + 16:  # the builder may grow: the general way
            self.Prep(4, n + 1)
            head = self.head - 1 - n
            self.Bytes[head + n] = 0
            self.Bytes[head:head + n] = x
            self.head = head
            self.vectorNumElems = n
            return self.EndVector()
        # The length word, the bytes, their terminating zero and the padding, in one write.
        return len(buf) - self._below_head(_U32.pack(n) + x + _PAD[:pad + 1], 4)

    def _below_head(self, data: bytes, align: int) -> int:
        """``data`` (whole vectors, their padding included) written just below the head, as
        the generated calls would leave the builder (its alignment at least ``align``, no
        vector open); the new head."""
        start = self.head - len(data)
        self.Bytes[start:self.head] = data
        if align > self.minalign:
            self.minalign = align
        self.head = start
        self.vectorNumElems = None
        self.nested = False
        return start

    def create_numbers(self, values: list | tuple, dtype: str) -> int:
        """A vector of a list of numbers of ``dtype`` ("<i4", "<f4", "<i8"): what
        CreateNumpyVector writes of ``np.asarray(values, dtype)``, without the array."""
        code, width = _NUMBER_CODES[dtype]
        n = len(values)
        head = self.head
        if head < n * width + 24:  # the builder may grow: the general way
            try:
                payload = struct.pack(f"<{n}{code}", *values)
            except (struct.error, TypeError, OverflowError):  # numpy's conversion rules
                return self.CreateNumpyVector(np.asarray(values, dtype=dtype).reshape(-1))
            self.StartVector(width, n, width)
            head = self.head - len(payload)
            self.Bytes[head:self.head] = payload
            self.head = head
            self.vectorNumElems = n
            return self.EndVector()
        # StartVector's two Preps (4 for the length word, then the element width) pad to
        # the larger alignment at once; the length word, the payload and that padding are
        # then one write.
        buf = self.Bytes
        size = len(buf)
        align = 8 if width == 8 else 4
        pad = (head - size - n * width) & (align - 1)
        try:
            data = struct.pack(f"<I{n}{code}{pad}x", n, *values)
        except (struct.error, TypeError, OverflowError):  # numpy's conversion rules, then
            return self.CreateNumpyVector(np.asarray(values, dtype=dtype).reshape(-1))
        return size - self._below_head(data, align)

    def string_and_ints(self, s: str, ints: list[int]) -> tuple[int, int] | None:
        """CreateString(s), then create_numbers(ints, "<i4"), in one write: (the string,
        the vector); None when the builder could have to grow or an int does not fit (the
        caller then goes the general way)."""
        if type(s) is not str:
            return None
        x = s.encode()
        k = len(ints)
        head = self.head
        buf = self.Bytes
        n = len(buf)
        if head < len(x) + 4 * k + 32:
            return None
        try:
            data = _INTS[k].pack(k, *ints, len(x)) if k < len(_INTS) else \
                struct.pack(f"<I{k}iI", k, *ints, len(x))
        except (struct.error, TypeError, OverflowError):
            return None
        # The string's padding makes its length word 4-aligned, so the vector needs none.
        data += x + _PAD[:((head - n - len(x) - 1) & 3) + 1]
        start = self._below_head(data, 4)
        return n - start - 4 * k - 4, n - start

    def two_ints(self, a: list[int], b: list[int]) -> tuple[int, int] | None:
        """create_numbers(a, "<i4"), then create_numbers(b, "<i4"), in one write; None as
        :meth:`string_and_ints`."""
        head = self.head
        buf = self.Bytes
        n = len(buf)
        if head < 4 * (len(a) + len(b)) + 32:
            return None
        pad = (head - n) & 3  # before a (4-byte elements: b then needs none)
        try:
            data = struct.pack(f"<I{len(b)}iI{len(a)}i{pad}x", len(b), *b, len(a), *a)
        except (struct.error, TypeError, OverflowError):
            return None
        start = self._below_head(data, 4)
        return n - start - 4 * len(b) - 4, n - start

    def CreateNumpyVector(self, x: np.ndarray) -> int:  # noqa: N802
        if x.ndim > 1 or x.dtype.kind not in "biuf":
            return super().CreateNumpyVector(x)  # its errors
        payload = x.astype(x.dtype.newbyteorder("<"), copy=False).tobytes()
        self.StartVector(x.itemsize, x.size, x.dtype.alignment)
        head = self.head - len(payload)
        self.Bytes[head:self.head] = payload
        self.head = head
        self.vectorNumElems = x.size
        return self.EndVector()

    def table(self, module: str, keys: tuple[str, ...], values: Any) -> int | None:
        """A whole table at once: ``keys`` are its fields in the order the generated adders
        would be called, ``values`` theirs (None or the default: left out). The very bytes
        StartObject, each adder and EndObject write, in one pack (with the vtable when it is
        new) laid out by :func:`_plan`; None when the builder could have to grow or the
        table goes the generated way (the caller then does)."""
        spec = _spec(module, keys)
        if spec is None:
            return None
        defaults, align, plans, numfields, fields = spec
        mask, bit, present = 0, 1, []
        for x, default in zip(values, defaults):
            if x is not None and x != default:
                mask |= bit
                present.append(x)
            bit <<= 1
        head = self.head
        buf = self.Bytes
        n = len(buf)
        object_end = n - head
        at = object_end & align
        plan = plans.get(mask << 3 | at)
        if plan is None:
            plan = plans[mask << 3 | at] = _plan(numfields, fields, mask, at)
        size, key, vtable, new, found_pack, deltas, minalign, slots = plan
        if head < size + 2 * len(vtable) + 16:
            return None
        args = []
        for x, delta in zip(present, deltas):
            if delta is not None:  # an offset: from where it is written to its child
                x = object_end + delta - x
                if x < 4:
                    raise flatbuffers.builder.OffsetArithmeticError(
                        "flatbuffers: Offset arithmetic error.")
            args.append(x)
        args.reverse()
        object_offset = object_end + size
        found = self.vtables.get(key)
        if found is None:
            vhead = head - size - 2 * len(vtable)
            new(buf, vhead, *vtable, n - vhead - object_offset, *args)
            self.vtables[key] = n - vhead
            self.head = vhead
        else:
            found_pack(buf, head - size, found - object_offset, *args)
            self.head = head - size
        if minalign > self.minalign:
            self.minalign = minalign
        self.objectEnd = object_end
        self.fields_at = (object_end, slots)
        self.current_vtable = None
        self.nested = False
        return object_offset

    def offsets_vector(self, items: list[int]) -> int:
        """A vector of offsets to ``items`` (children written before): what
        ``Start...Vector`` (4-byte elements), PrependUOffsetTRelative on each, last first, and
        EndVector write."""
        count = len(items)
        if self.head < 4 * count + 16:
            self.StartVector(4, count, 4)
            for off in reversed(items):
                self.PrependUOffsetTRelative(off)
            return self.EndVector()
        self.StartVector(4, count, 4)  # aligns for the elements and the length word
        buf = self.Bytes
        n = len(buf)
        # Element j lies 4 (count - j) bytes below the head, and points from there.
        top = n - self.head + 4 * count
        values = [top - 4 * j - off for j, off in enumerate(items)]
        if values and min(values) < 4:
            raise flatbuffers.builder.OffsetArithmeticError(
                "flatbuffers: Offset arithmetic error.")
        self.head -= 4 * count + 4
        struct.pack_into(f"<I{count}I", buf, self.head, count, *values)  # and the length
        self.vectorNumElems = None
        self.nested = False
        return n - self.head


#: struct's code and width of the dtypes _numbers writes.
_NUMBER_CODES = {"<i4": ("i", 4), "<f4": ("f", 4), "<i8": ("q", 8)}
_BOOL = struct.Struct("<?")
_I8 = struct.Struct("<b")
_U8 = struct.Struct("<B")
_I16 = struct.Struct("<h")
_U16 = struct.Struct("<H")
_I32 = struct.Struct("<i")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
_F32 = struct.Struct("<f")
_F64 = struct.Struct("<d")
#: (length word, k int32s, a string's length word) for a tensor's shape of rank k.
_INTS = [struct.Struct(f"<I{k}iI") for k in range(9)]
#: Padding bytes (at most 7 per field), and struct's code for so many.
_PAD = bytes(8)
_PADS = ["", "x", "2x", "3x", "4x", "5x", "6x", "7x"]


@functools.cache
def _fn(module: str, name: str) -> Any:
    return getattr(importlib.import_module(f"tflite.{module}"), f"{module}{name}")


def _offsets(b: flatbuffers.Builder, module: str, vec: str, items: list[int]) -> int:
    if type(b) is _Builder:
        return b.offsets_vector(items)
    _fn(module, f"Start{vec}Vector")(b, len(items))
    for off in reversed(items):
        b.PrependUOffsetTRelative(off)
    return b.EndVector()


def _numbers(b: flatbuffers.Builder, values: Any, dtype: str) -> int:
    if type(b) is _Builder and type(values) in (list, tuple):
        return b.create_numbers(values, dtype)
    return b.CreateNumpyVector(np.asarray(values, dtype=dtype).reshape(-1))


@functools.cache
def _table_fns(module: str) -> tuple[Any, Any, dict[str, Any]]:
    """The generated Start, End and Add<field> functions of table ``module``."""
    mod = importlib.import_module(f"tflite.{module}")
    add = f"{module}Add"
    return (getattr(mod, f"{module}Start"), getattr(mod, f"{module}End"),
            {k[len(add):]: f for k, f in vars(mod).items() if k.startswith(add)})


class _Recorder:
    """Stands for the builder while a table's generated functions run once, to learn each
    field's slot, kind and default (:func:`_field`, :func:`_numfields`)."""

    def __init__(self) -> None:
        self.numfields = -1
        self.calls: list[tuple[str, int, Any]] = []

    def StartObject(self, numfields: int) -> None:  # noqa: N802
        self.numfields = numfields

    def __getattr__(self, name: str) -> Any:
        def record(slot: int, x: Any, d: Any) -> None:
            self.calls.append((name, slot, d))
        return record


#: The builder's slot methods: the width and struct code (None: an offset) of each.
_SLOT_KINDS: dict[str, tuple[int, str | None]] = {
    "PrependBoolSlot": (1, "?"), "PrependInt8Slot": (1, "b"), "PrependUint8Slot": (1, "B"),
    "PrependInt16Slot": (2, "h"), "PrependUint16Slot": (2, "H"), "PrependInt32Slot": (4, "i"),
    "PrependUint32Slot": (4, "I"), "PrependInt64Slot": (8, "q"), "PrependUint64Slot": (8, "Q"),
    "PrependFloat32Slot": (4, "f"), "PrependFloat64Slot": (8, "d"),
    "PrependUOffsetTRelativeSlot": (4, None)}


@functools.cache
def _field(module: str, key: str) -> tuple[int, int, str | None, Any] | None:
    """(slot, width, struct code or None for an offset, default) of field ``key`` of table
    ``module``, learnt from its generated adder (only the fields written are learnt); None
    when it does anything else (a table with it then goes the generated way)."""
    add = getattr(importlib.import_module(f"tflite.{module}"), f"{module}Add{key}", None)
    if add is None:
        raise KeyError(key)
    rec = _Recorder()
    try:
        add(rec, 1)
    except Exception:  # noqa: BLE001 - an adder that wants more than a number
        return None
    if len(rec.calls) != 1 or rec.calls[0][0] not in _SLOT_KINDS:
        return None
    name, slot, default = rec.calls[0]
    return (slot, *_SLOT_KINDS[name], default)


@functools.cache
def _numfields(module: str) -> int:
    """Table ``module``'s field count, from its generated Start (-1: it says none)."""
    rec = _Recorder()
    _fn(module, "Start")(rec)
    return rec.numfields


@functools.cache
def _spec(module: str, keys: tuple[str, ...]) -> tuple[Any, ...] | None:
    """What :meth:`_Builder.table` needs of fields ``keys`` of table ``module``: their
    defaults, the bits of a table's start its layout depends on (its widest field's
    alignment, at least 4), its :func:`_plan` by fields present and start (filled as they
    are met), the field count and each field's :func:`_field`; None when it goes the
    generated way."""
    numfields = _numfields(module)
    fields = tuple(_field(module, k) for k in keys)
    if numfields < 0 or None in fields:
        return None
    return (tuple(f[3] for f in fields), max([4, *(f[1] for f in fields)]) - 1, {},
            numfields, fields)


def _plan(numfields: int, fields: tuple[Any, ...], mask: int, align: int) -> tuple[Any, ...]:
    """How :meth:`_Builder.table` writes a table of ``numfields`` with those of ``fields``
    (:func:`_field`) that ``mask`` marks present, starting ``align`` bytes (modulo its widest
    field's alignment, see :func:`_spec`) from the buffer's end: what Prep pads before each
    field and before the soffset depends on no more, and so neither do the table's size, its
    vtable and where each field lies (counted from where the table starts). (size, vtable
    key, vtable entries, its packer with the vtable, without, per present field the
    distance of an offset from the start (None: a scalar), the minimum alignment, each
    slot's distance (0: absent))."""
    d = 0
    codes, deltas, minalign = [], [], 4
    slots = [0] * numfields
    for k, (slot, width, code, _) in enumerate(fields):
        if not mask >> k & 1:
            continue
        minalign = max(minalign, width)
        pad = -(align + d) & (width - 1)
        if pad:
            d += pad
            codes.append(_PADS[pad])
        d += width
        codes.append("I" if code is None else code)
        deltas.append(d if code is None else None)
        slots[slot] = d
    pad = -(align + d) & 3
    if pad:
        d += pad
        codes.append(_PADS[pad])
    size = d + 4  # and the soffset
    k = numfields
    while k and not slots[k - 1]:
        k -= 1  # trailing absent fields: not written
    entries = [size - e if e else 0 for e in slots[:k]]
    body = "".join(reversed(codes))
    return (size, (*reversed(entries), size), (2 * (k + 2), size, *entries),
            struct.Struct(f"<{k + 2}Hi{body}").pack_into, struct.Struct(f"<i{body}").pack_into,
            tuple(deltas), minalign, tuple(slots))


def _fields(b: flatbuffers.Builder, module: str, keys: tuple[str, ...], values: Any) -> int:
    """A table whose children are already built: ``keys`` its fields in the order the
    generated adders would be called, ``values`` theirs (None: absent)."""
    if type(b) is _Builder:
        done = b.table(module, keys, values)
        if done is not None:
            return done
    start, end, adders = _table_fns(module)
    start(b)
    for key, value in zip(keys, values):
        if value is not None:
            adders[key](b, value)
    return end(b)


def _table(b: flatbuffers.Builder, module: str, fields: dict[str, Any]) -> int:
    """:func:`_fields` of a dict."""
    return _fields(b, module, tuple(fields), tuple(fields.values()))


def _options(b: flatbuffers.Builder, name: str, options: dict[str, Any]) -> int:
    """An options table: list values become int32 vectors first (ReshapeOptions.NewShape,
    SqueezeOptions.SqueezeDims...), the rest are scalars."""
    return _fields(b, name, tuple(options),
                   [_numbers(b, v, "<i4") if isinstance(v, (list, tuple)) else v
                    for v in options.values()])


def _data_len(data: bytes | np.ndarray) -> int:
    """A constant's byte length, bytes or array alike (not the operand size rule)."""
    return data.nbytes if isinstance(data, np.ndarray) else len(data)


def _buffer(b: flatbuffers.Builder, data: bytes | np.ndarray) -> int:
    n = _data_len(data)
    if not n:
        return _table(b, "Buffer", {})
    # A ubyte vector whose first byte lands on the boundary, its bytes copied once (what
    # the builder's CreateByteVector does, which takes bytes only).
    b.Prep(_BUFFER_ALIGN, n)
    b.StartVector(1, n, 1)
    b.head -= n
    raw = data.reshape(-1).view(np.uint8) if isinstance(data, np.ndarray) else data
    b.Bytes[b.head:b.head + n] = raw if isinstance(raw, bytes) else memoryview(raw)
    return _table(b, "Buffer", {"Data": b.EndVector()})


def _tensor(b: flatbuffers.Builder, t: TensorDef) -> int:
    both = b.string_and_ints(t.name, t.shape) if type(b) is _Builder and \
        type(t.shape) is list else None
    if both is None:
        name = b.CreateString(t.name)
        shape = _numbers(b, t.shape, "<i4")
    else:
        name, shape = both
    signature = _numbers(b, t.shape_signature, "<i4") if t.shape_signature else None
    quant = None
    if t.scales is not None:
        arrays = t.quant_arrays() if type(b) is _Builder else None
        if arrays is not None:  # the same numbers, without packing thousands one by one
            scale = b.CreateNumpyVector(arrays[0].astype("<f4"))
            zp = b.CreateNumpyVector(arrays[1].astype("<i8", copy=False))
        else:
            scale = _numbers(b, t.scales, "<f4")
            zp = _numbers(b, t.zero_points or [0] * len(t.scales), "<i8")
        quant = _fields(b, "QuantizationParameters", _QUANTIZATION,
                        (scale, zp, t.quantized_dimension))
    return _fields(b, "Tensor", _TENSOR, (shape, t.type, t.buffer, name, quant, signature,
                                          True if t.is_variable else None))


_QUANTIZATION = ("Scale", "ZeroPoint", "QuantizedDimension")
_TENSOR = ("Shape", "Type", "Buffer", "Name", "Quantization", "ShapeSignature", "IsVariable")
_OPERATOR = ("OpcodeIndex", "Inputs", "Outputs", "BuiltinOptionsType", "BuiltinOptions")


def _operator(b: flatbuffers.Builder, op: OperatorDef, opcode_index: int) -> int:
    both = b.two_ints(op.inputs, op.outputs) if type(b) is _Builder and \
        type(op.inputs) is list and type(op.outputs) is list else None
    if both is None:
        inputs = _numbers(b, op.inputs, "<i4")
        outputs = _numbers(b, op.outputs, "<i4")
    else:
        inputs, outputs = both
    options = options_type = None
    if op.options_name:
        options = _options(b, op.options_name, op.options)
        options_type = _options_type(op.options_name)
    return _fields(b, "Operator", _OPERATOR,
                   (opcode_index, inputs, outputs, options_type, options))


@functools.cache
def _options_type(name: str) -> int:
    """The BuiltinOptions union's tag of options table ``name``."""
    return getattr(tflite.BuiltinOptions, name)


def _subgraph(b: flatbuffers.Builder, sg: SubgraphDef, opcodes: dict[int, int]) -> int:
    tensors = [_tensor(b, t) for t in sg.tensors]
    operators = [_operator(b, op, opcodes[op.code]) for op in sg.operators]
    name = b.CreateString(sg.name)
    return _table(b, "SubGraph", {
        "Tensors": _offsets(b, "SubGraph", "Tensors", tensors),
        "Inputs": _numbers(b, sg.inputs, "<i4"), "Outputs": _numbers(b, sg.outputs, "<i4"),
        "Operators": _offsets(b, "SubGraph", "Operators", operators), "Name": name})


def _signature(b: flatbuffers.Builder, key: str, inputs: list[tuple[str, int]],
               outputs: list[tuple[str, int]]) -> int:
    def maps(items: list[tuple[str, int]], vec: str) -> int:
        tables = [_table(b, "TensorMap", {"Name": b.CreateString(n), "TensorIndex": i})
                  for n, i in items]
        return _offsets(b, "SignatureDef", vec, tables)

    ins, outs = maps(inputs, "Inputs"), maps(outputs, "Outputs")
    return _table(b, "SignatureDef", {"Inputs": ins, "Outputs": outs,
                                      "SignatureKey": b.CreateString(key),
                                      "SubgraphIndex": 0})


def _outside(b: flatbuffers.Builder, size: int) -> tuple[int, int]:
    """A Buffer table whose data lies past the flatbuffer (``offset`` and ``size``, the
    schema's form for large models): the offset is written as a placeholder, patched once the
    flatbuffer's length is known. (The table, where the placeholder sits, counted from the
    end of the builder's bytes.)"""
    if type(b) is _Builder:
        table = b.table("Buffer", _OUTSIDE, (_PLACEHOLDER_OFFSET, size))
        if table is not None:
            object_end, slots = b.fields_at
            return table, object_end + slots[_field("Buffer", "Offset")[0]]  # type: ignore
    _fn("Buffer", "Start")(b)
    _fn("Buffer", "AddOffset")(b, _PLACEHOLDER_OFFSET)  # non-zero: always written
    at = b.Offset()
    _fn("Buffer", "AddSize")(b, size)
    return _fn("Buffer", "End")(b), at


#: Any value above 1 (TFLite's sign of data outside the flatbuffer) holds the offset's place.
_PLACEHOLDER_OFFSET = 1 << 40
_OUTSIDE = ("Offset", "Size")


def serialise(model: ModelDef, *, data_outside: bool = False,
              builder: type[flatbuffers.Builder] = _Builder,
              frame: tuple[Frame, Callable[[Any], int | None]] | None = None) -> bytes:
    """The .tflite bytes (schema version 3, identifier TFL3) of ``model``.

    ``data_outside``: constant data goes after the flatbuffer (each Buffer's ``offset`` and
    ``size``, which TFLite reads since 2.14, for models past 2 GB), so the weights are
    copied once, straight into the result, and the builder holds only the small tables;
    otherwise inside (each Buffer's ``data``), which every TFLite reader takes.
    ``frame`` (with ``data_outside``): a frame holding the weights (nnhal.memory.frame) and
    where a constant lies in it (None: elsewhere); when the frame can still be claimed and
    its room takes the tables and the other constants, the result is the frame's buffer, the
    flatbuffer built around the weights where they lie: nothing of them copied.
    ``builder``: flatbuffers.Builder writes the very same bytes, slower."""
    codes = sorted({op.code for sg in model.subgraphs for op in sg.operators})
    opcodes = {code: k for k, code in enumerate(codes)}
    # Room for everything, so the builder never grows: the data (when inside), and a
    # generous bound on the tables, vectors and strings around it.
    names = sum(len(t.name) for sg in model.subgraphs for t in sg.tensors)
    items = sum(len(sg.tensors) + len(sg.operators) for sg in model.subgraphs)
    scales = sum(len(t.scales or ()) for sg in model.subgraphs for t in sg.tensors)
    size = sum((0 if data_outside else _data_len(d)) + 2 * _BUFFER_ALIGN + 32
               for d in model.buffers) + 4 * names + 512 * items + 16 * scales + 65536
    b = builder(size)
    # Buffers first: the largest children, at the end of the file.
    outside: list[tuple[int, int, bytes | np.ndarray]] = []  # (placeholder, offset, data)
    buffers = []
    end = 0  # where the next outside buffer starts, counted from the first one's start
    for data in model.buffers:
        n = _data_len(data)
        if data_outside and n:
            table, at = _outside(b, n)
            outside.append((at, end, data))
            end = _align(end + n)
            buffers.append(table)
        else:
            buffers.append(_buffer(b, data))
    subgraphs = [_subgraph(b, sg, opcodes) for sg in model.subgraphs]
    codes_tables = [_table(b, "OperatorCode", {
        "DeprecatedBuiltinCode": min(code, _PLACEHOLDER_FOR_GREATER_OP_CODES),
        "BuiltinCode": code, "Version": 1}) for code in codes]
    signatures = None
    if model.signature is not None:
        signatures = _offsets(b, "Model", "SignatureDefs", [_signature(b, *model.signature)])
    description = b.CreateString(model.description)
    root = _table(b, "Model", {
        "Version": SCHEMA_VERSION,
        "OperatorCodes": _offsets(b, "Model", "OperatorCodes", codes_tables),
        "Subgraphs": _offsets(b, "Model", "Subgraphs", subgraphs),
        "Description": description,
        "Buffers": _offsets(b, "Model", "Buffers", buffers),
        "SignatureDefs": signatures})
    b.Finish(root, file_identifier=FILE_IDENTIFIER)
    if not outside:
        return bytes(memoryview(b.Bytes)[b.Head():])  # one copy (Output() slices, then bytes())
    flat = bytearray(memoryview(b.Bytes)[b.Head():])
    if frame is not None:
        framed = _in_frame(flat, outside, *frame)
        if framed is not None:
            return framed
    base = _align(len(flat))
    pieces: list[Any] = [flat, bytes(base - len(flat))]
    for at, offset, data in outside:
        _U64.pack_into(flat, len(flat) - at, base + offset)
        pieces.append(data.reshape(-1).view(np.uint8) if isinstance(data, np.ndarray) else data)
        pad = _align(_data_len(data)) - _data_len(data)
        if pad:
            pieces.append(bytes(pad))
    return b"".join(pieces)  # the one copy of the weights


def _in_frame(flat: bytearray, outside: list[tuple[int, int, bytes | np.ndarray]],
              frame: Frame, locate: Callable[[Any], int | None]) -> bytes | None:
    """The frame's buffer with ``flat`` (the tables) in its tail, each outside constant's
    offset the place it lies in the frame (or the tail, after the tables, for one that
    does not), and the root offset and identifier in its head; None when the room is short
    or another export claimed the frame first."""
    start = frame.tail
    end = _align(start + len(flat))
    elsewhere = []
    for at, _, data in outside:
        where = locate(data)
        if where is None:
            where, end = end, _align(end + _data_len(data))
            elsewhere.append((where, data))
        _U64.pack_into(flat, len(flat) - at, where)
    if end > len(frame.buffer) or not frame.claim():
        return None
    head = _U32.pack(start + _U32.unpack_from(flat, 0)[0]) + FILE_IDENTIFIER
    # The tables and the small constants after them go in as one write (each write of the
    # frame has a cost of its own), their padding zeros as the room's are; a large constant
    # on its own, not copied twice.
    at, chunk = start, flat
    for where, data in elsewhere:
        raw = memoryview(data.reshape(-1).view(np.uint8) if isinstance(data, np.ndarray)
                         else data)
        if raw.nbytes > _SMALL_CONSTANT:
            if chunk:
                frame.write(at, chunk)
            frame.write(where, raw)
            at, chunk = where + raw.nbytes, bytearray()
        else:
            chunk += bytes(where - at - len(chunk))
            chunk += raw
    if chunk:
        frame.write(at, chunk)
    frame.write(0, head)
    frame.trim(end)
    return frame.buffer


#: Constants up to this size not in the frame are copied in with the tables (one write).
_SMALL_CONSTANT = 1 << 16


def _align(n: int) -> int:
    return (n + _BUFFER_ALIGN - 1) // _BUFFER_ALIGN * _BUFFER_ALIGN
