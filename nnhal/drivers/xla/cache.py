"""The XLA driver's compilation cache, in the common authenticated container
(:mod:`nnhal.drivers.common.compilation_cache`).

The *data cache* is the compiled executable's bytes (``Client.serialize_executable``: the
machine code XLA made, loaded again without compiling) followed by the weights, each tensor's
bytes in argument order. The *model cache* body holds, after the common head, the main inputs
and outputs as the LiteRT driver encodes them (:func:`nnhal.drivers.litert.cache.encode_io`,
with this driver's version) and this driver's record: the platform the executable was compiled
for (JAX version, platform, device kind: a cache from another one is refused, never loaded),
the executable's length and the weights' table. Everything is bound by the HMAC of the model
cache (the data cache through its digest), so only bytes this driver wrote are ever loaded: an
XLA executable is code. No pickle.
"""

from __future__ import annotations

import json
import math
import struct
from typing import Any

import numpy as np

from nnhal.analysis import ModelGraph
from nnhal.drivers.common.compilation_cache import (
    BODY_HEAD_SIZE,
    CacheError,
    CompilationCache,
    Loaded,
    encode_head,
)
from nnhal.drivers.litert.cache import check_work, decode_io, encode_io
from nnhal.drivers.xla.engine import (
    RELAXED_ENV,
    Executable,
    platform,
    relaxed_dtype,
    restore,
)
from nnhal.drivers.xla.lowering import Weight, uses_quantized
from nnhal.hal.interfaces import IPreparedModel
from nnhal.hal.types import Model, Priority

_LEN = struct.Struct("<I")


def relaxed_name(graph: ModelGraph, device: Any) -> str | None:
    """What a relaxed float model computes in on ``device`` now (:data:`RELAXED_ENV`;
    raises ValueError for a value it does not know); None for a model that is not relaxed
    or is quantized (its arithmetic is the model's own)."""
    if not graph.relaxed or uses_quantized(graph):
        return None
    fast = relaxed_dtype(device)
    return "float32" if fast is None else str(fast)


class XlaPlan:
    """What an XLA prepared model runs: the main inputs and outputs (a graph without
    operations when restored) and the executable. Shared by the prepared models restored from
    one cache while any of them lives. ``relaxed_in``: what a relaxed float model was
    compiled to compute in (see :func:`relaxed_name`), which a restore checks against the
    setting of the time."""

    def __init__(self, graph: ModelGraph, executable: Executable,
                 relaxed_in: str | None = None):
        self.graph = graph
        self.executable = executable
        self.relaxed_in = relaxed_in

    def check_relaxed(self, device: Any) -> None:
        """Raises CacheError when :data:`RELAXED_ENV` now asks another arithmetic than the
        executable was compiled in (the model is compiled again rather than restored)."""
        if self.relaxed_in is None:
            return
        try:
            fast = relaxed_dtype(device)
        except ValueError as e:
            raise CacheError(str(e)) from None
        now = "float32" if fast is None else str(fast)
        if now != self.relaxed_in:
            raise CacheError(f"relaxed arithmetic compiled in {self.relaxed_in}, "
                             f"{RELAXED_ENV} now asks {now}")


class XlaCache(CompilationCache):
    """Serialized executables in the common container (see the module's text)."""

    def __init__(self, driver_version: str, key: bytes | None, device: Any):
        super().__init__(driver_version, key)
        #: The JAX device restored executables load on (None: JAX is not available).
        self.device = device
        #: The restoring device's work bound (see :func:`check_work`; None: none).
        self.max_work: int | None = None

    def encode(self, model: Model, priority: Priority, prepared: IPreparedModel
               ) -> tuple[bytes, bytes, XlaPlan] | None:
        plan = getattr(prepared, "plan", None)
        if not isinstance(plan, XlaPlan):
            return None
        exe = plan.executable
        code = exe.serialize()
        parts = [code]
        table = []
        for w, arr in zip(exe.weight_table, exe.weight_bytes()):
            parts.append(np.ascontiguousarray(arr, dtype=np.dtype(w.dtype)).tobytes())
            table.append([w.index, w.dtype, list(w.shape)])
        data = b"".join(parts)
        io = encode_io(plan.graph, self.driver_version)
        record: dict[str, Any] = {"platform": platform(exe.device), "code": len(code),
                                  "weights": table}
        if plan.relaxed_in is not None:
            record["relaxed"] = plan.relaxed_in
        mine = json.dumps(record, separators=(",", ":")).encode()
        body = encode_head(priority, plan.graph.relaxed, data) + _LEN.pack(len(io)) + io + mine
        return body, data, plan

    def decode(self, loaded: Loaded
               ) -> tuple[ModelGraph, int, list[Weight], Loaded, str | None]:
        body = bytes(loaded.body)
        try:
            (n,) = _LEN.unpack_from(body, BODY_HEAD_SIZE)
            start = BODY_HEAD_SIZE + _LEN.size
            io = body[start:start + n]
            rec = json.loads(body[start + n:])
            # decode_io reads its JSON after a body head: give it one (its bytes unused).
            graph = decode_io(b"\0" * BODY_HEAD_SIZE + io, self.driver_version)
            weights = [Weight(int(i), str(np.dtype(d).str), tuple(int(x) for x in s))
                       for i, d, s in rec["weights"]]
            code = int(rec["code"])
            where = str(rec["platform"])
            compiled_in = rec.get("relaxed")
        except CacheError:
            raise
        except (ValueError, TypeError, KeyError, struct.error) as e:
            raise CacheError(f"malformed model cache: {type(e).__name__}: {e}") from e
        if self.device is None:
            raise CacheError("jax is not available")
        here = platform(self.device)
        if where != here:
            raise CacheError(f"compiled for {where}, this device is {here}")

        size = code + sum(np.dtype(w.dtype).itemsize * math.prod(w.shape) for w in weights)
        if size != loaded.head.data_length:
            raise CacheError("data cache length does not match the executable and weights")
        # ``loaded.data`` is read only by bind, once its digest has matched.
        if compiled_in is not None and compiled_in not in ("float16", "float32"):
            raise CacheError(f"malformed model cache: relaxed {compiled_in!r}")
        return graph, code, weights, loaded, compiled_in

    def bind(self, image: tuple[ModelGraph, int, list[Weight], Loaded, str | None]
             ) -> XlaPlan:
        graph, code, weights, loaded, compiled_in = image
        check_work(graph, self.max_work)
        data = memoryview(loaded.data)
        values = []
        pos = code
        for w in weights:
            n = np.dtype(w.dtype).itemsize * math.prod(w.shape)
            values.append(np.frombuffer(data[pos:pos + n], dtype=np.dtype(w.dtype))
                          .reshape(w.shape))
            pos += n
        exe = restore(bytes(data[:code]), self.device, weights, values)
        return XlaPlan(graph, exe, compiled_in)
