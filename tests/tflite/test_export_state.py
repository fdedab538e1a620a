"""``state_as_variables``: a flatbuffer's state pairs as resource variables. What it refuses
(the caller then keeps the state as inputs and outputs); what it makes is run against
ai-edge-litert in tests/test_session_state.py."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import add_model

from nnhal.tflite import write_tflite
from nnhal.tflite.export_state import StateFormError, state_as_variables


def _flat(**kw) -> bytes:
    return write_tflite(add_model((2,)), **kw)


@pytest.mark.parametrize("pairs, match", [
    ([], "no state pairs"),
    ([(2, 0)], "out of range"),
    ([(0, 1)], "out of range"),
    ([(0, 0), (0, 0)], "two pairs"),
])
def test_pairs_that_do_not_fit_are_refused(pairs, match):
    with pytest.raises(StateFormError, match=match):
        state_as_variables(_flat(), pairs)


def test_not_a_flatbuffer_is_refused():
    with pytest.raises(StateFormError, match="not a TFLite flatbuffer"):
        state_as_variables(b"nothing of the kind", [(0, 0)])


@pytest.mark.parametrize("outside", [False, True])
def test_the_form_keeps_the_old_bytes_and_adds_two_subgraphs(outside):
    """The old flatbuffer's bytes are the result's last ones (data outside it included,
    whose offsets move), and the setter and getter subgraphs follow the old ones."""
    flat = _flat(data_outside=outside)
    form = state_as_variables(flat, [(1, 0)])
    start = form.flatbuffer.rindex(flat)
    assert start % 16 == 0 and not form.flatbuffer[start + len(flat):].strip(b"\0")
    assert (form.set_subgraph, form.get_subgraph) == (1, 2)
    assert form.set_inputs == form.get_outputs == (1,)


def test_an_add_fed_back_is_an_accumulator_in_the_interpreter():
    """out = a + b with (b, out) a state pair: each invoke adds ``a`` to the variable."""
    pytest.importorskip("ai_edge_litert", reason="ai-edge-litert is not installed")
    from ai_edge_litert.interpreter import Interpreter

    form = state_as_variables(_flat(data_outside=True), [(1, 0)])
    it = Interpreter(model_content=form.flatbuffer)
    it.allocate_tensors()
    assert len(it.get_input_details()) == 1 and not it.get_output_details()
    w = it._interpreter  # the native calls, as the driver makes them (subgraph indexes)
    w.AllocateTensors(form.set_subgraph)
    w.AllocateTensors(form.get_subgraph)
    w.SetTensor(form.set_inputs[0], np.array([10, 20], np.float32), form.set_subgraph)
    w.Invoke(form.set_subgraph)
    w.SetTensor(it.get_input_details()[0]["index"], np.array([1, 2], np.float32))
    for _ in range(3):
        w.Invoke()
    w.Invoke(form.get_subgraph)
    assert w.GetTensor(form.get_outputs[0], form.get_subgraph).tolist() == [13, 26]
