"""A .tflite's scalars (rank-0 tensors: a reduction to one value, RANK, a scalar input such
as a threshold) through the Session: fed and given back as shape (), as TFLite takes and
gives them, though the HAL holds them as [1]. Found by the hostile-shapes sweep: a scalar
output came back as (1,) and a scalar feed was refused."""

from __future__ import annotations

import numpy as np
import pytest
from tfl import Graph, build

from nnhal.errors import InputError
from nnhal.session import Session

F = np.float32
ADD = ("AddOptions", dict(FusedActivationFunction=0))
MUL = ("MulOptions", dict(FusedActivationFunction=0))


def _mean_to_scalar() -> bytes:
    g = Graph()
    x = g.input([2, 3], F)
    y = g.tensor([], F)
    g.op("MEAN", [x, g.const(np.asarray([0, 1], np.int32))], [y],
         ("ReducerOptions", dict(KeepDims=False)))
    g.output(y)
    return build(g)


def _rank() -> bytes:
    g = Graph()
    x = g.input([2, 3], F)
    y = g.tensor([], np.int32)
    g.op("RANK", [x], [y])  # folded: the output is a constant
    g.output(y)
    return build(g)


def _scalar_input() -> bytes:
    g = Graph()
    s, w = g.input([], F), g.input([2], F)
    y, z = g.tensor([], F), g.tensor([2], F)
    g.op("ADD", [s, s], [y], ADD)
    g.op("MUL", [w, s], [z], MUL)
    g.output(y)
    g.output(z)
    return build(g)


def _feeds(blob: bytes) -> list[np.ndarray]:
    with Session(blob, device="reference") as s:
        return [(np.arange(max(1, int(np.prod(i.shape))), dtype=i.dtype) + 2).reshape(i.shape)
                for i in s.inputs]


def _peer(blob: bytes, xs: list[np.ndarray]) -> list[np.ndarray] | None:
    try:
        from runner import litert, litert_run
    except ImportError:
        return None
    it = litert(blob)
    return None if it is None else litert_run(it, xs)


@pytest.mark.parametrize("make", [_mean_to_scalar, _rank, _scalar_input])
@pytest.mark.parametrize("device", ["reference", "litert", None])
def test_scalars_are_fed_and_given_as_shape_nothing(make, device) -> None:
    blob = make()
    if device == "litert":
        from nnhal.drivers.litert import unavailable

        if unavailable() is not None:
            pytest.skip(f"LiteRT driver unavailable: {unavailable()}")
    xs = _feeds(blob)
    with Session(blob, device=device) as s:
        declared = [o.shape for o in s.outputs]
        assert () in [i.shape for i in s.inputs] + declared
        for _ in range(3):  # the first run, then the bound layout's
            got = list(s.run({i.name: x for i, x in zip(s.inputs, xs)}).values())
        assert [g.shape for g in got] == declared
    peer = _peer(blob, xs)
    if peer is not None:
        for g, p in zip(got, peer):
            assert g.shape == p.shape and g.dtype == p.dtype
            np.testing.assert_array_equal(g, p)


def test_a_scalar_feed_may_be_a_number_and_nothing_else() -> None:
    blob = _scalar_input()
    with Session(blob, device="reference") as s:
        w = np.ones(2, F)
        assert float(s.run([3.0, w])[s.outputs[0].name]) == 6.0  # a Python number
        assert float(s.run([np.float32(2.5), w])[s.outputs[0].name]) == 5.0
        for bad in (np.ones(1, F), [3.0], np.ones((1, 1), F)):
            with pytest.raises(InputError, match=r"expects \(\) \(a scalar\)"):
                s.run([bad, w])
        with pytest.raises(InputError, match="float64"):
            s.run([np.float64(1.0), w])  # numpy values keep the dtype policy


def test_a_restored_session_keeps_its_scalars(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("NNHAL_CACHE_DIR", str(tmp_path))
    path = tmp_path / "scalar.tflite"
    path.write_bytes(_scalar_input())
    xs = _feeds(path.read_bytes())
    with Session(path, device="reference", cache=True) as first:
        want = first.run(xs)
    with Session(path, device="reference", cache=True) as second:
        assert second.restored
        assert [i.shape for i in second.inputs] == [(), (2,)]
        got = second.run(xs)
    assert {k: v.shape for k, v in got.items()} == {k: v.shape for k, v in want.items()}
