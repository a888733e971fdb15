"""Locked mode: only distributions that match the lockfile are imported.

With ``OPREGISTRY_LOCK=/path/to/opregistry.lock`` (:attr:`Settings.lock
<opregistry.config.Settings.lock>`), :func:`gate` runs *before* discovery
imports any plugin module.  For every installed distribution with
opregistry entry points that the allow/block lists admit, it checks

1. that the lockfile names it,
2. at the same version,
3. and that its files on disk hash to the lockfile's ``contents`` (every
   file re-read: :func:`opregistry.digests.contents` with
   ``trust_record=False``).

A distribution that fails any check is never imported: discovery sees it
as blocked, and the plan reports a ``lock-mismatch`` error that names the
distribution and each differing file.  The rest loads.  A lockfile that
:func:`~opregistry.lockfile.read_lock` refuses -- missing, no regular file, not
JSON, of another format version, a key of the wrong shape, a fingerprint missing
or not its content's (edited by hand) -- loads nothing, with one
``lock-unreadable`` error that says which: in locked mode, no proof means no code.

Nothing here raises: :func:`gate` is on the path of ``import torch``.
"""

from __future__ import annotations

from typing import Any, Mapping

import attrs
from attrs import field, frozen

from .config import Settings, canonical_name
from .digests import contents, file_differences
from .discovery import GROUPS
from .discovery import _name_version as name_version  # METADATA's two headers, read fast
from .errors import LockMismatchError
from .lockfile import read_lock
from .model import Discovered, Origin, Problem, Skipped

__all__ = ["LOCK_VAR", "Gate", "gate"]

#: the environment variable that turns the locked mode on
LOCK_VAR = "OPREGISTRY_LOCK"


@frozen
class Gate:
    """What the locked mode decided: the settings discovery runs with, and why each was refused.

    ``settings`` are the caller's, with every refused distribution added to
    the block-list (so discovery never imports it) -- or, when the lockfile
    is unusable, with an empty allow-list.  :meth:`apply` puts the real
    reasons and the problems onto discovery's result.
    """

    settings: Settings
    refused: Mapping[str, str] = field(factory=dict)
    problems: tuple[Problem, ...] = ()
    #: when set, every distribution was refused for this reason (unusable lockfile)
    everything: str | None = None

    def apply(self, discovered: Discovered) -> Discovered:
        if not self.refused and not self.problems and self.everything is None:
            return discovered
        skipped = []
        for s in discovered.skipped:
            reason = self.everything or self.refused.get(s.origin.distribution)
            skipped.append(Skipped(s.origin, reason) if reason else s)
        return attrs.evolve(discovered, skipped=tuple(skipped),
                            problems=discovered.problems + self.problems)


def gate(settings: Settings) -> Gate:
    """Check the installed distributions against ``settings.lock`` before any is imported."""
    if settings.lock is None:
        return Gate(settings)
    where = f"{LOCK_VAR}={settings.lock}"
    try:
        locked = read_lock(settings.lock)
        return _check(settings, locked, where)
    except LockMismatchError as exc:
        reason = f"locked mode ({where}): the lockfile cannot be used"
        return _nothing(settings, reason, exc.message)
    except Exception as exc:  # noqa: BLE001 - never break `import torch`; load nothing instead
        reason = f"locked mode ({where}): the installed distributions could not be checked"
        return _nothing(settings, reason, f"{type(exc).__name__}: {exc}")


def _nothing(settings: Settings, reason: str, detail: str) -> Gate:
    problem = Problem(
        code="lock-unreadable",
        message=f"{reason} ({detail}); no op package or backend is loaded",
        hint=f"fix or regenerate the lockfile ('opregistry lock -o {settings.lock}' in the "
             f"environment it should describe), or unset {LOCK_VAR}",
    )
    return Gate(attrs.evolve(settings, allow=frozenset()), problems=(problem,), everything=reason)


def _check(settings: Settings, locked: Mapping[str, Any], where: str) -> Gate:
    import importlib_metadata

    versions: Mapping[str, str] = locked["distributions"]
    recorded: Mapping[str, Any] = locked["contents"]
    seen: set[str] = set()
    refused: dict[str, str] = {}
    problems = []
    for dist in importlib_metadata.distributions():
        every = dist.entry_points
        eps = [ep for ep in every if ep.group in GROUPS]
        if not eps:
            continue
        raw, version = name_version(dist, None)
        name = canonical_name(raw or "")
        if name in seen or settings.admits(name) is not None:
            continue  # a second copy (discovery reports it) or not admitted anyway
        seen.add(name)
        found = _mismatch(name, version, dist, every, versions, recorded)
        if not found:
            continue
        refused[name] = f"locked mode ({where}): does not match the lockfile, not imported"
        origins = tuple(sorted(Origin(distribution=name, version=version, group=ep.group,
                                      entry_point=ep.name, value=ep.value) for ep in eps))
        problems.append(Problem(
            code="lock-mismatch",
            message=f"{name}=={version} does not match the lockfile {settings.lock!r} "
                    f"(locked mode), so none of its code was imported: " + "; ".join(found),
            hint=f"install the locked version of {name} (pip install --force-reinstall "
                 f"{name}=={versions.get(name, version)}), or, if this content is the new "
                 f"truth, review it and run 'opregistry lock -o {settings.lock}'",
            culprits=origins,
        ))
    for name in sorted(set(versions) - seen):
        if settings.admits(name) is None:
            problems.append(Problem(
                code="lock-missing",
                severity="warning",
                message=f"the lockfile {settings.lock!r} names {name}=={versions[name]}, which "
                        f"is not installed here (locked mode)",
                hint=f"install {name}=={versions[name]}, or regenerate the lockfile",
            ))
    if not refused and not problems:
        return Gate(settings)
    blocked = attrs.evolve(settings, block=settings.block | frozenset(refused))
    return Gate(blocked, refused=refused, problems=tuple(problems))


def _mismatch(name: str, version: str, dist: Any, entry_points: Any,
              versions: Mapping[str, str], recorded: Mapping[str, Any]) -> list[str]:
    """Why ``dist`` does not match the lock (empty when it does), one phrase each."""
    if name not in versions:
        return [f"the lockfile does not name {name}"]
    if versions[name] != version:
        return [f"version {version} is installed, the lockfile has {versions[name]}"]
    if name not in recorded:
        return [f"the lockfile records no content for {name}"]
    # the files of the modules the locked plan referenced outside the install's own list
    # (a kernel module beside the package, say): hashed too, before anything is imported
    here = contents(dist, trust_record=False, entry_points=entry_points,
                    references=recorded[name].get("references", ()))
    if here["digest"] == recorded[name].get("digest") and here["files"] == recorded[name].get(
            "files"):
        return []
    prefix = f"distribution {name}: "
    return [d[len(prefix):] if d.startswith(prefix) else d
            for d in file_differences(name, recorded[name], here, "in the lockfile", "here")]
