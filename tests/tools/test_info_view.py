"""``nnhal info`` data and ``nnhal view`` pictures, on HAL models built by hand.

The model: image [1,8,8,3] -> CONV_2D (4x3x3x3 filter, SAME, stride 2) -> RELU -> ADD bias_map
[1,4,4,4] -> result,
with the output's shape left unknown so that the inferred one has to show.
"""

from __future__ import annotations

import io
import re
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from nnhal.errors import NnhalError
from nnhal.hal.builder import ModelBuilder
from nnhal.hal.types import ErrorStatus, Model
from nnhal.hal.types import OperandType as T
from nnhal.hal.types import OperationType as O
from nnhal.tflite.model import ImportedModel, StateVariable
from nnhal.tools import graphlayout, info, view

SVG = "{http://www.w3.org/2000/svg}"


def tiny(input_names: tuple[str, str] = ("image", "bias_map")) -> ImportedModel:
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, [1, 8, 8, 3])
    y = b.input(T.TENSOR_FLOAT32, [1, 4, 4, 4])
    w = b.constant(T.TENSOR_FLOAT32, np.ones((4, 3, 3, 3), np.float32))
    bias = b.constant(T.TENSOR_FLOAT32, np.zeros(4, np.float32))
    c = b.operand(T.TENSOR_FLOAT32, [1, 4, 4, 4])
    b.operation(O.CONV_2D, [x, w, bias, *[b.scalar(T.INT32, v) for v in (1, 2, 2, 3)]], [c])
    r = b.operand(T.TENSOR_FLOAT32, [1, 4, 4, 4])
    b.operation(O.RELU, [c], [r])
    out = b.output(T.TENSOR_FLOAT32, [0, 0, 0, 0])
    b.operation(O.ADD, [r, y, b.scalar(T.INT32, 0)], [out])
    return ImportedModel(b.build(), list(input_names), ["result"], source="tiny.tflite")


def chain(n: int) -> Model:
    b = ModelBuilder()
    x = b.input(T.TENSOR_FLOAT32, [1, 4])
    for i in range(n):
        y = b.output(T.TENSOR_FLOAT32, [1, 4]) if i == n - 1 else \
            b.operand(T.TENSOR_FLOAT32, [1, 4])
        b.operation(O.RELU, [x], [y])
        x = y
    return b.build()


class FakeDevice:
    """Answers getSupportedOperations as told."""

    def __init__(self, status: ErrorStatus, flags: list[bool]):
        self.status, self.flags = status, flags

    def get_supported_operations(self, model: Model) -> tuple[ErrorStatus, list[bool]]:
        return self.status, list(self.flags)


# ---- info ---------------------------------------------------------------------------------

def test_info_counts_parameters_bytes_and_shapes(device):
    data = info.model_info(tiny(), {"reference": device, "npu": "no NPU on this machine"})
    assert data["operations"] == {"ADD": 1, "CONV_2D": 1, "RELU": 1}
    assert data["operation_count"] == 3
    assert data["parameters"] == 4 * 3 * 3 * 3 + 4  # filter and bias; scalars are options
    assert data["constant_bytes"] == 432 + 16 + 5 * 4  # filter, bias, five INT32 scalars
    assert [i["name"] for i in data["inputs"]] == ["image", "bias_map"]
    assert data["inputs"][0]["shape"] == [1, 8, 8, 3]
    assert data["inputs"][0]["dtype"] == "float32"
    # declared [0,0,0,0]: info shows the shape the analysis inferred (stride 2: 4x4)
    assert data["outputs"] == [{**data["outputs"][0], "name": "result", "shape": [1, 4, 4, 4],
                                "shape_text": "1x4x4x4"}]
    assert data["valid"] and data["problem"] is None
    assert [s["name"] for s in data["subgraphs"]] == ["main"]
    ref, npu = data["devices"]
    assert (ref["name"], ref["supported"], ref["total"], ref["unsupported"]) == \
        ("reference", 3, 3, [])
    assert info.device_line(ref) == "reference: 3/3 supported"
    assert npu == {"name": "npu", "available": False, "total": 3,
                   "reason": "no NPU on this machine"}
    assert info.device_line(npu) == "npu: not available (no NPU on this machine)"


def test_info_lists_unsupported_operations_by_index_and_type():
    data = info.model_info(tiny(), {"fake": FakeDevice(ErrorStatus.NONE, [True, False, True])})
    d = data["devices"][0]
    assert d["supported"] == 2
    assert d["unsupported"] == [{"index": 1, "type": "RELU"}]
    assert info.device_line(d) == "fake: 2/3 supported; not: #1 RELU"


def test_info_of_an_invalid_model_carries_the_validation_message(device):
    m = tiny()
    m.model.main.operands[m.model.main.operations[2].inputs[1]].dimensions = [1, 4, 4, 5]
    data = info.model_info(m, {"reference": device, "short": FakeDevice(ErrorStatus.NONE, [])})
    assert not data["valid"]
    assert "operation 2" in data["problem"] and "broadcastable" in data["problem"]
    ref, short = data["devices"]
    assert ref["supported"] is None
    assert ref["error"].startswith("getSupportedOperations: INVALID_ARGUMENT (")
    assert data["problem"] in ref["error"]
    assert "0 answers for 3 operations" in short["error"]


def test_info_state_variables_and_quantization():
    b = ModelBuilder()
    x = b.input(T.TENSOR_QUANT8_ASYMM_SIGNED, [1, 4], 0.5, -3)
    s_in = b.input(T.TENSOR_QUANT8_ASYMM_SIGNED, [1, 4], 0.5, -3)
    out = b.output(T.TENSOR_QUANT8_ASYMM_SIGNED, [1, 4], 0.5, -3)
    s_out = b.output(T.TENSOR_QUANT8_ASYMM_SIGNED, [1, 4], 0.5, -3)
    b.operation(O.ADD, [x, s_in, b.scalar(T.INT32, 0)], [out])
    b.operation(O.RELU, [out], [s_out])
    state = StateVariable("stream", np.zeros((1, 4), np.int8), input=1, output=1)
    m = ImportedModel(b.build(), ["x", "stream"], ["y", "stream"], [state], "s.tflite")
    data = info.model_info(m, {})
    assert [i["state"] for i in data["inputs"]] == [False, True]
    assert [o["state"] for o in data["outputs"]] == [False, True]
    assert data["inputs"][0]["quantization"] == "scale 0.5 zero point -3"
    assert data["inputs"][0]["dtype"] == "int8"
    assert data["state"] == [{"name": "stream", "shape": [1, 4], "dtype": "int8", "input": 1,
                              "output": 1}]
    assert data["parameters"] == 0


def test_info_render_shows_tables_and_devices(device):
    from rich.console import Console

    buf = io.StringIO()
    info.render(info.model_info(tiny(), {"reference": device}),
                Console(file=buf, width=120, color_system=None))
    text = buf.getvalue()
    assert "tiny.tflite: 3 operations, 112 parameters" in text
    for word in ("image", "bias_map", "result", "1x4x4x4", "CONV_2D", "reference: 3/3 supported"):
        assert word in text, word


def test_info_asks_the_registry_by_default():
    registry = pytest.importorskip("nnhal.drivers.registry",
                                          reason="nnhal.drivers.registry is not merged")
    data = info.model_info(tiny())
    assert [d["name"] for d in data["devices"]] == list(registry.available())
    ref = next(d for d in data["devices"] if d["name"] == "reference")
    assert ref["supported"] == 3


# ---- view ---------------------------------------------------------------------------------

def _svg_root(text: str) -> ET.Element:
    start = text.index("<svg")
    return ET.fromstring(text[start:text.index("</svg>") + len("</svg>")])


def _node_texts(root: ET.Element) -> dict[str, list[str]]:
    """Texts of each node group by its class (input / op / output)."""
    out: dict[str, list[str]] = {}
    for g in root.iter(f"{SVG}g"):
        cls = g.get("class", "")
        if cls.startswith("node "):
            out.setdefault(cls[5:], []).append(
                " | ".join(t.text or "" for t in g.iter(f"{SVG}text")))
    return out


def test_svg_has_every_operation_input_and_output():
    text = view.to_svg(tiny())
    root = ET.fromstring(text)
    nodes = _node_texts(root)
    assert nodes["input"] == ["image | 1x8x8x3 f32", "bias_map | 1x4x4x4 f32"]
    assert nodes["output"] == ["result | 1x4x4x4 f32"]
    assert [n.split(" | ")[0] for n in nodes["op"]] == ["CONV_2D #0", "RELU #1", "ADD #2"]
    # constants summarised inside the operation, options in words (stride 2, RELU6 fused)
    assert nodes["op"][0] == "CONV_2D #0 | filter 4x3x3x3 f32 | bias=[0 0 0 0] SAME " \
                             "stride=2x2 RELU6"
    paths = [p for p in root.iter(f"{SVG}path") if p.get("class") == "edge"]
    assert len(paths) == 5  # image->conv, conv->relu, relu->add, bias_map->add, add->result
    assert all(p.get("d", "").startswith("M") for p in paths)
    labels = [t.text for t in root.iter(f"{SVG}text") if t.get("class") == "label"]
    assert labels.count("1x4x4x4 f32") == 4 and "1x8x8x3 f32" in labels


def test_svg_layers_follow_the_data():
    root = ET.fromstring(view.to_svg(tiny()))
    tops = {}
    for g in root.iter(f"{SVG}g"):
        if g.get("class", "").startswith("node "):
            title = next(g.iter(f"{SVG}text")).text
            tops[title] = float(next(g.iter(f"{SVG}rect")).get("y"))
    assert tops["image"] < tops["CONV_2D #0"] < tops["RELU #1"] < tops["ADD #2"] < tops["result"]
    assert tops["bias_map"] < tops["ADD #2"]
    assert tops["bias_map"] > tops["CONV_2D #0"]  # drawn just above its reader, not at the top


def test_html_is_one_self_contained_page():
    page = view.to_html(tiny(), {0: "reference", 1: "npu"})
    assert page.startswith("<!DOCTYPE html>")
    assert "<script" not in page and "src=" not in page and "<link" not in page
    root = _svg_root(page)
    assert len(_node_texts(root)["op"]) == 3
    assert '<span style="background:' in page and ">npu</span>" in page  # the legend
    fills = {}
    for g in root.iter(f"{SVG}g"):
        if g.get("class") == "node op":
            fills[int(g.get("data-index"))] = next(g.iter(f"{SVG}rect")).get("fill")
    assert len({fills[0], fills[1], fills[2]}) == 3  # two devices and "no device"
    assert fills[2] == view.OP_FILL


def test_dot_names_every_node_and_edge():
    text = view.to_dot(tiny(), {0: "reference"})
    assert text.startswith("digraph model {") and text.rstrip().endswith("}")
    assert text.count("{") == text.count("}")
    nodes = dict(re.findall(r'^\s*(m\d+) \[label="([^"]*)"', text, re.M))
    labels = [v.split("\\n")[0] for v in nodes.values()]
    assert labels == ["image", "bias_map", "CONV_2D #0", "RELU #1", "ADD #2", "result"]
    edges = re.findall(r"^\s*(m\d+) -> (m\d+) \[label=\"([^\"]*)\"", text, re.M)
    assert len(edges) == 5 and all(a in nodes and b in nodes for a, b, _ in edges)
    assert ("m4", "m5", "1x4x4x4 f32") in edges
    assert 'legend [shape=note, label="devices:\\nreference"]' in text


def test_names_are_escaped_everywhere():
    odd = ('a<b>&"c"', "back\\slash\nnewline")
    m = tiny(odd)
    root = ET.fromstring(view.to_svg(m))
    assert _node_texts(root)["input"][0].startswith('a<b>&"c" | ')
    _svg_root(view.to_html(m))
    dot = view.to_dot(m)
    assert 'label="a<b>&\\"c\\"\\n' in dot and 'label="back\\\\slash\\nnewline\\n' in dot


def test_write_by_suffix(tmp_path):
    m = tiny()
    for suffix in (".html", ".svg", ".dot"):
        view.write(m, tmp_path / f"g{suffix}")
        assert "RELU #1" in (tmp_path / f"g{suffix}").read_text()
    ET.parse(tmp_path / "g.svg")
    with pytest.raises(NnhalError, match=r"unknown picture format '\.gif'"):
        view.write(m, tmp_path / "g.gif")
    with pytest.raises(NnhalError, match="cannot write"):
        view.write(m, tmp_path / "missing" / "g.svg")


def test_png_needs_graphviz(tmp_path, monkeypatch):
    monkeypatch.setattr(view.shutil, "which", lambda name: None)
    with pytest.raises(NnhalError, match="needs Graphviz's dot"):
        view.write(tiny(), tmp_path / "g.png")
    assert not (tmp_path / "g.png").exists()


def test_a_thousand_operations_draw_as_one_straight_chain():
    # The layout's speed is a benchmark figure, not a test (timed asserts flake under load).
    m = chain(1000)
    svg = view.to_svg(m)
    root = ET.fromstring(svg)
    ops = [g for g in root.iter(f"{SVG}g") if g.get("class") == "node op"]
    assert len(ops) == 1000
    ys = [float(next(g.iter(f"{SVG}rect")).get("y")) for g in ops]
    assert ys == sorted(ys) and len(set(ys)) == 1000  # one layer each, in order
    centres = []
    for g in ops:
        rect = next(g.iter(f"{SVG}rect"))
        centres.append(float(rect.get("x")) + float(rect.get("width")) / 2)
    assert max(centres) - min(centres) < 0.5  # a chain is drawn straight


def test_operation_inputs_are_named_by_the_form_that_fits():
    from nnhal.tools.describe import slot_names

    explicit = slot_names(O.CONV_2D, [T.TENSOR_FLOAT32] * 3 + [T.INT32] * 7)
    implicit = slot_names(O.CONV_2D, [T.TENSOR_FLOAT32] * 3 + [T.INT32] * 4 +
                          [T.BOOL, T.INT32, T.INT32])
    assert explicit[3:7] == ["pad_left", "pad_right", "pad_top", "pad_bottom"]
    assert implicit[3:] == ["padding_scheme", "stride_w", "stride_h", "activation", "nchw",
                            "dilation_w", "dilation_h"]
    assert slot_names(O.CONCATENATION, [T.TENSOR_FLOAT32] * 2 + [T.INT32]) == \
        ["inputs[0]", "inputs[1]", "axis"]
    assert view.compact_options([("pad_left", "1"), ("pad_right", "2"), ("pad_top", "0"),
                                 ("pad_bottom", "0"), ("stride_w", "1"), ("stride_h", "1"),
                                 ("activation", "0"), ("nchw", "False")]) == \
        ["pad=1,2,0,0", "stride=1x1"]


# ---- layout -------------------------------------------------------------------------------

def test_layers_longest_path_with_sources_next_to_their_reader():
    # 0 -> 1 -> 2 -> 3, and 4 (a source) read only by 3
    assert graphlayout.layers_of(5, [(0, 1), (1, 2), (2, 3), (4, 3)]) == [0, 1, 2, 3, 2]
    # a diamond with a shortcut: 3 is below both paths
    assert graphlayout.layers_of(4, [(0, 1), (1, 2), (0, 3), (2, 3)]) == [0, 1, 2, 3]


def test_layout_has_no_overlap_and_bends_long_edges():
    # 0 fans out to 1..5, all joined by 6; plus a long edge 0 -> 7 -> (below 6) via 6 -> 7
    edges = [(0, k) for k in range(1, 6)] + [(k, 6) for k in range(1, 6)] + [(0, 7), (6, 7)]
    widths = [100.0] * 8
    lay = graphlayout.layout(widths, [30.0] * 8, edges)
    by_layer: dict[int, list[float]] = {}
    for i, layer in enumerate(lay.layer):
        by_layer.setdefault(layer, []).append(lay.x[i])
    for xs in by_layer.values():
        xs.sort()
        assert all(b - a >= 100.0 + graphlayout.NODE_GAP - 1e-6 for a, b in zip(xs, xs[1:]))
    long_edge = lay.edges[edges.index((0, 7))]
    assert len(long_edge) == 4  # layers 0..3: two bends
    assert lay.y[0] < lay.y[1] < lay.y[6] < lay.y[7]


def test_isotonic_keeps_order_and_spacing():
    got = graphlayout._isotonic([5.0, 0.0, 40.0], [10.0, 10.0, 10.0], 2.0)
    assert got[1] - got[0] == pytest.approx(12.0)  # 0 and 1 collide: pushed apart ...
    assert got[0] + got[1] == pytest.approx(5.0 + 0.0)  # ... around their mean
    assert got[2] == pytest.approx(40.0)  # 2 is free to sit where it wants
    got = graphlayout._isotonic([5.0, 0.0, 10.0], [10.0, 10.0, 10.0], 2.0)
    assert got == pytest.approx([-7.0, 5.0, 17.0])  # all three pooled: least squares
