"""Where running services are found: one small text file per service in a runtime directory.

The directory is ``$NNHAL_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/nnhal``, else one given
explicitly. A service named NAME writes ``NAME.service``: lines ``key=value`` with ``socket``
(absolute path), ``pid`` and ``driver``. It is written atomically (temporary file, rename)
and removed on a clean exit; a service killed leaves it behind, so readers check whether the
socket answers (``alive``). The file holds nothing but text: no code, nothing to unpickle.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

SUFFIX = ".service"
_MAX_FILE = 4096


def runtime_dir(given: str | os.PathLike[str] | None = None) -> Path | None:
    if given:
        return Path(given)
    env = os.environ.get("NNHAL_RUNTIME_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    return Path(xdg) / "nnhal" if xdg else None


@dataclass(frozen=True)
class Entry:
    name: str
    socket: str
    pid: int
    driver: str
    file: Path

    def alive(self, timeout_s: float = 0.5) -> bool:
        """The socket accepts a connection (the service answers)."""
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout_s)
        try:
            s.connect(self.socket)
            return True
        except OSError:
            return False
        finally:
            s.close()


def valid_name(name: str) -> bool:
    return bool(name) and len(name) <= 100 and all(c.isalnum() or c in "-_." for c in name) \
        and not name.startswith(".")


def register(directory: Path, name: str, socket_path: str, driver: str) -> Entry:
    if not valid_name(name):
        raise OSError(f"bad service name {name!r} (letters, digits, - _ . only)")
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    file = directory / f"{name}{SUFFIX}"
    tmp = directory / f".{name}{SUFFIX}.{os.getpid()}"
    tmp.write_text(f"socket={socket_path}\npid={os.getpid()}\ndriver={driver}\n")
    os.chmod(tmp, 0o600)
    os.replace(tmp, file)
    return Entry(name, socket_path, os.getpid(), driver, file)


def unregister(entry: Entry) -> None:
    """Remove the entry if it is still this service's (a restarted one may have replaced it)."""
    current = read(entry.file)
    if current is not None and current.pid == entry.pid:
        try:
            entry.file.unlink()
        except OSError:
            pass


def read(file: Path) -> Entry | None:
    try:
        with open(file, "rb") as f:
            data = f.read(_MAX_FILE + 1)
    except OSError:
        return None
    if len(data) > _MAX_FILE:
        return None
    fields: dict[str, str] = {}
    for line in data.decode("utf-8", "replace").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            fields[key.strip()] = value.strip()
    try:
        name = file.name[:-len(SUFFIX)]
        return Entry(name, fields["socket"], int(fields["pid"]), fields.get("driver", "?"),
                     file)
    except (KeyError, ValueError):
        return None


def services(directory: Path | None = None) -> list[Entry]:
    """Every registered service (alive or not), by name."""
    directory = directory if directory is not None else runtime_dir()
    if directory is None or not directory.is_dir():
        return []
    out = []
    for file in sorted(directory.glob(f"*{SUFFIX}")):
        if file.name.startswith("."):
            continue
        entry = read(file)
        if entry is not None:
            out.append(entry)
    return out


def find(name: str, directory: Path | None = None) -> Entry | None:
    if not valid_name(name):
        return None
    directory = directory if directory is not None else runtime_dir()
    return None if directory is None else read(directory / f"{name}{SUFFIX}")
