"""Invalid requests: mutants of a valid request, after upstream ``ValidateRequest`` (removed
input/output) plus pool indexes, locations, dimensions, argument counts, omitted arguments and
memory-domain tokens; :func:`check_request_mutant` runs one through one execution path
(:mod:`.paths`) and checks the answer."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from nnhal.conformance.mutations.common import (
    ACCEPTED,
    CALLBACK_TIMEOUT_S,
    CRASH,
    HANG,
    REJECTED,
    WRONG_STATUS,
    input_is_required,
)
from nnhal.conformance.mutations.paths import PathFn, call_with_timeout
from nnhal.hal.interfaces import IPreparedModel
from nnhal.hal.types import (
    LOOP_TIMEOUT_MAXIMUM_NS,
    DataLocation,
    ErrorStatus,
    MeasureTiming,
    MemoryPool,
    OperandType,
    OperationType,
    Request,
    RequestArgument,
    Subgraph,
)
from nnhal.memory import SharedMemory

T = OperandType
Op = OperationType


@dataclass
class RequestMutant:
    kind: str
    detail: str
    reason: str
    request: Request
    measure: int = MeasureTiming.NO
    loop_timeout: int | None = None
    #: Statuses that count as a correct answer (INVALID_ARGUMENT unless stated otherwise).
    accept: tuple[ErrorStatus, ...] = (ErrorStatus.INVALID_ARGUMENT,)
    #: Must the failure be reported before the execution launches (upstream's rule)?
    at_launch: bool = True


def copy_request(r: Request) -> Request:
    return Request(inputs=[replace(a, dimensions=list(a.dimensions)) for a in r.inputs],
                   outputs=[replace(a, dimensions=list(a.dimensions)) for a in r.outputs],
                   pools=list(r.pools))


def _pool_size(pool: object) -> int | None:
    mem = pool.hidl_memory if isinstance(pool, MemoryPool) else pool
    return int(mem.size) if isinstance(mem, SharedMemory) else None


def required_inputs(main: Subgraph) -> list[bool]:
    """Per request input: does some operation read it at a slot its signature does not let
    be omitted?"""
    return [any(i == idx and input_is_required(op, k)
                for op in main.operations for k, i in enumerate(op.inputs))
            for idx in main.input_indexes]


def request_mutations(request: Request, main: Subgraph,
                      closed_memory: SharedMemory | None = None) -> Iterator[RequestMutant]:
    """Invalid variants of a valid request for the main subgraph ``main``."""
    def mutant(kind: str, detail: str, reason: str, fn: Callable[[Request], None],
               **kw: Any) -> RequestMutant:
        r = copy_request(request)
        fn(r)
        return RequestMutant(kind, detail, reason, r, **kw)

    npools = len(request.pools)
    for kind, args, indexes in (("input", request.inputs, main.input_indexes),
                                ("output", request.outputs, main.output_indexes)):
        attr = f"{kind}s"
        for k in range(len(args)):
            yield mutant(f"remove_{kind}", f"{kind} {k} removed",
                         f"fewer {kind}s than the model has",
                         lambda r, k=k, a=attr: getattr(r, a).pop(k))
        if args:
            yield mutant(f"extra_{kind}", f"{kind} {len(args)} added",
                         f"more {kind}s than the model has",
                         lambda r, a=attr: getattr(r, a).append(getattr(r, a)[-1]))
        for k, (arg, idx) in enumerate(zip(args, indexes)):
            if arg.has_no_value:
                continue
            loc = arg.location
            op = main.operands[idx]
            yield mutant("pool_index", f"{kind} {k} pool {npools}", "pool index out of range",
                         lambda r, k=k, a=attr: _set_loc(getattr(r, a), k, pool_index=npools))
            size = _pool_size(request.pools[loc.pool_index]) \
                if loc.pool_index < npools else None
            if size is not None:
                yield mutant("location", f"{kind} {k} offset at pool end + 1",
                             "location beyond the pool",
                             lambda r, k=k, a=attr, s=size: _set_loc(
                                 getattr(r, a), k, offset=s - getattr(r, a)[k].location.length
                                 + 1))
                yield mutant("location", f"{kind} {k} length past pool end",
                             "location beyond the pool",
                             lambda r, k=k, a=attr, s=size: _set_loc(
                                 getattr(r, a), k, length=s - getattr(r, a)[k].location.offset
                                 + 1))
                yield mutant("location", f"{kind} {k} offset 2**32", "location beyond the pool",
                             lambda r, k=k, a=attr: _set_loc(getattr(r, a), k, offset=1 << 32))
            if kind == "input" and loc.length > 0:
                yield mutant("location", f"input {k} one byte short",
                             "input location smaller than the input",
                             lambda r, k=k: _set_loc(r.inputs, k,
                                                     length=r.inputs[k].location.length - 1))
            try:
                t = T(op.type)
            except ValueError:
                continue
            if t.is_scalar:
                yield mutant("dimensions", f"{kind} {k} scalar given dimensions [1]",
                             "dimensions on a scalar",
                             lambda r, k=k, a=attr: setattr(getattr(r, a)[k], "dimensions", [1]))
                continue
            dims = list(arg.dimensions) or list(op.dimensions)
            if op.dimensions and all(op.dimensions):
                bad = list(op.dimensions)
                bad[0] += 1
                yield mutant("dimensions", f"{kind} {k} dimensions {bad}",
                             "dimensions disagree with the model's",
                             lambda r, k=k, a=attr, b=bad: setattr(getattr(r, a)[k],
                                                                  "dimensions", b))
            if op.dimensions:
                yield mutant("dimensions", f"{kind} {k} rank + 1",
                             "rank differs from the model's",
                             lambda r, k=k, a=attr, d=dims: setattr(getattr(r, a)[k],
                                                                   "dimensions",
                                                                   [*(d or [1]), 1]))
        for k in range(len(args)):
            yield mutant("no_value_with_location", f"{kind} {k} omitted with a location",
                         "an omitted argument must have an empty location",
                         lambda r, k=k, a=attr: _omit(getattr(r, a), k, DataLocation(0, 0, 4)))
    for k in range(len(request.outputs)):
        yield mutant("omitted_output", f"output {k} omitted", "an output cannot be omitted",
                     lambda r, k=k: _omit(r.outputs, k))
    for k, need in enumerate(required_inputs(main)):
        if need and not request.inputs[k].has_no_value:
            # An input an operation needs: rejecting it (INVALID_ARGUMENT) or failing the
            # execution (GENERAL_FAILURE) are both clean answers; success is not.
            yield mutant("omitted_required_input", f"input {k} omitted",
                         "an input an operation requires is omitted",
                         lambda r, k=k: _omit(r.inputs, k),
                         accept=(ErrorStatus.INVALID_ARGUMENT, ErrorStatus.GENERAL_FAILURE),
                         at_launch=False)
    for p in range(npools):
        yield mutant("pool_token", f"pool {p} an unknown memory-domain token",
                     "no buffer has that token",
                     lambda r, p=p: _set_pool(r, p, MemoryPool.of_token(0x7FFF_FFF1)))
        yield mutant("pool_object", f"pool {p} not a memory", "a pool must be a memory",
                     lambda r, p=p: _set_pool(r, p, None))
        if closed_memory is not None:
            yield mutant("pool_closed", f"pool {p} a closed memory", "the memory cannot be mapped",
                         lambda r, p=p: _set_pool(r, p, closed_memory))
    yield mutant("measure", "measure 2", "MeasureTiming outside the enumeration",
                 lambda r: None, measure=2)
    yield mutant("loop_timeout", "loop timeout above the maximum",
                 "loop timeout above LoopTimeoutDurationNs::MAXIMUM", lambda r: None,
                 loop_timeout=LOOP_TIMEOUT_MAXIMUM_NS + 1)


def _set_loc(args: list[RequestArgument], k: int, **kw: int) -> None:
    args[k] = replace(args[k], location=replace(args[k].location, **kw))


def _omit(args: list[RequestArgument], k: int, loc: DataLocation | None = None) -> None:
    args[k] = RequestArgument(True, loc or DataLocation(), [])


def _set_pool(r: Request, p: int, pool: object) -> None:
    r.pools[p] = pool


def check_request_mutant(pm: IPreparedModel, mutant: RequestMutant, path: PathFn,
                         guarded: Sequence[SharedMemory] = ()) -> tuple[str, str]:
    """(outcome, message) for one invalid request on one path; ``guarded`` memories must be
    left untouched (an invalid request writes nothing)."""
    before = [m.read(0, m.size) for m in guarded]
    try:
        res = call_with_timeout(lambda: path(pm, mutant.request, mutant.measure,
                                             mutant.loop_timeout), CALLBACK_TIMEOUT_S)
    except TimeoutError:
        return HANG, "no answer"
    except Exception as e:  # noqa: BLE001
        return CRASH, f"{type(e).__name__}: {e}"
    if res.problem:
        return WRONG_STATUS, res.problem
    if res.status == ErrorStatus.NONE:
        return ACCEPTED, "executed"
    if res.status not in mutant.accept:
        return WRONG_STATUS, res.status.name
    if mutant.at_launch and res.launch is not None and res.launch != res.status:
        return WRONG_STATUS, f"launch {res.launch.name}, then {res.status.name}"
    if res.shapes or res.timing.available:
        return WRONG_STATUS, "a failed execution reported shapes or timing"
    for m, b in zip(guarded, before):
        if m.read(0, m.size) != b:
            return WRONG_STATUS, "a failed execution wrote to a pool"
    return REJECTED, ""
