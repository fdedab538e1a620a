"""The version-neutral core: what every NNAPI interface version shares.

It imports nothing of nnhal, so every layer (the HAL types, the operations, the runtime, the
service, conformance) can name a version through it and no layer spells versions its own way.
"""

from nnhal.core.version import FeatureLevel, UnknownVersion

__all__ = ["FeatureLevel", "UnknownVersion"]
