"""Import then export then import is stable, and exported models agree with the reference
driver, on every real .tflite of the test extra.

Stable means: the model imported from our own export imports to the same HAL model again
(same operations, operand types, shapes, quantization, constants and names), so the second
round trip is a fixed point (the first too, but for an operator the file has twice, which the
export writes once). An imported model's state variables export as plain extra inputs
and outputs (the HAL form), which is why the first round is not compared with the original
file: the state moves from resource variables into the signature.
"""

from __future__ import annotations

import numpy as np
import pytest
from runner import Reference, assert_agree, litert, litert_run, random_input
from test_import_models import FACE, WAKE

from nnhal.hal.types import Model, OperandLifeTime
from nnhal.tflite import read_tflite, write_tflite

pytest.importorskip("ai_edge_litert.interpreter")

MODELS = FACE + WAKE
#: Operations a file has twice (the same operator of the same tensors): face_landmark's
#: converter wrote one MAX_POOL_2D twice.
REPEATS = {"face_landmark.tflite": 1}
_CONST = (OperandLifeTime.CONSTANT_COPY, OperandLifeTime.CONSTANT_REFERENCE)


def fingerprint(model: Model) -> list:
    """Everything that defines a HAL model's meaning, constants by value."""
    def value(o) -> bytes:
        if o.lifetime == OperandLifeTime.CONSTANT_COPY:
            return model.operand_values[o.location.offset:o.location.offset + o.location.length]
        if o.lifetime == OperandLifeTime.CONSTANT_REFERENCE:
            return bytes(model.pools[o.location.pool_index].view(o.location.offset,
                                                                 o.location.length))
        return b""

    out = []
    for sg in [model.main, *model.referenced]:
        out.append([(int(o.type), tuple(o.dimensions), round(o.scale, 12), o.zero_point,
                     int(o.lifetime) if o.lifetime in _CONST else -1, value(o),
                     None if o.extra_params is None else
                     (tuple(o.extra_params.scales), o.extra_params.channel_dim))
                    for o in sg.operands])
        out.append([(op.type, tuple(op.inputs), tuple(op.outputs)) for op in sg.operations])
        out.append((tuple(sg.input_indexes), tuple(sg.output_indexes)))
    return out


@pytest.mark.skipif(not MODELS, reason="the test extra's model packages are not installed")
@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.name)
def test_import_export_import_is_stable_and_agrees(path) -> None:
    first = read_tflite(path)
    exported = write_tflite(first)
    second = read_tflite(exported, name=f"{path.name} (exported)")
    assert second.input_names == first.input_names
    assert second.output_names == first.output_names
    if not first.state:  # without state the first round is already a fixed point, but
        # where the file computes one value twice: the export writes it once
        dropped = len(first.model.main.operations) - len(second.model.main.operations)
        assert dropped == REPEATS.get(path.name, 0)
        if not dropped:
            assert fingerprint(second.model) == fingerprint(first.model)
    again = read_tflite(write_tflite(second))
    assert again.input_names == second.input_names
    assert fingerprint(again.model) == fingerprint(second.model), \
        "import(export(import(export(x)))) differs from import(export(x))"

    # The exported file on ai-edge-litert agrees with the imported model on the reference
    # driver, state inputs included (the export takes them as plain inputs).
    it = litert(exported)
    rng = np.random.default_rng(1)
    inputs = [random_input(d["dtype"], d["shape"], rng) for d in it.get_input_details()]
    expected = litert_run(it, inputs)
    ref = Reference(first)
    try:
        got = ref.run(inputs)
    finally:
        ref.close()
    assert_agree(got, expected, path.name)
