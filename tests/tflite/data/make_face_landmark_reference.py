"""Remake face_landmark_with_attention_mediapipe.npz: MediaPipe's own runtime on a drawn face.

Run with the `mediapipe` 0.10.14 wheel installed in a separate virtual environment (it is no
dependency of nnhal; matplotlib and opencv-python-headless satisfy its imports):
    python make_face_landmark_reference.py face_landmark_with_attention.tflite
The graph feeds the image through ImageToTensorCalculator (floats in [0, 1]) into
InferenceCalculator with MediaPipe's custom-operator resolver and its plain TFLite CPU kernels,
and saves the image and the model's seven outputs.
"""
import sys

import numpy as np
from google.protobuf import text_format
from mediapipe.framework import calculator_pb2
from mediapipe.python import packet_creator, packet_getter
from mediapipe.python._framework_bindings import calculator_graph, image_frame

NAMES = ["output_mesh_identity", "output_lips", "output_left_eye", "output_right_eye",
         "output_left_iris", "output_right_iris", "conv_faceflag"]
model = sys.argv[1]
delegate = "tflite"

# A drawn face: skin ellipse on a gradient, dark eyes, irises, mouth (smooth: compresses well).
yy, xx = np.mgrid[0:192, 0:192].astype(np.float64)
def blob(cx, cy, rx, ry):
    return np.clip(1.5 - np.sqrt(((xx - cx) / rx) ** 2 + ((yy - cy) / ry) ** 2) * 1.5, 0, 1)
bg = np.stack([40 + 0.3 * xx, 60 + 0.2 * yy, 90 + 0.1 * (xx + yy)], -1)
face = blob(96, 100, 62, 80)[..., None]
img = bg * (1 - face) + np.array([205, 160, 130]) * face
for cx in (72, 120):
    e = blob(cx, 82, 14, 7)[..., None]
    img = img * (1 - e) + np.array([245, 245, 240]) * e
    i = blob(cx, 82, 5, 5)[..., None]
    img = img * (1 - i) + np.array([60, 40, 30]) * i
    b = blob(cx, 64, 18, 4)[..., None]
    img = img * (1 - b) + np.array([70, 50, 40]) * b
m = blob(96, 140, 22, 7)[..., None]
img = img * (1 - m) + np.array([170, 70, 80]) * m
n = blob(96, 110, 6, 12)[..., None]
img = img * (1 - n) + np.array([185, 140, 115]) * n
face_img = np.clip(np.round(img), 0, 255).astype(np.uint8)

cfg = f"""
input_stream: "image"
output_stream: "f0"
output_stream: "f1"
output_stream: "f2"
output_stream: "f3"
output_stream: "f4"
output_stream: "f5"
output_stream: "f6"
output_stream: "fin"
node {{
  calculator: "TfLiteCustomOpResolverCalculator"
  output_side_packet: "OP_RESOLVER:op_resolver"
}}
node {{
  calculator: "ImageToTensorCalculator"
  input_stream: "IMAGE:image"
  output_stream: "TENSORS:input_tensors"
  options: {{
    [mediapipe.ImageToTensorCalculatorOptions.ext] {{
      output_tensor_width: 192
      output_tensor_height: 192
      keep_aspect_ratio: false
      output_tensor_float_range {{ min: 0.0 max: 1.0 }}
    }}
  }}
}}
node {{
  calculator: "TensorsToFloatsCalculator"
  input_stream: "TENSORS:input_tensors"
  output_stream: "FLOATS:fin"
}}
node {{
  calculator: "InferenceCalculator"
  input_stream: "TENSORS:input_tensors"
  input_side_packet: "OP_RESOLVER:op_resolver"
  output_stream: "TENSORS:out"
  options: {{
    [mediapipe.InferenceCalculatorOptions.ext] {{
      model_path: "{model}"
      delegate {{ {delegate} {{}} }}
    }}
  }}
}}
node {{
  calculator: "SplitTensorVectorCalculator"
  input_stream: "out"
  output_stream: "t0"
  output_stream: "t1"
  output_stream: "t2"
  output_stream: "t3"
  output_stream: "t4"
  output_stream: "t5"
  output_stream: "t6"
  options: {{
    [mediapipe.SplitVectorCalculatorOptions.ext] {{
      ranges: {{ begin: 0 end: 1 }}
      ranges: {{ begin: 1 end: 2 }}
      ranges: {{ begin: 2 end: 3 }}
      ranges: {{ begin: 3 end: 4 }}
      ranges: {{ begin: 4 end: 5 }}
      ranges: {{ begin: 5 end: 6 }}
      ranges: {{ begin: 6 end: 7 }}
    }}
  }}
}}
""" + "".join(f"""
node {{
  calculator: "TensorsToFloatsCalculator"
  input_stream: "TENSORS:t{i}"
  output_stream: "FLOATS:f{i}"
}}""" for i in range(7))
config = text_format.Parse(cfg, calculator_pb2.CalculatorGraphConfig())
graph = calculator_graph.CalculatorGraph(graph_config=config)
got = {}
for name in [f"f{i}" for i in range(7)] + ["fin"]:
    graph.observe_output_stream(name, lambda stream, packet: got.__setitem__(
        stream, np.array(packet_getter.get_float_list(packet), np.float32)))
graph.start_run()
frame = image_frame.ImageFrame(image_format=image_frame.ImageFormat.SRGB, data=face_img)
graph.add_packet_to_input_stream("image", packet_creator.create_image_frame(frame).at(0))
graph.close()
np.savez_compressed("face_landmark_with_attention_mediapipe.npz", image=face_img,
                    **{n: got[f"f{i}"] for i, n in enumerate(NAMES)})
