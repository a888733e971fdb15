"""A warm ``import torch`` with nothing to register, known from the plan cache's entry alone.

opregistry installed with its backends and no op package -- or every op
package blocked -- is the start every user of such a machine pays for.
When the plan cache's entry of this process's slot has an idle marker
beside it -- written by :meth:`opregistry.plancache.PlanCache.store` with
the entry's manifest when its plan registers nothing: no op, kernel,
namespace, native library or adopted package, no problem, not locked --
and that manifest still holds, :func:`idle_start` answers
``True`` having imported the slot's inputs and the cache reader only: no
backend, no pluggy, no record class, no decoding.  The autoload then notes
the load as deferred (:attr:`opregistry.state.ProcessState.deferred`) and
installs the recorder of ``torch.library`` registrations, as a load does;
the registry itself is loaded -- a plan-cache hit, the same registry -- the
first time it is asked for (:func:`opregistry.get_registry`,
:func:`opregistry.load`, and what reads them: ``opregistry list --live``,
``verify_lock``).

Anything else -- no entry, a stale one, a plan that registers something,
locked mode, ``OPREGISTRY_KERNEL_COUNTS`` -- is the full load, as before.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from . import inputs
from .diskcache import DiskCache
from .logs import get_logger

__all__ = ["FORMAT", "NAME", "CHECK_VAR", "plan_cache", "content_check", "marker_key", "idle_start"]

log = get_logger()

#: the plan cache entries' encoding version: an entry of another format is ignored
FORMAT = 3
#: the folder of the cache directory that holds the plans
NAME = "plans"
#: ``OPREGISTRY_CACHE_CHECK=content``: stamp every input by content, not size and time
CHECK_VAR = "OPREGISTRY_CACHE_CHECK"
#: ``OPREGISTRY_KERNEL_COUNTS``: the materializer counts calls, and prints them at exit
_COUNTS_VAR = "OPREGISTRY_KERNEL_COUNTS"


def plan_cache(environ: Mapping[str, str] | None = None) -> DiskCache:
    """The disk cache that holds the plans."""
    return DiskCache.open(NAME, stamp=f"plan-{FORMAT}", environ=environ)


def content_check(settings: Any, environ: Mapping[str, str]) -> bool:
    """Whether this slot's inputs are stamped by content (locked mode, or asked)."""
    mode = (environ.get(CHECK_VAR) or "stat").strip().lower()
    return settings.lock is not None or mode == "content"


def marker_key(key: str) -> str:
    """The key of the idle marker of the slot ``key``: its entry's manifest alone, stored
    beside the entry when its plan registers nothing (a few kilobytes, where the entry
    of a thousand ops is a megabyte of JSON)."""
    return key + "\n(idle)"


def idle_start(settings: Any, environ: Mapping[str, str] | None = None) -> bool:
    """Whether the load at ``import torch`` has nothing to do: see the module's docstring.

    ``settings``: the autoload's :class:`~opregistry.config.Settings`.  Never
    raises for a cache it cannot read: that is ``False``, and the full load.
    """
    env = os.environ if environ is None else environ
    if settings.lock is not None or env.get(_COUNTS_VAR):
        return False
    try:
        key = inputs.slot(settings, torch_imported=True, content=content_check(settings, env),
                          environ=env)
        marker = plan_cache(env).load(marker_key(key))
        if not isinstance(marker, dict):
            return False
        changed = inputs.check_manifest(marker["manifest"])
    except Exception as exc:  # noqa: BLE001 - an unusable marker means the full load
        log.debug("plan cache: idle check failed", error=repr(exc))
        return False
    if changed is not None:
        log.debug("plan cache entry stale", changed=changed)
        return False
    return True
