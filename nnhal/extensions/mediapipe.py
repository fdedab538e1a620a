"""com.google.mediapipe: MediaPipe's three custom TFLite operators as an nnhal extension.

MediaPipe's face landmark model with attention crops three regions (lips, eyes) out of a
feature map by an affine transform estimated from its own first-stage landmarks, refines them,
and maps the refined landmarks back. TFLite has no builtins for these steps, so MediaPipe
registers custom operators (``Landmarks2TransformMatrix``, ``TransformTensorBilinear``,
``TransformLandmarks``); LiteRT's resolver lacks them. Here each becomes an extension operation
whose custom options (a flexbuffers map in the TFLite file) are constant operands, so that a
HAL model carries everything the kernel needs and a driver that does not offer the extension
simply leaves these operations to one that does.

Semantics are those of the operators' version 2 (what MediaPipe's 0.10 models use), computed
in float64 and stored as float32; nnhal refuses inputs MediaPipe would read out of bounds
(landmark indices past the tensor, a batch other than 1) instead of reading garbage:

* LANDMARKS_TO_TRANSFORM_MATRIX(landmarks [1, N, 3], subset [K, 2], left, right,
  target_rotation, output_height, output_width, scale_x, scale_y) -> [1, 4, 4]: the rotation
  that brings the left->right landmark direction to ``target_rotation``; the box around the
  subset's landmarks in that rotated frame (its centre rotated back, its size times the
  scales); the row-major 4x4 matrix taking a pixel (u, v) of an output_width x output_height
  crop to the point centre + R(-rotation) @ (scale_x * w / output_width * (u - output_width/2),
  scale_y * h / output_height * (v - output_height/2)).
* TRANSFORM_LANDMARKS(landmarks [1, N, D], matrix [1, 4, 4]) -> [1, N, D], D 2 or 3: each
  (x, y) through the matrix's top two rows (z taken as 0, w as 1); z passes unchanged.
* TRANSFORM_TENSOR_BILINEAR(input [1, H, W, C], matrix [1, 4, 4], output_height,
  output_width) -> [1, output_height, output_width, C]: output pixel (u, v) samples the input
  at the matrix's image of the pixel centre (u + 0.5, v + 0.5), less 0.5 (align corners);
  bilinear between the four neighbours, zero where that point lies outside [0, W-1] x
  [0, H-1] (or is not a number).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from nnhal.hal.types import ErrorStatus
from nnhal.hal.types import OperandType as T
from nnhal.ops.extensions import ExtensionDef, operation
from nnhal.ops.resolver import OpContext, OperationDef, OpError
from nnhal.ops.signature import Slot

#: The extension's name.
NAME = "com.google.mediapipe"
#: Operation codes within the extension.
LANDMARKS_TO_TRANSFORM_MATRIX = 0
TRANSFORM_LANDMARKS = 1
TRANSFORM_TENSOR_BILINEAR = 2
#: The TFLite custom operators each operation stands for.
TFLITE_NAMES = {
    LANDMARKS_TO_TRANSFORM_MATRIX: "Landmarks2TransformMatrix",
    TRANSFORM_LANDMARKS: "TransformLandmarks",
    TRANSFORM_TENSOR_BILINEAR: "TransformTensorBilinear",
}
#: The largest crop TRANSFORM_TENSOR_BILINEAR makes (each side).
MAX_OUTPUT_SIDE = 1 << 14


def _matrix_rows(m: np.ndarray) -> np.ndarray:
    """The top two rows of a row-major 4x4 matrix, in float64."""
    return np.asarray(m, np.float64).reshape(-1)[:8].reshape(2, 4)


def _check_matrix(ctx: OpContext, index: int) -> None:
    shape = ctx.inputs[index].shape
    if shape is not None and all(shape):
        ctx.require(math.prod(shape) == 16, f"input {index} (the transform matrix) holds "
                    f"{math.prod(shape)} elements, not 16 (a 4x4 matrix)")


def _check_batch_one(ctx: OpContext, index: int) -> None:
    d = ctx.dim(index, 0)
    ctx.require(d is None or d == 1, f"input {index} has batch {d}; MediaPipe's operator "
                "reads batch 0 alone, so nnhal takes batch 1 only")


# ---- LANDMARKS_TO_TRANSFORM_MATRIX ----------------------------------------------------------

def landmarks_to_transform_matrix(landmarks: np.ndarray, subset: np.ndarray, left: int,
                                  right: int, target_rotation: float, output_height: int,
                                  output_width: int, scale_x: float, scale_y: float
                                  ) -> np.ndarray:
    """The [1, 4, 4] float32 matrix (see the module docstring); indices already checked."""
    pts = np.asarray(landmarks, np.float64).reshape(-1, 3)
    d = pts[right, :2] - pts[left, :2]
    rotation = target_rotation - math.atan2(d[1], d[0])
    c, s = math.cos(rotation), math.sin(rotation)
    xy = pts[np.asarray(subset).reshape(-1), :2]
    rot = np.array([[c, -s], [s, c]])
    turned = xy @ rot.T
    lo, hi = turned.min(axis=0), turned.max(axis=0)
    width, height = hi - lo
    centre = rot.T @ ((lo + hi) / 2)  # R(-rotation) is R(rotation) transposed
    sx = scale_x * width / output_width
    sy = scale_y * height / output_height
    out = np.zeros((4, 4))
    # centre + R(-rotation) @ diag(sx, sy) @ (p - (output_width/2, output_height/2))
    lin = rot.T @ np.diag([sx, sy])
    out[:2, :2] = lin
    out[:2, 3] = centre - lin @ np.array([output_width / 2, output_height / 2])
    out[2, 2] = out[3, 3] = 1.0
    with np.errstate(invalid="ignore", over="ignore"):
        return out.astype(np.float32).reshape(1, 4, 4)


class LandmarksToTransformMatrix(OperationDef):
    """A crop's affine transform from landmarks (MediaPipe's Landmarks2TransformMatrix v2)."""

    def validate(self, ctx: OpContext) -> None:
        ctx.expect_rank(0, 3)
        _check_batch_one(ctx, 0)
        d = ctx.dim(0, 2)
        ctx.require(d is None or d == 3, f"landmarks have {d} values each, not 3 (x, y, z)")
        subset = ctx.const(1)
        ctx.require(subset is not None, "the subset must be a constant")
        subset = np.asarray(subset)
        ctx.require(subset.ndim == 2 and subset.shape[1] == 2 and subset.shape[0] > 0,
                    f"the subset must be a non-empty [K, 2] tensor, got {list(subset.shape)}")
        ints = [ctx.const_int(i) for i in (2, 3, 5, 6)]
        floats = [ctx.const_float(i) for i in (4, 7, 8)]
        ctx.require(None not in ints and None not in floats, "every parameter after the "
                    "landmarks must be a constant")
        left, right, oh, ow = ints
        _, scale_x, scale_y = floats
        ctx.require(oh > 0 and ow > 0, f"output size {oh}x{ow} must be positive")  # type: ignore[operator]
        ctx.require(all(math.isfinite(v) for v in floats),  # type: ignore[arg-type]
                    "target rotation and scales must be finite")
        ctx.require(scale_x > 0 and scale_y > 0,  # type: ignore[operator]
                    f"scales {scale_x}, {scale_y} must be positive")
        idx = [left, right, *(int(v) for v in subset.reshape(-1))]
        ctx.require(min(idx) >= 0, f"landmark index {min(idx)} is negative")  # type: ignore[type-var]
        n = ctx.dim(0, 1)
        ctx.require(n is None or max(idx) < n,  # type: ignore[type-var,operator]
                    f"landmark index {max(idx)} is past the {n} landmarks")  # type: ignore[type-var]
        ctx.expect_rank(0, 3, output=True)

    def prepare(self, ctx: OpContext) -> list[tuple[int, ...] | None]:
        return [(1, 4, 4)]

    def kernel(self, ctx: OpContext):  # type: ignore[no-untyped-def]
        subset = np.asarray(ctx.const(1)).reshape(-1).astype(np.int64)
        left, right, oh, ow = (int(ctx.const_int(i) or 0) for i in (2, 3, 5, 6))
        target, sx, sy = (float(ctx.const_float(i) or 0.0) for i in (4, 7, 8))
        top = max(left, right, int(subset.max()))

        def run(ins, rt):  # type: ignore[no-untyped-def]
            lm = ins[0]
            if lm.ndim != 3 or lm.shape[0] != 1 or lm.shape[2] != 3 or lm.shape[1] <= top:
                raise OpError(f"{NAME}:LANDMARKS_TO_TRANSFORM_MATRIX: landmarks of shape "
                              f"{list(lm.shape)} do not hold landmark {top}",
                              ErrorStatus.INVALID_ARGUMENT)
            return [landmarks_to_transform_matrix(lm, subset, left, right, target, oh, ow,
                                                  sx, sy)]
        return run


# ---- TRANSFORM_LANDMARKS --------------------------------------------------------------------

def transform_landmarks(landmarks: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    """Landmarks [1, N, D] through the matrix (see the module docstring), float32."""
    lm = np.asarray(landmarks)
    rows = _matrix_rows(matrix)
    out = lm.astype(np.float32, copy=True)
    xy = lm[..., :2].astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        out[..., :2] = xy @ rows[:, :2].T + rows[:, 3]
    return out


class TransformLandmarks(OperationDef):
    """Landmarks through an affine matrix (MediaPipe's TransformLandmarks v2)."""

    def validate(self, ctx: OpContext) -> None:
        ctx.expect_rank(0, 3)
        _check_batch_one(ctx, 0)
        d = ctx.dim(0, 2)
        ctx.require(d is None or d in (2, 3), f"landmarks have {d} values each, not 2 or 3")
        _check_matrix(ctx, 1)
        ctx.expect_rank(0, 3, output=True)

    def prepare(self, ctx: OpContext) -> list[tuple[int, ...] | None]:
        shape = ctx.inputs[0].shape
        return [tuple(shape) if shape is not None and all(shape) else None]

    def kernel(self, ctx: OpContext):  # type: ignore[no-untyped-def]
        def run(ins, rt):  # type: ignore[no-untyped-def]
            lm, m = ins
            if lm.ndim != 3 or lm.shape[0] != 1 or lm.shape[2] not in (2, 3) or m.size != 16:
                raise OpError(f"{NAME}:TRANSFORM_LANDMARKS: landmarks {list(lm.shape)} and "
                              f"matrix {list(m.shape)} do not fit", ErrorStatus.INVALID_ARGUMENT)
            return [transform_landmarks(lm, m)]
        return run


# ---- TRANSFORM_TENSOR_BILINEAR --------------------------------------------------------------

def transform_tensor_bilinear(data: np.ndarray, matrix: np.ndarray, output_height: int,
                              output_width: int) -> np.ndarray:
    """The [1, output_height, output_width, C] float32 crop (see the module docstring)."""
    img = np.asarray(data, np.float64)[0]
    h, w, ch = img.shape
    rows = _matrix_rows(matrix)
    v, u = np.meshgrid(np.arange(output_height, dtype=np.float64) + 0.5,
                       np.arange(output_width, dtype=np.float64) + 0.5, indexing="ij")
    with np.errstate(invalid="ignore", over="ignore"):
        x = rows[0, 0] * u + rows[0, 1] * v + rows[0, 3] - 0.5
        y = rows[1, 0] * u + rows[1, 1] * v + rows[1, 3] - 0.5
        inside = (x >= 0) & (x <= w - 1) & (y >= 0) & (y <= h - 1)  # False for NaN
    x = np.where(inside, x, 0.0)
    y = np.where(inside, y, 0.0)
    x0, y0 = np.floor(x), np.floor(y)
    fx, fy = (x - x0)[..., None], (y - y0)[..., None]
    xi, yi = x0.astype(np.intp), y0.astype(np.intp)
    # One zero row and column past the edge: a point on the last row or column reads its
    # neighbour there with weight 0, as MediaPipe reads a zero.
    padded = np.zeros((h + 1, w + 1, ch))
    padded[:h, :w] = img
    q11, q21 = padded[yi, xi], padded[yi, xi + 1]
    q12, q22 = padded[yi + 1, xi], padded[yi + 1, xi + 1]
    with np.errstate(invalid="ignore", over="ignore"):
        top = (1 - fx) * q11 + fx * q21
        bottom = (1 - fx) * q12 + fx * q22
        out = fy * bottom + (1 - fy) * top
    out[~inside] = 0.0
    return out.astype(np.float32)[None]


class TransformTensorBilinear(OperationDef):
    """A bilinear affine crop of a feature map (MediaPipe's TransformTensorBilinear v2)."""

    def validate(self, ctx: OpContext) -> None:
        ctx.expect_rank(0, 4)
        _check_batch_one(ctx, 0)
        _check_matrix(ctx, 1)
        oh, ow = ctx.const_int(2), ctx.const_int(3)
        ctx.require(oh is not None and ow is not None, "the output size must be constants")
        ctx.require(0 < oh <= MAX_OUTPUT_SIDE and 0 < ow <= MAX_OUTPUT_SIDE,  # type: ignore[operator]
                    f"output size {oh}x{ow} must be in [1, {MAX_OUTPUT_SIDE}]")
        ctx.expect_rank(0, 4, output=True)
        out = ctx.outputs[0].shape
        if out is not None and len(out) == 4:
            for axis, want in ((1, oh), (2, ow), (3, ctx.dim(0, 3))):
                ctx.require(not out[axis] or want is None or out[axis] == want,
                            f"output dimension {axis} is {out[axis]}, not {want}")

    def prepare(self, ctx: OpContext) -> list[tuple[int, ...] | None]:
        c = ctx.dim(0, 3)
        return [None if c is None else (1, int(ctx.const_int(2) or 0),
                                        int(ctx.const_int(3) or 0), c)]

    def kernel(self, ctx: OpContext):  # type: ignore[no-untyped-def]
        oh, ow = int(ctx.const_int(2) or 0), int(ctx.const_int(3) or 0)

        def run(ins, rt):  # type: ignore[no-untyped-def]
            data, m = ins[0], ins[1]
            if data.ndim != 4 or data.shape[0] != 1 or m.size != 16:
                raise OpError(f"{NAME}:TRANSFORM_TENSOR_BILINEAR: input {list(data.shape)} "
                              f"and matrix {list(m.shape)} do not fit",
                              ErrorStatus.INVALID_ARGUMENT)
            return [transform_tensor_bilinear(data, m, oh, ow)]
        return run


# ---- the TFLite operators ----------------------------------------------------------------

def tflite_options(code: int, options: dict[str, Any]) -> list[tuple[T, Any]]:
    """The constant operands (type, value) after the tensor inputs that stand for a
    MediaPipe operator's custom options (a decoded flexbuffers map); ValueError names what
    is missing or malformed (version 1's options lack version 2's keys)."""
    def get(key: str, kind: type) -> Any:
        if key not in options:
            raise ValueError(f"{TFLITE_NAMES[code]}: custom option {key!r} is missing (nnhal "
                             "takes the operator's version 2)")
        try:
            return kind(options[key])
        except (TypeError, ValueError) as e:
            raise ValueError(f"{TFLITE_NAMES[code]}: custom option {key!r}: {e}") from None

    if code == LANDMARKS_TO_TRANSFORM_MATRIX:
        flat = [int(v) for v in get("subset_idxs", list)]
        if not flat:
            raise ValueError(f"{TFLITE_NAMES[code]}: custom option 'subset_idxs' is empty")
        if len(flat) % 2:  # MediaPipe pairs an odd last index with itself
            flat.append(flat[-1])
        return [(T.TENSOR_INT32, np.array(flat, np.int32).reshape(-1, 2)),
                (T.INT32, get("left_rotation_idx", int)),
                (T.INT32, get("right_rotation_idx", int)),
                (T.FLOAT32, get("target_rotation_radians", float)),
                (T.INT32, get("output_height", int)),
                (T.INT32, get("output_width", int)),
                (T.FLOAT32, get("scale_x", float)),
                (T.FLOAT32, get("scale_y", float))]
    if code == TRANSFORM_TENSOR_BILINEAR:
        return [(T.INT32, get("output_height", int)), (T.INT32, get("output_width", int))]
    return []


def _decode(raw: bytes) -> dict[str, Any]:
    if not raw:
        return {}
    from flatbuffers import flexbuffers  # the TFLite schema binding's dependency

    try:
        found = flexbuffers.Loads(raw)
    except Exception as e:  # noqa: BLE001 - malformed options are refused, with the reason
        raise ValueError(f"custom options are not a flexbuffers map: {e}") from None
    if not isinstance(found, dict):
        raise ValueError(f"custom options are a flexbuffers {type(found).__name__}, not a map")
    return found


def _converter(code: int, ranks: tuple[int, ...]) -> Callable[[Any], Any]:
    """The importer's conversion of one operator (see :mod:`nnhal.tflite.import_ext`)."""
    def convert(call: Any) -> tuple[list[int], list[int]]:
        call.expect(len(ranks), 1)
        for k, rank in enumerate(ranks):
            t = call.tensor(k)
            if t is None:
                raise call.refuse(f"input {k} is omitted")
            if t.has_rank and len(t.shape) != rank:
                raise call.refuse(f"input {k} has rank {len(t.shape)}, not {rank} "
                                  "(nnhal takes the operator's version 2)")
        try:
            extra = tflite_options(code, _decode(call.custom_options))
        except (ValueError, TypeError, OverflowError) as e:  # malformed values too
            raise call.refuse(str(e) or type(e).__name__) from None
        ins = [call.input(k) for k in range(len(ranks))]
        for type_, value in extra:
            ins.append(call.constant(type_, value) if type_ == T.TENSOR_INT32
                       else call.scalar(type_, value))
        return ins, [call.output(0)]
    return convert


# ---- the extension --------------------------------------------------------------------------

_F32 = (T.TENSOR_FLOAT32,)
_MATRIX = Slot("matrix", _F32, doc="a row-major 4x4 affine transform, [1, 4, 4]")

L2TM = operation(
    NAME, LANDMARKS_TO_TRANSFORM_MATRIX, "LANDMARKS_TO_TRANSFORM_MATRIX",
    [Slot("landmarks", _F32, doc="[1, N, 3]: x, y, z of N landmarks"),
     Slot("subset", (T.TENSOR_INT32,), const=True,
          doc="[K, 2]: pairs of landmark indices whose box the crop covers"),
     Slot("left_rotation_idx", (T.INT32,), const=True),
     Slot("right_rotation_idx", (T.INT32,), const=True),
     Slot("target_rotation_radians", (T.FLOAT32,), const=True),
     Slot("output_height", (T.INT32,), const=True),
     Slot("output_width", (T.INT32,), const=True),
     Slot("scale_x", (T.FLOAT32,), const=True),
     Slot("scale_y", (T.FLOAT32,), const=True)],
    [Slot("output", _F32, doc="[1, 4, 4]: crop pixel -> landmark space")],
    LandmarksToTransformMatrix(),
    doc="The affine transform of a rotated crop around a subset of landmarks.",
    tflite=(TFLITE_NAMES[LANDMARKS_TO_TRANSFORM_MATRIX],),
    tflite_convert=_converter(LANDMARKS_TO_TRANSFORM_MATRIX, (3,)))

TL = operation(
    NAME, TRANSFORM_LANDMARKS, "TRANSFORM_LANDMARKS",
    [Slot("landmarks", _F32, doc="[1, N, D], D 2 or 3"), _MATRIX],
    [Slot("output", _F32, doc="[1, N, D]: x, y transformed, z unchanged")],
    TransformLandmarks(), doc="Landmarks through an affine transform.",
    tflite=(TFLITE_NAMES[TRANSFORM_LANDMARKS],),
    tflite_convert=_converter(TRANSFORM_LANDMARKS, (3, 3)))

TTB = operation(
    NAME, TRANSFORM_TENSOR_BILINEAR, "TRANSFORM_TENSOR_BILINEAR",
    [Slot("input", _F32, doc="[1, H, W, C]"), _MATRIX,
     Slot("output_height", (T.INT32,), const=True),
     Slot("output_width", (T.INT32,), const=True)],
    [Slot("output", _F32, doc="[1, output_height, output_width, C]")],
    TransformTensorBilinear(), doc="A bilinear crop of a tensor by an affine transform.",
    tflite=(TFLITE_NAMES[TRANSFORM_TENSOR_BILINEAR],),
    tflite_convert=_converter(TRANSFORM_TENSOR_BILINEAR, (4, 3)))

#: The extension.
EXTENSION = ExtensionDef(NAME, (), (L2TM, TL, TTB),
                         doc="MediaPipe's custom TFLite operators (face landmarks with "
                             "attention).")
