"""Rules for op definitions: declared namespace, valid names and schema (rule 7), no redefinition (rule 3)."""

from __future__ import annotations

from collections import defaultdict

from ..errors import DOCS_URL, SchemaError
from ..keys import KNOWN_TAGS, tag_since, type_since, types_lacking, unreachable_name
from ..model import OpDef, is_identifier
from ..plan import NamespacePlan, OpPlan
from ..schema import SCHEMA_KEYWORDS, Schema, check_mutates_args, check_tags, parse_signature
from .context import Context, dist_name, names

__all__ = ["check_ops", "name_refusal"]


def name_refusal(op: OpDef) -> str | None:
    """Why torch cannot take ``op``'s name or overload, or ``None``."""
    if not is_identifier(op.name) or (op.overload and not is_identifier(op.overload)):
        return "names and overloads must be identifiers"
    keywords = sorted({op.name, op.overload} & SCHEMA_KEYWORDS)
    if keywords:
        return (f"{keywords[0]!r} is a keyword of torch's schema language, which torch cannot "
                f"parse as a name")
    why = unreachable_name(op.name, "op")
    if why is None and op.overload:
        why = unreachable_name(op.overload, "overload")
        return f"overload {op.overload!r}, {why}" if why else None
    return f"name {op.name!r}, {why}" if why else None


def _parsed(ctx: Context, op: OpDef, namespaces: dict[str, NamespacePlan],
            declared: set[tuple[str, str]]) -> Schema | None:
    """``op``'s parsed schema when it passes every per-op rule; else refused, ``None``."""
    where = op.source
    if (op.namespace, dist_name(op.origin)) not in declared:
        ctx.refuse("op-namespace-undeclared",
                   f"{op.origin} defines {op.qualname} but does not declare namespace "
                   f"{op.namespace!r}",
                   f"declare it: OpLibrary({op.namespace!r}) to own it, or "
                   f"OpLibrary({op.namespace!r}, 'FRAGMENT') to add to it",
                   (op.origin,), op=op.qualname, source=where)
        return None
    if op.namespace not in namespaces:
        return None  # the namespace itself is invalid or in conflict: reported already
    why = name_refusal(op)
    if why is not None:
        ctx.refuse("op-name-invalid", f"{op.origin} defines op {op.qualname!r}: {why}",
                   "rename the op (or its overload)", (op.origin,), op=op.qualname, source=where)
        return None
    if not _tags_known(ctx, op):
        return None
    try:
        schema = parse_signature(op.schema)
        check_mutates_args(schema, op.mutates_args, op.qualname)
        check_tags(schema, op.tags, op.qualname)
    except SchemaError as exc:
        ctx.refuse("schema-invalid", f"{op.origin}: {op.qualname}: {exc}",
                   f"fix the schema (the schema language, by example: "
                   f"{DOCS_URL}op-authors/#every-kind-of-op)",
                   (op.origin,), op=op.qualname, source=where)
        return None
    if not _types_parsed_by_installed_torch(ctx, op, schema):
        return None
    if ctx.torch is not None and op.qualname in ctx.torch.ops and \
            (op.namespace, dist_name(op.origin)) not in ctx.natives:  # a native op: loaded already
        ctx.refuse("op-held-by-torch",
                   f"{op.origin} defines {op.qualname}, which torch already has "
                   f"(registered outside opregistry)",
                   "rename the op or its overload", (op.origin,), op=op.qualname, source=where)
        return None
    return schema


def _tags_known(ctx: Context, op: OpDef) -> bool:
    """Every tag is a ``torch.Tag`` of some supported torch, and of the installed one.

    Without torch imported, the installed torch's tags are read from its files
    (:func:`~opregistry.keys.installed_torch`), so ``opregistry list`` reaches the
    verdict ``import torch`` will: an op tagged ``out`` is refused on torch 2.8,
    naming the release that has the tag, in both.
    """
    unknown = sorted(set(op.tags) - KNOWN_TAGS)
    if unknown:
        ctx.refuse("op-tag-unknown",
                   f"{op.origin}: {op.qualname} has unknown tag(s) {unknown}",
                   "use names of torch.Tag members, e.g. 'pt2_compliant_tag'",
                   (op.origin,), op=op.qualname, source=op.source)
        return False
    if not op.tags:
        return True
    facts = ctx.installed_torch()
    available = ctx.torch.tags if ctx.torch is not None else (
        facts.tags if facts is not None else KNOWN_TAGS)
    lacking = sorted(set(op.tags) - available)
    if lacking:
        version = facts.version if facts is not None else "?"
        since = ", ".join(f"torch.Tag.{t} exists from torch {tag_since(t) or '?'}" for t in lacking)
        _refuse_needs_newer(ctx, op, "op-tag-needs-newer-torch",
                            f"has tag(s) {lacking}, which the installed torch ({version}) lacks: "
                            f"{since}", [tag_since(t) for t in lacking],
                            f"declare the op without {lacking}")
        return False
    return True


def _refuse_needs_newer(ctx: Context, op: OpDef, code: str, what: str,
                        since: list[str | None], instead: str) -> None:
    """Refuse ``op``, which needs a newer torch than the installed one: the newest of ``since``."""
    needed = max((v or "0.0" for v in since), key=lambda v: tuple(map(int, v.split("."))))
    ctx.refuse(code, f"{op.origin}: {op.qualname} {what}", f"install torch>={needed}, or {instead}",
               (op.origin,), op=op.qualname, source=op.source)


def _types_parsed_by_installed_torch(ctx: Context, op: OpDef, schema: Schema) -> bool:
    """Every type of ``schema`` is one the installed torch's schema parser knows.

    ``SymBool`` is refused by torch 2.8's parser (:data:`~opregistry.keys.TYPE_SINCE`):
    the resolver says so, naming the release that takes it, before torch does with
    "unknown type specifier" in the middle of registering.
    """
    facts = ctx.installed_torch()
    if facts is None:
        return True  # no torch installed: no release to check against (the tags rule does the same)
    bases = [a.type.base for a in schema.arguments] + [r.type.base for r in schema.returns]
    lacking = types_lacking(bases, facts.release)
    if not lacking:
        return True
    since = ", ".join(f"{t} from torch {type_since(t)}" for t in lacking)
    _refuse_needs_newer(ctx, op, "schema-type-needs-newer-torch",
                        f"uses type(s) {lacking} in its schema, which the schema parser of the "
                        f"installed torch ({facts.version}) lacks: {since}",
                        [type_since(t) for t in lacking],
                        f"declare the op without {lacking} (e.g. bool)")
    return False


def check_ops(ctx: Context, namespaces: dict[str, NamespacePlan]) -> dict[str, OpPlan]:
    """Qualified name -> plan of every op that passes; a redefinition is an ``op-conflict``."""
    declared = {(ns.name, dist_name(ns.origin)) for ns in ctx.namespaces}
    by_name: dict[str, list[tuple[OpDef, Schema]]] = defaultdict(list)
    for op in ctx.ops:
        schema = _parsed(ctx, op, namespaces, declared)
        if schema is not None:
            by_name[op.qualname].append((op, schema))
    plans: dict[str, OpPlan] = {}
    for qualname, defs in by_name.items():
        if len(defs) > 1:
            defs = _redefined(ctx, qualname, defs, namespaces[defs[0][0].namespace])
            if not defs:
                continue
        plans[qualname] = OpPlan(op=defs[0][0], parsed=defs[0][1])
    return plans


def _redefined(ctx: Context, qualname: str, defs: list[tuple[OpDef, Schema]],
               namespace: NamespacePlan) -> list[tuple[OpDef, Schema]]:
    """Report an op defined more than once; the owner's definition stands if there is one."""
    ops = [op for op, _ in defs]
    owner = namespace.owner
    owner_defs = [d for d in defs if owner is not None and dist_name(d[0].origin) == dist_name(owner)]
    if len({dist_name(o.origin) for o in ops}) == 1:
        culprits = [ops[0].origin]
        msg = f"{ops[0].origin} defines {qualname} twice"
    elif len(owner_defs) == 1:
        culprits = [o.origin for o in ops if o is not owner_defs[0][0]]
        msg = (f"{names(culprits)} redefine(s) {qualname}, which namespace owner "
               f"{owner} already defines; a FRAGMENT may add ops, never redefine one")
    else:
        culprits = [o.origin for o in ops]
        msg = f"{qualname} is defined by {names(culprits)}"
    ctx.refuse("op-conflict", msg,
               "rename the op (or give it another overload name), or uninstall one "
               "of the distributions", culprits, op=qualname,
               others=tuple(d[0].origin for d in owner_defs if d[0].origin),
               # the line to fix is the culprit's, not the owner's
               source=next((o.source for o in ops if o.origin in culprits and o.source),
                           ops[-1].source))
    return owner_defs if len(owner_defs) == 1 else []
