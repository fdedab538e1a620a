"""ModelBuilder: referenced subgraphs, omitted operands, constant placement, explicit
numberOfConsumers, and the conformance case builder as a thin use of it."""

from __future__ import annotations

import numpy as np
import pytest

from nnhal.conformance.cases import MalformedCase, build_model
from nnhal.hal.builder import MAX_INLINE, ModelBuilder, RequestBuilder
from nnhal.hal.interfaces import PreparedModelCallback
from nnhal.hal.types import (
    DataLocation,
    ErrorStatus,
    ExecutionPreference,
    OperandLifeTime,
    OperandType,
    OperationType,
    Priority,
    SymmPerChannelQuantParams,
)

T, L, O = OperandType, OperandLifeTime, OperationType


def if_model(relaxed: bool = False):
    """out = IF(cond, x + 1, x - 1) with both branches built by sub-builders; each branch has
    its own constants (in the model's shared operandValues)."""
    b = ModelBuilder(relaxed=relaxed)
    branches = []
    for op in (O.ADD, O.SUB):
        sb = b.subgraph()
        x = sb.input(T.TENSOR_FLOAT32, [2])
        out = sb.output(T.TENSOR_FLOAT32, [2])
        sb.operation(op, [x, sb.constant(T.TENSOR_FLOAT32, [1.0, 1.0]), sb.scalar(T.INT32, 0)],
                     [out])
        branches.append(sb)
    cond = b.input(T.TENSOR_BOOL8, [1])
    x = b.input(T.TENSOR_FLOAT32, [2])
    refs = [b.reference(sb) for sb in branches]
    out = b.output(T.TENSOR_FLOAT32, [2])
    b.operation(O.IF, [cond, *refs, x], [out])
    return b.build()


def _run(device, model, inputs, out_bytes):
    cb = PreparedModelCallback()
    device.prepare_model(model, ExecutionPreference.FAST_SINGLE_ANSWER, Priority.MEDIUM, None,
                         [], [], b"", cb)
    status, pm = cb.wait(10)
    assert status == ErrorStatus.NONE
    rb = RequestBuilder(inputs, [out_bytes])
    try:
        status, shapes, _ = pm.execute_synchronously(rb.request)
        assert status == ErrorStatus.NONE
        return rb.output(0, np.float32, shapes[0].dimensions)
    finally:
        rb.close()


def test_referenced_subgraphs(device):
    m = if_model()
    assert len(m.referenced) == 2
    refs = [o for o in m.main.operands if o.lifetime == L.SUBGRAPH]
    assert [(o.type, o.location) for o in refs] == [(T.SUBGRAPH, DataLocation(0, 0, 0)),
                                                    (T.SUBGRAPH, DataLocation(0, 1, 0))]
    assert all(o.number_of_consumers == 1 for o in refs)
    # Branch constants share the one operandValues.
    locs = [o.location for sg in m.referenced for o in sg.operands
            if o.lifetime == L.CONSTANT_COPY]
    assert len(locs) == 4 and len({loc.offset for loc in locs}) == 4
    assert device.get_supported_operations(m)[0] == ErrorStatus.NONE
    x = np.array([1.0, 2.0], np.float32)
    assert _run(device, m, [np.array([1], np.uint8), x], 8).tolist() == [2.0, 3.0]
    assert _run(device, m, [np.array([0], np.uint8), x], 8).tolist() == [0.0, 1.0]


def test_reference_to_main_is_refused():
    b = ModelBuilder()
    with pytest.raises(ValueError):
        b.reference(b)
    with pytest.raises(ValueError):
        b.operand(T.INT32, lifetime=L.CONSTANT_COPY)
    with pytest.raises(ValueError):
        b.constant(T.INT32, 1, lifetime=L.TEMPORARY_VARIABLE)


def test_omitted_operand():
    b = ModelBuilder()
    i = b.omitted(T.TENSOR_INT32, [2], consumers=1)
    o = b.build().main.operands[i]
    assert o.lifetime == L.NO_VALUE and o.location == DataLocation()
    assert o.dimensions == [2] and o.number_of_consumers == 1


def test_constant_placement_and_alignment():
    b = ModelBuilder()
    small = b.scalar(T.INT32, 3)
    odd = b.constant(T.TENSOR_QUANT8_ASYMM, np.arange(3, dtype=np.uint8), scale=0.5)
    big = b.constant(T.TENSOR_FLOAT32, np.arange(MAX_INLINE // 4 + 1, dtype=np.float32))
    forced = b.constant(T.INT32, 7, lifetime=L.CONSTANT_REFERENCE)
    edge = b.constant(T.TENSOR_FLOAT32, np.zeros(MAX_INLINE // 4, np.float32),
                      lifetime=L.CONSTANT_COPY)
    sb = b.subgraph()
    sub_big = sb.constant(T.TENSOR_FLOAT32, np.ones(64, np.float32))
    m = b.build()
    ops = m.main.operands
    assert [ops[i].lifetime for i in (small, odd, big, forced, edge)] == [
        L.CONSTANT_COPY, L.CONSTANT_COPY, L.CONSTANT_REFERENCE, L.CONSTANT_REFERENCE,
        L.CONSTANT_COPY]
    assert len(m.pools) == 1  # one pool for every subgraph
    pool = m.pools[0].read(0, m.pools[0].size)
    sub = m.referenced[0].operands[sub_big]
    assert sub.lifetime == L.CONSTANT_REFERENCE
    for o in [*ops, sub]:
        assert o.location.offset % 8 == 0
    assert np.frombuffer(pool[sub.location.offset:sub.location.offset + 256],
                         np.float32).tolist() == [1.0] * 64
    f = ops[forced].location
    assert np.frombuffer(pool[f.offset:f.offset + f.length], np.int32).tolist() == [7]
    s = ops[odd].location
    assert m.operand_values[s.offset:s.offset + s.length] == bytes([0, 1, 2])


def test_consumers_counted_unless_given():
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, [2])
    y = b.input(T.TENSOR_FLOAT32, [2], consumers=5)
    act = b.scalar(T.INT32, 0)
    mid = b.operand(T.TENSOR_FLOAT32, [2])
    out = b.output(T.TENSOR_FLOAT32, [2])
    b.operation(O.ADD, [x, y, act], [mid])
    b.operation(O.ADD, [mid, x, act], [out])
    b.operation(O.ADD, [mid, 99, -1], [out])  # out-of-range indexes are kept, not counted
    ops = b.build().main.operands
    assert [ops[i].number_of_consumers for i in (x, y, act, mid, out)] == [2, 5, 2, 2, 0]


def test_per_channel_input_and_relaxed():
    b = ModelBuilder(relaxed=True)
    cq = SymmPerChannelQuantParams([0.5, 0.25], 0)
    i = b.input(T.TENSOR_QUANT8_SYMM_PER_CHANNEL, [2, 1], channel_quant=cq)
    m = b.build()
    assert m.relax_computation_float32_to_float16
    assert m.main.operands[i].extra_params == cq and m.main.input_indexes == [i]


def _json_operand(t, lifetime, dims, data=None, consumers=0, **kw):
    o = {"name": "", "type": t, "dimensions": dims, "scale": 0.0, "zeroPoint": 0,
         "numberOfConsumers": consumers, "lifetime": lifetime, "channelQuant": None,
         "isIgnored": False, "data": data or []}
    o.update(kw)
    return o


def test_case_builder_matches_model_builder():
    """The JSON of if_model(relaxed=True), built by build_model, is the same model."""
    f = "TENSOR_FLOAT32"

    def branch(op):
        return {"name": op, "operands": [
            _json_operand(f, "SUBGRAPH_INPUT", [2], consumers=1),
            _json_operand(f, "SUBGRAPH_OUTPUT", [2]),
            _json_operand(f, "CONSTANT_COPY", [2], [1.0, 1.0], 1),
            _json_operand("INT32", "CONSTANT_COPY", [], [0], 1)],
            "operations": [{"type": op, "inputs": [0, 2, 3], "outputs": [1]}],
            "inputIndexes": [0], "outputIndexes": [1]}

    main = {"name": "main", "operands": [
        _json_operand("TENSOR_BOOL8", "SUBGRAPH_INPUT", [1], consumers=1),
        _json_operand(f, "SUBGRAPH_INPUT", [2], consumers=1),
        _json_operand("SUBGRAPH", "SUBGRAPH", [], [0], 1),
        _json_operand("SUBGRAPH", "SUBGRAPH", [], [1], 1),
        _json_operand(f, "SUBGRAPH_OUTPUT", [2])],
        "operations": [{"type": "IF", "inputs": [0, 2, 3, 1], "outputs": [4]}],
        "inputIndexes": [0, 1], "outputIndexes": [4]}
    built = build_model({"main": main, "referenced": [branch("ADD"), branch("SUB")],
                         "isRelaxed": True})
    expected = if_model(relaxed=True)
    assert built.main == expected.main and built.referenced == expected.referenced
    assert built.operand_values == expected.operand_values and built.pools == []
    assert built.relax_computation_float32_to_float16


def test_case_builder_keeps_json_lifetimes_and_omitted_operands():
    main = {"name": "main", "operands": [
        _json_operand("TENSOR_FLOAT32", "CONSTANT_REFERENCE", [1], [2.0], 1),
        _json_operand("TENSOR_INT32", "NO_VALUE", [], consumers=1),
        _json_operand("TENSOR_FLOAT32", "CONSTANT_COPY", [40], [0.5] * 40, 1),
        _json_operand("TENSOR_QUANT8_SYMM_PER_CHANNEL", "SUBGRAPH_INPUT", [2, 1],
                      channelQuant={"scales": [0.5, 0.25], "channelDim": 0}),
        _json_operand("TENSOR_FLOAT32", "SUBGRAPH_OUTPUT", [1])],
        "operations": [], "inputIndexes": [3], "outputIndexes": [4]}
    m = build_model({"main": main, "referenced": []})
    ops = m.main.operands
    assert [o.lifetime for o in ops] == [L.CONSTANT_REFERENCE, L.NO_VALUE,
                                         L.CONSTANT_REFERENCE, L.SUBGRAPH_INPUT,
                                         L.SUBGRAPH_OUTPUT]
    assert [o.number_of_consumers for o in ops] == [1, 1, 1, 0, 0]
    assert ops[1].location == DataLocation()
    assert ops[3].extra_params == SymmPerChannelQuantParams([0.5, 0.25], 0)
    assert m.operand_values == b"" and len(m.pools) == 1


def test_case_builder_names_what_is_malformed():
    with pytest.raises(MalformedCase, match="operands"):
        build_model({"main": {"operations": []}, "referenced": []})
    bad = {"main": {"operands": [_json_operand("INT32", "CONSTANT_COPY", [], ["x"])],
                    "operations": [], "inputIndexes": [], "outputIndexes": []},
           "referenced": []}
    with pytest.raises(MalformedCase, match="ValueError"):
        build_model(bad)


def test_large_pools_are_written_while_building(monkeypatch):
    """From the first large constant on, the pool is written on a background thread as the
    constants come: the model holds the same sealed bytes as one written at build time, a
    second build gives them again, and a builder dropped unbuilt leaves no descriptor."""
    import gc
    import os

    from nnhal.hal import builder as builder_module

    rng = np.random.default_rng(0)
    values = [rng.standard_normal(n).astype(np.float32) for n in (40, 300_000, 70, 5000)]

    def make(threshold):
        monkeypatch.setattr(builder_module, "BACKGROUND_BYTES", threshold)
        b = ModelBuilder()
        idx = [b.constant(T.TENSOR_FLOAT32, v) for v in values]
        return b, idx

    b, idx = make(1 << 20)  # the second constant (1.2 MB) starts the writer
    assert b._constants._writer is not None
    m, again = b.build(), b.build()
    b2, _ = make(1 << 60)
    assert b2._constants._writer is None
    plain = b2.build()
    for model in (m, again):
        pool = model.pools[0]
        assert pool.size == plain.pools[0].size
        assert np.array_equal(pool.array(), plain.pools[0].array())
        assert pool.immutable
        for i, v in zip(idx, values):
            loc = model.main.operands[i].location
            if model.main.operands[i].lifetime == L.CONSTANT_REFERENCE:
                got = pool.array()[loc.offset:loc.offset + loc.length].view(np.float32)
                assert np.array_equal(got, v)
    fds = len(os.listdir("/proc/self/fd"))
    for _ in range(3):
        dropped, _ = make(1 << 20)
        del dropped
    gc.collect()
    import time as _time

    deadline = _time.monotonic() + 5
    while len(os.listdir("/proc/self/fd")) > fds and _time.monotonic() < deadline:
        _time.sleep(0.01)
        gc.collect()
    assert len(os.listdir("/proc/self/fd")) <= fds


@pytest.mark.parametrize("large", [False, True])
def test_views_of_a_source_are_placed_where_they_lie(monkeypatch, large):
    """A builder given its source's bytes (an imported file) places each constant that is an
    element-aligned view of them at its offset in one pool part holding the whole source
    (copied once; for a large source, from the start, on the writer thread); any other
    constant (a copy, a view of other bytes, a misaligned view) is placed after it."""
    from nnhal.hal import builder as builder_module

    monkeypatch.setattr(builder_module, "BACKGROUND_BYTES", 4096 if large else 1 << 60)
    rng = np.random.default_rng(3)
    src = rng.integers(0, 256, 8192, dtype=np.uint8).tobytes()
    b = ModelBuilder()
    b.use_source(src)
    assert (b._constants._source_base is not None) == large  # large: part of the pool now
    x = b.input(T.TENSOR_FLOAT32, [1])
    view = np.frombuffer(src, np.float32, 64, 1028)  # element-aligned, not 8-aligned
    odd = np.frombuffer(src, np.float32, 64, 2)  # a float32 view at byte 2: copied
    other = np.frombuffer(bytes(bytearray(src)), np.float32, 64, 1024)  # other bytes: copied
    own = rng.standard_normal(64).astype(np.float32)
    small = np.frombuffer(src, np.int32, 2, 4000)  # inline, as any small constant
    idx = [b.constant(T.TENSOR_FLOAT32, v) for v in (view, odd, other, own)]
    tiny = b.constant(T.TENSOR_INT32, small)
    sb = b.subgraph()
    sub = sb.constant(T.TENSOR_FLOAT32, np.frombuffer(src, np.float32, 64, 4096))
    b.operation(O.ADD, [x, x, b.scalar(T.INT32, 0)], [b.output(T.TENSOR_FLOAT32, [1])])
    m = b.build()
    ops = m.main.operands
    base = b._constants._source_base
    assert base is not None and m.pools[0].size >= base + len(src)
    pool = m.pools[0].array()
    assert pool[base:base + len(src)].tobytes() == src  # the whole source, once
    assert ops[idx[0]].location.offset == base + 1028
    assert m.referenced[0].operands[sub].location.offset == base + 4096
    for i in idx[1:]:
        assert ops[i].location.offset >= base + len(src)  # placed after it
    for i, v in zip([*idx, tiny], (view, odd, other, own, small)):
        o = ops[i]
        where = m.operand_values if o.lifetime == L.CONSTANT_COPY else pool
        got = bytes(where[o.location.offset:o.location.offset + o.location.length])
        assert got == v.tobytes()  # (bytes: random bytes as floats hold NaNs)
    assert ops[tiny].lifetime == L.CONSTANT_COPY
    assert m.pools[0].immutable


def test_a_source_no_constant_uses_costs_nothing():
    """A small source no constant is a view of never becomes part of the pool."""
    b = ModelBuilder()
    b.use_source(bytes(range(256)) * 4)
    c = b.constant(T.TENSOR_FLOAT32, np.ones(64, np.float32))
    m = b.build()
    assert b._constants._source_base is None
    assert m.pools[0].size == 256 and m.main.operands[c].location.offset == 0


def test_scalars_store_what_constants_store():
    """scalar() packs Python numbers itself: the same bytes, lifetime and location rules as
    constant(), and the same errors for values out of range."""
    b = ModelBuilder()
    cases = [(T.INT32, 3), (T.INT32, -2**31), (T.INT32, True), (T.UINT32, 7), (T.FLOAT32, 0.1),
             (T.FLOAT32, 3), (T.FLOAT32, float("nan")), (T.FLOAT32, -0.0), (T.BOOL, True),
             (T.BOOL, 2), (T.FLOAT16, 0.1), (T.INT32, np.int32(5))]
    for t, v in cases:
        i, j = b.scalar(t, v), b.constant(t, v)
        a, c = b.operands[i], b.operands[j]
        assert (a.lifetime, a.dimensions, a.location.length) == \
            (c.lifetime, c.dimensions, c.location.length)
        assert a.lifetime == L.CONSTANT_COPY and a.dimensions == []
        vals = b._constants.values
        assert vals[a.location.offset:a.location.offset + a.location.length] == \
            vals[c.location.offset:c.location.offset + c.location.length], (t, v)
    for t, v in [(T.INT32, 2**31), (T.UINT32, -1)]:
        with pytest.raises(OverflowError):
            b.scalar(t, v)
