"""The compilation-cache container: what any driver's compilation caching shares.

A driver asks for one file of each kind. The *model cache* is security-sensitive: a header, a
body and an HMAC-SHA256 tag over the cache token and every byte before the tag, keyed with a
secret of the driver (random per cache object, or kept in a key file: see
:func:`load_or_create_key`). The body begins with the prepared model's priority, a flag, and the
length and BLAKE3 digest of the *data cache*; what follows is the driver's own encoding of what
it prepared (the reference driver's plan image: :mod:`nnhal.drivers.reference.cache`). The data
cache holds what the driver wants to read back in place (constant tensors' bytes).

Restoring reads each file exactly once into memory, so a client rewriting the files
concurrently can only make the restore fail, never change what was verified. The tag is checked
before anything is decoded (a flipped byte anywhere, a wrong token, a truncated or extended
file all fail it). Then a background task decodes the body (:meth:`CompilationCache.decode`)
while the calling thread hashes the data cache, and builds what the driver runs
(:meth:`CompilationCache.bind`) only once the digest has matched.

A driver may keep a private copy of each data cache it writes or verifies
(:meth:`CompilationCache.private_data`, :meth:`CompilationCache.keep_private`; the LiteRT
driver's store: :mod:`nnhal.drivers.common.private_store`, which says why that is sound). When
the verified model cache names a data cache the driver has such a copy of, the restore uses the
copy and neither reads nor hashes the client's data cache (only its length is checked, as for a
live plan); should the copy fail to build, the client's files are restored the usual way.

An in-process client that leaves the cache files alone until the driver has written them
may ask for the save after the notification (:func:`late_saves`, around its prepareModel
call): the first result then does not wait for megabytes of cache written to disk. Such saves
are counted (:meth:`CompilationCache.wait_saved`) and every restore from this cache object
waits for them first; the model cache is still invalidated first and written last, so a
process that dies mid-save leaves no cache that restores.

While what was built for a given cache is still alive in this process (its prepared model is
still held by a client), a restore of that exact cache (same tag) reuses it instead of building
it again: the driver's plans must be immutable and safe to share between prepared models.

A driver subclasses :class:`CompilationCache` with its encoding (``encode``, ``decode``,
``bind``) and passes in, per restore, how to make a prepared model and where to run the work.

Layout, little-endian. Model cache::

    magic "NNHALMC2" | u32 format | u32 reserved | u64 body length | body | tag (32 bytes)
    body: u8 priority, u8 flag (the reference driver: relaxed float32), u64 data length,
          32-byte data BLAKE3 (see :func:`data_digest`), then the driver's encoding
"""

from __future__ import annotations

import contextvars
import hmac
import logging
import operator
import os
import secrets
import stat
import struct
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import blake3

from nnhal.drivers.common.callbacks import NotifyOnce
from nnhal.drivers.common.workers import WorkerPools
from nnhal.hal.checks import InvalidArgument, check_deadline, check_token
from nnhal.hal.interfaces import IPreparedModel, IPreparedModelCallback
from nnhal.hal.types import ErrorStatus, Model, Priority

log = logging.getLogger(__name__)

#: getNumberOfCacheFilesNeeded: one security-sensitive model cache file, one data cache file.
NUM_MODEL_CACHE = 1
NUM_DATA_CACHE = 1
MAGIC = b"NNHALMC2"
#: 3: the data cache's digest is BLAKE3 (SHA-256 in 2).
FORMAT_VERSION = 3
TAG_SIZE = 32
#: The largest model cache accepted: it holds structure only, never constant data.
MAX_MODEL_CACHE_BYTES = 256 << 20
#: The largest data cache accepted (its exact length is also bound by the model cache).
MAX_DATA_CACHE_BYTES = 1 << 36
_HMAC_DOMAIN = b"nnhal compilation cache v1\0"

_HEADER = struct.Struct("<8sIIQ")
_BODY_HEAD = struct.Struct("<BBQ32s")
#: Where the driver's encoding starts in the body.
BODY_HEAD_SIZE = _BODY_HEAD.size


class CacheError(Exception):
    """A cache could not be written, or a cache file is not one this driver wrote."""


class CacheArgumentError(Exception):
    """Cache handles or token are malformed (INVALID_ARGUMENT for prepareModelFromCache)."""


# ---- handles and token ---------------------------------------------------------------------

def handle_fd(handle: Any) -> int:
    """The file descriptor of a cache handle: an int, an object with ``fileno()``, or a
    native-handle-like sequence holding exactly one of those."""
    if isinstance(handle, (list, tuple)):
        if len(handle) != 1:
            raise CacheArgumentError(f"a cache handle must hold exactly one fd, not {len(handle)}")
        handle = handle[0]
    if isinstance(handle, bool) or handle is None:
        raise CacheArgumentError(f"not a file descriptor: {handle!r}")
    try:
        fileno = getattr(handle, "fileno", None)
        fd = operator.index(fileno() if callable(fileno) else handle)
    except (TypeError, ValueError, OSError) as e:
        raise CacheArgumentError(f"not a usable file descriptor: {e}") from e
    if not 0 <= fd <= 0x7FFF_FFFF:  # a C int: anything else is no descriptor at all
        raise CacheArgumentError(f"file descriptor {fd} outside [0, INT_MAX]")
    return fd


def token_bytes(token: Any) -> bytes:
    """The cache token as bytes; it must be exactly BYTE_SIZE_OF_CACHE_TOKEN long."""
    try:
        return check_token(token)
    except InvalidArgument as e:
        raise CacheArgumentError(str(e)) from None


def _handle_fds(handles: Any, needed: int, what: str) -> list[int]:
    try:
        items = list(handles) if handles is not None else []
    except TypeError as e:
        raise CacheArgumentError(f"{what}: not a sequence of handles") from e
    if len(items) != needed:
        raise CacheArgumentError(f"{what}: {len(items)} handles, expected {needed}")
    return [handle_fd(h) for h in items]


# ---- file access ----------------------------------------------------------------------------

def write_file(fd: int, data: bytes | bytearray | memoryview) -> None:
    """Truncate the file, then write ``data`` from offset 0 whatever the fd's own offset."""
    os.ftruncate(fd, 0)
    view = memoryview(data).cast("B")
    pos = 0
    while pos < len(view):
        n = os.pwrite(fd, view[pos:pos + (64 << 20)], pos)
        if n <= 0:
            raise CacheError("short write")
        pos += n


def read_file(fd: int, limit: int) -> bytes:
    """The whole file from offset 0 (never the fd's own offset), at most ``limit`` bytes."""
    size = os.fstat(fd).st_size
    if size > limit:
        raise CacheError(f"cache file of {size} bytes exceeds {limit}")
    parts = []
    pos = 0
    # One byte more than the size: a file that grew meanwhile is detected, not truncated.
    while pos <= size:
        chunk = os.pread(fd, size + 1 - pos, pos)
        if not chunk:
            break
        parts.append(chunk)
        pos += len(chunk)
    if pos > size:
        raise CacheError("cache file changed while being read")
    return parts[0] if len(parts) == 1 else b"".join(parts)



# ---- the body head ---------------------------------------------------------------------------

@dataclass
class BodyHead:
    priority: Priority
    relaxed: bool
    data_length: int
    data_digest: bytes


#: BLAKE3 in its key-derivation mode: a hash of its own for data caches (domain separation).
_DATA_CONTEXT = "nnhal 2026 compilation cache data cache digest v3"


def data_digest(data: bytes | memoryview) -> bytes:
    """The 32-byte digest of a data cache. BLAKE3 rather than SHA-256: over a data cache of
    many megabytes (a MobileNet's weights) it takes under half the time, and restoring
    waits for it. Unkeyed suffices: the digest is bound into the model cache, whose HMAC is
    keyed; only collision resistance is needed here."""
    return blake3.blake3(data, derive_key_context=_DATA_CONTEXT).digest()


def encode_head(priority: Priority, relaxed: bool, data: bytes) -> bytes:
    """The body head of a cache whose data cache is ``data``."""
    return _BODY_HEAD.pack(int(Priority(priority)), int(bool(relaxed)), len(data),
                           data_digest(data))


def decode_head(body: bytes | memoryview) -> BodyHead:
    if len(body) < _BODY_HEAD.size:
        raise CacheError("model cache ends early")
    prio, relaxed, n, digest = _BODY_HEAD.unpack_from(body, 0)
    if prio not in (0, 1, 2) or relaxed not in (0, 1):
        raise CacheError("bad priority or relaxed flag")
    return BodyHead(Priority(prio), bool(relaxed), n, digest)


# ---- the driver's secret --------------------------------------------------------------------

KEY_BYTES = 32


#: Keys read by this process: path -> (the file's identity and times when read, the key).
_keys_read: dict[str, tuple[tuple[int, ...], bytes]] = {}


def _identity(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_dev, st.st_ino, st.st_mode, st.st_uid, st.st_size, st.st_mtime_ns,
            st.st_ctime_ns)


def load_or_create_key(path: str | os.PathLike[str]) -> bytes:
    """The cache-authentication secret kept in ``path``, created (mode 0600) if absent.

    The file must be a regular file of exactly KEY_BYTES bytes that only its owner can read or
    write: a secret others can read would let them forge model caches. Raises ValueError
    otherwise, or OSError when the file cannot be read or created. A file this process read
    already is not read again while it is the same file, unchanged (one ``lstat``: a device
    and the Session cache each ask for the key as a Session opens; the change time moves with
    any write, rename or change of mode).
    """
    name = os.fspath(path)
    known = _keys_read.get(name)
    if known is not None:
        try:
            if _identity(os.stat(name, follow_symlinks=False)) == known[0]:
                return known[1]
        except OSError:
            pass
    if not os.path.lexists(path):
        # Written to a private temporary file, then linked into place: a concurrent creator
        # (another process) either wins the link or reads the complete winner.
        key = secrets.token_bytes(KEY_BYTES)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)),
                                   prefix=".nnhal-key-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(key)
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass
            except OSError:  # no hard links here: create it in place
                try:
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                                 0o600)
                except FileExistsError:
                    pass
                else:
                    with os.fdopen(fd, "wb") as f:
                        f.write(key)
        finally:
            os.unlink(tmp)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_mode & 0o077:
            raise ValueError(f"cache key file {os.fspath(path)!r} must be a regular file "
                             "accessible to its owner only (mode 0600)")
        key = os.read(fd, KEY_BYTES + 1)
    finally:
        os.close(fd)
    if len(key) != KEY_BYTES:
        raise ValueError(f"cache key file {os.fspath(path)!r} must hold {KEY_BYTES} bytes")
    if isinstance(name, str):
        _keys_read[name] = (_identity(st), key)
    return key


# ---- the cache ------------------------------------------------------------------------------

#: Whether prepareModel calls made in this context may save after notifying (late_saves):
#: True, or the event to wait for before saving.
_LATE_SAVES: contextvars.ContextVar[bool | threading.Event] = contextvars.ContextVar(
    "nnhal_late_cache_saves", default=False)

#: Seconds a restore (or a client) waits for this cache object's late saves.
SAVE_WAIT_S = 60.0
#: Seconds a late save waits for its ``after`` event before saving anyway.
LATE_SAVE_DELAY_S = 1.0


@contextmanager
def late_saves(after: threading.Event | None = None) -> Iterator[None]:
    """prepareModel calls made inside may write their caches after notifying the callback
    (once ``after`` is set, or :data:`LATE_SAVE_DELAY_S` later: e.g. once the client's first
    execution is done, which the save would slow down). For an in-process client that
    neither reads nor changes the files until :meth:`CompilationCache.wait_saved` (or a
    restore, which waits itself) says they are written; a driver that knows nothing of it
    saves before notifying, as usual."""
    token = _LATE_SAVES.set(after if after is not None else True)
    try:
        yield
    finally:
        _LATE_SAVES.reset(token)


def saves_may_be_late() -> bool | threading.Event:
    """Whether the calling context asked for :func:`late_saves` (its event, if it gave one)."""
    return _LATE_SAVES.get()


class SaveJob:
    """Duplicated descriptors of validated cache handles, owned until :meth:`close`."""

    def __init__(self, model_fds: list[int], data_fds: list[int], token: bytes):
        self.model_fds = model_fds
        self.data_fds = data_fds
        self.token = token
        #: (digest, data) of a data cache written, for :meth:`CompilationCache.finish_save`.
        self.private: tuple[bytes, bytes] | None = None

    def close(self) -> None:
        fds, self.model_fds, self.data_fds = self.model_fds + self.data_fds, [], []
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass

    def __del__(self) -> None:
        self.close()


@dataclass
class Loaded:
    """Both files of a cache, the model cache verified. ``plan`` is the live plan of the same
    cache when there is one (then nothing else is needed); else ``body`` (from the body head
    on) and ``data`` are what the driver decodes."""

    head: BodyHead
    tag: bytes
    plan: Any = None
    body: bytes | memoryview = b""
    data: bytes = b""
    #: The driver's private copy of the data cache (:meth:`CompilationCache.private_data`),
    #: used instead of ``data``, which is then empty.
    private: Any = None

    def data_matches(self) -> bool:
        # One call: blake3 releases the GIL for all of it, so another thread can decode.
        return hmac.compare_digest(data_digest(self.data), self.head.data_digest)


class CompilationCache:
    """A driver instance's compilation cache: its secret key and its live restorable plans.

    ``key`` defaults to a fresh random secret, so caches are valid for this driver instance
    only; pass a persistent key (e.g. read from a driver-owned file) for caches that survive
    restarts. ``driver_version`` is the driver's, for its encoding to bind into every cache.

    A driver subclasses it with its encoding: :meth:`encode` (what to save of a prepared
    model), :meth:`decode` (the saved body back, before the data cache is verified) and
    :meth:`bind` (what the driver runs, from a decoded body, once the data cache is verified).
    """

    def __init__(self, driver_version: str = "", key: bytes | None = None):
        self._key = bytes(key) if key is not None else secrets.token_bytes(32)
        if len(self._key) < 16:
            raise ValueError("cache key too short")
        self.driver_version = driver_version
        self._live: weakref.WeakValueDictionary[bytes, Any] = weakref.WeakValueDictionary()
        self._lock = threading.Lock()
        #: Late saves (late_saves) begun and not finished, by cache token, and their condition.
        self._pending: dict[bytes, int] = {}
        self._saved = threading.Condition(threading.Lock())

    # ---- the driver's encoding -------------------------------------------------------------
    def encode(self, model: Model, priority: Priority, prepared: IPreparedModel
               ) -> tuple[bytes, bytes, Any] | None:
        """(body, data cache content, plan) of a prepared model, or None when it cannot be
        saved. The body starts with :func:`encode_head`; the plan is what a restore of this
        cache may reuse while it lives (weakly referenced)."""
        raise NotImplementedError

    def decode(self, loaded: Loaded) -> Any:
        """Decode a verified body; ``loaded.data`` is not verified yet and must not be read."""
        raise NotImplementedError

    def bind(self, image: Any) -> Any:
        """The plan of a decoded body, once its data cache has been verified."""
        raise NotImplementedError

    def private_data(self, head: BodyHead) -> Any:
        """The driver's own trusted copy of the data cache ``head`` names (its digest and
        length), for :meth:`decode` to find in ``loaded.private``; None (the default): none."""
        return None

    def drop_private(self, digest: bytes) -> None:
        """Forget the private copy of ``digest`` (it did not build); the default keeps none."""

    def keep_private(self, digest: bytes, data: bytes) -> None:
        """Keep a copy of a data cache whose ``digest`` the driver computed or verified (the
        default keeps none). Called after the client has been notified."""

    # ---- keyed integrity ------------------------------------------------------------------
    def _tag(self, token: bytes, content: bytes | memoryview) -> bytes:
        mac = hmac.new(self._key, _HMAC_DOMAIN, "sha256")  # by name: about 20 us less per call
        mac.update(token)
        mac.update(content)
        return mac.digest()

    def forget_live_plans(self) -> None:
        """Drop the table of live plans, so the next restores rebuild (tests, benchmarks)."""
        with self._lock:
            self._live.clear()

    def _remember(self, tag: bytes, plan: Any) -> None:
        try:
            with self._lock:
                self._live[tag] = plan
        except TypeError:  # not weak-referenceable: just do not remember it
            pass

    # ---- saving ---------------------------------------------------------------------------
    def begin_late_save(self, token: bytes) -> None:
        """Count a save of cache ``token`` that will run after its notification (end it with
        end_late_save)."""
        with self._saved:
            self._pending[token] = self._pending.get(token, 0) + 1

    def end_late_save(self, token: bytes) -> None:
        with self._saved:
            left = self._pending.get(token, 0) - 1
            if left > 0:
                self._pending[token] = left
            else:
                self._pending.pop(token, None)
            self._saved.notify_all()

    def wait_saved(self, timeout: float = SAVE_WAIT_S, token: bytes | None = None) -> bool:
        """Wait until no late save (of cache ``token``, or of any) is under way; False when
        ``timeout`` passed first. A late save may wait for its client's first result: wait
        for the saves of the files at hand only."""
        with self._saved:
            return self._saved.wait_for(
                lambda: not self._pending if token is None else token not in self._pending,
                timeout)

    def open_save(self, model_cache: Any, data_cache: Any, token: Any) -> SaveJob | None:
        """A SaveJob when the cache arguments of prepareModel are usable, else None.

        Cache arguments never fail prepareModel: with both vectors empty the token is ignored;
        with wrong counts, a bad token or a bad handle, the model is prepared but not saved.
        """
        try:
            if not model_cache and not data_cache:
                return None
            model_fds = _handle_fds(model_cache, NUM_MODEL_CACHE, "model cache")
            data_fds = _handle_fds(data_cache, NUM_DATA_CACHE, "data cache")
            tok = token_bytes(token)
            for fd in (*model_fds, *data_fds):  # all open, before a dup takes a closed number
                os.fstat(fd)
        except Exception as e:  # noqa: BLE001 - CacheArgumentError, or a handle that raised
            log.debug("not saving to cache: %s: %s", type(e).__name__, e)
            return None
        job = SaveJob([], [], tok)
        try:
            for fd in model_fds:
                job.model_fds.append(os.dup(fd))
            for fd in data_fds:
                job.data_fds.append(os.dup(fd))
        except OSError as e:
            log.debug("not saving to cache: %s", e)
            job.close()
            return None
        return job

    def save(self, job: SaveJob, model: Model, priority: Priority,
             prepared: IPreparedModel | None) -> bool:
        """Write the caches of a successfully prepared model; never raises, closes ``job``."""
        try:
            if prepared is None:
                return False
            encoded = self.encode(model, priority, prepared)
            if encoded is None:
                return False
            body, data, plan = encoded
            head = _HEADER.pack(MAGIC, FORMAT_VERSION, 0, len(body))
            content = head + body
            tag = self._tag(job.token, content)
            # The model cache is the commit point: invalidate it first, write it last.
            os.ftruncate(job.model_fds[0], 0)
            write_file(job.data_fds[0], data)
            write_file(job.model_fds[0], content + tag)
            self._remember(tag, plan)
            job.private = (decode_head(body).data_digest, data)
            return True
        except Exception as e:  # noqa: BLE001 - saving must never fail the preparation
            log.info("saving to cache failed: %s: %s", type(e).__name__, e)
            for fd in job.model_fds:
                try:
                    os.ftruncate(fd, 0)
                except OSError:
                    pass
            return False
        finally:
            job.close()

    def finish_save(self, job: SaveJob) -> None:
        """What :meth:`save` leaves until the client has been notified: the driver's private
        copy of the data cache. Never raises."""
        private, job.private = job.private, None
        if private is None:
            return
        try:
            self.keep_private(*private)
        except Exception as e:  # noqa: BLE001 - a private copy is an optimisation only
            log.info("keeping a private copy failed: %s: %s", type(e).__name__, e)

    # ---- restoring ------------------------------------------------------------------------
    def load(self, model_fd: int, data_fd: int, token: bytes) -> Loaded:
        """Read both files and verify the model cache. The data cache is verified by its
        digest later, unless a live plan has the same tag: then it is not needed at all.
        Late saves of this token land first (they may be writing these files)."""
        if not self.wait_saved(token=token):
            raise CacheError("a save of this driver's caches did not finish in time")
        blob = read_file(model_fd, MAX_MODEL_CACHE_BYTES)
        if len(blob) < _HEADER.size + _BODY_HEAD.size + TAG_SIZE:
            raise CacheError("model cache too short")
        content = memoryview(blob)[:-TAG_SIZE]
        tag = self._tag(token, content)
        if not hmac.compare_digest(tag, blob[-TAG_SIZE:]):
            raise CacheError("model cache or token does not match (integrity check failed)")
        magic, version, _reserved, body_len = _HEADER.unpack_from(blob, 0)
        if magic != MAGIC or version != FORMAT_VERSION or \
                body_len != len(blob) - _HEADER.size - TAG_SIZE:
            raise CacheError("unknown model cache format")
        body = content[_HEADER.size:]
        head = decode_head(body)
        if head.data_length > MAX_DATA_CACHE_BYTES:
            raise CacheError("data cache too large")
        with self._lock:
            plan = self._live.get(tag)
        if plan is not None:
            # The live plan already holds the constants: the data cache is not needed, so
            # only its length is checked; whatever it holds cannot change any result.
            if os.fstat(data_fd).st_size != head.data_length:
                raise CacheError("data cache has the wrong length")
            os.pread(data_fd, 1, 0)  # as on the cold path, it must be readable
            return Loaded(head, tag, plan=plan)
        private = self.private_data(head)
        if private is not None:
            # The driver's own copy of exactly the data cache the verified model cache names
            # (see the module's text): the client's is not read, only checked as above.
            if os.fstat(data_fd).st_size != head.data_length:
                raise CacheError("data cache has the wrong length")
            os.pread(data_fd, 1, 0)
            return Loaded(head, tag, body=body, private=private)
        data = read_file(data_fd, head.data_length)
        if len(data) != head.data_length:
            raise CacheError("data cache has the wrong length")
        return Loaded(head, tag, body=body, data=data)

    def prepare_from_cache(self, deadline: int | None, model_cache: Any, data_cache: Any,
                           token: Any, callback: IPreparedModelCallback, *,
                           make_prepared_model: Callable[[Any, Priority], IPreparedModel],
                           workers: WorkerPools, driver_log: Callable[[str], None]
                           ) -> ErrorStatus:
        """prepareModelFromCache_1_3: the callback is notified exactly once, with
        ``make_prepared_model(plan, priority)``; the work runs on ``workers``; diagnostics go
        to ``driver_log``."""
        if callback is None or not hasattr(callback, "notify"):
            return ErrorStatus.INVALID_ARGUMENT
        notify = NotifyOnce(callback)
        try:
            check_deadline(deadline)
            model_fds = _handle_fds(model_cache, NUM_MODEL_CACHE, "model cache")
            data_fds = _handle_fds(data_cache, NUM_DATA_CACHE, "data cache")
            tok = token_bytes(token)
        except Exception as e:  # noqa: BLE001 - CacheArgumentError, or a handle that raised
            driver_log(f"prepareModelFromCache rejected: {type(e).__name__}: {e}")
            notify(ErrorStatus.INVALID_ARGUMENT)
            return ErrorStatus.INVALID_ARGUMENT
        if deadline is not None and time.monotonic_ns() > deadline:
            notify(ErrorStatus.MISSED_DEADLINE_PERSISTENT)
            return ErrorStatus.MISSED_DEADLINE_PERSISTENT
        try:
            loaded = self.load(model_fds[0], data_fds[0], tok)
        except Exception as e:  # noqa: BLE001 - OSError, CacheError, anything: a clean failure
            driver_log(f"prepareModelFromCache failed: {type(e).__name__}: {e}")
            notify(ErrorStatus.GENERAL_FAILURE)
            return ErrorStatus.GENERAL_FAILURE
        priority = loaded.head.priority
        if loaded.plan is not None:
            try:
                pm = make_prepared_model(loaded.plan, priority)
            except Exception as e:  # noqa: BLE001
                driver_log(f"prepareModelFromCache failed: {type(e).__name__}: {e}")
                notify(ErrorStatus.GENERAL_FAILURE)
                return ErrorStatus.GENERAL_FAILURE
            notify(ErrorStatus.NONE, pm)
            return ErrorStatus.NONE
        if loaded.private is not None:
            status = self._restore_private(loaded, deadline, notify, make_prepared_model,
                                           driver_log)
            if status is not None:
                return status
            try:  # the private copy did not build: the client's files, the usual way
                loaded.data = read_file(data_fds[0], loaded.head.data_length)
                if len(loaded.data) != loaded.head.data_length:
                    raise CacheError("data cache has the wrong length")
            except Exception as e:  # noqa: BLE001
                driver_log(f"prepareModelFromCache failed: {type(e).__name__}: {e}")
                notify(ErrorStatus.GENERAL_FAILURE)
                return ErrorStatus.GENERAL_FAILURE

        # The background task decodes the verified structure while this thread hashes the
        # data cache (blake3 releases the GIL); the task binds no kernel before the digest
        # has matched. Both take about as long, so the restore costs about one of them.
        hashed = threading.Event()
        data_ok: list[bool] = []

        def task() -> None:
            try:
                image = self.decode(loaded)
                hashed.wait()
                if data_ok != [True]:
                    raise CacheError("data cache was modified")
                # The tag proves this driver validated and planned exactly this model.
                plan = self.bind(image)
                if deadline is not None and time.monotonic_ns() > deadline:
                    notify(ErrorStatus.MISSED_DEADLINE_TRANSIENT)
                    return
                self._remember(loaded.tag, plan)
                notify(ErrorStatus.NONE, make_prepared_model(plan, priority))
            except Exception as e:  # noqa: BLE001
                driver_log(f"prepareModelFromCache failed: {type(e).__name__}: {e}")
                notify(ErrorStatus.GENERAL_FAILURE)
                return
            try:  # verified: the next restore of it may skip the client's data cache
                self.keep_private(loaded.head.data_digest, loaded.data)
            except Exception as e:  # noqa: BLE001 - a private copy is an optimisation only
                log.info("keeping a private copy failed: %s: %s", type(e).__name__, e)

        try:
            workers.for_priority(priority).submit(task)
        except Exception:  # noqa: BLE001 - e.g. the pool was shut down
            notify(ErrorStatus.GENERAL_FAILURE)
            return ErrorStatus.GENERAL_FAILURE
        ok = False
        try:
            ok = loaded.data_matches()
        except Exception as e:  # noqa: BLE001 - the task then reports the failure
            driver_log(f"prepareModelFromCache: hashing the data cache failed: {e}")
        finally:
            data_ok.append(ok)
            hashed.set()
        return ErrorStatus.NONE

    def _restore_private(self, loaded: Loaded, deadline: int | None,
                         notify: Callable[..., None],
                         make_prepared_model: Callable[[Any, Priority], IPreparedModel],
                         driver_log: Callable[[str], None]) -> ErrorStatus | None:
        """Restore from the driver's private copy, in the calling thread (nothing to hash, so
        nothing to overlap with). None: the copy did not build (nothing notified)."""
        try:
            image = self.decode(loaded)
        except Exception as e:  # noqa: BLE001 - the verified body itself: no copy can help
            driver_log(f"prepareModelFromCache failed: {type(e).__name__}: {e}")
            notify(ErrorStatus.GENERAL_FAILURE)
            return ErrorStatus.GENERAL_FAILURE
        try:
            plan = self.bind(image)
        except Exception as e:  # noqa: BLE001
            driver_log(f"prepareModelFromCache: the private copy did not build "
                       f"({type(e).__name__}: {e}); restoring from the cache files")
            loaded.private = None
            try:  # replaced by the verified data once the files have restored
                self.drop_private(loaded.head.data_digest)
            except Exception:  # noqa: BLE001
                pass
            return None
        if deadline is not None and time.monotonic_ns() > deadline:
            notify(ErrorStatus.MISSED_DEADLINE_TRANSIENT)
            return ErrorStatus.MISSED_DEADLINE_TRANSIENT
        try:
            pm = make_prepared_model(plan, loaded.head.priority)
        except Exception as e:  # noqa: BLE001
            driver_log(f"prepareModelFromCache failed: {type(e).__name__}: {e}")
            notify(ErrorStatus.GENERAL_FAILURE)
            return ErrorStatus.GENERAL_FAILURE
        self._remember(loaded.tag, plan)
        notify(ErrorStatus.NONE, pm)
        return ErrorStatus.NONE
