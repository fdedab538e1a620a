"""Where running services are found: one small text file per service in a runtime directory.

The directory is ``$NNHAL_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/nnhal``, else one given
explicitly. A service named NAME writes ``NAME.service``: lines ``key=value`` with ``socket``
(absolute path), ``pid`` and ``driver``. It is written atomically (temporary file, rename)
and removed on a clean exit; a service killed leaves it behind, so readers check whether the
socket answers (``state``). The file holds nothing but text: no code, nothing to unpickle.

Anyone able to write the directory could plant a link or a FIFO where a service writes or a
reader opens, so the service writes only into a directory it owns and nobody else may write
(``check_dir``), creates its temporary with ``O_EXCL | O_NOFOLLOW`` and renames it over the
entry (a rename replaces a planted link instead of following it), and readers open entries
with ``O_NOFOLLOW | O_NONBLOCK`` and take only regular files: nothing blocks on a FIFO or a
device, nothing is read through a link.
"""

from __future__ import annotations

import errno
import os
import secrets
import socket
import stat
from dataclasses import dataclass
from pathlib import Path

SUFFIX = ".service"
_MAX_FILE = 4096
_OPEN_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC
#: connect() errors that mean a socket is there and listening but its backlog is full (or it
#: is slow): the service is alive, only busy.
_BUSY = (errno.EAGAIN, errno.EWOULDBLOCK, errno.EINPROGRESS, errno.ETIMEDOUT)

ALIVE, BUSY, DEAD = "alive", "busy", "not answering"


def runtime_dir(given: str | os.PathLike[str] | None = None) -> Path | None:
    if given:
        return Path(given)
    env = os.environ.get("NNHAL_RUNTIME_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    return Path(xdg) / "nnhal" if xdg else None


def socket_state(path: str) -> str:
    """ALIVE (a connection is accepted), BUSY (a listening socket whose backlog is full) or
    DEAD (nothing listens: refused, absent, not a socket). Never blocks: the connect is
    non-blocking, and a Unix socket answers it at once."""
    try:
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            return DEAD  # a link, a FIFO, a file: nothing a service made
    except (OSError, ValueError):
        return DEAD
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.setblocking(False)
        s.connect(path)
        return ALIVE
    except OSError as e:
        return BUSY if e.errno in _BUSY else DEAD
    finally:
        s.close()


@dataclass(frozen=True)
class Entry:
    name: str
    socket: str
    pid: int
    driver: str
    file: Path

    def state(self) -> str:
        """ALIVE, BUSY or DEAD (see :func:`socket_state`)."""
        return socket_state(self.socket)

    def alive(self, timeout_s: float = 0.5) -> bool:
        """The socket listens (it accepts, or its backlog is full: busy, not dead).
        ``timeout_s`` is kept for callers; the look never blocks."""
        return self.state() != DEAD


def valid_name(name: str) -> bool:
    return bool(name) and len(name) <= 100 and all(c.isalnum() or c in "-_." for c in name) \
        and not name.startswith(".")


def check_dir(directory: Path, create: bool = True) -> None:
    """Make sure ``directory`` is one a service may write into: created 0700 when absent
    (``create``), then a real directory (not a link), owned by this user, writable by nobody
    else. OSError otherwise, naming what is wrong."""
    if create:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(directory)
    if not stat.S_ISDIR(st.st_mode):
        raise OSError(errno.ENOTDIR, "runtime directory is not a directory (a link?)",
                      str(directory))
    if st.st_uid != os.getuid():
        raise OSError(errno.EPERM, f"runtime directory is owned by uid {st.st_uid}, "
                                   f"not {os.getuid()}", str(directory))
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise OSError(errno.EPERM, f"runtime directory is writable by others "
                                   f"(mode {stat.S_IMODE(st.st_mode):o})", str(directory))


def register(directory: Path, name: str, socket_path: str, driver: str) -> Entry:
    if not valid_name(name):
        raise OSError(f"bad service name {name!r} (letters, digits, - _ . only)")
    check_dir(directory)
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | _OPEN_FLAGS)
    try:
        entry = f"{name}{SUFFIX}"
        tmp = f".{entry}.{os.getpid()}.{secrets.token_hex(4)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _OPEN_FLAGS, 0o600,
                     dir_fd=dfd)
        try:
            with os.fdopen(fd, "w", closefd=False) as f:
                f.write(f"socket={socket_path}\npid={os.getpid()}\ndriver={driver}\n")
            os.fchmod(fd, 0o600)
        except BaseException:
            os.close(fd)
            os.unlink(tmp, dir_fd=dfd)
            raise
        os.close(fd)
        # Replaces whatever is at the entry's name (a planted link included) without
        # following it.
        os.replace(tmp, entry, src_dir_fd=dfd, dst_dir_fd=dfd)
    finally:
        os.close(dfd)
    return Entry(name, socket_path, os.getpid(), driver, directory / entry)


def unregister(entry: Entry) -> None:
    """Remove the entry if it is still this service's (a restarted one may have replaced it)."""
    current = read(entry.file)
    if current is not None and current.pid == entry.pid:
        try:
            entry.file.unlink()  # unlink removes a link itself, never its target
        except OSError:
            pass


def _why_not(file: Path) -> str | None:
    """Why ``file`` cannot be a service entry (None: it is a regular file, read it)."""
    try:
        mode = os.lstat(file).st_mode
    except OSError as e:
        return e.strerror or str(e)
    if stat.S_ISREG(mode):
        return None
    kind = ("a symbolic link" if stat.S_ISLNK(mode) else "a FIFO" if stat.S_ISFIFO(mode)
            else "a directory" if stat.S_ISDIR(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a file")
    return kind


def _read_entry(file: Path) -> tuple[Entry | None, str]:
    """The entry in ``file``, or None and why not."""
    why = _why_not(file)
    if why is not None:
        return None, why
    try:
        # NONBLOCK: should a FIFO replace the file after the lstat, opening it returns at once
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | _OPEN_FLAGS)
    except OSError as e:
        return None, ("a symbolic link" if e.errno == errno.ELOOP else e.strerror or str(e))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None, "not a regular file"
        data = os.read(fd, _MAX_FILE + 1)
    except OSError as e:
        return None, e.strerror or str(e)
    finally:
        os.close(fd)
    if len(data) > _MAX_FILE:
        return None, f"larger than {_MAX_FILE} bytes"
    fields: dict[str, str] = {}
    for line in data.decode("utf-8", "replace").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            fields[key.strip()] = value.strip()
    try:
        name = file.name[:-len(SUFFIX)]
        return Entry(name, fields["socket"], int(fields["pid"]), fields.get("driver", "?"),
                     file), ""
    except (KeyError, ValueError):
        return None, "no socket= and pid= lines"


def read(file: Path) -> Entry | None:
    return _read_entry(file)[0]


def scan(directory: Path | None = None) -> tuple[list[Entry], list[tuple[str, str]]]:
    """Every registered service (alive or not), by name, and every other ``*.service`` name
    in the directory with why it is not a service (a FIFO, a link, unreadable text...)."""
    directory = directory if directory is not None else runtime_dir()
    entries: list[Entry] = []
    others: list[tuple[str, str]] = []
    if directory is None:
        return entries, others
    try:
        st = os.lstat(directory)
        names = sorted(os.listdir(directory)) if stat.S_ISDIR(st.st_mode) else []
    except OSError:
        return entries, others
    for fname in names:
        if not fname.endswith(SUFFIX) or fname.startswith("."):
            continue
        entry, why = _read_entry(directory / fname)
        if entry is not None:
            entries.append(entry)
        else:
            others.append((fname, why))
    return entries, others


def services(directory: Path | None = None) -> list[Entry]:
    """Every registered service (alive or not), by name."""
    return scan(directory)[0]


def find(name: str, directory: Path | None = None) -> Entry | None:
    if not valid_name(name):
        return None
    directory = directory if directory is not None else runtime_dir()
    return None if directory is None else read(directory / f"{name}{SUFFIX}")
