"""A stand-in for :mod:`nnhal.drivers.litert.support` (written separately): everything is
supported here, and the exporter's UnsupportedModelError at prepare still refuses what it
cannot express. Imported only when ``support`` is missing."""

from __future__ import annotations

from nnhal.analysis import ModelGraph


def supported_operations(graph: ModelGraph) -> list[bool]:
    """Per operation of the main subgraph: whether LiteRT runs it (here: all)."""
    return [True] * len(graph.main.operations)


def refusal(graph: ModelGraph) -> str | None:
    """None when the whole model can run, else one line naming the first refused operation."""
    return None
