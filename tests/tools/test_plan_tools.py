"""``nnhal info --plan`` and ``nnhal view --plan``: the runtime's partition shown, over the
reference driver and a test driver that claims only RELU."""

from __future__ import annotations

import argparse
import json

import pytest
from test_info_view import tiny

from nnhal.conformance.mode_partitioned import HalfDevice
from nnhal.drivers import registry
from nnhal.hal.types import OperationType as O
from nnhal.tflite import write_tflite
from nnhal.tools import info, view
from nnhal.tools.view import PALETTE


@pytest.fixture
def relu_only(monkeypatch):
    monkeypatch.setattr(registry, "_DEVICES", dict(registry._DEVICES))
    registry.register("relu-only", lambda: HalfDevice(frozenset({int(O.RELU)})))
    return ["reference", "relu-only"]


@pytest.fixture
def tiny_file(tmp_path):
    path = tmp_path / "tiny.tflite"
    path.write_bytes(write_tflite(tiny().model))
    return str(path)


def test_plan_info_lists_steps_with_devices_and_operations(relu_only):
    steps = info.plan_info(tiny(), relu_only)
    assert [(s["device"], s["operations"], s["operation_names"]) for s in steps] == [
        ("reference", [0], ["CONV_2D"]), ("relu-only", [1], ["RELU"]),
        ("reference", [2], ["ADD"])]
    assert [len(s["inputs"]) for s in steps] == [1, 1, 2]
    one = info.plan_info(tiny(), ["reference"])
    assert [(s["device"], s["operations"]) for s in one] == [("reference", [0, 1, 2])]


def test_info_plan_command_prints_and_dumps_json(relu_only, tiny_file, capsys):
    args = argparse.Namespace(model=tiny_file, json=False, plan=True, device=relu_only,
                              preference="fast")
    assert info.main(args) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "plan: 3 steps"
    assert "step 1: relu-only: 1 operations [1] (RELU)" in out
    args.json = True
    assert info.main(args) == 0
    data = json.loads(capsys.readouterr().out)
    assert [s["device"] for s in data["plan"]] == ["reference", "relu-only", "reference"]


def test_info_plan_on_devices_that_cannot_run_the_model_is_one_error(monkeypatch, tiny_file):
    monkeypatch.setattr(registry, "_DEVICES", dict(registry._DEVICES))
    registry.register("relu-only", lambda: HalfDevice(frozenset({int(O.RELU)})))
    args = argparse.Namespace(model=tiny_file, json=False, plan=True, device=["relu-only"],
                              preference="fast")
    with pytest.raises(Exception, match="the runtime cannot compile the model"):
        info.main(args)


def test_view_plan_colours_each_operation_by_device_with_a_legend(relu_only, tiny_file,
                                                                  tmp_path):
    out = tmp_path / "tiny.dot"
    args = argparse.Namespace(model=tiny_file, output=str(out), plan=True, device=relu_only)
    assert view.main(args) == 0
    dot = out.read_text()
    assert "devices:\\nreference\\nrelu-only" in dot
    lines = {name: next(ln for ln in dot.splitlines() if f'"{name}' in ln and "fillcolor" in ln)
             for name in ("CONV_2D", "RELU", "ADD")}
    assert PALETTE[0] in lines["CONV_2D"] and PALETTE[0] in lines["ADD"]
    assert PALETTE[1] in lines["RELU"]
    plain = tmp_path / "plain.dot"
    assert view.main(argparse.Namespace(model=tiny_file, output=str(plain), plan=False,
                                        device=None)) == 0
    assert "devices:" not in plain.read_text()


def test_info_plan_says_why_each_refused_operation_went_elsewhere(relu_only, tiny_file,
                                                                   capsys):
    steps = info.plan_info(tiny(), relu_only)
    assert [s["refused"] for s in steps] == [
        [{"index": 0, "operation": "CONV_2D",
          "devices": {"relu-only": "getSupportedOperations: not supported"}}],
        [],
        [{"index": 2, "operation": "ADD",
          "devices": {"relu-only": "getSupportedOperations: not supported"}}]]
    info.render_plan(steps)
    assert "#2 ADD runs on reference: relu-only refused it: getSupportedOperations" in \
        capsys.readouterr().out


def _mul_then_add():
    """An 8-bit MUL whose input scales' product is 256 times the output's (LiteRT refuses
    it: TFLite's result differs), then an ADD LiteRT runs."""
    from nnhal.hal.builder import ModelBuilder
    from nnhal.hal.types import OperandType as T

    b = ModelBuilder()
    x = b.input(T.TENSOR_QUANT8_ASYMM, [1, 4], 16.0, 0)
    y = b.input(T.TENSOR_QUANT8_ASYMM, [1, 4], 16.0, 0)
    m = b.operand(T.TENSOR_QUANT8_ASYMM, [1, 4], 1.0, 0)
    b.operation(O.MUL, [x, y, b.scalar(T.INT32, 0)], [m])
    out = b.output(T.TENSOR_QUANT8_ASYMM, [1, 4], 1.0, 0)
    b.operation(O.ADD, [m, m, b.scalar(T.INT32, 0)], [out])
    return b.build()


def test_info_plan_gives_litert_s_own_reason():
    if registry.reason("litert") is not None:
        pytest.skip(f"litert is not available: {registry.reason('litert')}")
    steps = info.plan_info(_mul_then_add(), ["reference", "litert"])
    assert [(s["device"], s["operations"]) for s in steps] == [("reference", [0]),
                                                               ("litert", [1])]
    (refused,) = steps[0]["refused"]
    assert refused["operation"] == "MUL" and "256" in refused["devices"]["litert"]


def test_info_names_where_the_runtime_runs_the_model(capsys):
    data = info.model_info(tiny())
    fastest = "litert" if registry.reason("litert") is None else "reference"
    assert data["runtime"] == {"steps": [{"device": fastest, "operations": [0, 1, 2]}]}
    info.render(data)
    assert f"runtime (the default, over every available device): runs on {fastest} " \
           f"(3 operations)" in capsys.readouterr().out
