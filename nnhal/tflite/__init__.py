"""TFLite flatbuffers in and out of HAL models (schema binding: the ``tflite`` package)."""

from nnhal.tflite.exporter import write_tflite
from nnhal.tflite.importer import builtin_support, builtin_table, custom_support, read_tflite
from nnhal.tflite.model import ImportedModel, StateVariable

__all__ = ["ImportedModel", "StateVariable", "builtin_support", "builtin_table",
           "custom_support", "read_tflite", "write_tflite"]
