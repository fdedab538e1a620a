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
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from nnhal.conformance.specs import DEFAULT_SPECS as DEFAULT_SPECS
from nnhal.conformance.specs import SPECS_ENV as SPECS_ENV
from nnhal.conformance.specs import case_files
from nnhal.conformance.specs import default_specs_dir as default_specs_dir
from nnhal.core.version import FeatureLevel, UnknownVersion
from nnhal.hal.builder import ModelBuilder, SubgraphBuilder
from nnhal.hal.request_layout import ArgSlot, LayoutError, RequestLayout
from nnhal.hal.types import (
    Model,
    OperandLifeTime,
    OperandType,
    OperationType,
    Request,
    SymmPerChannelQuantParams,
)
from nnhal.memory import SharedMemory


@dataclass
class Case:
    """One conformance case, as read from its JSON, plus where it came from.

    A case that could not be read (its file is not gzip JSON, or the case lacks a field the
    runner needs) is still a Case: ``error`` says what is wrong and ``data`` is empty; the
    runner reports it as failed in every mode.
    """

    file: str
    folder: str
    name: str
    data: dict[str, Any]
    error: str = ""
    #: Position in its file (-1 when the whole file is unreadable).
    index: int = -1
    #: Its ``minSupportedVersion`` on the scale; None when it names none. Read even when the
    #: rest of the case cannot be, so a case of a level above the device's is skipped for
    #: that (its operations may be unknown to this nnhal) rather than failed as unreadable.
    min_level: FeatureLevel | None = None
    #: For a case above HAL 1.3 only: what of its model nnhal's signature table does not
    #: declare (an operation, or a type combination of a declared one), its first word the
    #: operation's name; empty when all is declared. Such a case is skipped as not
    #: implemented yet rather than failed (:func:`undeclared`).
    not_implemented: str = ""

    @property
    def broken(self) -> bool:
        return bool(self.error)

    @property
    def expect_failure(self) -> bool:
        return bool(self.data.get("expectFailure"))

    @property
    def multinomial_tolerance(self) -> float:
        return float(self.data.get("expectedMultinomialDistributionTolerance") or 0)

    @property
    def operations(self) -> list[str]:
        if self.error:
            return []
        m = self.data["model"]
        names = [op["type"] for op in m["main"]["operations"]]
        for sg in m["referenced"]:
            names += [op["type"] for op in sg["operations"]]
        return sorted(set(names))

    def has_type(self, name: str) -> bool:
        if self.error:
            return False
        m = self.data["model"]
        return any(o["type"] == name for sg in [m["main"], *m["referenced"]]
                   for o in sg["operands"])


class MalformedCase(ValueError):
    """A case's model or values cannot be turned into HAL objects."""


def iter_cases(specs: Path, pattern: str | None = None,
               shard: tuple[int, int] = (0, 1)) -> Iterator[Case]:
    """Every case under ``specs`` (a folder of folders, one folder, or one file), sorted.

    ``shard=(k, n)`` keeps every n-th file starting at the k-th, for parallel runs. A file
    that cannot be read and a case that lacks what the runner needs come out as broken
    cases (``Case.error`` set), whatever ``pattern`` says unless the case has a name that
    does not match it.
    """
    specs = Path(specs)
    k, n = shard
    for f in case_files(specs)[k::n]:
        folder = f.parent.name
        label = str(f.relative_to(specs.parent) if specs.is_dir() else f.name)
        try:
            with gzip.open(f, "rt", encoding="utf-8") as fh:
                cases = json.load(fh)
        except (OSError, EOFError, ValueError, zlib.error) as e:
            yield Case(label, folder, "(whole file)", {},
                       f"not gzip JSON: {type(e).__name__}: {e}")
            continue
        if not isinstance(cases, list):
            yield Case(label, folder, "(whole file)", {},
                       f"not a JSON list of cases but a JSON {_json_kind(cases)}")
            continue
        for index, c in enumerate(cases):
            name = c.get("name") if isinstance(c, dict) else None
            where = ""
            if not isinstance(name, str):
                name = f"case #{index}"
            elif pattern and not fnmatch.fnmatch(name, pattern):
                continue
            else:
                where = f"(case #{index}) "
            level, problem = case_level(c)
            missing = undeclared(c) if level is not None and level > FeatureLevel.V1_3 else ""
            problem = problem or case_problem(c)
            if problem:
                yield Case(label, folder, name, {}, where + problem, index, level, missing)
            else:
                yield Case(label, folder, name, c, index=index, min_level=level,
                           not_implemented=missing)


# ---- checking a case's structure ----------------------------------------------------------

def _json_kind(v: Any) -> str:
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    return {dict: "object", list: "array", str: "string", type(None): "null"}.get(
        type(v), type(v).__name__)


def _need(obj: dict[str, Any], key: str, kinds: tuple[type, ...], where: str,
          what: str) -> Any:
    if key not in obj:
        raise MalformedCase(f"{where}: '{key}' missing")
    v = obj[key]
    if not isinstance(v, kinds) or (isinstance(v, bool) and bool not in kinds):
        raise MalformedCase(f"{where}.{key}: {what} expected, got {_json_kind(v)}")
    return v


def _int_list(obj: dict[str, Any], key: str, where: str) -> list[int]:
    v = _need(obj, key, (list,), where, "a list of integers")
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise MalformedCase(f"{where}.{key}: a list of integers expected")
    return v


def _enum_name(obj: dict[str, Any], key: str, enum: Any, where: str) -> None:
    v = _need(obj, key, (str,), where, f"an {enum.__name__} name")
    if v not in enum.__members__:
        raise MalformedCase(f"{where}.{key}: unknown {enum.__name__} {v!r}")


def _check_subgraph(sg: Any, where: str, is_main: bool) -> None:
    if not isinstance(sg, dict):
        raise MalformedCase(f"{where}: an object expected, got {_json_kind(sg)}")
    operands = _need(sg, "operands", (list,), where, "a list")
    for j, o in enumerate(operands):
        w = f"{where}.operands[{j}]"
        if not isinstance(o, dict):
            raise MalformedCase(f"{w}: an object expected, got {_json_kind(o)}")
        _enum_name(o, "type", OperandType, w)
        _enum_name(o, "lifetime", OperandLifeTime, w)
        _int_list(o, "dimensions", w)
        _need(o, "scale", (int, float), w, "a number")
        _need(o, "zeroPoint", (int,), w, "an integer")
        _need(o, "numberOfConsumers", (int,), w, "an integer")
        data = _need(o, "data", (list,), w, "a list")
        if o["lifetime"] == "SUBGRAPH" and not (
                data and isinstance(data[0], int) and not isinstance(data[0], bool)):
            raise MalformedCase(f"{w}.data: a SUBGRAPH operand needs its subgraph index")
        cq = o.get("channelQuant")
        if cq is not None:
            if not isinstance(cq, dict):
                raise MalformedCase(f"{w}.channelQuant: an object or null expected")
            _need(cq, "scales", (list,), f"{w}.channelQuant", "a list of numbers")
            _need(cq, "channelDim", (int,), f"{w}.channelQuant", "an integer")
    operations = _need(sg, "operations", (list,), where, "a list")
    for j, op in enumerate(operations):
        w = f"{where}.operations[{j}]"
        if not isinstance(op, dict):
            raise MalformedCase(f"{w}: an object expected, got {_json_kind(op)}")
        _enum_name(op, "type", OperationType, w)
        _int_list(op, "inputs", w)
        _int_list(op, "outputs", w)
    for key in ("inputIndexes", "outputIndexes"):
        indexes = _int_list(sg, key, where)
        # The runner lays out the request from the main subgraph's inputs and outputs.
        if is_main and any(not 0 <= i < len(operands) for i in indexes):
            raise MalformedCase(f"{where}.{key}: operand index out of range")


def case_level(case: Any) -> tuple[FeatureLevel | None, str | None]:
    """(the case's ``minSupportedVersion`` on the scale, or None when it names none; what is
    wrong with that field, or None)."""
    spelling = case.get("minSupportedVersion") if isinstance(case, dict) else None
    if spelling is None:
        return None, None
    try:
        return FeatureLevel.parse(spelling), None
    except UnknownVersion as e:
        return None, f"minSupportedVersion: {e}"


def undeclared(case: Any) -> str:
    """What of a case's model nnhal's signature table does not declare, starting with the
    operation's name; empty when every operation and its operand types are declared (or the
    model is too malformed to tell: :func:`case_problem` reports that).

    An operation absent from the table is undeclared; so is a declared one whose operand
    types or counts fit none of its declared variants, except in a case expected to fail,
    where such a misfit may be what the case checks is refused."""
    from nnhal.ops.catalog import SIGNATURES
    from nnhal.ops.resolver import OperandInfo
    from nnhal.ops.signature import SignatureError, check

    try:
        model = case["model"]
        expect_failure = bool(case.get("expectFailure"))
        for sg in [model["main"], *model["referenced"]]:
            operands = sg["operands"]
            for op in sg["operations"]:
                name = op["type"]
                signature = SIGNATURES.get(OperationType.__members__.get(name))  # type: ignore
                if signature is None:
                    return f"{name} (an operation nnhal does not declare)"
                if expect_failure:
                    continue
                ins, outs = ([OperandInfo(OperandType[operands[i]["type"]], None,
                                          lifetime=OperandLifeTime[operands[i]["lifetime"]])
                              for i in op[key]] for key in ("inputs", "outputs"))
                try:
                    check(signature, ins, outs, presence=False)
                except SignatureError as e:
                    return f"{e} (a combination nnhal does not declare)"
    except (KeyError, IndexError, TypeError, AttributeError):
        pass
    return ""


def case_problem(case: Any) -> str | None:
    """What keeps a case (a parsed JSON value) from being run, or None: the fields and types
    the model builder and the runner rely on (values themselves are checked when used)."""
    try:
        if not isinstance(case, dict):
            raise MalformedCase(f"an object expected, got {_json_kind(case)}")
        _need(case, "name", (str,), "case", "a string")
        model = _need(case, "model", (dict,), "case", "an object")
        _check_subgraph(_need(model, "main", (dict,), "model", "an object"), "model.main",
                        True)
        for k, sg in enumerate(_need(model, "referenced", (list,), "model", "a list")):
            _check_subgraph(sg, f"model.referenced[{k}]", False)
    except MalformedCase as e:
        return str(e)
    return None


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


def build_model(case_model: dict[str, Any]) -> Model:
    """The HAL model of a case's ``model`` JSON, through :class:`ModelBuilder`: operands,
    lifetimes, numberOfConsumers and index lists exactly as the JSON gives them; constants
    placed as the builder places them. :class:`MalformedCase` when the JSON cannot be built."""
    try:
        b = ModelBuilder(relaxed=bool(case_model.get("isRelaxed")))
        subgraphs = [b] + [b.subgraph() for _ in case_model["referenced"]]
        for sb, sg in zip(subgraphs, [case_model["main"], *case_model["referenced"]]):
            _fill_subgraph(sb, sg)
        return b.build()
    except (KeyError, IndexError, TypeError, ValueError, OverflowError) as e:
        raise MalformedCase(f"cannot build the model: {type(e).__name__}: {e}") from e


def _fill_subgraph(b: SubgraphBuilder, sg: dict[str, Any]) -> None:
    for o in sg["operands"]:
        t = OperandType[o["type"]]
        lt = OperandLifeTime[o["lifetime"]]
        cq = o.get("channelQuant")
        extra = SymmPerChannelQuantParams(list(cq["scales"]), int(cq["channelDim"])) \
            if cq else None
        dims, scale, zp = list(o["dimensions"]), float(o["scale"]), int(o["zeroPoint"])
        consumers = int(o["numberOfConsumers"])
        if lt in (OperandLifeTime.CONSTANT_COPY, OperandLifeTime.CONSTANT_REFERENCE):
            b.constant(t, values_array(t, o["data"], dims), dims, scale, zp, extra,
                       lifetime=lt, consumers=consumers)
        elif lt == OperandLifeTime.SUBGRAPH:
            i = b.reference(int(o["data"][0]), consumers=consumers)
            # As the JSON has it (a SUBGRAPH operand normally has none of these).
            op = b.operands[i]
            op.type, op.dimensions, op.scale, op.zero_point, op.extra_params = \
                t, dims, scale, zp, extra
        elif lt == OperandLifeTime.NO_VALUE:
            b.omitted(t, dims, scale, zp, extra, consumers=consumers)
        else:
            b.operand(t, dims, scale, zp, extra, lifetime=lt, consumers=consumers)
    for op in sg["operations"]:
        b.operation(OperationType[op["type"]], op["inputs"], op["outputs"])
    b.inputs = list(sg["inputIndexes"])
    b.outputs = list(sg["outputIndexes"])


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
    element too small (the dynamic-shape insufficient-size check). :class:`MalformedCase`
    when the case's values cannot be laid out."""
    try:
        return _build_request(case_model, shrink_output, input_dims)
    except (KeyError, IndexError, TypeError, ValueError, OverflowError) as e:
        raise MalformedCase(f"cannot build the request: {type(e).__name__}: {e}") from e


def _build_request(case_model: dict[str, Any], shrink_output: int | None,
                   input_dims: bool) -> BuiltRequest:
    main = case_model["main"]
    ins, blobs = [], []
    for idx in main["inputIndexes"]:
        o = main["operands"][idx]
        t = OperandType[o["type"]]
        if not o["data"]:
            # As the upstream harness does: an input without data is an omitted input.
            ins.append(ArgSlot(omitted=True))
            blobs.append(None)
            continue
        blob = values_array(t, o["data"], o["dimensions"])
        ins.append(ArgSlot(blob.nbytes, tuple(o["dimensions"]) if input_dims and t.is_tensor
                           else ()))
        blobs.append(blob)
    outs = []
    expected = []
    for k, idx in enumerate(main["outputIndexes"]):
        o = main["operands"][idx]
        t = OperandType[o["type"]]
        vals = values_array(t, o["data"], o["dimensions"])
        size = vals.nbytes
        if shrink_output == k:
            size = max(0, size - t.byte_size)
        outs.append(ArgSlot(size))
        expected.append(Expected(t, list(o["dimensions"]), vals.view(np.bool_) if
                                 t == OperandType.TENSOR_BOOL8 else vals,
                                 bool(o.get("isIgnored")), float(o["scale"]),
                                 int(o["zeroPoint"])))
    try:
        layout = RequestLayout(ins, outs, both_pools=True)
    except LayoutError as e:
        raise ValueError(str(e)) from None
    for k, blob in enumerate(blobs):
        if blob is not None:
            layout.input_view(k)[:] = blob.reshape(-1).view(np.uint8)
    in_mem, out_mem = layout.input_memory, layout.output_memory
    assert in_mem is not None and out_mem is not None
    return BuiltRequest(layout.request, expected, out_mem, in_mem, [in_mem, out_mem])


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
                try:
                    o["data"] = [int(v) - 128 for v in o["data"]]
                except (TypeError, ValueError) as e:
                    raise MalformedCase(f"quant8 values: {type(e).__name__}: {e}") from e
    return m
