"""Mode ``capi``: the cases of mode ``runtime``, every NDK call made through
``libneuralnetworks.so`` with ctypes (:mod:`nnhal.capi.ctypes_ndk`), as a C client makes it:
structs in memory, handles as pointers, buffers as addresses and lengths."""

from __future__ import annotations

from nnhal.conformance import mode_runtime
from nnhal.conformance.cases import Case
from nnhal.conformance.runner import Options
from nnhal.hal.interfaces import IDevice


def run(device: IDevice, case: Case, opts: Options) -> str:
    from nnhal.capi import ctypes_ndk

    saved = mode_runtime.N
    mode_runtime.N = ctypes_ndk  # type: ignore[assignment]
    try:
        return mode_runtime.run(device, case, opts)
    finally:
        mode_runtime.N = saved
