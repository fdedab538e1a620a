"""The LiteRT driver's compilation cache: the flatbuffer in the authenticated container,
restored without exporting again; tampering, wrong tokens and foreign caches rejected; the
driver's private store of flatbuffers used when it holds a safe copy, else the client's files
fully checked."""

from __future__ import annotations

import os
import stat
import time

import numpy as np
import pytest
from test_caching import EXPECTED, TOKEN, X, const_model, flip, restore, run, size

from nnhal.drivers.litert import unavailable
from nnhal.hal.interfaces import PreparedModelCallback
from nnhal.hal.types import ErrorStatus, ExecutionPreference, Priority

pytestmark = pytest.mark.skipif(unavailable() is not None,
                                reason=f"LiteRT driver unavailable: {unavailable()}")
E = ErrorStatus


@pytest.fixture
def store_dir(tmp_path):
    return tmp_path / "store"


@pytest.fixture
def device(store_dir):
    from nnhal.drivers.litert import LiteRTDevice

    dev = LiteRTDevice(threads=1, store_dir=store_dir)
    yield dev
    dev.close()


@pytest.fixture
def files(tmp_path):
    opened = []
    for name in ("model", "data"):
        f = open(tmp_path / name, "w+b")  # noqa: SIM115 - closed by the fixture
        f.write(b"stale" * 40)
        f.flush()
        opened.append(f)
    yield [opened[0]], [opened[1]]
    for f in opened:
        f.close()


def prepare(device, model, mc=(), dc=(), token=TOKEN):
    cb = PreparedModelCallback()
    device.prepare_model(model, ExecutionPreference.FAST_SINGLE_ANSWER, Priority.HIGH, None,
                         list(mc), list(dc), token, cb)
    status, pm = cb.wait(30)
    assert status == E.NONE
    return pm


@pytest.fixture
def saved(device, files):
    mc, dc = files
    writer = prepare(device, const_model(), mc, dc)
    return device, mc, dc, writer


def test_restore_runs_the_cached_flatbuffer_without_exporting(saved, monkeypatch):
    import nnhal.drivers.litert.device as dev_mod

    device, mc, dc, writer = saved
    assert device.get_number_of_cache_files_needed() == (E.NONE, 1, 1)
    assert size(dc[0]) == len(writer.flatbuffer)  # the data cache is the flatbuffer
    device._cache.forget_live_plans()

    def no_export(*a, **k):
        raise AssertionError("exported again")

    monkeypatch.setattr(dev_mod, "write_tflite", no_export)
    status, pm = restore(device, mc, dc)
    assert status == E.NONE and pm.plan is not writer.plan
    assert pm.priority == Priority.HIGH
    np.testing.assert_allclose(run(pm), EXPECTED, rtol=1e-5)
    assert pm.signature.operands[0].dimensions == list(X.shape)


def test_a_live_plan_is_reused(saved):
    device, mc, dc, writer = saved
    status, pm = restore(device, mc, dc)
    assert status == E.NONE and pm.plan is writer.plan


def test_a_tampered_model_cache_is_rejected_even_with_a_private_copy(saved, store_dir):
    device, mc, dc, _ = saved
    device._cache.forget_live_plans()
    assert wait_for(lambda: len(stored(store_dir)) == 1)
    flip(mc[0], size(mc[0]) // 2)
    status, pm = restore(device, mc, dc)
    assert status == E.GENERAL_FAILURE and pm is None


def test_a_tampered_data_cache_is_rejected_without_a_private_copy(saved, store_dir):
    device, mc, dc, _ = saved
    device._cache.forget_live_plans()
    assert wait_for(lambda: len(stored(store_dir)) == 1)
    for path in stored(store_dir):
        path.unlink()
    flip(dc[0], size(dc[0]) // 2)
    status, pm = restore(device, mc, dc)
    assert status == E.GENERAL_FAILURE and pm is None


def test_a_tampered_data_cache_is_rejected_with_no_store(tmp_path, files):
    from nnhal.drivers.litert import LiteRTDevice

    device = LiteRTDevice(threads=1, store_dir=tmp_path / "unused", private_store=False)
    try:
        mc, dc = files
        prepare(device, const_model(), mc, dc)
        device._cache.forget_live_plans()
        flip(dc[0], size(dc[0]) // 2)
        status, pm = restore(device, mc, dc)
        assert status == E.GENERAL_FAILURE and pm is None
        assert not (tmp_path / "unused").exists()
    finally:
        device.close()


# ---- the private store ----------------------------------------------------------------------

def stored(store_dir):
    return sorted(store_dir.glob("*.bin"))


def wait_for(predicate, timeout=10.0):
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


def test_prepare_keeps_a_private_copy_named_by_its_digest(saved, store_dir):
    from nnhal.drivers.common.compilation_cache import data_digest

    _, _, _, writer = saved
    assert wait_for(lambda: len(stored(store_dir)) == 1)
    (path,) = stored(store_dir)
    assert path.name == data_digest(writer.flatbuffer).hex() + ".bin"
    assert path.read_bytes() == writer.flatbuffer
    assert stat.S_IMODE(store_dir.stat().st_mode) == 0o700


def test_restore_uses_the_private_copy_and_not_the_data_cache(saved, store_dir, monkeypatch):
    import nnhal.drivers.common.compilation_cache as cc
    from nnhal.drivers.common.private_store import StoredFile

    device, mc, dc, writer = saved
    assert wait_for(lambda: len(stored(store_dir)) == 1)
    device._cache.forget_live_plans()
    # Garbage of the right length in the client's data cache: never read, never hashed.
    os.pwrite(dc[0].fileno(), bytes(size(dc[0])), 0)

    def no_hash(data):
        raise AssertionError("the data cache was hashed")

    monkeypatch.setattr(cc, "data_digest", no_hash)
    status, pm = restore(device, mc, dc)
    assert status == E.NONE
    assert isinstance(pm.plan.engines.source, StoredFile)
    np.testing.assert_allclose(run(pm), EXPECTED, rtol=1e-5)
    assert pm.flatbuffer == writer.flatbuffer


def test_the_data_cache_length_is_still_checked(saved, store_dir):
    device, mc, dc, _ = saved
    assert wait_for(lambda: len(stored(store_dir)) == 1)
    device._cache.forget_live_plans()
    os.ftruncate(dc[0].fileno(), size(dc[0]) - 1)
    status, pm = restore(device, mc, dc)
    assert status == E.GENERAL_FAILURE and pm is None


def test_an_absent_copy_restores_from_the_files_and_is_kept_again(saved, store_dir):
    device, mc, dc, writer = saved
    assert wait_for(lambda: len(stored(store_dir)) == 1)
    (path,) = stored(store_dir)
    path.unlink()
    device._cache.forget_live_plans()
    status, pm = restore(device, mc, dc)
    assert status == E.NONE and isinstance(pm.plan.engines.source, bytes)
    np.testing.assert_allclose(run(pm), EXPECTED, rtol=1e-5)
    assert wait_for(path.exists)
    assert path.read_bytes() == writer.flatbuffer


def _truncate(path):
    os.truncate(path, path.stat().st_size - 8)


def _garbage(path):
    path.write_bytes(bytes(path.stat().st_size))


def _group_writable_file(path):
    path.chmod(0o660)


def _symlink(path):
    real = path.with_suffix(".real")
    path.rename(real)
    path.symlink_to(real)


def _group_writable_dir(path):
    path.parent.chmod(0o770)


@pytest.mark.parametrize("spoil", [_truncate, _garbage, _group_writable_file, _symlink,
                                   _group_writable_dir])
def test_an_unusable_copy_is_not_used(saved, store_dir, spoil):
    """A copy of the wrong length, not a flatbuffer, writable by others, a link, or in a
    directory others may write: the client's files are restored and fully checked instead
    (a tampered data cache then fails; the intact one restores)."""
    device, mc, dc, _ = saved
    assert wait_for(lambda: len(stored(store_dir)) == 1)
    (path,) = stored(store_dir)
    spoil(path)
    device._cache.forget_live_plans()
    flip(dc[0], size(dc[0]) // 2)
    status, pm = restore(device, mc, dc)
    assert status == E.GENERAL_FAILURE and pm is None
    flip(dc[0], size(dc[0]) // 2)
    status, pm = restore(device, mc, dc)
    assert status == E.NONE
    np.testing.assert_allclose(run(pm), EXPECTED, rtol=1e-5)
    if spoil is not _group_writable_dir:  # the verified flatbuffer replaces the bad copy

        def good():
            try:
                st = os.stat(path, follow_symlinks=False)
            except FileNotFoundError:
                return False
            return stat.S_ISREG(st.st_mode) and not st.st_mode & 0o022 and \
                path.read_bytes() == pm.flatbuffer

        assert wait_for(good)


def test_the_store_is_bounded(tmp_path):
    from nnhal.drivers.common.private_store import PrivateStore

    store = PrivateStore(tmp_path / "s", max_bytes=250)
    for k in range(3):
        assert store.put(bytes([k]) * 32, bytes([k]) * 100)
        time.sleep(0.01)  # distinct modification times
    names = sorted(p.name[:2] for p in (tmp_path / "s").glob("*.bin"))
    assert names == ["01", "02"]  # the oldest went first
    assert store.open(bytes(32), 100) is None
    assert store.open(bytes([2]) * 32, 99) is None  # not the length the model cache names
    f = store.open(bytes([2]) * 32, 100)
    assert f is not None and f.read() == bytes([2]) * 100
    f.close()


def test_the_store_is_bounded_in_files(tmp_path):
    from nnhal.drivers.common.private_store import PrivateStore

    store = PrivateStore(tmp_path / "s", max_files=2)
    for k in range(4):
        assert store.put(bytes([k]) * 32, bytes([k]) * 10)
        time.sleep(0.01)
    assert sorted(p.name[:2] for p in (tmp_path / "s").glob("*.bin")) == ["02", "03"]


def test_a_wrong_token_is_rejected(saved):
    device, mc, dc, _ = saved
    status, pm = restore(device, mc, dc, token=bytes(32))
    assert status == E.GENERAL_FAILURE and pm is None


def test_a_reference_cache_is_rejected_even_with_the_same_key(tmp_path, files):
    from nnhal.drivers.litert import LiteRTDevice
    from nnhal.drivers.reference import ReferenceDevice

    key = tmp_path / "key"
    ref, lit = ReferenceDevice(cache_key_file=key), LiteRTDevice(threads=1, cache_key_file=key)
    try:
        mc, dc = files
        prepare(ref, const_model(), mc, dc)
        assert os.fstat(mc[0].fileno()).st_size > 0
        status, pm = restore(lit, mc, dc)
        assert status == E.GENERAL_FAILURE and pm is None
    finally:
        ref.close()
        lit.close()
