"""nnhal.Session on hand-built HAL models and hand-made ImportedModels."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from helpers import add_model

import nnhal
from nnhal.drivers.reference import ReferenceDevice
from nnhal.errors import ExecutionError, InputError, InvalidModelError, NnhalError
from nnhal.hal.builder import ModelBuilder, RequestBuilder
from nnhal.hal.interfaces import PreparedModelCallback
from nnhal.hal.types import (
    ErrorStatus,
    ExecutionPreference,
    MeasureTiming,
    Model,
    OperandType,
    OperationType,
    Priority,
)
from nnhal.session import Session, TensorInfo
from nnhal.tflite.model import ImportedModel, StateVariable

T = OperandType
O = OperationType
F32 = np.float32


def reshape_model() -> Model:
    """x [6] reshaped by a runtime shape input: the output's dimensions are unknown."""
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, [6])
    shape = b.input(T.TENSOR_INT32, [2])
    out = b.output(T.TENSOR_FLOAT32, [0, 0])
    b.operation(O.RESHAPE, [x, shape], [out])
    return b.build()


def int8_add_model() -> Model:
    b = ModelBuilder()
    x = b.input(T.TENSOR_QUANT8_ASYMM_SIGNED, [3], 0.5, -10)
    y = b.input(T.TENSOR_QUANT8_ASYMM_SIGNED, [3], 0.5, -10)
    out = b.output(T.TENSOR_QUANT8_ASYMM_SIGNED, [3], 1.0, 0)
    b.operation(O.ADD, [x, y, b.scalar(T.INT32, 0)], [out])
    return b.build()


def accumulator(initial: np.ndarray | None = None) -> ImportedModel:
    """state_out = state_in + x and y = state_in + x, with the state first in both lists."""
    b = ModelBuilder()
    state_in = b.input(T.TENSOR_FLOAT32, [2])
    x = b.input(T.TENSOR_FLOAT32, [2])
    state_out = b.output(T.TENSOR_FLOAT32, [2])
    y = b.output(T.TENSOR_FLOAT32, [2])
    b.operation(O.ADD, [state_in, x, b.scalar(T.INT32, 0)], [state_out])
    b.operation(O.ADD, [state_in, x, b.scalar(T.INT32, 0)], [y])
    init = np.zeros(2, F32) if initial is None else initial
    return ImportedModel(b.build(), ["state_in", "x"], ["state_out", "y"],
                         [StateVariable("acc", init, input=0, output=0)], "<accumulator>")


@pytest.fixture
def add2():
    with Session(add_model((2,))) as s:
        yield s


# ---- the basics ----------------------------------------------------------------------------

def test_add_gives_the_right_answer_by_list_and_by_dict(add2):
    a, b = np.array([1, 2], F32), np.array([3, 4], F32)
    assert list(add2.run([a, b])) == ["output_0"]
    np.testing.assert_array_equal(add2.run([a, b])["output_0"], [4, 6])
    np.testing.assert_array_equal(add2.run({"input_1": b, "input_0": a})["output_0"], [4, 6])
    assert add2.run([a, b])["output_0"].dtype == F32
    assert add2.prepare_seconds > 0


def test_inputs_and_outputs_describe_the_model(add2):
    assert add2.inputs == [
        TensorInfo("input_0", np.dtype(F32), (2,), 0.0, 0, T.TENSOR_FLOAT32),
        TensorInfo("input_1", np.dtype(F32), (2,), 0.0, 0, T.TENSOR_FLOAT32)]
    assert [(o.name, o.shape) for o in add2.outputs] == [("output_0", (2,))]
    with pytest.raises(AttributeError):
        add2.inputs[0].name = "x"  # frozen


def test_names_can_be_given_for_a_hal_model():
    with Session(add_model((2,)), input_names=["a", "b"], output_names=["sum"]) as s:
        out = s.run({"a": np.ones(2, F32), "b": np.ones(2, F32)})
    assert list(out) == ["sum"] and out["sum"].tolist() == [2, 2]
    with pytest.raises(NnhalError, match="1 input and 1 output names given"):
        Session(add_model((2,)), input_names=["a"], output_names=["sum"])


def test_names_must_be_distinct_and_match_the_model():
    with pytest.raises(NnhalError, match="two inputs are named 'a'"):
        Session(add_model((2,)), input_names=["a", "a"])
    model = ImportedModel(add_model((2,)), ["a", "b", "c"], ["s"], [], "three.tflite")
    with pytest.raises(NnhalError, match="three.tflite on device 'reference': 3 input and 1 "
                                         "output names for 2 inputs"):
        Session(model, "reference")
    bad_state = ImportedModel(add_model((2,)), ["a", "b"], ["s"],
                              [StateVariable("v", np.zeros(2, F32), 0, 1)], "state.tflite")
    with pytest.raises(NnhalError, match="state variable 'v' names input 0 and output 1"):
        Session(bad_state)


def test_session_is_reexported_from_the_package():
    assert nnhal.Session is Session and nnhal.TensorInfo is TensorInfo


def test_results_are_fresh_arrays(add2):
    first = add2.run([np.ones(2, F32), np.ones(2, F32)])["output_0"]
    add2.run([np.zeros(2, F32), np.zeros(2, F32)])
    assert first.tolist() == [2, 2]  # not a view of the reused output memory
    assert first.flags.writeable


# ---- checks on feeds -----------------------------------------------------------------------

def test_float64_into_float32_is_an_error_naming_the_input(add2):
    with pytest.raises(InputError, match="input 'input_0' is float64, the model expects float32"):
        add2.run([np.array([1.0, 2.0]), np.array([3, 4], F32)])


def test_int_array_is_not_cast_either(add2):
    with pytest.raises(InputError, match="input 'input_1' is int64"):
        add2.run([np.ones(2, F32), np.array([3, 4])])


def test_wrong_shape_names_the_input_and_the_expected_shape(add2):
    with pytest.raises(InputError, match=r"input 'input_1' has shape \(3,\), the model "
                                         r"expects \(2,\)"):
        add2.run([np.ones(2, F32), np.ones(3, F32)])
    with pytest.raises(InputError, match=r"shape \(1, 2\)"):
        add2.run([np.ones((1, 2), F32), np.ones(2, F32)])


def test_wrong_count(add2):
    with pytest.raises(InputError, match="1 inputs given, the model takes 2"):
        add2.run([np.ones(2, F32)])
    with pytest.raises(InputError, match="3 inputs given"):
        add2.run([np.ones(2, F32)] * 3)


def test_unknown_and_missing_names(add2):
    with pytest.raises(InputError, match="unknown input 'x'"):
        add2.run({"input_0": np.ones(2, F32), "input_1": np.ones(2, F32), "x": 1})
    with pytest.raises(InputError, match="missing input 'input_1'"):
        add2.run({"input_0": np.ones(2, F32)})


def test_feeds_of_the_wrong_kind(add2):
    with pytest.raises(InputError, match="not ndarray"):
        add2.run(np.ones(2, F32))
    with pytest.raises(InputError, match="not an array"):
        add2.run([[1.0, [2.0, 3.0]], [1.0, 2.0]])


def test_python_lists_convert_only_when_their_values_survive(add2):
    assert add2.run([[1.5, 2], [3, 4]])["output_0"].tolist() == [4.5, 6]
    with Session(add_model((2,), quant=True)) as q:
        assert q.run([[20, 30], [20, 30]])["output_0"].tolist() == [10, 20]
        with pytest.raises(InputError, match="outside uint8's range"):
            q.run([[20, 300], [20, 30]])
        with pytest.raises(InputError, match="list of float64 values, the model expects uint8"):
            q.run([[20.0, 30.0], [20, 30]])
    with pytest.raises(InputError, match="list of bool values"):
        add2.run([[True, False], [1.0, 2.0]])


def test_a_value_overflowing_float16_is_refused():
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT16, [1])
    y = b.input(T.TENSOR_FLOAT16, [1])
    out = b.output(T.TENSOR_FLOAT16, [1])
    b.operation(O.ADD, [x, y, b.scalar(T.INT32, 0)], [out])
    with Session(b.build()) as s:
        got = s.run([np.array([1.5], np.float16), [0.25]])["output_0"]
        assert got.dtype == np.float16 and got.tolist() == [1.75]
        with pytest.raises(InputError, match="input 'input_1'"):
            s.run([np.array([1.5], np.float16), [1e6]])


# ---- refused models ------------------------------------------------------------------------

def test_an_invalid_model_raises_with_the_validation_message():
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, [2])
    y = b.input(T.TENSOR_INT32, [2])
    out = b.output(T.TENSOR_FLOAT32, [2])
    b.operation(O.ADD, [x, y, b.scalar(T.INT32, 0)], [out])
    with pytest.raises(InvalidModelError) as err:
        Session(b.build())
    message = str(err.value)
    assert "operation 0" in message and "ADD" in message and "TENSOR_INT32" in message
    assert err.value.status == ErrorStatus.INVALID_ARGUMENT
    assert "\n" not in message


class _NoAdd(ReferenceDevice):
    """A device that cannot run ADD (and refuses a model holding one)."""

    def get_supported_operations(self, model):
        status, ok = super().get_supported_operations(model)
        return status, [s and op.type != O.ADD for s, op in zip(ok, model.main.operations)]

    def prepare_model(self, model, preference, priority, deadline, model_cache, data_cache,
                      token, callback):
        if any(op.type == O.ADD for op in model.main.operations):
            callback.notify(ErrorStatus.INVALID_ARGUMENT, None)
            return ErrorStatus.INVALID_ARGUMENT
        return super().prepare_model(model, preference, priority, deadline, model_cache,
                                     data_cache, token, callback)


def test_unsupported_operations_are_named_by_index_and_type():
    device = _NoAdd()
    try:
        b = ModelBuilder()
        x = b.input(T.TENSOR_FLOAT32, [2])
        t = b.operand(T.TENSOR_FLOAT32, [2])
        b.operation(O.RELU, [x], [t])
        out = b.output(T.TENSOR_FLOAT32, [2])
        b.operation(O.ADD, [t, x, b.scalar(T.INT32, 0)], [out])
        with pytest.raises(InvalidModelError, match=r"does not support operation 1 \(ADD\)$"):
            Session(b.build(), device)
        # A device passed in stays open: the caller owns it.
        with Session(_relu_only(), device) as s:
            assert s.run([np.array([-1, 2], F32)])["output_0"].tolist() == [0, 2]
    finally:
        device.close()


def _relu_only():
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, [2])
    out = b.output(T.TENSOR_FLOAT32, [2])
    b.operation(O.RELU, [x], [out])
    return b.build()


def test_unknown_device_name():
    with pytest.raises(NnhalError, match="unknown device 'nope'; devices: reference"):
        Session(add_model((2,)), "nope")


def test_not_a_model():
    with pytest.raises(NnhalError, match="cannot make a Session from a int"):
        Session(3)  # type: ignore[arg-type]


# ---- shapes the model leaves unknown -------------------------------------------------------

def test_unknown_output_dims_come_back_with_the_real_shape():
    with Session(reshape_model()) as s:
        assert s.outputs[0].shape == (0, 0)
        x = np.arange(6, dtype=F32)
        got = s.run([x, np.array([2, 3], np.int32)])["output_0"]
        assert got.shape == (2, 3) and got.tolist() == [[0, 1, 2], [3, 4, 5]]
        got = s.run([x, np.array([3, 2], np.int32)])["output_0"]
        assert got.shape == (3, 2) and got[2].tolist() == [4, 5]


def test_unknown_input_dims_take_the_given_size():
    with Session(add_model((0,), out_dims=(0,))) as s:
        assert s.inputs[0].shape == (0,)
        assert s.run([np.ones(3, F32), np.ones(3, F32)])["output_0"].tolist() == [2, 2, 2]
        got = s.run([np.arange(5, dtype=F32), np.ones(5, F32)])["output_0"]
        assert got.tolist() == [1, 2, 3, 4, 5]
        with pytest.raises(InputError, match=r"expects \(\?,\)"):
            s.run([np.ones((1, 5), F32), np.ones(5, F32)])
        with pytest.raises(InputError, match="empty tensor"):
            s.run([np.ones(0, F32), np.ones(0, F32)])


def test_an_execution_failure_is_an_execution_error():
    with Session(reshape_model()) as s:
        with pytest.raises(ExecutionError, match="INVALID_ARGUMENT") as err:
            s.run([np.arange(6, dtype=F32), np.array([4, 2], np.int32)])
        assert err.value.status == ErrorStatus.INVALID_ARGUMENT
        # and the session still works afterwards
        assert s.run([np.arange(6, dtype=F32), np.array([1, 6], np.int32)])["output_0"].shape \
            == (1, 6)


# ---- quantized tensors ---------------------------------------------------------------------

def test_uint8_in_and_out_as_stored_integers():
    with Session(add_model((2,), quant=True)) as s:
        assert (s.inputs[0].dtype, s.inputs[0].scale, s.inputs[0].zero_point) == \
            (np.dtype(np.uint8), 0.5, 10)
        got = s.run([np.array([20, 30], np.uint8), np.array([20, 30], np.uint8)])["output_0"]
        assert got.dtype == np.uint8 and got.tolist() == [10, 20]
        with pytest.raises(InputError, match="is int8, the model expects uint8"):
            s.run([np.array([20, 30], np.int8), np.array([20, 30], np.uint8)])


def test_int8_in_and_out_as_stored_integers():
    with Session(int8_add_model()) as s:
        assert s.outputs[0].dtype == np.int8 and s.inputs[0].zero_point == -10
        x = np.array([-10, 0, 10], np.int8)  # 0, 5, 10
        got = s.run([x, x])["output_0"]
        assert got.dtype == np.int8 and got.tolist() == [0, 10, 20]


# ---- state variables -----------------------------------------------------------------------

def test_state_is_carried_across_runs_and_hidden():
    with Session(accumulator()) as s:
        assert [i.name for i in s.inputs] == ["x"]
        assert [o.name for o in s.outputs] == ["y"]
        one = np.ones(2, F32)
        assert [s.run([one])["y"].tolist() for _ in range(3)] == [[1, 1], [2, 2], [3, 3]]
        assert list(s.run({"x": one})) == ["y"]
        s.reset_state()
        assert s.run([one])["y"].tolist() == [1, 1]
        with pytest.raises(InputError, match="unknown input 'state_in'"):
            s.run({"x": one, "state_in": one})


def test_state_starts_from_its_initial_value():
    with Session(accumulator(np.array([10, 20], F32))) as s:
        assert s.run([np.ones(2, F32)])["y"].tolist() == [11, 21]
        s.run([np.ones(2, F32)])
        s.reset_state()
        assert s.run([np.zeros(2, F32)])["y"].tolist() == [10, 20]


def test_a_state_initial_value_that_does_not_fit_is_an_error():
    with pytest.raises(InvalidModelError, match="state variable 'acc'"):
        Session(accumulator(np.array([0.5, 1, 2], F32)))


# ---- lifetime and threads ------------------------------------------------------------------

def test_run_after_close_is_an_error():
    s = Session(add_model((2,)))
    s.close()
    s.close()  # twice is fine
    with pytest.raises(NnhalError, match="closed"):
        s.run([np.ones(2, F32), np.ones(2, F32)])


def test_a_dropped_session_closes_the_device_it_opened():
    import gc

    # The threads themselves, not a count: threads of earlier tests may still be ending.
    for _ in range(3):
        before = set(threading.enumerate())
        s = Session(add_model((2,)), "reference")  # a device the Session opens itself
        workers = set(threading.enumerate()) - before
        assert workers  # the device's workers
        del s
        gc.collect()
        deadline = time.monotonic() + 10
        while any(w.is_alive() for w in workers) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not any(w.is_alive() for w in workers)
    outside = ReferenceDevice()
    try:
        s = Session(add_model((2,)), outside)
        del s
        gc.collect()
        # a device the caller passed in stays usable
        with Session(add_model((2,)), outside) as again:
            assert again.run([np.ones(2, F32), np.ones(2, F32)])["output_0"].tolist() == [2, 2]
    finally:
        outside.close()


def test_request_memory_is_reused_while_shapes_stay(add2):
    add2.run([np.ones(2, F32), np.ones(2, F32)])
    layout = add2._layout
    add2.run([np.zeros(2, F32), np.ones(2, F32)])
    assert add2._layout is layout


def test_concurrent_runs_on_one_session_give_each_caller_its_answer(add2):
    errors, results = [], {}

    def work(k: int) -> None:
        try:
            for _ in range(20):
                got = add2.run([np.full(2, k, F32), np.ones(2, F32)])["output_0"]
                if got.tolist() != [k + 1, k + 1]:
                    errors.append((k, got))
            results[k] = True
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and len(results) == 4


# ---- RequestBuilder checks -----------------------------------------------------------------

def _prepare(model: Model):
    device = ReferenceDevice()
    cb = PreparedModelCallback()
    device.prepare_model(model, ExecutionPreference.FAST_SINGLE_ANSWER, Priority.MEDIUM, None,
                         [], [], b"", cb)
    status, prepared = cb.wait(30)
    assert status == ErrorStatus.NONE
    return device, prepared


def test_request_builder_checks_arrays_against_the_model():
    model = add_model((2,))
    with pytest.raises(InputError, match="input 0 is float64, the model expects float32"):
        RequestBuilder([np.array([1.0, 2.0]), np.ones(2, F32)], model=model)
    with pytest.raises(InputError, match=r"input 1 has shape \(3,\)"):
        RequestBuilder([np.ones(2, F32), np.ones(3, F32)], model=model)
    with pytest.raises(InputError, match="1 inputs given"):
        RequestBuilder.for_model(model, [np.ones(2, F32)])
    device, prepared = _prepare(model)
    try:
        req = RequestBuilder.for_model(model, [np.array([1, 2], F32), np.array([3, 4], F32)])
        assert req.request.outputs[0].location.length == 8
        status, shapes, _ = prepared.execute_synchronously(req.request, MeasureTiming.NO)
        assert status == ErrorStatus.NONE
        assert req.output(0).tolist() == [4, 6]
        req.close()
    finally:
        device.close()


def test_request_builder_gives_dims_for_unknown_input_dims():
    model = add_model((0,), out_dims=(0,))
    device, prepared = _prepare(model)
    try:
        req = RequestBuilder([np.ones(3, F32), np.ones(3, F32)], model=model)
        assert req.request.inputs[0].dimensions == [3]
        assert req.request.outputs[0].location.length == 0
        status, shapes, _ = prepared.execute_synchronously(req.request, MeasureTiming.NO)
        assert status == ErrorStatus.OUTPUT_INSUFFICIENT_SIZE and shapes[0].dimensions == [3]
        req.close()
        req = RequestBuilder([np.ones(3, F32), np.ones(3, F32)], [12], model=model)
        status, shapes, _ = prepared.execute_synchronously(req.request, MeasureTiming.NO)
        assert status == ErrorStatus.NONE
        assert req.output(0, shape=shapes[0].dimensions).tolist() == [2, 2, 2]
        req.close()
    finally:
        device.close()


def test_request_builder_positional_form_is_unchanged():
    req = RequestBuilder([np.ones(2, F32)], [8])
    assert req.request.inputs[0].dimensions == [] and req.request.outputs[0].location.length == 8
    with pytest.raises(TypeError, match="needs dtype and shape"):
        req.output(0)
    req.close()


# ---- .tflite files -------------------------------------------------------------------------

def test_a_missing_tflite_file_is_named(tmp_path):
    missing = tmp_path / "none.tflite"
    with pytest.raises(nnhal.ModelFileError, match="none.tflite: no such file"):
        Session(str(missing))
    with pytest.raises(nnhal.ModelFileError, match="not a TFLite flatbuffer"):
        Session(b"definitely not a model")


def _wakeword_model():
    import importlib.metadata

    try:
        files = importlib.metadata.files("pymicro-wakeword") or []
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("pymicro-wakeword is not installed")
    paths = sorted(str(f.locate()) for f in files if str(f).endswith(".tflite"))
    if not paths:
        pytest.skip("pymicro-wakeword ships no .tflite here")
    return paths[0]


def test_a_real_streaming_model_runs_with_its_state():
    tflite = pytest.importorskip("nnhal.tflite")
    if not hasattr(tflite, "read_tflite"):
        pytest.skip("nnhal.tflite.read_tflite is not in this build yet")
    path = _wakeword_model()
    with Session(path) as s:
        assert s.inputs and s.outputs
        info = s.inputs[0]
        assert info.dtype == np.int8 and info.scale > 0
        x = np.zeros(info.shape, np.int8)
        first = s.run([x])
        assert all(v.dtype == o.dtype for v, o in zip(first.values(), s.outputs))
        assert len(s.imported.state) > 0  # the streaming buffers are carried, not inputs


# ---- through the NNAPI runtime (no device given) ------------------------------------------

def test_without_a_device_the_session_compiles_through_the_runtime():
    with Session(add_model((2,))) as s:
        assert s.compilation is not None
        plan = s.plan
        assert len(plan) == 1 and plan[0]["operations"] == [0]
        assert s.device_name == plan[0]["device"]
        out = s.run({"input_0": np.array([1, 2], F32), "input_1": np.array([3, 4], F32)})
        np.testing.assert_array_equal(out["output_0"], [4, 6])


def test_devices_restrict_the_runtime_and_device_still_names_one_driver():
    with Session(add_model((2,)), devices=["reference"]) as s:
        assert [p["device"] for p in s.plan] == ["reference"]
        out = s.run([np.array([1, 2], F32), np.array([3, 4], F32)])
        np.testing.assert_array_equal(out["output_0"], [4, 6])
    with Session(add_model((2,)), "reference") as s:
        assert s.compilation is None and s.device_name == "reference"
    with pytest.raises(NnhalError, match="not both"):
        Session(add_model((2,)), "reference", devices=["reference"])
    with pytest.raises(NnhalError, match="unknown device 'nope'"):
        Session(add_model((2,)), devices=["nope"])
