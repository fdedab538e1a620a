"""The XLA driver on this machine: MobileNetV2 224 float32 (the TFLite converter's file)
through ``Session(path, device=...)`` on xla, LiteRT and the reference driver in interleaved
rounds (median of per-round ratios), the outputs' largest difference from the reference, and
prepareModel against prepareModelFromCache, each the first call of a fresh process sharing a
cache key file (as when an app starts again). Asserts nothing; prints /proc/loadavg with
every figure. Quantized models too (integer inputs get random values of their whole range;
a streaming model's state is carried from call to call, as in an app), e.g. the wake-word
models of pymicro-wakeword with ``--fresh 0``.

Parts (``--parts``, comma-separated; default ``logits,compare,fresh``):

* ``logits``: the xla outputs' difference from the reference's (the SOFTMAX made an identity).
* ``compare``: ``Session(path, device=...)`` on xla, LiteRT and the reference, interleaved
  (LiteRT skipped, saying so, where ai-edge-litert is not installed: the GPU box).
* ``relaxed``: the same model on xla, float32 against relaxed (``relaxComputationFloat32to
  Float16``: float16 compute on a GPU, or where ``NNHAL_XLA_RELAXED=float16`` forces it).
* ``fresh``: prepare against prepare-from-cache in fresh processes.
* ``overhead``: one ADD [1,16] through ``executeSynchronously``, a burst and the engine's own
  call, against the bare XLA executable on device arrays (the floor): what an execution
  costs beyond the device's own work.
* ``components``: where an execution of the model on xla spends its time, float32 and
  relaxed: the executable on device inputs, each transfer (the input from a numpy array and
  from shared memory, float16 input, pinned host memory, the output back), ``run_host``,
  ``executeSynchronously``, a burst and ``Session.run`` (medians of 7 rounds of ``--calls``).
* ``roundtrip``: two executions chained through an IBuffer (execution 1 writes it, execution
  2 reads it; the data stays in device memory) against the same chain through shared memory
  (``--shape``: the tensor's dimensions).

    python benchmarks/bench_xla.py [--model FILE] [--rounds N] [--fresh N] [--parts P,...]
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

    names = []
    for n in ("xla", "litert", "reference"):
        why = reason(n)
        if why is None:
            names.append(n)
        else:
            print(f"{n}: skipped ({why})")
    sessions = {n: Session(model, device=n) for n in names}
    first = sessions["xla"]
    rng = np.random.default_rng(0)
    feeds = {i.name: feed(i, rng) for i in first.inputs}
    outs = {n: s.run(feeds) for n, s in sessions.items()}
    base = "reference" if "reference" in outs else names[-1]
    for k, ref in outs[base].items():
        got, ref = outs["xla"][k], ref.astype(np.float64)
        got = got.astype(np.float64)
        scale = float(np.abs(ref).max()) or 1.0
        print(f"output {k}: xla - {base} max |diff| {np.abs(got - ref).max():.3g} "
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


def relaxed(model: str, rounds: int) -> None:
    """xla on the model as it is and marked relaxed, interleaved."""
    from nnhal.session import Session
    from nnhal.tflite import read_tflite

    # The logits where the model ends in a SOFTMAX (a random-weight MobileNet's
    # probabilities are all about 1/1000: they would hide any difference).
    exact = logits_model(model) or read_tflite(model).model
    fast = logits_model(model) or read_tflite(model).model
    fast.relax_computation_float32_to_float16 = True
    sessions = {"float32": Session(exact, device="xla"), "relaxed": Session(fast, device="xla")}
    rng = np.random.default_rng(0)
    feeds = {i.name: feed(i, rng) for i in sessions["float32"].inputs}
    outs = {n: s.run(feeds) for n, s in sessions.items()}
    for k, ref in outs["float32"].items():
        got = outs["relaxed"][k].astype(np.float64)
        ref = ref.astype(np.float64)
        span = float(np.ptp(ref)) or 1.0
        tiny = " (below float16's normal range: random weights, float16 underflows)" \
            if span < float(np.finfo(np.float16).tiny) else ""
        print(f"output {k}: relaxed - float32 max |diff| {np.abs(got - ref).max():.3g} "
              f"({np.abs(got - ref).max() / span:.2g} of its range {span:.3g}){tiny}")
    times: dict[str, list[float]] = {n: [] for n in sessions}
    for _ in range(rounds):
        for n, s in sessions.items():
            t = time.perf_counter()
            s.run(feeds)
            times[n].append(time.perf_counter() - t)
    ratio = statistics.median(a / b for a, b in zip(times["relaxed"], times["float32"]))
    print(f"xla float32 median {statistics.median(times['float32']) * 1e3:7.3f} ms, relaxed "
          f"{statistics.median(times['relaxed']) * 1e3:7.3f} ms (relaxed/float32 {ratio:.2f}x; "
          f"{_relaxed_mode()})  load {load()}")


def _relaxed_mode() -> str:
    from nnhal.drivers.xla.engine import default_device, relaxed_dtype

    return f"relaxed computes in {relaxed_dtype(default_device()) or 'float32'} on " \
           f"{default_device().platform}"


def _prepare(device, model):
    from nnhal.hal.interfaces import PreparedModelCallback
    from nnhal.hal.types import ErrorStatus, ExecutionPreference, Priority

    cb = PreparedModelCallback()
    device.prepare_model(model, ExecutionPreference.SUSTAINED_SPEED, Priority.MEDIUM, None,
                         [], [], b"", cb)
    status, pm = cb.wait(600)
    if status != ErrorStatus.NONE:
        raise SystemExit(f"prepare failed: {status!r}")
    return pm


def _add_model(shape: tuple[int, ...]):
    from nnhal.hal.builder import ModelBuilder
    from nnhal.hal.types import OperandType, OperationType

    b = ModelBuilder()
    x = b.input(OperandType.TENSOR_FLOAT32, shape)
    y = b.input(OperandType.TENSOR_FLOAT32, shape)
    act = b.scalar(OperandType.INT32, 0)
    out = b.output(OperandType.TENSOR_FLOAT32, shape)
    b.operation(OperationType.ADD, [x, y, act], [out])
    return b.build()


def _rounds(paths: dict, rounds: int, calls: int) -> dict[str, float]:
    """Per path the median over ``rounds`` of the mean time of ``calls`` calls (paths
    interleaved round by round), in microseconds."""
    per: dict[str, list[float]] = {n: [] for n in paths}
    for fn in paths.values():
        fn()
    for _ in range(rounds):
        for n, fn in paths.items():
            t = time.perf_counter()
            for _ in range(calls):
                fn()
            per[n].append((time.perf_counter() - t) / calls * 1e6)
    return {n: statistics.median(v) for n, v in per.items()}


def overhead(rounds: int) -> None:
    """One ADD [1,16]: what each execution path costs over the executable's own call."""
    from nnhal.drivers.xla import XlaDevice
    from nnhal.hal.builder import RequestBuilder
    from nnhal.hal.types import ErrorStatus

    shape = (1, 16)
    dev = XlaDevice()
    try:
        pm = _prepare(dev, _add_model(shape))
        a = np.arange(16, dtype=np.float32).reshape(shape)
        rb = RequestBuilder([a, a], [a.nbytes])
        _, burst = pm.configure_execution_burst()
        exe = pm.plan.executable
        assert pm.execute_synchronously(rb.request)[0] == ErrorStatus.NONE
        assert burst.execute(rb.request)[0] == ErrorStatus.NONE
        np.testing.assert_array_equal(rb.output(0, np.float32, shape), a + a)
        on_device = [exe.put(a), exe.put(a)]
        args = [*exe.weights, *on_device]
        loaded = exe.loaded

        def floor() -> None:
            for r in loaded.execute_sharded(args).disassemble_into_single_device_arrays():
                r[0].block_until_ready()

        got = _rounds({"floor": floor,
                       "engine": lambda: exe.run_host([a, a]),
                       "sync": lambda: pm.execute_synchronously(rb.request),
                       "burst": lambda: burst.execute(rb.request)}, rounds, 200)
        base = got["floor"]
        print(f"ADD [1,16] on {dev.device.platform}: the executable on device arrays (floor) "
              f"{base:.1f} us; per execution (beyond the floor): " +
              ", ".join(f"{n} {v:.1f} us (+{v - base:.1f})" for n, v in got.items()
                        if n != "floor") + f"  load {load()}")
        rb.close()
    finally:
        dev.close()


def _median_us(fn, calls: int, rounds: int = 7) -> float:
    fn()
    fn()
    out = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t) / calls * 1e6)
    return statistics.median(out)


def components(model: str, calls: int) -> None:
    """Each part of one execution of ``model`` (one input) on xla, float32 and relaxed."""
    import jax

    from nnhal.drivers.xla import XlaDevice

    dev = XlaDevice()
    d = dev.device
    print(f"components on {d.platform} ({d.device_kind}), jax {jax.__version__}  load {load()}")
    try:
        for relaxed in (False, True):
            _components(dev, model, relaxed, calls)
    finally:
        dev.close()


def _components(dev, model: str, relaxed: bool, calls: int) -> None:
    import jax

    from nnhal.hal.builder import RequestBuilder
    from nnhal.memory import SharedMemory
    from nnhal.session import Session
    from nnhal.tflite import read_tflite

    d = dev.device
    m = read_tflite(model).model
    if len(m.main.input_indexes) != 1:
        print("components: models of one input only")
        return
    m.relax_computation_float32_to_float16 = relaxed
    t = time.perf_counter()
    pm = _prepare(dev, m)
    exe = pm.plan.executable
    kinds = sorted({str(w.dtype) for w in exe.weights})
    print(f"relaxed={relaxed}: prepare {time.perf_counter() - t:.1f} s, weights {kinds}")
    info = m.main.operands[m.main.input_indexes[0]]
    rng = np.random.default_rng(0)
    x = feed(type("I", (), {"dtype": np.dtype(info.type.dtype),
                            "shape": tuple(info.dimensions)})(), rng)
    shm = SharedMemory.from_bytes(x.tobytes())
    xs = shm.array().view(x.dtype).reshape(x.shape)  # as the driver reads a request
    args = [*exe.weights, exe.put(x)]

    def executable() -> None:
        for r in exe._execute(args).disassemble_into_single_device_arrays():
            r[0].block_until_ready()

    outs = [r[0] for r in exe._execute(args).disassemble_into_single_device_arrays()]
    for o in outs:
        o.block_until_ready()
    sharding = jax.sharding.SingleDeviceSharding(d)
    res = {"the executable (device inputs, waited for)": _median_us(executable, calls),
           f"input to device ({x.nbytes / 1e3:.0f} kB numpy)":
               _median_us(lambda: exe.put(x).block_until_ready(), calls),
           "input to device (from shared memory)":
               _median_us(lambda: exe.put(xs).block_until_ready(), calls)}
    if x.dtype == np.float32:
        x16 = x.astype(np.float16)
        res["input cast to float16 on the host"] = _median_us(
            lambda: x.astype(np.float16), calls)
        res["float16 input to device"] = _median_us(
            lambda: exe.put(x16).block_until_ready(), calls)
    try:
        pinned = jax.sharding.SingleDeviceSharding(d, memory_kind="pinned_host")
        px = jax.device_put(x, pinned)
        res["input to pinned host memory"] = _median_us(
            lambda: jax.device_put(x, pinned).block_until_ready(), calls)
        res["pinned host memory to device"] = _median_us(
            lambda: jax.device_put(px, sharding).block_until_ready(), calls)
    except Exception as e:  # noqa: BLE001 - a backend without pinned host memory
        print(f"  pinned host memory: {type(e).__name__}: {e}")

    def back() -> float:
        o = exe._execute(args).disassemble_into_single_device_arrays()[0][0]
        o.block_until_ready()
        t = time.perf_counter()
        np.asarray(o)
        return time.perf_counter() - t

    res[f"output 0 to host ({outs[0].nbytes / 1e3:.1f} kB, after the run)"] = \
        statistics.median(back() for _ in range(calls)) * 1e6
    res["Executable.run_host (numpy input)"] = _median_us(lambda: exe.run_host([x]), calls)
    res["Executable.run_host (shared-memory input)"] = _median_us(
        lambda: exe.run_host([xs]), calls)
    rb = RequestBuilder([x], model=m)
    _, burst = pm.configure_execution_burst()
    res["executeSynchronously"] = _median_us(lambda: pm.execute_synchronously(rb.request),
                                             calls)
    res["burst execute"] = _median_us(lambda: burst.execute(rb.request), calls)
    session = Session(m, device=dev)
    feeds = {i.name: x for i in session.inputs}
    res["Session.run"] = _median_us(lambda: session.run(feeds), calls)
    for k, v in res.items():
        print(f"  {k:52s} {v:9.1f} us")
    print(f"  load {load()}")
    session.close()
    rb.close()
    shm.close()


def roundtrip(rounds: int, shape: tuple[int, ...]) -> None:
    """out1 = a + b into an IBuffer, then out2 = out1 + b from it; against the same through
    shared memory (out1 copied to the host and back)."""
    from nnhal.drivers.xla import XlaDevice
    from nnhal.hal.types import (
        BufferDesc,
        BufferRole,
        DataLocation,
        ErrorStatus,
        MemoryPool,
        Request,
        RequestArgument,
    )
    from nnhal.memory import SharedMemory

    dev = XlaDevice()
    mems: list[SharedMemory] = []
    try:
        pm = _prepare(dev, _add_model(shape))
        rng = np.random.default_rng(0)
        a = rng.random(shape, np.float32)
        b = rng.random(shape, np.float32)
        n = a.nbytes
        ins = SharedMemory.from_bytes(a.tobytes() + b.tobytes())
        mid, out = SharedMemory.ashmem(n), SharedMemory.ashmem(n)
        mems += [ins, mid, out]
        status, buf, token = dev.allocate(BufferDesc([]), [pm], [BufferRole(0, 0, 1.0)],
                                          [BufferRole(0, 0, 1.0)])
        assert status == ErrorStatus.NONE, status

        def arg(pool: int, offset: int = 0, length: int = 0) -> RequestArgument:
            return RequestArgument(False, DataLocation(pool, offset, length), [])

        # pools: 0 the inputs, 1 the middle (memory or the buffer), 2 the output
        first_mem = Request([arg(0, 0, n), arg(0, n, n)], [arg(1, 0, n)],
                            [MemoryPool.of(ins), MemoryPool.of(mid), MemoryPool.of(out)])
        second_mem = Request([arg(1, 0, n), arg(0, n, n)], [arg(2, 0, n)],
                             [MemoryPool.of(ins), MemoryPool.of(mid), MemoryPool.of(out)])
        tok = MemoryPool.of_token(token)
        first_buf = Request([arg(0, 0, n), arg(0, n, n)], [arg(1)],
                            [MemoryPool.of(ins), tok, MemoryPool.of(out)])
        second_buf = Request([arg(1), arg(0, n, n)], [arg(2, 0, n)],
                             [MemoryPool.of(ins), tok, MemoryPool.of(out)])
        run = pm.execute_synchronously

        def chain(first: Request, second: Request) -> None:
            s1, s2 = run(first)[0], run(second)[0]
            if s1 != ErrorStatus.NONE or s2 != ErrorStatus.NONE:
                raise SystemExit(f"execution failed: {s1!r} {s2!r}")

        want = a + b + b
        for first, second in ((first_mem, second_mem), (first_buf, second_buf)):
            chain(first, second)
            got = out.array().view(np.float32).reshape(shape)
            np.testing.assert_allclose(got, want, rtol=1e-6)
            out.array()[:] = 0
        got = _rounds({"memory": lambda: chain(first_mem, second_mem),
                       "ibuffer": lambda: chain(first_buf, second_buf)}, rounds,
                      max(1, 20000 // max(1, n // 1000)))
        print(f"two chained ADD {list(shape)} ({n / 1e6:.2f} MB) on {dev.device.platform}: "
              f"through shared memory {got['memory']:.1f} us, through an IBuffer "
              f"{got['ibuffer']:.1f} us ({got['ibuffer'] / got['memory']:.2f}x)  load {load()}")
        buf.close()
    finally:
        for m in mems:
            m.close()
        dev.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--fresh", type=int, default=3)
    ap.add_argument("--parts", default="logits,compare,fresh",
                    help="comma-separated: logits, compare, relaxed, fresh, overhead, "
                         "components, roundtrip")
    ap.add_argument("--calls", type=int, default=100,
                    help="calls per round of the components part")
    ap.add_argument("--shape", default="1,112,112,32",
                    help="the round trip's tensor dimensions")
    args = ap.parse_args()
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    known = {"logits", "compare", "relaxed", "fresh", "overhead", "components", "roundtrip"}
    if set(parts) - known:
        ap.error(f"unknown parts {sorted(set(parts) - known)}; known: {sorted(known)}")
    if "logits" in parts:
        compare_logits(args.model)
    if "compare" in parts:
        interleaved(args.model, args.rounds)
    if "relaxed" in parts:
        relaxed(args.model, args.rounds)
    if "fresh" in parts and args.fresh:
        fresh(args.model, args.fresh)
    if "overhead" in parts:
        overhead(args.rounds)
    if "components" in parts:
        components(args.model, args.calls)
    if "roundtrip" in parts:
        roundtrip(args.rounds, tuple(int(d) for d in args.shape.split(",")))


if __name__ == "__main__":
    main()
