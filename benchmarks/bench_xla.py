"""The XLA driver on this machine: MobileNetV2 224 float32 (the TFLite converter's file)
through ``Session(path, device=...)`` on xla, LiteRT and the reference driver in interleaved
rounds (median of per-round ratios), the outputs' largest difference from the reference, and
prepareModel against prepareModelFromCache, each the first call of a fresh process sharing a
cache key file (as when an app starts again). Asserts nothing; prints /proc/loadavg with
every figure. Quantized models too (integer inputs get random values of their whole range;
a streaming model's state is carried from call to call, as in an app), e.g. the wake-word
models of pymicro-wakeword with ``--fresh 0``.

    python benchmarks/bench_xla.py [--model FILE] [--rounds N] [--fresh N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

TOKEN = bytes(range(32))
DEFAULT_MODEL = "/work/bench-models/mobilenet_v2.tflite"


def load() -> str:
    return Path("/proc/loadavg").read_text().split(" ", 3)[:3].__str__()


def logits_model(model: str):
    """The model with its final SOFTMAX made an identity (the logits out): a random-weight
    MobileNet's probabilities are all 1/1000, its logits are not, so they are compared."""
    from nnhal.hal.types import OperationType
    from nnhal.tflite import read_tflite

    m = read_tflite(model).model
    main = m.main
    last = main.operations[-1]
    if last.type != OperationType.SOFTMAX or last.outputs != main.output_indexes:
        return None
    # The SOFTMAX becomes MAXIMUM(x, x): x itself, the model's output.
    x, beta = last.inputs[0], last.inputs[1]
    last.type = int(OperationType.MAXIMUM)
    last.inputs = [x, x]
    main.operands[x].number_of_consumers += 1
    main.operands[beta].number_of_consumers -= 1
    return m


def compare_logits(model: str) -> None:
    from nnhal.session import Session

    m = logits_model(model)
    if m is None:
        return
    outs = []
    for dev in ("xla", "reference"):
        s = Session(m, device=dev)
        feeds = {i.name: np.random.default_rng(0).random(i.shape, np.float32) for i in s.inputs}
        outs.append(next(iter(s.run(feeds).values())))
    span = float(np.ptp(outs[1])) or 1.0
    print(f"logits (the SOFTMAX made an identity): xla - reference max |diff| "
          f"{np.abs(outs[0] - outs[1]).max():.3g}, {np.abs(outs[0] - outs[1]).max() / span:.2g}"
          f" of their range {span:.3g}")


def feed(info, rng: np.random.Generator) -> np.ndarray:
    """Random values for one input: [0, 1) for floats, the whole range for integers."""
    dtype = np.dtype(info.dtype)
    if dtype.kind in "iu":
        lim = np.iinfo(dtype)
        return rng.integers(lim.min, lim.max, info.shape, endpoint=True).astype(dtype)
    return rng.random(info.shape).astype(dtype)


def interleaved(model: str, rounds: int) -> None:
    from nnhal.drivers.registry import reason
    from nnhal.session import Session

    names = [n for n in ("xla", "litert", "reference") if reason(n) is None]
    sessions = {n: Session(model, device=n) for n in names}
    first = sessions["xla"]
    rng = np.random.default_rng(0)
    feeds = {i.name: feed(i, rng) for i in first.inputs}
    outs = {n: s.run(feeds) for n, s in sessions.items()}
    for k, ref in outs["reference"].items():
        got, ref = outs["xla"][k], ref.astype(np.float64)
        got = got.astype(np.float64)
        scale = float(np.abs(ref).max()) or 1.0
        print(f"output {k}: xla - reference max |diff| {np.abs(got - ref).max():.3g} "
              f"(largest |value| {scale:.3g})")
    times: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(rounds):
        for n, s in sessions.items():
            t = time.perf_counter()
            s.run(feeds)
            times[n].append(time.perf_counter() - t)
    for n in names:
        ratio = statistics.median(a / b for a, b in zip(times["xla"], times[n]))
        print(f"{n:10s} median {statistics.median(times[n]) * 1e3:7.2f} ms  "
              f"xla/{n} {ratio:.2f}x  load {load()}")


_CHILD = r"""
import sys, time
t0 = time.perf_counter()
from nnhal.drivers.xla import XlaDevice
from nnhal.hal.interfaces import PreparedModelCallback
from nnhal.hal.types import ErrorStatus, ExecutionPreference, Priority
from nnhal.tflite import read_tflite
import os
mode, model_path, mc, dc = sys.argv[1:5]
token = bytes(range(32))
model = read_tflite(model_path).model if mode == "prepare" else None
dev = XlaDevice(cache_key_file=os.environ["NNHAL_CACHE_KEY_FILE"])
fm = os.open(mc, os.O_RDWR | os.O_CREAT, 0o600)
fd = os.open(dc, os.O_RDWR | os.O_CREAT, 0o600)
cb = PreparedModelCallback()
t = time.perf_counter()
if mode == "prepare":
    dev.prepare_model(model, ExecutionPreference.FAST_SINGLE_ANSWER, Priority.MEDIUM, None,
                      [fm], [fd], token, cb)
else:
    dev.prepare_model_from_cache(None, [fm], [fd], token, cb)
status, pm = cb.wait(600)
took = time.perf_counter() - t
assert status == ErrorStatus.NONE, status
print(f"{took * 1e3:.1f}")
"""


def fresh(model: str, n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, NNHAL_CACHE_KEY_FILE=str(Path(tmp) / "key"))
        mc, dc = str(Path(tmp) / "model.cache"), str(Path(tmp) / "data.cache")
        prep, rest = [], []
        for _ in range(n):
            for mode, into in (("prepare", prep), ("restore", rest)):
                out = subprocess.run([sys.executable, "-c", _CHILD, mode, model, mc, dc],
                                     env=env, capture_output=True, text=True, check=True)
                into.append(float(out.stdout.strip().splitlines()[-1]))
        print(f"fresh processes: prepare {statistics.median(prep):.0f} ms, "
              f"prepare from cache {statistics.median(rest):.1f} ms: "
              f"{statistics.median(prep) / statistics.median(rest):.0f}x "
              f"(data cache {os.path.getsize(dc) / 1e6:.1f} MB)  load {load()}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--fresh", type=int, default=3)
    args = ap.parse_args()
    compare_logits(args.model)
    interleaved(args.model, args.rounds)
    if args.fresh:
        fresh(args.model, args.fresh)


if __name__ == "__main__":
    main()
