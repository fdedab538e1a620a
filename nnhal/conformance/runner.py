"""The conformance runner: upstream generated cases against any IDevice, mode by mode.

Each mode runs a case the way the upstream driver test suite does (see the conformance
README); a case passes a mode only if every execution path of that mode passes. A case whose
operations the device does not support is skipped, not failed.

A device that dies during a run (a served driver whose process is gone) fails the case it was
running and every case left, at once and without running them: their results say nothing of
the driver, and a dead service would only answer DEVICE_UNAVAILABLE to each. The report says
where it died (:attr:`Report.died`).
"""

from __future__ import annotations

import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from nnhal.conformance.cases import (
    BuiltRequest,
    Case,
    Expected,
    MalformedCase,
    build_model,
    build_request,
    to_signed_quant,
    with_unknown_output_dims,
)
from nnhal.conformance.faces import describe, level_through, through
from nnhal.hal.interfaces import IDevice, IPreparedModel, PreparedModelCallback
from nnhal.hal.types import (
    ErrorStatus,
    ExecutionPreference,
    MeasureTiming,
    OperandType,
    Priority,
)
from nnhal.hidl import ExecutionCallback
from nnhal.hidl import execute as execute_1_3
from nnhal.runtime.devices import feature_level_of, is_dead

MODES = ("general", "dynamic_shape", "quantization_coupling", "memory_domain", "fenced",
         "caching", "runtime", "partitioned", "capi")
PASSED, FAILED, SKIPPED, NOT_APPLICABLE = "passed", "failed", "skipped", "not_applicable"
#: Operations whose quant8 operands do not carry real values the usual way, so shifting them to
#: the signed type changes the result (hits flags, hashed bytes, an int32 pad value, a raw type
#: cast, an asymm-only kernel). A case is coupled only through its other operations.
UNCOUPLED_OPERATIONS = frozenset({"HASHTABLE_LOOKUP", "LSH_PROJECTION", "PAD_V2", "CAST",
                                  "QUANTIZED_16BIT_LSTM"})
#: How long the runner waits for any callback before calling the case hung.
CALLBACK_TIMEOUT_S = 60.0
#: Messages of cases that could not be loaded, or whose values cannot be built into a model
#: or request, start with these; the report lists such cases apart (Report.broken).
LOAD_ERROR, MALFORMED = "could not load: ", "malformed case: "
#: How many unloadable cases the summary lists (the JSON report has them all).
MAX_BROKEN_LINES = 20
#: The message of a case failed because the device died: the ones it was running start with
#: it, the ones left after it are exactly :data:`NOT_RUN_DEAD`.
DEVICE_DIED = "device unavailable: the device died"
NOT_RUN_DEAD = DEVICE_DIED + " before this case (not run)"
#: The message of a case skipped because its minSupportedVersion is above the device's level
#: starts with this.
NEEDS_LEVEL = "needs "
#: The message of a case skipped because it is of a level above HAL 1.3 and its model uses
#: what nnhal's signature table does not declare (:attr:`Case.not_implemented`) starts with
#: this, then the operation's name.
NOT_IMPLEMENTED = "not implemented yet: "
F16_TOL = 5 * 0.0009765625
F32_ATOL, F32_RTOL = 1e-5, 5 * 1.1920928955078125e-7


class CaseFailure(Exception):
    """A case failed; the message says where."""


class Unsupported(Exception):
    """The device does not support an operation of the case."""


class NotApplicable(Exception):
    """The mode does not apply to the case (e.g. no coupled quant8 operand)."""


class ExpectedFailureSeen(Exception):
    """An expectFailure case failed as it should; carries the status."""


#: The loop timeout of a case expected to pass, at least: the NDK's default.
FINITE_LOOP_TIMEOUT_NS = 2_000_000_000


@dataclass
class Options:
    #: The WHILE loop timeout of a case expected to fail (an endless loop); cases expected to
    #: pass get at least FINITE_LOOP_TIMEOUT_NS.
    loop_timeout_ns: int | None = 500_000_000
    #: Also run the async path in general mode.
    async_path: bool = True
    #: Mode runtime: also compile with plain create over every available device.
    runtime_create: bool = False
    #: The face every mode reaches the device through (:mod:`.faces`, ``--hal``); None: the
    #: device object as given.
    face: str | None = None


# ---- checking ---------------------------------------------------------------------------

def _uses_f16_tolerance(case: Case) -> bool:
    return bool(case.data["model"].get("isRelaxed")) or case.has_type("TENSOR_FLOAT16") \
        or case.has_type("FLOAT16")


def tolerance(t: OperandType, case: Case) -> tuple[float, float] | None:
    """(atol, rtol) for an output type; None means exact."""
    if t in (OperandType.TENSOR_FLOAT16, OperandType.FLOAT16):
        return F16_TOL, F16_TOL
    if t in (OperandType.TENSOR_FLOAT32, OperandType.FLOAT32):
        return (F16_TOL, F16_TOL) if _uses_f16_tolerance(case) else (F32_ATOL, F32_RTOL)
    if t in (OperandType.TENSOR_QUANT8_ASYMM, OperandType.TENSOR_QUANT8_ASYMM_SIGNED,
             OperandType.TENSOR_QUANT8_SYMM):
        return (3.0 if "mobilenet" in case.name else 1.0), 0.0
    if t in (OperandType.TENSOR_BOOL8, OperandType.BOOL):
        return None
    return 1.0, 0.0


def compare(case: Case, k: int, exp: Expected, actual: np.ndarray) -> None:
    if exp.ignored:
        return
    if list(actual.shape) != list(exp.dims) and actual.size != exp.values.size:
        raise CaseFailure(f"output {k}: shape {list(actual.shape)}, expected {exp.dims}")
    a = actual.reshape(-1)
    e = exp.values.reshape(-1)
    if a.size != e.size:
        raise CaseFailure(f"output {k}: {a.size} values, expected {e.size}")
    tol = tolerance(exp.type, case)
    if tol is None:
        bad = np.nonzero(a != e)[0]
    else:
        atol, rtol = tol
        a64, e64 = a.astype(np.float64), e.astype(np.float64)
        with np.errstate(invalid="ignore"):
            diff = np.abs(a64 - e64)
            bad = np.nonzero(~(diff <= atol + rtol * np.abs(e64)) & ~(np.isnan(a64) &
                                                                      np.isnan(e64)))[0]
    if bad.size:
        i = int(bad[0])
        raise CaseFailure(f"output {k}: {bad.size} of {a.size} values off; first at {i}: "
                          f"got {a[i]!r}, expected {e[i]!r}")


def check_multinomial(case: Case, built: BuiltRequest, actual: np.ndarray) -> None:
    """Per batch, each class's draw frequency must be within the tolerance of softmax(input)."""
    main = case.data["model"]["main"]
    logits_op = main["operands"][main["inputIndexes"][0]]
    logits = np.asarray(logits_op["data"], dtype=np.float64).reshape(logits_op["dimensions"])
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    tol = case.multinomial_tolerance
    for b in range(actual.shape[0]):
        counts = np.bincount(actual[b].astype(np.int64), minlength=p.shape[1])
        freq = counts / max(1, actual.shape[1])
        worst = float(np.max(np.abs(freq[:p.shape[1]] - p[b])))
        if worst > tol:
            raise CaseFailure(f"multinomial batch {b}: frequency off by {worst:.4f} > {tol}")


def check_outputs(case: Case, built: BuiltRequest, shapes: list[Any]) -> None:
    for k, exp in enumerate(built.outputs):
        dims = list(shapes[k].dimensions) if shapes and k < len(shapes) else exp.dims
        if exp.type.is_tensor and dims != list(exp.dims):
            if not exp.ignored:
                raise CaseFailure(f"output {k}: reported shape {dims}, expected {exp.dims}")
            continue
        actual = built.read_output(k, dims)
        if case.multinomial_tolerance > 0:
            check_multinomial(case, built, actual)
        else:
            compare(case, k, exp, actual)


# ---- running ------------------------------------------------------------------------------

def prepare(device: IDevice, case: Case, model_json: dict[str, Any],
            model_cache: Sequence[Any] = (), data_cache: Sequence[Any] = (),
            token: bytes = b"") -> IPreparedModel:
    """Check support, prepare (optionally saving to cache files) and check the callback."""
    model = build_model(model_json)
    status, supported = device.get_supported_operations(model)
    if status != ErrorStatus.NONE:
        raise ExpectedFailureSeen(f"getSupportedOperations: {status.name}") \
            if case.expect_failure else CaseFailure(f"getSupportedOperations: {status.name}")
    if not all(supported):
        raise Unsupported(", ".join(sorted({case.data["model"]["main"]["operations"][i]["type"]
                                            for i, s in enumerate(supported) if not s})))
    cb = PreparedModelCallback()
    launch = device.prepare_model(model, ExecutionPreference.FAST_SINGLE_ANSWER,
                                  Priority.MEDIUM, None, list(model_cache), list(data_cache),
                                  token, cb)
    status, prepared = cb.wait(CALLBACK_TIMEOUT_S)
    if cb.calls != 1:
        raise CaseFailure(f"prepare callback called {cb.calls} times")
    if launch != ErrorStatus.NONE and launch != status:
        raise CaseFailure(f"prepare launch status {launch.name} but callback {status.name}")
    if status != ErrorStatus.NONE or prepared is None:
        if case.expect_failure:
            raise ExpectedFailureSeen(f"prepareModel: {status.name}")
        raise CaseFailure(f"prepareModel failed: {status.name}")
    return prepared


def _execute_sync(pm: IPreparedModel, built: BuiltRequest, opts: Options,
                  measure: MeasureTiming) -> tuple[ErrorStatus, list[Any]]:
    status, shapes, _timing = pm.execute_synchronously(built.request, measure, None,
                                                       opts.loop_timeout_ns)
    return status, shapes


def _execute_async(pm: IPreparedModel, built: BuiltRequest, opts: Options,
                   measure: MeasureTiming) -> tuple[ErrorStatus, list[Any]]:
    cb = ExecutionCallback()
    launch = execute_1_3(pm, built.request, measure, None, opts.loop_timeout_ns, cb)
    status, shapes, _timing = cb.wait(CALLBACK_TIMEOUT_S)
    if cb.calls != 1:
        raise CaseFailure(f"execution callback called {cb.calls} times")
    if launch != ErrorStatus.NONE and launch != status:
        raise CaseFailure(f"launch status {launch.name} but callback {status.name}")
    return status, shapes


Executor = Callable[[IPreparedModel, BuiltRequest, Options, MeasureTiming],
                    tuple[ErrorStatus, list[Any]]]


def run_paths(case: Case, pm: IPreparedModel, model_json: dict[str, Any],
              paths: Iterable[tuple[str, Executor, MeasureTiming]], opts: Options) -> None:
    """Run the case through each execution path and check each result."""
    for label, fn, measure in paths:
        built = build_request(model_json)
        try:
            status, shapes = fn(pm, built, opts, measure)
            if case.expect_failure:
                if status == ErrorStatus.NONE:
                    raise CaseFailure(f"{label}: expected a failure, execution succeeded")
                continue
            if status != ErrorStatus.NONE:
                raise CaseFailure(f"{label}: execution failed with {status.name}")
            try:
                check_outputs(case, built, shapes)
            except CaseFailure as e:
                raise CaseFailure(f"{label}: {e}") from None
        finally:
            built.close()


# -- burst and reusable-execution paths (driver: nnhal/drivers/common/burst.py, execution.py)
def _execute_burst(pm: IPreparedModel, built: BuiltRequest, opts: Options,
                   measure: MeasureTiming) -> tuple[ErrorStatus, list[Any]]:
    status, burst = pm.configure_execution_burst()
    if status != ErrorStatus.NONE or burst is None:
        raise CaseFailure(f"configureExecutionBurst failed: {status.name}")
    holds = [burst.cache_memory(p) for p in built.request.pools]  # noqa: F841 - kept alive
    status, shapes, _timing = burst.execute(built.request, measure, None, opts.loop_timeout_ns)
    return status, shapes


def _execute_reusable(pm: IPreparedModel, built: BuiltRequest, opts: Options,
                      measure: MeasureTiming) -> tuple[ErrorStatus, list[Any]]:
    status, execution = pm.create_reusable_execution(built.request, measure,
                                                     opts.loop_timeout_ns)
    if status != ErrorStatus.NONE or execution is None:
        return status, []
    for _ in range(2):  # computed twice: a reused execution must give the same results
        status, shapes, _timing = execution.compute(None)
        if status != ErrorStatus.NONE:
            break
    return status, shapes


def general_paths(opts: Options) -> list[tuple[str, Executor, MeasureTiming]]:
    paths: list[tuple[str, Executor, MeasureTiming]] = [("sync", _execute_sync, MeasureTiming.NO)]
    if opts.async_path:
        paths.append(("async", _execute_async, MeasureTiming.YES))
    paths += [("burst", _execute_burst, MeasureTiming.YES),
              ("reusable", _execute_reusable, MeasureTiming.NO)]
    return paths


def run_general(device: IDevice, case: Case, opts: Options) -> str:
    m = case.data["model"]
    pm = prepare(device, case, m)
    paths = general_paths(opts)
    run_paths(case, pm, m, paths, opts)
    return "+".join(label for label, _fn, _measure in paths)


def run_dynamic_shape(device: IDevice, case: Case, opts: Options) -> str:
    m = case.data["model"]
    pm = prepare(device, case, with_unknown_output_dims(m))
    run_paths(case, pm, m, [("sync", _execute_sync, MeasureTiming.NO)], opts)
    if case.expect_failure:
        return "failed as expected"
    # One output buffer one element too small: OUTPUT_INSUFFICIENT_SIZE, full shape reported.
    main = m["main"]
    for k, idx in enumerate(main["outputIndexes"]):
        o = main["operands"][idx]
        if not o["dimensions"] or 0 in o["dimensions"] or \
                OperandType[o["type"]].is_scalar:
            continue
        built = build_request(m, shrink_output=k)
        try:
            status, shapes, _ = pm.execute_synchronously(built.request, MeasureTiming.NO, None,
                                                         opts.loop_timeout_ns)
        finally:
            built.close()
        if status != ErrorStatus.OUTPUT_INSUFFICIENT_SIZE:
            raise CaseFailure(f"output {k} one element short: status {status.name}, expected "
                              f"OUTPUT_INSUFFICIENT_SIZE")
        if len(shapes) != len(main["outputIndexes"]) or shapes[k].is_sufficient or \
                list(shapes[k].dimensions) != list(o["dimensions"]):
            raise CaseFailure(f"output {k} one element short: shapes reported {shapes}")
        break
    return "shapes + insufficient size"


def is_coupled(case: Case) -> bool:
    """As upstream selects them: a single-operation model, not expected to fail, whose
    operation (outside UNCOUPLED_OPERATIONS) reads a TENSOR_QUANT8_ASYMM operand."""
    m = case.data["model"]
    main = m["main"]
    if case.expect_failure or m["referenced"] or len(main["operations"]) != 1:
        return False
    op = main["operations"][0]
    return op["type"] not in UNCOUPLED_OPERATIONS and any(
        main["operands"][i]["type"] == "TENSOR_QUANT8_ASYMM" for i in op["inputs"])


def run_quantization_coupling(device: IDevice, case: Case, opts: Options) -> str:
    if not is_coupled(case):
        raise NotApplicable("no coupled TENSOR_QUANT8_ASYMM operand")
    outcomes = []
    variants = (("asymm", case.data["model"]), ("signed", to_signed_quant(case.data["model"])))
    for label, m in variants:
        try:
            pm = prepare(device, case, m)
            run_paths(case, pm, m, [("sync", _execute_sync, MeasureTiming.NO)], opts)
            outcomes.append((label, PASSED, ""))
        except (CaseFailure, ExpectedFailureSeen, Unsupported) as e:
            outcomes.append((label, type(e).__name__, str(e)))
    kinds = {o[1] for o in outcomes}
    if len(kinds) != 1:
        raise CaseFailure("asymm and signed differ: " +
                          "; ".join(f"{lb}: {k} {msg}" for lb, k, msg in outcomes))
    kind = kinds.pop()
    if kind == "Unsupported":
        raise Unsupported(outcomes[0][2])
    if kind == "CaseFailure":
        raise CaseFailure("; ".join(f"{lb}: {msg}" for lb, _, msg in outcomes))
    return "asymm and signed agree"


MODE_RUNNERS: dict[str, Callable[[IDevice, Case, Options], str]] = {
    "general": run_general,
    "dynamic_shape": run_dynamic_shape,
    "quantization_coupling": run_quantization_coupling,
}


def mode_runner(mode: str) -> Callable[[IDevice, Case, Options], str]:
    """The runner of a mode; modes beyond the basic three live in ``mode_<name>`` modules,
    each defining ``run(device, case, opts) -> str``."""
    fn = MODE_RUNNERS.get(mode)
    if fn is None:
        import importlib

        if mode not in MODES:
            raise KeyError(f"unknown mode {mode!r}")
        fn = importlib.import_module(f"nnhal.conformance.mode_{mode}").run
        MODE_RUNNERS[mode] = fn
    return fn


def run_case(device: IDevice, case: Case, mode: str, opts: Options) -> tuple[str, str]:
    """(result, message) of one case in one mode, ``device`` already reached through
    ``opts.face``; never raises."""
    own = feature_level_of(device)
    have = level_through(opts.face, own)
    if case.min_level is not None and case.min_level > have:
        through_face = "" if have is own else f" through --hal {opts.face} (itself at " \
                                              f"{own.describe()})"
        return SKIPPED, f"{NEEDS_LEVEL}{case.min_level.describe()}; the device is at " \
                        f"{have.describe()}{through_face}"
    if case.not_implemented:
        return SKIPPED, NOT_IMPLEMENTED + case.not_implemented
    if case.error:
        return FAILED, LOAD_ERROR + case.error
    if not case.expect_failure and opts.loop_timeout_ns is not None and \
            opts.loop_timeout_ns < FINITE_LOOP_TIMEOUT_NS:
        # The short timeout is for the loops meant never to end; a finite loop on a loaded
        # machine gets the NDK's default, so that it is not cut short.
        opts = replace(opts, loop_timeout_ns=FINITE_LOOP_TIMEOUT_NS)
    try:
        msg = mode_runner(mode)(device, case, opts)
        return PASSED, msg
    except Unsupported as e:
        return SKIPPED, f"unsupported: {e}"
    except NotApplicable as e:
        return NOT_APPLICABLE, str(e)
    except ExpectedFailureSeen as e:
        return PASSED, f"failed as expected: {e}"
    except CaseFailure as e:
        return FAILED, str(e)
    except MalformedCase as e:
        return FAILED, MALFORMED + (f"(case #{case.index}) " if case.index >= 0 else "") + str(e)
    except Exception as e:  # noqa: BLE001 - a runner or driver crash fails the case
        return FAILED, f"crash: {type(e).__name__}: {e}"


#: How mode ``partitioned`` starts the message of a case whose plan used both devices.
SPLIT_MESSAGE = "partitioned (split)"


# ---- reporting ----------------------------------------------------------------------------

@dataclass
class Report:
    modes: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))
    folders: dict[tuple[str, str], Counter] = field(default_factory=lambda: defaultdict(Counter))
    operations: dict[tuple[str, str], Counter] = field(
        default_factory=lambda: defaultdict(Counter))
    cases: list[dict[str, str]] = field(default_factory=list)
    #: Cases (or whole files) that could not be loaded or built: file, name, message. Each is
    #: also counted as failed in every mode.
    broken: list[dict[str, str]] = field(default_factory=list)
    seconds: float = 0.0
    #: Where the device died, once per run that saw it (a sharded run has one per shard):
    #: mode and case it was running, and how many case runs were left unrun.
    died: list[dict[str, Any]] = field(default_factory=list)
    #: The face the device was reached through (:mod:`.faces`); None: called as given.
    face: str | None = None
    _broken_seen: set[tuple[str, str, str]] = field(default_factory=set, repr=False)

    def _note_broken(self, case: Case, message: str) -> None:
        for prefix in (LOAD_ERROR, MALFORMED):
            if message.startswith(prefix):
                entry = {"file": case.file, "name": case.name,
                         "message": message[len(prefix):]}
                key = (case.file, case.name, entry["message"])
                if key not in self._broken_seen:  # once, not once per mode
                    self._broken_seen.add(key)
                    self.broken.append(entry)

    def add(self, case: Case, mode: str, result: str, message: str, seconds: float) -> None:
        self.modes[mode][result] += 1
        if result == FAILED:
            self._note_broken(case, message)
        self.folders[(mode, case.folder)][result] += 1
        for op in case.operations:
            self.operations[(mode, op)][result] += 1
        self.cases.append({"file": case.file, "name": case.name, "mode": mode,
                           "result": result, "message": message,
                           "seconds": round(seconds, 4)})

    def to_json(self) -> dict[str, Any]:
        def counts(c: Counter) -> dict[str, int]:
            return {k: int(c.get(k, 0)) for k in (PASSED, FAILED, SKIPPED, NOT_APPLICABLE)}

        return {
            "modes": {m: counts(c) for m, c in self.modes.items()},
            "folders": {f"{m}/{f}": counts(c) for (m, f), c in sorted(self.folders.items())},
            "operations": {f"{m}/{o}": counts(c) for (m, o), c in sorted(self.operations.items())},
            "hal": self.face,
            "hal_face": self.face_line(),
            "not_implemented": {m: dict(sorted(c.items()))
                                for m, c in self.not_implemented().items()},
            "seconds": round(self.seconds, 2),
            "broken": self.broken,
            "died": self.died,
            "cases": self.cases,
        }

    def face_line(self) -> str:
        """The face the run went through, for people."""
        if self.face is None:
            return "the device object called as given"
        return f"--hal {self.face}: {describe(self.face)}"

    def not_implemented(self) -> dict[str, Counter]:
        """Per mode, the case runs skipped as not implemented yet, counted per operation."""
        out: dict[str, Counter] = defaultdict(Counter)
        for k in self.cases:
            if k["result"] == SKIPPED and k["message"].startswith(NOT_IMPLEMENTED):
                op = k["message"][len(NOT_IMPLEMENTED):].split(maxsplit=1)[0].rstrip(":")
                out[k["mode"]][op] += 1
        return out

    def summary(self, show_ops: bool = True) -> str:
        lines = [f"face: {self.face_line()}"]
        missing = self.not_implemented()
        for mode, c in self.modes.items():
            extra = [f"{c[NOT_APPLICABLE]} not applicable"] if c[NOT_APPLICABLE] else []
            if missing.get(mode):
                extra.append(f"{sum(missing[mode].values())} not implemented yet")
            lines.append(f"mode {mode}: {c[PASSED]} passed, {c[FAILED]} failed, "
                         f"{c[SKIPPED]} skipped" + (f" ({', '.join(extra)})" if extra else ""))
            if mode == "partitioned":
                split = sum(1 for k in self.cases if k["mode"] == mode and
                            k["result"] == PASSED and k["message"].startswith(SPLIT_MESSAGE))
                lines.append(f"  split across both devices (plan): {split} of "
                             f"{c[PASSED]} passed")
            for (m, f), fc in sorted(self.folders.items()):
                if m == mode:
                    lines.append(f"  {f:<16} {fc[PASSED]:5d} passed {fc[FAILED]:4d} failed "
                                 f"{fc[SKIPPED]:4d} skipped")
            if show_ops:
                bad = [(o, oc) for (m, o), oc in sorted(self.operations.items())
                       if m == mode and (oc[FAILED] or oc[SKIPPED])]
                for o, oc in bad:
                    lines.append(f"  op {o:<30} {oc[PASSED]:5d} passed {oc[FAILED]:4d} failed "
                                 f"{oc[SKIPPED]:4d} skipped")
        above = Counter(k["message"] for k in self.cases
                        if k["result"] == SKIPPED and k["message"].startswith(NEEDS_LEVEL))
        if above:
            lines.append("skipped for their version (minSupportedVersion above the device's "
                         "feature level):")
            lines += [f"  {n} case run(s): {m}" for m, n in sorted(above.items())]
        if missing:
            lines.append("skipped as not implemented yet (cases above HAL 1.3 whose operation "
                         "or operand types nnhal's signature table does not declare):")
            total: Counter = Counter()
            for c in missing.values():
                total.update(c)
            lines += [f"  {op}: {n} case run(s)" for op, n in sorted(total.items())]
        if self.broken:
            lines.append(f"{len(self.broken)} case(s) could not be loaded or built (counted "
                         f"as failed):")
            for b in self.broken[:MAX_BROKEN_LINES]:
                lines.append(f"  {b['file']} {b['name']}: {b['message']}")
            if len(self.broken) > MAX_BROKEN_LINES:
                lines.append(f"  ... and {len(self.broken) - MAX_BROKEN_LINES} more "
                             f"(all in the --json report)")
        for d in self.died:
            lines.append(f"the device died during [{d['mode']}] {d['case']} (a served "
                         f"driver: its service is gone): the {d['not_run']} case run(s) left "
                         f"failed as device unavailable, without running")
        lines.append(f"{sum(c[PASSED] for c in self.modes.values())} passed, "
                     f"{sum(c[FAILED] for c in self.modes.values())} failed, "
                     f"{sum(c[SKIPPED] for c in self.modes.values())} skipped "
                     f"in {self.seconds:.1f}s")
        return "\n".join(lines)


class Progress:
    """A rich progress bar on a terminal (cases done, failures, time left, the current case);
    silent otherwise, so a pipe or a log gets the report and nothing else."""

    def __init__(self, total: int, stream: Any = sys.stderr):
        self.enabled = hasattr(stream, "isatty") and stream.isatty()
        self.done = 0
        self.failed = 0
        self._bar: Any = None
        if not self.enabled:
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            TextColumn,
            TimeRemainingColumn,
        )
        from rich.progress import Progress as RichProgress

        self._bar = RichProgress(
            BarColumn(), MofNCompleteColumn(), TextColumn("failed {task.fields[failed]}"),
            TimeRemainingColumn(), TextColumn("{task.fields[label]}", markup=False),
            console=Console(file=stream))
        self._task = self._bar.add_task("cases", total=max(total, 1), failed=0, label="")
        self._bar.start()

    def step(self, result: str, label: str) -> None:
        self.done += 1
        self.failed += result == FAILED
        if self._bar is not None:
            self._bar.update(self._task, advance=1, failed=self.failed, label=label[:40])

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


def run(device: IDevice, cases: list[Case], modes: Iterable[str], opts: Options | None = None,
        progress: bool = True, on_result: Callable[[Case, str, str, str], None] | None = None
        ) -> Report:
    opts = opts or Options()
    modes = list(modes)
    report = Report(face=opts.face)
    # Every mode drives the device through the face; whether it died is asked of the device
    # itself (a face need not pass on a served driver's ``alive``).
    faced = through(opts.face, device)
    bar = Progress(len(cases) * len(modes)) if progress else None
    start = time.monotonic()
    died: dict[str, Any] | None = None
    try:
        for mode in modes:
            for case in cases:
                t0 = time.monotonic()
                if died is not None:
                    result, message = FAILED, NOT_RUN_DEAD
                    died["not_run"] += 1
                else:
                    result, message = run_case(faced, case, mode, opts)
                    if is_dead(device):
                        died = {"mode": mode, "case": case.name, "not_run": 0}
                        report.died.append(died)
                        # Only a case that fully passed is a verdict; any other outcome
                        # (an expected failure seen included) may be the death's doing.
                        if result != PASSED or message.startswith("failed as expected"):
                            result, message = FAILED, f"{DEVICE_DIED} during this case: " \
                                                      f"{message}"
                report.add(case, mode, result, message, time.monotonic() - t0)
                if bar:
                    bar.step(result, f"{mode} {case.name}")
                if on_result:
                    on_result(case, mode, result, message)
    finally:  # an interrupted run leaves the terminal clean
        if bar:
            bar.close()
    report.seconds = time.monotonic() - start
    return report
