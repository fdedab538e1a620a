"""The Session's compilation cache: a second open of the same .tflite file is a restore.

A Session made from a .tflite path or its bytes (not from a HAL or imported model) looks up an
*entry* keyed by the BLAKE3 digest of the file's bytes and of everything else that decides
what the Session would prepare: this cache's format, nnhal's version and a fingerprint of its
code (size and modification time of every module, so an edited or upgraded nnhal never reads
an older entry; computed on a thread while ``nnhal.session`` imports, :func:`fingerprint_early`,
so an open finds it known; when it is not yet, the open looks the entry up with the fingerprint
the last process remembered and checks it before using the restore, dropping the restore when
it was wrong: :class:`Fingerprint`), the devices (each driver's name and version), the
preference, the priority and the names given. The entry is plain JSON: the Session's inputs,
outputs and state variables (names, types, shapes, quantization; state initial values as
bytes) and the runtime's plan (which device runs which operations, each step's inputs and
outputs). Each step's prepared model is the driver's own compilation cache (the files the
runtime writes with ``setCaching``, in the ``steps/`` folder beside the entries), restored with
``prepareModelFromCache``: a hit reads no flatbuffer into a HAL model, analyses nothing and
exports nothing. What needs the HAL model later (CPU fallback after a driver failure,
:attr:`Session.model`, a run whose values between steps are zero-sized) reads the file then.

Trust. An entry is ``magic | u64 length | JSON | HMAC-SHA256 tag`` over the entry key and
everything before the tag, keyed with the drivers' per-user secret
(:func:`nnhal.drivers.common.device.default_key_file`); it is written to a temporary file and
renamed into place, so concurrent writers leave one complete entry. A missing, truncated,
tampered or foreign entry, a step a driver refuses to restore, or a JSON record of the wrong
shape is a *miss*: the Session prepares from the file as without a cache and writes the entry
again. The drivers check their own files (their model caches are authenticated the same way).
Nothing is unpickled.

Where it does not pay: opening a tiny single-step model from scratch costs about the fixed
costs a restore has too (opening the devices, the interpreter), so a model under
:data:`MIN_BYTES` is not cached unless ``cache=True`` (measured in fresh processes with
``benchmarks/bench_open.py --force``: a 1 KB REVERSE model 38.7 ms cold, writing the cache,
against 31.7 ms restored; a 1 KB model split over LiteRT and the reference 105 ms against 30 ms:
partitioned small models gain, and ``cache=True`` is there for them), and a program
generating many small models would fill the cache with them. Off with
``Session(..., cache=False)`` or ``NNHAL_SESSION_CACHE=0``. The entries live in
``session/`` of nnhal's per-user cache (``$NNHAL_CACHE_DIR``, else
``$XDG_CACHE_HOME/nnhal``, else ``~/.cache/nnhal``); at most :data:`MAX_ENTRIES` are kept,
and :data:`MAX_BYTES` with their steps' files, the least recently used going first with
their steps' files.

A file not seen before under its name (its digest not remembered) is not looked up: it is
almost always a miss, and its digest is only needed by the entry written after the first
result, which hashes it then (:class:`Digesting`); the drivers' files of such an entry are
named by a random token the entry records. Steps' files no entry names are removed once
:data:`ORPHAN_AGE_S` old.
"""

from __future__ import annotations

import base64
import hmac
import json
import logging
import os
import re
import stat
import struct
import threading
import time
from pathlib import Path
from typing import Any

import blake3
import numpy as np

from nnhal.memory.frame import Frame, file_bytes
from nnhal.session.background import Background

log = logging.getLogger("nnhal.session")

#: The environment variable that turns the cache off ("0", "off", "false", "no").
ENV = "NNHAL_SESSION_CACHE"
#: Files smaller than this are not cached by default (see the module's text).
MIN_BYTES = 16 << 10
#: Entries kept; past it the least recently used go, with the driver caches they name.
MAX_ENTRIES = 64
#: Bytes kept (the entries and the driver caches they name, together); past it the least
#: recently used go too: a few opens of a large model must not fill the disk (64 entries of a
#: 52 MB model, each with its driver caches, took 6 GB).
MAX_BYTES = 4 << 30
#: A drivers' cache file no entry names, this old, is removed when an entry is written: its
#: entry was replaced (the same content opened under another name) or never written (a
#: process gone first, a model the cache does not describe). A younger one may be an entry's
#: still being written (its writer waits at most a minute for them).
ORPHAN_AGE_S = 600.0
_STEP_FILE = re.compile(r"[0-9a-f]{40}_[md][0-9]+")
#: Bumped whenever the record's meaning changes.
FORMAT = 1
MAGIC = b"NNHALSE1"
_LEN = struct.Struct("<Q")
_TAG = 32
_DOMAIN = b"nnhal session cache entry v1\0"
#: The largest entry read (it holds descriptions, state initial values and the plan).
MAX_ENTRY_BYTES = 64 << 20


def enabled(cache: bool | None) -> bool:
    """Whether to use the cache: ``cache`` when given, else the environment's say."""
    if cache is not None:
        return bool(cache)
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "off", "false", "no")


#: This process's code fingerprint, once computed (set by one assignment: no lock, which a
#: forked child could inherit held).
_fingerprint: str | None = None
#: The computation :func:`fingerprint_early` started: (its thread, the pid of the process
#: that started it), or None.
_early: tuple[Background, int] | None = None
#: The memo files (Fingerprint) this process has checked hold its fingerprint.
_confirmed: set[Path] = set()


def _package_dir() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # nnhal/


def code_fingerprint() -> str:
    """A digest of nnhal's modules (path, size, modification time): an entry written by other
    code (an upgrade, an edit) is never read. Computed once per process (about 1 ms: a stat
    of each of some 200 files; a file edited in place changes nothing else, so nothing
    cheaper would see it); :class:`Fingerprint` keeps it off a restore's way."""
    global _fingerprint
    if _fingerprint is None:
        _fingerprint = _walk(_package_dir())
    return _fingerprint


def fingerprint_early() -> None:
    """Start computing the code fingerprint on a thread of its own, when the cache is on and
    it is not known yet: called as ``nnhal.session`` is imported, so that it is done long
    before that import (which loads numpy, the runtime, the drivers and ai-edge-litert, a few
    hundred ms) ends, and a Session's open finds it computed instead of checking a guess
    while its drivers restore. An interpreter's allocation, which a LiteRT restore spends most
    of its time in, holds the GIL: a check begun there only ran once it returned, and the
    open waited for it (about 1 ms, plus the switches between the two threads). Here it
    costs the import its own time on the GIL, about 1 ms, and nothing when the cache is off."""
    global _early
    if _fingerprint is not None or _early is not None or not enabled(None):
        return
    _early = _start_computing()


def _start_computing() -> tuple[Background, int] | None:
    """:func:`code_fingerprint` computed on a new thread started without waiting for it to
    run (:class:`~nnhal.session.background.Background`: that wait is what this keeps off the
    open's way): (the thread, this process's pid), or None when no thread can be had (it is
    computed where it is needed). A failure is left for the caller's own call of
    :func:`code_fingerprint` to raise."""
    try:
        return Background(code_fingerprint), os.getpid()
    except RuntimeError:
        return None


def _walk(top: str) -> str:
    h = blake3.blake3()

    def walk(d: str, rel: str) -> None:
        try:
            entries = sorted(os.scandir(d), key=lambda e: e.name)
        except OSError:
            return
        for e in entries:
            if e.is_dir(follow_symlinks=False):
                if e.name != "__pycache__":
                    walk(e.path, f"{rel}{e.name}/")
            elif e.name.endswith((".py", ".c", ".so")):
                try:
                    st = e.stat()
                except OSError:
                    continue
                h.update(f"{rel}{e.name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())

    walk(top, "")
    return h.hexdigest()


class Fingerprint:
    """The code fingerprint of one open, in steps: :attr:`guess` at once (this process's when
    known, else the one the last process remembered for this copy of nnhal, in the store's
    ``code/`` folder); :meth:`begin`, when the guess has found an entry, computes the real
    one in a thread while the drivers restore (or waits for the import's,
    :func:`fingerprint_early`); :meth:`settle`, the verified one. The guess only chooses the
    entry tried: nothing restored is used before :meth:`settle` has confirmed it
    (``Opened.settle`` in :mod:`nnhal.session.restore`). That thread gets little done during
    a restore: ai-edge-litert's ``allocate_tensors`` and ``invoke`` hold the GIL (measured:
    a spinning Python thread ran no iteration during either), so the open waited for it
    after the allocation (about 1.1 ms for MobileNetV2 int8), which is why the import
    computes it now."""

    def __init__(self, directory: Path | None):
        self._done: Any = None
        self._pid = 0
        self._memo = None if directory is None else \
            directory / "code" / blake3.blake3(_package_dir().encode()).hexdigest()[:32]
        known = _fingerprint
        if known is not None:
            self.guess = known
            if self._memo is not None and self._memo not in _confirmed:
                self._remember(known)  # once per process: for the next one
                _confirmed.add(self._memo)
            return
        remembered = self._remembered()
        if remembered is None:
            self.guess = code_fingerprint()
            self._remember(self.guess)
            return
        self.guess = remembered

    def begin(self) -> None:
        """Start computing the real fingerprint (nothing when known already; the import's
        computation, :func:`fingerprint_early`, waited for when it is still running)."""
        if _fingerprint is not None or self._done is not None:
            return
        early = _early
        if early is not None and early[1] == os.getpid() and early[0].is_alive():
            self._done, self._pid = early
            return
        started = _start_computing()
        if started is not None:
            self._done, self._pid = started

    def _remembered(self) -> str | None:
        if self._memo is None:
            return None
        try:
            with open(self._memo, "rb") as f:
                text = f.read(65).decode("ascii")
        except (OSError, UnicodeDecodeError):
            return None
        return text if len(text) == 64 else None

    def _remember(self, value: str) -> None:
        if self._memo is not None and self._remembered() != value:
            _write_file(self._memo, value.encode("ascii"))

    def settle(self) -> str:
        """The fingerprint of the code running (remembered for the next process when the
        guess was another)."""
        done, self._done = self._done, None
        if done is not None and os.getpid() == self._pid:  # (a forked child computes it below)
            done.join()
        value = code_fingerprint()
        if value != self.guess:
            self._remember(value)
        return value


#: A file whose modification or change time is this recent is hashed every time (not
#: remembered): a rewrite within the file system's clock tick would keep both times.
RACY_NS = 2_000_000_000


def content_digest(data: bytes | memoryview) -> bytes:
    """BLAKE3 of the file's bytes (on every core: a 50 MB model takes a few milliseconds)."""
    return blake3.blake3(data, max_threads=blake3.blake3.AUTO).digest()


class Digesting:
    """:func:`content_digest` of bytes just read, computed when first asked for
    (:meth:`result`), then ``done`` called with it (e.g. to remember it). ``read``: the frame
    holding the bytes, settled first (:meth:`Frame.settle`: they may still be being copied in).

    Why later: only the entry written after the first run needs it (a file not seen before
    is a miss, unless the same content was opened under another name, and a miss's drivers
    write their caches under names of their own, :meth:`nnhal.session.restore.Opened.files`),
    so the thread writing the entry hashes it, off the open's way. Hashed on a thread of its
    own while the open read the file, it cost MobileNetV2's cold open 4-5 ms: a new thread
    gets the GIL only when the open lets it go, and the hash took a core the open used."""

    def __init__(self, data: bytes | memoryview, done: Any = None, read: Any = None):
        self._data, self._done, self._read = data, done, read
        self._digest: bytes | None = None
        self._lock = threading.Lock()

    def result(self) -> bytes:
        """The digest (OSError when the bytes are not the file's: it changed while read)."""
        with self._lock:
            if self._digest is None:
                if isinstance(self._read, Frame):
                    self._read.settle()
                self._digest = content_digest(self._data)
                if self._done is not None:
                    self._done(self._digest)
            return self._digest


def entry_key(digest: bytes, config: list[Any], code: str | None = None) -> bytes:
    """The 32-byte key of an entry (also the runtime's cache token for its steps), for the
    code fingerprint ``code`` (default: this process's)."""
    text = json.dumps([FORMAT, code or code_fingerprint(), digest.hex(), config],
                      separators=(",", ":"), sort_keys=True)
    return blake3.blake3(text.encode()).digest()


def _write_file(target: Path, blob: bytes) -> bool:
    """``blob`` into ``target``: a temporary file renamed into place (its folder made 0700)."""
    from nnhal.core.native import write_replacing

    try:
        target.parent.mkdir(mode=0o700, exist_ok=True)
        write_replacing(target, blob)
        return True
    except OSError as e:
        log.info("session cache: writing %s failed: %s", target.name, e)
        return False


class Store:
    """The entries in ``directory`` (``steps/`` holds the drivers' caches), authenticated
    with ``key``. Every method fails soft: a store that cannot be used is an empty one."""

    def __init__(self, directory: Path, key: bytes):
        self.directory = directory
        self.steps = directory / "steps"
        self._key = key

    @classmethod
    def default(cls) -> Store | None:
        """The per-user store, or None (logged) when its directory or key is unusable."""
        from nnhal.core.native import cache_root, check_private_dir
        from nnhal.drivers.common.compilation_cache import load_or_create_key
        from nnhal.drivers.common.device import default_key_file

        directory = cache_root() / "session"
        for d in (directory, directory / "steps"):
            bad = check_private_dir(d)
            if bad is not None:
                log.info("session cache not used: %s", bad)
                return None
        path = default_key_file()
        if path is None:
            return None
        try:
            return cls(directory, load_or_create_key(path))
        except (OSError, ValueError) as e:
            log.info("session cache not used: %s", e)
            return None

    # ---- file digests remembered by (file, inode, size, times) ------------------------------
    @staticmethod
    def _signature(path: str, st: os.stat_result) -> bytes:
        return (f"{os.path.realpath(path)}\0{st.st_dev}\0{st.st_ino}\0{st.st_size}\0"
                f"{st.st_mtime_ns}\0{st.st_ctime_ns}").encode()

    def _memo_path(self, sig: bytes) -> Path:
        return self.directory / "files" / f"{blake3.blake3(sig).hexdigest()[:40]}.digest"

    def file_digest(self, path: str, *, background: bool = False
                    ) -> tuple[bytes | Digesting, bytes | Frame | None]:
        """(BLAKE3 of the file's content, the content when it had to be read: a large one
        read in the background case in a frame, nnhal.memory.frame). The digest of
        a file unchanged since it was last hashed (same path, device, inode, size, modification
        and change times; the change time cannot be set back) is remembered, so a second open
        does not read the file. OSError when it cannot be read. ``background``: the digest of
        a file not remembered although it could be (not changed in the last RACY_NS: a miss,
        unless the same content was opened under another name) is a :class:`Digesting`,
        hashed and remembered when first asked for."""
        if background:
            found = self._remembered(path)
            if found[0] is not None:
                return found[0], None
            st, sig, memo = found[1:]
            if time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) > RACY_NS:
                read = Frame.read(path)  # a large file framed, for a driver's export
                data = file_bytes(read)
                return Digesting(data, lambda digest: self._remember(
                    path, st, sig, memo, data, digest), read), read
        st = os.stat(path)
        sig = self._signature(path, st)
        memo = self._memo_path(sig)
        try:
            with open(memo, "rb") as f:
                blob = f.read(2 * _TAG + 1)
            if len(blob) == 2 * _TAG and hmac.compare_digest(
                    self._tag(b"file\0" + sig, blob[:_TAG]), blob[_TAG:]):
                return blob[:_TAG], None
        except OSError:
            pass
        read = Frame.read(path)
        if isinstance(read, Frame):
            read.settle()
        data = file_bytes(read)
        digest = content_digest(data)
        if len(data) == st.st_size and \
                time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) > RACY_NS:
            try:
                # Unchanged while it was read: the same signature.
                if self._signature(path, os.stat(path)) == sig:
                    self._write(memo, digest + self._tag(b"file\0" + sig, digest))
            except OSError:
                pass
        return digest, read

    def _remembered(self, path: str) -> tuple[bytes | None, os.stat_result, bytes, Path]:
        """(the remembered digest of ``path`` or None, its stat, signature and memo path)."""
        st = os.stat(path)
        sig = self._signature(path, st)
        memo = self._memo_path(sig)
        try:
            with open(memo, "rb") as f:
                blob = f.read(2 * _TAG + 1)
            if len(blob) == 2 * _TAG and hmac.compare_digest(
                    self._tag(b"file\0" + sig, blob[:_TAG]), blob[_TAG:]):
                return blob[:_TAG], st, sig, memo
        except OSError:
            pass
        return None, st, sig, memo

    def _remember(self, path: str, st: os.stat_result, sig: bytes, memo: Path,
                  data: bytes | memoryview, digest: bytes) -> None:
        """Remember ``digest`` of ``data`` read from ``path`` (as file_digest does)."""
        if len(data) == st.st_size and \
                time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) > RACY_NS:
            try:
                if self._signature(path, os.stat(path)) == sig:
                    self._write(memo, digest + self._tag(b"file\0" + sig, digest))
            except OSError:
                pass

    def _write(self, target: Path, blob: bytes) -> bool:
        return _write_file(target, blob)

    def _path(self, key: bytes) -> Path:
        return self.directory / f"{key.hex()[:40]}.entry"

    def _tag(self, key: bytes, content: bytes | memoryview) -> bytes:
        mac = hmac.new(self._key, _DOMAIN, "sha256")  # by name: about 20 us less per call
        mac.update(key)
        mac.update(content)
        return mac.digest()

    def load(self, key: bytes) -> dict[str, Any] | None:
        """The record of ``key``, or None (absent, or not an entry this user's nnhal wrote for
        this key)."""
        path = self._path(key)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_ENTRY_BYTES:
                return None
            blob = os.pread(fd, st.st_size + 1, 0)
        except OSError:
            return None
        finally:
            os.close(fd)
        head = len(MAGIC) + _LEN.size
        if len(blob) < head + _TAG or blob[:len(MAGIC)] != MAGIC:
            return self._miss(path, "not an entry")
        (n,) = _LEN.unpack_from(blob, len(MAGIC))
        if n != len(blob) - head - _TAG:
            return self._miss(path, "wrong length")
        content = memoryview(blob)[:-_TAG]
        if not hmac.compare_digest(self._tag(key, content), blob[-_TAG:]):
            return self._miss(path, "integrity check failed")
        try:
            record = json.loads(bytes(content[head:]))
        except ValueError:
            return self._miss(path, "not JSON")
        if not isinstance(record, dict) or record.get("format") != FORMAT:
            return self._miss(path, "another format")
        try:
            os.utime(path)  # recently used: evicted last
        except OSError:
            pass
        return record

    @staticmethod
    def _miss(path: Path, why: str) -> None:
        log.info("session cache entry %s ignored: %s", path.name, why)
        return None

    def save(self, key: bytes, record: dict[str, Any]) -> bool:
        """Write the entry of ``key`` (temporary file, then renamed into place)."""
        record = {**record, "format": FORMAT}
        body = json.dumps(record, separators=(",", ":")).encode()
        content = MAGIC + _LEN.pack(len(body)) + body
        if not self._write(self._path(key), content + self._tag(key, content)):
            return False
        self._evict(record.get("files", []))
        return True

    def remove(self, key: bytes) -> None:
        try:
            os.unlink(self._path(key))
        except OSError:
            pass

    def _evict(self, keep: list[str]) -> None:
        """Past MAX_ENTRIES entries or MAX_BYTES in all, the least recently used entries go
        with the files they name (files a kept entry names stay). The newest entry, and the
        files of the one just written (``keep``), always stay."""
        try:
            entries = sorted(((st.st_mtime_ns, e.path, st.st_size)
                              for e in os.scandir(self.directory)
                              if e.name.endswith(".entry") and e.is_file(follow_symlinks=False)
                              for st in (e.stat(),)), reverse=True)
        except OSError:
            return
        self._evict_digests()
        sizes: dict[str, int] = {}

        def size(name: str) -> int:
            if name not in sizes:
                try:
                    sizes[name] = os.stat(self.steps / name).st_size
                except OSError:
                    sizes[name] = 0
            return sizes[name]

        kept_files = {os.path.basename(f) for f in keep}
        total = sum(size(f) for f in kept_files)
        cut = len(entries)
        for k, (_, path, n) in enumerate(entries):  # newest first
            files = [f for f in self._files_of(path) if f not in kept_files]
            more = n + sum(size(f) for f in files)
            if k and (k >= MAX_ENTRIES or total + more > MAX_BYTES):
                cut = k
                break
            kept_files.update(files)
            total += more
        for _, path, _ in entries[cut:]:
            for f in self._files_of(path):
                if f not in kept_files:
                    try:
                        os.unlink(self.steps / f)
                    except OSError:
                        pass
            try:
                os.unlink(path)
            except OSError:
                pass
        self._sweep(kept_files)

    def _sweep(self, named: set[str]) -> None:
        """Remove the drivers' cache files no entry names (``named``: every kept entry's),
        older than :data:`ORPHAN_AGE_S`."""
        old = time.time_ns() - int(ORPHAN_AGE_S * 1e9)
        try:
            with os.scandir(self.steps) as it:
                for e in it:
                    if e.name in named or not _STEP_FILE.fullmatch(e.name):
                        continue
                    try:
                        if e.is_file(follow_symlinks=False) and \
                                e.stat(follow_symlinks=False).st_mtime_ns < old:
                            os.unlink(e.path)
                    except OSError:
                        pass
        except OSError:
            pass

    def _evict_digests(self) -> None:
        """Past 4 x MAX_ENTRIES remembered file digests, the oldest go (a few bytes each)."""
        try:
            memos = sorted((e.stat().st_mtime_ns, e.path)
                           for e in os.scandir(self.directory / "files")
                           if e.name.endswith(".digest"))
        except OSError:
            return
        for _, p in memos[:max(0, len(memos) - 4 * MAX_ENTRIES)]:
            try:
                os.unlink(p)
            except OSError:
                pass

    @staticmethod
    def _files_of(path: str) -> list[str]:
        """The step files an entry names (read without verifying: only for eviction)."""
        try:
            with open(path, "rb") as f:
                blob = f.read(MAX_ENTRY_BYTES)
            files = json.loads(blob[len(MAGIC) + _LEN.size:-_TAG]).get("files", [])
            return [os.path.basename(str(x)) for x in files]
        except Exception:  # noqa: BLE001 - an unreadable entry names nothing
            return []


# ---- plain data for what the Session describes ---------------------------------------------

def tensor_record(info: Any) -> dict[str, Any]:
    return {"name": info.name, "dtype": info.dtype.str,
            "shape": None if info.shape is None else [int(d) for d in info.shape],
            "scale": float(info.scale), "zp": int(info.zero_point), "type": int(info.type)}


def tensor_from(rec: dict[str, Any]) -> Any:
    from nnhal.hal.types import OperandType
    from nnhal.session.info import TensorInfo

    shape = rec["shape"]
    return TensorInfo(str(rec["name"]), np.dtype(str(rec["dtype"])),
                      None if shape is None else tuple(int(d) for d in shape),
                      float(rec["scale"]), int(rec["zp"]), OperandType(int(rec["type"])))


def state_record(sv: Any, value: np.ndarray) -> dict[str, Any]:
    return {"name": sv.name, "input": int(sv.input), "output": int(sv.output),
            "dtype": value.dtype.str, "shape": [int(d) for d in value.shape],
            "data": base64.b64encode(np.ascontiguousarray(value).tobytes()).decode("ascii")}


def state_from(rec: dict[str, Any]) -> Any:
    from nnhal.tflite.model import StateVariable

    dtype, shape = np.dtype(str(rec["dtype"])), tuple(int(d) for d in rec["shape"])
    if dtype.hasobject:
        raise ValueError("object dtype")
    raw = base64.b64decode(str(rec["data"]), validate=True)
    value = np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
    return StateVariable(str(rec["name"]), value, int(rec["input"]), int(rec["output"]))


def operand_record(op: Any) -> dict[str, Any]:
    return {"type": int(op.type), "dims": [int(d) for d in op.dimensions],
            "scale": float(op.scale), "zp": int(op.zero_point)}


def operand_from(rec: dict[str, Any], lifetime: Any) -> Any:
    from nnhal.hal.types import DataLocation, Operand

    dims = [int(d) for d in rec["dims"]]
    if any(d < 0 for d in dims):
        raise ValueError("negative dimension")
    return Operand(int(rec["type"]), dims, 0, float(rec["scale"]), int(rec["zp"]), lifetime,
                   DataLocation())
