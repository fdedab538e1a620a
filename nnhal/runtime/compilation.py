"""ANeuralNetworksCompilation: a finished model prepared on one device.

``create`` picks, among all available devices, the first that supports every operation,
preferring the one whose capabilities are best for the compilation's preference (lowest power
for LOW_POWER, else lowest execution time); ``createForDevices`` restricts the choice to the
named devices, which must support every operation (BAD_DATA otherwise). Caching: with a cache
directory and a 32-byte token, the runtime opens per device the files the driver asks for
(``<dir>/<device token>_<m|d><i>``, where the device token hashes the app's token with the
device's name and version) and tries ``prepareModelFromCache`` before preparing and saving.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from nnhal.analysis import analyse
from nnhal.errors import NdkError
from nnhal.hal.interfaces import IPreparedModel, PreparedModelCallback
from nnhal.hal.request_layout import RequestLayout
from nnhal.hal.types import (
    ErrorStatus,
    ExecutionPreference,
    OperandLifeTime,
    PrepareModelConfig,
    Priority,
)
from nnhal.memory import SharedMemory
from nnhal.runtime.codes import (
    BYTE_SIZE_OF_CACHE_TOKEN,
    PreferenceCode,
    PriorityCode,
    ResultCode,
    code_of_status,
    fail,
)
from nnhal.runtime.devices import Device, devices
from nnhal.runtime.extensions import Attributes
from nnhal.runtime.model import NdkModel
from nnhal.runtime.partition import (
    RUNTIME,
    NoDevice,
    Step,
    assign,
    build_steps,
    group,
    subgraph_model,
    supported_by,
)
from nnhal.runtime.plan import FallbackPrepared, PlanPrepared

#: How long the runtime waits for a driver's prepare callback (a hung driver fails the
#: compilation instead of hanging the app).
PREPARE_TIMEOUT_S = 600.0
#: What getPreferredMemoryAlignment/Padding answer: the NDK's defaults for a driver that
#: states no preference (HAL drivers cannot), in bytes.
PREFERRED_ALIGNMENT = 64
PREFERRED_PADDING = 64
_PRIORITY = {int(PriorityCode.LOW): Priority.LOW, int(PriorityCode.MEDIUM): Priority.MEDIUM,
             int(PriorityCode.HIGH): Priority.HIGH}


class Compilation:
    """ANeuralNetworksCompilation. Methods raise :class:`nnhal.NdkError`."""

    def __init__(self, model: NdkModel, devices_: Sequence[Device] | None = None):
        if model is None:
            raise fail(ResultCode.UNEXPECTED_NULL, "create: model is NULL")
        if not model.finished or model.invalid:
            raise fail(ResultCode.BAD_STATE, "create: the model is not finished")
        if devices_ is not None:
            if not devices_:
                raise fail(ResultCode.BAD_DATA, "createForDevices: no device")
            if any(d is None for d in devices_):
                raise fail(ResultCode.UNEXPECTED_NULL, "createForDevices: a device is NULL")
            if len({id(d) for d in devices_}) != len(devices_):
                raise fail(ResultCode.BAD_DATA, "createForDevices: a device is named twice")
        self.model = model
        self.explicit = devices_ is not None
        self.devices = list(devices_) if devices_ is not None else None
        self.preference = int(PreferenceCode.FAST_SINGLE_ANSWER)
        self.priority = int(PriorityCode.DEFAULT)
        self.timeout_ns = 0
        self.cache_dir: str | None = None
        self.token: bytes | None = None
        #: addExtensionAttribute: the driver's compilation hints.
        self.attributes = Attributes()
        self.finished = False
        self.failed = False
        self.device: Device | None = None
        self.prepared: IPreparedModel | None = None
        self._free: list[SharedMemory] = []
        #: Requests of finished executions by argument layout, for the next alike execution
        #: (the same pools and Request object: the driver recognises a recent request).
        self._layouts: dict[tuple, list[Any]] = {}
        self._free_lock = threading.Lock()
        #: The plan: one step per run of operations on one device (one step: the fast path).
        self.steps: list[Step] = []
        self.fell_back = False
        #: How many executions were re-run on the reference driver.
        self.fallbacks = 0
        self._ref_prepared: IPreparedModel | None = None
        self._whole: IPreparedModel | None = None
        self._whole_device: Device | None = None

    @classmethod
    def for_devices(cls, model: NdkModel, devices_: Sequence[Device]) -> Compilation:
        """ANeuralNetworksCompilation_createForDevices."""
        if devices_ is None:
            raise fail(ResultCode.UNEXPECTED_NULL, "createForDevices: devices are NULL")
        return cls(model, list(devices_))

    @property
    def single_device(self) -> bool:
        """Created by createForDevices with exactly one device: the only kind that may set
        timeouts and measure timing."""
        return self.explicit and self.devices is not None and len(self.devices) == 1

    def _check_open(self, what: str) -> None:
        if self.finished:
            raise fail(ResultCode.BAD_STATE, f"{what}: the compilation is finished")

    def set_preference(self, preference: int) -> None:
        self._check_open("setPreference")
        if preference not in {int(p) for p in PreferenceCode}:
            raise fail(ResultCode.BAD_DATA, f"setPreference: invalid preference {preference}")
        self.preference = int(preference)

    def set_priority(self, priority: int) -> None:
        self._check_open("setPriority")
        if priority not in _PRIORITY:
            raise fail(ResultCode.BAD_DATA, f"setPriority: invalid priority {priority}")
        self.priority = int(priority)

    def set_timeout(self, duration_ns: int) -> None:
        self._check_open("setTimeout")
        if not self.single_device:
            raise fail(ResultCode.BAD_DATA, "setTimeout: only for a compilation created by "
                       "createForDevices with one device")
        if not isinstance(duration_ns, int) or duration_ns < 0:
            raise fail(ResultCode.BAD_DATA, f"setTimeout: invalid duration {duration_ns}")
        self.timeout_ns = duration_ns

    def set_caching(self, cache_dir: str, token: bytes) -> None:
        self._check_open("setCaching")
        if cache_dir is None or token is None:
            raise fail(ResultCode.UNEXPECTED_NULL, "setCaching: cacheDir or token is NULL")
        token = bytes(token)
        if len(token) != BYTE_SIZE_OF_CACHE_TOKEN:
            raise fail(ResultCode.BAD_DATA, f"setCaching: token of {len(token)} bytes, not "
                       f"{BYTE_SIZE_OF_CACHE_TOKEN}")
        self.cache_dir, self.token = os.fspath(cache_dir), token

    def add_extension_attribute(self, extension_name: str, code: int, data: Any,
                                length: int | None = None) -> None:
        """ANeuralNetworksCompilation_addExtensionAttribute (feature level 8): a hint for the
        one device of a createForDevices compilation, given to it at prepare; an attribute
        may be set once per compilation."""
        what = "addExtensionAttribute"
        Attributes.check_null(extension_name, data, length, what)
        self._check_open(what)
        if not self.single_device:
            raise fail(ResultCode.BAD_DATA, f"{what}: only for a compilation created by "
                       "createForDevices with one device")
        self.attributes.add([*(self.devices or []), *devices()], extension_name, code, data,
                            length, what)

    # ---- finish -------------------------------------------------------------------------
    def finish(self) -> None:
        """ANeuralNetworksCompilation_finish: partition, then prepare every step."""
        self._check_open("finish")
        self.finished = True
        try:
            self._plan_and_prepare()
        except BaseException:
            self.failed = True
            raise

    def _plan_and_prepare(self) -> None:
        hal = self.model.hal
        candidates = self.devices if self.devices is not None else devices()
        try:
            choice = assign(hal, candidates, self.preference)
        except NoDevice as e:
            dead = [d.name for d in candidates if d.dead]
            if self.explicit and dead:
                # A dead device answers nothing, so it seems to support nothing: say why.
                raise fail(ResultCode.DEAD_OBJECT, f"finish: device {', '.join(dead)} is "
                           f"dead") from None
            if self.explicit:
                raise fail(ResultCode.BAD_DATA, "finish: the devices do not support every "
                           f"operation of the model (operations {e.operations})") from None
            raise fail(ResultCode.OP_FAILED, f"finish: no device supports operations "
                       f"{e.operations}") from None
        used = sorted(set(choice))
        if len(used) <= 1 and RUNTIME not in used:
            # Fast path: one device runs the whole model, no runtime memory in between.
            device = candidates[used[0]] if used else candidates[0]
            self._whole_on(device)
            return
        try:
            steps = self._steps(hal, candidates, choice)
        except NdkError:
            if self.explicit:
                raise
            self._whole_on(self._reference(), fell_back=True)
            return
        self.device = None
        self.steps = steps
        support = supported_by(hal, candidates)
        whole = [d for d, flags in zip(candidates, support) if all(flags)]
        self._whole_device = whole[0] if whole else None
        self.prepared = PlanPrepared(hal.main, steps,
                                     None if self.explicit else self._reference_prepared,
                                     self._whole_prepared, model=hal)

    def _partition_key(self) -> bytes:
        """What the partition depends on besides the model (which the app's token names)."""
        return partition_key(self.devices if self.devices is not None else devices(),
                             self.preference)

    def _steps(self, hal: Any, candidates: Sequence[Device], choice: list[int],
               where: str = "main") -> list[Step]:
        """The steps of a model, each prepared; an IF/WHILE the runtime runs gets a plan for
        each subgraph it references (partitioned the same way, recursively)."""
        shapes = None
        try:
            shapes = analyse(hal, own_constants=False).main.shapes  # kept at finish: no analysis
        except Exception:  # noqa: BLE001 - shapes only fill unknown step dimensions
            shapes = None
        steps = build_steps(hal, candidates, group(hal, choice), shapes)
        for step in steps:
            if step.device is not None:
                step.prepared = self._prepare(step.device, step.model,
                                              step=step_key(where, step.operations))
                continue
            op = hal.main.operations[step.operations[0]]
            for i in op.inputs:
                o = hal.main.operands[i]
                if o.lifetime == OperandLifeTime.SUBGRAPH:
                    k = int(o.location.offset)
                    if k not in step.branches:
                        step.branches[k] = self._branch(hal, k, candidates,
                                                        f"{where}/{step.operations[0]}.{k}")
        return steps

    def _branch(self, hal: Any, k: int, candidates: Sequence[Device],
                where: str = "") -> PlanPrepared:
        sub = subgraph_model(hal, k)
        try:
            choice = assign(sub, candidates, self.preference)
        except NoDevice as e:
            raise fail(ResultCode.BAD_DATA if self.explicit else ResultCode.OP_FAILED,
                       f"finish: operations {e.operations} of subgraph {k} are supported by "
                       f"no device") from None
        return PlanPrepared(sub.main, self._steps(sub, candidates, choice, where), model=sub)

    def _whole_on(self, device: Device, fell_back: bool = False) -> None:
        """Prepare the whole model on one device (on the reference when that fails and the
        compilation may fall back)."""
        hal = self.model.hal
        try:
            prepared = self._prepare(device, hal)
        except NdkError:
            ref = None if self.explicit else self._reference()
            if ref is None or ref is device:
                raise
            device, prepared, fell_back = ref, self._prepare(ref, hal), True
        self.device = device
        self.fell_back = fell_back
        self.steps = [Step(device, list(range(len(hal.main.operations))),
                           list(hal.main.input_indexes), list(hal.main.output_indexes),
                           hal, prepared)]
        ref = None if self.explicit else self._reference()
        if ref is None or ref is device:
            self.prepared = prepared
            if ref is device:
                self._ref_prepared = prepared
        else:
            self.prepared = FallbackPrepared(prepared, self._reference_prepared)

    def _reference(self) -> Device | None:
        for d in devices():
            if d.name == "reference":
                return d
        return None

    def _reference_prepared(self) -> IPreparedModel | None:
        """The whole model prepared on the reference driver, for CPU fallback (once)."""
        with self._free_lock:
            if self._ref_prepared is None:
                ref = self._reference()
                if ref is None:
                    return None
                try:
                    self._ref_prepared = self._prepare(ref, self.model.hal, cache=False)
                except NdkError:
                    return None
                self.fallbacks += 1
            else:
                self.fallbacks += 1
            return self._ref_prepared

    def _whole_prepared(self) -> IPreparedModel | None:
        """The whole model prepared on one of the compilation's devices (once)."""
        with self._free_lock:
            if self._whole is None and self._whole_device is not None:
                try:
                    self._whole = self._prepare(self._whole_device, self.model.hal,
                                                cache=False)
                except NdkError:
                    self._whole_device = None
            return self._whole

    def used_devices(self) -> list[Device]:
        """The devices the finished compilation runs on: its device, every step's (in the
        bodies of IF/WHILE the runtime runs too) and the one kept for a whole-model run."""
        found: list[Device] = []

        def add(d: Any) -> None:
            if isinstance(d, Device) and all(d is not f for f in found):
                found.append(d)

        def walk(steps: Sequence[Step]) -> None:
            for s in steps:
                add(s.device)
                for branch in s.branches.values():
                    walk(branch.steps)

        add(self.device)
        walk(self.steps)
        add(self._whole_device)
        return found

    @property
    def dead(self) -> bool:
        """A device the compilation runs on is dead: a DEVICE_UNAVAILABLE it returns is
        DEAD_OBJECT (the runtime fell back already when it could)."""
        return any(d.dead for d in self.used_devices())

    # ---- memory preferences (feature level 5) ------------------------------------------
    def preferred_memory(self, index: int, is_output: bool, what: str) -> tuple[int, int]:
        """(alignment, padding) for an input's or output's buffer or memory region: the
        defaults of the NDK for HAL drivers (which declare none), 64 and 64 bytes."""
        if not self.finished or self.failed:
            raise fail(ResultCode.BAD_STATE, f"{what}: the compilation is not finished")
        ios = self.model.outputs if is_output else self.model.inputs
        if not isinstance(index, (int, np.integer)) or isinstance(index, bool) or \
                not 0 <= int(index) < len(ios):
            raise fail(ResultCode.BAD_DATA, f"{what}: index {index} out of range "
                       f"[0, {len(ios)})")
        return PREFERRED_ALIGNMENT, PREFERRED_PADDING

    def plan(self) -> list[dict[str, Any]]:
        """The steps of a finished compilation: device name, operation indexes, and the
        main-subgraph operands each step reads and writes."""
        if not self.finished or self.failed:
            raise fail(ResultCode.BAD_STATE, "plan: the compilation is not finished")
        return [s.describe() for s in self.steps]

    def _deadline(self) -> int | None:
        return time.monotonic_ns() + self.timeout_ns if self.timeout_ns else None

    def _prepare(self, device: Device, model: Any, cache: bool = True,
                 step: bytes | None = None) -> IPreparedModel:
        """``step`` names a step's sub-model (see :meth:`_steps`) so that it is cached under a
        token of its own; without it only the whole model is cached."""
        deadline = self._deadline()
        files = self._cache_files(device, step) if cache and (
            model is self.model.hal or step is not None) else None
        try:
            if files is not None:
                model_fds, data_fds, token, complete = files
                if complete:
                    cb = PreparedModelCallback()
                    launch = device.hal.prepare_model_from_cache(deadline, model_fds,
                                                                 data_fds, token, cb)
                    if launch == ErrorStatus.NONE:
                        status, pm = cb.wait(PREPARE_TIMEOUT_S)
                        if status == ErrorStatus.NONE and pm is not None:
                            return pm
                    for fd in (*model_fds, *data_fds):
                        os.ftruncate(fd, 0)
            else:
                model_fds, data_fds, token = [], [], b""
            cb = PreparedModelCallback()
            config = PrepareModelConfig(
                ExecutionPreference(self.preference), _PRIORITY[self.priority], deadline,
                model_fds, data_fds, token, tuple(self.attributes.hints),
                self.attributes.table())
            launch = device.hal.prepare_model_with_config(model, config, cb)
            try:
                status, pm = cb.wait(PREPARE_TIMEOUT_S)
            except TimeoutError:
                raise fail(ResultCode.DEAD_OBJECT if device.dead else ResultCode.OP_FAILED,
                           "finish: the driver never answered") from None
            except Exception as e:  # noqa: BLE001 - a driver that raises failed to prepare
                raise fail(ResultCode.DEAD_OBJECT if device.dead else ResultCode.OP_FAILED,
                           f"finish: {device.name}: {e}") from None
            if launch != ErrorStatus.NONE and status == ErrorStatus.NONE:
                status = launch
            if status != ErrorStatus.NONE or pm is None:
                dead = device.dead
                raise fail(code_of_status(status, dead), f"finish: {device.name} failed to "
                           f"prepare the model: {ErrorStatus(status).name}"
                           + (" (the device is dead)" if dead else ""))
            return pm
        finally:
            if files is not None:
                for fd in (*files[0], *files[1]):
                    os.close(fd)

    def _cache_files(self, device: Device, step: bytes | None = None
                     ) -> tuple[list[int], list[int], bytes, bool] | None:
        """(model fds, data fds, device token, all files were there) or None: no caching. A
        step's token also covers the partition that made it (the devices, the preference and
        the step's place), so a step is found again only for the same split."""
        if self.cache_dir is None or self.token is None:
            return None
        found = cache_names(self.cache_dir, self.token, device,
                            None if step is None else self._partition_key() + b"\0" + step)
        if found is None:
            return None
        token, names, n_model = found
        wait = getattr(device.hal, "wait_cache_saves", None)
        if wait is not None:  # a late save (late_saves) may be writing these very files
            wait(token=token)
        complete = all(os.path.exists(n) for n in names) and \
            all(os.path.getsize(n) > 0 for n in names[:n_model])
        opened = open_cache_files(names, n_model)
        if opened is None:
            return None  # caching never fails a compilation
        return opened[0], opened[1], token, complete

    # ---- runtime memory for pointer arguments --------------------------------------------
    def take_memory(self, size: int) -> SharedMemory:
        """Shared memory of at least ``size`` bytes for copying an execution's buffers."""
        with self._free_lock:
            for k, mem in enumerate(self._free):
                if mem.size >= size:
                    return self._free.pop(k)
        return SharedMemory.ashmem(max(size, 64), sealed=True)

    def give_memory(self, mem: SharedMemory) -> None:
        with self._free_lock:
            if len(self._free) < 8:
                self._free.append(mem)
                return
        mem.close()

    def take_layout(self, key: tuple) -> RequestLayout | None:
        """A bound request of a finished execution with this argument layout, or None."""
        with self._free_lock:
            found = self._layouts.get(key)
            return found.pop() if found else None

    def give_layout(self, key: tuple, bound: RequestLayout) -> None:
        """Keep a finished execution's layout for the next alike one; past the free list's
        bound its memories go back to the memory free list (its ``give``)."""
        with self._free_lock:
            found = self._layouts.setdefault(key, [])
            if len(found) < 4 and len(self._layouts) <= 64:
                found.append(bound)
                return
        bound.close()

    def free(self) -> None:
        """ANeuralNetworksCompilation_free."""
        with self._free_lock:
            for m in self._free:
                m.close()
            self._free.clear()
            layouts, self._layouts = self._layouts, {}
        for bounds in layouts.values():
            for b in bounds:  # closed, not given back: the free list is gone
                for m in (b.input_memory, b.output_memory):
                    if m is not None:
                        m.close()
        self.prepared = None


def partition_key(devices_: Sequence[Device], preference: int) -> bytes:
    """What a partition depends on besides the model: the devices (names and versions) and
    the preference."""
    return ("\0".join(f"{d.name}/{d.version}" for d in devices_) +
            f"\0pref{int(preference)}").encode()


def step_key(where: str, operations: Sequence[int]) -> bytes:
    """The name of a step's sub-model in its cache token: its place and its operations."""
    return f"{where}:{','.join(map(str, operations))}".encode()


def cache_names(cache_dir: str, token: bytes, device: Device, split: bytes | None = None
                ) -> tuple[bytes, list[str], int] | None:
    """(device token, model cache paths then data cache paths, number of model caches) of
    ``device``'s cache files for the app's ``token``; ``split`` (:func:`partition_key`, NUL,
    :func:`step_key`) names a step's sub-model. None: the driver caches nothing."""
    status, n_model, n_data = device.hal.get_number_of_cache_files_needed()
    if status != ErrorStatus.NONE or (n_model == 0 and n_data == 0):
        return None
    dev_token = hashlib.sha256(token + device.name.encode() + b"\0" +
                               device.version.encode()).digest()
    if split is not None:
        dev_token = hashlib.sha256(dev_token + b"\0step\0" + split).digest()
    stem = os.path.join(cache_dir, dev_token.hex()[:40])
    return dev_token, [f"{stem}_m{i}" for i in range(n_model)] + \
        [f"{stem}_d{i}" for i in range(n_data)], n_model


def open_cache_files(names: Sequence[str], n_model: int
                     ) -> tuple[list[int], list[int]] | None:
    """:func:`cache_names`' files opened (created, private): (model cache fds, data cache
    fds), or None, nothing left open, when one cannot be."""
    fds: list[int] = []
    try:
        for n in names:
            fds.append(os.open(n, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
    except OSError:
        for fd in fds:
            os.close(fd)
        return None
    return fds[:n_model], fds[n_model:]


def check_compilation(c: Any, what: str) -> Compilation:
    if c is None:
        raise fail(ResultCode.UNEXPECTED_NULL, f"{what}: compilation is NULL")
    return c
