"""The LiteRT driver's support rule (nnhal.drivers.litert.support): per operation, what the
survey found (benchmarks/survey_litert.py); supported models really run right in
ai-edge-litert; over a handful of conformance families, every model the rule claims passes."""

from __future__ import annotations

import fnmatch
import sys
from pathlib import Path

import numpy as np
import pytest

from nnhal.analysis import ModelGraph, analyse
from nnhal.conformance.cases import Case, iter_cases
from nnhal.conformance.runner import is_coupled
from nnhal.conformance.specs import default_specs_dir
from nnhal.drivers.litert.support import refusal, refused_reasons, supported_operations
from nnhal.drivers.reference import ReferenceDevice
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

T, O = OperandType, OperationType
SPECS = default_specs_dir()


def _graph(model: Model) -> ModelGraph:
    return analyse(model, own_constants=False)


# ---- small models, one kind each ----------------------------------------------------------

def _add() -> Model:
    b = ModelBuilder()
    x, y = b.input(T.TENSOR_FLOAT32, [1, 16]), b.input(T.TENSOR_FLOAT32, [1, 16])
    out = b.output(T.TENSOR_FLOAT32, [1, 16])
    b.operation(O.ADD, [x, y, b.scalar(T.INT32, 0)], [out])
    return b.build()


def _div_int32(divisor: list[int] | None) -> Model:
    b = ModelBuilder()
    x = b.input(T.TENSOR_INT32, [4])
    y = b.input(T.TENSOR_INT32, [4]) if divisor is None else \
        b.constant(T.TENSOR_INT32, np.array(divisor, np.int32), [4])
    out = b.output(T.TENSOR_INT32, [4])
    b.operation(O.DIV, [x, y, b.scalar(T.INT32, 0)], [out])
    return b.build()


def _transpose(perm: str) -> Model:
    """perm: 'const' (a constant), 'input' (a model input), 'omitted' (NO_VALUE)."""
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, [2, 3])
    p = {"const": lambda: b.constant(T.TENSOR_INT32, np.array([1, 0], np.int32), [2]),
         "input": lambda: b.input(T.TENSOR_INT32, [2]),
         "omitted": lambda: b.omitted(T.TENSOR_INT32, [2])}[perm]()
    out = b.output(T.TENSOR_FLOAT32, [3, 2])
    b.operation(O.TRANSPOSE, [x, p], [out])
    return b.build()


def _argmax(dims: list[int], out_dims: list[int]) -> Model:
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, dims)
    out = b.output(T.TENSOR_INT32, out_dims)
    b.operation(O.ARGMAX, [x, b.scalar(T.INT32, 0)], [out])
    return b.build()


def _mean(keep: int) -> Model:
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, [2, 3])
    axes = b.constant(T.TENSOR_INT32, np.array([0, 1], np.int32), [2])
    out = b.output(T.TENSOR_FLOAT32, [1, 1] if keep else [1])
    b.operation(O.MEAN, [x, axes, b.scalar(T.INT32, keep)], [out])
    return b.build()


def _reshape(shape_as_input: bool, out_dims: list[int]) -> Model:
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, [2, 3])
    s = b.input(T.TENSOR_INT32, [2]) if shape_as_input else \
        b.constant(T.TENSOR_INT32, np.array([3, 2], np.int32), [2])
    out = b.output(T.TENSOR_FLOAT32, out_dims)
    b.operation(O.RESHAPE, [x, s], [out])
    return b.build()


def _add_then_div_int32() -> Model:
    b = ModelBuilder()
    x, y = b.input(T.TENSOR_INT32, [4]), b.input(T.TENSOR_INT32, [4])
    s = b.operand(T.TENSOR_INT32, [4])
    b.operation(O.ADD, [x, y, b.scalar(T.INT32, 0)], [s])
    out = b.output(T.TENSOR_INT32, [4])
    b.operation(O.DIV, [s, y, b.scalar(T.INT32, 0)], [out])
    return b.build()


def _add_then_argmax_rank1() -> Model:
    b = ModelBuilder()
    x, y = b.input(T.TENSOR_FLOAT32, [4]), b.input(T.TENSOR_FLOAT32, [4])
    s = b.operand(T.TENSOR_FLOAT32, [4])
    b.operation(O.ADD, [x, y, b.scalar(T.INT32, 0)], [s])
    out = b.output(T.TENSOR_INT32, [1])
    b.operation(O.ARGMAX, [s, b.scalar(T.INT32, 0)], [out])
    return b.build()


@pytest.mark.parametrize("model, expected", [
    (_add(), [True]),
    (_div_int32([1, 2, 3, 4]), [True]),    # FLOOR_DIV (TFLite's DIV truncates)
    (_div_int32(None), [True]),            # a zero divisor: the guarded form (test below)
    (_transpose("const"), [True]),
    (_transpose("omitted"), [True]),       # known at prepare: the exporter reverses the axes
    (_transpose("input"), [False]),        # the request may omit it
    (_argmax([2, 3], [3]), [True]),
    (_argmax([3], [1]), [True]),           # rank 0 in TFLite, reshaped to [1] on export
    (_mean(1), [True]),
    (_mean(0), [True]),                    # rank 0 in TFLite, reshaped to [1] on export
    (_reshape(False, [0, 0]), [True]),
    (_reshape(True, [3, 2]), [True]),
    (_reshape(True, [0, 0]), [False]),     # XNNPACK cannot reshape at allocation
    (_add_then_argmax_rank1(), [True, True]),
    (_add_then_div_int32(), [True, True]),
], ids=["add", "div-int32-const", "div-int32-input",
        "transpose-const", "transpose-omitted", "transpose-input", "argmax-rank2",
        "argmax-rank1", "mean-keep", "mean-all", "reshape-const-dynamic",
        "reshape-input-known", "reshape-input-dynamic", "add+argmax-rank1", "add+div-int32"])
def test_supported_operations_per_kind(model: Model, expected: list[bool]) -> None:
    g = _graph(model)
    assert supported_operations(g) == expected
    why = refusal(g)
    if all(expected):
        assert why is None
    else:
        k = expected.index(False)
        name = OperationType(g.main.operations[k][0]).name
        assert why is not None and why.startswith(f"#{k} {name}: "), why


def test_exporter_refusal_names_the_operation() -> None:
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, [1, 4, 4, 1])
    rois = b.input(T.TENSOR_FLOAT32, [1, 4])
    idx = b.input(T.TENSOR_INT32, [1])
    out = b.output(T.TENSOR_FLOAT32, [1, 2, 2, 1])
    b.operation(O.ROI_ALIGN, [x, rois, idx, b.scalar(T.INT32, 2), b.scalar(T.INT32, 2),
                              b.scalar(T.FLOAT32, 1.0), b.scalar(T.FLOAT32, 1.0),
                              b.scalar(T.INT32, 0), b.scalar(T.INT32, 0),
                              b.scalar(T.BOOL, False)], [out])
    g = _graph(b.build())
    assert supported_operations(g) == [False]
    why = refusal(g)
    assert why is not None and why.startswith("#0 ROI_ALIGN: exporter: "), why


def _same_max_pool(filter_h: int) -> Model:
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, [1, 4, 1, 1])
    out = b.output(T.TENSOR_FLOAT32, [1, 4, 1, 1])
    params = [b.scalar(T.INT32, v) for v in (1, 1, 1, 1, filter_h, 0)]  # SAME, strides 1
    b.operation(O.MAX_POOL_2D, [x, *params], [out])
    return b.build()


def test_a_same_padding_past_int16_is_not_claimed() -> None:
    """TFLite's Prepare refuses a SAME padding past int16 (kernel_rules); the exporter checks
    what it writes, so the driver never hands ai-edge-litert such a pool."""
    assert supported_operations(_graph(_same_max_pool(65_536))) == [True]
    g = _graph(_same_max_pool(65_537))
    assert supported_operations(g) == [False]
    why = refusal(g)
    assert why is not None and "SAME padding of 32768 along the height" in why, why


def test_reasons_table_covers_what_is_always_refused() -> None:
    table = refused_reasons()
    for name in ("WHILE", "LSTM", "SVDF", "BIDIRECTIONAL_SEQUENCE_RNN", "ROI_ALIGN"):
        assert table[name] and all(kind and why for kind, why in table[name]), name
    assert "loop timeout" in table["WHILE"][0][1]


# ---- supported models run right in litert -------------------------------------------------

def _reference(model: Model, inputs: list[np.ndarray], out_nbytes: list[int]
               ) -> list[np.ndarray]:
    dev = ReferenceDevice()
    try:
        cb = PreparedModelCallback()
        dev.prepare_model(model, ExecutionPreference.FAST_SINGLE_ANSWER, Priority.MEDIUM,
                          None, [], [], b"", cb)
        status, pm = cb.wait(60)
        assert status == ErrorStatus.NONE
        req = RequestBuilder.for_model(model, inputs)
        try:
            status, _shapes, _ = pm.execute_synchronously(req.request, MeasureTiming.NO)
            assert status == ErrorStatus.NONE
            return [req.output(k) for k in range(len(out_nbytes))]
        finally:
            req.close()
    finally:
        dev.close()


@pytest.mark.parametrize("make, inputs", [
    (_add, lambda r: [r.standard_normal((1, 16)).astype(np.float32),
                      r.standard_normal((1, 16)).astype(np.float32)]),
    (lambda: _transpose("const"), lambda r: [r.standard_normal((2, 3)).astype(np.float32)]),
    (lambda: _transpose("omitted"), lambda r: [r.standard_normal((2, 3)).astype(np.float32)]),
    (lambda: _mean(1), lambda r: [r.standard_normal((2, 3)).astype(np.float32)]),
    (lambda: _mean(0), lambda r: [r.standard_normal((2, 3)).astype(np.float32)]),
    (lambda: _argmax([3], [1]), lambda r: [np.array([0.5, 2.0, -1.0], np.float32)]),
], ids=["add", "transpose-const", "transpose-omitted", "mean-keep", "mean-all-axes",
        "argmax-rank1"])
def test_supported_models_run_in_litert_as_on_the_reference(make, inputs) -> None:
    litert = pytest.importorskip("ai_edge_litert.interpreter",
                                 reason="ai-edge-litert not installed")
    from nnhal.tflite import write_tflite

    model = make()
    assert all(supported_operations(_graph(model)))
    xs = inputs(np.random.default_rng(5))
    it = litert.Interpreter(model_content=write_tflite(model), num_threads=2)
    it.allocate_tensors()
    for d, x in zip(it.get_input_details(), xs):
        it.set_tensor(d["index"], x)
    it.invoke()
    got = [it.get_tensor(d["index"]) for d in it.get_output_details()]
    want = _reference(model, xs, [g.nbytes for g in got])
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


# ---- the cross-check over a handful of families ------------------------------------------

FAMILIES = ["transpose_v1_2*", "transpose_float*", "reshape*", "squeeze*", "div*", "mean*",
            "argmax*", "lsh_projection*", "svdf*", "if_*", "bidirectional_sequence_rnn*",
            "depthwise_conv2d_v1_2*", "resize_bilinear_v1_3*"]


@pytest.fixture(scope="module")
def cases_by_family() -> dict[str, list[Case]]:
    """The cases of FAMILIES and of the whole-kind test, read in one pass over the data."""
    if not SPECS.exists():
        pytest.skip(f"conformance data not found at {SPECS}")
    patterns = FAMILIES + [p for _op, p, _s in WHOLE_KINDS]
    found: dict[str, list[Case]] = {p: [] for p in patterns}
    for case in iter_cases(SPECS):
        if case.broken or case.expect_failure:
            continue
        for p in patterns:
            if fnmatch.fnmatch(case.name, p):
                found[p].append(case)
    return found


@pytest.mark.parametrize("family", FAMILIES)
def test_every_claimed_case_passes(family: str, cases_by_family: dict[str, list[Case]]
                                   ) -> None:
    """As the survey's full cross-check does: every case the rule claims (general, output
    dims unknown, signed variant) exports, runs and agrees within the runner's tolerances.
    Rule-claimed kinds never include one that aborts litert, so running them in-process is
    itself part of the check."""
    pytest.importorskip("ai_edge_litert.interpreter", reason="ai-edge-litert not installed")
    sys.path.append(str(Path(__file__).resolve().parents[2]))
    from benchmarks.survey_litert import run_one
    from nnhal.conformance.cases import build_model, to_signed_quant, with_unknown_output_dims

    claimed = refused = 0
    bad = []
    for case in cases_by_family[family]:
        for variant in ("general", "dynamic", "signed"):
            if variant == "signed" and not is_coupled(case):
                continue
            m = case.data["model"]
            m = to_signed_quant(m) if variant == "signed" else m
            m = with_unknown_output_dims(m) if variant == "dynamic" else m
            if refusal(_graph(build_model(m))) is not None:
                refused += 1
                continue
            claimed += 1
            r = run_one(case, variant)
            if r["status"] != "passed":
                bad.append(f"{case.name} [{variant}]: {r['status']} {r.get('reason')}")
    assert not bad, "\n".join(bad)
    assert claimed + refused > 0
    # Every case of these four is refused (perm or weight computed at run time, a whole kind
    # refused).
    if family not in ("bidirectional_sequence_rnn*", "svdf*", "transpose_v1_2*",
                      "lsh_projection*"):
        assert claimed > 0, f"no {family} case claimed"


def test_an_omittable_input_computed_at_run_time_is_refused(
        cases_by_family: dict[str, list[Case]]) -> None:
    """An LSH_PROJECTION weight computed by an ADD (a temporary) is refused as one fed by a
    model input is: a step of a split model gets that temporary as a model input, and its
    prepare must accept what the claim on the whole model promised."""
    from nnhal.conformance.cases import build_model

    internal = [c for c in cases_by_family["lsh_projection*"]
                if c.name.endswith("all_inputs_as_internal")]
    assert internal
    for case in internal:
        why = refusal(_graph(build_model(case.data["model"])))
        assert why is not None and "computed at run time" in why, (case.name, why)


WHOLE_KINDS = [
    ("WHILE", "while_*", False), ("BIDIRECTIONAL_SEQUENCE_RNN", "bidirectional_sequence_rnn*",
                                  False),
    ("LSTM", "lstm*", False), ("SVDF", "svdf*", False), ("IF", "if_simple*", True),
    ("CONV_2D", "conv2d_v1_2*", True)]


@pytest.mark.parametrize("op, pattern, supported", WHOLE_KINDS)
def test_whole_operation_kinds(op: str, pattern: str, supported: bool,
                               cases_by_family: dict[str, list[Case]]) -> None:
    """WHILE (loop timeout), BIDIRECTIONAL_SEQUENCE_RNN (aborts litert), LSTM and SVDF are
    refused in every case; IF with supported branches and CONV_2D are claimed in some."""
    from nnhal.conformance.cases import build_model

    answers = []
    for case in cases_by_family[pattern]:
        if op not in case.operations:
            continue
        g = _graph(build_model(case.data["model"]))
        main_ops = [OperationType(t).name for t, _i, _o in g.main.operations]
        answers += [s for name, s in zip(main_ops, supported_operations(g)) if name == op]
        if len(answers) >= 40:
            break
    assert answers, f"no {op} case under {pattern}"
    assert any(answers) if supported else not any(answers)
