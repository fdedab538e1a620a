"""What a Session's inputs and outputs are, and how a feed is checked against one.

The dtype policy (the issue's first complaint was float64 silently read as float32 bytes):

* A numpy array or numpy scalar must have exactly the input's dtype: nothing is cast, so a
  float64 array for a float32 input is an InputError, not a rounded or reinterpreted copy.
* A Python number, list or tuple has no dtype of its own: it is converted to the input's dtype
  when every value survives as a value of that kind: integers within the type's range for
  integer (and quantized) inputs, any real number for float inputs (rounded to float32/float16
  as a literal would be, but never overflowing to infinity), booleans only for bool inputs.
* Shapes: the rank must match and every known dimension must be equal; a dimension the model
  leaves unknown (0) takes the given size, which must not be 0.
* Size: a feed holds at most :data:`MAX_FEED_BYTES`, checked on its shape before any of its
  values is read or copied (a broadcast view may claim terabytes in a few bytes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from nnhal.errors import InputError, NnhalError, one_line
from nnhal.hal.types import Operand, OperandType, is_extension_type

#: The most bytes a feed (and all the feeds of a run together) may hold: the reference
#: driver's default limit on one tensor. A larger feed is an InputError before it is copied.
MAX_FEED_BYTES = 1 << 32

#: A shape as the HAL gives it: 0 for an unknown dimension; None for a tensor of unknown rank.
Shape = tuple[int, ...] | None


@dataclass(frozen=True)
class TensorInfo:
    """One input or output of a Session, as a numpy user needs it.

    ``dtype`` is the stored element type: quantized tensors are their integers (uint8, int8,
    int16, uint16) with ``scale`` and ``zero_point``; bool is ``np.bool_``. ``shape`` uses 0
    for a dimension the model leaves unknown, as the HAL does, and is None for a tensor of
    unknown rank (an empty tuple is a scalar). ``type`` is the HAL operand type.
    """

    name: str
    dtype: np.dtype
    shape: Shape
    scale: float = 0.0
    zero_point: int = 0
    type: OperandType | None = None

    @property
    def fully_known(self) -> bool:
        return self.shape is not None and 0 not in self.shape


def tensor_info(name: str, operand: Operand, extensions: Any = ()) -> TensorInfo:
    """``extensions``: the model's extensionNameToPrefix, for an operand of an extension type
    (its numpy type is the extension's, e.g. complex64 for org.nnhal.tflite's)."""
    t = _operand_type(operand.type, extensions)
    if t.is_scalar:
        shape: Shape = ()
    elif not operand.dimensions:
        shape = None
    else:
        shape = tuple(int(d) for d in operand.dimensions)
    return TensorInfo(name, np.dtype(t.dtype), shape, float(operand.scale),
                      int(operand.zero_point), t)


def _operand_type(raw: int, extensions: Any) -> Any:
    if isinstance(raw, OperandType) or not is_extension_type(int(raw)):
        return OperandType(raw)
    from nnhal.ops import extensions as registry

    try:
        found = registry.resolve_operand_type(int(raw), registry.resolve(extensions))
    except registry.ExtensionError as e:
        raise NnhalError(str(e)) from None
    if found is None:
        raise NnhalError(f"extension operand type {int(raw):#x}: its extension is not "
                         f"installed here")
    return found


def format_shape(shape: Shape) -> str:
    """``(1, ?, 3)``: unknown dimensions as ``?``."""
    if shape is None:
        return "any shape"
    inner = ", ".join(str(d) if d else "?" for d in shape)
    return f"({inner},)" if len(shape) == 1 else f"({inner})"


def check_feed(info: TensorInfo, value: Any) -> np.ndarray:
    """``value`` as an array of ``info``'s dtype and a compatible shape, or InputError naming
    the input and what it expects (see the module's dtype policy). Shape and size are checked
    before any value is read or copied."""
    if isinstance(value, (np.ndarray, np.generic)):
        arr = np.asarray(value)
        if arr.dtype != info.dtype:
            raise InputError(f"input '{info.name}' is {arr.dtype}, the model expects "
                             f"{info.dtype}")
        check_shape(info, arr.shape)
        return arr
    return _from_python(info, value)


def _from_python(info: TensorInfo, value: Any) -> np.ndarray:
    try:
        ref = np.asarray(value)
    except (ValueError, TypeError) as e:
        raise InputError(f"input '{info.name}' is not an array: {one_line(e)}") from None
    want = info.dtype
    kind = ref.dtype.kind
    fits = (kind == "b") if want.kind == "b" else \
        (kind in "iu") if want.kind in "iu" else (kind in "iuf") if want.kind == "f" else False
    if fits:
        check_shape(info, ref.shape)
        if want.kind in "iu":
            fits = ref.size == 0 or (int(ref.min()) >= np.iinfo(want).min
                                     and int(ref.max()) <= np.iinfo(want).max)
        elif want.kind == "f":
            with np.errstate(over="ignore", invalid="ignore"):
                conv = ref.astype(want)
            fits = bool(np.all(np.isfinite(conv) | ~np.isfinite(ref)))
    if not fits:
        what = f"{type(value).__name__} of {ref.dtype} values"
        if want.kind in "iu" and kind in "iu":
            what = f"{type(value).__name__} with values outside {want}'s range"
        raise InputError(f"input '{info.name}' is a {what}, the model expects {want}")
    return ref.astype(want)


def check_shape(info: TensorInfo, shape: tuple[int, ...]) -> None:
    """InputError unless ``shape`` fits ``info`` and holds at most MAX_FEED_BYTES (checked on
    the numbers alone, so a file's header can be checked before its data is read)."""
    want = info.shape
    size = math.prod(shape) * info.dtype.itemsize
    if size > MAX_FEED_BYTES:
        raise InputError(f"input '{info.name}' has shape {tuple(shape)}: {size} bytes, more "
                         f"than the {MAX_FEED_BYTES} a feed may hold")
    if want is None:
        if 0 in shape:
            raise InputError(f"input '{info.name}' has shape {tuple(shape)}: an empty tensor "
                             f"cannot be passed")
        return
    if len(shape) != len(want) or any(w and w != s for w, s in zip(want, shape)):
        raise InputError(f"input '{info.name}' has shape {tuple(shape)}, the model expects "
                         f"{format_shape(want)}")
    if 0 in shape:
        raise InputError(f"input '{info.name}' has shape {tuple(shape)}: an empty tensor "
                         f"cannot be passed")
