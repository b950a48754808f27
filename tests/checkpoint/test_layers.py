"""Imports run one way: formats <- checkpoint <- server / offline <- cli and the package root.
Read from the sources (every relative import, also those inside functions)."""
from __future__ import annotations

import ast
from pathlib import Path

import keyedstate

PACKAGE = Path(keyedstate.__file__).resolve().parent
BELOW = {"formats": {"formats"}, "checkpoint": {"formats", "checkpoint", "shim"}}


def _relative_imports(path: Path) -> list[tuple[str, int]]:
    """(first package part imported, line) of each relative import in ``path``."""
    own = list(path.relative_to(PACKAGE).parent.parts)
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = own[:len(own) - (node.level - 1)]
            names = [node.module] if node.module else [a.name for a in node.names]
            for name in names:
                parts = base + name.split(".")
                found.append((parts[0] if parts else "", node.lineno))
    return found


def test_formats_and_checkpoint_import_nothing_above_them():
    wrong = [f"{path.relative_to(PACKAGE)}:{line} imports {target or 'the package root'}"
             for sub, allowed in BELOW.items() for path in (PACKAGE / sub).rglob("*.py")
             for target, line in _relative_imports(path) if target not in allowed]
    assert not wrong, wrong
