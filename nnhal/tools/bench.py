"""``nnhal bench MODEL``: prepare time and execution latency of a model, on the runtime over
every available device (as ``nnhal run``) or the ``--device`` named; ``--profile`` adds the
time per operation on the device that ran it (:mod:`nnhal.tools.profiling`).

Inputs are random (seed 0, as ``nnhal run`` makes them) and the same for every run, so the
figures measure the device, not the data. ``--json`` records them with the machine's load
(``/proc/loadavg``), because on a shared machine latencies mean little without it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from nnhal.conformance.cliutil import MAX_COUNT, input_file, int_in, output_file
from nnhal.errors import InputError, ModelFileError, NnhalError
from nnhal.executor.profile import profiling
from nnhal.tools.profiling import profile_report, render_profile
from nnhal.tools.run import (
    ArgumentProblem,
    add_device_argument,
    console,
    fail,
    open_session,
    ran_on,
    random_feeds,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", type=input_file, help="a .tflite model file")
    add_device_argument(parser)
    parser.add_argument("--runs", type=int_in(1, MAX_COUNT), default=100,
                        help="timed runs (default: 100)")
    parser.add_argument("--warmup", type=int_in(0, MAX_COUNT), default=10,
                        help="untimed runs first (default: 10)")
    parser.add_argument("--json", metavar="FILE", type=output_file,
                        help="write the figures as JSON here")
    parser.add_argument("--profile", action="store_true",
                        help="then as many runs again, timing each operation on the device "
                             "that ran it (per step of the runtime's plan where a device "
                             "cannot time its operations: LiteRT)")
    parser.add_argument("--top", type=int_in(1, MAX_COUNT), default=15,
                        help="with --profile: the slowest operations shown (default: 15)")


def loadavg() -> list[float] | None:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except (OSError, ValueError):
        return None


def figures(latencies: list[float]) -> dict[str, float]:
    """Seconds: min / median / p90 / mean, and executions per second (from the mean)."""
    ordered = sorted(latencies)
    mean = statistics.fmean(ordered)
    return {"min": ordered[0], "median": statistics.median(ordered),
            "p90": float(np.percentile(ordered, 90)), "mean": mean,
            "executions_per_second": 1.0 / mean if mean > 0 else float("inf")}


def main(args: argparse.Namespace) -> int:
    out = console()
    try:
        session = open_session(args.model, args.device)
    except NnhalError as e:  # a file that cannot be read is a usage error, as for info/view
        return fail("bench", e, 2 if isinstance(e, ModelFileError) else 1)
    latencies: list[float] = []
    profiled: list[float] = []
    report = None
    with session:
        feeds, notes = random_feeds(session.inputs, 0)
        for note in notes:
            out.print(note)
        try:
            progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                MofNCompleteColumn(), console=out, transient=True,
                                disable=not out.is_terminal)
            with progress:
                task = progress.add_task("warm-up", total=args.warmup + args.runs * (
                    2 if args.profile else 1))
                for _ in range(args.warmup):
                    session.run(feeds)
                    progress.advance(task)
                progress.update(task, description="timing")
                for _ in range(args.runs):
                    started = time.perf_counter()
                    session.run(feeds)
                    latencies.append(time.perf_counter() - started)
                    progress.advance(task)
                if args.profile:  # apart: the timed loops cost what the lean ones do not
                    progress.update(task, description="profiling")
                    with profiling() as prof:
                        for _ in range(args.runs):
                            started = time.perf_counter()
                            session.run(feeds)
                            profiled.append(time.perf_counter() - started)
                            progress.advance(task)
        except (ArgumentProblem, InputError) as e:
            return fail("bench", e, 2)
        except NnhalError as e:
            return fail("bench", e, 1)
        prepare = session.prepare_seconds
        device = session.device_name
        steps = session.plan
        where = ran_on(session)
        if args.profile:
            report = profile_report(prof, session.model, steps, profiled)
    stats = figures(latencies)
    out.print(f"{args.model}: {where}; {args.runs} runs after {args.warmup} warm-up")
    table = Table()
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_row("prepare", f"{prepare * 1e3:.2f} ms")
    for key in ("min", "median", "p90", "mean"):
        table.add_row(f"latency {key}", f"{stats[key] * 1e3:.3f} ms")
    table.add_row("executions per second", f"{stats['executions_per_second']:.1f}")
    out.print(table)
    if report is not None:
        render_profile(report, out, args.top)
    if args.json:
        record = {"model": str(args.model), "device": device, "pinned": args.device is not None,
                  "placement": where,
                  "steps": [{"device": s["device"], "operations": len(s["operations"])}
                            for s in steps],
                  "runs": args.runs,
                  "warmup": args.warmup, "prepare_seconds": prepare,
                  "latency_seconds": {k: stats[k] for k in ("min", "median", "p90", "mean")},
                  "executions_per_second": stats["executions_per_second"],
                  "loadavg": loadavg(), "cpu_count": os.cpu_count(),
                  "python": platform.python_version()}
        if report is not None:
            record["profile"] = report
        try:
            Path(args.json).write_text(json.dumps(record, indent=2) + "\n")
        except OSError as e:
            return fail("bench", f"cannot write {args.json}: {e.strerror or e}", 1)
    return 0

