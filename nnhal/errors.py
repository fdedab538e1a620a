"""The errors nnhal raises to its users.

Each carries one line a person can act on (which file, input, operand or operation, and what
was expected), so that the command line prints it as it is and a program can catch one type.
HAL entry points never raise: they return a status; these are for the layers above the HAL
(model files, the Session, the commands).
"""

from __future__ import annotations


class NnhalError(Exception):
    """Any error nnhal reports to a user; ``str(e)`` is one line."""


class ModelFileError(NnhalError):
    """A model file that cannot be read: missing, not a model, truncated, corrupted, or of a
    schema version nnhal does not know."""

    def __init__(self, path: str, problem: str):
        self.path, self.problem = path, problem
        super().__init__(f"{path}: {problem}")


class UnsupportedModelError(NnhalError):
    """A model that is well formed but cannot be converted: ``items`` names each operator or
    operation (with its index) that has no equivalent, and why."""

    def __init__(self, what: str, items: list[str]):
        self.items = list(items)
        shown = "; ".join(self.items)
        super().__init__(f"{what}: {shown}" if shown else what)


class InvalidModelError(NnhalError):
    """A model a driver refused, with the validation message naming the operand or
    operation; ``status`` is the HAL status the driver returned."""

    def __init__(self, message: str, status: object = None):
        self.status = status
        super().__init__(message)


class InputError(NnhalError):
    """Execution arguments that do not match the model: count, name, dtype or shape."""


class ExecutionError(NnhalError):
    """An execution the driver failed; ``status`` is the HAL status."""

    def __init__(self, message: str, status: object = None):
        self.status = status
        super().__init__(message)


class NdkError(NnhalError):
    """A call of the NNAPI runtime (``nnhal.Model``, ``Compilation``, ``Execution``...) that
    the C API would have answered with a result code other than NO_ERROR; ``code`` is that
    code (an int of :class:`nnhal.runtime.codes.ResultCode`)."""

    def __init__(self, code: int, message: str):
        self.code = int(code)
        super().__init__(message)


def one_line(e: BaseException) -> str:
    """``Type: first line`` of any exception, for a message built around an error nnhal did
    not raise itself (a feed's or a driver's code); safe against a ``__str__`` that raises."""
    try:
        text = str(e)
    except Exception:  # noqa: BLE001 - the exception's own code may be hostile
        text = ""
    first = text.strip().splitlines()[0] if text.strip() else ""
    name = type(e).__name__
    return f"{name}: {first}" if first else name
