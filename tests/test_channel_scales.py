"""Frozen per-channel scales (:class:`nnhal.hal.types.ChannelScales`): what the importer
makes, so the checks and the analysis read one array made once. They must stay a list to
every reader, never change under the array, and leave every check as strict as a list's."""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle

import numpy as np
import pytest

from nnhal.analysis import analyse, analyses
from nnhal.hal.builder import ModelBuilder
from nnhal.hal.types import ChannelScales, OperationType, SymmPerChannelQuantParams
from nnhal.hal.types import OperandType as T


def test_a_list_to_every_reader():
    s = ChannelScales(np.array([0.5, 0.25], np.float32))
    assert s == [0.5, 0.25] and isinstance(s, list)
    assert all(type(x) is float for x in s)
    assert json.loads(json.dumps(s)) == [0.5, 0.25]
    assert s.array.tolist() == [0.5, 0.25] and not s.array.flags.writeable
    assert ChannelScales(x for x in (0.5, 0.25)) == s  # any iterable, as list() takes
    assert dataclasses.asdict(SymmPerChannelQuantParams(s, 0))["scales"] == s
    for other in (copy.copy(s), copy.deepcopy(s), pickle.loads(pickle.dumps(s))):
        assert type(other) is ChannelScales and other == s
        assert other.array.tolist() == s.array.tolist()


@pytest.mark.parametrize("edit", [
    lambda s: s.__setitem__(0, 2.0), lambda s: s.__delitem__(0), lambda s: s.append(1.0),
    lambda s: s.extend([1.0]), lambda s: s.insert(0, 1.0), lambda s: s.pop(),
    lambda s: s.remove(0.5), lambda s: s.clear(), lambda s: s.sort(), lambda s: s.reverse(),
    lambda s: s.__iadd__([1.0]), lambda s: s.__imul__(2),
])
def test_frozen(edit):
    s = ChannelScales([0.5, 0.25])
    with pytest.raises(TypeError, match="cannot change"):
        edit(s)
    assert s == [0.5, 0.25] and s.array.tolist() == [0.5, 0.25]
    mutable = list(s)
    mutable[0] = 2.0  # an ordinary copy to edit
    assert s[0] == 0.5


def test_bounds_fail_every_bad_scale():
    assert ChannelScales([0.5, 2.0]).bounds == (0.5, 2.0)
    assert ChannelScales([]).bounds == (float("inf"), 0.0)
    lo, hi = ChannelScales([1.0, float("nan")]).bounds
    assert not lo > 0 and not hi < float("inf")
    assert ChannelScales([-3.0, 1.0]).bounds == (-3.0, 3.0)


def _conv(scales) -> object:
    b = ModelBuilder()
    x = b.input(T.TENSOR_QUANT8_ASYMM_SIGNED, [1, 2, 2, 1], 0.5, 0)
    w = b.constant(T.TENSOR_QUANT8_SYMM_PER_CHANNEL, np.ones((2, 1, 1, 1), np.int8),
                   channel_quant=SymmPerChannelQuantParams(scales, 0))
    bias = b.constant(T.TENSOR_INT32, np.zeros(2, np.int32))
    y = b.output(T.TENSOR_QUANT8_ASYMM_SIGNED, [1, 2, 2, 2], 1.0, 0)
    b.operation(OperationType.CONV_2D, [x, w, bias, *(b.scalar(T.INT32, v) for v in
                                                      (0, 0, 0, 0, 1, 1, 0))], [y])
    return b.build()


def test_analysis_reads_the_array_as_it_reads_a_list():
    frozen = analyse(_conv(ChannelScales([0.25, 0.5])))
    plain = analyse(_conv([0.25, 0.5]))
    a = [i for i in frozen.main.operands if i.channel_scales is not None][0]
    b = [i for i in plain.main.operands if i.channel_scales is not None][0]
    assert a.channel_scales.dtype == b.channel_scales.dtype == np.float32
    assert a.channel_scales.tolist() == b.channel_scales.tolist() == [0.25, 0.5]


def test_replaced_scales_miss_the_kept_graph():
    model = _conv(ChannelScales([0.25, 0.5]))
    graph = analyse(model, keep=True)
    n = analyses()
    assert analyse(model) is graph and analyses() == n  # unedited: kept
    w = next(o for o in model.main.operands if o.type == T.TENSOR_QUANT8_SYMM_PER_CHANNEL)
    w.extra_params.scales = ChannelScales([0.25, 0.75])
    again = analyse(model)
    assert again is not graph and analyses() == n + 1
    got = next(i for i in again.main.operands if i.channel_scales is not None)
    assert got.channel_scales.tolist() == [0.25, 0.75]
