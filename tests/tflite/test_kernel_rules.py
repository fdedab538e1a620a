"""nnhal.tflite.kernel_rules' SAME padding rule: its early pass for windows whose padding
cannot leave int16 agrees with the per-axis arithmetic TFLite's Prepare does."""

from __future__ import annotations

import random

from nnhal.tflite.kernel_rules import RuleOp, _same_padding, rule_tensor

_INT16_MAX = (1 << 15) - 1


def _refused(size: int, k: int, stride: int, dilation: int) -> bool:
    """TFLite's SAME padding per side along one axis, past int16."""
    if size <= 0 or k <= 0 or stride <= 0 or dilation <= 0:
        return False
    out = (size + stride - 1) // stride
    return max((out - 1) * stride + (k - 1) * dilation + 1 - size, 0) // 2 > _INT16_MAX


def test_same_padding_rule_agrees_with_the_arithmetic_on_either_side_of_its_early_pass():
    rng = random.Random(29)
    edges = [-1, 0, 1, 2, 3, 100, 32_767, 32_768, 65_535, 65_536, 65_537, 131_072]
    refusals = 0
    for _ in range(20_000):
        kh, kw, dh, dw, sh, sw, h, w = (rng.choice(edges) if rng.random() < 0.7
                                        else rng.randint(-2, 140_000) for _ in range(8))
        x = rule_tensor(0, None, None, "x", (1, h, w, 3))
        op = RuleOp("CONV_2D", [x], [x], {"Padding": 0, "StrideH": sh, "StrideW": sw}.get)
        want = _refused(h, kh, sh, dh) or _refused(w, kw, sw, dw)
        assert (_same_padding(op, kh, kw, dh, dw) is not None) == want, (kh, kw, dh, dw, sh,
                                                                          sw, h, w)
        refusals += want
    assert refusals > 1000  # the far side was reached
