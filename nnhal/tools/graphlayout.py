"""A layered (Sugiyama-style) drawing of a directed acyclic graph, top to bottom.

Model graphs are DAGs whose readers follow data downwards, so a layered drawing is the usual
picture; it is written here (a few hundred lines) rather than taken from Graphviz so that an
HTML page needs no binary and no network. Steps: longest-path layering; a chain of virtual
nodes for every edge spanning several layers (edges then bend around nodes instead of
crossing them); barycentric ordering sweeps; and x positions placing each node as near as
possible to the mean of its neighbours without overlap (isotonic regression per layer, exact
and linear). Everything is linear or n log n per sweep, so 1000 nodes lay out in well under a
second.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

#: Vertical space between layers (beyond the tallest node), horizontal gap between
#: nodes, and the width of a virtual node (a bend of a long edge).
LAYER_GAP = 44.0
NODE_GAP = 24.0
VIRTUAL_WIDTH = 8.0
#: Ordering sweeps (down then up counts as two) and positioning passes.
ORDER_SWEEPS = 8
PLACE_PASSES = 6
#: Beyond this many virtual nodes, long edges are drawn straight (a pathological graph,
#: e.g. one input read by every operation of a long chain, would otherwise grow quadratically).
MAX_VIRTUAL = 20000


@dataclass
class Layout:
    """Positions (centres) of the real nodes and the polyline of every edge, in edge order."""

    x: list[float]
    y: list[float]
    layer: list[int]
    edges: list[list[tuple[float, float]]]
    width: float
    height: float
    #: Heights of the nodes as given, for drawing.
    heights: list[float] = field(default_factory=list)


def layers_of(n: int, edges: Sequence[tuple[int, int]],
              pinned: dict[int, int] | None = None) -> list[int]:
    """Longest-path layer of each node (sources at 0). Nodes on a cycle, which a valid model
    does not have, are placed after their other predecessors rather than looping."""
    succ: list[list[int]] = [[] for _ in range(n)]
    indeg = [0] * n
    for u, v in edges:
        if u != v:
            succ[u].append(v)
            indeg[v] += 1
    indeg_orig = list(indeg)
    layer = [0] * n
    ready = [i for i in range(n) if indeg[i] == 0]
    seen = 0
    while True:
        while ready:
            u = ready.pop()
            seen += 1
            for v in succ[u]:
                layer[v] = max(layer[v], layer[u] + 1)
                indeg[v] -= 1
                if indeg[v] == 0:
                    ready.append(v)
        if seen >= n:
            break
        # a cycle: release the lowest-numbered blocked node
        blocked = next(i for i in range(n) if indeg[i] > 0)
        indeg[blocked] = 0
        ready.append(blocked)
    # a source (a model input) sits just above its first reader, not at the top of the page
    for u in range(n):
        if indeg_orig[u] == 0 and succ[u]:
            layer[u] = min(layer[v] for v in succ[u]) - 1
    for node, at in (pinned or {}).items():
        layer[node] = at
    return layer


def _isotonic(targets: list[float], widths: list[float], gap: float) -> list[float]:
    """Centres c_i minimising sum (c_i - t_i)^2 with c_i >= c_{i-1} + (w_{i-1}+w_i)/2 + gap:
    shift out the required spacing, pool adjacent violators, shift back."""
    n = len(targets)
    offset = [0.0] * n
    for i in range(1, n):
        offset[i] = offset[i - 1] + (widths[i - 1] + widths[i]) / 2 + gap
    blocks: list[list[float]] = []  # [mean, count]
    for i in range(n):
        blocks.append([targets[i] - offset[i], 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, c2 = blocks.pop()
            m1, c1 = blocks[-1]
            blocks[-1] = [(m1 * c1 + m2 * c2) / (c1 + c2), c1 + c2]
    out: list[float] = []
    for mean, count in blocks:
        out.extend([mean] * int(count))
    return [out[i] + offset[i] for i in range(n)]


def layout(widths: Sequence[float], heights: Sequence[float],
           edges: Sequence[tuple[int, int]], pinned: dict[int, int] | None = None) -> Layout:
    """Lay out nodes of the given sizes; ``pinned`` forces some nodes onto a layer."""
    n = len(widths)
    gap = max(heights, default=0.0) + LAYER_GAP
    layer = layers_of(n, edges, pinned)
    # nodes 0..n-1 real, then virtual ones; chains replace long edges
    w = list(map(float, widths))
    lay = list(layer)
    chains: list[list[int]] = []
    budget = MAX_VIRTUAL
    for u, v in edges:
        chain = [u]
        span = lay[v] - lay[u] if v < n and u < n else 0
        if 1 < span <= budget + 1:
            for k in range(1, span):
                lay.append(lay[u] + k)
                w.append(VIRTUAL_WIDTH)
                chain.append(len(w) - 1)
            budget -= span - 1
        chain.append(v)
        chains.append(chain)
    total = len(w)
    up: list[list[int]] = [[] for _ in range(total)]
    down: list[list[int]] = [[] for _ in range(total)]
    for chain in chains:
        for a, b in zip(chain, chain[1:]):
            if lay[b] == lay[a] + 1:
                down[a].append(b)
                up[b].append(a)
    depth = max(lay, default=-1) + 1
    rows: list[list[int]] = [[] for _ in range(depth)]
    for i in range(total):
        rows[lay[i]].append(i)
    pos = [0.0] * total
    for row in rows:
        for k, i in enumerate(row):
            pos[i] = float(k)

    def sweep(order: range, neighbours: list[list[int]]) -> None:
        for r in order:
            row = rows[r]
            keys = []
            for i in row:
                nb = neighbours[i]
                keys.append(sum(pos[j] for j in nb) / len(nb) if nb else pos[i])
            row[:] = [i for _, i in sorted(zip(keys, row), key=lambda t: t[0])]
            for k, i in enumerate(row):
                pos[i] = float(k)

    for s in range(ORDER_SWEEPS):
        if s % 2 == 0:
            sweep(range(1, depth), up)
        else:
            sweep(range(depth - 2, -1, -1), down)

    x = [0.0] * total
    for row in rows:
        acc = 0.0
        for i in row:
            x[i] = acc + w[i] / 2
            acc += w[i] + NODE_GAP
    for p in range(PLACE_PASSES):
        downward = p % 2 == 0
        order = range(1, depth) if downward else range(depth - 2, -1, -1)
        for r in order:
            row = rows[r]
            targets = []
            for i in row:
                nb = up[i] if downward else down[i]
                if p >= 2:  # later passes balance both sides
                    nb = up[i] + down[i]
                targets.append(sum(x[j] for j in nb) / len(nb) if nb else x[i])
            for i, c in zip(row, _isotonic(targets, [w[i] for i in row], NODE_GAP)):
                x[i] = c
    left = min((x[i] - w[i] / 2 for i in range(total)), default=0.0)
    x = [v - left for v in x]
    width = max((x[i] + w[i] / 2 for i in range(total)), default=0.0)
    y = [gap / 2 + lay[i] * gap for i in range(total)]
    polylines = [[(x[i], y[i]) for i in chain] for chain in chains]
    return Layout(x=x[:n], y=y[:n], layer=lay[:n], edges=polylines, width=width,
                  height=depth * gap, heights=list(map(float, heights)))
