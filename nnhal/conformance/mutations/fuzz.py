"""Random models, requests and byte corruptions for fuzzing a driver.

The generators (:func:`random_model`, :func:`random_typed_model`, :func:`random_request`,
:func:`mutate_bytes`, :func:`mutate_model_bytes`) take a :class:`random.Random`, so hypothesis
(``st.randoms()``) can drive and shrink them and a long run can drive them from a plain
seed."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from nnhal.conformance.mutations.common import QUANT_TYPES, byte_size
from nnhal.conformance.mutations.model import copy_model
from nnhal.hal.types import (
    DataLocation,
    Model,
    Operand,
    OperandLifeTime,
    OperandType,
    Operation,
    OperationType,
    Request,
    RequestArgument,
    Subgraph,
    SymmPerChannelQuantParams,
)
from nnhal.memory import SharedMemory

L = OperandLifeTime
T = OperandType
Op = OperationType


#: Operations the random graph generator draws from, with (inputs, outputs) it usually uses.
_FUZZ_OPS: dict[int, tuple[int, int]] = {
    Op.ADD: (3, 1), Op.MUL: (3, 1), Op.SUB: (3, 1), Op.DIV: (3, 1), Op.RELU: (1, 1),
    Op.TANH: (1, 1), Op.LOGISTIC: (1, 1), Op.FLOOR: (1, 1), Op.SOFTMAX: (2, 1),
    Op.CONCATENATION: (3, 1), Op.RESHAPE: (2, 1), Op.TRANSPOSE: (2, 1), Op.MEAN: (3, 1),
    Op.PAD: (2, 1), Op.SQUEEZE: (2, 1), Op.CAST: (1, 1), Op.ABS: (1, 1), Op.ARGMAX: (2, 1),
    Op.MAXIMUM: (2, 1), Op.EXP: (1, 1), Op.GATHER: (3, 1), Op.SPLIT: (3, 2), Op.TILE: (2, 1),
    Op.FULLY_CONNECTED: (4, 1), Op.CONV_2D: (7, 1), Op.MAX_POOL_2D: (7, 1),
    Op.DEPTHWISE_CONV_2D: (8, 1), Op.RESIZE_BILINEAR: (3, 1), Op.SLICE: (3, 1),
    Op.STRIDED_SLICE: (7, 1), Op.REDUCE_SUM: (3, 1), Op.QUANTIZE: (1, 1),
    Op.DEQUANTIZE: (1, 1), Op.SELECT: (3, 1), Op.EQUAL: (2, 1), Op.BATCH_TO_SPACE_ND: (2, 1),
    Op.L2_NORMALIZATION: (1, 1), Op.TOPK_V2: (2, 2), Op.RANK: (1, 1), Op.FILL: (2, 1),
    Op.EXPAND_DIMS: (2, 1), Op.EMBEDDING_LOOKUP: (2, 1), Op.HASHTABLE_LOOKUP: (3, 2),
    Op.LSH_PROJECTION: (4, 1), Op.INSTANCE_NORMALIZATION: (5, 1), Op.PRELU: (2, 1),
    Op.LOG_SOFTMAX: (3, 1), Op.CHANNEL_SHUFFLE: (3, 1), Op.ROI_ALIGN: (10, 1),
    Op.HARD_SWISH: (1, 1), Op.ELU: (2, 1), Op.RESIZE_NEAREST_NEIGHBOR: (4, 1),
}
_FUZZ_TYPES = [t for t in T if t not in (T.OEM, T.TENSOR_OEM_BYTE)]


def _rand_dims(rng: random.Random, rank: int | None = None) -> list[int]:
    rank = rng.choice([0, 1, 1, 2, 2, 3, 4, 4]) if rank is None else rank
    return [rng.choice([0, 1, 1, 2, 2, 3, 4, 5]) for _ in range(rank)]


def _rand_values(rng: random.Random, t: T, count: int) -> bytes:
    """Plausible values most of the time (small ints, finite floats), garbage sometimes."""
    if rng.random() < 0.2:
        return rng.randbytes(count * t.byte_size)
    if t.dtype.kind == "f":
        arr = np.asarray([rng.uniform(-4, 4) for _ in range(count)], dtype=t.dtype)
    elif t.dtype.kind == "b":
        arr = np.asarray([rng.random() < 0.5 for _ in range(count)], dtype=np.uint8)
    else:
        info = np.iinfo(t.dtype)
        lo, hi = max(int(info.min), -3), min(int(info.max), 5)
        arr = np.asarray([rng.randint(lo, hi) for _ in range(count)], dtype=t.dtype)
    return arr.tobytes()


def random_model(rng: random.Random, *, max_operations: int = 4) -> Model:
    """A random graph of random operations over random operands; mostly invalid, sometimes
    valid. Built in operation order, so the structure is often plausible enough to reach the
    per-operation validation and, when it passes, execution."""
    values = bytearray()
    pool = bytearray()
    operands: list[Operand] = []
    operations: list[Operation] = []
    inputs: list[int] = []
    available: list[int] = []

    def add_operand(lifetime: L) -> int:
        t = rng.choice(_FUZZ_TYPES) if rng.random() < 0.5 else rng.choice(
            [T.TENSOR_FLOAT32, T.TENSOR_FLOAT32, T.INT32, T.TENSOR_INT32, T.TENSOR_QUANT8_ASYMM,
             T.TENSOR_FLOAT16, T.BOOL, T.FLOAT32])
        dims = [] if (t.is_scalar or t == T.SUBGRAPH) else _rand_dims(rng)
        scale, zp = 0.0, 0
        if t in (*QUANT_TYPES, T.TENSOR_QUANT8_ASYMM_SIGNED):
            scale = rng.choice([0.5, 1.0, 0.25, 0.0])
            zp = rng.choice([0, 0, 1, 128, -1])
        extra = None
        if t == T.TENSOR_QUANT8_SYMM_PER_CHANNEL and dims:
            extra = SymmPerChannelQuantParams([1.0] * dims[0], 0)
        o = Operand(type=int(t), dimensions=dims, scale=scale, zero_point=zp, lifetime=lifetime,
                    extra_params=extra)
        if lifetime in (L.CONSTANT_COPY, L.CONSTANT_REFERENCE):
            count = 1 if t.is_scalar else int(np.prod(dims or [0], dtype=np.int64))
            if t == T.SUBGRAPH or 0 in dims or not dims and not t.is_scalar:
                count = 0
            blob = _rand_values(rng, t, count) if t != T.SUBGRAPH else b""
            target = values if lifetime == L.CONSTANT_COPY else pool
            off = len(target)
            target.extend(blob)
            o.location = DataLocation(0, off, len(blob))
        operands.append(o)
        return len(operands) - 1

    for _ in range(rng.randint(1, 3)):
        i = add_operand(L.SUBGRAPH_INPUT)
        inputs.append(i)
        available.append(i)
    for _ in range(rng.randint(0, max_operations)):
        op_type = rng.choice(list(_FUZZ_OPS)) if rng.random() < 0.95 else rng.randint(0, 120)
        n_in, n_out = _FUZZ_OPS.get(op_type, (rng.randint(0, 4), rng.randint(0, 2)))
        if rng.random() < 0.15:
            n_in += rng.choice([-1, 1])
        ins = []
        for _k in range(max(n_in, 0)):
            r = rng.random()
            if r < 0.45 and available:
                ins.append(rng.choice(available))
            elif r < 0.9:
                ins.append(add_operand(rng.choice([L.CONSTANT_COPY, L.CONSTANT_COPY,
                                                   L.CONSTANT_REFERENCE])))
            elif r < 0.95:
                ins.append(add_operand(L.NO_VALUE))
            else:
                ins.append(rng.randint(0, len(operands) + 1))  # maybe out of range
        outs = [add_operand(L.TEMPORARY_VARIABLE) for _ in range(n_out)]
        operations.append(Operation(int(op_type), ins, outs))
        available.extend(outs)
    outputs = []
    for k, op in enumerate(operands):
        op.number_of_consumers = sum(o.inputs.count(k) for o in operations)
    for k in available:
        if k not in inputs and operands[k].number_of_consumers == 0 and rng.random() < 0.9:
            operands[k].lifetime = L.SUBGRAPH_OUTPUT
            outputs.append(k)
    if rng.random() < 0.1 and operands:
        operands[rng.randrange(len(operands))].number_of_consumers += rng.choice([-1, 1])
    pools = [SharedMemory.from_bytes(bytes(pool))] if pool else []
    return Model(main=Subgraph(operands, operations, inputs, outputs),
                 operand_values=bytes(values), pools=pools,
                 relax_computation_float32_to_float16=rng.random() < 0.2)


_UNARY = (Op.RELU, Op.RELU1, Op.RELU6, Op.TANH, Op.LOGISTIC, Op.ABS, Op.EXP, Op.FLOOR,
          Op.NEG, Op.SQRT, Op.RSQRT, Op.SIN, Op.LOG, Op.HARD_SWISH, Op.CAST)
_BINARY_ACT = (Op.ADD, Op.MUL, Op.SUB, Op.DIV)
_BINARY = (Op.MAXIMUM, Op.MINIMUM, Op.EQUAL, Op.LESS, Op.GREATER)


def random_typed_model(rng: random.Random, *, max_operations: int = 5) -> Model:
    """A random graph that is usually valid: each operation is drawn from a few families whose
    signatures are known (unary, binary with broadcasting, softmax, concatenation, reshape,
    transpose, reductions), wired to earlier tensors with the right types and shapes; now and
    then a shape, type or parameter is deliberately off."""
    b_ops: list[Operand] = []
    values = bytearray()
    operations: list[Operation] = []
    t = rng.choice([T.TENSOR_FLOAT32, T.TENSOR_FLOAT32, T.TENSOR_FLOAT16, T.TENSOR_QUANT8_ASYMM])
    q = (rng.choice([0.5, 0.25, 1.0]), rng.randint(0, 255)) if t == T.TENSOR_QUANT8_ASYMM \
        else (0.0, 0)

    def operand(tt: T, dims: Sequence[int], lt: L = L.TEMPORARY_VARIABLE,
                quant: tuple[float, int] | None = None) -> int:
        sc, zp = quant if quant is not None else \
            (q if tt == T.TENSOR_QUANT8_ASYMM else (0.0, 0))
        b_ops.append(Operand(int(tt), list(dims), 0, sc, zp, lt))
        return len(b_ops) - 1

    def const(tt: T, arr: Any) -> int:
        blob = np.asarray(arr, dtype=np.uint8 if tt.dtype.kind == "b" else tt.dtype).tobytes()
        i = operand(tt, [] if tt.is_scalar else list(np.shape(arr)), L.CONSTANT_COPY)
        off = (len(values) + 7) // 8 * 8
        values.extend(b"\0" * (off - len(values)) + blob)
        b_ops[i].location = DataLocation(0, off, len(blob))
        return i

    rank = rng.randint(1, 4)
    shape = [rng.randint(1, 4) for _ in range(rank)]
    inputs = [operand(t, shape, L.SUBGRAPH_INPUT)]
    avail: list[tuple[int, list[int]]] = [(inputs[0], shape)]
    for _ in range(rng.randint(1, max_operations)):
        x, xs = rng.choice(avail)
        xt = T(b_ops[x].type)
        fam = rng.random()
        off = rng.random() < 0.08  # a deliberate mistake somewhere in this operation
        if fam < 0.3:
            kind = rng.choice(_UNARY)
            out_t = rng.choice([T.TENSOR_FLOAT32, T.TENSOR_INT32, xt]) if kind == Op.CAST else xt
            ins = [x]
            out_s = list(xs)
        elif fam < 0.55:
            kind = rng.choice(_BINARY_ACT + _BINARY)
            ys = [d if rng.random() < 0.7 else 1 for d in xs][rng.randint(0, len(xs) - 1):]
            y = operand(xt, ys, L.SUBGRAPH_INPUT)
            inputs.append(y)
            ins = [x, y] + ([const(T.INT32, rng.choice([0, 0, 1, 3]))]
                            if kind in _BINARY_ACT else [])
            out_t = T.TENSOR_BOOL8 if kind in (Op.EQUAL, Op.LESS, Op.GREATER) else xt
            out_s = list(xs)
        elif fam < 0.65:
            kind = Op.SOFTMAX
            beta = const(T.FLOAT16 if xt == T.TENSOR_FLOAT16 else T.FLOAT32, 1.0)
            ins, out_t, out_s = [x, beta], xt, list(xs)
        elif fam < 0.75:
            kind = Op.CONCATENATION
            axis = rng.randrange(len(xs))
            ins = [x, x, const(T.INT32, axis)]
            out_t, out_s = xt, [d * 2 if k == axis else d for k, d in enumerate(xs)]
        elif fam < 0.85:
            kind = Op.RESHAPE
            n = int(np.prod(xs))
            ins, out_t, out_s = [x, const(T.TENSOR_INT32, [n])], xt, [n]
        elif fam < 0.93:
            kind = Op.TRANSPOSE
            perm = list(range(len(xs)))
            rng.shuffle(perm)
            ins, out_t = [x, const(T.TENSOR_INT32, perm)], xt
            out_s = [xs[p] for p in perm]
        else:
            kind = rng.choice([Op.MEAN, Op.REDUCE_SUM, Op.REDUCE_MAX])
            axis = rng.randrange(len(xs))
            if kind == Op.MEAN:
                ins = [x, const(T.TENSOR_INT32, [axis]), const(T.INT32, 1)]
            else:
                ins = [x, const(T.TENSOR_INT32, [axis]), const(T.BOOL, True)]
            out_t, out_s = xt, [1 if k == axis else d for k, d in enumerate(xs)]
        if off:
            what = rng.randrange(4)
            if what == 0:
                out_s = [d + 1 for d in out_s]
            elif what == 1:
                out_t = rng.choice(_FUZZ_TYPES)
            elif what == 2 and len(ins) > 1:
                ins.pop()
            else:
                ins.append(rng.choice(avail)[0])
        if rng.random() < 0.2:
            out_s = [0] * len(out_s)  # unknown at model time
        try:
            tt = T(out_t)
            odims: list[int] = [] if tt.is_scalar else out_s
        except ValueError:
            odims = out_s
        out = operand(out_t, odims, quant=(1.0, 0) if out_t == T.TENSOR_QUANT8_ASYMM and
                      kind in (Op.SOFTMAX, Op.LOGISTIC) else None)
        if out_t == T.TENSOR_QUANT8_ASYMM and kind == Op.SOFTMAX:
            b_ops[out].scale, b_ops[out].zero_point = 1.0 / 256, 0
        operations.append(Operation(int(kind), ins, [out]))
        if T(b_ops[out].type).is_tensor if b_ops[out].type in tuple(T) else False:
            avail.append((out, [d or 1 for d in out_s]))
    for k, o in enumerate(b_ops):
        o.number_of_consumers = sum(op.inputs.count(k) for op in operations)
    outputs = []
    for op in operations:
        for k in op.outputs:
            if b_ops[k].number_of_consumers == 0:
                b_ops[k].lifetime = L.SUBGRAPH_OUTPUT
                outputs.append(k)
    return Model(main=Subgraph(b_ops, operations, inputs, outputs),
                 operand_values=bytes(values),
                 relax_computation_float32_to_float16=rng.random() < 0.2)


#: Largest input (in elements) and output (in 4-byte words) a fuzzed request carries.
MAX_FUZZ_ELEMENTS = 1 << 16
#: Bytes written around every output region of a fuzzed request, checked afterwards.
GUARD = 64
GUARD_BYTE = 0xA5


@dataclass
class FuzzRequest:
    """A request with guard bytes around each output region (see :meth:`guards_intact`)."""

    request: Request
    input_memory: SharedMemory
    output_memory: SharedMemory
    regions: list[tuple[int, int]]

    def _writable(self, pool_index: int, size: int) -> np.ndarray:
        """Mask of the bytes of pool ``pool_index`` that the request's outputs (as they are
        now, after any corruption) may legitimately be written to."""
        mask = np.zeros(size, dtype=bool)
        for a in self.request.outputs:
            loc = a.location
            if not a.has_no_value and loc.pool_index == pool_index and 0 <= loc.offset < size:
                mask[loc.offset:max(loc.offset, min(size, loc.offset + max(0, loc.length)))] = \
                    True
        return mask

    def guards_intact(self) -> bool:
        """No byte of the output pool outside the outputs' regions changed."""
        raw = np.frombuffer(self.output_memory.read(0, self.output_memory.size), np.uint8)
        free = ~self._writable(1, raw.size)
        return bool(np.all(raw[free] == GUARD_BYTE))

    def inputs_intact(self, before: bytes) -> bool:
        """The input pool is unchanged, except where an output points into it."""
        now = np.frombuffer(self.input_memory.read(0, self.input_memory.size), np.uint8)
        old = np.frombuffer(before, np.uint8)
        free = ~self._writable(0, now.size)
        return bool(np.array_equal(now[free], old[free]))

    def close(self) -> None:
        self.input_memory.close()
        self.output_memory.close()


def random_request(rng: random.Random, main: Subgraph) -> FuzzRequest:
    """A request for ``main``: usually well-formed (sizes from the model, random values,
    unknown dimensions filled), sometimes with wrong sizes, dimensions or omitted inputs."""
    blobs: list[bytes] = []
    in_args: list[RequestArgument] = []
    off = 0
    for idx in main.input_indexes:
        o = main.operands[idx] if 0 <= idx < len(main.operands) else Operand(T.INT32)
        try:
            t = T(o.type)
        except ValueError:
            t = T.TENSOR_FLOAT32
        dims = [d or rng.randint(1, 3) for d in o.dimensions] if t.is_tensor else []
        if t.is_tensor and not dims:
            dims = _rand_dims(rng, rng.randint(1, 3))
            dims = [d or 1 for d in dims]
        count = int(np.prod(dims, dtype=np.int64)) if dims else 1
        if count > MAX_FUZZ_ELEMENTS:  # absurd model dimensions: send a short input instead
            count = rng.randint(0, 16)
        blob = _rand_values(rng, t, count) if t != T.SUBGRAPH else b""
        if rng.random() < 0.05:
            in_args.append(RequestArgument(True, DataLocation(), []))
            continue
        if rng.random() < 0.05:
            dims = [d + 1 for d in dims]
        if rng.random() < 0.05 and blob:
            blob = blob[:-1]
        off = (off + 7) // 8 * 8
        in_args.append(RequestArgument(False, DataLocation(0, off, len(blob)), dims))
        blobs.append(b"\0" * (off - sum(len(b) for b in blobs)) + blob)
        off += len(blob)
    in_mem = SharedMemory.from_bytes(b"".join(blobs))
    out_args: list[RequestArgument] = []
    regions: list[tuple[int, int]] = []
    off = GUARD
    for idx in main.output_indexes:
        o = main.operands[idx] if 0 <= idx < len(main.operands) else Operand(T.INT32)
        size = byte_size(o) or rng.choice([0, 4, 16, 64, 256])
        size = min(size, MAX_FUZZ_ELEMENTS * 4)
        if rng.random() < 0.1:
            size = max(0, size + rng.choice([-4, -1, 1, 4]))
        out_args.append(RequestArgument(False, DataLocation(1, off, size), []))
        regions.append((off, size))
        off += size + GUARD
    out_mem = SharedMemory.ashmem(off)
    out_mem.array()[:] = GUARD_BYTE
    return FuzzRequest(Request(in_args, out_args, [in_mem, out_mem]), in_mem, out_mem, regions)


def mutate_bytes(rng: random.Random, data: bytes, n: int | None = None) -> bytes:
    """Flip, set or clear a few random bytes (or bits) of ``data``."""
    if not data:
        return data
    buf = bytearray(data)
    for _ in range(n or rng.randint(1, 4)):
        i = rng.randrange(len(buf))
        r = rng.random()
        buf[i] = (buf[i] ^ (1 << rng.randrange(8))) if r < 0.5 else \
            (0xFF if r < 0.7 else (0x00 if r < 0.85 else rng.randrange(256)))
    return bytes(buf)


def mutate_model_bytes(rng: random.Random, model: Model) -> Model:
    """A copy of ``model`` with corrupted operandValues, pool contents or dimensions. The
    result may be valid (most byte flips in weights are) or not; either way the driver must
    answer without raising, crashing or hanging."""
    m = copy_model(model)
    what = rng.random()
    if what < 0.35 and m.operand_values:
        m.operand_values = mutate_bytes(rng, m.operand_values)
    elif what < 0.6 and m.pools:
        k = rng.randrange(len(m.pools))
        src = m.pools[k]
        m.pools[k] = SharedMemory.from_bytes(mutate_bytes(rng, src.read(0, src.size)))
    else:
        sgs = [m.main, *m.referenced]
        sg = rng.choice(sgs)
        if sg.operands:
            o = rng.choice(sg.operands)
            if o.dimensions:
                j = rng.randrange(len(o.dimensions))
                o.dimensions[j] = rng.choice([0, 1, 2, o.dimensions[j] + 1,
                                              max(0, o.dimensions[j] - 1), 1 << 20, 0xFFFFFFFF])
            else:
                o.dimensions = [rng.choice([0, 1, 3])]
    return m
