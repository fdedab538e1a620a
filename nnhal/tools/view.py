"""``nnhal view MODEL -o FILE``: a picture of a model's graph.

Operations are boxes (type and index, with their constant tensors and small options written
inside), model inputs and outputs are named pills, and every edge is an operand labelled with
its shape and type. ``.dot`` is Graphviz text (the field's usual graph format); ``.svg`` and
``.html`` are drawn here with :mod:`nnhal.tools.graphlayout`, so the page needs no program
and no network; ``.png`` goes through Graphviz's ``dot`` when it is installed.
``devices`` (operation index -> device name) colours each operation by where it runs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from xml.sax.saxutils import escape

from nnhal.conformance.cliutil import device, error, input_file, output_file
from nnhal.errors import NnhalError
from nnhal.hal.types import Model, OperandLifeTime
from nnhal.tflite.model import ImportedModel
from nnhal.tools.describe import (
    CONSTANT,
    Analysed,
    analysed,
    op_name,
    open_model,
    quant_text,
    shape_text,
    short_type,
    slot_names,
    type_name,
    value_text,
)
from nnhal.tools.graphlayout import Layout, layout

#: Seconds Graphviz's dot may take to draw a .png (a model of thousands of operations takes
#: a few).
DOT_TIMEOUT = 300.0

SUFFIXES = (".html", ".svg", ".dot", ".png")
#: Node text: title font size and detail font size (px), and their character widths.
TITLE_PX, DETAIL_PX = 12, 10
TITLE_CH, DETAIL_CH = 7.3, 6.1
#: Longest detail line drawn in a node (the tooltip has everything).
MAX_DETAIL = 44
#: Colours of operations by device, in order of first appearance; inputs, outputs, default.
PALETTE = ("#9ec5fe", "#f1aeb5", "#c5b3e6", "#ffe69c", "#9eeaf9", "#a3cfbb", "#ced4da",
           "#feb272")
INPUT_FILL, OUTPUT_FILL, OP_FILL = "#d4f4dd", "#fde5cf", "#e8eef7"


@dataclass
class Node:
    kind: str  # "input", "op" or "output"
    title: str
    details: list[str]
    tooltip: str
    index: int
    device: str | None = None


@dataclass
class Edge:
    src: int
    dst: int
    operand: int
    label: str
    tooltip: str
    labelled: bool = True  # the first edge of an operand carries its label


@dataclass
class Drawing:
    """One subgraph as nodes and edges, ready to lay out or write as DOT."""

    name: str
    nodes: list[Node]
    edges: list[Edge]
    devices: list[str] = field(default_factory=list)


def _clip(text: str, n: int = MAX_DETAIL) -> str:
    return text if len(text) <= n else text[:n - 1] + "…"


_FUSED = {"1": "RELU", "2": "RELU1", "3": "RELU6"}
_PADDING = {"1": "SAME", "2": "VALID"}
#: Options whose value here is the default, left out of the node text (not the tooltip).
_PADS = ("pad_left", "pad_right", "pad_top", "pad_bottom")
_DEFAULTS = {("activation", "0"), ("nchw", "False"), ("dilation_w", "1"), ("dilation_h", "1")}


def compact_options(options: list[tuple[str, str]]) -> list[str]:
    """Small constant inputs as short words: ``SAME stride=2x2 RELU6`` rather than five
    ``name=value`` pairs; defaults are dropped."""
    values = dict(options)
    out = []
    for name, v in options:
        if (name, v) in _DEFAULTS:
            continue
        if name == "activation":
            out.append(_FUSED.get(v, f"activation={v}"))
        elif name == "padding_scheme":
            out.append(_PADDING.get(v, f"padding={v}"))
        elif name == "nchw":
            out.append("NCHW")
        elif name in _PADS:
            pads = [values.get(p) for p in _PADS]
            if name == "pad_left" and None not in pads and set(pads) != {"0"}:
                out.append("pad=" + ",".join(pads))  # type: ignore[arg-type]
        elif name.endswith("_w") and name[:-2] + "_h" in values:
            h = values[name[:-2] + "_h"]
            if name[:-2] != "dilation" or (v, h) != ("1", "1"):
                out.append(f"{name[:-2]}={v}x{h}")
        elif name.endswith("_h") and name[:-2] + "_w" in values:
            continue
        else:
            out.append(f"{name}={v}")
    return out


def _operand_text(a: Analysed, k: int, index: int) -> tuple[str, str]:
    """(short label, full description) of an operand."""
    o = a.subgraph(k).operands[index]
    shape = shape_text(a.shape(k, index))
    full = f"operand {index}: {type_name(o.type)} {shape}"
    q = quant_text(o)
    return f"{shape} {short_type(o.type)}", full + (f", {q}" if q else "")


def drawing(imported: ImportedModel | Model | Analysed, subgraph: int = -1,
            devices: Mapping[int, str] | None = None) -> Drawing:
    """The nodes and edges of one subgraph (-1: main) of a model."""
    a = imported if isinstance(imported, Analysed) else analysed(imported)
    sg = a.subgraph(subgraph)
    main = subgraph < 0
    in_names = a.imported.input_names if main else [f"input {k}" for k in
                                                   range(len(sg.input_indexes))]
    out_names = a.imported.output_names if main else [f"output {k}" for k in
                                                     range(len(sg.output_indexes))]
    nodes: list[Node] = []
    producer: dict[int, int] = {}
    for k, idx in enumerate(sg.input_indexes):
        label, full = _operand_text(a, subgraph, idx)
        nodes.append(Node("input", in_names[k], [label], f"input {k} {in_names[k]}\n{full}", k))
        producer.setdefault(idx, len(nodes) - 1)
    used: list[str] = []
    op_node: list[int] = []
    for i, op in enumerate(sg.operations):
        names = slot_names(op.type, [sg.operands[j].type if 0 <= j < len(sg.operands) else -1
                                     for j in op.inputs])
        tensors, scalars, tip = [], [], []
        for name, j in zip(names, op.inputs):
            if not 0 <= j < len(sg.operands):
                tip.append(f"{name}: operand {j} (out of range)")
                continue
            o = sg.operands[j]
            _, full = _operand_text(a, subgraph, j)
            if o.lifetime in CONSTANT:
                value = a.value(subgraph, j)
                shape = a.shape(subgraph, j) or []
                small = value is not None and (len(shape) == 0 or
                                               (len(shape) == 1 and shape[0] <= 4))
                if small:
                    scalars.append((name, value_text(value, 4)))
                    tip.append(f"{name} = {value_text(value, 16)} ({full})")
                else:
                    tensors.append(f"{name} {shape_text(shape)} {short_type(o.type)}")
                    tip.append(f"{name}: constant {full}, {o.location.length} bytes")
            elif o.lifetime == OperandLifeTime.NO_VALUE:
                tip.append(f"{name}: omitted")
            elif o.lifetime == OperandLifeTime.SUBGRAPH:
                scalars.append(f"{name}=subgraph {o.location.offset}")
                tip.append(f"{name}: subgraph {o.location.offset}")
            else:
                tip.append(f"{name}: {full}")
        for j in op.outputs:
            if 0 <= j < len(sg.operands):
                tip.append(f"-> {_operand_text(a, subgraph, j)[1]}")
        device = devices.get(i) if devices and main else None
        if device is not None and device not in used:
            used.append(device)
        title = f"{op_name(op.type, a.model.extension_name_to_prefix)} #{i}"
        details = [_clip(", ".join(tensors))] if tensors else []
        options = compact_options(scalars)
        if options:
            details.append(_clip(" ".join(options)))
        head = title + (f" on {device}" if device else "")
        nodes.append(Node("op", title, details, head + "\n" + "\n".join(tip), i, device))
        op_node.append(len(nodes) - 1)
        for j in op.outputs:
            producer.setdefault(j, len(nodes) - 1)
    outputs_at: list[tuple[int, int]] = []
    for k, idx in enumerate(sg.output_indexes):
        label, full = _operand_text(a, subgraph, idx)
        nodes.append(Node("output", out_names[k], [label],
                          f"output {k} {out_names[k]}\n{full}", k))
        outputs_at.append((idx, len(nodes) - 1))
    edges: list[Edge] = []
    labelled: set[int] = set()

    def connect(j: int, dst: int) -> None:
        src = producer.get(j)
        if src is None or src == dst:
            return
        label, full = _operand_text(a, subgraph, j)
        edges.append(Edge(src, dst, j, label, full, j not in labelled))
        labelled.add(j)

    for i, op in enumerate(sg.operations):
        for j in dict.fromkeys(op.inputs):
            connect(j, op_node[i])
    for j, node in outputs_at:
        connect(j, node)
    name = "main" if main else f"subgraph {subgraph}"
    return Drawing(name, nodes, edges, used)


# ---- DOT ------------------------------------------------------------------------------------

def _dot_str(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _fills(d: Drawing) -> dict[str, str]:
    return {dev: PALETTE[k % len(PALETTE)] for k, dev in enumerate(d.devices)}


def _fill(node: Node, fills: Mapping[str, str]) -> str:
    if node.kind == "input":
        return INPUT_FILL
    if node.kind == "output":
        return OUTPUT_FILL
    return fills.get(node.device or "", OP_FILL)


def to_dot(imported: ImportedModel | Model, devices: Mapping[int, str] | None = None) -> str:
    """Graphviz DOT text of every subgraph (referenced ones as clusters)."""
    a = analysed(imported)
    lines = ["digraph model {", '  graph [rankdir=TB, fontname="monospace"];',
             '  node [shape=box, style="rounded,filled", fontname="monospace", fontsize=10];',
             '  edge [fontname="monospace", fontsize=9, color="#666666"];']
    count = 1 + len(a.model.referenced)
    for k in range(-1, count - 1):
        d = drawing(a, k, devices)
        prefix = "m" if k < 0 else f"s{k}_"
        indent = "  "
        if k >= 0:
            lines.append(f"  subgraph cluster_{k} {{")
            lines.append(f"    label={_dot_str(d.name)};")
            indent = "    "
        fills = _fills(d)
        for n, node in enumerate(d.nodes):
            shape = ", shape=ellipse" if node.kind != "op" else ""
            text = "\n".join([node.title, *node.details])
            lines.append(f"{indent}{prefix}{n} [label={_dot_str(text)}, "
                         f"tooltip={_dot_str(node.tooltip)}, fillcolor=\"{_fill(node, fills)}\""
                         f"{shape}];")
        for e in d.edges:
            lines.append(f"{indent}{prefix}{e.src} -> {prefix}{e.dst} "
                         f"[label={_dot_str(e.label)}, tooltip={_dot_str(e.tooltip)}];")
        if k >= 0:
            lines.append("  }")
        if fills and k < 0:
            legend = _dot_str("\n".join(["devices:", *fills]))
            lines.append(f"  legend [shape=note, label={legend}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


# ---- SVG ------------------------------------------------------------------------------------

def _size(node: Node) -> tuple[float, float]:
    w = max([len(node.title) * TITLE_CH] + [len(t) * DETAIL_CH for t in node.details]) + 20
    h = 10 + TITLE_PX + 4 + len(node.details) * (DETAIL_PX + 4)
    return max(w, 60.0), float(h)


def _path(points: list[tuple[float, float]], y0: float, y1: float) -> str:
    """A smooth vertical path through the layout points, from the source's bottom (y0) to
    the destination's top (y1)."""
    pts = list(points)
    pts[0] = (pts[0][0], y0)
    pts[-1] = (pts[-1][0], y1)
    out = [f"M{pts[0][0]:.1f},{pts[0][1]:.1f}"]
    for (xa, ya), (xb, yb) in zip(pts, pts[1:]):
        my = (ya + yb) / 2
        out.append(f"C{xa:.1f},{my:.1f} {xb:.1f},{my:.1f} {xb:.1f},{yb:.1f}")
    return "".join(out)


def svg_of(d: Drawing) -> tuple[str, Layout]:
    """One drawing as an SVG element, with its layout."""
    sizes = [_size(n) for n in d.nodes]
    lay = layout([s[0] for s in sizes], [s[1] for s in sizes], [(e.src, e.dst) for e in d.edges])
    margin = 12.0
    fills = _fills(d)
    width, height = lay.width + 2 * margin, lay.height + 2 * margin
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" '
             f'height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}" '
             f'font-family="ui-monospace, Menlo, Consolas, monospace">',
             '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
             'markerHeight="7" orient="auto-start-reverse"><path d="M0,0L10,5L0,10z" '
             'fill="#777"/></marker></defs>',
             f'<g transform="translate({margin},{margin})">', '<g class="edges">']
    labels = []
    for e, pts in zip(d.edges, lay.edges):
        y0 = lay.y[e.src] + sizes[e.src][1] / 2
        y1 = lay.y[e.dst] - sizes[e.dst][1] / 2
        parts.append(f'<path class="edge" d="{_path(pts, y0, y1)}" fill="none" stroke="#888" '
                     f'stroke-width="1.2" marker-end="url(#arrow)"><title>{escape(e.tooltip)}'
                     f'</title></path>')
        if e.labelled:
            x = pts[0][0] if len(pts) < 3 else pts[1][0]
            y = y0 + 13 if len(pts) < 3 else pts[1][1]
            labels.append(f'<text class="label" x="{x + 4:.1f}" y="{y:.1f}" font-size="9" '
                          f'fill="#555" stroke="#fff" stroke-width="3" paint-order="stroke">'
                          f'{escape(e.label)}</text>')
    parts.append("</g>")
    parts.append('<g class="nodes">')
    for n, node in enumerate(d.nodes):
        w, h = sizes[n]
        x, y = lay.x[n] - w / 2, lay.y[n] - h / 2
        radius = h / 2 if node.kind != "op" else 5
        parts.append(f'<g class="node {node.kind}" data-index="{node.index}">'
                     f'<title>{escape(node.tooltip)}</title>'
                     f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" '
                     f'rx="{radius:.1f}" fill="{_fill(node, fills)}" stroke="#556" '
                     f'stroke-width="1"/>')
        ty = y + 8 + TITLE_PX
        parts.append(f'<text x="{lay.x[n]:.1f}" y="{ty:.1f}" text-anchor="middle" '
                     f'font-size="{TITLE_PX}" font-weight="bold">{escape(node.title)}</text>')
        for line in node.details:
            ty += DETAIL_PX + 4
            parts.append(f'<text x="{lay.x[n]:.1f}" y="{ty:.1f}" text-anchor="middle" '
                         f'font-size="{DETAIL_PX}" fill="#333">{escape(line)}</text>')
        parts.append("</g>")
    parts.append("</g>")
    parts.append('<g class="labels">' + "".join(labels) + "</g>")
    parts.append("</g></svg>")
    return "\n".join(parts), lay


def to_svg(imported: ImportedModel | Model, devices: Mapping[int, str] | None = None) -> str:
    """The main subgraph as a standalone SVG document."""
    svg, _ = svg_of(drawing(imported, -1, devices))
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + svg + "\n"


_CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.3em; margin-bottom: 0.2em; } h2 { font-size: 1.1em; margin-top: 1.5em; }
.meta { color: #555; margin: 0.2em 0 1em; }
.legend span { display: inline-block; padding: 0.1em 0.6em; margin-right: 0.5em;
  border: 1px solid #556; border-radius: 4px; font-family: monospace; }
.graph { overflow: auto; border: 1px solid #ddd; padding: 4px; }
.node:hover rect { stroke-width: 2.5; } .edge:hover { stroke: #c00; stroke-width: 2.5; }
"""


def to_html(imported: ImportedModel | Model, devices: Mapping[int, str] | None = None,
            title: str | None = None) -> str:
    """One self-contained page: a summary, the device legend, and an SVG per subgraph."""
    a = analysed(imported)
    model = a.model
    name = title or a.imported.source or "model"
    ops = sum(len(sg.operations) for sg in [model.main, *model.referenced])
    main = model.main
    consts = sum(o.location.length for sg in [model.main, *model.referenced]
                 for o in sg.operands if o.lifetime in CONSTANT)
    body = [f"<h1>{escape(name)}</h1>",
            f'<p class="meta">{ops} operations, {len(main.input_indexes)} inputs, '
            f"{len(main.output_indexes)} outputs, {consts:,} bytes of constants. Hover a box or "
            f"an edge for its operands.</p>"]
    if a.problem:
        body.append(f'<p class="meta"><b>Invalid model:</b> {escape(a.problem)}</p>')
    for k in range(-1, len(model.referenced)):
        d = drawing(a, k, devices)
        if k >= 0:
            body.append(f"<h2>{escape(d.name)}</h2>")
        if d.devices:
            fills = _fills(d)
            body.append('<p class="legend">' + "".join(
                f'<span style="background:{fills[dev]}">{escape(dev)}</span>'
                for dev in d.devices) + "</p>")
        svg, _ = svg_of(d)
        body.append(f'<div class="graph">{svg}</div>')
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{escape(name)}</title><style>{_CSS}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")


def write(imported: ImportedModel | Model, path: str | Path,
          devices: Mapping[int, str] | None = None) -> None:
    """Write the picture in the format the suffix names (NnhalError for any other)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".html":
        text = to_html(imported, devices)
    elif suffix == ".svg":
        text = to_svg(imported, devices)
    elif suffix == ".dot":
        text = to_dot(imported, devices)
    elif suffix == ".png":
        dot = shutil.which("dot")
        if dot is None:
            raise NnhalError(f"{path}: writing .png needs Graphviz's dot program, which is not "
                             f"installed; write .html, .svg or .dot instead")
        try:
            done = subprocess.run([dot, "-Tpng", "-o", os.fsencode(path)],
                                  input=to_dot(imported, devices).encode(
                                      "utf-8", "backslashreplace"),
                                  capture_output=True, check=False, timeout=DOT_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise NnhalError(f"{path}: dot did not finish within {DOT_TIMEOUT:.0f} s") from None
        except OSError as e:
            raise NnhalError(f"{path}: cannot run dot: {e.strerror or e}") from None
        if done.returncode != 0:
            first = (done.stderr.decode("utf-8", "replace").strip().splitlines()
                     or ["failed"])[0]
            raise NnhalError(f"{path}: dot: {first}")
        return
    else:
        raise NnhalError(f"{path}: unknown picture format {suffix or '(no suffix)'!r}; "
                         f"use {', '.join(SUFFIXES)}")
    try:
        # The text names the model's file, which may not be UTF-8: escaped, not refused.
        path.write_text(text, encoding="utf-8", errors="backslashreplace")
    except OSError as e:
        raise NnhalError(f"cannot write {path}: {e.strerror or e}") from None


# ---- command --------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", type=input_file, help="a .tflite file")
    parser.add_argument("-o", "--output", required=True, metavar="FILE", type=output_file,
                        help="the picture: .html (a page to open in a browser), .svg, .dot "
                             "(Graphviz) or .png (needs Graphviz's dot)")
    parser.add_argument("--plan", action="store_true",
                        help="colour each operation by the device the runtime gives it "
                             "(a legend names them)")
    parser.add_argument("--device", action="append", metavar="NAME", type=device,
                        help="with --plan: partition over these devices (repeatable; default: "
                             "every available device)")


def main(args: argparse.Namespace) -> int:
    suffix = Path(args.output).suffix.lower()
    if suffix not in SUFFIXES:  # an argument problem: said before the model is read
        return error("nnhal view", f"{args.output}: unknown picture format "
                                   f"{suffix or '(no suffix)'!r}; use {', '.join(SUFFIXES)}")
    imported = open_model(args.model)
    devices = None
    if args.plan or args.device:
        from nnhal.tools.plan import compile_plan, operation_devices

        model = imported.model if isinstance(imported, ImportedModel) else imported
        steps, comp = compile_plan(model, args.device)
        comp.free()
        devices = operation_devices(steps)
    write(imported, args.output, devices)
    print(f"wrote {args.output}")
    return 0

