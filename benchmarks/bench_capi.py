"""Per-execution cost of one 2x2 float ADD (create, two setInput, setOutput, compute, free) on
the reference device: through the Python runtime (nnhal.runtime.ndk), through
libneuralnetworks.so from Python (ctypes, in-process), and from a C program (the library
starting Python itself). Interleaved rounds; prints medians in microseconds with the load.

    python benchmarks/bench_capi.py [--rounds R] [--n N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from nnhal.capi import ctypes_ndk
from nnhal.capi.build import INCLUDE_DIR, compiler, library_dir
from nnhal.runtime import ndk
from nnhal.runtime.model import ANeuralNetworksOperandType


def compilation(api):
    _, m = api.ANeuralNetworksModel_create()
    t = ANeuralNetworksOperandType(3, [2, 2])
    for ot in (t, t, ANeuralNetworksOperandType(1), t):
        api.ANeuralNetworksModel_addOperand(m, ot)
    api.ANeuralNetworksModel_setOperandValue(m, 2, np.zeros(1, np.int32), 4)
    api.ANeuralNetworksModel_addOperation(m, 0, [0, 1, 2], [3])
    api.ANeuralNetworksModel_identifyInputsAndOutputs(m, [0, 1], [3])
    assert api.ANeuralNetworksModel_finish(m) == 0
    _, c = api.ANeuralNetworksCompilation_create(m)
    assert api.ANeuralNetworksCompilation_finish(c) == 0
    return m, c


def per_execution_us(api, comp, n: int) -> float:
    a = np.arange(4, dtype=np.float32)
    b = np.ones(4, np.float32)
    o = np.zeros(4, np.float32)
    t0 = time.perf_counter()
    for _ in range(n):
        _, e = api.ANeuralNetworksExecution_create(comp)
        api.ANeuralNetworksExecution_setInput(e, 0, None, a, 16)
        api.ANeuralNetworksExecution_setInput(e, 1, None, b, 16)
        api.ANeuralNetworksExecution_setOutput(e, 0, None, o, 16)
        assert api.ANeuralNetworksExecution_compute(e) == 0
        api.ANeuralNetworksExecution_free(e)
    assert o.tolist() == [1, 2, 3, 4]
    return (time.perf_counter() - t0) / n * 1e6


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--n", type=int, default=300)
    args = p.parse_args()
    libdir, why = library_dir()
    if libdir is None:
        print(f"no library: {why}")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "bench_capi"
        subprocess.run([*compiler(), "-O2", f"-I{INCLUDE_DIR}",
                        str(Path(__file__).with_name("bench_capi.c")), f"-L{libdir}",
                        "-lneuralnetworks", "-o", str(exe)], check=True)
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME")}
        env["LD_LIBRARY_PATH"] = str(libdir)
        py = compilation(ndk)
        capi = compilation(ctypes_ndk)
        per_execution_us(ndk, py[1], 20)
        per_execution_us(ctypes_ndk, capi[1], 20)
        res: dict[str, list[float]] = {"python runtime (ndk.py)": [],
                                       "C API via ctypes, in-process": [],
                                       "C API from a C program": []}
        for _ in range(args.rounds):
            res["python runtime (ndk.py)"].append(per_execution_us(ndk, py[1], args.n))
            res["C API via ctypes, in-process"].append(
                per_execution_us(ctypes_ndk, capi[1], args.n))
            out = subprocess.run([str(exe), "1", str(args.n)], env=env, capture_output=True,
                                 text=True, check=True).stdout
            res["C API from a C program"].append(float(out))
    print(f"load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    for name, v in res.items():
        print(f"{name:32s} median {statistics.median(v):8.1f} us/execution  "
              f"(min {min(v):.1f}, max {max(v):.1f}; {args.rounds} rounds x {args.n})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
