"""Operator schemas, parsed and checked without importing torch.

The resolver must judge a schema before torch is touched, and ``opregistry
list`` must show schemas without torch at all, so opregistry carries a parser
for torch's schema language: the one ``torch.library.define`` reads
(``function_schema_parser.cpp`` and ``schema_type_parser.cpp``, without type
variables), every form torch itself prints included.  Its verdict is torch's
(tests/test_schema_differential.py holds it to that over every schema torch
knows, on every supported release), with one documented exception that torch
accepts and then fails on (:data:`DELIBERATE_REFUSALS`).  What depends on the
release (a type, a dtype name, a class torch registers) is checked by the
resolver against :mod:`opregistry.keys`; the parser knows every release's
words.

Tokens and literals are :mod:`opregistry.schema_lexer`'s.
"""

from __future__ import annotations

import functools
from typing import Callable, Iterable

from attrs import Factory, field, frozen

from .errors import SchemaError
from .keys import (DEVICE_TYPES, DTYPE_SINCE, FAKE_INT_TYPES, SCHEMA_TYPES, TYPE_SINCE, TYPE_UNTIL,
                   all_dtype_names)
from .schema_lexer import (KEYWORDS, LexError, device_error, double_value, integer_value,
                           string_value, token_offsets, tokenize)

__all__ = [
    "Alias",
    "Type",
    "Argument",
    "Return",
    "Schema",
    "BASE_TYPES",
    "SCHEMA_KEYWORDS",
    "MAX_ARGUMENTS",
    "DELIBERATE_REFUSALS",
    "parse_schema",
    "parse_signature",
    "split_name",
    "overload_refusal",
    "check_mutates_args",
    "check_tags",
]

#: Every named type some supported release's schema parser takes (``Tensor`` and the
#: entries of its type table); which release takes which is :mod:`opregistry.keys`'.
BASE_TYPES: frozenset[str] = frozenset(SCHEMA_TYPES) | {"Tensor"}

#: Words torch's schema lexer reserves (``torch/csrc/jit/frontend/lexer.h``): torch
#: cannot parse them as a namespace, op, overload or argument name.
SCHEMA_KEYWORDS: frozenset[str] = KEYWORDS
#: c10's limit on the arguments of one schema ("this PyTorch build only supports 64")
MAX_ARGUMENTS = 64

#: What torch's ``Library.define`` accepts and opregistry refuses on purpose, by code:
#: why, and where torch fails later.  docs/op-authors.md lists them;
#: tests/test_schema_differential.py shows each failure.
DELIBERATE_REFUSALS: dict[str, str] = {
    "duplicate-argument-name": (
        "two arguments with one name: torch.library.define accepts it, but the op's Python "
        "signature cannot be built, so torch.library.opcheck fails (test_schema: \"duplicate "
        "parameter name\") and so does torch.fx's argument normalization; a keyword call "
        "binds one of the two arbitrarily"),
}

#: composite type names (a :class:`Type`'s ``name`` when it has ``contained`` types)
LIST, OPTIONAL, TUPLE = "[]", "?", "()"
_WRAPPERS = ("Future", "RRef", "Await")
_CLASS_PREFIX = "__torch__.torch.classes."
#: identifiers a default may use for any number (``function_schema_parser.cpp``)
_DEFAULT_WORDS = {"float": 6, "long": 4, "strided": 0, "contiguous_format": 0, "Mean": 1}
_NUMBER_START = frozenset("0123456789.")


@frozen
class Alias:
    """An alias annotation: ``(a)``, ``(a!)``, ``(a|b)``, ``(a! -> a|b)``, ``(*)`` or ``!``.

    ``sets`` are the alias sets as written (``"*"`` the wildcard); empty for
    ``Tensor!`` (a fresh set of its own, torch's ``$0``...) and for the alias
    torch gives a list whose elements are annotated (``Tensor(a!)[]``).
    ``after`` is what follows ``->``; ``None`` when nothing does.
    """

    sets: tuple[str, ...] = ()
    is_write: bool = False
    after: tuple[str, ...] | None = None

    @property
    def name(self) -> str | None:
        """The first alias set, ``None`` for a fresh one."""
        return self.sets[0] if self.sets else None

    @property
    def is_fresh(self) -> bool:
        return not self.sets

    def same_sets(self, other: Alias) -> bool:
        """Whether both name the same alias sets (torch's ``before_set`` equality); a fresh set
        is its own and equals none."""
        return bool(self.sets) and frozenset(self.sets) == frozenset(other.sets)

    def __str__(self) -> str:
        if not self.sets:
            return "!"
        after = "" if self.after is None else " -> " + "|".join(self.after)
        return f"({'|'.join(self.sets)}{'!' if self.is_write else ''}{after})"


@frozen
class Type:
    """A schema type: a named type (``Tensor``, ``int``, a custom class) or a composite.

    ``name`` is the type's name, or for a composite ``"[]"`` (a list of
    ``contained[0]``, ``size`` elements when fixed), ``"?"`` (optional),
    ``"()"`` (a tuple), ``"Dict"``, ``"Union"``, ``"Future"``, ``"RRef"``,
    ``"Await"``.  ``alias`` is the annotation written on this level.
    """

    name: str
    contained: tuple[Type, ...] = ()
    alias: Alias | None = None
    #: a fixed-size list's size as written (what ``stoll`` reads); torch's: :attr:`list_size`
    size: int | None = None
    #: the named type under lists and optionals (``"Tensor"`` for ``Tensor?[]``); derived
    base: str = field(default=Factory(lambda t: _base_of(t), takes_self=True), eq=False,
                      repr=False)
    #: the alias torch gives an argument of this type (``Argument.alias_info``): a list's own
    #: annotation, or, when only its elements are annotated (``Tensor(a!)[]``), an alias of the
    #: list that writes if they do; derived
    alias_info: Alias | None = field(default=Factory(lambda t: _alias_info_of(t), takes_self=True),
                                     eq=False, repr=False)

    @property
    def optional(self) -> bool:
        return self.name == OPTIONAL

    @property
    def is_list(self) -> bool:
        """A list, or an optional list (``Tensor[]?``)."""
        return (self.contained[0] if self.optional else self).name == LIST

    @property
    def element_optional(self) -> bool:
        """A list of optionals (``Tensor?[]``)."""
        t = self.contained[0] if self.optional else self
        return t.name == LIST and t.contained[0].name == OPTIONAL

    @property
    def list_size(self) -> int | None:
        """The fixed size of a list, as torch holds it (a 32-bit int: ``int[4294967298]`` is 2)."""
        t = self.contained[0] if self.optional else self
        if t.name != LIST or t.size is None:
            return None
        return (t.size + 2**31) % 2**32 - 2**31

    @property
    def is_tensor_like(self) -> bool:
        """``Tensor``, ``Tensor?``, ``Tensor[]``, ``Tensor?[]``... (``is_tensor_like_type``)."""
        return self.base == "Tensor"

    @property
    def is_plain_tensor(self) -> bool:
        """``Tensor`` itself, with or without alias (torch's ``isinstance(t, TensorType)``)."""
        return self.name == "Tensor"

    def walk(self) -> Iterable[Type]:
        """This type and every type it contains."""
        yield self
        for t in self.contained:
            yield from t.walk()

    def __str__(self) -> str:
        alias = "" if self.alias is None else str(self.alias)
        if self.name == LIST:
            size = "" if self.size is None else str(self.size)
            return f"{self.contained[0]}[{size}]{alias}"
        if self.name == OPTIONAL:
            return f"{self.contained[0]}?"
        if self.name == TUPLE:
            return "(" + ", ".join(map(str, self.contained)) + ")"
        if self.contained:
            return f"{self.name}({', '.join(map(str, self.contained))}){alias}"
        return self.name + alias


def _base_of(typ: Type) -> str:
    if not typ.contained:
        return typ.name
    return typ.contained[0].base if typ.name in (LIST, OPTIONAL) else typ.name


def _alias_info_of(typ: Type) -> Alias | None:
    if not typ.contained or typ.alias is not None:
        return typ.alias
    if typ.name == OPTIONAL:
        return typ.contained[0].alias_info
    if typ.name == LIST:
        inner = typ.contained[0].alias_info
        return None if inner is None else Alias((), inner.is_write)
    return None


@frozen
class Argument:
    name: str
    type: Type
    #: the default as written (normalized spacing): ``"None"``, ``"[1, 2]"``, ``'"x"'``
    default: str | None = None
    kwarg_only: bool = False

    @property
    def is_write(self) -> bool:
        """The op writes to this argument (its alias annotation has ``!``)."""
        alias = self.type.alias_info
        return alias is not None and alias.is_write


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
    #: ``...`` closes the arguments / the returns (torch's varargs, varret)
    is_vararg: bool = False
    is_varret: bool = False
    #: an explicit namespace, ``ns::name(...)``; empty when none was written
    namespace: str = ""
    #: the words whose meaning depends on the torch release, for the resolver to check against
    #: the installed one: types some releases lack, custom classes (``__torch__.torch.classes.
    #: NS.Class``), dtype names some releases lack (in ``ScalarType`` defaults)
    versioned: frozenset[str] = frozenset()

    @property
    def mutated_args(self) -> tuple[str, ...]:
        """Names of the arguments the op writes to (``(a!)``, ``!``): those it mutates."""
        return tuple(a.name for a in self.arguments if a.is_write)

    @property
    def is_mutable(self) -> bool:
        return bool(self.mutated_args)

    @property
    def is_functional(self) -> bool:
        """Writes to no argument and returns no alias of one (no ``(a!)``, no ``(a)`` return)."""
        return not self.is_mutable and not any(r.type.alias_info for r in self.returns)

    @property
    def has_kwarg_only_tensors(self) -> bool:
        """Some tensor argument is keyword-only (after ``*``)."""
        return any(a.kwarg_only and a.type.is_tensor_like for a in self.arguments)

    @property
    def is_factory(self) -> bool:
        """No tensor argument to dispatch on, and a ``Device`` argument to route by."""
        return not self.tensor_arguments and any(a.type.base == "Device" for a in self.arguments)

    @property
    def tensor_arguments(self) -> tuple[Argument, ...]:
        return tuple(a for a in self.arguments if a.type.is_tensor_like)

    @property
    def types(self) -> frozenset[str]:
        """Every named type the schema uses, contained ones included (custom classes in full)."""
        return frozenset(t.name for x in (*self.arguments, *self.returns) for t in x.type.walk()
                         if not t.contained and t.name != TUPLE)

    def deliberate_refusal(self) -> tuple[str, str] | None:
        """``(code, why)`` when opregistry refuses this schema although torch accepts it
        (:data:`DELIBERATE_REFUSALS`), else ``None``."""
        seen: set[str] = set()
        for arg in self.arguments:
            if arg.name in seen:
                return ("duplicate-argument-name",
                        f"argument {arg.name!r} appears twice; "
                        + DELIBERATE_REFUSALS["duplicate-argument-name"] + "; rename one")
            seen.add(arg.name)
        return None

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
    def signature(self) -> str:
        """The schema without its name, as torch reads it back: ``(Tensor x) -> Tensor``."""
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
        if self.is_vararg:
            args.append("...")
        rets = [f"{r.type}{' ' + r.name if r.name else ''}" for r in self.returns]
        if self.is_varret:
            ret = "(" + ", ".join(rets + ["..."]) + ")" if rets else "..."
        elif len(rets) == 1 and not self.returns[0].type.name == TUPLE:
            ret = rets[0]
        else:
            ret = "(" + ", ".join(rets) + ")"
        return f"({', '.join(args)}) -> {ret}"

    def __str__(self) -> str:
        name = (self.namespace + "::" if self.namespace else "") + self.name
        return name + ("." + self.overload if self.overload else "") + self.signature


# -- the parser ----------------------------------------------------------------------

_EOF = ""
#: the named types and dtype names whose availability depends on the release (:mod:`.keys`)
_VERSIONED_TYPES = frozenset(TYPE_SINCE) | frozenset(TYPE_UNTIL)
_VERSIONED_DTYPES = frozenset(DTYPE_SINCE)
_NONE: frozenset[str] = frozenset()
_IDENT_START = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_")
#: named types without alias: one record each, shared by every schema
_NAMED: dict[str, Type] = {name: Type(name) for name in BASE_TYPES}
#: a fresh alias set (``Tensor!``): torch numbers them ($0, $1...), opregistry needs only one
_FRESH = Alias((), True)
#: hints for names people write that torch's schema language spells otherwise
_TYPE_HINTS = {
    "double": "write 'float' (a C++ double)",
    "int64_t": "write 'int' (or 'SymInt' for a size that may be symbolic)",
    "Optional": "write 'T?' for an optional T",
    "List": "write 'T[]' for a list of T",
    "Tuple": "write '(A, B)' for a tuple",
    "SymFloat": "no release of torch's schema parser takes it; write 'float'",
}
#: named types whose only default is None
_NONE_DEFAULTS = frozenset({"Tensor", "Generator", "Quantizer"})
#: named types a default is one constant for (their fake type is a number, a bool or a string)
_CONSTANT_DEFAULTS = frozenset({"str", "Dimname", "Scalar", "int", "bool", "float", "complex"}
                               | FAKE_INT_TYPES)


def _is_ident(tok: str) -> bool:
    return tok[:1] in _IDENT_START and tok not in KEYWORDS


def _is_number(tok: str) -> bool:
    return tok[:1] in _NUMBER_START and tok != "..." and (tok[0] != "." or tok[1:2].isdigit())


class _Tokens:
    """The token stream of one schema, and the errors that point into its text."""

    def __init__(self, text: str) -> None:
        self.text = text
        try:
            self.toks = tokenize(text)
        except LexError as exc:
            raise self.error(str(exc), offset=exc.offset) from None
        self.i = 0
        #: release-dependent words met (:attr:`Schema.versioned`)
        self.versioned: list[str] = []

    def error(self, what: str, *, offset: int | None = None, at: int | None = None) -> SchemaError:
        if offset is None:
            offsets = token_offsets(self.text)
            index = self.i if at is None else at
            offset = offsets[index] if index < len(offsets) else len(self.text)
        return SchemaError(f"invalid schema {self.text!r}: {what} (at column {offset + 1})")

    def found(self) -> str:
        tok = self.toks[self.i]
        return repr(tok) if tok else "the end of the schema"

    def next(self) -> str:
        tok = self.toks[self.i]
        if tok:
            self.i += 1
        return tok

    def accept(self, tok: str) -> bool:
        if self.toks[self.i] == tok:
            self.i += 1
            return True
        return False

    def expect(self, tok: str, what: str | None = None) -> None:
        if self.toks[self.i] != tok:
            raise self.error(f"expected {what or repr(tok)}, found {self.found()}")
        self.i += 1

    def ident(self, what: str) -> str:
        tok = self.toks[self.i]
        if not _is_ident(tok):
            if tok in KEYWORDS:
                raise self.error(f"{tok!r} cannot be {what}: it is a keyword of torch's schema "
                                 f"language")
            raise self.error(f"expected {what}, found {self.found()}")
        self.i += 1
        return tok


class _Types(_Tokens):
    """The type grammar (``SchemaTypeParser``): named types, composites, alias annotations."""

    def type(self) -> Type:
        tok = self.next()
        if tok == "(":
            items: list[Type] = []
            if not self.accept(")"):
                items.append(self.type())
                while self.accept(","):
                    items.append(self.type())
                self.expect(")", "',' or ')'")
            typ = Type(TUPLE, tuple(items))
        elif tok in _WRAPPERS:
            self.expect("(")
            typ = Type(tok, (self.type(),))
            self.expect(")")
        elif tok == "Dict":
            self.expect("(")
            key = self.type()
            self.expect(",", "',' and the value type")
            value = self.type()
            self.expect(")")
            typ = Type("Dict", (key, value), self.alias())
        elif tok == "Union":
            typ = self.union()
        elif tok == "__torch__":
            typ = Type(self.class_name())
            self.versioned.append(typ.name)
        else:
            typ = _NAMED[self.base(tok)]
            if tok in _VERSIONED_TYPES:
                self.versioned.append(tok)
            if self.toks[self.i] in ("(", "!"):
                typ = Type(typ.name, alias=self.alias())
        while True:
            tok = self.toks[self.i]
            if tok == "[" and self.toks[self.i + 1] == "]":
                self.i += 2
                typ = Type(LIST, (typ,), self.alias())
            elif tok == "?":
                self.i += 1
                typ = Type(OPTIONAL, (typ,))
            else:
                return typ

    def base(self, tok: str) -> str:
        if tok in _NAMED:
            return tok
        self.i -= bool(tok)
        if not _is_ident(tok) and tok not in ("None", "NoneType"):
            raise self.error(f"expected a type, found {self.found()}")
        hint = _TYPE_HINTS.get(tok)
        if hint is None and tok[:1].islower():
            hint = ("lowercase names are type variables in TorchScript, which "
                    "torch.library.define refuses")
        raise self.error(f"unknown type {tok!r}; " + (hint or "torch's schema types are "
                                                       + ", ".join(sorted(BASE_TYPES))))

    def class_name(self) -> str:
        """``__torch__.torch.classes.NS.Class``: a class registered with torch (checked later)."""
        for word in ("torch", "classes"):
            self.expect(".")
            if self.next() != word:
                raise self.error("a custom class type is written __torch__.torch.classes.NS."
                                 "Class", at=self.i - 1)
        self.expect(".")
        ns = self.ident("a custom class namespace")
        self.expect(".", "'.' and the class name")
        return f"{_CLASS_PREFIX}{ns}.{self.ident('a custom class name')}"

    def union(self) -> Type:
        self.expect("(")
        members = [self.type()]
        while self.accept(","):
            members.append(self.type())
        self.expect(")", "',' or ')'")
        typ = Type("Union", tuple(members), self.alias())
        if len(_unified(typ)) == 1:
            raise self.error(f"{typ} is a single type once torch unifies its members (it "
                             f"refuses such a Union); write that type instead")
        return typ

    def alias(self) -> Alias | None:
        tok = self.toks[self.i]
        if tok == "!":
            self.i += 1
            return _FRESH
        if tok != "(":
            return None
        self.i += 1
        sets = self.alias_sets()
        write = self.accept("!")
        after = self.alias_sets() if self.accept("->") else None
        self.expect(")", "')' closing the alias annotation")
        return Alias(sets, write, after)

    def alias_sets(self) -> tuple[str, ...]:
        """``a|b``; after a wildcard ``*`` torch ignores the rest, and takes only more ``*``."""
        sets: list[str] = []
        while True:
            if self.accept("*"):
                if "*" not in sets:
                    sets.append("*")
            elif "*" not in sets:
                sets.append(self.ident("an alias set name"))
            if not self.accept("|"):
                return tuple(sets)


class _Defaults(_Tokens):
    """Default values, as ``parseDefaultValue`` reads them for each type."""

    def default(self, typ: Type) -> str:
        """A default value, read as ``function_schema_parser.cpp`` reads it for ``typ``.

        torch converts it by the argument's type only as far as its parser needs
        to (``int x=1.5`` and ``str x=1`` pass); opregistry checks no more.
        """
        start = self.i
        name = typ.name
        if name == OPTIONAL or (name == "Union" and _union_is_optional(typ)):
            return self.constant(typ.contained[0].name == "ScalarType", "")[1]
        if name == LIST:
            return self.list_default(typ)
        if name in _NONE_DEFAULTS:
            self.expect("None", f"None (the only default of a {name} argument)")
            return "None"
        if name == "Device":
            tok = self.next()
            quoted = bool(tok) and tok[0] in "'\""
            why = None if quoted else "a Device default is a string, e.g. \"cpu\""
            why = why or self.string_error(tok) or device_error(string_value(tok), DEVICE_TYPES)
            if why:
                raise self.error(why, at=start)
            return tok
        if name in _CONSTANT_DEFAULTS:
            return self.constant(name == "ScalarType", _number_kind(name))[1]
        raise self.error(f"torch's schema parser has no default value for a {typ} argument",
                         at=start)

    def list_default(self, typ: Type) -> str:
        element = typ.contained[0]
        kind = _list_kind(element)
        words = element.name == "ScalarType"
        if _is_ident(self.toks[self.i]):
            raise self.error(f"a list default is written '[...]' (or, for a fixed size, one "
                             f"value), found {self.found()}")
        start = self.i
        if typ.size is not None and self.toks[self.i] != "[":
            value, text = self.constant(words, _number_kind(element.name))
            values = [value]
            if typ.list_size < 0:  # type: ignore[operator]
                raise self.error(f"a default of one value for {typ} repeats it {typ.list_size} "
                                 f"times, which torch cannot", at=start)
        else:
            self.expect("[", "'[' opening a list default")
            items = []
            if self.toks[self.i] != "]":
                items.append(self.constant(words, _number_kind(element.name)))
                while self.accept(","):
                    items.append(self.constant(words, _number_kind(element.name)))
            self.expect("]", "',' or ']'")
            values = [v for v, _ in items]
            text = "[" + ", ".join(t for _, t in items) + "]"
        if kind is None:
            raise self.error(f"torch's list defaults are lists of int, float, bool or complex, "
                             f"not of {element}", at=start)
        bad = [v for v in values if v not in _LIST_VALUES[kind]]
        if bad:
            raise self.error(f"a {bad[0]} in a default of {typ}, which torch cannot convert",
                             at=start)
        return text

    def constant(self, dtype_words: bool, kind: str) -> tuple[str, str]:
        """One constant: ``(what it is, its text)``; ``kind`` is the number kind torch reads
        numbers with (``"float"``, ``"complex"`` or ``""``: by how they are written)."""
        at = self.i
        tok = self.next()
        if tok in ("True", "False"):
            return "bool", tok
        if tok == "None":
            return "None", tok
        if tok[:1] in "'\"" and tok:
            why = self.string_error(tok)
            if why:
                raise self.error(why, at=at)
            return "str", tok
        if _is_ident(tok):
            if tok in _DEFAULT_WORDS or (dtype_words and tok in all_dtype_names()):
                if tok in _VERSIONED_DTYPES and tok not in _DEFAULT_WORDS:
                    self.versioned.append(tok)
                return "int", tok
            raise self.error(f"{tok!r} is not a default torch knows (numbers, True, False, None, "
                             f"strings, and the words {', '.join(_DEFAULT_WORDS)}"
                             + (", or a dtype name" if dtype_words else "") + ")", at=at)
        number = tok
        if tok == "-":
            number = "-" + self.next()
            tok = number[1:]
        if not _is_number(tok):
            raise self.error(f"expected a default value, found {tok or 'the end'!r}", at=at)
        return _number(number, kind, lambda why: self.error(why, at=at))

    @staticmethod
    def string_error(tok: str) -> str | None:
        try:
            string_value(tok)
        except ValueError as exc:
            return str(exc)
        return None


class _Parser(_Types, _Defaults):
    """Recursive descent over the tokens, one method per rule of torch's grammar."""

    def declaration(self, named: bool) -> Schema:
        namespace = name = overload = ""
        if named:
            name = self.ident("the op name")
            if self.accept(":"):
                self.expect(":", "'::'")
                namespace, name = name, self.ident("the op name")
            if self.accept("."):
                overload = self.ident("the overload name")
                why = overload_refusal(overload)
                if why:
                    raise self.error(why, at=self.i - 1)
        arguments, vararg = self.arguments()
        self.expect("->", "'->' and the returns")
        returns, varret = self.returns()
        if self.toks[self.i] != _EOF:
            rest = self.text[token_offsets(self.text)[self.i]:]
            raise self.error(f"unexpected text {rest!r} after the returns")
        return Schema(name, overload, arguments, returns, vararg, varret, namespace,
                      frozenset(self.versioned) if self.versioned else _NONE)

    def arguments(self) -> tuple[list[Argument], bool]:
        self.expect("(", "'(' and the arguments")
        args: list[Argument] = []
        kwarg_only = vararg = False
        if self.accept(")"):
            return args, vararg
        while True:
            if vararg:
                raise self.error("'...' must close the argument list")
            if self.accept("*"):
                kwarg_only = True
            elif self.accept("..."):
                vararg = True
            else:
                args.append(self.argument(kwarg_only))
            if self.accept(")"):
                return args, vararg
            self.expect(",", "',' or ')'")

    def argument(self, kwarg_only: bool) -> Argument:
        typ = self.type()
        if self.toks[self.i] == "[":
            typ = self.fixed_list(typ)
        name = self.ident("an argument name")
        default = self.default(typ) if self.accept("=") else None
        return Argument(name, typ, default, kwarg_only)

    def returns(self) -> tuple[list[Return], bool]:
        if self.accept("..."):
            return [], True
        if not self.accept("("):
            return [self.ret()], False
        rets: list[Return] = []
        varret = False
        if self.accept(")"):
            return rets, varret
        while True:
            if varret:
                raise self.error("'...' must close the return list")
            if self.accept("..."):
                varret = True
            else:
                rets.append(self.ret())
            if self.accept(")"):
                return rets, varret
            self.expect(",", "',' or ')'")

    def ret(self) -> Return:
        typ = self.type()
        if self.toks[self.i] == "[":
            typ = self.fixed_list(typ)
        return Return(typ, self.next() if _is_ident(self.toks[self.i]) else None)

    def fixed_list(self, element: Type) -> Type:
        """``int[2]``: torch reads the size with ``stoll`` into a 32-bit int (``[1.5]`` is 1)."""
        self.i += 1
        tok = self.next()
        size = integer_value(tok) if _is_number(tok) else None
        if size is None:
            raise self.error(f"a list size is a number, found {tok!r}", at=self.i - 1)
        self.expect("]")
        typ = Type(LIST, (element,), self.alias(), size)
        return Type(OPTIONAL, (typ,)) if self.accept("?") else typ


#: what each kind of list element takes (IValue's toDouble, toInt, toBool, toComplexDouble)
_LIST_VALUES = {"float": ("int", "double"), "int": ("int",), "bool": ("bool",),
                "complex": ("complex",)}


def _number_kind(name: str) -> str:
    return name if name in ("float", "complex") else ""


def _list_kind(element: Type) -> str | None:
    name = element.name
    if name == "int" or name in FAKE_INT_TYPES:
        return "int"
    return name if name in ("float", "bool", "complex") else None


def _number(number: str, kind: str, error: Callable[[str], SchemaError]) -> tuple[str, str]:
    """``(kind, number)`` as torch converts a default number, or raise ``error(why)``.

    A ``j`` suffix or a complex argument: ``stod`` of the text less its last
    character, the imaginary part; a ``float`` argument, a ``.`` or an ``e``: ``stod``;
    else ``stoll``.  ``stod``/``stoll`` throw on what does not fit a double / an int64.
    """
    if kind == "complex" or number.endswith("j"):
        if double_value(number[:-1]) is None:
            raise error(f"{number} is not a complex number torch can read (write it as '1.5j'; "
                        f"torch takes the text before the last character as the imaginary part)")
        return "complex", number
    if kind == "float" or "." in number or "e" in number:
        if double_value(number) is None:
            raise error(f"{number} does not fit a double, which torch stores it in")
        return "double", number
    if integer_value(number) is None:
        raise error(f"{number} does not fit a 64-bit integer, which torch stores it in")
    return "int", number


# -- Union: torch's canonical form (c10's union_type.cpp) --------------------------------

def _key(typ: Type) -> tuple:  # type: ignore[type-arg]
    """What torch compares when it unifies the members of a Union: the type less its aliases,
    with the types its parser reads as ``int`` (SymInt, ScalarType...) or ``str`` (Dimname)
    merged."""
    name = typ.name
    if not typ.contained:
        if name in FAKE_INT_TYPES:
            return ("int",)
        return ({"Dimname": "str", "None": "NoneType"}.get(name, name),)
    if name == "Union":
        return ("Union", *sorted(set(_unified(typ))))
    return (name, *(_key(t) for t in typ.contained))


def _flatten(typ: Type, out: list[tuple]) -> None:  # type: ignore[type-arg]
    if typ.name == "Union":
        for member in typ.contained:
            _flatten(member, out)
    elif typ.name == OPTIONAL:
        _flatten(typ.contained[0], out)
        out.append(("NoneType",))
    elif typ.name == "Scalar":
        out += [("int",), ("float",), ("complex",)]
    else:
        out.append(_key(typ))


def _unify(a: tuple, b: tuple) -> tuple | None:  # type: ignore[type-arg]
    """The one type torch unifies ``a`` and ``b`` into (``unifyTypes``), or ``None``."""
    if a == b:
        return a
    if ("NoneType",) in (a, b):
        return None  # kept apart: a Union never coalesces None into an Optional member
    if ("Any",) in (a, b):
        return ("Any",)
    for x, y in ((a, b), (b, a)):
        if x == ("AnyClassType",) and y[0].startswith(_CLASS_PREFIX):
            return x
    if a[0] == b[0] and len(a) == len(b) and a[0] in (TUPLE, *_WRAPPERS):
        inner = [_unify_contained(x, y) for x, y in zip(a[1:], b[1:])]
        if all(t is not None for t in inner):
            return (a[0], *inner)
    return None


def _unify_contained(a: tuple, b: tuple) -> tuple | None:  # type: ignore[type-arg]
    """:func:`_unify` inside a tuple or a Future: there None and T unify into T?."""
    for x, y in ((a, b), (b, a)):
        if x == ("NoneType",) and y != x:
            return y if y[0] == OPTIONAL else (OPTIONAL, y)
    return _unify(a, b)


def _unified(typ: Type) -> list[tuple]:  # type: ignore[type-arg]
    """The members of Union ``typ`` after torch's flattening and unification."""
    flat: list[tuple] = []  # type: ignore[type-arg]
    _flatten(typ, flat)
    kept: list[tuple] = []  # type: ignore[type-arg]
    for member in flat:
        for j, other in enumerate(kept):
            merged = _unify(member, other)
            if merged is not None:
                kept[j] = merged
                break
        else:
            kept.append(member)
    return kept


def _union_is_optional(typ: Type) -> bool:
    """Whether torch makes Union ``typ`` an Optional (one type or the three numbers, and None)."""
    members = _unified(typ)
    if ("NoneType",) not in members:
        return False
    return len(members) == 2 or (len(members) == 4 and {("int",), ("float",), ("complex",)}
                                 <= set(members))


# -- entry points ----------------------------------------------------------------------

def overload_refusal(overload: str) -> str | None:
    """Why ``Library.define`` refuses this overload name, or ``None``."""
    if overload == "default":
        return "'default' is reserved for the unnamed overload; leave it out"
    if overload.startswith("__"):
        return f"overload name {overload!r}: torch refuses overload names that start with '__'"
    return None


def split_name(head: str) -> tuple[str, str, str] | None:
    """``(namespace, name, overload)`` of the text before a schema's ``(``, read as torch's
    lexer reads it (``"mylib::f.out"``, ``" f . out"``, a comment before it...); ``None``
    when it is no name torch reads.  Keywords pass: the resolver names them."""
    try:
        tokens = tokenize(head)
    except LexError:
        return None
    namespace = ""
    if len(tokens) > 3 and tokens[1:3] == [":", ":"]:
        namespace, tokens = tokens[0], tokens[3:]
    if len(tokens) == 2 and tokens[0][:1] in _IDENT_START:
        return namespace, tokens[0], ""
    if len(tokens) == 4 and tokens[1] == "." and tokens[0][:1] in _IDENT_START \
            and tokens[2][:1] in _IDENT_START:
        return namespace, tokens[0], tokens[2]
    return None


def _parse(text: str, *, named: bool, deliberate: bool = True) -> Schema:
    if not isinstance(text, str):
        raise SchemaError(f"a schema is a string, got {type(text).__name__}")
    try:
        schema = _Parser(text).declaration(named)
    except RecursionError:
        # types nest by recursion, as in torch's parser (whose C++ stack would give out too)
        raise SchemaError(f"invalid schema {text[:80]!r}...: types nested too deeply") from None
    _check(schema, text)
    if deliberate:
        refusal = schema.deliberate_refusal()
        if refusal is not None:
            raise SchemaError(f"invalid schema {text!r}: {refusal[1]}")
    return schema


def _check(schema: Schema, text: str) -> None:
    """What torch checks once the text is parsed (FunctionSchema's constructor, the dispatcher)."""
    if len(schema.arguments) > MAX_ARGUMENTS:
        raise SchemaError(
            f"invalid schema {text!r}: {len(schema.arguments)} arguments, and torch "
            f"supports at most {MAX_ARGUMENTS} (Library.define would fail, and leave the op's "
            f"name in the dispatcher); pass a list (Tensor[]) or fewer arguments")
    seen_default = None
    for arg in schema.arguments:
        if arg.kwarg_only:
            continue
        if arg.default is not None:
            seen_default = arg.name
        elif seen_default is not None:
            raise SchemaError(
                f"invalid schema {text!r}: positional argument {arg.name!r} has no default but "
                f"follows {seen_default!r}, which has one; give it a default or make it "
                f"keyword-only (after '*')")


def parse_schema(text: str, *, deliberate: bool = True) -> Schema:
    """Parse a full schema, ``"name.overload(Tensor x) -> Tensor"`` (``ns::`` may lead).

    :param deliberate: apply :data:`DELIBERATE_REFUSALS` (``False``: torch's verdict alone).
    :raises SchemaError: where ``Library.define`` would refuse the text, or opregistry does.
    """
    return _parse(text, named=True, deliberate=deliberate)


def parse_signature(text: str, *, deliberate: bool = True) -> Schema:
    """Parse a schema without its name, ``"(Tensor x) -> Tensor"``.

    Memoized: op packages repeat a few signatures over hundreds of ops, and
    the records are frozen (a failing text is not cached: it raises again).
    """
    if isinstance(text, str):
        return _parse_signature_cached(text, deliberate)
    return _parse(text, named=False)


@functools.lru_cache(maxsize=4096)
def _parse_signature_cached(text: str, deliberate: bool) -> Schema:
    return _parse(text, named=False, deliberate=deliberate)


def check_mutates_args(schema: Schema, mutates_args: Iterable[str] | None, op: str) -> None:
    """Rule 7: ``mutates_args`` must name exactly the arguments the schema writes to."""
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
            f"{sorted(written)} (arguments annotated 'Tensor(a!)' or 'Tensor!'); make them agree",
            op=op,
        )


def check_tags(schema: Schema, tags: Iterable[str], op: str) -> None:
    """The schema rules ``Library.define`` enforces for the ``out`` and ``inplace`` tags.

    The same rules as torch's ``_validate_out_schema`` / ``_validate_inplace_schema``
    (torch/library.py), checked before torch is touched.
    """
    tags = set(tags)

    def bad(tag: str, why: str) -> SchemaError:
        return SchemaError(f"{op}: a schema tagged '{tag}' {why}; got {schema.signature!r}", op=op)

    if "out" in tags:
        _check_out(schema, bad)
    if "inplace" in tags:
        _check_inplace(schema, bad)


def _check_out(schema: Schema, bad: Callable[[str, str], SchemaError]) -> None:
    mutable = [a for a in schema.arguments if a.is_write]
    if not mutable:
        raise bad("out", "needs at least one mutable argument ('Tensor(a!) out')")
    positional = [a.name for a in mutable if not a.kwarg_only]
    if positional:
        raise bad("out", f"must have its mutable arguments keyword-only (after '*'): {positional}")
    not_tensor = [a.name for a in mutable if not a.type.is_plain_tensor]
    if not_tensor:
        raise bad("out", f"may only mutate Tensor arguments: {not_tensor}")
    if len(schema.returns) != len(mutable):
        raise bad("out", f"must return each of its {len(mutable)} mutable argument(s), "
                         f"in order, and nothing else")
    for ret, arg in zip(schema.returns, mutable):
        alias, written = ret.type.alias_info, arg.type.alias_info
        assert written is not None
        if alias is None or not alias.is_write or not alias.same_sets(written):
            name = written.name
            raise bad("out", f"must return '{arg.name}' as "
                             + (f"'Tensor({name}!)'" if name else "the same alias set: annotate "
                                "both 'Tensor(a!)' ('Tensor!' gives each its own set)"))


def _check_inplace(schema: Schema, bad: Callable[[str, str], SchemaError]) -> None:
    args = schema.arguments
    if not args or args[0].kwarg_only:
        raise bad("inplace", "needs a positional first argument")
    first = args[0]
    if not first.is_write or not first.type.is_plain_tensor:
        raise bad("inplace", "must take its first argument as a mutable Tensor ('Tensor(a!)')")
    if len(schema.returns) != 1:
        raise bad("inplace", "must return exactly its first argument")
    ret = schema.returns[0]
    alias, written = ret.type.alias_info, first.type.alias_info
    assert written is not None
    if (not ret.type.is_plain_tensor or alias is None or not alias.is_write
            or not alias.same_sets(written)):
        raise bad("inplace", f"must return its first argument as "
                             f"'Tensor({written.name or 'a'}!)'")
    others = [a.name for a in args[1:] if a.is_write]
    if others:
        raise bad("inplace", f"may only mutate its first argument, not {others}")
