"""Per-call time of the FMQ packet codec on the burst's ADD packet (issue 15), the fast forms
(``pack_request`` & co.) against the datum path they fall back to (kept as the reference), in
interleaved rounds. Prints the median over rounds of each round's best per-call time, the
ratio, and the load; asserts nothing.

The packet is the one a served ADD [1,16] burst execution sends: 2 inputs and 1 output of
dimensions [1, 16], 3 pools (a 336-byte request), and its result (one output shape, a timing:
120 bytes). ``--big`` adds a packet of 4 operands with 64 dimensions each and 16 pools.
``--burst`` adds a whole packet round in process, without the ring: pack_request, the
reference driver's ``DriverBurst.execute_packet`` (which decodes the request and encodes the result)
and unpack_result, once with the fast codec and once with the datum path patched in.

    python benchmarks/bench_fmq.py [--rounds R] [--n N] [--big] [--burst]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the worktree importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nnhal.hal.types import (  # noqa: E402
    DataLocation,
    ErrorStatus,
    MeasureTiming,
    OutputShape,
    Request,
    RequestArgument,
    Timing,
)
from nnhal.hidl import fmq  # noqa: E402


def per_call(f: Callable[[], object], n: int) -> float:
    """Best of 3 runs of ``n`` calls, in microseconds per call."""
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        best = min(best, time.perf_counter() - t0)
    return best / n * 1e6


def cases(big: bool) -> dict[str, tuple[Callable[[], object], Callable[[], object]]]:
    """name -> (fast call, reference call)."""
    dims = list(range(1, 65)) if big else [1, 16]
    n_in, n_pools = (3, 16) if big else (2, 3)
    args = [RequestArgument(False, DataLocation(k, 0, 64), dims) for k in range(n_in + 1)]
    request = Request(args[:n_in], args[n_in:], [None] * n_pools)
    slots = list(range(n_pools))
    packet = fmq.pack_request(request, MeasureTiming.NO, slots)
    shapes = [OutputShape(dims)]
    timing = Timing(12, 15)
    result = fmq.pack_result(ErrorStatus.NONE, shapes, timing)
    assert packet == fmq._pack_request_reference(request, MeasureTiming.NO, slots)
    assert fmq.unpack_request(packet) == fmq._unpack_request_reference(packet)
    assert fmq.unpack_result(result) == fmq._unpack_result_reference(result)
    tag = f" ({len(packet)} B)" if big else ""
    return {
        f"pack_request{tag}": (lambda: fmq.pack_request(request, MeasureTiming.NO, slots),
                               lambda: fmq._pack_request_reference(request, MeasureTiming.NO,
                                                                   slots)),
        f"unpack_request{tag}": (lambda: fmq.unpack_request(packet),
                                 lambda: fmq._unpack_request_reference(packet)),
        "pack_result": (lambda: fmq.pack_result(ErrorStatus.NONE, shapes, timing),
                        lambda: fmq._pack_result_reference(ErrorStatus.NONE, shapes, timing)),
        "unpack_result": (lambda: fmq.unpack_result(result),
                          lambda: fmq._unpack_result_reference(result)),
    }


def burst_case() -> tuple[Callable[[], object], Callable[[], object]]:
    """(fast, reference) whole packet rounds through a reference driver's burst."""
    import numpy as np

    from nnhal.drivers.common import burst as burst_module
    from nnhal.drivers.reference import ReferenceDevice
    from nnhal.hal.builder import ModelBuilder, RequestBuilder
    from nnhal.hal.interfaces import PreparedModelCallback
    from nnhal.hal.types import ExecutionPreference, OperandType, OperationType, Priority

    b = ModelBuilder()
    x = b.input(OperandType.TENSOR_FLOAT32, [1, 16])
    y = b.input(OperandType.TENSOR_FLOAT32, [1, 16])
    out = b.output(OperandType.TENSOR_FLOAT32, [1, 16])
    b.operation(OperationType.ADD, [x, y, b.scalar(OperandType.INT32, 0)], [out])
    cb = PreparedModelCallback()
    ReferenceDevice().prepare_model(b.build(), ExecutionPreference.SUSTAINED_SPEED,
                                    Priority.MEDIUM, None, [], [], b"", cb)
    status, pm = cb.wait(60)
    if status != ErrorStatus.NONE:
        raise SystemExit(f"prepareModel failed: {status.name}")
    status, burst = pm.configure_execution_burst()
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    rb = RequestBuilder([a, a], [a.nbytes])  # two pools: inputs, outputs
    memories = {0: rb.input_memory, 1: rb.output_memory}

    def fast() -> object:
        packet = fmq.pack_request(rb.request, MeasureTiming.NO, [0, 1])
        return fmq.unpack_result(burst.execute_packet(packet, memories))

    def reference() -> object:
        burst_module.unpack_request = fmq._unpack_request_reference
        burst_module.pack_result = fmq._pack_result_reference
        try:
            packet = fmq._pack_request_reference(rb.request, MeasureTiming.NO, [0, 1])
            return fmq._unpack_result_reference(burst.execute_packet(packet, memories))
        finally:
            burst_module.unpack_request = fmq.unpack_request
            burst_module.pack_result = fmq.pack_result

    got = fast()
    assert got == reference() and got[0] == ErrorStatus.NONE, got
    return fast, reference


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--n", type=int, default=2000, help="calls per timed run")
    ap.add_argument("--big", action="store_true", help="also a packet with many dimensions")
    ap.add_argument("--burst", action="store_true", help="also a packet round through a burst")
    a = ap.parse_args()
    table = cases(False)
    if a.big:
        big = cases(True)
        table.update({k: v for k, v in big.items() if "B)" in k})
    if a.burst:
        table["burst round (2 pools)"] = burst_case()
    print(f"load before: {os.getloadavg()[0]:.2f}")
    times: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in table}
    for r in range(a.rounds):
        for name, (fast, ref) in table.items():  # interleaved: fast and reference alike
            order = ((0, fast), (1, ref)) if r % 2 == 0 else ((1, ref), (0, fast))
            for i, f in order:
                n = a.n if i == 0 else max(1, a.n // 10)
                times[name][i].append(per_call(f, n))
    print(f"{'call':28s} {'before (datum path)':>20s} {'after (fast)':>13s} {'ratio':>7s}")
    for name, (fast, ref) in times.items():
        b, f = statistics.median(ref), statistics.median(fast)
        print(f"{name:28s} {b:17.2f} us {f:10.2f} us {b / f:6.1f}x")
    print(f"load after: {os.getloadavg()[0]:.2f} (1-min), rounds {a.rounds}")


if __name__ == "__main__":
    main()
