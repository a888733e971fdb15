"""What a Python expression of a scanned distribution evaluates to, read from source alone.

The scanner needs the namespaces and op names that registration calls
receive; real packages build them from module constants (``NS = "mylib"``,
``f"{NS}::op"``), import torch.library's functions under other names
(``register_fake = torch.library.register_fake`` in one module,
``from .._ops import register_fake`` in the next) and keep ``Library``
objects in module variables.  :class:`Index` holds the modules of one
distribution and evaluates expressions lazily, across its modules, to one
of a few values: :class:`Str` (a string), :class:`Ref` (a dotted name from
outside the distribution, ``torch.library.define``), :class:`Lib` (a
``torch.library.Library(ns, kind)``), :class:`Op` (an op named by
``custom_op`` or ``torch.ops.ns.name``), :class:`PathValue` (a file path
built from ``__file__``) -- or :class:`Unknown`, with the reason in words.

Evaluation is flow-insensitive: a name assigned more than once in a scope
has a value only when every assignment gives the same one.  No code of the
distribution runs.
"""

from __future__ import annotations

import ast
import builtins
import itertools
import os
from typing import Callable, Iterable, Iterator, Union

from attrs import frozen

from ..regular import open_regular

__all__ = ["Str", "Num", "Bool", "Seq", "Ref", "Lib", "Op", "PathValue", "Func", "Inferred",
           "Unknown", "Value", "decide", "Scope", "Index", "ModuleSource", "bindings",
           "bind_arguments", "unroll", "LIBRARY_CTORS"]

#: the names Python gives every module (``list``, ``sorted``): run-time values to the scan
_BUILTINS = frozenset(dir(builtins))


@frozen
class Str:
    text: str


@frozen
class Ref:
    """A dotted name that is not (or not only) this distribution's: ``torch.library.define``."""

    path: str


@frozen
class Lib:
    """A ``torch.library.Library``; ``unresolved`` says which argument could not be read."""

    namespace: str | None
    kind: str | None
    key: str | None = None
    unresolved: str = ""


@frozen
class Op:
    """An op: ``ns::name[.overload]``."""

    qualname: str


@frozen
class PathValue:
    path: str


@frozen
class Num:
    """An int or float constant (a loop over ``range(1, 9)`` names ops by number)."""

    value: float


@frozen
class Bool:
    """``True`` / ``False`` (a flag passed to a helper: ``_register_custom_op(lib, False)``)."""

    value: bool


@frozen
class Seq:
    """A tuple or list whose items are all known."""

    items: tuple[Value, ...]


@frozen
class Func:
    """A function of the distribution, with the scope it was defined in (for its closure)."""

    node: ast.FunctionDef | ast.AsyncFunctionDef
    scope: Scope

    @property
    def label(self) -> str:
        """``pkg.mod.outer.inner``: the module, the enclosing functions, the function."""
        outer = self.scope.label
        if outer.startswith("function "):
            return f"{outer[len('function '):]}.{self.node.name}"
        return f"{self.scope.module.name}.{self.node.name}"


@frozen
class Unknown:
    why: str


@frozen
class Inferred:
    """``torch.library.infer_schema(fn)``: ``"(args) -> returns"``, read from type hints at run time.

    ``name`` is set for ``"name" + infer_schema(fn)``: a schema whose op name
    is known and whose signature only torch can tell.
    """

    name: str = ""


Value = Union[Str, Num, Bool, Seq, Ref, Lib, Op, PathValue, Func, Inferred, Unknown]

#: (expression or import target, how to read it)
Binding = tuple[object, str]
#: torch's ``Library`` constructors
LIBRARY_CTORS = frozenset({"torch.library.Library", "torch.library._scoped_library"})
_OP_CTORS = ("custom_op", "triton_op")
_OS_PATH = {"os.path.join", "os.path.dirname", "os.path.abspath", "os.path.realpath",
            "os.fspath", "pathlib.Path", "pathlib.PurePath", "str"}


class ModuleSource:
    """One module of the distribution: its name, file and (lazily) syntax tree."""

    def __init__(self, name: str, file: str, is_package: bool, text: bytes | None = None
                 ) -> None:
        self.name = name
        self.file = file
        self.package = name if is_package else name.rpartition(".")[0]
        #: the file's bytes, when the caller read them already: parsed, and searched by
        #: :meth:`span`, as they were read (the file is read here otherwise)
        self.text = text
        self._tree: ast.Module | None = None
        self._starts: list[int] | None = None
        #: ``{words: (starts, ends)}``: where the scanner's sets of names are in the text
        #: (``pysource._occurrences``)
        self.words_found: dict[object, tuple[list[int], list[int]]] = {}
        self.failed = ""
        self.scope: Scope | None = None

    @property
    def tree(self) -> ast.Module | None:
        if self._tree is None and not self.failed:
            try:
                if self.text is None:
                    with open_regular(self.file) as f:
                        self.text = f.read()
                self._tree = ast.parse(self.text, self.file)
            except (OSError, SyntaxError, ValueError, RecursionError, MemoryError) as exc:
                self.failed = f"{type(exc).__name__}: {exc}"
        return self._tree

    def span(self, first_node: ast.AST, last_node: ast.AST | None = None
             ) -> tuple[int, int] | None:
        """The byte offsets in :attr:`text` of the lines from ``first_node``'s first to
        ``last_node``'s last (default: ``first_node``'s), nodes of :attr:`tree`; ``None``
        when unknown.  Where a search for the names the nodes use may look."""
        first = getattr(first_node, "lineno", None)
        last = getattr(first_node if last_node is None else last_node, "end_lineno", None)
        if self.text is None or first is None or last is None:
            return None
        if self._starts is None:  # the tokenizer's line breaks: \n, \r\n, \r
            self._starts = [0, *itertools.accumulate(map(len, self.text.splitlines(True)))]
        starts = self._starts
        if not 1 <= first <= last < len(starts):
            return None
        return starts[first - 1], starts[last]

    def absolute(self, module: str | None, level: int) -> str:
        """The absolute name of ``from <level dots><module> import ...`` in this module."""
        if not level:
            return module or ""
        parts = self.package.split(".") if self.package else []
        base = parts[: max(len(parts) - level + 1, 0)]
        return ".".join(base + ([module] if module else []))


def _targets(node: ast.AST) -> Iterator[tuple[str, ast.AST | None]]:
    """``(name, value)`` bound by an assignment target; value ``None`` when not a plain copy."""
    if isinstance(node, ast.Name):
        yield node.id, None
    elif isinstance(node, (ast.Tuple, ast.List)):
        for elt in node.elts:
            yield from _targets(elt)
    elif isinstance(node, ast.Starred):
        yield from _targets(node.value)


def _statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Every statement of ``body`` that runs in its scope, nested blocks included.

    Function and class bodies are other scopes and left out; expressions are
    not entered (a walrus binding is rare enough to read as "not assigned").
    """
    stack: list[ast.stmt] = list(reversed(body))
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for name in ("body", "orelse", "finalbody", "handlers", "cases"):
            block = getattr(node, name, None)
            if block:
                stack.extend(reversed(block))


def _bind_import(found: dict[str, list[Binding]], node: ast.AST, module: ModuleSource) -> None:
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.asname:
                found.setdefault(alias.asname, []).append((alias.name, "ref"))
            else:
                top = alias.name.split(".")[0]
                found.setdefault(top, []).append((top, "ref"))
    elif isinstance(node, ast.ImportFrom):
        base = module.absolute(node.module, node.level)
        for alias in node.names:
            if alias.name != "*":
                found.setdefault(alias.asname or alias.name, []).append(
                    (f"{base}.{alias.name}" if base else alias.name, "ref"))


def bindings(body: list[ast.stmt], module: ModuleSource,
             params: Iterable[str] = ()) -> dict[str, list[Binding]]:
    """Every name a scope's statements bind, with how to evaluate each binding."""
    found: dict[str, list[Binding]] = {p: [(p, "param")] for p in params}
    for node in _statements(body):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            _bind_import(found, node, module)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                plain = isinstance(target, ast.Name)
                for name, _ in _targets(target):
                    found.setdefault(name, []).append(
                        (node.value, "expr") if plain else ("unpacked from a tuple", "unknown"))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if node.value is not None:
                found.setdefault(node.target.id, []).append((node.value, "expr"))
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            found.setdefault(node.target.id, []).append(("changed in place", "unknown"))
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            for name, _ in _targets(node.target):
                found.setdefault(name, []).append(("a loop variable", "unknown"))
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                plain = isinstance(item.optional_vars, ast.Name)
                for name, _ in _targets(item.optional_vars) if item.optional_vars else ():
                    found.setdefault(name, []).append(
                        (item.context_expr, "with") if plain else ("bound by a with statement",
                                                                   "unknown"))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.setdefault(node.name, []).append((node, "def"))
        elif isinstance(node, ast.ClassDef):
            found.setdefault(node.name, []).append((f"the class {node.name}", "unknown"))
        elif isinstance(node, ast.ExceptHandler) and node.name:
            found.setdefault(node.name, []).append(("an exception", "unknown"))
    return found


class Scope:
    """The names of one scope (a module, a function, a class body) and their values, memoized."""

    def __init__(self, index: Index, module: ModuleSource, body: list[ast.stmt],
                 parent: Scope | None, label: str, params: Iterable[str] = (),
                 is_class: bool = False, fixed: dict[str, Value] | None = None) -> None:
        self.index = index
        self.module = module
        self.parent = parent
        self.label = label
        self.is_class = is_class
        self._body, self._params = body, tuple(params)
        self._names: dict[str, list[Binding]] | None = None
        #: parameters whose value is given (a call's arguments, a loop's current item)
        self._given: dict[str, Value] = dict(fixed or {})
        self._params = self._params + tuple(n for n in self._given if n not in self._params)
        self._memo: dict[str, Value] = {}
        self._busy: set[str] = set()
        index.scopes.append(self)

    @property
    def names(self) -> dict[str, list[Binding]]:
        """The scope's bindings, read on first use (most function scopes are never asked)."""
        if self._names is None:
            self._names = bindings(self._body, self.module, self._params)
        return self._names

    def release(self) -> None:
        """Drop what this scope holds (:meth:`Index.release`)."""
        self._names, self._body, self.parent = None, [], None
        self._memo.clear()
        self._given.clear()

    def assign(self, name: str, value: Value) -> None:
        """``name = value`` run in order (a followed function's body is read statement by
        statement): later reads see this value, not the merge of every assignment."""
        self._memo[name] = value

    def state(self) -> dict[str, Value]:
        return dict(self._memo)

    def restore(self, state: dict[str, Value]) -> None:
        self._memo = dict(state)

    def lookup(self, name: str) -> Value:
        if name in self.names:
            if name in self._memo:
                return self._memo[name]
            if name in self._busy:
                return Unknown(f"{name} refers to itself")
            self._busy.add(name)
            try:
                value = self._merge(name, [self._read(b) for b in self.names[name]])
            finally:
                self._busy.discard(name)
            self._memo[name] = value
            return value
        if self.parent is not None:
            return self.parent.lookup(name)
        return self._module_name(name)

    def _module_name(self, name: str) -> Value:
        if name == "__file__":
            return PathValue(self.module.file)
        if name == "__name__":
            return Str(self.module.name)
        if name == "__package__":
            return Str(self.module.package)
        if name in ("str", "range", "len", "getattr"):  # builtins the evaluator knows, by name
            return Ref(name)
        if name in _BUILTINS:  # list(...), sorted(...): run-time values, not a missing name
            return Unknown(f"the value of the built-in {name}(...) is known only at run time")
        return Unknown(f"{name} is not assigned in {self.module.name}")

    def _merge(self, name: str, values: list[Value]) -> Value:
        first = values[0]
        if all(v == first for v in values[1:]):
            return first
        known = [v for v in values if not isinstance(v, Unknown)]
        if known and all(_equivalent(v, known[0]) for v in known) and len(known) == len(values):
            # the name torch >= 2.8 has (the branch that runs there): register_fake, not
            # impl_abstract
            return next((v for v in known if isinstance(v, Ref)
                         and v.path.rsplit(".", 1)[-1] in _CURRENT), known[0])
        where = "in " + self.label
        return Unknown(f"{name} is assigned different values {where}")

    def _read(self, binding: Binding) -> Value:
        what, how = binding
        if how == "ref":
            return self.index.resolve(str(what))
        if how == "expr":
            return self.index.evaluate(what, self)  # type: ignore[arg-type]
        if how == "with":  # ``with _scoped_library(ns, kind) as lib``: the library itself
            value = self.index.evaluate(what, self)  # type: ignore[arg-type]
            return value if isinstance(value, Lib) else Unknown(
                f"a name bound by a with statement in {self.label}")
        if how == "def":
            return self.index.definition(what, self)  # type: ignore[arg-type]
        if how == "param":
            given = self._given.get(str(what))
            return given if given is not None else Unknown(f"the parameter {what} of {self.label}")
        return Unknown(f"{what} in {self.label}")


#: torch's registration functions that a package binds to one name, one or the other by
#: torch version (bitsandbytes 0.46-0.49: ``register_kernel = torch.library.register_kernel``
#: where ``register_fake`` exists, ``torch.library.impl`` before): the same call to the scan
#: -- the op, then the key or device types
_SAME_CALL = (frozenset({"register_fake", "impl_abstract"}),
              frozenset({"register_kernel", "impl"}))


#: of each pair, the name of the torch versions opregistry supports
_CURRENT = frozenset({"register_fake", "register_kernel"})


def _equivalent(a: Value, b: Value) -> bool:
    """Whether two of torch's functions bound to one name register alike (:data:`_SAME_CALL`)."""
    if isinstance(a, Ref) and isinstance(b, Ref):
        ends = {a.path.rsplit(".", 1)[-1], b.path.rsplit(".", 1)[-1]}
        return any(ends <= same for same in _SAME_CALL) and \
            a.path.rsplit(".", 1)[0] == b.path.rsplit(".", 1)[0]
    return False


def _split_op(path: str) -> Op | None:
    """``torch.ops.ns.name[.overload]`` as an :class:`Op`."""
    parts = path.split(".")
    if len(parts) < 4 or parts[:2] != ["torch", "ops"]:
        return None
    ns, name = parts[2], parts[3]
    overload = parts[4] if len(parts) > 4 and parts[4] != "default" else ""
    return Op(f"{ns}::{name}" + (f".{overload}" if overload else ""))


class Index:
    """The modules of one distribution, and the evaluation of expressions over them."""

    #: how deep calls of the distribution's own functions are followed
    MAX_DEPTH = 3

    def __init__(self, modules: dict[str, ModuleSource]) -> None:
        self.modules = modules
        #: evaluates a call the scanner knows (``Library(...)``, ``custom_op(...)``), set by it
        self.call_hook: Callable[[ast.Call, Scope, str], Value | None] | None = None
        self.depth = 0
        #: names of the distribution's functions that may register (set by the scanner)
        self.registering: frozenset[str] = frozenset()
        #: names of those that define (and may return) a function that registers
        self.returned: frozenset[str] = frozenset()
        #: every name a registration is made through (``pysource.Words``, set by the
        #: scanner): a function or class body whose lines name none of them is not walked
        self.words: object | None = None
        #: every scope made over these modules (:meth:`release`)
        self.scopes: list[Scope] = []

    def release(self) -> None:
        """Break the cycles the evaluation made (scopes, their memoized values and the
        functions in them, the modules' scopes), so that reference counting frees them and
        the syntax trees they hold: left to the cyclic collector -- paused during a load --
        vllm's scan kept ~600,000 objects alive.  The modules keep their trees."""
        for scope in self.scopes:
            scope.release()
        self.scopes.clear()
        for module in self.modules.values():
            module.scope = None
        self.call_hook = None

    def scope_of(self, module: ModuleSource) -> Scope:
        if module.scope is None:
            tree = module.tree
            module.scope = Scope(self, module, tree.body if tree is not None else [], None,
                                 f"module {module.name}")
        return module.scope

    def resolve(self, path: str) -> Value:
        """A dotted name: this distribution's modules are looked into, others stay :class:`Ref`."""
        parts = path.split(".")
        for cut in range(len(parts), 0, -1):
            module = self.modules.get(".".join(parts[:cut]))
            if module is None:
                continue
            if cut == len(parts):
                return Ref(path)  # a module of the distribution itself
            value = self.scope_of(module).lookup(parts[cut])
            for attr in parts[cut + 1:]:
                value = self.attribute(value, attr)
            return value
        return _split_op(path) or Ref(path)

    def attribute(self, value: Value, attr: str) -> Value:
        if isinstance(value, Ref):
            return self.resolve(f"{value.path}.{attr}")
        if isinstance(value, PathValue) and attr == "parent":
            return PathValue(os.path.dirname(value.path))
        if isinstance(value, Func) and attr == "__name__":
            return Str(value.node.name)
        if isinstance(value, Op) and attr == "default":
            return value
        if isinstance(value, Op) and "." not in value.qualname:
            return Op(f"{value.qualname}.{attr}")
        if isinstance(value, Unknown):
            return value
        return Unknown(f"the attribute {attr} of {type(value).__name__.lower()}")

    def definition(self, node: ast.FunctionDef | ast.AsyncFunctionDef, scope: Scope) -> Value:
        """A function: an :class:`Op` when ``custom_op`` / ``triton_op`` decorates it."""
        for deco in node.decorator_list:
            if isinstance(deco, ast.Call):
                func = self.evaluate(deco.func, scope)
                if isinstance(func, Ref) and func.path.rsplit(".", 1)[-1] in _OP_CTORS:
                    value = self.evaluate(deco, scope)
                    if isinstance(value, Op):
                        return value
        return Func(node, scope)

    def evaluate(self, node: ast.AST, scope: Scope) -> Value:
        """What ``node`` evaluates to in ``scope``."""
        if isinstance(node, ast.Constant):
            return _constant(node.value)
        if isinstance(node, ast.Name):
            return scope.lookup(node.id)
        if isinstance(node, ast.Attribute):
            return self.attribute(self.evaluate(node.value, scope), node.attr)
        if isinstance(node, (ast.Tuple, ast.List)):
            return _seq([self.evaluate(e, scope) for e in node.elts], node)
        evaluate = _EVALUATORS.get(type(node))
        if evaluate is not None:
            return evaluate(self, node, scope)
        return Unknown(f"the expression {_text(node)}")

    def call(self, func: Func, call: ast.Call, scope: Scope) -> Value:
        """What a call of the distribution's function returns, when one ``return`` says it."""
        if self.depth >= self.MAX_DEPTH:
            return Unknown(f"the result of {func.label} (calls nested too deeply)")
        inner = bind_arguments(func, call, scope)
        returns = [n.value for n in _statements(func.node.body)
                   if isinstance(n, ast.Return) and n.value is not None]
        if not returns:
            return Unknown(f"the result of {func.label}")
        self.depth += 1
        try:
            values = [self.evaluate(r, inner) for r in returns]
        finally:
            self.depth -= 1
        return inner._merge(f"the result of {func.label}", values)


def bind_arguments(func: Func, call: ast.Call, scope: Scope,
                   extra: tuple[Value, ...] = ()) -> Scope:
    """The scope of ``func``'s body for a call with ``call``'s arguments (evaluated in ``scope``).

    ``extra``: values passed before the call's own positional arguments (the
    function a decorator is applied to).  A parameter with no argument takes
    its default, evaluated where the function was defined.
    """
    index, args = func.scope.index, func.node.args
    positional = [*args.posonlyargs, *args.args]
    given: dict[str, Value] = {}
    values = list(extra) + [index.evaluate(a, scope) if not isinstance(a, ast.Starred)
                            else Unknown("*args") for a in call.args]
    for param, value in zip(positional, values):
        given[param.arg] = value
    for kw in call.keywords:
        if kw.arg is not None:
            given[kw.arg] = index.evaluate(kw.value, scope)
    defaults = list(zip(positional[len(positional) - len(args.defaults):], args.defaults))
    defaults += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
    for param, default in defaults:
        if param.arg not in given:
            given[param.arg] = index.evaluate(default, func.scope)
    params = [a.arg for a in [*positional, *args.kwonlyargs]]
    params += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
    return Scope(index, func.scope.module, func.node.body, func.scope, f"function {func.label}",
                 params, fixed=given)


def unroll(node: ast.For, scope: Scope, limit: int = 64) -> list[Scope] | None:
    """One scope per iteration of a loop over known items (``range(1, 9)``, a constant tuple).

    ``None`` when the items are not known, or more than ``limit``.
    """
    items = scope.index.evaluate(node.iter, scope)
    if not isinstance(items, Seq) or not items.items or len(items.items) > limit:
        return None
    names = [t.id for t in (node.target.elts if isinstance(node.target, ast.Tuple)
                            else [node.target]) if isinstance(t, ast.Name)]
    out = []
    for item in items.items:
        if isinstance(node.target, ast.Tuple):
            size = len(node.target.elts)
            if not isinstance(item, Seq) or len(item.items) != size or len(names) != size:
                return None
            given = dict(zip(names, item.items))
        elif isinstance(node.target, ast.Name):
            given = {node.target.id: item}
        else:
            return None
        out.append(Scope(scope.index, scope.module, node.body, scope, scope.label, (),
                         fixed=given))
    return out


def decide(index: Index, test: ast.expr, scope: Scope) -> bool | None:
    """Whether an ``if`` test is true, when it compares known strings or numbers; else ``None``."""
    if isinstance(test, (ast.Constant, ast.Name, ast.Attribute)):
        value = index.evaluate(test, scope)
        if isinstance(value, Bool):
            return value.value
        return bool(value.text) if isinstance(value, Str) else None
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = decide(index, test.operand, scope)
        return None if inner is None else not inner
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(
            test.ops[0], (ast.Eq, ast.NotEq)):
        left = index.evaluate(test.left, scope)
        right = index.evaluate(test.comparators[0], scope)
        if isinstance(left, (Str, Num)) and isinstance(right, (Str, Num)):
            return (left == right) == isinstance(test.ops[0], ast.Eq)
    return None


def _constant(value: object) -> Value:
    if isinstance(value, str):
        return Str(value)
    if isinstance(value, bool):
        return Bool(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return Num(value)
    return Unknown(f"the constant {value!r}")


def _seq(values: list[Value], node: ast.AST) -> Value:
    bad = next((v for v in values if isinstance(v, Unknown)), None)
    return bad or Seq(tuple(values))


def _format(value: Value) -> str | None:
    if isinstance(value, Str):
        return value.text
    if isinstance(value, Bool):
        return str(value.value)
    if isinstance(value, Num):
        return str(value.value)
    return None


def _fstring(index: Index, node: ast.JoinedStr, scope: Scope) -> Value:
    out = []
    for part in node.values:
        if isinstance(part, ast.FormattedValue):
            if part.format_spec is not None or part.conversion not in (-1, ord("s")):
                return Unknown(f"the f-string {_text(node)}")
            value = index.evaluate(part.value, scope)
        else:
            value = index.evaluate(part, scope)
        text = _format(value)
        if text is None:
            return _unknown(value, node)
        out.append(text)
    return Str("".join(out))


def _binop(index: Index, node: ast.BinOp, scope: Scope) -> Value:
    left, right = index.evaluate(node.left, scope), index.evaluate(node.right, scope)
    if isinstance(left, Str) and isinstance(right, Str) and isinstance(node.op, ast.Add):
        return Str(left.text + right.text)
    if isinstance(left, Str) and isinstance(right, Inferred) and isinstance(node.op, ast.Add):
        return Inferred(left.text)
    if isinstance(left, Num) and isinstance(right, Num) and type(node.op) in _ARITHMETIC:
        return Num(_ARITHMETIC[type(node.op)](left.value, right.value))
    if isinstance(node.op, ast.Div) and isinstance(left, PathValue) and isinstance(right, Str):
        return PathValue(os.path.join(left.path, right.text))
    if isinstance(node.op, ast.Mod) and isinstance(left, Str):
        args = right.items if isinstance(right, Seq) else (right,)
        texts = [_format(a) for a in args]
        if all(t is not None for t in texts):
            try:
                return Str(left.text % tuple(texts))
            except (TypeError, ValueError):
                pass
    bad = next((v for v in (left, right) if isinstance(v, Unknown)), None)
    return bad or Unknown(f"the expression {_text(node)}")


_ARITHMETIC: dict[type, Callable[[float, float], float]] = {
    ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b}


def _subscript(index: Index, node: ast.Subscript, scope: Scope) -> Value:
    base = index.evaluate(node.value, scope)
    if isinstance(node.slice, ast.Slice):
        bounds = [index.evaluate(b, scope) if b is not None else None
                  for b in (node.slice.lower, node.slice.upper, node.slice.step)]
        if isinstance(base, Str) and all(b is None or isinstance(b, Num) for b in bounds):
            return Str(base.text[slice(*(int(b.value) if b else None for b in bounds))])
    else:
        key = index.evaluate(node.slice, scope)
        if isinstance(base, (Str, Seq)) and isinstance(key, Num):
            items = base.text if isinstance(base, Str) else base.items
            try:
                item = items[int(key.value)]
            except IndexError:
                return Unknown(f"the expression {_text(node)}")
            return Str(item) if isinstance(item, str) else item
    return _unknown(base, node)


def _call(index: Index, node: ast.Call, scope: Scope) -> Value:
    func = node.func
    if isinstance(func, ast.Attribute) and func.attr == "format":
        base = index.evaluate(func.value, scope)
        if isinstance(base, Str):
            return _str_format(index, base, node, scope)
    if isinstance(func, ast.Attribute) and func.attr in _STR_METHODS and not node.args \
            and not node.keywords:  # f"Autocast{device_type.upper()}" (torch-harmonics)
        base = index.evaluate(func.value, scope)
        if isinstance(base, Str):
            return Str(getattr(base.text, func.attr)())
    callee = index.evaluate(func, scope)
    if isinstance(callee, Func):
        return index.call(callee, node, scope)
    if isinstance(callee, Ref):
        if index.call_hook is not None:
            found = index.call_hook(node, scope, callee.path)
            if found is not None:
                return found
        if callee.path == "range":
            return _range(index, node, scope)
        if callee.path.startswith("torch.") and callee.path.endswith(".infer_schema"):
            return Inferred()
        if callee.path in _OS_PATH:
            return _path_call(index, callee.path, node, scope)
    return _unknown(callee, node, call=True)


#: ``str`` methods without arguments the evaluator runs on a known string
_STR_METHODS = frozenset({"upper", "lower", "strip", "lstrip", "rstrip", "capitalize",
                          "title", "casefold"})


def _range(index: Index, node: ast.Call, scope: Scope) -> Value:
    args = [index.evaluate(a, scope) for a in node.args]
    if not args or len(args) > 3 or not all(isinstance(a, Num) for a in args):
        return Unknown(f"the expression {_text(node)}")
    bounds = [int(a.value) for a in args]  # type: ignore[union-attr]
    values = range(*bounds)
    if len(values) > 256:
        return Unknown(f"the expression {_text(node)} (too many items)")
    return Seq(tuple(Num(v) for v in values))


def _str_format(index: Index, base: Str, node: ast.Call, scope: Scope) -> Value:
    args = [_format(index.evaluate(a, scope)) for a in node.args]
    kwargs = {k.arg: _format(index.evaluate(k.value, scope)) for k in node.keywords if k.arg}
    if len(kwargs) != len(node.keywords) or None in args or None in kwargs.values():
        return Unknown(f"the expression {_text(node)}")
    try:
        return Str(base.text.format(*args, **kwargs))
    except (IndexError, KeyError, ValueError, AttributeError):
        return Unknown(f"the expression {_text(node)}")


def _path_call(index: Index, path: str, node: ast.Call, scope: Scope) -> Value:
    args = [index.evaluate(a, scope) for a in node.args]
    if not args or not all(isinstance(a, (Str, PathValue)) for a in args):
        return Unknown(f"the path {_text(node)}")
    texts = [a.text if isinstance(a, Str) else a.path for a in args]  # type: ignore[union-attr]
    if path == "os.path.dirname":
        return PathValue(os.path.dirname(texts[0]))
    if path in ("os.path.join", "pathlib.Path", "pathlib.PurePath"):
        return PathValue(os.path.join(*texts))
    if path == "str" and isinstance(args[0], Str):
        return args[0]
    return PathValue(texts[0])


def _ifexp(index: Index, node: ast.IfExp, scope: Scope) -> Value:
    verdict = decide(index, node.test, scope)
    if verdict is not None:
        return index.evaluate(node.body if verdict else node.orelse, scope)
    body, orelse = index.evaluate(node.body, scope), index.evaluate(node.orelse, scope)
    return body if body == orelse else Unknown(f"the expression {_text(node)}")


_EVALUATORS: dict[type, Callable[..., Value]] = {
    ast.JoinedStr: _fstring, ast.BinOp: _binop, ast.Call: _call, ast.Subscript: _subscript,
    ast.IfExp: _ifexp}


def _text(node: ast.AST) -> str:
    text = ast.unparse(node)
    return text if len(text) <= 60 else text[:57] + "..."


def _unknown(value: Value, node: ast.AST, call: bool = False) -> Unknown:
    if isinstance(value, Unknown):
        return value
    return Unknown(f"the {'result of ' if call else 'expression '}{_text(node)}")
