"""Vendor extensions as plug-ins: operand types and operations of a vendor's own, as data.

The HAL carries an extension by name and prefix (a model's ``extensionNameToPrefix``; an
extension operand or operation type is the prefix << 16 | its code within the extension) and
by what a driver reports (``getSupportedExtensions``: each operand type's code, whether it is a
tensor, its byte size). What nnhal adds is the extension *itself*, declared once as data, like
the HAL's own operations (:mod:`nnhal.ops.signature`):

* :class:`OperandTypeDef`: a code, a name, scalar or tensor, the bytes of one value or element,
  the numpy type kernels see, and the extension data (``extraParams.extension``) it carries:
  exactly ``params_size`` bytes, checked by ``check_params`` when given.
* :class:`ExtensionOperation`: a code, a name, a :class:`~nnhal.ops.signature.Signature`
  whose slots may name extension operand types, and a definition with ``validate``,
  ``prepare`` and ``kernel`` as every HAL operation has (:mod:`nnhal.ops.resolver`).

Installed distributions provide extensions through the entry-point group :data:`PLUGIN_GROUP`
(``name = "package.module:attribute"``, the attribute an :class:`ExtensionDef` or a callable
returning one), read lazily as drivers are (:mod:`nnhal.drivers.registry`); :func:`register`
adds one in process. A driver offers an extension by listing it in ``getSupportedExtensions``
and claiming its operations; the runtime learns what devices report (:func:`declare`), which
is enough to size and validate operands when the extension itself is not installed here.

The analysis reads this registry through a model's table (:func:`resolve`): an operand of a
prefix the table lacks, of an unknown code of a known extension, or with extension data of the
wrong length is INVALID_ARGUMENT; an operation of an extension this process does not know, of
an unknown code, or whose operands fit none of its signature, is valid but supported by no
one, as upstream's runtime cannot validate extension operations and leaves them to drivers.
"""

from __future__ import annotations

import importlib.metadata
import logging
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nnhal.core.version import FeatureLevel
from nnhal.hal.types import (
    EXTENSION_TYPE_LOW_BITS,
    Extension,
    ExtensionNameAndPrefix,
    ExtensionOperandType,
    ExtensionOperandTypeInformation,
    extension_low,
    extension_prefix,
)
from nnhal.ops.resolver import OperationDef
from nnhal.ops.signature import Signature, Slot, Variant, declaration_problems, sig

log = logging.getLogger("nnhal.extensions")

#: The entry-point group of plug-in extensions (the entry point's name is the extension's).
PLUGIN_GROUP = "nnhal.extensions"
#: Extension::name: lowercase letters, digits, periods and underscores, at least one period.
_NAME = re.compile(r"[a-z0-9_]+(\.[a-z0-9_]+)+")
_CODE_MAX = (1 << EXTENSION_TYPE_LOW_BITS) - 1
#: The extensions nnhal itself ships, registered on first lookup (name -> module, attribute).
SHIPPED = {"org.nnhal.tflite": ("nnhal.extensions.tflite_builtins", "EXTENSION"),
           "com.google.mediapipe": ("nnhal.extensions.mediapipe", "EXTENSION")}


def valid_name(name: object) -> bool:
    """Whether ``name`` is a valid extension name (the 1.2 seed's rule)."""
    return isinstance(name, str) and _NAME.fullmatch(name) is not None


def _element_dtype(byte_size: int) -> np.dtype:
    return np.dtype({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}.get(
        byte_size, f"V{byte_size}"))


@dataclass(frozen=True, eq=False)
class OperandTypeDef:
    """One operand type of an extension (see the module docstring).

    ``params_size``: the exact bytes of ``extraParams.extension`` an operand of this type
    carries (0: none); None leaves them opaque (any length, or none), as for an extension known
    only from a device's report. ``check_params(data)`` returns None or what is wrong.
    """

    extension: str
    code: int
    name: str
    is_tensor: bool
    byte_size: int
    dtype: np.dtype | None = None
    params_size: int | None = 0
    check_params: Callable[[bytes], str | None] | None = None
    doc: str = ""
    #: The TFLite TensorType (schema code, e.g. 8 for COMPLEX64) this type stands for when the
    #: TFLite importer meets a tensor of a type the HAL lacks (None: none).
    tflite: int | None = None

    def __post_init__(self) -> None:
        if self.dtype is None:
            object.__setattr__(self, "dtype", _element_dtype(self.byte_size))
        else:
            object.__setattr__(self, "dtype", np.dtype(self.dtype))

    @property
    def full_name(self) -> str:
        return f"{self.extension}:{self.name}"

    @property
    def is_scalar(self) -> bool:
        return not self.is_tensor

    def params_problem(self, data: bytes | None) -> str | None:
        """None when ``data`` (the operand's extension data, None when it has none) fits."""
        n = 0 if data is None else len(data)
        if self.params_size is not None and n != self.params_size:
            return (f"{self.full_name} takes {self.params_size} bytes of extension data, "
                    f"got {n}")
        if self.check_params is not None and data is not None:
            try:
                return self.check_params(bytes(data))
            except Exception as e:  # noqa: BLE001 - a broken check refuses, never crashes
                return f"{self.full_name}: extension data check failed: {e}"
        return None

    def info(self) -> ExtensionOperandTypeInformation:
        """What a driver reports of it (Extension::OperandTypeInformation)."""
        return ExtensionOperandTypeInformation(self.code, self.is_tensor, self.byte_size)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OperandTypeDef) and \
            (self.extension, self.code) == (other.extension, other.code)

    def __hash__(self) -> int:
        return hash((self.extension, self.code))

    def __repr__(self) -> str:
        return f"OperandTypeDef({self.full_name})"


@dataclass(frozen=True)
class OperationId:
    """An extension operation as a signature and an operation context name it."""

    extension: str
    code: int
    short: str

    @property
    def name(self) -> str:
        return f"{self.extension}:{self.short}"


@dataclass(frozen=True)
class ExtensionOperation:
    """One operation of an extension: its signature (slots may name :class:`OperandTypeDef`s)
    and its definition (``validate``, ``prepare``, ``kernel``). ``tflite`` names the TFLite
    operators it stands for (a builtin code, or a custom operator's name): nnhal's importer
    turns such an operator into this operation (:func:`for_tflite`) with ``tflite_convert``,
    which reads the operator and gives the operation's operands (see
    :mod:`nnhal.tflite.import_ext`; None: the operator's inputs and outputs in order).
    ``tflite_export`` writes the operation back to TFLite: a builtin code (that builtin of
    the operation's operands, no options), the name of a HAL operation of the same operands
    (its export), or a callable given the exporter's operation context
    (:class:`nnhal.tflite.export_context.ExportOpContext`); None: it has no TFLite form, and
    the LiteRT driver does not run it."""

    id: OperationId
    signature: Signature
    definition: OperationDef
    tflite: tuple[int | str, ...] = ()
    tflite_convert: Callable[[Any], Any] | None = None
    tflite_export: int | str | Callable[[Any], None] | None = None


def operation(extension: str, code: int, name: str,
              inputs: Sequence[Slot] | Mapping[str, Sequence[Slot]], outputs: Sequence[Slot],
              definition: OperationDef, variants: Iterable[Variant] = (),
              doc: str = "", tflite: Iterable[int | str] = (),
              tflite_convert: Callable[[Any], Any] | None = None,
              tflite_export: int | str | Callable[[Any], None] | None = None
              ) -> ExtensionOperation:
    """Declare an extension operation (variants default to feature level 3, HAL 1.2, which
    brought extensions)."""
    op_id = OperationId(extension, code, name)
    signature = sig(op_id, inputs, outputs,  # type: ignore[arg-type]
                    list(variants) or [Variant({}, FeatureLevel.V1_2)], doc)
    definition.op_type = op_id  # type: ignore[assignment]
    return ExtensionOperation(op_id, signature, definition, tuple(tflite), tflite_convert,
                              tflite_export)


@dataclass(frozen=True)
class ExtensionDef:
    """A vendor extension: its name, operand types and operations. ``declared`` marks one
    known only from a device's report (operand types without operations)."""

    name: str
    operand_types: tuple[OperandTypeDef, ...] = ()
    operations: tuple[ExtensionOperation, ...] = ()
    doc: str = ""
    declared: bool = False
    _types: dict[int, OperandTypeDef] = field(default_factory=dict, repr=False, compare=False)
    _ops: dict[int, ExtensionOperation] = field(default_factory=dict, repr=False,
                                                compare=False)

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise ValueError(f"extension {self.name!r}: " + "; ".join(problems))
        self._types.update((t.code, t) for t in self.operand_types)
        self._ops.update((o.id.code, o) for o in self.operations)

    def problems(self) -> list[str]:
        """What is wrong with the declaration itself."""
        out = []
        if not valid_name(self.name):
            out.append("the name must be lowercase letters, digits, '_' and '.', with a '.'")
        for kind, codes in (("operand type", [t.code for t in self.operand_types]),
                            ("operation", [o.id.code for o in self.operations])):
            if len(set(codes)) != len(codes):
                out.append(f"an {kind} code is declared twice")
            out += [f"{kind} code {c} is not a uint16" for c in codes
                    if isinstance(c, bool) or not isinstance(c, int) or not 0 <= c <= _CODE_MAX]
        for t in self.operand_types:
            if t.extension != self.name:
                out.append(f"operand type {t.name} belongs to {t.extension!r}")
            if not isinstance(t.byte_size, int) or t.byte_size <= 0:
                out.append(f"operand type {t.name}: byte size {t.byte_size!r}")
            elif t.dtype.itemsize != t.byte_size:
                out.append(f"operand type {t.name}: dtype {t.dtype} is not {t.byte_size} bytes")
        for o in self.operations:
            if o.id.extension != self.name:
                out.append(f"operation {o.id.short} belongs to {o.id.extension!r}")
            out += declaration_problems(o.signature)
        return out

    def operand_type(self, code: int) -> OperandTypeDef | None:
        return self._types.get(int(code))

    def operation(self, code: int) -> ExtensionOperation | None:
        return self._ops.get(int(code))

    def hal(self) -> Extension:
        """The HAL Extension a driver offering it reports."""
        return Extension(self.name, [t.info() for t in sorted(self.operand_types,
                                                              key=lambda t: t.code)])


def from_hal(ext: Extension) -> ExtensionDef:
    """An extension known only from a device's report: its operand types, opaque extension
    data, no operations."""
    types = tuple(OperandTypeDef(ext.name, int(i.type), f"TYPE_{int(i.type)}",
                                 bool(i.is_tensor), int(i.byte_size), params_size=None)
                  for i in ext.operand_types)
    return ExtensionDef(ext.name, types, declared=True)


# ---- the registry ---------------------------------------------------------------------------

_lock = threading.RLock()
_registered: dict[str, ExtensionDef] = {}
_plugins: dict[str, Any] = {}  # name -> entry point, loaded on first lookup
_errors: dict[str, str] = {}
_declared: dict[str, ExtensionDef] = {}
_discovered = False


def register(ext: ExtensionDef) -> None:
    """Make ``ext`` known in this process (replaces one of the same name)."""
    if not isinstance(ext, ExtensionDef):
        raise TypeError(f"not an ExtensionDef: {type(ext).__name__}")
    with _lock:
        _registered[ext.name] = ext


def unregister(name: str) -> None:
    """Forget an extension :func:`register` added (tests)."""
    with _lock:
        _registered.pop(name, None)


def discover(force: bool = False) -> None:
    """Read the entry points of :data:`PLUGIN_GROUP` (once; ``force`` reads them again)."""
    global _discovered
    with _lock:
        if _discovered and not force:
            return
        _discovered = True
        if force:
            _plugins.clear()
            _errors.clear()
        for name, where in SHIPPED.items():
            if name not in _registered:
                try:
                    ext = getattr(importlib.import_module(where[0]), where[1])
                    _registered[name] = ext
                except Exception as e:  # noqa: BLE001 - a broken shipped one is reported
                    _errors[name] = f"shipped extension failed to load: {type(e).__name__}: {e}"
        try:
            eps = importlib.metadata.entry_points(group=PLUGIN_GROUP) if force or \
                _maybe_plugins() else ()
        except Exception:  # noqa: BLE001 - broken metadata: no plug-ins
            return
        for ep in eps:
            _plugins.setdefault(ep.name, ep)


#: Whether a distribution on the path may declare a plug-in of :data:`PLUGIN_GROUP`: lent by
#: :mod:`nnhal.drivers.registry` as it loads (it remembers its look along ``sys.path`` across
#: processes); without it, or when it cannot tell, the full scan decides.
plugins_possible: Callable[[], bool] | None = None


def _maybe_plugins() -> bool:
    look = plugins_possible
    try:
        return look is None or bool(look())
    except Exception:  # noqa: BLE001 - the full scan decides
        return True


def _load(name: str) -> ExtensionDef | None:
    ep = _plugins.get(name)
    if ep is None or name in _errors:
        return None
    try:
        obj = ep.load()
        ext = obj if isinstance(obj, ExtensionDef) else obj()
        if not isinstance(ext, ExtensionDef):
            raise TypeError(f"gave {type(ext).__name__}, not an ExtensionDef")
        if ext.name != name:
            raise ValueError(f"declares {ext.name!r}, not {name!r}")
    except BaseException as e:  # noqa: BLE001 - a broken plug-in is unknown, with a reason
        _errors[name] = f"plug-in {ep.value} failed to load: {type(e).__name__}: {e}"
        log.warning("extension %s: %s", name, _errors[name])
        return None
    _registered[name] = ext
    del _plugins[name]
    return ext


def lookup(name: str) -> ExtensionDef | None:
    """The extension named ``name``: installed (registered or a plug-in), else as a device
    reported it, else None."""
    discover()
    with _lock:
        found = _registered.get(name)
        if found is None and name in _plugins:
            found = _load(name)
        return found or _declared.get(name)


def installed() -> dict[str, str | None]:
    """Every installed extension's name: None when it loads, else why it does not."""
    discover()
    with _lock:
        for name in list(_plugins):
            _load(name)
        out: dict[str, str | None] = {n: None for n in _registered}
        out.update(_errors)
        return out


def for_tflite(operator: int | str) -> tuple[ExtensionDef, ExtensionOperation] | None:
    """The installed extension operation that claims a TFLite operator (a builtin code, or a
    custom operator's name), the first in name order when several do; None when none does."""
    with _lock:
        for name in sorted(installed()):
            ext = _registered.get(name)
            for op in ext.operations if ext is not None else ():
                if operator in op.tflite:
                    return ext, op
    return None


def for_tflite_type(tensor_type: int) -> tuple[ExtensionDef, OperandTypeDef] | None:
    """The installed extension operand type that stands for a TFLite TensorType the HAL
    lacks (first in extension name order), or None."""
    with _lock:
        for name in sorted(installed()):
            ext = _registered.get(name)
            for t in ext.operand_types if ext is not None else ():
                if t.tflite is not None and t.tflite == tensor_type:
                    return ext, t
    return None


def tflite_claims() -> dict[int | str, tuple[ExtensionDef, ExtensionOperation]]:
    """Every TFLite operator (builtin code or custom name) an installed extension claims."""
    out: dict[int | str, tuple[ExtensionDef, ExtensionOperation]] = {}
    with _lock:
        for name in sorted(installed()):
            ext = _registered.get(name)
            for op in ext.operations if ext is not None else ():
                for key in op.tflite:
                    out.setdefault(key, (ext, op))
    return out


def declare(ext: Extension) -> None:
    """What a device reports of an extension, for sizing its operands when the extension is
    not installed here. The installed extension, or else the first report, is kept; a report
    that differs from it is logged (upstream disables such an extension; here the device
    that disagrees is left to refuse what it cannot read)."""
    if not isinstance(getattr(ext, "name", None), str) or not valid_name(ext.name):
        return
    try:
        reported = from_hal(ext)
    except (ValueError, TypeError) as e:
        log.warning("extension %r as a device reports it is unusable: %s", ext.name, e)
        return
    def shape(e: ExtensionDef) -> dict[int, tuple[bool, int]]:
        return {t.code: (t.is_tensor, t.byte_size) for t in e.operand_types}

    with _lock:
        mine = lookup(ext.name)
        if mine is not None and shape(mine) != shape(reported):
            log.warning("devices report extension %s with different operand types; the %s "
                        "one is used", ext.name, "first reported" if mine.declared else
                        "installed")
        if mine is None:
            _declared[ext.name] = reported


# ---- a model's extensions -------------------------------------------------------------------

class ExtensionError(Exception):
    """An operand of an extension type that the model's table or the extension refuses."""


def resolve(table: Iterable[ExtensionNameAndPrefix]) -> dict[int, tuple[str, ExtensionDef | None]]:
    """prefix -> (extension name, its definition or None when this process does not know it)."""
    return {int(e.prefix): (e.name, lookup(e.name)) for e in table}


def resolve_operand_type(raw: int, exts: Mapping[int, tuple[str, ExtensionDef | None]]
                         ) -> ExtensionOperandType | None:
    """The typed extension operand type of value ``raw`` in a model whose table ``exts``
    resolves; None when its extension is unknown here; ExtensionError for a prefix the table
    lacks or a code its extension does not declare."""
    prefix = extension_prefix(raw)
    if prefix not in exts:
        raise ExtensionError(f"extension type {int(raw):#x} has no declared prefix")
    name, ext = exts[prefix]
    if ext is None:
        return None
    tdef = ext.operand_type(extension_low(raw))
    if tdef is None:
        raise ExtensionError(f"extension {name} has no operand type {extension_low(raw)}")
    return ExtensionOperandType(raw, tdef)


def resolve_operation(raw: int, exts: Mapping[int, tuple[str, ExtensionDef | None]]
                      ) -> ExtensionOperation | None:
    """The operation of value ``raw``; None when its extension or its code is unknown here."""
    found = exts.get(extension_prefix(raw))
    if found is None or found[1] is None:
        return None
    return found[1].operation(extension_low(raw))


def operation_name(raw: int, table: Iterable[ExtensionNameAndPrefix]) -> str:
    """A readable name of an extension operation value (for messages)."""
    exts = {int(e.prefix): e.name for e in table}
    name = exts.get(extension_prefix(raw))
    if name is None:
        return f"extension operation {int(raw):#x}"
    ext = lookup(name)
    op = ext.operation(extension_low(raw)) if ext is not None else None
    return op.id.name if op is not None else f"{name}:{extension_low(raw)}"


def describe() -> str:
    """The installed extensions as text (``nnhal ops --extensions``): each operand type and
    operation with its code, and why a plug-in that does not load is unusable."""
    from nnhal.ops.signature import slot_types

    lines = []
    for name, why in sorted(installed().items()):
        if why is not None:
            lines.append(f"{name}: unusable: {why}")
            continue
        ext = lookup(name)
        assert ext is not None
        lines.append(name + (f": {ext.doc}" if ext.doc else ""))
        for t in sorted(ext.operand_types, key=lambda t: t.code):
            data = ("opaque" if t.params_size is None else f"{t.params_size} bytes")
            lines.append(f"  operand type {t.code} {t.name}: "
                         f"{'tensor' if t.is_tensor else 'scalar'} of {t.byte_size}-byte "
                         f"{'elements' if t.is_tensor else 'value'}, extension data {data}")
        for op in sorted(ext.operations, key=lambda o: o.id.code):
            lines.append(f"  operation {op.id.code} {op.id.short}"
                         + (f": {op.signature.doc}" if op.signature.doc else ""))
            for form in op.signature.forms:
                for kind, group in (("input", form.inputs), ("output", op.signature.outputs)):
                    for k, slot in enumerate(group):
                        types = slot_types(slot, op.signature)
                        names = "any" if types is None else " or ".join(
                            getattr(t, "name", str(t)) for t in types)
                        lines.append(f"    {kind} {k} {slot.name}: {names}")
    return "\n".join(lines) if lines else "no extension is installed"
