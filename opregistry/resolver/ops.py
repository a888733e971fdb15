"""Rules for op definitions: declared namespace, valid names and schema (rule 7), no redefinition (rule 3)."""

from __future__ import annotations

from collections import defaultdict

from ..errors import DOCS_URL, SchemaError
from ..keys import (CLASS_PREFIX, DTYPE_SINCE, KNOWN_TAGS, TYPE_SINCE, class_known,
                    dtypes_lacking, installed_torch_build, shadowed_op_name, tag_since, type_since,
                    type_until, types_lacking, unreachable_name)
from ..model import OpDef, is_identifier
from ..plans import NamespacePlan, OpPlan
from ..schema import (SCHEMA_KEYWORDS, Schema, check_mutates_args, check_tags, overload_refusal,
                      parse_signature)
from .context import Context, dist_name, names
from .foreign import owner_text, possibly

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
    if why is not None:
        return f"name {op.name!r}, {why}"
    if shadowed_op_name(op.name):
        return (f"torch.ops.{op.namespace}.{op.name} is an attribute of torch's namespace object, "
                f"so Library.define fails for an op of that name (after registering it)")
    if op.overload:
        why = unreachable_name(op.overload, "overload")
        if why is not None:
            return f"overload {op.overload!r}, {why}"
        return overload_refusal(op.overload)
    return None


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
    if not _release_takes(ctx, op, schema):
        return None
    held = ctx.foreign.op_owner(op.qualname)
    if held is not None:
        certain = op.qualname in ctx.foreign.ops
        ctx.refuse("op-held-by-package",
                   f"{op.origin} defines {op.qualname}, which {owner_text(held)} "
                   + ("defines at its import with torch.library" if certain else possibly(held))
                   + ": torch would refuse the second definition, crashing whichever is "
                     "imported last" + ("" if certain else " (a C++ library aborts the process)"),
                   "rename the op or its overload (a FRAGMENT may add ops of new names)",
                   (op.origin,), op=op.qualname, source=where)
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


def _release_takes(ctx: Context, op: OpDef, schema: Schema) -> bool:
    """Every word of ``schema`` is one the installed torch's schema parser knows.

    Types come and go between releases (:data:`~opregistry.keys.TYPE_SINCE`,
    :data:`~opregistry.keys.TYPE_UNTIL`: ``SymBool`` from 2.13, ``Dimname`` up to 2.8),
    so do dtype names of ``ScalarType`` defaults and the custom classes torch
    registers: the resolver says so, naming the release, before torch does with
    "unknown type specifier" in the middle of registering.
    """
    words = schema.versioned
    if not words:
        return True
    facts = ctx.installed_torch()
    if facts is None:
        return True  # no torch installed: no release to check against (the tags rule does the same)
    lacking = types_lacking(words, facts.release)
    # not yet rather than no more (PyObject has both: 2.12 only)
    newer = [t for t in lacking if facts.release < TYPE_SINCE.get(t, (0, 0))]
    if newer:
        since = ", ".join(f"{t} from torch {type_since(t)}" for t in newer)
        _refuse_needs_newer(ctx, op, "schema-type-needs-newer-torch",
                            f"uses type(s) {newer} in its schema, which the schema parser of the "
                            f"installed torch ({facts.version}) lacks: {since}",
                            [type_since(t) for t in newer],
                            f"declare the op without {newer}"
                            + (" (SymBool: bool)" if "SymBool" in newer else ""))
        return False
    if lacking:
        until = ", ".join(f"{t} up to torch {type_until(t)}" for t in lacking)
        ctx.refuse("schema-type-gone-from-torch",
                   f"{op.origin}: {op.qualname} uses type(s) {lacking} in its schema, which the "
                   f"schema parser of the installed torch ({facts.version}) no longer takes: "
                   f"{until}", f"declare the op without {lacking}"
                   + (" (Dimname: str)" if "Dimname" in lacking else ""), (op.origin,),
                   op=op.qualname, source=op.source)
        return False
    dtypes = dtypes_lacking(words, facts.release)
    if dtypes:
        _refuse_needs_newer(ctx, op, "schema-dtype-needs-newer-torch",
                            f"defaults a ScalarType argument to dtype(s) {dtypes}, which the "
                            f"installed torch ({facts.version}) lacks",
                            ["%d.%d" % DTYPE_SINCE[d] for d in dtypes], "default to another dtype")
        return False
    return _classes_known(ctx, op, [w[len(CLASS_PREFIX):] for w in words
                                    if w.startswith(CLASS_PREFIX)], facts.release)


def _classes_known(ctx: Context, op: OpDef, classes: list[str], release: tuple[int, int]) -> bool:
    """Every custom class the schema names is registered with torch when the op is defined.

    With torch imported, torch says (its registry holds every class loaded so
    far); without it, the classes torch registers itself (the release's table).
    A distribution with a native library may register its own classes as it
    loads, before its ops are defined: torch checks those.
    """
    if not classes or (op.namespace, dist_name(op.origin)) in ctx.natives:
        return True
    if ctx.torch is not None and ctx.torch.has_class is not None:
        unknown = [c for c in classes if not ctx.torch.has_class(c)]
    else:
        build = installed_torch_build()
        cuda = build is not None and build[1] is not None
        unknown = [c for c in classes if not class_known(c, release, cuda)]
    if not unknown:
        return True
    ctx.refuse("schema-class-unknown",
               f"{op.origin}: {op.qualname} uses custom class(es) "
               f"{[CLASS_PREFIX + c for c in sorted(unknown)]}, which torch does not have "
               f"registered" + ("" if ctx.torch is not None else
                                " (torch registers none of that name itself; without torch "
                                "imported, opregistry knows only those)"),
               "register the class before the op is defined: from a native library of this "
               "distribution (NativeLibrary), or torch.classes.load_library in its import",
               (op.origin,), op=op.qualname, source=op.source)
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

