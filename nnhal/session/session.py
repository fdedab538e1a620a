"""``Session``: a model prepared once on a device, run with numpy arrays by name.

What TFLite's Interpreter or onnxruntime's InferenceSession give their users, over the HAL:
feeds are checked against the model before anything runs (see :mod:`nnhal.session.info` for
the dtype policy), a refused model raises with the validation message instead of a bare
status, outputs come back with their real shapes, and a streaming model's resource variables
(:class:`~nnhal.tflite.model.StateVariable`) are carried from one run to the next.

Thread safety: ``run``, ``reset_state`` and ``close`` take one lock, so a Session may be
shared between threads; runs on one Session are serialised (state and the reused request
memory belong to the Session). Use one Session per thread to run in parallel. Feeds are
converted before the lock is taken, because converting runs the caller's code (``__array__``,
a mapping's ``__getitem__``...), which must never run under a lock it could ask for again; a
call that re-enters the Session from such code, or from a driver while the lock is held, is
an NnhalError instead of a deadlock.

Repeated runs: after a good run, its feed layout is bound
(:class:`~nnhal.session.bound.Bound`). Feeds that are a dict (or list) of plain numpy arrays of
the very dtypes and shapes of that run are taken as checked (the full check passed on them) and
run with nothing made per run: the request memory and views of its outputs are reused, and
where the prepared model binds arrays itself
(:meth:`~nnhal.hal.interfaces.IPreparedModel.bind_arrays`: the LiteRT driver, also behind the
runtime's CPU fallback) the arrays go straight into its interpreter and the outputs straight
out of it, as ai-edge-litert's own ``set_tensor`` + ``invoke`` + ``get_tensor`` (one copy in,
one out). Anything else takes the general way, which checks (and converts) it and binds its
layout in turn; a binding that cannot run a feed hands that run, and the layout's later ones,
back to requests, so failures are reported (and fall back) as before.

Streaming models: where the prepared model keeps a stream's state itself
(:meth:`~nnhal.hal.interfaces.IPreparedModel.bind_arrays_with_state`: the LiteRT driver, as
resource variables in an interpreter of the binding's own), the bound layout's binding is made
at its second run and holds the state (``_state_holder``) until anything else needs it, which
takes it back first (the ``_state`` property); once it answered, the instance's ``run`` is a
closure for the common case (:func:`~nnhal.session.bound.stateful_fast`).
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import numpy as np

from nnhal.drivers.common.compilation_cache import SAVE_WAIT_S, late_saves
from nnhal.drivers.registry import open_device
from nnhal.errors import ExecutionError, InputError, InvalidModelError, NnhalError, one_line
from nnhal.hal.interfaces import IDevice, IPreparedModel, PreparedModelCallback
from nnhal.hal.request_layout import ArgSlot, LayoutError, RequestLayout
from nnhal.hal.types import (
    ErrorStatus,
    ExecutionPreference,
    MeasureTiming,
    Model,
    OutputShape,
    Priority,
    value_nbytes,
)
from nnhal.memory.collector import new_objects_only
from nnhal.memory.frame import Frame, file_bytes
from nnhal.session import pending
from nnhal.session.background import Background
from nnhal.session.bound import Bound, plain_fast, session_lock, stateful_fast
from nnhal.session.explain import explain_rejection
from nnhal.session.info import MAX_FEED_BYTES, TensorInfo, check_feed, tensor_info
from nnhal.session.restore import (
    PREPARE_TIMEOUT,
    Opened,
    cache_source,
    open_cached,
    prepare_quietly,
)
from nnhal.tflite.model import ImportedModel, StateVariable

_CONVERTING = ("Session.run() was called while converting the feeds of another run of the "
               "same session (from a feed's __array__, __len__, __getitem__...): convert the "
               "feeds before calling run")


ModelSource = Model | ImportedModel | str | os.PathLike | bytes
Feeds = Mapping[str, Any] | Sequence[Any]


def load_model(source: ModelSource, input_names: Sequence[str] | None = None,
               output_names: Sequence[str] | None = None) -> ImportedModel:
    """Any accepted model source as an ImportedModel (a HAL Model gets ``input_0``... names
    unless given)."""
    if isinstance(source, ImportedModel):
        return source
    if isinstance(source, Model):
        n_in, n_out = len(source.main.input_indexes), len(source.main.output_indexes)
        ins = list(input_names) if input_names is not None else \
            [f"input_{k}" for k in range(n_in)]
        outs = list(output_names) if output_names is not None else \
            [f"output_{k}" for k in range(n_out)]
        if len(ins) != n_in or len(outs) != n_out:
            raise NnhalError(f"{len(ins)} input and {len(outs)} output names given for a model "
                             f"with {n_in} inputs and {n_out} outputs")
        return ImportedModel(source, ins, outs, [], "<model>")
    if isinstance(source, (str, os.PathLike, bytes, bytearray)):
        try:
            from nnhal.tflite import read_tflite  # type: ignore[attr-defined]
        except ImportError:
            from nnhal.tflite.schema import load

            load(source)  # a missing or broken file is still named as such
            raise NnhalError("reading .tflite files needs nnhal.tflite.read_tflite, which "
                             "this build lacks") from None
        return read_tflite(bytes(source) if isinstance(source, bytearray) else source)
    raise NnhalError(f"cannot make a Session from a {type(source).__name__}: give a HAL Model, "
                     f"an ImportedModel, a .tflite path or its bytes")


def _check_arguments(device: Any, devices: Any, preference: Any, priority: Any,
                     input_names: Any, output_names: Any
                     ) -> tuple[ExecutionPreference, Priority]:
    """Session's own arguments, checked before any work, so a wrong type is an NnhalError
    naming the argument instead of an exception from deep in a driver."""
    def device_like(d: Any) -> bool:
        return isinstance(d, (str, IDevice))

    if device is not None and not device_like(device):
        raise NnhalError(f"device must be a driver name or an IDevice, not a "
                         f"{type(device).__name__}")
    if devices is not None:
        if isinstance(devices, (str, bytes)) or not isinstance(devices, Sequence) or \
                not all(device_like(d) for d in devices):
            raise NnhalError("devices must be a sequence of driver names or IDevices")
    for name, names in (("input_names", input_names), ("output_names", output_names)):
        if names is not None and (isinstance(names, (str, bytes)) or
                                  not isinstance(names, Sequence) or
                                  not all(isinstance(n, str) for n in names)):
            raise NnhalError(f"{name} must be a sequence of strings")
    checked = []
    for name, value, enum in (("preference", preference, ExecutionPreference),
                              ("priority", priority, Priority)):
        try:
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError
            checked.append(enum(value))
        except ValueError:
            names = ", ".join(m.name for m in enum)
            raise NnhalError(f"{name} must be one of {names}, not {value!r}") from None
    return checked[0], checked[1]


def _never() -> bool:
    """``held`` of a lock that does not know its holder."""
    return False


class Session:
    """A model prepared on ``device`` (a registered name or an IDevice the caller keeps and
    closes), ready to :meth:`run`; without ``device``, compiled through the NNAPI runtime
    (:mod:`nnhal.runtime`) over ``devices`` (names or IDevices; default: every available
    device), which partitions the model by ``preference`` and falls back to the reference
    driver when a driver fails. :attr:`plan` lists the runtime's steps.

    ``inputs`` / ``outputs`` describe what :meth:`run` takes and returns (state variables
    excluded); ``prepare_seconds`` is how long preparation took.

    From a .tflite path or its bytes, the Session uses the compilation cache
    (:mod:`nnhal.session.cache`): a second open of the same content (with the same devices,
    preference, priority and names) restores what the first prepared, without reading the
    model, analysing or exporting it (``restored`` says so; :attr:`model` reads the file when
    asked; ``compilation`` is None, :attr:`plan` comes from the cache). ``cache=False`` (or
    ``NNHAL_SESSION_CACHE=0``) never uses it; ``cache=True`` uses it for models of any size.
    """

    def __init__(self, model_or_path: ModelSource, device: str | IDevice | None = None, *,
                 devices: Sequence[str | IDevice] | None = None,
                 preference: ExecutionPreference = ExecutionPreference.FAST_SINGLE_ANSWER,
                 priority: Priority = Priority.MEDIUM,
                 input_names: Sequence[str] | None = None,
                 output_names: Sequence[str] | None = None,
                 cache: bool | None = None):
        # An open makes thousands of objects: the collections they start walk only those.
        with new_objects_only():
            self._open(model_or_path, device, devices, preference, priority, input_names,
                       output_names, cache)

    def _open(self, model_or_path: ModelSource, device: str | IDevice | None,
              devices: Sequence[str | IDevice] | None, preference: ExecutionPreference,
              priority: Priority, input_names: Sequence[str] | None,
              output_names: Sequence[str] | None, cache: bool | None) -> None:
        self._lock = session_lock()
        #: Whether this thread holds ``_lock``, for a lock that knows its holder (the native
        #: run notes no owner); else ``_owner`` says.
        self._held: Callable[[], bool] = getattr(self._lock, "held", _never)
        #: The thread holding ``_lock`` (only that thread sets it to its own id, so a thread
        #: that reads its own id knows it would deadlock).
        self._owner: int | None = None
        #: The threads converting feeds for a run of this Session now.
        self._converting: set[int] = set()
        self._closed = True  # until prepared: close() must be safe after a failed __init__
        self._layout: RequestLayout | None = None
        self._layout_key: tuple = ()
        self._views: list[np.ndarray] = []
        #: The feed layout of the last good run, bound for runs of it again (see Bound).
        self._bound: Bound | None = None
        #: The state values (see ``_state``) and the driver binding that holds the newer
        #: ones inside its interpreter (None: ``_state_values`` are the state).
        self._state_values: list[np.ndarray] = []
        self._state_holder: Any = None
        preference, priority = _check_arguments(device, devices, preference, priority,
                                                input_names, output_names)
        if cache is not None and not isinstance(cache, bool):
            raise NnhalError(f"cache must be True, False or None, not {cache!r}")
        self._names = (input_names, output_names)
        self._imported: ImportedModel | None = None
        self._imported_lock = threading.Lock()
        #: The .tflite path or bytes a restored Session reads again only when asked.
        self._source_arg: Any = None
        #: Whether this Session was restored from the Session cache (nnhal.session.cache).
        self.restored = False
        self._restored_plan: list[dict[str, Any]] | None = None
        self._digest = b""
        #: The thread writing this Session's cache entry (nnhal.session.pending), or None.
        self._saver: Background | None = None
        #: Set once the first run is done (or at close): the drivers' late cache saves wait
        #: for it, so that they do not slow the first result down.
        self._first_done = threading.Event()
        cached = None
        if isinstance(model_or_path, (str, os.PathLike, bytes, bytearray)):
            cached = cache_source(model_or_path, cache)
        if cached is None:
            self._imported = load_model(model_or_path, input_names, output_names)
            self.source = self._imported.source
        else:
            is_bytes = isinstance(model_or_path, (bytes, bytearray))
            self._source_arg = bytes(model_or_path) if is_bytes else model_or_path
            self.source = "<bytes>" if is_bytes else os.fspath(model_or_path)
            if isinstance(cached[1], bytes):
                self._digest = cached[1]
            else:
                # Content not seen before under this name (a miss, unless seen under
                # another): read now, hashed after the first run by the entry's writer.
                self._imported = read_bytes_as_model(cached[2], self.source)
        self.compilation: Any = None
        self._owned: list[IDevice] = []
        self._fallback_pm: Any = None
        if device is not None and devices is not None:
            raise NnhalError("give device (one driver) or devices (the runtime), not both")
        self._owns_device = isinstance(device, str)
        if device is None:
            self.device: IDevice | None = None
            self.device_name = "runtime"
        else:
            self.device = open_device(device) if isinstance(device, str) else device
            self.device_name = device if isinstance(device, str) else \
                getattr(device, "name", type(device).__name__)
        try:
            started = time.perf_counter()
            chosen = self._chosen(devices) if device is None else None
            opened = None if cached is None else open_cached(
                self, cached[0], cached[3], chosen, preference, priority, cached[1])
            if not self.restored:
                if self._imported is None:
                    self._read_for_miss(cached[2], opened)  # type: ignore[index]
                self._prepared = self._prepare(preference, priority, opened) \
                    if device is not None else self._compile(chosen, preference, priority,
                                                             opened)
                # After preparing: the driver has validated the model's operands by now.
                self._describe()
                if opened is not None:
                    # Off the first result's path: the drivers write their caches after
                    # notifying (late_saves), then the entry that names them is written.
                    self._saver = pending.start(opened, self)
            self.prepare_seconds = time.perf_counter() - started
        except BaseException:
            self._first_done.set()
            self._close_device()
            raise
        self._closed = False

    @property
    def imported(self) -> ImportedModel:
        """The model as read (a Session restored from the cache reads its file now)."""
        if self._imported is None:
            with self._imported_lock:
                if self._imported is None:
                    self._imported = read_bytes_as_model(self._source_bytes(), self.source)
        return self._imported

    def _read_for_miss(self, data: bytes | Frame | None, opened: Opened | None) -> None:
        """Read the model to prepare it; the entry is keyed by the bytes actually read."""
        from nnhal.session import cache as sc

        if data is None:
            try:
                data = self._source_arg if isinstance(self._source_arg, bytes) else \
                    Frame.read(self._source_arg)
                if isinstance(data, Frame):
                    data.settle()
            except OSError:
                self._imported = load_model(self._source_arg)  # names the problem
                raise NnhalError(f"{self.source}: cannot be read") from None
            digest = sc.content_digest(file_bytes(data))
            if digest != self._digest and opened is not None:
                self._digest = digest
                opened.rekey(digest)
        self._imported = read_bytes_as_model(data, self.source)

    def _source_bytes(self) -> bytes:
        """The file's bytes again, the same as when the Session opened (else NnhalError: the
        restored Session runs the file as it was then)."""
        from nnhal.session import cache as sc

        src = self._source_arg
        if isinstance(src, bytes):
            return src
        try:
            with open(src, "rb") as f:
                data = f.read()
        except OSError as e:
            raise NnhalError(f"{self.source}: cannot read the model again: {e}") from None
        if sc.content_digest(data) != self._digest:
            raise NnhalError(f"{self.source}: the file changed since the session opened it")
        return data

    @property
    def model(self) -> Model:
        """The HAL model (a Session restored from the cache reads its file now)."""
        return self.imported.model

    def _describe(self) -> None:
        """Inputs, outputs and state of the prepared model."""
        main, imp = self.model.main, self.imported
        if len(imp.input_names) != len(main.input_indexes) or \
                len(imp.output_names) != len(main.output_indexes):
            raise NnhalError(f"{self._what()}: {len(imp.input_names)} input and "
                             f"{len(imp.output_names)} output names for "
                             f"{len(main.input_indexes)} inputs and {len(main.output_indexes)} "
                             f"outputs")
        for kind, names in (("input", imp.input_names), ("output", imp.output_names)):
            twice = sorted({n for n in names if list(names).count(n) > 1})
            if twice:
                raise NnhalError(f"{self._what()}: two {kind}s are named '{twice[0]}'")
        for sv in imp.state:
            if not (0 <= sv.input < len(main.input_indexes)
                    and 0 <= sv.output < len(main.output_indexes)):
                raise NnhalError(f"{self._what()}: state variable '{sv.name}' names input "
                                 f"{sv.input} and output {sv.output}, out of range")
        exts = self.model.extension_name_to_prefix
        all_in = [tensor_info(n, main.operands[i], exts)
                  for n, i in zip(imp.input_names, main.input_indexes)]
        all_out = [tensor_info(n, main.operands[i], exts)
                   for n, i in zip(imp.output_names, main.output_indexes)]
        self._set_io(all_in, all_out, list(imp.state))
        self._set_scalars(imp.scalar_inputs, imp.scalar_outputs)

    def _set_scalars(self, inputs: Sequence[int], outputs: Sequence[int]) -> None:
        """The file's scalars (positions in the main inputs / outputs): fed and given back
        as shape (), what TFLite takes and gives, held as [1] by the HAL; a feed is checked
        as [1] once reshaped (:meth:`_checked`)."""
        scalar_in = [k for k in inputs if k in self._public_in]
        scalar_out = [k for k in outputs if k in self._public_out]
        self._scalar_io = (tuple(scalar_in), tuple(scalar_out))
        if not scalar_in and not scalar_out:
            return
        self._scalars = ({self._public_in.index(k) for k in scalar_in},
                         {self._all_outputs[k].name for k in scalar_out})
        self.inputs = [replace(i, shape=()) if k in self._scalars[0] else i
                       for k, i in enumerate(self.inputs)]
        self.outputs = [replace(o, shape=()) if o.name in self._scalars[1] else o
                        for o in self.outputs]

    def _set_io(self, all_in: list[TensorInfo], all_out: list[TensorInfo],
                state: list[StateVariable]) -> None:
        """What run() needs: every main input and output, the public ones, the state."""
        self._state_vars = state
        state_in = {s.input for s in state}
        state_out = {s.output for s in state}
        self._all_inputs, self._all_outputs = all_in, all_out
        self._public_in = [k for k in range(len(all_in)) if k not in state_in]
        self._public_out = [k for k in range(len(all_out)) if k not in state_out]
        #: The public inputs as the driver takes them (what a feed is checked against).
        self._feed_infos = [all_in[k] for k in self._public_in]
        #: The file's scalars (see ImportedModel.scalar_inputs): positions among the public
        #: inputs, names of outputs; None when there are none (the usual case). And as
        #: positions in the main inputs and outputs (what a cache entry keeps).
        self._scalars: tuple[set[int], set[str]] | None = None
        self._scalar_io: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())
        self.inputs: list[TensorInfo] = [all_in[k] for k in self._public_in]
        self.outputs: list[TensorInfo] = [all_out[k] for k in self._public_out]
        self._out_names = [(all_out[k].name, k) for k in self._public_out]
        self._state_out = [s.output for s in state]
        #: The state inputs are the last inputs, in the state's order (as the importer makes
        #: them): every input of a run is the feeds followed by the state.
        self._state_last = [s.input for s in state] == \
            list(range(len(self._public_in), len(all_in))) and \
            self._public_in == list(range(len(self._public_in)))
        self._bound = None
        self._initial = [self._initial_value(s) for s in state]
        self._state = list(self._initial)
        #: The output sizes the last run needed (grows with OUTPUT_INSUFFICIENT_SIZE).
        self._out_sizes = [_bytes(o, o.shape) if o.fully_known else 0 for o in all_out]

    @property
    def _state(self) -> list[np.ndarray]:
        """The state values the next run reads: a stateful driver binding that holds them
        (``_state_holder``) hands them back first, and holds them no more."""
        holder = self._state_holder
        if holder is not None:
            self._state_holder = None
            values = holder.read()
            if values is None:
                self._state_values = list(self._initial)
                raise ExecutionError(f"{self._what()}: the driver lost the stream's state; it "
                                     f"starts again from its initial value",
                                     ErrorStatus.GENERAL_FAILURE)
            self._state_values = values
        return self._state_values

    @_state.setter
    def _state(self, values: list[np.ndarray]) -> None:
        self._state_values = values
        self._state_holder = None

    # ---- preparation -----------------------------------------------------------------------
    def _initial_value(self, s: StateVariable) -> np.ndarray:
        info = self._all_inputs[s.input]
        value = np.asarray(s.initial)
        conv = value.astype(info.dtype)
        if not np.array_equal(conv, value) or (
                info.shape is not None and not _fits(info.shape, conv.shape)):
            raise InvalidModelError(f"state variable '{s.name}': initial value of {value.dtype}"
                                    f" {value.shape} does not fit its input {info.dtype} "
                                    f"{info.shape}")
        return np.ascontiguousarray(conv)

    def _prepare(self, preference: ExecutionPreference, priority: Priority,
                 opened: Opened | None = None) -> IPreparedModel:
        files = opened.device_files(self) if opened is not None else None
        model_fds, data_fds, token = files if files is not None else ([], [], b"")
        try:
            cb = PreparedModelCallback()
            with late_saves(self._first_done):
                launched = self.device.prepare_model(self.model, preference, priority, None,
                                                     model_fds, data_fds, token, cb)
            status, prepared = ErrorStatus(launched), None
            if launched == ErrorStatus.NONE:
                try:
                    status, prepared = cb.wait(PREPARE_TIMEOUT)
                except TimeoutError:
                    raise NnhalError(f"{self._what()}: the device did not finish preparing "
                                     f"within {PREPARE_TIMEOUT:.0f} s") from None
        finally:
            for fd in (*model_fds, *data_fds):
                os.close(fd)
        if status == ErrorStatus.NONE and prepared is not None:
            return prepared
        raise InvalidModelError(
            f"{self._what()}: {explain_rejection(self.model, self.device, status)}", status)

    def _chosen(self, devices: Sequence[str | IDevice] | None) -> list[Any] | None:
        """The runtime's devices for ``devices`` (None: every available one), opening the
        named ones (the Session closes them)."""
        from nnhal.runtime.devices import Device

        if devices is None:
            return None
        chosen = []
        for d in devices:
            if isinstance(d, str):
                hal = open_device(d)
                self._owned.append(hal)
                chosen.append(Device(d, hal))
            else:
                chosen.append(Device.of(d, getattr(d, "name", None)))
        return chosen

    def _compile(self, chosen: list[Any] | None, preference: ExecutionPreference,
                 priority: Priority, opened: Opened | None = None) -> Any:
        """Compile through the runtime; the prepared model it runs (one driver's, a plan of
        steps, or one with CPU fallback)."""
        from nnhal.errors import NdkError
        from nnhal.runtime import Compilation
        from nnhal.runtime import NdkModel as RuntimeModel
        from nnhal.runtime.codes import PriorityCode
        from nnhal.runtime.devices import devices as available

        names = [d.name for d in (chosen if chosen is not None else available())]
        self.device_name = "+".join(names)
        try:
            model = RuntimeModel.from_hal(self.model)
            comp = Compilation(model, chosen)
            comp.set_preference(int(preference))
            comp.set_priority(int({Priority.LOW: PriorityCode.LOW,
                                   Priority.MEDIUM: PriorityCode.MEDIUM,
                                   Priority.HIGH: PriorityCode.HIGH}[Priority(priority)]))
            if opened is not None and opened.store is not None:
                comp.set_caching(str(opened.store.steps), opened.files())
            with late_saves(self._first_done):  # the entry: once the drivers' saves are
                comp.finish()
        except NdkError as e:
            ref = None
            try:
                ref = open_device("reference")
                why = explain_rejection(self.model, ref, ErrorStatus.INVALID_ARGUMENT)
            except Exception:  # noqa: BLE001
                why = str(e)
            finally:
                if ref is not None:
                    ref.close()
            raise InvalidModelError(f"{self._what()}: {why}",
                                    ErrorStatus.INVALID_ARGUMENT) from None
        self.compilation = comp
        self.device_name = "+".join(dict.fromkeys(s["device"] for s in comp.plan()))
        return comp.prepared

    # ---- the Session cache: nnhal.session.restore -----------------------------------------
    def _reference_fallback(self) -> IPreparedModel | None:
        """The whole model on the reference driver, for a restored Session's CPU fallback
        (reads the file; once)."""
        with self._imported_lock:
            done = self._fallback_pm
        if done is not None:
            return done or None
        pm = None
        try:
            from nnhal.runtime.devices import devices as available

            ref = next((d for d in available() if d.name == "reference"), None)
            if ref is not None:
                pm = prepare_quietly(ref.hal, self.model)
        except Exception:  # noqa: BLE001 - no fallback, the failure stands
            pm = None
        with self._imported_lock:
            self._fallback_pm = pm if pm is not None else False
        return pm

    @property
    def plan(self) -> list[dict[str, Any]]:
        """The runtime's steps (device, operations, inputs, outputs); one step on the device
        for a Session made with ``device``."""
        if self._restored_plan is not None:
            return [dict(s) for s in self._restored_plan]
        if self.compilation is not None:
            return self.compilation.plan()
        main = self.model.main
        return [{"device": self.device_name, "operations": list(range(len(main.operations))),
                 "inputs": list(main.input_indexes), "outputs": list(main.output_indexes)}]

    def _what(self) -> str:
        return f"{self.source or 'model'} on device '{self.device_name}'"

    # ---- running ---------------------------------------------------------------------------
    def run(self, feeds: Feeds) -> dict[str, np.ndarray]:
        """Run once: ``feeds`` by input name, or a sequence in :attr:`inputs` order; returns
        every output by name, in :attr:`outputs` order, each a fresh array of its real shape.
        InputError before anything runs when a feed does not match (or its conversion
        fails); ExecutionError when the driver fails."""
        bound = self._bound
        if bound is not None and self._scalars is None:  # (a scalar's feed is reshaped first)
            arrays = bound.match(feeds)
            if arrays is not None:  # the feeds of the bound layout: checked already
                return self._run_bound(bound, arrays)
        checked = self._convert(feeds)  # the caller's code runs here, with no lock held
        try:
            with self._exclusive("run"):
                if self._closed:
                    raise NnhalError("the session is closed")
                if bound is None and self._layout is None and not self._state_vars:
                    outs = self._run_arrays_first(checked)
                    if outs is not None:
                        return self._results(outs)
                return self._results(self._execute(self._with_state(checked)))
        finally:
            self._first_done.set()

    def _run_arrays_first(self, checked: list[np.ndarray]) -> list[np.ndarray] | None:
        """The first run, of a model without state, on the driver's binding of arrays
        (``bind_arrays``) when it offers one, as every later run of the same layout goes: the
        checked feeds straight into its interpreter and the outputs straight out, with no
        request memory made, validated and mapped for one run (what ai-edge-litert's own
        ``set_tensor`` + ``invoke`` + ``get_tensor`` do, where a run by request cost about a
        millisecond more). The layout is bound without request memory, which a later run
        the binding cannot do makes (the general way). None, with nothing the caller sees
        changed, when the driver binds no arrays, an output's shape is not known before the
        run, or the binding did not run them: the general way runs them then (and reports or
        falls back)."""
        bind = getattr(self._prepared, "bind_arrays", None)
        outs_info = self._all_outputs
        if bind is None or not all(i.fully_known for i in outs_info):
            return None
        try:
            runner = bind([tuple(a.shape) for a in checked])
        except Exception:  # noqa: BLE001 - a driver that cannot bind: the run goes by request
            return None
        if runner is None:
            return None
        outs = runner.run(checked)
        if outs is None or len(outs) != len(outs_info) or not all(
                type(o) is np.ndarray and o.dtype == i.dtype and o.shape == i.shape
                for o, i in zip(outs, outs_info)):
            return None  # no state moved on: run again by request, which reports
        self._bound = Bound.of_arrays(self, checked, outs, runner)
        return outs

    def _results(self, outs: list[np.ndarray]) -> dict[str, np.ndarray]:
        """The state carried on, the public outputs by name (the lock held)."""
        if self._state_out:
            self._state = [outs[k] for k in self._state_out]
        if self._scalars is not None:
            return self._scalar_outputs({name: outs[k] for name, k in self._out_names})
        return {name: outs[k] for name, k in self._out_names}

    def _scalar_outputs(self, got: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The file's scalar outputs as shape () (the HAL's [1])."""
        for name in self._scalars[1]:  # type: ignore[index]
            got[name] = got[name].reshape(())
        return got

    def _run_bound(self, bound: Bound, arrays: list[np.ndarray]) -> dict[str, np.ndarray]:
        """:meth:`run` of feeds that match ``bound``: the path of every repeated run, so
        :meth:`_exclusive`, :meth:`_with_state` and :meth:`_results` are inline here."""
        me = threading.get_ident()
        if self._owner == me or self._held():
            raise NnhalError("Session.run() was called from inside a run of the same session "
                             "(by its driver or a callback): a session cannot be re-entered")
        if me in self._converting:
            raise NnhalError(_CONVERTING)
        with self._lock:
            self._owner = me
            try:
                if self._closed:
                    raise NnhalError("the session is closed")
                if bound.stateful:
                    done = self._run_stateful(bound, arrays)
                    if done is not None:
                        return done
                state_out = self._state_out
                full = arrays if not state_out else arrays + self._state \
                    if self._state_last else self._with_state(arrays)
                outs = None
                if bound is self._bound and bound.prepared is self._prepared:
                    runner = None if bound.stateful else bound.runner
                    if runner is not None:
                        outs = runner.run(full)
                        if outs is None or not (bound.checked or bound.same_outputs(outs)):
                            bound.runner = None  # this layout goes by request from now on
                            outs = None
                        elif not state_out and not bound.fast:
                            bound.fast = True
                            self.__dict__["run"] = plain_fast(self, bound)
                    if outs is None:
                        outs = self._run_layout(bound, full)
                if outs is None:  # bound meanwhile to another layout: the general way
                    outs = self._execute(full)
                if state_out:
                    self._state = [outs[k] for k in state_out]
                return {name: outs[k] for name, k in self._out_names}
            finally:
                self._owner = None

    def _run_stateful(self, bound: Bound, arrays: list[np.ndarray]
                      ) -> dict[str, np.ndarray] | None:
        """A bound run on a driver binding that keeps the state in its interpreter (the lock
        held); None when it did not run there (its state handed back: the caller runs it by
        request)."""
        if bound is not self._bound or bound.prepared is not self._prepared:
            return None
        if bound.pending:
            bound.bind_state()
            if not bound.stateful:
                return None  # the usual bound way, with the plain binding
        runner = bound.runner
        if runner is None:
            return None
        if self._state_holder is not runner:
            values = self._state  # from another holder, if one has them
            if not runner.load(values):
                bound.runner = None  # this layout goes by request from now on
                return None
            self._state_holder = runner
        outs = runner.run(arrays)
        if outs is not None and (bound.checked or bound.same_outputs(outs)):
            if bound.checked and not bound.fast:
                bound.fast = True
                self.__dict__["run"] = stateful_fast(self, bound)
            return dict(zip(bound.names, outs))
        self._stateful_failed(bound)
        if outs is not None:  # the state moved on: this run cannot be run again by request
            raise ExecutionError(f"{self._what()}: the driver's binding gave outputs of other "
                                 f"shapes than the model's", ErrorStatus.GENERAL_FAILURE)
        return None

    def _stateful_failed(self, bound: Bound) -> None:
        """A stateful binding's run failed: not used again, its state handed back (the state
        before that run; ExecutionError when the driver lost it)."""
        bound.runner = None
        _ = self._state

    @contextmanager
    def _exclusive(self, what: str) -> Iterator[None]:
        """Hold the Session's lock; NnhalError, not a deadlock, for the thread holding it."""
        me = threading.get_ident()
        if self._owner == me or self._held():
            raise NnhalError(f"Session.{what}() was called from inside a run of the same "
                             f"session (by its driver or a callback): a session cannot be "
                             f"re-entered")
        with self._lock:
            self._owner = me
            try:
                yield
            finally:
                self._owner = None

    def _convert(self, feeds: Feeds) -> list[np.ndarray]:
        """The public feeds checked and converted (see :func:`check_feed`). Whatever the
        feeds' own code raises is an InputError; a run it starts on this Session is refused
        (it would convert the same feeds again, without end)."""
        me = threading.get_ident()
        if me in self._converting:
            raise NnhalError(_CONVERTING)
        self._converting.add(me)
        try:
            return self._checked(feeds)
        except NnhalError:
            raise
        except MemoryError:
            raise InputError("the feeds do not fit in memory") from None
        except Exception as e:  # noqa: BLE001 - the feeds' own code, whatever it raises
            raise InputError(f"the feeds cannot be read: {one_line(e)}") from None
        finally:
            self._converting.discard(me)

    def _checked(self, feeds: Feeds) -> list[np.ndarray]:
        infos = self.inputs  # (the names; the checks are against _feed_infos)
        if isinstance(feeds, Mapping):
            names = [i.name for i in infos]
            keys = list(itertools.islice(iter(feeds), len(names) + 1))  # bounded: a hostile
            unknown = [k for k in keys if k not in names]                # mapping may not end
            if unknown:
                raise InputError(f"unknown input {_key(unknown[0])}; the model's inputs are "
                                 f"{', '.join(names)}")
            if len(keys) > len(names):
                raise InputError(f"the feeds name more inputs than the model's "
                                 f"{len(names)} ({', '.join(names)})")
            missing = [n for n in names if n not in feeds]
            if missing:
                raise InputError(f"missing input '{missing[0]}' (of {', '.join(names)})")
            given = [feeds[n] for n in names]
        elif isinstance(feeds, (str, bytes)) or not isinstance(feeds, Sequence):
            raise InputError(f"feeds must be a dict of input name to array, or a list of "
                             f"{len(infos)} arrays, not {type(feeds).__name__}")
        else:
            count = len(feeds)
            if count != len(infos):
                raise InputError(f"{count} inputs given, the model takes {len(infos)} "
                                 f"({', '.join(i.name for i in infos)})")
            given = [feeds[k] for k in range(count)]
        if self._scalars is not None:
            for k in self._scalars[0]:
                given[k] = _one_of_scalar(infos[k], given[k])
        checked = [check_feed(info, v) for info, v in zip(self._feed_infos, given)]
        total = sum(a.nbytes for a in checked)
        if total > MAX_FEED_BYTES:
            raise InputError(f"the feeds hold {total} bytes together, more than the "
                             f"{MAX_FEED_BYTES} a run takes")
        return checked

    def _with_state(self, checked: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Every main input in model order: the checked feeds and the state values."""
        full: list[np.ndarray] = [None] * len(self._all_inputs)  # type: ignore[list-item]
        for k, arr in zip(self._public_in, checked):
            full[k] = arr
        for s, value in zip(self._state_vars, self._state):
            full[s.input] = value
        return full

    def _layout_for(self, arrays: Sequence[np.ndarray]) -> RequestLayout:
        """The request memory for feeds of these shapes: kept while the shapes stay, with
        typed views of its inputs (one copy in)."""
        key = tuple(a.shape for a in arrays)
        if self._layout is not None and self._layout_key == key:
            return self._layout
        if self._layout is not None:
            self._layout.close()
            self._layout = None
            self._bound = None
        ins = self._all_inputs
        # Dimensions go in the request only where the model leaves some unknown.
        layout = RequestLayout(
            [ArgSlot(_bytes(i, s), () if i.fully_known else s) for i, s in zip(ins, key)],
            [ArgSlot(n) for n in self._out_sizes], max_output_bytes=MAX_FEED_BYTES,
            both_pools=True, sealed=True)  # the Session never shrinks it: nothing to check
        self._views = [layout.input_view(k).view(i.dtype).reshape(s)
                       for k, (i, s) in enumerate(zip(ins, key))]
        self._layout, self._layout_key = layout, key
        return layout

    def _execute(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        """One run by request (feeds copied into the request memory), then this layout bound
        for the runs after it."""
        try:
            layout = self._layout_for(arrays)
            for view, arr in zip(self._views, arrays):
                np.copyto(view, arr, casting="no")
            outs = self._outputs(layout, *self._call(layout))
        except LayoutError as e:
            raise self._layout_failed(e) from None
        bound = self._bound
        if bound is None or bound.layout is not layout or bound.prepared is not self._prepared:
            try:
                self._bound = Bound.of(self, layout, arrays, outs)
            except LayoutError:  # views it cannot make: runs keep the general way
                self._bound = None
        return outs

    def _run_layout(self, bound: Bound, full: list[np.ndarray]) -> list[np.ndarray] | None:
        """A run of the bound layout by request, its outputs read from views made once; None
        when the layout is not the Session's any more."""
        layout = bound.layout
        if layout is None or layout is not self._layout:
            return None
        try:
            for view, arr in zip(self._views, full):
                np.copyto(view, arr, casting="no")
            status, shapes = self._call(layout)
            views = bound.out_views
            if status == ErrorStatus.NONE and views is not None and len(shapes) == len(views) \
                    and all(s.dimensions == d for s, d in zip(shapes, bound.dims)):
                return [v.copy() for v in views]
            return self._outputs(layout, status, shapes)
        except LayoutError as e:
            raise self._layout_failed(e) from None

    def _layout_failed(self, e: LayoutError) -> ExecutionError:
        """The layout may be half made or half grown: not reused."""
        self._bound = None
        if self._layout is not None:
            self._layout.close()
            self._layout = None
        return ExecutionError(f"{self._what()}: {e}", ErrorStatus.RESOURCE_EXHAUSTED_TRANSIENT)

    def _outputs(self, layout: RequestLayout, status: int,
                 shapes: list[OutputShape]) -> list[np.ndarray]:
        """The outputs of a run by request that answered ``status`` and ``shapes`` (run again
        once with bigger output memory on OUTPUT_INSUFFICIENT_SIZE)."""
        if status == ErrorStatus.OUTPUT_INSUFFICIENT_SIZE and \
                len(shapes) == len(self._all_outputs):
            self._bound = None  # its views are of the memory growing replaces
            layout.grow(self._needs(shapes))
            self._out_sizes = list(layout.out_sizes)
            status, shapes = self._call(layout)
        if status != ErrorStatus.NONE:
            raise ExecutionError(f"{self._what()}: execution failed: {_status_name(status)}"
                                 f"{_hint(status)}", status)
        return [self._read(layout, k, self._real_shape(k, shapes))
                for k in range(len(shapes))] \
            if len(shapes) == len(self._all_outputs) else self._declared_outputs(layout)

    def _needs(self, shapes: Sequence[OutputShape]) -> list[int]:
        """Bytes each output needs for the shapes a driver reported."""
        try:
            return [_bytes(info, [int(d) for d in s.dimensions])
                    for info, s in zip(self._all_outputs, shapes)]
        except Exception as e:  # noqa: BLE001 - a driver's answer of the wrong kind
            raise LayoutError(f"the driver reported unreadable output shapes: "
                              f"{one_line(e)}") from None

    def _read(self, layout: RequestLayout, k: int, shape: Sequence[int]) -> np.ndarray:
        info = self._all_outputs[k]
        n, have = _bytes(info, shape), layout.out_sizes[k]
        if n > have:
            raise LayoutError(f"the driver reported shape {tuple(shape)} for output "
                              f"'{info.name}': {n} bytes, its buffer has {have}")
        return layout.read_output(k, info.dtype, shape)

    def _call(self, layout: RequestLayout) -> tuple[int, list[OutputShape]]:
        """(status, output shapes) of one execution; ExecutionError for a driver that raises
        or answers something else."""
        try:
            status, shapes, _ = self._prepared.execute_synchronously(layout.request,
                                                                     MeasureTiming.NO)
            return int(status), list(shapes or [])
        except Exception as e:  # noqa: BLE001 - a driver that raises is a failed execution
            raise ExecutionError(f"{self._what()}: the driver raised or answered wrongly: "
                                 f"{one_line(e)}", ErrorStatus.GENERAL_FAILURE) from None

    def _real_shape(self, k: int, shapes: Sequence[OutputShape]) -> tuple[int, ...]:
        try:
            dims = tuple(int(d) for d in shapes[k].dimensions)
        except Exception as e:  # noqa: BLE001 - a driver's answer of the wrong kind
            raise ExecutionError(f"{self._what()}: the driver reported an unreadable shape for "
                                 f"output '{self._all_outputs[k].name}': {one_line(e)}",
                                 ErrorStatus.GENERAL_FAILURE) from None
        declared = self._all_outputs[k].shape
        if not dims and declared:  # a driver that reports no dimensions: the declared ones
            return declared
        if any(d < 0 for d in dims):
            raise ExecutionError(f"{self._what()}: the driver reported shape {dims} for output "
                                 f"'{self._all_outputs[k].name}'", ErrorStatus.GENERAL_FAILURE)
        return dims

    def _declared_outputs(self, layout: RequestLayout) -> list[np.ndarray]:
        """Outputs when the driver returned no shapes: only fully declared ones can be read."""
        outs = []
        for k, info in enumerate(self._all_outputs):
            if not info.fully_known:
                raise ExecutionError(f"{self._what()}: the driver reported no shape for "
                                     f"output '{info.name}', whose shape the model leaves "
                                     f"unknown", ErrorStatus.GENERAL_FAILURE)
            outs.append(self._read(layout, k, info.shape))  # type: ignore[arg-type]
        return outs

    # ---- state and lifetime ----------------------------------------------------------------
    def reset_state(self) -> None:
        """Give every state variable its initial value again (a new stream)."""
        with self._exclusive("reset_state"):
            self._state = list(self._initial)

    def close(self) -> None:
        """Release the request memory and, if the Session opened the device, the device."""
        with self._exclusive("close"):
            if self._closed:
                return
            self._closed = True
            self._bound = None
            self._state_holder = None
            self.__dict__.pop("run", None)  # a stateful binding's direct way, and its binding
            self._first_done.set()
            if self._saver is not None:  # its entry written before the devices close
                self._saver.join(SAVE_WAIT_S)
                self._saver = None
            if self._layout is not None:
                self._layout.close()
                self._layout = None
            self._prepared = None  # type: ignore[assignment]
            self._close_device()

    def _close_device(self) -> None:
        if self.compilation is not None:
            self.compilation.free()
        for d in self._owned:
            close = getattr(d, "close", None)
            if close is not None:
                close()
        self._owned = []
        if self._owns_device and self.device is not None:
            close = getattr(self.device, "close", None)
            if close is not None:
                close()

    def __del__(self) -> None:
        # A Session dropped unclosed must not leak its device's worker threads.
        try:
            if getattr(self, "_lock", None) is not None:
                self.close()
        except Exception:  # noqa: BLE001 - nothing to report to at collection time
            pass

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        ins = ", ".join(f"{i.name}: {i.dtype}{list(i.shape or [])}" for i in self.inputs)
        return f"Session({self.source!r} on {self.device_name!r}; {ins})"


def read_bytes_as_model(data: bytes | Frame, name: str) -> ImportedModel:
    """A .tflite file's bytes (or the frame they were read into) as the model, named as its
    source for messages."""
    from nnhal.tflite import read_tflite  # type: ignore[attr-defined]

    return read_tflite(data, None if name == "<bytes>" else name)


def _one_of_scalar(info: TensorInfo, value: Any) -> Any:
    """A feed of a scalar input (shape ()) as the [1] the driver takes: an array's view, a
    number in a list (converted as numbers are, see check_feed); InputError for any other
    shape."""
    arr = np.asarray(value)
    if arr.shape != ():
        raise InputError(f"input '{info.name}' has shape {arr.shape}, the model expects () "
                         f"(a scalar)")
    return arr.reshape(1) if isinstance(value, (np.ndarray, np.generic)) else [value]


def _fits(want: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    return len(want) == len(shape) and all(not w or w == s for w, s in zip(want, shape))


def _key(key: object) -> str:
    """A feed's key for a message: a name quoted, anything else by its type."""
    return f"'{key}'" if isinstance(key, str) else f"key of type {type(key).__name__}"


def _bytes(info: TensorInfo, shape: Sequence[int]) -> int:
    """Bytes of a value of ``info`` in ``shape`` by the one size rule (a tensor fed or
    reported with rank 0 holds one element)."""
    n = value_nbytes(info.type if info.type is not None else -1, tuple(shape) or (1,),
                     zero_is_known=True)
    if n is None:
        raise LayoutError(f"'{info.name}' is not of a HAL operand type")
    return n


def _status_name(status: int) -> str:
    try:
        return ErrorStatus(status).name
    except ValueError:
        return f"status {status} (not a HAL ErrorStatus)"


def _hint(status: int) -> str:
    if status == ErrorStatus.INVALID_ARGUMENT:
        return (" (an input value the model cannot run with, e.g. a runtime shape or index "
                "out of range; the driver logs the detail at DEBUG level)")
    if status == ErrorStatus.OUTPUT_INSUFFICIENT_SIZE:
        return " (an output still did not fit after growing its buffer once)"
    return ""
