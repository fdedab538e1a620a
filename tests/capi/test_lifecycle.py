"""The library at every point of its host's life: called before the host's Python starts,
while it finalizes and after, from native threads racing a Python or a C exit, and from
atexit handlers and static destructors. Each case runs in a child process, which must exit 0
(never die by a signal), within a bound, with the result codes it prints."""

import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest
from capi_helpers import PROGRAMS, build_program, clean_env, run_program

from nnhal.capi.build import INCLUDE_DIR, NAME, compiler

BAD_STATE = 6
BOUND = 120  # s: each child takes about a second; a hang or a 600 s wait fails the test


def _helper(tmp_path: Path) -> Path:
    out = tmp_path / "host_helper.so"
    r = subprocess.run([*compiler(), "-shared", "-fPIC", "-Wall", "-Werror", f"-I{INCLUDE_DIR}",
                        str(PROGRAMS / "host_helper.c"), "-lpthread", "-o", str(out)],
                       capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    return out


def _python(code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    script = tmp_path / "client.py"
    script.write_text(textwrap.dedent(code))
    top = str(Path(__file__).resolve().parents[2])
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=BOUND, check=False, cwd=tmp_path,
                          env={"PYTHONPATH": top, "PATH": "/usr/bin:/bin"})


_LOAD = """
    import atexit, ctypes
    def early():  # registered before the library: runs after the library closed
        lib.ANeuralNetworksModel_free(early_model)
        m = ctypes.c_void_p()
        print("early", lib.ANeuralNetworksModel_create(ctypes.byref(m)), flush=True)
    atexit.register(early)
    lib = ctypes.CDLL({lib!r})
    lib.ANeuralNetworksModel_create.argtypes = [ctypes.c_void_p]
    lib.ANeuralNetworksModel_free.argtypes = [ctypes.c_void_p]
    early_model, late_model = ctypes.c_void_p(), ctypes.c_void_p()
    assert lib.ANeuralNetworksModel_create(ctypes.byref(early_model)) == 0
    assert lib.ANeuralNetworksModel_create(ctypes.byref(late_model)) == 0
    def late():  # registered after the library: runs while it still works
        lib.ANeuralNetworksModel_free(late_model)
        m = ctypes.c_void_p()
        print("late", lib.ANeuralNetworksModel_create(ctypes.byref(m)), flush=True)
    atexit.register(late)
    helper = ctypes.CDLL({helper!r})
    helper.setup(ctypes.cast(lib.ANeuralNetworksModel_create, ctypes.c_void_p),
                 ctypes.cast(lib.ANeuralNetworksModel_free, ctypes.c_void_p))
"""


def test_free_from_atexit_handlers_after_ctypes_load(libdir, tmp_path):
    """Loaded with ctypes: a Python atexit handler registered after the load still works; one
    registered before it, and a C atexit handler run after Py_Finalize (where the free used
    to be a SIGSEGV), find the library closed: the free is a no-op, a call BAD_STATE."""
    r = _python(_LOAD.format(lib=str(libdir / NAME), helper=str(_helper(tmp_path))), tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout == f"late 0\nearly {BAD_STATE}\n", r.stdout + r.stderr


def test_native_threads_racing_python_exit(libdir, tmp_path):
    """Native threads of a C extension call the library in a loop, more of them starting (a
    first call) as the interpreter shuts down: every call answers NO_ERROR or BAD_STATE, the
    process exits 0, and the C atexit free after finalization is a no-op."""
    code = _LOAD.format(lib=str(libdir / NAME), helper=str(_helper(tmp_path))) + """
    import time
    assert helper.start_callers(4) == 0
    while helper.calls_made() < 50:
        time.sleep(0.001)
    assert helper.start_callers(4) == 0  # their first calls race the shutdown below
    """
    for _ in range(3):
        r = _python(code, tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "Fatal" not in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_c_program_threads_racing_exit(libdir, tmp_path):
    """main() returns while native threads call: the library closes at exit (the calls in
    flight finish first), later calls and an older atexit handler's free answer BAD_STATE."""
    exe = build_program("exit_race", libdir, tmp_path)
    for _ in range(3):
        r = run_program(exe, libdir, timeout=BOUND)
        assert r.returncode == 0, r.stdout + r.stderr
        assert r.stdout.endswith(f"after exit: create {BAD_STATE}\n"), r.stdout + r.stderr


def test_calls_before_and_after_the_hosts_python(libdir, tmp_path):
    """A C program embedding Python: a call before Py_Initialize is BAD_STATE (the library
    starts no second interpreter in a host that owns one), calls while it runs work, calls
    and frees after Py_Finalize are BAD_STATE and no-ops; the getters still answer."""
    if not sysconfig.get_config_var("Py_ENABLE_SHARED"):
        pytest.skip("this Python has no shared libpython to embed")
    exe = tmp_path / "embedded"
    pylib = sysconfig.get_config_var("LIBDIR")
    ver = sysconfig.get_config_var("LDVERSION")
    cmd = [*compiler(), "-Wall", "-Werror", f"-I{INCLUDE_DIR}",
           f"-I{sysconfig.get_paths()['include']}", str(PROGRAMS / "embedded.c"),
           f"-L{libdir}", "-lneuralnetworks", f"-L{pylib}", f"-lpython{ver}",
           f"-Wl,-rpath,{pylib}", "-lpthread", "-o", str(exe)]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    env = clean_env(libdir)
    paths = [str(Path(__file__).resolve().parents[2]), *sysconfig.get_paths().values()]
    env["PYTHONPATH"] = ":".join(dict.fromkeys(p for p in paths if p))
    r = subprocess.run([str(exe)], capture_output=True, text=True, env=env, timeout=BOUND,
                       check=False, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout == (f"before {BAD_STATE}\nrunning 0\ncompile 0\nafter {BAD_STATE}\n"
                        f"finish {BAD_STATE}\nlevel 1000008\n"), r.stdout + r.stderr


def test_sync_fence_fd_must_be_a_fence(libdir, tmp_path):
    """A pipe, a file, fd 0, a negative or closed fd: BAD_DATA; an eventfd fence that never
    signals is accepted and freeing its event does not wait (it used to wait 600 s)."""
    r = run_program(build_program("fence", libdir, tmp_path), libdir, timeout=BOUND)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ok: 0 failures" in r.stdout
