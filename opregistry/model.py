"""Frozen records: what plugins declare, and what discovery and collection hand on.

Every stage of the pipeline hands the next one plain, frozen attrs data, so
each can be printed, compared and tested without torch.  Op and backend
authors build :class:`Namespace`, :class:`OpDef`, :class:`Kernel` and
:class:`Backend` records (usually through :class:`~opregistry.OpLibrary`);
the collector stamps each with the :class:`Origin` it came from.  What a
kernel registers is its payload, one record per registration kind
(:mod:`opregistry.kinds`).  The records two stages exchange live here too --
:class:`Plugin`, :class:`Skipped` and :class:`Discovered` (discover ->
collect), :class:`Declarations` (collect -> resolve) -- so that no stage
imports another to learn a type; what the resolver decides is in
:mod:`opregistry.plans`.  Nothing here reads the machine.
"""

from __future__ import annotations

import inspect
import re
from typing import Any, Literal

import attrs
from attrs import field, frozen

from . import keys as _keys
from .conditions import Condition, in_range, parse_range, parse_requirement
from .errors import DOCS_URL, DeclarationError
from .kinds import Kind, payload_for
from .problems import PAGE, Severity, code_of
from .references import KernelRef, NativeLibrary, check_ref, describe_ref

__all__ = [
    "Origin",
    "Namespace",
    "NativeLibrary",
    "OpDef",
    "Kernel",
    "Candidate",
    "Condition",
    "parse_range",
    "in_range",
    "parse_requirement",
    "Backend",
    "Problem",
    "Severity",
    "Plugin",
    "Skipped",
    "Discovered",
    "Declarations",
    "KernelRef",
    "describe_ref",
    "is_identifier",
    "source_of",
    "elide",
    "TEXT_LIMIT",
    "evolve_unchecked",
]

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

#: the field names of each frozen record type, read once
_FIELDS: dict[type, tuple[str, ...]] = {}


def evolve_unchecked(record: Any, **changes: Any) -> Any:
    """``attrs.evolve(record, **changes)`` without converters or validators: for values
    already checked (a record's own, or what its validated references import to)."""
    cls = type(record)
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = tuple(a.name for a in attrs.fields(cls))
    new = object.__new__(cls)
    for name in names:
        object.__setattr__(new, name, changes[name] if name in changes else getattr(record, name))
    return new

NamespaceKind = Literal["DEF", "FRAGMENT"]


def source_of(where: Any) -> str | None:
    """``file:line`` of a function, a code object, a frame or a traceback entry.

    The one way opregistry computes a source location (declarations record
    the line of their ``define(...)`` call, problems the line of the hook or
    module at fault); ``None`` when ``where`` has no code (a builtin, a
    ``functools.partial``).
    """
    if where is None:
        return None
    if hasattr(where, "f_code"):  # a frame
        return f"{where.f_code.co_filename}:{where.f_lineno}"
    if hasattr(where, "filename") and hasattr(where, "lineno"):  # traceback.FrameSummary
        return f"{where.filename}:{where.lineno}"
    code = where if hasattr(where, "co_filename") else getattr(
        inspect.unwrap(where) if callable(where) else where, "__code__", None)
    return f"{code.co_filename}:{code.co_firstlineno}" if code is not None else None


def is_identifier(name: str) -> bool:
    """Whether ``name`` is an ASCII identifier, as torch requires of names."""
    return bool(_IDENT.match(name))


@frozen(order=True)
class Origin:
    """Where a declaration came from: a distribution and one of its entry points."""

    distribution: str
    version: str
    group: str = ""
    entry_point: str = ""
    value: str = ""

    @property
    def dist(self) -> str:
        """``name==version``, the way pip spells a pinned distribution."""
        return f"{self.distribution}=={self.version}"

    @property
    def entry_point_spec(self) -> str:
        return f"{self.entry_point} = {self.value}" if self.entry_point else ""

    def __str__(self) -> str:
        if not self.entry_point:
            return self.dist
        return f"{self.dist} (entry point '{self.entry_point} = {self.value}' in {self.group})"


@frozen(kw_only=True)
class Namespace:
    """A namespace a distribution defines (``DEF``) or adds ops to (``FRAGMENT``).

    ``closed=True`` on a ``DEF`` refuses fragments from other distributions.
    """

    name: str
    kind: NamespaceKind = field(default="DEF", validator=attrs.validators.in_(("DEF", "FRAGMENT")))
    closed: bool = False
    description: str = ""
    #: ``file:line`` of the declaration (the ``OpLibrary(...)`` call)
    source: str | None = field(default=None, eq=False)
    origin: Origin | None = field(default=None, eq=False, order=False)
    #: the compiled library whose ``TORCH_LIBRARY`` defines this namespace's
    #: declared ops (``None``: opregistry defines them from Python)
    native: NativeLibrary | None = None

    def __attrs_post_init__(self) -> None:
        if self.closed and self.kind != "DEF":
            raise DeclarationError(
                f"namespace {self.name!r}: only the DEF of a namespace can close it "
                f"(closed=True on a FRAGMENT means nothing)"
            )


@frozen(kw_only=True)
class OpDef:
    """One operator: ``namespace::name.overload`` and its schema.

    ``schema`` is the signature without the name, as
    :func:`torch.library.infer_schema` returns it: ``"(Tensor x) -> Tensor"``.
    ``samples`` names a function returning sample inputs for ``opcheck``: a
    list of ``(args, kwargs)`` pairs, or of objects with ``.args`` and
    ``.kwargs`` (as torch's ``SampleInput``).
    """

    namespace: str
    name: str
    schema: str
    overload: str = ""
    mutates_args: tuple[str, ...] | None = field(
        default=None, converter=attrs.converters.optional(tuple)
    )
    tags: tuple[str, ...] = field(default=(), converter=tuple)
    samples: KernelRef | None = field(default=None, validator=check_ref)
    doc: str = ""
    source: str | None = field(default=None, eq=False)
    origin: Origin | None = field(default=None, eq=False, order=False)

    @property
    def qualname(self) -> str:
        """``ns::name`` or ``ns::name.overload``, as torch spells it."""
        return f"{self.namespace}::{self.name_with_overload}"

    @property
    def base_qualname(self) -> str:
        """``ns::name``: the op packet, every overload of it."""
        return f"{self.namespace}::{self.name}"

    @property
    def name_with_overload(self) -> str:
        return f"{self.name}.{self.overload}" if self.overload else self.name

    @property
    def full_schema(self) -> str:
        """The schema string given to ``Library.define``."""
        return f"{self.name_with_overload}{self.schema}"


#: the keywords that declare a payload by its key (``Kernel(op=..., key=..., fn=...)``)
_PAYLOAD_KEYWORDS = ("fn", "setup_context", "triton", "dispatch_class", "native", "library")
_PAYLOAD_KEYWORD_SET = frozenset(_PAYLOAD_KEYWORDS)
#: (key as given, the payload's keywords) -> (canonical key, payload), for payloads declared by
#: reference strings: payloads are frozen records, equal for equal keywords, so the kernels
#: that declare the same functions share one (checked once; the materializer imports its
#: references once); bounded, for a process that declares without end
_DECLARED: dict[tuple[Any, ...], tuple[str, Any]] = {}
_DECLARED_MAX = 1 << 14


@frozen(kw_only=True, init=False)
class Kernel:
    """One registration for one op and dispatch key: which, by whom, and under what conditions.

    ``payload`` is what is registered, one record per kind
    (:mod:`opregistry.kinds`): a device kernel, a fake kernel, an autograd
    formula, a vmap rule, an autocast rule, a Triton kernel, a torch_dispatch
    rule, a C++ kernel -- or a kind a backend distribution defines.  The
    built-in kinds can also be declared by key, as ``torch.library`` does::

        Kernel(op="ns::f", key="cpu", fn="pkg.kernels:f")              # device kernel
        Kernel(op="ns::f", key="fake", fn="pkg.kernels:f_fake")        # fake kernel
        Kernel(op="ns::f", key="autograd", fn="pkg:bwd", setup_context="pkg:setup")

    ``key`` accepts torch's dispatch-key names and the aliases op authors use
    (``cpu``, ``cuda``, ``fake``, ``autograd``, ``vmap``); it is stored
    canonical.  ``override=True`` asks to replace a kernel another
    distribution (or torch) registered for the same key; the user's policy
    must allow it too.  ``when``, ``predicate`` and ``priority`` make a
    kernel of a kind that allows it a *candidate* (:mod:`opregistry.selection`).
    """

    op: str
    key: str = field(converter=_keys.canonical_key)
    payload: Any
    override: bool = False
    #: a candidate's conditions (:mod:`opregistry.selection`): checked once at load ...
    when: Condition | None = field(default=None, converter=Condition.of)
    #: ... and per call: a function of the op's arguments, true to take the call
    predicate: KernelRef | None = field(default=None, validator=check_ref)
    #: candidates of one (op, key) are tried by priority, highest first
    priority: int = 0
    source: str | None = field(default=None, eq=False)
    origin: Origin | None = field(default=None, eq=False, order=False)

    def __init__(self, *, op: str, key: str, payload: Any = None, override: bool = False,
                 when: Any = None, predicate: KernelRef | None = None, priority: int = 0,
                 source: str | None = None, origin: Origin | None = None,
                 **declared: Any) -> None:
        if declared and not declared.keys() <= _PAYLOAD_KEYWORD_SET:
            unknown = sorted(declared.keys() - _PAYLOAD_KEYWORD_SET)
            raise TypeError(f"Kernel() got unexpected keyword argument(s) {unknown}")
        if payload is None:
            plain = type(key) is str and all(
                v is None or type(v) is str or type(v) is bool for v in declared.values())
            memo = (key, *declared.items()) if plain else None
            found = None if memo is None else _DECLARED.get(memo)
            if found is not None:
                key, payload = found
            else:
                if "fn" not in declared:
                    raise DeclarationError(f"kernel for {op}: give its payload (payload=...) "
                                           f"or its function (fn=...)", op=op)
                key = _keys.canonical_key(key)  # the field's converter finds it canonical
                _check_key(op, key)
                payload = payload_for(op, key, **declared)
                if memo is not None:
                    if len(_DECLARED) >= _DECLARED_MAX:
                        _DECLARED.clear()
                    _DECLARED[memo] = (key, payload)
        elif set(declared) == {"fn"}:
            # attrs.evolve(kernel, fn=...): the same kind, another primary reference
            payload = attrs.evolve(payload, **{payload.kind.primary: declared["fn"]})
        elif declared:
            raise DeclarationError(f"kernel for {op}: give payload= or the function's keywords "
                                   f"({', '.join(sorted(declared))}), not both", op=op)
        self.__attrs_init__(op=op, key=key, payload=payload, override=override, when=when,
                            predicate=predicate, priority=priority, source=source, origin=origin)

    @property
    def kind(self) -> Kind:
        """The registration kind, the descriptor of :attr:`payload`."""
        return self.payload.kind

    @property
    def fn(self) -> Any:
        """The payload's primary reference: the kernel, backward formula, dtype or library."""
        return getattr(self.payload, self.payload.kind.primary)

    @property
    def conditional(self) -> bool:
        """Whether this kernel is a candidate with conditions (it may decline)."""
        return self.when is not None or self.predicate is not None

    @property
    def per_call(self) -> bool:
        """Whether a call may be declined by this kernel's conditions."""
        return self.predicate is not None or (
            self.when is not None and self.when.capability is not None)

    def __attrs_post_init__(self) -> None:
        kind = getattr(type(self.payload), "kind", None)
        if not isinstance(kind, Kind):
            raise DeclarationError(
                f"kernel for {self.op}: its payload {type(self.payload).__name__} has no kind "
                f"(a payload class names its opregistry.kinds.Kind as its 'kind' attribute)",
                op=self.op, key=self.key)
        if not kind.accepts(self.key):
            _check_key(self.op, self.key)
            raise DeclarationError(kind.wrong_key(self.op, self.key), op=self.op, key=self.key)
        kind.check(self)
        if not isinstance(self.priority, int) or isinstance(self.priority, bool):
            raise DeclarationError(
                f"kernel for {self.op} on {self.key}: priority must be an int, "
                f"not {self.priority!r}", op=self.op, key=self.key)
        if (self.conditional or self.priority) and not kind.candidates:
            raise DeclarationError(
                f"kernel for {self.op} on {self.key}: conditions and priorities choose "
                f"between device kernels (a key such as CPU, CUDA, or 'default'); a {self.key} "
                f"kernel has none", op=self.op, key=self.key)
        if self.when is not None and self.when.capability is not None and self.key != "CUDA":
            raise DeclarationError(
                f"kernel for {self.op} on {self.key}: a compute-capability condition "
                f"belongs to a CUDA kernel", op=self.op, key=self.key)

    @property
    def namespace(self) -> str:
        return self.op.split("::", 1)[0]


def _check_key(op: str, key: str) -> None:
    """Refuse a key torch has no name for: ``"CPu"`` is a typo to report, not a key to guess."""
    if not _keys.is_known_key(key):
        raise DeclarationError(f"kernel for {op}: unknown dispatch key {key!r}; "
                               f"{_keys.suggest_key(key)}", op=op, key=key)


@frozen
class Candidate:
    """A kernel with conditions, as a value of ``define(kernels={...})``.

    ``kernels={"cuda": [Candidate("pkg.triton:f", when={"requires": "triton>=3.2"},
    predicate="pkg.triton:fits"), "pkg.kernels:f"]}``: the first whose
    conditions hold serves, the others are fallbacks (``docs/op-authors.md``).
    """

    fn: KernelRef = field(validator=check_ref)
    when: Any = None
    predicate: KernelRef | None = field(default=None, kw_only=True, validator=check_ref)
    priority: int = field(default=0, kw_only=True)


@frozen(kw_only=True)
class Backend:
    """What a backend plugin serves: one or more dispatch keys.

    ``device_type`` is the ``torch.device`` type for device backends
    (``"cpu"``, ``"cuda"``, ``"privateuseone"``), ``None`` for the others.
    ``kinds`` are registration kinds the backend's distribution defines
    (:class:`~opregistry.kinds.Kind`): a key the backend serves may then be
    one of theirs (a key family of a kind, not a torch dispatch key).
    """

    name: str
    keys: tuple[str, ...] = field(converter=lambda ks: tuple(_keys.canonical_key(k) for k in ks))
    device_type: str | None = None
    description: str = ""
    kinds: tuple[Kind, ...] = field(default=(), converter=tuple, eq=False)
    origin: Origin | None = field(default=None, eq=False, order=False)

    def __attrs_post_init__(self) -> None:
        families = {kind.family(key) for kind in self.kinds for key in self.keys}
        unknown = [k for k in self.keys if not _keys.is_known_key(k) and k not in families]
        if unknown:
            raise DeclarationError(
                f"backend {self.name!r} serves unknown dispatch key(s) {unknown}; "
                f"{_keys.suggest_key(unknown[0])}"
            )


#: the longest message, hint or source :meth:`Problem.text` shows whole
TEXT_LIMIT = 600


def elide(text: str, limit: int | None = TEXT_LIMIT) -> str:
    """``text`` if it has at most ``limit`` characters, else its head and tail around a marker.

    ``"ab...[12,345 characters elided]...yz"``: both ends stay, because a
    schema's name is at the start and what went wrong is often at the end.
    The result has at most ``limit`` characters (for ``limit >= 60``).
    """
    if limit is None or len(text) <= limit:
        return text
    marker = f" ...[{len(text):,} characters elided]... "  # no shorter than the real one
    keep = max(limit - len(marker), 20)
    head = keep - keep // 3
    tail = keep - head
    cut = len(text) - head - tail
    marker = f" ...[{cut:,} characters elided]... "
    return f"{text[:head]}{marker}{text[len(text) - tail:]}"




def _default_severity(code: str) -> Severity:
    found = code_of(code)
    return found.severity if found is not None else "error"


@frozen(kw_only=True)
class Problem:
    """Something wrong, found by discovery, resolution or materialization.

    ``culprits`` are the distributions left out because of it (every
    distribution named in an error); ``others`` are named for context only
    (the owner whose kernel would have been overridden, say).
    """

    code: str
    message: str
    hint: str = ""
    #: the code's default (:data:`~opregistry.problems.CODES`) unless given
    severity: Severity = field(default=attrs.Factory(
        lambda self: _default_severity(self.code), takes_self=True))
    culprits: tuple[Origin, ...] = ()
    others: tuple[Origin, ...] = ()
    op: str | None = None
    key: str | None = None
    namespace: str | None = None
    source: str | None = None
    #: the exception behind the problem, as an opregistry error whose
    #: ``__cause__`` is the original (pluggy's ``PluginValidationError``, the
    #: plugin's ``ImportError``...); ``None`` for rules the resolver checks
    error: BaseException | None = field(default=None, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        code = code_of(self.code)
        if code is not None and self.severity not in code.severities:
            raise ValueError(f"problem code {self.code!r} is never a {self.severity!r} "
                             f"(opregistry.problems: {', '.join(code.severities)})")

    @property
    def leaves_out(self) -> bool:
        """Whether the :attr:`culprits` are left out whole (rule 9): the code's table entry.

        A code the core does not know (a registration kind's own) leaves its
        culprits out when it is an error.
        """
        code = code_of(self.code)
        return code.leaves_out if code is not None else self.severity == "error"

    @property
    def docs(self) -> str:
        """The page that explains this problem's code."""
        code = code_of(self.code)
        return DOCS_URL + (code.anchor if code is not None else f"{PAGE}/")

    def __str__(self) -> str:
        return self.text()

    def text(self, limit: int | None = TEXT_LIMIT) -> str:
        """One line: ``[code] message (at source) -> hint``, each part elided to ``limit``.

        :attr:`message` and :attr:`hint` stay whole (``to_dict``, ``--json``);
        text for people is bounded, because they quote user strings -- a
        100,000-character schema would otherwise fill a terminal.
        ``limit=None`` keeps everything.
        """
        text = f"[{self.code}] {elide(self.message, limit)}"
        if self.source:
            text += f" (at {elide(self.source, limit)})"
        if self.hint:
            text += f" -> {elide(self.hint, limit)}"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "severity": self.severity,
            "message": self.message,
            "hint": self.hint,
            "distributions": [o.dist for o in self.culprits],
            "entry_points": [o.entry_point_spec for o in self.culprits],
            "others": [o.dist for o in self.others],
            "op": self.op,
            "key": self.key,
            "namespace": self.namespace,
            "source": self.source,
            "docs": self.docs,
        }


@frozen
class Plugin:
    """A loaded entry point: the object it names, and where it came from."""

    origin: Origin
    obj: Any = attrs.field(eq=False, repr=False)


@frozen
class Skipped:
    """An entry point that was found but not loaded, and why.

    ``deferred`` marks one whose module was still being imported -- a
    decorator-style op package that imports torch before it defines its ops,
    imported before torch: :meth:`opregistry.Registry.complete` loads it once
    the import has finished.
    """

    origin: Origin
    reason: str
    deferred: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"distribution": self.origin.dist, "entry_point": self.origin.entry_point_spec,
                "reason": self.reason, "deferred": self.deferred}


@frozen
class Discovered:
    """What discovery hands to collection: loaded plugins, skipped ones, problems."""

    plugins: tuple[Plugin, ...]
    skipped: tuple[Skipped, ...]
    problems: tuple[Problem, ...]
    #: adoptions packages declare for themselves, read from their entry points (never imported)
    adoptions: tuple[Any, ...] = ()


@frozen(kw_only=True)
class Declarations:
    """Everything the admitted plugins declared, with problems found so far."""

    namespaces: tuple[Namespace, ...] = field(default=(), converter=tuple)
    ops: tuple[OpDef, ...] = field(default=(), converter=tuple)
    kernels: tuple[Kernel, ...] = field(default=(), converter=tuple)
    backends: tuple[Backend, ...] = field(default=(), converter=tuple)
    #: backend name -> whether it can run on this machine
    available: dict[str, bool] = field(factory=dict, eq=False)
    #: every distribution whose plugin loaded
    distributions: tuple[Origin, ...] = field(default=(), converter=tuple)
    skipped: tuple[Skipped, ...] = field(default=(), converter=tuple)
    problems: tuple[Problem, ...] = field(default=(), converter=tuple)
    #: the ``opregistry_*`` hooks each loaded plugin implements
    hooks: dict[Origin, tuple[str, ...]] = field(factory=dict, eq=False)
    #: adoptions declared by adapters' hooks and by packages' own entry points
    #: (:class:`~opregistry.adoption.Adoption`)
    adoptions: tuple[Any, ...] = field(default=(), converter=tuple)
