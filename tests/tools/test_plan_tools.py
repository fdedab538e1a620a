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
