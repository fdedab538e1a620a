"""A driver's private store of data caches: copies the driver itself wrote, named by their
digest, that a restore may use instead of reading and hashing the client's data cache file.

Why this is sound. The model cache's HMAC (keyed with the driver's secret) binds the token and
the data cache's length and BLAKE3 digest: once the tag has matched, the driver knows that it
itself wrote this model cache for a data cache with exactly that digest. A file in the store is
named by that digest and was written by the driver, from bytes it produced (at prepareModel) or
had just verified against an authenticated digest (at a restore from the client's files); it
is written to a temporary file and renamed into place, never modified in place, so a name
always holds complete content. The store lives in a directory of this user that nobody else
can write (:func:`nnhal.core.native.check_private_dir`: created 0700, owned by this user,
refused when group- or world-writable), and each file is opened without following links and
used only when it is a regular file of this user, writable by nobody else, of the exact
length the model cache names. Whoever could still change a file there runs as this user and
could read the cache key as well: the store is exactly as trusted as the key file. The client
can only tamper with its own cache files, and those stay fully checked whenever the store has
no usable copy. What the store does not catch is its own storage failing (a bit flipped on
disk): as for the compiled native kernels, the driver trusts its own files.

The store is bounded (``max_bytes`` in all, ``max_files`` files): after a write, the least
recently used files go first (a use refreshes a file's modification time).
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from nnhal.core.native import cache_root, check_private_dir, write_replacing

log = logging.getLogger(__name__)

#: The default bounds of one store: its total size, its number of files (many small models
#: would otherwise make a directory of tens of thousands of files).
DEFAULT_MAX_BYTES = 2 << 30
DEFAULT_MAX_FILES = 1024
_PROC_FD = "/proc/self/fd"


def default_store_dir(name: str) -> Path:
    """``name``'s store under nnhal's per-user cache (``$NNHAL_CACHE_DIR``, ...)."""
    return cache_root() / name


class StoredFile:
    """An open, checked file of the store, kept open while any user needs it: a later
    replacement or eviction of its name does not change what this descriptor reads."""

    __slots__ = ("fd", "size", "__weakref__")

    def __init__(self, fd: int, size: int):
        self.fd = fd
        self.size = size

    @property
    def path(self) -> str:
        """A path that opens exactly this file (the descriptor's /proc entry)."""
        return f"{_PROC_FD}/{self.fd}"

    def read(self) -> bytes:
        parts, pos = [], 0
        while pos < self.size:
            chunk = os.pread(self.fd, self.size - pos, pos)
            if not chunk:
                raise OSError("stored file ended early")
            parts.append(chunk)
            pos += len(chunk)
        return b"".join(parts)

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def __del__(self) -> None:
        try:
            self.close()
        except OSError:
            pass


class PrivateStore:
    """Files named by a digest in a directory private to this user (see the module's text).
    Every method fails soft: a store that cannot be used is as if it were empty."""

    def __init__(self, directory: str | os.PathLike[str], max_bytes: int = DEFAULT_MAX_BYTES,
                 max_files: int = DEFAULT_MAX_FILES):
        self.directory = Path(directory)
        self.max_bytes = int(max_bytes)
        self.max_files = int(max_files)
        #: Why the store was last found unusable (None: it was usable), for diagnostics.
        self.unusable: str | None = None

    def _dir(self) -> Path | None:
        bad = check_private_dir(self.directory)
        self.unusable = bad
        if bad is not None:
            log.info("private store not used: %s", bad)
            return None
        return self.directory

    @staticmethod
    def _name(digest: bytes) -> str:
        return digest.hex() + ".bin"

    def open(self, digest: bytes, size: int) -> StoredFile | None:
        """The stored file of ``digest`` when it is there, safe to trust and ``size`` bytes
        long; else None."""
        if not os.path.isdir(_PROC_FD):
            return None  # no way to hand an engine exactly the checked file
        d = self._dir()
        if d is None:
            return None
        try:
            fd = os.open(d / self._name(digest), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_mode & 0o022 or \
                    st.st_uid != os.getuid() or st.st_size != size:
                log.info("private store: %s refused (not a private regular file of %d bytes)",
                         self._name(digest), size)
                os.close(fd)
                return None
            try:
                os.utime(fd)  # recently used: evicted last
            except OSError:
                pass
            return StoredFile(fd, size)
        except OSError:
            os.close(fd)
            return None

    def put(self, digest: bytes, data: bytes | memoryview) -> bool:
        """Store ``data`` (whose digest the caller has computed or verified) under ``digest``;
        False when the store is unusable or the write failed. Flushed to disk before it is
        renamed into place, so a crash never leaves a short file under the name."""
        d = self._dir()
        if d is None or len(data) > self.max_bytes:
            return False
        target = d / self._name(digest)
        try:
            st = os.stat(target, follow_symlinks=False)
            if stat.S_ISREG(st.st_mode) and st.st_size == len(data) and \
                    not st.st_mode & 0o022 and st.st_uid == os.getuid():
                return True  # written before (the name is the content's digest)
        except OSError:
            pass  # absent; anything else under the name is replaced
        try:
            write_replacing(target, data, durable=True)
        except OSError as e:
            log.info("private store: writing %s failed: %s", target.name, e)
            return False
        self._evict(d)
        return True

    def remove(self, digest: bytes) -> None:
        """Forget the file of ``digest`` (it proved unusable)."""
        d = self._dir()
        if d is not None:
            try:
                os.unlink(d / self._name(digest))
            except OSError:
                pass

    def _evict(self, d: Path) -> None:
        try:
            entries = []
            for e in os.scandir(d):
                if e.name.endswith(".bin") and e.is_file(follow_symlinks=False):
                    st = e.stat(follow_symlinks=False)
                    entries.append((st.st_mtime_ns, st.st_size, e.path))
        except OSError:
            return
        total, count = sum(size for _, size, _ in entries), len(entries)
        for _, size, path in sorted(entries):
            if total <= self.max_bytes and count <= self.max_files:
                break
            try:
                os.unlink(path)  # an engine holding it open keeps reading the same file
                total -= size
                count -= 1
            except OSError:
                pass
