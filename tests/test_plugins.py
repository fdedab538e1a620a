"""Plug-in drivers: entry points of the group ``nnhal.drivers`` in installed distributions
(faked here by a dist-info directory on sys.path)."""

from __future__ import annotations

import sys
import textwrap
import time

import pytest

from nnhal.drivers import registry
from nnhal.drivers.reference import ReferenceDevice
from nnhal.errors import NnhalError


@pytest.fixture
def plugin_site(tmp_path, monkeypatch):
    """A directory on sys.path holding a fake distribution whose entry points name a good
    driver, one whose probe refuses, one that fails to import, one that is not callable,
    and one that tries to replace the reference driver."""
    pkg = tmp_path / "fakevendor_nn"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(textwrap.dedent("""
        from nnhal.drivers.reference import ReferenceDevice

        LOADED = []

        class VendorDevice(ReferenceDevice):
            pass

        def make():
            LOADED.append("make")
            return VendorDevice()

        def make_offline():
            return VendorDevice()

        make_offline.probe = lambda: "the vendor NPU is not present"

        def make_reference():
            raise AssertionError("a plug-in must not replace a built-in")

        NOT_CALLABLE = 3
    """))
    (pkg / "broken.py").write_text("raise RuntimeError('vendor library missing')\n")
    dist = tmp_path / "fakevendor_nn-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fakevendor-nn\n"
                                   "Version: 1.0\n")
    (dist / "entry_points.txt").write_text(textwrap.dedent("""
        [nnhal.drivers]
        vendor = fakevendor_nn:make
        vendor-offline = fakevendor_nn:make_offline
        vendor-broken = fakevendor_nn.broken:make
        vendor-odd = fakevendor_nn:NOT_CALLABLE
        reference = fakevendor_nn:make_reference
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_DEVICES", dict(registry._DEVICES))
    registry.discover(force=True)
    yield
    for name in [m for m in sys.modules if m.startswith("fakevendor_nn")]:
        del sys.modules[name]
    registry._discovered = False


def test_plugins_are_listed_after_the_built_ins_without_being_imported(plugin_site):
    names = registry.device_names()
    assert names[:3] == ["reference", "litert", "xla"]
    assert names[3:] == ["vendor", "vendor-offline", "vendor-broken", "vendor-odd"]
    assert "fakevendor_nn" not in sys.modules  # listing names imports nothing


def test_a_plugin_opens_and_a_builtin_is_never_replaced(plugin_site):
    device = registry.open_device("vendor")
    try:
        assert type(device).__name__ == "VendorDevice"
        assert sys.modules["fakevendor_nn"].LOADED == ["make"]
    finally:
        device.close()
    ref = registry.open_device("reference")
    try:
        assert type(ref) is ReferenceDevice
    finally:
        ref.close()


def test_broken_plugins_are_unavailable_with_the_reason(plugin_site):
    why = registry.available()
    assert why["vendor"] is None
    assert why["vendor-offline"] == "the vendor NPU is not present"
    assert why["vendor-broken"] == ("plug-in fakevendor_nn.broken:make failed to load: "
                                    "RuntimeError: vendor library missing")
    assert why["vendor-odd"] == "plug-in fakevendor_nn:NOT_CALLABLE is not a callable factory"
    with pytest.raises(NnhalError, match="'vendor-broken' is not available: plug-in"):
        registry.open_device("vendor-broken")
    with pytest.raises(NnhalError, match="'vendor-offline' is not available: the vendor NPU"):
        registry.open_device("vendor-offline")


def test_a_factory_returning_something_else_is_refused(monkeypatch):
    monkeypatch.setattr(registry, "_DEVICES", dict(registry._DEVICES))
    registry.register("odd", lambda: object())
    with pytest.raises(NnhalError, match="'odd' is not available: its factory returned "
                                         "object, not an IDevice"):
        registry.open_device("odd")


def test_the_quick_look_for_plugins_finds_them_and_defers_what_it_cannot_read(
        tmp_path, monkeypatch, plugin_site):
    assert registry._maybe_plugins()  # the fake distribution names the group
    bare = tmp_path / "bare"
    (bare / "other-1.0.dist-info").mkdir(parents=True)
    (bare / "other-1.0.dist-info" / "entry_points.txt").write_text(
        "[console_scripts]\nother = other:main\n")
    (bare / "plain-2.0.dist-info").mkdir()  # no entry points at all
    monkeypatch.setattr(sys, "path", [str(bare), str(tmp_path / "absent")])
    assert not registry._maybe_plugins()  # nothing names the group: no full scan
    scanned = []
    monkeypatch.setattr(registry.importlib.metadata, "entry_points",
                        lambda **k: scanned.append(k) or ())
    registry.discover(force=True)
    assert scanned == []  # the full scan of every distribution was skipped
    zipped = tmp_path / "site.zip"
    zipped.write_bytes(b"PK\x05\x06" + bytes(18))  # an empty zip archive
    monkeypatch.setattr(sys, "path", [str(bare), str(zipped)])
    assert registry._maybe_plugins()  # a zip on the path: the full scan decides


def test_extensions_are_looked_for_only_where_a_distribution_may_declare_them(
        tmp_path, monkeypatch):
    """Extension discovery takes the drivers' look along the path: the full scan of every
    installed distribution only where an ``entry_points.txt`` names the group."""
    from nnhal.ops import extensions

    assert extensions.plugins_possible == registry.extension_plugins_possible  # lent
    bare = tmp_path / "bare"
    (bare / "other-1.0.dist-info").mkdir(parents=True)
    (bare / "other-1.0.dist-info" / "entry_points.txt").write_text(
        f"[{registry.PLUGIN_GROUP}]\nv = vendor_nn:make\n")  # a driver, no extension
    monkeypatch.setenv("NNHAL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(sys, "path", [str(bare)])
    monkeypatch.setattr(registry, "_facts", None)
    for name in ("_registered", "_plugins", "_errors"):
        monkeypatch.setattr(extensions, name, {})
    monkeypatch.setattr(extensions, "_discovered", False)
    scanned = []
    monkeypatch.setattr(extensions.importlib.metadata, "entry_points",
                        lambda **k: scanned.append(k) or ())
    extensions.discover()
    assert scanned == []  # nothing names nnhal.extensions: no full scan
    (bare / "ext-1.0.dist-info").mkdir()
    (bare / "ext-1.0.dist-info" / "entry_points.txt").write_text(
        f"[{extensions.PLUGIN_GROUP}]\ncom.vendor.x = vendor_x:EXT\n")
    monkeypatch.setattr(sys, "path", [str(bare), str(tmp_path / "absent")])  # looked again
    extensions.discover(force=False)  # once per process: not again
    assert scanned == []
    monkeypatch.setattr(extensions, "_discovered", False)
    extensions.discover()
    assert scanned == [{"group": extensions.PLUGIN_GROUP}]


def test_the_look_along_the_path_is_remembered_until_a_directory_on_it_changes(
        tmp_path, monkeypatch):
    site = tmp_path / "site"
    (site / "other-1.0.dist-info").mkdir(parents=True)
    monkeypatch.setenv("NNHAL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(sys, "path", [str(site)])
    monkeypatch.setattr(registry, "_facts", None)
    monkeypatch.setattr(registry, "RACY_NS", 0)  # the folders were made just now
    assert registry._path_facts() == (False, registry._xla_listed(), False)
    assert (tmp_path / "cache" / registry.PATH_MEMO).is_file()

    def looked():
        raise AssertionError("looked again")

    monkeypatch.setattr(registry, "_maybe_plugins", looked)
    monkeypatch.setattr(registry, "_facts", None)  # a new process: the memo answers
    assert registry._path_facts()[0] is False
    # A distribution installed: its folder changes the directory, so the path is read again.
    time.sleep(0.05)  # past the file system clock's tick
    dist = site / "vendor_nn-1.0.dist-info"
    dist.mkdir()
    (dist / "entry_points.txt").write_text(f"[{registry.PLUGIN_GROUP}]\nv = vendor_nn:make\n")
    monkeypatch.undo()
    monkeypatch.setenv("NNHAL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(sys, "path", [str(site)])
    monkeypatch.setattr(registry, "_facts", None)
    monkeypatch.setattr(registry, "RACY_NS", 0)
    assert registry._path_facts()[0] is True
    monkeypatch.setattr(registry, "_facts", None)
    monkeypatch.setattr(registry, "_maybe_plugins", looked)
    assert registry._path_facts()[0] is True  # remembered in turn
