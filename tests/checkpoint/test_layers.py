"""Imports run one way: formats <- checkpoint <- server / offline <- cli and the package root.
Read from the sources (every import of the package, also those inside functions)."""
from __future__ import annotations

import ast
from pathlib import Path

import keyedstate

PACKAGE = Path(keyedstate.__file__).resolve().parent
BELOW = {"formats": {"formats"}, "checkpoint": {"formats", "checkpoint", "shim"}}

# Each top-level module or subpackage of keyedstate and its layer: a unit imports only units of
# lower layers and itself; the top layer (the package root and its command line) may import
# anything. A new unit must be placed here.
LAYERS = {
    "formats": 0, "version": 0,
    "conf": 1,
    "shim": 2,
    "checkpoint": 3, "failures": 3,
    "server": 4, "offline": 4,
    "": 5, "cli": 5, "demo": 5,  # "": the package root
}
TOP = max(LAYERS.values())


def _module_of(path: Path) -> tuple[str, ...]:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return parts[:-1] if parts[-1] == "__init__" else parts


def _is_module(parts: tuple[str, ...]) -> bool:
    where = PACKAGE.joinpath(*parts) if parts else PACKAGE
    return where.is_dir() or where.with_suffix(".py").is_file()


def _imports(path: Path) -> list[tuple[tuple[str, ...], int, bool]]:
    """(module of keyedstate imported, line, whether under ``if TYPE_CHECKING``) of each import
    in ``path``, relative or absolute; a name imported from a package that is no module of it
    counts as an import of the package."""
    own = _module_of(path)
    package = own if path.name == "__init__.py" else own[:-1]
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)]
            elif (node.module or "").split(".")[0] == "keyedstate":
                base = ()
            else:
                continue
            module = tuple(node.module.split(".")) if node.module else ()
            if not node.level:
                module = module[1:]
            target = base + module
            for alias in node.names:
                found.append((target + (alias.name,) if _is_module(target + (alias.name,)) else target,
                              node.lineno, id(node) in typing_only))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "keyedstate":
                    found.append((tuple(alias.name.split(".")[1:]), node.lineno, id(node) in typing_only))
    return found


def test_formats_and_checkpoint_import_nothing_above_them():
    wrong = [f"{path.relative_to(PACKAGE)}:{line} imports {'.'.join(target) or 'the package root'}"
             for sub, allowed in BELOW.items() for path in (PACKAGE / sub).rglob("*.py")
             for target, line, _ in _imports(path) if (target[:1] or ("",))[0] not in allowed]
    assert not wrong, wrong


def test_every_import_of_the_package_runs_down_its_layers():
    wrong, unplaced = [], set()
    for path in sorted(PACKAGE.rglob("*.py")):
        unit = (_module_of(path)[:1] or ("",))[0]
        if unit not in LAYERS:
            unplaced.add(unit)
            continue
        for target, line, _ in _imports(path):
            to = (target[:1] or ("",))[0]
            if to not in LAYERS:
                unplaced.add(to)
            elif to != unit and LAYERS[unit] != TOP and LAYERS[to] >= LAYERS[unit]:
                wrong.append(f"{path.relative_to(PACKAGE)}:{line} imports {'.'.join(target) or 'the package root'}")
    assert not unplaced, f"units in no layer (add them to LAYERS): {sorted(unplaced)}"
    assert not wrong, wrong


def test_no_import_cycle():
    """No cycle among the imports a module runs (those under ``if TYPE_CHECKING`` aside), a
    package's ``__init__`` counted as the module that imports its submodules."""
    graph: dict[tuple[str, ...], set[tuple[str, ...]]] = {}
    for path in PACKAGE.rglob("*.py"):
        graph[_module_of(path)] = {t for t, _, typing_only in _imports(path) if not typing_only
                                   and t != _module_of(path)}
    done: set = set()
    cycles = []

    def visit(node: tuple[str, ...], stack: list) -> None:
        if node in stack:
            cycles.append(" -> ".join(".".join(m) or "keyedstate" for m in stack[stack.index(node):] + [node]))
            return
        if node in done:
            return
        for target in sorted(graph.get(node, ())):
            visit(target, stack + [node])
        done.add(node)

    for module in sorted(graph):
        visit(module, [])
    assert not cycles, cycles
