"""``nnhal mutations``: model and request mutants of every conformance case, checked against a
device (the reference driver by default) through the face ``--hal`` names, with totals per
mutation kind (and per execution path for requests)."""

from __future__ import annotations

import argparse
import random
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nnhal.conformance.cases import (
    MalformedCase,
    build_model,
    build_request,
    iter_cases,
)
from nnhal.conformance.cliutil import add_mutations_arguments as add_arguments
from nnhal.conformance.cliutil import error, parse_shard
from nnhal.conformance.faces import DEFAULT_FACE, describe, through
from nnhal.conformance.faces import problem as face_problem
from nnhal.conformance.mutations.common import (
    ACCEPTED,
    CALLBACK_TIMEOUT_S,
    CRASH,
    HANG,
    REJECTED,
    WRONG_STATUS,
)
from nnhal.conformance.mutations.fuzz import GUARD_BYTE
from nnhal.conformance.mutations.model import (
    ModelMutant,
    check_model_mutant,
    model_mutations,
    relaxed_control,
)
from nnhal.conformance.mutations.paths import SharedBurst, execution_paths
from nnhal.conformance.mutations.request import check_request_mutant, request_mutations
from nnhal.conformance.specs import default_specs_dir, no_cases_message, specs_problem
from nnhal.drivers.registry import open_device
from nnhal.errors import NnhalError
from nnhal.hal.interfaces import IDevice, IPreparedModel, PreparedModelCallback
from nnhal.hal.types import ErrorStatus, ExecutionPreference, Model, Priority
from nnhal.memory import SharedMemory


@dataclass
class Totals:
    """Counts of a mutation run, by outcome and by kind, and the first failures of each kind."""

    outcomes: Counter = field(default_factory=Counter)
    by_kind: dict[str, Counter] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    cases: int = 0
    relaxed_controls: Counter = field(default_factory=Counter)
    #: Cases left out because their model or request could not be built from the JSON.
    unbuildable: list[str] = field(default_factory=list)

    def add(self, kind: str, outcome: str, message: str, where: str) -> None:
        self.outcomes[outcome] += 1
        self.by_kind.setdefault(kind, Counter())[outcome] += 1
        if outcome != REJECTED and len(self.failures) < 200:
            self.failures.append(f"[{outcome}] {kind} {where}: {message}")

    @property
    def generated(self) -> int:
        return sum(self.outcomes.values())

    def summary(self, title: str) -> str:
        lines = [f"{title}: {self.cases} cases, {self.generated} mutants generated, "
                 f"{self.outcomes[REJECTED]} rejected, {self.outcomes[ACCEPTED]} accepted, "
                 f"{self.outcomes[WRONG_STATUS]} wrong status, {self.outcomes[CRASH]} crashes, "
                 f"{self.outcomes[HANG]} hangs"]
        for kind, c in sorted(self.by_kind.items()):
            bad = sum(v for k, v in c.items() if k != REJECTED)
            lines.append(f"  {kind:<28} {sum(c.values()):7d} generated {c[REJECTED]:7d} "
                         f"rejected {bad:5d} not")
        if self.relaxed_controls:
            lines.append(f"  relaxed-flag controls (valid): {dict(self.relaxed_controls)}")
        return "\n".join(lines)


def run_model_mutations(device: IDevice, cases: Sequence[Any], *,
                        limit_per_case: int | None = None, seed: int = 0,
                        relaxed_control_check: bool = True) -> Totals:
    """Generate and check model mutants for each conformance case (``Case`` objects);
    ``limit_per_case`` samples that many mutants per case (deterministically by ``seed``)."""
    totals = Totals()
    rng = random.Random(seed)
    for case in cases:
        model = _base_model(case, totals)
        if model is None:
            continue
        try:
            status, flags = device.get_supported_operations(model)
            if status != ErrorStatus.NONE or not all(flags):
                continue  # not a valid, supported base model: nothing to mutate
            totals.cases += 1
            mutants: Iterator[ModelMutant] | list[ModelMutant] = model_mutations(model)
            if limit_per_case is not None:
                mutants = list(mutants)
                if len(mutants) > limit_per_case:
                    mutants = rng.sample(mutants, limit_per_case)
            for mutant in mutants:
                outcome, message = check_model_mutant(device, mutant)
                totals.add(mutant.kind, outcome, message, f"{case.name}: {mutant.detail}")
            if relaxed_control_check:
                st, _ = device.get_supported_operations(relaxed_control(model))
                totals.relaxed_controls[ErrorStatus(st).name] += 1
        finally:
            for p in model.pools:
                p.close()
    return totals


def _base_model(case: Any, totals: Totals) -> Model | None:
    """The model of a case to derive mutants from: None for a case that is expected to fail,
    could not be loaded, or cannot be built (noted in ``totals``)."""
    if getattr(case, "error", "") or case.expect_failure:
        return None
    try:
        return build_model(case.data["model"])
    except MalformedCase as e:
        totals.unbuildable.append(_where(case, e))
        return None


def _where(case: Any, e: Exception) -> str:
    index = getattr(case, "index", -1)
    return f"{case.file} {case.name}: " + (f"(case #{index}) " if index >= 0 else "") + str(e)


def _prepare(device: IDevice, model: Model) -> IPreparedModel | None:
    cb = PreparedModelCallback()
    device.prepare_model(model, ExecutionPreference.FAST_SINGLE_ANSWER, Priority.MEDIUM, None,
                         [], [], b"", cb)
    status, pm = cb.wait(CALLBACK_TIMEOUT_S)
    return pm if status == ErrorStatus.NONE else None


def run_request_mutations(device: IDevice, cases: Sequence[Any], *,
                          limit_per_case: int | None = None, seed: int = 0,
                          paths: Sequence[str] | None = None) -> dict[str, Totals]:
    """Request mutants of each case through every execution path; totals per path."""
    per_path: dict[str, Totals] = {}
    rng = random.Random(seed)
    closed = SharedMemory.ashmem(16)
    closed.close()
    unbuildable = Totals()
    for case in cases:
        model = _base_model(case, unbuildable)
        if model is None:
            continue
        built = None
        burst: SharedBurst | None = None
        try:
            pm = _prepare(device, model)
            if pm is None:
                continue
            try:
                built = build_request(case.data["model"])
            except MalformedCase as e:
                unbuildable.unbuildable.append(_where(case, e))
                continue
            for mem in built.pools:
                arr = mem.array()
                if mem is built.output_memory:
                    arr[:] = GUARD_BYTE
            available = execution_paths(pm, built.request)
            if paths is not None:
                available = {k: v for k, v in available.items() if k in paths}
            if "burst" in available:
                available["burst"] = burst = SharedBurst()
            mutants = list(request_mutations(built.request, model.main, closed))
            if limit_per_case is not None and len(mutants) > limit_per_case:
                mutants = rng.sample(mutants, limit_per_case)
            for name, fn in available.items():
                totals = per_path.setdefault(name, Totals())
                totals.cases += 1
                for mutant in mutants:
                    outcome, message = check_request_mutant(pm, mutant, fn, built.pools)
                    totals.add(mutant.kind, outcome, message, f"{case.name}: {mutant.detail}")
                if fn is burst:
                    burst.close()  # its rings would otherwise be watched through the others
        finally:
            if burst is not None:
                burst.close()
            if built is not None:
                built.close()
            for p in model.pools:
                p.close()
    for totals in per_path.values():
        totals.unbuildable = list(unbuildable.unbuildable)
    return per_path


def main(argv: Sequence[str] | None = None) -> int:
    """``nnhal mutations``: model and request mutations over the conformance suite."""
    p = argparse.ArgumentParser(prog="nnhal mutations", description=main.__doc__)
    add_arguments(p)
    return run_cli(p.parse_args(argv))


def run_cli(args: argparse.Namespace) -> int:
    prog = "nnhal mutations"
    shard = parse_shard(args.shard)
    if shard is None:
        return error(prog, f"--shard must be K/N with 0 <= K < N, not {args.shard!r}")
    specs = Path(args.specs) if args.specs else default_specs_dir()
    problem = specs_problem(specs)
    if problem:
        return error(prog, problem)
    loaded = list(iter_cases(specs, args.filter))
    if not loaded:
        return error(prog, no_cases_message(specs, args.filter))
    broken = [c for c in loaded if c.error]
    k, n = shard
    cases = [c for c in loaded if not c.error][::max(1, args.every)][k::n]
    face = getattr(args, "hal", DEFAULT_FACE)
    why = face_problem(face)
    if why is not None:
        return error(prog, f"--hal {face}: {why}")
    try:
        device = open_device(getattr(args, "device", "reference"))
    except NnhalError as e:
        return error(prog, str(e))
    print(f"face: --hal {face}: {describe(face)}")
    bare, device = device, through(face, device)
    bad = 0
    unbuildable: set[str] = set()
    try:
        if args.what in ("model", "both"):
            t0 = time.monotonic()
            totals = run_model_mutations(device, cases, limit_per_case=args.limit,
                                         seed=args.seed)
            print(totals.summary(f"model mutations ({time.monotonic() - t0:.0f} s)"))
            for line in totals.failures[:args.show_failures]:
                print("  " + line)
            bad += totals.generated - totals.outcomes[REJECTED]
            unbuildable.update(totals.unbuildable)
        if args.what in ("request", "both"):
            t0 = time.monotonic()
            per_path = run_request_mutations(device, cases, limit_per_case=args.limit,
                                             seed=args.seed)
            print(f"request mutations ({time.monotonic() - t0:.0f} s)")
            for name, totals in per_path.items():
                print(totals.summary(f"path {name}"))
                for line in totals.failures[:args.show_failures]:
                    print("  " + line)
                bad += totals.generated - totals.outcomes[REJECTED]
                unbuildable.update(totals.unbuildable)
    finally:
        bare.close()
    if broken or unbuildable:
        print(f"{len(broken) + len(unbuildable)} case(s) could not be loaded or built "
              f"(left out):")
        for c in broken:
            print(f"  {c.file} {c.name}: {c.error}")
        for line in sorted(unbuildable):
            print(f"  {line}")
    if broken or unbuildable:
        return error(prog, f"{len(broken) + len(unbuildable)} case(s) could not be loaded or "
                           f"built; they are listed above", 1)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
