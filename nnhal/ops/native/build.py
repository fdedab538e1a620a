"""Compile ``kernels.c`` at first use into a private per-user cache and load it with ctypes.

The shared object's name is a digest of everything that decides its content (the source, the
compiler command and its ``--version``, the flags, the machine, and the CPU flags when the
flags target the build machine), so a stale or foreign build is never picked up. It is
compiled into a temporary file in the cache directory and moved into place with
:func:`os.replace`, so processes compiling at the same time all end up with a complete file.
Every failure is returned as a reason string; nothing here raises.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shlex
import stat
import subprocess
import sysconfig
import tempfile
from pathlib import Path

SOURCE = Path(__file__).with_name("kernels.c")
#: -O3 for vectorisation; no -ffast-math (NaN/Inf and rounding stay IEEE) and no FMA
#: contraction, so the result does not depend on the build machine's instruction set.
BASE_FLAGS = ("-O3", "-fPIC", "-shared", "-ffp-contract=off", "-fno-math-errno")
#: Tried first (keyed by the CPU flags): measured here 2.5-5x faster than the generic build,
#: whose 8-lane vectors are split into SSE halves.
NATIVE_FLAGS = (*BASE_FLAGS, "-march=native")
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


def _cpu_flags() -> str:
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


def build_best() -> tuple[ctypes.CDLL | None, str]:
    """:data:`NATIVE_FLAGS`, else (a compiler without -march=native) :data:`BASE_FLAGS`."""
    lib, why = build(NATIVE_FLAGS)
    if lib is None and why.startswith("compiling"):
        lib, why2 = build(BASE_FLAGS)
        return lib, why2 if lib is not None else why
    return lib, why


def build(flags: tuple[str, ...] = BASE_FLAGS) -> tuple[ctypes.CDLL | None, str]:
    """(library, "loaded from PATH") or (None, reason)."""
    try:
        src = SOURCE.read_bytes()
    except OSError as e:
        return None, f"kernel source missing: {e}"
    cc = compiler()
    try:
        ver = subprocess.run([*cc, "--version"], capture_output=True, timeout=COMPILE_TIMEOUT,
                             check=False)
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"C compiler {shlex.join(cc)!r} unusable: {e}"
    if ver.returncode != 0:
        return None, f"C compiler {shlex.join(cc)!r} --version failed ({ver.returncode})"
    h = hashlib.sha256()
    for part in (src, shlex.join(cc).encode(), ver.stdout, " ".join(flags).encode(),
                 platform.machine().encode()):
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    if any(f.startswith(("-march=native", "-mcpu=native", "-mtune=native")) for f in flags):
        h.update(_cpu_flags().encode())
    d = cache_dir()
    bad = check_private_dir(d)
    if bad:
        return None, bad
    target = d / f"kernels-{h.hexdigest()[:32]}.so"
    if not target.exists():
        reason = _compile(cc, flags, d, target)
        if reason:
            return None, reason
    try:
        st = target.stat()
        if hasattr(os, "getuid") and st.st_uid != os.getuid():
            return None, f"{target} is not owned by this user"
        lib = ctypes.CDLL(str(target))
    except OSError as e:
        return None, f"cannot load {target}: {e}"
    return lib, f"loaded from {target}"


def _compile(cc: list[str], flags: tuple[str, ...], d: Path, target: Path,
             source: Path | None = None) -> str | None:
    """Compile ``source`` (default: the kernels) into ``target`` in ``d``, atomically; None,
    or the reason it failed."""
    source = SOURCE if source is None else source
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
