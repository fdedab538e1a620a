"""Mode ``capi``: the cases of mode ``runtime``, every NDK call made through
``libneuralnetworks.so`` with ctypes (:mod:`nnhal.capi.ctypes_ndk`), as a C client makes it:
structs in memory, handles as pointers, buffers as addresses and lengths.

The device under test is the library's device of the same name (ANeuralNetworks_getDevice,
ANeuralNetworksDevice_getName). One it does not list, a served driver at ``remote:PATH``,
is named to it the way a C program names it, in ``$NNHAL_DEVICES``
(:func:`nnhal.capi.ctypes_ndk.use_device`): the library's runtime then opens its own
connection to the service, and every case goes client → C library → service. Through
``--hal aidl`` the library is named ``NAME@aidl``, a registry entry that opens the device
wrapped by the face (:func:`nnhal.conformance.faces.library_name`): client → C library →
AIDL face → driver (or service).
"""

from __future__ import annotations

from nnhal.conformance import mode_runtime
from nnhal.conformance.cases import Case
from nnhal.conformance.faces import library_name
from nnhal.conformance.runner import CaseFailure, Options
from nnhal.hal.interfaces import IDevice

#: Device name -> None once the library lists it, else why it cannot (asked once per name).
_listed: dict[str, str | None] = {}


def run(device: IDevice, case: Case, opts: Options) -> str:
    from nnhal.capi import ctypes_ndk

    name = getattr(device, "name", None)
    if name:
        # Through a face, the library opens the device by a name that wraps it the same way.
        name = library_name(opts.face, str(name))
        if name not in _listed:
            _listed[name] = ctypes_ndk.use_device(str(name))
        if _listed[name] is not None:
            raise CaseFailure(str(_listed[name]))
    saved = mode_runtime.N
    mode_runtime.N = ctypes_ndk  # type: ignore[assignment]
    try:
        return mode_runtime.run(device, case, opts, name)
    finally:
        mode_runtime.N = saved
