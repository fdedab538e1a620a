"""Graphs kept for the Model objects they were made from, so a model is analysed once.

The runtime analyses its model at ``finish`` and the importer the model it builds; every
later ``analyse`` of the same object in this process (each in-process device's
``getSupportedOperations`` and ``prepareModel``, the exporter) is answered from here. A
driver keeps knowing nothing but the HAL Model it is handed, and a served driver, in another
process, never sees this table and analyses what arrives, as it must.

A HAL Model is a plain mutable dataclass, so identity alone would be fooled by a caller who
edits the model after it was analysed. An entry therefore also holds a snapshot of every
field the analysis reads (structure by value; the operand-values bytes and the pools by
identity), compared at each lookup: an edited model is analysed again. Only graphs that own
their constants are kept, so what a pool holds later cannot change a kept graph.
Entries go with their model (a weak reference).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from nnhal.analysis.graph import ModelGraph
from nnhal.hal.types import ChannelScales, Model, Subgraph

_lock = threading.Lock()
_count = 0
#: id(model) -> (weak reference to it, its snapshot, the analysis' limits, graph)
_kept: dict[int, tuple[weakref.ref, tuple, tuple, ModelGraph]] = {}


def analyses() -> int:
    """How many analyses this process has run (what the tests count to show "once")."""
    return _count


def counted() -> None:
    """Called by ``analyse`` for each analysis it really runs."""
    global _count
    with _lock:
        _count += 1


def _scales(scales: object) -> object:
    """Frozen scales stand for themselves (compared by value, no copy); others are copied."""
    return scales if type(scales) is ChannelScales else tuple(scales)  # type: ignore


def _subgraph(sg: Subgraph) -> tuple:
    # List comprehensions, not generators (every lookup takes a snapshot); extra parameters
    # that are None or bytes stand for themselves.
    return (tuple([(o.type, tuple(o.dimensions), o.number_of_consumers, o.scale, o.zero_point,
                    o.lifetime, o.location,
                    e if (e := o.extra_params) is None or type(e) is bytes else
                    (_scales(e.scales), e.channel_dim) if hasattr(e, "scales") else e)
                   for o in sg.operands]),
            tuple([(o.type, tuple(o.inputs), tuple(o.outputs)) for o in sg.operations]),
            tuple(sg.input_indexes), tuple(sg.output_indexes))


def snapshot(model: Model) -> tuple | None:
    """What the analysis reads of ``model``; None when it cannot be taken (a malformed
    model, or operand values in a mutable buffer): such a model is never kept."""
    try:
        if type(model.operand_values) is not bytes:
            return None
        return (tuple(_subgraph(sg) for sg in (model.main, *model.referenced)),
                model.operand_values, tuple(model.pools),
                model.relax_computation_float32_to_float16,
                tuple(model.extension_name_to_prefix))
    except Exception:  # noqa: BLE001 - whatever is malformed, the analysis will name it
        return None


def lookup(model: Any, limits: tuple) -> ModelGraph | None:
    """The graph kept for this very object, when it has not been edited since and was
    analysed under the same ``limits`` (max_tensor_bytes, max_work)."""
    entry = _kept.get(id(model))
    if entry is None or entry[0]() is not model or entry[2] != limits:
        return None
    if snapshot(model) != entry[1]:
        return None
    return entry[3]


def keep(model: Model, snap: tuple | None, limits: tuple, graph: ModelGraph) -> None:
    """Keep ``graph`` (constants owned) for ``model`` as ``snap`` saw it, while it lives."""
    if snap is None:
        return
    key = id(model)
    try:
        ref = weakref.ref(model, lambda r, key=key: _forget(key, r))
    except TypeError:
        return
    with _lock:
        _kept[key] = (ref, snap, limits, graph)


def _forget(key: int, ref: weakref.ref) -> None:
    with _lock:
        entry = _kept.get(key)
        if entry is not None and entry[0] is ref:
            del _kept[key]
