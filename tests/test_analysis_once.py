"""A model is analysed once per path: ``nnhal run``, a Session, a runtime compilation on one
device and across devices; an edited model is analysed again, never answered stale."""

from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest

from nnhal import cli
from nnhal.analysis import analyse, analyses
from nnhal.drivers.reference import ReferenceDevice
from nnhal.hal.builder import ModelBuilder
from nnhal.hal.interfaces import PreparedModelCallback
from nnhal.hal.types import ErrorStatus, OperandType, OperationType
from nnhal.runtime import Compilation, Device
from nnhal.runtime import NdkModel as RtModel
from nnhal.tflite import write_tflite

T, O = OperandType, OperationType


def add_mul():
    """out = (x + y) * y, float32 [1, 4]."""
    b = ModelBuilder()
    x, y = b.input(T.TENSOR_FLOAT32, [1, 4]), b.input(T.TENSOR_FLOAT32, [1, 4])
    t = b.operand(T.TENSOR_FLOAT32, [1, 4])
    out = b.output(T.TENSOR_FLOAT32, [1, 4])
    b.operation(O.ADD, [x, y, b.scalar(T.INT32, 0)], [t])
    b.operation(O.MUL, [t, y, b.scalar(T.INT32, 0)], [out])
    return b.build()


def _litert():
    pytest.importorskip("ai_edge_litert")
    from nnhal.drivers.litert import LiteRTDevice

    return LiteRTDevice


@pytest.mark.parametrize("device", ["reference", "litert"])
def test_nnhal_run_analyses_once(tmp_path, device):
    if device == "litert":
        _litert()
    path = tmp_path / "m.tflite"
    path.write_bytes(write_tflite(add_mul()))
    before = analyses()
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli.main(["run", str(path), "--device", device]) == 0
    assert analyses() - before == 1  # the importer's; the device reads it (was 2, 3)


def test_session_on_the_runtime_analyses_once(tmp_path):
    import nnhal

    path = tmp_path / "m.tflite"
    path.write_bytes(write_tflite(add_mul()))
    before = analyses()
    with nnhal.Session(str(path), devices=["reference"]) as s:
        s.run([np.ones((1, 4), np.float32)] * 2)
    assert analyses() - before == 1


def _compile(devices):
    m = RtModel.from_hal(add_mul())
    c = Compilation(m, devices)
    c.finish()
    return c


def test_runtime_compilation_on_reference_analyses_once():
    before = analyses()
    _compile([Device("reference", ReferenceDevice())])
    assert analyses() - before == 1  # finish; support query and prepare read it (was 3)


def test_runtime_compilation_over_reference_and_litert_analyses_once():
    litert = _litert()
    before = analyses()
    c = _compile([Device("reference", ReferenceDevice()), Device("litert", litert())])
    assert len(c.plan()) == 1
    assert analyses() - before == 1  # (was 5: finish, two support queries, prepare, export)


def test_split_compilation_analyses_the_model_once_and_each_step_once():
    litert = _litert()

    class AddOnly(litert):
        def supported(self, graph):
            return [op[0] == O.ADD for op in graph.main.operations]

    before = analyses()
    c = _compile([Device("reference", ReferenceDevice()), Device("litert", AddOnly())])
    plan = c.plan()
    assert [s["device"] for s in plan] == ["litert", "reference"]
    # The whole model once at finish; each step is a model of its own, analysed once by
    # the device that prepares it (was 3 + 2 per step).
    assert analyses() - before == 1 + len(plan)


def _prepare(device, model):
    cb = PreparedModelCallback()
    device.prepare_model(model, 1, 1, None, [], [], b"", cb)
    return cb.wait(30)


def test_an_edited_model_is_analysed_again():
    model = add_mul()
    graph = analyse(model, keep=True)
    n = analyses()
    assert analyse(model) is graph and analyses() == n
    model.main.operands[0].dimensions = [1, 5]  # now contradicts the other input
    device = ReferenceDevice()
    status, prepared = _prepare(device, model)
    assert status == ErrorStatus.INVALID_ARGUMENT and prepared is None
    assert analyses() == n + 1
    model.main.operands[0].dimensions = [1, 4]
    status, _ = _prepare(device, model)
    assert status == ErrorStatus.NONE


@pytest.mark.parametrize("edit", [
    lambda m: m.main.operations.pop(),
    lambda m: setattr(m.main.operands[2], "scale", 0.5),
    lambda m: setattr(m, "operand_values", bytes(len(m.operand_values) + 8)),
    lambda m: setattr(m, "relax_computation_float32_to_float16", True),
    lambda m: m.main.output_indexes.append(0),
])
def test_any_edit_misses_the_kept_graph(edit):
    model = add_mul()
    graph = analyse(model, keep=True)
    edit(model)
    n = analyses()
    try:
        again = analyse(model)
    except Exception:  # noqa: BLE001 - an edit may make it invalid: analysed all the same
        again = None
    assert again is not graph and analyses() == n + 1


def test_a_kept_graph_goes_with_its_model():
    import gc

    from nnhal.analysis import kept

    model = add_mul()
    analyse(model, keep=True)
    key = id(model)
    assert key in kept._kept
    del model
    gc.collect()
    assert key not in kept._kept
