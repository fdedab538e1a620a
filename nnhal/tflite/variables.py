"""TFLite resource variables (VAR_HANDLE / READ_VARIABLE / ASSIGN_VARIABLE, initialised by a
CALL_ONCE subgraph) as HAL state: the HAL keeps nothing between executions, so each variable
becomes one extra main input (its value before the run) and one extra main output (its value
after), which the caller feeds back. TFLite's interpreter runs operators in order, so a READ
after an ASSIGN sees the assigned value; that order is followed here while converting."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tflite.TensorType import TensorType as TT

from nnhal.hal.types import OperandLifeTime
from nnhal.tflite import schema
from nnhal.tflite.import_ctx import Context, Unimportable, hal_dims, hal_type
from nnhal.tflite.import_fold import fold
from nnhal.tflite.import_read import OpInfo, SubgraphInfo, TfliteTensor

VARIABLE_OPS = ("VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE", "CALL_ONCE")


def variable_name(opts: object, fallback: str) -> str:
    """A variable's name: ``container/shared_name``, or its shared name alone."""
    if opts is None:
        return fallback
    shared = (opts.SharedName() or b"").decode("utf-8", "replace")
    container = (opts.Container() or b"").decode("utf-8", "replace")
    name = shared or fallback
    return f"{container}/{name}" if container else name


def initial_values(sg: SubgraphInfo) -> dict[str, np.ndarray]:
    """What an initialisation subgraph assigns: its ASSIGN_VARIABLE values, folded to
    constants."""
    var_ops = {op.index for op in sg.ops if op.name in VARIABLE_OPS}
    fold(sg, var_ops)
    handles: dict[int, str] = {}
    values: dict[str, np.ndarray] = {}
    for op in sg.ops:
        if op.name == "VAR_HANDLE" and op.outputs:
            handles[op.outputs[0]] = variable_name(op.options, f"var{op.outputs[0]}")
        elif op.name == "ASSIGN_VARIABLE" and len(op.inputs) >= 2:
            key = handles.get(op.inputs[0])
            value = sg.tensors[op.inputs[1]].value
            if key is None or value is None:
                raise Unimportable(f"the initialisation subgraph {sg.index} assigns a value that "
                                   f"is not constant")
            values[key] = value
    return values


@dataclass
class _Var:
    name: str
    template: TfliteTensor | None = None
    input: int | None = None
    current: int | None = None


class Variables:
    """The variables of the main subgraph while it is converted."""

    def __init__(self, ctx: Context, initial: dict[str, np.ndarray]):
        self.ctx, self.initial = ctx, initial
        self.handles: dict[int, str] = {}
        self.vars: dict[str, _Var] = {}

    def _var(self, op: OpInfo) -> _Var:
        key = self.handles.get(op.inputs[0]) if op.inputs else None
        if key is None:
            raise Unimportable("reads a resource that no VAR_HANDLE made")
        handle = self.ctx.t(op.inputs[0])
        if handle.ttype not in (TT.RESOURCE, TT.INT32):  # what TFLite's kernels take
            raise Unimportable(f"{handle.describe()} is {handle.type_name}, not a resource handle")
        if handle.has_rank and int(np.prod(handle.shape)) != 1:  # NumElements, in Prepare
            raise Unimportable(f"{handle.describe()} has shape {list(handle.shape)}: a resource "
                               f"handle is one element")
        return self.vars[key]

    def _input(self, v: _Var, t: TfliteTensor) -> int:
        ht, sc, zp, cq = hal_type(t)
        v.template = t
        v.input = self.ctx.sb.operand(ht, hal_dims(t), sc, zp, cq,
                                      lifetime=OperandLifeTime.SUBGRAPH_INPUT)
        return v.input

    def convert(self, op: OpInfo) -> None:
        if op.name == "CALL_ONCE":
            return
        if op.name == "VAR_HANDLE":
            key = variable_name(op.options, f"var{op.outputs[0]}")
            self.handles[op.outputs[0]] = key
            self.vars.setdefault(key, _Var(key))
            return
        v = self._var(op)
        if op.name == "READ_VARIABLE":
            if v.current is None:
                v.current = self._input(v, self.ctx.t(op.outputs[0]))
            self.ctx.operands[op.outputs[0]] = v.current
        else:  # ASSIGN_VARIABLE
            src = op.inputs[1]
            if v.template is None:
                self._input(v, self.ctx.t(src))
            v.current = self.ctx.x(src)

    def tensor_state(self, i: int) -> int:
        """The current value of a TFLite variable tensor (the state an RNN, SVDF or LSTM keeps
        between invocations), carried like a resource variable named after the tensor."""
        t = self.ctx.t(i)
        key = f"\0tensor {i}"
        v = self.vars.get(key)
        if v is None:
            v = self.vars[key] = _Var(t.name or f"state{i}")
            v.current = self._input(v, t)
            if t.value is not None:
                self.initial[v.name] = t.value
        return v.current

    def set_tensor_state(self, i: int, operand: int) -> None:
        self.vars[f"\0tensor {i}"].current = operand

    def finish(self) -> tuple[list[tuple[str, int, int, np.ndarray]], set[int]]:
        """Per variable in first-use order: (name, input operand, output operand, initial
        value); the output operands are produced here (by promotion or an exact copy)."""
        ctx, out = self.ctx, []
        used: set[int] = set(ctx.output_operands.values())
        for v in self.vars.values():
            if v.input is None or v.template is None:
                continue  # a handle never read or assigned
            cur = v.current
            op_ = ctx.sb.operands[cur]
            if (op_.lifetime == OperandLifeTime.TEMPORARY_VARIABLE and cur not in used):
                op_.lifetime = OperandLifeTime.SUBGRAPH_OUTPUT
                dst = cur
            else:
                ht, sc, zp, cq = hal_type(v.template)
                dst = ctx.sb.operand(ht, hal_dims(v.template), sc, zp, cq,
                                     lifetime=OperandLifeTime.SUBGRAPH_OUTPUT)
                ctx.copy_into(cur, dst)
            used.add(dst)
            dtype = schema.DTYPES[v.template.ttype]
            init = self.initial.get(v.name)
            if init is None:  # TFLite's variables start as zero bytes
                init = np.zeros(v.template.shape, dtype)
            init = np.asarray(init, dtype).reshape(v.template.shape)
            out.append((v.name, v.input, dst, init))
        return out, used
