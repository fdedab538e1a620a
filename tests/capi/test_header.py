"""NeuralNetworks.h and the generated wrappers are what nnhal's enums generate; the header's
values and layouts are the NDK's; the ctypes structs of the bridge match the header."""

import ctypes
import inspect
import re
import subprocess

import pytest
from capi_helpers import PROGRAMS

from nnhal.capi import bridge, header
from nnhal.capi.build import INCLUDE_DIR, compiler
from nnhal.hal.types import OperandType, OperationType
from nnhal.runtime import codes, ndk


def test_generated_files_are_up_to_date():
    assert header.HEADER.read_text(encoding="ascii") == header.render()
    assert header.EXTENSIONS_HEADER.read_text(encoding="ascii") == header.render_extensions()
    assert header.EXTENSIONS_HEADER.parent == header.HEADER.parent  # beside it, as upstream
    assert header.WRAPPERS.read_text(encoding="ascii") == header.render_wrappers()


def _values() -> dict[str, int]:
    text = header.HEADER.read_text(encoding="ascii")
    return {k: int(v) for k, v in re.findall(r"^\s+(ANEURALNETWORKS_\w+) = (-?\d+),", text,
                                             re.M)}


def test_enum_values_agree_with_nnhal():
    v = _values()
    for t in OperandType:
        if t.name.startswith(("OEM", "TENSOR_OEM")):
            assert f"ANEURALNETWORKS_{t.name}" not in v  # HAL only
        else:
            assert v["ANEURALNETWORKS_" + ("MODEL" if t.name == "SUBGRAPH" else t.name)] == t
    ops = [t for t in OperationType if t.name != "OEM_OPERATION"]
    assert len(ops) == 106 and all(v[f"ANEURALNETWORKS_{t.name}"] == t for t in ops)
    assert all(v[f"ANEURALNETWORKS_{c.name}"] == c for c in codes.ResultCode)
    assert v["ANEURALNETWORKS_PRIORITY_HIGH"] == codes.PriorityCode.HIGH == 110
    assert v["ANEURALNETWORKS_FEATURE_LEVEL_8"] == codes.RUNTIME_FEATURE_LEVEL.ndk == 1000008
    # Every level of the scale, 6-8 included, with the NDK's values.
    assert [v[f"ANEURALNETWORKS_FEATURE_LEVEL_{n}"] for n in range(1, 9)] == \
        [27, 28, 29, 30, 31, 1000006, 1000007, 1000008]


def test_functions_are_ndk_functions():
    every = [*header.FUNCTIONS, *header.EXTENSION_FUNCTIONS]
    assert {f[1] for f in every} == {n for n in ndk.__all__
                                     if n.startswith("ANeuralNetworks")
                                     and inspect.isfunction(getattr(ndk, n))}
    assert all(callable(getattr(bridge, f[1])) for f in every)
    assert all(header.since(f[1]).level == 3 for f in header.EXTENSION_FUNCTIONS)


def test_layouts_compile(tmp_path):
    """Static assertions on offsets, sizes and values, in C with -std=c11 -pedantic."""
    r = subprocess.run([*compiler(), "-std=c11", "-pedantic", "-Wall", "-Werror",
                        f"-I{INCLUDE_DIR}", str(PROGRAMS / "layout.c"), "-o",
                        str(tmp_path / "layout")], capture_output=True, text=True, check=False)
    if r.returncode != 0 and "not found" in r.stderr:
        pytest.skip("no C compiler")
    assert r.returncode == 0, r.stderr


def test_bridge_structs_match_header():
    assert ctypes.sizeof(bridge._OperandTypeStruct) == 16 + ctypes.sizeof(ctypes.c_void_p)
    assert bridge._OperandTypeStruct.zeroPoint.offset == 12 + ctypes.sizeof(ctypes.c_void_p)
    assert bridge._ChannelQuantStruct.scales.offset == 8
