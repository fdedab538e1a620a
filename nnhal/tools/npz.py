"""The arrays of an .npz given to ``nnhal run --inputs``, read no further than the model needs.

``np.load`` trusts the file: a header may claim any shape (numpy allocates it before reading
a byte), and a deflated member of a few KiB may expand to gigabytes before anything is
checked. Here each member's .npy header (at most :data:`MAX_HEADER` bytes) is read first and
checked against the model's input (dtype, no Python objects, shape and size, by the
Session's own rules), and only then are exactly the bytes that header promises
decompressed, as a stream: a member whose declared size differs from that, or whose stream
does not match its CRC, is refused. Nothing is unpickled. The file is opened without blocking
and must be a regular file (a FIFO would wait for a writer for ever).
"""

from __future__ import annotations

import io
import math
import os
import stat
import struct
import warnings
import zipfile
from collections.abc import Sequence
from typing import IO

import numpy as np

from nnhal.errors import InputError, one_line
from nnhal.session import TensorInfo
from nnhal.session.info import check_shape

#: The most bytes an .npy header may take (numpy writes under 200 for any model input).
MAX_HEADER = 4096
_MAGIC = b"\x93NUMPY"
#: The header-length field per .npy format version (1.0: 2 bytes, 2.0 and 3.0: 4 bytes).
_LENGTH = {(1, 0): "<H", (2, 0): "<I"}


class ArgumentProblem(Exception):
    """Something the user gave that does not fit the model (exit status 2)."""


def open_regular(path: str) -> IO[bytes]:
    """``path`` opened for reading without blocking; ArgumentProblem unless it is a readable
    regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ArgumentProblem(f"{path}: no such file") from None
    except (OSError, ValueError) as e:
        raise ArgumentProblem(f"{path}: cannot open: {_why(e)}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        what = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
        raise ArgumentProblem(f"{path}: {what}, not an .npz file")
    return os.fdopen(fd, "rb")


def read_feeds(path: str, inputs: Sequence[TensorInfo]) -> dict[str, np.ndarray]:
    """The arrays of the .npz at ``path`` by input name (keys: the input names, or ``arr_0``...
    in input order); ArgumentProblem naming the file and what does not fit."""
    with open_regular(path) as f:
        try:
            archive = zipfile.ZipFile(f)
        except Exception as e:  # noqa: BLE001 - anything the zip reader raises: not an .npz
            raise ArgumentProblem(f"{path}: not an .npz file ({one_line(e)})") from None
        with archive:
            members = _members(path, archive)
            mapping = _mapping(path, list(members), inputs)
            by_name = {i.name: i for i in inputs}
            return {name: _read_member(path, archive, members[key], key, by_name[name])
                    for name, key in mapping.items()}


def _members(path: str, archive: zipfile.ZipFile) -> dict[str, zipfile.ZipInfo]:
    members: dict[str, zipfile.ZipInfo] = {}
    for m in archive.infolist():
        if not m.filename.endswith(".npy"):
            raise ArgumentProblem(f"{path}: member '{m.filename}' is not an .npy array")
        key = m.filename[:-4]
        if key in members:
            raise ArgumentProblem(f"{path}: array '{key}' is there twice")
        members[key] = m
    return members


def _mapping(path: str, keys: list[str], inputs: Sequence[TensorInfo]) -> dict[str, str]:
    """Input name -> member key."""
    names = [i.name for i in inputs]
    positional = [f"arr_{k}" for k in range(len(keys))]
    if keys == positional and not set(keys) & set(names):
        if len(keys) != len(names):
            raise ArgumentProblem(f"{path}: {len(keys)} arrays, the model takes {len(names)} "
                                  f"inputs ({', '.join(names)})")
        return dict(zip(names, keys))
    extra = [k for k in keys if k not in names]
    if extra:
        raise ArgumentProblem(f"{path}: key '{extra[0]}' is not an input of the model "
                              f"(inputs: {', '.join(names)})")
    missing = [n for n in names if n not in keys]
    if missing:
        raise ArgumentProblem(f"{path}: no array for input '{missing[0]}'")
    return {n: n for n in names}


def _read_member(path: str, archive: zipfile.ZipFile, member: zipfile.ZipInfo, key: str,
                 info: TensorInfo) -> np.ndarray:
    where = f"{path}: array '{key}'"
    try:
        with archive.open(member) as stream:
            shape, fortran, dtype = _header(stream, where)
            if dtype.hasobject:
                raise ArgumentProblem(f"{where} holds Python objects, which would need "
                                      f"unpickling (refused)")
            if dtype != info.dtype:
                raise ArgumentProblem(f"input '{info.name}' is {dtype}, the model expects "
                                      f"{info.dtype}")
            check_shape(info, shape)
            n = math.prod(shape) * dtype.itemsize
            start = stream.tell()
            if member.file_size != start + n:
                raise ArgumentProblem(f"{where}: the member holds {member.file_size - start} "
                                      f"bytes of data, its header's shape {shape} needs {n}")
            data = stream.read(n)
            if len(data) != n:
                raise ArgumentProblem(f"{where} is truncated ({len(data)} of {n} bytes)")
    except (ArgumentProblem, InputError):
        raise
    except Exception as e:  # noqa: BLE001 - anything the zip or npy reader raises: broken
        raise ArgumentProblem(f"{where} cannot be read: {one_line(e)}") from None
    arr = np.frombuffer(data, dtype)
    return arr.reshape(shape[::-1]).T if fortran else arr.reshape(shape)


def _header(stream: IO[bytes], where: str) -> tuple[tuple[int, ...], bool, np.dtype]:
    """(shape, fortran order, dtype) of the .npy at the stream's start, reading at most
    :data:`MAX_HEADER` bytes of header; the stream is left at the data."""
    magic = stream.read(8)
    if len(magic) != 8 or magic[:6] != _MAGIC:
        raise ArgumentProblem(f"{where} is not an .npy array")
    version = (magic[6], magic[7])
    fmt = _LENGTH.get(version)
    if fmt is None:
        raise ArgumentProblem(f"{where}: .npy format version {version[0]}.{version[1]} is not "
                              f"read (1.0 and 2.0 are)")
    field = stream.read(struct.calcsize(fmt))
    if len(field) != struct.calcsize(fmt):
        raise ArgumentProblem(f"{where} is truncated in its header")
    length = struct.unpack(fmt, field)[0]
    if length > MAX_HEADER:
        raise ArgumentProblem(f"{where}: its header claims {length} bytes, more than the "
                              f"{MAX_HEADER} an array's header needs")
    header = stream.read(length)
    if len(header) != length:
        raise ArgumentProblem(f"{where} is truncated in its header")
    parse = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
        np.lib.format.read_array_header_2_0
    with warnings.catch_warnings():  # a header written by Python 2 warns; it is read all the same
        warnings.simplefilter("ignore")
        shape, fortran, dtype = parse(io.BytesIO(field + header), max_header_size=MAX_HEADER)
    if any(d < 0 for d in shape):
        raise ArgumentProblem(f"{where}: its header claims shape {shape}")
    return tuple(int(d) for d in shape), bool(fortran), np.dtype(dtype)


def _why(e: BaseException) -> str:
    return getattr(e, "strerror", None) or one_line(e)
