"""Stage 1, discover: find the plugins' entry points and import each in isolation.

Reads the entry-point groups :data:`BACKENDS_GROUP` and :data:`OPS_GROUP`
through importlib-metadata, applies the allow- and block-lists, and loads
every admitted entry point on its own: a missing module or an exception at
import becomes a :class:`~opregistry.model.Problem` of that distribution, and
the others still load.
"""

from __future__ import annotations

import traceback
from typing import Any, Iterable

import attrs
from attrs import frozen

from .config import Settings, canonical_name
from .model import Origin, Problem
from .logs import get_logger

__all__ = ["BACKENDS_GROUP", "OPS_GROUP", "GROUPS", "Plugin", "Skipped", "Discovered", "discover"]

BACKENDS_GROUP = "opregistry.backends"
OPS_GROUP = "opregistry.ops"
GROUPS = (BACKENDS_GROUP, OPS_GROUP)

log = get_logger()


@frozen
class Plugin:
    """A loaded entry point: the object it names, and where it came from."""

    origin: Origin
    obj: Any = attrs.field(eq=False, repr=False)


@frozen
class Skipped:
    """An entry point that was found but not loaded, and why."""

    origin: Origin
    reason: str


@frozen
class Discovered:
    plugins: tuple[Plugin, ...]
    skipped: tuple[Skipped, ...]
    problems: tuple[Problem, ...]


def _origin(ep: Any, group: str) -> Origin:
    dist = getattr(ep, "dist", None)
    name = dist.metadata["Name"] if dist is not None else "<unknown>"
    version = dist.version if dist is not None else "?"
    return Origin(
        distribution=canonical_name(name),
        version=version,
        group=group,
        entry_point=ep.name,
        value=ep.value,
    )


def _where(exc: BaseException) -> str | None:
    """file:line of the innermost frame of ``exc`` outside importlib."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "importlib" not in f.filename]
    if not frames:
        return None
    frame = frames[-1]
    return f"{frame.filename}:{frame.lineno}"


def load_problem(origin: Origin, exc: BaseException) -> Problem:
    if isinstance(exc, ModuleNotFoundError):
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
    return Problem(
        code=code,
        message=f"{origin} failed to load: {type(exc).__name__}: {exc}",
        hint=hint,
        culprits=(origin,),
        source=_where(exc),
    )


def entry_points(groups: Iterable[str] = GROUPS) -> list[tuple[str, Any]]:
    """Every entry point of ``groups``, as ``(group, entry_point)``, in a stable order."""
    import importlib_metadata

    found: list[tuple[str, Any]] = []
    for group in groups:
        for ep in importlib_metadata.entry_points(group=group):
            found.append((group, ep))
    return found


def discover(settings: Settings, *, groups: Iterable[str] = GROUPS) -> Discovered:
    """Find and import the plugins that ``settings`` admits."""
    plugins: list[Plugin] = []
    skipped: list[Skipped] = []
    problems: list[Problem] = []
    for group, ep in entry_points(groups):
        origin = _origin(ep, group)
        reason = settings.admits(origin.distribution)
        if reason is not None:
            skipped.append(Skipped(origin, reason))
            continue
        try:
            obj = ep.load()
        except Exception as exc:  # a plugin's failure is its own, never ours
            problem = load_problem(origin, exc)
            log.warning("plugin failed to load", distribution=origin.dist, error=str(exc))
            problems.append(problem)
            skipped.append(Skipped(origin, problem.message))
            continue
        plugins.append(Plugin(origin, obj))
    return Discovered(tuple(plugins), tuple(skipped), tuple(problems))
