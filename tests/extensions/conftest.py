"""The Fibonacci example package made visible as if installed: its directory on sys.path and a
dist-info whose entry points are those of examples/fibonacci/pyproject.toml (no pip into the
shared environment; a child process gets the same through :func:`site_paths`)."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fibonacci"


def make_site(root: Path) -> list[str]:
    """A dist-info for nnhal-fibonacci under ``root`` with the pyproject's entry points; the
    paths to put on sys.path (or PYTHONPATH) for it to be found."""
    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
    dist = root / "nnhal_fibonacci-0.1.0.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\n"
                                   f"Version: {project['version']}\n")
    lines = []
    for group, eps in project["entry-points"].items():
        lines.append(f"[{group}]")
        lines += [f"{name} = {value}" for name, value in eps.items()]
    (dist / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return [str(root), str(EXAMPLE)]


@pytest.fixture
def fibonacci_site(tmp_path, monkeypatch, fresh_runtime):
    """The example installed for this test: its extension and its device ``fibonacci``
    discovered through their entry points, a fresh device list, a clean extension registry."""
    from nnhal.drivers import registry
    from nnhal.ops import extensions

    paths = make_site(tmp_path / "site")
    for p in reversed(paths):
        monkeypatch.syspath_prepend(p)
    for name in ("_registered", "_plugins", "_errors", "_declared"):
        monkeypatch.setattr(extensions, name, {})
    monkeypatch.setattr(extensions, "_discovered", False)
    registry.discover(force=True)
    yield paths
    registry._discovered = False
    extensions._discovered = False
    for name in [m for m in sys.modules if m.startswith("nnhal_fibonacci")]:
        del sys.modules[name]
