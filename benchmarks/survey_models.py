"""Which real .tflite models ai-edge-litert runs, which nnhal imports, and which nnhal runs
with litert's outputs (issue 28's survey). Prints figures; asserts nothing.

    python benchmarks/survey_models.py FOLDER_OR_FILE... [--jobs N] [--timeout S]
           [--device NAME] [--json OUT] [--steps N]

Every .tflite under the folders given (recursively) is handled in a child process of its own
with a time limit, so a model that crashes or hangs either engine is recorded as such and the
survey goes on. In the child:

1. ``nnhal.tflite.read_tflite``: imported, or the refusal (the refused operators named).
2. ai-edge-litert (default Interpreter, XNNPACK delegate, 1 thread) builds, allocates and
   invokes on random inputs of each input's type and shape (an unknown dimension takes the
   size TFLite's ``shape`` gives it, else 1760 or 16000 samples, the first that litert runs
   (batch 1); floats uniform in [-1, 1], 8-bit integers over their
   whole range, int16 within +-1000, other integers in [1, 3], bools at random). A model
   with TFLite resource variables or recurrent state runs ``--steps`` invocations (default
   3) with fresh inputs each, so carried state is compared too. Its result is printed
   before nnhal runs, so a crash in nnhal keeps it.
3. ``nnhal.Session(path)`` (the runtime over every available device, the default; or
   ``--device NAME``) runs the same inputs; its outputs are matched to litert's by name and
   compared with the agreement tests' tolerance (tests/tflite/runner.py): float outputs
   within 1e-4 of litert's range over that output (1e-4 absolute when the range is 0),
   integer and quantized outputs within one step, bools exactly. XNNPACK's float kernels
   round differently from TFLite's own, so a model outside the tolerance against the
   default interpreter is compared again against litert's builtin kernels without the
   delegate and then its reference kernels; it matches when one of them agrees, and the
   report says which.

Each model gets one line: package (the first folder below the argument, or the argument
itself), file, size, litert result, nnhal result, and the largest error as a multiple of
the tolerance (``x0.02``) or the refusal reason. Then totals and the nnhal failures grouped
by cause. ``--json`` writes every record.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

#: TFLite operators that keep state between invocations: such a model runs several steps.
STATEFUL_OPS = {"VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE", "CALL_ONCE",
                "UNIDIRECTIONAL_SEQUENCE_LSTM", "UNIDIRECTIONAL_SEQUENCE_RNN",
                "BIDIRECTIONAL_SEQUENCE_LSTM", "BIDIRECTIONAL_SEQUENCE_RNN", "SVDF"}
FLOAT_RTOL = 1e-4
#: Sizes tried for a dimension the file leaves unknown (not the batch), in turn until litert
#: runs: the file's placeholder, then sizes an audio front end accepts (openWakeWord's
#: melspectrogram needs more than one 400-sample window).
UNKNOWN_SIZES: tuple[int | None, ...] = (None, 1760, 16000)


# ---- the child: one model --------------------------------------------------------------------

def _emit(**kw: Any) -> None:
    sys.stdout.write(json.dumps(kw, default=str) + "\n")
    sys.stdout.flush()


def _short(e: BaseException, n: int = 400) -> str:
    text = " ".join(f"{type(e).__name__}: {e}".split())
    return text[:n]


def _random(dtype: np.dtype, shape: list[int], rng: np.random.Generator) -> np.ndarray:
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return rng.uniform(-1, 1, shape).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(dtype)
    if dtype.kind == "c":
        return (rng.uniform(-1, 1, shape) + 1j * rng.uniform(-1, 1, shape)).astype(dtype)
    info = np.iinfo(dtype)
    if info.bits == 8:
        lo, hi = int(info.min), int(info.max)
    elif info.bits == 16:
        lo, hi = max(int(info.min), -1000), 1000
    else:  # sizes, indices, divisors: small and never 0 (TFLite fails a division by 0)
        lo, hi = 1, 3
    return rng.integers(lo, hi + 1, shape).astype(dtype)


def _litert_run(data: bytes, feeds: list[list[np.ndarray]] | None, resolver: Any,
                seed: int, steps: int, unknown: int | None = None
                ) -> tuple[list[list[np.ndarray]], list[dict[str, Any]],
                           list[list[np.ndarray]], list[str]]:
    """Build, allocate and invoke ``steps`` times; (feeds, input details, outputs per step,
    output names). Draws the feeds when none are given: an unknown dimension gets the file's
    placeholder size, or ``unknown`` (the batch dimension stays 1)."""
    from ai_edge_litert.interpreter import Interpreter

    kw = {"experimental_op_resolver_type": resolver} if resolver is not None else {}
    it = Interpreter(model_content=data, num_threads=1, **kw)
    details = it.get_input_details()
    for k, d in enumerate(details):
        sig = list(d.get("shape_signature", d["shape"]))
        if feeds is not None:
            if list(feeds[0][k].shape) != list(d["shape"]):
                it.resize_tensor_input(d["index"], list(feeds[0][k].shape), strict=False)
        elif any(s < 0 for s in sig):
            shape = [int(s) if s >= 0 else 1 if (j == 0 or unknown is None) and x <= 1
                     else int(x) if unknown is None else unknown
                     for j, (s, x) in enumerate(zip(sig, d["shape"]))]
            it.resize_tensor_input(d["index"], [max(1, s) for s in shape], strict=False)
    it.allocate_tensors()
    details = it.get_input_details()
    if feeds is None:
        rng = np.random.default_rng(seed)
        feeds = [[_random(d["dtype"], list(d["shape"]), rng) for d in details]
                 for _ in range(steps)]
    out_details = it.get_output_details()
    outs = []
    for step in feeds:
        for d, a in zip(details, step):
            it.set_tensor(d["index"], a)
        it.invoke()
        outs.append([np.array(it.get_tensor(d["index"])) for d in out_details])
    return feeds, details, outs, [d["name"] for d in out_details]


def _tolerance(expected: np.ndarray) -> float:
    if expected.dtype.kind == "f":
        finite = expected[np.isfinite(expected)]
        rng = float(finite.max() - finite.min()) if finite.size else 0.0
        return FLOAT_RTOL * (rng if rng > 0 else 1.0)
    if expected.dtype.kind == "b":
        return 0.0
    return 1.0


def _compare(got: list[list[np.ndarray]], want: list[list[np.ndarray]], names: list[str]
             ) -> dict[str, Any]:
    """The worst output over every step: its name, step, max abs error, tolerance, ratio."""
    worst: dict[str, Any] = {"ratio": 0.0, "abs": 0.0, "output": None, "step": 0}
    for s, (gs, ws) in enumerate(zip(got, want)):
        for name, g, w in zip(names, gs, ws):
            if g.shape != w.shape:
                return {"ratio": float("inf"), "abs": float("inf"), "output": name, "step": s,
                        "why": f"shape {list(g.shape)}, litert {list(w.shape)}"}
            if w.size == 0:
                continue
            a, b = g.astype(np.float64), w.astype(np.float64)
            with np.errstate(invalid="ignore"):
                d = np.abs(a - b)
            same = (a == b) | (np.isnan(a) & np.isnan(b))
            d[same] = 0.0
            d[np.isnan(d)] = np.inf
            err = float(d.max())
            tol = _tolerance(w)
            ratio = err / tol if tol > 0 else (0.0 if err == 0 else float("inf"))
            if ratio > worst["ratio"] or worst["output"] is None:
                k = int(np.argmax(d))
                worst = {"ratio": ratio, "abs": err, "tol": tol, "output": name, "step": s,
                         "at": [int(x) for x in np.unravel_index(k, w.shape)],
                         "got": float(a.reshape(-1)[k]), "want": float(b.reshape(-1)[k]),
                         "dtype": str(w.dtype)}
    return worst


def child(path: str, steps: int, device: str | None, seed: int, also_reference: bool
          ) -> None:
    """Prints JSON lines: 'import', 'litert', 'nnhal' (each as soon as it is known)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    data = Path(path).read_bytes()
    import nnhal
    from nnhal.errors import UnsupportedModelError
    from nnhal.tflite import read_tflite

    stateful = False
    imported = None
    try:
        imported = read_tflite(data)
        stateful = bool(imported.state)
        _emit(phase="import", ok=True, ops=len(imported.model.main.operations),
              state=len(imported.state), nnhal=nnhal.__file__)
    except UnsupportedModelError as e:
        def names(items: list[str]) -> list[str]:
            return sorted({i.split(":", 1)[0].split(" ", 1)[-1] for i in items})

        # Every operator refused, and those refused for themselves (not only downstream).
        _emit(phase="import", ok=False, kind="refused", refused_ops=names(e.items),
              root_ops=names([i for i in e.items if "from a refused operator too" not in i]),
              reason=" ".join(str(e).split())[:3000])
    except Exception as e:  # noqa: BLE001 - the survey records whatever happens
        _emit(phase="import", ok=False, kind=type(e).__name__, reason=_short(e, 600))

    # litert, default interpreter
    from ai_edge_litert.interpreter import Interpreter
    try:
        ops = {o["op_name"] for o in Interpreter(model_content=data)._get_ops_details()}
    except Exception:  # noqa: BLE001
        ops = set()
    stateful = stateful or bool(ops & STATEFUL_OPS)
    n = steps if stateful else 1
    feeds = details = want = names = None
    try:
        t0 = time.perf_counter()
        for unknown in UNKNOWN_SIZES:
            try:
                feeds, details, want, names = _litert_run(data, None, None, seed, n, unknown)
                break
            except Exception:  # noqa: BLE001 - another size, then the first error
                if unknown == UNKNOWN_SIZES[-1]:
                    feeds, details, want, names = _litert_run(data, None, None, seed, n)
        _emit(phase="litert", ok=True, steps=n, seconds=round(time.perf_counter() - t0, 3),
              inputs=[[d["name"], str(np.dtype(d["dtype"])), [int(x) for x in d["shape"]]]
                      for d in details])
    except Exception as e:  # noqa: BLE001
        _emit(phase="litert", ok=False, kind="fails", reason=_short(e))
    if imported is None:
        return

    in_names = [d["name"] for d in details] if feeds is not None else None
    for phase, dev in (("nnhal", device), ("reference", "reference" if also_reference
                                             else None)):
        if phase == "reference" and dev is None:
            break
        r = _nnhal_run(path, data, dev, feeds, in_names, want if feeds is not None else None,
                       names if feeds is not None else None, seed, n)
        _emit(phase=phase, **r)


def _nnhal_run(path: str, data: bytes, device: str | None,
               feeds: list[list[np.ndarray]] | None, in_names: list[str] | None,
               want: list[list[np.ndarray]] | None, names: list[str] | None, seed: int,
               n: int) -> dict[str, Any]:
    """One nnhal Session (the runtime when ``device`` is None) over the feeds litert ran,
    compared with litert's outputs (and its other kernels when outside the tolerance)."""
    from ai_edge_litert.interpreter import OpResolverType

    import nnhal

    try:
        t0 = time.perf_counter()
        s = nnhal.Session(path, device) if device else nnhal.Session(path)
        plan = sorted({p["device"] for p in s.plan})
        prep = time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001
        return {"ok": False, "kind": "prepare", "reason": _short(e, 600)}
    try:
        if feeds is None or in_names is None or names is None:  # litert failed
            rng = np.random.default_rng(seed)
            feeds = [[_random(i.dtype, [x or 1 for x in (i.shape or (1,))], rng)
                      for i in s.inputs] for _ in range(n)]
            in_names = [i.name for i in s.inputs]
            names = [o.name for o in s.outputs]
        t0 = time.perf_counter()
        got = []
        by_name = {i.name for i in s.inputs}
        for step in feeds:
            fed: Any = dict(zip(in_names, step)) if set(in_names) == by_name else list(step)
            out = s.run(fed)
            got.append([out[k] for k in names] if set(names) <= set(out)
                       else list(out.values()))
        run_s = time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001
        return {"ok": False, "kind": "run", "reason": _short(e, 600), "plan": plan}
    finally:
        s.close()
    result = {"ok": True, "plan": plan, "prepare_seconds": round(prep, 3),
              "run_seconds": round(run_s, 3)}
    if want is None:
        return {**result, "compared": False}
    errs = {"default": _compare(got, want, names)}
    oracle = "default"
    if errs["default"]["ratio"] > 1:
        for label, res in (("builtin", OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES),
                           ("reference", OpResolverType.BUILTIN_REF)):
            try:
                _, _, other, _ = _litert_run(data, feeds, res, seed, n)
                errs[label] = _compare(got, other, names)
            except Exception as e:  # noqa: BLE001
                errs[label] = {"ratio": float("inf"), "why": _short(e)}
            if errs[label]["ratio"] <= 1:
                oracle = label
                break
        else:
            oracle = min(errs, key=lambda k: errs[k]["ratio"])
    return {**result, "compared": True, "match": errs[oracle]["ratio"] <= 1, "oracle": oracle,
            "errors": errs}


# ---- the parent ------------------------------------------------------------------------------

def find_models(args: list[str]) -> list[tuple[str, Path]]:
    """(package, path) of every .tflite under the arguments, sorted, each file once."""
    out: dict[Path, str] = {}
    for a in args:
        p = Path(a)
        if p.is_file():
            out.setdefault(p.resolve(), p.parent.name)
            continue
        for f in sorted(p.rglob("*.tflite")):
            rel = f.relative_to(p)
            pkg = rel.parts[0] if len(rel.parts) > 1 else str(p) if not p.is_absolute() \
                else p.name
            out.setdefault(f.resolve(), pkg)
    return sorted(((pkg, f) for f, pkg in out.items()), key=lambda t: (t[0], t[1].name))


def run_model(pkg: str, path: Path, a: argparse.Namespace) -> dict[str, Any]:
    rec: dict[str, Any] = {"package": pkg, "file": path.name, "path": str(path),
                           "bytes": path.stat().st_size,
                           "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                           "device": a.device}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(path),
           "--steps", str(a.steps), "--seed", str(a.seed)]
    if a.device:
        cmd += ["--device", a.device]
    cmd += ["--reference" if a.reference else "--no-reference"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(a.tree), *filter(None, [os.environ.get("PYTHONPATH")])]), "OMP_NUM_THREADS": "1"}
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                         text=True)
    try:
        out, err = p.communicate(timeout=a.timeout)
        ended = f"exit {p.returncode}"
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        ended = "hang"
    rec["seconds"] = round(time.monotonic() - t0, 1)
    for line in out.splitlines():
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(msg, dict) and "phase" in msg:
            rec[msg.pop("phase")] = msg
    if p.returncode != 0 or ended == "hang":
        tail = [x for x in err.splitlines() if x.strip()][-1:]
        what = "hang" if ended == "hang" else "crash"
        why = f"{what} ({ended}): {tail[0][:200] if tail else ''}"
        # The phase that was running when the child died is the one that did it.
        for phase in ("import", "litert", "nnhal", "reference"):
            if phase not in rec:
                if phase in ("nnhal", "reference") and not rec.get("import", {}).get("ok"):
                    break
                if phase == "reference" and not a.reference:
                    break
                rec[phase] = {"ok": False, "kind": what, "reason": why}
                break
    return rec


def _litert_word(r: dict[str, Any]) -> str:
    if "litert" not in r:
        return "-"
    lit = r["litert"]
    if lit.get("ok"):
        return "runs"
    return lit.get("kind", "fails")


def _nnhal_word(r: dict[str, Any], phase: str = "nnhal") -> str:
    imp, nn = r.get("import", {}), r.get(phase, {})
    if not imp.get("ok"):
        return "import-" + imp.get("kind", "?")
    if not nn.get("ok"):
        return nn.get("kind", "?") + "-failed" if nn.get("kind") in ("prepare", "run") \
            else nn.get("kind", "?")
    if not nn.get("compared"):
        return "ran (not compared)"
    return "match" if nn.get("match") else "MISMATCH"


def _detail(r: dict[str, Any], phase: str = "nnhal") -> str:
    imp, nn = r.get("import", {}), r.get(phase, {})
    if not imp.get("ok"):
        ops = imp.get("refused_ops")
        if not ops:
            return imp.get("reason", "")[:160]
        why = imp.get("reason", "").split(": ", 1)[-1].split("; ")
        why = [w for w in why if "from a refused operator too" not in w]
        return "refused: " + "; ".join(why)[:200]
    if not nn.get("ok"):
        return nn.get("reason", "")[:160]
    if not nn.get("compared"):
        return "litert: " + r.get("litert", {}).get("reason", "")[:120]
    e = nn["errors"][nn["oracle"]]
    via = "" if nn["oracle"] == "default" else f" vs litert {nn['oracle']} kernels"
    worst = f" ({e.get('output')} {e.get('abs', 0):.3g})" if e.get("ratio", 0) > 1 else ""
    return f"x{e['ratio']:.3g} of tol{via}{worst} [{'+'.join(nn.get('plan', []))}]"


def _phases(records: list[dict[str, Any]]) -> list[tuple[str, str]]:
    device = next((r["device"] for r in records if r.get("device")), None)
    out = [("nnhal", f"nnhal Session on {device}" if device else "nnhal (default Session)")]
    if any("reference" in r for r in records):
        out.append(("reference", "nnhal reference driver"))
    return out


def report(records: list[dict[str, Any]], seconds: float | None = None) -> None:
    phases = _phases(records)
    head = f"{'package':20} {'file':44} {'KiB':>6} {'litert':6} {'import':8}"
    print(head + "".join(f" {'session' if p == 'nnhal' else 'ref-drv':14}" for p, _ in phases)
          + " error (x tolerance) / reason")
    for r in records:
        imp = r.get("import", {})
        line = (f"{r['package'][:20]:20} {r['file'][:44]:44} {r['bytes'] / 1024:6.0f} "
                f"{_litert_word(r)[:6]:6} {'ok' if imp.get('ok') else imp.get('kind', '?'):8}")
        details = []
        for p, _ in phases:
            w = _nnhal_word(r, p)
            line += f" {'-' if w.startswith('import-') else w[:14]:14}"
            d = _detail(r, p)
            if d and d not in details:
                details.append(d)
        why = r.get("litert", {}).get("reason")
        if why and "litert: " + why[:120] not in details:
            details.append("litert: " + why[:120])
        print(line + " " + " | ".join(details))
    first: dict[str, str] = {}
    for r in records:
        first.setdefault(r.get("sha256", r["path"]), f"{r['package']}/{r['file']}")
    distinct = [r for r in records
                if first[r.get("sha256", r["path"])] == f"{r['package']}/{r['file']}"]
    dupes = [f"{r['package']}/{r['file']} = {first[r['sha256']]}" for r in records
             if r not in distinct]
    for title, rs in (("files", records), ("distinct models (by content)", distinct)):
        lit = sum(bool(r.get("litert", {}).get("ok")) for r in rs)
        imp = sum(bool(r.get("import", {}).get("ok")) for r in rs)
        print(f"\n{len(rs)} {title}: ai-edge-litert runs {lit}; nnhal imports {imp}")
        for p, label in phases:
            ran = sum(bool(r.get(p, {}).get("ok")) for r in rs)
            match = sum(bool(r.get(p, {}).get("match")) for r in rs)
            both = sum(bool(r.get(p, {}).get("match")) and bool(r.get("litert", {}).get("ok"))
                       for r in rs)
            print(f"  {label}: runs {ran}, outputs match litert on {match}"
                  + ("" if both == match else f" ({both} where litert runs)"))
    if dupes:
        print("  same content: " + "; ".join(dupes))
    if seconds is not None:
        print(f"survey: {seconds:.0f} s")
    for p, label in phases:
        groups: dict[str, list[str]] = defaultdict(list)
        refused: Counter[str] = Counter()
        for r in records:
            word = _nnhal_word(r, p)
            if word == "match":
                continue
            name = f"{r['package']}/{r['file']}"
            if word == "import-refused":
                for op in r["import"].get("refused_ops", []):
                    refused[op] += 1
                groups["import refused: " + ", ".join(
                    r["import"].get("refused_ops", []))].append(name)
            elif word.startswith("import-"):
                groups[word + ": " + r["import"].get("reason", "")[:100]].append(name)
            elif word == "MISMATCH":
                e = r[p]["errors"][r[p]["oracle"]]
                groups["mismatch"].append(f"{name}: output {e.get('output')} off by "
                                          f"{e.get('abs', 0):.3g} (x{e.get('ratio', 0):.3g} "
                                          f"of tolerance {e.get('tol', 0):.3g})")
            else:
                groups[word].append(f"{name}: {_detail(r, p)[:150]}")
        if not groups:
            continue
        print(f"\n{label}: failures by cause")
        for k in sorted(groups):
            print(f"  {k}: {len(groups[k])}")
            for name in groups[k]:
                print(f"      {name}")
        if refused and p == "nnhal":
            print("  refused operators, by models: " + ", ".join(
                f"{k} {v}" for k, v in refused.most_common()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="*", help="folders (searched recursively) or .tflite files")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per model")
    ap.add_argument("--steps", type=int, default=3, help="invocations of a stateful model")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default=None,
                    help="one nnhal driver (default: the runtime over every device)")
    ap.add_argument("--reference", action=argparse.BooleanOptionalAction, default=True,
                    help="also run nnhal's reference driver (its own kernels; the runtime "
                    "places most models on the litert driver)")
    ap.add_argument("--tree", type=Path, default=ROOT,
                    help="the nnhal source tree to survey (default: this script's)")
    ap.add_argument("--json", default=None, help="write every record here")
    ap.add_argument("--report", default=None, help="print the report of an earlier --json")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child, a.steps, a.device, a.seed, a.reference)
        return 0
    if a.report:
        saved = json.loads(Path(a.report).read_text())
        report(saved["records"], saved.get("seconds"))
        return 0
    if not a.paths:
        ap.error("give folders or .tflite files")
    models = find_models(a.paths)
    if not models:
        print("no .tflite found", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    with ThreadPoolExecutor(max(1, a.jobs)) as pool:
        records = list(pool.map(lambda m: run_model(m[0], m[1], a), models))
    took = time.monotonic() - t0
    commit = subprocess.run(["git", "-C", str(a.tree), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    if a.json:
        Path(a.json).write_text(json.dumps({"commit": commit, "seconds": took,
                                            "records": records}, indent=1, default=str))
    print(f"nnhal at {commit or '?'} ({a.tree}); {len(models)} models, {a.jobs} jobs, "
          f"load {os.getloadavg()[0]:.1f}\n")
    report(records, took)
    return 0


if __name__ == "__main__":
    sys.exit(main())
