"""The importer's core: tensor types, names, shapes, constants (inline and past the
flatbuffer), constant folding (float16 / int8 DEQUANTIZE, sparse DENSIFY, SHAPE chains),
resource variables, the support table, and errors (every unsupported operator named at once;
corrupted files as one ModelFileError)."""

from __future__ import annotations

import numpy as np
import pytest
from runner import Reference, agree, litert, litert_run
from tfl import Graph, Quant, build, one_op
from tflite.TensorType import TensorType as TT

from nnhal.errors import ModelFileError, UnsupportedModelError
from nnhal.hal.types import ChannelScales, OperandLifeTime, OperandType, OperationType
from nnhal.tflite import builtin_support, read_tflite, schema
from nnhal.tflite.import_ctx import Unimportable, hal_type
from nnhal.tflite.import_read import TfliteTensor, read_model

F = np.float32
T = OperandType


def _input_types(data: bytes) -> list[tuple[OperandType, list[int], float, int]]:
    m = read_tflite(data).model.main
    return [(T(m.operands[i].type), m.operands[i].dimensions, m.operands[i].scale,
             m.operands[i].zero_point) for i in m.input_indexes]


def _ops(data: bytes) -> list[str]:
    return [OperationType(op.type).name for op in read_tflite(data).model.main.operations]


# ---- types, names, shapes --------------------------------------------------------------------

@pytest.mark.parametrize("dtype, quant, expected", [
    (np.float32, None, (T.TENSOR_FLOAT32, 0.0, 0)),
    (np.float16, None, (T.TENSOR_FLOAT16, 0.0, 0)),
    (np.int32, None, (T.TENSOR_INT32, 0.0, 0)),
    (np.uint8, Quant([0.5], [128]), (T.TENSOR_QUANT8_ASYMM, 0.5, 128)),
    (np.int8, Quant([0.25], [-3]), (T.TENSOR_QUANT8_ASYMM_SIGNED, 0.25, -3)),
    (np.int16, Quant([0.125], [0]), (T.TENSOR_QUANT16_SYMM, 0.125, 0)),
    (np.bool_, None, (T.TENSOR_BOOL8, 0.0, 0)),
])
def test_tensor_types_become_hal_operand_types(dtype, quant, expected) -> None:
    g = Graph()
    x = g.input((2, 3), dtype, quant=quant)
    g.output(x)  # an input listed as an output is copied by an exact HAL operation
    data = build(g)
    tensor = read_model(schema.load(data))[0].tensors[0]
    assert hal_type(tensor)[:3] == expected
    try:
        types = _input_types(data)
    except UnsupportedModelError as e:  # no exact HAL copy of an int16 tensor
        assert dtype == np.int16 and "TENSOR_QUANT16_SYMM" in str(e)
        return
    assert (types[0][0], types[0][2], types[0][3]) == expected
    assert types[0][1] == [2, 3]


def test_a_type_the_hal_operation_does_not_take_names_the_operator() -> None:
    g = Graph()
    x = g.input((2, 3), np.int32)
    y = g.tensor((2, 3), np.int32)
    g.op("FLOOR", [x], [y])
    g.output(y)
    with pytest.raises(UnsupportedModelError) as e:
        read_tflite(build(g))
    assert e.value.items[0].startswith("#0 FLOOR: the HAL's FLOOR: input 0 (input) has "
                                       "type TENSOR_INT32")


def test_per_channel_int8_weights_become_symm_per_channel() -> None:
    g = Graph()
    x = g.input((1, 3, 3, 2), np.int8, quant=Quant([0.1], [0]))
    wt = g.const(np.ones((3, 1, 1, 2), np.int8), quant=Quant([0.1, 0.2, 0.3], [0, 0, 0], 0))
    b = g.const(np.zeros(3, np.int32), quant=Quant([0.01, 0.02, 0.03], [0, 0, 0], 0))
    y = g.tensor((1, 3, 3, 3), np.int8, quant=Quant([0.5], [0]))
    g.op("CONV_2D", [x, wt, b], [y], ("Conv2DOptions", dict(Padding=1, StrideW=1, StrideH=1)))
    g.output(y)
    main = read_tflite(build(g)).model.main
    filt = main.operands[main.operations[0].inputs[1]]
    bias = main.operands[main.operations[0].inputs[2]]
    assert T(filt.type) == T.TENSOR_QUANT8_SYMM_PER_CHANNEL
    assert filt.extra_params.scales == pytest.approx([0.1, 0.2, 0.3])
    assert filt.extra_params.channel_dim == 0
    assert type(filt.extra_params.scales) is ChannelScales  # frozen, with its array
    assert (T(bias.type), bias.scale) == (T.TENSOR_INT32, 0.0)


def test_hal_type_is_kept_per_tensor_until_its_quantization_changes() -> None:
    t = TfliteTensor(0, "w", TT.INT8, (2, 1), scales=np.array([0.5, 0.25], np.float32),
                     zero_points=np.zeros(2, np.int64))
    a, b = hal_type(t), hal_type(t)
    assert a[0] == b[0] == T.TENSOR_QUANT8_SYMM_PER_CHANNEL
    assert a[3] is not b[3] and a[3].scales is b[3].scales  # own params, shared frozen scales
    t.scales = np.array([0.5, -1.0], np.float32)  # replaced: judged again
    with pytest.raises(Unimportable, match="non-positive"):
        hal_type(t)
    t.scales, t.zero_points = np.array([0.5], np.float32), np.zeros(1, np.int64)
    assert hal_type(t)[:3] == (T.TENSOR_QUANT8_ASYMM_SIGNED, 0.5, 0)


def test_quantized_bias_scale_is_the_product_the_hal_requires() -> None:
    g = Graph()
    x = g.input((1, 4), np.int8, quant=Quant([0.3], [0]))
    wt = g.const(np.ones((2, 4), np.int8), quant=Quant([0.07], [0]))
    b = g.const(np.zeros(2, np.int32), quant=Quant([0.021001], [0]))  # slightly off
    y = g.tensor((1, 2), np.int8, quant=Quant([0.5], [0]))
    g.op("FULLY_CONNECTED", [x, wt, b], [y])  # no options: the schema's defaults
    g.output(y)
    main = read_tflite(build(g)).model.main
    bias = main.operands[main.operations[0].inputs[2]]
    assert bias.scale == pytest.approx(float(np.float32(0.3) * np.float32(0.07)), rel=1e-7)


def _dynamic_batch_relu() -> bytes:
    g = Graph()
    x = g.input((1, 3), F, name="audio:0", signature=(-1, 3))
    y = g.tensor((1, 3), F, name="score/Identity", signature=(-1, 3))
    g.op("RELU", [x], [y])
    g.output(y)
    return build(g)


def test_names_and_unknown_dimensions_with_dynamic_shapes() -> None:
    imported = read_tflite(_dynamic_batch_relu(), dynamic_shapes=True)
    assert imported.input_names == ["audio:0"]
    assert imported.output_names == ["score/Identity"]
    main = imported.model.main
    assert main.operands[main.input_indexes[0]].dimensions == [0, 3]
    assert main.operands[main.output_indexes[0]].dimensions == [0, 3]


def test_shapes_are_the_allocated_ones_by_default() -> None:
    """As TFLite allocates (and its NNAPI delegate delegates) without a resize: the `shape`
    field, whatever the signature marks dynamic."""
    imported = read_tflite(_dynamic_batch_relu())
    assert imported.input_names == ["audio:0"]
    main = imported.model.main
    assert main.operands[main.input_indexes[0]].dimensions == [1, 3]
    assert main.operands[main.output_indexes[0]].dimensions == [1, 3]


def test_outputs_that_are_inputs_constants_or_repeated_are_copied_exactly() -> None:
    pytest.importorskip("ai_edge_litert.interpreter")
    g = Graph()
    x = g.input((2, 3), F, name="x")
    c = g.const(np.arange(6, dtype=F).reshape(2, 3), name="c")
    y = g.tensor((2, 3), F, name="y")
    g.op("ADD", [x, c], [y])
    g.output(y, x, y)
    data = build(g)
    imported = read_tflite(data)
    assert imported.output_names == ["y", "x", "y"]
    ref = Reference(imported)
    try:
        xin = np.random.default_rng(0).normal(size=(2, 3)).astype(F)
        got = ref.run([xin])
    finally:
        ref.close()
    np.testing.assert_array_equal(got[1], xin)
    np.testing.assert_array_equal(got[0], got[2])
    np.testing.assert_array_equal(got[0], xin + np.arange(6, dtype=F).reshape(2, 3))


def test_constants_past_the_flatbuffer_are_read() -> None:
    pytest.importorskip("ai_edge_litert.interpreter")
    g = Graph()
    x = g.input((2, 40), F)
    y = g.tensor((2, 40), F)
    g.op("ADD", [x, g.const(np.linspace(-3, 3, 80, dtype=F).reshape(2, 40))], [y])
    g.output(y)
    data = build(g, external=True)
    main = schema.load(data).model
    assert any(main.Buffers(k).Offset() > 1 for k in range(main.BuffersLength()))
    agree(data)


def test_float16_weights_feeding_a_float16_operation_stay_float16() -> None:
    g = Graph()
    x = g.input((2, 3), np.float16)
    y = g.tensor((2, 3), np.float16)
    g.op("ADD", [x, g.const(np.ones((2, 3), np.float16))], [y])
    g.output(y)
    main = read_tflite(build(g)).model.main
    assert {T(main.operands[i].type) for i in main.operations[0].inputs[:2]} == {
        T.TENSOR_FLOAT16}


# ---- constant folding ------------------------------------------------------------------------

def test_float16_and_int8_weights_behind_dequantize_are_folded() -> None:
    pytest.importorskip("ai_edge_litert.interpreter")
    g = Graph()
    x = g.input((1, 4, 4, 2), F)
    w16 = g.const(np.random.default_rng(0).normal(size=(3, 1, 1, 2)).astype(np.float16))
    wf = g.tensor((3, 1, 1, 2), F)
    g.op("DEQUANTIZE", [w16], [wf])
    b8 = g.const(np.int8([10, -20, 30]), quant=Quant([0.01, 0.02, 0.03], [0, 0, 0], 0))
    bf = g.tensor((3,), F)
    g.op("DEQUANTIZE", [b8], [bf])
    y = g.tensor((1, 4, 4, 3), F)
    g.op("CONV_2D", [x, wf, bf], [y], ("Conv2DOptions", dict(Padding=1, StrideW=1, StrideH=1)))
    g.output(y)
    data = build(g)
    assert _ops(data) == ["CONV_2D"]
    agree(data)


def _keras_flatten(batch_signature: int = 1) -> bytes:
    """The Keras flatten pattern: the batch size read from SHAPE at run time."""
    g = Graph()
    x = g.input((1, 4, 4, 2), F, signature=(batch_signature, 4, 4, 2))
    shape = g.tensor((4,), np.int32)
    g.op("SHAPE", [x], [shape], ("ShapeOptions", dict(OutType=TT.INT32)))
    batch = g.tensor((), np.int32)
    g.op("STRIDED_SLICE", [shape, g.const(np.int32([0])), g.const(np.int32([1])),
                           g.const(np.int32([1]))], [batch],
         ("StridedSliceOptions", dict(ShrinkAxisMask=1)))
    new_shape = g.tensor((2,), np.int32)
    g.op("PACK", [batch, g.const(np.int32(-1))], [new_shape],
         ("PackOptions", dict(ValuesCount=2, Axis=0)))
    y = g.tensor((1, 32), F, signature=(batch_signature, 32))
    g.op("RESHAPE", [x, new_shape], [y])
    g.output(y)
    return build(g)


@pytest.mark.parametrize("batch_signature", [1, -1])
def test_shape_strided_slice_pack_reshape_chain_folds_to_a_constant_reshape(
        batch_signature: int) -> None:
    """Folded with a static batch, and by default with a dynamic one too (the allocated
    shape), as Keras MobileNet V1 needs."""
    pytest.importorskip("ai_edge_litert.interpreter")
    data = _keras_flatten(batch_signature)
    assert _ops(data) == ["RESHAPE"]
    main = read_tflite(data).model.main
    assert OperandLifeTime(main.operands[main.operations[0].inputs[1]].lifetime) in (
        OperandLifeTime.CONSTANT_COPY, OperandLifeTime.CONSTANT_REFERENCE)
    agree(data)


def test_shape_chain_with_dynamic_shapes_is_refused_naming_shape() -> None:
    with pytest.raises(UnsupportedModelError, match=r"#0 SHAPE"):
        read_tflite(_keras_flatten(-1), dynamic_shapes=True)


def _csr(dense: np.ndarray) -> tuple[list, list, list]:
    """Rows dense, columns CSR: (segments, indices, values)."""
    seg, idx, vals = [0], [], []
    for row in dense:
        nz = np.flatnonzero(row)
        idx += nz.tolist()
        vals += row[nz].tolist()
        seg.append(len(idx))
    return seg, idx, vals


def _sparse_model(dense: np.ndarray, values: list, spec: tuple) -> bytes:
    g = Graph()
    x = g.input(dense.shape, F)
    s = g.const(np.asarray(values, F), sparsity=spec, shape=dense.shape)
    d = g.tensor(dense.shape, F)
    g.op("DENSIFY", [s], [d])
    y = g.tensor(dense.shape, F)
    g.op("ADD", [x, d], [y])
    g.output(y)
    return build(g)


def _matrix() -> np.ndarray:
    m = np.zeros((4, 6), F)
    m[0, 1], m[0, 5], m[2, 0], m[3, 3], m[3, 4] = 1.5, -2, 3, 4.25, -5
    return m


def test_densify_csr_agrees_with_litert() -> None:
    pytest.importorskip("ai_edge_litert.interpreter")
    m = _matrix()
    seg, idx, vals = _csr(m)
    data = _sparse_model(m, vals, ([0, 1], [], [("dense", 4), ("csr", seg, idx)]))
    assert _ops(data) == ["ADD"]
    x = np.zeros(m.shape, F)
    np.testing.assert_array_equal(agree(data, [x])[0], m)


def test_densify_column_major_traversal_agrees_with_litert() -> None:
    pytest.importorskip("ai_edge_litert.interpreter")
    m = _matrix()
    seg, idx, vals = _csr(m.T)
    data = _sparse_model(m, vals, ([1, 0], [], [("dense", 6), ("csr", seg, idx)]))
    np.testing.assert_array_equal(agree(data, [np.zeros(m.shape, F)])[0], m)


def test_densify_block_sparse_agrees_with_litert() -> None:
    """2x2 blocks: rows of blocks dense, block columns CSR, each block dense 2x2."""
    pytest.importorskip("ai_edge_litert.interpreter")
    m = _matrix()
    blocks = m.reshape(2, 2, 3, 2).transpose(0, 2, 1, 3)  # [brow, bcol, r, c]
    seg, idx, vals = [0], [], []
    for br in range(2):
        for bc in range(3):
            if np.any(blocks[br, bc]):
                idx.append(bc)
                vals += blocks[br, bc].reshape(-1).tolist()
        seg.append(len(idx))
    spec = ([0, 1, 2, 3], [0, 1], [("dense", 2), ("csr", seg, idx), ("dense", 2),
                                   ("dense", 2)])
    data = _sparse_model(m, vals, spec)
    np.testing.assert_array_equal(agree(data, [np.zeros(m.shape, F)])[0], m)


# ---- resource variables ----------------------------------------------------------------------

def _stateful(assign_second: bool, init_second: bool = True) -> bytes:
    """acc += x each run (initialised to [1, 2, 3] by CALL_ONCE); a second variable
    (initialised to [4, 5, 6] unless ``init_second`` is false) is only read, or also assigned
    a constant, depending on ``assign_second``."""
    init = Graph()
    h = init.tensor((), TT.RESOURCE)
    init.op("VAR_HANDLE", [], [h], ("VarHandleOptions", dict(SharedName=b"acc")))
    init.op("ASSIGN_VARIABLE", [h, init.const(np.float32([1, 2, 3]))], [])
    if init_second:
        h2 = init.tensor((), TT.RESOURCE)
        init.op("VAR_HANDLE", [], [h2], ("VarHandleOptions", dict(SharedName=b"other",
                                                                  Container=b"box")))
        init.op("ASSIGN_VARIABLE", [h2, init.const(np.float32([4, 5, 6]))], [])
    g = Graph()
    x = g.input((3,), F, name="x")
    g.op("CALL_ONCE", [], [], ("CallOnceOptions", dict(InitSubgraphIndex=1)))
    h1 = g.tensor((), TT.RESOURCE)
    g.op("VAR_HANDLE", [], [h1], ("VarHandleOptions", dict(SharedName=b"acc")))
    h2 = g.tensor((), TT.RESOURCE)
    g.op("VAR_HANDLE", [], [h2], ("VarHandleOptions", dict(SharedName=b"other",
                                                           Container=b"box")))
    old = g.tensor((3,), F)
    g.op("READ_VARIABLE", [h1], [old])
    new = g.tensor((3,), F, name="total")
    g.op("ADD", [old, x], [new], ("AddOptions", dict(FusedActivationFunction=0)))
    g.op("ASSIGN_VARIABLE", [h1, new], [])
    if assign_second:
        g.op("ASSIGN_VARIABLE", [h2, g.const(np.float32([7, 8, 9]))], [])
    other = g.tensor((3,), F)
    g.op("READ_VARIABLE", [h2], [other])
    y = g.tensor((3,), F, name="y")
    g.op("MUL", [new, other], [y], ("MulOptions", dict(FusedActivationFunction=0)))
    g.output(y, new)
    return build(g, init)


@pytest.mark.parametrize("assign_second", [False, True])
def test_resource_variables_become_state_and_agree_over_five_runs(assign_second: bool
                                                                   ) -> None:
    pytest.importorskip("ai_edge_litert.interpreter")
    data = _stateful(assign_second)
    imported = read_tflite(data)
    assert imported.input_names == ["x", "acc", "box/other"]
    assert imported.output_names == ["y", "total", "acc", "box/other"]
    assert [(s.name, s.input, s.output) for s in imported.state] == [
        ("acc", 1, 2), ("box/other", 2, 3)]
    np.testing.assert_array_equal(imported.state[0].initial, [1, 2, 3])
    np.testing.assert_array_equal(imported.state[1].initial, [4, 5, 6])
    it = litert(data)
    ref = Reference(imported)
    rng = np.random.default_rng(0)
    state = [s.initial for s in imported.state]
    try:
        for _ in range(5):
            x = rng.normal(size=3).astype(F)
            expected = litert_run(it, [x])
            got = ref.run([x] + state)
            state = got[2:]
            for g_, e in zip(got[:2], expected):
                np.testing.assert_allclose(g_, e, rtol=1e-6, atol=1e-6)
    finally:
        ref.close()
    assert np.any(state[0] != imported.state[0].initial)
    np.testing.assert_array_equal(state[1], [7, 8, 9] if assign_second else [4, 5, 6])


def test_a_variable_the_initialisation_leaves_alone_starts_at_zeros() -> None:
    """(litert reads such a variable's memory uninitialised, so there is no oracle here.)"""
    imported = read_tflite(_stateful(False, init_second=False))
    np.testing.assert_array_equal(imported.state[1].initial, np.zeros(3, F))
    assert imported.state[1].initial.dtype == F


# ---- the support table -----------------------------------------------------------------------

def test_builtin_support_lists_every_builtin_once() -> None:
    mapped, refused = builtin_support()
    names = {n for n in schema.BUILTIN_NAMES.values() if not n.startswith("PLACEHOLDER")}
    assert not set(mapped) & set(refused)
    assert set(mapped) | set(refused) == names
    for name in ("CONV_2D", "FULLY_CONNECTED", "DENSIFY", "SPLIT_V", "READ_VARIABLE"):
        assert name in mapped
    for name in ("BATCH_MATMUL", "PACK", "MIRROR_PAD", "REVERSE_V2"):  # AIDL v2 / v3
        assert name in mapped and "AIDL v" in mapped[name]


# ---- errors ----------------------------------------------------------------------------------

def test_every_unsupported_operator_and_tensor_is_named_at_once() -> None:
    g = Graph()
    x = g.input((2, 3), F)
    a = g.tensor((2, 2, 5), F)  # TFLite broadcasts x over the batch of 2: the HAL cannot
    g.op("BATCH_MATMUL", [x, g.const(np.ones((2, 3, 5), np.float32))], [a],
         ("BatchMatMulOptions", dict(AdjX=False, AdjY=False)))
    b = g.tensor((2, 2, 5), F)
    g.op("RELU", [a], [b])  # reads a refused result: not reported again
    c = g.tensor((2, 3), F)
    g.op("CUSTOM:MyOp", [x], [c])
    d = g.tensor((2, 3), F)
    g.op("ATAN2", [x, x], [d])
    s = g.tensor((2,), np.int64)
    g.op("SHAPE", [c], [s], ("ShapeOptions", dict(OutType=TT.INT64)))
    g.output(b, d, s)
    with pytest.raises(UnsupportedModelError) as e:
        read_tflite(build(g), name="m.tflite")
    items = e.value.items
    assert str(e.value).startswith("m.tflite: 3 operator(s) have no HAL equivalent and 1 "
                                   "tensor(s) have no HAL operand type: ")
    # SHAPE of a static shape folds to an int64 constant, which is reported as an output.
    assert [i.split(":")[0] for i in items] == ["#0 BATCH_MATMUL", "#2 MyOp", "#3 ATAN2",
                                                "output tensor 6 't6'"]
    assert "batch dimensions" in items[0] and "custom" in items[1] and "INT64" in items[3]


def test_a_fold_only_operator_on_run_time_values_says_so() -> None:
    g = Graph()
    x = g.input((), np.int32)
    y = g.tensor((4,), np.int32)
    g.op("RANGE", [g.const(np.int32(0)), x, g.const(np.int32(1))], [y])
    g.output(y)
    with pytest.raises(UnsupportedModelError, match="#0 RANGE: .*folded only when"):
        read_tflite(build(g))


def test_unsupported_tensor_types_are_named() -> None:
    g = Graph()
    x = g.input((2,), np.int64, name="ids")
    y = g.tensor((2,), np.int64)
    g.op("NEG", [x], [y])
    g.output(y)
    with pytest.raises(UnsupportedModelError) as e:
        read_tflite(build(g))
    assert "tensor 0 'ids' has type INT64" in str(e.value)


@pytest.mark.parametrize("data, problem", [
    (b"", "not a TFLite flatbuffer"),
    (b"\x10\0\0\0ABCD" + b"\0" * 16, "identifier"),
    (b"\xff\xff\0\0TFL3" + b"\0" * 8, "truncated"),
])
def test_files_that_are_not_tflite_give_one_line(data: bytes, problem: str) -> None:
    with pytest.raises(ModelFileError) as e:
        read_tflite(data, name="x.tflite")
    assert str(e.value).startswith("x.tflite: ") and problem in str(e.value)
    assert "\n" not in str(e.value)


def test_unknown_schema_version_and_missing_file(tmp_path) -> None:
    data = one_op("RELU", [((2,), F)], (2,))
    g = Graph()
    x = g.input((2,), F)
    y = g.tensor((2,), F)
    g.op("RELU", [x], [y])
    g.output(y)
    with pytest.raises(ModelFileError, match="schema version 2 is not supported"):
        read_tflite(build(g, version=2))
    with pytest.raises(ModelFileError, match="no such file"):
        read_tflite(tmp_path / "missing.tflite")
    (tmp_path / "m.tflite").write_bytes(data)
    assert read_tflite(tmp_path / "m.tflite").source == str(tmp_path / "m.tflite")


def _fixture_model() -> bytes:
    g = Graph()
    x = g.input((1, 4, 4, 2), F)
    w = g.const(np.ones((3, 2, 2, 2), F))
    b = g.const(np.zeros(3, F))
    y = g.tensor((1, 3, 3, 3), F)
    g.op("CONV_2D", [x, w, b], [y], ("Conv2DOptions", dict(Padding=1, StrideW=1, StrideH=1)))
    z = g.tensor((1, 27), F)
    g.op("RESHAPE", [y, g.const(np.int32([1, 27]))], [z])
    g.output(z)
    return build(g)


def test_truncated_and_corrupted_files_never_raise_anything_else() -> None:
    """Every prefix of a small model, and bytes flipped at random: each either imports or
    raises one ModelFileError / UnsupportedModelError line, never another exception."""
    data = _fixture_model()
    read_tflite(data)
    rng = np.random.default_rng(11)
    variants = [data[:n] for n in range(0, len(data), 7)]
    for _ in range(300):
        b = bytearray(data)
        for k in rng.integers(0, len(b), rng.integers(1, 4)):
            b[k] = int(rng.integers(0, 256))
        variants.append(bytes(b))
    outcomes = {"ok": 0, "file": 0, "unsupported": 0}
    for v in variants:
        try:
            read_tflite(v)
            outcomes["ok"] += 1
        except ModelFileError as e:
            assert "\n" not in str(e)
            outcomes["file"] += 1
        except UnsupportedModelError:
            outcomes["unsupported"] += 1
    assert outcomes["file"] > len(data) // 7  # every truncation at least


# ---- control flow ----------------------------------------------------------------------------

def _branch(op: str, const: float) -> Graph:
    g = Graph()
    x = g.input((2,), F)
    y = g.tensor((2,), F)
    g.op(op, [x, g.const(np.float32([const, const]))], [y],
         (f"{op.capitalize()}Options", dict(FusedActivationFunction=0)))
    g.output(y)
    return g


def test_if_agrees_with_litert_on_both_branches() -> None:
    pytest.importorskip("ai_edge_litert.interpreter")
    g = Graph()
    c = g.input((1,), np.bool_, name="cond")
    x = g.input((2,), F, name="x")
    y = g.tensor((2,), F, name="y")
    g.op("IF", [c, x], [y], ("IfOptions", dict(ThenSubgraphIndex=1, ElseSubgraphIndex=2)))
    g.output(y)
    data = build(g, _branch("ADD", 1.0), _branch("MUL", 2.0))
    imported = read_tflite(data)
    assert len(imported.model.referenced) == 2
    x = np.float32([3, -4])
    np.testing.assert_array_equal(agree(data, [np.array([True]), x])[0], x + 1)
    np.testing.assert_array_equal(agree(data, [np.array([False]), x])[0], x * 2)


@pytest.mark.parametrize("counter", [(), (1,)], ids=["scalar", "vector"])
def test_while_agrees_with_litert(counter: tuple) -> None:
    """A TFLite scalar (the usual loop counter) is a HAL [1]."""
    pytest.importorskip("ai_edge_litert.interpreter")
    one = np.ones(counter, np.int32)
    cond = Graph()
    i, x = cond.input(counter, np.int32), cond.input((2,), F)
    b = cond.tensor(counter, np.bool_)
    cond.op("LESS", [i, cond.const(one * 5)], [b])
    cond.output(b)
    body = Graph()
    i, x = body.input(counter, np.int32), body.input((2,), F)
    i2, x2 = body.tensor(counter, np.int32), body.tensor((2,), F)
    body.op("ADD", [i, body.const(one)], [i2], ("AddOptions", dict(FusedActivationFunction=0)))
    body.op("MUL", [x, body.const(np.float32([1.5, -1]))], [x2],
            ("MulOptions", dict(FusedActivationFunction=0)))
    body.output(i2, x2)
    g = Graph()
    i, x = g.input(counter, np.int32, name="i"), g.input((2,), F, name="x")
    i_out, x_out = g.tensor(counter, np.int32, name="i_out"), g.tensor((2,), F, name="x_out")
    g.op("WHILE", [i, x], [i_out, x_out], ("WhileOptions", dict(CondSubgraphIndex=1,
                                                                 BodySubgraphIndex=2)))
    g.output(i_out, x_out)
    data = build(g, cond, body)
    got = agree(data, [one, np.float32([2, 3])])
    np.testing.assert_array_equal(got[0].reshape(-1), [5])
    np.testing.assert_allclose(got[1], [2 * 1.5 ** 4, 3.0])


def test_an_operator_with_too_few_inputs_is_named_not_a_traceback() -> None:
    g = Graph()
    x = g.input((1, 4, 4, 2), F)
    y = g.tensor((1, 4, 4, 2), F)
    g.op("CONV_2D", [x], [y], ("Conv2DOptions", dict(Padding=0, StrideW=1, StrideH=1)))
    g.output(y)
    with pytest.raises(ModelFileError, match=r"operator 0 \(CONV_2D\) has 1 inputs"):
        read_tflite(build(g))


def test_a_sparse_tensor_of_absurd_shape_is_refused_not_allocated() -> None:
    g = Graph()
    x = g.input((2,), F)
    s = g.const(np.float32([1.0]), shape=(1 << 20, 1 << 20),
                sparsity=([0, 1], [], [("dense", 1 << 20), ("csr", [0, 1], [0])]))
    d = g.tensor((1 << 20, 1 << 20), F)
    g.op("DENSIFY", [s], [d])
    y = g.tensor((2,), F)
    g.op("RELU", [x], [y])
    g.output(y)
    with pytest.raises(ModelFileError, match="out of range"):
        read_tflite(build(g))


def test_options_read_at_init_are_what_the_generated_accessors_read() -> None:
    """Every options table's scalar fields, read once from the vtable when the table is
    initialised, are recognised (as many as the layout has scalar slots) and read as the
    generated accessors read them: each field set to a value that is not its default, and
    each absent (its default)."""
    import importlib
    import pkgutil

    import flatbuffers
    import tflite

    from nnhal.tflite.import_read import _read_once, _scalar_field
    from nnhal.tflite.layout import TABLES

    checked = 0
    for m in pkgutil.iter_modules(tflite.__path__):
        base = getattr(importlib.import_module(f"tflite.{m.name}"), m.name, None)
        if not m.name.endswith("Options") or not hasattr(base, "Init"):
            continue
        fields = {n: f for n, fn in vars(base).items() if (f := _scalar_field(fn)) is not None}
        assert len(fields) == sum(k.isdigit() for k in TABLES.get(m.name, "").split())
        for present in (True, False):
            b = flatbuffers.Builder(64)
            b.StartObject(1 + max((v for v, _ in fields.values()), default=4) // 2)
            for voffset, packer in fields.values() if present else ():
                flags = next(f for f in vars(flatbuffers.number_types).values()
                             if getattr(f, "packer_type", None) is packer)
                value = {"?": True, "f": 2.5, "d": 2.5}.get(packer.format[-1], 3)
                b.PrependSlot(flags, (voffset - 4) // 2, value, None)
            b.Finish(b.EndObject())
            data = bytes(b.Output())
            pos = flatbuffers.encode.Get(flatbuffers.packer.uoffset, data, 0)
            fast, slow = _read_once(m.name)(), base()
            fast.Init(data, pos)
            slow.Init(data, pos)
            for name in fields:
                got, want = getattr(fast, name)(), getattr(slow, name)()
                assert (got, type(got)) == (want, type(want)), (m.name, name, present)
                checked += 1
    assert checked > 300


def test_shape_inference_broadcasts_as_numpy_does() -> None:
    """The import's broadcast of static shapes is numpy's: the same shape, or a ValueError
    where numpy raises one; past numpy's 32 dimensions (where it raises RuntimeError) still
    an answer or a ValueError."""
    from nnhal.ops.common import broadcast_static

    rng = np.random.default_rng(5)
    for _ in range(500):
        shapes = [tuple(int(d) for d in rng.choice([0, 1, 2, 3], size=rng.integers(0, 5)))
                  for _ in range(rng.integers(1, 4))]
        try:
            want: object = tuple(np.broadcast_shapes(*shapes))
        except ValueError:
            want = ValueError
        try:
            got: object = broadcast_static(*shapes)
        except ValueError:
            got = ValueError
        assert got == want, shapes
    with pytest.raises(RuntimeError):
        np.broadcast_shapes((1,) * 33, (2,))
    assert broadcast_static((1,) * 33, (2,)) == (1,) * 32 + (2,)
    with pytest.raises(ValueError):
        broadcast_static((2,) * 40, (3,) * 40)
