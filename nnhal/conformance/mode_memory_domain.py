"""Conformance mode ``memory_domain``: every input and output is a driver-allocated buffer.

As the upstream harness does for its memory-domain tests, each execution path gets fresh
buffers: one ``IDevice.allocate`` per input (input role ``(0, i)``) written with ``copyFrom``
from shared memory holding the case's value, one per output (output role ``(0, k)``) read back
with ``copyTo`` and checked as in general mode. An input without data stays omitted
(``hasNoValue``). The buffer descriptors leave the dimensions to the roles, and ``copyFrom``
passes no dimensions when the model's input is fully specified (so the buffer must deduce
them), the case's dimensions otherwise.

Paths: synchronous and asynchronous (MeasureTiming NO), and fenced when the prepared model
implements it. Zero-sized outputs: the buffer still receives the output (the execution must
succeed and report the zero-sized shape), but there is nothing to copy out, so, as upstream,
no ``copyTo`` is made for it; a fenced execution of a model whose outputs are not fully
specified (which includes every zero-sized output) must be refused with INVALID_ARGUMENT.
``expectFailure`` cases (not run by upstream in this mode) must fail somewhere: in prepare,
allocate, copyFrom or the execution.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from nnhal.conformance.cases import Case, Expected, outputs_fully_specified, values_array
from nnhal.conformance.runner import (
    CALLBACK_TIMEOUT_S,
    CaseFailure,
    ExpectedFailureSeen,
    Options,
    check_outputs,
    prepare,
)
from nnhal.hal.interfaces import IDevice, IPreparedModel
from nnhal.hal.types import (
    BufferDesc,
    BufferRole,
    DataLocation,
    ErrorStatus,
    MeasureTiming,
    MemoryPool,
    OperandType,
    Request,
    RequestArgument,
)
from nnhal.hidl import ExecutionCallback
from nnhal.hidl import execute as execute_1_3
from nnhal.memory import SharedMemory

_MISSED_DEADLINE = (ErrorStatus.MISSED_DEADLINE_TRANSIENT, ErrorStatus.MISSED_DEADLINE_PERSISTENT)


class _AllocFailed(Exception):
    """A buffer could not be allocated or written; carries the status."""

    def __init__(self, status: ErrorStatus, message: str):
        super().__init__(message)
        self.status = status


class DomainRequest:
    """A request whose every argument is a driver buffer; duck-types BuiltRequest for
    :func:`check_outputs` (``outputs`` and ``read_output``)."""

    def __init__(self, device: IDevice, pm: IPreparedModel, case_model: dict[str, Any]):
        self.buffers: list[Any] = []
        self._tokens: list[int] = []
        self.outputs: list[Expected] = []
        self._out_buffers: list[Any] = []
        main = case_model["main"]
        pools: list[MemoryPool] = []
        in_args: list[RequestArgument] = []
        try:
            for i, idx in enumerate(main["inputIndexes"]):
                o = main["operands"][idx]
                if not o["data"]:
                    in_args.append(RequestArgument(True, DataLocation(0, 0, 0), []))
                    continue
                buf = self._allocate(device, pm, [BufferRole(0, i, 1.0)], [], f"input {i}")
                self._write_input(buf, o, i)
                in_args.append(RequestArgument(False, DataLocation(len(pools), 0, 0), []))
                pools.append(MemoryPool.of_token(self._tokens[-1]))
            out_args: list[RequestArgument] = []
            for k, idx in enumerate(main["outputIndexes"]):
                o = main["operands"][idx]
                t = OperandType[o["type"]]
                buf = self._allocate(device, pm, [], [BufferRole(0, k, 1.0)], f"output {k}")
                self._out_buffers.append(buf)
                out_args.append(RequestArgument(False, DataLocation(len(pools), 0, 0), []))
                pools.append(MemoryPool.of_token(self._tokens[-1]))
                vals = values_array(t, o["data"], o["dimensions"])
                self.outputs.append(Expected(
                    t, list(o["dimensions"]),
                    vals.view(np.bool_) if t == OperandType.TENSOR_BOOL8 else vals,
                    bool(o.get("isIgnored")), float(o["scale"]), int(o["zeroPoint"])))
        except BaseException:
            self.close()
            raise
        self.request = Request(inputs=in_args, outputs=out_args, pools=list(pools))

    def _allocate(self, device: IDevice, pm: IPreparedModel, ins: list[BufferRole],
                  outs: list[BufferRole], what: str) -> Any:
        status, buf, token = device.allocate(BufferDesc([]), [pm], ins, outs)
        status = ErrorStatus(status)
        if status != ErrorStatus.NONE:
            if buf is not None or token != 0:
                raise CaseFailure(f"allocate for {what} failed with {status.name} but returned "
                                  f"a buffer or token {token}")
            raise _AllocFailed(status, f"allocate for {what}: {status.name}")
        if buf is None or not 0 < token <= 2**32 - 1:
            raise CaseFailure(f"allocate for {what}: NONE with buffer {buf!r}, token {token}")
        if token in self._tokens:
            raise CaseFailure(f"allocate for {what}: token {token} already in use")
        self.buffers.append(buf)
        self._tokens.append(int(token))
        return buf

    @staticmethod
    def _write_input(buf: Any, o: dict[str, Any], i: int) -> None:
        t = OperandType[o["type"]]
        blob = values_array(t, o["data"], o["dimensions"]).tobytes()
        dims = list(o["dimensions"])
        if t.is_scalar or (dims and 0 not in dims):
            dims = []  # fully specified in the model: the buffer knows them from its role
        src = SharedMemory.from_bytes(blob)
        try:
            status = ErrorStatus(buf.copy_from(src, dims))
        finally:
            src.close()
        if status != ErrorStatus.NONE:
            raise _AllocFailed(status, f"copyFrom for input {i}: {status.name}")

    def read_output(self, k: int, dims: list[int]) -> np.ndarray:
        exp = self.outputs[k]
        count = int(np.prod(dims, dtype=np.int64)) if dims else 1
        size = count * exp.type.byte_size
        if size == 0:  # zero-sized: nothing to copy out (as upstream)
            return np.zeros(dims, dtype=exp.type.dtype)
        mem = SharedMemory.ashmem(size)
        try:
            status = ErrorStatus(self._out_buffers[k].copy_to(mem))
            if status != ErrorStatus.NONE:
                raise CaseFailure(f"copyTo of output {k}: {status.name}")
            raw = mem.array().copy()
        finally:
            mem.close()
        arr = raw.view(exp.type.dtype) if exp.type.dtype != np.bool_ else raw != 0
        return arr.reshape(dims) if dims else arr.reshape(())

    def close(self) -> None:
        for buf in self.buffers:
            close = getattr(buf, "close", None)
            if close is not None:
                close()
        self.buffers.clear()
        self._out_buffers.clear()


# ---- execution paths ----------------------------------------------------------------------

PathFn = Callable[[IPreparedModel, Request, Options], tuple[ErrorStatus, list[Any]]]


def _sync(pm: IPreparedModel, request: Request, opts: Options) -> tuple[ErrorStatus, list[Any]]:
    status, shapes, _ = pm.execute_synchronously(request, MeasureTiming.NO, None,
                                                 opts.loop_timeout_ns)
    return ErrorStatus(status), list(shapes)


def _async(pm: IPreparedModel, request: Request, opts: Options) -> tuple[ErrorStatus, list[Any]]:
    cb = ExecutionCallback()
    launch = ErrorStatus(execute_1_3(pm, request, MeasureTiming.NO, None, opts.loop_timeout_ns,
                                     cb))
    status, shapes, _ = cb.wait(CALLBACK_TIMEOUT_S)
    if cb.calls != 1:
        raise CaseFailure(f"execution callback called {cb.calls} times")
    if launch != ErrorStatus.NONE and launch != status:
        raise CaseFailure(f"launch status {launch.name} but callback {status.name}")
    return ErrorStatus(status), list(shapes)


def _fenced(pm: IPreparedModel, request: Request, opts: Options
            ) -> tuple[ErrorStatus, list[Any]]:
    status, fence, cb = pm.execute_fenced(request, [], MeasureTiming.NO, None,
                                          opts.loop_timeout_ns, None)
    status = ErrorStatus(status)
    if status != ErrorStatus.NONE:
        return status, []
    try:
        if fence is not None:
            fence.wait(CALLBACK_TIMEOUT_S)
        status = ErrorStatus(cb.get_execution_info()[0])
    finally:
        if fence is not None:
            fence.close()
    return status, []


def _has_fenced(pm: IPreparedModel) -> bool:
    return type(pm).execute_fenced is not IPreparedModel.execute_fenced


def _check_shapes(shapes: list[Any], req: DomainRequest) -> None:
    if shapes and len(shapes) != len(req.outputs):
        raise CaseFailure(f"{len(shapes)} output shapes for {len(req.outputs)} outputs")
    for k, s in enumerate(shapes):
        if not s.is_sufficient:
            raise CaseFailure(f"output {k} reported insufficient")


def run(device: IDevice, case: Case, opts: Options) -> str:
    m = case.data["model"]
    pm = prepare(device, case, m)
    paths: list[tuple[str, PathFn]] = [("sync", _sync)]
    if opts.async_path:
        paths.append(("async", _async))
    fenced = _has_fenced(pm)
    if fenced:
        paths.append(("fenced", _fenced))
    for label, fn in paths:
        try:
            req = DomainRequest(device, pm, m)
        except _AllocFailed as e:
            if case.expect_failure:
                raise ExpectedFailureSeen(str(e)) from None
            raise CaseFailure(f"{label}: {e}") from None
        try:
            status, shapes = fn(pm, req.request, opts)
            if label == "fenced" and not outputs_fully_specified(m) and \
                    not case.expect_failure:
                if status != ErrorStatus.INVALID_ARGUMENT:
                    raise CaseFailure(f"fenced: outputs not fully specified, got "
                                      f"{status.name}, expected INVALID_ARGUMENT")
                continue
            if case.expect_failure:
                if status == ErrorStatus.NONE:
                    raise CaseFailure(f"{label}: expected a failure, execution succeeded")
                if "infinite_loop" in case.name and status not in _MISSED_DEADLINE:
                    raise CaseFailure(f"{label}: endless loop ended with {status.name}, "
                                      f"expected MISSED_DEADLINE_*")
                continue
            if status != ErrorStatus.NONE:
                raise CaseFailure(f"{label}: execution failed with {status.name}")
            _check_shapes(shapes, req)
            try:
                check_outputs(case, req, shapes)  # type: ignore[arg-type]
            except CaseFailure as e:
                raise CaseFailure(f"{label}: {e}") from None
        finally:
            req.close()
    if case.expect_failure:
        return "failed as expected"
    return "+".join(lb for lb, _ in paths) + " via driver buffers"
