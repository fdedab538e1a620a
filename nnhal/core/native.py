"""nnhal's per-user cache folder, and C compiled into it at first use (the reference
driver's kernels, the frame fill, the C library from a checkout, the extension modules of the
repeated-run paths): stdlib only at import, so the lowest layer and ``setup.py`` can use it.

A build is compiled into a temporary file in the cache directory and moved into place with
:func:`os.replace`, so processes compiling at the same time all end up with a complete file.
Every failure is returned as a reason string; nothing here raises.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.machinery
import importlib.util
import os
import shlex
import stat
import subprocess
import sys
import sysconfig
import tempfile
import threading
from pathlib import Path
from types import ModuleType

COMPILE_TIMEOUT = 60.0


def cache_root() -> Path:
    """nnhal's per-user cache: ``$NNHAL_CACHE_DIR`` or ``$XDG_CACHE_HOME/nnhal`` or
    ``~/.cache/nnhal`` (each user of it takes a subdirectory)."""
    base = os.environ.get("NNHAL_CACHE_DIR")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg) / "nnhal" if xdg else Path.home() / ".cache" / "nnhal"

def cache_dir() -> Path:
    """:func:`cache_root`, then ``native/``."""
    return cache_root() / "native"

def compiler() -> list[str]:
    """``$CC``, else the interpreter's configured C compiler, else ``cc`` (as an argv)."""
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    argv = shlex.split(cc)
    return argv or ["cc"]

def cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return line.strip()
    except OSError:
        pass
    return ""

def check_private_dir(d: Path) -> str | None:
    """None when ``d`` is a directory private to this user (created 0700 if absent), else the
    reason it is not. One ``stat`` when it exists (each open of a Session checks a few)."""
    try:
        st = os.stat(d)
    except FileNotFoundError:
        st = None
    except OSError as e:
        return f"cache directory {d}: {e}"
    if st is None:
        try:
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
            st = d.stat()
        except OSError as e:
            return f"cache directory {d}: {e}"
    if not stat.S_ISDIR(st.st_mode):
        return f"cache path {d} is not a directory"
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return f"cache directory {d} is not owned by this user"
    if st.st_mode & 0o022:
        return f"cache directory {d} is writable by group or others"
    return None

def write_replacing(target: Path, data: bytes, durable: bool = False) -> None:
    """``data`` under ``target`` whole or not at all, for the per-user cache's files: a
    temporary file beside it, renamed into place (flushed to disk first when ``durable``, so
    that a crash never leaves a short file under the name). Raises OSError, leaving no
    temporary file behind."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def compile_into(cc: list[str], flags: tuple[str, ...], d: Path, target: Path,
                 source: Path) -> str | None:
    """Compile ``source`` into the shared object ``target`` in ``d``, atomically; None, or
    the reason it failed."""
    fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=d)
    os.close(fd)
    try:
        try:
            r = subprocess.run([*cc, *flags, "-o", tmp, str(source)], capture_output=True,
                               timeout=COMPILE_TIMEOUT, check=False)
        except subprocess.TimeoutExpired:
            return f"compiling {source.name} timed out after {COMPILE_TIMEOUT:.0f} s"
        except (OSError, subprocess.SubprocessError) as e:
            return f"compiling {source.name} failed: {e}"
        if r.returncode != 0:
            msg = (r.stderr or r.stdout).decode(errors="replace").strip().splitlines()
            return (f"compiling {source.name} with {shlex.join(cc)!r} failed "
                    f"({r.returncode}): {msg[0] if msg else ''}")
        if os.path.getsize(tmp) == 0:
            return f"compiler {shlex.join(cc)!r} produced an empty file"
        os.replace(tmp, target)
        tmp = ""
        return None
    except OSError as e:
        return f"cannot write the native build of {source.name}: {e}"
    finally:
        if tmp:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def switched_off() -> str | None:
    """Why native code is off in this process (``NNHAL_NATIVE=0``), else None."""
    if os.environ.get("NNHAL_NATIVE", "1").strip().lower() in ("0", "off", "false", "no"):
        return "disabled by NNHAL_NATIVE=0"
    return None


def _built(stem: str, parts: list[bytes], source: Path, flags: tuple[str, ...],
           cc: list[str] | None, build: bool = True) -> tuple[Path | None, str]:
    """(path, "") of ``source`` compiled with ``flags`` into the cache as ``STEM-KEY.so``,
    KEY a digest of ``parts``, compiled only when no such file is there (and ``build``);
    (None, reason) when it cannot be, or the file is not owned by this user."""
    h = hashlib.sha256()
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    d = cache_dir()
    bad = check_private_dir(d)
    if bad:
        return None, bad
    target = d / f"{stem}-{h.hexdigest()[:32]}.so"
    if not target.exists():
        if not build:
            return None, f"{target.name} is not built yet"
        reason = compile_into(cc if cc is not None else compiler(), flags, d, target, source)
        if reason:
            return None, reason
    try:
        if hasattr(os, "getuid") and target.stat().st_uid != os.getuid():
            return None, f"{target} is not owned by this user"
    except OSError as e:
        return None, f"cannot stat {target}: {e}"
    return target, ""


def build_cached(stem: str, parts: list[bytes], source: Path, flags: tuple[str, ...],
                 cc: list[str] | None = None, *, use_errno: bool = False
                 ) -> tuple[ctypes.CDLL | None, str]:
    """(library, "loaded from PATH") or (None, reason): ``source`` compiled with ``flags``
    (by ``cc``, default :func:`compiler`, asked only when it must compile) into the cache
    as ``STEM-KEY.so``, KEY a digest of ``parts`` (everything that decides the build's
    content), compiled only when no such file is there; a file not owned by this user is
    refused."""
    target, why = _built(stem, parts, source, flags, cc)
    if target is None:
        return None, why
    try:
        lib = ctypes.CDLL(str(target), use_errno=use_errno)
    except OSError as e:
        return None, f"cannot load {target}: {e}"
    return lib, f"loaded from {target}"


#: What the extensions share (a call, bound shapes), on their include path.
EXT_HEADER = Path(__file__).with_name("native_ext.h")
#: An extension's compiler flags but its include paths.
_EXT_FLAGS = ("-O2", "-shared", "-fPIC", "-fno-strict-aliasing",
              "-DNPY_NO_DEPRECATED_API=NPY_1_7_API_VERSION")


def build_extension(name: str, source: Path, build: bool = True
                    ) -> tuple[ModuleType | None, str]:
    """(module, "loaded from PATH") or (None, reason): the CPython extension module ``name``
    (its init function ``PyInit_NAME``), written against the Python and numpy C APIs,
    compiled from ``source`` into the cache once per source, interpreter and numpy version.
    For the few hot paths where a Python frame costs as much as the work (a call into a
    native engine that takes a microsecond); each has its Python twin for when this fails
    (no compiler or no Python headers here, ``NNHAL_NATIVE=0``). ``build=False``: only
    one built already (None, saying so, where none is)."""
    off = switched_off()
    if off:
        return None, off
    try:
        import numpy

        src = source.read_bytes()
        # The key needs no sysconfig (a millisecond to load, for a Session's open that only
        # looks for a build): the interpreter's build string and extension suffix, numpy's
        # version and headers say what the include paths would.
        parts = [src, EXT_HEADER.read_bytes(), " ".join(_EXT_FLAGS).encode(),
                 sys.version.encode(), sys.base_prefix.encode(),
                 importlib.machinery.EXTENSION_SUFFIXES[0].encode(),
                 numpy.__version__.encode(), numpy.get_include().encode()]
        flags: tuple[str, ...] = ()
        if build:
            py_inc = sysconfig.get_paths()["include"]
            if not os.path.exists(os.path.join(py_inc, "Python.h")):
                return None, f"no Python headers in {py_inc}"
            flags = (*_EXT_FLAGS, f"-I{py_inc}", f"-I{numpy.get_include()}",
                     f"-I{EXT_HEADER.parent}")
    except (OSError, ImportError) as e:
        return None, f"cannot build {source.name}: {e}"
    target, why = _built(name, parts, source, flags, None, build)
    if target is None:
        return None, why
    try:
        spec = importlib.util.spec_from_file_location(name, target)
        if spec is None or spec.loader is None:
            return None, f"cannot load {target}"
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - an extension that does not load: its twin runs
        return None, f"cannot load {target}: {type(e).__name__}: {e}"
    return module, f"loaded from {target}"


#: How many builds started by :meth:`NativeModule.soon` have ended in this process: code
#: that runs its Python twin while one was under way looks here to take the native one up.
BUILDS = [0]
#: How many such builds are under way (both counts change under this lock).
_UNDER_WAY = [0]
_COUNTS = threading.Lock()


def building() -> bool:
    """Whether a build started by :meth:`NativeModule.soon` is under way: code that would
    install native parts over twins (one native, one not yet) waits for all of them."""
    return _UNDER_WAY[0] > 0


class NativeModule:
    """An extension module (:func:`build_extension`) built or loaded once per process, on
    first use: :meth:`module` (None where it cannot be), :meth:`soon` (without waiting for a
    compiler) and :meth:`status` (why)."""

    def __init__(self, name: str, source: Path) -> None:
        self.name, self.source = name, source
        self._lock = threading.Lock()
        self._loaded: tuple[ModuleType | None, str] | None = None
        self._building = False

    def soon(self) -> ModuleType | None:
        """The module where it is loaded or built already; else None at once, its build
        started on a thread of its own (once), :data:`BUILDS` counting it when it ends. For
        a hot path whose Python twin runs meanwhile: a compiler run takes half a second or
        more, which a stream's second call should not wait for."""
        with self._lock:
            if self._loaded is not None:
                return self._loaded[0]
            if self._building:
                return None
            off = switched_off()
            found = (None, off) if off else build_extension(self.name, self.source, False)
            if found[0] is not None or off:
                self._loaded = found
                return found[0]
            self._building = True
            with _COUNTS:
                _UNDER_WAY[0] += 1
        threading.Thread(target=self._build_behind, name=f"nnhal-build-{self.name}",
                         daemon=True).start()
        return None

    def _build_behind(self) -> None:
        try:
            loaded = build_extension(self.name, self.source)
        except BaseException as e:  # noqa: BLE001 - the twin runs on; the reason is kept
            loaded = (None, f"cannot build {self.source.name}: {type(e).__name__}: {e}")
        with self._lock:
            if self._loaded is None:
                self._loaded = loaded
            self._building = False
            with _COUNTS:
                _UNDER_WAY[0] -= 1
                BUILDS[0] += 1

    def module(self, build: bool = True) -> ModuleType | None:
        """The module; ``build=False``: only if it is loaded or built already (no compiler
        run here: none is remembered, so a later call may still build it)."""
        with self._lock:
            if self._loaded is None:
                loaded = build_extension(self.name, self.source, build)
                if not build and loaded[0] is None:
                    return None
                self._loaded = loaded
            return self._loaded[0]

    def status(self) -> str:
        """"loaded from PATH", or why the module is not in use."""
        self.module()
        return self._loaded[1] if self._loaded is not None else ""
