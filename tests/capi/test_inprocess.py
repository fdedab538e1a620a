"""The library loaded inside this Python process with ctypes (as PyTorch's tests load it):
it attaches to the running interpreter. Every function with NULL arguments, every function
taking a handle with a foreign one; threads calling at once with the GIL released."""

import ctypes
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from nnhal.capi import ctypes_ndk
from nnhal.capi.build import NAME
from nnhal.capi.header import FUNCTIONS
from nnhal.runtime.codes import ResultCode
from nnhal.runtime.model import ANeuralNetworksOperandType

NULL = int(ResultCode.UNEXPECTED_NULL)
BAD = int(ResultCode.BAD_DATA)
N = ctypes_ndk
_OPAQUE = ("ANeuralNetworksModel", "ANeuralNetworksCompilation", "ANeuralNetworksExecution",
           "ANeuralNetworksBurst", "ANeuralNetworksEvent", "ANeuralNetworksMemory",
           "ANeuralNetworksMemoryDesc", "ANeuralNetworksDevice")


@pytest.fixture(scope="module")
def lib(libdir):
    return ctypes_ndk.load(str(libdir / NAME))


def _zeros(lib, name):
    fn = getattr(lib, name)
    return fn(*[None if t is ctypes.c_void_p else 0 for t in fn.argtypes])


@pytest.mark.parametrize("name", [f[1] for f in FUNCTIONS])
def test_null_arguments(lib, name):
    """NULL for every pointer and handle: UNEXPECTED_NULL (frees: nothing), the process
    lives; the three parameterless getters answer their values."""
    got = _zeros(lib, name)
    want = {"ANeuralNetworks_getRuntimeFeatureLevel": 1000008,
            "ANeuralNetworks_getDefaultLoopTimeout": 2_000_000_000,
            "ANeuralNetworks_getMaximumLoopTimeout": 15_000_000_000}
    if name.endswith("_free"):
        assert got is None
    else:
        assert got == want.get(name, NULL)


def _handle_first(ret, params):
    first = params.split(",")[0].strip()
    return ret == "int" and first.split("*")[0].replace("const ", "").strip() in _OPAQUE \
        and first.count("*") == 1


HANDLE_FUNCTIONS = [f[1] for f in FUNCTIONS if _handle_first(f[0], f[2])]


@pytest.mark.parametrize("name", HANDLE_FUNCTIONS)
def test_foreign_handle(lib, name):
    """A pointer that is no handle of the library (client memory) as the first argument, the
    other pointers valid: BAD_DATA, and the memory is left as it was."""
    foreign = ctypes.create_string_buffer(b"\x5a" * 64)
    scratch = ctypes.create_string_buffer(256)
    fn = getattr(lib, name)
    args = [ctypes.addressof(foreign)]
    args += [ctypes.addressof(scratch) if t is ctypes.c_void_p else 0 for t in fn.argtypes[1:]]
    assert fn(*args) == BAD
    assert foreign.raw == b"\x5a" * 64 + b"\0"


def test_foreign_and_freed_handles_are_ignored_by_free(lib):
    foreign = ctypes.create_string_buffer(64)
    for _, name, _ in FUNCTIONS:
        if name.endswith("_free"):
            getattr(lib, name)(ctypes.addressof(foreign))
    code, model = N.ANeuralNetworksModel_create()
    assert code == 0
    N.ANeuralNetworksModel_free(model)
    N.ANeuralNetworksModel_free(model)
    assert N.ANeuralNetworksModel_finish(model) == BAD


def _add_compilation():
    code, model = N.ANeuralNetworksModel_create()
    assert code == 0
    t = ANeuralNetworksOperandType(3, [2, 2])
    for ot in (t, t, ANeuralNetworksOperandType(1), t):
        assert N.ANeuralNetworksModel_addOperand(model, ot) == 0
    assert N.ANeuralNetworksModel_setOperandValue(model, 2, np.zeros(1, np.int32), 4) == 0
    assert N.ANeuralNetworksModel_addOperation(model, 0, [0, 1, 2], [3]) == 0
    assert N.ANeuralNetworksModel_identifyInputsAndOutputs(model, [0, 1], [3]) == 0
    assert N.ANeuralNetworksModel_finish(model) == 0
    code, comp = N.ANeuralNetworksCompilation_create(model)
    assert code == 0 and N.ANeuralNetworksCompilation_finish(comp) == 0
    return model, comp


def _run(comp, base):
    a = np.arange(4, dtype=np.float32) + base
    b = np.full(4, 100 * base, np.float32)
    out = np.full(5, -1, np.float32)  # one float past the length given: never written
    code, ex = N.ANeuralNetworksExecution_create(comp)
    assert code == 0
    assert N.ANeuralNetworksExecution_setInput(ex, 0, None, a, 16) == 0
    assert N.ANeuralNetworksExecution_setInput(ex, 1, None, b, 16) == 0
    assert N.ANeuralNetworksExecution_setOutput(ex, 0, None, out, 16) == 0
    assert N.ANeuralNetworksExecution_compute(ex) == 0
    assert N.ANeuralNetworksExecution_getOutputOperandDimensions(ex, 0) == (0, [2, 2])
    N.ANeuralNetworksExecution_free(ex)
    return out, a + b


def test_add_in_process(lib):
    model, comp = _add_compilation()
    out, want = _run(comp, 3.0)
    assert out[:4].tolist() == want.tolist() and out[4] == -1
    N.ANeuralNetworksCompilation_free(comp)
    N.ANeuralNetworksModel_free(model)


def test_threads_in_process(lib):
    """Eight Python threads calling the library at once (ctypes releases the GIL; the library
    takes it back per call)."""
    model, comp = _add_compilation()

    def work(k):
        bad = 0
        for i in range(10):
            out, want = _run(comp, float(k * 10 + i))
            bad += out[:4].tolist() != want.tolist()
        return bad

    with ThreadPoolExecutor(8) as pool:
        assert sum(pool.map(work, range(8))) == 0
    N.ANeuralNetworksCompilation_free(comp)
    N.ANeuralNetworksModel_free(model)


def test_python_exception_becomes_op_failed(lib, monkeypatch, caplog):
    """An exception raised underneath never crosses into C: OP_FAILED, and it is logged."""
    from nnhal.runtime.model import NdkModel

    def boom(self):
        raise RuntimeError("injected")

    monkeypatch.setattr(NdkModel, "finish", boom)
    code, model = N.ANeuralNetworksModel_create()
    with caplog.at_level("ERROR"):
        assert N.ANeuralNetworksModel_finish(model) == int(ResultCode.OP_FAILED)
    assert "injected" in caplog.text
    N.ANeuralNetworksModel_free(model)


def test_memory_preferences_and_padding_through_the_library(lib):
    """Feature level 5's five functions, called as a C client calls them."""
    model, comp = _add_compilation()
    for io in ("Input", "Output"):
        for what in ("Alignment", "Padding"):
            get = getattr(N, f"ANeuralNetworksCompilation_getPreferredMemory{what}For{io}")
            assert get(comp, 0) == (0, 64)
            assert get(comp, 2)[0] == BAD
    code, ex = N.ANeuralNetworksExecution_create(comp)
    assert N.ANeuralNetworksExecution_enableInputAndOutputPadding(ex, True) == 0
    a = np.arange(16, dtype=np.float32)  # 64 bytes for 16-byte operands
    out = np.full(16, -1, np.float32)
    assert N.ANeuralNetworksExecution_setInput(ex, 0, None, a, 64) == 0
    assert N.ANeuralNetworksExecution_setInput(ex, 1, None, a, 64) == 0
    assert N.ANeuralNetworksExecution_enableInputAndOutputPadding(ex, False) == \
        ResultCode.BAD_STATE
    assert N.ANeuralNetworksExecution_setOutput(ex, 0, None, out, 64) == 0
    assert N.ANeuralNetworksExecution_compute(ex) == 0
    assert out[:4].tolist() == (2 * a[:4]).tolist() and (out[4:] == -1).all()
    N.ANeuralNetworksExecution_free(ex)
    N.ANeuralNetworksCompilation_free(comp)
    N.ANeuralNetworksModel_free(model)
