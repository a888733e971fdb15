"""Operator schemas, parsed and checked without importing torch.

The resolver must reject a bad schema before torch is touched, and
``opregistry list`` must show schemas without torch at all, so opregistry
carries a parser for the part of torch's schema language that custom
operators use.  It is deliberately stricter than torch: anything it accepts,
``Library.define`` accepts; it refuses what torch silently accepts but should
not (two arguments with one name) and says why.
"""

from __future__ import annotations

import functools

import math
import re
from typing import Iterable

from attrs import field, frozen

from .errors import SchemaError

__all__ = [
    "Alias",
    "Type",
    "Argument",
    "Return",
    "Schema",
    "BASE_TYPES",
    "SCHEMA_KEYWORDS",
    "MAX_ARGUMENTS",
    "parse_schema",
    "parse_signature",
    "check_mutates_args",
    "check_tags",
]

#: Base types a custom operator schema may use.  ``Dimname`` and ``SymFloat``
#: parse in torch's schema language but ``Library.define`` refuses them for
#: custom ops (found by tests/test_properties.py), so they are not here.
BASE_TYPES: frozenset[str] = frozenset(
    {
        "Tensor",
        "int",
        "SymInt",
        "float",
        "bool",
        "SymBool",
        "str",
        "Scalar",
        "ScalarType",
        "Layout",
        "Device",
        "MemoryFormat",
        "Generator",
        "complex",
    }
)
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

#: Words torch's schema lexer reserves (``torch/csrc/jit/frontend/lexer.h``): torch
#: cannot parse them as a namespace, op, overload or argument name.  Found by
#: tests/test_properties.py; ``test_schema_keywords_match_torch`` keeps it honest.
SCHEMA_KEYWORDS: frozenset[str] = frozenset(
    {
        "False", "None", "NoneType", "True", "and", "as", "assert", "break", "class",
        "continue", "def", "del", "elif", "else", "for", "global", "if", "import", "in",
        "is", "not", "or", "pass", "raise", "return", "while", "with",
    }
)
_ALIAS = re.compile(r"\(\s*([a-z][A-Za-z0-9_]*)\s*(!?)\s*\)")
# torch's lexer takes a leading '-' but no '+', and neither inf nor nan
_NUMBER = re.compile(r"-?(\d+\.?\d*([eE][+-]?\d+)?|\.\d+([eE][+-]?\d+)?)\Z")
_INT = re.compile(r"-?\d+\Z")
#: c10's limit on the arguments of one schema ("this PyTorch build only supports 64")
MAX_ARGUMENTS = 64
_STRING = re.compile(r"""('[^'\\]*'|"[^"\\]*")\Z""")


@frozen
class Alias:
    """An alias annotation: ``(a)`` or, when the argument is written to, ``(a!)``."""

    name: str
    is_write: bool


@frozen
class Type:
    """A schema type: a base type with list / optional wrappers and an alias."""

    base: str
    alias: Alias | None = None
    is_list: bool = False
    list_size: int | None = None
    element_optional: bool = False
    optional: bool = False

    @property
    def is_tensor_like(self) -> bool:
        return self.base == "Tensor"

    def __str__(self) -> str:
        text = self.base
        if self.element_optional:
            text += "?"
        if self.alias is not None and not self.is_list:
            text += f"({self.alias.name}{'!' if self.alias.is_write else ''})"
        if self.is_list:
            text += f"[{self.list_size if self.list_size is not None else ''}]"
            if self.alias is not None:
                text += f"({self.alias.name}{'!' if self.alias.is_write else ''})"
        if self.optional:
            text += "?"
        return text


@frozen
class Argument:
    name: str
    type: Type
    default: str | None = None
    kwarg_only: bool = False

    @property
    def is_write(self) -> bool:
        return self.type.alias is not None and self.type.alias.is_write


@frozen
class Return:
    type: Type
    name: str | None = None


@frozen
class Schema:
    """A parsed schema; ``name`` and ``overload`` are empty for a bare signature."""

    name: str
    overload: str
    arguments: tuple[Argument, ...] = field(converter=tuple)
    returns: tuple[Return, ...] = field(converter=tuple)

    @property
    def mutated_args(self) -> tuple[str, ...]:
        """Names of the arguments annotated ``(x!)``: those the op writes to."""
        return tuple(a.name for a in self.arguments if a.is_write)

    @property
    def is_mutable(self) -> bool:
        return bool(self.mutated_args)

    @property
    def is_functional(self) -> bool:
        """Writes to no argument and returns no alias of one (no ``(a!)``, no ``(a)`` return)."""
        return not self.is_mutable and not any(r.type.alias for r in self.returns)

    @property
    def has_kwarg_only_tensors(self) -> bool:
        """Some tensor argument is keyword-only (after ``*``)."""
        return any(a.kwarg_only and a.type.is_tensor_like for a in self.arguments)

    @property
    def is_factory(self) -> bool:
        """No tensor argument to dispatch on, and a ``Device`` argument to route by."""
        return not self.tensor_arguments and any(a.type.base == "Device" for a in self.arguments)

    def autograd_refusal(self, tags: Iterable[str] = ()) -> tuple[str, str] | None:
        """``(code, why)`` when ``torch.library.register_autograd`` refuses this op, else ``None``.

        The one statement of the rule: the resolver reports it before torch is
        imported, and opregistry-autograd applies it to ops it did not see
        declared (a kernel for an op defined in C++).
        """
        if "out" in tuple(tags):
            return ("autograd-on-mutable-op",
                    "it is tagged torch.Tag.out, and out= variants do not support autograd")
        if not self.is_functional:
            return ("autograd-on-mutable-op", "it mutates or aliases its inputs (its schema has "
                                              "'(a!)' / '(a)' annotations)")
        if not self.returns:
            return ("autograd-no-returns", "it returns nothing, so there is nothing to differentiate")
        if self.has_kwarg_only_tensors:
            return ("autograd-kwarg-only-tensor", "it has keyword-only Tensor arguments, which "
                                                  "torch's autograd kernels do not support")
        return None

    def autocast_refusal(self) -> tuple[str, str] | None:
        """``(code, why)`` when an autocast rule cannot serve this op, else ``None``.

        ``torch.library.register_autocast``'s kernel raises on keyword
        arguments ("Custom ops do not support kwargs yet"), at the first call
        that passes one; and it casts floating inputs to new tensors, so a
        mutated argument would be cast to a copy and the mutation lost.
        """
        if any(a.kwarg_only for a in self.arguments):
            return ("autocast-kwarg-only-argument", "it has keyword-only arguments, which "
                                                    "torch's autocast kernel refuses")
        if self.mutated_args:
            return ("autocast-on-mutable-op", "it mutates its inputs, and autocast would cast a "
                                              "mutated argument to a copy, losing the mutation")
        return None

    def vmap_refusal(self) -> tuple[str, str] | None:
        """``(code, why)`` when ``torch.library.register_vmap`` refuses this op, else ``None``."""
        if self.has_kwarg_only_tensors:
            return ("vmap-kwarg-only-tensor", "it has keyword-only Tensor arguments, which "
                                              "torch.library.register_vmap does not support")
        return None

    @property
    def tensor_arguments(self) -> tuple[Argument, ...]:
        return tuple(a for a in self.arguments if a.type.is_tensor_like)

    @property
    def signature(self) -> str:
        """The schema without its name: ``(Tensor x) -> Tensor``."""
        args: list[str] = []
        star = False
        for a in self.arguments:
            if a.kwarg_only and not star:
                args.append("*")
                star = True
            text = f"{a.type} {a.name}"
            if a.default is not None:
                text += f"={a.default}"
            args.append(text)
        rets = [f"{r.type}{' ' + r.name if r.name else ''}" for r in self.returns]
        if len(rets) == 1 and self.returns[0].name is None:
            ret = rets[0]
        else:
            ret = "(" + ", ".join(rets) + ")"
        return f"({', '.join(args)}) -> {ret}"


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    # -- low level -------------------------------------------------------
    def error(self, what: str) -> SchemaError:
        return SchemaError(f"invalid schema {self.text!r}: {what} (at column {self.pos + 1})")

    def skip(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in " \t":
            self.pos += 1

    def peek(self, s: str) -> bool:
        self.skip()
        return self.text.startswith(s, self.pos)

    def accept(self, s: str) -> bool:
        if self.peek(s):
            self.pos += len(s)
            return True
        return False

    def expect(self, s: str) -> None:
        if not self.accept(s):
            got = self.text[self.pos : self.pos + 10] or "end of schema"
            raise self.error(f"expected {s!r}, found {got!r}")

    def ident(self, what: str) -> str:
        self.skip()
        m = _IDENT.match(self.text, self.pos)
        if not m:
            got = self.text[self.pos : self.pos + 10] or "end of schema"
            raise self.error(f"expected {what}, found {got!r}")
        if m.group(0) in SCHEMA_KEYWORDS and what != "a type":
            raise self.error(
                f"{m.group(0)!r} cannot be {what}: it is a keyword of torch's schema language"
            )
        self.pos = m.end()
        return m.group(0)

    # -- grammar ---------------------------------------------------------
    def alias(self) -> Alias | None:
        self.skip()
        if not self.text.startswith("(", self.pos):
            return None
        m = _ALIAS.match(self.text, self.pos)
        if not m:
            raise self.error(
                "unsupported alias annotation; use '(a)' for a view or '(a!)' for an "
                "argument the op writes to"
            )
        self.pos = m.end()
        return Alias(m.group(1), bool(m.group(2)))

    def type(self) -> Type:
        start = self.pos
        base = self.ident("a type")
        if base not in BASE_TYPES:
            self.pos = start
            raise self.error(
                f"unknown type {base!r}; custom op schemas use " + ", ".join(sorted(BASE_TYPES))
            )
        element_optional = False
        if self.peek("?") and self.text.startswith("[", self.pos + 1):
            self.accept("?")
            element_optional = True
        alias = self.alias()
        is_list = False
        size: int | None = None
        if self.accept("["):
            is_list = True
            self.skip()
            m = re.compile(r"\d+").match(self.text, self.pos)
            if m:
                size = int(m.group(0))
                self.pos = m.end()
            self.expect("]")
            list_alias = self.alias()
            if list_alias is not None:
                if alias is not None:
                    raise self.error("a list type carries one alias annotation, not two")
                alias = list_alias
        elif element_optional:
            raise self.error("'?' before '[' needs a list type")
        optional = self.accept("?")
        if alias is not None and base != "Tensor":
            raise self.error(f"alias annotations belong to Tensor types, not {base}")
        if size is not None and base not in ("int", "SymInt", "bool", "float"):
            raise self.error(f"a fixed-size list ({base}[{size}]) is only allowed for int and bool")
        return Type(base, alias, is_list, size, element_optional, optional)

    def default(self, typ: Type, name: str) -> str:
        self.skip()
        start = self.pos
        depth = 0
        while self.pos < len(self.text):
            c = self.text[self.pos]
            if c in "[(":
                depth += 1
            elif c in "])":
                if depth == 0:
                    break
                depth -= 1
            elif c == "," and depth == 0:
                break
            elif c in "'\"":
                end = self.text.find(c, self.pos + 1)
                if end < 0:
                    raise self.error("unterminated string default")
                self.pos = end
            self.pos += 1
        value = self.text[start : self.pos].strip()
        _check_default(value, typ, name, self)
        return value

    def arguments(self) -> list[Argument]:
        self.expect("(")
        args: list[Argument] = []
        kwarg_only = False
        if self.accept(")"):
            return args
        while True:
            if self.accept("*"):
                if kwarg_only:
                    raise self.error("'*' appears twice")
                kwarg_only = True
            else:
                typ = self.type()
                name = self.ident("an argument name")
                default = self.default(typ, name) if self.accept("=") else None
                args.append(Argument(name, typ, default, kwarg_only))
            if self.accept(")"):
                return args
            self.expect(",")

    def returns(self) -> list[Return]:
        self.skip()
        if self.accept("("):
            rets: list[Return] = []
            if self.accept(")"):
                return rets
            while True:
                typ = self.type()
                self.skip()
                name = self.ident("a return name") if _IDENT.match(self.text, self.pos) else None
                rets.append(Return(typ, name))
                if self.accept(")"):
                    return rets
                self.expect(",")
        return [Return(self.type())]


def _check_default(value: str, typ: Type, name: str, parser: _Parser) -> None:
    def bad(why: str) -> SchemaError:
        return parser.error(f"default {value!r} of argument {name!r} ({typ}): {why}")

    if not value:
        raise bad("empty default")
    if value == "None":
        if not typ.optional:
            raise bad("only an optional type ('T?') may default to None")
        return
    base = typ.base
    if typ.is_list:
        if _INT.match(value) and base in ("int", "SymInt") and typ.list_size is not None:
            return
        if not (value.startswith("[") and value.endswith("]")):
            raise bad("a list default is written '[1, 2]'")
        items = [v.strip() for v in value[1:-1].split(",") if v.strip()]
        for item in items:
            _check_scalar_default(item, base, bad)
        return
    _check_scalar_default(value, base, bad)


def _check_scalar_default(value: str, base: str, bad) -> None:  # type: ignore[no-untyped-def]
    if base in ("int", "SymInt"):
        ok = bool(_INT.match(value))
        if ok and not -(2**63) <= int(value) < 2**63:
            raise bad("out of the range of a 64-bit integer, which torch stores it in")
    elif base in ("float", "SymFloat", "Scalar"):
        ok = bool(_NUMBER.match(value))
        if ok and math.isinf(float(value)):
            raise bad("too large for a double, which torch stores it in")
    elif base in ("bool", "SymBool"):
        ok = value in ("True", "False")
    elif base == "str":
        ok = bool(_STRING.match(value))
    else:
        raise bad(f"opregistry supports defaults for {base} arguments only as None")
    if not ok:
        why = f"not a valid {base} literal"
        if value.lstrip("+-") in ("inf", "nan"):
            why = "torch's schema language has no literal for inf or nan; default to None instead"
        elif value.startswith("+"):
            why = "torch's schema language does not take a leading '+'"
        raise bad(why)


def _parse(text: str, *, named: bool) -> Schema:
    if not isinstance(text, str):
        raise SchemaError(f"a schema is a string, got {type(text).__name__}")
    p = _Parser(text)
    name = overload = ""
    if named:
        name = p.ident("the op name")
        if p.text.startswith(".", p.pos):
            p.pos += 1
            overload = p.ident("the overload name")
            if overload == "default":
                raise p.error("'default' is reserved for the unnamed overload; leave it out")
    arguments = p.arguments()
    p.expect("->")
    returns = p.returns()
    p.skip()
    if p.pos != len(p.text):
        raise p.error(f"unexpected text {p.text[p.pos:]!r} after the returns")
    schema = Schema(name, overload, arguments, returns)
    _check_semantics(schema, text)
    return schema


def _check_semantics(schema: Schema, text: str) -> None:
    if len(schema.arguments) > MAX_ARGUMENTS:
        raise SchemaError(
            f"invalid schema {text!r}: {len(schema.arguments)} arguments, and torch "
            f"supports at most {MAX_ARGUMENTS} (Library.define would fail, and leave the op's "
            f"name in the dispatcher); pass a list (Tensor[]) or fewer arguments")
    seen: set[str] = set()
    for arg in schema.arguments:
        if arg.name in seen:
            raise SchemaError(
                f"invalid schema {text!r}: argument {arg.name!r} appears twice "
                f"(torch accepts this and later binds the wrong value; rename one)"
            )
        seen.add(arg.name)
    arg_aliases: dict[str, bool] = {}
    for arg in schema.arguments:
        a = arg.type.alias
        if a is None:
            continue
        if a.name in arg_aliases:
            raise SchemaError(
                f"invalid schema {text!r}: alias set '{a.name}' is used by two arguments; "
                f"give each argument its own"
            )
        arg_aliases[a.name] = a.is_write
    for ret in schema.returns:
        a = ret.type.alias
        if a is None:
            continue
        if a.name not in arg_aliases:
            raise SchemaError(
                f"invalid schema {text!r}: a return is annotated '({a.name}"
                f"{'!' if a.is_write else ''})' but no argument carries alias set '{a.name}'"
            )
        if a.is_write != arg_aliases[a.name]:
            raise SchemaError(
                f"invalid schema {text!r}: alias set '{a.name}' is written ('!') on one "
                f"side and not on the other; annotate the argument and the return alike"
            )


def parse_schema(text: str) -> Schema:
    """Parse a full schema, ``"name.overload(Tensor x) -> Tensor"``."""
    return _parse(text, named=True)


def parse_signature(text: str) -> Schema:
    """Parse a schema without its name, ``"(Tensor x) -> Tensor"``.

    Memoized: op packages repeat a few signatures over hundreds of ops, and
    the records are frozen (a failing text is not cached: it raises again).
    """
    if isinstance(text, str):
        return _parse_signature_cached(text)
    return _parse(text, named=False)


@functools.lru_cache(maxsize=4096)
def _parse_signature_cached(text: str) -> Schema:
    return _parse(text, named=False)


def check_mutates_args(schema: Schema, mutates_args: Iterable[str] | None, op: str) -> None:
    """Rule 7: ``mutates_args`` must name exactly the arguments annotated ``(x!)``."""
    if mutates_args is None:
        return
    declared = set(mutates_args)
    unknown = declared - {a.name for a in schema.arguments}
    if unknown:
        raise SchemaError(
            f"{op}: mutates_args names {sorted(unknown)}, which the schema does not have",
            op=op,
        )
    written = set(schema.mutated_args)
    if declared != written:
        raise SchemaError(
            f"{op}: mutates_args={sorted(declared)} but the schema writes to "
            f"{sorted(written)} (arguments annotated 'Tensor(a!)'); make them agree",
            op=op,
        )


def _plain_tensor(typ: Type) -> bool:
    """``Tensor`` itself: not a list, not optional (torch's ``TensorType``)."""
    return typ.base == "Tensor" and not typ.is_list and not typ.optional


def check_tags(schema: Schema, tags: Iterable[str], op: str) -> None:
    """The schema rules ``Library.define`` enforces for the ``out`` and ``inplace`` tags.

    The same rules as torch's ``_validate_out_schema`` / ``_validate_inplace_schema``
    (torch/library.py), checked before torch is touched.
    """
    tags = set(tags)

    def bad(tag: str, why: str) -> SchemaError:
        return SchemaError(f"{op}: a schema tagged '{tag}' {why}; got {schema.signature!r}", op=op)

    mutable = [a for a in schema.arguments if a.is_write]
    if "out" in tags:
        if not mutable:
            raise bad("out", "needs at least one mutable argument ('Tensor(a!) out')")
        positional = [a.name for a in mutable if not a.kwarg_only]
        if positional:
            raise bad("out", f"must have its mutable arguments keyword-only (after '*'): {positional}")
        not_tensor = [a.name for a in mutable if not _plain_tensor(a.type)]
        if not_tensor:
            raise bad("out", f"may only mutate Tensor arguments: {not_tensor}")
        if len(schema.returns) != len(mutable):
            raise bad("out", f"must return each of its {len(mutable)} mutable argument(s), "
                             f"in order, and nothing else")
        for ret, arg in zip(schema.returns, mutable):
            alias = ret.type.alias
            if alias is None or not alias.is_write or alias.name != arg.type.alias.name:  # type: ignore[union-attr]
                raise bad("out", f"must return '{arg.name}' as 'Tensor({arg.type.alias.name}!)'")  # type: ignore[union-attr]
    if "inplace" in tags:
        args = schema.arguments
        if not args or args[0].kwarg_only:
            raise bad("inplace", "needs a positional first argument")
        first = args[0]
        if not first.is_write or not _plain_tensor(first.type):
            raise bad("inplace", "must take its first argument as a mutable Tensor ('Tensor(a!)')")
        if len(schema.returns) != 1:
            raise bad("inplace", "must return exactly its first argument")
        ret = schema.returns[0]
        alias = ret.type.alias
        if (not _plain_tensor(ret.type) or alias is None or not alias.is_write
                or alias.name != first.type.alias.name):  # type: ignore[union-attr]
            raise bad("inplace", f"must return its first argument as "
                                 f"'Tensor({first.type.alias.name}!)'")  # type: ignore[union-attr]
        others = [a.name for a in args[1:] if a.is_write]
        if others:
            raise bad("inplace", f"may only mutate its first argument, not {others}")

