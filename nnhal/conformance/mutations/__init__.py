"""Hostile input for a driver: invalid models, invalid requests and random garbage.

The package is split by what it mutates; each module imports only the ones above it:

- :mod:`.common`: outcomes of a check, the callback timeout, operand type groups;
- :mod:`.model`: model mutants (:func:`model_mutations`, :func:`check_model_mutant`);
- :mod:`.paths`: execution paths of a prepared model (sync, async, burst, reusable, fenced)
  and :func:`call_with_timeout`;
- :mod:`.request`: request mutants (:func:`request_mutations`, :func:`check_request_mutant`);
- :mod:`.fuzz`: random models and requests, byte corruptions;
- :mod:`.cli`: whole-suite runs and ``nnhal mutations`` (:func:`run_cli`).

The names below are re-exported so that ``from nnhal.conformance.mutations import X`` keeps
working.
"""

from nnhal.conformance.mutations.cli import (
    Totals,
    add_arguments,
    main,
    run_cli,
    run_model_mutations,
    run_request_mutations,
)
from nnhal.conformance.mutations.common import (
    ACCEPTED,
    CALLBACK_TIMEOUT_S,
    CRASH,
    HANG,
    REJECTED,
    WRONG_STATUS,
    byte_size,
)
from nnhal.conformance.mutations.fuzz import (
    GUARD,
    GUARD_BYTE,
    MAX_FUZZ_ELEMENTS,
    FuzzRequest,
    mutate_bytes,
    mutate_model_bytes,
    random_model,
    random_request,
    random_typed_model,
)
from nnhal.conformance.mutations.model import (
    INVALID_OPERAND_TYPES,
    INVALID_OPERATION_TYPES,
    MAX_CONSTANT_COPY,
    UNDECLARED_EXTENSION_TYPE,
    ModelMutant,
    check_model_mutant,
    copy_model,
    copy_operand,
    copy_subgraph,
    model_mutations,
    relaxed_control,
)
from nnhal.conformance.mutations.paths import (
    ALL_PATHS,
    PathFn,
    PathResult,
    SharedBurst,
    call_with_timeout,
    execution_paths,
)
from nnhal.conformance.mutations.request import (
    RequestMutant,
    check_request_mutant,
    copy_request,
    request_mutations,
    required_inputs,
)

__all__ = [
    "ACCEPTED", "ALL_PATHS", "CALLBACK_TIMEOUT_S", "CRASH", "GUARD", "GUARD_BYTE", "HANG",
    "INVALID_OPERAND_TYPES", "INVALID_OPERATION_TYPES", "MAX_CONSTANT_COPY",
    "MAX_FUZZ_ELEMENTS", "REJECTED", "UNDECLARED_EXTENSION_TYPE", "WRONG_STATUS",
    "FuzzRequest", "ModelMutant", "PathFn", "PathResult", "RequestMutant", "SharedBurst", "Totals",
    "add_arguments", "byte_size", "call_with_timeout", "check_model_mutant",
    "check_request_mutant", "copy_model", "copy_operand", "copy_request", "copy_subgraph",
    "execution_paths", "main", "model_mutations", "mutate_bytes", "mutate_model_bytes",
    "random_model", "random_request", "random_typed_model",
    "relaxed_control", "request_mutations", "required_inputs", "run_cli",
    "run_model_mutations", "run_request_mutations",
]
