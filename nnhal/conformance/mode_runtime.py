"""Mode ``runtime``: each case through the NNAPI runtime (:mod:`nnhal.runtime.ndk`), as the
upstream generated CTS tests drive the NDK.

The model is built call by call (addOperand, setOperandValue for copied constants and omitted
operands, setOperandValueFromMemory for referenced ones, setOperandValueFromModel for
subgraphs, setOperandSymmPerChannelQuantParams, addOperation, identifyInputsAndOutputs,
relaxComputationFloat32toFloat16, finish), compiled with createForDevices on the device under
test (and, with ``Options.runtime_create``, also with plain create over every available
device), then executed through compute, startCompute (timing measured), burstCompute and a
reusable execution computed twice. An expectFailure case passes when finish, compilation or
every execution fails with a code other than NO_ERROR.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from nnhal.conformance.cases import Case, Expected, MalformedCase, values_array
from nnhal.conformance.faces import DEFAULT_FACE
from nnhal.conformance.runner import (
    CaseFailure,
    ExpectedFailureSeen,
    Options,
    Unsupported,
    compare,
)
from nnhal.hal.interfaces import IDevice
from nnhal.hal.types import OperandLifeTime, OperandType, OperationType
from nnhal.runtime import ndk as N
from nnhal.runtime.codes import PROT_READ, ResultCode
from nnhal.runtime.devices import Device

OK = int(ResultCode.NO_ERROR)


class _Built:
    """A model built through the NDK, with what keeps its referenced values alive."""

    def __init__(self) -> None:
        self.keep: list[Any] = []
        self.models: list[Any] = []


def _code_name(code: int) -> str:
    try:
        return ResultCode(code).name
    except ValueError:
        return str(code)


def _check(code: int, what: str) -> None:
    if code != OK:
        raise MalformedCase(f"{what}: {_code_name(code)}")


def _subgraph(sg: dict[str, Any], refs: dict[int, Any], relaxed: bool, built: _Built,
              expect_failure: bool) -> Any:
    code, model = N.ANeuralNetworksModel_create()
    _check(code, "Model_create")
    built.models.append(model)
    ref_blobs: list[tuple[int, bytes]] = []
    for i, o in enumerate(sg["operands"]):
        t = OperandType[o["type"]]
        dims = [int(d) for d in o["dimensions"]]
        code = N.ANeuralNetworksModel_addOperand(
            model, N.ANeuralNetworksOperandType(int(t), dims, float(o["scale"]),
                                                int(o["zeroPoint"])))
        if code != OK:
            raise _Failed("addOperand", code)
        cq = o.get("channelQuant")
        if cq:
            code = N.ANeuralNetworksModel_setOperandSymmPerChannelQuantParams(
                model, i, N.ANeuralNetworksSymmPerChannelQuantParams(
                    int(cq["channelDim"]), [float(s) for s in cq["scales"]]))
            if code != OK:
                raise _Failed("setOperandSymmPerChannelQuantParams", code)
        lt = OperandLifeTime[o["lifetime"]]
        if lt == OperandLifeTime.CONSTANT_COPY:
            blob = values_array(t, o["data"], dims).tobytes()
            built.keep.append(blob)
            code = N.ANeuralNetworksModel_setOperandValue(model, i, blob, len(blob))
        elif lt == OperandLifeTime.CONSTANT_REFERENCE:
            ref_blobs.append((i, values_array(t, o["data"], dims).tobytes()))
            continue
        elif lt == OperandLifeTime.NO_VALUE:
            code = N.ANeuralNetworksModel_setOperandValue(model, i, None, 0)
        elif lt == OperandLifeTime.SUBGRAPH:
            code = N.ANeuralNetworksModel_setOperandValueFromModel(model, i,
                                                                   refs[int(o["data"][0])])
        if code != OK:
            raise _Failed("setOperandValue", code)
    if ref_blobs:  # every referenced value in one memory, as the CTS wrapper lays them out
        offsets, size = [], 0
        for _i, blob in ref_blobs:
            size += -size % 8
            offsets.append(size)
            size += len(blob)
        fd = os.memfd_create("nnhal-cts-constants", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, max(size, 1))
            for off, (_i, blob) in zip(offsets, ref_blobs):
                os.pwrite(fd, blob, off)
            code, memory = N.ANeuralNetworksMemory_createFromFd(max(size, 1), PROT_READ, fd, 0)
        finally:
            os.close(fd)
        _check(code, "Memory_createFromFd")
        built.keep.append(memory)
        for off, (i, blob) in zip(offsets, ref_blobs):
            code = N.ANeuralNetworksModel_setOperandValueFromMemory(model, i, memory, off,
                                                                    len(blob))
            if code != OK:
                raise _Failed("setOperandValueFromMemory", code)
    for op in sg["operations"]:
        code = N.ANeuralNetworksModel_addOperation(model, int(OperationType[op["type"]]),
                                                   op["inputs"], op["outputs"])
        if code != OK:
            raise _Failed(f"addOperation {op['type']}", code)
    code = N.ANeuralNetworksModel_identifyInputsAndOutputs(model, sg["inputIndexes"],
                                                           sg["outputIndexes"])
    if code != OK:
        raise _Failed("identifyInputsAndOutputs", code)
    if relaxed:
        _check(N.ANeuralNetworksModel_relaxComputationFloat32toFloat16(model, True),
               "relaxComputationFloat32toFloat16")
    code = N.ANeuralNetworksModel_finish(model)
    if code != OK:
        raise _Failed("finish", code)
    return model


class _Failed(Exception):
    """An NDK call failed: the call and its code."""

    def __init__(self, what: str, code: int):
        self.what, self.code = what, code
        super().__init__(f"{what}: {_code_name(code)}")


def build(case_model: dict[str, Any], expect_failure: bool = False) -> tuple[Any, _Built]:
    """The case's model through the NDK calls (referenced subgraphs first)."""
    built = _Built()
    relaxed = bool(case_model.get("isRelaxed"))
    referenced = case_model["referenced"]
    done: dict[int, Any] = {}

    def ref(k: int, stack: tuple[int, ...] = ()) -> Any:
        if k in done:
            return done[k]
        if k in stack or not 0 <= k < len(referenced):
            raise _Failed("setOperandValueFromModel", int(ResultCode.BAD_DATA))
        sg = referenced[k]
        needed = [int(o["data"][0]) for o in sg["operands"] if o["lifetime"] == "SUBGRAPH"]
        refs = {j: ref(j, stack + (k,)) for j in needed}
        done[k] = _subgraph(sg, refs, relaxed, built, expect_failure)
        return done[k]

    main = case_model["main"]
    needed = [int(o["data"][0]) for o in main["operands"] if o["lifetime"] == "SUBGRAPH"]
    refs = {j: ref(j) for j in needed}
    return _subgraph(main, refs, relaxed, built, expect_failure), built


def _expected(case_model: dict[str, Any]) -> list[Expected]:
    main = case_model["main"]
    out = []
    for idx in main["outputIndexes"]:
        o = main["operands"][idx]
        t = OperandType[o["type"]]
        vals = values_array(t, o["data"], o["dimensions"])
        out.append(Expected(t, list(o["dimensions"]), vals.view(np.bool_) if
                            t == OperandType.TENSOR_BOOL8 else vals, bool(o.get("isIgnored")),
                            float(o["scale"]), int(o["zeroPoint"])))
    return out


def _run_path(label: str, compilation: Any, case: Case, opts: Options, burst: Any,
              single: bool) -> tuple[int, list[np.ndarray], list[list[int]]]:
    m = case.data["model"]
    main = m["main"]
    code, ex = N.ANeuralNetworksExecution_create(compilation)
    _check(code, "Execution_create")
    try:
        if label == "reusable":
            _check(N.ANeuralNetworksExecution_setReusable(ex, True), "setReusable")
        if label == "startCompute" and single:
            _check(N.ANeuralNetworksExecution_setMeasureTiming(ex, True), "setMeasureTiming")
        if opts.loop_timeout_ns is not None:
            _check(N.ANeuralNetworksExecution_setLoopTimeout(ex, opts.loop_timeout_ns),
                   "setLoopTimeout")
        keep = []
        for k, idx in enumerate(main["inputIndexes"]):
            o = main["operands"][idx]
            t = OperandType[o["type"]]
            if not o["data"]:
                code = N.ANeuralNetworksExecution_setInput(ex, k, None, None, 0)
            else:
                arr = values_array(t, o["data"], o["dimensions"])
                keep.append(arr)
                code = N.ANeuralNetworksExecution_setInput(ex, k, None, arr, arr.nbytes)
            if code != OK:
                return code, [], []
        outs = []
        for k, exp in enumerate(_expected(m)):
            buf = np.zeros(max(exp.values.nbytes, 1), np.uint8)
            outs.append(buf)
            code = N.ANeuralNetworksExecution_setOutput(ex, k, None, buf, exp.values.nbytes)
            if code != OK:
                return code, [], []
        runs = 2 if label == "reusable" else 1
        for _ in range(runs):
            if label == "startCompute":
                code, event = N.ANeuralNetworksExecution_startCompute(ex)
                if code == OK:
                    code = N.ANeuralNetworksEvent_wait(event)
                    N.ANeuralNetworksEvent_free(event)
                    if code == OK and single:
                        for dc in range(4):
                            c2, _ns = N.ANeuralNetworksExecution_getDuration(ex, dc)
                            if c2 != OK:
                                raise CaseFailure(f"{label}: getDuration({dc}): "
                                                  f"{_code_name(c2)}")
            elif label == "burst":
                code = N.ANeuralNetworksExecution_burstCompute(ex, burst)
            else:
                code = N.ANeuralNetworksExecution_compute(ex)
            if code != OK:
                return code, [], []
        dims = []
        for k in range(len(main["outputIndexes"])):
            c2, rank = N.ANeuralNetworksExecution_getOutputOperandRank(ex, k)
            if c2 != OK:
                raise CaseFailure(f"{label}: getOutputOperandRank({k}): {_code_name(c2)}")
            if rank:
                c2, d = N.ANeuralNetworksExecution_getOutputOperandDimensions(ex, k)
                if c2 != OK:
                    raise CaseFailure(f"{label}: getOutputOperandDimensions({k}): "
                                      f"{_code_name(c2)}")
                dims.append(list(d))
            else:
                dims.append([])
        return OK, outs, dims
    finally:
        N.ANeuralNetworksExecution_free(ex)


PATHS = ("compute", "startCompute", "burst", "reusable")


def _check_results(case: Case, label: str, outs: list[np.ndarray],
                   dims: list[list[int]]) -> None:
    for k, exp in enumerate(_expected(case.data["model"])):
        if exp.type.is_tensor and dims[k] != list(exp.dims):
            if exp.ignored:
                continue
            raise CaseFailure(f"{label}: output {k}: reported shape {dims[k]}, expected "
                              f"{exp.dims}")
        raw = outs[k][:exp.values.nbytes]
        actual = raw.view(exp.type.dtype) if exp.type.dtype != np.bool_ else raw != 0
        actual = actual.reshape(exp.dims) if exp.dims else actual.reshape(())
        try:
            if case.multinomial_tolerance > 0:
                from nnhal.conformance.runner import check_multinomial

                check_multinomial(case, None, actual)  # type: ignore[arg-type]
            else:
                compare(case, k, exp, actual)
        except CaseFailure as e:
            raise CaseFailure(f"{label}: {e}") from None


def _compile_and_run(case: Case, model: Any, devices: list[Any] | None, opts: Options,
                     tag: str, look: Callable[[Any], None] | None = None) -> None:
    """Compile and run every path; ``look`` sees the finished compilation (its plan)."""
    if devices is not None:
        code, comp = N.ANeuralNetworksCompilation_createForDevices(model, devices)
    else:
        code, comp = N.ANeuralNetworksCompilation_create(model)
    _check(code, f"{tag}: Compilation_create")
    burst = None
    try:
        code = N.ANeuralNetworksCompilation_finish(comp)
        if code != OK:
            if case.expect_failure:
                raise ExpectedFailureSeen(f"{tag}: Compilation_finish: {_code_name(code)}")
            raise CaseFailure(f"{tag}: Compilation_finish: {_code_name(code)}")
        if look is not None:
            look(comp)
        code, burst = N.ANeuralNetworksBurst_create(comp)
        _check(code, "Burst_create")
        single = devices is not None and len(devices) == 1
        failures = 0
        for label in PATHS:
            code, outs, dims = _run_path(label, comp, case, opts, burst, single)
            if case.expect_failure:
                if code == OK:
                    raise CaseFailure(f"{tag} {label}: expected a failure, execution "
                                      f"succeeded")
                failures += 1
                continue
            if code != OK:
                raise CaseFailure(f"{tag} {label}: execution failed with {_code_name(code)}")
            _check_results(case, f"{tag} {label}", outs, dims)
        if case.expect_failure and failures:
            raise ExpectedFailureSeen(f"{tag}: every execution failed")
    finally:
        N.ANeuralNetworksBurst_free(burst)
        N.ANeuralNetworksCompilation_free(comp)


def build_case(case: Case) -> tuple[Any, Any]:
    """The case's model built through the NDK calls (see :func:`build`), a failure of that
    reported as the runner expects: seen (an expectFailure case), failed, or malformed."""
    try:
        return build(case.data["model"], case.expect_failure)
    except _Failed as e:
        if case.expect_failure:
            raise ExpectedFailureSeen(str(e)) from None
        raise CaseFailure(f"model: {e}") from None
    except (KeyError, IndexError, TypeError, ValueError, OverflowError) as e:
        raise MalformedCase(f"cannot build the model: {type(e).__name__}: {e}") from e


def run(device: IDevice, case: Case, opts: Options, name: str | None = None) -> str:
    """The case through the runtime on ``device`` (already reached through ``opts.face``),
    named ``name`` (default: the device's own name; mode capi names the library's device)."""
    model, built = build_case(case)
    dev = Device.of(device, name or getattr(device, "name", None))
    code, supported = N.ANeuralNetworksModel_getSupportedOperationsForDevices(model, [dev])
    if code != OK:
        if case.expect_failure:
            raise ExpectedFailureSeen(f"getSupportedOperationsForDevices: {_code_name(code)}")
        raise CaseFailure(f"getSupportedOperationsForDevices: {_code_name(code)}")
    if not all(supported):
        raise Unsupported(", ".join(sorted({case.data["model"]["main"]["operations"][i]["type"]
                                            for i, s in enumerate(supported) if not s})))
    try:
        _compile_and_run(case, model, [dev], opts, "createForDevices")
        done = "createForDevices"
        if opts.runtime_create:
            _compile_and_run(case, model, None, opts, "create")
            done += " + create" + (f" (the runtime's own devices, not through --hal "
                                   f"{opts.face})" if opts.face not in (None, DEFAULT_FACE) else "")
    finally:
        for obj in built.keep:
            if hasattr(obj, "close"):
                obj.close()
        for mm in built.models:
            N.ANeuralNetworksModel_free(mm)
    return done + ": " + "+".join(PATHS)
