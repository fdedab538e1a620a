"""The 8-bit DEPTHWISE_CONV_2D kernels on MobileNetV2's depthwise layers (224x224, int8 data,
per-channel filters): the numpy path against the native C kernel, bound as the executor binds
them (``kernel_into``), timed interleaved (one numpy call, one native call, ...) so both see
the same load. Prints the median time per layer and the totals, with /proc/loadavg; asserts
only that both give identical bytes.

    python benchmarks/bench_q8_depthwise.py [--rounds N] [--act relu6|none]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a script: make the worktree importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nnhal.hal.types import OperandType, OperationType  # noqa: E402
from nnhal.ops import conv, native  # noqa: E402
from nnhal.ops.catalog import check_operation, lookup  # noqa: E402
from nnhal.ops.resolver import OpContext  # noqa: E402
from nnhal.ops.testing import output, tensor  # noqa: E402

S8 = OperandType.TENSOR_QUANT8_ASYMM_SIGNED
PC = OperandType.TENSOR_QUANT8_SYMM_PER_CHANNEL
I32 = OperandType.TENSOR_INT32

#: (input height = width, channels, stride) of MobileNetV2 224's depthwise layers, with count
LAYERS = ((112, 32, 1, 1), (112, 96, 2, 1), (56, 144, 1, 1), (56, 144, 2, 1), (28, 192, 1, 2),
          (28, 192, 2, 1), (14, 384, 1, 4), (14, 576, 1, 2), (14, 576, 2, 1), (7, 960, 1, 3))


def load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def bind(hw: int, c: int, stride: int, act: int, native_q8: bool, rng) -> tuple:
    x = rng.integers(-128, 128, (1, hw, hw, c)).astype(np.int8)
    f = rng.integers(-127, 128, (1, 3, 3, c)).astype(np.int8)
    scales = list(10 ** rng.uniform(-2.5, -1.5, c).astype(np.float32))
    bias = rng.integers(-3000, 3000, c).astype(np.int32)
    pad = (0, 1, 0, 1) if stride == 2 else (1, 1, 1, 1)  # SAME
    ins = [tensor(S8, x, 0.02, -5), tensor(PC, f, const=True, channel_scales=scales,
                                           channel_dim=3),
           tensor(I32, bias, 0.0, 0, const=True)]
    ins += [tensor(OperandType.INT32, np.int32(v)) for v in
            (pad[2], pad[3], pad[0], pad[1], stride, stride, 1, act)]
    op = OperationType.DEPTHWISE_CONV_2D
    d = lookup(op)
    oh = -(-hw // stride)
    ctx = OpContext(op_type=op, inputs=[i for i, _ in ins],
                    outputs=[output(S8, (1, oh, oh, c), 0.03, -128 if act else 3)])
    check_operation(d, ctx)
    saved = conv.NATIVE_Q8_DEPTHWISE
    conv.NATIVE_Q8_DEPTHWISE = native_q8
    try:
        run = d.kernel_into(ctx)
    finally:
        conv.NATIVE_Q8_DEPTHWISE = saved
    return run, [v for _, v in ins], np.empty((1, oh, oh, c), np.int8)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--act", choices=("relu6", "none"), default="relu6")
    args = ap.parse_args()
    if native.library() is None:
        sys.exit(f"native kernels not loaded: {native.status()}")
    act = 3 if args.act == "relu6" else 0
    print(f"load before: {load()}   act {args.act}   rounds {args.rounds}")
    tot_np = tot_c = 0.0
    for hw, c, stride, count in LAYERS:
        rng = np.random.default_rng(hw * 1000 + c + stride)
        run_np, vals, out_np = bind(hw, c, stride, act, False, rng)
        rng = np.random.default_rng(hw * 1000 + c + stride)
        run_c, _, out_c = bind(hw, c, stride, act, True, rng)
        run_np(vals, [out_np], None)
        run_c(vals, [out_c], None)
        assert np.array_equal(out_np, out_c), (hw, c, stride)
        t_np, t_c = [], []
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            run_np(vals, [out_np], None)
            t1 = time.perf_counter()
            run_c(vals, [out_c], None)
            t2 = time.perf_counter()
            t_np.append(t1 - t0)
            t_c.append(t2 - t1)
        a, b = statistics.median(t_np) * 1e3, statistics.median(t_c) * 1e3
        tot_np += a * count
        tot_c += b * count
        print(f"{hw:4d}x{hw:<4d}x{c:<4d} s{stride} x{count}: numpy {a:7.3f} ms  native {b:7.3f} ms"
              f"  ({a / b:4.2f}x)")
    print(f"all 17 layers: numpy {tot_np:.2f} ms  native {tot_c:.2f} ms  ({tot_np / tot_c:.2f}x)")
    print(f"load after: {load()}")


if __name__ == "__main__":
    main()
