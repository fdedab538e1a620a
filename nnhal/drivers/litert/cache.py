"""The LiteRT driver's compilation cache, in the common authenticated container
(:mod:`nnhal.drivers.common.compilation_cache`).

The *data cache* is the flatbuffer (verified by its BLAKE3 digest, bound into the model
cache); the *model cache* body holds this driver's version and the main inputs and outputs
(JSON: types, dimensions, quantization, which inputs are required, the outputs' inferred
shapes). Restoring builds an interpreter from the flatbuffer: nothing is analysed or exported
again. The tag proves this driver validated and exported exactly this model.

With a private store (:mod:`nnhal.drivers.common.private_store`, which says why it is sound),
every flatbuffer this driver writes to a data cache or verifies from one is also kept there,
named by its digest; a restore whose verified model cache names a stored flatbuffer builds the
interpreter from the stored file by path (mapped, not read into memory), and neither reads nor
hashes the client's data cache. Measured on MobileNetV2 float32 (14 MB): that saves reading
(~9 ms) and hashing (~5 ms) it; the interpreter's allocation, where XNNPACK packs the weights,
stays (benchmarks/bench_litert.py).
"""

from __future__ import annotations

import json
from typing import Any

from nnhal.analysis import ModelGraph, about
from nnhal.analysis.analyser import operand_info
from nnhal.analysis.graph import SubgraphGraph
from nnhal.drivers.common.compilation_cache import (
    BODY_HEAD_SIZE,
    BodyHead,
    CacheError,
    CompilationCache,
    Loaded,
    encode_head,
)
from nnhal.drivers.common.private_store import PrivateStore, StoredFile
from nnhal.drivers.litert.engine import Engine, EnginePool
from nnhal.hal.interfaces import IPreparedModel
from nnhal.hal.types import (
    DataLocation,
    Model,
    Operand,
    OperandLifeTime,
    OperandType,
    Priority,
    Subgraph,
    SymmPerChannelQuantParams,
)


class LiteRTPlan:
    """What a LiteRT prepared model runs: the main inputs and outputs (as a graph without
    operations) and its interpreters. Shared by the prepared models restored from one cache
    while any of them lives."""

    def __init__(self, graph: ModelGraph, engines: EnginePool):
        self.graph = graph
        self.engines = engines


def _operand_json(op: Operand) -> dict[str, Any]:
    extra = op.extra_params
    if extra is not None and not isinstance(extra, SymmPerChannelQuantParams):
        raise CacheError("extension operand parameters are not cached")
    return {"type": int(op.type), "dims": [int(d) for d in op.dimensions],
            "scale": float(op.scale), "zp": int(op.zero_point),
            "channel": None if extra is None else
            {"scales": [float(s) for s in extra.scales], "dim": int(extra.channel_dim)}}


def encode_io(graph: ModelGraph, driver_version: str, **extra: Any) -> bytes:
    """The driver's part of the body: version, inputs and outputs (and ``extra``, which
    :func:`read_io` gives back)."""
    sig, main = graph.signature, graph.main
    return json.dumps({
        **extra,
        "driver": driver_version,
        "relaxed": graph.relaxed,
        "inputs": [_operand_json(sig.operands[i]) for i in sig.input_indexes],
        "outputs": [_operand_json(sig.operands[i]) for i in sig.output_indexes],
        "required": [k for k, i in enumerate(main.inputs) if i in graph.required_inputs],
        "shapes": [None if main.shapes[i] is None else list(main.shapes[i])
                   for i in main.outputs],
        "work": int(graph.work),
    }, separators=(",", ":")).encode()


def _operand(rec: Any, lifetime: OperandLifeTime) -> Operand:
    t = OperandType(int(rec["type"]))  # ValueError for an unknown type
    dims = [int(d) for d in rec["dims"]]
    if any(d < 0 for d in dims):
        raise CacheError("negative dimension")
    ch = rec["channel"]
    extra = None if ch is None else SymmPerChannelQuantParams(
        [float(s) for s in ch["scales"]], int(ch["dim"]))
    return Operand(int(t), dims, 0, float(rec["scale"]), int(rec["zp"]), lifetime,
                   DataLocation(), extra)


def decode_io(body: bytes | memoryview, driver_version: str) -> ModelGraph:
    """The graph of a model cache body (inputs and outputs only); CacheError when malformed."""
    return read_io(body, driver_version)[0]


def read_io(body: bytes | memoryview, driver_version: str
            ) -> tuple[ModelGraph, dict[str, Any]]:
    """:func:`decode_io`'s graph, and the whole record (with what :func:`encode_io` was given
    besides)."""
    try:
        rec = json.loads(bytes(body[BODY_HEAD_SIZE:]))
        if not isinstance(rec, dict):
            raise CacheError("malformed model cache: not a record")
        if rec["driver"] != driver_version:
            raise CacheError("model cache of another driver version")
        ins = [_operand(r, OperandLifeTime.SUBGRAPH_INPUT) for r in rec["inputs"]]
        outs = [_operand(r, OperandLifeTime.SUBGRAPH_OUTPUT) for r in rec["outputs"]]
        n_in = len(ins)
        operands = [*ins, *outs]
        signature = Subgraph(operands, [], list(range(n_in)), list(range(n_in, len(operands))))
        infos = tuple(operand_info(op) for op in operands)
        shapes = [info.shape for info in infos]
        for k, shape in enumerate(rec["shapes"]):
            shapes[n_in + k] = None if shape is None else tuple(int(d) for d in shape)
        required = frozenset(int(k) for k in rec["required"] if 0 <= int(k) < n_in)
        main = SubgraphGraph(-1, infos, tuple(shapes), (), tuple(range(n_in)),
                             tuple(range(n_in, len(operands))), ())
        work = int(rec["work"])
        if work < 0:
            raise CacheError("negative work estimate")
        return ModelGraph(main, (), bool(rec["relaxed"]), signature, required, work=work), rec
    except CacheError:
        raise
    except (ValueError, TypeError, KeyError, IndexError) as e:
        raise CacheError(f"malformed model cache: {type(e).__name__}: {e}") from e


def check_work(graph: ModelGraph, max_work: int | None) -> None:
    """CacheError when a restored graph's work estimate (:func:`encode_io` keeps it) is past
    the restoring device's bound (None: none), as a prepare would refuse it."""
    if max_work is not None and graph.work > max_work:
        raise CacheError(f"the model's estimated work {about(graph.work)} is beyond this "
                         f"device's bound {max_work:.3g} (max_work, NNHAL_MAX_WORK)")


class LiteRTCache(CompilationCache):
    """Flatbuffers in the common container (see the module's text)."""

    def __init__(self, driver_version: str, key: bytes | None, threads: int,
                 store: PrivateStore | None = None):
        super().__init__(driver_version, key)
        self.threads = threads
        #: The driver's private store of flatbuffers (None: none kept).
        self.store = store
        #: The restoring device's work bound (None: none): a model cache written under a
        #: looser one (another process's NNHAL_MAX_WORK, one key file) is not restored.
        self.max_work: int | None = None

    def encode(self, model: Model, priority: Priority, prepared: IPreparedModel
               ) -> tuple[bytes, bytes, LiteRTPlan] | None:
        plan = getattr(prepared, "plan", None)
        if not isinstance(plan, LiteRTPlan):
            return None
        data = plan.engines.flatbuffer
        body = encode_head(priority, plan.graph.relaxed, data) + \
            encode_io(plan.graph, self.driver_version, xnnpack=plan.engines.xnnpack,
                      divides=plan.engines.divides)
        return body, data, plan

    def decode(self, loaded: Loaded) -> tuple[ModelGraph, bytes | StoredFile, bool, bool]:
        source = loaded.private if loaded.private is not None else loaded.data
        graph, rec = read_io(loaded.body, self.driver_version)
        xnnpack, divides = rec.get("xnnpack", True), rec.get("divides", False)
        if not isinstance(xnnpack, bool) or not isinstance(divides, bool):
            raise CacheError("malformed model cache: xnnpack or divides is not a boolean")
        return graph, source, xnnpack, divides

    def private_data(self, head: BodyHead) -> StoredFile | None:
        if self.store is None:
            return None
        return self.store.open(head.data_digest, head.data_length)

    def keep_private(self, digest: bytes, data: bytes) -> None:
        if self.store is not None:
            self.store.put(digest, data)

    def drop_private(self, digest: bytes) -> None:
        if self.store is not None:
            self.store.remove(digest)

    def bind(self, image: tuple[ModelGraph, bytes | StoredFile, bool, bool]) -> LiteRTPlan:
        graph, flatbuffer, xnnpack, divides = image
        check_work(graph, self.max_work)
        first = Engine(flatbuffer, self.threads, xnnpack)
        if len(first.inputs) != len(graph.main.inputs) or \
                len(first.outputs) != len(graph.main.outputs):
            raise CacheError("flatbuffer does not match the model cache")
        return LiteRTPlan(graph, EnginePool(flatbuffer, self.threads, first, xnnpack,
                                            divides))
