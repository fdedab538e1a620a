"""Upstream's FibonacciExtensionTest against a served Fibonacci driver: ``nnhal serve
fibonacci`` in its own process, where the example is installed; this process does not have
it, so its runtime knows the extension only as the served device reports it (operand types,
sizes) and the service validates and runs the operation."""

from __future__ import annotations

import pytest

from nnhal.runtime import ndk

from . import fibonacci_cases as cases


@pytest.mark.parametrize("case", cases.CASES, ids=lambda c: c.__name__)
def test_fibonacci_served(remote, case):
    case(ndk)


def test_the_extension_is_known_here_only_as_reported(remote):
    from nnhal.ops import extensions

    fib, _, _ = cases.find_devices(ndk)
    assert ndk.ANeuralNetworksDevice_getName(fib) == (cases.OK, remote)
    ext = extensions.lookup(cases.NAME)
    assert ext is not None and ext.declared and not ext.operations
    assert [(t.code, t.is_tensor, t.byte_size) for t in ext.operand_types] == \
        [(0, False, 8), (1, True, 8)]
