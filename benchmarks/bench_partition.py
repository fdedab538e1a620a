"""A real model partitioned by the NNAPI runtime across the reference and LiteRT drivers:
the plan and the time per execution of each compilation. Prints figures; asserts nothing.

Compilations (each through nnhal.runtime, executions by ``compute`` on a new Execution):

- reference alone and litert alone (createForDevices, one device: no runtime memory);
- plain create over every available device (the runtime's own choice);
- reference + litert claiming only CONV_2D and DEPTHWISE_CONV_2D (a wrapper over the LiteRT
  driver): LiteRT runs every model it imports whole, so this forces a real split, and shows
  what crossing steps costs (every crossing value goes through runtime memory).

    python benchmarks/bench_partition.py [MODEL.tflite] [--n N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from nnhal.conformance.mode_partitioned import HalfDevice
from nnhal.drivers.registry import available, open_device
from nnhal.hal.types import OperandType, OperationType
from nnhal.runtime import Compilation, Device, Execution
from nnhal.runtime import NdkModel as RtModel
from nnhal.tflite import read_tflite


def timed(c: Compilation, model, inputs: list[np.ndarray], n: int) -> tuple[float, list]:
    main = model.main
    outs = []
    for idx in main.output_indexes:
        o = main.operands[idx]
        outs.append(np.zeros(int(np.prod(o.dimensions)), OperandType(o.type).dtype))
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        e = Execution(c)
        for k, x in enumerate(inputs):
            e.set_input(k, None, x)
        for k, o in enumerate(outs):
            e.set_output(k, None, o)
        e.compute()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3, [o.copy() for o in outs]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default="/tmp/mobilenet_v1.tflite")
    ap.add_argument("--n", type=int, default=10)
    args = ap.parse_args()
    if available().get("litert") is not None:
        print(f"litert not available: {available()['litert']}")
        return
    imported = read_tflite(args.model)
    hal = imported.model
    rng = np.random.default_rng(0)
    inputs = []
    for idx in hal.main.input_indexes:
        o = hal.main.operands[idx]
        t = OperandType(o.type)
        inputs.append(rng.random(o.dimensions).astype(t.dtype) if t.dtype.kind == "f"
                      else rng.integers(0, 8, o.dimensions).astype(t.dtype))
    ref = Device("reference", open_device("reference"))
    lit = Device("litert", open_device("litert"))
    conv = frozenset({int(OperationType.CONV_2D), int(OperationType.DEPTHWISE_CONV_2D)})
    lit_conv = Device("litert[conv]", HalfDevice(conv, open_device("litert")))
    load = os.getloadavg()
    print(f"{os.path.basename(args.model)}: {len(hal.main.operations)} operations; load "
          f"average {load[0]:.2f} {load[1]:.2f} on {os.cpu_count()} cores; median of {args.n}")
    results = {}
    for label, devs in (("reference alone", [ref]), ("litert alone", [lit]),
                        ("plain create (all devices)", None),
                        ("reference + litert[conv only]", [ref, lit_conv])):
        c = Compilation(RtModel.from_hal(hal), devs)
        t0 = time.perf_counter()
        c.finish()
        prep = (time.perf_counter() - t0) * 1e3
        plan = c.plan()
        ms, outs = timed(c, hal, inputs, args.n)
        results[label] = outs
        per_dev: dict[str, int] = {}
        for s in plan:
            per_dev[s["device"]] = per_dev.get(s["device"], 0) + len(s["operations"])
        crossing = sum(len(s["inputs"]) for s in plan[1:])
        print(f"  {label:32s} {ms:9.2f} ms/execution  (finish {prep:7.1f} ms)  "
              f"{len(plan)} steps, ops per device {per_dev}, values crossing steps "
              f"{crossing}")
        c.free()
    base = results["reference alone"]
    for label, outs in results.items():
        err = max(float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
                  for a, b in zip(outs, base))
        total = sum(float(o.sum()) for o in outs)
        print(f"  max |difference| from reference alone: {label}: {err:.3g} (outputs sum "
              f"{total:.4f})")


if __name__ == "__main__":
    main()
