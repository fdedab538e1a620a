"""Compilation caching: prepareModel versus prepareModelFromCache on the V1_0 MobileNet case.

Prints, for each path, the median and best wall time from the call to the callback:

* prepare: prepareModel without caching (validation + plan building);
* prepare+save: prepareModel writing the two cache files;
* restore (live plan): prepareModelFromCache while the prepared model that wrote the cache is
  still alive in this process, so its plan is reused after the files are verified;
* restore (cold): prepareModelFromCache with no live plan: read, verify, decode, rebind.

and the ratios prepare / restore. prepare and cold restore take turns in runs of 5 calls; the
last line repeats them strictly alternating (each call right after one of the other kind,
which disturbs the caches the other left warm). The last lines time the first call in fresh
processes sharing a cache key file, as when an app starts again: there start-up costs (thread
creation, cold code, the collector walking every object start-up made) weigh on both paths.

Two diagnostics say where a cold restore's time goes: each stage run alone in this thread, and
cold restores in which a ready plan stands in for decoding and binding (the module is patched
for that measurement only), which bounds what faster decoding and binding could ever give.
Asserts nothing (speed goals live here, not in tests).

    python benchmarks/bench_caching.py [--specs DIR] [--repeat N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from nnhal.conformance.cases import build_model, build_request, default_specs_dir, iter_cases
from nnhal.conformance.runner import CaseFailure, check_outputs
from nnhal.drivers.reference import ReferenceDevice
from nnhal.hal.interfaces import PreparedModelCallback
from nnhal.hal.types import ErrorStatus, ExecutionPreference, MeasureTiming, Priority

CASE_FILE = "V1_0/mobilenet_224_gender_basic_fixed.json.gz"
TOKEN = bytes(range(32))


def prepare(device, model, model_cache=(), data_cache=()):
    cb = PreparedModelCallback()
    device.prepare_model(model, ExecutionPreference.FAST_SINGLE_ANSWER, Priority.MEDIUM, None,
                         list(model_cache), list(data_cache), TOKEN, cb)
    status, pm = cb.wait(120)
    assert status == ErrorStatus.NONE, status
    return pm


def restore(device, model_cache, data_cache):
    cb = PreparedModelCallback()
    device.prepare_model_from_cache(None, list(model_cache), list(data_cache), TOKEN, cb)
    status, pm = cb.wait(120)
    assert status == ErrorStatus.NONE, status
    return pm


def timed(fn, repeat: int) -> tuple[float, float]:
    """(median, best) in ms; the result of each call is dropped before the next."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), min(times)


def timed_rounds(fns: list, repeat: int, run: int) -> list[tuple[float, float]]:
    """(median, best) in ms of each function over ``repeat`` calls, taking turns in runs of
    ``run`` calls each, so that all of them see the same machine conditions. ``run=1``: each
    call follows a call of the other function (caches disturbed); larger runs: steady state."""
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(max(1, repeat // run)):
        for fn, ts in zip(fns, times):
            for _ in range(run):
                t0 = time.perf_counter()
                fn()
                ts.append((time.perf_counter() - t0) * 1e3)
    return [(statistics.median(ts), min(ts)) for ts in times]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--specs", type=Path, default=None,
                    help="conformance directory (default: $NNHAL_CONFORMANCE or "
                         "../shared/conformance)")
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--processes", type=int, default=8,
                    help="fresh processes per path for the first-call figures (0: none)")
    ap.add_argument("--child", nargs=3, metavar=("MODE", "CACHE_DIR", "GC"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    specs = args.specs or default_specs_dir()
    path = specs / CASE_FILE
    if not path.is_file():
        print(f"{CASE_FILE} not found under {specs}: skipped")
        return 0
    if args.child:
        return child(path, *args.child)
    case = next(iter_cases(path))
    m = case.data["model"]
    model = build_model(m)
    device = ReferenceDevice()
    with tempfile.TemporaryFile() as mc, tempfile.TemporaryFile() as dc:
        caches = ([mc], [dc])
        writer = prepare(device, model, *caches)  # warm-up, and the files to restore from
        # Results of a restored model are the case's expected results.
        for live in (True, False):
            if not live:
                device._cache.forget_live_plans()
            pm = restore(device, *caches)
            built = build_request(m)
            try:
                status, shapes, _ = pm.execute_synchronously(built.request, MeasureTiming.NO)
                if status != ErrorStatus.NONE:
                    raise CaseFailure(status.name)
                check_outputs(case, built, shapes)
            except CaseFailure as e:
                print(f"restored model gave wrong results: {e}")
                return 1
            finally:
                built.close()
            del pm

        def cold() -> None:
            device._cache.forget_live_plans()
            restore(device, *caches)

        def uncached() -> None:
            prepare(device, model)

        # prepare and cold restore take turns, so both see the same machine conditions.
        results = dict(zip(("prepare", "restore (cold)"),
                           timed_rounds([uncached, cold], args.repeat, 5)))
        alternating = dict(zip(("prepare", "restore (cold)"),
                               timed_rounds([uncached, cold], args.repeat, 1)))
        results["prepare+save"] = timed(lambda: prepare(device, model, *caches), args.repeat)
        # prepare+save rewrote the files; the writer's plan is still the live one for them.
        writer = prepare(device, model, *caches)
        results["restore (live plan)"] = timed(lambda: restore(device, *caches), args.repeat)
        del writer
        device._cache.forget_live_plans()
        parts = stages(device, caches, args.repeat)
        ceiling = without_decode_and_bind(device, model, caches, uncached, cold, args.repeat)
    device.close()
    print(f"{case.name}: {len(model.main.operations)} operations, "
          f"{sum(p.size for p in model.pools)} constant bytes; {args.repeat} runs each")
    for label, (med, best) in results.items():
        print(f"  {label:<22} median {med:8.3f} ms   best {best:8.3f} ms")
    base = results["prepare"]
    for label in ("restore (live plan)", "restore (cold)"):
        med, best = results[label]
        print(f"  ratio prepare / {label:<20} {base[0] / med:6.1f}x (median) "
              f"{base[1] / best:6.1f}x (best)")
    (pm, pb), (rm, rb) = alternating["prepare"], alternating["restore (cold)"]
    print(f"  alternating calls: prepare median {pm:.3f} ms, cold restore median {rm:.3f} ms: "
          f"{pm / rm:.1f}x (median) {pb / rb:.1f}x (best)")
    print("  where a cold restore's time goes (each stage alone, this thread, medians):")
    for label, ms in parts.items():
        print(f"    {label:<48} {ms:6.3f} ms")
    print(f"  cold restore with decoding and binding skipped (a ready plan stands in): "
          f"prepare median {ceiling[0]:.3f} ms, restore median {ceiling[1]:.3f} ms: at most "
          f"{ceiling[0] / ceiling[1]:.1f}x without making decode and bind faster")
    if args.processes > 0:
        fresh_processes(args.specs, args.processes)
    return 0


def without_decode_and_bind(device: ReferenceDevice, model, caches, uncached, cold,
                            repeat: int) -> tuple[float, float]:
    """(prepare, cold restore) medians with the restore's decode and bind replaced by handing
    back an already built plan: what everything else in a cold restore costs (reading,
    verifying, hashing, thread hand-offs, the callback). A diagnostic only: it patches the
    driver's module for the duration."""
    from unittest import mock

    import nnhal.drivers.reference.cache as cache_module

    ready = prepare(device, model).plan
    image = SimpleNamespace(graph=None)
    with mock.patch.object(cache_module, "decode_image", lambda *a, **k: image), \
            mock.patch.object(cache_module, "ModelPlan", lambda *a, **k: ready):
        (p, _), (r, _) = timed_rounds([uncached, cold], repeat, 5)
    return p, r


def stages(device: ReferenceDevice, caches: tuple[list, list], repeat: int
           ) -> dict[str, float]:
    """Median ms of each stage of a cold restore, run one after another in this thread."""
    from nnhal.drivers.reference.cache import decode_image
    from nnhal.executor.plan import ModelPlan

    cache = device._cache
    (mc,), (dc,) = caches
    loaded = cache.load(mc.fileno(), dc.fileno(), TOKEN)

    def decode() -> None:
        decode_image(loaded.body, loaded.head, loaded.data, cache.driver_version)

    def bind() -> None:
        fresh = decode_image(loaded.body, loaded.head, loaded.data, cache.driver_version)
        t0 = time.perf_counter()
        ModelPlan(fresh.graph)
        bind_times.append((time.perf_counter() - t0) * 1e3)

    bind_times: list[float] = []
    for _ in range(repeat):
        bind()
    return {
        "read both files, verify the model cache (HMAC)":
            timed(lambda: cache.load(mc.fileno(), dc.fileno(), TOKEN), repeat)[0],
        f"SHA-256 of the data cache ({len(loaded.data) // 1024} KB)":
            timed(loaded.data_matches, repeat)[0],
        "decode the plan image": timed(decode, repeat)[0],
        "bind the kernels": statistics.median(bind_times),
    }


def child(case_path: Path, mode: str, cache_dir: str, gc_mode: str) -> int:
    """One fresh process (a driver service just started): one prepare or one restore, timed
    from the call to the callback; prints the milliseconds as JSON."""
    import gc
    import json

    from nnhal.ops.catalog import registered

    model = build_model(next(iter_cases(case_path)).data["model"])
    registered()  # part of the service's start-up, as is the key file
    device = ReferenceDevice(cache_key_file=Path(cache_dir) / "key")
    if gc_mode == "frozen":
        gc.collect()
        gc.freeze()  # start-up objects out of the collector's way, as a service may do
    with open(Path(cache_dir) / "model", "r+b") as mc, open(Path(cache_dir) / "data", "r+b") as dc:
        t0 = time.perf_counter()
        if mode == "save":
            prepare(device, model, [mc], [dc])
        elif mode == "prepare":
            prepare(device, model)
        else:
            restore(device, [mc], [dc])
        ms = (time.perf_counter() - t0) * 1e3
    device.close()
    print(json.dumps({"ms": ms}))
    return 0


def fresh_processes(specs: Path | None, n: int) -> None:
    """First calls in fresh processes, the case a cache is for: an app started again."""
    import json
    import subprocess

    def run(mode: str, cache_dir: str, gc_mode: str) -> float:
        cmd = [sys.executable, __file__, "--child", mode, cache_dir, gc_mode]
        if specs is not None:
            cmd += ["--specs", str(specs)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        return float(json.loads(out.strip().splitlines()[-1])["ms"])

    with tempfile.TemporaryDirectory() as d:
        for name in ("model", "data"):
            (Path(d) / name).touch()
        run("save", d, "collecting")
        for gc_mode in ("collecting", "frozen"):
            times: dict[str, list[float]] = {"prepare": [], "restore": []}
            for _ in range(n):
                for mode in times:
                    times[mode].append(run(mode, d, gc_mode))
            p, r = statistics.median(times["prepare"]), statistics.median(times["restore"])
            note = "gc.freeze() after start-up" if gc_mode == "frozen" else "default gc"
            print(f"  first call in a fresh process ({note}, {n} each): prepare {p:.2f} ms, "
                  f"cold restore {r:.2f} ms: {p / r:.1f}x")


if __name__ == "__main__":
    sys.exit(main())
