"""Running a validated request against a prepared plan: read inputs, run, write outputs."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import numpy as np

from nnhal.executor.plan import ModelPlan, RunError, RunState, run_fixed
from nnhal.hal.request_pool import RequestPool
from nnhal.hal.types import ErrorStatus, OperandType, OutputShape, Request
from nnhal.memory.pool import watch_of

_BOOLS = (OperandType.BOOL, OperandType.TENSOR_BOOL8)


def read_argument(raw: np.ndarray, t: OperandType, shape: tuple[int, ...]) -> np.ndarray:
    """Decode an input from pool bytes: a read-only view where the layout allows."""
    count = int(math.prod(shape))  # math.prod: no numpy reduction on the hot path
    nbytes = count * t.byte_size
    data = raw[:nbytes]
    arr = (data != 0) if t in _BOOLS else data.view(t.dtype)
    arr = arr.reshape(shape)
    arr.flags.writeable = False
    return arr


def encode(arr: np.ndarray) -> np.ndarray:
    """An output array as the bytes the HAL stores (booleans as one byte each)."""
    if arr.dtype == np.bool_:
        arr = arr.astype(np.uint8)
    return np.ascontiguousarray(arr).reshape(-1).view(np.uint8)


def input_shape(model_dims: Sequence[int], request_dims: Sequence[int]) -> tuple[int, ...]:
    if not request_dims:
        return tuple(model_dims)
    return tuple(int(d) for d in request_dims)


def run_request(plan: ModelPlan, request: Request, pools: Sequence[RequestPool],
                rt: RunState) -> tuple[ErrorStatus, list[OutputShape]]:
    """Execute; ``pools`` are uint8 arrays or driver buffers (RequestBuffer)."""
    main = plan.main
    inputs: list[np.ndarray | None] = []
    for arg, idx in zip(request.inputs, main.input_indexes):
        if arg.has_no_value:
            if idx in plan.required_inputs:
                raise RunError(ErrorStatus.INVALID_ARGUMENT, f"input operand {idx} "
                                     "is required but has no value")
            inputs.append(None)
            continue
        info = main.infos[idx]
        pool = pools[arg.location.pool_index]
        shape = input_shape(info.shape or (), arg.dimensions) if info.type.is_tensor else ()
        if isinstance(pool, np.ndarray):
            raw = pool[arg.location.offset:arg.location.offset + arg.location.length]
            inputs.append(read_argument(raw, info.type, shape))
        else:
            inputs.append(pool.read_input(info, shape))
    outs = plan.run(inputs, rt)
    return write_outputs(request, pools, outs)


def write_outputs(request: Request, pools: Sequence[RequestPool], outs: Sequence[np.ndarray],
                  done: Sequence[np.ndarray | None] = ()) -> tuple[ErrorStatus,
                                                                   list[OutputShape]]:
    """Store the outputs in their pools (the ones ``done`` marks are there already) or report
    OUTPUT_INSUFFICIENT_SIZE with every output's shape."""
    shapes: list[OutputShape] = []
    sufficient = True
    datas: list[np.ndarray | None] = []
    for k, (arg, out) in enumerate(zip(request.outputs, outs)):
        data = None
        if k < len(done) and done[k] is not None:
            ok = True
        elif arg.has_no_value:
            ok = True
        else:
            pool = pools[arg.location.pool_index]
            if isinstance(pool, np.ndarray):
                data = encode(out)
                ok = data.size <= arg.location.length
            else:
                ok = pool.can_hold(out)
        datas.append(data)
        sufficient &= ok
        shapes.append(OutputShape(dimensions=list(out.shape), is_sufficient=ok))
    if not sufficient:
        return ErrorStatus.OUTPUT_INSUFFICIENT_SIZE, shapes
    for k, (arg, out) in enumerate(zip(request.outputs, outs)):
        if arg.has_no_value or (k < len(done) and done[k] is not None):
            continue
        pool = pools[arg.location.pool_index]
        data = datas[k]
        if data is not None:
            pool[arg.location.offset:arg.location.offset + data.size] = data
        else:
            pool.write_output(out)  # type: ignore[union-attr]
    return ErrorStatus.NONE, shapes


class RequestPlan:
    """A validated request bound to a prepared plan once, for executions that run it many
    times (a reusable execution; a burst's repeated request): input views, output
    destinations and the memories to check before each run are decided here.

    * An input in shared memory (not BOOL) is a read-only typed view built once: its bytes are
      read at run time, so a client writing new inputs between runs is seen.
    * An output in shared memory whose operand is written by a kernel taking its output memory
      (:attr:`SubgraphPlan.direct_outputs`), whose shape is known and whose location is large
      enough, aligned for its element type and overlapping no other argument of the request
      (same pool and byte range, or same file and file range through another memory) is
      written by that kernel straight into the pool: no copy afterwards.
    * Everything else (driver buffers, BOOL, unknown shapes) takes :func:`run_request`'s way.
    """

    __slots__ = ("plan", "inputs", "dynamic", "missing", "given", "direct", "shapes",
                 "request", "pools", "memories", "buffers", "views", "given_outs", "all_direct",
                 "watch", "fixed")

    def __init__(self, plan: ModelPlan, request: Request, pools: Sequence[RequestPool],
                 memories: Sequence[object] = ()):
        main = plan.main
        self.plan = plan
        self.request = request
        self.pools = list(pools)
        #: Shared memories to check for shrinking before each run.
        self.memories = list(memories)
        #: Those that may shrink (see :func:`~nnhal.memory.pool.shrunk_watched`).
        self.watch = watch_of(self.memories)
        #: Whether a pool is a driver buffer (told how each run ended).
        self.buffers = any(not isinstance(p, np.ndarray) for p in pools)
        self.inputs: list[np.ndarray | None] = []
        self.dynamic: list[tuple[int, object, object, tuple[int, ...]]] = []
        self.missing: int | None = None
        ranges: list[tuple[int, int, int]] = []  # (pool, start, end) of every argument
        for k, (arg, idx) in enumerate(zip(request.inputs, main.input_indexes)):
            if arg.has_no_value:
                if idx in plan.required_inputs and self.missing is None:
                    self.missing = idx
                self.inputs.append(None)
                continue
            info = main.infos[idx]
            pool = pools[arg.location.pool_index]
            shape = input_shape(info.shape or (), arg.dimensions) if info.type.is_tensor else ()
            loc = arg.location
            if isinstance(pool, np.ndarray) and info.type not in _BOOLS:
                ranges.append((loc.pool_index, loc.offset, loc.offset + loc.length))
                self.inputs.append(read_argument(pool[loc.offset:loc.offset + loc.length],
                                                 info.type, shape))
            else:
                if isinstance(pool, np.ndarray):
                    ranges.append((loc.pool_index, loc.offset, loc.offset + loc.length))
                self.inputs.append(None)
                self.dynamic.append((k, pool, info, shape))
        out_ranges: list[tuple[int, int, int] | None] = []
        for arg in request.outputs:
            loc = arg.location
            mine = None
            if not arg.has_no_value and isinstance(pools[loc.pool_index], np.ndarray):
                mine = (loc.pool_index, loc.offset, loc.offset + loc.length)
                ranges.append(mine)
            out_ranges.append(mine)
        files = [_file_of(m) for m in _memories_of(request)]
        self.given: dict[int, np.ndarray] = {}
        self.direct: list[np.ndarray | None] = []
        self.shapes: list[list[int]] = []
        specs = {idx: spec for step in main.steps if step.into is not None
                 for idx, spec in zip(step.outputs, step.out_specs)}
        for arg, idx, mine in zip(request.outputs, main.output_indexes, out_ranges):
            view = None
            pool = None if arg.has_no_value else pools[arg.location.pool_index]
            if isinstance(pool, np.ndarray) and idx in main.direct_outputs and \
                    main.infos[idx].type not in _BOOLS:
                dtype, shape = specs[idx]
                loc = arg.location
                nbytes = dtype.itemsize * int(math.prod(shape))
                raw = pool[loc.offset:loc.offset + nbytes]
                if nbytes <= loc.length and raw.size == nbytes and \
                        raw.ctypes.data % dtype.itemsize == 0 and \
                        not any(_overlap(mine, r, files) for r in ranges if r is not mine):
                    view = raw.view(dtype).reshape(shape)
                    self.given[idx] = view
                    self.shapes.append(list(shape))
            if view is None:
                self.shapes.append(list(main.inferred[idx] or ()))
            self.direct.append(view)
        #: Per step of the main subgraph: its output arrays when all are given.
        self.given_outs = main.outs_given(self.given)
        #: Every output is written straight into its pool.
        self.all_direct = all(d is not None for d in self.direct)
        #: The whole run decided once, when it can be (see SubgraphPlan.fixed_steps).
        self.fixed = main.fixed_steps(self.inputs, self.given) \
            if self.all_direct and not self.dynamic and self.missing is None else None
        #: Per output: where it goes in its pool as a typed view (None: the generic way).
        self.views: list[np.ndarray | None] = [
            d if d is not None else _typed_view(arg, pools, main.infos[idx], shape)
            for d, arg, idx, shape in zip(self.direct, request.outputs, main.output_indexes,
                                          self.shapes)]

    def run(self, rt: RunState) -> tuple[ErrorStatus, list[OutputShape]]:
        fixed = self.fixed
        if fixed is not None and rt.deadline_ns is None:
            run_fixed(fixed, rt)
            return ErrorStatus.NONE, [OutputShape(list(s), True) for s in self.shapes]
        if self.missing is not None:
            raise RunError(ErrorStatus.INVALID_ARGUMENT, f"input operand {self.missing} "
                                 "is required but has no value")
        inputs = self.inputs
        if self.dynamic:
            inputs = list(inputs)
            for k, pool, info, shape in self.dynamic:
                loc = self.request.inputs[k].location
                inputs[k] = (read_argument(pool[loc.offset:loc.offset + loc.length], info.type,
                                           shape) if isinstance(pool, np.ndarray)
                             else pool.read_input(info, shape))  # type: ignore[union-attr]
        plan = self.plan
        outs = plan.main.run(inputs, rt, plan.referenced, self.given or None, self.given_outs)
        if self.all_direct:
            for out, view in zip(outs, self.direct):
                if out is not view:
                    break
            else:  # every output written in place: their shapes are the known ones
                return ErrorStatus.NONE, [OutputShape(list(s), True) for s in self.shapes]
        views = self.views
        for out, view in zip(outs, views):
            if view is None or (out is not view and out.shape != view.shape):
                return write_outputs(self.request, self.pools, outs, self.direct)
        for out, view in zip(outs, views):
            if out is not view:
                view[...] = out
        return ErrorStatus.NONE, [OutputShape(dimensions=list(s), is_sufficient=True)
                                  for s in self.shapes]


def _typed_view(arg: object, pools: Sequence[RequestPool], info: object,
                shape: Sequence[int]) -> np.ndarray | None:
    """An output's place in its shared-memory pool as an array of its type and known shape;
    None for a driver buffer, BOOL, an unknown shape or a location too small."""
    if arg.has_no_value:  # type: ignore[attr-defined]
        return None
    loc = arg.location  # type: ignore[attr-defined]
    pool = pools[loc.pool_index]
    t = info.type  # type: ignore[attr-defined]
    if not isinstance(pool, np.ndarray) or t in _BOOLS or not t.is_tensor or not shape or \
            0 in shape:
        return None
    nbytes = t.byte_size * int(math.prod(shape))
    if nbytes > loc.length or loc.offset + nbytes > pool.size:
        return None
    return pool[loc.offset:loc.offset + nbytes].view(t.dtype).reshape(tuple(shape))


def _memories_of(request: Request) -> list[object]:
    return [getattr(p, "hidl_memory", p) for p in request.pools]


def _file_of(mem: object) -> tuple[int, int, int] | None:
    """(device, inode, offset of the region in the file) of a shared memory, if it has one."""
    fd, offset = getattr(mem, "fd", None), getattr(mem, "offset", 0)
    if not isinstance(fd, int):
        return None
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino, int(offset)


def _overlap(a: tuple[int, int, int], b: tuple[int, int, int],
             files: Sequence[tuple[int, int, int] | None]) -> bool:
    """Whether two argument ranges (pool, start, end) may share bytes: in one pool, or in two
    memories of one file (an unknown file counts as possibly shared)."""
    (pa, sa, ea), (pb, sb, eb) = a, b
    if pa != pb:
        fa = files[pa] if pa < len(files) else None
        fb = files[pb] if pb < len(files) else None
        if fa is None or fb is None:
            return True
        if fa[:2] != fb[:2]:
            return False
        sa, ea, sb, eb = sa + fa[2], ea + fa[2], sb + fb[2], eb + fb[2]
    return sa < eb and sb < ea
