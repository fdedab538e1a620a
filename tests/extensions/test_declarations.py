"""nnhal.ops.extensions: declarations checked, the registry (plug-ins, in-process, what devices
report), and extension operand types where any operand type goes."""

from __future__ import annotations

import copy
import pickle
import textwrap

import numpy as np
import pytest

from nnhal.hal.types import (
    Extension,
    ExtensionOperandType,
    ExtensionOperandTypeInformation,
    operand_type,
    value_nbytes,
)
from nnhal.ops import extensions as ex
from nnhal.ops.resolver import OperationDef
from nnhal.ops.signature import Slot


@pytest.fixture
def registry(monkeypatch):
    for name in ("_registered", "_plugins", "_errors", "_declared"):
        monkeypatch.setattr(ex, name, {})
    monkeypatch.setattr(ex, "_discovered", True)
    return ex


def _ext(name="com.vendor.test", **kw) -> ex.ExtensionDef:
    t = ex.OperandTypeDef(name, 3, "T", True, 2, np.int16)
    op = ex.operation(name, 1, "OP", [Slot("x", t)], [Slot("y", t)], OperationDef(),
                      tflite=["VENDOR_OP", 42])
    return ex.ExtensionDef(name, (t,), (op,), **kw)


@pytest.mark.parametrize("bad", [
    lambda: _ext("NoPeriod"), lambda: _ext("com.Vendor"),
    lambda: ex.ExtensionDef("com.a.b", (ex.OperandTypeDef("com.a.b", 1, "A", False, 4),) * 2),
    lambda: ex.ExtensionDef("com.a.b", (ex.OperandTypeDef("com.a.c", 1, "A", False, 4),)),
    lambda: ex.ExtensionDef("com.a.b", (ex.OperandTypeDef("com.a.b", 1 << 16, "A", False, 4),)),
    lambda: ex.ExtensionDef("com.a.b", (ex.OperandTypeDef("com.a.b", 1, "A", False, 4,
                                                          np.int8),)),
    lambda: ex.ExtensionDef("com.a.b", (ex.OperandTypeDef("com.a.b", 1, "A", False, 0),)),
])
def test_declarations_are_checked(bad):
    with pytest.raises(ValueError):
        bad()


def test_register_lookup_and_the_hal_report(registry):
    e = _ext()
    registry.register(e)
    assert registry.lookup("com.vendor.test") is e
    assert e.hal() == Extension("com.vendor.test", [ExtensionOperandTypeInformation(3, True, 2)])
    assert registry.for_tflite("VENDOR_OP")[1].id.name == "com.vendor.test:OP"
    assert registry.for_tflite(42)[0] is e and registry.for_tflite("OTHER") is None
    registry.unregister("com.vendor.test")
    assert registry.lookup("com.vendor.test") is None


def test_what_a_device_reports_is_known_until_one_is_installed(registry):
    report = Extension("com.vendor.test", [ExtensionOperandTypeInformation(3, True, 2)])
    registry.declare(report)
    known = registry.lookup("com.vendor.test")
    assert known.declared and known.operand_type(3).params_size is None  # opaque data
    registry.register(_ext())
    assert not registry.lookup("com.vendor.test").declared
    registry.declare(Extension("Bad Name", []))  # ignored, not an error
    assert registry.lookup("Bad Name") is None


def test_plugins_load_lazily_and_a_broken_one_is_unknown_with_why(registry, tmp_path,
                                                                  monkeypatch):
    pkg = tmp_path / "vendor_ext"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(textwrap.dedent("""
        import numpy as np
        from nnhal.ops import extensions as ex
        GOOD = ex.ExtensionDef("com.vendor.good",
                               (ex.OperandTypeDef("com.vendor.good", 0, "X", False, 8),))
        def wrong_name():
            return ex.ExtensionDef("com.vendor.other")
    """))
    dist = tmp_path / "vendor_ext-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vendor-ext\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(textwrap.dedent("""
        [nnhal.extensions]
        com.vendor.good = vendor_ext:GOOD
        com.vendor.named = vendor_ext:wrong_name
        com.vendor.missing = vendor_ext.nothing:X
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.discover(force=True)
    assert "vendor_ext" not in __import__("sys").modules  # nothing imported yet
    assert registry.lookup("com.vendor.good").operand_type(0).byte_size == 8
    status = registry.installed()
    assert status["com.vendor.good"] is None
    assert "declares 'com.vendor.other'" in status["com.vendor.named"]
    assert "failed to load" in status["com.vendor.missing"]
    assert registry.lookup("com.vendor.named") is None
    __import__("sys").modules.pop("vendor_ext", None)


def test_an_extension_operand_type_goes_where_operand_types_go():
    t = ex.OperandTypeDef("com.vendor.test", 3, "T", True, 2, np.int16)
    typed = ExtensionOperandType(5 << 16 | 3, t)
    assert typed == 5 << 16 | 3 and operand_type(typed) is typed
    assert typed.is_tensor and typed.dtype == np.int16 and typed.name == "com.vendor.test:T"
    assert value_nbytes(typed, [3, 4]) == 24 and value_nbytes(typed, [0, 4]) is None
    assert value_nbytes(typed, []) is None
    assert value_nbytes(ExtensionOperandType(1 << 16, ex.OperandTypeDef(
        "com.vendor.test", 0, "S", False, 8)), []) == 8
    assert value_nbytes(5 << 16 | 3, [3]) is None  # unresolved: unknown size
    assert copy.deepcopy(typed) is typed
    again = pickle.loads(pickle.dumps(typed))
    assert again == typed and again.definition == t
    with pytest.raises(ValueError):
        operand_type(5 << 16 | 3)


def test_nnhal_ops_lists_the_installed_extensions(fibonacci_site, capsys):
    from nnhal import cli

    assert cli.main(["ops", "--extensions"]) == 0
    out = capsys.readouterr().out
    assert "com.example.fibonacci" in out
    assert "operand type 1 TENSOR_QUANT64_ASYMM: tensor of 8-byte elements, extension data " \
           "16 bytes" in out
    assert "input 0 n: INT64 or TENSOR_FLOAT32" in out
