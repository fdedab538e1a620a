"""ANeuralNetworksMemory and ANeuralNetworksMemoryDesc.

A memory from a file descriptor maps ``size`` bytes of the caller's file from ``offset`` (the
descriptor is duplicated, as mmap keeps its own reference). A memory from a descriptor is
runtime memory sized for the roles it may play (inputs and outputs of finished compilations)
and starts uninitialized: reading it as an input, or copying from it, before an execution or a
copy wrote it is BAD_DATA, as the runtime rules.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any

from nnhal.hal.types import OperandType as T
from nnhal.hal.types import operand_type
from nnhal.memory import SharedMemory
from nnhal.memory.pool import MemoryError_
from nnhal.runtime.codes import PROT_READ, PROT_WRITE, ResultCode, fail


def merge_dims(a: list[int], b: list[int]) -> list[int] | None:
    """The dimensions both ``a`` and ``b`` allow (0 or an empty list: unknown); None when they
    conflict."""
    if not a:
        return list(b)
    if not b:
        return list(a)
    if len(a) != len(b):
        return None
    out = []
    for x, y in zip(a, b):
        if x and y and x != y:
            return None
        out.append(x or y)
    return out


@dataclass(frozen=True)
class Role:
    """An input or output of a finished compilation a descriptor's memory may be used as."""

    compilation: Any
    io_index: int
    is_output: bool
    frequency: float


class MemoryDesc:
    """ANeuralNetworksMemoryDesc: the roles and dimensions of a memory to allocate."""

    def __init__(self) -> None:
        self.roles: list[Role] = []
        self.dimensions: list[int] = []
        self.operand: Any = None  # the HAL operand every role shares (type, scale, zp)
        self.finished = False

    def _check_open(self, what: str) -> None:
        if self.finished:
            raise fail(ResultCode.BAD_STATE, f"{what}: the memory descriptor is finished")

    def add_input_role(self, compilation: Any, index: int, frequency: float) -> None:
        self._add_role(compilation, index, False, frequency)

    def add_output_role(self, compilation: Any, index: int, frequency: float) -> None:
        self._add_role(compilation, index, True, frequency)

    def _add_role(self, compilation: Any, index: int, is_output: bool, frequency: float) -> None:
        what = "addOutputRole" if is_output else "addInputRole"
        self._check_open(what)
        if not getattr(compilation, "finished", False):
            # Upstream (MemoryBuilder::addRole) answers BAD_STATE here.
            raise fail(ResultCode.BAD_STATE, f"{what}: the compilation is not finished")
        if compilation.failed:
            raise fail(ResultCode.BAD_DATA, f"{what}: the compilation failed")
        ios = compilation.model.outputs if is_output else compilation.model.inputs
        if not isinstance(index, int) or not 0 <= index < len(ios):
            raise fail(ResultCode.BAD_DATA, f"{what}: index {index} out of range "
                       f"[0, {len(ios)})")
        if not (isinstance(frequency, (int, float)) and 0.0 < frequency <= 1.0):
            raise fail(ResultCode.BAD_DATA, f"{what}: frequency {frequency} outside (0, 1]")
        for r in self.roles:
            if r.compilation is compilation and r.io_index == index and \
                    r.is_output == is_output:
                raise fail(ResultCode.BAD_DATA, f"{what}: the same role was added twice")
        op = compilation.model.operands[ios[index]]
        if self.operand is not None:
            o = self.operand
            if (o.type, o.scale, o.zero_point) != (op.type, op.scale, op.zero_point) or \
                    o.extra_params != op.extra_params:
                raise fail(ResultCode.BAD_DATA, f"{what}: the operand's type differs from "
                           f"the other roles'")
        dims = merge_dims(self.dimensions, list(op.dimensions))
        if dims is None:
            raise fail(ResultCode.BAD_DATA, f"{what}: dimensions {list(op.dimensions)} "
                       f"conflict with {self.dimensions}")
        self.operand = op
        self.dimensions = dims
        self.roles.append(Role(compilation, index, is_output, float(frequency)))

    def set_dimensions(self, dimensions: list[int]) -> None:
        self._check_open("setDimensions")
        dims = merge_dims(self.dimensions, list(dimensions))
        if dims is None or (self.operand is not None and operand_type(self.operand.type).is_scalar
                            and dimensions):
            raise fail(ResultCode.BAD_DATA, f"setDimensions: {list(dimensions)} conflict with "
                       f"{self.dimensions}")
        self.dimensions = dims

    def finish(self) -> None:
        self._check_open("finish")
        if not self.roles:
            raise fail(ResultCode.BAD_DATA, "finish: the memory descriptor has no role")
        self.finished = True


class Memory:
    """ANeuralNetworksMemory: shared memory the runtime hands to drivers as a request or
    model pool."""

    def __init__(self, shared: SharedMemory | None, desc: MemoryDesc | None = None,
                 dimensions: list[int] | None = None, buffer: Any = None, token: int = 0,
                 size: int = 0):
        self.shared = shared
        self.desc = desc
        #: A driver-allocated buffer (IBuffer) and its token, for a descriptor whose roles are
        #: all on one device that could allocate it; else ``shared`` is runtime memory.
        self.buffer = buffer
        self.token = token
        self._size = size
        #: Current dimensions of a descriptor's memory (set by outputs and copies).
        self.dimensions = list(dimensions or [])
        self.initialized = desc is None
        self.lock = threading.Lock()

    @property
    def size(self) -> int:
        return self.shared.size if self.shared is not None else self._size

    def pool(self) -> Any:
        """What a request names as this memory's pool."""
        if self.buffer is not None:
            from nnhal.hal.types import MemoryPool

            return MemoryPool.of_token(self.token)
        return self.shared

    @classmethod
    def from_fd(cls, size: int, protect: int, fd: int, offset: int) -> Memory:
        """ANeuralNetworksMemory_createFromFd."""
        if not isinstance(size, int) or size <= 0:
            raise fail(ResultCode.BAD_DATA, f"createFromFd: size {size} must be positive")
        if not isinstance(protect, int) or protect & ~(PROT_READ | PROT_WRITE):
            raise fail(ResultCode.BAD_DATA, f"createFromFd: invalid protection {protect}")
        if not isinstance(fd, int) or fd < 0:
            raise fail(ResultCode.BAD_DATA, f"createFromFd: invalid file descriptor {fd}")
        if not isinstance(offset, int) or offset < 0:
            raise fail(ResultCode.BAD_DATA, f"createFromFd: invalid offset {offset}")
        try:
            shared = SharedMemory.mmap_fd(fd, size, offset)
        except (OSError, MemoryError_) as e:
            raise fail(ResultCode.BAD_DATA, f"createFromFd: {e}") from None
        try:
            shared.mapped()
        except MemoryError_ as e:
            shared.close()
            raise fail(ResultCode.UNMAPPABLE, f"createFromFd: {e}") from None
        return cls(shared)

    @classmethod
    def from_desc(cls, desc: MemoryDesc) -> Memory:
        """ANeuralNetworksMemory_createFromDesc: a buffer of the driver when every role is on
        one device and it allocates one, else runtime memory of the operand's full size."""
        if not desc.finished:
            raise fail(ResultCode.BAD_STATE, "createFromDesc: the descriptor is not finished")
        t = operand_type(desc.operand.type)
        dims = desc.dimensions
        mem = cls._allocate_on_device(desc, t)
        if mem is not None:
            return mem
        if t.is_tensor and (not dims or 0 in dims):
            raise fail(ResultCode.OP_FAILED, f"createFromDesc: dimensions {dims} are not "
                       f"fully specified; no driver memory of unknown size is allocated")
        # exact: an int64 product of dimensions up to 2^32-1 wraps, to a small or negative size
        n = math.prod(map(int, dims)) * t.byte_size if t.is_tensor else t.byte_size
        try:
            shared = SharedMemory.ashmem(n, sealed=True)
        except (OSError, OverflowError, MemoryError_) as e:  # (OverflowError: past 2^63 bytes)
            raise fail(ResultCode.OUT_OF_MEMORY, f"createFromDesc: {n} bytes: {e}") from None
        return cls(shared, desc, dims)

    @classmethod
    def _allocate_on_device(cls, desc: MemoryDesc, t: T) -> Memory | None:
        from nnhal.hal.types import BufferDesc, BufferRole, ErrorStatus

        comps: list[Any] = []
        for r in desc.roles:
            if all(c is not r.compilation for c in comps):
                comps.append(r.compilation)
        if len({id(c.device) for c in comps}) != 1 or any(c.prepared is None for c in comps):
            return None
        # Only a driver's own prepared model (not a plan or a fallback wrapper) can own it.
        if comps[0].device is None or any(
                not c.steps or c.prepared is not c.steps[0].prepared for c in comps):
            return None
        index = {id(c): k for k, c in enumerate(comps)}
        roles = [(BufferRole(index[id(r.compilation)], r.io_index, r.frequency), r.is_output)
                 for r in desc.roles]
        try:
            status, buffer, token = comps[0].device.hal.allocate(
                BufferDesc(list(desc.dimensions)), [c.prepared for c in comps],
                [b for b, out in roles if not out], [b for b, out in roles if out])
        except Exception:  # noqa: BLE001 - a driver that cannot: runtime memory instead
            return None
        if status != ErrorStatus.NONE or buffer is None:
            return None
        dims = list(desc.dimensions)
        size = (math.prod(dims) * t.byte_size if dims and 0 not in dims else 0) \
            if t.is_tensor else t.byte_size
        return cls(None, desc, dims, buffer=buffer, token=int(token), size=size)

    def has_role(self, compilation: Any, index: int, is_output: bool) -> bool:
        if self.desc is None:
            return True
        return any(r.compilation is compilation and r.io_index == index and
                   r.is_output == is_output for r in self.desc.roles)

    def copy_to(self, dst: Memory) -> None:
        """ANeuralNetworksMemory_copy(self, dst)."""
        if self.size != dst.size and self.size and dst.size:
            raise fail(ResultCode.BAD_DATA, f"copy: sizes differ ({self.size} and {dst.size})")
        if not self.initialized:
            raise fail(ResultCode.BAD_DATA, "copy: the source memory is not initialized")
        if dst.desc is not None and self.desc is not None and \
                merge_dims(dst.desc.dimensions, self.dimensions) is None:
            raise fail(ResultCode.BAD_DATA, "copy: incompatible dimensions")
        try:
            self._copy_bytes(dst)
        except MemoryError_ as e:
            raise fail(ResultCode.OP_FAILED, f"copy: {e}") from None
        if dst.desc is not None:
            dst.dimensions = list(self.dimensions) if self.desc is not None \
                else list(dst.desc.dimensions)
        dst.initialized = True

    def _copy_bytes(self, dst: Memory) -> None:
        from nnhal.hal.types import ErrorStatus
        from nnhal.runtime.codes import code_of_status

        dims = list(self.dimensions) if self.desc is not None else list(dst.dimensions)
        if self.buffer is None and dst.buffer is None:
            dst.shared.array()[:] = self.shared.array()
            return
        if self.buffer is not None and dst.buffer is not None:
            tmp = SharedMemory.ashmem(max(self.size, 1))
            try:
                status = self.buffer.copy_to(tmp)
                if status == ErrorStatus.NONE:
                    status = dst.buffer.copy_from(tmp, dims)
            finally:
                tmp.close()
        elif self.buffer is not None:
            status = self.buffer.copy_to(dst.shared)
        else:
            status = dst.buffer.copy_from(self.shared, dims)
        if status != ErrorStatus.NONE:
            # A driver buffer lives on its compilations' device: a dead one is a dead object.
            dead = status == ErrorStatus.DEVICE_UNAVAILABLE and any(
                r.compilation.dead for m in (self, dst) if m.buffer is not None
                for r in m.desc.roles)
            raise fail(code_of_status(status, dead), f"copy: the driver refused: "
                       f"{ErrorStatus(status).name}")

    def close(self) -> None:
        """ANeuralNetworksMemory_free."""
        if self.shared is not None:
            self.shared.close()
        if self.buffer is not None and hasattr(self.buffer, "close"):
            self.buffer.close()
        self.buffer = None
