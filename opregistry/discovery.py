"""Stage 1, discover: find the plugins' entry points and import each in isolation.

Reads the entry-point groups :data:`BACKENDS_GROUP` and :data:`OPS_GROUP`
through importlib-metadata, applies the allow- and block-lists, and loads
every admitted entry point on its own: a missing module or an exception at
import becomes a :class:`~opregistry.model.Problem` of that distribution, and
the others still load.  Also reported here: a distribution installed twice
(importlib-metadata would silently show one copy), an entry-point name used
twice in one group, and -- when torch is already imported -- what a plugin
registers with torch by itself while being imported (:mod:`opregistry.guard`:
undone and reported).
"""

from __future__ import annotations

import sys
from collections import defaultdict
from typing import Any, Iterable

from . import guard
from .adoption import ADOPT_EAGER_GROUP, ADOPT_GROUPS, Adoption
from .config import Settings, canonical_name
from .containment import describe
from .errors import DeclarationError, PluginLoadError
from .logs import get_logger
from .model import Discovered, Origin, Plugin, Problem, Skipped
from .ownership import Owners, change_culprit, state_problem
from .seal import Seal

__all__ = ["BACKENDS_GROUP", "OPS_GROUP", "GROUPS", "DEFERRED", "discover", "entry_points",
           "load_problem", "still_importing", "self_declared", "load_origins"]

BACKENDS_GROUP = "opregistry.backends"
OPS_GROUP = "opregistry.ops"
GROUPS = (BACKENDS_GROUP, OPS_GROUP)

log = get_logger()


def _name_version(dist: Any, cache: dict[int, tuple[str, str]] | None) -> tuple[str, str]:
    """``(Name, Version)`` of ``dist``; each ``.metadata`` access re-reads and re-parses
    METADATA, so one discovery pass reads it once per distribution."""
    if dist is None:
        return "<unknown>", "?"
    key = id(dist)
    found = cache.get(key) if cache is not None else None
    if found is None:
        found = _headers(dist)
        if found is None:
            metadata = dist.metadata
            found = (metadata["Name"], metadata["Version"])
        if cache is not None:
            cache[key] = found
    return found


def _headers(dist: Any) -> tuple[str, str] | None:
    """``(Name, Version)`` read off the METADATA header, or ``None`` to ask ``dist.metadata``.

    ``dist.metadata`` parses the whole file with the ``email`` package (and
    imports it); two header lines are all discovery needs, and ``opregistry
    list`` reads them for every distribution with plugins.  Only for
    importlib-metadata's own ``PathDistribution`` (a custom provider may
    override ``metadata``), reading the same files in the same order, and
    only when both headers are plain one-line values; anything else falls
    back to the full parser.
    """
    import importlib_metadata

    if type(dist) is not importlib_metadata.PathDistribution:
        return None
    text = dist.read_text("METADATA") or dist.read_text("PKG-INFO")
    if not text:
        return None
    found: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            break  # end of the header
        if line[0] in " \t":
            return None  # a folded header line: leave it to the email parser
        key, sep, value = line.partition(":")
        key = key.lower()  # as the email parser: no stripping of the name...
        if sep and key in ("name", "version") and key not in found:
            found[key] = value.lstrip(" \t")  # ...and leading blanks only of the value
    if "name" not in found or "version" not in found:
        return None
    return found["name"], found["version"]


def _origin(ep: Any, group: str, cache: dict[int, tuple[str, str]] | None = None) -> Origin:
    name, version = _name_version(getattr(ep, "dist", None), cache)
    return Origin(
        distribution=canonical_name(name),
        version=version,
        group=group,
        entry_point=ep.name,
        value=ep.value,
    )


#: why a deferred entry point was not loaded (see :class:`~opregistry.model.Skipped`)
DEFERRED = ("its module was still being imported (it imports torch before declaring its ops); "
            "it is loaded when the import has finished: at the first call of one of its ops, "
            "or opregistry.load()")


def still_importing(module: str) -> bool:
    """Whether ``module`` is in the middle of its own import (it imported torch, say)."""
    found = sys.modules.get(module)
    return found is not None and guard.initializing(found)


def load_problem(origin: Origin, exc: BaseException) -> Problem:
    if isinstance(exc, DeclarationError):
        code, hint = "declaration-invalid", (
            f"fix the declaration in {origin.distribution} at the line named here "
            f"(opregistry checks names, dispatch keys and references when they are declared)"
        )
    elif isinstance(exc, ModuleNotFoundError):
        code, hint = "plugin-missing-module", (
            f"reinstall {origin.distribution}, or fix its entry point '{origin.entry_point}'"
        )
    elif isinstance(exc, AttributeError):
        code, hint = "plugin-missing-attribute", (
            f"{origin.distribution}'s entry point '{origin.entry_point_spec}' names an "
            f"attribute its module does not have; fix the entry point or the module"
        )
    else:
        code, hint = "plugin-import-error", (
            f"fix the error in {origin.distribution}, or block it with "
            f"OPREGISTRY_BLOCK={origin.distribution}"
        )
    message = f"{origin} failed to load: {describe(exc)}"
    error = PluginLoadError(message, origin=origin)
    error.__cause__ = exc
    return Problem(
        code=code,
        message=message,
        hint=hint,
        culprits=(origin,),
        source=guard.raised_at(exc),
        error=error,
    )


def entry_points(groups: Iterable[str] = GROUPS) -> list[tuple[str, Any]]:
    """Every entry point of ``groups``, as ``(group, entry_point)``, in a stable order."""
    return _scan(groups)[0]


def _scan(
    groups: Iterable[str], metadata_cache: dict[int, tuple[str, str]] | None = None,
) -> tuple[list[tuple[str, Any]], dict[str, list[Any]], list[tuple[Any, Any]]]:
    """One walk over the installed distributions: entry points, and copies installed twice.

    The entry points are importlib-metadata's (``entry_points(group=...)``):
    of several copies of a distribution, the first on ``sys.path`` -- the one
    Python imports from.  One walk instead of two keeps discovery as fast as
    importlib-metadata alone (``opregistry list`` runs before torch).

    The second result maps each distribution with plugins that is installed
    more than once to its copies.  The same copy seen twice (an ``.egg-info``
    in a source tree next to the installed ``.dist-info``: same version, same
    entry points) is not a conflict.  Only copies that declare entry points of
    ``groups`` are compared: reading every distribution's metadata would
    double the cost.  ``metadata_cache`` receives each such distribution's
    ``(Name, Version)`` (see :func:`_name_version`): METADATA is parsed once.
    The third result holds ``(distribution, entry point)`` for each entry
    point of the adoption groups (:data:`~opregistry.adoption.ADOPT_GROUPS`),
    read in the same walk and never loaded.
    """
    import importlib_metadata

    wanted = tuple(groups)
    copies: dict[str, list[Any]] = defaultdict(list)
    signatures: dict[str, set[Any]] = defaultdict(set)
    seen: set[str] = set()
    adoptions: list[tuple[Any, Any]] = []
    for dist in importlib_metadata.distributions():
        every = dist.entry_points
        if every:
            _adoption_entry_points(dist, every, seen, metadata_cache, adoptions)
        eps = [ep for ep in every if ep.group in wanted]
        if not eps:
            continue
        raw_name, version = _name_version(dist, metadata_cache)
        name = canonical_name(raw_name or "")
        copies[name].append((dist, eps))
        signatures[name].add((version, tuple(sorted((ep.group, ep.name, ep.value)
                                                         for ep in eps))))
    found = [(ep.group, ep) for found_copies in copies.values() for ep in found_copies[0][1]]
    found.sort(key=lambda item: wanted.index(item[0]))  # by group, as before; stable within
    twice = {name: [dist for dist, _ in found_copies] for name, found_copies in copies.items()
             if len(signatures[name]) > 1}
    return found, twice, adoptions


def _adoption_entry_points(dist: Any, every: Any, seen: set[str],
                           metadata_cache: dict[int, tuple[str, str]] | None,
                           out: list[tuple[Any, Any]]) -> None:
    """Add ``dist``'s adoption entry points to ``out``; the first copy on ``sys.path`` only."""
    eps = [ep for ep in every if ep.group in ADOPT_GROUPS]
    if not eps:
        return
    name = canonical_name(_name_version(dist, metadata_cache)[0] or "")
    if name in seen:
        return
    seen.add(name)
    out.extend((dist, ep) for ep in eps)


def self_declared(found: list[tuple[Any, Any]],
                  metadata_cache: dict[int, tuple[str, str]] | None = None
                  ) -> tuple[list[Adoption], list[Problem]]:
    """The adoptions packages declare through their entry points, as :class:`Adoption` records.

    An entry point of :data:`~opregistry.adoption.ADOPT_GROUP` (lazy) or
    :data:`~opregistry.adoption.ADOPT_EAGER_GROUP` (eager) names a namespace
    (its name) and the module whose import registers it (its value).  An
    invalid one is a ``declaration-invalid`` problem of its distribution.
    """
    adoptions, problems = [], []
    for dist, ep in found:
        raw, version = _name_version(dist, metadata_cache)
        origin = Origin(distribution=canonical_name(raw or ""), version=version,
                        group=ep.group, entry_point=ep.name, value=ep.value)
        try:
            if ep.attr:
                raise DeclarationError(
                    f"the value names a module whose import registers namespace {ep.name!r} "
                    f"({ep.module!r}), not an attribute ({ep.value!r})")
            adoption = Adoption(distribution=origin.distribution, namespaces=(ep.name,),
                                modules=(ep.module,), source=f"{ep.group}: {ep.name} = {ep.value}",
                                load="eager" if ep.group == ADOPT_EAGER_GROUP else "lazy")
        except DeclarationError as exc:
            problems.append(Problem(
                code="declaration-invalid",
                message=f"{origin} declares its adoption wrongly: {exc}",
                hint=f"in {origin.distribution}'s entry points, write [{ep.group}] "
                     f"<namespace> = <module>, e.g. mylib = \"mylib._ops\"",
                culprits=(origin,)))
            continue
        object.__setattr__(adoption, "origin", origin)
        adoptions.append(adoption)
    return adoptions, problems


def _duplicate_problem(name: str, copies: list[Any], groups: Iterable[str]) -> Problem:
    wanted = set(groups)
    origins = []
    places = []
    for dist in copies:
        ep = next(ep for ep in dist.entry_points if ep.group in wanted)
        origins.append(Origin(distribution=name, version=dist.version, group=ep.group,
                              entry_point=ep.name, value=ep.value))
        places.append(f"{name}=={dist.version} in {dist.locate_file('')}")
    return Problem(
        code="distribution-duplicate",
        message=f"{name} is installed {len(copies)} times ({'; '.join(places)}); Python imports "
                f"whichever copy comes first on sys.path, so opregistry loads none of them",
        hint=f"uninstall every copy (repeat 'pip uninstall {name}' until it is gone, or remove "
             f"the stale folder) and install one",
        culprits=tuple(sorted(set(origins))),
    )


def _import(ep: Any, origin: Origin, settings: Settings, seal: Seal,
            owners: Owners) -> tuple[Plugin | None, list[Problem]]:
    """Import one entry point, contained; the plugin (``None`` if it failed) and the problems."""
    # a plugin's failure is its own, never ours: SystemExit (a module that parses
    # sys.argv at import) and any BaseException but a real Ctrl-C included.
    # With torch imported, what a plugin registers with torch by itself is watched; a
    # plugin that imports torch itself (torch was not imported before) is watched from
    # then on (guard.torch_arrived): the same verdict with torch imported first or not
    torch_imported = "torch" in sys.modules
    with guard.running(origin):
        guarded = guard.run(ep.load, origin=origin, what=f"importing {ep.value}",
                            protected=frozenset() if torch_imported else None,
                            policy=settings.policy, owns=guard.owned_by(ep.module),
                            until_torch=not torch_imported)
    problems = list(guarded.problems)
    changes = seal.check()
    if changes:
        # put back already; the culprit is whoever's file made the change, else this plugin
        culprit = change_culprit(changes, origin, owners)
        problems.append(state_problem(culprit, changes, f"{origin.dist} was imported"))
    if guarded.error is not None:
        problem = load_problem(origin, guarded.error)
        log.warning("plugin failed to load", distribution=origin.dist,
                    error=describe(guarded.error))
        return None, problems + [problem]
    return Plugin(origin, guarded.result), problems


def discover(settings: Settings, *, groups: Iterable[str] = GROUPS) -> Discovered:
    """Find and import the plugins that ``settings`` admits."""
    groups = tuple(groups)
    plugins: list[Plugin] = []
    skipped: list[Skipped] = []
    problems: list[Problem] = []
    # filled by _scan: (Name, Version) per distribution, METADATA parsed once
    metadata_cache: dict[int, tuple[str, str]] = {}
    found, installed_twice, adopting = _scan(groups, metadata_cache)
    twice = {name: copies for name, copies in installed_twice.items()
             if settings.admits(name) is None}
    for name in sorted(twice):
        problems.append(_duplicate_problem(name, twice[name], groups))
    # settings checked against what is installed: a typo in a list, a variable nobody reads
    installed = {canonical_name(_name_version(getattr(ep, "dist", None), metadata_cache)[0])
                 for _, ep in found} | set(installed_twice)
    problems.extend(Problem(code=code, severity=severity, message=message, hint=hint)  # type: ignore[arg-type]
                    for code, severity, message, hint in settings.findings(installed))
    # one name twice in one group of one distribution: pluggy would keep one, silently
    origins = [_origin(ep, group, metadata_cache) for group, ep in found]
    names = defaultdict(int)
    for (group, ep), origin in zip(found, origins):
        names[(origin.distribution, group, ep.name)] += 1
    reported: set[tuple[str, str, str]] = set()
    # opregistry's own state, sealed while plugins are imported; who owns which file
    seal = Seal()
    owners = Owners([Plugin(origin, None) for origin in origins])
    for (group, ep), origin in zip(found, origins):
        reason = settings.admits(origin.distribution)
        if reason is not None:
            skipped.append(Skipped(origin, reason))
            continue
        if origin.distribution in twice:
            skipped.append(Skipped(origin, f"{origin.distribution} is installed more than once"))
            continue
        where = (origin.distribution, group, ep.name)
        if names[where] > 1:
            if where not in reported:
                reported.add(where)
                problems.append(Problem(
                    code="entry-point-duplicate",
                    message=f"{origin.dist} declares entry point {ep.name!r} {names[where]} "
                            f"times in {group}; which one would load is unspecified",
                    hint=f"give each entry point of {origin.distribution} its own name",
                    culprits=(origin,),
                ))
            skipped.append(Skipped(origin, f"entry point name {ep.name!r} is used twice"))
            continue
        if still_importing(ep.module):
            # it imported torch (whose autoload brought us here) before defining its ops:
            # what it declares does not exist yet; the registry completes it later
            skipped.append(Skipped(origin, DEFERRED, deferred=True))
            continue
        plugin, found_problems = _import(ep, origin, settings, seal, owners)
        problems.extend(found_problems)
        if plugin is None:  # its problems name it: the resolver leaves it out
            skipped.append(Skipped(origin, found_problems[-1].message))
            continue
        plugins.append(plugin)
    return _discovered(plugins, skipped, problems, self_declared(adopting, metadata_cache))


def _discovered(plugins: list[Plugin], skipped: list[Skipped], problems: list[Problem],
                adopting: tuple[list[Adoption], list[Problem]]) -> Discovered:
    """The record of discovery, with the packages' own adoptions and their problems."""
    adoptions, invalid = adopting
    return Discovered(tuple(plugins), tuple(skipped), tuple(problems + invalid), tuple(adoptions))


class _KnownEntryPoint:
    """An entry point known from an :class:`~opregistry.model.Origin`: loaded as
    importlib-metadata's ``EntryPoint.load`` does, without importing importlib-metadata."""

    def __init__(self, value: str) -> None:
        self.value = value
        self.module = value.partition(":")[0].strip()

    def load(self) -> Any:
        import importlib

        found: Any = importlib.import_module(self.module)
        for part in filter(None, self.value.partition(":")[2].strip().split(".")):
            found = getattr(found, part)
        return found


def load_origins(settings: Settings, origins: Iterable[Origin]) -> Discovered:
    """Import the entry points ``origins`` name, as :func:`discover` would, without the scan.

    For entry points known already (the plan cache's backends): no walk over
    the installed distributions, no allow/block list or duplicate checks --
    those were made when the origins were found.
    """
    origins = list(origins)
    plugins: list[Plugin] = []
    skipped: list[Skipped] = []
    problems: list[Problem] = []
    seal = Seal()
    owners = Owners([Plugin(origin, None) for origin in origins])
    for origin in origins:
        ep = _KnownEntryPoint(origin.value)
        if still_importing(ep.module):
            skipped.append(Skipped(origin, DEFERRED, deferred=True))
            continue
        plugin, found = _import(ep, origin, settings, seal, owners)
        problems.extend(found)
        if plugin is None:
            skipped.append(Skipped(origin, found[-1].message))
            continue
        plugins.append(plugin)
    return Discovered(tuple(plugins), tuple(skipped), tuple(problems))
