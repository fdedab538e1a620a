"""A long fuzzing run: the checks of tests/test_fuzz.py for as long as the time budget allows.

Each round runs the three fuzzers (random graphs, byte-corrupted models, random and corrupted
requests) with hypothesis, a fresh seed per round, until ``--seconds`` have passed. Any
failure stops the run and is printed with hypothesis' shrunk example. Prints the number of
cases run per fuzzer.

    python benchmarks/fuzz_long.py --seconds 600 [--seed 1] [--per-round 500]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import test_fuzz as tf  # noqa: E402

from nnhal.drivers.reference import ReferenceDevice  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=300.0, help="time budget (default 300)")
    p.add_argument("--seed", type=int, default=1, help="first round's seed")
    p.add_argument("--per-round", type=int, default=500, help="examples per fuzzer per round")
    args = p.parse_args()

    device = ReferenceDevice()
    bases = tf._base_models()
    counts = {"random_models": 0, "byte_mutated_models": 0, "random_requests": 0}
    prepared = []
    for name, model in bases:
        pm = tf.check_model_answers(device, model)
        if pm is not None:
            prepared.append((name, model, pm))

    def cfg() -> settings:
        return settings(max_examples=args.per_round, deadline=None, database=None,
                        suppress_health_check=list(HealthCheck))

    def fuzzers() -> list:
        """Fresh hypothesis tests (a test takes one settings/seed decoration only)."""
        @given(rng=st.randoms(use_true_random=False), typed=st.booleans())
        def random_models(rng, typed):
            counts["random_models"] += 1
            tf.test_random_models.hypothesis.inner_test(device, rng, typed)

        @given(data=st.data(), rng=st.randoms(use_true_random=False))
        def byte_mutated(data, rng):
            counts["byte_mutated_models"] += 1
            tf.test_byte_mutated_models.hypothesis.inner_test(device, bases, data, rng)

        @given(data=st.data(), rng=st.randoms(use_true_random=False))
        def requests(data, rng):
            counts["random_requests"] += 1
            tf.test_random_requests.hypothesis.inner_test(prepared, data, rng)

        return [random_models, byte_mutated, requests]

    start = time.monotonic()
    round_ = 0
    status = 0
    try:
        while time.monotonic() - start < args.seconds:
            s = args.seed + round_
            for fn in fuzzers():
                if time.monotonic() - start >= args.seconds:
                    break
                seed(s)(cfg()(fn))()
            round_ += 1
            print(f"round {round_} (seed {s}) done at {time.monotonic() - start:.0f} s: "
                  f"{counts}", flush=True)
    except Exception as e:  # noqa: BLE001 - report and stop
        print(f"FAILURE: {type(e).__name__}: {e}", flush=True)
        status = 1
    finally:
        for _, m in bases:
            tf._close_new_pools(m)
        device.close()
    total = sum(counts.values())
    print(f"{total} fuzz cases in {time.monotonic() - start:.0f} s: {counts}; "
          f"{'FAILED' if status else 'no failure'}")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
