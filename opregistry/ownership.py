"""Declarations are owned: what one distribution's code declares through another's library is refused.

A declarations module can import another op package and call its library
(``victim.lib.define("evil(...)", kernels={"cpu": "attacker:evil"})``), or
put a hook implementation of its own on it
(``victim.lib.opregistry_ops = ...``).  Without a check, the records would be
stamped with the victim's origin: listed, locked and registered as the
victim's.  At collection, every record of a plugin is attributed to the
distribution whose code declared it:

1. the file of the line that declared it (the record's ``source``; for
   sample inputs chosen later, the line of ``register_samples``), when a
   discovered distribution owns that file -- its entry point's top-level
   package or module, or a file its ``RECORD`` lists;
2. otherwise, the distribution whose code opregistry was running when the
   record was declared (:func:`opregistry.seal.running`), when that is not
   the one that was running when the library was made;
3. otherwise the library's own distribution.

A hook implementation is attributed by the file of its function the same way.
A record or hook of another distribution is refused (``declaration-not-owned``,
the culprit left out whole, the victim named as ``others``); the victim keeps
what it declared itself -- for an ``OpLibrary``, its hooks are the class's
own, whatever was put on the instance.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Iterable, Sequence

from .model import Origin, Plugin, Problem, source_of

__all__ = ["Owners", "is_op_library", "attributed", "foreign_hook", "not_owned", "state_problem",
           "change_culprit"]


#: opregistry's own folder: code there is nobody's declaration
_OURS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "")


def is_op_library(obj: Any) -> bool:
    """Whether ``obj`` is an :class:`opregistry.OpLibrary` itself (not a subclass, not a lookalike)."""
    cls = type(obj)
    return cls.__module__ == "opregistry.declare" and cls.__qualname__ == "OpLibrary"


def _file(where: str | None) -> str | None:
    if not where:
        return None
    file, _, line = where.rpartition(":")
    return os.path.abspath(file) if line.isdigit() and file else None


class Owners:
    """Which discovered distribution's code a file is (computed lazily, cached per file)."""

    def __init__(self, plugins: Sequence[Plugin], files: dict[str, Origin] | None = None) -> None:
        self._plugins = list(plugins)
        #: files known to be a distribution's (its referenced kernel modules, say)
        self._cache: dict[str, Origin | None] = dict(files or {})
        self._recorded: dict[str, Origin] | None = None
        self._origins = {p.origin.distribution: p.origin for p in reversed(self._plugins)}
        for origin in (files or {}).values():
            self._origins.setdefault(origin.distribution, origin)

    def origin(self, distribution: str) -> Origin | None:
        return self._origins.get(distribution)

    def of(self, file: str | None) -> Origin | None:
        if file is None:
            return None
        if file not in self._cache:
            self._cache[file] = self._by_package(file) or self._by_record(file)
        return self._cache[file]

    def _by_package(self, file: str) -> Origin | None:
        """The distribution whose entry point's top-level package or module holds ``file``."""
        for plugin in self._plugins:
            top = sys.modules.get(plugin.origin.value.partition(":")[0].partition(".")[0].strip())
            if top is None:
                continue
            paths = [os.path.join(os.path.abspath(p), "") for p in getattr(top, "__path__", ())
                     or ()]
            own = getattr(top, "__file__", None)
            if any(file.startswith(p) for p in paths) or (
                    not paths and own and os.path.abspath(own) == file):
                return plugin.origin
        return None

    def _by_record(self, file: str) -> Origin | None:
        """The distribution whose ``RECORD`` lists ``file`` (read once, for every plugin)."""
        if self._recorded is None:
            self._recorded = {}
            import importlib_metadata

            for name, origin in self._origins.items():
                try:
                    files = importlib_metadata.distribution(name).files or ()
                except Exception:  # noqa: BLE001 - a broken install owns nothing we can read
                    continue
                for entry in files:
                    self._recorded.setdefault(os.path.abspath(str(entry.locate())), origin)
        return self._recorded.get(file)


def attributed(plugin: Plugin, owners: Owners) -> Callable[[Any], tuple[Origin, Any]] | None:
    """``author(record)``: who declared ``record`` of ``plugin``, and what the plugin keeps.

    ``(distribution whose code declared it, the record to keep instead or None)``;
    see the module docstring.  ``None`` when every record of an ``OpLibrary``
    was declared in the file that made it, while the code of the distribution
    that made it ran: the common case costs nothing per record.
    """
    origin = plugin.origin
    obj = plugin.obj
    late: dict[int, Any] = obj.__dict__.get("_late", {}) if is_op_library(obj) else {}
    if is_op_library(obj) and not late:
        return None
    made_during = obj.__dict__.get("_made_during") if late else None

    def author(record: Any) -> tuple[Origin, Any]:
        found = late.get(id(record)) if late else None
        if found is None:
            return origin, None  # declared where and while the library was made
        running, files, replaced = found
        for file in files:  # innermost first: a helper the library's own code calls is its own
            owner = owners.of(os.path.abspath(file))
            if owner is not None:
                return (origin if owner.distribution == origin.distribution else owner), replaced
        running = running or made_during
        if running is not None and running.distribution != origin.distribution:
            return owners.origin(running.distribution) or running, replaced
        return origin, None

    return author


def foreign_hook(plugin: Plugin, function: Callable[..., Any], owners: Owners) -> Origin | None:
    """The other distribution whose function is ``plugin``'s hook implementation, or ``None``."""
    obj = plugin.obj
    if is_op_library(obj) and getattr(function, "__self__", None) is obj and \
            getattr(function, "__func__", None) is type(obj).__dict__.get(
                getattr(function, "__name__", "")):
        return None  # the class's own method, bound to the library: opregistry's code
    file = _file(source_of(function))
    if file is None or file.startswith(_OURS):
        return None  # opregistry's own (a DeviceBackend's hooks), or no code to read
    owner = owners.of(file)
    if owner is not None and owner.distribution != plugin.origin.distribution:
        return owner
    return None


def not_owned(culprit: Origin, victim: Origin, what: str, source: str | None) -> Problem:
    """The problem of a declaration (or hook) ``culprit``'s code made on ``victim``'s library."""
    return Problem(
        code="declaration-not-owned",
        message=f"{culprit} declared {what} through a library of {victim.dist} (its entry point "
                f"'{victim.entry_point_spec}'); a distribution declares through its own "
                f"libraries only: refused, {culprit.distribution} is left out, "
                f"{victim.distribution} keeps what it declared itself",
        hint=f"declare in {culprit.distribution}'s own OpLibrary (OpLibrary(ns, 'FRAGMENT') to "
             f"add ops to {victim.distribution}'s namespace, 'IMPL' to add kernels), or block "
             f"{culprit.distribution} (OPREGISTRY_BLOCK={culprit.distribution})",
        culprits=(culprit,), others=(victim,), source=source)


def state_problem(culprit: Origin | None, changes: Iterable[Any], what: str) -> Problem:
    """The problem of ``culprit``'s code changing opregistry's own state (undone since).

    ``culprit`` ``None``: code no distribution is known to own did it.
    """
    changes = list(changes)
    shown = ", ".join(c.where for c in changes[:5]) + (
        f" and {len(changes) - 5} more" if len(changes) > 5 else "")
    source = next((c.source for c in changes if c.source), None)
    if culprit is None:
        return Problem(
            code="opregistry-state-changed",
            message=f"code run while {what} changed opregistry's own state: {shown}; opregistry "
                    f"put it back; no distribution is known to own the code that did it",
            hint="find the code at the line named here (a kernel module, a backend)",
            source=source)
    return Problem(
        code="opregistry-state-changed",
        message=f"{culprit} changed opregistry's own state while {what}: {shown}; opregistry "
                f"put it back, so the distributions after it load as they would have, and "
                f"left {culprit.distribution} out",
        hint=f"a plugin declares through its OpLibrary and never assigns to opregistry's "
             f"modules or classes; block {culprit.distribution} "
             f"(OPREGISTRY_BLOCK={culprit.distribution}) or report it to its authors",
        culprits=(culprit,), source=source)


def change_culprit(changes: Iterable[Any], window: Origin | None,
                   owners: Owners) -> Origin | None:
    """Who made ``changes``: the owner of the file a change names, else the code running."""
    for change in changes:
        owner = owners.of(_file(change.source))
        if owner is not None:
            return owner
    return window
