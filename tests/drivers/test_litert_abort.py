"""The LiteRT driver runs ai-edge-litert in its host process, so an operation TFLite's kernel
would abort on (a failed TFLITE_CHECK) or crash on must never be claimed: the support rule
reads nnhal.tflite.kernel_rules through the exporter. Every model here runs in a child
process, which must exit 0 (a signal is the crash these tests exist to catch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ai_edge_litert.interpreter", reason="ai-edge-litert not installed")

ROOT = Path(__file__).resolve().parents[2]

#: The child: builds each spec's model, prepares it on a fresh LiteRT device and, when it is
#: claimed, runs it there and on the reference driver. One JSON line per model, written
#: before and after, so a death names its model.
_CHILD = r'''
import json, sys
import numpy as np
from nnhal.drivers.litert import LiteRTDevice
from nnhal.drivers.litert.support import supported_operations
from nnhal.drivers.reference import ReferenceDevice
from nnhal.analysis import analyse
from nnhal.hal.builder import RequestBuilder
from nnhal.hal.interfaces import PreparedModelCallback
from nnhal.hal.types import ErrorStatus, ExecutionPreference, MeasureTiming, Priority
sys.path.insert(0, sys.argv[1])
from test_litert_abort import build

def prepare(dev, model):
    cb = PreparedModelCallback()
    launch = dev.prepare_model(model, ExecutionPreference.FAST_SINGLE_ANSWER, Priority.MEDIUM,
                               None, [], [], b"", cb)
    status, pm = cb.wait(60)
    assert isinstance(status, ErrorStatus) and isinstance(launch, ErrorStatus)
    return status, pm

def run(pm, model, inputs):
    rb = RequestBuilder(inputs, model=model)
    try:
        status, _shapes, _ = pm.execute_synchronously(rb.request, MeasureTiming.NO, None, None)
        assert isinstance(status, ErrorStatus)
        got = [rb.output(k).copy() for k in range(len(model.main.output_indexes))] \
            if status == ErrorStatus.NONE else None
        return status, got
    finally:
        rb.close()

lite, ref = LiteRTDevice(threads=1), ReferenceDevice()
for line in sys.stdin:
    spec = json.loads(line)
    print(json.dumps({"start": spec["id"]}), flush=True)
    model, inputs = build(spec)
    try:
        claimed = all(supported_operations(analyse(model, own_constants=False)))
    except Exception as e:  # an invalid model: prepare must answer INVALID_ARGUMENT
        claimed = None
    status, pm = prepare(lite, model)
    res = {"id": spec["id"], "claimed": claimed, "prepare": status.name}
    if status == ErrorStatus.NONE:
        st, got = run(pm, model, inputs)
        res["execute"] = st.name
        rs, rpm = prepare(ref, model)
        if st == ErrorStatus.NONE and rs == ErrorStatus.NONE:
            rst, want = run(rpm, model, inputs)
            if rst == ErrorStatus.NONE:
                res["diff"] = max([int(np.max(np.abs(g.astype(int) - w.astype(int))))
                                   if g.size else 0 for g, w in zip(got, want)] or [0])
    print(json.dumps(res), flush=True)
lite.close(); ref.close()
'''


def run_child(specs: list[dict], timeout: float = 120.0) -> tuple[int, list[dict], str]:
    """Run ``specs`` in one child; (its exit status, its answers, its stderr tail)."""
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    p = subprocess.run([sys.executable, "-c", _CHILD, str(Path(__file__).parent)],
                       input="".join(json.dumps(s) + "\n" for s in specs), text=True,
                       capture_output=True, timeout=timeout, env=env)
    answers = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
    return p.returncode, answers, p.stderr[-2000:]


# ---- the models ---------------------------------------------------------------------------

import numpy as np  # noqa: E402

from nnhal.hal.builder import ModelBuilder  # noqa: E402
from nnhal.hal.types import Model, OperandType, OperationType  # noqa: E402

T, O = OperandType, OperationType
_BINARY = ("ADD", "SUB", "MUL", "MAXIMUM", "MINIMUM")
_COMPARE = ("EQUAL", "LESS", "GREATER_EQUAL")
_UNARY = ("RELU", "RELU1", "RELU6", "HARD_SWISH", "LOGISTIC", "TANH", "SOFTMAX")
_POOL = ("AVERAGE_POOL_2D", "MAX_POOL_2D")
_OTHER = ("CONCATENATION", "FULLY_CONNECTED", "CONV_2D", "DEPTHWISE_CONV_2D", "MEAN")
#: Every operation kind the fuzz builds.
OPS = _BINARY + _COMPARE + _UNARY + _POOL + _OTHER
_TYPES = {"u8": (T.TENSOR_QUANT8_ASYMM, np.uint8), "i8": (T.TENSOR_QUANT8_ASYMM_SIGNED,
                                                           np.int8)}
#: Output quantization the HAL fixes for these (uint8; int8 has zero point - 128).
_FIXED = {"LOGISTIC": (1 / 256, 0), "SOFTMAX": (1 / 256, 0), "TANH": (1 / 128, 128)}


def build(spec: dict) -> tuple[Model, list[np.ndarray]]:
    """The model of one spec and random inputs for it (deterministic in the spec)."""
    op, (qt, dt) = spec["op"], _TYPES[spec["type"]]
    s, z, shape = spec["scales"], spec["zps"], list(spec["shape"])
    rng = np.random.default_rng(spec["id"])
    b = ModelBuilder()
    info = np.iinfo(dt)

    def data(dims: list[int]) -> np.ndarray:
        return rng.integers(info.min, info.max + 1, dims).astype(dt)

    x = b.input(qt, shape, s[0], z[0])
    inputs = [data(shape)]
    i32 = b.scalar
    if op in _BINARY or op in _COMPARE or op == "CONCATENATION":
        y = b.input(qt, shape, s[1], z[1])
        inputs.append(data(shape))
        if op in _COMPARE:
            out = b.output(T.TENSOR_BOOL8, shape)
            b.operation(O[op], [x, y], [out])
        elif op == "CONCATENATION":
            out = b.output(qt, shape[:-1] + [2 * shape[-1]], s[2], z[2])
            b.operation(O[op], [x, y, i32(T.INT32, len(shape) - 1)], [out])
        else:
            out = b.output(qt, shape, s[2], z[2])
            extra = [i32(T.INT32, 0)] if op in ("ADD", "SUB", "MUL") else []
            b.operation(O[op], [x, y, *extra], [out])
    elif op in _UNARY:
        scale, zp = _FIXED.get(op, (s[0], z[0]) if op.startswith("RELU") else (s[2], z[2]))
        zp -= 128 if op in _FIXED and qt == T.TENSOR_QUANT8_ASYMM_SIGNED else 0
        out = b.output(qt, shape, scale, zp)
        extra = [b.scalar(T.FLOAT32, 1.0)] if op == "SOFTMAX" else []
        b.operation(O[op], [x, *extra], [out])
    elif op in _POOL:
        out = b.output(qt, shape, s[0], z[0])
        b.operation(O[op], [x] + [i32(T.INT32, v) for v in (1, 1, 1, 2, 2, 0)], [out])
    elif op == "MEAN":
        out = b.output(qt, shape[:-1] + [1], s[2], z[2])
        b.operation(O[op], [x, b.constant(T.TENSOR_INT32, np.array([len(shape) - 1], np.int32),
                                          [1]), i32(T.INT32, 1)], [out])
    else:  # FULLY_CONNECTED, CONV_2D, DEPTHWISE_CONV_2D: a constant filter, an exact bias
        c, units = shape[-1], 3
        wshape = {"FULLY_CONNECTED": [units, c], "CONV_2D": [units, 1, 1, c],
                  "DEPTHWISE_CONV_2D": [1, 1, 1, c]}[op]
        w = b.constant(qt, data(wshape), wshape, s[1], z[1])
        n = wshape[0] if op != "DEPTHWISE_CONV_2D" else c
        bias = b.constant(T.TENSOR_INT32, rng.integers(-100, 100, [n]).astype(np.int32), [n],
                          float(np.float32(s[0]) * np.float32(s[1])), 0)
        oshape = shape[:-1] + [n]
        out = b.output(qt, oshape, s[2], z[2])
        if op == "FULLY_CONNECTED":
            params = [0]
        elif op == "CONV_2D":
            params = [1, 1, 1, 0]
        else:
            params = [1, 1, 1, 1, 0]
        b.operation(O[op], [x, w, bias] + [i32(T.INT32, v) for v in params], [out])
    return b.build(), inputs


_EDGES = (1e-38, 1.2e-38, 1e-30, 1e-10, 1e-5, 1 / 256, 0.5, 1.0, 3.0, 1e5, 1e10, 1e30,
          1.7e38, 3.4e38)


def specs(seed: int, n: int) -> list[dict]:
    """``n`` models: each operation kind in turn, scales drawn from the edges of float32
    and log-uniformly over 1e-38..1e38, zero points at the type's ends or anywhere, 2-D to
    4-D shapes up to 64 x 64 x 8."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        op = OPS[k % len(OPS)]
        typ = ("u8", "i8")[int(rng.integers(2))]
        lo, hi = np.iinfo(_TYPES[typ][1]).min, np.iinfo(_TYPES[typ][1]).max
        scales = [float(rng.choice(_EDGES)) if rng.random() < 0.5 else
                  float(10 ** rng.uniform(-38, 38)) for _ in range(3)]
        plausible = rng.random() < 0.3  # so that some models are claimed and run
        if plausible:
            scales = [float(10 ** rng.uniform(-3, 0)) for _ in range(3)]
        zps = [int(rng.choice([lo, hi, 0 if lo < 0 else 128])) if rng.random() < 0.6 else
               int(rng.integers(lo, hi + 1)) for _ in range(3)]
        rank = 4 if op in _POOL or op in ("CONV_2D", "DEPTHWISE_CONV_2D") else \
            int(rng.integers(2, 5))
        shape = [1] + [int(rng.choice([1, 2, 3, 7, 64])) for _ in range(rank - 2)] + \
            [int(rng.choice([1, 2, 8]))]
        out.append({"id": seed * 100000 + k, "op": op, "type": typ, "scales": scales,
                    "zps": zps, "shape": shape, "plausible": plausible})
    return out


#: One model per rule of nnhal.tflite.kernel_rules that guards a crash, each of which
#: killed the child before the rule: (operation, type, input scales and output scale).
CRASHERS = {
    "add_output_multiplier_not_below_1": ("ADD", "u8", [1.0, 1.0, 1e-7]),
    "sub_doubled_input_scale_overflows": ("SUB", "u8", [3e38, 1.0, 1.0]),
    "sub_output_scale_times_2_20_overflows": ("SUB", "i8", [1.0, 1.0, 1e33]),
    "subnormal_scale_requantized": ("MAXIMUM", "u8", [1.0, 1.0, 1e-38]),
}


@pytest.mark.parametrize("name", sorted(CRASHERS))
def test_rule_keeps_the_process_alive(name: str) -> None:
    """Prepared on LiteRT in a child: a HAL error, not a death; and the support decision
    refuses the operation, so the runtime places it on the reference driver."""
    op, typ, scales = CRASHERS[name]
    spec = {"id": 1, "op": op, "type": typ, "scales": scales, "zps": [0, 0, 0],
            "shape": [1, 4], "plausible": False}
    rc, answers, err = run_child([spec])
    assert rc == 0, f"the child died (status {rc}):\n{err}"
    (answer,) = [a for a in answers if "prepare" in a]
    assert answer["claimed"] is False
    assert answer["prepare"] not in ("NONE",), answer


FUZZ_MODELS = 1000


def test_fuzz_extreme_quantization_never_kills_the_process() -> None:
    """1000 models of 20 operation kinds with extreme quantization, each prepared on a fresh
    LiteRT device and run when prepared, in one child: it must exit 0 (never a signal),
    every answer a HAL status, and every claimed model that runs agree with the reference
    driver within one quantization step (the LiteRT tests' quant8 tolerance)."""
    todo = specs(7, FUZZ_MODELS)
    rc, answers, err = run_child(todo, timeout=300)
    done = [a for a in answers if "prepare" in a]
    assert rc == 0, (f"child died (status {rc}) on model {answers[-1] if answers else None}:"
                     f" {todo[len(done)] if len(done) < len(todo) else None}\n{err}")
    assert len(done) == len(todo)
    # Only plausible scales are compared: with extreme ones TFLite and the reference round
    # differently (flushed multipliers, saturation), by more than a step in a few percent.
    far = [(a, s) for a, s in zip(done, todo) if a.get("diff", 0) > 1 and s["plausible"]]
    assert not far, far[:5]
    # The fuzz is not vacuous: some models are claimed, prepared and run.
    assert sum(a.get("execute") == "NONE" for a in done) > FUZZ_MODELS // 10
