"""The LiteRT driver's bound runs of a streaming model with its state kept in the interpreter
(:meth:`~nnhal.hal.interfaces.IPreparedModel.bind_arrays_with_state`).

The prepared flatbuffer carries each state variable as one more input and output (the HAL
keeps nothing between executions); carried that way, every call copies each state tensor in
and out through Python. Here the flatbuffer is extended with the pairs as TFLite resource
variables (:func:`nnhal.tflite.export_state.state_as_variables`), and one interpreter of it,
owned by the binding, keeps the state between calls as ai-edge-litert does with the
converter's own file: a call sets the other inputs, invokes and gets the other outputs, and
the state moves inside the interpreter (READ_VARIABLE first, ASSIGN_VARIABLE last). Two added
subgraphs set every variable (:meth:`LiteRTStateArrays.load`: the initial values, a reset,
the state a run by request left) and read them (:meth:`LiteRTStateArrays.read`).

Binding runs the interpreter once on zeros (after loading zeros), so every operator has run
and every output's shape is known before the first real call: a call then fails only as any
interpreter call may (out of memory), and since the assignments are the last operators, a
failure in the model's own operators leaves the variables as they were before the call.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from nnhal.drivers.litert import direct
from nnhal.drivers.litert.engine import Engine
from nnhal.executor import profile as _profile
from nnhal.hal.interfaces import StateArrayRun
from nnhal.tflite.export_state import StateForm


class LiteRTStateArrays(StateArrayRun):
    """Runs of one input layout of a streaming model in an interpreter of its own that keeps
    the state (see the module's docstring). Made by :meth:`make`; used by one caller at a
    time (a Session runs under its lock)."""

    __slots__ = ("engine", "form", "wrapper", "set_tensor", "invoke", "get_tensor", "inputs",
                 "outputs", "reshapes", "state_dtypes", "state_shapes", "log", "in0", "out0",
                 "failure", "known")

    def __init__(self, engine: Engine, form: StateForm, state_dtypes: list[np.dtype],
                 state_shapes: list[tuple[int, ...]], log: Any):
        self.engine = engine
        self.form = form
        self.state_dtypes = state_dtypes
        self.state_shapes = state_shapes
        self.log = log
        #: The native wrapper and its calls, held for the binding's life: only these are
        #: used from here on (ai-edge-litert's public methods, which count the wrapper's
        #: references before resizing or invoking, are not called again).
        self.wrapper: Any = None
        self.set_tensor: Any = None
        self.invoke: Any = None
        self.get_tensor: Any = None
        self.inputs: tuple[int, ...] = tuple(engine.inputs)
        self.outputs: tuple[int, ...] = tuple(engine.outputs)
        #: (output position, shape) of each output TFLite gives in another shape of the same
        #: size (its [] for the HAL's [1]).
        self.reshapes: tuple[tuple[int, tuple[int, ...]], ...] = ()
        #: The first input's and output's tensor (for the one-in, one-out form).
        self.in0 = self.inputs[0] if self.inputs else -1
        self.out0 = self.outputs[0] if self.outputs else -1
        #: Why the last run failed, logged by :meth:`read` (not by :meth:`run`, which the
        #: caller may call holding a lock a log handler could ask for).
        self.failure: str | None = None
        #: Per output (not a state output): its shape in the model.
        self.known: tuple[tuple[int, ...], ...] = ()

    @classmethod
    def make(cls, form: StateForm, threads: int, shapes: Sequence[tuple[int, ...]],
             known: Sequence[tuple[int, ...]], state_dtypes: list[np.dtype],
             state_shapes: list[tuple[int, ...]], in_dtypes: list[np.dtype],
             log: Any, xnnpack: bool = True) -> LiteRTStateArrays | None:
        """The binding, tried once on zeros; None (logged) when the interpreter refuses the
        form or gives an output of another size than ``known``."""
        try:
            engine = Engine(form.flatbuffer, threads, xnnpack)
            if not engine.direct or len(engine.inputs) != len(shapes) or \
                    len(engine.outputs) != len(known):
                return None
            engine.fit([tuple(s) for s in shapes])
            run = cls(engine, form, state_dtypes, state_shapes, log)
            w = engine.interpreter._interpreter
            w.AllocateTensors(form.set_subgraph)
            w.AllocateTensors(form.get_subgraph)
            run.wrapper, run.set_tensor, run.invoke, run.get_tensor = \
                w, w.SetTensor, w.Invoke, w.GetTensor
            del w
            if not run.load([np.zeros(s, d) for s, d in zip(state_shapes, state_dtypes)]):
                return None
            outs = run._call([np.zeros(s, d) for s, d in zip(shapes, in_dtypes)])
            reshapes = []
            for k, (out, want) in enumerate(zip(outs, known)):
                if out.shape != tuple(want):
                    if out.size != math.prod(want):
                        log(f"stateful binding refused: output {k} has shape "
                            f"{list(out.shape)}, the model's is {list(want)}")
                        return None
                    reshapes.append((k, tuple(want)))
            run.reshapes = tuple(reshapes)
            run.known = tuple(tuple(int(d) for d in want) for want in known)
            if run.read() is None:
                return None
            return run
        except Exception as e:  # noqa: BLE001 - the state stays with the caller
            log(f"stateful binding refused: {type(e).__name__}: {e}")
            return None

    def _call(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        set_tensor = self.set_tensor
        for idx, arr in zip(self.inputs, inputs):
            set_tensor(idx, arr)
        self.invoke()
        get = self.get_tensor
        return [get(idx, 0) for idx in self.outputs]

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray] | None:
        prof = _profile.ACTIVE
        started = time.perf_counter() if prof is not None else 0.0
        try:
            set_tensor = self.set_tensor
            for idx, arr in zip(self.inputs, inputs):
                set_tensor(idx, arr)
            self.invoke()
            get = self.get_tensor
            outs = [get(idx, 0) for idx in self.outputs]  # copies, as get_tensor's
        except Exception as e:  # noqa: BLE001 - the caller runs it by request
            self.failure = f"{type(e).__name__}: {e}"
            return None
        for k, shape in self.reshapes:
            outs[k] = outs[k].reshape(shape)
        if prof is not None:
            prof.whole_run(time.perf_counter() - started)
        return outs

    def direct(self) -> Any:
        """:meth:`run` as one native call where it is built (the Python frame around the
        three calls is most of a wake-word model's overhead), else :meth:`run`."""
        native = direct.calls(pool=None, calls=(self.set_tensor, self.invoke, self.get_tensor),
                              shapes=None, inputs=self.inputs, outputs=self.outputs,
                              known=self.known, general=self.run, failed=self._failed,
                              fix=self._fit_outputs)
        return native if native is not None else self.run

    def _failed(self, e: BaseException, inputs: object = None) -> None:
        self.failure = f"{type(e).__name__}: {e}"

    def _fit_outputs(self, outs: list[np.ndarray]) -> list[np.ndarray] | None:
        for k, shape in self.reshapes:
            outs[k] = outs[k].reshape(shape)
        return outs

    def one_call(self) -> Any:
        """One input, one output, no reshape (a wake-word model): a closure doing the peer's
        own call, one ``SetTensor``, ``Invoke``, one ``GetTensor``, with nothing around them
        but the profiler's check; else the general run's."""
        if len(self.inputs) != 1 or len(self.outputs) != 1 or self.reshapes:
            return super().one_call()
        set_tensor, invoke, get_tensor = self.set_tensor, self.invoke, self.get_tensor
        in0, out0, general = self.in0, self.out0, self.run
        profile = _profile

        def one(x: np.ndarray) -> np.ndarray | None:
            if profile.ACTIVE is not None:
                outs = general((x,))
                return None if outs is None else outs[0]
            try:
                set_tensor(in0, x)
                invoke()
                return get_tensor(out0, 0)  # a copy, as get_tensor's
            except Exception as e:  # noqa: BLE001 - the caller runs it by request
                self.failure = f"{type(e).__name__}: {e}"
                return None
        return one

    def load(self, values: Sequence[np.ndarray]) -> bool:
        form = self.form
        try:
            if len(values) != len(form.set_inputs):
                return False
            sub = form.set_subgraph
            for idx, value, dtype, shape in zip(form.set_inputs, values, self.state_dtypes,
                                                self.state_shapes):
                value = np.asarray(value)
                if value.dtype != dtype or value.size != math.prod(shape):
                    return False
                self.set_tensor(idx, np.ascontiguousarray(value).reshape(shape), sub)
            self.invoke(sub)
            return True
        except Exception as e:  # noqa: BLE001 - the binding is not used again
            self.log(f"state not loaded: {type(e).__name__}: {e}")
            return False

    def read(self) -> list[np.ndarray] | None:
        form = self.form
        if self.failure is not None:
            self.log(f"bound stateful run failed: {self.failure}")
            self.failure = None
        try:
            sub = form.get_subgraph
            self.invoke(sub)
            return [self.get_tensor(idx, sub).reshape(shape)
                    for idx, shape in zip(form.get_outputs, self.state_shapes)]
        except Exception as e:  # noqa: BLE001 - the caller then says the state is lost
            self.log(f"state not read: {type(e).__name__}: {e}")
            return None
