"""The Session cache (nnhal.session.cache): a second Session on the same .tflite file is a
restore (no read into a HAL model, no analysis, no export), with the same outputs; anything
wrong with an entry or a driver's cache is a miss that prepares from the file."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("nnhal.tflite")

from nnhal.analysis import analyses  # noqa: E402
from nnhal.session import Session  # noqa: E402
from nnhal.session import cache as sc  # noqa: E402
from nnhal.session import session as session_module  # noqa: E402

DATA = Path(__file__).parent / "tflite" / "data"


@pytest.fixture
def home(tmp_path, monkeypatch, fresh_runtime):
    """An empty per-user cache, the runtime's devices opened anew (with its key)."""
    d = tmp_path / "cache"
    monkeypatch.setenv("NNHAL_CACHE_DIR", str(d))
    monkeypatch.delenv("NNHAL_CACHE_KEY_FILE", raising=False)
    monkeypatch.delenv(sc.ENV, raising=False)
    return d


def model_file(tmp_path: Path, name: str) -> Path:
    """A copy with old times, so its digest is remembered (fresh files are hashed each time)."""
    p = tmp_path / name
    shutil.copyfile(DATA / name, p)
    old = time.time() - 3600
    os.utime(p, (old, old))
    return p


def feeds(s: Session, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for i in s.inputs:
        shape = [d or 1 for d in i.shape]
        out[i.name] = rng.standard_normal(shape).astype(i.dtype) if i.dtype.kind == "f" else \
            rng.integers(-5, 5, shape).astype(i.dtype)
    return out


def same(a: dict, b: dict) -> bool:
    return list(a) == list(b) and all(np.array_equal(a[k], b[k]) for k in a)


def entries(home: Path) -> list[Path]:
    return sorted((home / "session").glob("*.entry"))


def no_reading(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("the model was read")

    monkeypatch.setattr(session_module, "read_bytes_as_model", refuse)
    monkeypatch.setattr(session_module, "load_model", refuse)


def test_a_second_open_is_a_restore(home, tmp_path, monkeypatch):
    path = model_file(tmp_path, "bmm_f32.tflite")
    with Session(path, cache=True) as first:
        x = feeds(first)
        expected = first.run(x)
        assert not first.restored
    assert len(entries(home)) == 1
    before = analyses()
    no_reading(monkeypatch)
    with Session(path, cache=True) as second:
        assert second.restored
        assert [i.name for i in second.inputs] == [i.name for i in first.inputs]
        assert second.inputs == first.inputs and second.outputs == first.outputs
        assert second.plan == first.plan and second.device_name == first.device_name
        assert same(second.run(x), expected)
    assert analyses() == before  # nothing analysed (nor exported: that analyses too)


def test_a_restore_in_a_fresh_process(home, tmp_path):
    """The drivers' caches outlive the process (the registry's devices share a per-user key).
    Both opens run in fresh processes: this one's runtime keeps the devices it opened first,
    with the key of whatever cache directory an earlier test had."""
    path = model_file(tmp_path, "bmm_f32.tflite")
    code = ("import sys, numpy as np\nfrom nnhal.session import Session\n"
            "s = Session(sys.argv[1], cache=True)\n"
            "rng = np.random.default_rng(0)\n"
            "x = {i.name: rng.standard_normal(i.shape).astype(i.dtype) for i in s.inputs}\n"
            "out = s.run(x)\nprint(s.restored, repr(next(iter(out.values())).tolist()))\n")
    # The children import the nnhal this process runs (the checkout, or the installed copy
    # that CI's tests import): the entry's key names the code that wrote it.
    import nnhal

    env = dict(os.environ, PYTHONPATH=str(Path(nnhal.__file__).resolve().parent.parent),
               NNHAL_CACHE_DIR=str(home), TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("NNHAL_CACHE_KEY_FILE", None)
    env.pop(sc.ENV, None)
    seen = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                              text=True, env=env, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        seen.append(done.stdout.strip().splitlines()[-1].split(" ", 1))
    assert [restored for restored, _ in seen] == ["False", "True"]
    assert seen[0][1] == seen[1][1]
    assert np.isfinite(np.array(eval(seen[1][1]), dtype=np.float32)).all()  # noqa: S307


@pytest.mark.parametrize("device", [None, "reference"])
def test_an_entry_of_other_code_is_never_restored(home, tmp_path, monkeypatch, device):
    """A new process opens with the code fingerprint the last one remembered (its check runs
    meanwhile): when nnhal changed since, what the remembered one finds is dropped."""
    path = model_file(tmp_path, "reverse_f32.tflite")
    with Session(path, device, cache=True) as first:
        x = feeds(first)
        expected = first.run(x)
    monkeypatch.setattr(sc, "_fingerprint", None)  # a new process of the same code
    with Session(path, device, cache=True) as same_code:
        assert same_code.restored
    monkeypatch.setattr(sc, "_fingerprint", None)  # a new process of edited code
    monkeypatch.setattr(sc, "_walk", lambda top: "e" * 64)
    with Session(path, device, cache=True) as edited:
        assert not edited.restored  # the old code's entry, found by the guess, was dropped
        assert same(edited.run(x), expected)
    assert len(entries(home)) == 2
    monkeypatch.setattr(sc, "_fingerprint", None)  # the edited code remembered: it restores
    with Session(path, device, cache=True) as again:
        assert again.restored and same(again.run(x), expected)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_fingerprint_check_begun_before_a_fork_settles_in_the_child(home, monkeypatch):
    """The check's thread does not exist in a forked child: the child computes it itself."""
    real = sc.code_fingerprint()
    store = sc.Store.default()
    monkeypatch.setattr(sc, "_confirmed", set())
    sc.Fingerprint(store.directory)  # remembered for the next "process"
    monkeypatch.setattr(sc, "_fingerprint", None)
    slow = sc._walk

    def walk(top):
        time.sleep(0.3)
        return slow(top)

    monkeypatch.setattr(sc, "_walk", walk)
    fp = sc.Fingerprint(store.directory)
    assert fp.guess == real
    fp.begin()
    assert fp._done is not None  # the check runs in a thread
    pid = os.fork()
    if pid == 0:  # the child: settle, and say whether it got the right value
        try:
            os._exit(0 if fp.settle() == real else 1)
        finally:
            os._exit(2)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.02)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the child hung waiting for its parent's thread")
    assert os.waitstatus_to_exitcode(status) == 0
    assert fp.settle() == real  # and the parent's own check finishes


@pytest.mark.parametrize("cache", ["1", "0"])
def test_the_fingerprint_is_computed_while_nnhal_session_imports(cache):
    """Importing nnhal.session starts the code fingerprint on a thread (an open then finds it
    known), the very value a walk of the files gives; with the cache off, nothing is started."""
    import nnhal

    code = ("import nnhal.session\nfrom nnhal.session import cache as sc\n"
            "if sc._early is not None:\n"
            "    sc._early[0].join(30)\n"
            "print(sc._early is not None, sc._fingerprint == sc._walk(sc._package_dir()))\n")
    env = dict(os.environ, PYTHONPATH=str(Path(nnhal.__file__).resolve().parent.parent),
               TF_CPP_MIN_LOG_LEVEL="3")
    env[sc.ENV] = cache
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    started, right = done.stdout.split()
    assert (started, right) == (("True", "True") if cache == "1" else ("False", "False"))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_fork_while_the_import_computes_the_fingerprint_settles_in_the_child():
    """A child forked at once after the import (its thread perhaps still running, absent in
    the child) gets the right fingerprint and never waits on the parent's thread."""
    import nnhal

    code = ("import os, sys\nimport nnhal.session\nfrom nnhal.session import cache as sc\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    fp = sc.Fingerprint(None)\n"
            "    fp.begin()\n"
            "    os._exit(0 if fp.settle() == sc._walk(sc._package_dir()) else 1)\n"
            "_, status = os.waitpid(pid, 0)\n"
            "sys.exit(os.waitstatus_to_exitcode(status))\n")
    env = dict(os.environ, PYTHONPATH=str(Path(nnhal.__file__).resolve().parent.parent),
               TF_CPP_MIN_LOG_LEVEL="3")
    env.pop(sc.ENV, None)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty", "foreign"])
def test_a_damaged_entry_is_a_miss_with_correct_results(home, tmp_path, damage):
    path = model_file(tmp_path, "bmm_f32.tflite")
    with Session(path, cache=True) as first:
        x = feeds(first)
        expected = first.run(x)
    [entry] = entries(home)
    blob = bytearray(entry.read_bytes())
    if damage == "flip":
        blob[len(blob) // 2] ^= 1
    elif damage == "truncate":
        del blob[-10:]
    elif damage == "empty":
        blob = bytearray()
    else:  # a valid entry of another model put in its place
        with Session(model_file(tmp_path, "reverse_f32.tflite"), cache=True):
            pass
        other = [e for e in entries(home) if e != entry][0]
        blob = bytearray(other.read_bytes())
    entry.write_bytes(bytes(blob))
    with Session(path, cache=True) as second:
        assert not second.restored
        assert same(second.run(x), expected)
    with Session(path, cache=True) as third:  # the miss wrote the entry again
        assert third.restored
        assert same(third.run(x), expected)


def test_a_damaged_driver_cache_is_a_miss_with_correct_results(home, tmp_path):
    path = model_file(tmp_path, "bmm_f32.tflite")
    with Session(path, cache=True) as first:
        x = feeds(first)
        expected = first.run(x)
    for f in (home / "session" / "steps").glob("*_m*"):
        blob = bytearray(f.read_bytes())
        blob[len(blob) // 2] ^= 0x40
        f.write_bytes(bytes(blob))
    with Session(path, cache=True) as second:
        assert not second.restored
        assert same(second.run(x), expected)


def test_other_content_is_a_miss(home, tmp_path):
    """The same path rewritten with another model (its modification time set back: the
    change time still differs) is read again, never restored as the old one."""
    path = model_file(tmp_path, "bmm_f32.tflite")
    with Session(path, cache=True) as first:
        assert not first.restored
    st = path.stat()
    shutil.copyfile(DATA / "reverse_f32.tflite", path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    with Session(path, cache=True) as second:
        assert not second.restored
        assert [i.name for i in second.inputs] == ["x"]
        x = feeds(second)
        with Session(path, cache=False) as reference:
            assert same(second.run(x), reference.run(x))


def test_bytes_are_cached_by_content(home):
    data = (DATA / "bmm_f32.tflite").read_bytes()
    with Session(data, cache=True) as first:
        x = feeds(first)
        expected = first.run(x)
    with Session(bytearray(data), cache=True) as second:
        assert second.restored and second.source == "<bytes>"
        assert same(second.run(x), expected)
    with Session((DATA / "pack_f32.tflite").read_bytes(), cache=True) as other:
        assert not other.restored


def test_cache_false_never_writes(home, tmp_path):
    path = model_file(tmp_path, "bmm_f32.tflite")
    for _ in range(2):
        with Session(path, cache=False) as s:
            assert not s.restored
    assert not (home / "session").exists() or not any((home / "session").rglob("*"))


def test_the_environment_turns_it_off(home, tmp_path, monkeypatch):
    monkeypatch.setenv(sc.ENV, "0")
    path = model_file(tmp_path, "bmm_f32.tflite")
    for _ in range(2):
        with Session(path) as s:
            assert not s.restored
    assert not entries(home)


def test_small_models_are_not_cached_by_default(home, tmp_path):
    path = model_file(tmp_path, "bmm_f32.tflite")
    assert path.stat().st_size < sc.MIN_BYTES
    for _ in range(2):
        with Session(path) as s:
            assert not s.restored
    assert not entries(home)


def test_a_device_session_restores(home, tmp_path, monkeypatch):
    path = model_file(tmp_path, "reverse_f32.tflite")
    with Session(path, "reference", cache=True) as first:
        x = feeds(first)
        expected = first.run(x)
    no_reading(monkeypatch)
    with Session(path, "reference", cache=True) as second:
        assert second.restored and second.device_name == "reference"
        assert same(second.run(x), expected)


def test_a_partitioned_plan_restores(home, tmp_path, monkeypatch):
    path = model_file(tmp_path, "floor_div_mod.tflite")
    with Session(path, cache=True) as first:
        if len(first.plan) < 2:
            pytest.skip(f"not partitioned here (on {first.device_name}): needs ai-edge-litert")
        x = {k: np.where(v == 0, 3, v) for k, v in feeds(first).items()}  # no divisor 0
        expected = first.run(x)
    before = analyses()
    no_reading(monkeypatch)
    with Session(path, cache=True) as second:
        assert second.restored and second.plan == first.plan
        assert same(second.run(x), expected)
    assert analyses() == before


def test_a_restored_session_reads_its_model_when_asked(home, tmp_path):
    path = model_file(tmp_path, "bmm_f32.tflite")
    with Session(path, cache=True) as first:
        ops = len(first.model.main.operations)
    second = Session(path, cache=True)
    assert second.restored
    assert len(second.model.main.operations) == ops
    second.close()
    third = Session(path, cache=True)
    assert third.restored
    path.write_bytes((DATA / "pack_f32.tflite").read_bytes())
    with pytest.raises(Exception, match="changed since the session opened"):
        third.model  # noqa: B018
    third.close()


def test_state_variables_are_restored(home, monkeypatch):
    """A streaming model's state (from the wake-word package, when installed) restores with
    its initial values, and runs the same sequence."""
    from test_session import _wakeword_model

    src = Path(_wakeword_model())
    first = Session(src, cache=True)
    if not first._state_vars:
        first.close()
        pytest.skip("the model has no state variables")
    xs = [feeds(first, seed) for seed in range(3)]
    expected = [first.run(x) for x in xs]
    first.close()
    no_reading(monkeypatch)
    with Session(src, cache=True) as second:
        assert second.restored
        assert [same(second.run(x), e) for x, e in zip(xs, expected)] == [True] * 3


def test_concurrent_first_opens_leave_one_good_entry(home, tmp_path):
    """Sessions opening the same file at once with an empty cache (each a miss writing the
    entry and the drivers' files) all run correctly, and the next open restores."""
    import threading

    path = model_file(tmp_path, "floor_div_mod.tflite")
    with Session(path, cache=False) as plain:
        x = {k: np.where(v == 0, 3, v) for k, v in feeds(plain).items()}
        expected = plain.run(x)
    results: list[object] = []
    barrier = threading.Barrier(4)

    def open_and_run() -> None:
        barrier.wait()
        try:
            with Session(path, cache=True) as s:
                results.append(same(s.run(x), expected))
        except Exception as e:  # noqa: BLE001 - reported below
            results.append(e)

    threads = [threading.Thread(target=open_and_run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == [True] * 4
    assert len(entries(home)) == 1
    with Session(path, cache=True) as after:
        assert after.restored and same(after.run(x), expected)


def test_a_restored_session_falls_back_to_the_reference(home, tmp_path):
    """A driver failing a run of a restored Session: the runtime's CPU fallback reads the
    model then, and the run still gives the right outputs."""
    from nnhal.hal.types import ErrorStatus, Timing
    from nnhal.runtime.plan import FallbackPrepared

    path = model_file(tmp_path, "bmm_f32.tflite")
    with Session(path, cache=True) as first:
        x = feeds(first)
        expected = first.run(x)
    with Session(path, cache=True) as second:
        assert second.restored
        if not isinstance(second._prepared, FallbackPrepared):
            pytest.skip(f"restored on {second.device_name}: no other device to fall back from")
        second._prepared.primary.execute_synchronously = \
            lambda *a, **k: (ErrorStatus.GENERAL_FAILURE, [], Timing())
        second._prepared.primary.bind_arrays = lambda shapes: None  # the run goes by request
        assert second._imported is None  # not read yet
        assert same(second.run(x), expected)
        assert second._imported is not None  # read for the fallback


def test_the_entry_is_written_off_the_first_results_path(home, tmp_path, monkeypatch):
    """The drivers' cache saves (megabytes to disk) and the entry come after the Session is
    ready: it runs while they are held; close() waits for them; the next open restores."""
    import threading

    from nnhal.drivers.common import compilation_cache as cc

    path = model_file(tmp_path, "bmm_f32.tflite")
    release, started = threading.Event(), threading.Event()
    real_save = cc.CompilationCache.save

    def held_save(self, *args, **kwargs):
        started.set()
        assert release.wait(20)
        return real_save(self, *args, **kwargs)

    monkeypatch.setattr(cc.CompilationCache, "save", held_save)
    monkeypatch.setattr(cc, "LATE_SAVE_DELAY_S", 30.0)
    first = Session(path, cache=True)
    try:
        assert not first.restored
        x = feeds(first)
        time.sleep(0.05)
        assert not started.is_set()  # the saves wait for the first result
        expected = first.run(x)  # ready and running while the saves are held
        assert started.wait(10)
        assert not entries(home)
    finally:
        release.set()
        first.close()
    assert len(entries(home)) == 1
    with Session(path, cache=True) as second:
        assert second.restored and same(second.run(x), expected)


def test_a_file_not_seen_before_is_hashed_after_its_first_result(home, tmp_path, monkeypatch):
    """A file whose digest is not remembered (and could be: not changed lately) is a miss: it
    is not looked up, and hashed by the thread writing its entry, after the first result; the
    entry's key is the content's, the digest is remembered, and the next open restores
    without reading the file."""
    import threading

    monkeypatch.setattr(sc, "RACY_NS", -1)  # every file old enough to be remembered
    path = model_file(tmp_path, "bmm_f32.tflite")
    hashed = []
    real = sc.Digesting.result

    def counted(self):
        digest = real(self)
        hashed.append((digest, threading.current_thread() is threading.main_thread()))
        return digest

    monkeypatch.setattr(sc.Digesting, "result", counted)
    with Session(path, cache=True) as first:
        assert not hashed  # not on the open's way
        x = feeds(first)
        expected = first.run(x)
        assert not first.restored
    assert hashed == [(sc.content_digest(path.read_bytes()), False)]
    assert len(entries(home)) == 1
    no_reading(monkeypatch)
    with Session(path, cache=True) as second:
        assert second.restored and same(second.run(x), expected)
    assert len(hashed) == 1  # remembered: not hashed again


def test_the_same_content_under_a_new_name_is_prepared_and_its_entry_restores(
        home, tmp_path, monkeypatch):
    """Content not seen under this name is not looked up (a miss): prepared again, its entry
    written again under the same key (the drivers' files of each entry named by a token of its
    own, which the entry records), and the next open of either name restores it."""
    monkeypatch.setattr(sc, "RACY_NS", -1)
    path = model_file(tmp_path, "bmm_f32.tflite")
    copy = tmp_path / "copy.tflite"
    shutil.copyfile(path, copy)
    with Session(path, cache=True) as first:
        x = feeds(first)
        expected = first.run(x)
    with Session(copy, cache=True) as second:
        assert not second.restored and same(second.run(x), expected)
    assert len(entries(home)) == 1  # one content, one entry
    for p in (path, copy):
        with Session(p, cache=True) as again:
            assert again.restored and same(again.run(x), expected)


@pytest.mark.parametrize("files_key", [12, "ab", "zz" * 32, "00" * 32, None])
def test_an_entry_with_a_bad_files_token_is_a_miss(home, tmp_path, monkeypatch, files_key):
    """A record naming no driver files (not a token, not hex, another token) restores
    nothing: a miss, which prepares. Without a token, the entry's key names them (a file
    just written is hashed at once, its entry's files named by its key)."""
    path = model_file(tmp_path, "bmm_f32.tflite")
    saved = []
    real = sc.Store.save

    def keep(self, key, record):
        saved.append((self, key, dict(record)))
        return real(self, key, record)

    monkeypatch.setattr(sc.Store, "save", keep)
    with Session(path, cache=True) as first:
        x = feeds(first)
        expected = first.run(x)
    [(store, key, record)] = saved
    assert isinstance(record["files_key"], str) and len(record["files_key"]) == 64
    if files_key is None:
        del record["files_key"]  # (files named by the entry's key: these were, just written)
    else:
        record["files_key"] = files_key
    assert real(store, key, record)
    with Session(path, cache=True) as second:
        assert second.restored == (files_key is None) and same(second.run(x), expected)


def _cache_bytes(home: Path) -> int:
    return sum(p.stat().st_size for p in (home / "session").rglob("*") if p.is_file())


@pytest.mark.parametrize("bound", ["entries", "bytes"])
def test_the_least_recently_used_entries_go_past_the_bounds(home, tmp_path, monkeypatch, bound):
    names = ["bmm_f32.tflite", "pack_f32.tflite", "reverse_f32.tflite", "mirror_pad_f32.tflite"]
    paths = [model_file(tmp_path, n) for n in names]
    with Session(paths[0], cache=True):
        pass
    one = _cache_bytes(home)  # one entry with its driver caches
    assert len(entries(home)) == 1 and one > 0
    if bound == "entries":
        monkeypatch.setattr(sc, "MAX_ENTRIES", 2)
    else:
        monkeypatch.setattr(sc, "MAX_BYTES", 2 * one + one // 2)
    for p in paths[1:]:
        with Session(p, cache=True):
            pass
    assert len(entries(home)) == 2  # the two most recent
    if bound == "bytes":
        assert _cache_bytes(home) <= 2 * one + one // 2
    for p, restored in zip(paths[::-1], [True, True, False, False]):  # newest first
        with Session(p, cache=True) as s:
            assert s.restored == restored, p.name


def test_driver_files_no_entry_names_go_once_old(home, tmp_path):
    """A drivers' cache file no entry names (its entry replaced, or never written) is removed
    when an entry is written, once older than ORPHAN_AGE_S; younger ones (an entry being
    written) and other files stay."""
    steps = home / "session" / "steps"
    with Session(model_file(tmp_path, "bmm_f32.tflite"), cache=True) as s:
        s.run(feeds(s))
    named = {p.name for p in steps.iterdir()}
    assert named
    old = time.time() - sc.ORPHAN_AGE_S - 60
    orphan, young, other = steps / ("ab" * 20 + "_m0"), steps / ("cd" * 20 + "_d0"), \
        steps / "notes.txt"
    for p in (orphan, young, other):
        p.write_bytes(b"x")
    os.utime(orphan, (old, old))
    os.utime(other, (old, old))
    for p in named:
        os.utime(steps / p, (old, old))  # old, but named by the entry
    with Session(model_file(tmp_path, "pack_f32.tflite"), cache=True) as s:
        s.run(feeds(s))
    left = {p.name for p in steps.iterdir()}
    assert orphan.name not in left and {young.name, other.name} <= left
    assert named <= left
