"""What a driver claims of the conformance cases, per operation type, and why it refuses the
rest: each refusal's reason as the driver words it (``nnhal info --plan`` gives the same
reasons for one model). Nothing is compiled or run; prints figures, asserts nothing.

    python benchmarks/coverage.py --device xla [--specs DIR] [--filter GLOB] [--reasons N]

Each case's main operations count once each: an operation is claimed when the driver's
getSupportedOperations would say so for that case's model. Cases expected to fail and
cases whose model does not build are left out (they have no per-operation answer).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter, defaultdict
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the checkout importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nnhal.conformance.cases import (  # noqa: E402
    MalformedCase,
    build_model,
    default_specs_dir,
    iter_cases,
)
from nnhal.drivers import registry  # noqa: E402
from nnhal.hal.types import OperationType  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="xla", help="a registered driver with refusals()")
    ap.add_argument("--specs", type=Path, default=None)
    ap.add_argument("--filter", default=None, help="fnmatch pattern on case names")
    ap.add_argument("--reasons", type=int, default=4, help="reasons shown per operation")
    args = ap.parse_args(argv)
    specs = args.specs or default_specs_dir()
    if specs is None or not Path(specs).exists():
        print(f"coverage: no conformance data at {specs}")
        return 2
    why = registry.reason(args.device)
    if why is not None:
        print(f"coverage: device {args.device!r} is unavailable: {why}")
        return 2
    device = registry.open_device(args.device)
    refusals = getattr(device, "refusals", None)
    if refusals is None:
        print(f"coverage: device {args.device!r} does not say why it refuses (no refusals())")
        return 2
    claimed: Counter[str] = Counter()
    total: Counter[str] = Counter()
    reasons: dict[str, Counter[str]] = defaultdict(Counter)
    cases = invalid = 0
    for case in iter_cases(Path(specs), args.filter):
        if case.error or case.data.get("expectFailure"):
            continue
        try:
            model = build_model(case.data["model"])
        except MalformedCase:
            continue
        answer = refusals(model)
        if answer is None:
            invalid += 1
            continue
        cases += 1
        for op, r in zip(model.main.operations, answer):
            name = OperationType(op.type).name if op.type in OperationType._value2member_map_ \
                else f"extension {op.type:#x}"
            total[name] += 1
            if r is None:
                claimed[name] += 1
            else:
                reasons[name][r] += 1
    ops = sum(total.values())
    print(f"{args.device}: {sum(claimed.values())} of {ops} operations claimed over {cases} "
          f"cases ({invalid} models the driver found invalid left out), specs {specs}")
    for name in sorted(total, key=lambda n: (-(total[n] - claimed[n]), n)):
        share = claimed[name] / total[name]
        print(f"  {name:32s} {claimed[name]:5d} / {total[name]:5d}  {share:6.1%}")
        for r, k in reasons[name].most_common(args.reasons):
            print(f"      {k:5d}  {r}")
        rest = len(reasons[name]) - args.reasons
        if rest > 0:
            print(f"      ({rest} more reasons)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
