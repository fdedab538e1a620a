"""The LiteRT driver's IPreparedModel: the shared execution paths
(:class:`~nnhal.drivers.common.prepared_model.PreparedModelBase`) over a pool of LiteRT
interpreters of one flatbuffer.

Inputs go from the request's pools into the interpreter's input tensors (one copy, by
``set_tensor``, from a view of the pool bytes); outputs go from views of the interpreter's
output tensors into the request's pools (one copy). An input whose dimensions differ from the
ones its interpreter is allocated for is resized first; output shapes are the interpreter's.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from nnhal.analysis import ModelGraph
from nnhal.drivers.common.prepared_model import PreparedModelBase, PreparingDevice
from nnhal.drivers.litert import direct
from nnhal.drivers.litert.cache import LiteRTPlan
from nnhal.drivers.litert.engine import EnginePool
from nnhal.drivers.litert.state import LiteRTStateArrays
from nnhal.executor import RunError, RunState
from nnhal.executor import profile as _profile
from nnhal.executor.run import input_shape, read_argument, write_outputs
from nnhal.hal.interfaces import ArrayRun
from nnhal.hal.request_pool import RequestPool
from nnhal.hal.types import (
    ErrorStatus,
    MemoryPool,
    OperandType,
    OutputShape,
    Priority,
    Request,
    Subgraph,
)
from nnhal.memory import SharedMemory
from nnhal.memory.pool import watch_of
from nnhal.tflite.export_state import StateForm, StateFormError, state_as_variables

_BOOLS = (OperandType.BOOL, OperandType.TENSOR_BOOL8)
_NONE = ErrorStatus.NONE


def _input_view(raw: np.ndarray, t: OperandType, shape: tuple[int, ...]) -> np.ndarray:
    """An input's bytes as an array for ``set_tensor`` (which copies it): a plain view of the
    pool, left as writeable as the pool is (ai-edge-litert takes a read-only view about 1 us
    slower per input); booleans decoded."""
    if t in _BOOLS:
        return read_argument(raw, t, shape)
    nbytes = t.byte_size * math.prod(shape)
    return raw[:nbytes].view(t.dtype).reshape(shape)


class LiteRTRequest:
    """A validated request bound once (a reusable execution, a burst's repeated request):
    views of its inputs in shared memory and of its outputs' places, decided here."""

    __slots__ = ("request", "pools", "watch", "buffers", "inputs", "shapes", "outputs",
                 "all_inputs", "direct", "dims", "feeds")

    def __init__(self, pm: LiteRTPreparedModel, request: Request,
                 pools: Sequence[RequestPool]):
        self.request = request
        self.pools = list(pools)
        mems = (p.hidl_memory if isinstance(p, MemoryPool) else p for p in request.pools)
        self.watch = watch_of([m for m in mems if isinstance(m, SharedMemory)])
        self.buffers = any(not isinstance(p, np.ndarray) for p in pools)
        #: Per input: its array (a view of the pool) or None (read at each run).
        self.inputs: list[np.ndarray | None] = []
        self.shapes = pm.input_shapes(request)
        main = pm.graph.main
        for arg, idx, shape in zip(request.inputs, main.inputs, self.shapes):
            pool = None if arg.has_no_value else pools[arg.location.pool_index]
            info = main.operands[idx]
            if isinstance(pool, np.ndarray) and info.type not in _BOOLS and shape is not None:
                loc = arg.location
                self.inputs.append(_input_view(pool[loc.offset:loc.offset + loc.length],
                                               info.type, shape))
            else:
                self.inputs.append(None)
        #: Every input is a view already: nothing to read at run time.
        self.all_inputs = all(x is not None for x in self.inputs)
        #: Per output: its place in its pool as a typed array of the inferred shape, or None.
        self.outputs: list[np.ndarray | None] = []
        for arg, idx in zip(request.outputs, main.outputs):
            self.outputs.append(_place(arg, pools, main.operands[idx].type, main.shapes[idx]))
        #: (tensor index, input view) and (tensor index, output place) pairs, made at the
        #: first direct run.
        self.feeds: tuple[tuple[tuple[int, np.ndarray], ...],
                          tuple[tuple[int, np.ndarray], ...]] | None = None
        #: Per output, its dimensions when known before the run (see ``direct``).
        self.dims: list[list[int]] = [list(p.shape) for p in self.outputs if p is not None]
        #: The direct way applies: every input a view, every output a place of the shape the
        #: analysis knows (the interpreter's output is checked against it at each run).
        self.direct = self.all_inputs and len(self.dims) == len(self.outputs) and all(
            known is not None and tuple(p.shape) == known  # type: ignore[union-attr]
            for p, known in zip(self.outputs, pm._known))


def _place(arg: object, pools: Sequence[RequestPool], t: OperandType,
           shape: object) -> np.ndarray | None:
    if arg.has_no_value or not t.is_tensor or t in _BOOLS:  # type: ignore[attr-defined]
        return None
    if not shape or 0 in shape:  # type: ignore[operator]
        return None
    loc = arg.location  # type: ignore[attr-defined]
    pool = pools[loc.pool_index]
    if not isinstance(pool, np.ndarray):
        return None
    nbytes = t.byte_size * int(math.prod(shape))  # type: ignore[arg-type]
    if nbytes > loc.length or loc.offset + nbytes > pool.size:
        return None
    raw = pool[loc.offset:loc.offset + nbytes]
    if raw.ctypes.data % t.dtype.itemsize:
        return None
    return raw.view(t.dtype).reshape(tuple(shape))  # type: ignore[arg-type]


class LiteRTArrays(ArrayRun):
    """Runs of one input layout with the caller's arrays (see
    :meth:`LiteRTPreparedModel.bind_arrays`): each input set straight from the caller's array
    into the interpreter (one copy, as ``set_tensor``), each output copied straight out of it
    into a fresh array (one copy, as ``get_tensor``); no request memory in between."""

    __slots__ = ("pm", "engines", "shapes", "known", "tensors", "bools")

    def __init__(self, pm: LiteRTPreparedModel, shapes: list[tuple[int, ...]],
                 tensors: tuple[tuple[int, ...], tuple[int, ...]],
                 bools: tuple[int, ...] = ()):
        self.pm = pm
        self.engines = pm.engines
        self.shapes = shapes
        #: The input and output tensor indexes (the same in every interpreter of the model).
        self.tensors = tensors
        #: The boolean inputs: an array of them whose bytes are not all 0 or 1 (a view of
        #: other bytes as bool, which numpy reads as nonzero) is set as ``a != 0``, as a run
        #: by request reads it; TFLite would read the raw byte.
        self.bools = bools
        self.known: list[tuple[int, ...]] = pm._known  # type: ignore[assignment]

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray] | None:
        prof = _profile.ACTIVE
        started = time.perf_counter() if prof is not None else 0.0
        outs = self._run_on(self.engines, inputs)
        if prof is not None and outs is not None:
            prof.whole_run(time.perf_counter() - started)
        return outs

    def _run_on(self, pool: EnginePool, inputs: Sequence[np.ndarray]
                ) -> list[np.ndarray] | None:
        """One run on an interpreter of ``pool`` (the model's, or its guarded form's)."""
        engine = pool.take()
        if engine.shapes != self.shapes:
            try:
                engine.fit(self.shapes)
            except Exception as e:  # noqa: BLE001 - the engine is not trusted again
                self.pm.device.log(f"bound run failed: {type(e).__name__}: {e}")
                return None
        return self._invoke(engine, inputs, pool)

    def direct(self) -> Any:
        """:meth:`run` as ai-edge-litert's own calls, with nothing around them but taking
        a free interpreter already fitted to this layout (any other case, and a profiled
        run, is :meth:`run`'s): one native call where it is built, else a closure."""
        native = direct.calls(
            pool=self.engines._free, calls=None, shapes=self.engines.layout(self.shapes),
            inputs=self.tensors[0], outputs=self.tensors[1], known=self.known,
            general=self.run, failed=self._failed, fix=self._fit_outputs, bools=self.bools)
        if native is not None:
            return native
        free = self.engines._free
        take, give = free.pop, free.append
        shapes, invoke, general = self.shapes, self._invoke, self.run
        profile = _profile

        def run(inputs: Sequence[np.ndarray]) -> list[np.ndarray] | None:
            if profile.ACTIVE is None and free:
                try:
                    engine = take()
                except IndexError:  # taken meanwhile by another thread
                    return general(inputs)
                if engine.shapes == shapes:
                    return invoke(engine, inputs)
                give(engine)
            return general(inputs)
        return run

    def _failed(self, e: BaseException, inputs: Sequence[np.ndarray]
                ) -> list[np.ndarray] | None:
        """A run that raised: made again on the guarded form where the model divides (a zero
        divisor; :attr:`EnginePool.divides`), else logged; its answer is the run's."""
        if self.engines.divides:
            try:
                pool = self.engines.guarded()
            except Exception as e2:  # noqa: BLE001 - reported as the run's failure
                self.pm.device.log(f"bound run failed: {type(e).__name__}: {e}; no guarded "
                                   f"form: {type(e2).__name__}: {e2}")
                return None
            return self._run_on(pool, inputs)
        self.pm.device.log(f"bound run failed: {type(e).__name__}: {e}")
        return None

    def _invoke(self, engine: Any, inputs: Sequence[np.ndarray], pool: Any = None
                ) -> list[np.ndarray] | None:
        """One run on ``engine`` (fitted to this layout), given back to ``pool`` (default:
        the model's) after it; None when it failed (the engine is not trusted again: not
        given back) or its outputs do not fit the model's shapes. A run that fails on the
        model's own pool goes to :meth:`_failed`, on the guarded form's it is reported."""
        pool = self.engines if pool is None else pool
        if self.bools:
            inputs = list(inputs)
            for k in self.bools:
                a = inputs[k]
                if a.size and a.view(np.uint8).max() > 1:
                    inputs[k] = a != 0
        try:
            w = engine.interpreter._interpreter
            set_tensor = w.SetTensor
            for idx, arr in zip(engine.inputs, inputs):
                set_tensor(idx, arr)
            w.Invoke()
            get = w.GetTensor
            outs = []
            for idx in engine.outputs:
                outs.append(get(idx, 0))  # copies, as get_tensor's
            del w, set_tensor, get
        except Exception as e:  # noqa: BLE001
            if pool is self.engines:
                return self._failed(e, inputs)
            self.pm.device.log(f"bound run failed: {type(e).__name__}: {e}")
            return None
        pool.give(engine)
        return self._fit_outputs(outs)

    def _fit_outputs(self, outs: list[np.ndarray]) -> list[np.ndarray] | None:
        """``outs`` in the model's shapes: TFLite's [] for the HAL's [1], say, reshaped;
        None when an output's size differs (the request way reports the shape the
        interpreter gives)."""
        known = self.known
        k = 0
        for out in outs:
            if out.shape != known[k]:
                if known[k] is None or out.size != math.prod(known[k]):
                    return None
                outs[k] = out.reshape(known[k])
            k += 1
        return outs


class LiteRTPreparedModel(PreparedModelBase):
    """IPreparedModel of the LiteRT driver: a flatbuffer and its interpreters."""

    def __init__(self, device: PreparingDevice, plan: LiteRTPlan, priority: Priority):
        super().__init__(device, priority)
        #: Inputs, outputs and interpreters (shared with models restored from one cache).
        self.plan = plan
        self.graph: ModelGraph = plan.graph
        self.engines: EnginePool = plan.engines
        main = plan.graph.main
        #: Per output: its shape when the analysis knows it fully, else None. TFLite may give
        #: the same elements another shape (a reduction to one element is [] there, [1] in
        #: the HAL, which has no rank-0 tensors): outputs are reported in the model's shape.
        self._known: list[tuple[int, ...] | None] = [
            tuple(main.shapes[i]) if main.shapes[i] and 0 not in main.shapes[i] else None
            for i in main.outputs]
        #: The flatbuffer with state pairs as resource variables, per pairs (None: refused).
        self._state_forms: dict[tuple[tuple[int, int], ...], StateForm | None] = {}

    @property
    def flatbuffer(self) -> bytes:
        return self.engines.flatbuffer

    @property
    def signature(self) -> Subgraph:
        return self.graph.signature

    def input_shapes(self, request: Request) -> list[tuple[int, ...] | None]:
        """Per input, the shape the request gives it (None: omitted)."""
        main = self.graph.main
        shapes: list[tuple[int, ...] | None] = []
        for arg, idx in zip(request.inputs, main.inputs):
            if arg.has_no_value:
                shapes.append(None)
                continue
            info = main.operands[idx]
            shapes.append(input_shape(info.shape or (), arg.dimensions)
                          if info.type.is_tensor else ())
        return shapes

    def bind_arrays(self, shapes: Sequence[tuple[int, ...]]) -> LiteRTArrays | None:
        """Offered when every input and output is a tensor, every output's shape is known and
        the interpreters can be called directly (``Engine.direct``)."""
        main = self.graph.main
        if len(shapes) != len(main.inputs) or any(k is None for k in self._known):
            return None
        for idx in (*main.inputs, *main.outputs):
            if not main.operands[idx].type.is_tensor:
                return None
        engine = self.engines.take()
        direct, tensors = engine.direct, (tuple(engine.inputs), tuple(engine.outputs))
        self.engines.give(engine)
        if not direct:
            return None
        bools = tuple(k for k, idx in enumerate(main.inputs)
                      if main.operands[idx].type in _BOOLS)
        return LiteRTArrays(self, [tuple(int(d) for d in s) for s in shapes], tensors, bools)

    def bind_arrays_with_state(self, shapes: Sequence[tuple[int, ...]],
                               state: Sequence[tuple[int, int]]) -> LiteRTStateArrays | None:
        """Offered as :meth:`bind_arrays` is, when the flatbuffer takes the pairs as resource
        variables (:mod:`nnhal.drivers.litert.state`); each binding has an interpreter of
        its own, which holds its stream's state."""
        main = self.graph.main
        pairs = tuple((int(i), int(o)) for i, o in state)
        if not pairs or len(shapes) != len(main.inputs) or \
                any(k is None for k in self._known) or self.engines.divides:
            return None  # (divides: a run that fails may have set some of the state)
        for idx in (*main.inputs, *main.outputs):
            t = main.operands[idx].type
            if not t.is_tensor or t in _BOOLS:
                return None
        if pairs not in self._state_forms:
            try:
                self._state_forms[pairs] = state_as_variables(self.flatbuffer, pairs)
            except StateFormError as e:
                self.device.log(f"state kept as inputs and outputs: {e}")
                self._state_forms[pairs] = None
        form = self._state_forms[pairs]
        if form is None:
            return None
        state_in = {i for i, _ in pairs}
        state_out = {o for _, o in pairs}
        shapes = [tuple(int(d) for d in s) for s in shapes]
        dtypes = [main.operands[i].type.dtype for i in main.inputs]
        return LiteRTStateArrays.make(
            form, self.engines.threads,
            [s for k, s in enumerate(shapes) if k not in state_in],
            [k for j, k in enumerate(self._known) if j not in state_out],  # type: ignore[misc]
            [dtypes[i] for i, _ in pairs], [shapes[i] for i, _ in pairs],
            [d for k, d in enumerate(dtypes) if k not in state_in], self.device.log,
            self.engines.xnnpack)

    def request_plan(self, request: Request, pools: Sequence[RequestPool]
                     ) -> LiteRTRequest | None:
        try:
            return LiteRTRequest(self, request, pools)
        except Exception as e:  # noqa: BLE001 - runs of it take the generic way, which reports
            self.device.log(f"request not bound: {type(e).__name__}: {e}")
            return None

    def _inputs(self, request: Request, pools: Sequence[RequestPool],
                shapes: Sequence[tuple[int, ...] | None],
                given: Sequence[np.ndarray | None] | None) -> list[np.ndarray | None]:
        main = self.graph.main
        arrays: list[np.ndarray | None] = []
        for k, (arg, idx, shape) in enumerate(zip(request.inputs, main.inputs, shapes)):
            if given is not None and given[k] is not None:
                arrays.append(given[k])
                continue
            if shape is None:
                if idx in self.graph.required_inputs:
                    raise RunError(ErrorStatus.INVALID_ARGUMENT, f"input operand {idx} "
                                         "is required but has no value")
                raise RunError(ErrorStatus.GENERAL_FAILURE, f"input operand {idx} "
                                     "omitted: LiteRT has no omitted inputs")
            info = main.operands[idx]
            pool = pools[arg.location.pool_index]
            if isinstance(pool, np.ndarray):
                loc = arg.location
                arrays.append(_input_view(pool[loc.offset:loc.offset + loc.length],
                                          info.type, shape))
            else:
                arrays.append(pool.read_input(info, shape))
        return arrays

    def execute_checked(self, request: Request, pools: Sequence[RequestPool], rt: RunState,
                        prepared: LiteRTRequest | None) -> tuple[ErrorStatus, list[OutputShape]]:
        prof = _profile.ACTIVE
        if prof is None:
            return self._run_checked(request, pools, rt, prepared)
        # ai-edge-litert's Python API has no per-operation profiler: the whole run is timed.
        started = time.perf_counter()
        try:
            return self._run_checked(request, pools, rt, prepared)
        finally:
            prof.whole_run(time.perf_counter() - started)

    def _run_checked(self, request: Request, pools: Sequence[RequestPool], rt: RunState,
                     prepared: LiteRTRequest | None) -> tuple[ErrorStatus, list[OutputShape]]:
        engines = self.engines
        if prepared is not None and prepared.direct and rt.deadline_ns is None:
            try:
                done = self._direct(prepared)
            except Exception:
                if not engines.divides:
                    raise
                done, engines = None, engines.guarded()  # (a zero divisor: see below)
            if done is not None:
                return done
        if prepared is None:
            shapes = self.input_shapes(request)
            inputs = self._inputs(request, pools, shapes, None)
        else:
            shapes = prepared.shapes
            inputs = prepared.inputs if prepared.all_inputs else \
                self._inputs(request, pools, shapes, prepared.inputs)
        if rt.deadline_ns is not None:
            rt.check_deadline()
        # Taken by this run alone; given back only after a clean run: an interpreter that
        # failed half-way is not trusted again (the next run makes a fresh one).
        engine = engines.take()
        engine.fit(shapes)
        try:
            engine.invoke(inputs)
        except Exception:
            # A model that divides by a run-time int32 divisor: TFLite's FLOOR_DIV fails on
            # a zero, where the HAL gives 0; the guarded form gives it (and fails the run
            # for anything else, as this one did).
            if not engines.divides or engines is not self.engines:
                raise
            engines = engines.guarded()
            engine = engines.take()
            engine.fit(shapes)
            engine.invoke(inputs)
        outs = engine.output_views()
        for k, known in enumerate(self._known):
            if known is not None and outs[k].shape != known and outs[k].size == math.prod(known):
                outs[k] = outs[k].reshape(known)
        try:
            result = self._store(request, pools, outs, prepared)
        finally:
            del outs  # the views must be gone before this interpreter resizes again
        engines.give(engine)
        return result

    def _direct(self, prepared: LiteRTRequest) -> tuple[ErrorStatus, list[OutputShape]] | None:
        """A bound request on the shortest way: set each input, invoke, copy each output
        straight from the interpreter into its place. None (nothing written that the general
        way would not write again): an output's shape is not the one expected, or the engine
        has no direct access; the caller then takes the general way."""
        engines = self.engines
        engine = engines.take()
        if not engine.direct:
            engines.give(engine)
            return None
        if engine.shapes != prepared.shapes:
            engine.fit(prepared.shapes)  # before ``w`` is held: resizing counts references
        feeds = prepared.feeds
        if feeds is None:  # tensor indexes are the same in every interpreter of one model
            feeds = prepared.feeds = (tuple(zip(engine.inputs, prepared.inputs)),
                                      tuple(zip(engine.outputs, prepared.outputs)))
        w = engine.interpreter._interpreter
        set_tensor = w.SetTensor
        for idx, arr in feeds[0]:
            set_tensor(idx, arr)
        w.Invoke()  # raises on failure: the engine is not given back (not trusted again)
        tensor = w.tensor
        out = None
        copyto = np.copyto
        for idx, place in feeds[1]:
            out = tensor(w, idx)
            if out.shape != place.shape:
                break
            copyto(place, out)
        else:
            del out, w, tensor, set_tensor  # no view may live when the interpreter runs again
            engines.give(engine)
            return _NONE, [OutputShape(d[:], True) for d in prepared.dims]
        del out, w, tensor, set_tensor
        # An output of another shape (TFLite's [] for the HAL's [1], say): the general way
        # reshapes or reports it. The interpreter holds this run's results: read them again.
        try:
            outs = engine.output_views()
            for k, known in enumerate(self._known):
                if known is not None and outs[k].shape != known and \
                        outs[k].size == math.prod(known):
                    outs[k] = outs[k].reshape(known)
            result = self._store(prepared.request, prepared.pools, outs, prepared)
        finally:
            outs = []
        engines.give(engine)
        return result

    @staticmethod
    def _store(request: Request, pools: Sequence[RequestPool], outs: list[np.ndarray],
               prepared: LiteRTRequest | None) -> tuple[ErrorStatus, list[OutputShape]]:
        if prepared is not None:
            places = prepared.outputs
            for out, place in zip(outs, places):
                if place is None or place.shape != out.shape or place.dtype != out.dtype:
                    break
            else:
                for out, place in zip(outs, places):
                    np.copyto(place, out)  # type: ignore[arg-type]
                return ErrorStatus.NONE, [OutputShape(list(o.shape), True) for o in outs]
        return write_outputs(request, pools, outs)
