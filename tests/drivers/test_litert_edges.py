"""Issue 27 item 4: the LiteRT driver claims only what TFLite computes as NNAPI defines it.

Every (operation, type variant) of the signature table that the exporter converts is a pair
here (:mod:`litert_edge_models` derives them, so a newly claimed operation is covered at once,
and fails here until it has an edge generator). Each pair's edge cases (-0.0, float limits,
int32 limits, every 8-bit stored value under extreme quantization, ties, zero-sized and
broadcast shapes, fused activations) run on the reference and on LiteRT with finite inputs:
every case LiteRT claims must agree within the conformance tolerances. The cases fed NaN or
infinities run once more with them: NNAPI defines no result for those (its operations are over
real numbers), so they must only run (no error), and where they differ is recorded in
NONFINITE_DIFFERENCES, checked complete and not stale. The cases the support rule was narrowed
for must be refused. One model per operation, one prepare per driver and run.
"""

from __future__ import annotations

import pytest
from litert_edge_models import Result, all_pairs, cases_for, sweep

import nnhal.drivers.litert.support as support
from nnhal.drivers.litert.support import REFUSED
from nnhal.drivers.reference import ReferenceDevice
from nnhal.drivers.registry import available, open_device
from nnhal.hal.types import OperationType
from nnhal.tflite.export_ops import CONVERTERS

WHY = available().get("litert", "not registered")
pytestmark = [
    pytest.mark.skipif(WHY is not None, reason=f"the LiteRT driver is unavailable: {WHY}"),
    # The edge inputs overflow on purpose: numpy's warnings about it are expected.
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
]


def claimable(name: str) -> bool:
    """Whether LiteRT may claim some model of this operation: it exports, and the support
    rule has no blanket refusal for it."""
    return name in CONVERTERS and not any(kind.startswith("every")
                                          for kind, _ in REFUSED.get(name, []))


PAIRS = all_pairs(claimable)

#: Cases the support rule was narrowed for (issue 27 item 4): pair -> case name prefixes that
#: must now be refused. Each one differs on finite inputs when claimed, which the test checks
#: (support.REFUSED says what differed).
NARROWED: dict[str, tuple[str, ...]] = {
    "CAST[T=INT32,U=QUANT8_ASYMM]": ("edges",),
    **{f"RSQRT[T={t}]": ("",) for t in ("FLOAT32", "FLOAT16")},
    **{f"{op}[T=FLOAT32]": ("",) for op in ("EXP", "LOG", "SIN", "SQRT",
                                             "UNIDIRECTIONAL_SEQUENCE_RNN")},
    "org.nnhal.tflite:COS": ("edges",),
    "INSTANCE_NORMALIZATION[T=FLOAT32,S=FLOAT32]": ("",),
    "LOG_SOFTMAX[T=FLOAT32,S=FLOAT32]": ("beta 1000000.0",),
    **{f"TOPK_V2[T={t}]": ("",) for t in ("FLOAT32", "FLOAT16", "INT32", "QUANT8_ASYMM",
                                         "QUANT8_ASYMM_SIGNED")},
    **{f"LOCAL_RESPONSE_NORMALIZATION[T={t},S={t}]": ("",) for t in ("FLOAT32", "FLOAT16")},
    **{f"LSH_PROJECTION[H={h},T=FLOAT16]": ("type 3",) for h in ("FLOAT32", "FLOAT16")},
    **{f"ADD[T={t}]": ("bcast act=0 q=(100.0",)
       for t in ("QUANT8_ASYMM", "QUANT8_ASYMM_SIGNED")},
    "MUL[T=QUANT8_ASYMM]": ("bcast act=0 q=(16.0",),
    **{f"LOGISTIC[T={t}]": ("edges in(100.0", "edges in(4.0", "edges in(8.0")
       for t in ("QUANT8_ASYMM", "QUANT8_ASYMM_SIGNED")},
    **{f"TANH[T={t}]": ("edges in(100.0", "edges in(8.0")
       for t in ("QUANT8_ASYMM", "QUANT8_ASYMM_SIGNED")},
    **{f"PRELU[T={t}]": ("bcast", "rank-4 bcast") for t in ("FLOAT32", "FLOAT16",
                                                            "QUANT8_ASYMM",
                                                            "QUANT8_ASYMM_SIGNED")},
    **{f"RESHAPE[T={t}]": ("zero-sized",) for t in ("FLOAT32", "FLOAT16", "INT32",
                                                    "QUANT8_ASYMM", "QUANT8_ASYMM_SIGNED")},
}

#: Where LiteRT differs from the reference only on NaN or infinite inputs, as measured: per
#: operation, the input types (T of the pair) and what differs. Not a narrowing (NNAPI defines
#: no result there); the test fails when a claimed operation differs so and is not listed
#: here, or is listed and no longer differs.
_F = ("FLOAT32", "FLOAT16")
#: (Measured on the one-operation models, which run with XNNPACK off where the operation is
#: one of support.XNNPACK_EDGES: XNNPACK's float16 exp(NaN), 0, is then not seen.)
NONFINITE_DIFFERENCES: dict[str, tuple[tuple[str, ...], str]] = {
    "CAST": (_F, "NaN to int32 gives INT32_MAX, to quant8 255, where the reference gives 0"),
    "QUANTIZE": (_F, "NaN quantizes to the largest value (255 / 127), not to the zero point"),
    "MAXIMUM": (_F, "NaN does not propagate: max(NaN, x) gives x, not NaN"),
    "MINIMUM": (_F, "NaN does not propagate: min(NaN, x) gives x, not NaN"),
    "REDUCE_MAX": (_F, "NaN is skipped: inf where the reference gives NaN"),
    "REDUCE_MIN": (_F, "NaN is skipped: -inf where the reference gives NaN"),
    "ARGMIN": (_F, "NaN is skipped: index 2 (the -inf) where the reference gives 0 (the NaN)"),
    "MAX_POOL_2D": (_F, "NaN in a window is skipped (-1.5, 88.7 where the reference gives "
                        "NaN)"),
    "AVERAGE_POOL_2D": (_F, "a window with NaN or both infinities gives -inf (0 / -1 "
                        "after an activation) where the reference gives NaN"),
    "RESIZE_BILINEAR": (_F, "interpolating next to an infinity gives NaN (inf x 0) "
                        "where the reference gives the infinity (float32 downscaling: "
                        "a finite value, 1.96)"),
    "RNN": (_F, "with RELU / RELU1 / RELU6, a NaN state becomes 0 / -1 where the reference "
                "keeps NaN"),
    "UNIDIRECTIONAL_SEQUENCE_RNN": (("FLOAT16",), "as RNN: with an activation, NaN becomes "
                                    "0 / -1 where the reference keeps NaN"),
}

def _sweep_all(cases_by_op: dict[OperationType, list]) -> dict[str, list[Result]]:
    ref, lit = ReferenceDevice(), open_device("litert")
    by_pair: dict[str, list[Result]] = {}
    try:
        for cases in cases_by_op.values():
            for r in sweep(cases, ref, lit):
                by_pair.setdefault(r.case.pair, []).append(r)
    finally:
        for d in (lit, ref):
            close = getattr(d, "close", None)
            if close is not None:
                close()
    return by_pair


@pytest.fixture(scope="module")
def results() -> dict[str, list[Result]]:
    ops: dict[OperationType, list] = {}
    for op, variant, _ in PAIRS:
        ops.setdefault(op, []).extend(cases_for(op, variant))
    return _sweep_all(ops)


@pytest.fixture(scope="module")
def forced() -> dict[str, list[Result]]:
    """The narrowed cases run with the edge sweep's narrowings off."""
    ops: dict[OperationType, list] = {}
    for op, variant, pair in PAIRS:
        prefixes = NARROWED.get(pair, ())
        ops.setdefault(op, []).extend(c for c in cases_for(op, variant)
                                      if c.name.startswith(prefixes) and prefixes)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(support, "_edge_rule", lambda *args: None)
        mp.setattr(support, "_edge_float", lambda *args: None)
        mp.setattr(support, "builtin_kernels", lambda graph: False)
        return _sweep_all({op: cases for op, cases in ops.items() if cases})


@pytest.fixture(scope="module")
def builtin() -> dict[str, list[Result]]:
    """Every case run with XNNPACK off (TFLite's builtin kernels alone), the rules on."""
    ops: dict[OperationType, list] = {}
    for op, variant, _ in PAIRS:
        ops.setdefault(op, []).extend(cases_for(op, variant))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(support, "builtin_kernels", lambda graph: True)
        return _sweep_all(ops)


def _op_of(pair: str) -> str:
    """The operation's name (an extension operation's short name) of a pair's name."""
    return pair.partition("[")[0].rpartition(":")[2]


#: The pairs of support.BUILTIN_WRONG: what the builtin kernels compute wrong where XNNPACK
#: computes right.
BUILTIN_WRONG_PAIRS = {
    "ADD": ("ADD[T=QUANT8_ASYMM]", "ADD[T=QUANT8_ASYMM_SIGNED]"),
    "MUL": ("MUL[T=QUANT8_ASYMM]", "MUL[T=QUANT8_ASYMM_SIGNED]"),
    "BATCH_MATMUL": ("BATCH_MATMUL[T=FLOAT32]",),
    "QUANTIZE": ("QUANTIZE[T=FLOAT32,U=QUANT8_ASYMM]",
                 "QUANTIZE[T=FLOAT32,U=QUANT8_ASYMM_SIGNED]"),
}


def test_builtin_kernels_are_wrong_only_where_listed(builtin: dict[str, list[Result]]) -> None:
    # With XNNPACK off, every claimed case agrees but those of BUILTIN_WRONG (a model with
    # one of them keeps XNNPACK), and each of those still differs (not stale).
    assert set(BUILTIN_WRONG_PAIRS) == set(support.BUILTIN_WRONG)
    listed = {p for pairs in BUILTIN_WRONG_PAIRS.values() for p in pairs}
    wrong = {pair for pair, rs in builtin.items() if any(r.claimed and r.problems for r in rs)}
    assert wrong - listed == set(), sorted(
        (p, next(x for r in builtin[p] for x in r.problems)) for p in wrong - listed)[:5]
    stale = {op for op, pairs in BUILTIN_WRONG_PAIRS.items() if not wrong & set(pairs)}
    assert stale == set(), stale
    failed = [(p, e) for p, rs in builtin.items() for r in rs for e in r.nonfinite_errors]
    assert failed == [], failed[:5]


def test_every_claimable_operation_has_a_generator() -> None:
    from litert_edge_models import GENERATORS

    missing = sorted({op.name for op, _, _ in PAIRS} - set(GENERATORS))
    assert missing == [], f"no edge generator for {missing}"
    assert len(PAIRS) > 300


def test_narrowed_pairs_exist() -> None:
    names = {p for _, _, p in PAIRS}
    assert set(NARROWED) <= names, sorted(set(NARROWED) - names)


@pytest.mark.parametrize("pair", [p for _, _, p in PAIRS])
def test_claimed_cases_agree_with_the_reference(results: dict[str, list[Result]],
                                                pair: str) -> None:
    found = results.get(pair, [])
    assert found, f"{pair}: no edge case generated"
    wrong = [f"{r.case.name}: {p}" for r in found for p in r.problems]
    assert wrong == [], wrong[:5]
    failed = [f"{r.case.name} (NaN / inf): {p}" for r in found for p in r.nonfinite_errors]
    assert failed == [], failed[:5]
    refused_now = [r.case.name for r in found if not r.claimed]
    # A narrowing of XNNPACK's own (support.XNNPACK_EDGES) holds in models that keep XNNPACK:
    # this one-operation model runs with XNNPACK off, and claims those cases.
    off = _op_of(pair) in support.XNNPACK_EDGES
    for prefix in NARROWED.get(pair, ()):
        hits = [n for n in (r.case.name for r in found) if n.startswith(prefix)]
        assert hits, f"{pair}: no case named {prefix!r}"
        if off:
            assert not set(hits) & set(refused_now), f"{pair}: refused with XNNPACK off"
            continue
        assert set(hits) <= set(refused_now), f"{pair}: still claimed: " \
            f"{sorted(set(hits) - set(refused_now))[:3]}"
    if not any(r.claimed for r in found):
        pytest.skip(f"{pair}: LiteRT claims none of its {len(found)} edge cases")


def test_narrowings_still_differ_on_finite_inputs(forced: dict[str, list[Result]]) -> None:
    # Every narrowing earns its place: claimed again, some case of each of its prefixes
    # differs from the reference (or fails) on finite inputs.
    stale = []
    for pair, prefixes in NARROWED.items():
        found = forced.get(pair, [])
        for prefix in prefixes:
            hits = [r for r in found if r.case.name.startswith(prefix)]
            if not any(r.claimed and r.problems for r in hits):
                stale.append((pair, prefix, [r.claimed for r in hits]))
    assert stale == [], stale


def _nonfinite_measured(results: dict[str, list[Result]]) -> dict[str, set[str]]:
    measured: dict[str, set[str]] = {}
    for pair, found in results.items():
        if any(r.nonfinite_diffs for r in found):
            op, _, types = pair.partition("[")
            t = types.partition("T=")[2].split(",")[0].rstrip("]")
            measured.setdefault(op, set()).add(t)
    return measured


def test_nonfinite_differences_are_recorded(results: dict[str, list[Result]]) -> None:
    measured = _nonfinite_measured(results)
    listed = {op: set(types) for op, (types, _) in NONFINITE_DIFFERENCES.items()}
    examples = {pair: next(d for r in rs for d in r.nonfinite_diffs)
                for pair, rs in results.items() if any(r.nonfinite_diffs for r in rs)}
    unlisted = {op: sorted(ts - listed.get(op, set())) for op, ts in measured.items()
                if ts - listed.get(op, set())}
    assert unlisted == {}, ("differences on NaN / inf not in NONFINITE_DIFFERENCES",
                            unlisted, sorted(examples.items())[:8])
    stale = {op: sorted(ts - measured.get(op, set())) for op, ts in listed.items()
             if ts - measured.get(op, set())}
    assert stale == {}, ("listed in NONFINITE_DIFFERENCES but no longer different", stale)


def test_most_pairs_are_still_claimed(results: dict[str, list[Result]]) -> None:
    claimed = [p for p, rs in results.items() if any(r.claimed for r in rs)]
    # The narrowing is by (operation, type, condition); most pairs keep their claim.
    assert len(claimed) >= 0.6 * len(results), (len(claimed), len(results))
