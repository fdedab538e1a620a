"""Build ``libneuralnetworks.so``: at ``pip install`` time (setup.py) or on demand.

An installed nnhal carries the library in ``nnhal/capi/lib/``; it finds its Python at run
time from its own path. A source tree (tests run from a checkout, an editable install) has
none, so :func:`library_dir` compiles one into the private per-user cache of
:mod:`nnhal.core.native`, in a folder named by a digest of everything that decides its
content, with this interpreter and this source tree baked in. Stdlib only at module level:
setup.py loads this file by path, before nnhal's dependencies exist. Failures are reasons
(strings), never exceptions.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCES = (HERE / "neuralnetworks.c", HERE / "wrappers.inc", HERE / "include" / "NeuralNetworks.h")
INCLUDE_DIR = HERE / "include"
INSTALLED_DIR = HERE / "lib"
NAME = "libneuralnetworks.so"
#: Exported: the NDK's names only (everything else is hidden by -fvisibility too).
VERSION_SCRIPT = "{ global: ANeuralNetworks*; local: *; };\n"
FLAGS = ("-O2", "-fPIC", "-shared", "-fvisibility=hidden", "-Wall")
COMPILE_TIMEOUT = 120.0


def compiler() -> list[str]:
    """``$CC``, else the interpreter's configured C compiler, else ``cc``."""
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    return shlex.split(cc) or ["cc"]


def libpython() -> str:
    """The shared libpython of this interpreter, or "" when it is linked statically."""
    if not sysconfig.get_config_var("Py_ENABLE_SHARED"):
        return ""
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    name = sysconfig.get_config_var("INSTSONAME") or sysconfig.get_config_var("LDLIBRARY")
    return str(Path(libdir) / name) if name else ""


def _c_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def command(output: Path, version_script: Path, executable: str = "",
            syspath: str = "") -> list[str]:
    """The compiler command line (``executable``/``syspath``: baked in for a cache build)."""
    return [*compiler(), *FLAGS, f"-I{sysconfig.get_paths()['include']}", f"-I{INCLUDE_DIR}",
            f"-I{HERE}", f"-DNNHAL_LIBPYTHON={_c_string(libpython())}",
            f"-DNNHAL_EXECUTABLE={_c_string(executable)}",
            f"-DNNHAL_SYSPATH={_c_string(syspath)}", f"-Wl,-soname,{NAME}",
            f"-Wl,--version-script={version_script}", "-o", str(output),
            str(HERE / "neuralnetworks.c"), "-ldl", "-lpthread"]


def compile_library(target: Path, executable: str = "", syspath: str = "") -> str | None:
    """Compile into ``target`` (atomically); None, or the reason it failed."""
    if not sys.platform.startswith("linux"):
        return f"libneuralnetworks.so is built on Linux only (this is {sys.platform})"
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as tmp:
        vs = Path(tmp) / "exports.map"
        vs.write_text(VERSION_SCRIPT, encoding="ascii")
        out = Path(tmp) / NAME
        cmd = command(out, vs, executable, syspath)
        try:
            r = subprocess.run(cmd, capture_output=True, timeout=COMPILE_TIMEOUT, check=False)
        except subprocess.TimeoutExpired:
            return f"compiling {NAME} timed out after {COMPILE_TIMEOUT:.0f} s"
        except (OSError, subprocess.SubprocessError) as e:
            return f"compiling {NAME}: C compiler {shlex.join(compiler())!r} unusable: {e}"
        if r.returncode != 0:
            msg = (r.stderr or r.stdout).decode(errors="replace").strip().splitlines()
            return f"compiling {NAME} failed ({r.returncode}): {msg[0] if msg else ''}"
        os.replace(out, target)
    return None


def _digest(executable: str, syspath: str) -> str:
    h = hashlib.sha256()
    try:
        ver = subprocess.run([*compiler(), "--version"], capture_output=True,
                             timeout=COMPILE_TIMEOUT, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        ver = b""
    parts = [p.read_bytes() for p in SOURCES]
    parts += [shlex.join(compiler()).encode(), ver, " ".join(FLAGS).encode(),
              libpython().encode(), executable.encode(), syspath.encode(),
              sysconfig.get_paths()["include"].encode(), VERSION_SCRIPT.encode()]
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()[:32]


def library_dir() -> tuple[Path | None, str]:
    """(folder holding libneuralnetworks.so, "") or (None, reason): the installed library
    when this nnhal is an installed one, else a build in the private cache."""
    if (INSTALLED_DIR / NAME).is_file():
        return INSTALLED_DIR, ""
    from nnhal.core.native import cache_root, check_private_dir

    root = cache_root()
    bad = check_private_dir(root)
    if bad:
        return None, bad
    executable, syspath = sys.executable, str(HERE.parent.parent)
    try:
        d = root / f"capi-{_digest(executable, syspath)}"
    except OSError as e:
        return None, f"library sources missing: {e}"
    if not (d / NAME).is_file():
        reason = compile_library(d / NAME, executable, syspath)
        if reason:
            return None, reason
    return d, ""
