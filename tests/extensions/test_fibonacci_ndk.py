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
