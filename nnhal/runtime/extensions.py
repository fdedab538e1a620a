"""The runtime's extension prefixes, and vendor hints as the HAL carries them.

A driver sees an extension's name only through a prefix the runtime assigns (the high bits of
an extension operand or operation type, and of a hint's token), with the table of names and
prefixes beside it (``ExtensionNameAndPrefix``). As upstream's runtime does, prefixes are
assigned once per process, from 1 upwards, to extensions some device supports, so one name
keeps one prefix for every compilation; an extension no device supports has none (BAD_DATA:
no driver could read a hint of it).

The NDK's extension calls (``NeuralNetworksExtensions.h``) read the same prefixes: an
extension operand or operation type is prefix << 16 | its code; an operand type is checked
against what the extension declares (installed here, or as the devices report it: see
:func:`nnhal.ops.extensions.declare`), and a model sent to a driver carries the table of the
prefixes it uses (:func:`table_of`).

Feature level 8's ``addExtensionAttribute`` calls record :class:`Attributes`: each is a
``TokenValuePair`` (token = prefix << 16 | code) with the table entries its tokens use.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import Any

from nnhal.hal.types import (
    EXTENSION_TYPE_LOW_BITS,
    ErrorStatus,
    ExtensionNameAndPrefix,
    ExtensionOperandType,
    TokenValuePair,
    extension_low,
    extension_prefix,
)
from nnhal.ops.extensions import declare, lookup
from nnhal.runtime.codes import ResultCode, as_bytes, fail

#: The largest attribute's data, in bytes (upstream sets none; a hint is metadata, and a
#: length past this from C is a client's mistake, refused before its memory is read).
MAX_ATTRIBUTE_BYTES = 1 << 20
#: The largest prefix: a token is an int32 with the sign bit 0.
MAX_PREFIX = (1 << 15) - 1

_lock = threading.Lock()
_prefixes: dict[str, int] = {}


def supported_extensions(hal: Any) -> list[str]:
    """The names of the extensions a driver says it supports (none when it cannot say); what
    it reports of each is declared to :mod:`nnhal.ops.extensions`, as upstream's TypeManager
    learns extensions from the devices."""
    try:
        status, exts = hal.get_supported_extensions()
        if status != ErrorStatus.NONE:
            return []
        names = []
        for e in exts:
            if isinstance(getattr(e, "name", None), str):
                names.append(e.name)
                declare(e)
        return names
    except Exception:  # noqa: BLE001 - a driver that cannot answer supports nothing
        return []


def name_of(prefix: int) -> str | None:
    """The extension a prefix was assigned to in this process, None when none was."""
    with _lock:
        for name, p in _prefixes.items():
            if p == prefix:
                return name
    return None


def extension_type(name: Any, code: Any, devices: Iterable[Any], what: str) -> int:
    """getExtensionOperandType / getExtensionOperationType: prefix << 16 | code; BAD_DATA for
    an invalid name or code, or an extension no device supports."""
    if not isinstance(name, str) or not name:
        raise fail(ResultCode.BAD_DATA, f"{what}: invalid extension name {name!r}")
    if isinstance(code, bool) or not isinstance(code, int) or \
            not 0 <= code < 1 << EXTENSION_TYPE_LOW_BITS:
        raise fail(ResultCode.BAD_DATA, f"{what}: code {code!r} is not a uint16")
    prefix = prefix_of(name, devices)
    if prefix is None:
        raise fail(ResultCode.BAD_DATA, f"{what}: no device supports extension {name!r}")
    return prefix << EXTENSION_TYPE_LOW_BITS | code


def operand_type_of(raw: int, where: str) -> ExtensionOperandType:
    """The extension operand type of value ``raw`` (a prefix this process assigned, a code its
    extension declares); BAD_DATA otherwise, as upstream's addOperand answers."""
    prefix = extension_prefix(raw)
    name = name_of(prefix)
    ext = None if name is None else lookup(name)
    if ext is None:
        raise fail(ResultCode.BAD_DATA, f"{where}: extension type {raw:#x} has a prefix "
                   f"{prefix} no extension was given")
    tdef = ext.operand_type(extension_low(raw))
    if tdef is None:
        raise fail(ResultCode.BAD_DATA, f"{where}: extension {name} has no operand type "
                   f"{extension_low(raw)}")
    return ExtensionOperandType(raw, tdef)


def is_operation_of_known_prefix(raw: int) -> bool:
    """Whether an extension operation value's prefix was assigned in this process."""
    return name_of(extension_prefix(raw)) is not None


def table_of(prefixes: Iterable[int]) -> list[ExtensionNameAndPrefix]:
    """The extensionNameToPrefix table of the prefixes a model uses, by prefix."""
    out = []
    for p in sorted(set(prefixes)):
        name = name_of(p)
        if name is not None:
            out.append(ExtensionNameAndPrefix(name, p))
    return out


def prefix_of(name: str, devices: Iterable[Any]) -> int | None:
    """The prefix of extension ``name``: the one assigned before, else a new one when one of
    ``devices`` (runtime :class:`~nnhal.runtime.devices.Device`: the runtime's and the
    compilation's) supports it; None otherwise. As upstream, a name any device of the runtime
    supports is valid for every device (a driver ignores hints it does not know)."""
    with _lock:
        found = _prefixes.get(name)
        if found is not None:
            return found
    if not any(name in d.extensions for d in devices):
        return None
    with _lock:
        found = _prefixes.get(name)
        if found is None:
            if len(_prefixes) >= MAX_PREFIX:
                raise fail(ResultCode.OP_FAILED, "addExtensionAttribute: no extension prefix "
                           "left")
            found = _prefixes[name] = len(_prefixes) + 1
        return found


class Attributes:
    """The extension attributes of one compilation or execution: hints for its driver."""

    def __init__(self) -> None:
        self.hints: list[TokenValuePair] = []
        self._table: dict[str, int] = {}

    @staticmethod
    def check_null(name: Any, data: Any, length: int | None, what: str) -> None:
        """UNEXPECTED_NULL, which the NDK answers before any other rule: a NULL name, or NULL
        data with a length."""
        if name is None or (data is None and length not in (None, 0)):
            raise fail(ResultCode.UNEXPECTED_NULL, f"{what}: extensionName or data is NULL")

    def add(self, devices: Sequence[Any], name: Any, code: Any, data: Any,
            length: int | None, what: str) -> None:
        """Record one attribute (the first ``length`` bytes of ``data``, all when None); the
        caller has checked NULLs, the object's state and its devices."""
        if not isinstance(name, str) or not name:
            raise fail(ResultCode.BAD_DATA, f"{what}: invalid extension name {name!r}")
        if isinstance(code, bool) or not isinstance(code, int) or \
                not 0 <= code < 1 << EXTENSION_TYPE_LOW_BITS:
            raise fail(ResultCode.BAD_DATA, f"{what}: attribute code {code!r} is not a uint16")
        try:
            view = as_bytes(b"" if data is None else data)
        except (TypeError, ValueError) as e:
            raise fail(ResultCode.BAD_DATA, f"{what}: data is not a buffer: {e}") from None
        length = view.nbytes if length is None else length
        if isinstance(length, bool) or not isinstance(length, int) or \
                not 0 <= length <= view.nbytes or length > MAX_ATTRIBUTE_BYTES:
            raise fail(ResultCode.BAD_DATA, f"{what}: invalid length {length} (data of "
                       f"{view.nbytes} bytes, at most {MAX_ATTRIBUTE_BYTES})")
        value = bytes(view[:length])
        prefix = prefix_of(name, devices)
        if prefix is None:
            raise fail(ResultCode.BAD_DATA, f"{what}: no device supports extension {name!r}")
        token = prefix << EXTENSION_TYPE_LOW_BITS | code
        if any(h.token == token for h in self.hints):
            raise fail(ResultCode.BAD_DATA, f"{what}: attribute {code} of {name!r} is "
                       f"already set")
        self.hints.append(TokenValuePair(token, value))
        self._table[name] = prefix

    def table(self) -> tuple[ExtensionNameAndPrefix, ...]:
        """The names and prefixes the hints' tokens use."""
        return tuple(ExtensionNameAndPrefix(n, p) for n, p in sorted(self._table.items(),
                                                                    key=lambda kv: kv[1]))
