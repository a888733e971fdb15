"""The registrations a distribution's Python files make, read from their syntax trees.

Recognised, under any import alias (``from torch.library import Library``,
``import torch.library as tl``, ``register_fake = torch.library.register_fake``
in one module and ``from ._ops import register_fake`` in another):

* ``torch.library.Library(ns, kind[, key])`` (and ``_scoped_library``), and
  its methods ``define``, ``impl``, ``_register_fake``, ``fallback``,
  ``_register_torch_dispatch_rule``;
* ``torch.library.define``, ``impl`` (both forms: ``impl("ns::op", types)``
  and ``impl(lib, name, key)``), ``register_kernel``, ``register_fake``,
  ``impl_abstract``, ``register_autograd``, ``register_vmap``,
  ``register_autocast``, ``register_torch_dispatch``, ``custom_op``,
  ``triton_op`` (``torch.library`` or ``torch._library``), and the methods
  of what ``custom_op`` returns (``@my_op.register_fake``, ...);
* ``torch._custom_ops.custom_op`` (the deprecated API);
* ``torch.ops.load_library(path)`` / ``torch.classes.load_library(path)``.

Arguments are evaluated by :mod:`opregistry.scan.pyvalues` (constants,
f-strings, ``%`` and ``.format``, names across the distribution's modules,
paths built from ``__file__``).  What cannot be read leaves the registration
``unresolved`` with the reason; a call of anything else is not a
registration.  Nothing is imported or run.
"""

from __future__ import annotations

import ast
import bisect
import os
import re

import attrs
from typing import Any, Callable, Collection, Iterable, Iterator, Mapping, Sequence

from ..foreign import Registration
from ..keys import autocast_key, canonical_key
from .pyvalues import (LIBRARY_CTORS, Func, Index, Inferred, Lib, ModuleSource, Op, PathValue, Ref,
                       Scope, Str, Unknown, Value, bind_arguments, decide, unroll)

__all__ = ["scan_modules", "importers", "API_PREFIXES", "API_NAMES"]

#: modules whose functions of the names below are torch's registration API
API_PREFIXES = frozenset({"torch.library", "torch._library", "torch._library.custom_ops",
                          "torch._library.triton", "torch._custom_ops", "torch.ops",
                          "torch.classes"})
#: the names a registration call can be spelt with (functions and methods)
API_NAMES = frozenset({"Library", "_scoped_library", "define", "impl", "impl_abstract",
                       "register_kernel", "register_fake", "register_autograd", "register_vmap",
                       "register_autocast", "register_torch_dispatch", "custom_op", "triton_op",
                       "load_library", "_register_fake", "fallback",
                       "_register_torch_dispatch_rule"})
#: string literals and comments, each a whole (a ``#`` in a string is no comment)
_NOT_CODE = re.compile(  # each loop unrolled: a run of plain bytes taken at once
    rb'"""[^"\\]*(?:(?:\\.|"(?!""))[^"\\]*)*"""|' rb"'''[^'\\]*(?:(?:\\.|'(?!''))[^'\\]*)*'''|"
    rb'"[^"\\\r\n]*(?:\\.[^"\\\r\n]*)*"|' rb"'[^'\\\r\n]*(?:\\.[^'\\\r\n]*)*'|#[^\r\n]*",
    re.DOTALL)  # an escaped line break is part of its string
_QUALNAME = re.compile(r"([A-Za-z_]\w*)::([A-Za-z_]\w*)(?:\.([A-Za-z_]\w*))?\Z")
_NAME = re.compile(r"([A-Za-z_]\w*)(?:\.([A-Za-z_]\w*))?\Z")
_FUNCTION_KEYS = {"register_fake": "Meta", "impl_abstract": "Meta", "register_autograd": "Autograd",
                  "register_vmap": "FuncTorchBatched", "_register_fake": "Meta"}
_LIB_METHODS = frozenset({"define", "impl", "_register_fake", "fallback",
                          "_register_torch_dispatch_rule"})
_OP_METHODS = frozenset({"register_fake", "register_kernel", "register_autograd", "register_vmap",
                         "register_autocast", "register_torch_dispatch", "impl", "impl_abstract"})


def _api(path: str) -> str | None:
    """The short name of torch's registration function at ``path``, or ``None``."""
    if path in LIBRARY_CTORS:
        return "Library"
    module, _, name = path.rpartition(".")
    if module not in API_PREFIXES:
        return None
    if name == "load_library":
        return name if module in ("torch.ops", "torch.classes") else None
    if name in _FUNCTION_KEYS or name in ("define", "impl", "register_kernel", "register_autocast",
                                          "register_torch_dispatch", "custom_op", "triton_op"):
        return name
    return None


def _arg(call: ast.Call, pos: int | None, name: str | None) -> ast.AST | None:
    """Argument ``pos`` (positional) or ``name`` (keyword) of ``call``, if given plainly."""
    if pos is not None and pos < len(call.args):
        if not any(isinstance(a, ast.Starred) for a in call.args[: pos + 1]):
            return call.args[pos]
        return None
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    return None


class _Found:
    """The registrations of one call site, and how to read its arguments."""

    def __init__(self, index: Index, scope: Scope, call: ast.Call, at_import: bool,
                 conditional: bool = False) -> None:
        self.index, self.scope, self.call, self.at_import = index, scope, call, at_import
        self.conditional = conditional
        self.out: list[Registration] = []

    def value(self, pos: int | None, name: str | None) -> Value | None:
        node = _arg(self.call, pos, name)
        return None if node is None else self.index.evaluate(node, self.scope)

    def emit(self, kind: str, api: str, **fields: object) -> None:
        module = self.scope.module
        self.out.append(Registration(kind=kind, api=api, module=module.name, file=module.file,
                                     line=self.call.lineno, at_import=self.at_import,
                                     conditional=self.conditional,
                                     **fields))  # type: ignore[arg-type]

    def op(self, value: Value | None, lib: Lib | None = None) -> dict[str, object]:
        """The op fields (namespace, name, overload, unresolved) of an op argument."""
        if isinstance(value, Op):
            value = Str(value.qualname)
        if isinstance(value, Str):
            m = _QUALNAME.match(value.text)
            if m:
                return {"namespace": m.group(1), "name": m.group(2), "overload": m.group(3) or ""}
            m = _NAME.match(value.text)
            if m and lib is not None:
                return {"namespace": lib.namespace, "name": m.group(1),
                        "overload": m.group(2) or "", "unresolved": lib.unresolved}
            return {"namespace": None, "unresolved": f"{value.text!r} is not an op name"}
        why = value.why if isinstance(value, Unknown) else "the op is not given plainly"
        return {"namespace": lib.namespace if lib else None,
                "unresolved": f"the op name: {why}"}

    def key_list(self, pos: int | None, name: str | None, default: str
                 ) -> list[tuple[str | None, str]]:
        """``(key, unresolved)`` for each device type / key the argument names."""
        node = _arg(self.call, pos, name)
        if node is None or (isinstance(node, ast.Constant) and node.value is None):
            return [(default, "")]
        items = node.elts if isinstance(node, (ast.List, ast.Tuple, ast.Set)) else [node]
        out: list[tuple[str | None, str]] = []
        for item in items:
            value = self.index.evaluate(item, self.scope)
            if isinstance(value, Str):
                out.append((default if value.text == "default" else canonical_key(value.text), ""))
            else:
                why = value.why if isinstance(value, Unknown) else "not a string"
                out.append((None, f"the dispatch key: {why}"))
        return out


def _kernels(found: _Found, api: str, op: dict[str, object],
             keys: Iterable[tuple[str | None, str]]) -> None:
    for key, why in keys:
        fields = dict(op)
        if why:
            fields["unresolved"] = "; ".join(w for w in (str(fields.get("unresolved", "")), why)
                                            if w)
        found.emit("kernel", api, key=key, **fields)  # type: ignore[arg-type]


def _schema_of(value: Value | None) -> tuple[str | None, str]:
    if value is None or isinstance(value, Inferred):
        return None, ""  # none given, or inferred from type hints at run time
    if isinstance(value, Str):
        return value.text, ""
    return None, f"the schema: {value.why if isinstance(value, Unknown) else 'not a string'}"


def _define_on_lib(found: _Found, lib: Lib) -> None:
    schema = found.value(0, "schema")
    if isinstance(schema, Inferred) and schema.name:  # name + infer_schema(fn)
        found.emit("op", "Library.define", **found.op(Str(schema.name), lib))
        return
    if isinstance(schema, Str):
        head, paren, rest = schema.text.partition("(")
        name = head.strip()
        m = _QUALNAME.match(name) or _NAME.match(name)
        if paren and m and lib.namespace is not None:
            fields = found.op(Str(name), lib)
            found.emit("op", "Library.define", schema="(" + rest, **fields)  # type: ignore[arg-type]
            return
        if not paren or not m:
            found.emit("op", "Library.define", namespace=lib.namespace,
                       unresolved=f"{schema.text[:60]!r} is not a schema")
            return
    why = schema.why if isinstance(schema, Unknown) else "no schema given"
    found.emit("op", "Library.define", namespace=lib.namespace,
               unresolved="; ".join(w for w in (lib.unresolved, f"the schema: {why}") if w))


def _lib_method(found: _Found, lib: Lib, method: str) -> None:
    api = f"Library.{method}"
    if method == "define":
        _define_on_lib(found, lib)
    elif method == "impl":
        op = found.op(found.value(0, "op_name"), lib)
        _kernels(found, api, op, found.key_list(2, "dispatch_key",
                                                lib.key or "CompositeImplicitAutograd"))
    elif method == "_register_fake":
        found.emit("kernel", api, key="Meta", **found.op(found.value(0, "op_name"), lib))
    elif method == "fallback":
        _kernels(found, api, {"namespace": lib.namespace, "unresolved": lib.unresolved},
                 found.key_list(1, "dispatch_key", lib.key or "CompositeImplicitAutograd"))
    elif method == "_register_torch_dispatch_rule":
        found.emit("kernel", api, key="TorchDispatch", **found.op(found.value(0, "op_name"), lib))


def _op_method(found: _Found, op: Op, method: str) -> None:
    api = f"custom_op.{method}"
    fields = found.op(op)
    if method in ("register_fake", "impl_abstract"):
        found.emit("kernel", api, key="Meta", **fields)
    elif method in ("register_kernel", "impl"):
        _kernels(found, api, fields, found.key_list(0, "device_types",
                                                    "CompositeExplicitAutograd"))
    elif method == "register_autograd":
        found.emit("kernel", api, key="Autograd", **fields)
    elif method == "register_vmap":
        found.emit("kernel", api, key="FuncTorchBatched", **fields)
    elif method == "register_autocast":
        _autocast(found, api, fields, 0)
    elif method == "register_torch_dispatch":
        found.emit("kernel", api, key="TorchDispatch", **fields)


def _autocast(found: _Found, api: str, fields: dict[str, object], pos: int) -> None:
    device = found.value(pos, "device_type")
    key = autocast_key(device.text) if isinstance(device, Str) else None
    if key is None:
        why = (f"{device.text!r} has no autocast key" if isinstance(device, Str)
               else "the device type is not a constant")
        fields = {**fields, "unresolved": "; ".join(
            w for w in (str(fields.get("unresolved", "")), why) if w)}
    found.emit("kernel", api, key=key, **fields)  # type: ignore[arg-type]


def _library(found: _Found) -> Lib:
    ns, kind, key = found.value(0, "ns"), found.value(1, "kind"), found.value(2, "dispatch_key")
    why = []
    if not isinstance(ns, Str):
        why.append(f"the namespace: {ns.why if isinstance(ns, Unknown) else 'not given'}")
    if not (isinstance(kind, Str) and kind.text in ("DEF", "FRAGMENT", "IMPL")):
        why.append("the kind (DEF, FRAGMENT or IMPL) is not a constant")
    known = isinstance(kind, Str) and kind.text in ("DEF", "FRAGMENT", "IMPL")
    return Lib(ns.text if isinstance(ns, Str) else None,
               kind.text if known else None,  # type: ignore[union-attr]
               canonical_key(key.text) if isinstance(key, Str) and key.text else None,
               "; ".join(why))


def _custom_op(found: _Found, api: str, path: str) -> None:
    fields = found.op(found.value(0, "qualname" if path.startswith("torch._custom_ops")
                                  else "name"))
    schema_arg = "manual_schema" if path.startswith("torch._custom_ops") else "schema"
    schema, _ = _schema_of(found.value(None, schema_arg))  # none: inferred from type hints
    found.emit("op", path, schema=schema, **fields)
    if path.startswith("torch._custom_ops"):
        return  # the deprecated API registers its kernels through .impl(...)
    keys = ([("CompositeExplicitAutograd", "")] if api == "triton_op"
            else found.key_list(None, "device_types", "CompositeExplicitAutograd"))
    _kernels(found, path, fields, keys)


def _function(found: _Found, api: str, path: str) -> None:
    if api == "Library":
        lib = _library(found)
        found.emit(lib.kind or "library", "torch.library.Library",
                   namespace=lib.namespace, key=lib.key, unresolved=lib.unresolved)
        return
    if api in ("custom_op", "triton_op"):
        _custom_op(found, api, path)
        return
    if api == "load_library":
        target = found.value(0, "path")
        if isinstance(target, (Str, PathValue)):
            text = target.text if isinstance(target, Str) else target.path
            found.emit("load_library", path, how=text)
        else:
            why = target.why if isinstance(target, Unknown) else "no path given"
            found.emit("load_library", path, unresolved=f"the library's path: {why}")
        return
    _function_kernel(found, api, path)


def _function_kernel(found: _Found, api: str, path: str) -> None:
    first = found.value(0, "qualname" if api in ("define", "impl") else "op")
    if api == "define":
        schema, why = _schema_of(found.value(1, "schema"))
        fields = found.op(first)
        if why:
            fields["unresolved"] = "; ".join(w for w in (str(fields.get("unresolved", "")), why)
                                            if w)
        found.emit("op", path, schema=schema, **fields)  # type: ignore[arg-type]
    elif api == "impl" and isinstance(first, Lib):
        _kernels(found, path, found.op(found.value(1, "name"), first),
                 found.key_list(2, "dispatch_key", first.key or "CompositeImplicitAutograd"))
    elif api == "impl":
        _kernels(found, path, found.op(first), found.key_list(1, "types",
                                                              "CompositeExplicitAutograd"))
    elif api == "register_kernel":
        _kernels(found, path, found.op(first), found.key_list(1, "device_types",
                                                              "CompositeExplicitAutograd"))
    elif api in _FUNCTION_KEYS:
        found.emit("kernel", path, key=_FUNCTION_KEYS[api], **found.op(first))
    elif api == "register_autocast":
        _autocast(found, path, found.op(first), 1)
    elif api == "register_torch_dispatch":
        found.emit("kernel", path, key="TorchDispatch", **found.op(first))


def _value_hook(index: Index) -> None:
    """Let the evaluator see ``Library(...)`` and ``custom_op(...)`` as values."""
    def hook(call: ast.Call, scope: Scope, path: str) -> Value | None:
        api = _api(path)
        if api is None:
            return None
        found = _Found(index, scope, call, True)
        if api == "Library":
            return _library(found)
        if api in ("custom_op", "triton_op"):
            fields = found.op(found.value(0, "name"))
            if fields.get("name") and not fields.get("unresolved"):
                return Op(f"{fields['namespace']}::{fields['name']}"
                          + (f".{fields['overload']}" if fields.get("overload") else ""))
        return None

    index.call_hook = hook


#: ``ast.NodeVisitor.visit_Constant``: it only dispatches to ``visit_Num`` and the like,
#: which no walker here defines
_SHIM = getattr(ast.NodeVisitor, "visit_Constant", None)


class _Flow(ast.NodeVisitor):
    """The control flow of the walk: which statements run under a condition, and in order.

    A statement under ``if`` / ``while`` / ``except`` / ``match`` may not run:
    its registrations are ``conditional``.  While a function's body is
    followed for one call (``enter_functions`` false), it is read in order:
    assignments update the names, and an ``if`` on known values takes one
    branch.
    """

    index: Index
    scope: Scope
    enter_functions: bool
    conditional: int
    #: node class -> the method that visits it, per walker class (``visit`` looks it up by
    #: name for every node: a large package has millions)
    _methods: dict[type, Callable[..., Any]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._methods = {}

    def visit(self, node: ast.AST) -> Any:
        methods = self._methods
        method = methods.get(node.__class__)
        if method is None:
            method = getattr(type(self), "visit_" + node.__class__.__name__, None)
            if method is None or method is _SHIM:  # ast's visit_Constant: only for visit_Num
                method = type(self).generic_visit
            methods[node.__class__] = method
        return method(self, node)

    def generic_visit(self, node: ast.AST) -> None:
        """``ast.NodeVisitor.generic_visit`` without its generator (same order)."""
        for field in node._fields:
            value = getattr(node, field, None)
            if isinstance(value, list):
                for item in value:
                    if isinstance(item, ast.AST):
                        self.visit(item)
            elif isinstance(value, ast.AST):
                self.visit(value)

    def _guarded(self, blocks: Iterable[Iterable[ast.AST]]) -> None:
        self.conditional += 1
        try:
            for block in blocks:
                for stmt in block:
                    self.visit(stmt)
        finally:
            self.conditional -= 1

    def visit_If(self, node: ast.If) -> None:
        self.visit(node.test)
        if self.enter_functions:
            self._guarded([node.body, node.orelse])
            return
        # a followed function's body runs in order: a test on known values picks its branch
        verdict = decide(self.index, node.test, self.scope)
        if verdict is not None:
            for stmt in node.body if verdict else node.orelse:
                self.visit(stmt)
            return
        before = self.scope.state()
        self._guarded([node.body])
        after_body = self.scope.state()
        self.scope.restore(before)
        self._guarded([node.orelse])
        after = self.scope.state()
        for name in set(after) | set(after_body):
            if after.get(name) != after_body.get(name):
                after[name] = Unknown(f"{name} depends on a condition in {self.scope.label}")
        self.scope.restore(after)

    def visit_Assign(self, node: ast.Assign) -> None:
        self.generic_visit(node)
        if not self.enter_functions and len(node.targets) == 1 and isinstance(
                node.targets[0], ast.Name):
            self.scope.assign(node.targets[0].id, self.index.evaluate(node.value, self.scope))

    def visit_While(self, node: ast.While) -> None:
        self.visit(node.test)
        self._guarded([node.body, node.orelse])

    def visit_Try(self, node: ast.Try) -> None:
        for stmt in node.body:
            self.visit(stmt)
        self._guarded([node.handlers, node.orelse])
        for stmt in node.finalbody:
            self.visit(stmt)

    visit_TryStar = visit_Try

    def visit_Match(self, node: ast.Match) -> None:
        self.visit(node.subject)
        self._guarded([node.cases])


_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


class _Walker(_Flow):
    """Visits one module, scope by scope, and collects what its calls register.

    A call is evaluated only when the name it calls is one of torch's
    registration names (:data:`API_NAMES`) or an alias the distribution
    binds at module level (``aliases``): evaluating every call of a large
    package would cost seconds, and a call of ``np.zeros`` registers nothing.
    """

    def __init__(self, index: Index, module: ModuleSource, aliases: frozenset[str],
                 scope: Scope | None = None, at_import: bool = True,
                 enter_functions: bool = True) -> None:
        self.index = index
        self.module = module
        self.aliases = aliases
        self.scope = scope or index.scope_of(module)
        self.at_import = at_import
        #: ``False`` while following a call: a nested function's body runs when it is called
        self.enter_functions = enter_functions
        #: how many ``if`` / ``while`` / ``except`` / ``match`` blocks hold the current statement
        self.conditional = 0
        self.found: list[Registration] = []

    def _may_register(self, func: ast.AST) -> bool:
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        return name is not None and (name in API_NAMES or name in self.aliases)

    def visit_Call(self, node: ast.Call) -> None:
        self._classify(node)
        self.generic_visit(node)

    def visit_Module(self, node: ast.Module) -> None:
        words = self.index.words
        for stmt in node.body:  # a def or class has its decorators above its lines
            if isinstance(stmt, _DEFINITIONS) or _may_hold(self.module, stmt, words):
                self.visit(stmt)

    def visit_For(self, node: ast.For) -> None:
        scopes = unroll(node, self.scope)
        if scopes is None:
            self.generic_visit(node)
            return
        self.visit(node.iter)
        for scope in scopes:  # the body once per item: names built from the loop variable
            self._enter(scope, node.body, at_import=self.at_import)
        for stmt in node.orelse:
            self.visit(stmt)

    def _classify(self, node: ast.Call) -> None:
        func = node.func
        if not self._may_register(func):
            if isinstance(func, ast.Name) or isinstance(func, ast.Attribute):
                callee = self.index.evaluate(func, self.scope) if self._calls_local(func) \
                    else None
                if isinstance(callee, Func):
                    self._follow(callee, node, ())
            return
        found = _Found(self.index, self.scope, node, self.at_import, self.conditional > 0)
        base = self.index.evaluate(func.value, self.scope) if isinstance(func, ast.Attribute) \
            else None
        if isinstance(base, Lib) and func.attr in _LIB_METHODS:  # type: ignore[union-attr]
            _lib_method(found, base, func.attr)  # type: ignore[union-attr]
        elif isinstance(base, Op) and func.attr in _OP_METHODS:  # type: ignore[union-attr]
            _op_method(found, base, func.attr)  # type: ignore[union-attr]
        else:
            callee = self.index.evaluate(func, self.scope)
            api = _api(callee.path) if isinstance(callee, Ref) else None
            if api is not None:
                _function(found, api, callee.path)  # type: ignore[union-attr]
            elif isinstance(callee, Func):
                self._follow(callee, node, ())
        self.found += found.out

    def _calls_local(self, func: ast.AST) -> bool:
        """Whether ``func`` names one of the distribution's functions that registers."""
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        return name in self.index.registering

    def _follow(self, func: Func, call: ast.Call, extra: tuple[Value, ...]) -> None:
        """Walk ``func``'s body with the call's arguments: what it registers, at the call site."""
        if func.node.name not in self.index.registering or self.index.depth >= Index.MAX_DEPTH:
            return
        inner = bind_arguments(func, call, self.scope, extra)
        walker = _Walker(self.index, func.scope.module, self.aliases, inner, self.at_import,
                         enter_functions=False)
        self.index.depth += 1
        try:
            for stmt in func.node.body:
                walker.visit(stmt)
        finally:
            self.index.depth -= 1
        site = self.scope.module
        for reg in walker.found:
            self.found.append(attrs.evolve(
                reg, module=site.name, file=site.file, line=call.lineno, at_import=self.at_import,
                conditional=reg.conditional or self.conditional > 0,
                how=reg.how or f"through {func.label} ({reg.source})"))

    def _decorators(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        for deco in node.decorator_list:
            if isinstance(deco, ast.Attribute) and deco.attr in _OP_METHODS:
                base = self.index.evaluate(deco.value, self.scope)
                if isinstance(base, Op):  # @my_op.register_fake, no call
                    call = ast.Call(func=deco, args=[], keywords=[], lineno=deco.lineno,
                                    col_offset=deco.col_offset)
                    found = _Found(self.index, self.scope, call, self.at_import,
                                   self.conditional > 0)
                    _op_method(found, base, deco.attr)
                    self.found += found.out
            self.visit(deco)
            self._apply(deco, node)

    def _apply(self, deco: ast.expr, node: ast.AST) -> None:
        """A decorator that is the distribution's own function, applied to the function below."""
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return
        head = deco.func if isinstance(deco, ast.Call) else deco
        name = head.attr if isinstance(head, ast.Attribute) else getattr(head, "id", "")
        if name not in self.index.registering and name not in self.index.returned:
            return
        value = self.index.evaluate(deco, self.scope)
        if isinstance(value, Func):
            call = ast.Call(func=deco, args=[], keywords=[], lineno=deco.lineno,
                            col_offset=deco.col_offset)
            self._follow(value, call, (Func(node, self.scope),))

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        if not isinstance(node, ast.Lambda):
            self._decorators(node)
        args = node.args
        for default in [*args.defaults, *(d for d in args.kw_defaults if d is not None)]:
            self.visit(default)
        body = node.body if isinstance(node.body, list) else [node.body]
        if not self.enter_functions or not _may_hold(self.module, body, self.index.words):
            return
        params = [a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]]
        params += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
        body = node.body if isinstance(node.body, list) else [ast.Expr(node.body)]
        label = getattr(node, "name", "a lambda")
        self._enter(Scope(self.index, self.module, body, self._closure(), f"function {label}",
                          params), body, at_import=False)

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function  # type: ignore[assignment]

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._decorators(node)
        if not self.enter_functions:
            return
        for child in [*node.bases, *(k.value for k in node.keywords)]:
            self.visit(child)
        if not _may_hold(self.module, node.body, self.index.words):
            return
        scope = Scope(self.index, self.module, node.body, self.scope, f"class {node.name}",
                      is_class=True)
        self._enter(scope, node.body, at_import=self.at_import)

    def _closure(self) -> Scope:
        scope = self.scope
        while scope.is_class and scope.parent is not None:
            scope = scope.parent  # a method does not see its class body's names
        return scope

    def _enter(self, scope: Scope, body: list[ast.stmt], *, at_import: bool) -> None:
        saved = self.scope, self.at_import
        self.scope, self.at_import = scope, at_import
        try:
            for stmt in body:
                self.visit(stmt)
        finally:
            self.scope, self.at_import = saved


def _aliases(index: Index, modules: Iterable[ModuleSource]) -> frozenset[str]:
    """Module-level names bound to a registration function, a ``Library`` or a custom op.

    ``register_fake = torch.library.register_fake``, ``lib = Library(...)``,
    ``from torch.library import custom_op as co``: a file that imports one of
    these names (``from .._ops import register_kernel``) may register without
    naming torch at all.
    """
    out = set()
    for module in modules:
        scope = index.scope_of(module)
        for name, found in scope.names.items():
            if not any(_mentions_api(b) for b in found):
                continue
            value = scope.lookup(name)
            if isinstance(value, (Lib, Op)) or (isinstance(value, Ref) and _api(value.path)):
                out.add(name)
    return frozenset(out)


def _functions(index: Index, modules: Iterable[ModuleSource], aliases: frozenset[str]
               ) -> frozenset[str]:
    """Which of the distribution's functions may register (by name): those the walk follows.

    A function whose body calls a registration name (``def register_op(name):
    torch.library.define(name, ...)``) registers what its callers name;
    ``index.returned`` names the functions that return such a function (a
    decorator factory: ``register_custom_op = _register_custom_op(lib)``).
    Returns the names of those defined at module level: another module that
    names one of them may register through it.
    """
    names = API_NAMES | aliases
    # a body whose lines name no registration name and define no function marks nothing
    inside, defines = _words(names | {"def"}), _words(["def"])
    registering: set[str] = set()
    returned: set[str] = set()
    exported: set[str] = set()
    for module in modules:
        if module.tree is None:
            continue
        top = {id(n) for n in module.tree.body}
        # one walk, with the chain of enclosing functions: a registration call marks them all
        stack: list[tuple[ast.AST, tuple[ast.AST, ...]]] = [(n, ()) for n in module.tree.body]
        while stack:
            node, outer = stack.pop()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if outer:
                    returned.add(outer[-1].name)  # type: ignore[attr-defined]
                # decorators and defaults run where the function is defined, not in it
                stack.extend((child, outer) for child in [*node.decorator_list,
                                                          *node.args.defaults])
                if _may_hold(module, node.body, inside):
                    stack.extend((child, outer + (node,)) for child in node.body)
                continue
            if not outer and not _may_hold(module, node, defines):
                continue  # outside any function, a call marks nothing: only a def inside counts
            if isinstance(node, ast.Call) and outer and (
                    getattr(node.func, "attr", None) in names
                    or getattr(node.func, "id", None) in names):
                for func in outer:
                    registering.add(func.name)  # type: ignore[attr-defined]
                    if id(func) in top:
                        exported.add(func.name)  # type: ignore[attr-defined]
            stack.extend((child, outer) for child in ast.iter_child_nodes(node))
    returned &= registering
    index.registering = frozenset(registering)
    index.returned = frozenset(returned | _factories(modules, returned))
    return frozenset(exported | _factories(modules, returned))


def _factories(modules: Iterable[ModuleSource], returned: set[str]) -> set[str]:
    """Module-level names bound to what a decorator factory returns (``reg = factory(lib)``)."""
    out = set()
    for module in modules:
        for node in module.tree.body if module.tree is not None else ():
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                func = node.value.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name in returned:
                    out.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return out


def _mentions_api(binding: tuple[object, str]) -> bool:
    what, how = binding
    if how == "ref":
        return str(what).rpartition(".")[2] in API_NAMES
    if how == "expr":
        return any((isinstance(n, ast.Name) and n.id in API_NAMES)
                   or (isinstance(n, ast.Attribute) and n.attr in API_NAMES)
                   for n in ast.walk(what))  # type: ignore[arg-type]
    return False


class Words:
    """Names to search a module's text for as whole words (:func:`_names_word`), and the
    substrings it is searched for: the prefix each group of names with the same first four
    characters shares (``register_`` for the six ``register_*`` of :data:`API_NAMES`,
    ``impl`` for ``impl`` and ``impl_abstract``), a name alone as itself, and one that
    holds another searched for as that one.  Each search is a pass over the text; the
    module texts of a large site are tens of megabytes."""

    __slots__ = ("anchors", "whole")

    def __init__(self, names: Iterable[bytes]) -> None:
        self.whole = frozenset(n for n in names if n)  # an empty word would match forever
        groups: dict[bytes, list[bytes]] = {}
        for word in self.whole:
            groups.setdefault(word[:4], []).append(word)
        shared = {os.path.commonprefix(group) for group in groups.values()}
        if len(shared) <= 64:  # beyond, the pairs' comparisons would cost more than passes
            shared = {a for a in shared if not any(o != a and o in a for o in shared)}
        self.anchors = tuple(sorted(shared))


def _words(names: Iterable[str]) -> Words:
    return Words(n.encode() for n in names)


def _may_register(text: bytes) -> bool:
    """Whether a module's text names torch and, in its code, one of :data:`API_NAMES` (or
    ``library``).

    Names in comments, docstrings and other string literals do not count: in
    transformers, 116 modules name torch and "define", "impl" or "fallback"
    in prose, two in code; parsing the 116 took seconds.  Nor does a name
    followed by ``.`` or ``import``: an object or a module of that name, not
    torch's function (``self.impl.forward(...)``,
    ``from vllm.model_executor.custom_op import CustomOp``: 114 of sglang's
    204 modules that pass the rest); ``library`` always counts
    (``torch.library.define``).
    """
    if b"torch" not in text or not _names_word(text, _API_WORDS):
        return False
    code = _NOT_CODE.sub(b" ", text)
    return any(word == b"library" or not _NOT_A_CALL.match(code, after)
               for word, after in _whole_words(code, _API_CODE_WORDS))


_API_WORDS = _words(API_NAMES)
#: ... or ``library`` (``torch.library``, ``getattr(library, name)``), in code
_API_CODE_WORDS = _words(API_NAMES | {"library"})
_WORD_BYTES = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
_WORD_END = re.compile(rb"\w*")  # bytes: ASCII letters, digits and _, as _WORD_BYTES
#: what follows a name that is an object or a module, not a function called or bound
_NOT_A_CALL = re.compile(rb"[ \t]*(?:\.|import\b)")


def _names_word(text: bytes, words: Words, start: int = 0, stop: int | None = None) -> bool:
    """Whether ``text[start:stop]`` has one of ``words`` as a whole word
    (``rb"\\b(?:a|b)\\b"``), faster than the regex: each of the words' anchors found by
    ``bytes.find``, the word around it read where it is found (an alternation reads
    ~25 MB/s; vllm's 2,000 modules were searched 36,000 times)."""
    return next(_whole_words(text, words, start, stop), None) is not None


def _whole_words(text: bytes, words: Words, start: int = 0, stop: int | None = None
                 ) -> Iterator[tuple[bytes, int]]:
    """``(word, offset after it)`` of each of ``words`` found in ``text[start:stop]`` as a
    whole word (:func:`_names_word`), anchor by anchor."""
    stop = len(text) if stop is None else stop
    whole = words.whole
    for anchor in words.anchors:
        at = text.find(anchor, start, stop)
        while at >= 0:
            first = at
            while first > 0 and text[first - 1] in _WORD_BYTES:
                first -= 1
            after = _WORD_END.match(text, at + len(anchor)).end()  # type: ignore[union-attr]
            if first >= start and after <= stop and text[first:after] in whole:
                yield text[first:after], after
            at = text.find(anchor, after, stop)


def _may_hold(module: ModuleSource, nodes: Sequence[ast.AST] | ast.AST,
              words: Words | None) -> bool:
    """Whether the lines of ``nodes`` (a body, or one node) name one of ``words`` (``None``:
    anything may count).

    A call registers only through a name: torch's (:data:`API_NAMES`), an
    alias, or one of the distribution's functions that registers; a
    function body or class body whose lines name none of them (in code,
    comments or strings alike) holds no registration, and the walks skip it
    without visiting its nodes -- most of a large package's code.
    """
    if words is None:
        return True
    if isinstance(nodes, ast.AST):
        span = module.span(nodes)
    else:
        span = module.span(nodes[0], nodes[-1]) if nodes else None
    if span is None:
        return True
    starts, ends = _occurrences(module, words)
    i = bisect.bisect_left(starts, span[0])  # the first word at or after the span's start
    return i < len(starts) and ends[i] <= span[1]  # words do not overlap: the first decides


def _occurrences(module: ModuleSource, words: Words) -> tuple[list[int], list[int]]:
    """Where each of ``words`` is in the module's text, as a whole word: its start and end
    offsets, sorted.  Found once per module and set of words (a pass per anchor), then
    looked up for every body a walk asks about, instead of a search of each body's lines,
    which read a nested body's lines again at every level above it (vllm, sglang and
    flashinfer: 280,000 calls of ``bytes.find`` in all instead of 777,000)."""
    found = module.words_found.get(words)
    if found is None:
        text = module.text or b""
        hits = sorted({(after - len(word), after) for word, after in _whole_words(text, words)})
        module.words_found[words] = found = ([a for a, _ in hits], [b for _, b in hits])
    return found


def scan_modules(modules: dict[str, ModuleSource], texts: Mapping[str, bytes],
                 naming: Collection[str] | None = None) -> list[Registration]:
    """The registrations in the modules of one distribution.

    ``texts``: each module file's bytes.  A module is parsed and walked when
    it names torch and, in its code (not in a comment or a string), one of
    :data:`API_NAMES` or ``library`` (:func:`_may_register`), or uses an alias another
    such module binds (``from .._ops import register_kernel``); any other
    module is parsed only when a walked one needs one of its names.
    ``naming``: the files known to name torch, when the caller has searched
    them already (the others are not searched again).
    """
    index = Index(modules)
    try:
        return _scan(index, modules, texts, naming)
    finally:
        index.release()


def _scan(index: Index, modules: dict[str, ModuleSource], texts: Mapping[str, bytes],
          naming: Collection[str] | None) -> list[Registration]:
    _value_hook(index)
    first = [m for m in modules.values() if (naming is None or m.file in naming)
             and _may_register(texts.get(m.file, b""))]
    aliases = _aliases(index, first)
    helpers = _functions(index, first, aliases)
    index.words = _words(API_NAMES | aliases | index.registering | index.returned)
    chosen = {m.name for m in first}
    second: list[ModuleSource] = []
    if aliases | helpers:
        second = _importing(modules, texts, chosen, _words(aliases | helpers),
                            {m.name.rpartition(".")[2] for m in first})
    found: list[Registration] = []
    for module in sorted([*first, *second], key=lambda m: m.name):
        tree = module.tree
        if tree is None:
            continue
        walker = _Walker(index, module, aliases)
        walker.visit(tree)
        found += walker.found
    return found


def _importing(modules: dict[str, ModuleSource], texts: Mapping[str, bytes], chosen: set[str],
               names: tuple[bytes, ...], sources: set[str]) -> list[ModuleSource]:
    """The modules not ``chosen`` whose text names one of ``names`` (aliases, registering
    functions) and one of the modules that bind them, or of a package that re-exports them.

    ``from quack.dsl import cute_op``: ``quack/dsl/__init__.py`` re-exports
    the helper of ``quack.dsl.torch_library_op``; a module naming the helper
    and ``dsl`` counts too (quack-kernels 0.6.5: 14 of its 16 ``cute_op``
    ops) -- each package found adds its name, until none is left.  Only a
    package's ``__init__`` counts as a re-export: a module that only uses a
    helper adds nothing (executorch 1.5, whose helpers are named ``impl``
    and ``lib``, would otherwise have most of its 3,000 modules parsed).
    """
    naming = [m for m in modules.values()
              if m.name not in chosen and _names_word(texts.get(m.file, b""), names)]
    out: list[ModuleSource] = []
    while naming and sources:
        words = _words(sources)
        found = [m for m in naming if _names_word(texts.get(m.file, b""), words)]
        if not found:
            break
        out += found
        sources = {m.name.rpartition(".")[2] for m in found if m.package == m.name} - sources
        naming = [m for m in naming if m not in found]
    return out


def importers(modules: dict[str, ModuleSource], texts: Mapping[str, bytes],
              target: str) -> list[str]:
    """The modules that import ``target`` (``pkg._C``), read from those whose text names it."""
    word = _words([target.rpartition(".")[2]])
    out = []
    for module in modules.values():
        if not _names_word(texts.get(module.file, b""), word) or module.tree is None:
            continue
        for node in ast.walk(module.tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = module.absolute(node.module, node.level)
                names = [base] + [f"{base}.{a.name}" if base else a.name for a in node.names]
            if target in names:
                out.append(module.name)
                break
    return sorted(out)
