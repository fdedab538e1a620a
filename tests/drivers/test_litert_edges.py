"""Issue 27 item 4: the LiteRT driver claims only what TFLite computes as NNAPI defines it.

Every (operation, type variant) of the signature table that the exporter converts is a pair
here (:mod:`litert_edge_models` derives them, so a newly claimed operation is covered at once,
and fails here until it has an edge generator). Each pair's edge cases (NaN, +-Inf, -0.0,
float limits, int32 limits, every 8-bit stored value under extreme quantization, ties,
zero-sized and broadcast shapes, fused activations) run on the reference and on LiteRT; every
case LiteRT claims must agree within the conformance tolerances, NaN where the reference has
NaN. The cases the support rule was narrowed for must be refused. One model per operation,
one prepare per driver: the whole sweep takes seconds.
"""

from __future__ import annotations

import pytest
from litert_edge_models import Result, all_pairs, cases_for, sweep

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
#: must now be refused. Each one differed when claimed (see support.REFUSED for what differed).
NARROWED: dict[str, tuple[str, ...]] = {
    **{f"CAST[T={a},U={b}]": ("edges",) for a in ("FLOAT32", "FLOAT16")
       for b in ("INT32", "QUANT8_ASYMM")},
    "CAST[T=INT32,U=QUANT8_ASYMM]": ("edges",),
    **{f"QUANTIZE[T={a},U={b}]": ("out",) for a in ("FLOAT32", "FLOAT16")
       for b in ("QUANT8_ASYMM", "QUANT8_ASYMM_SIGNED")},
    **{f"{op}[T={t}]": ("",) for op in ("EXP", "RSQRT", "MAXIMUM", "MINIMUM", "REDUCE_MAX",
                                         "REDUCE_MIN", "ARGMIN", "AVERAGE_POOL_2D",
                                         "MAX_POOL_2D")
       for t in ("FLOAT32", "FLOAT16")},
    **{f"{op}[T=FLOAT32]": ("",) for op in ("LOG", "SIN", "SQRT")},
    **{f"TOPK_V2[T={t}]": ("",) for t in ("FLOAT32", "FLOAT16", "INT32", "QUANT8_ASYMM",
                                         "QUANT8_ASYMM_SIGNED")},
    **{f"RESIZE_BILINEAR[T={t},S={t}]": ("",) for t in ("FLOAT32", "FLOAT16")},
    "INSTANCE_NORMALIZATION[T=FLOAT32,S=FLOAT32]": ("",),
    "LOCAL_RESPONSE_NORMALIZATION[T=FLOAT16,S=FLOAT16]": ("",),
    "LSH_PROJECTION[H=FLOAT16,T=FLOAT16]": ("type 3",),
    **{f"ADD[T={t}]": ("bcast act=0 q=(100.0",)
       for t in ("QUANT8_ASYMM", "QUANT8_ASYMM_SIGNED")},
    **{f"MUL[T={t}]": ("bcast act=0 q=(16.0",) for t in ("QUANT8_ASYMM",
                                                        "QUANT8_ASYMM_SIGNED")},
    **{f"LOGISTIC[T={t}]": ("edges in(100.0", "edges in(4.0", "edges in(8.0")
       for t in ("QUANT8_ASYMM", "QUANT8_ASYMM_SIGNED")},
    **{f"TANH[T={t}]": ("edges in(100.0", "edges in(8.0")
       for t in ("QUANT8_ASYMM", "QUANT8_ASYMM_SIGNED")},
    **{f"PRELU[T={t}]": ("bcast", "rank-4 bcast") for t in ("FLOAT32", "FLOAT16",
                                                            "QUANT8_ASYMM",
                                                            "QUANT8_ASYMM_SIGNED")},
    **{f"RESHAPE[T={t}]": ("zero-sized",) for t in ("FLOAT32", "FLOAT16", "INT32",
                                                    "QUANT8_ASYMM", "QUANT8_ASYMM_SIGNED")},
    **{f"RNN[T={t}]": ("act=1", "act=2", "act=3") for t in ("FLOAT32", "FLOAT16")},
    "UNIDIRECTIONAL_SEQUENCE_RNN[T=FLOAT32]": ("time_major",),
    "UNIDIRECTIONAL_SEQUENCE_RNN[T=FLOAT16]": ("time_major=0 act=1", "time_major=1 act=1"),
}


@pytest.fixture(scope="module")
def results() -> dict[str, list[Result]]:
    ref, lit = ReferenceDevice(), open_device("litert")
    by_pair: dict[str, list[Result]] = {}
    try:
        ops: dict[OperationType, list] = {}
        for op, variant, _ in PAIRS:
            ops.setdefault(op, []).extend(cases_for(op, variant))
        for cases in ops.values():
            for r in sweep(cases, ref, lit):
                by_pair.setdefault(r.case.pair, []).append(r)
    finally:
        for d in (lit, ref):
            close = getattr(d, "close", None)
            if close is not None:
                close()
    return by_pair


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
    refused_now = [r.case.name for r in found if not r.claimed]
    for prefix in NARROWED.get(pair, ()):
        hits = [n for n in (r.case.name for r in found) if n.startswith(prefix)]
        assert hits, f"{pair}: no case named {prefix!r}"
        assert set(hits) <= set(refused_now), f"{pair}: still claimed: " \
            f"{sorted(set(hits) - set(refused_now))[:3]}"
    if not any(r.claimed for r in found):
        pytest.skip(f"{pair}: LiteRT claims none of its {len(found)} edge cases")


def test_most_pairs_are_still_claimed(results: dict[str, list[Result]]) -> None:
    claimed = [p for p, rs in results.items() if any(r.claimed for r in rs)]
    # The narrowing is by (operation, type, condition); most pairs keep their claim.
    assert len(claimed) >= 0.6 * len(results), (len(claimed), len(results))
