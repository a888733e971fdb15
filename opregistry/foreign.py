"""What installed distributions register with torch by themselves, known without torch.

Packages such as bitsandbytes, torchao, torchvision or vLLM call
``torch.library`` (``Library``, ``define``, ``impl``, ``custom_op``,
``register_fake``, ...) or C++ ``TORCH_LIBRARY`` macros at their own
import, outside opregistry.  :mod:`opregistry.scan` reads their installed
files -- Python sources by their syntax tree, shared libraries by their
symbol tables and strings, no code run -- and describes what each will
register with the records below, so that the resolver can apply torch's
DEF/FRAGMENT/IMPL rules to these *foreign owners* before torch is imported.

One :class:`Registration` is one call (or one C++ macro block) that
registers something, with the module whose import runs it and its
``file:line``.  Its :attr:`~Registration.kind` says what it registers:

``DEF``, ``FRAGMENT``, ``IMPL``
    a library for a namespace: ``torch.library.Library(ns, kind)`` in
    Python; ``TORCH_LIBRARY(ns, m)`` (``DEF``), ``TORCH_LIBRARY_FRAGMENT``,
    ``TORCH_LIBRARY_IMPL(ns, key, m)`` (and their ``STABLE_`` forms) in C++.
    A ``DEF`` claims the namespace: torch refuses a second one.
``library``
    a ``Library`` whose kind is not a constant (it may be a ``DEF``).
``op``
    an op definition, ``ns::name[.overload]``, with its schema when the
    source spells it (``custom_op`` infers it from type hints: ``None``).
``kernel``
    a kernel for ``(op, key)``: ``Library.impl``, ``torch.library.impl``,
    ``register_kernel``, ``register_fake`` (key ``Meta``),
    ``register_autograd`` (``Autograd``), ``register_vmap``
    (``FuncTorchBatched``), ``register_autocast`` (``Autocast<Device>``),
    ``register_torch_dispatch`` (``TorchDispatch``), and the kernel that
    ``custom_op`` / ``triton_op`` register for their device types.
``load_library``
    ``torch.ops.load_library(path)``: where a C++ library is loaded from
    (``library`` is the path when it is a constant).

Static analysis cannot evaluate everything: a name built at run time (a
function's parameter, a loop variable, a value read from a file) leaves a
registration :attr:`~Registration.unresolved` -- its text says what could not
be read -- with what *is* known (often the namespace) kept.  Nothing is
guessed.
"""

from __future__ import annotations

from typing import Any, Iterator, Literal, Mapping

from attrs import field, frozen

__all__ = [
    "STRIPPED_API",
    "RegistrationKind",
    "LIBRARY_KINDS",
    "Registration",
    "InstalledDistribution",
    "ForeignDistribution",
    "ForeignScan",
    "SCAN_FORMAT",
]

#: bumped whenever the records or what the scanner finds change: cached scans of an
#: older format are ignored
SCAN_FORMAT = 3

#: the ``api`` of a library whose namespace was read from the strings of a C++ library
#: stripped of its symbols (:mod:`opregistry.scan.native`): a weaker claim than one read from
#: symbols or source -- which macro (DEF, FRAGMENT, IMPL) is not known
STRIPPED_API = "TORCH_LIBRARY (a stripped library: the namespace read from its strings)"

RegistrationKind = Literal["DEF", "FRAGMENT", "IMPL", "library", "op", "kernel", "load_library"]
#: the kinds that are a library for a namespace (torch's ``Library`` kinds)
LIBRARY_KINDS: frozenset[str] = frozenset({"DEF", "FRAGMENT", "IMPL"})
_KINDS = LIBRARY_KINDS | {"library", "op", "kernel", "load_library"}


def _check_kind(instance: object, attribute: object, value: str) -> None:
    if value not in _KINDS:
        raise ValueError(f"kind={value!r} is not one of {sorted(_KINDS)}")


@frozen(kw_only=True)
class Registration:
    """One registration a foreign distribution makes with torch, as read from its files.

    ``namespace`` / ``name`` / ``overload`` name the op (``name`` is ``None``
    for a library or a C++ ``TORCH_LIBRARY_IMPL`` block, whose ops are not
    in the symbols); ``key`` is torch's dispatch-key name for a kernel or an
    IMPL block.  ``api`` is what the source calls (``torch.library.define``,
    ``Library.impl``, ``register_fake``, ``TORCH_LIBRARY_FRAGMENT``, ...).
    ``module`` is the dotted module whose import runs the registration: the
    module holding the call, or for a C++ library the Python module that
    loads it (``how`` says how that was found).  ``file`` is absolute,
    ``line`` is ``None`` for a shared library.  ``at_import`` is false for a
    call inside a function body: it runs when the function is called, which
    may be at import or later; ``conditional`` is true for a call under an
    ``if`` (a feature test: "triton is installed", "torch >= 2.7") that may
    not run at all.
    """

    kind: str = field(validator=_check_kind)
    namespace: str | None = None
    name: str | None = None
    overload: str = ""
    schema: str | None = None
    key: str | None = None
    api: str = ""
    module: str = ""
    file: str = ""
    line: int | None = None
    at_import: bool = True
    #: under an ``if`` / ``while`` / ``except`` / ``match`` (a feature test, a torch version
    #: check): it may not run at all
    conditional: bool = False
    #: what static analysis could not read (empty when everything was read)
    unresolved: str = ""
    #: for a C++ library: how ``module`` was found; for ``load_library``: the library's path
    how: str = ""

    @property
    def op(self) -> str | None:
        """``ns::name[.overload]``, or ``None`` when the op is not known."""
        if self.namespace is None or self.name is None:
            return None
        return f"{self.namespace}::{self.name}" + (f".{self.overload}" if self.overload else "")

    @property
    def inferred(self) -> bool:
        """Whether the namespace was read from a stripped library's strings (:data:`STRIPPED_API`):
        it yields to any other distribution's claim read from symbols or source."""
        return self.api == STRIPPED_API

    @property
    def source(self) -> str:
        """``file:line`` (the file alone for a shared library)."""
        return self.file if self.line is None else f"{self.file}:{self.line}"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "namespace": self.namespace, "op": self.op,
                "name": self.name, "overload": self.overload, "schema": self.schema,
                "key": self.key, "api": self.api, "module": self.module, "file": self.file,
                "line": self.line, "at_import": self.at_import, "conditional": self.conditional,
                "unresolved": self.unresolved,
                "how": self.how}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Registration:
        return cls(**{k: data[k] for k in _FIELDS if k in data})


_FIELDS = ("kind", "namespace", "name", "overload", "schema", "key", "api", "module", "file",
           "line", "at_import", "conditional", "unresolved", "how")


@frozen(kw_only=True)
class InstalledDistribution:
    """An installed distribution as ``pip show`` names it: canonical name, version, where."""

    name: str
    version: str
    #: its ``*.dist-info`` / ``*.egg-info`` folder
    location: str

    @property
    def text(self) -> str:
        """``name==version``, the form every message uses."""
        return f"{self.name}=={self.version}"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "location": self.location}


@frozen(kw_only=True)
class ForeignDistribution:
    """Everything one installed distribution registers with torch by itself.

    ``requires_torch``: its metadata names torch (or opregistry) in
    ``Requires-Dist``; a distribution that does not but whose Python files
    mention torch is scanned too (torchao 0.18 declares no dependency on
    torch).  ``plugin_groups``: the opregistry entry-point groups it has
    (``opregistry.ops``, ``opregistry.backends``): an opregistry plugin,
    whose own ``Library`` calls are scanned like anyone's.  ``digest`` is
    what the cached scan was keyed on (see :mod:`opregistry.scan`).
    """

    distribution: InstalledDistribution
    requires_torch: bool = False
    plugin_groups: tuple[str, ...] = ()
    registrations: tuple[Registration, ...] = ()
    #: the files read: Python sources and shared libraries
    files: int = 0
    digest: str = ""
    #: why the scan of this distribution failed (a bug of the scanner: its registrations
    #: are unknown, not absent)
    error: str = ""
    #: the folders above its modules that are no module themselves: namespace packages
    #: (PEP 420) such as ``optimum`` of optimum-quanto, whose ``import optimum`` imports
    #: nothing of it (:meth:`import_root`)
    namespace_packages: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.distribution.name

    @property
    def version(self) -> str:
        return self.distribution.version

    @property
    def is_plugin(self) -> bool:
        return bool(self.plugin_groups)

    def namespaces(self, *kinds: str) -> frozenset[str]:
        """Namespaces its registrations name, of ``kinds`` only when given."""
        return frozenset(r.namespace for r in self.registrations
                         if r.namespace is not None and (not kinds or r.kind in kinds))

    def ops(self) -> frozenset[str]:
        """``ns::name[.overload]`` of every op it defines (``kind == "op"``, name known)."""
        return frozenset(r.op for r in self.registrations if r.kind == "op" and r.op)

    def possible_ops(self) -> dict[str, Registration]:
        """``ns::name[.overload]`` -> its definition, for each op a C++ library defines with a
        schema string that names no namespace, in each namespace that library DEFs or
        FRAGMENTs: the string does not say which (vLLM's ``_C`` and ``_C_cache_ops`` in one
        library), so once it is loaded torch may hold the op in any of them."""
        out: dict[str, Registration] = {}
        vague = [r for r in self.registrations
                 if r.kind == "op" and r.namespace is None and r.name and r.line is None]
        if not vague:
            return out
        owned: dict[str, set[str]] = {}
        for r in self.registrations:
            if r.kind in ("DEF", "FRAGMENT") and r.namespace is not None and r.line is None:
                owned.setdefault(r.file, set()).add(r.namespace)
        for r in vague:
            for ns in sorted(owned.get(r.file, ())):
                out.setdefault(f"{ns}::{r.name}" + (f".{r.overload}" if r.overload else ""), r)
        return out

    def library_namespaces(self, file: str) -> tuple[str, ...]:
        """The namespaces the C++ library ``file`` DEFs or FRAGMENTs, sorted."""
        return tuple(sorted({r.namespace for r in self.registrations
                             if r.file == file and r.line is None and r.namespace is not None
                             and r.kind in ("DEF", "FRAGMENT")}))

    def unresolved(self) -> tuple[Registration, ...]:
        return tuple(r for r in self.registrations if r.unresolved)

    def import_root(self, module: str) -> str:
        """The package a user imports to get ``module``'s registrations: its top-level
        package (``bitsandbytes``), or, below namespace packages, the first regular one
        (``optimum.quanto``)."""
        parts = module.split(".")
        for i in range(1, len(parts)):
            prefix = ".".join(parts[:i])
            if prefix not in self.namespace_packages:
                return prefix
        return module

    def to_dict(self) -> dict[str, Any]:
        return {**self.distribution.to_dict(), "requires_torch": self.requires_torch,
                "plugin_groups": list(self.plugin_groups), "files": self.files,
                "digest": self.digest, "error": self.error,
                "namespace_packages": list(self.namespace_packages),
                "registrations": [r.to_dict() for r in self.registrations]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ForeignDistribution:
        return cls(
            distribution=InstalledDistribution(name=data["name"], version=data["version"],
                                               location=data["location"]),
            requires_torch=bool(data["requires_torch"]),
            plugin_groups=tuple(data["plugin_groups"]),
            registrations=tuple(Registration.from_dict(r) for r in data["registrations"]),
            files=int(data["files"]), digest=data["digest"], error=data.get("error", ""),
            namespace_packages=tuple(data.get("namespace_packages", ())))


@frozen(kw_only=True)
class ForeignScan:
    """The scan of every installed distribution: the torch users, and what was skipped.

    ``distributions`` are those that require or mention torch, sorted by
    name, with or without registrations; ``skipped`` counts the others
    (and torch and opregistry themselves); ``cached`` counts the
    distributions whose scan came from the disk cache.
    """

    distributions: tuple[ForeignDistribution, ...] = ()
    skipped: int = 0
    cached: int = 0
    #: the files the scan read that a cache of it must stamp
    #: (:func:`opregistry.scan.scan_inputs`); ``None`` when not known (a scan rebuilt
    #: from data, one of some distributions only)
    inputs: tuple[str, ...] | None = field(default=None, eq=False, repr=False)

    def registrations(self) -> Iterator[tuple[ForeignDistribution, Registration]]:
        for dist in self.distributions:
            for reg in dist.registrations:
                yield dist, reg

    def by_namespace(self) -> dict[str, list[tuple[ForeignDistribution, Registration]]]:
        """namespace -> every ``(distribution, registration)`` that names it."""
        out: dict[str, list[tuple[ForeignDistribution, Registration]]] = {}
        for dist, reg in self.registrations():
            if reg.namespace is not None:
                out.setdefault(reg.namespace, []).append((dist, reg))
        return out

    def importers(self, namespace: str) -> list[tuple[ForeignDistribution, str]]:
        """``(distribution, module)`` whose import registers something in ``namespace``.

        What lazy adoption imports on the first touch of ``torch.ops.<namespace>``:
        modules whose registrations run at import, outside any condition,
        first (those that define ops before those that only add kernels),
        then the others; each module once, in a stable order.
        """
        ranked: dict[tuple[str, str], tuple[int, int, ForeignDistribution]] = {}
        for dist, reg in self.registrations():
            if reg.namespace != namespace or not reg.module:
                continue
            rank = (0 if reg.at_import and not reg.conditional else 1,
                    0 if reg.kind in ("DEF", "FRAGMENT", "op") else 1)
            key = (dist.name, reg.module)
            if key not in ranked or rank < ranked[key][:2]:
                ranked[key] = (*rank, dist)
        order = sorted(ranked.items(), key=lambda item: (item[1][:2], item[0]))
        return [(dist, module) for (_, module), (_, _, dist) in order]

    def held_elsewhere(self, namespace: str, name: str) -> bool:
        """Whether a distribution other than ``name`` defines ``namespace`` by a registration
        read from its symbols or source (not :attr:`Registration.inferred`)."""
        return any(dist.name != name and reg.namespace == namespace and not reg.inferred
                   and reg.kind in ("DEF", "FRAGMENT", "library", "op")
                   for dist, reg in self.registrations())

    def get(self, name: str) -> ForeignDistribution | None:
        """The scan of distribution ``name`` (canonical), if it was scanned."""
        for dist in self.distributions:
            if dist.name == name:
                return dist
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"distributions": [d.to_dict() for d in self.distributions],
                "skipped": self.skipped, "cached": self.cached}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ForeignScan:
        return cls(distributions=tuple(ForeignDistribution.from_dict(d)
                                       for d in data["distributions"]),
                   skipped=int(data["skipped"]), cached=int(data["cached"]))
