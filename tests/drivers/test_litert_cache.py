"""The LiteRT driver's compilation cache: the flatbuffer in the authenticated container,
restored without exporting again; tampering, wrong tokens and foreign caches rejected."""

from __future__ import annotations

import os

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
def device():
    from nnhal.drivers.litert import LiteRTDevice

    dev = LiteRTDevice(threads=1)
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


@pytest.mark.parametrize("which", ["model", "data"])
def test_tampering_is_rejected(saved, which):
    device, mc, dc, _ = saved
    device._cache.forget_live_plans()
    f = mc[0] if which == "model" else dc[0]
    flip(f, size(f) // 2)
    status, pm = restore(device, mc, dc)
    assert status == E.GENERAL_FAILURE and pm is None


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
