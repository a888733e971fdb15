"""Kernels spread over several modules, read from their source: nothing is imported.

A distribution that keeps one module per device (bitsandbytes'
``backends/<device>/ops.py``) names those modules on its library,
``OpLibrary("quantkit", kernel_modules=["quantkit.backends.cpu", ...])``,
and marks each kernel where it is written::

    from opregistry import kernel

    @kernel("quantkit::quantize", "cpu")
    def quantize_cpu(x, scale): ...

:func:`read_kernel_modules` finds those decorators in the modules' syntax
trees, so that the resolver knows every kernel -- its op, key and
``"module:function"`` reference -- before anything is imported, as if each
had been declared with ``lib.impl(...)`` in the declarations module.  The
module is imported when its kernel is registered.  The decorator's
arguments are read as the scanner of foreign packages reads
``torch.library`` calls (constants, names imported from the package's other
modules, f-strings): :mod:`opregistry.scan.pyvalues`.

What cannot be read is refused with its ``file:line``
(:class:`~opregistry.errors.DeclarationError`): a kernel defined under an
``if`` / ``try`` (say so with ``when=``: a load-time condition, or a
``check`` function), an argument computed at run time, a module that does
not exist.
"""

from __future__ import annotations

import ast
import os
import sys
from typing import Any, Iterable

from .conditions import Condition
from .errors import DeclarationError
from .model import Kernel
from .scan.pyvalues import Index, ModuleSource, Seq, Str

__all__ = ["read_kernel_modules", "locate", "MARKER"]

#: the decorator that marks a kernel in a kernel module
MARKER = "opregistry.kernel"
_COMPOUND = (ast.If, ast.Try, ast.For, ast.While, ast.With, ast.AsyncFor, ast.AsyncWith)
if sys.version_info >= (3, 11):
    _COMPOUND += (ast.TryStar,)  # type: ignore[assignment]
if sys.version_info >= (3, 10):
    _COMPOUND += (ast.Match,)  # type: ignore[assignment]


def locate(module: str) -> str | None:
    """The source file of ``module``, found as the import system would, running no code.

    Packages already imported answer from ``sys.modules``; the others are
    found with :class:`importlib.machinery.PathFinder`, one level at a time,
    without importing them.
    """
    from importlib.machinery import PathFinder

    path: list[str] | None = None
    origin: str | None = None
    parts = module.split(".")
    for i in range(len(parts)):
        name = ".".join(parts[: i + 1])
        found = sys.modules.get(name)
        spec = getattr(found, "__spec__", None) if found is not None else None
        if spec is None:
            spec = PathFinder.find_spec(name, path)
        if spec is None:
            return None
        origin = spec.origin
        path = list(spec.submodule_search_locations or []) or None
    return origin if origin and origin.endswith(".py") else None


def _package_sources(module: str, file: str) -> dict[str, ModuleSource]:
    """The modules of ``module``'s top-level package, for names imported across them."""
    depth = module.count(".") + (1 if file.endswith("__init__.py") else 0)
    root = file
    for _ in range(depth + 1):
        root = os.path.dirname(root)
    top = module.split(".")[0]
    sources = {module: ModuleSource(module, file, file.endswith("__init__.py"))}
    folder = os.path.join(root, top)
    for here, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
        for name in sorted(n for n in names if n.endswith(".py")):
            rel = os.path.relpath(os.path.join(here, name), root)[:-3].split(os.sep)
            if rel[-1] == "__init__":
                rel = rel[:-1]
            dotted = ".".join(rel)
            sources.setdefault(dotted, ModuleSource(dotted, os.path.join(here, name),
                                                    name == "__init__.py"))
    return sources


def _text(value: Any) -> str | None:
    return value.text if isinstance(value, Str) else None


def _keys(value: Any) -> tuple[str, ...] | None:
    if isinstance(value, Str):
        return (value.text,)
    if isinstance(value, Seq) and all(isinstance(v, Str) for v in value.items):
        return tuple(v.text for v in value.items)  # type: ignore[union-attr]
    return None


def _argument(call: ast.Call, position: int, name: str) -> ast.expr | None:
    if len(call.args) > position:
        return call.args[position]
    return next((kw.value for kw in call.keywords if kw.arg == name), None)


def _literal(node: ast.expr | None, what: str, where: str) -> Any:
    if node is None:
        return None
    try:
        return ast.literal_eval(node)
    except ValueError:
        raise DeclarationError(f"{where}: {what}= must be written out (a literal), so that it "
                               f"is read without running the module") from None


class _Reader:
    """The ``@kernel(...)`` decorators of one kernel module."""

    def __init__(self, namespace: str, module: str, file: str) -> None:
        self.namespace, self.module, self.file = namespace, module, file
        self.index = Index(_package_sources(module, file))
        self.source = self.index.modules[module]
        tree = self.source.tree
        if tree is None:
            raise DeclarationError(f"kernel module {module} ({file}) cannot be read: "
                                   f"{self.source.failed}")
        self.tree = tree
        self.scope = self.index.scope_of(self.source)

    def _marker(self, deco: ast.expr) -> ast.Call | None:
        if not isinstance(deco, ast.Call):
            return None
        func = self.index.evaluate(deco.func, self.scope)
        return deco if getattr(func, "path", None) == MARKER else None

    def kernels(self) -> list[Kernel]:
        found = []
        for node in ast.walk(self.tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for deco in node.decorator_list:
                    call = self._marker(deco)
                    if call is not None:
                        found.extend(self._kernels(node, call))
        return found

    def _kernels(self, node: ast.FunctionDef | ast.AsyncFunctionDef, call: ast.Call
                 ) -> list[Kernel]:
        where = f"{self.file}:{call.lineno}"
        if node not in self.tree.body:
            raise DeclarationError(
                f"{where}: @kernel marks {node.name}, which is not defined at the top level of "
                f"{self.module} (under an if, a try or a function body it may not exist): "
                f"define it at the top level, and say when it serves with when= (a "
                f"load-time condition, e.g. when={{'check': 'mypkg.features:has_avx512'}})")
        op = _text(self.index.evaluate(call.args[0], self.scope)) if call.args else None
        keys = _keys(self.index.evaluate(call.args[1], self.scope)) if len(call.args) > 1 \
            else None
        if op is None or keys is None:
            raise DeclarationError(
                f"{where}: @kernel(op, key) on {node.name}: the op ('ns::name') and the key "
                f"(device type or dispatch key, or a list of them) must be constants, or names "
                f"of constants of {self.module.split('.')[0]}, read without running the module")
        qualname = op if "::" in op else f"{self.namespace}::{op}"
        when = Condition.of(_literal(_argument(call, 2, "when"), "when", where))
        priority = _literal(_argument(call, 3, "priority"), "priority", where) or 0
        override = bool(_literal(_argument(call, 4, "override"), "override", where))
        return [Kernel(op=qualname, key=key, fn=f"{self.module}:{node.name}", when=when,
                       priority=priority, override=override, source=where) for key in keys]


def read_kernel_modules(namespace: str, modules: Iterable[str]) -> list[Kernel]:
    """Every kernel the ``@kernel(...)`` decorators of ``modules`` declare, read statically.

    :raises DeclarationError: a module that cannot be found or read, a
        decorator whose arguments cannot be read, a kernel defined where it
        may not exist; each names the file and line.
    """
    found: list[Kernel] = []
    for module in modules:
        file = locate(module)
        if file is None:
            raise DeclarationError(
                f"OpLibrary({namespace!r}, kernel_modules=[..., {module!r}]): no Python module "
                f"{module} is installed (a typo, or a module that is not a .py file)")
        kernels = _Reader(namespace, module, file).kernels()
        if not kernels:
            raise DeclarationError(
                f"OpLibrary({namespace!r}, kernel_modules=[..., {module!r}]): {file} has no "
                f"@opregistry.kernel(...) decorator: mark each kernel with "
                f"@kernel('{namespace}::op', 'cpu')")
        found.extend(kernels)
    return found
