"""NDK memory and memory-descriptor rules, with exact result codes."""

from __future__ import annotations

import os

import numpy as np
from ndk_helpers import OK, compiled, execution

from nnhal.runtime import ndk as N
from nnhal.runtime.codes import ResultCode as R


def fd_memory(size: int, file_size: int | None = None):
    fd = os.memfd_create("t")
    os.ftruncate(fd, size if file_size is None else file_size)
    try:
        return N.ANeuralNetworksMemory_createFromFd(size, 3, fd, 0)
    finally:
        os.close(fd)


def test_create_from_fd_rules():
    assert fd_memory(0)[0] == R.BAD_DATA
    assert N.ANeuralNetworksMemory_createFromFd(64, 3, -1, 0)[0] == R.BAD_DATA
    assert fd_memory(4096, file_size=64)[0] == R.UNMAPPABLE  # beyond the file
    fd = os.memfd_create("t")
    os.ftruncate(fd, 64)
    assert N.ANeuralNetworksMemory_createFromFd(64, 8, fd, 0)[0] == R.BAD_DATA  # protection
    os.close(fd)
    assert fd_memory(64)[0] == OK


def shared_fd_memory():
    """64 bytes at offset 64 of a file the caller wrote 2.0s into after mapping."""
    fd = os.memfd_create("t")
    os.ftruncate(fd, 128)
    code, mem = N.ANeuralNetworksMemory_createFromFd(64, 3, fd, 64)
    assert code == OK
    os.pwrite(fd, np.full(16, 2, np.float32).tobytes(), 64)  # the caller's writes show
    os.close(fd)
    return mem


def test_set_input_from_memory_rules(device):
    c = compiled(device)
    mem = shared_fd_memory()
    e, *_, out = execution(c)
    f = N.ANeuralNetworksExecution_setInputFromMemory
    assert f(e, 0, None, mem, 32, 64) == R.BAD_DATA  # beyond the memory
    assert f(e, 0, None, mem, 0, 32) == R.BAD_DATA  # length
    assert f(e, 0, None, None, 0, 64) == R.UNEXPECTED_NULL
    assert f(e, 0, None, mem, 0, 64) == OK
    assert N.ANeuralNetworksExecution_compute(e) == OK
    assert out[0, 5] == 3.0  # 2 + 1


def _desc(c, inputs=(), outputs=(), finish=True):
    code, d = N.ANeuralNetworksMemoryDesc_create()
    assert code == OK
    for i in inputs:
        assert N.ANeuralNetworksMemoryDesc_addInputRole(d, c, i, 1.0) == OK
    for i in outputs:
        assert N.ANeuralNetworksMemoryDesc_addOutputRole(d, c, i, 1.0) == OK
    if finish:
        assert N.ANeuralNetworksMemoryDesc_finish(d) == OK
    return d


def test_memory_desc_role_rules(device):
    c = compiled(device)
    d = _desc(c, finish=False)
    f = N.ANeuralNetworksMemoryDesc_addInputRole
    assert f(d, c, 2, 1.0) == R.BAD_DATA  # no input 2
    assert f(d, c, 0, 0.0) == R.BAD_DATA  # frequency outside (0, 1]
    assert f(d, c, 0, 1.5) == R.BAD_DATA
    assert f(d, None, 0, 1.0) == R.UNEXPECTED_NULL
    assert f(d, c, 0, 0.5) == OK
    assert f(d, c, 0, 0.5) == R.BAD_DATA  # the same role twice
    assert N.ANeuralNetworksMemoryDesc_setDimensions(d, [2, 16]) == R.BAD_DATA
    assert N.ANeuralNetworksMemoryDesc_setDimensions(d, [1, 16]) == OK
    assert N.ANeuralNetworksMemoryDesc_finish(d) == OK
    assert N.ANeuralNetworksMemoryDesc_finish(d) == R.BAD_STATE
    assert f(d, c, 1, 0.5) == R.BAD_STATE


def test_memory_desc_without_roles_and_unfinished(device):
    code, d = N.ANeuralNetworksMemoryDesc_create()
    assert N.ANeuralNetworksMemory_createFromDesc(d)[0] == R.BAD_STATE
    assert N.ANeuralNetworksMemoryDesc_finish(d) == R.BAD_DATA


def test_device_memory_roles_and_initialization(device):
    c = compiled(device)
    code, mem = N.ANeuralNetworksMemory_createFromDesc(_desc(c, inputs=[0], outputs=[0]))
    assert code == OK
    e, *_ = execution(c)
    set_in = N.ANeuralNetworksExecution_setInputFromMemory
    assert set_in(e, 1, None, mem, 0, 0) == R.BAD_DATA  # input 1 is not a role
    assert set_in(e, 0, None, mem, 0, 64) == R.BAD_DATA  # offset and length must be 0
    assert set_in(e, 0, None, mem, 0, 0) == OK
    assert N.ANeuralNetworksExecution_compute(e) == R.BAD_DATA  # not initialized yet
    e, *_ = execution(c)  # written as an output, then read as an input
    assert N.ANeuralNetworksExecution_setOutputFromMemory(e, 0, None, mem, 0, 0) == OK
    assert N.ANeuralNetworksExecution_compute(e) == OK
    e, *_, out = execution(c)
    assert set_in(e, 0, None, mem, 0, 0) == OK
    assert N.ANeuralNetworksExecution_compute(e) == OK
    assert out[0, 4] == 6.0  # (4 + 1) + 1
    e, *_ = execution(c)
    assert N.ANeuralNetworksExecution_setOutputFromMemory(e, 0, None, mem, 0, 0) == OK


def test_memory_copy_rules(device):
    c = compiled(device)
    code, dev_mem = N.ANeuralNetworksMemory_createFromDesc(_desc(c, inputs=[0, 1]))
    code, other = N.ANeuralNetworksMemory_createFromDesc(_desc(c, inputs=[0]))
    code, small = fd_memory(32)
    code, src = fd_memory(64)
    assert N.ANeuralNetworksMemory_copy(dev_mem, other) == R.BAD_DATA  # not initialized
    assert N.ANeuralNetworksMemory_copy(small, dev_mem) == R.BAD_DATA  # sizes differ
    assert N.ANeuralNetworksMemory_copy(None, dev_mem) == R.UNEXPECTED_NULL
    assert N.ANeuralNetworksMemory_copy(src, dev_mem) == OK
    assert N.ANeuralNetworksMemory_copy(dev_mem, other) == OK  # initialized by the copy
    e, *_ = execution(c)
    assert N.ANeuralNetworksExecution_setInputFromMemory(e, 1, None, dev_mem, 0, 0) == OK
    assert N.ANeuralNetworksExecution_compute(e) == OK


def test_device_memory_is_refused_as_an_operand_value(device):
    from ndk_helpers import add_model

    c = compiled(device)
    code, mem = N.ANeuralNetworksMemory_createFromDesc(_desc(c, inputs=[0]))
    m = add_model(finish=False)
    assert N.ANeuralNetworksModel_setOperandValueFromMemory(m, 0, mem, 0, 64) == R.BAD_DATA


def test_roles_on_one_device_get_a_driver_buffer_else_runtime_memory(device):
    from nnhal.drivers.reference import ReferenceDevice
    from nnhal.runtime import Device

    c = compiled(device)
    code, mem = N.ANeuralNetworksMemory_createFromDesc(_desc(c, inputs=[0], outputs=[0]))
    assert code == OK and mem.buffer is not None and mem.shared is None
    other = compiled(Device.of(ReferenceDevice(), "second"))
    code, mem = N.ANeuralNetworksMemory_createFromDesc(_two_device_desc(c, other))
    assert code == OK and mem.buffer is None and mem.shared is not None
    e, *_, out = execution(other)
    assert N.ANeuralNetworksExecution_setOutputFromMemory(e, 0, None, mem, 0, 0) == OK
    assert N.ANeuralNetworksExecution_compute(e) == OK
    e, *_, out = execution(c)
    assert N.ANeuralNetworksExecution_setInputFromMemory(e, 0, None, mem, 0, 0) == OK
    assert N.ANeuralNetworksExecution_compute(e) == OK
    assert out[0, 2] == 4.0  # (2 + 1) + 1


def _two_device_desc(c, other):
    code, d = N.ANeuralNetworksMemoryDesc_create()
    assert N.ANeuralNetworksMemoryDesc_addInputRole(d, c, 0, 0.5) == OK
    assert N.ANeuralNetworksMemoryDesc_addOutputRole(d, other, 0, 0.5) == OK
    assert N.ANeuralNetworksMemoryDesc_finish(d) == OK
    return d


def test_device_memory_of_unknown_dimensions_takes_the_output_shape(device):
    from ndk_helpers import add_model

    c = compiled(device, add_model(out_dims=(0, 0)))
    code, mem = N.ANeuralNetworksMemory_createFromDesc(_desc(c, outputs=[0]))
    assert code == OK and mem.buffer is not None
    e, *_ = execution(c)
    assert N.ANeuralNetworksExecution_setOutputFromMemory(e, 0, None, mem, 0, 0) == OK
    assert N.ANeuralNetworksExecution_compute(e) == OK
    assert mem.initialized and mem.dimensions == [1, 16]
    code, dst = fd_memory(64)
    assert N.ANeuralNetworksMemory_copy(mem, dst) == OK
    assert np.frombuffer(dst.shared.read(0, 64), np.float32)[3] == 4.0


def test_role_with_an_unfinished_compilation_is_bad_state(device):
    """As upstream's MemoryBuilder::addRole: an unfinished compilation is a state error, for an
    input role and an output role alike (and the descriptor stays usable)."""
    c = compiled(device)
    d = _desc(c, finish=False)
    code, unfinished = N.ANeuralNetworksCompilation_createForDevices(c.model, [device])
    assert code == OK
    assert N.ANeuralNetworksMemoryDesc_addInputRole(d, unfinished, 0, 1.0) == R.BAD_STATE
    assert N.ANeuralNetworksMemoryDesc_addOutputRole(d, unfinished, 0, 1.0) == R.BAD_STATE
    assert N.ANeuralNetworksMemoryDesc_addOutputRole(d, c, 0, 1.0) == OK
    N.ANeuralNetworksCompilation_free(unfinished)
