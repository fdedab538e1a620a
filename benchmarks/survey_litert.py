"""Which conformance cases export to .tflite and run right in ai-edge-litert (XNNPACK): the
survey behind nnhal.drivers.litert.support (issue 13). Prints figures; asserts nothing.

Every conformance case not expected to fail is run three ways: as given ("general"), with its
output dimensions unknown ("dynamic", as the dynamic_shape mode builds it), and, when the
quantization_coupling mode couples it, turned to TENSOR_QUANT8_ASYMM_SIGNED ("signed"). Each
run exports with write_tflite, builds an Interpreter (2 threads), resizes inputs when the
exported shape differs, invokes and compares every output with the conformance runner's own
tolerances. A litert abort must not end the survey: cases run in worker processes that
announce each case before running it, so a worker that dies or hangs names the case that did
it, and a fresh worker carries on with the rest.

Each run is classified: passed, export_refused, invalid (analysis rejects it), litert_build,
litert_allocate, litert_invoke, wrong (max error), crash (process died), hang. When
nnhal.drivers.litert.support is importable, the survey also records whether it claims the
model, and prints every claimed run that did not pass (the full cross-check).

    python benchmarks/survey_litert.py [--specs DIR] [--filter GLOB] [--jobs N]
           [--out /tmp/litert_survey.json] [--timeout S]
"""

from __future__ import annotations

import argparse
import json
import os
import select
import subprocess
import sys
import tempfile
import time
import zlib
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as a script: make the worktree importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nnhal.conformance.cases import (  # noqa: E402
    Case,
    Expected,
    build_model,
    default_specs_dir,
    iter_cases,
    to_signed_quant,
    values_array,
    with_unknown_output_dims,
)
from nnhal.conformance.runner import (  # noqa: E402
    CaseFailure,
    check_multinomial,
    compare,
    is_coupled,
    tolerance,
)
from nnhal.hal.types import OperandType  # noqa: E402

VARIANTS = ("general", "dynamic", "signed", "random")
#: Operations whose int32 tensor inputs are values (not indices, axes or shapes): the random
#: variant draws those too.
_INT_VALUE_OPS = {"ADD", "SUB", "MUL", "DIV", "ABS", "NEG", "MAXIMUM", "MINIMUM"}


# ---- one run (in a worker) ----------------------------------------------------------------

def _expected(main: dict[str, Any]) -> list[Expected]:
    out = []
    for idx in main["outputIndexes"]:
        o = main["operands"][idx]
        t = OperandType[o["type"]]
        vals = values_array(t, o["data"], o["dimensions"])
        out.append(Expected(t, list(o["dimensions"]), vals.view(np.bool_) if
                            t == OperandType.TENSOR_BOOL8 else vals, bool(o.get("isIgnored")),
                            float(o["scale"]), int(o["zeroPoint"])))
    return out


def _max_error(exp: Expected, actual: np.ndarray) -> float:
    a = actual.reshape(-1).astype(np.float64)
    e = exp.values.reshape(-1).astype(np.float64)
    if a.size != e.size or a.size == 0:
        return float("nan")
    with np.errstate(invalid="ignore"):
        d = np.abs(a - e)
        d[np.isnan(a) & np.isnan(e)] = 0
    return float(np.nanmax(d)) if not np.all(np.isnan(d)) else float("nan")


#: Largest relative difference the random variant still calls float noise (summation order).
NOISE_RTOL = 1e-4


def _float_noise(expected: list[Expected], actuals: list[np.ndarray]) -> bool:
    """Whether every float output agrees up to NOISE_RTOL (equal infinities agree) and every
    other output agrees exactly as the runner would have it."""
    for exp, act in zip(expected, actuals):
        if exp.ignored:
            continue
        a = act.reshape(-1).astype(np.float64)
        e = exp.values.reshape(-1).astype(np.float64)
        if a.size != e.size:
            return False
        if exp.type.dtype.kind != "f":
            if np.any(np.abs(a - e) > 1):
                return False
            continue
        same = (a == e) | (np.isnan(a) & np.isnan(e))
        with np.errstate(invalid="ignore", divide="ignore"):
            rel = np.abs(a - e) / np.maximum(np.abs(e), 1e-3)
        if np.any(~same & ~(rel <= NOISE_RTOL)):
            return False
    return True


def _claim(model: Any) -> str | None:
    """support.refusal of the analysed model; '' when the module is absent."""
    try:
        from nnhal.analysis import analyse
        from nnhal.drivers.litert import support
    except ImportError:
        return "(support module absent)"
    try:
        return support.refusal(analyse(model, own_constants=False))
    except Exception as e:  # noqa: BLE001 - the survey records whatever happens
        return f"(support raised {type(e).__name__}: {e})"


def _random_inputs(case: Case, seed: int) -> list[np.ndarray] | None:
    """The case's inputs redrawn at random (negative values included): floats and quantized
    values always, int32 only where an arithmetic operation reads them. None when an input
    is omitted."""
    main = case.data["model"]["main"]
    int_values = {i for op in main["operations"] if op["type"] in _INT_VALUE_OPS
                  for i in op["inputs"]}
    rng = np.random.default_rng(seed)
    out = []
    for idx in main["inputIndexes"]:
        o = main["operands"][idx]
        if not o["data"]:
            return None
        t = OperandType[o["type"]]
        v = values_array(t, o["data"], o["dimensions"]).reshape(o["dimensions"])
        if t.dtype.kind == "f":
            a = 1.5 * max(1.0, float(np.max(np.abs(v.astype(np.float64)))) if v.size else 1.0)
            v = rng.uniform(-a, a, v.shape).astype(v.dtype)
        elif t in (OperandType.TENSOR_QUANT8_ASYMM, OperandType.TENSOR_QUANT8_ASYMM_SIGNED,
                   OperandType.TENSOR_QUANT8_SYMM, OperandType.TENSOR_QUANT16_ASYMM,
                   OperandType.TENSOR_QUANT16_SYMM):
            info = np.iinfo(v.dtype)
            v = rng.integers(info.min, int(info.max) + 1, v.shape).astype(v.dtype)
        elif t == OperandType.TENSOR_INT32 and idx in int_values:
            a = 2 * max(4, int(np.max(np.abs(v))) if v.size else 4)
            v = rng.integers(-a, a + 1, v.shape).astype(v.dtype)
        elif t == OperandType.TENSOR_BOOL8:
            v = rng.integers(0, 2, v.shape).astype(v.dtype)
        out.append(v)
    return out


_REFERENCE: list[Any] = []


def _reference_outputs(case: Case, inputs: list[np.ndarray]) -> list[Expected] | str:
    """The reference driver's outputs for these inputs, as Expected; a string when it fails."""
    from nnhal.drivers.reference import ReferenceDevice
    from nnhal.hal.builder import RequestBuilder
    from nnhal.hal.interfaces import PreparedModelCallback
    from nnhal.hal.types import ErrorStatus, ExecutionPreference, MeasureTiming, Priority

    if not _REFERENCE:
        _REFERENCE.append(ReferenceDevice())
    m = case.data["model"]
    cb = PreparedModelCallback()
    _REFERENCE[0].prepare_model(build_model(m), ExecutionPreference.FAST_SINGLE_ANSWER,
                                Priority.MEDIUM, None, [], [], b"", cb)
    status, pm = cb.wait(60)
    if status != ErrorStatus.NONE:
        return f"reference prepare: {status.name}"
    expected = _expected(m["main"])
    req = RequestBuilder(inputs, [max(1, e.values.nbytes) for e in expected])
    try:
        status, shapes, _ = pm.execute_synchronously(req.request, MeasureTiming.NO, None,
                                                     500_000_000)
        if status != ErrorStatus.NONE:
            return f"reference execute: {status.name}"
        out = []
        for k, e in enumerate(expected):
            dims = list(shapes[k].dimensions) if e.type.is_tensor else []
            dt = np.dtype(np.uint8) if e.type == OperandType.TENSOR_BOOL8 else e.type.dtype
            vals = req.output(k, dt, dims)
            out.append(Expected(e.type, dims, vals.view(np.bool_) if dt == np.uint8 and
                                e.type == OperandType.TENSOR_BOOL8 else vals, e.ignored,
                                e.scale, e.zero_point))
        return out
    finally:
        req.close()


def run_one(case: Case, variant: str, guard_division: bool = False) -> dict[str, Any]:
    """Export, run and check one case in one variant; a dict saying what happened. A run
    that fails to invoke where the model divides by a run-time int32 divisor is made again on
    the guarded export (``guard_division``), as the LiteRT driver makes it."""
    from ai_edge_litert.interpreter import Interpreter

    from nnhal.errors import InvalidModelError, UnsupportedModelError
    from nnhal.tflite import write_tflite

    m = case.data["model"]
    if variant == "signed":
        m = to_signed_quant(m)
    model_json = with_unknown_output_dims(m) if variant == "dynamic" else m
    res: dict[str, Any] = {}
    model = build_model(model_json)
    try:
        blob = write_tflite(model, guard_division=guard_division)
    except UnsupportedModelError as e:
        return {**res, "status": "export_refused", "reason": "; ".join(e.items)}
    except InvalidModelError as e:
        return {**res, "status": "invalid", "reason": str(e)}
    expected: list[Expected] | None = None
    feeds_override: list[np.ndarray] | None = None
    if variant == "random":
        feeds_override = _random_inputs(case, zlib.crc32(case.name.encode()))
        if feeds_override is None:
            return {**res, "status": "not_drawn", "reason": "an input is omitted"}
        ref = _reference_outputs(case, feeds_override)
        if isinstance(ref, str):
            return {**res, "status": "not_drawn", "reason": ref}
        expected = ref
    stage = "litert_build"
    try:
        interp = Interpreter(model_content=blob, num_threads=2)
        stage = "litert_allocate"
        details = interp.get_input_details()
        by_name = {d["name"]: d for d in details}
        main = m["main"]
        feeds = []
        resized = False
        for k, idx in enumerate(main["inputIndexes"]):
            o = main["operands"][idx]
            d = by_name.get(f"input_{k}")
            if d is None:
                raise RuntimeError(f"input_{k} not among the interpreter's inputs")
            t = OperandType[o["type"]]
            if feeds_override is not None:
                arr = feeds_override[k].astype(d["dtype"])
            elif not o["data"]:
                res["omitted_input"] = True
                arr = np.zeros(o["dimensions"], dtype=d["dtype"])
            else:
                arr = values_array(t, o["data"], o["dimensions"]).reshape(o["dimensions"])
                arr = arr.astype(d["dtype"])
            if list(d["shape"]) != list(arr.shape):
                interp.resize_tensor_input(d["index"], list(arr.shape), strict=False)
                resized = True
            feeds.append((d["index"], arr))
        res["resized"] = resized
        interp.allocate_tensors()
        stage = "litert_invoke"
        for i, arr in feeds:
            interp.set_tensor(i, arr)
        interp.invoke()
        outs = {d["name"]: d for d in interp.get_output_details()}
        actuals = [interp.get_tensor(outs[f"output_{k}"]["index"])
                   for k in range(len(main["outputIndexes"]))]
    except Exception as e:  # noqa: BLE001 - litert raises ValueError / RuntimeError
        if stage == "litert_invoke" and not guard_division and _divides(model):
            return run_one(case, variant, guard_division=True)
        return {**res, "status": stage, "reason": f"{type(e).__name__}: {e}".splitlines()[0]}
    errs = []
    expected = expected if expected is not None else _expected(main)
    try:
        for k, exp in enumerate(expected):
            actual = actuals[k]
            if exp.ignored:
                continue
            if exp.type.is_tensor and list(actual.shape) != list(exp.dims):
                raise CaseFailure(f"output {k}: shape {list(actual.shape)}, expected {exp.dims}")
            errs.append(_max_error(exp, actual))
            if case.multinomial_tolerance > 0:
                check_multinomial(case, None, actual)  # type: ignore[arg-type]
            else:
                compare(case, k, exp, actual)
    except CaseFailure as e:
        tol = [tolerance(x.type, case) for x in expected]
        status = "wrong"
        if variant == "random" and _float_noise(expected, actuals):
            # Random inputs reach magnitudes the cases never do: float32 results then differ
            # from the reference in summation order only (and inf - inf is not "off").
            status = "float_noise"
        return {**res, "status": status, "reason": str(e), "max_error": errs,
                "tolerance": tol}
    return {**res, "status": "passed", "max_error": errs}


def _divides(model: Any) -> bool:
    try:
        from nnhal.analysis import analyse
        from nnhal.drivers.litert.support import divides
    except ImportError:
        return False
    return divides(analyse(model, own_constants=False))


def _describe(case: Case) -> dict[str, Any]:
    m = case.data["model"]
    main = m["main"]
    ops = []
    for op in main["operations"]:
        ops.append({"type": op["type"],
                    "in": [main["operands"][i]["type"] for i in op["inputs"]],
                    "out": [main["operands"][i]["type"] for i in op["outputs"]]})
    return {"ops": case.operations, "main_ops": ops, "relaxed": bool(m.get("isRelaxed")),
            "referenced": len(m["referenced"])}


def worker(specs: Path, jobs: list[list[Any]]) -> None:
    """Runs jobs [file, index, variant, id]; prints a 'start' line before each run and a
    result line after it (JSON lines on stdout)."""
    by_file: dict[str, dict[int, Case]] = {}
    out = sys.stdout
    for file, index, variant, jid in jobs:
        if file not in by_file:
            f = specs.parent / file
            by_file[file] = {c.index: c for c in iter_cases(f)}
        case = by_file[file][index]
        try:
            m = case.data["model"]
            m = to_signed_quant(m) if variant == "signed" else m
            claim = _claim(build_model(with_unknown_output_dims(m) if variant == "dynamic"
                                       else m))
        except Exception as e:  # noqa: BLE001
            claim = f"(claim failed: {type(e).__name__}: {e})"
        # The claim first: a case that then takes the worker down keeps it.
        out.write(json.dumps({"start": jid, "claim": claim}) + "\n")
        out.flush()
        try:
            r = run_one(case, variant)
        except Exception as e:  # noqa: BLE001
            r = {"status": "survey_error", "reason": f"{type(e).__name__}: {e}"}
        out.write(json.dumps({"done": jid, "result": r}, default=float) + "\n")
        out.flush()


# ---- the parent ---------------------------------------------------------------------------

def _spawn(specs: Path, jobs: list[list[Any]], err: Any) -> subprocess.Popen[bytes]:
    p = subprocess.Popen([sys.executable, __file__, "--worker", "--specs", str(specs)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, bufsize=0)
    assert p.stdin is not None
    p.stdin.write(json.dumps(jobs).encode())
    p.stdin.close()
    return p


class _Slot:
    def __init__(self, specs: Path, jobs: list[list[Any]], timeout: float) -> None:
        self.specs, self.jobs, self.timeout = specs, list(jobs), timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.err = tempfile.TemporaryFile()
        self.current: int | None = None
        self.since = time.monotonic()
        self.buf = ""

    def ensure(self) -> None:
        if self.proc is None and self.jobs:
            self.err.seek(0)
            self.err.truncate()
            self.proc = _spawn(self.specs, self.jobs, self.err)
            self.current, self.since, self.buf = None, time.monotonic(), ""


def survey(specs: Path, pattern: str | None, n_jobs: int, timeout: float,
           with_random: bool = False) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    jobs: list[list[Any]] = []
    for case in iter_cases(specs, pattern):
        if case.broken or case.expect_failure:
            continue
        base = {"file": case.file, "folder": case.folder, "name": case.name,
                **_describe(case)}
        for variant in VARIANTS:
            if variant == "signed" and not is_coupled(case):
                continue
            if variant == "random" and (not with_random or case.multinomial_tolerance):
                continue
            jid = len(records)
            records.append({**base, "variant": variant})
            jobs.append([case.file, case.index, variant, jid])
    slots = [_Slot(specs, jobs[k::n_jobs], timeout) for k in range(n_jobs)]
    done = 0
    t0 = time.monotonic()
    while any(s.jobs for s in slots):
        for s in slots:
            s.ensure()
        live = [s for s in slots if s.proc is not None]
        ready, _, _ = select.select([s.proc.stdout for s in live], [], [], 1.0)  # type: ignore
        for s in live:
            assert s.proc is not None and s.proc.stdout is not None
            if s.proc.stdout in ready:
                chunk = os.read(s.proc.stdout.fileno(), 1 << 16).decode()
                if chunk:
                    s.buf += chunk
                    while "\n" in s.buf:
                        line, s.buf = s.buf.split("\n", 1)
                        msg = json.loads(line)
                        if "start" in msg:
                            s.current, s.since = msg["start"], time.monotonic()
                            records[s.current]["claim"] = msg["claim"]
                            continue
                        records[msg["done"]].update(msg["result"])
                        s.jobs = [j for j in s.jobs if j[3] != msg["done"]]
                        s.current = None
                        done += 1
                        if done % 500 == 0:
                            print(f"  {done}/{len(records)} runs, "
                                  f"{time.monotonic() - t0:.0f} s", file=sys.stderr)
                    continue
                # EOF: the worker ended; if mid-case, that case crashed it.
                rc = s.proc.wait()
                s.err.seek(0)
                err = [x for x in s.err.read().decode(errors="replace").splitlines()
                       if x.strip() and not x.startswith("INFO:")]
                if s.current is not None:
                    records[s.current].update(
                        status="crash", reason=f"worker exit {rc}: "
                        f"{err[-1] if err else ''}"[:300])
                    s.jobs = [j for j in s.jobs if j[3] != s.current]
                    done += 1
                s.proc = None
            elif s.current is not None and time.monotonic() - s.since > s.timeout:
                s.proc.kill()
                s.proc.wait()
                records[s.current].update(status="hang", reason=f"no result in {s.timeout} s")
                s.jobs = [j for j in s.jobs if j[3] != s.current]
                done += 1
                s.proc = None
    return records


def _fmt(c: Counter[str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in c.most_common())


def report(records: list[dict[str, Any]]) -> None:
    def table(title: str, key: Any) -> None:
        print(f"\n== {title}")
        groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in records:
            for k in key(r):
                groups[k].append(r)
        print(f"{'':28} {'runs':>6} {'passed':>6} {'share':>6}  failures by kind")
        for k in sorted(groups):
            rs = groups[k]
            ok = sum(r.get("status") == "passed" for r in rs)
            kinds = Counter(r.get("status", "?") for r in rs if r.get("status") != "passed")
            print(f"{k:28} {len(rs):6} {ok:6} {100 * ok / len(rs):5.1f}%  {_fmt(kinds)}")

    for variant in VARIANTS:
        vr = [r for r in records if r["variant"] == variant]
        if not vr:
            continue
        ok = sum(r.get("status") == "passed" for r in vr)
        print(f"\n{variant}: {len(vr)} runs, {ok} passed, "
              f"{_fmt(Counter(r.get('status', '?') for r in vr))}")
    table("per HAL version (all variants)", lambda r: [r["folder"]])
    table("per HAL version, general", lambda r: [r["folder"]] if r["variant"] == "general"
          else [])
    table("per operation (a case counts for each of its operations)", lambda r: r["ops"])
    print("\n== failure reasons per operation (single-operation cases, reasons shortened)")
    reasons: dict[str, Counter[str]] = defaultdict(Counter)
    for r in records:
        st = r.get("status")
        if st == "passed" or len(r["ops"]) != 1:
            continue
        why = (r.get("reason") or "")
        why = why.split(": ", 1)[-1] if st == "export_refused" else why
        reasons[r["ops"][0]][f"{st}: {why[:110]}"] += 1
    for op in sorted(reasons):
        print(op)
        for why, n in reasons[op].most_common(8):
            print(f"   {n:4}  {why}")
    claimed = [r for r in records if r.get("claim") is None]
    if any("claim" in r and not str(r.get("claim")).startswith("(support module")
           for r in records):
        bad = [r for r in claimed if r.get("status") not in ("passed", "float_noise",
                                                               "not_drawn")]
        noise = [r for r in claimed if r.get("status") == "float_noise"]
        lost = [r for r in records if r.get("claim") is not None
                and r.get("status") == "passed"]
        print(f"\n== cross-check of support.refusal: {len(claimed)} runs claimed, "
              f"{len(bad)} of them did not pass; {len(lost)} passing runs refused; "
              f"{len(noise)} random runs claimed off by float noise only (rel <= "
              f"{NOISE_RTOL}: summation order, equal infinities)")
        lost_by = Counter(str(r.get("claim")).split(":", 1)[0].split(" ", 1)[-1]
                          for r in lost)
        print(f"   passing runs refused, by refused operation: {_fmt(lost_by)}")
        for r in bad[:60]:
            print(f"   CLAIMED BUT {r.get('status')}: {r['folder']}/{r['name']} "
                  f"[{r['variant']}] {str(r.get('reason'))[:120]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--specs", type=Path, default=None)
    ap.add_argument("--filter", default=None)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=30.0)
    ap.add_argument("--out", default="/tmp/litert_survey.json")
    ap.add_argument("--random", action="store_true",
                    help="also run each case on random inputs (negatives included) against "
                    "the reference driver")
    ap.add_argument("--report-only", action="store_true", help="print the report of --out")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    specs = a.specs or default_specs_dir()
    if a.worker:
        worker(Path(specs), json.load(sys.stdin))
        return 0
    if a.report_only:
        report(json.loads(Path(a.out).read_text()))
        return 0
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    t0 = time.monotonic()
    records = survey(Path(specs), a.filter, a.jobs, a.timeout, a.random)
    Path(a.out).write_text(json.dumps(records, default=float))
    print(f"{len(records)} runs in {time.monotonic() - t0:.0f} s; raw results in {a.out}")
    report(records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
