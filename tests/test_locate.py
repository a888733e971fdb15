"""opregistry.locate: a reference's files and attribute, found without running any code."""

from __future__ import annotations

import importlib
import sys
import textwrap
from pathlib import Path

import pytest

from opregistry.locate import attribute_status, locate_module

#: every module written here records that it ran (it must not)
RAN = "import pathlib; pathlib.Path({marker!r}).joinpath({name!r}).touch()\n"


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    root = tmp_path / "path"
    marker = tmp_path / "ran"
    marker.mkdir()
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    written: list[str] = []

    def write(name: str, body: str = "", *, package: bool = False) -> Path:
        parts = name.split(".")
        path = root.joinpath(*parts, "__init__.py") if package else \
            root.joinpath(*parts[:-1], parts[-1] + ".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(RAN.format(marker=str(marker), name=name) + textwrap.dedent(body))
        written.append(parts[0])
        return path

    importlib.invalidate_caches()
    yield write, marker, root
    for name in list(sys.modules):
        if name.partition(".")[0] in written:
            del sys.modules[name]


def test_a_submodule_is_found_without_running_its_packages(tree, ns) -> None:
    """``a.b.c``: every ``__init__`` on the way and the module, in order; none of them runs."""
    write, marker, _ = tree
    write(f"{ns}", package=True)
    write(f"{ns}.sub", package=True)
    write(f"{ns}.sub.mod", "def f(x):\n    return x\n")
    found = locate_module(f"{ns}.sub.mod")
    assert found.found == "source"
    assert found.names == (f"{ns}/__init__.py", f"{ns}/sub/__init__.py", f"{ns}/sub/mod.py")
    assert [Path(f).name for f in found.files] == ["__init__.py", "__init__.py", "mod.py"]
    assert attribute_status(found, "f") == ("defined", "")
    assert list(marker.iterdir()) == [] and ns not in sys.modules, "nothing was imported"


def test_a_namespace_package_on_the_way(tree, ns) -> None:
    write, marker, _ = tree
    write(f"{ns}.inner.k", "def g():\n    pass\n")  # no __init__ in ns/ nor ns/inner/
    found = locate_module(f"{ns}.inner.k")
    assert found.found == "source" and found.names == (f"{ns}/inner/k.py",)
    assert attribute_status(found, "g")[0] == "defined"
    assert attribute_status(found, "h")[0] == "missing"
    assert list(marker.iterdir()) == []


@pytest.mark.parametrize(("body", "attribute", "want", "status"), [
    ("def f(): pass\n", "f", "callable", "defined"),
    ("def f(): pass\n", "F", "callable", "missing"),
    ("class C:\n    def m(self): pass\n", "C.m", "callable", "defined"),
    ("class C:\n    def m(self): pass\n", "C.n", "callable", "missing"),
    ("x = 42\n", "x", "callable", "not-callable"),
    ("x = [1, 2]\n", "x", "callable", "not-callable"),
    ("x = make()\n", "x", "callable", "defined"),
    ("def f(): pass\n", "f", "class", "not-a-class"),
    ("class C: pass\n", "C", "class", "defined"),
    ("from os import path as p\n", "p", "callable", "defined"),
    ("import os.path\n", "os", "callable", "defined"),
    ("for i in range(2):\n    pass\n", "i", "callable", "defined"),
    ("try:\n    import json\nexcept ImportError as err:\n    pass\n", "err", "callable", "defined"),
    ("if True:\n    def f(): pass\n", "f", "callable", "defined"),
    ("with open(__file__) as fh:\n    pass\n", "fh", "callable", "defined"),
    # never a false typo: whatever the module could bind at run time is unknown
    ("from os import *\n", "anything", "callable", "unknown"),
    ("def __getattr__(name):\n    return 1\n", "anything", "callable", "unknown"),
    ("globals()['f'] = len\n", "f", "callable", "unknown"),
    ("import sys\nsetattr(sys.modules[__name__], 'f', len)\n", "f", "callable", "unknown"),
    ("def make():\n    global f\n    f = len\n", "f", "callable", "unknown"),
    ("exec('def f(): pass')\n", "f", "callable", "unknown"),
    ("def f(:\n", "f", "callable", "unimportable"),
    # importing it fails for certain: a top-level raise or exit
    ("import sys\nsys.exit(3)\ndef f(): pass\n", "f", "callable", "unimportable"),
    ("raise RuntimeError('no')\ndef f(): pass\n", "f", "callable", "unimportable"),
    # ... but not when a condition or a handler stands in between
    ("import sys\nif __name__ == '__main__':\n    sys.exit(3)\ndef f(): pass\n", "f",
     "callable", "defined"),
    ("try:\n    raise ImportError\nexcept ImportError:\n    pass\ndef f(): pass\n", "f",
     "callable", "defined"),
])
def test_attribute_status(tree, ns, body, attribute, want, status) -> None:
    write, marker, _ = tree
    write(ns, body)
    found, why = attribute_status(locate_module(ns), attribute, want)
    assert found == status, why
    if status == "missing":
        assert repr(attribute.rpartition(".")[2]) in why
    assert list(marker.iterdir()) == [], "the module was not run"


def test_a_typo_gets_a_suggestion(tree, ns) -> None:
    write, _, _ = tree
    write(ns, "def silu_and_mul(x):\n    return x\n")
    status, why = attribute_status(locate_module(ns), "silu_and_mull")
    assert status == "missing" and "did you mean 'silu_and_mul'?" in why


def test_missing_modules(tree, ns) -> None:
    write, _, _ = tree
    write(ns, package=True)
    write(f"{ns}.leaf", "x = 1\n")
    assert locate_module(f"no_such_{ns}").found == "missing"
    missing = locate_module(f"{ns}.nope")
    assert missing.found == "missing" and missing.names == (f"{ns}/__init__.py",)
    assert "not a package" in locate_module(f"{ns}.leaf.deeper").why
    assert attribute_status(missing, "f")[0] == "missing"


def test_a_module_imported_already_is_read_from_its_namespace(tree, ns) -> None:
    """No code runs: the attribute is looked up in ``__dict__``, never with getattr."""
    write, _, _ = tree
    write(ns, "def f(): pass\nx = 1\n")
    module = importlib.import_module(ns)
    found = locate_module(ns)
    assert found.loaded is module and found.file == module.__file__
    assert attribute_status(found, "f")[0] == "defined"
    assert attribute_status(found, "x")[0] == "not-callable"
    module.g = len  # bound at run time, not in the source: the live namespace knows
    assert attribute_status(found, "g")[0] == "defined"


def test_an_extension_module_is_located_but_not_read(tree, ns) -> None:
    """An extension's attributes are unknown, never missing; it is not loaded."""
    import importlib.util
    import shutil
    from importlib.machinery import EXTENSION_SUFFIXES

    _, _, root = tree
    spec = importlib.util.find_spec("_bz2")  # a compiled module of the standard library
    if spec is None or not spec.has_location:
        pytest.skip("this Python has _bz2 built in")
    target = root / f"{ns}{EXTENSION_SUFFIXES[0]}"
    shutil.copy(spec.origin, target)
    importlib.invalidate_caches()
    found = locate_module(ns)
    assert found.found == "extension" and found.file == str(target)
    assert attribute_status(found, "anything")[0] == "unknown"
    assert ns not in sys.modules
