"""Which backend serves each dispatch key (the backend half of rule 6).

One backend serves a key.  When several installed backends declare the same
key, one is chosen and the others are *shadowed* for that key -- reported,
never a conflict that takes the key away from everyone:

1. the distribution the user chose (``OPREGISTRY_BACKEND_<KEY>=dist`` or
   ``backends = {KEY = "dist"}`` in ``OPREGISTRY_CONFIG``);
2. else the first-party backend of the key (:data:`opregistry.keys.PROVIDERS`:
   ``opregistry-cpu`` for ``CPU``, ...);
3. else the first by distribution name, then backend name (deterministic,
   rule 8).

Each backend left unused for a key gets a ``backend-shadowed`` warning naming
both and the switch that picks it (``info`` when the user's own choice
shadowed it).  A choice naming a distribution that declares no backend for
the key is a ``config-backend-invalid`` error (nothing is left out for it;
strict mode raises).  Two distributions declaring the same backend *name*
is still a ``backend-conflict``, but only the one not chosen by the same
order is left out: the name is how kernels are routed to their backend.
"""

from __future__ import annotations

import difflib
from collections import defaultdict

from ..keys import PROVIDERS
from ..model import Backend
from .context import Context, dist_name, names

__all__ = ["check_backends", "preference"]


def preference(ctx: Context, key: str | None):  # type: ignore[no-untyped-def]
    """Sort key of backends for ``key``: chosen, first-party, then by name (smallest wins)."""
    chosen = ctx.policy.backend_for(key) if key is not None else None
    provider = PROVIDERS.get(key) if key is not None else None

    def rank(b: Backend) -> tuple[int, str, str]:
        dist = dist_name(b.origin)
        if chosen is not None and dist == chosen:
            level = 0
        elif dist == provider or (key is None and dist in PROVIDERS.values()):
            level = 1
        else:
            level = 2
        return (level, dist, b.name)

    return rank


def check_backends(ctx: Context) -> dict[str, Backend]:
    """Dispatch key -> the one backend that serves it (see the module's docstring)."""
    _check_choices(ctx)
    by_name: dict[str, list[Backend]] = defaultdict(list)
    for b in ctx.backends:
        by_name[b.name].append(b)
    refused: set[int] = set()
    for name, group in by_name.items():
        if len({dist_name(b.origin) for b in group}) > 1:
            ordered = sorted(group, key=preference(ctx, _common_key(group)))
            keep = ordered[0]
            losers = [b for b in ordered if dist_name(b.origin) != dist_name(keep.origin)]
            refused.update(id(b) for b in losers)
            ctx.refuse("backend-conflict",
                       f"backend name {name!r} is declared by {names(b.origin for b in group)}; "
                       f"{dist_name(keep.origin)} keeps it, "
                       f"{', '.join(sorted({dist_name(b.origin) for b in losers}))} is left out "
                       f"(a backend's name routes kernels to it, so it must be unique)",
                       f"rename the backend in {', '.join(sorted({dist_name(b.origin) for b in losers}))}, "
                       f"or uninstall or block (OPREGISTRY_BLOCK) it",
                       (b.origin for b in losers), others=tuple(
                           sorted({keep.origin} if keep.origin is not None else set())))
    by_key: dict[str, list[Backend]] = defaultdict(list)
    for b in ctx.backends:
        if id(b) in refused:
            continue
        for key in b.keys:
            by_key[key].append(b)
    owners: dict[str, Backend] = {}
    for key, group in by_key.items():
        ordered = sorted(group, key=preference(ctx, key))
        owners[key] = winner = ordered[0]
        chosen = ctx.policy.backend_for(key)
        for other in ordered[1:]:
            by_user = chosen is not None and chosen == dist_name(winner.origin)
            ctx.warn(
                "backend-shadowed",
                f"dispatch key {key} is served by backend {winner.name!r} of {winner.origin}"
                f"{' (chosen by ' + ctx.policy.backend_source(key) + ')' if by_user else ''}; "
                f"backend {other.name!r} of {other.origin} also declares {key} and is not "
                f"used for it",
                f"to use {dist_name(other.origin)}'s backend for {key} instead, set "
                f"{_switch(key)}={dist_name(other.origin)} (or backends = {{{key} = "
                f"\"{dist_name(other.origin)}\"}} in OPREGISTRY_CONFIG)",
                severity="info" if by_user else "warning",
                key=key, others=tuple(o for o in (winner.origin, other.origin) if o is not None),
            )
    return owners


def _switch(key: str) -> str:
    return f"OPREGISTRY_BACKEND_{key.upper()}"


def _common_key(group: list[Backend]) -> str | None:
    keys = set(group[0].keys)
    for b in group[1:]:
        keys &= set(b.keys)
    return sorted(keys)[0] if keys else None


def _check_choices(ctx: Context) -> None:
    """A choice must name a distribution that declares a backend for the key."""
    for key, dist in ctx.policy.backends:
        declaring = sorted({dist_name(b.origin) for b in ctx.declared_backends if key in b.keys})
        if dist in declaring:
            continue
        where = ctx.policy.backend_source(key)
        close = difflib.get_close_matches(dist, declaring, n=1)
        ctx.warn(
            "config-backend-invalid",
            f"{where} chooses {dist!r} to serve {key}, but {dist!r} declares no backend for {key}"
            + (f"; did you mean {close[0]!r}?" if close else "")
            + (f" (backends for {key}: {', '.join(declaring)})" if declaring
               else f" (no installed backend declares {key})"),
            f"set {where} to one of them, or unset it" if declaring else f"unset {where}",
            severity="error", key=key,
        )
