"""The operation resolver: each operation registers validate, prepare and a kernel factory.

Modelled on the NNAPI operation resolver and TFLite's Prepare/Eval split:

* the operation's signature (``SIGNATURES`` in its module, see :mod:`nnhal.ops.signature`)
  declares its inputs and outputs: counts, types, omission and constancy are checked from it.
* ``validate(ctx)`` checks the rest of ``operations-1.3.hal``: ranks, shapes, parameter values
  and quantization relations. It raises :class:`OpError` (INVALID_ARGUMENT) on a violation.
  Both run once per model, in the analysis (:mod:`nnhal.analysis`).
* ``prepare(ctx)`` (optional) infers output shapes from input shapes known at prepare time
  (``0`` marks an unknown dimension, ``None`` an unknown rank). The analysis asks for both
  through ``validate_and_prepare(ctx)``; a validate that infers the shapes (to check them)
  returns them, so they are inferred once.
* ``kernel(ctx)`` runs once per operation in ``prepareModel``: it unpacks constants, picks the
  arithmetic and returns the bound kernel ``run(ins, rt) -> outs`` that every execution calls.
  ``ins`` are numpy arrays (0-d for scalars, ``None`` for omitted optional inputs) and ``outs``
  must have the output operands' element types. Execution-time errors are raised as
  :class:`OpError` (or any exception, reported as GENERAL_FAILURE).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from nnhal.hal.types import ErrorStatus, OperandLifeTime, OperandType, OperationType

Shape = tuple[int, ...] | None
_NO_VALUE = OperandLifeTime.NO_VALUE
_CONSTANT_LIFETIMES = frozenset({OperandLifeTime.CONSTANT_COPY,
                                 OperandLifeTime.CONSTANT_REFERENCE})


class OpError(Exception):
    """An operation rejected its operands; carries the HAL status to report."""

    def __init__(self, message: str, status: ErrorStatus = ErrorStatus.INVALID_ARGUMENT):
        super().__init__(message)
        self.status = status


@dataclass(slots=True)
class OperandInfo:
    """What an operation may know about one operand at prepare time.

    ``shape`` is ``()`` for scalars, ``None`` for a tensor of unknown rank, and may hold 0 for
    unknown dimensions. ``value`` is the decoded constant (CONSTANT_COPY/REFERENCE), the
    subgraph index (SUBGRAPH), or ``None``. ``type`` is an :class:`OperandType` or, for a
    vendor extension's operand, an :class:`~nnhal.hal.types.ExtensionOperandType`.
    """

    type: OperandType
    shape: Shape
    scale: float = 0.0
    zero_point: int = 0
    channel_scales: np.ndarray | None = None
    channel_dim: int = 0
    lifetime: OperandLifeTime = OperandLifeTime.TEMPORARY_VARIABLE
    value: Any = None
    #: An extension operand's ``extraParams.extension`` bytes (None when it has none).
    extension_params: bytes | None = None

    @property
    def omitted(self) -> bool:
        return self.lifetime == _NO_VALUE

    @property
    def is_const(self) -> bool:
        return self.value is not None and self.lifetime in _CONSTANT_LIFETIMES

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    @property
    def fully_specified(self) -> bool:
        return self.shape is not None and all(d > 0 for d in self.shape)

    @property
    def dtype(self) -> np.dtype:
        return self.type.dtype


class RunContext(Protocol):
    """Per-execution state a kernel may consult (only control flow needs it)."""

    loop_timeout_ns: int

    def check_deadline(self) -> None: ...


SubgraphRunner = Callable[[Sequence[np.ndarray], RunContext], list[np.ndarray]]
Kernel = Callable[[Sequence[Any], RunContext], list[np.ndarray]]
#: A kernel that writes its outputs into the arrays it is given: C-contiguous, of the output
#: operands' dtypes and fully known shapes, planned at prepare (arena slots) and never aliasing
#: an input of the same call. It returns nothing; what it does not write is undefined.
IntoKernel = Callable[[Sequence[Any], Sequence[np.ndarray], RunContext], None]


@dataclass(slots=True)
class OpContext:
    """An operation's view of its operands during validate, prepare and kernel binding."""

    op_type: OperationType
    inputs: list[OperandInfo]
    outputs: list[OperandInfo]
    relaxed: bool = False
    #: Subgraph runners by index into Model.referenced (set by the executor; control flow only).
    subgraphs: Sequence[Any] = field(default_factory=list)

    # ---- helpers for validate -------------------------------------------------------------
    def fail(self, message: str) -> OpError:
        return OpError(f"{self.op_type.name}: {message}")

    def require(self, condition: bool, message: str) -> None:
        if not condition:
            raise self.fail(message)

    def expect_rank(self, index: int, ranks: int | Sequence[int], *, output: bool = False) -> None:
        shape = (self.outputs if output else self.inputs)[index].shape
        if shape is None or len(shape) == ranks:  # an unknown rank, or the one expected
            return
        allowed = (ranks,) if isinstance(ranks, int) else tuple(ranks)
        if len(shape) not in allowed:
            raise self.fail(f"{'output' if output else 'input'} {index} has rank {len(shape)}, "
                            f"expected {' or '.join(map(str, allowed))}")

    def const(self, index: int) -> Any:
        """The constant value of an input, or ``None`` when it is only known at run time."""
        info = self.inputs[index]
        return info.value if info.is_const else None

    def has_value(self, index: int) -> bool:
        """Whether input ``index`` is present (the operation has it) and not omitted."""
        return index < len(self.inputs) and not self.inputs[index].omitted

    def dim(self, index: int, axis: int, *, output: bool = False) -> int | None:
        """A dimension known at prepare time; ``None`` for an unknown rank or dimension."""
        info = (self.outputs if output else self.inputs)[index]
        shape = info.shape
        if shape is None or info.omitted or not -len(shape) <= axis < len(shape) or \
                shape[axis] == 0:
            return None
        return int(shape[axis])

    def const_int(self, index: int) -> int | None:
        v = self.const(index) if index < len(self.inputs) else None
        return None if v is None else int(v)

    def const_float(self, index: int) -> float | None:
        v = self.const(index) if index < len(self.inputs) else None
        return None if v is None else float(v)

    def const_ints(self, index: int) -> list[int] | None:
        v = self.const(index) if index < len(self.inputs) else None
        return None if v is None else [int(x) for x in v.reshape(-1)]

    def require_same(self, a: int | None, b: int | None, what: str) -> None:
        """Two sizes that must agree when both are known."""
        if a is not None and b is not None and a != b:
            raise self.fail(f"{what} mismatch: {a} vs {b}")


class OperationDef:
    """Base class of a registered operation. Subclasses override what they need."""

    op_type: OperationType

    def validate(self, ctx: OpContext) -> list[Shape] | None:  # pragma: no cover
        """Every rule of the operation beyond its signature; raises OpError. One that infers
        the output shapes to check them (calls :meth:`prepare`) returns them, so that
        :meth:`validate_and_prepare` does not infer them again."""
        raise NotImplementedError

    def prepare(self, ctx: OpContext) -> list[Shape] | None:
        """Output shapes inferred at prepare time; ``None`` when the op does not infer."""
        return None

    def validate_and_prepare(self, ctx: OpContext) -> list[Shape] | None:
        """:meth:`validate` then :meth:`prepare`, as the analysis asks of every operation;
        the shapes validate returned, when it inferred them to check them, rather than
        inferring them again. An operation may override this to share more than the shapes;
        a subclass that redefines validate or prepare gets this default back
        (:meth:`__init_subclass__`), so an override never skips what it added."""
        inferred = self.validate(ctx)
        return self.prepare(ctx) if inferred is None else inferred

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__
        if ("validate" in own or "prepare" in own) and "validate_and_prepare" not in own:
            cls.validate_and_prepare = OperationDef.validate_and_prepare  # type: ignore

    def kernel(self, ctx: OpContext) -> Kernel:  # pragma: no cover - every op overrides
        raise NotImplementedError

    def kernel_into(self, ctx: OpContext) -> IntoKernel | None:
        """A kernel writing into planned output memory, for outputs of known shape; None when
        the operation has none for this context (the executor then calls :meth:`kernel`)."""
        return None

    def work(self, ctx: OpContext, outputs: Sequence[Shape]) -> int:
        """Roughly the multiply-adds or element visits one execution does, from the shapes
        and constants known at prepare (``ctx.inputs`` carry inferred shapes, ``outputs`` the
        outputs'), so the analysis can bound a model's work before anything runs.

        The default visits every input and output element once, which is right for
        element-wise operations and data movement and an upper bound for reductions. An
        operation whose work per output element the tensor sizes do not bound (a window, a
        filter, a contraction, a recurrence) overrides it; unknown dimensions count as 1.
        """
        return visits(ctx, outputs)


#: Work units (:meth:`OperationDef.work`) of one step of an interpreted loop over elements:
#: the reference's greedy NMS compares candidates in a Python loop (about 2e7 comparisons a
#: second measured here, where vectorised kernels visit about 1e10 elements a second). 100,
#: not the 500 measured, keeps real detection models far under the default bound (Faster
#: R-CNN's 1,000 boxes x 91 classes x 100 detections: 9e8) and a hostile NMS to seconds.
INTERPRETED_STEP = 100
#: Work units of one iteration of an interpreted loop that calls numpy: the reference's
#: ROI_ALIGN and ROI_POOLING (per region) and RANDOM_MULTINOMIAL (per row) spend 30 to 60 us
#: in each, the time of about 3e5 vectorised element visits.
INTERPRETED_ITERATION = 300_000


def elements(shape: Shape) -> int:
    """Elements of a shape known at prepare; an unknown dimension (0) or rank counts as 1,
    so an estimate from it is a lower bound until run time."""
    if not shape:
        return 1
    if min(shape) > 0:  # every dimension known: one product in C
        return math.prod(shape)
    n = 1
    for d in shape:
        if d > 0:
            n *= d
    return n


def visits(ctx: OpContext, outputs: Sequence[Shape]) -> int:
    """Every input and output element once: :meth:`OperationDef.work`'s default."""
    total = 0
    for info in ctx.inputs:
        shape = info.shape
        total += elements(shape) if shape else 1  # a scalar's one element, without a call
    for shape in outputs:
        total += elements(shape)
    return total


class RecurrentDef(OperationDef):
    """A recurrent operation (RNN, LSTM, SVDF and their sequence forms): every row of its
    input (each batch entry at each time step) is multiplied by every matrix input (weights
    and states: roughly the gates' work)."""

    def work(self, ctx: OpContext, outputs: Sequence[Shape]) -> int:
        shape = ctx.inputs[0].shape
        rows = elements(shape[:-1]) if shape else 1
        matrices = 0
        for info in ctx.inputs[1:]:
            if info.shape is not None and len(info.shape) == 2:
                matrices += elements(info.shape)
        return visits(ctx, outputs) + rows * matrices


_REGISTRY: dict[int, OperationDef] = {}


def register(op_type: OperationType) -> Callable[[type[OperationDef]], type[OperationDef]]:
    """Class decorator: instantiate and register an operation definition."""

    def deco(cls: type[OperationDef]) -> type[OperationDef]:
        inst = cls()
        inst.op_type = op_type
        if int(op_type) in _REGISTRY:
            raise RuntimeError(f"{op_type.name} registered twice")
        _REGISTRY[int(op_type)] = inst
        return cls

    return deco


def definitions() -> dict[int, OperationDef]:
    """Every operation registered so far (``nnhal.ops.catalog`` imports them all)."""
    return dict(_REGISTRY)
