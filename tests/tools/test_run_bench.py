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
    assert (data["model"], data["device"], data["runs"], data["warmup"]) == \
        ("add.tflite", "reference", 7, 2)
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
