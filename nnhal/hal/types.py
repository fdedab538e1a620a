"""The canonical, version-neutral HAL types: what HAL 1.0-1.3 and AIDL v1-v4 all carry.

Like upstream's canonical ``nnapi/Types.h``, one set of types serves every interface version;
the faces (:mod:`nnhal.aidl` for AIDL, HAL 1.3 being these types as they are) convert at their
edge. Config types and hints came with AIDL v4 (feature level 8); ``DEAD_OBJECT`` is the
canonical status of a transport that died, which no interface version sends as a status.

Enum values are the upstream numeric values, so models and packets can be exchanged with
any other NNAPI component. Structures are plain dataclasses: cheap to build, easy to mutate
in tests, and validated only by :mod:`nnhal.validation`, never on construction.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "NO_DIMENSION_TYPES", "OPERAND_TYPES", "OPERATION_TYPES", "OPERATION_TYPE_NAMES",
    "BYTE_SIZE_OF_CACHE_TOKEN", "MAX_NUMBER_OF_CACHE_FILES", "LOOP_TIMEOUT_DEFAULT_NS",
    "LOOP_TIMEOUT_MAXIMUM_NS", "NO_TIME", "EXTENSION_TYPE_LOW_BITS", "OperandType",
    "OperationType", "OperandLifeTime", "ErrorStatus", "DeviceType", "ExecutionPreference",
    "Priority", "MeasureTiming", "Timing", "NO_TIMING", "OutputShape",
    "PerformanceInfo", "OperandPerformance", "Capabilities", "DataLocation",
    "SymmPerChannelQuantParams", "ChannelScales", "Operand", "Operation", "Subgraph", "Model",
    "ExtensionNameAndPrefix", "RequestArgument", "MemoryPool", "Request", "BufferDesc",
    "BufferRole", "Extension", "ExtensionOperandTypeInformation",
    "is_extension_type", "extension_prefix", "extension_low", "make_extension_type",
    "ExtensionOperandType", "operand_type",
    "TokenValuePair", "PrepareModelConfig", "ExecutionConfig",
]

#: Constant::BYTE_SIZE_OF_CACHE_TOKEN
BYTE_SIZE_OF_CACHE_TOKEN = 32
#: Constant::MAX_NUMBER_OF_CACHE_FILES
MAX_NUMBER_OF_CACHE_FILES = 32
#: LoopTimeoutDurationNs::DEFAULT (2 s)
LOOP_TIMEOUT_DEFAULT_NS = 2_000_000_000
#: LoopTimeoutDurationNs::MAXIMUM (15 s)
LOOP_TIMEOUT_MAXIMUM_NS = 15_000_000_000
#: A Timing field that is not available (UINT64_MAX).
NO_TIME = 0xFFFF_FFFF_FFFF_FFFF
#: ExtensionTypeEncoding::LOW_BITS_TYPE: the low 16 bits of an extension type.
EXTENSION_TYPE_LOW_BITS = 16


class OperandType(enum.IntEnum):
    """OperandType (1.3)."""

    FLOAT32 = 0
    INT32 = 1
    UINT32 = 2
    TENSOR_FLOAT32 = 3
    TENSOR_INT32 = 4
    TENSOR_QUANT8_ASYMM = 5
    BOOL = 6
    TENSOR_QUANT16_SYMM = 7
    TENSOR_FLOAT16 = 8
    TENSOR_BOOL8 = 9
    FLOAT16 = 10
    TENSOR_QUANT8_SYMM_PER_CHANNEL = 11
    TENSOR_QUANT16_ASYMM = 12
    TENSOR_QUANT8_SYMM = 13
    TENSOR_QUANT8_ASYMM_SIGNED = 14
    SUBGRAPH = 15
    OEM = 10000
    TENSOR_OEM_BYTE = 10001

    @property
    def is_scalar(self) -> bool:
        return self in _SCALAR_TYPES

    @property
    def is_tensor(self) -> bool:
        return self not in _SCALAR_TYPES and self is not OperandType.SUBGRAPH

    @property
    def dtype(self) -> np.dtype:
        """numpy element type of the operand's stored values."""
        return _DTYPES[self]

    @property
    def byte_size(self) -> int:
        return _DTYPES[self].itemsize


_SCALAR_TYPES = frozenset({
    OperandType.FLOAT32, OperandType.INT32, OperandType.UINT32, OperandType.BOOL,
    OperandType.FLOAT16, OperandType.OEM,
})

_DTYPES: dict[OperandType, np.dtype] = {
    OperandType.FLOAT32: np.dtype(np.float32),
    OperandType.INT32: np.dtype(np.int32),
    OperandType.UINT32: np.dtype(np.uint32),
    OperandType.TENSOR_FLOAT32: np.dtype(np.float32),
    OperandType.TENSOR_INT32: np.dtype(np.int32),
    OperandType.TENSOR_QUANT8_ASYMM: np.dtype(np.uint8),
    OperandType.BOOL: np.dtype(np.bool_),
    OperandType.TENSOR_QUANT16_SYMM: np.dtype(np.int16),
    OperandType.TENSOR_FLOAT16: np.dtype(np.float16),
    OperandType.TENSOR_BOOL8: np.dtype(np.bool_),
    OperandType.FLOAT16: np.dtype(np.float16),
    OperandType.TENSOR_QUANT8_SYMM_PER_CHANNEL: np.dtype(np.int8),
    OperandType.TENSOR_QUANT16_ASYMM: np.dtype(np.uint16),
    OperandType.TENSOR_QUANT8_SYMM: np.dtype(np.int8),
    OperandType.TENSOR_QUANT8_ASYMM_SIGNED: np.dtype(np.int8),
    OperandType.SUBGRAPH: np.dtype(np.uint32),
    OperandType.OEM: np.dtype(np.uint8),
    OperandType.TENSOR_OEM_BYTE: np.dtype(np.uint8),
}


def value_nbytes(operand_type: int, dims: Sequence[int] | None = (), *,
                 zero_is_known: bool = False) -> int | None:
    """Bytes a value of this type and shape occupies: the one size rule of every layer.

    None when the size is not known: a type that is not a HAL operand type (an extension),
    a tensor of unknown rank (no ``dims``) or, unless ``zero_is_known`` (a shape a driver
    reported, where 0 is a real, empty dimension), with an unknown (0) dimension. A scalar is
    its type's size whatever ``dims`` says; a SUBGRAPH reference occupies nothing. Python
    integers: a huge shape gives a huge number, never an overflow; callers bound it.
    """
    if isinstance(operand_type, ExtensionOperandType):
        t = operand_type
        if not t.is_tensor:
            return t.byte_size
    else:
        found = OPERAND_TYPES.get(int(operand_type))  # a look-up, not the enum's call
        if found is None:
            return None
        t = found
    if t is OperandType.SUBGRAPH:
        return 0
    if t in _SCALAR_TYPES:
        return _DTYPES[t].itemsize
    if not dims or (not zero_is_known and 0 in dims):
        return None
    n = t.byte_size
    for d in dims:
        n *= int(d)
    return n


class ExtensionOperandType(int):
    """An extension operand type as one model spells it: the int is its value there (the
    model's prefix << 16 | the type's code within its extension), and ``definition`` what the
    extension declares of it (``is_tensor``, ``byte_size``, ``dtype``, ``name``; see
    :mod:`nnhal.ops.extensions`). It goes wherever an operand type goes (an operand's ``type``,
    an operand info's), so every layer sizes and reads extension operands as it does the HAL's
    own, with no special case: :func:`value_nbytes`, request checks, the executor."""

    definition: object

    def __new__(cls, value: int, definition: object) -> ExtensionOperandType:
        obj = super().__new__(cls, int(value))
        obj.definition = definition
        return obj

    @property
    def is_tensor(self) -> bool:
        return bool(self.definition.is_tensor)  # type: ignore[attr-defined]

    @property
    def is_scalar(self) -> bool:
        return not self.is_tensor

    @property
    def byte_size(self) -> int:
        return int(self.definition.byte_size)  # type: ignore[attr-defined]

    @property
    def dtype(self) -> np.dtype:
        return self.definition.dtype  # type: ignore[attr-defined]

    @property
    def name(self) -> str:
        d = self.definition
        return str(getattr(d, "full_name", None) or d.name)  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return f"<{self.name} {int(self):#x}>"

    def __reduce__(self) -> tuple:
        return (ExtensionOperandType, (int(self), self.definition))

    def __copy__(self) -> ExtensionOperandType:
        return self

    def __deepcopy__(self, memo: dict) -> ExtensionOperandType:
        return self


#: Operand types by value (a look-up for hot paths: the enum's call costs a microsecond).
OPERAND_TYPES: dict[int, OperandType] = {int(t): t for t in OperandType}


def operand_type(value: int) -> OperandType | ExtensionOperandType:
    """An operand's type as an object with ``is_tensor``, ``byte_size``, ``dtype``, ``name``:
    the HAL's enum, or the resolved extension type as it is (ValueError for any other
    value)."""
    if isinstance(value, ExtensionOperandType):
        return value
    found = OPERAND_TYPES.get(value)  # a look-up: the enum's call costs a microsecond
    return found if found is not None else OperandType(value)


def operand_nbytes(op: Operand) -> int | None:
    """Bytes of an operand as declared (see :func:`value_nbytes`; None when unknown)."""
    return value_nbytes(op.type, op.dimensions)


def is_extension_type(value: int) -> bool:
    """Extension operand/operation types have a non-zero 16-bit prefix in the high bits."""
    return (int(value) >> EXTENSION_TYPE_LOW_BITS) != 0


def extension_prefix(value: int) -> int:
    return (int(value) >> EXTENSION_TYPE_LOW_BITS) & 0xFFFF


def extension_low(value: int) -> int:
    return int(value) & 0xFFFF


def make_extension_type(prefix: int, low: int) -> int:
    return ((prefix & 0xFFFF) << EXTENSION_TYPE_LOW_BITS) | (low & 0xFFFF)


# Operation names in their upstream order: the value of each is its index (0..105; 102-105
# came with AIDL v2 and v3).
_OPERATION_NAMES = """
ADD AVERAGE_POOL_2D CONCATENATION CONV_2D DEPTHWISE_CONV_2D DEPTH_TO_SPACE DEQUANTIZE
EMBEDDING_LOOKUP FLOOR FULLY_CONNECTED HASHTABLE_LOOKUP L2_NORMALIZATION L2_POOL_2D
LOCAL_RESPONSE_NORMALIZATION LOGISTIC LSH_PROJECTION LSTM MAX_POOL_2D MUL RELU RELU1 RELU6
RESHAPE RESIZE_BILINEAR RNN SOFTMAX SPACE_TO_DEPTH SVDF TANH
BATCH_TO_SPACE_ND DIV MEAN PAD SPACE_TO_BATCH_ND SQUEEZE STRIDED_SLICE SUB TRANSPOSE
ABS ARGMAX ARGMIN AXIS_ALIGNED_BBOX_TRANSFORM BIDIRECTIONAL_SEQUENCE_LSTM
BIDIRECTIONAL_SEQUENCE_RNN BOX_WITH_NMS_LIMIT CAST CHANNEL_SHUFFLE DETECTION_POSTPROCESSING
EQUAL EXP EXPAND_DIMS GATHER GENERATE_PROPOSALS GREATER GREATER_EQUAL GROUPED_CONV_2D
HEATMAP_MAX_KEYPOINT INSTANCE_NORMALIZATION LESS LESS_EQUAL LOG LOGICAL_AND LOGICAL_NOT
LOGICAL_OR LOG_SOFTMAX MAXIMUM MINIMUM NEG NOT_EQUAL PAD_V2 POW PRELU QUANTIZE
QUANTIZED_16BIT_LSTM RANDOM_MULTINOMIAL REDUCE_ALL REDUCE_ANY REDUCE_MAX REDUCE_MIN
REDUCE_PROD REDUCE_SUM ROI_ALIGN ROI_POOLING RSQRT SELECT SIN SLICE SPLIT SQRT TILE TOPK_V2
TRANSPOSE_CONV_2D UNIDIRECTIONAL_SEQUENCE_LSTM UNIDIRECTIONAL_SEQUENCE_RNN
RESIZE_NEAREST_NEIGHBOR QUANTIZED_LSTM IF WHILE ELU HARD_SWISH FILL RANK
BATCH_MATMUL PACK MIRROR_PAD REVERSE
""".split()

#: OperationType: the 106 fundamental operations plus the deprecated OEM_OPERATION.
OperationType = enum.IntEnum(  # type: ignore[misc]
    "OperationType",
    [(name, value) for value, name in enumerate(_OPERATION_NAMES)] + [("OEM_OPERATION", 10000)],
)
OperationType.__doc__ = "OperationType (1.3)."
OperationType.__module__ = __name__

class OperandLifeTime(enum.IntEnum):
    """OperandLifeTime (1.3); SUBGRAPH_INPUT/OUTPUT were MODEL_INPUT/OUTPUT before 1.3."""

    TEMPORARY_VARIABLE = 0
    SUBGRAPH_INPUT = 1
    SUBGRAPH_OUTPUT = 2
    CONSTANT_COPY = 3
    CONSTANT_REFERENCE = 4
    NO_VALUE = 5
    SUBGRAPH = 6


class ErrorStatus(enum.IntEnum):
    """ErrorStatus (1.3)."""

    NONE = 0
    DEVICE_UNAVAILABLE = 1
    GENERAL_FAILURE = 2
    OUTPUT_INSUFFICIENT_SIZE = 3
    INVALID_ARGUMENT = 4
    MISSED_DEADLINE_TRANSIENT = 5
    MISSED_DEADLINE_PERSISTENT = 6
    RESOURCE_EXHAUSTED_TRANSIENT = 7
    RESOURCE_EXHAUSTED_PERSISTENT = 8
    #: Canonical only: the process or transport behind the interface died (upstream's
    #: ``ErrorStatus::DEAD_OBJECT``). Faces map it to their own death signal.
    DEAD_OBJECT = 10000


class DeviceType(enum.IntEnum):
    """DeviceType (1.2); 0 is unused, as in the HAL."""

    OTHER = 1
    CPU = 2
    GPU = 3
    ACCELERATOR = 4


class ExecutionPreference(enum.IntEnum):
    """ExecutionPreference (1.1)."""

    LOW_POWER = 0
    FAST_SINGLE_ANSWER = 1
    SUSTAINED_SPEED = 2


class Priority(enum.IntEnum):
    """Priority (1.3)."""

    LOW = 0
    MEDIUM = 1
    HIGH = 2


class MeasureTiming(enum.IntEnum):
    """MeasureTiming (1.2)."""

    NO = 0
    YES = 1


@dataclass(frozen=True)
class Timing:
    """Timing (1.2): microseconds; :data:`NO_TIME` (UINT64_MAX) means not available."""

    time_on_device: int = NO_TIME
    time_in_driver: int = NO_TIME

    @property
    def available(self) -> bool:
        return self.time_on_device != NO_TIME or self.time_in_driver != NO_TIME


#: Timing with both fields not available.
NO_TIMING = Timing()


@dataclass
class OutputShape:
    """OutputShape (1.2): the real dimensions of an output and whether its buffer sufficed."""

    dimensions: list[int]
    is_sufficient: bool = True


@dataclass(frozen=True)
class PerformanceInfo:
    """PerformanceInfo (1.0): relative to the CPU, lower is better."""

    exec_time: float = 1.0
    power_usage: float = 1.0


@dataclass(frozen=True)
class OperandPerformance:
    """Capabilities::OperandPerformance (1.3)."""

    type: int
    info: PerformanceInfo


@dataclass
class Capabilities:
    """Capabilities (1.3). ``operand_performance`` is kept sorted by operand type."""

    relaxed_float32_to_float16_performance_scalar: PerformanceInfo
    relaxed_float32_to_float16_performance_tensor: PerformanceInfo
    operand_performance: list[OperandPerformance]
    if_performance: PerformanceInfo
    while_performance: PerformanceInfo

    def performance_of(self, operand_type: int) -> PerformanceInfo | None:
        for p in self.operand_performance:
            if p.type == operand_type:
                return p.info
        return None


@dataclass(frozen=True)
class DataLocation:
    """DataLocation (1.0): bytes ``[offset, offset + length)`` of pool ``pool_index``."""

    pool_index: int = 0
    offset: int = 0
    length: int = 0


class ChannelScales(list):
    """Per-channel scales that cannot change, with their float64 array made once.

    A filter has up to thousands of channels: the field checks, the validation and the
    analysis each read :attr:`array` instead of converting the list again (the importer
    makes its scales so). Still a list of Python floats (equal to one, JSON and the wire
    take it), but frozen: every mutator raises TypeError, so the array always holds the
    same numbers. ``list(scales)`` gives an ordinary, mutable copy.
    """

    __slots__ = ("_array", "_bounds")

    def __init__(self, values: object = ()) -> None:
        if not isinstance(values, (np.ndarray, list, tuple)):
            values = list(values)  # type: ignore[call-overload]  # any iterable, as list()
        arr = np.array(values, dtype=np.float64).reshape(-1)  # a copy nobody else holds
        arr.flags.writeable = False
        super().__init__(arr.tolist())
        self._array = arr
        # NaN propagates into both (every comparison with it then fails, as the checks need).
        self._bounds = (float(arr.min()), float(np.abs(arr).max())) if arr.size else \
            (float("inf"), 0.0)

    @property
    def array(self) -> np.ndarray:
        """The scales as a read-only float64 array."""
        return self._array

    @property
    def bounds(self) -> tuple[float, float]:
        """(the smallest scale, the largest magnitude), NaN when a scale is NaN; (inf, 0)
        when there is none: what the checks of every scale reduce to, computed once."""
        return self._bounds

    def __reduce__(self) -> tuple:  # copy, deepcopy and pickle: rebuilt, not appended to
        return (ChannelScales, (self._array.tolist(),))

    def _frozen(self, *args: object, **kwargs: object) -> None:
        raise TypeError("ChannelScales cannot change; edit list(scales) and assign it")

    __setitem__ = __delitem__ = __iadd__ = __imul__ = _frozen  # type: ignore[assignment]
    append = extend = insert = pop = remove = clear = sort = reverse = _frozen  # type: ignore


@dataclass
class SymmPerChannelQuantParams:
    """SymmPerChannelQuantParams (1.2): Operand.ExtraParams.channelQuant. ``scales`` may be
    a :class:`ChannelScales` (frozen, with its array)."""

    scales: list[float]
    channel_dim: int


@dataclass
class Operand:
    """Operand (1.3). ``extra_params`` is channel quantization or extension bytes."""

    type: int
    dimensions: list[int] = field(default_factory=list)
    number_of_consumers: int = 0
    scale: float = 0.0
    zero_point: int = 0
    lifetime: OperandLifeTime = OperandLifeTime.TEMPORARY_VARIABLE
    location: DataLocation = field(default_factory=DataLocation)
    extra_params: SymmPerChannelQuantParams | bytes | None = None


@dataclass
class Operation:
    """Operation (1.3)."""

    type: int
    inputs: list[int]
    outputs: list[int]


@dataclass
class Subgraph:
    """Subgraph (1.3): operands, operations in execution order, and its inputs and outputs."""

    operands: list[Operand]
    operations: list[Operation]
    input_indexes: list[int]
    output_indexes: list[int]


@dataclass(frozen=True)
class ExtensionNameAndPrefix:
    """Model::ExtensionNameAndPrefix (1.2)."""

    name: str
    prefix: int


@dataclass(frozen=True)
class TokenValuePair:
    """TokenValuePair (AIDL v4): a vendor hint. ``token`` is the extension prefix in its high
    15 bits and the hint's code within the extension in its low 16 bits; the sign bit is 0."""

    token: int
    value: bytes


@dataclass
class PrepareModelConfig:
    """PrepareModelConfig (AIDL v4): everything a preparation needs besides the model.

    ``deadline`` is steady-clock ns or None, as everywhere in the core."""

    preference: ExecutionPreference = ExecutionPreference.FAST_SINGLE_ANSWER
    priority: Priority = Priority.MEDIUM
    deadline: int | None = None
    model_cache: Sequence[object] = ()
    data_cache: Sequence[object] = ()
    cache_token: bytes = bytes(32)
    compilation_hints: Sequence[TokenValuePair] = ()
    extension_name_to_prefix: Sequence[ExtensionNameAndPrefix] = ()


@dataclass(frozen=True)
class ExecutionConfig:
    """ExecutionConfig (AIDL v4): how to run one execution, with the vendor's hints."""

    measure: MeasureTiming = MeasureTiming.NO
    loop_timeout: int | None = None
    execution_hints: tuple[TokenValuePair, ...] = ()
    extension_name_to_prefix: tuple[ExtensionNameAndPrefix, ...] = ()


@dataclass
class Model:
    """Model (1.3). ``pools`` are :class:`nnhal.memory.SharedMemory` objects."""

    main: Subgraph
    referenced: list[Subgraph] = field(default_factory=list)
    operand_values: bytes = b""
    pools: list = field(default_factory=list)
    relax_computation_float32_to_float16: bool = False
    extension_name_to_prefix: list[ExtensionNameAndPrefix] = field(default_factory=list)


@dataclass
class RequestArgument:
    """RequestArgument (1.0). ``dimensions`` empty means "as in the model"."""

    has_no_value: bool = False
    location: DataLocation = field(default_factory=DataLocation)
    dimensions: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class MemoryPool:
    """Request::MemoryPool (1.3): a safe union of shared memory or a memory-domain token."""

    hidl_memory: object | None = None
    token: int | None = None

    @staticmethod
    def of(memory: object) -> MemoryPool:
        return MemoryPool(hidl_memory=memory)

    @staticmethod
    def of_token(token: int) -> MemoryPool:
        return MemoryPool(token=token)


@dataclass
class Request:
    """Request (1.3). Each pool is a :class:`MemoryPool`, or a bare shared memory object."""

    inputs: list[RequestArgument]
    outputs: list[RequestArgument]
    pools: list[MemoryPool | object] = field(default_factory=list)


@dataclass(frozen=True)
class BufferRole:
    """BufferRole (1.3): input or output ``io_index`` of prepared model ``model_index``."""

    model_index: int
    io_index: int
    frequency: float = 1.0


@dataclass
class BufferDesc:
    """BufferDesc (1.3): dimensions of a driver-managed buffer; empty or 0 means unknown."""

    dimensions: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class ExtensionOperandTypeInformation:
    """Extension::OperandTypeInformation (1.2)."""

    type: int
    is_tensor: bool
    byte_size: int


@dataclass
class Extension:
    """Extension (1.2): a vendor extension the driver supports."""

    name: str
    operand_types: list[ExtensionOperandTypeInformation] = field(default_factory=list)


#: Lifetimes by value (a look-up for hot paths; ``OperandLifeTime(x)`` for what is not here).
LIFETIMES: dict[int, OperandLifeTime] = {int(t): t for t in OperandLifeTime}
#: Operation types by value, and their names (look-ups for hot paths; an extension's
#: operation types are not here).
OPERATION_TYPES: dict[int, OperationType] = {int(o): o for o in OperationType}
OPERATION_TYPE_NAMES: dict[int, str] = {k: o.name for k, o in OPERATION_TYPES.items()}
#: The operand types whose operands have no dimensions (scalars, subgraph references).
NO_DIMENSION_TYPES: frozenset[OperandType] = frozenset(
    {t for t in OperandType if t.is_scalar} | {OperandType.SUBGRAPH})
