"""One version scale (``nnhal.core.version``) for every place a version is meant.

The scale itself (order, NDK values, every spelling round-trips, unknown ones refused), a
property test of its parsers over arbitrary input, the model's minimum version the analysis
computes, the devices' and the runtime's feature levels, and a scan of the package for a
second spelling of a version outside the scale.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nnhal.analysis import analyse
from nnhal.core import FeatureLevel, UnknownVersion
from nnhal.drivers.reference import ReferenceDevice
from nnhal.hal.builder import ModelBuilder
from nnhal.hal.interfaces import IDevice
from nnhal.hal.types import OperandType, OperationType
from nnhal.runtime import codes, ndk
from nnhal.runtime.devices import Device, feature_level_of

ROOT = Path(__file__).resolve().parent.parent / "nnhal"
F = FeatureLevel
T = OperandType
NDK = [27, 28, 29, 30, 31, 1000006, 1000007, 1000008]
SPELLINGS = ["V1_0", "V1_1", "V1_2", "V1_3", "AIDL_V1", "AIDL_V2", "AIDL_V3", "AIDL_V4"]


# ---- the scale ------------------------------------------------------------------------------

def test_levels_are_ordered_one_to_eight_with_the_ndk_values():
    members = list(F)
    assert [m.level for m in members] == list(range(1, 9))
    assert [m.ndk for m in members] == NDK
    assert [m.spelling for m in members] == SPELLINGS
    assert sorted(members, reverse=True) == members[::-1]
    assert all(a < b and b > a and a <= b and not a >= b
               for a, b in zip(members, members[1:]))
    assert max(members) is F.AIDL_V4 is F.latest() and min(members) is F.V1_0
    assert len({m.interface for m in members}) == 8
    assert F.V1_3.interface == "android.hardware.neuralnetworks@1.3"
    assert F.V1_3.describe() == "feature level 4 (HAL 1.3)"
    assert F.AIDL_V2.describe() == "feature level 6 (AIDL v2)"


def test_aidl_interface_versions_are_levels_five_to_eight():
    assert [m.aidl_version for m in F] == [None] * 4 + [1, 2, 3, 4]
    assert [F.of_aidl(v) for v in (1, 2, 3, 4)] == [F.AIDL_V1, F.AIDL_V2, F.AIDL_V3, F.AIDL_V4]
    for bad in (0, 5, -1, True, "4", 4.0, None):
        with pytest.raises(UnknownVersion):
            F.of_aidl(bad)


def test_a_level_never_compares_with_a_number():
    """An NDK value (30) or a level number (4) beside a member is a TypeError, not a guess."""
    for n in (4, 30):
        with pytest.raises(TypeError):
            _ = F.V1_3 < n  # type: ignore[operator]
    assert F.V1_3 != 4 and F.V1_3 != 30


@pytest.mark.parametrize("member", list(F), ids=lambda m: m.name)
def test_every_spelling_round_trips(member):
    for spelling in (member.spelling, str(member), member.label, member.interface,
                     f"  {member.spelling} "):
        assert F.parse(spelling) is member
    assert F.from_ndk(member.ndk) is member
    assert F.of_level(member.level) is member
    assert F[member.spelling] is member


@pytest.mark.parametrize("bad", ["", "V1_4", "v1_3", "AIDL_V5", "1.4", "HAL 2.0", "13", "V1",
                                 None, 3, 30, 1.3, True, b"V1_3", ["V1_3"]])
def test_unknown_spellings_are_refused(bad):
    with pytest.raises(UnknownVersion, match="known"):
        F.parse(bad)


@pytest.mark.parametrize("bad", [0, 9, 26, 32, 1000005, 1000009, -1, True, 30.0, "30", None])
def test_unknown_numbers_are_refused(bad):
    with pytest.raises(UnknownVersion):
        F.from_ndk(bad)
    with pytest.raises(UnknownVersion):
        F.of_level(bad if bad not in NDK else 0)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.text(max_size=40), st.sampled_from(SPELLINGS + [str(m) for m in F]),
                 st.integers(), st.floats(), st.none(), st.booleans(), st.binary(max_size=8),
                 st.lists(st.integers(), max_size=3)))
def test_the_parsers_answer_a_member_or_unknown_version(value):
    """1,500 arbitrary values through each of the three parsers: a member or UnknownVersion
    (a ValueError, so callers that catch bad input catch it), never another exception."""
    for parse in (F.parse, F.from_ndk, F.of_level):
        try:
            got = parse(value)
        except UnknownVersion as e:
            assert isinstance(e, ValueError) and str(e)
        else:
            assert isinstance(got, F)


# ---- the model's minimum version --------------------------------------------------------

def _add(t: OperandType, relaxed: bool = False, scale: float = 0.0) -> ModelBuilder:
    b = ModelBuilder(relaxed=relaxed)
    x, y = b.input(t, (2,), scale), b.input(t, (2,), scale)
    out = b.output(t, (2,), scale)
    b.operation(OperationType.ADD, [x, y, b.scalar(T.INT32, 0)], [out])
    return b


@pytest.mark.parametrize("t, relaxed, scale, want", [
    (T.TENSOR_FLOAT32, False, 0.0, F.V1_0),
    (T.TENSOR_FLOAT32, True, 0.0, F.V1_1),        # relaxComputationFloat32toFloat16
    (T.TENSOR_FLOAT16, False, 0.0, F.V1_2),       # a variant of 1.2
    (T.TENSOR_QUANT8_ASYMM_SIGNED, False, 0.5, F.V1_3),
    (T.TENSOR_INT32, False, 0.0, F.V1_3),
])
def test_the_analysis_computes_the_models_minimum_version(t, relaxed, scale, want):
    graph = analyse(_add(t, relaxed, scale).build())
    assert graph.min_level is want
    assert graph.main.min_level is (F.V1_0 if relaxed else want)


def test_a_trailing_input_added_later_raises_the_level():
    """SOFTMAX of 1.0 takes two inputs; its axis came with 1.2."""
    levels = []
    for with_axis in (False, True):
        b = ModelBuilder()
        x = b.input(T.TENSOR_FLOAT32, (1, 4))
        ins = [x, b.scalar(T.FLOAT32, 1.0)] + ([b.scalar(T.INT32, -1)] if with_axis else [])
        b.operation(OperationType.SOFTMAX, ins, [b.output(T.TENSOR_FLOAT32, (1, 4))])
        levels.append(analyse(b.build()).min_level)
    assert levels == [F.V1_0, F.V1_2]


# ---- devices and the runtime ------------------------------------------------------------

def test_devices_report_their_interfaces_level_through_the_ndk():
    dev = Device.of(ReferenceDevice())
    assert dev.feature_level is F.AIDL_V4  # answers AIDL v4's calls through the defaults
    assert IDevice.feature_level is F.V1_3  # a driver that names no level
    assert ndk.ANeuralNetworksDevice_getFeatureLevel(dev) == (0, 1000008)
    assert ndk.ANeuralNetworks_getRuntimeFeatureLevel() == 1000008 == \
        codes.RUNTIME_FEATURE_LEVEL.ndk

    class Earlier(ReferenceDevice):
        feature_level = F.AIDL_V2

    assert ndk.ANeuralNetworksDevice_getFeatureLevel(Device.of(Earlier())) == (0, 1000006)


def test_a_served_device_reports_the_served_drivers_level(tmp_path):
    from helpers import served

    from nnhal.service.client import RemoteDevice

    with served(tmp_path / "s.sock") as svc:
        remote = RemoteDevice(svc.path)
        try:
            dev = Device.of(remote)
            assert dev.feature_level is F.AIDL_V4  # the served reference driver's level
            assert ndk.ANeuralNetworksDevice_getFeatureLevel(dev) == (0, 1000008)
        finally:
            remote.close()


def test_an_object_naming_no_level_is_taken_as_hal_1_3():
    class Odd:
        feature_level = 30  # an NDK number is not a level of the scale

    class Broken:
        @property
        def feature_level(self):
            raise RuntimeError("no")

    assert feature_level_of(Odd()) is F.V1_3
    assert feature_level_of(Broken()) is F.V1_3
    assert feature_level_of(object()) is F.V1_3


# ---- no second spelling -------------------------------------------------------------------

def _names_members(value: ast.expr) -> bool:
    """``FeatureLevel.V1_2`` or a tuple of such: an alias of the scale's members."""
    items = value.elts if isinstance(value, ast.Tuple) else [value]
    return all(isinstance(v, ast.Attribute) and isinstance(v.value, ast.Name) and
               v.value.id == "FeatureLevel" for v in items)


def _second_spellings(path: Path) -> list[str]:
    """Literals in ``path`` that spell a version themselves: a whole string the scale parses
    (``"V1_3"``, ``"1.2"``, ``"AIDL v2"``), an NDK value of levels 6-8, and a class or name
    that defines V1_x / AIDL_Vx members of its own."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                F.parse(node.value)
            except UnknownVersion:
                continue
            found.append(f"{path}:{node.lineno}: string {node.value!r}")
        elif isinstance(node, ast.Constant) and type(node.value) is int and \
                node.value in NDK[5:]:
            found.append(f"{path}:{node.lineno}: NDK value {node.value}")
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                names = target.elts if isinstance(target, ast.Tuple) else [target]
                for n in names:
                    if isinstance(n, ast.Name) and n.id in SPELLINGS and \
                            not _names_members(node.value):
                        found.append(f"{path}:{node.lineno}: defines {n.id}")
    return found


def test_the_scanner_sees_each_kind_of_second_spelling(tmp_path):
    p = tmp_path / "m.py"
    p.write_text('class Version:\n    V1_3 = (1, 3)\nx = "V1_2"\ny = 1000007\nz = "1.0"\n'
                 'V1_0 = FeatureLevel.V1_0\nok = "version 1.3 of the HAL"\n')
    found = _second_spellings(p)
    assert sorted(f.split(": ", 1)[1] for f in found) == \
        ["NDK value 1000007", "defines V1_3", "string '1.0'", "string 'V1_2'"]


def test_no_second_version_spelling_outside_the_scale():
    """Versions are the scale's members everywhere; the signature tables name them by the
    scale's own short aliases (``V1_2``), which are members, not spellings."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        if path.relative_to(ROOT).parts[0] != "core":
            found += _second_spellings(path)
    assert not found, "versions spelled outside nnhal/core:\n" + "\n".join(found)
