"""Loading conformance cases and turning them into HAL models and requests.

The model is built the way the NNAPI runtime hands it to a driver: small CONSTANT_COPY values
in ``operandValues``, CONSTANT_REFERENCE values and every constant over 128 bytes in a shared
memory pool; inputs and outputs always travel in shared-memory pools of the request.
"""

from __future__ import annotations

import copy
import fnmatch
import gzip
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from nnhal.hal.builder import MAX_INLINE
from nnhal.hal.types import (
    DataLocation,
    Model,
    Operand,
    OperandLifeTime,
    OperandType,
    Operation,
    OperationType,
    Request,
    RequestArgument,
    Subgraph,
    SymmPerChannelQuantParams,
)
from nnhal.memory import SharedMemory

ALIGN = 8
#: Where the conformance data lives when neither --specs nor NNHAL_CONFORMANCE names it.
DEFAULT_SPECS = "../shared/conformance"
SPECS_ENV = "NNHAL_CONFORMANCE"


def default_specs_dir() -> Path:
    return Path(os.environ.get(SPECS_ENV) or DEFAULT_SPECS)


@dataclass
class Case:
    """One conformance case, as read from its JSON, plus where it came from."""

    file: str
    folder: str
    name: str
    data: dict[str, Any]

    @property
    def expect_failure(self) -> bool:
        return bool(self.data.get("expectFailure"))

    @property
    def multinomial_tolerance(self) -> float:
        return float(self.data.get("expectedMultinomialDistributionTolerance") or 0)

    @property
    def operations(self) -> list[str]:
        m = self.data["model"]
        names = [op["type"] for op in m["main"]["operations"]]
        for sg in m["referenced"]:
            names += [op["type"] for op in sg["operations"]]
        return sorted(set(names))

    def has_type(self, name: str) -> bool:
        m = self.data["model"]
        return any(o["type"] == name for sg in [m["main"], *m["referenced"]]
                   for o in sg["operands"])


def iter_cases(specs: Path, pattern: str | None = None,
               shard: tuple[int, int] = (0, 1)) -> Iterator[Case]:
    """Every case under ``specs`` (a folder of folders, one folder, or one file), sorted.

    ``shard=(k, n)`` keeps every n-th file starting at the k-th, for parallel runs.
    """
    specs = Path(specs)
    files = [specs] if specs.is_file() else sorted(specs.rglob("*.json.gz"))
    k, n = shard
    for f in files[k::n]:
        folder = f.parent.name
        with gzip.open(f, "rt") as fh:
            cases = json.load(fh)
        for c in cases:
            if pattern and not fnmatch.fnmatch(c["name"], pattern):
                continue
            yield Case(file=str(f.relative_to(specs.parent) if specs.is_dir() else f.name),
                       folder=folder, name=c["name"], data=c)


# ---- building HAL objects ----------------------------------------------------------------

def values_array(t: OperandType, data: list[Any], dims: list[int]) -> np.ndarray:
    """JSON values in the operand's own type (floats rounded to float16 where it is float16)."""
    if t in (OperandType.BOOL, OperandType.TENSOR_BOOL8):
        arr = np.asarray([bool(v) for v in data], dtype=np.uint8)
    elif t == OperandType.SUBGRAPH:
        arr = np.asarray(data, dtype=np.uint32)
    else:
        arr = np.asarray(data, dtype=np.float64 if t.dtype.kind == "f" else np.int64)
        arr = arr.astype(t.dtype)
    return arr


class _Packer:
    """Lays out byte blobs at aligned offsets."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.size = 0

    def add(self, blob: bytes) -> tuple[int, int]:
        pad = (-self.size) % ALIGN
        if pad:
            self.parts.append(b"\0" * pad)
            self.size += pad
        off = self.size
        self.parts.append(blob)
        self.size += len(blob)
        return off, len(blob)

    def bytes(self) -> bytes:
        return b"".join(self.parts)


def build_model(case_model: dict[str, Any]) -> Model:
    values = _Packer()
    pool = _Packer()

    def subgraph(sg: dict[str, Any]) -> Subgraph:
        operands = []
        for o in sg["operands"]:
            t = OperandType[o["type"]]
            lt = OperandLifeTime[o["lifetime"]]
            cq = o.get("channelQuant")
            extra = SymmPerChannelQuantParams(list(cq["scales"]), int(cq["channelDim"])) \
                if cq else None
            loc = DataLocation()
            if lt in (OperandLifeTime.CONSTANT_COPY, OperandLifeTime.CONSTANT_REFERENCE):
                blob = values_array(t, o["data"], o["dimensions"]).tobytes()
                if lt == OperandLifeTime.CONSTANT_COPY and len(blob) <= MAX_INLINE:
                    off, n = values.add(blob)
                    loc = DataLocation(0, off, n)
                else:
                    lt = OperandLifeTime.CONSTANT_REFERENCE
                    off, n = pool.add(blob)
                    loc = DataLocation(0, off, n)
            elif lt == OperandLifeTime.SUBGRAPH:
                loc = DataLocation(0, int(o["data"][0]), 0)
            operands.append(Operand(
                type=t, dimensions=list(o["dimensions"]),
                number_of_consumers=int(o["numberOfConsumers"]), scale=float(o["scale"]),
                zero_point=int(o["zeroPoint"]), lifetime=lt, location=loc, extra_params=extra))
        operations = [Operation(int(OperationType[op["type"]]), list(op["inputs"]),
                                list(op["outputs"])) for op in sg["operations"]]
        return Subgraph(operands, operations, list(sg["inputIndexes"]),
                        list(sg["outputIndexes"]))

    main = subgraph(case_model["main"])
    referenced = [subgraph(sg) for sg in case_model["referenced"]]
    pools = [SharedMemory.from_bytes(pool.bytes())] if pool.size else []
    return Model(main=main, referenced=referenced, operand_values=values.bytes(), pools=pools,
                 relax_computation_float32_to_float16=bool(case_model.get("isRelaxed")))


@dataclass
class Expected:
    """An expected main-subgraph output."""

    type: OperandType
    dims: list[int]
    values: np.ndarray
    ignored: bool
    scale: float = 0.0
    zero_point: int = 0


@dataclass
class BuiltRequest:
    request: Request
    outputs: list[Expected]
    output_memory: SharedMemory
    input_memory: SharedMemory | None
    pools: list[SharedMemory] = field(default_factory=list)

    def read_output(self, k: int, dims: list[int]) -> np.ndarray:
        exp = self.outputs[k]
        loc = self.request.outputs[k].location
        count = int(np.prod(dims, dtype=np.int64)) if dims else 1
        raw = self.output_memory.view(loc.offset, count * exp.type.byte_size)
        arr = raw.view(exp.type.dtype) if exp.type.dtype != np.bool_ else raw != 0
        return arr.reshape(dims) if dims else arr.reshape(())

    def close(self) -> None:
        for p in self.pools:
            p.close()


def build_request(case_model: dict[str, Any], *, shrink_output: int | None = None,
                  input_dims: bool = True) -> BuiltRequest:
    """Inputs and outputs in two ashmem pools. ``shrink_output`` makes that output's buffer one
    element too small (the dynamic-shape insufficient-size check)."""
    main = case_model["main"]
    ins = _Packer()
    in_args = []
    for idx in main["inputIndexes"]:
        o = main["operands"][idx]
        t = OperandType[o["type"]]
        if not o["data"]:
            # As the upstream harness does: an input without data is an omitted input.
            in_args.append(RequestArgument(True, DataLocation(0, 0, 0), []))
            continue
        blob = values_array(t, o["data"], o["dimensions"]).tobytes()
        off, n = ins.add(blob)
        in_args.append(RequestArgument(False, DataLocation(0, off, n),
                                       list(o["dimensions"]) if input_dims and t.is_tensor
                                       else []))
    outs = _Packer()
    out_args = []
    expected = []
    for k, idx in enumerate(main["outputIndexes"]):
        o = main["operands"][idx]
        t = OperandType[o["type"]]
        vals = values_array(t, o["data"], o["dimensions"])
        size = vals.nbytes
        if shrink_output == k:
            size = max(0, size - t.byte_size)
        off, n = outs.add(b"\0" * size)
        out_args.append(RequestArgument(False, DataLocation(1, off, n), []))
        expected.append(Expected(t, list(o["dimensions"]), vals.view(np.bool_) if
                                 t == OperandType.TENSOR_BOOL8 else vals,
                                 bool(o.get("isIgnored")), float(o["scale"]),
                                 int(o["zeroPoint"])))
    in_mem = SharedMemory.from_bytes(ins.bytes())
    out_mem = SharedMemory.ashmem(outs.size)
    req = Request(inputs=in_args, outputs=out_args, pools=[in_mem, out_mem])
    return BuiltRequest(req, expected, out_mem, in_mem, [in_mem, out_mem])


def outputs_fully_specified(case_model: dict[str, Any]) -> bool:
    """Whether every main-subgraph output tensor has known dimensions (fenced execution
    requires it)."""
    main = case_model["main"]
    for idx in main["outputIndexes"]:
        o = main["operands"][idx]
        if OperandType[o["type"]].is_tensor and (not o["dimensions"] or 0 in o["dimensions"]):
            return False
    return True


# ---- case transformations for the modes ---------------------------------------------------

def with_unknown_output_dims(case_model: dict[str, Any]) -> dict[str, Any]:
    """dynamic_shape: main-subgraph outputs of unknown dimensions (rank kept)."""
    m = copy.deepcopy(case_model)
    for idx in m["main"]["outputIndexes"]:
        o = m["main"]["operands"][idx]
        o["dimensions"] = [0] * len(o["dimensions"])
    return m


def to_signed_quant(case_model: dict[str, Any]) -> dict[str, Any]:
    """quantization_coupling: TENSOR_QUANT8_ASYMM turned into TENSOR_QUANT8_ASYMM_SIGNED."""
    m = copy.deepcopy(case_model)
    for sg in [m["main"], *m["referenced"]]:
        for o in sg["operands"]:
            if o["type"] == "TENSOR_QUANT8_ASYMM":
                o["type"] = "TENSOR_QUANT8_ASYMM_SIGNED"
                o["zeroPoint"] = int(o["zeroPoint"]) - 128
                o["data"] = [int(v) - 128 for v in o["data"]]
    return m
