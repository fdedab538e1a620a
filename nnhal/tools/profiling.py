"""``nnhal bench --profile``: a collected :class:`~nnhal.executor.profile.Profile` as figures
per operation, per operation type and per step of the runtime's plan, each on the device
that ran it, as a fraction of the run.

The reference driver times every operation; LiteRT cannot (ai-edge-litert's Python API
exposes no per-operation profiler), so a LiteRT step is one figure: its whole run. What no
step accounts for (the Session's copies, the runtime's memory between steps) is
``other_seconds``.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from nnhal.executor.profile import Profile
from nnhal.hal.types import Model

#: Why a step has no per-operation figures.
NO_OP_PROFILE = {
    "litert": "ai-edge-litert's Python API exposes no per-operation profiler: timed as a "
              "whole step",
    "runtime": "an IF/WHILE the runtime runs itself: its bodies are timed as one step",
}


def profile_report(prof: Profile, model: Model, steps: Sequence[dict[str, Any]],
                   runs: Sequence[float]) -> dict[str, Any]:
    """JSON-ready figures, in seconds per run (means over ``runs``, the profiled runs'
    wall times)."""
    from nnhal.tools.describe import op_name

    n = max(1, len(runs))
    run = statistics.fmean(runs) if runs else 0.0
    table = model.extension_name_to_prefix
    ops = model.main.operations

    def pct(seconds: float) -> float:
        return 100.0 * seconds / run if run > 0 else 0.0

    step_rows = []
    operations = []
    for k, s in enumerate(steps):
        device = prof.steps[k][0] if k in prof.steps else s["device"]
        mine = sorted((i, e) for (step, i), e in prof.operations.items() if step == k)
        op_total = sum(e[1] for _, e in mine) / n
        for i, (_type, seconds, count) in mine:
            name = op_name(ops[i].type, table) if 0 <= i < len(ops) else _type
            operations.append({"index": i, "type": name, "device": device, "step": k,
                               "seconds": seconds / n, "calls": count / n,
                               "percent": pct(seconds / n)})
        if k in prof.steps:
            seconds, timed_by = prof.steps[k][1] / n, "runtime"
        elif k in prof.driver:
            seconds, timed_by = prof.driver[k] / n, "driver"
        elif mine:
            seconds, timed_by = op_total, "operations"
        else:
            seconds, timed_by = None, None
        row: dict[str, Any] = {"step": k, "device": device, "operations": len(s["operations"]),
                               "seconds": seconds, "percent": pct(seconds or 0.0),
                               "timed_by": timed_by, "per_operation": bool(mine)}
        if not mine:
            row["why_no_operations"] = NO_OP_PROFILE.get(device) or (
                "the device timed its whole run only (the reference driver does so for a "
                "model with IF/WHILE)" if k in prof.driver else
                "the device recorded no per-operation times")
        step_rows.append(row)
    types: dict[tuple[str, str], dict[str, Any]] = {}
    for o in operations:
        t = types.setdefault((o["device"], o["type"]), {"type": o["type"],
                                                        "device": o["device"], "count": 0,
                                                        "seconds": 0.0})
        t["count"] += 1
        t["seconds"] += o["seconds"]
    type_rows = sorted(types.values(), key=lambda t: -t["seconds"])
    for t in type_rows:
        t["percent"] = pct(t["seconds"])
    attributed = sum(r["seconds"] or 0.0 for r in step_rows)
    return {"runs": len(runs), "run_seconds": run,
            "attributed_seconds": attributed, "other_seconds": max(0.0, run - attributed),
            "steps": step_rows,
            "operations": sorted(operations, key=lambda o: (o["step"], o["index"])),
            "types": type_rows}


def render_profile(report: dict[str, Any], out: Any, top: int = 15) -> None:
    """The report as tables on a rich console: the slowest operations, the totals per
    operation type and (when there is more than one, or one without per-operation times)
    the steps."""
    from rich.table import Table

    ms = 1e3
    out.print(f"profile: {report['runs']} runs of {report['run_seconds'] * ms:.3f} ms "
              f"(profiled); {report['attributed_seconds'] * ms:.3f} ms on the devices, "
              f"{report['other_seconds'] * ms:.3f} ms around them")
    steps = report["steps"]
    if len(steps) > 1 or any(not s["per_operation"] for s in steps):
        st = Table(title="steps", title_justify="left")
        for col in ("step", "device", "operations", "ms", "% of run", "note"):
            st.add_column(col, justify="right" if col in ("operations", "ms", "% of run")
                          else "left")
        for s in steps:
            st.add_row(str(s["step"]), s["device"], str(s["operations"]),
                       "-" if s["seconds"] is None else f"{s['seconds'] * ms:.3f}",
                       f"{s['percent']:.1f}", s.get("why_no_operations", ""))
        out.print(st)
    ops = report["operations"]
    if not ops:
        return
    slow = sorted(ops, key=lambda o: -o["seconds"])[:top]
    t = Table(title=f"slowest operations (top {len(slow)} of {len(ops)})", title_justify="left")
    for col in ("#", "type", "device", "ms", "% of run"):
        t.add_column(col, justify="right" if col in ("ms", "% of run") else "left")
    for o in slow:
        t.add_row(str(o["index"]), o["type"], o["device"], f"{o['seconds'] * ms:.3f}",
                  f"{o['percent']:.1f}")
    out.print(t)
    by_type = Table(title="per operation type", title_justify="left")
    for col in ("type", "device", "count", "ms", "% of run"):
        by_type.add_column(col, justify="right" if col in ("count", "ms", "% of run")
                           else "left")
    for r in report["types"]:
        by_type.add_row(r["type"], r["device"], str(r["count"]), f"{r['seconds'] * ms:.3f}",
                        f"{r['percent']:.1f}")
    out.print(by_type)
