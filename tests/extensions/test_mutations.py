"""Mutations of extension models, rejected with the right codes: through the HAL (the example's
device and the reference device, in process and served) and through the NDK."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from nnhal.hal.builder import ModelBuilder
from nnhal.hal.interfaces import PreparedModelCallback
from nnhal.hal.types import (
    DataLocation,
    ErrorStatus,
    ExtensionNameAndPrefix,
    Model,
    OperandLifeTime,
    SymmPerChannelQuantParams,
)
from nnhal.hal.types import OperandType as T
from nnhal.runtime import ndk
from nnhal.runtime.codes import ResultCode
from nnhal.runtime.model import ANeuralNetworksOperandType as OT

from . import fibonacci_cases as cases
from .fibonacci_cases import ok

NAME = cases.NAME
P = 7  # the prefix the HAL models below give the extension
INT64, QUANT64, FIB = P << 16 | 0, P << 16 | 1, P << 16 | 0
PARAMS = struct.pack("=dq", 0.5, 10)
NONE, INVALID = ErrorStatus.NONE, ErrorStatus.INVALID_ARGUMENT


def fib_model() -> Model:
    """INT64 n -> FIBONACCI -> TENSOR_QUANT64_ASYMM [10] {0.5, 10}."""
    b = ModelBuilder()
    x = b.input(INT64)
    y = b.output(QUANT64, [10])
    b.operation(FIB, [x], [y])
    m = b.build()
    m.main.operands[y].extra_params = PARAMS
    m.extension_name_to_prefix = [ExtensionNameAndPrefix(NAME, P)]
    return m


def _x(m: Model):
    return m.main.operands[m.main.input_indexes[0]]


def _y(m: Model):
    return m.main.operands[m.main.output_indexes[0]]


def _set(attr):
    def edit(obj_of, value):
        def f(m):
            setattr(obj_of(m), attr, value)
        return f
    return edit


def _table(*entries):
    def f(m):
        m.extension_name_to_prefix = [ExtensionNameAndPrefix(n, p) for n, p in entries]
    return f


def _constant_input(length_delta: int):
    """n as a constant of the extension's INT64 type, its location ``length_delta`` off."""
    def f(m):
        b = ModelBuilder()
        n = b.operand(INT64)
        x = b.input(T.TENSOR_FLOAT32, [1])  # a model input, unused by the Fibonacci op
        y = b.output(QUANT64, [10])
        b.operation(FIB, [n], [y])
        built = b.build()
        op = built.main.operands[n]
        op.lifetime = OperandLifeTime.CONSTANT_COPY
        op.location = DataLocation(0, 0, 8 + length_delta)
        built.operand_values = np.int64(10).tobytes() + b"\0" * 8
        built.main.operands[y].extra_params = PARAMS
        del x
        m.main, m.operand_values = built.main, built.operand_values
    return f


#: (name, mutation, status of getSupportedOperations on the Fibonacci device)
HAL_MUTATIONS = [
    ("operand prefix not in the table", _set("type")(_x, 9 << 16 | 0), INVALID),
    ("operation prefix not in the table", lambda m: setattr(m.main.operations[0], "type",
                                                            9 << 16), INVALID),
    ("no table", _table(), INVALID),
    ("a name twice", _table((NAME, P), (NAME, 8)), INVALID),
    ("a prefix twice", _table((NAME, P), ("com.example.other", P)), INVALID),
    ("prefix 0", _table((NAME, 0)), INVALID),
    ("an invalid name", _table(("Com.Example.Fibonacci", P)), INVALID),
    ("an unknown operand code", _set("type")(_x, P << 16 | 5), INVALID),
    ("extension data one byte short", _set("extra_params")(_y, PARAMS[:-1]), INVALID),
    ("extension data one byte long", _set("extra_params")(_y, PARAMS + b"\0"), INVALID),
    ("no extension data", _set("extra_params")(_y, None), INVALID),
    ("a negative scale in the extension data",
     _set("extra_params")(_y, struct.pack("=dq", -0.5, 10)), INVALID),
    ("extension data on a type that takes none", _set("extra_params")(_x, b"\1"), INVALID),
    ("channel quantization on an extension operand",
     _set("extra_params")(_y, SymmPerChannelQuantParams([1.0], 0)), INVALID),
    ("a scale on an extension operand", _set("scale")(_y, 0.5), INVALID),
    ("a zero point on an extension operand", _set("zero_point")(_x, 1), INVALID),
    ("a scalar extension operand with dimensions", _set("dimensions")(_x, [1]), INVALID),
    ("a constant extension operand of the wrong length", _constant_input(-1), INVALID),
    # valid models whose operation nobody here runs:
    ("an unknown operation code", lambda m: setattr(m.main.operations[0], "type",
                                                    P << 16 | 1), NONE),
    ("an extension not installed", _table(("com.example.other", P)), NONE),
]


def _statuses(device, m: Model) -> tuple[ErrorStatus, list[bool], ErrorStatus]:
    status, supported = device.get_supported_operations(m)
    cb = PreparedModelCallback()
    launched = device.prepare_model(m, 1, 1, None, [], [], b"", cb)
    prepared, _ = cb.wait()
    assert launched == prepared or launched == NONE
    return ErrorStatus(status), list(supported), ErrorStatus(prepared)


@pytest.fixture
def hal_devices(fibonacci_site):
    from nnhal.drivers import registry

    fib, ref = registry.open_device("fibonacci"), registry.open_device("reference")
    yield fib, ref
    fib.close()
    ref.close()


def test_the_unmutated_model_runs_on_the_fibonacci_device_only(hal_devices):
    fib, ref = hal_devices
    assert _statuses(fib, fib_model()) == (NONE, [True], NONE)
    # A device without the extension: valid, unsupported, refused at prepare.
    assert _statuses(ref, fib_model()) == (NONE, [False], INVALID)


@pytest.mark.parametrize("name,mutate,want", HAL_MUTATIONS, ids=[m[0] for m in HAL_MUTATIONS])
def test_hal_mutation(hal_devices, name, mutate, want):
    m = fib_model()
    mutate(m)
    for device in hal_devices:
        status, supported, prepared = _statuses(device, m)
        assert status == want, (device.name, status)
        assert supported == ([False] if want == NONE else [])
        assert prepared == INVALID


def test_hal_mutations_served(remote):
    """The served Fibonacci driver answers as the in-process one (the wire carries the
    extension operands, their data and the table unchanged)."""
    from nnhal.service.client import RemoteDevice

    dev = RemoteDevice(remote[len("remote:"):])
    try:
        assert _statuses(dev, fib_model()) == (NONE, [True], NONE)
        for name, mutate, want in HAL_MUTATIONS:
            m = fib_model()
            mutate(m)
            status, supported, prepared = _statuses(dev, m)
            assert (status, prepared) == (want, INVALID), name
    finally:
        dev.close()


# ---- the NDK ------------------------------------------------------------------------------

BAD, NULL, STATE = int(ResultCode.BAD_DATA), int(ResultCode.UNEXPECTED_NULL), \
    int(ResultCode.BAD_STATE)


def test_ndk_mutations(fibonacci_device):
    c = cases.Case(ndk)
    m = c.model
    t_int64 = c.ext_operand_type(cases.INT64)
    t_quant = c.ext_operand_type(cases.TENSOR_QUANT64_ASYMM)
    prefix = t_int64 >> 16
    # getExtension*Type: an extension no device supports, a code past uint16, NULLs
    for fn in (ndk.ANeuralNetworksModel_getExtensionOperandType,
               ndk.ANeuralNetworksModel_getExtensionOperationType):
        assert fn(m, "com.example.unknown", 0)[0] == BAD
        assert fn(m, NAME, 1 << 16)[0] == BAD
        assert fn(m, NAME, -1)[0] == BAD
        assert fn(m, None, 0)[0] == NULL
        assert fn(None, NAME, 0)[0] == NULL
    assert ndk.ANeuralNetworksDevice_getExtensionSupport(c.cpu, None)[0] == NULL
    assert ndk.ANeuralNetworksDevice_getExtensionSupport(None, NAME)[0] == NULL
    # addOperand: a prefix never given, an unknown code, quantization, a scalar with dims
    unassigned = (prefix + 100) << 16
    for bad in (OT(unassigned), OT(prefix << 16 | 5), OT(t_quant, [2], scale=0.5),
                OT(t_quant, [2], zeroPoint=1), OT(t_int64, [1])):
        assert ndk.ANeuralNetworksModel_addOperand(m, bad) == BAD, bad
    # addOperation: a prefix never given
    a, b = c.operand(cases.TENSOR_FLOAT32, [1]), c.operand(cases.TENSOR_FLOAT32, [1])
    assert ndk.ANeuralNetworksModel_addOperation(m, unassigned, [a], [b]) == BAD
    # setOperandExtensionData: a base operand, NULL with a length, data of length 0, a bad
    # index; a valid clear
    q = c.operand(t_quant, [10])
    assert ndk.ANeuralNetworksModel_setOperandExtensionData(m, a, PARAMS, 16) == BAD
    assert ndk.ANeuralNetworksModel_setOperandExtensionData(m, q, None, 16) == BAD
    assert ndk.ANeuralNetworksModel_setOperandExtensionData(m, q, PARAMS, 0) == BAD
    assert ndk.ANeuralNetworksModel_setOperandExtensionData(m, 99, PARAMS, 16) == BAD
    assert ndk.ANeuralNetworksModel_setOperandExtensionData(None, q, PARAMS, 16) == NULL
    assert ndk.ANeuralNetworksModel_setOperandExtensionData(m, q, None, 0) == cases.OK
    ndk.ANeuralNetworksModel_free(m)


def _short_params_model() -> cases.Case:
    c = cases.Case(ndk)
    fin = c.operand(c.ext_operand_type(cases.INT64))
    fout = c.operand(c.ext_operand_type(cases.TENSOR_QUANT64_ASYMM), [cases.N])
    ok(ndk.ANeuralNetworksModel_setOperandExtensionData(c.model, fout, PARAMS[:8], 8))
    ok(ndk.ANeuralNetworksModel_addOperation(c.model, c.ext_operation_type(cases.FIBONACCI),
                                             [fin], [fout]))
    ok(ndk.ANeuralNetworksModel_identifyInputsAndOutputs(c.model, [fin], [fout]))
    return c


def test_ndk_wrong_extension_data_length_installed_here(fibonacci_site):
    """With the extension installed in this process, finish checks its data: BAD_DATA."""
    c = _short_params_model()
    assert ndk.ANeuralNetworksModel_finish(c.model) == BAD
    assert ndk.ANeuralNetworksModel_setOperandExtensionData(c.model, 1, PARAMS, 16) == STATE


def test_ndk_wrong_extension_data_length_served(remote):
    """Known here only as the served device reports it, the data is the driver's to check:
    the model finishes, the driver refuses it, nobody supports the operation."""
    c = _short_params_model()
    ok(ndk.ANeuralNetworksModel_finish(c.model))
    assert c.compile()[1] == BAD


def test_ndk_a_device_without_the_extension(fibonacci_device):
    c = cases.Case(ndk)
    c.build(cases.TENSOR_FLOAT32, [1], cases.TENSOR_FLOAT32, [1])
    assert ok(ndk.ANeuralNetworksDevice_getExtensionSupport(c.cpu, NAME)) is False
    assert c.supported([c.cpu]) == [False]
    comp = ok(ndk.ANeuralNetworksCompilation_createForDevices(c.model, [c.cpu]))
    assert ndk.ANeuralNetworksCompilation_finish(comp) == BAD


def test_the_aidl_face_carries_extensions(hal_devices):
    """Through the AIDL face (canonical -> AIDL -> canonical): the report, the table, the
    operands' extension data and a mutation's status are unchanged."""
    from nnhal.aidl import through_aidl

    fib = through_aidl(hal_devices[0])
    status, exts = fib.get_supported_extensions()
    assert status == NONE and [e.name for e in exts] == [NAME]
    assert _statuses(fib, fib_model()) == (NONE, [True], NONE)
    m = fib_model()
    _y(m).extra_params = PARAMS[:-1]
    assert _statuses(fib, m)[0] == INVALID
