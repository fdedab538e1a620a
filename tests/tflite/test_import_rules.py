"""The structural rules of the TFLite schema that TFLite's own reader and interpreter check:
each hostile file below is refused by nnhal's reader with one ModelFileError line, and
ai-edge-litert (the oracle, in a child process) refuses the same file."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import tflite
from oracle import available, verdicts
from tfl import Graph, Quant, build
from tflite.TensorType import TensorType as TT

from nnhal.errors import ModelFileError, UnsupportedModelError
from nnhal.hal.types import OperationType
from nnhal.tflite import read_tflite
from nnhal.tflite.arity import ARITY
from nnhal.tflite.importer import builtin_support

F = np.float32
ADD = ("AddOptions", dict(FusedActivationFunction=0))


def _binary(name: str, n_inputs: int = 2, shape: tuple = (2,)) -> bytes:
    g = Graph()
    x = g.input(shape, F, name="x")
    c = g.const(np.full(shape, 3, F))
    y = g.tensor(shape, F, name="y")
    g.op(name, [x] + [c] * (n_inputs - 1), [y], (f"{name.capitalize()}Options",
                                                  dict(FusedActivationFunction=0)))
    g.output(y)
    return build(g)


def _relu(shape=(2, 3), signature=None, quant=None, dtype=F) -> bytes:
    g = Graph()
    x = g.input(shape, dtype, name="x", quant=quant, signature=signature)
    y = g.tensor(shape, dtype, name="y", quant=quant)
    g.op("RELU", [x], [y])
    g.output(y)
    return build(g)


def _patch(data: bytes, pos: int, raw: bytes) -> bytes:
    b = bytearray(data)
    b[pos:pos + len(raw)] = raw
    return bytes(b)


def _field(table: object, k: int) -> int:
    """The byte position of field ``k`` of a generated table (0 when absent)."""
    off = table._tab.Offset(4 + 2 * k)
    return table._tab.Pos + off if off else 0


def _opcode_field(data: bytes, k: int) -> int:
    return _field(tflite.Model.GetRootAs(data).OperatorCodes(0), k)


def _tensor_field(data: bytes, i: int, k: int) -> int:
    return _field(tflite.Model.GetRootAs(data).Subgraphs(0).Tensors(i), k)


def _deprecated_code_add() -> bytes:
    """A MUL whose deprecated 8-bit code field says ADD (0): TFLite takes the larger."""
    data = _binary("MUL")
    return _patch(data, _opcode_field(data, 0), b"\0")


def _negative_dim() -> bytes:
    return _relu((2, -3))


def _bad_signature() -> bytes:
    return _relu((2, 3), signature=[-1, 3, 1])


def _writes_its_input() -> bytes:
    g = Graph()
    x = g.input((2,), F, name="x")
    y = g.tensor((2,), F, name="y")
    g.op("RELU", [y], [x])
    g.op("RELU", [x], [y])
    g.output(y)
    return build(g)


def _two_writers() -> bytes:
    g = Graph()
    x = g.input((2,), F, name="x")
    y = g.tensor((2,), F, name="y")
    g.op("RELU", [x], [y])
    g.op("RELU6", [x], [y])
    g.output(y)
    return build(g)


def _writes_a_constant() -> bytes:
    g = Graph()
    x = g.input((2,), F, name="x")
    c = g.const(np.ones(2, F), name="c")
    y = g.tensor((2,), F, name="y")
    g.op("RELU", [x], [c])
    g.op("ADD", [x, c], [y], ADD)
    g.output(y)
    return build(g)


def _zero_points(n: int) -> bytes:
    return _relu((2, 3), quant=Quant([0.5], [1] * n), dtype=np.int8)


def _per_axis(scales: int, dim: int) -> bytes:
    return _relu((2, 3), quant=Quant([0.5] * scales, [0] * scales, dim), dtype=np.int8)


def _optional_left_out() -> bytes:
    g = Graph()
    x = g.input((2,), F, name="x")
    y = g.tensor((2,), F, name="y")
    g.op("ADD", [x, -1], [y], ADD)
    g.output(y)
    return build(g)


def _add_const(n: int = 2) -> bytes:
    """x + c with c of shape [2] and n float32 values of data."""
    g = Graph()
    x = g.input((2,), F, name="x")
    c = g.const(np.ones(n, F), name="c", shape=(2,))
    y = g.tensor((2,), F, name="y")
    g.op("ADD", [x, c], [y], ADD)
    g.output(y)
    return build(g)


def _buffer_out_of_range() -> bytes:
    data = _add_const()
    return _patch(data, _tensor_field(data, 1, 2), (999).to_bytes(4, "little"))


def _if_names(then_index: int) -> bytes:
    branch = Graph()
    a = branch.input((2,), F)
    b = branch.tensor((2,), F)
    branch.op("RELU", [a], [b])
    branch.output(b)
    g = Graph()
    c = g.input((1,), np.bool_, name="cond")
    x = g.input((2,), F, name="x")
    y = g.tensor((2,), F, name="y")
    g.op("IF", [c, x], [y], ("IfOptions", dict(ThenSubgraphIndex=then_index,
                                                ElseSubgraphIndex=1)))
    g.output(y)
    return build(g, branch)


#: kind -> (file, what nnhal's one line says).
HOSTILE = {
    "negative_dimension": (_negative_dim, r"has shape \[2, -3\] \(a negative dimension"),
    "shape_signature_of_other_rank": (_bad_signature, r"shape_signature \[-1, 3, 1\] for "
                                                       r"shape \[2, 3\]"),
    "operator_writes_a_model_input": (_writes_its_input, r"writes tensor 0 'x', an input"),
    "two_writers": (_two_writers, r"tensor 1 is written by operators 0 and 1"),
    "operator_writes_a_constant": (_writes_a_constant, r"writes tensor 1 'c', a constant"),
    "one_scale_three_zero_points": (lambda: _zero_points(3), r"1 quantization scales and 3 "
                                                             r"zero points"),
    "per_axis_count_not_the_dimension": (lambda: _per_axis(2, 1), r"2 quantization scales "
                                                                  r"\(1, or 3 along dim"),
    "quantized_dimension_out_of_range": (lambda: _per_axis(3, 2), r"quantized_dimension 2 "
                                                                  r"for rank 2"),
    "add_with_3_inputs": (lambda: _binary("ADD", 3), r"\(ADD\) has 3 inputs \(TFLite's "
                                                     r"kernel takes 2\)"),
    "add_with_100000_inputs": (lambda: _binary("ADD", 100_000), r"has 100000 inputs"),
    "required_input_left_out": (_optional_left_out, r"leaves out input 1, which is not "
                                                    r"optional"),
    "buffer_out_of_range": (_buffer_out_of_range, r"names buffer 999 of"),
    "buffer_larger_than_the_shape": (lambda: _add_const(3), r"12 bytes of data for shape "
                                                            r"\[2\]"),
    "buffer_smaller_than_the_shape": (lambda: _add_const(1), r"4 bytes of data for shape "
                                                             r"\[2\]"),
    "if_names_a_missing_subgraph": (lambda: _if_names(5), r"names subgraph 5 of 2"),
}


#: Kinds ai-edge-litert 2.3 accepts (with XNNPACK) where nnhal keeps the schema's rule:
#: litert then runs a graph whose meaning depends on its execution order (a tensor written
#: twice, an input overwritten, a cycle reading an unset tensor), reads the first bytes of a
#: longer buffer, or keeps a signature contradicting the shape it allocates.
LITERT_ACCEPTS = {"shape_signature_of_other_rank", "operator_writes_a_model_input",
                  "two_writers", "operator_writes_a_constant", "buffer_larger_than_the_shape"}


@pytest.fixture(scope="module")
def litert_verdicts() -> dict[str, str]:
    """What ai-edge-litert says of every hostile file (one child process for all)."""
    if not available():
        return {}
    names = list(HOSTILE)
    return dict(zip(names, verdicts([HOSTILE[n][0]() for n in names])))


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_hostile_file_is_refused_in_one_line_as_litert_does(kind: str, litert_verdicts
                                                            ) -> None:
    make, message = HOSTILE[kind]
    with pytest.raises(ModelFileError, match=message) as e:
        read_tflite(make(), name="m.tflite")
    assert str(e.value).startswith("m.tflite: corrupted: ") and "\n" not in str(e.value)
    if litert_verdicts and kind not in LITERT_ACCEPTS:
        assert litert_verdicts[kind] != "ok", f"ai-edge-litert accepts {kind}"


def test_builtin_code_is_the_larger_of_the_two_raw_fields() -> None:
    """The binding's accessor answers the deprecated field (ADD) below 127; TFLite runs MUL."""
    data = _deprecated_code_add()
    assert tflite.Model.GetRootAs(data).OperatorCodes(0).BuiltinCode() == 0  # the trap
    ops = [op.type for op in read_tflite(data).model.main.operations]
    assert ops == [OperationType.MUL]
    if available():
        assert verdicts([data]) == ["ok"]
        from runner import agree
        x = np.float32([1, -2])
        np.testing.assert_array_equal(agree(data, [x])[0], x * 3)


def test_every_builtin_the_importer_reads_has_its_operand_counts() -> None:
    mapped, _ = builtin_support()
    assert sorted(set(mapped) - set(ARITY)) == []


def test_unused_tensors_cost_no_accessor_calls(monkeypatch) -> None:
    """Reading scales with the file, not with accessor calls per tensor: the binding's field
    lookup (flatbuffers' Table.Offset) runs as often for 3,000 unused tensors as for 30."""
    import flatbuffers.table

    def model(n: int) -> bytes:
        g = Graph()
        x = g.input((2,), F)
        y = g.tensor((2,), F)
        for k in range(n):
            g.const(np.float32([k, 1]))
            g.tensor((3, 4), np.int8, quant=Quant([0.5], [1]))
        g.op("RELU", [x], [y])
        g.output(y)
        return build(g)

    calls = []
    original = flatbuffers.table.Table.Offset

    def counting(self, off):
        calls.append(off)
        return original(self, off)

    small, large = model(15), model(1500)
    monkeypatch.setattr(flatbuffers.table.Table, "Offset", counting)
    counts = []
    for data in (small, large):
        calls.clear()
        read_tflite(data)
        counts.append(len(calls))
    assert counts[1] == counts[0] < 200


def _reshape(shape_input: np.ndarray | None = None, new_shape: list[int] | None = None,
             out: tuple = (3, 2)) -> bytes:
    g = Graph()
    x = g.input((2, 3), F, name="x")
    y = g.tensor(out, F, name="y")
    ins = [x] if shape_input is None else [x, g.const(shape_input)]
    g.op("RESHAPE", ins, [y], None if new_shape is None else ("ReshapeOptions",
                                                              dict(NewShape=new_shape)))
    g.output(y)
    return build(g)


def _reshape_empty() -> bytes:
    """An empty SLICE (2x0) reshaped to 3 elements: the input's count is 0, not unknown."""
    g = Graph()
    x = g.input((2, 3), F, name="x")
    e = g.tensor((2, 0), F, name="e")
    g.op("SLICE", [x, g.const(np.int32([0, 0])), g.const(np.int32([2, 0]))], [e])
    y = g.tensor((3,), F, name="y")
    g.op("RESHAPE", [e, g.const(np.int32([3]))], [y])
    g.output(y)
    return build(g)


def _reshape_string_shape() -> bytes:
    """The shape constant's type rewritten to STRING: its value is not read at all, so the
    target is the (absent) options' []."""
    data = _reshape(np.int32([3, 2]))
    return _patch(data, _tensor_field(data, 2, 1), bytes([TT.STRING]))


#: RESHAPEs TFLite refuses in its parser or its kernel's Prepare, whose declared output
#: shape alone would let them through: the target shape is the shape input only when that
#: is a constant 1-D int32 tensor, else the options' new_shape, and no options is [].
RESHAPE_REFUSED = {
    "no_shape_input_and_no_options": (lambda: _reshape(out=(6,)), r"new shape \[\] does not"),
    "shape_input_not_int32": (lambda: _reshape(np.int64([3, 2])), r"new shape \[\] does not"),
    "shape_input_of_rank_2_and_options": (lambda: _reshape(np.int32([[3, 2]]), [3, 4]),
                                          r"new shape \[3, 4\] does not hold"),
    "shape_input_of_type_string": (_reshape_string_shape, r"new shape \[\] does not"),
    "empty_input_to_three_elements": (_reshape_empty, r"does not hold the input's 0 elem"),
    "options_of_nine_dimensions": (lambda: _reshape(np.int32([3, 2]), [1] * 8 + [6]),
                                   r"new_shape has 9 dimensions"),
}


@pytest.mark.parametrize("kind", list(RESHAPE_REFUSED))
def test_reshape_target_is_the_one_tflite_computes(kind: str) -> None:
    make, message = RESHAPE_REFUSED[kind]
    data = make()
    with pytest.raises(UnsupportedModelError, match=message) as e:
        read_tflite(data, name="m.tflite")
    assert "\n" not in str(e.value)
    if available():
        assert verdicts([data])[0] != "ok", f"ai-edge-litert accepts {kind}"


def test_reshape_shape_input_wins_over_the_options() -> None:
    """A constant 1-D int32 shape input is used whatever the options say."""
    data = _reshape(np.int32([3, 2]), [7, 7])
    read_tflite(data)
    if available():
        assert verdicts([data]) == ["ok"]


def _quantized(op: str, out_scale: float, dtype=np.int8) -> bytes:
    g = Graph()
    x = g.input((4,), dtype, name="x", quant=Quant([1.0], [0]))
    y = g.tensor((4,), dtype, name="y", quant=Quant([out_scale], [0]))
    g.op(op, [x, g.const(np.ones(4, dtype), quant=Quant([0.5], [0]))], [y],
         (f"{op.capitalize()}Options", dict(FusedActivationFunction=0)))
    g.output(y)
    return build(g)


def test_quantized_add_output_multiplier_must_be_a_fraction() -> None:
    """2 x 1.0 / (2^20 x s) < 1 needs s > 2^-19: just above it is read (and litert runs it),
    8e-29 (a fuzz mutant's output scale) is refused, where litert's process aborts on the
    TFLITE_CHECK of ADD's Prepare: that crash is TFLite's refusal, not a litert accident.
    SUB's Prepare takes a multiplier above 1, so the same SUB is read. The ADD litert runs
    has an input scale 2^19 times its output's, where litert's results overflow (test_import_ops
    measures it): that one is refused for its results instead."""
    good, bad = _quantized("ADD", 2.0 ** -19 * 1.01), _quantized("ADD", 8e-29)
    sub = _quantized("SUB", 8e-29)
    with pytest.raises(UnsupportedModelError, match="overflows its fixed point"):
        read_tflite(good)
    read_tflite(sub)
    with pytest.raises(UnsupportedModelError, match=r"output multiplier .* is not below 1"):
        read_tflite(bad)
    if available():
        assert verdicts([good, bad, sub]) == ["ok", "crash", "ok"]


def _shape_buffer_emptied() -> bytes:
    """A RESHAPE whose shape constant's data vector is rewritten to length 0: TFLite still
    takes the buffer as the tensor's data (0 bytes for an 8-byte tensor) and refuses it;
    read as "no data" the shape would silently become a run-time input."""
    data = _reshape(np.int32([3, 2]))
    model = tflite.Model.GetRootAs(data)
    shape = model.Subgraphs(0).Tensors(2)
    assert shape.ShapeAsNumpy().tolist() == [2]
    at = _field(model.Buffers(shape.Buffer()), 0)
    return _patch(data, at + struct.unpack_from("<I", data, at)[0], b"\0\0\0\0")


def _conv(bias: list[int] | None, stride: int = 1, op: str = "CONV_2D") -> bytes:
    g = Graph()
    x = g.input((1, 4, 4, 2), F, name="x")
    depthwise = op == "DEPTHWISE_CONV_2D"
    w = g.const(np.ones((1, 2, 2, 2) if depthwise else (3, 2, 2, 2), F))
    ins = [x, w] + [g.const(np.zeros(2 if depthwise else 3, F)) if b else -1
                    for b in (bias or [])]
    y = g.tensor((1, 3, 3 if stride == 1 else 1, 2 if depthwise else 3), F)
    options = dict(Padding=1, StrideW=stride, StrideH=1)
    g.op(op, ins, [y], ("DepthwiseConv2DOptions", dict(options, DepthMultiplier=1))
         if depthwise else ("Conv2DOptions", options))
    g.output(y)
    return build(g)


def _same_pool(op: str, height: int, filter_h: int, stride_h: int = 1) -> bytes:
    """A SAME pooling of a [1, height, 1, 1] input: its padding per side is half of
    (out - 1) * stride + filter - height (TFLite keeps it in int16)."""
    g = Graph()
    x = g.input((1, height, 1, 1), F, name="x")
    y = g.tensor((1, -(-height // stride_h), 1, 1), F)
    g.op(op, [x], [y], ("Pool2DOptions", dict(Padding=0, StrideW=1, StrideH=stride_h,
                                              FilterWidth=1, FilterHeight=filter_h,
                                              FusedActivationFunction=0)))
    g.output(y)
    return build(g)


def _versioned(name: str, version: int) -> bytes:
    """One operator ``name`` over a float input (valid or not: the resolver runs first)."""
    g = Graph()
    x = g.input((2,), F, name="x")
    y = g.tensor((2,), F, name="y")
    g.op(name, [x], [y])
    g.output(y)
    return build(g, op_versions={name: version})


def _relu_version(version: int) -> bytes:
    g = Graph()
    x = g.input((2,), F, name="x")
    y = g.tensor((2,), F, name="y")
    g.op("RELU", [x], [y])
    g.output(y)
    return build(g, op_versions={"RELU": version})


def _same_conv(op: str, filter_h: int, dilation_h: int = 1) -> bytes:
    """A SAME convolution of a [1, 4, 1, 1] input by a filter_h x 1 filter."""
    g = Graph()
    x = g.input((1, 4, 1, 1), F, name="x")
    w = g.const(np.ones((1, filter_h, 1, 1), F))
    y = g.tensor((1, 4, 1, 1), F)
    options = dict(Padding=0, StrideW=1, StrideH=1, DilationHFactor=dilation_h,
                   DilationWFactor=1)
    g.op(op, [x, w, g.const(np.zeros(1, F))], [y],
         ("DepthwiseConv2DOptions", dict(options, DepthMultiplier=1))
         if op == "DEPTHWISE_CONV_2D" else ("Conv2DOptions", options))
    g.output(y)
    return build(g)


def _quantized_fc(bias_scale: float) -> bytes:
    g = Graph()
    x = g.input((1, 4), np.int8, name="x", quant=Quant([0.5], [0]))
    w = g.const(np.ones((2, 4), np.int8), quant=Quant([0.25], [0]))
    b = g.const(np.int32([1, 2]), quant=Quant([bias_scale], [0]))
    y = g.tensor((1, 2), np.int8, name="y", quant=Quant([1.0], [0]))
    g.op("FULLY_CONNECTED", [x, w, b], [y])
    g.output(y)
    return build(g)


def _int8_concat(second_scale: float) -> bytes:
    g = Graph()
    x = g.input((1, 2), np.int8, name="x", quant=Quant([0.5], [1]))
    c = g.const(np.int8([[3, 4]]), quant=Quant([second_scale], [1]))
    y = g.tensor((2, 2), np.int8, name="y", quant=Quant([0.5], [1]))
    g.op("CONCATENATION", [x, c], [y], ("ConcatenationOptions", dict(Axis=-2)))
    g.output(y)
    return build(g)


def _variable(handle_shape: tuple) -> bytes:
    init = Graph()
    h = init.tensor(handle_shape, TT.RESOURCE)
    init.op("VAR_HANDLE", [], [h], ("VarHandleOptions", dict(SharedName=b"v")))
    init.op("ASSIGN_VARIABLE", [h, init.const(np.float32([1, 2]))], [])
    g = Graph()
    x = g.input((2,), F, name="x")
    g.op("CALL_ONCE", [], [], ("CallOnceOptions", dict(InitSubgraphIndex=1)))
    h1 = g.tensor(handle_shape, TT.RESOURCE)
    g.op("VAR_HANDLE", [], [h1], ("VarHandleOptions", dict(SharedName=b"v")))
    v = g.tensor((2,), F)
    g.op("READ_VARIABLE", [h1], [v])
    y = g.tensor((2,), F, name="y")
    g.op("ADD", [v, x], [y], ("AddOptions", dict(FusedActivationFunction=0)))
    g.output(y)
    return build(g, init)


def _gather(positions: np.ndarray) -> bytes:
    g = Graph()
    x = g.input((3, 2), F, name="x")
    y = g.tensor((2, 2), F, name="y")
    g.op("GATHER", [x, g.const(positions)], [y], ("GatherOptions", dict(Axis=0)))
    g.output(y)
    return build(g)


def _mean(axis: np.ndarray) -> bytes:
    g = Graph()
    x = g.input((2, 3), F, name="x")
    y = g.tensor((2,), F, name="y")
    g.op("MEAN", [x, g.const(axis)], [y], ("ReducerOptions", dict(KeepDims=False)))
    g.output(y)
    return build(g)


def _folded_shape(op: str, second: np.ndarray) -> bytes:
    """x [6] reshaped to a shape computed from constants by ``op`` (folded at import)."""
    g = Graph()
    x = g.input((6,), F, name="x")
    shape = g.tensor((2,), np.int32)
    if op == "ADD":
        g.op("ADD", [g.const(np.int32([1, 2])), g.const(second)], [shape],
             ("AddOptions", dict(FusedActivationFunction=0)))
    else:
        g.op("CONCATENATION", [g.const(np.int32([2])), g.const(second)], [shape],
             ("ConcatenationOptions", dict(Axis=0)))
    y = g.tensor((2, 3), F, name="y")
    g.op("RESHAPE", [x, shape], [y])
    g.output(y)
    return build(g)


def _counted(op: str, count: int) -> bytes:
    """x [6] reshaped to [2, 3] by a shape that PACK, or SPLIT_V and PACK, make of
    constants (folded at import), the options' count ``count`` (right: 2); or SHAPE of x
    with out_type ``count`` (right: INT32) as the new shape of a RESHAPE to [6]."""
    g = Graph()
    x = g.input((6,), F, name="x")
    if op == "SHAPE":
        shape = g.tensor((1,), np.int32)
        g.op("SHAPE", [x], [shape], ("ShapeOptions", dict(OutType=count)))
        y = g.tensor((6,), F, name="y")
    else:
        shape = g.tensor((2,), np.int32)
        parts = [g.const(np.int32(2)), g.const(np.int32(3))]
        if op == "SPLIT_V":
            parts = [g.tensor((1,), np.int32), g.tensor((1,), np.int32)]
            g.op("SPLIT_V", [g.const(np.int32([2, 3])), g.const(np.int32([1, 1])),
                             g.const(np.int32(0))], parts, ("SplitVOptions",
                                                            dict(NumSplits=count)))
            g.op("CONCATENATION", parts, [shape], ("ConcatenationOptions", dict(Axis=0)))
        else:
            g.op("PACK", parts, [shape], ("PackOptions", dict(ValuesCount=count, Axis=0)))
        y = g.tensor((2, 3), F, name="y")
    g.op("RESHAPE", [x, shape], [y])
    g.output(y)
    return build(g)


def _folded_reshape(shape: np.ndarray | None) -> bytes:
    """x [2, 3] + a constant [6] reshaped to the declared [2, 3] by ``shape`` (folded at
    import; None: no shape input and no options, TFLite's target [])."""
    g = Graph()
    x = g.input((2, 3), F, name="x")
    r = g.tensor((2, 3), F)
    ins = [g.const(np.arange(6, dtype=F))] + ([] if shape is None else [g.const(shape)])
    g.op("RESHAPE", ins, [r])
    y = g.tensor((2, 3), F, name="y")
    g.op("ADD", [x, r], [y], ("AddOptions", dict(FusedActivationFunction=0)))
    g.output(y)
    return build(g)


def _split_v(axis: np.ndarray) -> bytes:
    """x [6] reshaped to [2, 3] by a shape SPLIT_V takes apart along ``axis`` (folded; TFLite
    reads a float axis's bits as an int: 1.0 is out of range, where nnhal read axis 1)."""
    g = Graph()
    x = g.input((6,), F, name="x")
    parts = [g.tensor((1,), np.int32), g.tensor((1,), np.int32)]
    g.op("SPLIT_V", [g.const(np.int32([2, 3])), g.const(np.int32([1, 1])), g.const(axis)],
         parts, ("SplitVOptions", dict(NumSplits=2)))
    shape = g.tensor((2,), np.int32)
    g.op("CONCATENATION", parts, [shape], ("ConcatenationOptions", dict(Axis=0)))
    y = g.tensor((2, 3), F, name="y")
    g.op("RESHAPE", [x, shape], [y])
    g.output(y)
    return build(g)


def _complex_buffer(short: bool) -> bytes:
    """An unused complex64 [2] constant whose buffer holds 8 bytes (short) or 16."""
    g = Graph()
    x = g.input((2,), F, name="x")
    y = g.tensor((2,), F, name="y")
    g.op("ADD", [x, x], [y], ("AddOptions", dict(FusedActivationFunction=0)))
    g.const(np.zeros(2 if short else 4, np.int32), name="c", shape=(2,))  # retyped below
    g.output(y)
    data = bytearray(build(g))
    sg = tflite.Model.GetRootAs(bytes(data)).Subgraphs(0)
    for i in range(sg.TensorsLength()):
        if sg.Tensors(i).Name() == b"c":
            struct.pack_into("<b", data, _field(sg.Tensors(i), 1), TT.COMPLEX64)
    return bytes(data)


#: What TFLite's InterpreterBuilder or a kernel's Prepare refuses, found by the fuzz test
#: beyond its first seed: (file, the error class, what the message says), and a file of
#: the same kind TFLite accepts, which nnhal must read.
PREPARE_REFUSED = {
    "empty_data_vector_of_a_constant": (_shape_buffer_emptied, ModelFileError,
                                        r"has 0 bytes of data for shape \[2\]", None),
    "conv_without_bias": (lambda: _conv(None), ModelFileError, r"has 2 inputs",
                          lambda: _conv([1])),
    "conv_bias_left_out": (lambda: _conv([0]), ModelFileError, r"leaves out input 2",
                           None),
    "depthwise_bias_left_out": (lambda: _conv([0], op="DEPTHWISE_CONV_2D"), ModelFileError,
                                r"leaves out input 2",
                                lambda: _conv(None, op="DEPTHWISE_CONV_2D")),
    "conv_stride_over_int16": (lambda: _conv([1], 40000), UnsupportedModelError,
                               r"stride_width 40000 is over 32767",
                               lambda: _conv([1], 32767)),
    **{f"{op.lower()}_same_padding_over_int16": (
        lambda op=op: _same_pool(op, 4, 65_537), UnsupportedModelError,
        r"SAME padding of 32768 along the height is over 32767",
        lambda op=op: _same_pool(op, 4, 65_536)) for op in (
            "MAX_POOL_2D", "AVERAGE_POOL_2D", "L2_POOL_2D")},
    # The padding, not the window, is bounded: a stride shrinks it ((2 - 1) * 4 + f - 8).
    "pool_same_padding_over_int16_with_a_stride": (
        lambda: _same_pool("MAX_POOL_2D", 8, 65_540, 4), UnsupportedModelError,
        r"SAME padding of 32768", lambda: _same_pool("MAX_POOL_2D", 8, 65_539, 4)),
    **{f"{op.lower()}_same_padding_over_int16": (
        lambda op=op: _same_conv(op, 65_537), UnsupportedModelError,
        r"SAME padding of 32768 along the height is over 32767",
        lambda op=op: _same_conv(op, 65_536)) for op in ("CONV_2D", "DEPTHWISE_CONV_2D")},
    "dilated_conv_same_padding_over_int16": (
        lambda: _same_conv("CONV_2D", 3, 32_769), UnsupportedModelError,
        r"SAME padding of 32769", lambda: _same_conv("CONV_2D", 3, 32_767)),
    "relu_version_past_the_registered": (lambda: _relu_version(4), UnsupportedModelError,
                                         r"version 4 of RELU is not one TFLite registers "
                                         r"\(1 to 3\)", lambda: _relu_version(3)),
    "relu_version_0": (lambda: _relu_version(0), UnsupportedModelError,
                       r"version 0 of RELU", lambda: _relu_version(1)),
    "fc_bias_scale_not_input_times_filter": (lambda: _quantized_fc(0.25),
                                             UnsupportedModelError,
                                             r"bias scale 0.25 is not input x filter",
                                             lambda: _quantized_fc(0.125)),
    "fc_bias_scale_nan": (lambda: _quantized_fc(float("nan")), UnsupportedModelError,
                          r"bias scale nan", None),
    "int8_concatenation_rescaling": (lambda: _int8_concat(0.25), UnsupportedModelError,
                                     r"TFLite's int8 kernel does not rescale",
                                     lambda: _int8_concat(0.5)),
    "resource_handle_of_two_elements": (lambda: _variable((2,)), UnsupportedModelError,
                                        r"a resource handle is one element",
                                        lambda: _variable(())),
    # Found by mutating today's seeds (tests/tflite/data: stft_net, complex_movement, ...):
    "gather_float_positions": (lambda: _gather(np.float32([0, 2])), UnsupportedModelError,
                               r"input 1\) is of a type TFLite's kernel refuses",
                               lambda: _gather(np.int32([0, 2]))),
    "gather_uint8_positions": (lambda: _gather(np.uint8([0, 2])), UnsupportedModelError,
                                r"input 1\) is of a type TFLite's kernel refuses",
                                lambda: _gather(np.int64([0, 2]))),
    "mean_uint8_axis": (lambda: _mean(np.uint8([1])), UnsupportedModelError,
                         r"input 1\) is of a type TFLite's kernel refuses",
                         lambda: _mean(np.int32([1]))),
    "folded_add_of_mixed_types": (lambda: _folded_shape("ADD", np.int64([1, 1])),
                                  UnsupportedModelError, r"differ in type",
                                  lambda: _folded_shape("ADD", np.int32([1, 1]))),
    "folded_concatenation_of_mixed_types": (
        lambda: _folded_shape("CONCATENATION", np.int64([3])), UnsupportedModelError,
        r"differs in type", lambda: _folded_shape("CONCATENATION", np.int32([3]))),
    "pack_values_count_not_its_inputs": (lambda: _counted("PACK", 3), UnsupportedModelError,
                                         r"ValuesCount is 3 for 2 inputs",
                                         lambda: _counted("PACK", 2)),
    "split_v_num_splits_not_its_outputs": (lambda: _counted("SPLIT_V", 5),
                                           UnsupportedModelError, r"NumSplits is 5 for 2 out",
                                           lambda: _counted("SPLIT_V", 2)),
    "shape_out_type_not_an_integer": (lambda: _counted("SHAPE", TT.FLOAT32),
                                      UnsupportedModelError, r"out_type 0 is not int32",
                                      lambda: _counted("SHAPE", TT.INT32)),
    "shape_out_type_not_its_outputs": (lambda: _counted("SHAPE", TT.INT64),
                                       UnsupportedModelError, r"out_type 4 is not .* type of",
                                       lambda: _counted("SHAPE", TT.INT32)),
    "folded_reshape_without_a_target": (lambda: _folded_reshape(None), UnsupportedModelError,
                                        r"new shape \[\] does not hold",
                                        lambda: _folded_reshape(np.int32([2, 3]))),
    "folded_reshape_by_a_shape_of_rank_2": (lambda: _folded_reshape(np.int32([[2, 3]])),
                                            UnsupportedModelError,
                                            r"new shape \[\] does not hold", None),
    "split_v_float_axis": (lambda: _split_v(np.float32(1)), UnsupportedModelError,
                           r"input 2\) is of a type TFLite's kernel refuses",
                           lambda: _split_v(np.int32(0))),
    "complex64_buffer_too_short": (lambda: _complex_buffer(True), ModelFileError,
                                   r"has 8 bytes of data for shape \[2\]",
                                   lambda: _complex_buffer(False)),
}


@pytest.fixture(scope="module")
def prepare_verdicts() -> dict[str, list[str]]:
    if not available():
        return {}
    files = [(k, make()) for k, (bad, _, _, good) in PREPARE_REFUSED.items()
             for make in (bad, good) if make is not None]
    said: dict[str, list[str]] = {}
    for (k, _), v in zip(files, verdicts([f for _, f in files])):
        said.setdefault(k, []).append(v)
    return said


@pytest.mark.parametrize("kind", list(PREPARE_REFUSED))
def test_what_tflite_prepare_refuses_is_refused_in_one_line(kind: str, prepare_verdicts
                                                            ) -> None:
    bad, error, message, good = PREPARE_REFUSED[kind]
    with pytest.raises(error, match=message) as e:
        read_tflite(bad(), name="m.tflite")
    assert "\n" not in str(e.value)
    if good is not None:
        read_tflite(good())
    if prepare_verdicts:
        assert prepare_verdicts[kind][0] != "ok", f"ai-edge-litert accepts {kind}"
        assert prepare_verdicts[kind][1:] in ([], ["ok"])


@pytest.mark.parametrize("scales, refused", [
    ([0.5, 0.25, 1.0], False),
    ([0.5, 1e-40, 1.0], True),  # one subnormal float32 among normal ones
    ([0.0, 0.5], False),  # zero is not subnormal (the type mapping judges it)
    ([float("nan"), 0.5], False),  # nor NaN
    ([1e-46, 0.5], False),  # rounds to float32 zero
    ([-1e-40, 0.5], True),
])
def test_per_channel_subnormal_scale_rule(scales, refused) -> None:
    from nnhal.tflite.kernel_rules import RuleOp, kernel_refusal, rule_tensor

    w = rule_tensor(TT.INT8, scales, [0] * len(scales), "filter")
    op = RuleOp("ABS", [w], [rule_tensor(TT.INT8, [0.5], [0], "out")], lambda k, d: d)
    why = kernel_refusal(op)
    assert (why is not None) == refused
    if refused:
        assert "filter has a subnormal float32 scale" in why


def test_the_version_table_is_what_litert_resolves() -> None:
    """Each builtin's highest registered version resolves in ai-edge-litert and the next
    does not (the table was probed from it; a newer ai-edge-litert shows up here)."""
    if not available():
        pytest.skip("ai-edge-litert is not installed")
    from nnhal.tflite.op_versions import REGISTERED

    names = sorted(REGISTERED)
    files = [_versioned(n, v) for n in names for v in (REGISTERED[n][1], REGISTERED[n][1] + 1)]
    said = verdicts(files, budget_s=120.0)
    unresolved = "Didn't find op for builtin opcode"
    for k, name in enumerate(names):
        at_top, past = said[2 * k], said[2 * k + 1]
        assert unresolved not in at_top, (name, at_top)
        assert unresolved in past, (name, past)


@pytest.mark.parametrize("rank", [33, 40, 64])
def test_shapes_past_32_dimensions_are_refused_in_one_line(rank: int) -> None:
    """numpy's broadcast_shapes raises RuntimeError past 32 dimensions: an element-wise
    operator of such static shapes whose output the importer infers was a traceback."""
    g = Graph()
    x = g.input([1] * rank, F, name="x")
    c = g.const(np.ones([2] + [1] * (rank - 1), F), name="c")
    y = g.tensor([2] + [1] * (rank - 1), F, name="y", signature=[-1] + [1] * (rank - 1))
    g.op("ADD", [x, c], [y], ("AddOptions", dict(FusedActivationFunction=0)))
    g.output(y)
    # (TFLite's ADD broadcasts 8 dimensions at most: the kernel rule says so first)
    with pytest.raises(UnsupportedModelError, match=f"ADD broadcasting {rank} dimensions"):
        read_tflite(build(g))



@pytest.mark.parametrize("rank", [65, 70])
def test_a_tensor_past_64_dimensions_is_unsupported_not_corrupted(rank: int) -> None:
    """No array holds more than 64 dimensions: a used constant of rank 65 was reported as a
    corrupted file (numpy's ValueError from its reshape), the file being well formed."""
    g = Graph()
    x = g.input([1], F, name="x")
    c = g.const(np.ones(1, F), name="c", shape=[1] * rank)
    y = g.tensor([1] * rank, F, name="y")
    g.op("ADD", [x, c], [y], ("AddOptions", dict(FusedActivationFunction=0)))
    g.output(y)
    with pytest.raises(UnsupportedModelError, match=f"tensor 1 'c' has rank {rank}, more "
                                                    f"than the 64 dimensions"):
        read_tflite(build(g))


def test_broadcasting_a_constant_to_a_huge_shape_is_refused_without_allocating() -> None:
    """SELECT_V2's operands are broadcast to the output's shape by constants: an input of
    2^31-1 rows materialised a 2 GiB constant (seconds, and more memory than a phone has)."""
    g = Graph()
    cond = g.const(np.ones([1, 1], np.bool_), name="cond")
    x = g.input([2**31 - 1, 1], F, name="x")
    y = g.tensor([2**31 - 1, 1], F, name="y")
    g.op("SELECT_V2", [cond, x, x], [y])
    g.output(y)
    with pytest.raises(UnsupportedModelError, match="needs a constant of 2147483647 elements"):
        read_tflite(build(g))


@pytest.mark.parametrize("op", ["SLICE", "STRIDED_SLICE", "RESHAPE"])
def test_shape_inference_of_a_huge_input_allocates_nothing(op: str) -> None:
    """The importer inferred these outputs by slicing or reshaping np.empty of the input's
    shape: [2^31-1, 2^20] asked for 2 PiB, and a well-formed file was 'corrupted'."""
    g = Graph()
    x = g.input([2**31 - 1, 2**20], F, name="x")
    i32 = np.int32
    if op == "RESHAPE":
        ins, want = [x, g.const(np.asarray([2**20, -1], i32))], [2**20, 2**31 - 1]
    else:
        ins, want = [x, g.const(np.zeros(2, i32)), g.const(np.ones(2, i32))], [1, 1]
    if op == "STRIDED_SLICE":
        ins.append(g.const(np.ones(2, i32)))
    y = g.tensor([1, 1], F, name="y", signature=[-1, -1])
    g.op(op, ins, [y], ("StridedSliceOptions", {}) if op == "STRIDED_SLICE" else None)
    g.output(y)
    model = read_tflite(build(g), dynamic_shapes=True).model
    assert list(model.main.operands[model.main.output_indexes[0]].dimensions) == want


@pytest.mark.parametrize("op", ["FILL", "TILE", "BROADCAST_TO"])
def test_a_fold_past_a_floats_range_is_refused_quietly(op: str) -> None:
    """The fold bound multiplied a file's dimensions as floats: 40 of 2^31-1 overflowed, and
    numpy's RuntimeWarning reached the user's console (an error under -W error)."""
    import warnings

    from nnhal.errors import NnhalError
    from nnhal.session import Session

    g = Graph()
    x = g.input([1], F, name="x")
    big = np.full(40, 2**31 - 1, np.int32)
    if op == "FILL":
        ins = [g.const(big), g.const(np.asarray(1.0, F))]
    else:
        ins = [g.const(np.ones([1] * 40, F)), g.const(big)]
    y = g.tensor([2**31 - 1] * 40, F, name="y")
    g.op(op, ins, [y])
    z = g.tensor([1], F, name="z")
    g.op("ADD", [x, x], [z], ("AddOptions", dict(FusedActivationFunction=0)))
    g.output(y, z)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # (TILE is imported as the HAL's, which the analysis then finds too large)
        with pytest.raises(NnhalError, match="#0 FILL|#0 BROADCAST_TO|too large"):
            Session(build(g), "reference")
