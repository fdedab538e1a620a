"""A .tflite flatbuffer as a HAL Model: a HAL 1.3 one unless it uses a builtin that maps to an
operation or type of AIDL v2 / v3 (BATCH_MATMUL, PACK, MIRROR_PAD, REVERSE_V2, int8 RSQRT).

Subgraph 0 becomes the main subgraph. The file is read into records first (every count
bounded, every buffer checked), constants are folded, then each operator is converted in
order. Everything that cannot be converted is collected and reported at once, each operator
with its index, so a user sees the whole list rather than the first failure.
"""

from __future__ import annotations

import functools
import os
import re
from typing import Any

from nnhal.analysis import analyse
from nnhal.errors import ModelFileError, NnhalError, UnsupportedModelError
from nnhal.hal.builder import ModelBuilder, SubgraphBuilder
from nnhal.hal.types import (
    EXTENSION_TYPE_LOW_BITS,
    OperandLifeTime,
    OperationType,
    is_extension_type,
    operand_type,
)
from nnhal.memory.frame import Frame
from nnhal.ops import extensions as ops_extensions
from nnhal.ops.catalog import signature
from nnhal.ops.resolver import OpError
from nnhal.ops.signature import SignatureError, check
from nnhal.tflite import (
    import_ext,
    import_reach,  # noqa: F401  (registers its converters)
    import_recurrent,  # noqa: F401  (registers its converters)
    schema,
)
from nnhal.tflite.import_ctx import Context, Unimportable, hal_dims, hal_type
from nnhal.tflite.import_fold import FOLDED_NOTE, FOLDERS, fold, rule_op
from nnhal.tflite.import_ops import CONVERTERS, MAPPED, REFUSED
from nnhal.tflite.import_reach import CUSTOM_CONVERTERS, CUSTOM_MAPPED, LOWERED, repeat_chains
from nnhal.tflite.import_read import OpInfo, SubgraphInfo, read_model
from nnhal.tflite.kernel_rules import kernel_refusal
from nnhal.tflite.model import ImportedModel, StateVariable
from nnhal.tflite.op_versions import version_refusal
from nnhal.tflite.schema import TT
from nnhal.tflite.variables import VARIABLE_OPS, Variables, initial_values
from nnhal.validation import ValidationError

L = OperandLifeTime


#: The classes of :func:`builtin_table` ("extension (NAME:OP)" is the fifth, per extension).
KINDS = ("HAL operation", "lowered", "folded", "refused")
_CODES = {name: code for code, name in schema.BUILTIN_NAMES.items()}


def builtin_table() -> dict[str, tuple[str, str]]:
    """Every TFLite builtin -> (kind, how or why): "HAL operation" (one HAL operation, its
    options as operands), "lowered" (a short HAL subgraph computing the same thing),
    "folded" (only constants: folded at import, otherwise refused or an extension's),
    "extension (NAME:OP)" (an installed extension's operation stands for it) or "refused".
    A builtin with a HAL form keeps its kind; its note then names the extension that takes
    the forms the HAL refuses."""
    mapped, refused = builtin_support()
    table = {}
    for name, note in mapped.items():
        ext = import_ext.claim_name(_CODES[name]) if name in _CODES else None
        if name in CONVERTERS:
            kind = "lowered" if name in LOWERED else "HAL operation"
        elif name in VARIABLE_OPS and name != "CALL_ONCE":
            kind = "lowered"  # state inputs and outputs of the model
        elif ext is not None and name not in FOLDERS:
            table[name] = (ext, "an installed extension's operation (the HAL has none)")
            continue
        else:
            kind = "folded"
        if ext is not None:
            note += f"; the forms it refuses: {ext}"
        table[name] = (kind, note)
    for name, why in refused.items():
        table[name] = ("refused", why)
    return dict(sorted(table.items()))


def builtin_support() -> tuple[dict[str, str], dict[str, str]]:
    """(mapped, refused): every TFLite builtin the importer converts with how (those an
    installed extension claims included), and every one it refuses with why
    (:func:`builtin_table` says which kind each mapping is)."""
    mapped = dict(MAPPED)
    for name in FOLDERS:
        mapped.setdefault(name, FOLDED_NOTE)
    mapped["DENSIFY"] = "folded: a sparse constant becomes a dense constant"
    mapped["ZEROS_LIKE"] = "folded: zeros of the input's shape when that is static"
    mapped["SHAPE"] = "folded when the input's shape is static"
    mapped["RANK"] = "folded when the input's shape is static"
    for name in ("VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE"):
        mapped[name] = "resource variable: one extra state input and output of the model"
    mapped["CALL_ONCE"] = "initialisation of resource variables (initial state values)"
    refused = {}
    for code, name in schema.BUILTIN_NAMES.items():
        if name in mapped or name.startswith("PLACEHOLDER"):
            continue
        ext = import_ext.claim_name(code)
        if ext is not None:
            mapped[name] = f"{ext}: an operation of an installed extension (the HAL has none)"
            continue
        refused[name] = REFUSED.get(name, "no HAL equivalent")
    return dict(sorted(mapped.items())), dict(sorted(refused.items()))


class _Importer:
    def __init__(self, file: str, subgraphs: list[SubgraphInfo],
                 mb: ModelBuilder | None = None):
        self.file = file
        self.subgraphs = subgraphs
        self.problems: list[str] = []
        #: The TFLite operator each main HAL operation comes from, for messages.
        self.origin: list[OpInfo] = []
        self.referenced: dict[int, SubgraphBuilder] = {}
        self.converting: set[int] = set()
        #: The model's builder (given: one whose pool takes the file's bytes whole, see
        #: ModelBuilder.use_source).
        self.mb = mb if mb is not None else ModelBuilder()
        #: The model's extensions (prefixes assigned on first use).
        self.extensions = import_ext.ExtensionTable()
        #: (operation type, input count, each operand's type and lifetime) of the emitted
        #: operations that fit their HAL signatures (see _check_emitted).
        self._passed: set[tuple] = set()

    def run(self) -> ImportedModel:
        main = self.subgraphs[0]
        initial = {}
        for op in main.ops:
            if op.name == "CALL_ONCE" and op.options is not None:
                k = op.options.InitSubgraphIndex()
                if not 0 < k < len(self.subgraphs):
                    raise ModelFileError(self.file, f"CALL_ONCE #{op.index} names subgraph {k}"
                                                    f" of {len(self.subgraphs)}")
                try:
                    initial.update(initial_values(self.subgraphs[k]))
                except Unimportable as e:
                    self.problems.append(f"{op.describe()}: {e}")
        mb = self.mb
        skip = {op.index for op in main.ops if op.name in VARIABLE_OPS}
        folded = fold(main, skip)
        ctx = Context(main, mb, main.outputs, self._reference)
        inputs = self._inputs(ctx, main)
        variables = Variables(ctx, initial)
        ctx.variables = variables
        self._convert_ops(ctx, main, folded, variables)
        outputs = self._outputs(ctx, main)
        state: list[StateVariable] = []
        if not self.problems:
            try:
                found, _ = variables.finish()
            except Unimportable as e:
                self.problems.append(f"resource variables: {e}")
                found = []
            in_names = [main.tensors[i].name for i in main.inputs]
            out_names = [main.tensors[i].name for i in main.outputs]
            for name, vin, vout, init in found:
                state.append(StateVariable(name, init, len(inputs), len(outputs)))
                inputs.append(vin)
                outputs.append(vout)
                in_names.append(name)
                out_names.append(name)
        if self.problems:
            raise self._error(self.problems)
        mb.inputs, mb.outputs = inputs, outputs
        model = mb.build()
        model.extension_name_to_prefix = self.extensions.hal()
        try:
            analyse(model, keep=True)  # a Session or the runtime reads this graph again
        except (ValidationError, OpError) as e:
            # Name the TFLite operator the failing HAL operation comes from.
            m = re.match(r"main operation (\d+)", str(e))
            k = int(m.group(1)) if m else -1
            where = self.origin[k].describe() if 0 <= k < len(self.origin) else \
                "the converted model"
            raise self._error([f"{where}: the HAL rejects it: {e}"]) from None
        return ImportedModel(
            model, in_names, out_names, state, self.file,
            tuple(k for k, i in enumerate(main.inputs) if not main.tensors[i].shape),
            tuple(k for k, i in enumerate(main.outputs) if not main.tensors[i].shape))

    def _reference(self, k: int, sb: SubgraphBuilder) -> int:
        """A SUBGRAPH operand in ``sb`` naming TFLite subgraph ``k`` converted into a
        referenced HAL subgraph (once per subgraph)."""
        if not 0 < k < len(self.subgraphs):
            raise Unimportable(f"names subgraph {k} of {len(self.subgraphs)}")
        if k not in self.referenced:
            if k in self.converting:
                raise Unimportable(f"subgraph {k} calls itself")
            self.converting.add(k)
            sg = self.subgraphs[k]
            sub = self.mb.subgraph()
            ctx = Context(sg, sub, sg.outputs, self._reference)
            sub.inputs = self._inputs(ctx, sg)
            self._convert_ops(ctx, sg, fold(sg, set()), None)
            sub.outputs = self._outputs(ctx, sg)
            self.converting.discard(k)
            self.referenced[k] = sub
        return sb.reference(self.referenced[k])

    def _error(self, items: list[str]) -> UnsupportedModelError:
        n_ops = sum(1 for i in items if i.startswith("#"))
        what = f"{self.file}: {n_ops} operator(s) have no HAL equivalent"
        if len(items) > n_ops:
            what += f" and {len(items) - n_ops} tensor(s) have no HAL operand type"
        return UnsupportedModelError(what, items)

    def _check_emitted(self, ctx: Context, start: int) -> None:
        """The operations just emitted fit their HAL signatures (operand types and counts),
        so a type the HAL does not take is reported against the TFLite operator."""
        operands = ctx.sb.operands
        n = len(operands)
        seen: dict[tuple, _TypeAndLifetime] = {}

        def info(i: int) -> _TypeAndLifetime:
            o = operands[i]
            key = (o.type, o.lifetime)  # most operands of one operation share a type
            found = seen.get(key)
            if found is None:
                found = seen[key] = _TypeAndLifetime(operand_type(o.type), o.lifetime)
            return found

        passed = self._passed
        for operation in ctx.sb.operations[start:]:
            # An operation of the types and lifetimes of one that passed passes: most of a
            # model's operations repeat a few patterns.
            both = (*operation.inputs, *operation.outputs)
            try:
                key = (operation.type, len(operation.inputs),
                       *[(operands[i].type, operands[i].lifetime) for i in both]) \
                    if not both or min(both) >= 0 else None
            except IndexError:
                key = None
            if key in passed:
                continue
            if is_extension_type(operation.type):
                continue  # checked against its extension's signature (_check_extension)
            for i in (*operation.inputs, *operation.outputs):
                if 0 <= i < n and int(operands[i].type) >> EXTENSION_TYPE_LOW_BITS:
                    raise Unimportable(
                        f"the HAL's operation {_op_name(operation.type)} takes no extension "
                        f"operand (operand {i} is of extension type "
                        f"{int(operands[i].type):#x})")
            sig = _signature(operation.type)
            if sig is not None:
                try:
                    check(sig, [info(i) for i in operation.inputs],
                          [info(i) for i in operation.outputs])
                except SignatureError as e:
                    raise Unimportable(f"the HAL's {e}") from None
            if key is not None:
                passed.add(key)

    def _inputs(self, ctx: Context, sg: SubgraphInfo) -> list[int]:
        out = []
        for i in sg.inputs:
            t = sg.tensors[i]
            try:
                if t.zero_sized:
                    raise Unimportable(f"{t.describe()} has shape {list(t.shape)}: a HAL input "
                                       f"cannot be empty (its 0 means unknown)")
                ht, sc, zp, cq = hal_type(t)
            except Unimportable as e:
                self.problems.append(f"input {e}")
                ctx.poisoned.add(i)
                continue
            k = ctx.sb.operand(ht, hal_dims(t), sc, zp, cq, lifetime=L.SUBGRAPH_INPUT)
            ctx.operands[i] = k
            out.append(k)
        return out

    def _convert_ops(self, ctx: Context, sg: SubgraphInfo, folded: set[int],
                     variables: Variables | None) -> None:
        fold_refused = sg.extra.get("fold_refused", {})
        left_out, chain_ends = repeat_chains(sg, folded)
        for op in sg.ops:
            if op.index in folded or op.index in left_out:
                continue
            if ctx.poisoned and not ctx.poisoned.isdisjoint(op.inputs):
                # Downstream of a refusal: nothing to convert, but an operator that would be
                # refused on its own is named too, so one message lists every blocker.
                why = _kind_refusal(op, variables is not None)
                if why is not None:
                    self.problems.append(f"{_where(op, sg)}: {why} (its inputs come from a "
                                         f"refused operator too)")
                ctx.poisoned.update(op.outputs)
                continue
            ctx.op = op
            start = len(ctx.sb.operations)
            checked = False
            try:
                if op.index in fold_refused:
                    raise Unimportable(fold_refused[op.index])
                too_new = None if op.custom else version_refusal(op.name, op.version)
                if too_new is not None:  # before any converter or extension reads it
                    raise Unimportable(too_new)
                if op.name in VARIABLE_OPS:
                    if variables is None:
                        raise Unimportable("resource variables only in the main subgraph")
                    variables.convert(op)
                elif op.custom:
                    if op.name in CUSTOM_CONVERTERS:
                        CUSTOM_CONVERTERS[op.name](ctx, op)
                    elif not self._extension(ctx, op, _custom_refusal(op)):
                        raise Unimportable(_custom_refusal(op))
                elif op.name in CONVERTERS:
                    # (the rules as TFLite's kernels apply them; the version was checked above)
                    why = kernel_refusal(rule_op(ctx.sg.tensors, op, version_checked=True))
                    if why is not None:
                        self._extension(ctx, op, why)
                    else:
                        saved = _Saved(ctx)
                        try:
                            chain_ends.get(op.index, CONVERTERS[op.name])(ctx, op)
                            # Checked here: a HAL form the HAL's signature refuses (an
                            # extension operand, complex64 say) goes to an extension too.
                            ctx.flush()
                            self._check_emitted(ctx, start)
                            checked = True
                        except Unimportable as e:
                            saved.restore(ctx)
                            self._extension(ctx, op, str(e))
                        except (ValueError, TypeError, KeyError):
                            # A HAL converter meeting a type the HAL lacks (complex64)
                            if not any(i >= 0 and self.extensions.tensor_type(ctx.t(i))
                                       is not None for i in (*op.inputs, *op.outputs)):
                                raise
                            saved.restore(ctx)
                            self._extension(ctx, op, "the HAL's form takes no extension "
                                                     "operand")
                elif import_ext.claim(op) is not None:
                    why = kernel_refusal(rule_op(ctx.sg.tensors, op, version_checked=True))
                    if why is not None:  # what TFLite refuses, no extension runs either
                        raise Unimportable(why)
                    self._extension(ctx, op, "")
                elif op.name in FOLDERS or op.name in ("SHAPE", "RANK", "DENSIFY"):
                    raise Unimportable("no HAL equivalent (folded only when its inputs are "
                                       "constants or, for SHAPE / RANK, its input shape is static)")
                else:
                    raise Unimportable(REFUSED.get(op.name, "no HAL equivalent"))
                if not checked:
                    ctx.flush()
                    self._check_emitted(ctx, start)
            except (Unimportable, IndexError, ValueError, TypeError, KeyError) as e:
                # The latter: an operator whose tensors contradict its kind (too few inputs,
                # shapes of the wrong rank), reported against it rather than as a traceback.
                ctx.pending.clear()
                ctx.poisoned.update(op.outputs)
                where = _where(op, sg)
                reason = str(e) if isinstance(e, Unimportable) else (
                    f"malformed operator ({type(e).__name__}: {e})")
                self.problems.append(f"{where}: {reason}")
            ctx.op = None
            if sg.index == 0:
                self.origin += [op] * (len(ctx.sb.operations) - len(self.origin))

    def _extension(self, ctx: Context, op: OpInfo, hal_refusal: str) -> bool:
        """Convert ``op`` into the operation of an installed extension that claims it (True);
        False when none does. Raises Unimportable naming both refusals when the extension's
        converter refuses it too (or with ``hal_refusal`` alone when no extension claims it
        and ``hal_refusal`` is not empty)."""
        found = import_ext.claim(op)
        if found is None:
            if hal_refusal:
                raise Unimportable(hal_refusal)
            return False
        ext, operation = found
        start = len(ctx.sb.operations)
        try:
            import_ext.convert(ctx, op, self.extensions, ext, operation)
            ctx.flush()
            self._check_extension(ctx, start, operation)
        except Unimportable as e:
            prefix = f"{hal_refusal}; " if hal_refusal else ""
            raise Unimportable(f"{prefix}extension operation {operation.id.name}: {e}") from None
        return True

    @staticmethod
    def _check_extension(ctx: Context, start: int, operation: Any) -> None:
        """The extension operations just emitted fit ``operation``'s signature where their
        operands are of the HAL's types (an int8 tensor into a float32-only operation is the
        importer's refusal, not an invalid model for the driver to report)."""
        operands = ctx.sb.operands
        for emitted in ctx.sb.operations[start:]:
            both = (*emitted.inputs, *emitted.outputs)
            if not is_extension_type(emitted.type) or any(
                    i < 0 or int(operands[i].type) >> EXTENSION_TYPE_LOW_BITS for i in both):
                continue
            infos = [_TypeAndLifetime(operand_type(operands[i].type), operands[i].lifetime)
                     for i in both]
            try:
                check(operation.signature, infos[:len(emitted.inputs)],
                      infos[len(emitted.inputs):])
            except SignatureError as e:
                raise Unimportable(str(e)) from None

    def _outputs(self, ctx: Context, sg: SubgraphInfo) -> list[int]:
        """The subgraph's output operands, each written by an operation: a tensor that is an
        input, a constant or listed twice is copied exactly into its own output operand."""
        out = []
        for i in sg.outputs:
            if i in ctx.poisoned:
                continue
            if i in ctx.output_operands and ctx.output_operands[i] not in out:
                out.append(ctx.output_operands[i])
                continue
            t = sg.tensors[i]
            try:
                ht, sc, zp, cq = hal_type(t)
                src = ctx.x(i)
                dst = ctx.sb.operand(ht, hal_dims(t), sc, zp, cq, lifetime=L.SUBGRAPH_OUTPUT)
                ctx.copy_into(src, dst)
            except Unimportable as e:
                self.problems.append(f"output {t.describe()}: {e}")
                continue
            out.append(dst)
        return out


def read_tflite(source: str | os.PathLike[str] | bytes | Frame, name: str | None = None, *,
                dynamic_shapes: bool = False) -> ImportedModel:
    """A .tflite file (or its bytes) as a HAL Model with its tensor names and state.

    Shapes: by default every tensor has its ``shape`` field, the shape TFLite's interpreter
    allocates without ``resize_tensor_input`` and the one its NNAPI delegate hands a driver,
    so shapes are static and run-time shape arithmetic (SHAPE -> STRIDED_SLICE -> PACK ->
    RESHAPE, as Keras leaves for a dynamic batch) folds into constants. With
    ``dynamic_shapes=True`` a dimension the ``shape_signature`` marks -1 becomes 0 (unknown
    to the HAL), for a model meant to run at other sizes; such chains then stay and are
    refused.

    Raises ModelFileError for a file that cannot be read, UnsupportedModelError naming every
    operator (index and name) and tensor that has no HAL equivalent."""
    lf = schema.load(source, name)
    try:
        imported = _import(lf, dynamic_shapes)
    except NnhalError:
        lf.settle()  # a file that changed while it was read says so instead
        raise
    lf.settle()
    return imported


def _import(lf: schema.LoadedFile, dynamic_shapes: bool) -> ImportedModel:
    subgraphs = read_model(lf, dynamic_shapes)
    mb = ModelBuilder()
    if 2 * _weights_as_stored(subgraphs) >= len(lf.data):
        # Mostly weights the HAL takes as they are (not float16 ones, widened): the file is
        # their pool part, copied whole now, on the writer thread, while the operators are
        # converted (a file of other weights is not copied for nothing).
        mb.use_source(lf.frame if lf.frame is not None else lf.data)
    with lf.guard():
        importer = _Importer(lf.name, subgraphs, mb)
        token = import_ext.CURRENT.set(importer.extensions)
        try:
            return importer.run()
        finally:
            import_ext.CURRENT.reset(token)


def _weights_as_stored(subgraphs: list[SubgraphInfo]) -> int:
    """Bytes of the constant tensors whose data a HAL constant can be a view of (float16
    ones are widened, sparse ones densified: copies)."""
    total = 0
    for sg in subgraphs:
        for t in sg.tensors:
            v = t.value
            if v is not None and t.ttype != TT.FLOAT16 and t.sparse_value is None:
                total += v.nbytes
    return total


def custom_support() -> dict[str, str]:
    """The custom operators the importer maps (custom code -> how), those of installed
    extensions included; every other is refused."""
    out = dict(CUSTOM_MAPPED)
    for key, (_, operation) in ops_extensions.tflite_claims().items():
        if isinstance(key, str):
            out.setdefault(key, f"extension ({operation.id.name})")
    return dict(sorted(out.items()))


__all__ = ["builtin_support", "builtin_table", "custom_support", "read_tflite"]


def _where(op: OpInfo, sg: SubgraphInfo) -> str:
    return op.describe() + (f" (subgraph {sg.index})" if sg.index else "")


def _custom_refusal(op: OpInfo) -> str:
    """(``custom_support()`` lists the custom operators that do map.)"""
    return f"custom operator '{op.name}' has no HAL equivalent"


def _kind_refusal(op: OpInfo, main: bool) -> str | None:
    """Why an operator is refused whatever its inputs, or None when only its inputs (a
    refused producer) stop it."""
    if op.name in VARIABLE_OPS:
        return None if main else "resource variables only in the main subgraph"
    if op.custom:
        return None if op.name in CUSTOM_CONVERTERS or import_ext.claim(op) is not None \
            else _custom_refusal(op)
    if op.name in CONVERTERS or import_ext.claim(op) is not None:
        return None
    if op.name in FOLDERS or op.name in ("SHAPE", "RANK", "DENSIFY"):
        return ("no HAL equivalent (folded only when its inputs are constants or, for "
                "SHAPE / RANK, its input shape is static)")
    return REFUSED.get(op.name, "no HAL equivalent")


@functools.cache
def _signature(op_type: int) -> Any:
    """:func:`nnhal.ops.catalog.signature`, looked up once per operation type (the enum's
    conversion costs a microsecond per operation)."""
    return signature(op_type)


def _op_name(t: int) -> str:
    try:
        return OperationType(t).name
    except ValueError:
        return str(t)


class _Saved:
    """The subgraph's state before a converter runs, to undo what it emitted when it
    refuses the operator midway (an extension then converts it)."""

    def __init__(self, ctx: Context):
        sb = ctx.sb
        self.n_operands, self.n_operations = len(sb.operands), len(sb.operations)
        self.operands, self.outputs = dict(ctx.operands), dict(ctx.output_operands)
        self.consts = dict(ctx._consts)

    def restore(self, ctx: Context) -> None:
        sb = ctx.sb
        fixed = sb._fixed_consumers
        for operation in sb.operations[self.n_operations:]:
            for i in operation.inputs:
                if 0 <= i < self.n_operands and i not in fixed:
                    sb.operands[i].number_of_consumers -= 1
        del sb.operations[self.n_operations:]
        del sb.operands[self.n_operands:]
        fixed.difference_update({i for i in fixed if i >= self.n_operands})
        ctx.operands, ctx.output_operands = self.operands, self.outputs
        ctx._consts = self.consts
        ctx.pending.clear()


class _TypeAndLifetime:
    """What a signature check reads of an operand (lighter than an operand info)."""

    __slots__ = ("type", "lifetime")

    def __init__(self, type_: Any, lifetime: Any) -> None:
        self.type, self.lifetime = type_, lifetime
