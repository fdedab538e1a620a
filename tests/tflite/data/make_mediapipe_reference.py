"""Remake the MediaPipe reference outputs of tests/extensions/test_mediapipe.py with
MediaPipe's own runtime (its InferenceCalculator, custom-operator resolver and plain TFLite
CPU kernels; images enter through ImageToTensorCalculator as floats in [0, 1]).

Run in a separate virtual environment with the `mediapipe` 0.10.14 wheel (no dependency of
nnhal; matplotlib and opencv-python-headless satisfy its imports), in this directory:
    python make_mediapipe_reference.py
* face_landmark_with_attention_mediapipe.npz: a drawn face and the model's seven outputs.
* transform_tensor_bilinear_mediapipe.npz: for each case k, a one-operator model
  (``model{k}``, TransformTensorBilinear v2 with a constant matrix, written by the test
  module's ``_one_op_model``) and its input image; only ``mediapipe{k}`` is remade.
"""
import tempfile
from pathlib import Path

import numpy as np
from google.protobuf import text_format
from mediapipe.framework import calculator_pb2
from mediapipe.python import packet_creator, packet_getter
from mediapipe.python._framework_bindings import calculator_graph, image_frame

FACE_OUTPUTS = ["output_mesh_identity", "output_lips", "output_left_eye", "output_right_eye",
                "output_left_iris", "output_right_iris", "conv_faceflag"]


def run_model(model: str, image: np.ndarray, n_outputs: int) -> list[np.ndarray]:
    """The model's outputs (flat float32) on ``image`` (H x W x 3 uint8) scaled to [0, 1]."""
    h, w = image.shape[:2]
    split = "".join(f"ranges: {{ begin: {k} end: {k + 1} }}\n" for k in range(n_outputs))
    cfg = f"""
input_stream: "image"
node {{ calculator: "TfLiteCustomOpResolverCalculator"
        output_side_packet: "OP_RESOLVER:op_resolver" }}
node {{
  calculator: "ImageToTensorCalculator" input_stream: "IMAGE:image"
  output_stream: "TENSORS:input_tensors"
  options: {{ [mediapipe.ImageToTensorCalculatorOptions.ext] {{
    output_tensor_width: {w} output_tensor_height: {h} keep_aspect_ratio: false
    output_tensor_float_range {{ min: 0.0 max: 1.0 }} }} }}
}}
node {{
  calculator: "InferenceCalculator" input_stream: "TENSORS:input_tensors"
  input_side_packet: "OP_RESOLVER:op_resolver" output_stream: "TENSORS:out"
  options: {{ [mediapipe.InferenceCalculatorOptions.ext] {{
    model_path: "{model}" delegate {{ tflite {{}} }} }} }}
}}
node {{
  calculator: "SplitTensorVectorCalculator" input_stream: "out"
  {"".join(f'output_stream: "t{k}" ' for k in range(n_outputs))}
  options: {{ [mediapipe.SplitVectorCalculatorOptions.ext] {{ {split} }} }}
}}
""" + "".join(f"""
node {{ calculator: "TensorsToFloatsCalculator" input_stream: "TENSORS:t{k}"
        output_stream: "FLOATS:f{k}" }}
output_stream: "f{k}"
""" for k in range(n_outputs))
    config = text_format.Parse(cfg, calculator_pb2.CalculatorGraphConfig())
    graph = calculator_graph.CalculatorGraph(graph_config=config)
    got: dict[str, np.ndarray] = {}
    for k in range(n_outputs):
        graph.observe_output_stream(f"f{k}", lambda stream, packet: got.__setitem__(
            stream, np.array(packet_getter.get_float_list(packet), np.float32)))
    graph.start_run()
    frame = image_frame.ImageFrame(image_format=image_frame.ImageFormat.SRGB,
                                   data=np.ascontiguousarray(image))
    graph.add_packet_to_input_stream("image", packet_creator.create_image_frame(frame).at(0))
    graph.close()
    return [got[f"f{k}"] for k in range(n_outputs)]


def drawn_face() -> np.ndarray:
    """A 192x192 face: skin ellipse on a gradient, eyes with irises, brows, nose, mouth
    (smooth, so that it compresses well)."""
    yy, xx = np.mgrid[0:192, 0:192].astype(np.float64)

    def blob(cx: float, cy: float, rx: float, ry: float) -> np.ndarray:
        r = np.sqrt(((xx - cx) / rx) ** 2 + ((yy - cy) / ry) ** 2)
        return np.clip(1.5 - r * 1.5, 0, 1)[..., None]

    img = np.stack([40 + 0.3 * xx, 60 + 0.2 * yy, 90 + 0.1 * (xx + yy)], -1)
    parts = [((96, 100, 62, 80), (205, 160, 130))]
    for cx in (72, 120):
        parts += [((cx, 82, 14, 7), (245, 245, 240)), ((cx, 82, 5, 5), (60, 40, 30)),
                  ((cx, 64, 18, 4), (70, 50, 40))]
    parts += [((96, 140, 22, 7), (170, 70, 80)), ((96, 110, 6, 12), (185, 140, 115))]
    for where, colour in parts:
        b = blob(*where)
        img = img * (1 - b) + np.array(colour) * b
    return np.clip(np.round(img), 0, 255).astype(np.uint8)


def main() -> None:
    image = drawn_face()
    outs = run_model(str(Path("face_landmark_with_attention.tflite").resolve()), image,
                     len(FACE_OUTPUTS))
    np.savez_compressed("face_landmark_with_attention_mediapipe.npz", image=image,
                        **dict(zip(FACE_OUTPUTS, outs)))
    cases = dict(np.load("transform_tensor_bilinear_mediapipe.npz"))
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(sum(name.startswith("model") for name in cases)):
            path = Path(tmp) / f"model{k}.tflite"
            path.write_bytes(cases[f"model{k}"].tobytes())
            (out,) = run_model(str(path), cases[f"image{k}"], 1)
            cases[f"mediapipe{k}"] = out.reshape(cases[f"mediapipe{k}"].shape)
    np.savez_compressed("transform_tensor_bilinear_mediapipe.npz", **cases)


if __name__ == "__main__":
    main()
