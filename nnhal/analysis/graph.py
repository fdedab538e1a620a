"""The analysed model: what one check of a HAL Model leaves for everything else to read.

``getSupportedOperations``, the reference plan, the compilation cache and any other backend
read a :class:`ModelGraph`; none of them validates, decodes constants or infers shapes again.
Graphs are immutable once built (operand infos are shared, never edited).
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, TypeVar

from nnhal.core.version import FeatureLevel
from nnhal.hal.types import OperationType, Subgraph
from nnhal.ops.resolver import OperandInfo, Shape

#: (operation type, input operand indexes, output operand indexes)
OperationTuple = tuple[int, tuple[int, ...], tuple[int, ...]]


@dataclass(frozen=True, eq=False)
class SubgraphGraph:
    """One subgraph after analysis.

    ``operands`` are the declared descriptions with constants decoded (``value``); ``shapes``
    the shapes after inference (0 for a dimension still unknown, None for an unknown rank);
    ``supported[k]`` tells whether operation k can run here (every operation it reaches
    through control flow included); ``min_level`` the highest feature level its operations
    need as given (each operation's signature says; see :func:`nnhal.ops.signature.check`).
    """

    index: int  # -1 for the main subgraph, else the index into Model.referenced
    operands: tuple[OperandInfo, ...]
    shapes: tuple[Shape, ...]
    operations: tuple[OperationTuple, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    supported: tuple[bool, ...] = ()
    min_level: FeatureLevel = FeatureLevel.V1_0
    #: Per operation, its work estimate (:meth:`nnhal.ops.resolver.OperationDef.work`; 0
    #: for one nnhal cannot run).
    work: tuple[int, ...] = ()

    @property
    def input_infos(self) -> list[OperandInfo]:
        return [self.operands[i] for i in self.inputs]

    @property
    def output_infos(self) -> list[OperandInfo]:
        return [self.operands[i] for i in self.outputs]

    def shaped(self, index: int) -> OperandInfo:
        """Operand ``index`` as operations see it: its description with its inferred shape."""
        return self._shaped[index]

    @cached_property
    def _shaped(self) -> tuple[OperandInfo, ...]:
        """Every operand as :meth:`shaped` gives it, made once (an export asks for each
        operand several times; infos are never edited, so one object serves every asker)."""
        return tuple(info if info is None or shape == info.shape else
                     replace(info, shape=shape)
                     for info, shape in zip(self.operands, self.shapes))

    @cached_property
    def producers(self) -> dict[int, int]:
        """The operation (its index) writing each operand that one writes, made on first
        ask (the export's fusions and LiteRT's support rules walk back through them)."""
        return {o: k for k, (_, _, outs) in enumerate(self.operations) for o in outs}

    @cached_property
    def readers(self) -> dict[int, list[int]]:
        """The operations (indexes, in order) reading each operand, made on first ask."""
        readers: dict[int, list[int]] = {}
        for k, (_, ins, _) in enumerate(self.operations):
            for i in ins:
                readers.setdefault(i, []).append(k)
        return readers

    @property
    def all_supported(self) -> bool:
        return all(self.supported) if self.supported else True


@dataclass(frozen=True, eq=False)
class ModelGraph:
    """A whole model after analysis: the main subgraph and every referenced one.

    ``signature`` is the main subgraph as requests and memory-domain roles see it (copies of
    its input and output operands), immune to a client editing its Model later.
    ``required_inputs`` are the main inputs a request may not omit. ``too_large`` names
    temporaries whose known size exceeds the device's limit. ``min_level`` is the model's
    minimum version: the lowest feature level whose interface can carry it (the highest level
    any of its operations, operand types or model flags needs), computed once by the analysis;
    None for a graph restored from a compilation cache, where it was checked at prepare.
    """

    main: SubgraphGraph
    referenced: tuple[SubgraphGraph, ...]
    relaxed: bool
    signature: Subgraph
    required_inputs: frozenset[int] = frozenset()
    too_large: tuple[str, ...] = field(default=())
    min_level: FeatureLevel | None = None
    #: Extension operation value -> (its id, its definition), for each one the analysis
    #: accepted (what the plan binds; see nnhal.ops.extensions).
    extension_ops: Mapping[int, tuple[Any, Any]] = field(default_factory=dict)
    #: (subgraph index, operation) -> why an operation is supported by nobody here (an
    #: extension operation's refusal, an operation whose work alone exceeds the bound).
    reasons: Mapping[tuple[int, int], str] = field(default_factory=dict)
    #: The estimated work of one execution: every operation of every subgraph once (a WHILE
    #: body's iterations are bounded by the loop timeout, not here).
    work: int = 0
    #: Why one execution would do more work than the analysis' bound allows (one line
    #: naming the operation), or None.
    too_much_work: str | None = None

    @property
    def subgraphs(self) -> tuple[SubgraphGraph, ...]:
        return (self.main, *self.referenced)

    def supported_operations(self) -> list[bool]:
        return list(self.main.supported)

    def unsupported_names(self) -> list[str]:
        names = []
        for k, ((t, _, _), ok) in enumerate(zip(self.main.operations, self.main.supported)):
            if not ok:
                try:
                    names.append(OperationType(t).name)
                except ValueError:
                    why = self.reasons.get((-1, k))
                    names.append(f"extension operation {t:#x}" + (f" ({why})" if why else ""))
        return names


_T = TypeVar("_T")
_G = TypeVar("_G", ModelGraph, SubgraphGraph)


def once_per_graph(find: Callable[[_G], _T]) -> Callable[[_G], _T]:
    """``find`` of a graph computed once while the graph lives (graphs are immutable): what
    several readers ask of one analysed graph (a support query, then the prepare) is worked
    out once. The answer is shared: it must not be changed by its callers."""
    found: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
    lock = threading.Lock()

    @functools.wraps(find)
    def once(graph: _G) -> _T:
        with lock:
            hit = found.get(graph, _MISSING)
        if hit is _MISSING:
            hit = find(graph)
            with lock:
                found[graph] = hit
        return hit
    return once


_MISSING = object()
