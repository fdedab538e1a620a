"""Running the conformance suite in several processes, one shard of case files each.

The shards are separate ``nnhal conformance --shard K/N`` processes that write JSON reports;
nothing is pickled between processes. Each shard opens the registered device by name (a device
object cannot cross a process boundary).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from nnhal.conformance.runner import Report


def report_from_json(data: dict) -> Report:
    rep = Report()
    for mode, counts in data["modes"].items():
        rep.modes[mode].update(counts)
    for key, counts in data["folders"].items():
        mode, folder = key.split("/", 1)
        rep.folders[(mode, folder)].update(counts)
    for key, counts in data["operations"].items():
        mode, op = key.split("/", 1)
        rep.operations[(mode, op)].update(counts)
    rep.cases = list(data["cases"])
    rep.broken = list(data.get("broken", []))
    rep.died = list(data.get("died", []))
    rep.seconds = float(data.get("seconds", 0.0))
    rep.face = data.get("hal")
    return rep


def merge(reports: Sequence[Report]) -> Report:
    out = Report()
    for r in reports:
        for m, c in r.modes.items():
            out.modes[m].update(c)
        for k, c in r.folders.items():
            out.folders[k].update(c)
        for k, c in r.operations.items():
            out.operations[k].update(c)
        out.cases.extend(r.cases)
        out.broken.extend(r.broken)
        out.died.extend(r.died)
        out.seconds = max(out.seconds, r.seconds)
        out.face = r.face  # every shard runs with the same --hal
    for d in (out.modes, out.folders, out.operations):
        for k in list(d):
            d[k] = Counter({n: v for n, v in d[k].items() if v})
    return out


#: The folder holding the ``nnhal`` package, so that shards import this same copy.
PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


class ShardFailed(RuntimeError):
    """A shard process died or wrote no report; the message is one line."""


def run_sharded(specs: Path, modes: Sequence[str], jobs: int, pattern: str | None = None,
                loop_timeout_ms: float = 500.0, device: str = "reference",
                extra_args: Sequence[str] = ()) -> Report:
    """Run the registered ``device`` over ``specs`` in ``jobs`` processes (each opens its own:
    a device object cannot cross a process boundary) and merge the reports."""
    jobs = max(1, jobs)
    with tempfile.TemporaryDirectory(prefix="nnhal-shards-") as tmp:
        procs = []
        for k in range(jobs):
            out = Path(tmp) / f"shard{k}.json"
            cmd = [sys.executable, "-m", "nnhal.cli", "conformance", "--specs", str(specs),
                   "--shard", f"{k}/{jobs}", "--json", str(out), "--quiet", "--no-ops",
                   "--loop-timeout-ms", str(loop_timeout_ms), "--device", device]
            for m in modes:
                cmd += ["--mode", m]
            if pattern:
                cmd += ["--filter", pattern]
            cmd += list(extra_args)
            env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
                       PYTHONPATH=os.pathsep.join(filter(None, [
                           PACKAGE_ROOT, os.environ.get("PYTHONPATH")])))
            procs.append((subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                           stderr=subprocess.PIPE, env=env), out))
        reports = []
        failure = None
        for k, (proc, out) in enumerate(procs):
            _, err = proc.communicate()
            if failure is None and (proc.returncode != 0 or not out.exists()):
                lines = err.decode(errors="replace").strip().splitlines()
                failure = ShardFailed(f"shard {k}/{jobs} failed (exit {proc.returncode}): "
                                      f"{lines[-1] if lines else 'no message'}")
            elif failure is None:
                reports.append(report_from_json(json.loads(out.read_text())))
    if failure is not None:
        raise failure
    return merge(reports)
