"""The vendor extensions nnhal ships (:mod:`nnhal.ops.extensions` registers them itself),
which the reference driver offers: :mod:`nnhal.extensions.tflite_builtins`
(``org.nnhal.tflite``), TFLite builtins that have no HAL operation, and
:mod:`nnhal.extensions.mediapipe` (``com.google.mediapipe``), MediaPipe's custom operators."""
