"""The version-neutral core: what every NNAPI interface version shares.

It imports nothing of nnhal, so every layer (the HAL types, the operations, the runtime, the
service, conformance) can name a version through it and no layer spells versions its own way.
:mod:`nnhal.core.native` (the per-user cache folder, C compiled into it) is here for the same
reason: the lowest layer (the frame fill) and the highest (the C library) build through it.
"""

from nnhal.core.version import FeatureLevel, UnknownVersion

__all__ = ["FeatureLevel", "UnknownVersion"]
