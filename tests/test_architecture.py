"""The core's shape: imports form a DAG by the layers of docs/architecture.md, ``__all__`` is true."""

from __future__ import annotations

import ast
import functools
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "opregistry"
DOC = ROOT / "docs" / "architecture.md"
#: code whose imports of opregistry's names are checked against ``__all__``
IMPORTERS = [PACKAGE, ROOT / "plugins", ROOT / "examples", ROOT / "tests", ROOT / "benchmarks"]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@functools.lru_cache(maxsize=None)
def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _layers() -> dict[str, int]:
    """The module map of docs/architecture.md: module -> layer."""
    rows = re.findall(r"^\| `(opregistry/[\w/]+\.py)` \| (\d+) \|", DOC.read_text(), re.M)
    assert rows, "docs/architecture.md has no module map"
    return {_module_name(ROOT / path): int(layer) for path, layer in rows}


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node, less the bodies of ``if TYPE_CHECKING:`` (they never run)."""
    out: list[ast.AST] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        out.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return out


@functools.lru_cache(maxsize=None)
def _imports(path: Path, *, runtime_only: bool, name: str | None = None
             ) -> list[tuple[str, list[str]]]:
    """``(module, names)`` for every import in ``path``, relative imports made absolute.

    ``name``: the module's name, when ``path`` is not where it lives (a test's copy).
    """
    tree = ast.parse(path.read_text(), str(path))
    nodes = _runtime_nodes(tree) if runtime_only else list(ast.walk(tree))
    here = name or _module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found = []
    for node in nodes:
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names = [a.name for a in node.names]
            submodules = [n for n in names if f"{module}.{n}" in _modules()]
            # ``from . import torch_state``: an import of the module, not of the package
            found += [(f"{module}.{n}", []) for n in submodules]
            if len(submodules) < len(names):
                found.append((module, [n for n in names if n not in submodules]))
    return found


def test_module_map_names_every_module():
    """docs/architecture.md's module map lists exactly the modules of the package."""
    assert set(_layers()) == set(_modules())


def _layer_violations(modules: dict[str, Path], layers: dict[str, int]) -> list[str]:
    """Every import of ``modules`` (name -> file) of a module of the same or a higher layer."""
    wrong = []
    for name, path in sorted(modules.items()):
        for module, _ in _imports(path, runtime_only=True, name=name):
            if module in layers and module != name and layers[module] >= layers[name]:
                wrong.append(f"{name} (layer {layers[name]}) imports {module} "
                             f"(layer {layers[module]})")
    return wrong


def test_imports_follow_the_layers():
    """Each module imports only modules of a lower layer: the imports form a DAG."""
    wrong = _layer_violations(_modules(), _layers())
    assert not wrong, "\n".join(wrong)


def test_the_layers_forbid_a_cycle(tmp_path):
    """The checker itself fails on an upward import: the lockfile reaching for the registry --
    at module level, inside a function, relative or absolute -- but not under TYPE_CHECKING."""
    layers = _layers()
    assert layers["opregistry.lockfile"] < layers["opregistry.registry"]
    real = _modules()["opregistry.lockfile"]
    for bad, caught in (("from .registry import plan\n", True),
                        ("def f():\n    from .registry import load\n", True),
                        ("import opregistry.registry\n", True),
                        ("def f():\n    from . import registry\n", True),
                        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                         "    from .registry import Registry\n", False),
                        ("from .model import Origin\n", False)):
        copy = tmp_path / f"case{len(list(tmp_path.iterdir()))}" / "lockfile.py"
        copy.parent.mkdir()
        copy.write_text(real.read_text() + "\n" + bad)
        found = _layer_violations({**_modules(), "opregistry.lockfile": copy}, layers)
        expected = ["opregistry.lockfile (layer 4) imports opregistry.registry (layer 7)"]
        assert (found == expected) is caught, (bad, found)


@pytest.mark.parametrize("module", sorted(_modules()))
def test_all_is_true(module):
    """Every name in ``__all__`` exists, and every public name others import from it is listed."""
    mod = importlib.import_module(module)
    exported = getattr(mod, "__all__", None)
    assert exported is not None, f"{module} has no __all__"
    missing = [n for n in exported if not hasattr(mod, n) and n != "__version__"]
    assert not missing, f"{module}.__all__ names what it does not have: {missing}"
    imported = {n for source, names in _all_imports() if source == module for n in names
                if not n.startswith("_") and n != "*" and f"{module}.{n}" not in _modules()}
    unlisted = sorted(imported - set(exported))
    assert not unlisted, f"imported from {module} but not in its __all__: {unlisted}"


@functools.lru_cache(maxsize=None)
def _all_imports() -> list[tuple[str, list[str]]]:
    """Every import of every file of :data:`IMPORTERS`, parsed once for all modules."""
    found = []
    for root in IMPORTERS:
        for path in root.rglob("*.py"):
            if not {".venv", "build", "site"} & set(path.relative_to(ROOT).parts):
                found += _imports(path, runtime_only=False)
    return found


def test_messages_name_no_file_of_the_repository():
    """Hints and messages name pages of the documentation site, never ``docs/*.md``.

    A user who installed the wheels has no ``docs/`` folder: ``see docs/hooks.md``
    points at nothing.  Docstrings and comments may name the repository's files.
    """
    found = []
    for name, path in sorted(_modules().items()):
        tree = ast.parse(path.read_text(), str(path))
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef,
                                           ast.AsyncFunctionDef))
                      and node.body and isinstance(node.body[0], ast.Expr)
                      and isinstance(node.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and id(node) not in docstrings and re.search(r"docs/[\w-]+\.md", node.value)):
                found.append(f"{name}:{node.lineno}: {node.value[:80]!r}")
    assert not found, "\n".join(found)
