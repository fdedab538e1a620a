"""What every driver's IDevice shares: worker pools, memory-domain buffers, the compilation
cache, and prepareModel's checks and flow around one driver's own steps.

A driver subclasses :class:`DeviceBase` and gives :meth:`~DeviceBase.supported` (per main
operation), optionally :meth:`~DeviceBase.refusal` and :meth:`~DeviceBase.compile_now` (work
that must happen in the calling thread, since the client may change its Model once the call
returns), and :meth:`~DeviceBase.build` (the prepared model, on a worker). Restored caches go
through :meth:`~DeviceBase.restored`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from nnhal.analysis import ModelGraph, analyse, max_work_default
from nnhal.core.version import FeatureLevel
from nnhal.drivers.common import compilation_cache
from nnhal.drivers.common.buffer import allocate
from nnhal.drivers.common.callbacks import notify_prepared
from nnhal.drivers.common.compilation_cache import (
    NUM_DATA_CACHE,
    NUM_MODEL_CACHE,
    SAVE_WAIT_S,
    CompilationCache,
    load_or_create_key,
    saves_may_be_late,
)
from nnhal.drivers.common.tokens import TokenRegistry
from nnhal.drivers.common.workers import WorkerPools
from nnhal.hal import checks
from nnhal.hal.interfaces import IBuffer, IDevice, IPreparedModel, IPreparedModelCallback
from nnhal.hal.request_pool import RequestBuffer
from nnhal.hal.types import (
    BufferDesc,
    BufferRole,
    DeviceType,
    ErrorStatus,
    ExecutionPreference,
    Extension,
    Model,
    OperandType,
    Priority,
    is_extension_type,
)
from nnhal.ops.extensions import lookup as lookup_extension
from nnhal.ops.resolver import OpError
from nnhal.validation import ValidationError, validate_preference, validate_priority


def cache_key(cache_key_file: str | os.PathLike[str] | None) -> bytes | None:
    """The secret that authenticates compilation caches: from ``cache_key_file`` or
    ``NNHAL_CACHE_KEY_FILE`` (created on first use), else None (a fresh one per device)."""
    if cache_key_file is None:
        cache_key_file = os.environ.get("NNHAL_CACHE_KEY_FILE") or None
    return None if cache_key_file is None else load_or_create_key(cache_key_file)


#: The name of the per-user key file in nnhal's cache (:func:`default_key_file`).
DEFAULT_KEY_NAME = "compilation-cache.key"


def default_key_file() -> str | None:
    """The key file of devices opened by name (the registry: what the Session, the runtime and
    the tools use), so that their compilation caches outlive the process: ``NNHAL_CACHE_KEY_FILE``
    when set, else :data:`DEFAULT_KEY_NAME` in nnhal's per-user cache (``$NNHAL_CACHE_DIR``,
    ...) when that directory is private to this user. The file is as trusted as the drivers'
    private stores beside it (:mod:`nnhal.drivers.common.private_store`). None (a fresh key per
    device, caches valid for the process only) when there is no usable file; never raises."""
    from nnhal.core.native import cache_root, check_private_dir

    path = os.environ.get("NNHAL_CACHE_KEY_FILE") or None
    try:
        if path is None:
            root = cache_root()
            if check_private_dir(root) is not None:
                return None
            path = str(root / DEFAULT_KEY_NAME)
        load_or_create_key(path)
    except (OSError, ValueError) as e:
        logging.getLogger("nnhal.drivers").info("compilation caches per process: %s", e)
        return None
    return path


def _positive(value: object) -> int:
    """A work bound as given to a constructor: a positive whole number (1e12 spellings too)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 1 or \
            value == float("inf"):
        raise ValueError(f"max_work must be a positive number, got {value!r}")
    return int(value)


class DeviceBase(IDevice):
    """An IDevice over worker pools per priority, a token registry of driver buffers and a
    compilation cache; see the module docstring for what a driver gives."""

    #: getVersionString.
    version_string = "nnhal"
    #: AIDL v4: the ``*_with_config`` calls are answered by the canonical interface's
    #: defaults (hints are advice a driver may ignore), every other call by this class.
    feature_level = FeatureLevel.AIDL_V4
    #: Where :meth:`log` writes (a driver sets its own).
    logger = logging.getLogger("nnhal.drivers")
    #: The vendor extensions this device offers, by name (:mod:`nnhal.ops.extensions`):
    #: ``getSupportedExtensions`` reports them and :meth:`claimed` lets their operations
    #: through; any other extension's operations are not this device's, even where this
    #: process knows how to run them.
    extensions: tuple[str, ...] = ()

    def __init__(self, name: str, workers: int, max_tensor_bytes: int,
                 cache: CompilationCache, max_work: int | None = None):
        self.name = name
        self.max_tensor_bytes = max_tensor_bytes
        #: The bound on one execution's estimated work (multiply-adds or element visits,
        #: :meth:`nnhal.ops.resolver.OperationDef.work`): a model beyond it is refused at
        #: prepare, an operation beyond it alone is not claimed. None: ``$NNHAL_MAX_WORK``,
        #: else :data:`nnhal.analysis.MAX_WORK`.
        self.max_work = max_work_default() if max_work is None else _positive(max_work)
        self.workers = WorkerPools(workers)
        #: The memory-domain buffers of this device, by token.
        self.buffers: TokenRegistry[RequestBuffer] = TokenRegistry()
        self._cache = cache
        # Threads are started on first use, not here: an in-process device that restores from
        # its cache and executes synchronously (the Session's warm open) never needs one, and
        # starting six costs milliseconds on a loaded machine. A service starts them with
        # itself (nnhal.service.server.Service), so its clients' first preparation or
        # execution of each priority does not pay for creating a thread.

    # ---- what a driver gives ----------------------------------------------------------------
    def supported(self, graph: ModelGraph) -> list[bool]:
        """Per main operation, whether this driver runs it."""
        raise NotImplementedError

    def claimed(self, graph: ModelGraph, only_extensions: bool = False) -> list[bool]:
        """Per main operation, whether the analysis found it runnable and it is no operation
        of an extension this device does not offer, itself or in a subgraph it runs (IF,
        WHILE); ``only_extensions`` claims the offered extensions' operations alone."""
        main = graph.main
        if not graph.extension_ops and not only_extensions:
            return list(main.supported)  # no extension operation runs here: nothing to drop
        offered = frozenset(self.extensions)

        def foreign_op(t: int) -> bool:
            if not is_extension_type(t):
                return False
            found = graph.extension_ops.get(t)
            return found is None or found[0].extension not in offered

        def callees(g: Any, ins: tuple[int, ...]) -> list[int]:
            infos = [g.operands[i] for i in ins]
            return [int(x.value) for x in infos
                    if x is not None and x.type == OperandType.SUBGRAPH]

        # Referenced subgraphs callees first (they form a DAG), without recursion.
        subs = graph.referenced
        order: list[int] = []
        state = [0] * len(subs)  # 0 new, 1 open, 2 done
        for root in range(len(subs)):
            stack = [root]
            while stack:
                s = stack[-1]
                if state[s] == 2:
                    stack.pop()
                    continue
                state[s] = 1
                nxt = [c for _, ins, _ in subs[s].operations for c in callees(subs[s], ins)
                       if state[c] == 0]
                if nxt:
                    stack.extend(nxt)
                else:
                    state[s] = 2
                    order.append(s)
                    stack.pop()
        foreign = [False] * len(subs)
        for s in order:
            g = subs[s]
            foreign[s] = any(foreign_op(t) or any(foreign[c] for c in callees(g, ins))
                             for t, ins, _ in g.operations)
        out = []
        for (t, ins, _), ok in zip(main.operations, main.supported):
            # Without referenced subgraphs no operand is a subgraph reference (validated).
            out.append(ok and not foreign_op(t)
                       and (is_extension_type(t) or not only_extensions)
                       and not (subs and any(foreign[c] for c in callees(main, ins))))
        return out

    def refusal(self, graph: ModelGraph) -> str | None:
        """None when the whole model runs here, else one line saying why not."""
        if all(self.supported(graph)):
            return None
        return "unsupported operations: " + ", ".join(graph.unsupported_names())

    def operation_reasons(self, graph: ModelGraph) -> list[str | None]:
        """Per main operation, None when this driver runs it, else why not (for ``nnhal info
        --plan``: why an operation went to another device)."""
        claimed = self.supported(graph)
        out: list[str | None] = []
        for k, ((t, _, _), ok, runnable) in enumerate(zip(graph.main.operations, claimed,
                                                          graph.main.supported)):
            if ok:
                out.append(None)
            elif not runnable:
                out.append(graph.reasons.get((-1, k)) or "not runnable here")
            elif is_extension_type(t):
                out.append("an extension this device does not offer")
            else:
                out.append("not supported by this driver")
        return out

    def refusals(self, model: Model) -> list[str | None] | None:
        """:meth:`operation_reasons` of a model; None when the model is invalid."""
        try:
            return self.operation_reasons(self.analyse(model, own_constants=False))
        except Exception as e:  # noqa: BLE001 - an invalid model has no per-operation answer
            self.log(f"invalid model: {type(e).__name__}: {e}")
            return None

    def compile_now(self, model: Model, graph: ModelGraph) -> Any:
        """Work done in prepareModel's calling thread (may raise: the model is refused)."""
        return None

    def build(self, graph: ModelGraph, compiled: Any, priority: Priority,
              deadline: int | None) -> tuple[ErrorStatus, IPreparedModel | None]:
        """The prepared model, on a worker thread; never raises."""
        raise NotImplementedError

    def restored(self, plan: Any, priority: Priority) -> IPreparedModel:
        """The prepared model of a plan restored from a compilation cache."""
        raise NotImplementedError

    # ---- plumbing ---------------------------------------------------------------------------
    def log(self, message: str) -> None:
        self.logger.debug("%s: %s", self.name, message)

    def executor_for(self, priority: Priority) -> ThreadPoolExecutor:
        """One worker pool per priority, so high-priority work never queues behind low."""
        return self.workers.for_priority(priority)

    def close(self) -> None:
        self.workers.close()

    def analyse(self, model: Model, *, own_constants: bool = True) -> ModelGraph:
        """The model checked once (raises ValidationError or OpError when it is invalid)."""
        return analyse(model, own_constants=own_constants,
                       max_tensor_bytes=self.max_tensor_bytes, max_work=self.max_work)

    # ---- IDevice ----------------------------------------------------------------------------
    def get_supported_operations(self, model: Model) -> tuple[ErrorStatus, list[bool]]:
        try:
            return ErrorStatus.NONE, self.supported(self.analyse(model, own_constants=False))
        except (ValidationError, OpError) as e:
            self.log(f"invalid model: {e}")
        except Exception as e:  # noqa: BLE001 - any failure of analysis: an invalid model
            self.log(f"invalid model: {type(e).__name__}: {e}")
        return ErrorStatus.INVALID_ARGUMENT, []

    def get_type(self) -> tuple[ErrorStatus, DeviceType]:
        return ErrorStatus.NONE, DeviceType.CPU

    def get_version_string(self) -> tuple[ErrorStatus, str]:
        return ErrorStatus.NONE, self.version_string

    def get_supported_extensions(self) -> tuple[ErrorStatus, list[Extension]]:
        found = [lookup_extension(n) for n in self.extensions]
        return ErrorStatus.NONE, [e.hal() for e in found if e is not None and not e.declared]

    def get_number_of_cache_files_needed(self) -> tuple[ErrorStatus, int, int]:
        return ErrorStatus.NONE, NUM_MODEL_CACHE, NUM_DATA_CACHE

    def prepare_model(self, model: Model, preference: ExecutionPreference = (
                          ExecutionPreference.FAST_SINGLE_ANSWER),
                      priority: Priority = Priority.MEDIUM, deadline: int | None = None,
                      model_cache: Sequence[object] = (), data_cache: Sequence[object] = (),
                      token: bytes = b"", callback: IPreparedModelCallback | None = None
                      ) -> ErrorStatus:
        if callback is None or not hasattr(callback, "notify"):
            return ErrorStatus.INVALID_ARGUMENT
        try:
            checks.check_preference(preference)
            checks.check_priority(priority)
            checks.check_deadline(deadline)
            validate_preference(preference)
            validate_priority(priority)
            graph = self.analyse(model)
        except Exception as e:  # noqa: BLE001 - every failure is a status
            return self._refuse(callback, ErrorStatus.INVALID_ARGUMENT, f"rejected: {e}")
        if graph.too_large:
            return self._refuse(callback, ErrorStatus.RESOURCE_EXHAUSTED_PERSISTENT,
                                f"refused: {graph.too_large[0]}")
        if graph.too_much_work:
            return self._refuse(callback, ErrorStatus.RESOURCE_EXHAUSTED_PERSISTENT,
                                f"refused: {graph.too_much_work}")
        try:
            why = self.refusal(graph)
            compiled = self.compile_now(model, graph) if why is None else None
        except Exception as e:  # noqa: BLE001 - e.g. UnsupportedModelError naming each op
            why = f"{type(e).__name__}: {e}"
        if why is not None:
            return self._refuse(callback, ErrorStatus.INVALID_ARGUMENT, f"refused: {why}")
        if deadline is not None and time.monotonic_ns() > deadline:
            # As upstream's QoS tests expect: the launch succeeds, the callback carries the miss.
            notify_prepared(callback, ErrorStatus.MISSED_DEADLINE_PERSISTENT, None)
            return ErrorStatus.NONE
        priority = Priority(priority)
        save = self._cache.open_save(model_cache, data_cache, token)  # None: do not save
        # A client in late_saves() gets its result before the caches are written (the job
        # holds its own descriptors); restores from this driver wait for such saves.
        late = saves_may_be_late() if save is not None else False
        if late:
            self._cache.begin_late_save(save.token)  # type: ignore[union-attr]

        def task() -> None:
            try:
                status, prepared = self.build(graph, compiled, priority, deadline)
                if save is not None and not late:  # before notifying: as the HAL expects
                    self._cache.save(save, model, priority, prepared)
                notify_prepared(callback, status, prepared)
                if save is not None:
                    if late:
                        if isinstance(late, threading.Event):  # the client's first result
                            late.wait(compilation_cache.LATE_SAVE_DELAY_S)
                        self._cache.save(save, model, priority, prepared)
                    self._cache.finish_save(save)
            finally:
                if late:
                    self._cache.end_late_save(save.token)  # type: ignore[union-attr]

        try:
            self.executor_for(priority).submit(task)
        except Exception:  # noqa: BLE001 - e.g. the pool was shut down
            if late:
                self._cache.end_late_save(save.token)  # type: ignore[union-attr]
            notify_prepared(callback, ErrorStatus.GENERAL_FAILURE, None)
            return ErrorStatus.GENERAL_FAILURE
        return ErrorStatus.NONE

    def wait_cache_saves(self, timeout: float = SAVE_WAIT_S, token: bytes | None = None
                         ) -> bool:
        """Wait for this driver's late cache saves (late_saves) of cache ``token`` (None:
        all); False on timeout."""
        return self._cache.wait_saved(timeout, token)

    def _refuse(self, callback: IPreparedModelCallback, status: ErrorStatus,
                why: str) -> ErrorStatus:
        self.log(f"prepareModel {why}")
        notify_prepared(callback, status, None)
        return status

    def prepare_model_from_cache(self, deadline: int | None, model_cache: Sequence[object],
                                 data_cache: Sequence[object], token: bytes,
                                 callback: IPreparedModelCallback) -> ErrorStatus:
        return self._cache.prepare_from_cache(deadline, model_cache, data_cache, token,
                                              callback, make_prepared_model=self.restored,
                                              workers=self.workers, driver_log=self.log)

    def allocate(self, desc: BufferDesc, prepared_models: Sequence[IPreparedModel],
                 input_roles: Sequence[BufferRole], output_roles: Sequence[BufferRole]
                 ) -> tuple[ErrorStatus, IBuffer | None, int]:
        return allocate(self, self.buffers, desc, prepared_models, input_roles, output_roles)
