"""Feature level 5's memory preferences and input/output padding, with exact result codes:
the preferred alignment and padding of a finished compilation's inputs and outputs, and
buffers or memory regions longer than their operands once padding is enabled."""

from __future__ import annotations

import mmap
import os

import numpy as np
from ndk_helpers import OK, add_model, compiled, execution

from nnhal.runtime import ndk as N
from nnhal.runtime.codes import ResultCode as R

C = "ANeuralNetworksCompilation_getPreferredMemory"
GETTERS = [getattr(N, f"{C}{what}For{io}") for io in ("Input", "Output")
           for what in ("Alignment", "Padding")]


def test_preferences_of_a_finished_compilation(device):
    c = compiled(device)
    for get in GETTERS:
        code, value = get(c, 0)
        assert code == OK and value == 64  # the NDK's default for drivers that state none
    assert N.ANeuralNetworksCompilation_getPreferredMemoryAlignmentForInput(c, 1) == (OK, 64)


def test_preference_rules(device):
    code, c = N.ANeuralNetworksCompilation_createForDevices(add_model(), [device])
    for get in GETTERS:
        assert get(c, 0)[0] == R.BAD_STATE  # not finished
        assert get(None, 0)[0] == R.UNEXPECTED_NULL
    assert N.ANeuralNetworksCompilation_finish(c) == OK
    assert N.ANeuralNetworksCompilation_getPreferredMemoryAlignmentForInput(c, 2)[0] == \
        R.BAD_DATA  # two inputs
    assert N.ANeuralNetworksCompilation_getPreferredMemoryPaddingForOutput(c, 1)[0] == \
        R.BAD_DATA  # one output


def test_padding_allows_longer_buffers_and_gives_the_right_sums(device):
    c = compiled(device)
    code, e = N.ANeuralNetworksExecution_create(c)
    assert N.ANeuralNetworksExecution_enableInputAndOutputPadding(e, True) == OK
    x = np.arange(32, dtype=np.float32)  # 128 bytes for a 64-byte operand
    y = np.full(20, 2, np.float32)
    out = np.full(32, -7, np.float32)
    assert N.ANeuralNetworksExecution_setInput(e, 0, None, x, x.nbytes) == OK
    assert N.ANeuralNetworksExecution_setInput(e, 1, None, y, 60) == R.BAD_DATA  # short
    assert N.ANeuralNetworksExecution_setInput(e, 1, None, y, y.nbytes) == OK
    assert N.ANeuralNetworksExecution_setOutput(e, 0, None, out, out.nbytes) == OK
    assert N.ANeuralNetworksExecution_compute(e) == OK
    np.testing.assert_array_equal(out[:16], x[:16] + 2)
    np.testing.assert_array_equal(out[16:], -7)  # the padding is the client's


def test_without_padding_the_length_must_be_exact(device):
    code, e = N.ANeuralNetworksExecution_create(compiled(device))
    x = np.zeros(32, np.float32)
    assert N.ANeuralNetworksExecution_setInput(e, 0, None, x, x.nbytes) == R.BAD_DATA
    code, e = N.ANeuralNetworksExecution_create(compiled(device))
    assert N.ANeuralNetworksExecution_enableInputAndOutputPadding(e, True) == OK
    assert N.ANeuralNetworksExecution_enableInputAndOutputPadding(e, False) == OK
    assert N.ANeuralNetworksExecution_setInput(e, 0, None, x, x.nbytes) == R.BAD_DATA


def test_padding_with_memory_regions(device):
    fd = os.memfd_create("padded")
    os.ftruncate(fd, 512)
    try:
        code, mem = N.ANeuralNetworksMemory_createFromFd(512, 3, fd, 0)
        assert code == OK
        view = mmap.mmap(fd, 512)
        data = np.frombuffer(view, np.float32)
        data[:16] = np.arange(16)
        data[32:48] = 5
        code, e = N.ANeuralNetworksExecution_create(compiled(device))
        assert N.ANeuralNetworksExecution_enableInputAndOutputPadding(e, True) == OK
        f = N.ANeuralNetworksExecution_setInputFromMemory
        assert f(e, 0, None, mem, 0, 128) == OK
        assert f(e, 1, None, mem, 128, 60) == R.BAD_DATA  # shorter than the operand
        assert f(e, 1, None, mem, 128, 128) == OK
        assert f(e, 1, None, mem, 448, 128) == R.BAD_DATA  # past the memory
        assert N.ANeuralNetworksExecution_setOutputFromMemory(e, 0, None, mem, 256, 256) == OK
        assert N.ANeuralNetworksExecution_compute(e) == OK
        np.testing.assert_array_equal(data[64:80], np.arange(16) + 5)
        del data
        view.close()
        N.ANeuralNetworksMemory_free(mem)
    finally:
        os.close(fd)


def test_enable_padding_state_rules(device):
    c = compiled(device)
    code, e = N.ANeuralNetworksExecution_create(c)
    x = np.zeros((1, 16), np.float32)
    assert N.ANeuralNetworksExecution_setInput(e, 0, None, x, x.nbytes) == OK
    assert N.ANeuralNetworksExecution_enableInputAndOutputPadding(e, True) == R.BAD_STATE
    e, *_ = execution(c)
    assert N.ANeuralNetworksExecution_compute(e) == OK
    assert N.ANeuralNetworksExecution_enableInputAndOutputPadding(e, True) == R.BAD_STATE
    assert N.ANeuralNetworksExecution_enableInputAndOutputPadding(None, True) == \
        R.UNEXPECTED_NULL
