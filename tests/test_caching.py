"""Compilation caching: saving, restoring, and refusing caches the driver did not write."""

from __future__ import annotations

import os
import random
import time

import numpy as np
import pytest

from nnhal.analysis import analyse
from nnhal.drivers.common.compilation_cache import CacheError, decode_head
from nnhal.drivers.reference import ReferenceDevice
from nnhal.drivers.reference.cache import decode_image, encode_model
from nnhal.executor import ModelPlan
from nnhal.hal.builder import ModelBuilder, RequestBuilder
from nnhal.hal.interfaces import PreparedModelCallback
from nnhal.hal.types import (
    DataLocation,
    ErrorStatus,
    ExecutionPreference,
    Model,
    OperandLifeTime,
    OperandType,
    OperationType,
    Priority,
    Subgraph,
    SymmPerChannelQuantParams,
)

T = OperandType
TOKEN = bytes(range(100, 132))
SHAPE = (4, 16)


def const_model() -> Model:
    """out = (x + big) * small: one pool constant (data cache) and one inline constant."""
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, SHAPE)
    big = b.constant(T.TENSOR_FLOAT32, np.arange(64, dtype=np.float32).reshape(SHAPE) / 7)
    small = b.constant(T.TENSOR_FLOAT32, np.linspace(-1, 1, 16, dtype=np.float32)[None, :])
    act = b.scalar(T.INT32, 0)
    t = b.operand(T.TENSOR_FLOAT32, SHAPE)
    out = b.output(T.TENSOR_FLOAT32, SHAPE)
    b.operation(OperationType.ADD, [x, big, act], [t])
    b.operation(OperationType.MUL, [t, small, act], [out])
    return b.build()


X = np.random.default_rng(7).standard_normal(SHAPE).astype(np.float32)
EXPECTED = (X + np.arange(64, dtype=np.float32).reshape(SHAPE) / 7) * \
    np.linspace(-1, 1, 16, dtype=np.float32)[None, :]


def run(pm) -> np.ndarray:
    rb = RequestBuilder([X], [X.nbytes])
    try:
        status, _, _ = pm.execute_synchronously(rb.request)
        assert status == ErrorStatus.NONE
        return rb.output(0, np.float32, SHAPE)
    finally:
        rb.close()


def prepare(device, model, mc=(), dc=(), token=TOKEN):
    cb = PreparedModelCallback()
    launch = device.prepare_model(model, ExecutionPreference.FAST_SINGLE_ANSWER,
                                  Priority.MEDIUM, None, list(mc), list(dc), token, cb)
    status, pm = cb.wait(10)
    assert cb.calls == 1
    assert launch == ErrorStatus.NONE and status == ErrorStatus.NONE and pm is not None
    return pm


def restore(device, mc, dc, token=TOKEN, deadline=None):
    """(status, prepared model); checks the callback came exactly once and agrees."""
    cb = PreparedModelCallback()
    launch = device.prepare_model_from_cache(deadline, list(mc), list(dc), token, cb)
    status, pm = cb.wait(10)
    assert cb.calls == 1
    assert launch in (ErrorStatus.NONE, status)
    assert (pm is None) == (status != ErrorStatus.NONE)
    return status, pm


def rejected(device, mc, dc, token=TOKEN) -> ErrorStatus:
    status, pm = restore(device, mc, dc, token)
    assert pm is None
    return status


@pytest.fixture
def files(tmp_path):
    """Two read-write cache files holding stale bytes, their fds at a nonzero offset."""
    opened = []
    for name in ("model", "data"):
        f = open(tmp_path / name, "w+b")  # noqa: SIM115 - closed by the fixture
        f.write(b"stale bytes from an earlier life of this file" * 3)
        f.flush()
        f.seek(5)
        opened.append(f)
    yield [opened[0]], [opened[1]]
    for f in opened:
        f.close()


@pytest.fixture
def saved(device, files):
    """A model prepared with caching; yields (device, mc, dc, writer prepared model)."""
    mc, dc = files
    writer = prepare(device, const_model(), mc, dc)
    return device, mc, dc, writer


def size(f) -> int:
    return os.fstat(f.fileno()).st_size


def flip(f, pos: int, bit: int = 0) -> None:
    old = os.pread(f.fileno(), 1, pos)
    os.pwrite(f.fileno(), bytes([old[0] ^ (1 << bit)]), pos)


# ---- the happy path --------------------------------------------------------------------------

def test_cache_files_needed(device):
    status, n_model, n_data = device.get_number_of_cache_files_needed()
    assert status == ErrorStatus.NONE and n_model >= 1 and n_data >= 1


def test_restored_model_gives_identical_results(saved):
    device, mc, dc, writer = saved
    expected = run(writer)
    np.testing.assert_allclose(expected, EXPECTED, rtol=1e-6)
    assert size(mc[0]) > 0 and size(dc[0]) >= 256  # stale bytes were truncated away
    status, live = restore(device, mc, dc)
    assert status == ErrorStatus.NONE
    assert np.array_equal(run(live), expected)
    device._cache.forget_live_plans()
    for f in mc + dc:
        f.seek(11)  # any offset
    status, cold = restore(device, mc, dc)
    assert status == ErrorStatus.NONE and cold.plan is not writer.plan
    assert np.array_equal(run(cold), expected)
    # Async execution of a restored model works too.
    assert cold.priority == Priority.MEDIUM


def test_cold_restore_after_writer_is_gone(device, files):
    mc, dc = files
    writer = prepare(device, const_model(), mc, dc)
    expected = run(writer)
    del writer
    status, pm = restore(device, mc, dc)
    assert status == ErrorStatus.NONE
    assert np.array_equal(run(pm), expected)
    # And restoring again, while that restored model lives, still gives the same results.
    status, again = restore(device, mc, dc)
    assert status == ErrorStatus.NONE and np.array_equal(run(again), expected)


def test_handles_as_fd_ints_and_one_fd_native_handles(device, files):
    mc, dc = files
    prepare(device, const_model(), [mc[0].fileno()], [(dc[0].fileno(),)])
    device._cache.forget_live_plans()
    status, pm = restore(device, [(mc[0].fileno(),)], [dc[0].fileno()])
    assert status == ErrorStatus.NONE
    np.testing.assert_allclose(run(pm), EXPECTED, rtol=1e-6)


def test_saving_overwrites_a_previous_cache(device, files):
    mc, dc = files
    prepare(device, const_model(), mc, dc)
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, SHAPE)
    y = b.constant(T.TENSOR_FLOAT32, np.ones(SHAPE, np.float32))
    act = b.scalar(T.INT32, 0)
    out = b.output(T.TENSOR_FLOAT32, SHAPE)
    b.operation(OperationType.ADD, [x, y, act], [out])
    prepare(device, b.build(), mc, dc)
    device._cache.forget_live_plans()
    status, pm = restore(device, mc, dc)
    assert status == ErrorStatus.NONE
    assert np.array_equal(run(pm), X + 1)


# ---- tampering -------------------------------------------------------------------------------

def test_every_flipped_bit_position_of_the_model_cache_is_rejected(saved):
    device, mc, dc, _writer = saved
    n = size(mc[0])
    assert n < 4096  # a small model keeps this exhaustive test fast
    for pos in range(n):
        flip(mc[0], pos, pos % 8)
        assert rejected(device, mc, dc) == ErrorStatus.GENERAL_FAILURE, pos
        flip(mc[0], pos, pos % 8)
    assert restore(device, mc, dc)[0] == ErrorStatus.NONE


def test_wrong_token_is_rejected(saved):
    device, mc, dc, _writer = saved
    for i in range(len(TOKEN)):
        wrong = bytearray(TOKEN)
        wrong[i] ^= 1 << (i % 8)
        assert rejected(device, mc, dc, bytes(wrong)) == ErrorStatus.GENERAL_FAILURE


@pytest.mark.parametrize("delta", [-1, -33, 1, 200])
def test_truncated_or_extended_model_cache_is_rejected(saved, delta):
    device, mc, dc, _writer = saved
    n = size(mc[0])
    if delta < 0:
        os.ftruncate(mc[0].fileno(), n + delta)
    else:
        os.pwrite(mc[0].fileno(), bytes(delta), n)
    assert rejected(device, mc, dc) == ErrorStatus.GENERAL_FAILURE
    os.ftruncate(mc[0].fileno(), 0)
    assert rejected(device, mc, dc) == ErrorStatus.GENERAL_FAILURE


def test_swapped_model_cache_of_another_token_is_rejected(device, tmp_path, files):
    mc, dc = files
    prepare(device, const_model(), mc, dc)
    other_token = bytes(32)
    with open(tmp_path / "m2", "w+b") as m2, open(tmp_path / "d2", "w+b") as d2:
        prepare(device, const_model(), [m2], [d2], other_token)
        os.ftruncate(mc[0].fileno(), 0)
        os.pwrite(mc[0].fileno(), os.pread(m2.fileno(), size(m2), 0), 0)
    assert rejected(device, mc, dc) == ErrorStatus.GENERAL_FAILURE


def test_cache_of_another_driver_instance_is_rejected(saved):
    _device, mc, dc, _writer = saved
    other = ReferenceDevice()
    try:
        assert rejected(other, mc, dc) == ErrorStatus.GENERAL_FAILURE
    finally:
        other.close()


def test_modified_data_cache_is_rejected_when_it_would_be_used(saved):
    device, mc, dc, writer = saved
    expected = run(writer)
    n = size(dc[0])
    for pos in sorted({0, 1, n // 3, n // 2, n - 1}):
        flip(dc[0], pos, 3)
        # While the writer lives, its plan is reused: results can never be wrong.
        status, pm = restore(device, mc, dc)
        if status == ErrorStatus.NONE:
            assert np.array_equal(run(pm), expected)
        # Without a live plan, the data digest catches the change.
        device._cache.forget_live_plans()
        assert rejected(device, mc, dc) == ErrorStatus.GENERAL_FAILURE, pos
        flip(dc[0], pos, 3)
    for new_size in (n - 1, n + 1, 0):
        data = os.pread(dc[0].fileno(), n, 0)
        os.ftruncate(dc[0].fileno(), new_size)
        assert rejected(device, mc, dc) == ErrorStatus.GENERAL_FAILURE
        os.ftruncate(dc[0].fileno(), 0)
        os.pwrite(dc[0].fileno(), data, 0)
    device._cache.forget_live_plans()
    status, pm = restore(device, mc, dc)
    assert status == ErrorStatus.NONE and np.array_equal(run(pm), expected)


# ---- saving never fails preparation ----------------------------------------------------------

@pytest.mark.parametrize("which", ["model", "data"])
def test_read_only_cache_file_still_prepares(device, tmp_path, files, which):
    mc, dc = files
    path = tmp_path / which
    fd = os.open(path, os.O_RDONLY)
    try:
        args = ([fd], dc) if which == "model" else (mc, [fd])
        pm = prepare(device, const_model(), *args)
        np.testing.assert_allclose(run(pm), EXPECTED, rtol=1e-6)
        device._cache.forget_live_plans()
        status = rejected(device, *args)
        assert status in (ErrorStatus.GENERAL_FAILURE, ErrorStatus.INVALID_ARGUMENT)
    finally:
        os.close(fd)


def test_closed_fd_still_prepares(device, files):
    mc, dc = files
    model = const_model()  # before closing: its pool must not take the closed fd's number
    r, w = os.pipe()
    os.close(r)
    os.close(w)
    pm = prepare(device, model, [r], dc)
    np.testing.assert_allclose(run(pm), EXPECTED, rtol=1e-6)
    pm = prepare(device, model, [object()], dc)  # not a handle at all
    np.testing.assert_allclose(run(pm), EXPECTED, rtol=1e-6)
    assert rejected(device, [r], dc) == ErrorStatus.GENERAL_FAILURE


@pytest.mark.parametrize("counts", [(0, 1), (1, 0), (2, 1), (1, 2)])
def test_wrong_handle_counts_prepare_without_saving(device, tmp_path, counts):
    handles = [open(tmp_path / f"f{i}", "w+b") for i in range(4)]  # noqa: SIM115
    try:
        mc, dc = handles[:counts[0]], handles[2:2 + counts[1]]
        pm = prepare(device, const_model(), mc, dc)
        np.testing.assert_allclose(run(pm), EXPECTED, rtol=1e-6)
        assert all(size(f) == 0 for f in handles)  # nothing was written
        assert rejected(device, mc, dc) == ErrorStatus.INVALID_ARGUMENT
    finally:
        for f in handles:
            f.close()


@pytest.mark.parametrize("token", [b"", bytes(31), bytes(33), "x" * 32, 32, None])
def test_bad_token_prepares_without_saving_and_restore_refuses_it(device, files, token):
    mc, dc = files
    before = size(mc[0])
    pm = prepare(device, const_model(), mc, dc, token)
    np.testing.assert_allclose(run(pm), EXPECTED, rtol=1e-6)
    assert size(mc[0]) == before  # not saved
    assert rejected(device, mc, dc, token) == ErrorStatus.INVALID_ARGUMENT


def test_token_ignored_without_cache_files(device):
    pm = prepare(device, const_model(), [], [], b"not a token at all")
    np.testing.assert_allclose(run(pm), EXPECTED, rtol=1e-6)


# ---- prepareModelFromCache arguments ---------------------------------------------------------

def test_restore_argument_errors(saved, tmp_path):
    device, mc, dc, _writer = saved
    with open(tmp_path / "extra", "w+b") as extra:
        assert rejected(device, mc + [extra], dc) == ErrorStatus.INVALID_ARGUMENT
        assert rejected(device, mc, dc + [extra]) == ErrorStatus.INVALID_ARGUMENT
        assert rejected(device, [], dc) == ErrorStatus.INVALID_ARGUMENT
        assert rejected(device, [(mc[0].fileno(), extra.fileno())], dc) == \
            ErrorStatus.INVALID_ARGUMENT
        assert rejected(device, [()], dc) == ErrorStatus.INVALID_ARGUMENT
        assert rejected(device, [-1], dc) == ErrorStatus.INVALID_ARGUMENT
        assert rejected(device, ["3"], dc) == ErrorStatus.INVALID_ARGUMENT

        class BadHandle:
            def fileno(self):
                raise RuntimeError("no fd here")

        assert rejected(device, [BadHandle()], dc) == ErrorStatus.INVALID_ARGUMENT
        pm = prepare(device, const_model(), [BadHandle()], dc)  # prepares, does not save
        np.testing.assert_allclose(run(pm), EXPECTED, rtol=1e-6)
    assert device.prepare_model_from_cache(None, mc, dc, TOKEN, None) == \
        ErrorStatus.INVALID_ARGUMENT


@pytest.mark.parametrize("live", [True, False])
def test_write_only_cache_file_fails_restore(saved, tmp_path, live):
    device, mc, dc, _writer = saved
    for which in ("model", "data"):
        if not live:
            device._cache.forget_live_plans()
        fd = os.open(tmp_path / which, os.O_WRONLY)
        try:
            args = ([fd], dc) if which == "model" else (mc, [fd])
            assert rejected(device, *args) == ErrorStatus.GENERAL_FAILURE
        finally:
            os.close(fd)


def test_passed_deadline(saved):
    device, mc, dc, _writer = saved
    status, pm = restore(device, mc, dc, deadline=time.monotonic_ns() - 1)
    assert pm is None
    assert status in (ErrorStatus.MISSED_DEADLINE_PERSISTENT,
                      ErrorStatus.MISSED_DEADLINE_TRANSIENT)


def test_raising_callback_does_not_break_restore(saved):
    device, mc, dc, _writer = saved

    class Boom:
        calls = 0

        def notify(self, status, pm):
            Boom.calls += 1
            raise RuntimeError("client bug")

    assert device.prepare_model_from_cache(None, mc, dc, TOKEN, Boom()) == ErrorStatus.NONE
    assert device.prepare_model_from_cache(None, mc, dc, bytes(32), Boom()) == \
        ErrorStatus.GENERAL_FAILURE
    deadline = time.monotonic() + 5
    while Boom.calls < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert Boom.calls == 2


def test_no_descriptors_leak(device, files):
    mc, dc = files
    fds_before = len(os.listdir("/proc/self/fd"))
    for _ in range(5):
        pm = prepare(device, const_model(), mc, dc)
        device._cache.forget_live_plans()
        restore(device, mc, dc)
        rejected(device, mc, dc, bytes(32))
    del pm
    import gc

    gc.collect()
    assert len(os.listdir("/proc/self/fd")) <= fds_before


# ---- the format ------------------------------------------------------------------------------

def structured_model() -> Model:
    """Every field of the plan image: referenced subgraphs (IF), a per-channel quantized
    CONV_2D whose filter lives in a pool, scalar and boolean constants, and an operand whose
    dimensions are only known after shape inference."""
    b = ModelBuilder()
    x = b.input(T.TENSOR_QUANT8_ASYMM, (1, 2, 2, 3), 0.5, 100)
    scales = [0.25 + k / 64 for k in range(48)]
    w = b.constant(T.TENSOR_QUANT8_SYMM_PER_CHANNEL,
                   (np.arange(48 * 3) % 17 - 8).astype(np.int8).reshape(48, 1, 1, 3),
                   channel_quant=SymmPerChannelQuantParams(scales, 0))
    bias = b.constant(T.TENSOR_INT32, np.arange(48, dtype=np.int32) - 20)
    one, zero = b.scalar(T.INT32, 1), b.scalar(T.INT32, 0)
    conv = b.operand(T.TENSOR_QUANT8_ASYMM, (0, 0, 0, 0), 1.0, 10)  # inferred at prepare
    b.operation(OperationType.CONV_2D, [x, w, bias, one, one, one, zero], [conv])
    y = b.operand(T.TENSOR_FLOAT32, (1, 2, 2, 48))
    b.operation(OperationType.DEQUANTIZE, [conv], [y])
    cond = b.constant(T.TENSOR_BOOL8, [3])  # any nonzero byte is true
    then_ref, else_ref = b.operand(T.SUBGRAPH), b.operand(T.SUBGRAPH)
    out = b.output(T.TENSOR_FLOAT32, (1, 2, 2, 48))
    b.operation(OperationType.IF, [cond, then_ref, else_ref, y], [out])
    m = b.build()
    for i, target in ((then_ref, 0), (else_ref, 1)):
        m.main.operands[i].lifetime = OperandLifeTime.SUBGRAPH
        m.main.operands[i].location = DataLocation(0, target, 0)

    def branch(op: OperationType) -> Subgraph:
        sb = ModelBuilder()
        a = sb.input(T.TENSOR_FLOAT32, (1, 2, 2, 48))
        r = sb.output(T.TENSOR_FLOAT32, (1, 2, 2, 48))
        sb.operation(op, [a], [r])
        return sb.build().main

    m.referenced = [branch(OperationType.RELU), branch(OperationType.RELU6)]
    return m


STRUCTURED_X = (np.arange(12, dtype=np.uint8) * 21).reshape(1, 2, 2, 3)


def run_structured(pm) -> np.ndarray:
    rb = RequestBuilder([STRUCTURED_X], [4 * 2 * 2 * 48])
    try:
        status, shapes, _ = pm.execute_synchronously(rb.request)
        assert status == ErrorStatus.NONE and shapes[0].dimensions == [1, 2, 2, 48]
        return rb.output(0, np.float32, (1, 2, 2, 48))
    finally:
        rb.close()


def test_plan_image_round_trip():
    model = structured_model()
    plan = ModelPlan(analyse(model))
    body, data = encode_model(model, plan, Priority.HIGH, "v9")
    head = decode_head(body)
    assert head.priority == Priority.HIGH and not head.relaxed
    assert head.data_length == len(data)
    image = decode_image(body, head, data, "v9")
    assert len(image.graph.subgraphs) == 3
    for got, want in zip(image.graph.subgraphs, plan.graph.subgraphs):
        assert got.operations == want.operations
        assert got.inputs == want.inputs
        assert got.outputs == want.outputs
        assert got.shapes == want.shapes
        for g, w in zip(got.operands, want.operands, strict=True):
            assert (g.type, g.shape, g.scale, g.zero_point, g.channel_dim, g.lifetime) == \
                (w.type, w.shape, w.scale, w.zero_point, w.channel_dim, w.lifetime)
            if w.channel_scales is None:
                assert g.channel_scales is None
            else:
                np.testing.assert_array_equal(g.channel_scales, w.channel_scales)
            if isinstance(w.value, np.ndarray):
                assert g.value.dtype == w.value.dtype and g.value.shape == w.value.shape
                np.testing.assert_array_equal(g.value, w.value)
                assert not g.value.flags.writeable
            else:
                assert g.value == w.value
    # Shape inference filled the conv output's unknown dims; the image carries that.
    assert image.graph.main.shapes[5] == (1, 2, 2, 48)
    assert image.graph.main.operands[5].shape == (0, 0, 0, 0)
    # The filter and bias (tensors) are in the data cache; the parameters are not.
    assert len(data) >= 48 * 3 + 48 * 4
    sig = image.graph.signature
    want = [model.main.operands[i] for i in (*model.main.input_indexes,
                                             *model.main.output_indexes)]
    assert [sig.operands[i] for i in (*sig.input_indexes, *sig.output_indexes)] == want
    with pytest.raises(CacheError):
        decode_image(body, head, data, "another version")


def test_cold_restore_of_a_structured_model(device, files):
    mc, dc = files
    writer = prepare(device, structured_model(), mc, dc)
    expected = run_structured(writer)
    assert np.any(expected != 0)
    del writer
    device._cache.forget_live_plans()
    status, pm = restore(device, mc, dc)
    assert status == ErrorStatus.NONE
    np.testing.assert_array_equal(run_structured(pm), expected)


def test_decoder_is_strict_on_damaged_bodies():
    """Without the tag, no damage may escape as anything but CacheError (or a clean decode)."""
    model = structured_model()
    plan = ModelPlan(analyse(model))
    body, data = encode_model(model, plan, Priority.LOW, "")
    rng = random.Random(1234)
    outcomes = {"ok": 0, "rejected": 0}
    for i in range(3000):
        b = bytearray(body)
        kind = i % 3
        if kind == 0:
            for _ in range(rng.randint(1, 4)):
                b[rng.randrange(len(b))] = rng.randrange(256)
        elif kind == 1:
            del b[rng.randrange(len(b)):]
        else:
            pos = rng.randrange(40, len(b) - 4)
            b[pos:pos + 4] = b"\xff\xff\xff\x7f"  # an absurd count or length somewhere
        try:
            head = decode_head(bytes(b))
            decode_image(bytes(b), head, data, "")
            outcomes["ok"] += 1
        except CacheError:
            outcomes["rejected"] += 1
    assert outcomes["rejected"] > 1500


def test_restore_reuses_the_live_plan(saved):
    device, mc, dc, writer = saved
    status, pm = restore(device, mc, dc)
    assert status == ErrorStatus.NONE and pm.plan is writer.plan


# ---- a persistent key --------------------------------------------------------------------------

def test_key_file_lets_caches_outlive_the_device(tmp_path, files):
    """Two devices sharing a key file (two runs of a program) share their caches; a device
    with another key refuses them."""
    from nnhal.drivers.reference import ReferenceDevice as Device

    mc, dc = files
    key = tmp_path / "key"
    first = Device(cache_key_file=key)
    try:
        expected = run(prepare(first, const_model(), mc, dc))
    finally:
        first.close()
    assert key.stat().st_mode & 0o777 == 0o600 and key.stat().st_size == 32
    second = Device(cache_key_file=key)
    other = Device(cache_key_file=tmp_path / "other-key")
    try:
        status, pm = restore(second, mc, dc)
        assert status == ErrorStatus.NONE
        assert np.array_equal(run(pm), expected)
        assert rejected(other, mc, dc) == ErrorStatus.GENERAL_FAILURE
    finally:
        second.close()
        other.close()


def test_key_file_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("NNHAL_CACHE_KEY_FILE", str(tmp_path / "env-key"))
    ReferenceDevice().close()
    assert (tmp_path / "env-key").stat().st_size == 32


@pytest.mark.parametrize("problem", ["readable by others", "wrong size", "directory"])
def test_unsafe_key_files_are_refused(tmp_path, problem):
    path = tmp_path / "key"
    if problem == "directory":
        path.mkdir()
    else:
        path.write_bytes(bytes(32) if problem == "readable by others" else bytes(31))
        path.chmod(0o644 if problem == "readable by others" else 0o600)
    with pytest.raises((ValueError, OSError)):
        ReferenceDevice(cache_key_file=path)


def test_concurrent_cold_restores(device, files):
    """Eight threads restoring the same files at once (each one possibly cold, possibly reusing
    a plan another just built) all get a working prepared model."""
    import threading

    mc, dc = files
    writer = prepare(device, structured_model(), mc, dc)
    expected = run_structured(writer)
    del writer
    device._cache.forget_live_plans()
    results: list[object] = []
    barrier = threading.Barrier(8)

    def worker() -> None:
        barrier.wait()
        try:
            status, pm = restore(device, mc, dc)
            assert status == ErrorStatus.NONE
            results.append(run_structured(pm))
        except Exception as e:  # noqa: BLE001 - reported below
            results.append(e)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(results) == 8
    for r in results:
        assert isinstance(r, np.ndarray), r
        np.testing.assert_array_equal(r, expected)


def test_key_file_without_hard_links(tmp_path, monkeypatch):
    """Filesystems without hard links still get a key file, the same one every time."""
    import errno

    from nnhal.drivers.common.compilation_cache import load_or_create_key

    def no_links(src, dst):
        raise OSError(errno.EPERM, "hard links not supported")

    monkeypatch.setattr(os, "link", no_links)
    path = tmp_path / "key"
    first = load_or_create_key(path)
    assert len(first) == 32 and path.stat().st_mode & 0o777 == 0o600
    assert load_or_create_key(path) == first
    assert [p.name for p in tmp_path.iterdir()] == ["key"]  # no temporary file left behind


def test_a_key_file_read_before_is_read_again_when_it_changed(tmp_path):
    """A process remembers the keys it read, never past a change of the file: a key made
    readable by others is refused, a replaced one is the new one."""
    from nnhal.drivers.common.compilation_cache import load_or_create_key

    path = tmp_path / "key"
    first = load_or_create_key(path)
    assert load_or_create_key(path) == first
    path.chmod(0o644)
    with pytest.raises(ValueError, match="0600"):
        load_or_create_key(path)
    other = bytes(range(32))
    replacement = tmp_path / "new"
    replacement.write_bytes(other)
    replacement.chmod(0o600)
    os.replace(replacement, path)
    assert load_or_create_key(path) == other


def test_late_save_notifies_first_and_a_restore_waits_for_it(device, files, monkeypatch):
    """Inside late_saves() the callback comes before the caches are written (the first result
    does not wait for them); a restore from the same driver waits for the save to land."""
    import threading

    from nnhal.drivers.common import compilation_cache as cc

    mc, dc = files
    release, saving = threading.Event(), threading.Event()
    real_save = cc.CompilationCache.save

    def slow_save(self, *args, **kwargs):
        saving.set()
        assert release.wait(10)
        return real_save(self, *args, **kwargs)

    monkeypatch.setattr(cc.CompilationCache, "save", slow_save)
    with cc.late_saves():
        writer = prepare(device, const_model(), mc, dc)  # notified while the save is held
    assert saving.wait(10)
    assert device.wait_cache_saves(0.05) is False  # still under way
    expected = run(writer)
    device._cache.forget_live_plans()
    got: list = []
    t = threading.Thread(target=lambda: got.append(restore(device, mc, dc)))
    t.start()
    time.sleep(0.05)
    assert not got  # waiting for the save, not failing on half-written files
    release.set()
    t.join(10)
    status, pm = got[0]
    assert status == ErrorStatus.NONE and np.array_equal(run(pm), expected)
    assert device.wait_cache_saves(0) is True


def test_saves_outside_late_saves_come_before_the_notification(device, files):
    mc, dc = files
    prepare(device, const_model(), mc, dc)
    assert size(mc[0]) > 0 and size(dc[0]) > 0  # written by the time the callback came


def test_a_late_save_holds_up_only_its_own_files(device, tmp_path, monkeypatch):
    """A late save waiting for its client's first result delays neither a restore of other
    files nor another preparation (a split model prepares its steps one after the other)."""
    import threading

    from nnhal.drivers.common import compilation_cache as cc

    monkeypatch.setattr(cc, "LATE_SAVE_DELAY_S", 30.0)
    gate = threading.Event()
    opened = [open(tmp_path / n, "w+b") for n in ("ma", "da", "mb", "db")]  # noqa: SIM115
    try:
        ma, da, mb, db = ([f] for f in opened)
        with cc.late_saves(gate):
            prepare(device, const_model(), ma, da, token=bytes(range(32)))
        t0 = time.monotonic()
        prepare(device, const_model(), mb, db)  # saved before notifying, as usual
        status, pm = restore(device, mb, db)
        assert status == ErrorStatus.NONE and pm is not None
        assert time.monotonic() - t0 < 10  # not held up by the gated save
        assert not device.wait_cache_saves(0.01) and size(ma[0]) == 0
        gate.set()
        assert device.wait_cache_saves(10)
        status, pm = restore(device, ma, da, token=bytes(range(32)))
        assert status == ErrorStatus.NONE
    finally:
        gate.set()
        for f in opened:
            f.close()
