"""com.google.mediapipe: MediaPipe's three custom operators as nnhal extension operations.

Each kernel is checked against an independent float64 implementation written here from the
operators' definitions (MediaPipe's public source: per-pixel and per-landmark loops and the
matrices composed as MediaPipe composes them), on random inputs and edge cases.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from nnhal.extensions import mediapipe as mp

# ---- independent float64 references ---------------------------------------------------------


def _mat4(rows):
    return np.array(rows, dtype=np.float64)


def ref_landmarks_to_matrix(lm, subset_flat, left, right, target, oh, ow, sx, sy):
    """Landmarks2TransformMatrix v2 as defined: rotation from the left/right landmarks, the
    subset's box in the rotated frame, then shift . rotate . scale . shift."""
    p = np.asarray(lm, np.float64).reshape(-1)
    pairs = list(subset_flat)
    if len(pairs) % 2:
        pairs.append(pairs[-1])
    lx, ly = p[left * 3], p[left * 3 + 1]
    rx, ry = p[right * 3], p[right * 3 + 1]
    r = target - math.atan2(ry - ly, rx - lx)
    pts = []
    for i in pairs:
        x, y = p[i * 3], p[i * 3 + 1]
        pts.append((math.cos(r) * x - math.sin(r) * y, math.sin(r) * x + math.cos(r) * y))
    xs, ys = [q[0] for q in pts], [q[1] for q in pts]
    w, h = max(xs) - min(xs), max(ys) - min(ys)
    mx, my = (max(xs) + min(xs)) / 2, (max(ys) + min(ys)) / 2
    cx = math.cos(-r) * mx - math.sin(-r) * my
    cy = math.sin(-r) * mx + math.cos(-r) * my
    t = np.eye(4)
    t = t @ _mat4([[1, 0, 0, cx], [0, 1, 0, cy], [0, 0, 1, 0], [0, 0, 0, 1]])
    q = -r
    t = t @ _mat4([[math.cos(q), -math.sin(q), 0, 0], [math.sin(q), math.cos(q), 0, 0],
                   [0, 0, 1, 0], [0, 0, 0, 1]])
    t = t @ _mat4([[sx * w / ow, 0, 0, 0], [0, sy * h / oh, 0, 0], [0, 0, 1, 0],
                   [0, 0, 0, 1]])
    t = t @ _mat4([[1, 0, 0, -ow / 2], [0, 1, 0, -oh / 2], [0, 0, 1, 0], [0, 0, 0, 1]])
    return t.reshape(1, 4, 4)


def ref_transform_landmarks(lm, m):
    m = np.asarray(m, np.float64).reshape(-1)
    lm = np.asarray(lm, np.float64)
    out = lm.copy()
    for n in range(lm.shape[1]):
        x, y = lm[0, n, 0], lm[0, n, 1]
        vec = (x, y, 0.0, 1.0)
        out[0, n, 0] = sum(m[k] * vec[k] for k in range(4))
        out[0, n, 1] = sum(m[4 + k] * vec[k] for k in range(4))
    return out


def ref_transform_tensor_bilinear(img, m, oh, ow):
    m = np.asarray(m, np.float64).reshape(-1)
    img = np.asarray(img, np.float64)
    _, h, w, c = img.shape
    a = list(m[0:4])
    b = list(m[4:8])
    # Align corners: T -> S . T . A (A adds, S takes away half a pixel).
    a[3] += a[0] * 0.5 + a[1] * 0.5 - 0.5
    b[3] += b[0] * 0.5 + b[1] * 0.5 - 0.5
    out = np.zeros((1, oh, ow, c))

    def read(yy, xx):
        if yy < 0 or xx < 0 or yy >= h or xx >= w:
            return np.zeros(c)
        return img[0, yy, xx]

    for v in range(oh):
        for u in range(ow):
            x = a[0] * u + a[1] * v + a[3]
            y = b[0] * u + b[1] * v + b[3]
            if not (0 <= x <= w - 1 and 0 <= y <= h - 1):
                continue
            x0, y0 = math.floor(x), math.floor(y)
            fx, fy = x - x0, y - y0
            top = (1 - fx) * read(y0, x0) + fx * read(y0, x0 + 1)
            bottom = (1 - fx) * read(y0 + 1, x0) + fx * read(y0 + 1, x0 + 1)
            out[0, v, u] = fy * bottom + (1 - fy) * top
    return out


# ---- the kernels against them ----------------------------------------------------------------

def _face(rng, n=40):
    """Landmarks scattered around a rotated face-like cloud, in pixels of a 192x192 crop."""
    pts = rng.uniform(40, 150, size=(1, n, 3)).astype(np.float32)
    pts[..., 2] = rng.normal(0, 5, size=(1, n))
    return pts


@pytest.mark.parametrize("seed", range(6))
def test_landmarks_to_matrix_random(seed):
    rng = np.random.default_rng(seed)
    lm = _face(rng)
    n = lm.shape[1]
    k = int(rng.integers(1, 12))
    flat = [int(i) for i in rng.integers(0, n, size=k)]
    left, right = (int(i) for i in rng.choice(n, 2, replace=False))
    target = float(rng.uniform(-1, 1))
    oh, ow = int(rng.integers(4, 32)), int(rng.integers(4, 32))
    sx, sy = float(rng.uniform(0.5, 2)), float(rng.uniform(0.5, 2))
    subset = mp.tflite_options(mp.LANDMARKS_TO_TRANSFORM_MATRIX, {
        "subset_idxs": flat, "left_rotation_idx": left, "right_rotation_idx": right,
        "target_rotation_radians": target, "output_height": oh, "output_width": ow,
        "scale_x": sx, "scale_y": sy})[0][1]
    got = mp.landmarks_to_transform_matrix(lm, subset, left, right, target, oh, ow, sx, sy)
    want = ref_landmarks_to_matrix(lm, flat, left, right, target, oh, ow, sx, sy)
    assert got.dtype == np.float32 and got.shape == (1, 4, 4)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_landmarks_to_matrix_maps_crop_corners_onto_the_box():
    """An axis-aligned box (no rotation): the crop's corners land on the box's corners."""
    lm = np.zeros((1, 4, 3), np.float32)
    lm[0, :, :2] = [[10, 20], [50, 20], [10, 80], [50, 80]]
    m = mp.landmarks_to_transform_matrix(lm, np.array([[0, 3]]), 0, 1, 0.0, 16, 8, 1.0, 1.0)
    m = m[0].astype(np.float64)
    for (u, v), (x, y) in (((0, 0), (10, 20)), ((8, 16), (50, 80)), ((4, 8), (30, 50))):
        got = m @ np.array([u, v, 0, 1])
        np.testing.assert_allclose(got[:2], (x, y), atol=1e-4)


def test_landmarks_to_matrix_degenerate():
    """Coincident rotation landmarks (atan2(0, 0) = 0) and a one-point subset (a box of size
    0): finite, the whole crop maps onto that point."""
    lm = np.full((1, 3, 3), 7.0, np.float32)
    got = mp.landmarks_to_transform_matrix(lm, np.array([[1, 1]]), 0, 0, 0.0, 4, 4, 1.5, 1.5)
    want = ref_landmarks_to_matrix(lm, [1], 0, 0, 0.0, 4, 4, 1.5, 1.5)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, atol=1e-6)
    np.testing.assert_allclose(got[0] @ np.array([3, 2, 0, 1]), [7, 7, 0, 1], atol=1e-5)


def test_landmarks_to_matrix_odd_subset_pairs_last_with_itself():
    ops = mp.tflite_options(mp.LANDMARKS_TO_TRANSFORM_MATRIX, {
        "subset_idxs": [1, 2, 3], "left_rotation_idx": 0, "right_rotation_idx": 1,
        "target_rotation_radians": 0.0, "output_height": 2, "output_width": 2,
        "scale_x": 1.0, "scale_y": 1.0})
    assert ops[0][1].tolist() == [[1, 2], [3, 3]]
    with pytest.raises(ValueError, match="subset_idxs"):
        mp.tflite_options(mp.LANDMARKS_TO_TRANSFORM_MATRIX, {"subset": [1, 2]})


@pytest.mark.parametrize("dims", [2, 3])
def test_transform_landmarks_random(dims):
    rng = np.random.default_rng(dims)
    lm = rng.normal(0, 30, size=(1, 17, dims)).astype(np.float32)
    m = rng.normal(0, 2, size=(1, 4, 4)).astype(np.float32)
    got = mp.transform_landmarks(lm, m)
    want = ref_transform_landmarks(lm, m)
    assert got.dtype == np.float32 and got.shape == lm.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    if dims == 3:
        np.testing.assert_array_equal(got[..., 2], lm[..., 2])  # z passes unchanged


def _rot_matrix(rng, h, w, oh, ow, spill=0.0):
    """A rotated, scaled crop mostly inside an h x w input (spill: how far past it)."""
    r = rng.uniform(-math.pi, math.pi)
    s = rng.uniform(0.3, 1.2) * min(h, w) / max(oh, ow) * (1 + spill)
    cx, cy = rng.uniform(0.3, 0.7) * w, rng.uniform(0.3, 0.7) * h
    c, sn = math.cos(r), math.sin(r)
    m = np.eye(4)
    m[0, :2], m[1, :2] = (c * s, -sn * s), (sn * s, c * s)
    m[0, 3] = cx - m[0, 0] * ow / 2 - m[0, 1] * oh / 2
    m[1, 3] = cy - m[1, 0] * ow / 2 - m[1, 1] * oh / 2
    return m.astype(np.float32).reshape(1, 4, 4)


@pytest.mark.parametrize("seed", range(4))
def test_transform_tensor_bilinear_random(seed):
    rng = np.random.default_rng(100 + seed)
    h, w, c = 24, 20, 3
    oh, ow = 9, 11
    img = rng.normal(size=(1, h, w, c)).astype(np.float32)
    m = _rot_matrix(rng, h, w, oh, ow, spill=seed * 0.8)  # later seeds sample past the edge
    got = mp.transform_tensor_bilinear(img, m, oh, ow)
    want = ref_transform_tensor_bilinear(img, m, oh, ow)
    assert got.dtype == np.float32 and got.shape == (1, oh, ow, c)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    if seed == 3:
        assert (want == 0).all(axis=-1).any()  # this case does sample outside


def test_transform_tensor_bilinear_edges():
    """Identity matrix: the crop copies the input (align corners); a shift by 0.5 pixel
    averages neighbours; points exactly on the last row and column are inside; points past
    any edge, or NaN ones, give 0."""
    rng = np.random.default_rng(7)
    img = rng.normal(size=(1, 5, 6, 2)).astype(np.float32)
    ident = np.eye(4, dtype=np.float32).reshape(1, 4, 4)
    got = mp.transform_tensor_bilinear(img, ident, 5, 6)
    np.testing.assert_allclose(got, img, atol=1e-6)  # last row and column included
    bigger = mp.transform_tensor_bilinear(img, ident, 7, 8)
    assert (bigger[0, 5:] == 0).all() and (bigger[0, :, 6:] == 0).all()
    half = ident.copy()
    half[0, 0, 3] = 0.5
    got = mp.transform_tensor_bilinear(img, half, 5, 5)
    np.testing.assert_allclose(got[0], (img[0, :, :5] + img[0, :, 1:]) / 2, atol=1e-6)
    np.testing.assert_allclose(got, ref_transform_tensor_bilinear(img, half, 5, 5), atol=1e-6)
    neg = ident.copy()
    neg[0, 1, 3] = -0.25  # row 0 samples y = -0.25: outside
    got = mp.transform_tensor_bilinear(img, neg, 5, 6)
    assert (got[0, 0] == 0).all() and (got[0, 1:] != 0).any()
    nan = ident.copy()
    nan[0, 0, 0] = np.nan
    assert (mp.transform_tensor_bilinear(img, nan, 3, 3) == 0).all()


# ---- the extension in a HAL model -----------------------------------------------------------

def _bilinear_model(oh, ow, shape=(1, 12, 10, 3)):
    from nnhal.hal.builder import ModelBuilder
    from nnhal.hal.types import ExtensionNameAndPrefix
    from nnhal.hal.types import OperandType as T

    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, list(shape))
    m = b.input(T.TENSOR_FLOAT32, [1, 4, 4])
    y = b.output(T.TENSOR_FLOAT32, [1, max(oh, 0), max(ow, 0), shape[3]])
    b.operation(1 << 16 | mp.TRANSFORM_TENSOR_BILINEAR,
                [x, m, b.scalar(T.INT32, oh), b.scalar(T.INT32, ow)], [y])
    b.inputs, b.outputs = [x, m], [y]
    model = b.build()
    model.extension_name_to_prefix = [ExtensionNameAndPrefix(mp.NAME, 1)]
    return model


def test_hal_model_runs_on_the_reference():
    from nnhal.session import Session

    rng = np.random.default_rng(3)
    img = rng.normal(size=(1, 12, 10, 3)).astype(np.float32)
    m = _rot_matrix(rng, 12, 10, 6, 5, spill=0.5)
    with Session(_bilinear_model(6, 5), device="reference") as s:
        (got,) = s.run([img, m]).values()
    np.testing.assert_allclose(got, ref_transform_tensor_bilinear(img, m, 6, 5), atol=1e-5)


def test_hal_model_bad_parameters_are_refused():
    from nnhal.errors import NnhalError
    from nnhal.session import Session

    with pytest.raises(NnhalError, match="TRANSFORM_TENSOR_BILINEAR: .*output size 0x5"):
        Session(_bilinear_model(0, 5), device="reference")


def test_reference_offers_the_extension():
    from nnhal.drivers.reference import ReferenceDevice
    from nnhal.hal.types import ErrorStatus

    status, exts = ReferenceDevice().get_supported_extensions()
    assert status == ErrorStatus.NONE and mp.NAME in [e.name for e in exts]


# ---- MediaPipe's face landmark model with attention ----------------------------------------

DATA = __import__("pathlib").Path(__file__).parent.parent / "tflite" / "data"
MODEL = DATA / "face_landmark_with_attention.tflite"
REFERENCE = DATA / "face_landmark_with_attention_mediapipe.npz"
BILINEAR = DATA / "transform_tensor_bilinear_mediapipe.npz"
OUTPUTS = ["output_mesh_identity", "output_lips", "output_left_eye", "output_right_eye",
           "output_left_iris", "output_right_iris", "conv_faceflag"]
#: Worst absolute error seen against MediaPipe's runtime: 4.6e-5 (its TFLite kernels) and
#: 1.2e-4 (XNNPACK) on landmark coordinates of up to ~160 pixels.
TOLERANCE = 1e-3


@pytest.fixture(scope="module")
def face():
    if not MODEL.exists() or not REFERENCE.exists():
        pytest.skip(f"{MODEL.name} or its MediaPipe outputs are not in {DATA}")
    ref = np.load(REFERENCE)
    return (ref["image"].astype(np.float32) / 255)[None], {k: ref[k] for k in OUTPUTS}


def test_face_model_imports():
    from nnhal.tflite import read_tflite

    imported = read_tflite(MODEL)
    model = imported.model
    assert [e.name for e in model.extension_name_to_prefix] == [mp.NAME]
    prefix = model.extension_name_to_prefix[0].prefix
    types = [op.type for op in model.main.operations if op.type >> 16]
    assert sorted(t & 0xFFFF for t in types) == [0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2]
    assert all(t >> 16 == prefix for t in types)
    assert imported.output_names == OUTPUTS


@pytest.mark.parametrize("device", [None, "reference"])
def test_face_model_matches_mediapipe(face, device):
    """Against MediaPipe's own runtime (the reference data), through Session on its default
    devices (LiteRT runs the HAL operations when installed; the reference the extension's)
    and on the reference alone."""
    from nnhal.session import Session

    x, want = face
    with Session(MODEL, device=device) as s:
        got = s.run([x])
        assert "reference" in s.device_name.split("+")  # where the extension operations run
    assert list(got) == OUTPUTS
    for name in OUTPUTS:
        g = got[name]
        assert g.dtype == np.float32 and np.isfinite(g).all()
        assert g.size == want[name].size
        np.testing.assert_allclose(g.reshape(-1), want[name], atol=TOLERANCE, err_msg=name)
    assert got["conv_faceflag"].item() > 10  # the drawn face is a face


def test_face_model_nnhal_run(face, tmp_path):
    from nnhal import cli

    x, want = face
    np.savez(tmp_path / "in.npz", input_1=x)
    assert cli.main(["run", str(MODEL), "--inputs", str(tmp_path / "in.npz"),
                     "--outputs", str(tmp_path / "out.npz")]) == 0
    got = np.load(tmp_path / "out.npz")
    for name in OUTPUTS:
        assert got[name].shape == (1, 1, 1, want[name].size)
        np.testing.assert_allclose(got[name].reshape(-1), want[name], atol=TOLERANCE)


def test_face_model_info_names_extension_operations(capsys):
    import json

    from nnhal import cli

    assert cli.main(["info", "--json", str(MODEL)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["operations"][f"{mp.NAME}:TRANSFORM_LANDMARKS"] == 5
    ext = info["extension_operations"]
    assert len(ext) == 11
    assert {e["operation"] for e in ext} == {f"{mp.NAME}:{n}" for n in (
        "LANDMARKS_TO_TRANSFORM_MATRIX", "TRANSFORM_LANDMARKS", "TRANSFORM_TENSOR_BILINEAR")}
    for e in ext:
        assert e["extension"] == mp.NAME
        assert "reference" in e["supported_by"] and "litert" not in e["supported_by"]
        assert e["runs_on"] == "reference"
    assert cli.main(["info", str(MODEL)]) == 0
    text = capsys.readouterr().out
    assert "extension operations" in text and f"{mp.NAME}:TRANSFORM_TENSOR_BILINEAR" in text


# ---- small TFLite models of one operator -----------------------------------------------------

def _one_op_model(custom_name, inputs, output, options=None):
    """A TFLite file of one custom operator: ``inputs`` (shape, constant value or None),
    ``output`` its shape; ``options`` a dict flexbuffers-encoded as MediaPipe's are."""
    schema = pytest.importorskip("ai_edge_litert.schema_py_generated",
                                 reason="ai-edge-litert writes the TFLite test models")
    import flatbuffers
    from flatbuffers import flexbuffers

    m = schema.ModelT()
    m.version = 3
    m.buffers = [schema.BufferT()]
    sg = schema.SubGraphT()
    sg.tensors, sg.inputs = [], []
    for k, (shape, value) in enumerate([*inputs, (output, None)]):
        t = schema.TensorT()
        t.shape, t.type, t.name, t.buffer = list(shape), schema.TensorType.FLOAT32, f"t{k}", 0
        if value is not None:
            b = schema.BufferT()
            b.data = np.asarray(value, np.float32).tobytes()
            m.buffers.append(b)
            t.buffer = len(m.buffers) - 1
        elif k < len(inputs):
            sg.inputs.append(k)
        sg.tensors.append(t)
    sg.outputs = [len(inputs)]
    code = schema.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = schema.BuiltinOperator.CUSTOM
    code.customCode, code.version = custom_name, 2
    m.operatorCodes = [code]
    op = schema.OperatorT()
    op.opcodeIndex, op.inputs, op.outputs = 0, list(range(len(inputs))), [len(inputs)]
    if options is not None:
        op.customOptions = list(flexbuffers.Dumps(options))
    sg.operators = [op]
    m.subgraphs = [sg]
    b = flatbuffers.Builder(1024)
    b.Finish(m.Pack(b), file_identifier=b"TFL3")
    return bytes(b.Output())


def _run_file(data, feeds):
    from nnhal.session import Session

    with Session(data, device="reference") as s:
        return list(s.run(feeds).values())


def test_tflite_transform_landmarks_alone():
    rng = np.random.default_rng(11)
    lm = rng.normal(0, 20, size=(1, 6, 3)).astype(np.float32)
    m = rng.normal(0, 1, size=(1, 4, 4)).astype(np.float32)
    data = _one_op_model("TransformLandmarks", [((1, 6, 3), None), ((1, 4, 4), m)],
                         (1, 6, 3))
    (got,) = _run_file(data, [lm])
    np.testing.assert_allclose(got, ref_transform_landmarks(lm, m), rtol=1e-5, atol=1e-4)


def test_tflite_landmarks_to_matrix_and_bilinear_alone():
    rng = np.random.default_rng(12)
    lm = _face(rng, 10)
    opts = {"left_rotation_idx": 1, "right_rotation_idx": 7, "output_height": 5,
            "output_width": 4, "scale_x": 1.25, "scale_y": 1.5, "subset_idxs": [0, 2, 3, 9, 5],
            "target_rotation_radians": 0.25}
    data = _one_op_model("Landmarks2TransformMatrix", [((1, 10, 3), None)], (1, 4, 4), opts)
    (got,) = _run_file(data, [lm])
    want = ref_landmarks_to_matrix(lm, [0, 2, 3, 9, 5], 1, 7, 0.25, 5, 4, 1.25, 1.5)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    img = rng.normal(size=(1, 8, 9, 2)).astype(np.float32)
    data = _one_op_model("TransformTensorBilinear", [((1, 8, 9, 2), None), ((1, 4, 4), None)],
                         (1, 5, 4, 2), {"output_height": 5, "output_width": 4})
    m = _rot_matrix(rng, 8, 9, 5, 4)
    (got,) = _run_file(data, [img, m])
    np.testing.assert_allclose(got, ref_transform_tensor_bilinear(img, m, 5, 4), atol=1e-5)


@pytest.mark.parametrize("case", ["v1 options", "v1 rank", "no options", "index past",
                                  "empty subset", "bad option"])
def test_tflite_forms_nnhal_refuses(case):
    """Version 1's forms (other options, 4-D landmarks), missing options and a landmark
    index past the tensor are refused with a message, at import or compilation."""
    from nnhal.errors import NnhalError

    v2 = {"left_rotation_idx": 0, "right_rotation_idx": 1, "output_height": 2,
          "output_width": 2, "scale_x": 1.0, "scale_y": 1.0, "subset_idxs": [0, 1],
          "target_rotation_radians": 0.0}
    if case == "v1 options":
        data = _one_op_model("Landmarks2TransformMatrix", [((1, 4, 3), None)], (1, 4, 4),
                             {"dimensions": 3, "landmarks_range": 192, "subset": [0, 1]})
        match = "subset_idxs' is missing"
    elif case == "v1 rank":
        data = _one_op_model("TransformLandmarks", [((1, 1, 4, 3), None), ((1, 4, 4), None)],
                             (1, 1, 4, 3), {"dimensions": 3, "scale": 1.0})
        match = "input 0 has rank 4, not 3"
    elif case == "no options":
        data = _one_op_model("TransformTensorBilinear", [((1, 4, 4, 1), None),
                                                         ((1, 4, 4), None)], (1, 2, 2, 1))
        match = "output_height' is missing"
    elif case == "index past":
        data = _one_op_model("Landmarks2TransformMatrix", [((1, 4, 3), None)], (1, 4, 4),
                             dict(v2, subset_idxs=[0, 4]))
        match = "landmark index 4 is past the 4 landmarks"
    elif case == "empty subset":
        data = _one_op_model("Landmarks2TransformMatrix", [((1, 4, 3), None)], (1, 4, 4),
                             dict(v2, subset_idxs=[]))
        match = "subset_idxs' is empty"
    else:
        data = _one_op_model("Landmarks2TransformMatrix", [((1, 4, 3), None)], (1, 4, 4),
                             dict(v2, subset_idxs=[[1]]))
        match = "LANDMARKS_TO_TRANSFORM_MATRIX: int"
    with pytest.raises(NnhalError, match=match):
        _run_file(data, [np.zeros((1, 4, 3), np.float32)])


def test_bilinear_models_match_mediapipe():
    """TransformTensorBilinear alone, as MediaPipe's runtime computed it (out-of-range
    sampling included: 51 and 456 of the outputs are zeros there)."""
    if not BILINEAR.exists():
        pytest.skip(f"{BILINEAR.name} is not in {DATA}")
    cases = np.load(BILINEAR)
    zeros = []
    for k in range(3):
        x = (cases[f"image{k}"].astype(np.float32) / 255)[None]
        (got,) = _run_file(cases[f"model{k}"].tobytes(), [x])
        want = cases[f"mediapipe{k}"]
        np.testing.assert_allclose(got, want, atol=1e-6)
        np.testing.assert_array_equal(got == 0, want == 0)
        zeros.append(int((want == 0).sum()))
    assert zeros[1] > 0 and zeros[2] > zeros[1]


def test_face_model_view_names_extension_operations():
    from nnhal.tflite import read_tflite
    from nnhal.tools.view import to_dot

    dot = to_dot(read_tflite(MODEL))
    assert f"{mp.NAME}:TRANSFORM_LANDMARKS #330" in dot
    assert "operation 65537" not in dot
