"""HAL drivers: what every driver shares (:mod:`nnhal.drivers.common`) and the drivers.

* :mod:`nnhal.drivers.reference`: the reference CPU driver (``ReferenceDevice``).
* :mod:`nnhal.drivers.litert`: whole models exported to TFLite and run by ai-edge-litert with
  XNNPACK (``LiteRTDevice``; needs the optional ``litert`` extra, reported unavailable
  without it).
* :mod:`nnhal.drivers.xla`: whole models lowered to JAX and compiled ahead of time by XLA, on a
  GPU when JAX finds one (``XlaDevice``; needs the optional ``xla`` extra, reported
  unavailable without it).
"""
