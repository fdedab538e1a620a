"""The LiteRT driver against ai-edge-litert running the same model (the driver's own overhead)
and against the reference driver (the capability figures of ``nnhal/drivers/litert/device.py``),
in interleaved rounds so that all see the same load. Prints figures; asserts nothing. Every
figure is printed with /proc/loadavg.

1. MobileNet V1 and V2 (Keras, random weights, 224x224x3), float32 and full-integer int8 (int8
   in and out), as the TFLite converter writes them: each .tflite is imported
   (``read_tflite``), prepared on ``LiteRTDevice`` and run with executeSynchronously, against
   ai-edge-litert on the *original* .tflite (set_tensor + invoke + get_tensor) with the same
   threads; the figure is the median of the per-round ratios (goal: 1.05 or less). The
   models come from ``--models DIR`` (mobilenet_v1.tflite, mobilenet_v1_int8.tflite,
   mobilenet_v2.tflite, mobilenet_v2_int8.tflite) or, without it, are made with TensorFlow
   into a temporary directory (skipped, saying so, when TensorFlow is absent). Also
   ``Session(path, device=<that LiteRTDevice>)`` in the same rounds, and the operators of
   nnhal's export (what LiteRTDevice runs) against the file's ("as the file" when every
   operator came back). ``--files F...`` runs the same on any other .tflite files.
2. One ADD [1,16] (a converter-made file, nnhal running its import): executeSynchronously
   against bare set + invoke + get on that file (goal: within 10 us),
   with the request in plain shared memory (checked for shrinking at every execution) and in
   memory sealed against shrinking (nothing to check), and the reference driver.
3. prepareModel against prepareModelFromCache on MobileNetV2 float32, each in a fresh process
   (the call alone, and the whole process), goal >= 10x; then in this process with the table
   of live plans emptied.
   With ``--engine-floor``: what the engine alone costs in a fresh process, from the stored
   flatbuffer by path: an Interpreter (build + allocate_tensors, where XNNPACK packs the
   weights) against ai-edge-litert's CompiledModel with XNNPACK's file-backed weight cache
   already written (the only API that offers it), each with its first and a steady run.
4. With ``--capability``: litert / reference on the HAL-built MobileNetV2 float32 and int8
   (benchmarks/hal_models), the figures behind the device's capabilities.

    python benchmarks/bench_litert.py [--models DIR] [--rounds N] [--threads T] [--capability]
                                      [--engine-floor] [--skip PARTS] [--files F...] [--cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # run as a script: make the worktree importable
    sys.path.insert(0, str(ROOT))

from nnhal.drivers.litert import LiteRTDevice  # noqa: E402
from nnhal.drivers.reference import ReferenceDevice  # noqa: E402
from nnhal.hal.builder import ModelBuilder, RequestBuilder  # noqa: E402
from nnhal.hal.interfaces import PreparedModelCallback  # noqa: E402
from nnhal.hal.types import (  # noqa: E402
    ErrorStatus,
    ExecutionPreference,
    Model,
    OperandType,
    OperationType,
    Priority,
)

MODELS = ("mobilenet_v1", "mobilenet_v1_int8", "mobilenet_v2", "mobilenet_v2_int8")
med = statistics.median


def load() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())


def prepare(device: object, model: Model) -> object:
    cb = PreparedModelCallback()
    device.prepare_model(model, ExecutionPreference.FAST_SINGLE_ANSWER,  # type: ignore
                         Priority.MEDIUM, None, [], [], b"", cb)
    status, pm = cb.wait(600)
    if status != ErrorStatus.NONE:
        raise SystemExit(f"prepare failed on {device}: {status.name}")
    return pm


#: The clock: wall time, or with ``--cpu`` this process's CPU time (with ``--threads 1`` on a
#: machine loaded by others, that measures the work rather than the wait for a core).
CLOCK: Callable[[], float] = time.perf_counter


def timed(fn: Callable[[], object], reps: int) -> float:
    """Seconds per call: the mean over ``reps`` calls."""
    t0 = CLOCK()
    for _ in range(reps):
        fn()
    return (CLOCK() - t0) / reps


def interleaved(fns: dict[str, Callable[[], object]], rounds: int, reps: int
                ) -> dict[str, list[float]]:
    """Per function, its seconds per call in each round; each round times each in turn."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            times[k].append(timed(fn, reps))
    return times


def ratios(a: list[float], b: list[float]) -> float:
    """The median of the per-round ratios a / b."""
    return med([x / y for x, y in zip(a, b)])


# ---- 1: converter-made MobileNets --------------------------------------------------------

def make_models(out: Path) -> bool:
    """Keras MobileNet and MobileNetV2 (weights=None, 224x224x3) converted to .tflite into
    ``out``: float32, and full-integer int8 (int8 input and output) calibrated on a few
    random images. False, saying why, when TensorFlow is not importable."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    try:
        import tensorflow as tf
    except Exception as e:  # noqa: BLE001 - any failure to load means "skip"
        print(f"MobileNet benchmarks skipped: TensorFlow is not importable "
              f"({type(e).__name__}: {e}); pass --models DIR with {', '.join(MODELS)} .tflite")
        return False
    rng = np.random.default_rng(0)
    calibration = [rng.uniform(-1, 1, (1, 224, 224, 3)).astype(np.float32) for _ in range(4)]
    makers = {"mobilenet_v1": tf.keras.applications.MobileNet,
              "mobilenet_v2": tf.keras.applications.MobileNetV2}
    for name, make in makers.items():
        keras_model = make(weights=None, input_shape=(224, 224, 3))
        converter = tf.lite.TFLiteConverter.from_keras_model(keras_model)
        (out / f"{name}.tflite").write_bytes(converter.convert())
        converter = tf.lite.TFLiteConverter.from_keras_model(keras_model)
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = lambda: ([x] for x in calibration)
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        converter.inference_input_type = tf.int8
        converter.inference_output_type = tf.int8
        (out / f"{name}_int8.tflite").write_bytes(converter.convert())
        print(f"made {name}.tflite and {name}_int8.tflite with TensorFlow {tf.__version__}",
              flush=True)
    return True


def random_input(detail: dict, rng: np.random.Generator) -> np.ndarray:
    shape, dtype = tuple(int(d) for d in detail["shape"]), np.dtype(detail["dtype"])
    if dtype.kind == "f":
        return rng.uniform(-1, 1, shape).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, shape, endpoint=True).astype(dtype)


def bench_tflite(name: str, path: Path, lit: LiteRTDevice, rounds: int, reps: int,
                 session: bool = True) -> float | None:
    """LiteRTDevice on the imported model, and ``Session(path, device=lit)``, against
    ai-edge-litert on the original file; then the operators nnhal writes against the
    file's."""
    from ai_edge_litert.interpreter import Interpreter

    from nnhal.tflite import read_tflite

    blob = path.read_bytes()
    try:
        imported = read_tflite(blob, path.name)
    except Exception as e:  # noqa: BLE001 - report and go on with the next model
        print(f"{name}: not imported: {type(e).__name__}: {e}")
        return None
    model = imported.model
    bare = Interpreter(model_content=blob, num_threads=lit.threads)
    bare.allocate_tensors()
    by_name = {d["name"]: d for d in bare.get_input_details()}
    in_dets = [by_name.get(n) for n in imported.input_names]
    if None in in_dets:
        in_dets = bare.get_input_details()
    out_by_name = {d["name"]: d["index"] for d in bare.get_output_details()}
    outs = [out_by_name.get(n) for n in imported.output_names]
    if None in outs:
        outs = [d["index"] for d in bare.get_output_details()]
    ins = [d["index"] for d in in_dets]
    rng = np.random.default_rng(1)
    inputs = [random_input(d, rng) for d in in_dets]
    try:
        pm = prepare(lit, model)
    except SystemExit as e:  # report and go on with the next model
        print(f"{name}: {e}")
        return None
    rb = RequestBuilder(inputs, model=model)
    request = rb.request

    def run_bare() -> None:
        for i, x in zip(ins, inputs):
            bare.set_tensor(i, x)
        bare.invoke()
        for o in outs:
            bare.get_tensor(o)

    def run_lit() -> None:
        pm.execute_synchronously(request)  # type: ignore[attr-defined]

    status = pm.execute_synchronously(request)[0]  # type: ignore[attr-defined]
    run_bare()
    diff = max(float(np.max(np.abs(rb.output(k).astype(np.float64) -
                                   bare.get_tensor(o).astype(np.float64))))
               for k, o in enumerate(outs))
    fns = {"litert": run_lit, "bare": run_bare}
    session = session and not imported.state  # a Session feeds no state inputs
    reps = max(reps, int(0.02 / max(timed(run_bare, 3), 1e-6)))  # rounds of 20 ms or more
    if session:
        from nnhal import Session

        sess = Session(path, device=lit)
        fns["session"] = lambda: sess.run(inputs)
    t = interleaved(fns, rounds, reps)
    rb.close()
    r = ratios(t["litert"], t["bare"])
    print(f"{name:20s} LiteRTDevice {med(t['litert']) * 1e3:7.3f} ms  ai-edge-litert "
          f"{med(t['bare']) * 1e3:7.3f} ms  ratio {r:5.3f} (goal <= 1.05)  "
          f"[{status.name}, outputs differ by <= {diff:.3g}]  load {load()}", flush=True)
    if session:
        print(f"{'':20s} Session(path, device=litert) {med(t['session']) * 1e3:7.3f} ms  "
              f"ratio {ratios(t['session'], t['bare']):5.3f} (goal <= 1.05)", flush=True)
        sess.close()
    print(f"{'':20s} operators {operators_against(blob, model)}", flush=True)
    return r


def operators_against(blob: bytes, model: Model) -> str:
    """What nnhal's export of ``model`` (the flatbuffer LiteRTDevice runs) writes against the
    file's operators: "as the file (N)" or the counts that differ."""
    from collections import Counter

    from nnhal.tflite import schema, write_tflite
    from nnhal.tflite.import_read import read_model

    def count(data: bytes) -> Counter:
        return Counter(op.name for op in read_model(schema.load(data))[0].ops)

    before = count(blob)
    try:
        after = count(write_tflite(model))
    except Exception as e:  # noqa: BLE001 - report and go on
        return f"not exported: {type(e).__name__}: {e}"
    if before == after:
        return f"as the file ({sum(before.values())})"
    gone, new = before - after, after - before
    return "differ: " + ", ".join([f"-{n} {k}" for k, n in sorted(gone.items())] +
                                  [f"+{n} {k}" for k, n in sorted(new.items())])


def runner(pm: object, rb: RequestBuilder) -> Callable[[], object]:
    """One executeSynchronously of ``rb``'s request on ``pm``."""
    request = rb.request
    return lambda: pm.execute_synchronously(request)  # type: ignore[attr-defined]


# ---- 2: one ADD ---------------------------------------------------------------------------

def add_model() -> tuple[Model, list[np.ndarray]]:
    b = ModelBuilder()
    x = b.input(OperandType.TENSOR_FLOAT32, (1, 16))
    y = b.input(OperandType.TENSOR_FLOAT32, (1, 16))
    act = b.scalar(OperandType.INT32, 0)
    o = b.output(OperandType.TENSOR_FLOAT32, (1, 16))
    b.operation(OperationType.ADD, [x, y, act], [o])
    rng = np.random.default_rng(0)
    return b.build(), [rng.standard_normal((1, 16)).astype(np.float32) for _ in range(2)]


def make_add(out: Path, dims: tuple[int, ...] = (1, 16)) -> Path | None:
    """A one-ADD float32 .tflite made by the TFLite converter (a peer runs the converter's
    file, never one nnhal wrote); None, said, without TensorFlow."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    try:
        import tensorflow as tf
    except Exception as e:  # noqa: BLE001 - any failure to load means "skip"
        print(f"the converter's one-ADD file cannot be made (TensorFlow: {type(e).__name__}: "
              f"{e}): no ai-edge-litert figure for one ADD")
        return None
    spec = tf.TensorSpec(list(dims), tf.float32)

    @tf.function(input_signature=[spec, spec])
    def add(a: object, b: object) -> object:
        return a + b

    conv = tf.lite.TFLiteConverter.from_concrete_functions([add.get_concrete_function()], add)
    path = out / f"add_{'x'.join(map(str, dims))}.tflite"
    path.write_bytes(conv.convert())
    return path


def bench_add(lit: LiteRTDevice, ref: ReferenceDevice, rounds: int, reps: int,
              tmp: Path) -> None:
    """nnhal's import of the converter's one-ADD file on both drivers, against ai-edge-litert
    on that very file."""
    from ai_edge_litert.interpreter import Interpreter

    from nnhal.tflite import read_tflite

    path = make_add(tmp)
    if path is None:
        return
    model = read_tflite(path).model
    _, inputs = add_model()
    pm_lit, pm_ref = prepare(lit, model), prepare(ref, model)
    plain = RequestBuilder(inputs, model=model)
    sealed = RequestBuilder(inputs, model=model, sealed=True)
    bare = Interpreter(model_path=str(path), num_threads=lit.threads)
    bare.allocate_tensors()
    ins = [d["index"] for d in bare.get_input_details()]
    outs = [d["index"] for d in bare.get_output_details()]

    def run_bare() -> None:
        for i, x in zip(ins, inputs):
            bare.set_tensor(i, x)
        bare.invoke()
        for o in outs:
            bare.get_tensor(o)

    t = interleaved({"bare": run_bare, "litert": runner(pm_lit, plain),
                     "litert sealed": runner(pm_lit, sealed),
                     "reference": runner(pm_ref, plain)}, rounds, reps)
    plain.close()
    sealed.close()
    b = t["bare"]

    def over(k: str) -> str:
        return f"{med([x - y for x, y in zip(t[k], b)]) * 1e6:5.1f}"

    print(f"ADD [1,16]: ai-edge-litert set+invoke+get {med(b) * 1e6:5.1f} us; LiteRTDevice "
          f"{med(t['litert']) * 1e6:5.1f} us (+{over('litert')}), with sealed memory "
          f"{med(t['litert sealed']) * 1e6:5.1f} us (+{over('litert sealed')}) (goal +10 us); "
          f"reference driver {med(t['reference']) * 1e6:5.1f} us  load {load()}", flush=True)


# ---- 3: prepareModel against prepareModelFromCache, in fresh processes ---------------------

#: One step in a fresh process. argv: mode (save, prepare, restore: with the driver's private
#: copy; files: restore without a private store, from the client's files; warm: as restore,
#: but after the model was read in the process), .tflite, model cache, data cache, key file,
#: threads, store directory. Prints JSON: the call's seconds and the first execution's.
#: A restoring driver never sees the model: reading it first (tens of MB of numpy arrays,
#: partly freed) leaves the heap grown and touched, and the interpreter's allocation (XNNPACK's
#: packed weights, ~14 MB here) then takes ~10 ms instead of ~22 ms. Hence only "warm" reads
#: it before the call; it is printed to show that effect, not as the figure.
_CHILD = r"""
import json, os, sys, time
from nnhal.drivers.litert import LiteRTDevice
from nnhal.hal.builder import RequestBuilder
from nnhal.hal.interfaces import PreparedModelCallback
from nnhal.hal.types import ErrorStatus, ExecutionPreference, Priority
from nnhal.tflite import read_tflite
import numpy as np
mode, path, mc, dc, key, threads, store = sys.argv[1:8]
device = LiteRTDevice(threads=int(threads), cache_key_file=key, store_dir=store,
                      private_store=mode != "files")
model = read_tflite(path).model if mode in ("save", "prepare", "warm") else None
token = bytes(range(32))
flags = os.O_RDWR | os.O_CREAT
mfd, dfd = os.open(mc, flags, 0o600), os.open(dc, flags, 0o600)
cb = PreparedModelCallback()
caches = ([mfd], [dfd]) if mode != "prepare" else ([], [])
t0 = time.perf_counter()
if mode in ("restore", "files", "warm"):
    device.prepare_model_from_cache(None, [mfd], [dfd], token, cb)
else:
    device.prepare_model(model, ExecutionPreference.FAST_SINGLE_ANSWER, Priority.MEDIUM, None,
                         *caches, token, cb)
status, pm = cb.wait(600)
call = time.perf_counter() - t0
assert status == ErrorStatus.NONE, status
model = model or read_tflite(path).model
x = np.random.default_rng(0).uniform(-1, 1, (1, 224, 224, 3)).astype(np.float32)
rb = RequestBuilder([x], model=model)
t0 = time.perf_counter()
assert pm.execute_synchronously(rb.request)[0] == ErrorStatus.NONE
first = time.perf_counter() - t0
print(json.dumps({"call": call, "first": first}))
"""


def child(mode: str, path: Path, tmp: Path, threads: int) -> tuple[float, float, float]:
    """(call seconds, first execution seconds, whole process seconds) of one fresh process."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _CHILD, mode, str(path), str(tmp / "model"),
                           str(tmp / "data"), str(tmp / "key"), str(threads),
                           str(tmp / "store")],
                          capture_output=True, text=True, env=env, cwd=tmp, timeout=600)
    whole = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{mode} process failed:\n{done.stderr[-2000:]}")
    rec = json.loads(done.stdout.strip().splitlines()[-1])
    return rec["call"], rec["first"], whole


def bench_cache_processes(path: Path, threads: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        # Writes the cache files, the key and the private copy (after notifying: wait for it).
        child("save", path, tmp, threads)
        if not any((tmp / "store").glob("*.bin")):
            print("(the save left no private copy: the restores below read the files)")
        t: dict[str, list[tuple[float, float, float]]] = {"prepare": [], "restore": [],
                                                           "files": [], "warm": []}
        for _ in range(rounds):
            for mode in t:
                t[mode].append(child(mode, path, tmp, threads))
    p = t["prepare"]
    for mode, what in (("restore", "from the driver's private copy"),
                       ("files", "from the client's files (no private store)"),
                       ("warm", "from the private copy, the model read in the process first")):
        r = t[mode]
        call = ratios([x[0] for x in p], [x[0] for x in r])
        whole = ratios([x[2] for x in p], [x[2] for x in r])
        print(f"{path.name} in fresh processes: prepareModel {med(x[0] for x in p) * 1e3:.1f} "
              f"ms, prepareModelFromCache {what} {med(x[0] for x in r) * 1e3:.1f} ms: "
              f"{call:.1f}x (goal >= 10x); whole process {med(x[2] for x in p):.2f} s against "
              f"{med(x[2] for x in r):.2f} s ({whole:.2f}x); first execution after "
              f"{med(x[1] for x in p) * 1e3:.1f} ms against {med(x[1] for x in r) * 1e3:.1f} ms"
              f"  load {load()}", flush=True)


#: One engine in a fresh process (argv: kind "interpreter" or "compiled", flatbuffer path,
#: weight cache path, threads). Prints JSON: build, first run and a steady run in seconds.
_FLOOR = r"""
import json, sys, time
import numpy as np
kind, path, wcache, threads = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
if kind == "compiled":
    from ai_edge_litert.compiled_model import CompiledModel, _create_default_environment
    from ai_edge_litert.cpu_options import CpuOptions
    from ai_edge_litert.hardware_accelerator import HardwareAccelerator
    from ai_edge_litert.options import Options
    env = _create_default_environment()  # a driver would make it when opening the device
    opts = Options(hardware_accelerators=HardwareAccelerator.CPU,
                   cpu_options=CpuOptions(num_threads=threads, xnnpack_weight_cache_path=wcache))
    t0 = time.perf_counter()
    m = CompiledModel.from_file(path, options=opts, environment=env)
    ins, outs = m.create_input_buffers(0), m.create_output_buffers(0)
    build = time.perf_counter() - t0
    def run(x):
        ins[0].write(x)
        m.run_by_index(0, ins, outs)
        return outs[0].read(1000, np.float32)
else:
    from ai_edge_litert.interpreter import Interpreter, OpResolverType
    t0 = time.perf_counter()
    it = Interpreter(model_path=path, num_threads=threads,
                     experimental_op_resolver_type=OpResolverType.AUTO)
    it.allocate_tensors()
    build = time.perf_counter() - t0
    i, o = it.get_input_details()[0]["index"], it.get_output_details()[0]["index"]
    def run(x):
        it.set_tensor(i, x)
        it.invoke()
        return it.get_tensor(o).copy()
x = np.random.default_rng(0).uniform(-1, 1, (1, 224, 224, 3)).astype(np.float32)
t0 = time.perf_counter(); run(x); first = time.perf_counter() - t0
steady = []
for _ in range(5):
    t0 = time.perf_counter(); run(x); steady.append(time.perf_counter() - t0)
print(json.dumps({"build": build, "first": first, "steady": sorted(steady)[2]}))
"""


def bench_engine_floor(path: Path, threads: int, rounds: int) -> None:
    """Interpreter against CompiledModel with a written weight cache, fresh processes."""
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        fb, wcache = tmp / "model.tflite", tmp / "weights.xnn"
        from nnhal.tflite import read_tflite, write_tflite

        fb.write_bytes(write_tflite(read_tflite(path).model))  # what the driver stores

        def one(kind: str) -> dict[str, float]:
            done = subprocess.run([sys.executable, "-c", _FLOOR, kind, str(fb), str(wcache),
                                   str(threads)], capture_output=True, text=True, timeout=600)
            if done.returncode != 0:
                raise SystemExit(f"{kind} process failed:\n{done.stderr[-2000:]}")
            return json.loads(done.stdout.strip().splitlines()[-1])

        one("compiled")  # writes the weight cache
        t: dict[str, list[dict[str, float]]] = {"interpreter": [], "compiled": []}
        for _ in range(rounds):
            for kind in t:
                t[kind].append(one(kind))
    for kind, recs in t.items():
        b, f, s = (med(r[k] for r in recs) * 1e3 for k in ("build", "first", "steady"))
        print(f"engine floor, {kind:11s}: build {b:5.1f} ms, first run {f:5.1f} ms, steady "
              f"{s:5.1f} ms: build + first run's excess over steady {b + f - s:5.1f} ms  "
              f"load {load()}", flush=True)


def bench_cache(lit: LiteRTDevice, model: Model, rounds: int) -> None:
    """prepareModel (saving the cache) against prepareModelFromCache in this process, the
    live-plan table emptied first, so every restore verifies, decodes and builds."""
    prep, rest = [], []
    with tempfile.TemporaryFile() as mf, tempfile.TemporaryFile() as df:
        token = bytes(range(32))
        for _ in range(rounds):
            t0 = time.perf_counter()
            cb = PreparedModelCallback()
            lit.prepare_model(model, ExecutionPreference.FAST_SINGLE_ANSWER, Priority.MEDIUM,
                              None, [mf], [df], token, cb)
            assert cb.wait(600)[0] == ErrorStatus.NONE
            prep.append(time.perf_counter() - t0)
            lit._cache.forget_live_plans()
            t0 = time.perf_counter()
            cb = PreparedModelCallback()
            lit.prepare_model_from_cache(None, [mf], [df], token, cb)
            assert cb.wait(600)[0] == ErrorStatus.NONE
            rest.append(time.perf_counter() - t0)
    print(f"in this process: prepareModel + save {med(prep) * 1e3:.1f} ms, from cache (cold "
          f"plan) {med(rest) * 1e3:.1f} ms: {ratios(prep, rest):.1f}x  load {load()}",
          flush=True)


# ---- 4: capability figures ------------------------------------------------------------------

def bench_capability(lit: LiteRTDevice, ref: ReferenceDevice, rounds: int) -> None:
    from benchmarks import hal_models

    m8, x8, _ = hal_models.mobilenet_v2_int8()
    cases = {"ADD [1,16]": (*add_model(), 2000),
             "MobileNetV2 float32": (hal_models.mobilenet_v2_float(),
                                     [hal_models.float_input()], 3),
             "MobileNetV2 int8": (m8, [x8], 3)}
    for name, (model, inputs, reps) in cases.items():
        pm_ref, pm_lit = prepare(ref, model), prepare(lit, model)
        rb = RequestBuilder(inputs, model=model)
        t = interleaved({"ref": runner(pm_ref, rb), "lit": runner(pm_lit, rb)}, rounds, reps)
        rb.close()
        print(f"capability {name:20s} reference {med(t['ref']) * 1e3:8.3f} ms  litert "
              f"{med(t['lit']) * 1e3:8.3f} ms  litert/reference {ratios(t['lit'], t['ref']):.3f}"
              f"  load {load()}", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", type=Path, default=None,
                   help="directory with the MobileNet .tflite files (default: make them)")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--threads", type=int, default=None, help="LiteRT threads (default: cores)")
    p.add_argument("--capability", action="store_true",
                   help="also litert / reference on the HAL-built MobileNetV2 models")
    p.add_argument("--engine-floor", action="store_true",
                   help="also the engine alone: Interpreter against CompiledModel + weight cache")
    p.add_argument("--skip", default="", help="comma-separated parts to skip: models,add,cache")
    p.add_argument("--files", type=Path, nargs="*", default=[],
                   help="more .tflite files for section 1 (any converter-made model)")
    p.add_argument("--cpu", action="store_true",
                   help="time this process's CPU seconds instead of wall time (use with "
                        "--threads 1 on a loaded machine)")
    args = p.parse_args()
    if args.cpu:
        global CLOCK
        CLOCK = time.process_time
    skip = set(filter(None, args.skip.split(",")))
    ref, lit = ReferenceDevice(), LiteRTDevice(threads=args.threads)
    print(f"LiteRT threads {lit.threads}; {'CPU' if args.cpu else 'wall'} time; load {load()}",
          flush=True)
    made = None
    try:
        models = args.models
        if models is None and not skip >= {"models", "cache"} and not args.files:
            made = tempfile.TemporaryDirectory()
            models = Path(made.name) if make_models(Path(made.name)) else None
        if "add" not in skip:
            with tempfile.TemporaryDirectory() as d:
                bench_add(lit, ref, args.rounds, 2000, Path(d))
        if models is not None and "models" not in skip:
            for name in MODELS:
                path = models / f"{name}.tflite"
                if path.exists():
                    bench_tflite(name, path, lit, args.rounds, 5)
                else:
                    print(f"{name}: {path} not found")
        for path in args.files:
            try:
                bench_tflite(path.stem[:20], path, lit, args.rounds, 5)
            except Exception as e:  # noqa: BLE001 - e.g. a custom operator litert lacks
                print(f"{path.stem[:20]}: {type(e).__name__}: {str(e).splitlines()[0]}")
        if models is not None and "cache" not in skip:
            path = models / "mobilenet_v2.tflite"
            if path.exists():
                bench_cache_processes(path, lit.threads, max(3, args.rounds // 2))
                from nnhal.tflite import read_tflite
                bench_cache(lit, read_tflite(path).model, args.rounds)
                if args.engine_floor:
                    bench_engine_floor(path, lit.threads, max(5, args.rounds))
        if args.capability:
            bench_capability(lit, ref, args.rounds)
    finally:
        ref.close()
        lit.close()
        if made is not None:
            made.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
