"""``nnhal run`` and ``nnhal bench`` through their main(), on HAL models handed in as files."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from nnhal import cli
from nnhal.hal.builder import ModelBuilder
from nnhal.hal.types import OperandType, OperationType
from nnhal.session import load_model
from nnhal.tflite.model import ImportedModel
from nnhal.tools import bench, run

F32 = np.float32
T = OperandType


def add_model(dims=(2,), out_dims=None, quant=False):
    """sum = a + b, float32 or uint8 (scale 0.5, zero point 10 in; 1, 0 out)."""
    b = ModelBuilder()
    t = T.TENSOR_QUANT8_ASYMM if quant else T.TENSOR_FLOAT32
    q_in, q_out = ((0.5, 10), (1.0, 0)) if quant else ((0.0, 0), (0.0, 0))
    x = b.input(t, dims, *q_in)
    y = b.input(t, dims, *q_in)
    out = b.output(t, dims if out_dims is None else out_dims, *q_out)
    b.operation(OperationType.ADD, [x, y, b.scalar(T.INT32, 0)], [out])
    return b.build()


def _bad_model():
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, [2])
    y = b.input(T.TENSOR_INT32, [2])
    out = b.output(T.TENSOR_FLOAT32, [2])
    b.operation(OperationType.ADD, [x, y, b.scalar(T.INT32, 0)], [out])
    return b.build()


MODELS = {
    "add.tflite": lambda: ImportedModel(add_model((2,)), ["a", "b"], ["sum"], [], "add.tflite"),
    "quant.tflite": lambda: ImportedModel(add_model((2,), quant=True), ["a", "b"], ["sum"], [],
                                          "quant.tflite"),
    "dynamic.tflite": lambda: ImportedModel(add_model((0, 3), out_dims=(0, 3)), ["a", "b"],
                                            ["sum"], [], "dynamic.tflite"),
    "bad.tflite": lambda: ImportedModel(_bad_model(), ["a", "b"], ["sum"], [], "bad.tflite"),
}


@pytest.fixture(autouse=True)
def fake_files(monkeypatch, tmp_path):
    """The commands read these names as models (placeholder files in the current folder, as
    the argument check wants a file); any other path goes to the real reader."""
    monkeypatch.chdir(tmp_path)
    for name in MODELS:
        (tmp_path / name).write_bytes(b"placeholder")
    monkeypatch.setattr(run, "read_model",
                        lambda path: MODELS[path]() if path in MODELS else load_model(path))


def parse(module, *argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    return parser.parse_args([str(a) for a in argv])


def call(module, capsys, *argv):
    """The command as ``nnhal`` runs it: (exit status, stdout, stderr)."""
    name = module.__name__.rsplit(".", 1)[1]
    status = cli.main([name, *(str(a) for a in argv)])
    out, err = capsys.readouterr()
    return status, out, err


# ---- nnhal run -----------------------------------------------------------------------------

def test_run_with_named_inputs_and_outputs(tmp_path, capsys):
    inputs, outputs = tmp_path / "in.npz", tmp_path / "out.npz"
    np.savez(inputs, a=np.array([1, 2], F32), b=np.array([3, 4], F32))
    status, out, err = call(run, capsys, "add.tflite", "--inputs", inputs, "--outputs", outputs)
    assert (status, err) == (0, "")
    assert "sum" in out and "(2,)" in out and "float32" in out and "4, 6" in out
    assert "prepare" in out and "execute" in out and "random" not in out
    with np.load(outputs, allow_pickle=False) as saved:
        assert saved.files == ["sum"] and saved["sum"].tolist() == [4, 6]


def test_run_with_positional_inputs(tmp_path, capsys):
    inputs, outputs = tmp_path / "in.npz", tmp_path / "out.npz"
    np.savez(inputs, np.array([1, 2], F32), np.array([10, 20], F32))
    status, _, err = call(run, capsys, "add.tflite", "--inputs", inputs, "--outputs", outputs)
    assert (status, err) == (0, "")
    with np.load(outputs, allow_pickle=False) as saved:
        assert saved["sum"].tolist() == [11, 22]


def test_run_with_random_inputs_says_so_and_is_seeded(tmp_path, capsys):
    outs = []
    for seed in (3, 3, 4):
        path = tmp_path / f"out{len(outs)}.npz"
        status, out, _ = call(run, capsys, "add.tflite", "--seed", seed, "--outputs", path)
        assert status == 0 and f"inputs are random (seed {seed})" in out
        with np.load(path, allow_pickle=False) as saved:
            outs.append(saved["sum"])
    assert outs[0].dtype == F32
    assert np.array_equal(outs[0], outs[1]) and not np.array_equal(outs[0], outs[2])


def test_random_quantized_inputs_are_integers_of_the_type(tmp_path, capsys):
    path = tmp_path / "out.npz"
    status, out, _ = call(run, capsys, "quant.tflite", "--outputs", path)
    assert status == 0 and "uint8" in out
    with np.load(path, allow_pickle=False) as saved:
        assert saved["sum"].dtype == np.uint8


def test_random_inputs_for_unknown_dims_use_one_and_say_so(tmp_path, capsys):
    path = tmp_path / "out.npz"
    status, out, _ = call(run, capsys, "dynamic.tflite", "--outputs", path)
    assert status == 0
    assert "input 'a': unknown dimensions set to 1, shape (1, 3)" in out
    with np.load(path, allow_pickle=False) as saved:
        assert saved["sum"].shape == (1, 3)


def test_random_arrays_cover_each_kind():
    rng = np.random.default_rng(0)
    from nnhal.session import TensorInfo

    q = run.random_array(TensorInfo("q", np.dtype(np.int8), (4000,), 0.1, 0), (4000,), rng)
    assert q.dtype == np.int8 and q.min() == -128 and q.max() == 127
    i = run.random_array(TensorInfo("i", np.dtype(np.int32), (100,)), (100,), rng)
    assert i.dtype == np.int32 and 0 <= i.min() and i.max() < run.SMALL_INT
    b = run.random_array(TensorInfo("b", np.dtype(np.bool_), (100,)), (100,), rng)
    assert b.dtype == np.bool_ and b.any() and not b.all()
    h = run.random_array(TensorInfo("h", np.dtype(np.float16), (3,)), (3,), rng)
    assert h.dtype == np.float16


@pytest.mark.parametrize("arrays, message", [
    ({"a": np.ones(2, F32), "b": np.ones(2, F32), "c": np.ones(2, F32)},
     "key 'c' is not an input of the model (inputs: a, b)"),
    ({"a": np.ones(2, F32)}, "no array for input 'b'"),
    ({"a": np.ones(2), "b": np.ones(2, F32)}, "input 'a' is float64, the model expects float32"),
    ({"a": np.ones(3, F32), "b": np.ones(2, F32)}, "input 'a' has shape (3,)"),
])
def test_run_with_bad_npz_is_one_line_and_exit_2(tmp_path, capsys, arrays, message):
    inputs = tmp_path / "in.npz"
    np.savez(inputs, **arrays)
    status, out, err = call(run, capsys, "add.tflite", "--inputs", inputs)
    assert status == 2 and err.startswith("nnhal run: ") and message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_run_with_too_few_positional_arrays(tmp_path, capsys):
    inputs = tmp_path / "in.npz"
    np.savez(inputs, np.ones(2, F32))
    status, _, err = call(run, capsys, "add.tflite", "--inputs", inputs)
    assert status == 2 and "1 arrays, the model takes 2 inputs (a, b)" in err


def test_run_refuses_pickled_arrays(tmp_path, capsys):
    inputs = tmp_path / "in.npz"
    np.savez(inputs, a=np.array([{"x": 1}, None], dtype=object), b=np.ones(2, F32))
    status, _, err = call(run, capsys, "add.tflite", "--inputs", inputs)
    assert status == 2 and "array 'a' holds Python objects" in err and "pickl" in err.lower()


def test_run_with_a_missing_or_broken_inputs_file(tmp_path, capsys):
    status, _, err = call(run, capsys, "add.tflite", "--inputs", tmp_path / "none.npz")
    assert status == 2 and f"{tmp_path / 'none.npz'}: no such file" in err
    assert err.startswith("nnhal run: ") and err.count("\n") == 1
    broken = tmp_path / "broken.npz"
    broken.write_bytes(b"PK\x03\x04 not really a zip")
    status, _, err = call(run, capsys, "add.tflite", "--inputs", broken)
    assert status == 2 and "not an .npz file" in err


def test_run_with_a_missing_model_file(tmp_path, capsys):
    missing = tmp_path / "none.tflite"
    status, out, err = call(run, capsys, missing)
    assert status == 2 and f"{missing}: no such file" in err and out == ""
    assert err.startswith("nnhal run: ") and err.count("\n") == 1


def test_run_with_a_file_that_is_not_a_model(tmp_path, capsys):
    junk = tmp_path / "junk.tflite"
    junk.write_bytes(b"\0" * 64)
    status, _, err = call(run, capsys, junk)
    assert status == 2 and "junk.tflite: not a TFLite flatbuffer" in err


def test_run_with_an_invalid_model_names_the_operation(capsys):
    status, _, err = call(run, capsys, "bad.tflite")
    assert status == 1 and "operation 0: ADD" in err and err.count("\n") == 1


def test_run_with_an_unknown_device(capsys):
    status, _, err = call(run, capsys, "add.tflite", "--device", "gpu")
    assert status == 2 and err.startswith("nnhal run: ") and err.count("\n") == 1
    assert "unknown device 'gpu'; devices: reference, litert" in err


def test_run_cannot_write_outputs(tmp_path, capsys):
    status, out, err = call(run, capsys, "add.tflite", "--outputs", tmp_path / "no" / "out.npz")
    assert status == 2 and "cannot write" in err and out == ""  # said before the run


def _fastest() -> str:
    """The device the runtime picks for a float32 or 8-bit model every driver runs."""
    from nnhal.drivers import registry

    return "litert" if registry.reason("litert") is None else "reference"


def test_run_defaults_to_the_runtime_and_says_which_device_ran_it(capsys):
    status, out, err = call(run, capsys, "quant.tflite")
    assert (status, err) == (0, "")
    assert f"ran on {_fastest()} (1 operation): prepare " in out and "pinned" not in out


def test_run_device_pins_one_driver(capsys):
    status, out, err = call(run, capsys, "quant.tflite", "--device", "reference")
    assert (status, err) == (0, "")
    assert "ran on reference (1 operation; pinned by --device): prepare " in out


def test_ran_on_names_every_device_of_a_split_plan(split_runtime, capsys):
    status, out, err = call(run, capsys, "tiny.tflite")
    assert (status, err) == (0, "")
    assert "reference: 2 operations, relu-only: 1 operation (3 steps): prepare" in out


@pytest.fixture
def split_runtime(monkeypatch, tmp_path):
    """The runtime's devices: the reference driver and one claiming only RELU, so the tiny
    CONV_2D -> RELU -> ADD model runs in three steps over two devices."""
    import importlib

    from test_info_view import tiny

    from nnhal.conformance.mode_partitioned import HalfDevice
    from nnhal.drivers.reference import ReferenceDevice
    from nnhal.hal.types import OperationType as O

    rt = importlib.import_module("nnhal.runtime.devices")
    ref, half = ReferenceDevice(), HalfDevice(frozenset({int(O.RELU)}))
    monkeypatch.setattr(rt, "_devices", [rt.Device("reference", ref),
                                         rt.Device("relu-only", half)])
    monkeypatch.setattr(rt, "_named_seen", rt.os.environ.get(rt.DEVICES_ENV, ""))
    MODELS["tiny.tflite"] = lambda: tiny()
    (tmp_path / "tiny.tflite").write_bytes(b"placeholder")
    yield
    del MODELS["tiny.tflite"]
    ref.close()
    half.inner.close()


def conv_model(layers: int = 4, size: int = 48, channels: int = 32) -> ImportedModel:
    """A float32 chain of 3x3 CONV_2D (SAME, RELU) then an ADD and a LOGISTIC: enough work
    per operation that the kernels, not the bookkeeping, are the run."""
    rng = np.random.default_rng(0)
    b = ModelBuilder()
    x = first = b.input(T.TENSOR_FLOAT32, [1, size, size, channels])
    for _ in range(layers):
        w = b.constant(T.TENSOR_FLOAT32,
                       (rng.standard_normal((channels, 3, 3, channels)) * 0.1).astype(F32))
        bias = b.constant(T.TENSOR_FLOAT32, np.zeros(channels, F32))
        y = b.operand(T.TENSOR_FLOAT32, [1, size, size, channels])
        b.operation(OperationType.CONV_2D, [x, w, bias, *[b.scalar(T.INT32, v)
                                                          for v in (1, 1, 1, 1)]], [y])
        x = y
    s = b.operand(T.TENSOR_FLOAT32, [1, size, size, channels])
    b.operation(OperationType.ADD, [x, first, b.scalar(T.INT32, 0)], [s])
    out = b.output(T.TENSOR_FLOAT32, [1, size, size, channels])
    b.operation(OperationType.LOGISTIC, [s], [out])
    return ImportedModel(b.build(), ["x"], ["y"], [], "conv.tflite")


def test_bench_profile_json_times_each_operation_of_the_reference(tmp_path, capsys):
    MODELS["conv.tflite"] = conv_model
    (tmp_path / "conv.tflite").write_bytes(b"placeholder")
    record = tmp_path / "bench.json"
    try:
        status, out, err = call(bench, capsys, "conv.tflite", "--device", "reference",
                                "--runs", 5, "--warmup", 1, "--profile", "--json", record)
    finally:
        del MODELS["conv.tflite"]
    assert (status, err) == (0, "")
    assert "slowest operations" in out and "per operation type" in out
    prof = json.loads(record.read_text())["profile"]
    assert prof["runs"] == 5
    ops = prof["operations"]
    assert [(o["index"], o["type"], o["device"]) for o in ops] == \
        [(k, "CONV_2D", "reference") for k in range(4)] + \
        [(4, "ADD", "reference"), (5, "LOGISTIC", "reference")]
    total = sum(o["seconds"] for o in ops)
    run_s = prof["run_seconds"]
    assert 0.6 * run_s <= total <= run_s  # the kernels are most of the run, never more
    assert total == pytest.approx(prof["attributed_seconds"])
    assert {t["type"]: t["count"] for t in prof["types"]} == {"CONV_2D": 4, "ADD": 1,
                                                              "LOGISTIC": 1}
    assert sum(t["percent"] for t in prof["types"]) == pytest.approx(100 * total / run_s)
    assert [(s["device"], s["operations"], s["per_operation"]) for s in prof["steps"]] == \
        [("reference", 6, True)]


def test_bench_profile_on_the_runtime_is_per_step_with_the_device(split_runtime, tmp_path,
                                                                  capsys):
    record = tmp_path / "bench.json"
    status, out, err = call(bench, capsys, "tiny.tflite", "--runs", 3, "--warmup", 1,
                            "--profile", "--json", record)
    assert (status, err) == (0, "")
    data = json.loads(record.read_text())
    prof = data["profile"]
    steps = prof["steps"]
    assert [(s["device"], s["operations"], s["timed_by"]) for s in steps] == \
        [("reference", 1, "runtime"), ("relu-only", 1, "runtime"), ("reference", 1, "runtime")]
    assert [(o["index"], o["type"], o["device"], o["step"]) for o in prof["operations"]] == \
        [(0, "CONV_2D", "reference", 0), (1, "RELU", "relu-only", 1), (2, "ADD", "reference", 2)]
    for s in steps:  # each step's time covers its operation's
        mine = [o["seconds"] for o in prof["operations"] if o["step"] == s["step"]]
        assert 0 < sum(mine) <= s["seconds"]
    assert sum(s["seconds"] for s in steps) <= prof["run_seconds"]
    assert "steps" in out


@pytest.mark.skipif("not __import__('nnhal.drivers.registry', fromlist=['x']).reason('litert') "
                    "is None", reason="ai-edge-litert is not installed")
def test_bench_profile_on_litert_is_one_step_and_says_why(tmp_path, capsys):
    record = tmp_path / "bench.json"
    status, out, err = call(bench, capsys, "add.tflite", "--device", "litert", "--runs", 3,
                            "--warmup", 1, "--profile", "--json", record)
    assert (status, err) == (0, "")
    prof = json.loads(record.read_text())["profile"]
    (step,) = prof["steps"]
    assert (step["device"], step["timed_by"], step["per_operation"]) == ("litert", "driver",
                                                                         False)
    assert "per-operation profiler" in step["why_no_operations"] and prof["operations"] == []
    assert 0 < step["seconds"] <= prof["run_seconds"]


# ---- nnhal bench ---------------------------------------------------------------------------

def test_bench_prints_figures_and_writes_json(tmp_path, capsys):
    record = tmp_path / "bench.json"
    status, out, err = call(bench, capsys, "add.tflite", "--runs", 7, "--warmup", 2,
                            "--json", record)
    assert (status, err) == (0, "")
    for figure in ("prepare", "latency min", "latency median", "latency p90", "latency mean",
                   "executions per second"):
        assert figure in out
    data = json.loads(record.read_text())
    # No --device: the runtime over every available device, which gives the one ADD to the
    # device whose capabilities are best (LiteRT, when it is installed).
    assert (data["model"], data["device"], data["runs"], data["warmup"]) == \
        ("add.tflite", _fastest(), 7, 2)
    assert data["pinned"] is False and data["steps"] == [{"device": _fastest(),
                                                          "operations": 1}]
    assert data["placement"] == f"ran on {_fastest()} (1 operation)"
    assert "profile" not in data
    lat = data["latency_seconds"]
    assert 0 < lat["min"] <= lat["median"] <= lat["p90"] and lat["min"] <= lat["mean"]
    assert data["executions_per_second"] == pytest.approx(1 / lat["mean"])
    assert data["prepare_seconds"] > 0
    assert data["loadavg"] is None or len(data["loadavg"]) == 3


def test_bench_figures():
    got = bench.figures([0.004, 0.001, 0.002, 0.003])
    assert got["min"] == 0.001 and got["median"] == 0.0025 and got["mean"] == 0.0025
    assert got["p90"] == pytest.approx(0.0037)
    assert got["executions_per_second"] == pytest.approx(400)


def test_bench_errors(capsys):
    status, _, err = call(bench, capsys, "add.tflite", "--runs", 0)
    assert status == 2 and err.startswith("nnhal bench: argument --runs")
    status, _, err = call(bench, capsys, "bad.tflite", "--runs", 1)
    assert status == 1 and err.startswith("nnhal bench: ") and "ADD" in err


# ---- a real .tflite, once the importer is in ----------------------------------------------

def test_run_and_bench_a_real_model(tmp_path, capsys):
    tflite = pytest.importorskip("nnhal.tflite")
    if not hasattr(tflite, "read_tflite"):
        pytest.skip("nnhal.tflite.read_tflite is not in this build yet")
    import importlib.metadata

    try:
        files = importlib.metadata.files("pymicro-wakeword") or []
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("pymicro-wakeword is not installed")
    models = sorted(str(f.locate()) for f in files if str(f).endswith(".tflite"))
    if not models:
        pytest.skip("pymicro-wakeword ships no .tflite here")
    path = tmp_path / "out.npz"
    status, out, err = call(run, capsys, models[0], "--outputs", path)
    assert (status, err) == (0, "") and "inputs are random (seed 0)" in out
    with np.load(path, allow_pickle=False) as saved:
        assert len(saved.files) >= 1
    status, out, err = call(bench, capsys, models[0], "--runs", 3, "--warmup", 1)
    assert (status, err) == (0, "") and "latency median" in out
