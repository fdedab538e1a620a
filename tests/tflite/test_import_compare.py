"""A TFLite 8-bit comparison with a constant, imported: TFLite compares stored values rescaled
in fixed point, more coarsely than the HAL's real values wherever a scale is below 2/256 or
the two differ, so the importer rewrites it against stored values of the tensor's own
quantization. Every stored value, against constants of random scales, zero points and
values, must come out as ai-edge-litert computes the converter's file, on the reference and
(when present) on LiteRT; each form of the rewrite is reached."""

from __future__ import annotations

import numpy as np
import pytest
import tfl
from runner import Reference, litert, litert_run

from nnhal.drivers.litert import unavailable
from nnhal.hal.types import OperationType as O
from nnhal.tflite import read_tflite

pytest.importorskip("ai_edge_litert.interpreter", reason="ai-edge-litert is the oracle here")

OPS = ["EQUAL", "NOT_EQUAL", "LESS", "LESS_EQUAL", "GREATER", "GREATER_EQUAL"]


def _model(op: str, dtype: type, xq: tuple[float, int], cq: tuple[float, int],
           const: np.ndarray, const_first: bool) -> bytes:
    g = tfl.Graph()
    x = g.input([256, 1], dtype, quant=tfl.Quant([xq[0]], [xq[1]]))
    c = g.const(const.astype(dtype).reshape(1, -1), dtype, quant=tfl.Quant([cq[0]], [cq[1]]))
    o = g.tensor([256, const.size], np.bool_, "out")
    g.op(op, [c, x] if const_first else [x, c], [o])
    g.output(o)
    return tfl.build(g)


def _cases() -> list[tuple]:
    """Named ones reaching each form, then a seeded random sample."""
    cases = [
        # the converter's kind: a fine activation scale against a threshold of its own scale
        ("GREATER", np.int8, (0.02, -10), (0.5 / 127, 0), [127, 1, -3], False),
        # coarse: several stored values round to the constant (a run: GREATER_EQUAL AND
        # LESS_EQUAL), its complement (LESS OR GREATER)
        ("EQUAL", np.int8, (0.001, 3), (0.002, -7), [0, 5, 9, -120], False),
        ("NOT_EQUAL", np.uint8, (0.0015, 100), (0.001, 90), [90, 92, 200], True),
        # true for every stored value: another operation of one comparison
        ("GREATER", np.int8, (0.01, 0), (0.9, 0), [-128, -100], False),
    ]
    rng = np.random.default_rng(29)
    for _ in range(40):
        dt = np.int8 if rng.random() < 0.7 else np.uint8
        lo, hi = (-128, 127) if dt == np.int8 else (0, 255)
        sx = float(np.float32(10 ** rng.uniform(-3.5, -0.2)))
        other = min(float(np.float32(sx * 10 ** rng.uniform(-3, 3))), 0.9)
        sc = sx if rng.random() < 0.2 else other
        cases.append((OPS[rng.integers(6)], dt, (sx, int(rng.integers(lo, hi + 1))),
                      (sc, int(rng.integers(lo, hi + 1))),
                      rng.integers(lo, hi + 1, 5).tolist(), bool(rng.random() < 0.3)))
    return cases


def test_comparisons_with_a_constant_agree_with_ai_edge_litert() -> None:
    forms: set[O] = set()
    devices = ["reference"] + (["litert"] if unavailable() is None else [])
    for op, dt, xq, cq, const, first in _cases():
        data = _model(op, dt, xq, cq, np.asarray(const), first)
        lo = -128 if dt == np.int8 else 0
        q = np.arange(lo, lo + 256).astype(dt).reshape(256, 1)
        want = litert_run(litert(data), [q])[0]
        imported = read_tflite(data)
        forms |= {o.type for o in imported.model.main.operations}
        what = f"{op} x{xq} const{cq} {const} {'first' if first else ''}"
        ref = Reference(imported)
        try:
            np.testing.assert_array_equal(ref.run([q])[0], want, err_msg=f"reference: {what}")
        finally:
            ref.close()
        if "litert" in devices:
            from nnhal.session import Session

            s = Session(imported, device="litert")
            got = next(iter(s.run({s.inputs[0].name: q}).values()))
            np.testing.assert_array_equal(got, want, err_msg=f"litert: {what}")
    assert {O.LOGICAL_AND, O.LOGICAL_OR, O.GREATER_EQUAL, O.LESS_EQUAL} <= forms


def test_comparisons_of_two_tensors_agree_with_ai_edge_litert() -> None:
    """Every stored value against every other: where the HAL's comparison of real values
    would differ (scales that differ, one too fine to rank stored values apart), the
    importer writes the extension's operation of the same name; where it would not (one
    quantization ranking exactly), the HAL's."""
    from nnhal.extensions.tflite_builtins import NAME

    rng = np.random.default_rng(30)
    cases = [("GREATER", np.int8, (0.02, 0), (0.02, 0), False),  # ranks exactly: the HAL's
             ("EQUAL", np.uint8, (0.001, 128), (0.001, 128), True),  # too fine
             ("LESS", np.int8, (0.0123, -5), (0.0456, 7), True)]  # scales differ
    for _ in range(12):
        dt = np.int8 if rng.random() < 0.6 else np.uint8
        lo = -128 if dt == np.int8 else 0
        sa = float(np.float32(10 ** rng.uniform(-3, -0.3)))
        sb = min(float(np.float32(sa * 10 ** rng.uniform(-1, 1))), 0.9)
        cases.append((OPS[rng.integers(6)], dt, (sa, int(rng.integers(lo, lo + 256))),
                      (sb, int(rng.integers(lo, lo + 256))), True))
    devices = ["reference"] + (["litert"] if unavailable() is None else [])
    for op, dt, qa, qb, extension in cases:
        g = tfl.Graph()
        a = g.input([256, 1], dt, quant=tfl.Quant([qa[0]], [qa[1]]))
        b = g.input([1, 256], dt, quant=tfl.Quant([qb[0]], [qb[1]]))
        o = g.tensor([256, 256], np.bool_, "out")
        g.op(op, [a, b], [o])
        g.output(o)
        data = tfl.build(g)
        lo = -128 if dt == np.int8 else 0
        q = np.arange(lo, lo + 256).astype(dt)
        feeds = [q.reshape(256, 1), q.reshape(1, 256)]
        want = litert_run(litert(data), feeds)[0]
        imported = read_tflite(data)
        used = [e.name for e in imported.model.extension_name_to_prefix]
        assert (used == [NAME]) == extension, f"{op} {qa} {qb}: {used}"
        for device in devices:
            from nnhal.session import Session

            s = Session(imported, device=device)
            got = next(iter(s.run(dict(zip((i.name for i in s.inputs), feeds))).values()))
            np.testing.assert_array_equal(got, want, err_msg=f"{device}: {op} {qa} {qb}")
