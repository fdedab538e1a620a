"""The two faces of the runtime: the C-API functions never raise and answer NULL with
UNEXPECTED_NULL; the Python classes raise NdkError carrying the code; a model end to end
through both."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from ndk_helpers import OK, add_model

import nnhal
from nnhal.runtime import OperandSpec
from nnhal.runtime import ndk as N
from nnhal.runtime.codes import ResultCode as R

HANDLE_FUNCTIONS = [name for name in N.__all__ if name.startswith("ANeuralNetworks") and
                    "_" in name and not name.endswith("_free") and
                    name.split("_")[0] in ("ANeuralNetworksModel", "ANeuralNetworksCompilation",
                                           "ANeuralNetworksExecution", "ANeuralNetworksEvent",
                                           "ANeuralNetworksMemoryDesc", "ANeuralNetworksBurst",
                                           "ANeuralNetworksDevice")
                    and name not in ("ANeuralNetworksModel_create",
                                     "ANeuralNetworksMemoryDesc_create",
                                     "ANeuralNetworksEvent_createFromSyncFenceFd")]


@pytest.mark.parametrize("name", HANDLE_FUNCTIONS)
def test_a_null_handle_is_unexpected_null(name):
    fn = getattr(N, name)
    n = len(inspect.signature(fn).parameters)
    result = fn(*([None] * n))
    code = result[0] if isinstance(result, tuple) else result
    assert code == R.UNEXPECTED_NULL, name


def test_wrong_handle_is_bad_data_not_an_exception():
    assert N.ANeuralNetworksModel_finish(object()) == R.BAD_DATA
    assert N.ANeuralNetworksExecution_compute("execution") == R.BAD_DATA


def test_free_of_null_is_harmless():
    for name in N.__all__:
        if name.endswith("_free"):
            assert getattr(N, name)(None) is None


def test_python_classes_raise_ndk_error_with_the_code():
    m = nnhal.Model()
    with pytest.raises(nnhal.NdkError) as e:
        m.add_operand(OperandSpec(9999))
    assert e.value.code == R.BAD_DATA and "addOperand" in str(e.value)
    with pytest.raises(nnhal.NdkError) as e:
        nnhal.Compilation(m)
    assert e.value.code == R.BAD_STATE
    model = add_model()
    with pytest.raises(nnhal.NdkError) as e:
        model.finish()
    assert e.value.code == R.BAD_STATE
    assert isinstance(e.value, nnhal.NnhalError)


def _python_face_add(device) -> np.ndarray:
    m = nnhal.Model()
    t = OperandSpec(3, [1, 16])
    a, b = m.add_operand(t), m.add_operand(t)
    act = m.add_operand(OperandSpec(1))
    out = m.add_operand(t)
    m.set_operand_value(act, np.int32(0).tobytes())
    m.add_operation(0, [a, b, act], [out])
    m.identify_inputs_and_outputs([a, b], [out])
    m.finish()
    c = nnhal.Compilation.for_devices(m, [device])
    c.finish()
    x = np.arange(16, dtype=np.float32).reshape(1, 16)
    result = np.zeros((1, 16), np.float32)
    e = nnhal.Execution(c)
    e.set_input(0, None, x)
    e.set_input(1, None, x)
    e.set_output(0, None, result)
    e.compute()
    with pytest.raises(nnhal.NdkError) as err:
        e.compute()
    assert err.value.code == R.BAD_STATE
    return result


def _c_face_add(device) -> np.ndarray:
    m = add_model()
    code, c = N.ANeuralNetworksCompilation_createForDevices(m, [device])
    assert code == OK and N.ANeuralNetworksCompilation_finish(c) == OK
    x = np.arange(16, dtype=np.float32).reshape(1, 16)
    result = np.zeros((1, 16), np.float32)
    code, e = N.ANeuralNetworksExecution_create(c)
    assert N.ANeuralNetworksExecution_setInput(e, 0, None, x, 64) == OK
    assert N.ANeuralNetworksExecution_setInput(e, 1, None, x, 64) == OK
    assert N.ANeuralNetworksExecution_setOutput(e, 0, None, result, 64) == OK
    assert N.ANeuralNetworksExecution_compute(e) == OK
    N.ANeuralNetworksExecution_free(e)
    N.ANeuralNetworksCompilation_free(c)
    N.ANeuralNetworksModel_free(m)
    return result


def test_a_model_end_to_end_through_both_faces(device):
    want = 2 * np.arange(16, dtype=np.float32).reshape(1, 16)
    np.testing.assert_array_equal(_python_face_add(device), want)
    np.testing.assert_array_equal(_c_face_add(device), want)


def test_every_path_gives_the_same_result(device):
    from ndk_helpers import compiled, execution

    c = compiled(device)
    burst = nnhal.Burst(c)
    outs = []
    for path in ("compute", "start", "fenced", "burst"):
        e, *_, out = execution(c)
        if path == "compute":
            e.compute()
        elif path == "start":
            e.start_compute().wait()
        elif path == "fenced":
            e.start_compute_with_dependencies([]).wait()
        else:
            e.burst_compute(burst)
        outs.append(out.copy())
    for o in outs:
        np.testing.assert_array_equal(o, outs[0])
    assert outs[0][0, 15] == 16.0
