"""Where a ``"module:attribute"`` reference leads, found without running any of its code.

One question, asked by two users: ``opregistry doctor`` (does every kernel,
fake, autograd, vmap, dispatch-rule and predicate reference name a module
and an attribute that exist?) and the lock (which files does the plan run?).
Both must answer before torch is imported and without executing a plugin's
module, so the answer is static:

* :func:`locate_module` finds a module's file the way the import system
  would, without importing it: the top-level name through
  :func:`importlib.util.find_spec` (a top-level lookup imports nothing; it
  asks the installed finders, editable installs' included), then each
  submodule with :meth:`importlib.machinery.PathFinder.find_spec` over its
  parent's search locations -- what ``import a.b.c`` does after running
  ``a/__init__.py``, here without running it (``find_spec("a.b")`` would
  import ``a``).  It returns every file importing the module executes: each
  package's ``__init__`` on the way, then the module itself.
* :func:`attribute_status` reads the module's source with :mod:`ast`:
  an attribute bound at top level (``def``, ``class``, an assignment, an
  import, a ``for``/``with``/``except`` target...) is ``defined``; a name
  bound nowhere is ``missing``, unless the module can bind names in ways a
  reader cannot follow -- a star import, a module ``__getattr__``,
  ``globals()``, ``exec``, ``setattr``, ``sys.modules`` tricks -- which make it
  ``unknown``.  Never a false typo: whatever is not certain is ``unknown``.

What is found is what a fresh import would find *before* the packages on
the way run: a package whose ``__init__`` rewrites its own ``__path__`` is
located as it is on disk.  A module already imported is read from
``sys.modules`` (its ``__dict__``, without calling anything).
"""

from __future__ import annotations

import ast
import functools
import os
import sys
from typing import Any, Literal

from attrs import frozen

from .regular import open_regular

__all__ = ["ModuleLocation", "locate_module", "attribute_status", "AttributeStatus",
           "split_ref", "module_source"]

#: how the module was found: ``source`` (a ``.py`` file), ``bytecode`` (a ``.pyc``
#: without source), ``extension`` (a compiled module), ``namespace`` (a folder
#: without ``__init__``), ``builtin`` (compiled into Python, or frozen),
#: ``archive`` (inside a zip file on ``sys.path``), ``other`` (a custom finder
#: whose spec names no file), ``missing`` (not found)
Found = Literal["source", "bytecode", "extension", "namespace", "builtin", "archive", "other",
                "missing"]
#: ``defined``, ``missing``, ``unknown``, ``not-callable`` (bound only to literal
#: values), ``not-a-class`` (bound only by ``def``), ``unimportable`` (the module's
#: source cannot be compiled) -- see :func:`attribute_status`
AttributeStatus = Literal["defined", "missing", "unknown", "not-callable", "not-a-class",
                          "unimportable"]


@frozen
class ModuleLocation:
    """A module found without running it: its files and how it was found."""

    module: str
    found: Found
    #: absolute paths of the files importing the module runs, outermost package
    #: first, the module's own file last (a namespace package adds none)
    files: tuple[str, ...] = ()
    #: for each of ``files``, its name relative to the ``sys.path`` entry it was found in
    names: tuple[str, ...] = ()
    #: why it is ``missing`` (or ``archive``/``other``: why its files cannot be hashed)
    why: str = ""
    #: the module object, when it is imported already (read, never called)
    loaded: Any = None

    @property
    def file(self) -> str | None:
        """The module's own file (``None`` for a namespace package or a missing module)."""
        if self.found in ("source", "bytecode", "extension") and self.files:
            return self.files[-1]
        return None


def split_ref(ref: str) -> tuple[str, str]:
    """``"pkg.mod:Class.method"`` -> ``("pkg.mod", "Class.method")``."""
    module, _, attribute = ref.partition(":")
    return module.strip(), attribute.strip()


def _kind_of(spec: Any) -> Found:
    origin = getattr(spec, "origin", None)
    if origin in ("built-in", "frozen"):
        return "builtin"
    if origin in (None, "namespace") or not getattr(spec, "has_location", False):
        return "namespace" if spec.submodule_search_locations is not None else "other"
    if not os.path.isfile(origin):
        return "archive" if ".zip" in origin or ".egg" in origin else "other"
    if origin.endswith(".py") or origin.endswith(".pyw"):
        return "source"
    if origin.endswith(".pyc"):
        return "bytecode"
    return "extension"


def _relative(origin: str, depth: int, package: bool) -> str:
    """``origin``'s name under its ``sys.path`` entry: ``depth`` folders above its module."""
    parts = [os.path.basename(origin)]
    folder = os.path.dirname(origin)
    for _ in range(depth - (0 if package else 1)):
        parts.append(os.path.basename(folder))
        folder = os.path.dirname(folder)
    return "/".join(reversed(parts))


def _top_spec(name: str) -> tuple[Any, str]:
    """The spec of a top-level module, or ``(None, why)``; nothing is imported."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError, AttributeError) as exc:
        return None, f"looking it up failed ({type(exc).__name__}: {exc})"
    return spec, "" if spec is not None else "no such module on sys.path"


def _path_finder(entry: str) -> Any:
    """The finder of one search location, as the import system gets it (``sys.path_hooks``)."""
    finder = sys.path_importer_cache.get(entry)
    if finder is not None:
        return finder
    for hook in sys.path_hooks:
        try:
            return hook(entry)
        except ImportError:
            continue
    return None


def _sub_spec(name: str, locations: list[str]) -> tuple[Any, str]:
    """The spec of submodule ``name`` in its parent's ``locations``; nothing is imported.

    :class:`importlib.machinery.PathFinder`'s walk, done here because its own
    builds a namespace package's path from the parent *module*, which is not
    imported: each location's finder is asked in turn, the first module wins,
    and namespace portions are gathered as the import system gathers them.
    """
    from importlib.machinery import ModuleSpec

    portions: list[str] = []
    for entry in locations:
        finder = _path_finder(entry)
        if finder is None or not hasattr(finder, "find_spec"):
            continue
        try:
            spec = finder.find_spec(name)
        except (ImportError, ValueError, OSError) as exc:
            return None, f"looking it up failed ({type(exc).__name__}: {exc})"
        if spec is None:
            continue
        if spec.loader is not None:
            return spec, ""
        portions.extend(spec.submodule_search_locations or ())
    if portions:
        namespace = ModuleSpec(name, None, is_package=True)
        namespace.submodule_search_locations = portions
        return namespace, ""
    return None, "no such module"


def locate_module(module: str) -> ModuleLocation:
    """Find ``module`` (``"pkg.sub.mod"``) and the files its import runs, without importing it.

    Modules already imported are read from ``sys.modules``; nothing else is
    imported and no code of the module or its packages runs.
    """
    parts = module.split(".")
    files: list[str] = []
    names: list[str] = []
    locations: list[str] | None = None
    spec: Any = None
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        loaded = sys.modules.get(name)
        spec = getattr(loaded, "__spec__", None) if loaded is not None else None
        if spec is None:
            if depth == 1:
                spec, why = _top_spec(name)
            elif locations is None:
                return ModuleLocation(module, "missing", tuple(files), tuple(names),
                                      why=f"{'.'.join(parts[:depth - 1])} is not a package")
            else:
                spec, why = _sub_spec(name, locations)
            if spec is None:
                return ModuleLocation(module, "missing", tuple(files), tuple(names),
                                      why=f"{name}: {why}")
        kind = _kind_of(spec)
        package = spec.submodule_search_locations is not None
        if kind in ("source", "bytecode", "extension"):
            files.append(spec.origin)
            names.append(_relative(spec.origin, depth, package))
        elif kind in ("archive", "other", "builtin") and depth == len(parts):
            why = {"archive": f"{spec.origin} is inside an archive",
                   "other": f"found by {type(getattr(spec, 'loader', None)).__name__}, "
                            f"which names no file",
                   "builtin": "built into Python"}[kind]
            return ModuleLocation(module, kind, tuple(files), tuple(names), why=why,
                                  loaded=sys.modules.get(module))
        elif kind in ("archive", "other"):
            return ModuleLocation(module, kind, tuple(files), tuple(names),
                                  why=f"{name}: {spec.origin or 'no file'} cannot be read "
                                      f"as a file")
        search = loaded.__path__ if loaded is not None and hasattr(loaded, "__path__") \
            else spec.submodule_search_locations
        locations = list(search) if search is not None else None
    kind = _kind_of(spec)
    return ModuleLocation(module, kind, tuple(files), tuple(names), loaded=sys.modules.get(module))


# -- attributes --------------------------------------------------------------------------

#: names whose call lets a module bind globals a reader cannot see
_DYNAMIC_CALLS = frozenset({"globals", "exec", "eval", "execfile"})


@frozen
class _Bindings:
    """What a module's top level binds, as far as a reader can tell."""

    #: name -> the statement kinds that bind it (``def``, ``class``, ``literal``, ``other``)
    names: dict[str, frozenset[str]]
    #: why names it does not bind may exist all the same (``""``: nothing dynamic)
    dynamic: str
    #: class name -> what its body binds (for ``Class.attribute`` references)
    classes: dict[str, "_Bindings"]
    #: why importing the module fails for certain (a top-level ``raise`` or ``sys.exit()``)
    fatal: str = ""


_LITERALS = (ast.Constant, ast.List, ast.Tuple, ast.Dict, ast.Set, ast.JoinedStr, ast.BinOp,
             ast.ListComp, ast.DictComp, ast.SetComp, ast.GeneratorExp)


def _targets(node: ast.AST) -> list[str]:
    """The plain names an assignment target binds (``a``, ``a, b``, ``*rest``)."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, (ast.Tuple, ast.List)):
        return [n for elt in node.elts for n in _targets(elt)]
    if isinstance(node, ast.Starred):
        return _targets(node.value)
    return []


def _bind(found: dict[str, set[str]], names: list[str], kind: str) -> None:
    for name in names:
        found.setdefault(name, set()).add(kind)


def _statement(node: ast.stmt, found: dict[str, set[str]], classes: dict[str, _Bindings],
               dynamic: list[str]) -> None:
    """Record what one top-level statement binds (compound statements: their bodies too)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        _bind(found, [node.name], "def")
        if node.name == "__getattr__":
            dynamic.append("it defines a module __getattr__")
    elif isinstance(node, ast.ClassDef):
        _bind(found, [node.name], "class")
        classes[node.name] = _bindings(node.body)
    elif isinstance(node, ast.Assign):
        kind = "literal" if isinstance(node.value, _LITERALS) else "other"
        for target in node.targets:
            _bind(found, _targets(target), kind if isinstance(target, ast.Name) else "other")
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        if isinstance(node, ast.AugAssign) or node.value is not None:
            _bind(found, _targets(node.target), "other")
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
        for alias in node.names:
            if alias.name == "*":
                dynamic.append(f"'from {getattr(node, 'module', '')} import *' binds names "
                               f"that only its import tells")
            else:
                _bind(found, [alias.asname or alias.name.partition(".")[0]], "other")
    elif isinstance(node, (ast.For, ast.AsyncFor)):
        _bind(found, _targets(node.target), "other")
    elif isinstance(node, (ast.With, ast.AsyncWith)):
        for item in node.items:
            if item.optional_vars is not None:
                _bind(found, _targets(item.optional_vars), "other")
    elif isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
        for handler in getattr(node, "handlers", ()):
            if handler.name:
                _bind(found, [handler.name], "other")
    elif type(node).__name__ == "TypeAlias":
        _bind(found, _targets(node.name), "other")  # type: ignore[attr-defined]
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.stmt) and not isinstance(
                node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            _statement(child, found, classes, dynamic)
        elif type(child).__name__ == "match_case":
            for stmt in child.body:  # type: ignore[attr-defined]
                _statement(stmt, found, classes, dynamic)


def _dynamic_uses(tree: ast.AST) -> list[str]:
    """Ways anything in the module could bind globals a reader does not see."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            out.append(f"'global {', '.join(node.names)}' in a function")
        elif isinstance(node, ast.NamedExpr) and isinstance(node.target, ast.Name):
            out.append("an assignment expression (:=)")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and (
                node.func.id in _DYNAMIC_CALLS or (node.func.id == "vars" and not node.args)):
            out.append(f"a call of {node.func.id}()")
        elif isinstance(node, ast.Attribute) and node.attr == "modules" and \
                isinstance(node.value, ast.Name) and node.value.id == "sys":
            out.append("an access to sys.modules")
    return out


#: calls that end the interpreter when a module's top level makes them
_EXITS = frozenset({"exit", "quit", "sys.exit", "os._exit", "os.abort"})


def _fatal(body: list[ast.stmt]) -> str:
    """Why running the module's top level always fails, or ``""``.

    Only a statement of the top level itself (no ``if``, no ``try``): a
    ``raise``, or a call of ``sys.exit()`` and its kin.  Reached for certain,
    unless a statement before it fails first, which fails the import too.
    """
    for node in body:
        if isinstance(node, ast.Raise):
            return f"it raises at import (line {node.lineno})"
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            name = ast.unparse(node.value.func)
            if name in _EXITS:
                return f"it calls {name}() at import (line {node.lineno})"
    return ""


def _bindings(body: list[ast.stmt], tree: ast.AST | None = None) -> _Bindings:
    found: dict[str, set[str]] = {}
    classes: dict[str, _Bindings] = {}
    dynamic: list[str] = []
    for node in body:
        _statement(node, found, classes, dynamic)
    if tree is not None:
        dynamic += _dynamic_uses(tree)
    return _Bindings({k: frozenset(v) for k, v in found.items()}, "; ".join(dynamic[:1]), classes,
                     _fatal(body) if tree is not None else "")


def module_source(path: str) -> str | None:
    """The text of a source file, or ``None`` when it cannot be read as text."""
    try:
        with open_regular(path) as fh:
            data = fh.read()
    except OSError:
        return None
    try:
        import io
        import tokenize

        return tokenize.TextIOWrapper(io.BytesIO(data)).read()  # honours a coding: line
    except (SyntaxError, UnicodeDecodeError, LookupError):
        return None


@functools.lru_cache(maxsize=256)
def _module_bindings(path: str, stamp: tuple[int, int]) -> _Bindings | str:
    """The bindings of the source file at ``path`` (cached per size and mtime), or why not."""
    text = module_source(path)
    if text is None:
        return "its source cannot be read"
    try:
        tree = ast.parse(text, path)
    except SyntaxError as exc:
        return f"SyntaxError: {exc.msg} (line {exc.lineno})"
    except ValueError as exc:  # null bytes
        return f"ValueError: {exc}"
    return _bindings(tree.body, tree)


def _bindings_of(path: str) -> _Bindings | str:
    try:
        st = os.stat(path)
    except OSError as exc:
        return f"it cannot be read ({exc.strerror})"
    return _module_bindings(path, (st.st_size, st.st_mtime_ns))


def attribute_status(location: ModuleLocation, attribute: str,
                     want: Literal["any", "callable", "class"] = "callable"
                     ) -> tuple[AttributeStatus, str]:
    """Whether ``attribute`` (``"f"`` or ``"Class.method"``) exists in the located module.

    Returns the status and a phrase saying why, for messages.  ``want``:
    ``callable`` reports an attribute bound only to literal values
    (``x = 42``) as ``not-callable``; ``class`` reports one bound only by
    ``def`` as ``not-a-class``.  A module whose source does not compile
    (a ``SyntaxError``) is ``unimportable``: importing it fails the same way.
    """
    if location.found == "missing":
        return "missing", f"module {location.module} is not found ({location.why})"
    first, _, rest = attribute.partition(".")
    if location.loaded is not None and isinstance(getattr(location.loaded, "__dict__", None), dict):
        namespace = location.loaded.__dict__
        if first in namespace:
            value = namespace[first]  # read from the dict: no descriptor, no __getattr__ runs
            if not rest and want == "callable" and not callable(value):
                return "not-callable", (f"{location.module}.{first} is a "
                                        f"{type(value).__name__}, not a callable")
            if not rest and want == "class" and not isinstance(value, type):
                return "not-a-class", (f"{location.module}.{first} is a "
                                       f"{type(value).__name__}, not a class")
            return "defined", "imported already"
        if "__getattr__" in namespace:
            return "unknown", "the module defines __getattr__"
    if location.found != "source" or location.file is None:
        return "unknown", f"module {location.module} is not Python source ({location.found})"
    bindings = _bindings_of(location.file)
    if isinstance(bindings, str):
        return "unimportable", f"module {location.module} cannot be imported: {bindings}"
    if bindings.fatal:
        return "unimportable", f"module {location.module} cannot be imported: {bindings.fatal}"
    return _status_in(bindings, first, rest, location.module, want)


def _status_in(bindings: _Bindings, first: str, rest: str, where: str,
               want: str) -> tuple[AttributeStatus, str]:
    kinds = bindings.names.get(first)
    if kinds is None:
        if bindings.dynamic:
            return "unknown", f"{where} may bind it at run time ({bindings.dynamic})"
        close = _close(first, bindings.names)
        return "missing", f"{where} has no attribute {first!r}{close}"
    if rest:
        inner = bindings.classes.get(first) if kinds == {"class"} else None
        if inner is None:
            return "unknown", f"{where}.{first} is not a class defined there"
        head, _, tail = rest.partition(".")
        return _status_in(inner, head, tail, f"{where}.{first}", want)
    if want == "callable" and kinds == {"literal"}:
        return "not-callable", f"{where}.{first} is assigned a literal value, not a callable"
    if want == "class" and kinds == {"def"}:
        return "not-a-class", f"{where}.{first} is a function (def), not a class"
    return "defined", ""


def _close(name: str, names: dict[str, Any]) -> str:
    import difflib

    found = difflib.get_close_matches(name, list(names), n=1)
    return f" (did you mean {found[0]!r}?)" if found else ""
