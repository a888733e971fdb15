"""What the resolver knows of this machine: one record, read before it runs.

The resolver is a pure function of the declarations, the policy and an
:class:`Environment`: the installed torch (version, tags, build, read from
its files without importing it), the installed versions of the
distributions conditions name, which modules kernels of some kinds need
(``triton``), which native libraries can be found, the platform, and --
when torch is imported -- what its dispatcher holds (:class:`TorchState`).
:func:`read_environment` builds it (the only I/O); resolver tests build the
record by hand.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Iterable, Mapping

from attrs import field, frozen

from .config import canonical_name
from .keys import KNOWN_TAGS, TorchFacts, installed_torch, installed_torch_build
from .references import NativeLibrary
from .regular import open_regular

__all__ = ["TorchState", "Environment", "EnvironmentQuery", "environment_query", "read_query",
           "read_environment", "native_missing", "native_broken", "not_a_library", "run_check"]


@frozen(kw_only=True)
class TorchState:
    """What torch's dispatcher holds that opregistry did not put there.

    Built by :func:`opregistry.torch_state.snapshot` when torch is imported;
    the resolver only reads it.
    """

    ops: frozenset[str] = frozenset()
    namespaces: frozenset[str] = frozenset()
    has_kernel: Callable[[str, str], bool] = field(default=lambda op, key: False, eq=False)
    tags: frozenset[str] = KNOWN_TAGS
    #: whether torch has a custom class ``NS.Class`` registered; ``None``: not known (the
    #: release's table of torch's own classes decides, :func:`opregistry.keys.class_known`)
    has_class: Callable[[str], bool] | None = field(default=None, eq=False)


@frozen(kw_only=True)
class Environment:
    """The facts of this machine the resolution rules read.

    ``distributions`` maps canonical names to installed versions, for the
    names the declarations' conditions mention (others are not looked up);
    ``modules`` says which of the top-level modules kinds require can be
    imported; ``natives`` says, per native library target, why it cannot be
    found (absent: it can).
    """

    torch: TorchFacts | None = None
    torch_build: tuple[str, str | None] | None = None
    distributions: Mapping[str, str] = field(factory=dict)
    modules: Mapping[str, bool] = field(factory=dict)
    natives: Mapping[str, str] = field(factory=dict)
    #: per native library target that exists but cannot be a shared library of this
    #: platform: ``(file, why)``
    natives_broken: Mapping[str, tuple[str, str]] = field(factory=dict)
    platform: str = sys.platform
    dispatcher: TorchState | None = None
    #: what installed distributions that do not use opregistry register with torch, read
    #: from their files (:func:`opregistry.scan.scan_installed`); ``None``: not read
    foreign: Any = field(default=None, eq=False)
    #: ``"module:function"`` of each load-time check (``when={"check": ...}``) -> ``(met,
    #: reason)``; a check not here was not run (torch was not imported)
    checks: Mapping[str, tuple[bool, str]] = field(factory=dict)
    #: each module an adoption names (``Adoption(modules=...)``) -> ``(owner, text)``: the
    #: canonical name of the distribution that installed its file and ``name==version``, or
    #: ``None`` and why no distribution did (a module of Python's own, one not found)
    module_owners: Mapping[str, tuple[str | None, str]] = field(factory=dict)

    @property
    def torch_version(self) -> str | None:
        """The installed torch's release (``"2.13.0"``), or ``None`` without torch."""
        return self.torch.version if self.torch is not None else None

    def version_of(self, name: str) -> str | None:
        """The installed version of the distribution ``name``, or ``None``."""
        return self.distributions.get(canonical_name(name))

    def check(self, ref: str) -> tuple[bool, str] | None:
        """The outcome of the load-time check ``ref``: ``(met, reason)``, ``None`` if not run."""
        return self.checks.get(ref)

    def importable(self, module: str) -> bool:
        """Whether the top-level ``module`` can be imported (as read; unknown: yes)."""
        return self.modules.get(module, True)


def native_missing(library: NativeLibrary) -> str | None:
    """Why ``library`` cannot be found without loading it, or ``None``.

    A module is located statically (:func:`opregistry.locate.locate_module`):
    ``importlib.util.find_spec("pkg.ext")`` would import ``pkg`` to find it.
    """
    import os

    from .locate import locate_module  # only where a native library or an adoption asks

    if library.path is not None:
        return None if os.path.isfile(library.path) else f"the file {library.path} does not exist"
    found = locate_module(library.module)  # type: ignore[arg-type]
    return f"module {library.module} does not exist ({found.why})" \
        if found.found == "missing" else None


#: the first bytes of a shared library on each platform that has one format for them
_MAGIC: dict[str, tuple[bytes, ...]] = {
    "linux": (b"\x7fELF",),
    "darwin": (b"\xfe\xed\xfa\xce", b"\xfe\xed\xfa\xcf", b"\xce\xfa\xed\xfe",
               b"\xcf\xfa\xed\xfe", b"\xca\xfe\xba\xbe", b"\xbe\xba\xfe\xca"),
    "win32": (b"MZ",),
}


def not_a_library(path: str) -> str | None:
    """Why the file at ``path`` cannot be a shared library of this platform, or ``None``.

    Its first bytes are compared with the platform's formats (ELF, Mach-O, PE):
    a file that is none of them fails to load, whatever else it is.
    """
    formats = next((m for p, m in _MAGIC.items() if sys.platform.startswith(p)), None)
    if formats is None:
        return None
    try:
        with open_regular(path) as fh:
            head = fh.read(4)
    except OSError as exc:
        return f"it cannot be read ({exc.strerror})"
    if any(head.startswith(m) for m in formats):
        return None
    return f"it is not a shared library of this platform (it starts with {head!r})"


def native_broken(library: NativeLibrary) -> tuple[str, str] | None:
    """``(file, why)`` when ``library`` exists but is no shared library of this platform."""
    from .locate import locate_module

    file = library.path if library.path is not None else \
        locate_module(library.module).file  # type: ignore[arg-type]
    if file is None or file.endswith(".py"):
        return None
    why = not_a_library(file)
    return (file, why) if why is not None else None


def _importable(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken install
        return False


def _versions(names: Iterable[str]) -> dict[str, str]:
    names = set(names)
    if not names:
        return {}
    import importlib_metadata

    found = {}
    for name in set(names):
        try:
            found[canonical_name(name)] = importlib_metadata.version(name)
        except importlib_metadata.PackageNotFoundError:
            continue
    return found


def run_check(ref: str) -> tuple[bool, str]:
    """Call the load-time check ``ref`` (``"module:function"``): ``(met, reason)``, never raising.

    The function takes no argument and returns a truth value, or ``(value,
    reason)`` to say why; an exception (its import's included) makes the
    check unmet, with the exception as the reason.
    """
    import importlib

    from .containment import contain, describe

    def call() -> Any:
        module, _, attr = ref.partition(":")
        obj: Any = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
        return obj()

    result, exc = contain(call)
    if exc is not None:
        return False, f"{ref} raised {describe(exc)}"
    why = ""
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], str):
        result, why = result
    met, _ = contain(bool, result)
    text = f"{ref}() returned {'true' if met else 'false'}" + (f": {why}" if why else "")
    return bool(met), text


def _checks(refs: Iterable[str], run: Callable[[str], tuple[bool, str]]
            ) -> dict[str, tuple[bool, str]]:
    """Each load-time check ``refs`` names, run once -- only with torch imported.

    ``opregistry list`` runs no plugin code beyond declarations, and a check
    may need torch (CPU features, a native library torch must load first):
    without torch, checks are not run and listings say so.
    """
    if "torch" not in sys.modules:
        return {}
    return {ref: run(ref) for ref in refs}


def _module_owners(modules: Iterable[str]) -> dict[str, tuple[str | None, str]]:
    """Who installed each of ``modules`` (those adoptions name), found without importing it."""
    if not modules:
        return {}
    from .distfiles import owner_of
    from .locate import locate_module

    out: dict[str, tuple[str | None, str]] = {}
    for module in modules:
        found = locate_module(module)
        path = found.files[-1] if found.files else None
        if found.found == "missing":
            out[module] = (None, f"cannot be found ({found.why})")
            continue
        owner = owner_of(path) if path is not None else None
        out[module] = ((canonical_name(owner.name), owner.text) if owner is not None else
                       (None, f"belongs to no installed distribution ({path or found.why})"))
    return out


@frozen(kw_only=True)
class EnvironmentQuery:
    """What a set of declarations asks of the machine: the part of it :func:`read_query` reads.

    The distributions their conditions name, the top-level modules their
    kinds require, their native libraries.  The plan cache keeps it beside a
    cached plan, so that a later load reads the same facts without the
    declarations.
    """

    distributions: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    libraries: tuple[NativeLibrary, ...] = ()
    #: the load-time checks (``when={"check": ...}``), run on every load with torch
    checks: tuple[str, ...] = ()
    #: the modules adoptions name (``Adoption(modules=...)``): who installed each
    adopted_modules: tuple[str, ...] = ()


def environment_query(decl: Any) -> EnvironmentQuery:
    """The :class:`EnvironmentQuery` of ``decl`` (:class:`~opregistry.model.Declarations`)."""
    names = {name for k in decl.kernels if k.when is not None for name in k.when.distributions}
    modules = {m for k in decl.kernels for m in k.payload.kind.requires}
    libraries = [ns.native for ns in decl.namespaces if ns.native is not None]
    libraries += [k.payload.library for k in decl.kernels
                  if getattr(k.payload, "library", None) is not None]
    checks = {k.when.check for k in decl.kernels if k.when is not None and k.when.check}
    adopted = {m for a in getattr(decl, "adoptions", ()) for m in a.modules}
    return EnvironmentQuery(distributions=tuple(sorted(names)), modules=tuple(sorted(modules)),
                            libraries=tuple(dict.fromkeys(libraries)),
                            checks=tuple(sorted(checks)), adopted_modules=tuple(sorted(adopted)))


def read_query(query: EnvironmentQuery, dispatcher: TorchState | None = None,
               foreign: Any = None, *,
               run: Callable[[str], tuple[bool, str]] = run_check) -> Environment:
    """The :class:`Environment` that answers ``query`` on this machine (the only I/O).

    ``run`` runs one load-time check (the registry runs each under the seal of
    :mod:`opregistry.seal`).
    """
    natives, broken = {}, {}
    for library in query.libraries:
        why = native_missing(library)
        if why is not None:
            natives[library.target] = why
            continue
        found = native_broken(library)
        if found is not None:
            broken[library.target] = found
    return Environment(torch=installed_torch(), torch_build=installed_torch_build(),
                       distributions=_versions(query.distributions),
                       modules={m: _importable(m) for m in query.modules},
                       natives=natives, natives_broken=broken, dispatcher=dispatcher,
                       foreign=foreign, checks=_checks(query.checks, run),
                       module_owners=_module_owners(query.adopted_modules))


def read_environment(decl: Any, dispatcher: TorchState | None = None,
                     foreign: Any = None, *,
                     run: Callable[[str], tuple[bool, str]] = run_check) -> Environment:
    """The :class:`Environment` for resolving ``decl`` (:class:`~opregistry.model.Declarations`).

    Reads only what the declarations can ask about: the distributions their
    conditions name, the modules their kinds require, their native libraries,
    and -- with torch imported -- the outcome of their load-time checks.
    ``foreign`` is the scan of the packages that register with torch.library
    directly (:func:`opregistry.scan.scan_installed`), read apart: what it depends on is the
    set of installed files, not the declarations.  ``run`` runs one load-time
    check (the registry runs each under the seal of :mod:`opregistry.seal`).
    """
    return read_query(environment_query(decl), dispatcher, foreign, run=run)
