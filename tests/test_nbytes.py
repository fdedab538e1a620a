"""The one operand byte-size rule (``nnhal.hal.types.value_nbytes``) and that no layer keeps
a private copy of it."""

from __future__ import annotations

import math
import pathlib
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from nnhal.hal.types import Operand, OperandType, operand_nbytes, value_nbytes

T = OperandType
ROOT = pathlib.Path(__file__).resolve().parents[1] / "nnhal"


@settings(max_examples=2000, deadline=None)
@given(st.one_of(st.sampled_from(list(T)), st.integers(-5, 1 << 20)),
       st.one_of(st.none(), st.lists(st.integers(0, 1 << 40), max_size=6)), st.booleans())
def test_value_nbytes_is_the_hal_rule(t, dims, zero_is_known):
    got = value_nbytes(t, dims, zero_is_known=zero_is_known)
    try:
        tt = T(t)
    except ValueError:
        assert got is None
        return
    if tt == T.SUBGRAPH:
        assert got == 0
    elif tt.is_scalar:
        assert got == tt.byte_size
    elif not dims or (0 in dims and not zero_is_known):
        assert got is None
    else:
        assert got == math.prod(dims) * tt.byte_size  # exact, never wrapped


def test_operand_nbytes_reads_the_declaration():
    assert operand_nbytes(Operand(T.TENSOR_FLOAT32, [2, 3])) == 24
    assert operand_nbytes(Operand(T.TENSOR_FLOAT32, [2, 0])) is None
    assert operand_nbytes(Operand(T.INT32)) == 4


def test_no_private_copy_of_the_size_rule_is_left():
    gone = re.compile(r"def (_?nbytes|_exact_nbytes|_known_nbytes|_known_bytes|"
                      r"operand_byte_size|operand_nbytes|value_nbytes)\(")
    found = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in ROOT.rglob("*.py")
             if p.name != "types.py" for m in gone.finditer(p.read_text())]
    assert found == []
