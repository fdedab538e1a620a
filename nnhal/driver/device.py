"""The reference CPU driver's IDevice."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np

from nnhal.driver.cache import (
    NUM_DATA_CACHE,
    NUM_MODEL_CACHE,
    CompilationCache,
    load_or_create_key,
)
from nnhal.executor import ModelPlan
from nnhal.executor.plan import operand_info
from nnhal.hal import checks
from nnhal.hal.interfaces import IDevice, IPreparedModel, IPreparedModelCallback
from nnhal.hal.types import (
    BufferDesc,
    BufferRole,
    Capabilities,
    DeviceType,
    ErrorStatus,
    ExecutionPreference,
    Extension,
    Model,
    OperandLifeTime,
    OperandPerformance,
    OperandType,
    OperationType,
    PerformanceInfo,
    Priority,
    Subgraph,
    is_extension_type,
)
from nnhal.memory import MemoryError_, SharedMemory
from nnhal.ops.registry import OpContext, OpError, lookup
from nnhal.validation import (
    ValidationError,
    validate_model,
    validate_preference,
    validate_priority,
)

log = logging.getLogger("nnhal.driver")

VERSION_STRING = "nnhal-reference-0.1"


def _nothing() -> None:
    pass


class ReferenceDevice(IDevice):
    """A CPU device that runs every supported operation with numpy.

    ``name`` is the device name a runtime would show; ``workers`` bounds the threads that run
    asynchronous preparations and executions. ``cache_key_file`` (default: the environment
    variable ``NNHAL_CACHE_KEY_FILE``, if set) holds the secret that authenticates compilation
    caches, created on first use, so that caches outlive the process; without one, a fresh
    secret per device means caches are valid for this device object only.
    """

    def __init__(self, name: str = "nnhal-reference", workers: int = 4,
                 cache_key_file: str | os.PathLike[str] | None = None):
        self.name = name
        self._workers = workers
        self._pools: dict[Priority, ThreadPoolExecutor] = {}
        self._pool_lock = threading.Lock()
        self._buffers: dict[int, object] = {}
        self._buffer_lock = threading.Lock()
        if cache_key_file is None:
            cache_key_file = os.environ.get("NNHAL_CACHE_KEY_FILE") or None
        key = None if cache_key_file is None else load_or_create_key(cache_key_file)
        self._cache = CompilationCache(VERSION_STRING, key)  # compilation caching: cache.py
        # A service starts its workers with itself: the first preparation or execution of each
        # priority then does not pay for creating a thread (about 0.5 ms here).
        for priority in Priority:
            self.executor_for(priority).submit(_nothing)

    # ---- plumbing ---------------------------------------------------------------------------
    def log(self, message: str) -> None:
        log.debug("%s: %s", self.name, message)

    def executor_for(self, priority: Priority) -> ThreadPoolExecutor:
        """One worker pool per priority, so high-priority work never queues behind low."""
        with self._pool_lock:
            pool = self._pools.get(priority)
            if pool is None:
                pool = ThreadPoolExecutor(self._workers,
                                          thread_name_prefix=f"nnhal-{priority.name.lower()}")
                self._pools[priority] = pool
            return pool

    def lookup_buffer(self, token: int) -> object | None:
        with self._buffer_lock:
            return self._buffers.get(int(token))

    def close(self) -> None:
        with self._pool_lock:
            pools, self._pools = list(self._pools.values()), {}
        for p in pools:
            p.shutdown(wait=True)

    # ---- model analysis ---------------------------------------------------------------------
    @staticmethod
    def _map_pools(model: Model) -> list[np.ndarray]:
        arrays = []
        for i, pool in enumerate(model.pools):
            if not isinstance(pool, SharedMemory):
                raise ValidationError(f"model pool {i} is not a shared memory")
            try:
                arrays.append(pool.array())
            except MemoryError_ as e:
                raise ValidationError(f"model pool {i}: {e}") from e
        return arrays

    def _op_support(self, model: Model, sg: Subgraph, visiting: set[int]) -> list[bool]:
        """Validate each operation of ``sg``; False where this driver cannot run it."""
        # Vendor extension operands and operations are valid but not supported by this driver.
        infos = [None if is_extension_type(op.type) else operand_info(op) for op in sg.operands]
        flags = []
        for operation in sg.operations:
            if is_extension_type(operation.type) or any(
                    infos[i] is None for i in (*operation.inputs, *operation.outputs)):
                flags.append(False)
                continue
            op_type = OperationType(operation.type)
            definition = lookup(op_type)
            if definition is None:
                flags.append(False)
                continue
            ins = [infos[i] for i in operation.inputs]
            for k, i in enumerate(operation.inputs):
                lt = sg.operands[i].lifetime
                if lt in (OperandLifeTime.CONSTANT_COPY, OperandLifeTime.CONSTANT_REFERENCE):
                    ins[k] = replace(ins[k], value=self._constant(model, sg.operands[i]))
                elif lt == OperandLifeTime.SUBGRAPH:
                    ins[k] = replace(ins[k], value=int(sg.operands[i].location.offset))
            ctx = OpContext(op_type=op_type, inputs=ins, outputs=[infos[i] for i in
                                                                  operation.outputs],
                            relaxed=model.relax_computation_float32_to_float16,
                            subgraphs=_SignatureView(model))
            definition.validate(ctx)  # raises OpError: the model is invalid
            ok = True
            for info in ins:
                if info.type == OperandType.SUBGRAPH and info.value is not None:
                    ref = int(info.value)
                    if ref in visiting:
                        ok = False
                        continue
                    ok &= all(self._op_support(model, model.referenced[ref], visiting | {ref}))
            flags.append(ok)
        return flags

    def _constant(self, model: Model, op: object) -> np.ndarray:
        from nnhal.executor.plan import decode_constant

        loc = op.location  # type: ignore[attr-defined]
        if op.lifetime == OperandLifeTime.CONSTANT_COPY:  # type: ignore[attr-defined]
            raw = np.frombuffer(model.operand_values, dtype=np.uint8)
        else:
            raw = model.pools[loc.pool_index].array()
        return decode_constant(op, raw[loc.offset:loc.offset + loc.length],  # type: ignore
                               copy=False)

    def check_model(self, model: Model) -> list[bool]:
        """Full validation; returns per-operation support of the main subgraph."""
        checks.check_model_fields(model)  # Python types and ranges of every field
        pools = self._map_pools(model)
        validate_model(model, [p.size for p in pools])
        return self._op_support(model, model.main, set())

    # ---- IDevice ----------------------------------------------------------------------------
    def get_capabilities(self) -> tuple[ErrorStatus, Capabilities]:
        perf = PerformanceInfo(1.0, 1.0)
        types = sorted(t for t in OperandType if t not in (OperandType.OEM,
                                                             OperandType.TENSOR_OEM_BYTE))
        return ErrorStatus.NONE, Capabilities(
            relaxed_float32_to_float16_performance_scalar=perf,
            relaxed_float32_to_float16_performance_tensor=perf,
            operand_performance=[OperandPerformance(int(t), perf) for t in types],
            if_performance=perf, while_performance=perf)

    def get_supported_operations(self, model: Model) -> tuple[ErrorStatus, list[bool]]:
        try:
            return ErrorStatus.NONE, self.check_model(model)
        except (ValidationError, OpError) as e:
            self.log(f"invalid model: {e}")
            return ErrorStatus.INVALID_ARGUMENT, []
        except Exception as e:  # noqa: BLE001
            self.log(f"invalid model: {type(e).__name__}: {e}")
            return ErrorStatus.INVALID_ARGUMENT, []

    def get_type(self) -> tuple[ErrorStatus, DeviceType]:
        return ErrorStatus.NONE, DeviceType.CPU

    def get_version_string(self) -> tuple[ErrorStatus, str]:
        return ErrorStatus.NONE, VERSION_STRING

    def get_supported_extensions(self) -> tuple[ErrorStatus, list[Extension]]:
        return ErrorStatus.NONE, []

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
            flags = self.check_model(model)
            if not all(flags):
                missing = [OperationType(model.main.operations[i].type).name
                           for i, f in enumerate(flags) if not f]
                raise ValidationError(f"unsupported operations: {', '.join(missing)}")
        except Exception as e:  # noqa: BLE001 - every failure is a status
            self.log(f"prepareModel rejected: {e}")
            _notify_prepared(callback, ErrorStatus.INVALID_ARGUMENT, None)
            return ErrorStatus.INVALID_ARGUMENT
        if deadline is not None and time.monotonic_ns() > deadline:
            # As upstream's QoS tests expect: the launch succeeds, the callback carries the miss.
            _notify_prepared(callback, ErrorStatus.MISSED_DEADLINE_PERSISTENT, None)
            return ErrorStatus.NONE
        priority = Priority(priority)
        save = self._cache.open_save(model_cache, data_cache, token)  # None: do not save

        def task() -> None:
            status, prepared = self._prepare(model, priority, deadline)
            if save is not None:  # before notifying: the client may close its fds after
                self._cache.save(save, model, priority, prepared)
            _notify_prepared(callback, status, prepared)

        try:
            self.executor_for(priority).submit(task)
        except Exception:  # noqa: BLE001
            _notify_prepared(callback, ErrorStatus.GENERAL_FAILURE, None)
            return ErrorStatus.GENERAL_FAILURE
        return ErrorStatus.NONE

    def _prepare(self, model: Model, priority: Priority, deadline: int | None
                 ) -> tuple[ErrorStatus, IPreparedModel | None]:
        from nnhal.driver.prepared_model import ReferencePreparedModel

        try:
            plan = ModelPlan(model, self._map_pools(model))
        except (ValidationError, OpError) as e:
            self.log(f"prepare failed: {e}")
            return ErrorStatus.INVALID_ARGUMENT, None
        except Exception as e:  # noqa: BLE001
            self.log(f"prepare failed: {type(e).__name__}: {e}")
            return ErrorStatus.GENERAL_FAILURE, None
        if deadline is not None and time.monotonic_ns() > deadline:
            return ErrorStatus.MISSED_DEADLINE_TRANSIENT, None
        return ErrorStatus.NONE, ReferencePreparedModel(self, plan, priority)

    def prepare_model_from_cache(self, deadline: int | None, model_cache: Sequence[object],
                                 data_cache: Sequence[object], token: bytes,
                                 callback: IPreparedModelCallback) -> ErrorStatus:
        return self._cache.prepare_from_cache(self, deadline, model_cache, data_cache, token,
                                              callback)

    def allocate(self, desc: BufferDesc, prepared_models: Sequence[IPreparedModel],
                 input_roles: Sequence[BufferRole], output_roles: Sequence[BufferRole]
                 ) -> tuple[ErrorStatus, object | None, int]:
        from nnhal.driver.buffer import allocate  # memory domains live in their own module

        return allocate(self, desc, prepared_models, input_roles, output_roles)


class _SignatureView:
    """Referenced subgraphs as control-flow validation sees them: operand infos only."""

    def __init__(self, model: Model):
        self._model = model

    def __len__(self) -> int:
        return len(self._model.referenced)

    def __getitem__(self, i: int) -> object:
        sg = self._model.referenced[i]

        class _Sig:
            input_infos = [operand_info(sg.operands[k]) for k in sg.input_indexes]
            output_infos = [operand_info(sg.operands[k]) for k in sg.output_indexes]

        return _Sig


def _notify_prepared(callback: IPreparedModelCallback, status: ErrorStatus,
                     prepared: IPreparedModel | None) -> None:
    try:
        callback.notify(status, prepared)
    except Exception:  # noqa: BLE001 - a failing client callback must not kill the driver
        pass
