"""Upstream's FibonacciExtensionTest through nnhal's NDK in Python, with the example package
discovered through its entry points (conftest.py)."""

from __future__ import annotations

import pytest

from nnhal.runtime import ndk

from . import fibonacci_cases as cases


@pytest.mark.parametrize("case", cases.CASES, ids=lambda c: c.__name__)
def test_fibonacci(fibonacci_site, case):
    case(ndk)


def test_the_split_gives_fibonacci_to_its_device_and_the_adds_to_the_reference(
        fibonacci_site):
    c = cases.Case(ndk)
    c.build(cases.TENSOR_FLOAT32, [1], cases.TENSOR_FLOAT32, [cases.N], nops=True)
    comp, code = c.compile()
    assert code == cases.OK
    steps = [(s["device"], list(s["operations"])) for s in comp.plan()]
    names = {d.name for d in c.devices}
    assert names == {"fibonacci", "reference"}
    assert [d for d, _ in steps] == ["reference", "fibonacci", "reference"], steps


def test_each_step_model_names_only_the_extensions_it_uses(fibonacci_site):
    c = cases.Case(ndk)
    c.build(cases.TENSOR_FLOAT32, [1], cases.TENSOR_FLOAT32, [cases.N], nops=True)
    tables = {}
    for d in c.devices:
        def record(model, *a, real=d.hal.prepare_model, name=d.name, **k):
            tables.setdefault(name, []).append([e.name for e in model.extension_name_to_prefix])
            return real(model, *a, **k)

        d.hal.prepare_model = record
    try:
        assert c.compile()[1] == cases.OK
    finally:
        for d in c.devices:
            del d.hal.prepare_model
    assert tables == {"fibonacci": [[cases.NAME]], "reference": [[], []]}


def test_plain_create_over_every_device(fibonacci_site):
    """``create`` (every device, CPU fallback allowed) gives the Fibonacci operation to its
    device too; the ADDs go wherever the capabilities say."""
    import numpy as np

    c = cases.Case(ndk)
    c.build(cases.TENSOR_FLOAT32, [1], cases.TENSOR_FLOAT32, [cases.N], nops=True)
    comp = cases.ok(ndk.ANeuralNetworksCompilation_create(c.model))
    cases.ok(ndk.ANeuralNetworksCompilation_finish(comp))
    plan = comp.plan()
    assert [s["device"] for s in plan if 1 in s["operations"]] == ["fibonacci"]
    assert all(s["device"] != "fibonacci" for s in plan if 1 not in s["operations"])
    out = np.zeros(cases.N, np.float32)
    e = cases.ok(ndk.ANeuralNetworksExecution_create(comp))
    x = np.array([cases.N], np.float32)
    cases.ok(ndk.ANeuralNetworksExecution_setInput(e, 0, None, x, 4))
    cases.ok(ndk.ANeuralNetworksExecution_setOutput(e, 0, None, out, out.nbytes))
    cases.ok(ndk.ANeuralNetworksExecution_compute(e))
    assert out.tolist() == cases.FIB
