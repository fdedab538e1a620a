"""The operation reference is generated from the signatures and checked in; it must be
current, and every operation must declare a signature."""

from __future__ import annotations

from pathlib import Path

from nnhal.hal.types import OperationType
from nnhal.ops import docs
from nnhal.ops.catalog import SIGNATURES

DOC = Path(__file__).resolve().parent.parent / "docs" / "operations.md"


def test_every_operation_declares_a_signature():
    missing = [op.name for op in OperationType
               if op != OperationType.OEM_OPERATION and op not in SIGNATURES]
    assert missing == []


def test_operations_md_is_current():
    assert DOC.read_text() == docs.markdown(), (
        "docs/operations.md is stale: run `nnhal ops --markdown > docs/operations.md`")


def test_text_reference_names_slots():
    listing = docs.text(["CONV_2D"])
    assert "padding_scheme" in listing and "implicit" in listing
