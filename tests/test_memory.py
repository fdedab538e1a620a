import os
import tempfile

import numpy as np
import pytest

from nnhal.memory import MemoryError_, SharedMemory


@pytest.mark.parametrize("make", [SharedMemory.ashmem, SharedMemory.hardware_buffer_blob])
def test_anonymous_pools_read_write(make):
    mem = make(64)
    assert mem.name in ("ashmem", "hardware_buffer_blob")
    mem.write(8, np.arange(4, dtype=np.float32))
    view = mem.view(8, 16).view(np.float32)
    assert view.tolist() == [0.0, 1.0, 2.0, 3.0]
    # Views alias the mapping: no copy.
    assert np.shares_memory(mem.view(0, 64), view)
    mem.close()
    assert mem.closed


def test_bounds_are_checked():
    mem = SharedMemory.ashmem(16)
    with pytest.raises(MemoryError_):
        mem.view(8, 9)
    with pytest.raises(MemoryError_):
        mem.view(-1, 2)
    with pytest.raises(MemoryError_):
        mem.write(15, b"ab")
    assert mem.view(16, 0).size == 0


def test_mmap_fd_with_unaligned_offset():
    with tempfile.TemporaryFile() as f:
        data = bytes(range(256)) * 40
        f.write(data)
        f.flush()
        mem = SharedMemory.mmap_fd(f.fileno(), size=100, offset=5000)
        assert mem.name == "mmap_fd"
        assert mem.read(0, 4) == data[5000:5004]
        mem.write(1, b"\xff")
        f.seek(5001)
        assert f.read(1) == b"\xff"
        mem.close()


def test_mmap_fd_beyond_file_is_an_error():
    with tempfile.TemporaryFile() as f:
        f.write(b"x" * 10)
        f.flush()
        mem = SharedMemory.mmap_fd(f.fileno(), size=100, offset=0)
        with pytest.raises(MemoryError_):
            mem.array()
        mem.close()


def test_close_releases_descriptor():
    mem = SharedMemory.ashmem(8)
    fd = mem.fd
    mem.array()
    mem.close()
    with pytest.raises(OSError):
        os.fstat(fd)
    with pytest.raises(MemoryError_):
        mem.array()


# ---- a client shrinking its memory after the driver mapped it ----------------------------------
# Touching a mapped page past the end of its file is SIGBUS, which kills the process: every test
# that lets the driver touch a shrunk memory runs in a subprocess, so a fault fails the test
# instead of killing pytest.

def _shrinkable(kind, size, tmp_path):
    """(memory, fd to truncate, file offset of the region) of each kind a request may use."""
    if kind == "ashmem":
        mem = SharedMemory.ashmem(size)
        return mem, mem.fd, 0
    if kind == "hardware_buffer_blob":
        mem = SharedMemory.hardware_buffer_blob(size)
        return mem, mem.fd, 0
    offset = 5000  # not page-aligned
    fd = os.open(tmp_path / "pool", os.O_RDWR | os.O_CREAT) if kind == "mmap_fd_file" else \
        os.memfd_create("client")
    os.ftruncate(fd, offset + size)
    return SharedMemory.mmap_fd(fd, size, offset), fd, offset


@pytest.mark.parametrize("kind", ["ashmem", "hardware_buffer_blob", "mmap_fd_file",
                                  "mmap_fd_memfd"])
def test_shrunk_memory_is_refused_before_it_is_touched(kind, tmp_path):
    """In-process: array() and shrunk_memory() check the file size without touching a page."""
    from nnhal.hal.types import MemoryPool
    from nnhal.memory import shrunk_memory

    mem, fd, offset = _shrinkable(kind, 3 * 4096, tmp_path)
    try:
        mem.array()
        pos = os.lseek(fd, 123, os.SEEK_SET)
        assert shrunk_memory([mem, MemoryPool.of(mem), MemoryPool.of_token(1), None]) is None
        os.ftruncate(fd, offset + 3 * 4096 - 1)  # one byte short is enough to refuse
        why = shrunk_memory([MemoryPool.of(mem)])
        assert why is not None and "shrunk" in why
        assert shrunk_memory([mem]) == why
        with pytest.raises(MemoryError_, match="shrunk"):
            mem.array()
        with pytest.raises(MemoryError_, match="shrunk"):
            mem.check_size()
        with pytest.raises(MemoryError_):
            mem.read(0, 1)
        mem.mapped()  # the unchecked accessor does not check: its caller does
        assert os.lseek(fd, 0, os.SEEK_CUR) == pos  # the check never moves the file offset
        os.ftruncate(fd, offset + 3 * 4096)  # grown back: usable again (zero-filled)
        assert shrunk_memory([mem]) is None
        assert mem.read(3 * 4096 - 1, 1) == b"\0"
    finally:
        mem.close()
        if kind.startswith("mmap_fd"):
            os.close(fd)
    assert shrunk_memory([mem]) is None  # closed: no longer checked (nor touched)


_SHRINK_SCRIPT = r'''
import json, os, sys, tempfile
import numpy as np
from nnhal.drivers.reference import ReferenceDevice
from nnhal.hal.fence import SyncFence
from nnhal.hal.builder import ModelBuilder
from nnhal.hal.interfaces import PreparedModelCallback
from nnhal.hidl import ExecutionCallback
from nnhal.hidl import execute as execute_1_3
from nnhal.hal.types import (BufferDesc, BufferRole, DataLocation, ErrorStatus, MemoryPool,
                             OperandType as T, OperationType as O, Request, RequestArgument)
from nnhal.memory import SharedMemory

kind, which = sys.argv[1], sys.argv[2]
N = 4096  # elements: each argument spans four pages
NB = 4 * N
tmp = tempfile.mkdtemp()

def memory(size):
    if kind == "ashmem":
        m = SharedMemory.ashmem(size); return m, m.fd, 0
    if kind == "hardware_buffer_blob":
        m = SharedMemory.hardware_buffer_blob(size); return m, m.fd, 0
    off = 5000
    fd = os.open(os.path.join(tmp, f"pool{size}"), os.O_RDWR | os.O_CREAT) \
        if kind == "mmap_fd_file" else os.memfd_create("client")
    os.ftruncate(fd, off + size)
    return SharedMemory.mmap_fd(fd, size, off), fd, off

def prepare(dev, model):
    cb = PreparedModelCallback()
    dev.prepare_model(model, callback=cb)
    return cb.wait(30)

b = ModelBuilder()
x, y = b.input(T.TENSOR_FLOAT32, [N]), b.input(T.TENSOR_FLOAT32, [N])
act = b.scalar(T.INT32, 0)
out = b.output(T.TENSOR_FLOAT32, [N])
b.operation(O.ADD, [x, y, act], [out])
dev = ReferenceDevice()
status, pm = prepare(dev, b.build())
assert status == ErrorStatus.NONE

inp, in_fd, in_off = memory(2 * NB)
outm, out_fd, out_off = memory(NB)
inp.write(0, np.ones(2 * N, np.float32))
req = Request([RequestArgument(False, DataLocation(0, 0, NB)),
               RequestArgument(False, DataLocation(0, NB, NB))],
              [RequestArgument(False, DataLocation(1, 0, NB))], [inp, MemoryPool.of(outm)])
_, burst = pm.configure_execution_burst()
holds = [burst.cache_memory(inp), burst.cache_memory(MemoryPool.of(outm))]
_, uncached = pm.configure_execution_burst()
_, reusable = pm.create_reusable_execution(req)
_, burst_reusable = burst.create_reusable_execution(req)

def fenced(status, fence, cb):
    if status != ErrorStatus.NONE:
        return status
    fence.wait(30)
    return cb.get_execution_info(30)[0]

def async_():
    cb = ExecutionCallback()
    launch = execute_1_3(pm, req, 0, None, None, cb)
    status = cb.wait(30)[0]
    assert cb.calls == 1
    return status if launch == ErrorStatus.NONE else launch

def waiting_fenced():
    fence = SyncFence()
    r = pm.execute_fenced(req, [fence])
    fence.signal()  # the shrink happened before: the run itself must refuse
    return fenced(*r)

paths = {
    "sync": lambda: pm.execute_synchronously(req)[0],
    "async": async_,
    "fenced": lambda: fenced(*pm.execute_fenced(req, [])),
    "fenced_waiting": waiting_fenced,
    "burst_cached": lambda: burst.execute(req)[0],
    "burst_uncached": lambda: uncached.execute(req)[0],
    "reusable": lambda: reusable.compute()[0],
    "reusable_fenced": lambda: fenced(*reusable.compute_fenced([])),
    "burst_reusable": lambda: burst_reusable.compute()[0],
}
# Memory domains copy to and from a memory of the same kind, shrunk with the others.
_, buf, _ = dev.allocate(BufferDesc([N]), [pm], [BufferRole(0, 0)], [BufferRole(0, 0)])
cp, cp_fd, cp_off = memory(NB)
paths["copy_from"] = lambda: buf.copy_from(cp, [N])
paths["copy_to"] = lambda: buf.copy_to(cp) if buf.copy_from(SharedMemory.ashmem(NB), [N]) == 0 \
    else ErrorStatus.GENERAL_FAILURE
fd, off, size = (in_fd, in_off, 2 * NB) if which == "input" else (out_fd, out_off, NB)
result = {"before": {}, "shrunk": {}, "regrown": {}}
for name, fn in paths.items():
    result["before"][name] = ErrorStatus(fn()).name
os.ftruncate(fd, off + (0 if which == "input" else size // 2))
os.ftruncate(cp_fd, cp_off + NB // 2)
for name, fn in paths.items():
    result["shrunk"][name] = ErrorStatus(fn()).name
shrunk = inp if which == "input" else outm
result["shrunk"]["cache_memory"] = repr(pm.configure_execution_burst()[1].cache_memory(shrunk))
os.ftruncate(fd, off + size)
os.ftruncate(cp_fd, cp_off + NB)
for name, fn in paths.items():
    result["regrown"][name] = ErrorStatus(fn()).name
print(json.dumps(result))
'''


def _run_script(script, *args):
    """Run ``script`` in a fresh interpreter on this checkout; its last stdout line."""
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", script, *args], capture_output=True,
                          text=True, timeout=300, env=env, cwd=root)
    assert proc.returncode == 0, (f"the driver process died (returncode {proc.returncode}, "
                                  f"-7 is SIGBUS): {proc.stderr[-2000:]}")
    return proc.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("which", ["input", "output"])
@pytest.mark.parametrize("kind", ["ashmem", "hardware_buffer_blob", "mmap_fd_file",
                                  "mmap_fd_memfd"])
def test_request_memory_shrunk_between_executions(kind, which):
    """A client shrinks an input or output pool between two executions: every execution path
    answers INVALID_ARGUMENT (the process survives), and works again once the size is back."""
    import json

    result = json.loads(_run_script(_SHRINK_SCRIPT, kind, which))
    assert set(result["before"].values()) == {"NONE"}, result["before"]
    shrunk = dict(result["shrunk"])
    assert shrunk.pop("cache_memory") == "None"  # the burst does not cache it
    assert set(shrunk.values()) == {"INVALID_ARGUMENT"}, result["shrunk"]
    assert set(result["regrown"].values()) == {"NONE"}, result["regrown"]


_CONSTANT_SCRIPT = r'''
import os
import numpy as np
from nnhal.drivers.reference import ReferenceDevice
from nnhal.hal.builder import ModelBuilder
from nnhal.hal.interfaces import PreparedModelCallback
from nnhal.hal.types import ErrorStatus, OperandType as T, OperationType as O
from nnhal.memory import SharedMemory

b = ModelBuilder()
x = b.input(T.TENSOR_FLOAT32, [4096])
c = b.constant(T.TENSOR_FLOAT32, np.ones(4096, np.float32))  # 16 KiB: a pool constant
act = b.scalar(T.INT32, 0)
out = b.output(T.TENSOR_FLOAT32, [4096])
b.operation(O.ADD, [x, c, act], [out])
model = b.build()
try:  # the builder's pool is sealed: nobody can shrink (or write) it
    os.ftruncate(model.pools[0].fd, 4096)
    raise SystemExit("the builder's pool could be shrunk")
except PermissionError:
    pass
# A client's own pool, unsealed, holding the same bytes.
model.pools[0] = SharedMemory.from_bytes(model.pools[0].read(0, model.pools[0].size))
dev = ReferenceDevice()
assert dev.get_supported_operations(model)[0] == ErrorStatus.NONE  # maps the pool
os.ftruncate(model.pools[0].fd, 4096)
cb = PreparedModelCallback()
launch = dev.prepare_model(model, callback=cb)
print(dev.get_supported_operations(model)[0].name, launch.name, cb.wait(30)[0].name, cb.calls)
'''


def test_model_constant_pool_shrunk_before_prepare():
    """A model pool shrunk after getSupportedOperations mapped it: INVALID_ARGUMENT."""
    assert _run_script(_CONSTANT_SCRIPT).split() == ["INVALID_ARGUMENT", "INVALID_ARGUMENT",
                                                     "INVALID_ARGUMENT", "1"]


def test_memory_sealed_against_shrinking_is_not_checked():
    """A memfd its creator sealed with F_SEAL_SHRINK before the driver mapped it cannot
    shrink: no per-use check (nor syscall) is needed; sealed after mapping, it still is."""
    import fcntl

    from nnhal.memory import shrunk_memory

    sealed, late = SharedMemory.ashmem(8192), SharedMemory.ashmem(8192)
    try:
        fcntl.fcntl(sealed.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
        sealed.array()
        late.array()
        fcntl.fcntl(late.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
        assert sealed._fixed and not late._fixed
        with pytest.raises(PermissionError):
            os.ftruncate(sealed.fd, 0)
        assert shrunk_memory([sealed, late]) is None
        sealed.check_size()
        os.ftruncate(sealed.fd, 16384)  # growing is still allowed
        assert sealed.read(8191, 1) == b"\0"
    finally:
        sealed.close()
        late.close()


def test_ashmem_created_sealed_is_never_checked():
    """SharedMemory.ashmem(sealed=True): sealed against shrinking from the start, so a
    bound request's size-check list leaves it out; an unsealed one stays in it."""
    from nnhal.memory.pool import shrunk_watched, watch_of

    sealed, plain = SharedMemory.ashmem(4096, sealed=True), SharedMemory.ashmem(4096)
    try:
        sealed.array()
        plain.array()
        with pytest.raises(PermissionError):
            os.ftruncate(sealed.fd, 0)
        assert [m for _, _, m in watch_of([sealed, plain])] == [plain]
        os.ftruncate(plain.fd, 0)
        assert "shrunk" in (shrunk_watched(watch_of([sealed, plain])) or "")
    finally:
        sealed.close()
        plain.close()


def test_from_parts_writes_each_part_and_seals_for_good():
    """A pool written from parts (bytes and arrays) holds them at their offsets, zeros
    between; sealed, nobody can write, shrink or grow it, it maps read-only and says it is
    immutable, so readers may view it instead of copying."""
    import fcntl

    parts = [(0, b"abc"), (8, np.arange(4, dtype=np.int32)), (32, memoryview(b"z" * 5))]
    open_, sealed = SharedMemory.from_parts(40, parts), SharedMemory.from_parts(40, parts,
                                                                                 seal=True)
    try:
        want = b"abc" + b"\0" * 5 + np.arange(4, dtype=np.int32).tobytes() + b"\0" * 8 + b"z" * 5
        for mem in (open_, sealed):
            assert mem.read(0, 40) == want + b"\0" * 3
        assert not open_.immutable and open_.array().flags.writeable
        assert sealed.immutable and not sealed.array().flags.writeable
        with pytest.raises(ValueError):
            sealed.write(0, b"x")
        for change in (lambda: os.ftruncate(sealed.fd, 8), lambda: os.ftruncate(sealed.fd, 80),
                       lambda: os.pwrite(sealed.fd, b"x", 0),
                       lambda: fcntl.fcntl(sealed.fd, fcntl.F_ADD_SEALS, 0)):
            with pytest.raises(PermissionError):
                change()
        with pytest.raises(MemoryError_):
            SharedMemory.from_parts(4, [(2, b"abc")])
    finally:
        open_.close()
        sealed.close()


def test_parts_in_batches_land_where_they_belong(monkeypatch):
    """Parts written in runs (one pwritev each: small gaps as zeros, a large gap, a part
    before the last one or past IOV_MAX starting a new run), by from_parts and by the
    background PartsWriter in batches, even when a pwritev writes only part of a run."""
    from nnhal.memory import pool

    rng = np.random.default_rng(0)
    parts, off = [], 0
    for k in range(300):
        blob = rng.integers(0, 256, int(rng.integers(1, 300)), dtype=np.uint8)
        blob.flags.writeable = False
        parts.append((off, blob if k % 2 else blob.tobytes()))
        off += blob.size + int(rng.choice([0, 3, 7, 500]))
    parts.append((1, b"early"))  # before the previous part: a run of its own
    size = off + 8
    want = bytearray(size)
    for o, d in parts:
        want[o:o + len(bytes(d))] = bytes(d)
    real = os.pwritev
    monkeypatch.setattr(pool, "_IOV_MAX", 16)
    monkeypatch.setattr(os, "pwritev", lambda fd, bufs, o: real(fd, bufs[:3], o))  # short
    mem = SharedMemory.from_parts(size, parts)
    writer = pool.PartsWriter()
    writer.BATCH_BYTES = 4096
    for o, d in parts:
        writer.write(o, d)
    batched = writer.finish(size, seal=True)
    try:
        assert mem.read(0, size) == bytes(want)
        assert batched.read(0, size) == bytes(want)
    finally:
        mem.close()
        batched.close()


def test_analysis_views_a_sealed_pool_and_copies_an_open_one():
    """A ModelBuilder pool is sealed: the analysis keeps views of it (a model's weights are
    not copied again); a client's own, writable pool is still copied (owned constants)."""
    from nnhal.analysis import analyse
    from nnhal.hal.builder import ModelBuilder
    from nnhal.hal.types import OperandType as T
    from nnhal.hal.types import OperationType as O

    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, [1024])
    c = b.constant(T.TENSOR_FLOAT32, np.arange(1024, dtype=np.float32))
    out = b.output(T.TENSOR_FLOAT32, [1024])
    b.operation(O.ADD, [x, c, b.scalar(T.INT32, 0)], [out])
    model = b.build()
    pool = model.pools[0]
    value = analyse(model).main.operands[c].value
    assert pool.immutable and np.shares_memory(value, pool.array())
    assert np.array_equal(value, np.arange(1024, dtype=np.float32))

    model.pools[0] = SharedMemory.from_bytes(pool.read(0, pool.size))  # writable, unsealed
    copied = analyse(model).main.operands[c].value
    assert not np.shares_memory(copied, model.pools[0].array())
    model.pools[0].array()[:4] = 255  # the client changes its memory: the graph keeps its copy
    assert np.array_equal(copied, np.arange(1024, dtype=np.float32))


def test_a_memory_sealed_against_writing_is_refused_as_a_request_pool():
    """A sealed (immutable) memory maps read-only: as a request's pool (whose outputs are
    written) it is INVALID_ARGUMENT, never a failure in the middle of a run."""
    from nnhal.drivers.reference import ReferenceDevice
    from nnhal.hal.builder import ModelBuilder
    from nnhal.hal.interfaces import PreparedModelCallback
    from nnhal.hal.types import DataLocation, ErrorStatus, MeasureTiming, MemoryPool, Request
    from nnhal.hal.types import OperandType as T
    from nnhal.hal.types import OperationType as O
    from nnhal.hal.types import RequestArgument as Arg

    b = ModelBuilder()
    x, out = b.input(T.TENSOR_FLOAT32, [4]), b.output(T.TENSOR_FLOAT32, [4])
    b.operation(O.ADD, [x, x, b.scalar(T.INT32, 0)], [out])
    dev = ReferenceDevice()
    try:
        cb = PreparedModelCallback()
        dev.prepare_model(b.build(), callback=cb)
        status, pm = cb.wait(30)
        assert status == ErrorStatus.NONE
        inp = SharedMemory.from_bytes(np.ones(4, np.float32).tobytes())
        sealed = SharedMemory.from_parts(16, [], seal=True)
        req = Request([Arg(False, DataLocation(0, 0, 16), [])],
                      [Arg(False, DataLocation(1, 0, 16), [])],
                      [MemoryPool.of(inp), MemoryPool.of(sealed)])
        assert pm.execute_synchronously(req, MeasureTiming.NO)[0] == \
            ErrorStatus.INVALID_ARGUMENT
    finally:
        dev.close()


def test_a_size_past_a_files_is_refused_not_an_overflow():
    from nnhal.memory.pool import MAX_FILE_BYTES, MemoryError_

    for size in (MAX_FILE_BYTES + 1, 1 << 70):
        with pytest.raises(MemoryError_, match="past what a file can hold"):
            SharedMemory.ashmem(size)
