"""One meaning per name: no public class name is defined twice in nnhal, and no module name
means two things where the issue found it (two ``registry`` modules)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "nnhal"


#: The AIDL face names its parcelables and interfaces as the AIDL text does, so each of its
#: names may also be the canonical one of the same idea (``nnhal.aidl.IDevice`` is the AIDL
#: IDevice, ``nnhal.hal.IDevice`` the canonical one), and nothing else.
FACE = {"aidl/types.py": "hal/types.py", "aidl/interfaces.py": "hal/interfaces.py"}


def test_no_public_class_name_is_defined_twice():
    where: dict[str, list[str]] = defaultdict(list)
    for p in sorted(ROOT.rglob("*.py")):
        for node in ast.parse(p.read_text()).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                where[node.name].append(str(p.relative_to(ROOT)))
    twice = {name: files for name, files in where.items()
             if len(files) > 1 and not (len(files) == 2 and FACE.get(files[0]) == files[1])}
    assert twice == {}


def test_one_registry_module():
    # nnhal.drivers.registry (the public, documented one) opens drivers by name; the table of
    # operation definitions is the resolver (upstream's word for it).
    assert sorted(str(p.relative_to(ROOT)) for p in ROOT.rglob("registry.py")) == \
        ["drivers/registry.py"]
