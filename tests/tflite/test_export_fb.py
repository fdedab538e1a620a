"""The exporter's flatbuffer writer (nnhal.tflite.export_fb): its lean builder writes the very
bytes flatbuffers.Builder writes, for real models of many operator and option kinds."""

from __future__ import annotations

from pathlib import Path

import flatbuffers
import pytest

from nnhal.analysis import analyse
from nnhal.errors import NnhalError
from nnhal.tflite.export_fb import serialise
from nnhal.tflite.exporter import convert_model
from nnhal.tflite.importer import read_tflite

DATA = Path(__file__).parent / "data"
MODELS = ["bmm_int8.tflite", "bool_reshape_if.tflite", "floor_div_mod.tflite",
          "mirror_pad_int8.tflite", "pack_f32.tflite",
          "reverse_int8.tflite", "select_v2_broadcast_int8.tflite",
          "selfie_segmentation.tflite"]


@pytest.mark.parametrize("name", MODELS)
def test_the_lean_builder_writes_flatbuffers_bytes(name):
    try:
        imported = read_tflite(DATA / name)
    except NnhalError as e:  # an extension this build lacks
        pytest.skip(f"{name}: {e}")
    graph = analyse(imported.model, own_constants=False)
    for exact in (False, True):
        converted, refused = convert_model(graph, list(imported.input_names),
                                           list(imported.output_names), exact_resize=exact)
        if refused:
            pytest.skip(f"{name}: not exportable: {refused[0]}")
        for outside in (False, True):
            want = serialise(converted, data_outside=outside, builder=flatbuffers.Builder)
            assert serialise(converted, data_outside=outside) == want, (name, exact, outside)


def test_out_of_range_scalars_still_raise():
    from nnhal.tflite.export_fb import ModelDef, OperatorDef, SubgraphDef, TensorDef

    sg = SubgraphDef("main", [TensorDef("x", [1], 0), TensorDef("y", [1], 0)],
                     [OperatorDef(0, [0], [1], "AddOptions", {"FusedActivationFunction": 300})],
                     [0], [1])
    with pytest.raises(Exception):  # noqa: B017,PT011 - flatbuffers' error or struct's
        serialise(ModelDef([sg]), builder=flatbuffers.Builder)
    with pytest.raises(Exception):  # noqa: B017,PT011
        serialise(ModelDef([sg]))
