"""Building HAL models and requests by hand, the way the NNAPI runtime lays them out.

Constants up to 128 bytes go into ``operandValues`` (CONSTANT_COPY); larger ones, and every
constant asked for as CONSTANT_REFERENCE, into one shared-memory pool that all subgraphs of the
model share; the pool is sealed when the model is built (its bytes can never change, see
:attr:`nnhal.memory.SharedMemory.immutable`). Values are placed at 8-byte aligned offsets.
Requests put inputs and outputs in shared memory.

A model with control flow: :meth:`ModelBuilder.subgraph` gives a builder for one referenced
subgraph (``Model.referenced[k]`` in creation order) and :meth:`SubgraphBuilder.reference`
adds the SUBGRAPH operand that names it::

    b = ModelBuilder()
    then_ = b.subgraph()
    x = then_.input(T.TENSOR_FLOAT32, [2])
    ...
    ref = b.reference(then_)
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from nnhal.errors import InputError
from nnhal.hal.request_layout import ArgSlot, RequestLayout
from nnhal.hal.types import (
    DataLocation,
    Model,
    Operand,
    OperandLifeTime,
    OperandType,
    Operation,
    OperationType,
    Subgraph,
    SymmPerChannelQuantParams,
    operand_nbytes,
)
from nnhal.memory import SharedMemory
from nnhal.memory.frame import Frame, FramedMemory
from nnhal.memory.pool import PartsWriter

#: Constants larger than this many bytes go to a pool, as the NNAPI runtime does.
MAX_INLINE = 128
#: A pool part this large starts writing the pool on a background thread (PartsWriter) while
#: the builder goes on: a large model's weights are copied while the rest is converted.
BACKGROUND_BYTES = 1 << 20
#: Alignment of every value in operandValues, the constant pool and request pools.
ALIGN = 8

L = OperandLifeTime
_CONSTANT = (L.CONSTANT_COPY, L.CONSTANT_REFERENCE)
#: struct's packing of the scalar types that take a Python int, float or bool as numpy does
#: (round to nearest; out of range raises, and constant() then says what numpy says; BOOL
#: only from a bool: numpy keeps any other byte).
_SCALAR_PACKS = {OperandType.INT32: struct.Struct("<i").pack,
                 OperandType.UINT32: struct.Struct("<I").pack,
                 OperandType.FLOAT32: struct.Struct("<f").pack,
                 OperandType.BOOL: struct.Struct("<?").pack}


def _align(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


def _append_aligned(buf: bytearray, blob: bytes) -> int:
    """Pad ``buf`` to the alignment, append ``blob``; the offset where it starts."""
    off = _align(len(buf))
    buf.extend(b"\0" * (off - len(buf)))
    buf.extend(blob)
    return off


def _immutable(arr: np.ndarray) -> bool:
    """Whether ``arr`` is C-contiguous and can never change: read-only all the way down to a
    ``bytes`` object (a view of a file's bytes, as the TFLite importer's constants are)."""
    return _bytes_under(arr) is not None


def _bytes_under(arr: np.ndarray) -> bytes | None:
    """The ``bytes`` object a C-contiguous array is a read-only view of, all the way down;
    None when it is anything else."""
    if not arr.flags.c_contiguous:
        return None
    base: Any = arr
    while isinstance(base, np.ndarray):
        if base.flags.writeable:
            return None
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj if base.readonly else None
    return base if type(base) is bytes else None


class _Constants:
    """The constant storage of one model: operandValues and the single constant pool.

    The pool's contents are kept as parts (bytes, or arrays that cannot change) until
    :meth:`pool_memory` writes each once into the shared memory: a large model's weights
    are copied once on their way from wherever they are to the pool, not appended to a
    growing buffer and copied again."""

    def __init__(self) -> None:
        self.values = bytearray()
        #: (offset, bytes or immutable array) per pool constant, in offset order.
        self.parts: list[tuple[int, bytes | np.ndarray]] = []
        self.pool_size = 0
        #: Writing the pool already, from the first large part on (PartsWriter), until the
        #: first pool_memory; after it (or when one could not be made), never again.
        self._writer: PartsWriter | None = None
        self._no_writer = False
        #: The bytes the constants are mostly views of (an imported file), its address, and
        #: where it starts in the pool once a constant is placed in it (None: not yet).
        self._source: bytes | memoryview | None = None
        self._source_at = 0
        self._source_base: int | None = None
        #: The ``bytes`` object the source's views lead down to (the source itself, or its
        #: frame's buffer), and the frame (nnhal.memory.frame) when the file was framed.
        self._source_obj: bytes | None = None
        self._frame: Frame | None = None
        #: The pool is the frame's bytes (FramedMemory): the file's, then the constants put
        #: after them; False once one did not fit (then a memfd, as for any other source).
        self._framed = False

    def use_source(self, data: bytes | Frame) -> None:
        """Constants that are views of ``data`` (an imported file's bytes, or the frame they
        were read into) are placed where they lie in it: the whole of it becomes one part of
        the pool, written at once (on the writer thread from the first such constant on)
        instead of weight by weight, and their locations are their offsets in it. A frame
        stays known to the pool (:attr:`SharedMemory.frame`), for a driver's export."""
        if isinstance(data, Frame):
            self._frame, self._source_obj, data = data, data.buffer, data.content
        elif type(data) is bytes:
            self._source_obj = data
        else:
            return
        if data:
            self._source = data
            self._source_at = np.frombuffer(data, np.uint8).ctypes.data
            if self._frame is not None and not self.pool_size:
                # The pool is the frame: the file at offset 0, nothing copied (FramedMemory).
                self._source_base, self._framed = 0, True
                self.parts.append((0, data))
                self.pool_size = len(data)
            elif len(data) >= BACKGROUND_BYTES:
                self._source_part()  # large: weights are likely; copied while reading on

    def _source_part(self) -> int:
        """Where the source starts in the pool, made a part of it (and its copy into the
        pool started) on the first call."""
        if self._source_base is None:
            src = self._source
            self._source_base = _align(self.pool_size, 64)
            self._add_part(self._source_base, src)  # type: ignore[arg-type]
            self.pool_size = self._source_base + len(src)  # type: ignore[arg-type]
            if self._writer is not None:
                self._writer.flush()  # the copy starts now, while the import goes on
        return self._source_base

    def _in_source(self, blob: np.ndarray, n: int) -> int | None:
        """The pool offset of ``blob`` when it is a view of the source aligned for its
        elements (a converter aligns buffers to 16 bytes; some lie 4 past that), else None."""
        src = self._source
        if src is None or _bytes_under(blob) is not self._source_obj:
            return None
        off = blob.ctypes.data - self._source_at
        if off < 0 or off + n > len(src) or off % blob.dtype.alignment:  # type: ignore[arg-type]
            return None
        return self._source_part() + off

    def _add_part(self, off: int, blob: bytes | np.ndarray) -> None:
        n = blob.nbytes if isinstance(blob, np.ndarray) else len(blob)
        self.parts.append((off, blob))
        try:
            if self._writer is not None:
                self._writer.write(off, blob)
            elif n >= BACKGROUND_BYTES and not self._no_writer:
                self._writer = PartsWriter()
                for part in self.parts:
                    self._writer.write(*part)
        except (OSError, RuntimeError):
            # No descriptor, or no thread (the interpreter is exiting): pool_memory
            # writes every part itself.
            self._writer, self._no_writer = None, True

    def place(self, blob: bytes | np.ndarray, lifetime: OperandLifeTime | None
              ) -> tuple[OperandLifeTime, DataLocation]:
        """Where a constant goes: inline when it is small and not asked for as a reference.
        ``blob``: bytes, or an array that :func:`_immutable` accepts (kept, not copied)."""
        n = blob.nbytes if isinstance(blob, np.ndarray) else len(blob)
        if lifetime != L.CONSTANT_REFERENCE and n <= MAX_INLINE:
            data = blob.tobytes() if isinstance(blob, np.ndarray) else blob
            return L.CONSTANT_COPY, DataLocation(0, _append_aligned(self.values, data), n)
        if n and self._source is not None and isinstance(blob, np.ndarray):
            at = self._in_source(blob, n)
            if at is not None:
                return L.CONSTANT_REFERENCE, DataLocation(0, at, n)
        off = _align(self.pool_size)
        if n:
            if self._framed and self._frame.put(off, blob):  # type: ignore[union-attr]
                self.parts.append((off, blob))
            else:
                self._unframe()
                self._add_part(off, blob)
        self.pool_size = off + n
        return L.CONSTANT_REFERENCE, DataLocation(0, off, n)

    def _unframe(self) -> None:
        """A constant did not fit beside the frame's file: the pool becomes a memfd holding
        every part (the file's copy started on the writer thread, as for bytes)."""
        if not self._framed:
            return
        self._framed = False
        parts, self.parts = self.parts, []
        for part in parts:
            self._add_part(*part)
        if self._writer is not None:
            self._writer.flush()

    def pool_memory(self) -> SharedMemory | None:
        """The pool as one shared memory (None when empty), sealed: a model's constants
        never change, so whoever reads them (the analysis, a driver, a served driver in
        another process) may keep views instead of copies."""
        self._no_writer = True
        writer, self._writer = self._writer, None
        if not self.pool_size:
            return None
        if self._framed:
            return FramedMemory(self._frame, self.pool_size)  # type: ignore[arg-type]
        mem = writer.finish(self.pool_size, seal=True) if writer is not None else \
            SharedMemory.from_parts(self.pool_size, self.parts, seal=True)
        if self._frame is not None and self._source_base is not None:
            mem.frame = (self._frame, self._source_base)
        return mem


class SubgraphBuilder:
    """Operands and operations of one subgraph, with its inputs and outputs.

    Operand indexes are returned in creation order. ``inputs`` and ``outputs`` list the
    subgraph's inputs and outputs in the order :meth:`input` and :meth:`output` were called;
    assign them to give another order. Each operation counts one more consumer for each of
    its inputs, except for operands created with an explicit ``consumers`` count.
    """

    def __init__(self, constants: _Constants | None = None, index: int = -1) -> None:
        self.operands: list[Operand] = []
        self.operations: list[Operation] = []
        self.inputs: list[int] = []
        self.outputs: list[int] = []
        #: -1 for the main subgraph, else the position in ``Model.referenced``.
        self.index = index
        self._constants = constants if constants is not None else _Constants()
        self._fixed_consumers: set[int] = set()

    # ---- operands --------------------------------------------------------------------------

    def operand(self, t: OperandType | int, dims: Sequence[int] = (), scale: float = 0.0,
                zero_point: int = 0, channel_quant: SymmPerChannelQuantParams | None = None,
                *, lifetime: OperandLifeTime = L.TEMPORARY_VARIABLE,
                consumers: int | None = None) -> int:
        """A value-less operand: TEMPORARY_VARIABLE unless ``lifetime`` says otherwise
        (SUBGRAPH_INPUT / SUBGRAPH_OUTPUT here do not add it to ``inputs`` / ``outputs``;
        :meth:`input` and :meth:`output` do). Constants, omitted operands and subgraph
        references have their own methods."""
        if lifetime in _CONSTANT or lifetime == L.SUBGRAPH:
            raise ValueError(f"{L(lifetime).name} operands carry a value: use constant() or "
                             f"reference()")
        o = Operand(type=t, dimensions=list(dims), scale=scale, zero_point=zero_point,
                    lifetime=lifetime, extra_params=channel_quant)
        if consumers is None:  # (most: no call to _add)
            self.operands.append(o)
            return len(self.operands) - 1
        return self._add(o, consumers)

    def _add(self, o: Operand, consumers: int | None) -> int:
        self.operands.append(o)
        i = len(self.operands) - 1
        if consumers is not None:
            o.number_of_consumers = int(consumers)
            self._fixed_consumers.add(i)
        return i

    def input(self, t: OperandType | int, dims: Sequence[int] = (), scale: float = 0.0,
              zero_point: int = 0, channel_quant: SymmPerChannelQuantParams | None = None,
              *, consumers: int | None = None) -> int:
        i = self.operand(t, dims, scale, zero_point, channel_quant,
                         lifetime=L.SUBGRAPH_INPUT, consumers=consumers)
        self.inputs.append(i)
        return i

    def output(self, t: OperandType | int, dims: Sequence[int] = (), scale: float = 0.0,
               zero_point: int = 0, channel_quant: SymmPerChannelQuantParams | None = None,
               *, consumers: int | None = None) -> int:
        i = self.operand(t, dims, scale, zero_point, channel_quant,
                         lifetime=L.SUBGRAPH_OUTPUT, consumers=consumers)
        self.outputs.append(i)
        return i

    def constant(self, t: OperandType, value: Any, dims: Sequence[int] | None = None,
                 scale: float = 0.0, zero_point: int = 0,
                 channel_quant: SymmPerChannelQuantParams | None = None, *,
                 lifetime: OperandLifeTime | None = None, consumers: int | None = None) -> int:
        """A constant holding ``value`` in the operand's type (booleans as bytes).

        ``lifetime`` None or CONSTANT_COPY: inline when at most :data:`MAX_INLINE` bytes,
        else CONSTANT_REFERENCE in the model's pool; CONSTANT_REFERENCE: always the pool.
        ``dims`` defaults to the value's shape (none for a scalar type)."""
        if lifetime is not None and lifetime not in _CONSTANT:
            raise ValueError(f"a constant cannot be {L(lifetime).name}")
        arr = np.asarray(value, dtype=np.uint8 if t.dtype == np.bool_ else t.dtype)
        if dims is None:
            dims = () if t.is_scalar else arr.shape
        # A view of immutable bytes (an imported file's weights) is kept as it is; anything
        # else is copied now, as the caller may change it before the model is built.
        lt, loc = self._constants.place(arr if _immutable(arr) else arr.tobytes(), lifetime)
        return self._add(Operand(type=t, dimensions=list(dims), scale=scale,
                                 zero_point=zero_point, lifetime=lt, location=loc,
                                 extra_params=channel_quant), consumers)

    def scalar(self, t: OperandType, value: Any, *, consumers: int | None = None) -> int:
        pack = _SCALAR_PACKS.get(t)
        if pack is not None and (type(value) is bool if t == OperandType.BOOL else
                                 type(value) in (int, float, bool)):
            # The bytes constant() would store, without an array on the way (a model has
            # hundreds of these); a value struct cannot take goes there, for its rules.
            try:
                blob = pack(value)
            except (struct.error, OverflowError):
                pass
            else:
                lt, loc = self._constants.place(blob, None)
                o = Operand(type=t, dimensions=[], lifetime=lt, location=loc)
                if consumers is None:  # (most: no call to _add)
                    self.operands.append(o)
                    return len(self.operands) - 1
                return self._add(o, consumers)
        return self.constant(t, value, consumers=consumers)

    def omitted(self, t: OperandType | int, dims: Sequence[int] = (), scale: float = 0.0,
                zero_point: int = 0, channel_quant: SymmPerChannelQuantParams | None = None,
                *, consumers: int | None = None) -> int:
        """An operand without a value (NO_VALUE, empty location): an omitted optional input."""
        return self.operand(t, dims, scale, zero_point, channel_quant, lifetime=L.NO_VALUE,
                            consumers=consumers)

    def reference(self, target: SubgraphBuilder | int, *, consumers: int | None = None) -> int:
        """A SUBGRAPH operand naming a referenced subgraph (a builder from
        :meth:`ModelBuilder.subgraph`, or its index in ``Model.referenced``)."""
        k = target.index if isinstance(target, SubgraphBuilder) else int(target)
        if isinstance(target, SubgraphBuilder) and k < 0:
            raise ValueError("the main subgraph cannot be referenced")
        return self._add(Operand(type=OperandType.SUBGRAPH, lifetime=L.SUBGRAPH,
                                 location=DataLocation(0, k, 0)), consumers)

    # ---- operations ------------------------------------------------------------------------

    def operation(self, op: OperationType | int, inputs: Sequence[int],
                  outputs: Sequence[int]) -> None:
        """Append an operation (indexes are taken as given, even out of range)."""
        for i in inputs:
            if 0 <= i < len(self.operands) and i not in self._fixed_consumers:
                self.operands[i].number_of_consumers += 1
        self.operations.append(Operation(int(op), list(inputs), list(outputs)))

    def build_subgraph(self) -> Subgraph:
        return Subgraph(self.operands, self.operations, list(self.inputs), list(self.outputs))


class ModelBuilder(SubgraphBuilder):
    """Builds a Model: the main subgraph through this builder's own methods, referenced
    subgraphs through :meth:`subgraph`; :meth:`build` makes the Model."""

    def __init__(self, relaxed: bool = False):
        super().__init__()
        self.relaxed = relaxed
        self.referenced: list[SubgraphBuilder] = []

    def use_source(self, data: bytes | Frame) -> None:
        """Constants given as views of ``data`` (an imported file's bytes: immutable) are
        placed in the pool at their offsets in it, ``data`` copied into the pool whole, once
        (see :meth:`_Constants.use_source`)."""
        self._constants.use_source(data)

    def subgraph(self) -> SubgraphBuilder:
        """A builder for the next referenced subgraph; it shares this model's constants."""
        sb = SubgraphBuilder(self._constants, len(self.referenced))
        self.referenced.append(sb)
        return sb

    def build(self) -> Model:
        pool = self._constants.pool_memory()
        pools = [pool] if pool is not None else []
        return Model(main=self.build_subgraph(),
                     referenced=[sb.build_subgraph() for sb in self.referenced],
                     operand_values=bytes(self._constants.values), pools=pools,
                     relax_computation_float32_to_float16=self.relaxed)


class RequestBuilder(RequestLayout):
    """Inputs in one ashmem pool and outputs in another; read outputs back with :meth:`output`.

    With ``model``, each array is first checked against the model's main inputs (count, dtype,
    known dimensions; an InputError names the input: never float64 bytes read as float32),
    inputs whose model dimensions are not all known get their dimensions in the request, and
    ``output_nbytes`` may be left out: each output gets the size of its known dimensions (0
    when some are unknown: the execution then reports OUTPUT_INSUFFICIENT_SIZE with the real
    shape, and :meth:`grow` makes room). ``sealed``: both memories sealed against shrinking
    (see :meth:`~nnhal.memory.SharedMemory.ashmem`), so executions need not check their size.
    """

    def __init__(self, inputs: Sequence[np.ndarray], output_nbytes: Sequence[int] | None = None,
                 *, model: Model | None = None, sealed: bool = False):
        dims: list[list[int]] = [[] for _ in inputs]
        if model is not None:
            dims = _check_inputs(model, inputs)
            if output_nbytes is None:
                output_nbytes = [operand_nbytes(model.main.operands[i]) or 0
                                 for i in model.main.output_indexes]
        if output_nbytes is None:
            raise TypeError("RequestBuilder needs output_nbytes, or a model to compute them")
        self.model = model
        arrays = [np.ascontiguousarray(a) for a in inputs]
        super().__init__([ArgSlot(a.nbytes, tuple(d)) for a, d in zip(arrays, dims)],
                         [ArgSlot(int(n)) for n in output_nbytes], sealed=sealed, both_pools=True)
        for k, a in enumerate(arrays):
            self.input_view(k)[:] = a.reshape(-1).view(np.uint8)

    @classmethod
    def for_model(cls, model: Model, inputs: Sequence[np.ndarray]) -> RequestBuilder:
        """A request for ``model`` with ``inputs`` checked against it."""
        return cls(inputs, model=model)

    def output(self, k: int, dtype: np.dtype | type | None = None,
               shape: Sequence[int] | None = None) -> np.ndarray:
        """Output ``k`` as an array; ``dtype`` and ``shape`` default to the model's (when the
        builder has one; pass the execution's OutputShape dimensions for unknown ones)."""
        if dtype is None or shape is None:
            if self.model is None:
                raise TypeError("output() needs dtype and shape without a model")
            op = self.model.main.operands[self.model.main.output_indexes[k]]
            dtype = OperandType(op.type).dtype if dtype is None else dtype
            shape = list(op.dimensions) if shape is None else shape
        return self.read_output(k, dtype, shape)


def _check_inputs(model: Model, inputs: Sequence[np.ndarray]) -> list[list[int]]:
    """InputError unless ``inputs`` match the model's main inputs; the request dimensions of
    each (its shape where the model's are not all known)."""
    main = model.main
    if len(inputs) != len(main.input_indexes):
        raise InputError(f"{len(inputs)} inputs given, the model takes "
                         f"{len(main.input_indexes)}")
    dims: list[list[int]] = []
    for k, (arr, idx) in enumerate(zip(inputs, main.input_indexes)):
        op = main.operands[idx]
        t = OperandType(op.type)
        got = np.asarray(arr)
        if got.dtype != t.dtype:
            raise InputError(f"input {k} is {got.dtype}, the model expects {t.dtype} "
                             f"({t.name})")
        want = [] if t.is_scalar else list(op.dimensions)
        if t.is_scalar or (want and 0 not in want):
            if tuple(got.shape) != tuple(want):
                raise InputError(f"input {k} has shape {tuple(got.shape)}, the model expects "
                                 f"{tuple(want)}")
            dims.append([])
            continue
        if (want and len(want) != got.ndim) or any(
                w and w != s for w, s in zip(want, got.shape)) or 0 in got.shape:
            shown = "any shape" if not want else tuple(want)
            raise InputError(f"input {k} has shape {tuple(got.shape)}, the model expects "
                             f"{shown} (0: any size but 0)")
        dims.append(list(got.shape))
    return dims
