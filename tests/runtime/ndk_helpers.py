"""Shared pieces of the runtime tests: one ADD [1, 16] model through the NDK face, compiled
on a reference device of its own."""

from __future__ import annotations

import numpy as np

from nnhal.drivers.reference import ReferenceDevice
from nnhal.runtime import Device
from nnhal.runtime import ndk as N

OK = 0
F32 = 3  # TENSOR_FLOAT32
I32 = 1  # INT32


_DEVICE: list[Device] = []


def ref_device() -> Device:
    """One reference device for all the runtime tests."""
    if not _DEVICE:
        _DEVICE.append(Device.of(ReferenceDevice(), "reference"))
    return _DEVICE[0]


def add_model(out_dims=(1, 16), finish: bool = True):
    """ADD of two [1, 16] float inputs, activation NONE."""
    code, m = N.ANeuralNetworksModel_create()
    assert code == OK
    t = N.ANeuralNetworksOperandType(F32, [1, 16])
    assert N.ANeuralNetworksModel_addOperand(m, t) == OK
    assert N.ANeuralNetworksModel_addOperand(m, t) == OK
    assert N.ANeuralNetworksModel_addOperand(m, N.ANeuralNetworksOperandType(I32)) == OK
    assert N.ANeuralNetworksModel_addOperand(
        m, N.ANeuralNetworksOperandType(F32, list(out_dims))) == OK
    assert N.ANeuralNetworksModel_setOperandValue(m, 2, np.int32(0).tobytes(), 4) == OK
    assert N.ANeuralNetworksModel_addOperation(m, 0, [0, 1, 2], [3]) == OK
    assert N.ANeuralNetworksModel_identifyInputsAndOutputs(m, [0, 1], [3]) == OK
    if finish:
        assert N.ANeuralNetworksModel_finish(m) == OK
    return m


def compiled(device: Device, model=None):
    model = model if model is not None else add_model()
    code, c = N.ANeuralNetworksCompilation_createForDevices(model, [device])
    assert code == OK
    assert N.ANeuralNetworksCompilation_finish(c) == OK
    return c


def execution(c, x=None, y=None, out=None):
    """An execution with both inputs and the output set; (execution, x, y, out)."""
    x = np.arange(16, dtype=np.float32).reshape(1, 16) if x is None else x
    y = np.ones((1, 16), np.float32) if y is None else y
    out = np.zeros((1, 16), np.float32) if out is None else out
    code, e = N.ANeuralNetworksExecution_create(c)
    assert code == OK
    assert N.ANeuralNetworksExecution_setInput(e, 0, None, x, x.nbytes) == OK
    assert N.ANeuralNetworksExecution_setInput(e, 1, None, y, y.nbytes) == OK
    assert N.ANeuralNetworksExecution_setOutput(e, 0, None, out, out.nbytes) == OK
    return e, x, y, out
