"""The Fibonacci example package made visible as if installed: its directory on sys.path and a
dist-info whose entry points are those of examples/fibonacci/pyproject.toml (no pip into the
shared environment), in this process or a child's PYTHONPATH; and the example's device served
by ``nnhal serve fibonacci`` in a process of its own."""

from __future__ import annotations

import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from helpers import served_process

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


@contextmanager
def fibonacci_service(tmp: Path) -> Iterator[Path]:
    """``nnhal serve fibonacci`` in its own process (the example installed there, not here);
    the socket's path, the service stopped after."""
    with served_process(tmp, "fibonacci", "fib", make_site(tmp / "svc-site")) as sock:
        yield sock
