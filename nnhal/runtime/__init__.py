"""The NNAPI runtime: the NDK's objects over the drivers of :mod:`nnhal.drivers`.

One core (:class:`NdkModel`, :class:`Compilation`, :class:`Execution`, :class:`Memory`,
:class:`MemoryDesc`, :class:`Event`, :class:`Burst`, :class:`Device`), whose methods raise
:class:`nnhal.NdkError` carrying the NDK result code, and its C-API face
:mod:`nnhal.runtime.ndk`, whose ``ANeuralNetworks*`` functions return the codes instead.
"""

from nnhal.runtime.codes import DurationCode, PreferenceCode, PriorityCode, ResultCode
from nnhal.runtime.compilation import Compilation
from nnhal.runtime.devices import Device, devices
from nnhal.runtime.execution import Burst, Event, Execution
from nnhal.runtime.memory import Memory, MemoryDesc
from nnhal.runtime.model import ANeuralNetworksOperandType, NdkModel

OperandSpec = ANeuralNetworksOperandType

__all__ = ["ANeuralNetworksOperandType", "Burst", "Compilation", "Device", "DurationCode",
           "Event", "Execution", "Memory", "MemoryDesc", "NdkModel", "OperandSpec",
           "PreferenceCode", "PriorityCode", "ResultCode", "devices"]
