"""Invalid models and requests (nnhal.conformance.mutations) against the reference driver.

A bounded sample: every mutation family on hand-built models, plus a deterministic sample of
the conformance cases (skipped when the data is absent). The full run over the suite is
``nnhal mutations`` (it prints the totals).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from helpers import add_model

from nnhal.conformance import default_specs_dir, iter_cases
from nnhal.conformance.mutations import (
    ACCEPTED,
    INVALID_OPERATION_TYPES,
    REJECTED,
    ModelMutant,
    SharedBurst,
    check_model_mutant,
    check_request_mutant,
    copy_model,
    execution_paths,
    model_mutations,
    relaxed_control,
    request_mutations,
    required_inputs,
    run_model_mutations,
    run_request_mutations,
)
from nnhal.drivers.registry import available, open_device
from nnhal.hal.builder import ModelBuilder, RequestBuilder
from nnhal.hal.interfaces import PreparedModelCallback
from nnhal.hal.types import (
    DataLocation,
    ErrorStatus,
    Model,
    OperandLifeTime,
    OperandType,
    OperationType,
    RequestArgument,
    Subgraph,
)
from nnhal.memory import SharedMemory

T = OperandType
SPECS = default_specs_dir()
needs_specs = pytest.mark.skipif(not SPECS.exists(), reason=f"no conformance data at {SPECS}")


def conv_model() -> Model:
    """CONV_2D (implicit padding, NCHW flag) feeding ADD: constants in operandValues and in a
    pool, a layout operand, two operations."""
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, (1, 4, 4, 1))
    w = b.constant(T.TENSOR_FLOAT32, np.arange(36, dtype=np.float32).reshape(4, 3, 3, 1) / 10)
    bias = b.constant(T.TENSOR_FLOAT32, np.zeros(4, np.float32))
    pad, s1, act = b.scalar(T.INT32, 1), b.scalar(T.INT32, 1), b.scalar(T.INT32, 0)
    nchw = b.scalar(T.BOOL, False)
    mid = b.operand(T.TENSOR_FLOAT32, (1, 4, 4, 4))
    b.operation(OperationType.CONV_2D, [x, w, bias, pad, s1, s1, act, nchw], [mid])
    y = b.input(T.TENSOR_FLOAT32, (1, 4, 4, 4))
    out = b.output(T.TENSOR_FLOAT32, (1, 4, 4, 4))
    b.operation(OperationType.ADD, [mid, y, act], [out])
    return b.build()


def if_model() -> Model:
    """IF(cond, then: x + 1, else: x - 1): subgraph references."""
    def branch(op: OperationType) -> Subgraph:
        b = ModelBuilder()
        x = b.input(T.TENSOR_FLOAT32, (2,))
        one = b.operand(T.TENSOR_FLOAT32, (1,))
        act = b.operand(T.INT32)
        out = b.output(T.TENSOR_FLOAT32, (2,))
        b.operation(op, [x, one, act], [out])
        sg = b.build().main
        # Keep constants out of the shared operandValues: make them inputs of the branch.
        for i in (one, act):
            sg.operands[i].lifetime = OperandLifeTime.SUBGRAPH_INPUT
        sg.input_indexes = [x, one, act]
        return sg

    b = ModelBuilder()
    cond = b.input(T.TENSOR_BOOL8, (1,))
    then_ref = b.operand(T.SUBGRAPH)
    else_ref = b.operand(T.SUBGRAPH)
    x = b.input(T.TENSOR_FLOAT32, (2,))
    one = b.constant(T.TENSOR_FLOAT32, [1.0])
    act = b.scalar(T.INT32, 0)
    out = b.output(T.TENSOR_FLOAT32, (2,))
    b.operation(OperationType.IF, [cond, then_ref, else_ref, x, one, act], [out])
    m = b.build()
    for i, target in ((then_ref, 0), (else_ref, 1)):
        m.main.operands[i].lifetime = OperandLifeTime.SUBGRAPH
        m.main.operands[i].location = DataLocation(0, target, 0)
    m.referenced = [branch(OperationType.ADD), branch(OperationType.SUB)]
    return m


def _close(model: Model) -> None:
    for p in model.pools:
        p.close()


@pytest.mark.parametrize("make", [add_model, conv_model, if_model])
def test_every_model_mutant_is_rejected(device, make):
    model = make()
    try:
        assert device.get_supported_operations(model)[0] == ErrorStatus.NONE  # a valid base
        outcomes: Counter = Counter()
        failures = []
        for mutant in model_mutations(model):
            outcome, message = check_model_mutant(device, mutant, timeout=10)
            outcomes[outcome] += 1
            if outcome != REJECTED:
                failures.append(f"{mutant.kind} {mutant.detail}: {outcome} {message}")
        assert not failures, failures[:10]
        assert outcomes[REJECTED] > 100
    finally:
        _close(model)


def test_mutation_families_are_all_generated():
    kinds = set()
    for make in (add_model, conv_model, if_model):
        model = make()
        kinds |= {m.kind for m in model_mutations(model)}
        _close(model)
    expected = {
        "operand_type", "operand_rank", "operand_scale", "operand_zero_point",
        "operand_lifetime", "operand_input_output", "operand_consumers", "operand_add_writer",
        "operation_operand_type", "operation_type", "operation_input_index",
        "operation_output_index", "operation_remove_write", "operation_order",
        "remove_operand", "remove_operation", "remove_operation_input",
        "remove_operation_output", "add_operation_input", "add_operation_output",
        "operand_location", "subgraph_input", "subgraph_output", "operand_no_writer",
        "subgraph_reference", "subgraph_cycle", "execution_preference", "priority"}
    assert expected <= kinds, expected - kinds


def test_invalid_operation_types_are_not_operations():
    # 102 was one past HAL 1.3's last operation; it is BATCH_MATMUL since AIDL v2.
    defined = {int(t) for t in OperationType}
    assert not defined & set(INVALID_OPERATION_TYPES)
    assert max(defined - {OperationType.OEM_OPERATION}) + 1 in INVALID_OPERATION_TYPES


def test_mutants_leave_the_original_untouched(device):
    model = conv_model()
    try:
        before = repr(model.main), repr(model.referenced), model.operand_values
        n = sum(1 for _ in model_mutations(model))
        assert n > 100
        assert (repr(model.main), repr(model.referenced), model.operand_values) == before
        assert device.get_supported_operations(model)[0] == ErrorStatus.NONE
    finally:
        _close(model)


def test_skip_lists_avoid_valid_mutants():
    model = conv_model()
    try:
        details = {m.detail for m in model_mutations(model)}
        # The filter (operand 1) may be per-channel quantized: not a mutant.
        assert not any(d.startswith("main operand 1 -> TENSOR_QUANT8_SYMM_PER_CHANNEL")
                       for d in details)
        # The NCHW flag (input 7 of CONV_2D) is optional: removing it stays valid.
        assert "main operation 0 input 7 removed" not in details
        assert "main operand 6 removed" not in details
        # ...but removing a required input is generated.
        assert "main operation 0 input 1 removed" in details
    finally:
        _close(model)


def test_relaxed_flag_is_a_valid_control(device):
    model = add_model()
    try:
        flipped = relaxed_control(model)
        assert flipped.relax_computation_float32_to_float16 != \
            model.relax_computation_float32_to_float16
        assert device.get_supported_operations(flipped)[0] == ErrorStatus.NONE
    finally:
        _close(model)


def test_prepare_rejection_calls_back_once_without_model(device):
    model = add_model()
    try:
        mutant = next(m for m in model_mutations(model) if m.kind == "operation_type")
        cb = PreparedModelCallback()
        launch = device.prepare_model(mutant.model, mutant.preference, mutant.priority, None,
                                      [], [], b"", cb)
        assert launch == ErrorStatus.INVALID_ARGUMENT
        assert cb.wait(5) == (ErrorStatus.INVALID_ARGUMENT, None)
        assert cb.calls == 1
    finally:
        _close(model)


def test_check_reports_an_accepted_mutant(device):
    """The checker itself: a valid model disguised as a mutant must come out as accepted."""
    model = add_model()
    try:
        fake = ModelMutant("none", "unchanged", "not invalid", copy_model(model))
        assert check_model_mutant(device, fake)[0] == ACCEPTED
    finally:
        _close(model)


# ---- requests -----------------------------------------------------------------------------

def _prepared(device, model):
    cb = PreparedModelCallback()
    device.prepare_model(model, callback=cb)
    status, pm = cb.wait(10)
    assert status == ErrorStatus.NONE
    return pm


def test_every_request_mutant_is_rejected_on_every_path(device):
    model = add_model()
    closed = SharedMemory.ashmem(8)
    closed.close()
    rb = RequestBuilder([np.ones((2, 2), np.float32), np.ones((2, 2), np.float32)], [16])
    try:
        pm = _prepared(device, model)
        rb.output_memory.array()[:] = 0xA5
        paths = execution_paths(pm, rb.request)
        assert {"sync", "async"} <= set(paths)
        mutants = list(request_mutations(rb.request, model.main, closed))
        assert {m.kind for m in mutants} >= {
            "remove_input", "remove_output", "extra_input", "extra_output", "pool_index",
            "location", "dimensions", "omitted_output", "omitted_required_input",
            "pool_token", "no_value_with_location"}
        failures = []
        for name, path in paths.items():
            for m in mutants:
                outcome, message = check_request_mutant(pm, m, path, [rb.output_memory])
                if outcome != REJECTED:
                    failures.append(f"{name} {m.kind} {m.detail}: {outcome} {message}")
        assert not failures, failures[:10]
        # The valid request still runs after all that.
        status, _, _ = pm.execute_synchronously(rb.request)
        assert status == ErrorStatus.NONE
        assert np.allclose(rb.output(0, np.float32, (2, 2)), 2.0)
    finally:
        rb.close()
        _close(model)


def test_shared_burst_carries_every_mutant_on_one_burst(device):
    model = add_model()
    rb = RequestBuilder([np.ones((2, 2), np.float32), np.ones((2, 2), np.float32)], [16])
    path = SharedBurst()
    try:
        pm = _prepared(device, model)
        configured = []
        real = type(pm).configure_execution_burst

        def counting(self):
            configured.append(1)
            return real(self)

        pm.configure_execution_burst = counting.__get__(pm)
        mutants = list(request_mutations(rb.request, model.main))
        for m in mutants:
            assert check_request_mutant(pm, m, path, [rb.output_memory])[0] == REJECTED
        assert len(configured) == 1
        assert path(pm, rb.request, 0, None).status == ErrorStatus.NONE
        path.close()
        assert path._burst is None
    finally:
        path.close()
        rb.close()
        _close(model)


def test_omitted_if_condition_fails_cleanly(device):
    """Regression: an IF whose condition input was omitted used to run the else branch."""
    model = if_model()
    rb = RequestBuilder([np.array([1], np.uint8), np.array([1, 2], np.float32)], [8])
    try:
        pm = _prepared(device, model)
        status, _, _ = pm.execute_synchronously(rb.request)
        assert status == ErrorStatus.NONE
        assert np.allclose(rb.output(0, np.float32, (2,)), [2, 3])
        rb.request.inputs[0] = RequestArgument(True, DataLocation(), [])
        rb.output_memory.array()[:] = 0
        status, shapes, _ = pm.execute_synchronously(rb.request)
        assert status != ErrorStatus.NONE and shapes == []
        assert not rb.output_memory.array().any()
    finally:
        rb.close()
        _close(model)


def test_required_inputs_are_conservative():
    model = conv_model()
    try:
        # x feeds CONV_2D input 0 (required); y feeds ADD (every input required).
        assert required_inputs(model.main) == [True, True]
    finally:
        _close(model)


# ---- a bounded sample of the suite ----------------------------------------------------------

def _sample(step: int):
    cases = list(iter_cases(SPECS))
    return cases[::step]


@needs_specs
def test_suite_sample_model_mutations(device):
    totals = run_model_mutations(device, _sample(60), limit_per_case=60, seed=1)
    assert totals.cases > 50
    assert totals.generated > 3000
    assert totals.outcomes[REJECTED] == totals.generated, totals.failures[:10]
    assert set(totals.relaxed_controls) == {"NONE"}


@needs_specs
def test_suite_sample_request_mutations(device):
    per_path = run_request_mutations(device, _sample(120), limit_per_case=25, seed=1)
    assert {"sync", "async"} <= set(per_path)
    for name, totals in per_path.items():
        assert totals.generated > 500, name
        assert totals.outcomes[REJECTED] == totals.generated, (name, totals.failures[:10])


@needs_specs
def test_cli_prints_totals(capsys):
    from nnhal.cli import main

    rc = main(["mutations", "--specs", str(SPECS), "--filter", "add_v1_2*", "--limit", "5",
               "--every", "10"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "model mutations" in out and "mutants generated" in out
    assert "path sync" in out and "path async" in out


# ---- the same on the LiteRT driver (skipped, saying why, when it is unavailable) ----------

_LITERT_WHY = available().get("litert", "not registered")
needs_litert = pytest.mark.skipif(_LITERT_WHY is not None,
                                  reason=f"the LiteRT driver is unavailable: {_LITERT_WHY}")


@pytest.fixture(scope="module")
def litert():
    dev = open_device("litert")
    yield dev
    dev.close()


@needs_litert
@pytest.mark.parametrize("make", [add_model, conv_model])
def test_litert_rejects_every_model_mutant(litert, make):
    test_every_model_mutant_is_rejected(litert, make)


@needs_litert
def test_litert_rejects_every_request_mutant_on_every_path(litert):
    test_every_request_mutant_is_rejected_on_every_path(litert)


@needs_litert
@needs_specs
def test_litert_suite_sample_mutations(litert):
    totals = run_model_mutations(litert, _sample(60), limit_per_case=60, seed=1)
    assert totals.generated > 3000
    assert totals.outcomes[REJECTED] == totals.generated, totals.failures[:10]
    per_path = run_request_mutations(litert, _sample(120), limit_per_case=25, seed=1)
    for name, totals in per_path.items():
        assert totals.generated > 300, name
        assert totals.outcomes[REJECTED] == totals.generated, (name, totals.failures[:10])
