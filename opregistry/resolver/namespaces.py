"""Rules 1-4 for namespaces: valid and not torch's, one DEF, FRAGMENTs, closed namespaces."""

from __future__ import annotations

import re
from collections import defaultdict

from ..keys import RESERVED_NAMESPACES, unreachable_name
from ..model import Namespace, is_identifier
from ..plans import NamespacePlan
from ..schema import SCHEMA_KEYWORDS
from .context import Context, dist_name, names
from .foreign import owner_text

__all__ = ["check_namespaces", "namespace_refusal"]


def namespace_refusal(name: str) -> tuple[str, str] | None:
    """``(why, suggested name)`` when ``name`` cannot be a namespace (rule 1), else ``None``."""
    if not is_identifier(name):
        return ("which is not a valid identifier (ASCII letters, digits and '_', not starting "
                "with a digit)", _suggest_identifier(name))
    if name in SCHEMA_KEYWORDS:
        return ("a keyword of torch's schema language, which torch cannot parse as a namespace",
                name.lower() + "_ops")
    unreachable = unreachable_name(name, "namespace")
    if unreachable is not None:
        return unreachable, name.strip("_") + "_ops"
    return None


def _valid(ctx: Context, ns: Namespace) -> bool:
    refusal = namespace_refusal(ns.name)
    if refusal is not None:
        why, suggestion = refusal
        ctx.refuse("namespace-invalid",
                   f"{ns.origin} declares namespace {ns.name!r}, {why}",
                   f"rename the namespace, e.g. to {suggestion!r}",
                   (ns.origin,), namespace=ns.name, source=ns.source)
        return False
    if ns.name in RESERVED_NAMESPACES:
        ctx.refuse("namespace-reserved",
                   f"{ns.origin} declares {ns.kind} of namespace {ns.name!r}, which belongs to torch",
                   "use a namespace of your own; to add a kernel to a torch op, use "
                   "OpLibrary(ns, 'IMPL') with override policy",
                   (ns.origin,), namespace=ns.name, source=ns.source)
        return False
    return True


def check_namespaces(ctx: Context) -> dict[str, NamespacePlan]:
    """Namespace name -> its plan (owner, fragments), for every namespace that passes."""
    defs: dict[str, list[Namespace]] = defaultdict(list)
    frags: dict[str, list[Namespace]] = defaultdict(list)
    for ns in ctx.namespaces:
        if _valid(ctx, ns):
            (defs if ns.kind == "DEF" else frags)[ns.name].append(ns)
    plans: dict[str, NamespacePlan] = {}
    for name in sorted(set(defs) | set(frags)):
        owners = defs.get(name, [])
        if len({dist_name(n.origin) for n in owners}) > 1:
            ctx.refuse("namespace-conflict",
                       f"namespace {name!r} is defined (DEF) by {names(n.origin for n in owners)}; "
                       f"a namespace has one owner",
                       "uninstall one of them, or block it with OPREGISTRY_BLOCK=<distribution>",
                       (n.origin for n in owners), namespace=name, source=owners[0].source)
            continue
        held = ctx.foreign.namespaces.get(name)
        if held is not None and owners:
            ctx.refuse("namespace-held-by-package",
                       f"namespace {name!r} is registered in by {owner_text(held)}, which uses "
                       f"torch.library directly; {names(n.origin for n in owners)} cannot DEF "
                       f"it: torch would refuse one of them (or a redefined op) when both are "
                       f"imported",
                       "rename the namespace, or declare it FRAGMENT to add ops of new names "
                       "to it", (n.origin for n in owners), namespace=name,
                       source=owners[0].source)
            continue
        if ctx.torch is not None and name in ctx.torch.namespaces and owners and \
                owners[0].native is None:
            # a native DEF held by torch is its library, loaded already (by opregistry, or
            # by an import of its extension module): loading checks it is that library
            ctx.refuse("namespace-held-by-torch",
                       f"namespace {name!r} already exists in torch (a C++ TORCH_LIBRARY or a "
                       f"Library('{name}', 'DEF') made outside opregistry); "
                       f"{names(n.origin for n in owners)} cannot DEF it",
                       "rename the namespace, or declare it FRAGMENT to add ops to it",
                       (n.origin for n in owners), namespace=name, source=owners[0].source)
            continue
        owner = owners[0] if owners else None
        plans[name] = NamespacePlan(
            name=name,
            owner=owner.origin if owner else None,
            fragments=_fragments(ctx, name, owner, frags.get(name, [])),
            closed=bool(owner and owner.closed),
        )
    return plans


def _fragments(ctx: Context, name: str, owner: Namespace | None,
               frags: list[Namespace]) -> tuple:
    """The origins of the FRAGMENTs admitted to ``name``: rule 3's closed namespaces."""
    admitted = set()
    for frag in frags:
        if owner is not None and dist_name(frag.origin) == dist_name(owner.origin):
            continue  # the owner's own FRAGMENT adds nothing to its DEF
        if owner is not None and owner.closed:
            ctx.refuse("namespace-closed",
                       f"{frag.origin} adds a FRAGMENT to namespace {name!r}, which its owner "
                       f"{owner.origin} closed to other distributions",
                       f"ask {dist_name(owner.origin)} to open it, or use your own namespace",
                       (frag.origin,), others=(owner.origin,) if owner.origin else (),
                       namespace=name, source=frag.source)
            continue
        if frag.origin is not None:
            admitted.add(frag.origin)
    return tuple(sorted(admitted))


def _suggest_identifier(name: str) -> str:
    text = re.sub(r"\W", "_", name.encode("ascii", "ignore").decode() or "ns")
    return text if is_identifier(text) else f"ns_{text}"
