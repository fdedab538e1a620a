"""LiteRT interpreters for one prepared model: a pool, one interpreter per concurrent
execution, created on demand and reused, never used by two threads at once.

``ai_edge_litert`` is imported here only when an interpreter is built, so that importing the
driver never needs it (see :func:`unavailable`).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from nnhal.drivers.common.private_store import StoredFile

#: Where an interpreter's flatbuffer comes from: its bytes, or a file of the driver's private
#: store (mapped by the interpreter, not copied).
Source = bytes | StoredFile


def unavailable() -> str | None:
    """None when ai-edge-litert can be loaded, else why not (one line)."""
    try:
        from ai_edge_litert.interpreter import Interpreter  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any failure to load means "not available"
        return (f"ai-edge-litert is not importable ({type(e).__name__}: {e}); "
                "install it with pip install 'nnhal[litert]'")
    return None


class Engine:
    """One interpreter and what a run needs to know of it: its input and output tensor
    indexes (in the model's input / output order) and the input shapes it is allocated for."""

    __slots__ = ("interpreter", "inputs", "outputs", "shapes", "prepared_shapes", "direct",
                 "calls")

    def __init__(self, flatbuffer: Source, threads: int, xnnpack: bool = True):
        from ai_edge_litert.interpreter import Interpreter, OpResolverType

        # AUTO: the builtin kernels with XNNPACK applied as the default delegate; without
        # it, the builtin kernels alone (:func:`nnhal.drivers.litert.support.builtin_kernels`
        # says when).
        kernels = OpResolverType.AUTO if xnnpack else \
            OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
        where: dict[str, Any] = {"model_content": flatbuffer} if isinstance(
            flatbuffer, bytes) else {"model_path": flatbuffer.path}
        self.interpreter: Any = Interpreter(**where, num_threads=threads,
                                            experimental_op_resolver_type=kernels)
        self.interpreter.allocate_tensors()
        #: Whether ai-edge-litert's native wrapper (``interpreter._interpreter``: ``SetTensor``,
        #: ``Invoke``, ``tensor``) is there to be called directly on the hot path, skipping a
        #: Python layer per call. Safe as the public methods are, because no view of a tensor
        #: outlives the run that made it (see :meth:`output_views`). Kept referenced only by
        #: :attr:`calls`, which :meth:`fit` drops first: ai-edge-litert counts the wrapper's
        #: references before resizing, to see that no view lives.
        wrapper = getattr(self.interpreter, "_interpreter", None)
        self.direct = all(callable(getattr(wrapper, n, None))
                          for n in ("SetTensor", "Invoke", "tensor"))
        #: The input and output tensor indexes, and the shape each input is allocated for
        #: now: from the wrapper when it has them (``get_output_details`` reads every
        #: tensor's quantization and sparsity, 0.1 ms for MobileNet's one output, on the
        #: way of every open).
        if all(callable(getattr(wrapper, n, None))
               for n in ("InputIndices", "OutputIndices", "TensorSize")):
            self.inputs = [int(i) for i in wrapper.InputIndices()]
            self.outputs = [int(i) for i in wrapper.OutputIndices()]
            self.shapes: list[tuple[int, ...]] = [
                tuple(int(x) for x in wrapper.TensorSize(i, 0)) for i in self.inputs]
        else:
            details = self.interpreter.get_input_details()
            self.inputs = [d["index"] for d in details]
            self.outputs = [d["index"] for d in self.interpreter.get_output_details()]
            self.shapes = [tuple(int(x) for x in d["shape"]) for d in details]
        del wrapper
        self.prepared_shapes = list(self.shapes)
        #: The wrapper's (SetTensor, Invoke, GetTensor) and the layout they were found fitted
        #: to (:meth:`EnginePool.layout`), kept here by the native bound run
        #: (:mod:`nnhal.drivers.litert.direct`) and dropped before a resize (which
        #: ai-edge-litert refuses while anything else holds the wrapper).
        self.calls: tuple[Any, Any, Any, Any] | None = None

    def fit(self, shapes: Sequence[tuple[int, ...] | None]) -> None:
        """Resize the inputs whose shape differs from ``shapes`` (None: leave it) and
        allocate again; nothing when every shape is the current one."""
        if shapes == self.shapes:
            return
        self.calls = None
        changed = False
        for k, shape in enumerate(shapes):
            if shape is not None and shape != self.shapes[k]:
                self.interpreter.resize_tensor_input(self.inputs[k], list(shape), strict=False)
                self.shapes[k] = shape
                changed = True
        if changed:
            self.interpreter.allocate_tensors()

    def invoke(self, inputs: Sequence[np.ndarray | None]) -> None:
        if not self.direct:
            interp = self.interpreter
            for idx, arr in zip(self.inputs, inputs):
                if arr is not None:
                    interp.set_tensor(idx, arr)
            interp.invoke()
            return
        w = self.interpreter._interpreter
        set_tensor = w.SetTensor
        for idx, arr in zip(self.inputs, inputs):
            if arr is not None:
                set_tensor(idx, arr)
        w.Invoke()

    def output_views(self) -> list[np.ndarray]:
        """The outputs as views of the interpreter's memory (drop them before the next
        resize or run: the interpreter refuses to reallocate while they live)."""
        if not self.direct:
            return [self.interpreter.tensor(i)() for i in self.outputs]
        w = self.interpreter._interpreter
        tensor = w.tensor
        return [tensor(w, i) for i in self.outputs]


class EnginePool:
    """Interpreters for one flatbuffer: :meth:`take` lends one no other thread uses (made
    when none is free), :meth:`give` returns it for the next execution. The source (bytes, or
    a private store's open file) is kept for the pool's lifetime: interpreters map it.
    ``xnnpack``: whether its interpreters apply XNNPACK (see :class:`Engine`). ``divides``:
    the model divides by a divisor that may be 0 at run time (an int32 DIV, a float32 floor
    division), which TFLite's FLOOR_DIV fails on where the HAL gives a result: a run that
    fails is run again on :meth:`guarded` (``nnhal.drivers.litert.support.divides``)."""

    def __init__(self, flatbuffer: Source, threads: int, first: Engine | None = None,
                 xnnpack: bool = True, divides: bool = False):
        self.source = flatbuffer
        self.threads = threads
        self.xnnpack = xnnpack
        self.divides = divides
        self._guarded: EnginePool | None = None
        self._free: list[Engine] = [first] if first is not None else []
        self._lock = threading.Lock()
        #: How many interpreters were made (for tests and diagnostics).
        self.created = 1 if first is not None else 0
        self._layouts: dict[tuple[tuple[int, ...], ...], list[tuple[int, ...]]] = {}

    def layout(self, shapes: Sequence[tuple[int, ...]]) -> list[tuple[int, ...]]:
        """One object per input layout, the same for every binding of it: what an engine's
        kept calls are keyed by (:mod:`nnhal.drivers.litert.direct`), so that bindings of one
        layout (Sessions restored from one cache share a pool) share them too."""
        key = tuple(tuple(s) for s in shapes)
        with self._lock:
            return self._layouts.setdefault(key, [tuple(s) for s in shapes])

    def take(self) -> Engine:
        # list.pop and list.append are atomic: no two threads get one engine, with no lock
        # on the way of every run.
        try:
            return self._free.pop()
        except IndexError:
            pass
        with self._lock:
            self.created += 1
        return Engine(self.source, self.threads, self.xnnpack)

    @property
    def flatbuffer(self) -> bytes:
        """The flatbuffer's bytes (read from the stored file when built from one)."""
        src = self.source
        return src if isinstance(src, bytes) else src.read()

    def give(self, engine: Engine) -> None:
        self._free.append(engine)

    def guarded(self) -> EnginePool:
        """The pool of the model's guarded form (``write_tflite(guard_division=True)``: the
        HAL's results for a zero divisor), made from this flatbuffer on first use: read back
        and written again (a failed run is rare; the form costs operators per division).
        Raises what reading or writing raises."""
        with self._lock:
            found = self._guarded
        if found is not None:
            return found
        from nnhal.tflite import read_tflite, write_tflite

        form = write_tflite(read_tflite(self.flatbuffer, dynamic_shapes=True),
                            guard_division=True)
        made = EnginePool(form, self.threads, Engine(form, self.threads, self.xnnpack),
                          self.xnnpack)
        with self._lock:
            if self._guarded is None:
                self._guarded = made
            return self._guarded
