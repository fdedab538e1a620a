"""The devices nnhal can open by name, for the Session, the runtime and the commands.

Drivers are discovered, not hard-wired: the reference driver always, the LiteRT driver (its
probe says why not when ``ai-edge-litert`` is missing), and every entry point of the group
``nnhal.drivers`` of the installed distributions. A plug-in's entry point names a factory
(``name = "package.module:factory"``): a callable returning an IDevice, optionally with a
``probe`` attribute returning None or the reason the device cannot run. Plug-ins are loaded
lazily (the group is read on the first listing, the module imported only when the device is
probed or opened), and one that fails to import or is not callable is listed as unavailable
with the reason, never an import error. A built-in name is never replaced by a plug-in.

A factory may return a canonical :class:`nnhal.hal.IDevice` or a driver written against the
AIDL interfaces (:class:`nnhal.aidl.IDevice`), which is opened through
:func:`nnhal.aidl.from_aidl`: everything that opens devices here (the runtime, ``nnhal serve``,
the C library, the tools) takes either kind as it is.

Each entry is a factory plus an availability probe, both called only when asked: a driver that
needs an optional package (a LiteRT-backed one needs ``ai-edge-litert``) registers a probe that
returns the reason it cannot run instead of failing at import, so listing devices never
imports what is not installed.

The reference and LiteRT devices opened here authenticate their compilation caches with the
per-user key file (:func:`nnhal.drivers.common.device.default_key_file`), so what they cache
outlives the process (the Session cache restores from it).
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nnhal import aidl
from nnhal.errors import NnhalError
from nnhal.hal.interfaces import IDevice
from nnhal.ops import extensions

#: A probe returns None when the device can be opened, else the reason (one line) it cannot.
Probe = Callable[[], "str | None"]


@dataclass(frozen=True)
class _Entry:
    factory: Callable[[], IDevice | aidl.IDevice]
    probe: Probe | None = None
    #: Whether the runtime lists the device without being asked (``runtime_names``); called
    #: before the probe, so a device that costs much to load can stay out cheaply.
    listed: Callable[[], bool] | None = None


@dataclass(frozen=True)
class _PluginEntry(_Entry):
    plugin: Any = None

    @classmethod
    def of(cls, ep: Any) -> _PluginEntry:
        p = _Plugin(ep)
        return cls(p.factory, p.probe, plugin=p)


_DEVICES: dict[str, _Entry] = {}


#: Name prefixes whose devices a module resolves, loaded on demand like a plug-in (by name,
#: never imported here): ``remote:PATH`` and ``remote:NAME`` are driver services
#: (nnhal.service.discovery: ``open_remote(name)``, ``remote_reason(name)``,
#: ``remote_names()``).
PREFIXES = {"remote:": "nnhal.service.discovery"}


def _prefix_module(name: str) -> Any:
    for prefix, module in PREFIXES.items():
        if name.startswith(prefix):
            return importlib.import_module(module)
    return None


def _prefixed_entry(name: str) -> _Entry | None:
    try:
        module = _prefix_module(name)
    except ImportError:
        return None
    if module is None:
        return None
    return _Entry(lambda: module.open_remote(name), lambda: module.remote_reason(name))


def lookup(name: str) -> bool:
    """Whether ``name`` names a device: registered, or of a resolvable prefix (``remote:``)."""
    discover()
    if name in _DEVICES:
        return True
    return _prefixed_entry(name) is not None


def reason(name: str) -> str | None:
    """None when device ``name`` can be opened, else why not (an unknown name included)."""
    discover()
    entry = _DEVICES.get(name) or _prefixed_entry(name)
    if entry is None:
        return f"unknown device '{name}'; devices: {', '.join(_DEVICES)}"
    return _reason(entry)


def register(name: str, factory: Callable[[], IDevice | aidl.IDevice],
             probe: Probe | None = None, listed: Callable[[], bool] | None = None) -> None:
    """Make ``name`` openable; ``factory`` and ``probe`` are called lazily (replaces an entry
    of the same name). The factory may make a canonical or an AIDL device. ``listed`` (default:
    always) says whether the runtime's default device list includes it."""
    _DEVICES[name] = _Entry(factory, probe, listed)


#: The entry-point group of plug-in drivers.
PLUGIN_GROUP = "nnhal.drivers"
_discovered = False


def discover(force: bool = False) -> None:
    """Register the plug-ins of :data:`PLUGIN_GROUP` (once; ``force`` reads them again)."""
    global _discovered
    if _discovered and not force:
        return
    _discovered = True
    try:
        maybe = _maybe_plugins() if force else _path_facts()[0]
        eps = importlib.metadata.entry_points(group=PLUGIN_GROUP) if maybe else ()
    except Exception:  # noqa: BLE001 - broken metadata: no plug-ins
        return
    for ep in eps:
        if ep.name in _DEVICES and not isinstance(_DEVICES[ep.name], _PluginEntry):
            continue
        _DEVICES[ep.name] = _PluginEntry.of(ep)
    _discover_services()


def _maybe_plugins(group: str = PLUGIN_GROUP) -> bool:
    """Whether a distribution on ``sys.path`` may declare an entry point of ``group`` (by
    default :data:`PLUGIN_GROUP`): False only when no ``entry_points.txt`` of a directory on
    the path names the group. ``importlib.metadata`` parses every installed distribution's
    entry points (milliseconds with a hundred installed, on every process's first device
    listing); this reads the files as bytes and looks for the name. Anything it does not
    read the way ``importlib.metadata`` would (a zip or an egg on the path, a finder of
    distributions other than the standard one) answers True: the full scan then decides."""
    from importlib.machinery import PathFinder

    if any(f is not PathFinder and hasattr(f, "find_distributions") for f in sys.meta_path):
        return True
    needle = group.encode()
    for entry in sys.path:
        if not isinstance(entry, str):
            return True
        try:
            listing = os.scandir(entry or ".")
        except NotADirectoryError:  # a zip file on the path
            return True
        except OSError:  # absent or unreadable: importlib.metadata finds nothing there either
            continue
        with listing:
            for e in listing:
                low = e.name.lower()
                if low.endswith(".egg"):
                    return True
                if not low.endswith((".dist-info", ".egg-info")):
                    continue
                try:
                    with open(os.path.join(e.path, "entry_points.txt"), "rb") as f:
                        if needle in f.read():
                            return True
                except (FileNotFoundError, NotADirectoryError):
                    continue
                except OSError:
                    return True
    return False


#: The file, in nnhal's per-user cache, remembering what the look along ``sys.path`` found.
PATH_MEMO = "path-facts.json"


def _path_state() -> list[Any] | None:
    """What the answers of :func:`_maybe_plugins` and :func:`_xla_listed` depend on: every
    ``sys.path`` entry with its directory's identity and modification time (installing or
    removing a distribution or a module creates or deletes an entry there, which changes the
    time), and the import system's finders. None when an entry is not a plain string."""
    kinds = [f if isinstance(f, type) else type(f) for f in sys.meta_path]
    state: list[Any] = [[f"{k.__module__}.{k.__qualname__}" for k in kinds]]
    for entry in sys.path:
        if not isinstance(entry, str):
            return None
        try:
            st = os.stat(entry or ".")
        except OSError:
            state.append([entry])
            continue
        state.append([entry, st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns])
    return state


_facts: tuple[bool, bool, bool] | None = None
#: The ``sys.path`` entries ``_facts`` answers for.
_facts_path: list[Any] = []
#: A directory whose times are this recent is not remembered (see _remembered_facts).
RACY_NS = 2_000_000_000


def _path_facts() -> tuple[bool, bool, bool]:
    """(:func:`_maybe_plugins`, :func:`_xla_listed`, :func:`_maybe_plugins` of extensions'
    group :data:`nnhal.ops.extensions.PLUGIN_GROUP`): asked once per process, and remembered
    across processes while every directory on ``sys.path`` is unchanged (:func:`_path_state`):
    together they read about a hundred files (about 1 ms) on every process's first device
    listing. An installer adds or removes a distribution's ``.dist-info`` folder and never
    edits one in place, so a changed installation changes a directory on the path;
    ``discover(force=True)`` looks again regardless. The memo lives in nnhal's private
    per-user cache; any trouble reading or writing it just means looking. Asked again when
    ``sys.path`` is another list than when it was asked (:func:`look_along_path` asks it as
    ``nnhal.session`` is imported)."""
    global _facts, _facts_path
    if _facts is None or _facts_path != sys.path:
        _facts_path = list(sys.path)
        _facts = _remembered_facts()
    return _facts


def extension_plugins_possible() -> bool:
    """Whether a distribution on the path may declare an extension plug-in: False lets
    :func:`nnhal.ops.extensions.discover` skip ``importlib.metadata``'s parse of every
    installed distribution (milliseconds, on the first open of a model an extension
    claims an operator of), remembered with the drivers' look (:func:`_path_facts`)."""
    return _path_facts()[2]


extensions.plugins_possible = extension_plugins_possible  # lent to extension discovery


def look_along_path() -> None:
    """Ask :func:`_path_facts` now (importing ``nnhal.session`` does, as it loads the drivers
    and their engines), so that a Session's first device listing finds the answer known
    (about 0.2 ms: the memo read and a stat of each ``sys.path`` entry)."""
    try:
        _path_facts()
    except Exception:  # noqa: BLE001 - asked again, and reported, where it is needed
        pass


def _remembered_facts() -> tuple[bool, bool, bool]:
    import json

    from nnhal.core.native import cache_root, check_private_dir, write_replacing

    state = _path_state()
    try:
        memo = cache_root() / PATH_MEMO if state is not None else None
    except RuntimeError:  # no home directory
        memo = None
    if memo is not None:
        try:
            with open(memo, "rb") as f:
                rec = json.loads(f.read())
            if rec["state"] == state:
                return bool(rec["plugins"]), bool(rec["xla"]), bool(rec["extensions"])
        except Exception:  # noqa: BLE001 - absent, unreadable or stale: look
            pass
    facts = _maybe_plugins(), _xla_listed(), _maybe_plugins(extensions.PLUGIN_GROUP)
    # A directory changed within the clock's tick of now could change again keeping its times.
    recent = time.time_ns() - RACY_NS
    if memo is None or any(len(e) > 1 and max(e[3], e[4]) > recent for e in state[1:]) or \
            check_private_dir(memo.parent) is not None:
        return facts
    try:
        write_replacing(memo, json.dumps({"state": state, "plugins": facts[0],
                                          "xla": facts[1], "extensions": facts[2]}).encode())
    except OSError:
        pass
    return facts


def _discover_services() -> None:
    """Services registered in the runtime directory, as ``remote:NAME`` devices."""
    try:
        module = importlib.import_module(PREFIXES["remote:"])
        names = module.remote_names()
    except Exception:  # noqa: BLE001 - an unreadable runtime directory: no services
        return
    for name in names:
        if name not in _DEVICES:
            _DEVICES[name] = _prefixed_entry(name)  # type: ignore[assignment]


class _Plugin:
    """One entry point, imported on first use; the reason it cannot be used, if any."""

    def __init__(self, ep: Any):
        self.ep = ep
        self.loaded: Any = None
        self.error: str | None = None

    def load(self) -> Any:
        if self.loaded is None and self.error is None:
            try:
                obj = self.ep.load()
            except BaseException as e:  # noqa: BLE001 - a broken plug-in is unavailable
                self.error = f"plug-in {self.ep.value} failed to load: {type(e).__name__}: {e}"
                return None
            if not callable(obj):
                self.error = f"plug-in {self.ep.value} is not a callable factory"
                return None
            self.loaded = obj
        return self.loaded

    def probe(self) -> str | None:
        obj = self.load()
        if obj is None:
            return self.error
        probe = getattr(obj, "probe", None)
        return probe() if callable(probe) else None

    def factory(self) -> IDevice | aidl.IDevice:
        obj = self.load()
        if obj is None:
            raise NnhalError(self.error or "plug-in failed to load")
        return obj()


def device_names() -> list[str]:
    """Every registered device name, available or not, in registration order (built-ins
    first, then plug-ins)."""
    discover()
    return list(_DEVICES)


def _reason(entry: _Entry) -> str | None:
    if entry.probe is None:
        return None
    try:
        return entry.probe()
    except Exception as e:  # noqa: BLE001 - a probe that breaks means "not available"
        return f"{type(e).__name__}: {e}"


def available() -> dict[str, str | None]:
    """{name: None if it can be opened, else the reason it cannot}."""
    discover()
    return {name: _reason(entry) for name, entry in _DEVICES.items()}


def runtime_names() -> list[str]:
    """The devices the runtime lists unless told otherwise: every available one that does not
    keep itself out (``listed``)."""
    discover()
    names = []
    for name, entry in _DEVICES.items():
        try:
            if entry.listed is not None and not entry.listed():
                continue
        except Exception:  # noqa: BLE001 - a predicate that breaks keeps its device out
            continue
        if _reason(entry) is None:
            names.append(name)
    return names


def open_device(name: str) -> IDevice:
    """A new device object (the caller closes it, if it has ``close``); NnhalError naming the
    known devices for an unknown name, or the reason for an unavailable one."""
    discover()
    entry = _DEVICES.get(name) or _prefixed_entry(name)
    if entry is None:
        raise NnhalError(f"unknown device '{name}'; devices: {', '.join(_DEVICES)}")
    why = _reason(entry)
    if why is not None:
        raise NnhalError(f"device '{name}' is not available: {why}")
    try:
        device = entry.factory()
        if isinstance(device, aidl.IDevice):
            device = aidl.from_aidl(device)
    except (NnhalError, ImportError) as e:
        raise NnhalError(f"device '{name}' is not available: {e}") from None
    except Exception as e:  # noqa: BLE001 - a factory that breaks: the device is unavailable
        raise NnhalError(f"device '{name}' is not available: {type(e).__name__}: {e}") \
            from None
    if not isinstance(device, IDevice):
        raise NnhalError(f"device '{name}' is not available: its factory returned "
                         f"{type(device).__name__}, not an IDevice (nnhal.hal or nnhal.aidl)")
    return device


def _reference() -> IDevice:
    from nnhal.drivers.common.device import default_key_file
    from nnhal.drivers.reference import ReferenceDevice

    return ReferenceDevice(cache_key_file=default_key_file())


register("reference", _reference)


def _litert() -> IDevice:
    from nnhal.drivers.common.device import default_key_file
    from nnhal.drivers.litert import LiteRTDevice

    return LiteRTDevice(cache_key_file=default_key_file())


def _litert_unavailable() -> str | None:
    from nnhal.drivers.litert import unavailable

    return unavailable()


register("litert", _litert, _litert_unavailable)


def _xla() -> IDevice:
    from nnhal.drivers.common.device import default_key_file
    from nnhal.drivers.xla import XlaDevice

    return XlaDevice(cache_key_file=default_key_file())


def _xla_unavailable() -> str | None:
    from nnhal.drivers.xla import unavailable

    return unavailable()


#: JAX's accelerator plug-ins (installed beside jaxlib for CUDA, ROCm or TPU).
_JAX_ACCELERATORS = ("jax_plugins", "jax_cuda12_plugin", "jax_cuda13_plugin", "libtpu")


@functools.cache
def _xla_listed() -> bool:
    """On a CPU, XLA runs slower than LiteRT and no faster than the reference, and loading JAX
    costs about a second: the runtime lists it only where JAX has an accelerator plug-in
    (``--device xla``, ``devices=["xla"]`` and ``$NNHAL_DEVICES`` still reach it). Asked once
    per process (plug-ins installed while it runs are not looked for again), and remembered
    across processes with the plug-ins' look (:func:`_path_facts`)."""
    import importlib.util

    return any(importlib.util.find_spec(m) is not None for m in _JAX_ACCELERATORS)


def _xla_listed_here() -> bool:
    """:func:`_xla_listed` as remembered with the plug-ins' look (:func:`_path_facts`)."""
    return _path_facts()[1]


register("xla", _xla, _xla_unavailable, _xla_listed_here)
