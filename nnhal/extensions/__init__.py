"""The vendor extensions nnhal ships (:mod:`nnhal.ops.extensions` registers them itself):
:mod:`nnhal.extensions.tflite_builtins` (``org.nnhal.tflite``), TFLite builtins that have no
HAL operation, which the reference driver offers."""
