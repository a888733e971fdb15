"""A warm ``import torch`` with nothing to register, known from one small file.

opregistry installed with its backends and no op package -- or every op
package blocked -- is the start every user of such a machine pays for; so
is a machine whose only registering packages are ones opregistry adopts
(vllm, bitsandbytes, torchao: imported on the first touch of their
namespace, never at ``import torch``).  When
:meth:`opregistry.plancache.PlanCache.store` writes the entry of ``import
torch`` whose plan registers nothing and has nothing to report -- no op,
kernel, namespace or native library, no problem, not locked, and every
adoption lazy with none of its kernels switched off
(:func:`~opregistry.plancache.waiting_load`) -- it writes an *idle marker*
beside it: the entry's manifest and the adopted namespaces, keyed by the
``OPREGISTRY_*`` variables as they are set (and only for a plan built with
the settings they give).  While that manifest holds, :func:`idle_start`
answers having imported the stamps' checker and the cache reader alone: no
settings parsed, no backend, no pluggy, no attrs class, no decoding.  The
autoload then notes the load as deferred
(:attr:`opregistry.state.ProcessState.deferred`), installs the recorder of
``torch.library`` registrations, as a load does, and, for adopted
namespaces, the hooks on ``torch.ops`` with a waiting adopter
(:class:`opregistry.autoload.Waiting`); the registry itself is loaded --
from the same entry -- the first time it is asked for
(:func:`opregistry.get_registry`, :func:`opregistry.load`, and what reads
them: ``opregistry list --live``, ``verify_lock``) or an adopted namespace
is touched.

Anything else -- no marker, a stale one, a plan that registers something,
an eager adoption, a kernel switch on an adopted package, locked mode,
``OPREGISTRY_KERNEL_COUNTS`` -- is the full load, as before.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from . import inputs
from .diskcache import DiskCache
from .logs import get_logger
from .variables import CHECK_VAR, COUNTS_VAR, check_mode

__all__ = ["FORMAT", "NAME", "CHECK_VAR", "plan_cache", "content_check", "marker_key", "idle_start"]

log = get_logger()

#: the plan cache entries' encoding version: an entry of another format is ignored
FORMAT = 5
#: the folder of the cache directory that holds the plans
NAME = "plans"


def plan_cache(environ: Mapping[str, str] | None = None) -> DiskCache:
    """The disk cache that holds the plans."""
    return DiskCache.open(NAME, stamp=f"plan-{FORMAT}", environ=environ)


def content_check(settings: Any, environ: Mapping[str, str]) -> bool:
    """Whether this slot's inputs are stamped by content (locked mode, or asked)."""
    return settings.lock is not None or check_mode(environ) == "content"


def marker_key(environ: Mapping[str, str] | None = None, *, own: bool = False) -> str:
    """The key of the idle marker of ``import torch`` in this environment: its entry's
    manifest alone (a few kilobytes, where the entry of a thousand ops is a megabyte of
    JSON), keyed by the variables as they are set, so that reading it parses no settings.
    ``own``: the marker of the slot of this ``sys.path[0]`` alone (see
    :class:`~opregistry.plancache.PlanCache`)."""
    env = os.environ if environ is None else environ
    return inputs.environment_slot(torch_imported=True, content=check_mode(env) == "content",
                                   environ=env, own=own) + "\n(idle)"


def idle_start(environ: Mapping[str, str] | None = None
               ) -> tuple[frozenset[str], frozenset[str]] | None:
    """Whether the load at ``import torch`` can wait (see the module's docstring): ``None``
    when it cannot (the full load, now), else the adopted namespaces whose first touch loads
    the registry, and those whose missing ops do (both empty: nothing is adopted).

    Never raises for a cache it cannot read: that is ``None``, and the full load.
    """
    env = os.environ if environ is None else environ
    if (env.get("OPREGISTRY_LOCK") or "").strip() or env.get(COUNTS_VAR):
        return None
    try:
        cache = plan_cache(env)
        for own in (True, False):  # the slot of this sys.path[0], then the shared one
            marker = cache.load(marker_key(env, own=own))
            if not isinstance(marker, dict):
                continue
            changed = inputs.check_manifest(marker["manifest"])
            if changed is None:
                settled = None if check_mode(env) == "content" else \
                    inputs.settle(marker["manifest"])
                if settled is not None:  # its racy files are checked by time from now on
                    cache.store(marker_key(env, own=own), {**marker, "manifest": settled})
                return _names(marker, "adopted"), _names(marker, "adopted_ops")
            log.debug("plan cache entry stale", changed=changed)
    except Exception as exc:  # noqa: BLE001 - an unusable marker means the full load
        log.debug("plan cache: idle check failed", error=repr(exc))
    return None


def _names(marker: Mapping[str, Any], field: str) -> frozenset[str]:
    names = marker.get(field, [])
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise TypeError(f"the marker's {field} is not a list of names")
    return frozenset(names)
