"""Which backend serves each dispatch key (the backend half of rule 6)."""

from __future__ import annotations

from collections import defaultdict

from ..model import Backend
from .context import Context, names

__all__ = ["check_backends"]


def check_backends(ctx: Context) -> dict[str, Backend]:
    """Dispatch key -> the one backend that serves it; two for one key is a conflict."""
    by_key: dict[str, list[Backend]] = defaultdict(list)
    by_name: dict[str, list[Backend]] = defaultdict(list)
    for b in ctx.backends:
        by_name[b.name].append(b)
        for key in b.keys:
            by_key[key].append(b)
    for name, group in by_name.items():
        if len(group) > 1:
            ctx.refuse("backend-conflict",
                       f"backend {name!r} is declared by {names(b.origin for b in group)}",
                       "uninstall or block (OPREGISTRY_BLOCK) all but one",
                       (b.origin for b in group))
    owners: dict[str, Backend] = {}
    for key, group in by_key.items():
        if len(group) > 1:
            ctx.refuse("backend-conflict",
                       f"dispatch key {key} is served by several backends: "
                       f"{names(b.origin for b in group)}",
                       "uninstall or block (OPREGISTRY_BLOCK) all but one",
                       (b.origin for b in group), key=key)
        else:
            owners[key] = group[0]
    return owners
