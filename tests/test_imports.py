"""The nnhal package has no import cycles, counting every import.

Every ``import`` and ``from ... import`` anywhere in a module counts: at module level, inside
functions and classes, and under ``if TYPE_CHECKING:``. A function-local import does not make a
cycle go away; it only hides it from the interpreter until the function runs.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "nnhal"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    """Every module of nnhal by dotted name; a package is its ``__init__``."""
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def imports_of(name: str, path: Path, modules: set[str]) -> set[str]:
    """The nnhal modules that ``name`` imports, wherever the import statement is."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                if node.level > 1:
                    base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.add(sub if sub in modules else target)
    return {m for m in out if m in modules and m != name}


def import_graph() -> dict[str, set[str]]:
    modules = all_modules()
    names = set(modules)
    return {name: imports_of(name, path, names) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path that starts and ends at the same module, or None."""
    WHITE, GREY, BLACK = 0, 1, 2
    colour = dict.fromkeys(graph, WHITE)
    for start in sorted(graph):
        if colour[start] != WHITE:
            continue
        stack: list[tuple[str, list[str]]] = [(start, sorted(graph[start]))]
        colour[start] = GREY
        while stack:
            node, todo = stack[-1]
            if not todo:
                colour[node] = BLACK
                stack.pop()
                continue
            nxt = todo.pop(0)
            if colour[nxt] == GREY:
                path = [n for n, _ in stack]
                return path[path.index(nxt):] + [nxt]
            if colour[nxt] == WHITE:
                colour[nxt] = GREY
                stack.append((nxt, sorted(graph[nxt])))
    return None


def test_the_graph_sees_every_kind_of_import():
    graph = import_graph()
    assert len(graph) > 50
    # A module-level import, a package __init__, and the executor importing its sibling.
    assert "nnhal.hal.types" in graph["nnhal.hal"]
    assert "nnhal.executor.plan" in graph["nnhal.executor.run"]
    # Function-local imports count too (the CLI imports the conformance runner lazily).
    assert any(m.startswith("nnhal.conformance") for m in graph["nnhal.cli"])


def test_find_cycle_reports_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycles():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


#: The layers of nnhal, lowest first: a module may import its own layer and those below.
LAYERS = ["nnhal.core", "nnhal.errors", "nnhal.memory", "nnhal.hal", "nnhal.validation",
          "nnhal.ops", "nnhal.extensions", "nnhal.analysis", "nnhal.tflite", "nnhal.executor",
          "nnhal.aidl", "nnhal.hidl", "nnhal.drivers.common",
          "nnhal.drivers", "nnhal.service", "nnhal.runtime", "nnhal.capi", "nnhal.session",
          "nnhal.conformance",
          "nnhal.tools", "nnhal.demo", "nnhal.cli"]


def layer(module: str) -> int:
    """The index in LAYERS of the longest layer that is ``module`` or contains it."""
    best = -1
    for i, name in enumerate(LAYERS):
        if (module == name or module.startswith(name + ".")) and \
                (best < 0 or len(name) > len(LAYERS[best])):
            best = i
    return best


def test_imports_point_one_way():
    """HAL types know no driver, the shared driver machinery knows no driver, and so on."""
    wrong = []
    for module, targets in import_graph().items():
        if module == "nnhal":
            continue
        assert layer(module) >= 0, f"{module} belongs to no layer: add it to LAYERS"
        wrong += [f"{module} -> {t}" for t in sorted(targets) if layer(t) > layer(module)]
    assert not wrong, "imports pointing up:\n" + "\n".join(wrong)


def test_the_core_imports_nothing_of_nnhal():
    """The version-neutral core sits under every layer, so it may not even import errors."""
    graph = import_graph()
    core = {m: t for m, t in graph.items() if m == "nnhal.core" or m.startswith("nnhal.core.")}
    assert "nnhal.core.version" in core
    wrong = [f"{m} -> {t}" for m, ts in core.items() for t in sorted(ts)
             if not t.startswith("nnhal.core")]
    assert not wrong, "the core imports:\n" + "\n".join(wrong)


#: The faces: each adapts the canonical core to one interface family at its edge.
FACES = ("nnhal.aidl", "nnhal.hidl")
#: The version-neutral core: the scale, memory, the canonical types and interfaces, the model
#: rules, the operations, the analysis and the executor.
CORE = ("nnhal.core", "nnhal.memory", "nnhal.hal", "nnhal.validation", "nnhal.ops",
        "nnhal.analysis", "nnhal.executor")


def test_the_core_imports_neither_face():
    """Adding a face, or a version to one, touches no module of the core."""
    def within(m, packages):
        return any(m == p or m.startswith(p + ".") for p in packages)
    wrong = [f"{m} -> {t}" for m, ts in import_graph().items() if within(m, CORE)
             for t in sorted(ts) if within(t, FACES)]
    assert not wrong, "the core imports a face:\n" + "\n".join(wrong)
    faces = {m for m in import_graph() if within(m, FACES)}
    assert {"nnhal.aidl.adapted", "nnhal.aidl.served", "nnhal.hidl.fmq",
            "nnhal.hidl.prepared_model"} <= faces
