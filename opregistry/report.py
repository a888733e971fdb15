"""What the ``opregistry`` commands show, as plain data, for the CLI and for Python.

Each ``*_report`` function takes a :class:`~opregistry.plans.Plan` (from
:func:`opregistry.plan`, or a loaded registry's ``.plan``) and returns a
JSON-ready dict: the object ``opregistry COMMAND --json`` prints.  The CLI
only parses arguments and renders these dicts as text; like ``datasette
plugins``, what a command shows is available from Python too::

    import opregistry
    from opregistry import report

    data = report.list_report(opregistry.plan(), namespaces=["mylib"])

Every report is built from the records' own ``to_dict`` and carries
``format_version`` (:data:`FORMAT_VERSION`).  One shape stands for a
distribution everywhere (see :func:`distribution`): the records'
``"name==version"`` strings are replaced by it, from the records' origins,
never by parsing.  Nothing here imports torch except :func:`live_namespace`,
which reads torch's dispatcher.
"""

from __future__ import annotations

import sys
from collections import Counter
from typing import TYPE_CHECKING, Any, Iterable, Literal, Sequence

from attrs import field, frozen

from .keys import FEATURES
from .model import Origin, Problem, describe_ref

if TYPE_CHECKING:
    from .checking import CheckResult
    from .plans import KernelPlan, OpPlan, Plan, RefusedKernel

__all__ = [
    "FORMAT_VERSION",
    "cache_report",
    "STATUSES",
    "Match",
    "distribution",
    "entry_point_distribution",
    "problem_dict",
    "override_problems",
    "find_ops",
    "find_target",
    "find_adopted",
    "find_op",
    "list_report",
    "adopted_rows",
    "adopted_op_rows",
    "namespace_kernels",
    "first_touch",
    "show_report",
    "live_namespaces",
    "live_ops",
    "steps_of",
    "plugins_report",
    "doctor_report",
    "check_report",
    "verify_report",
    "live_namespace",
]

#: The version of the JSON every command prints; raised when a key changes
#: meaning or goes away (new keys do not raise it).
FORMAT_VERSION = 1

#: Kernel statuses, as listings show them (``conflict``: refused by the resolver).
STATUSES = ("active", "inactive", "unavailable", "overridden", "conflict", "unmet", "unreached",
            "disabled", "native")


# -- distributions -----------------------------------------------------------------


def distribution(origin: Origin | None) -> dict[str, Any] | None:
    """A distribution as every report shows it: ``{"name": ..., "version": ...}``."""
    if origin is None:
        return None
    return {"name": origin.distribution, "version": origin.version}


def entry_point_distribution(origin: Origin | None) -> dict[str, Any] | None:
    """:func:`distribution` and the entry point it came through.

    ``{"name", "version", "group", "entry_point"}``, ``entry_point`` spelled
    as in ``entry_points.txt`` (``"ops = mylib.registry:lib"``).  Used where
    the entry point is the subject: plugins, skipped entry points, problems.
    """
    if origin is None:
        return None
    return {**distribution(origin),  # type: ignore[dict-item]
            "group": origin.group, "entry_point": origin.entry_point_spec}


def _replaced(plan: Plan, k: KernelPlan) -> tuple[Origin, ...]:
    """Whose kernels ``k`` replaces: the overridden kernels of its (op, key); none for torch's."""
    op = plan.op(k.kernel.op)
    if op is None:
        return ()
    return tuple(o.kernel.origin for o in op.kernels if o.kernel.key == k.kernel.key
                 and o.status == "overridden" and o.kernel.origin is not None)


def _overrides(plan: Plan, k: KernelPlan) -> dict[str, Any] | None:
    """What ``k`` replaces, as a distribution record: the overridden kernel's, or torch."""
    if not k.overrides:
        return None
    replaced = _replaced(plan, k)
    if replaced:
        return distribution(replaced[0])
    if k.overrides != "torch":  # a package's kernel (an op it defines with torch.library)
        name, _, version = k.overrides.partition("==")
        return {"name": name, "version": version or None}
    from .lockfile import torch_version  # metadata only: torch is not imported

    return {"name": "torch", "version": torch_version()}


def _kernel(plan: Plan, k: KernelPlan, data: dict[str, Any] | None = None) -> dict[str, Any]:
    """``k.to_dict()`` (or ``data``, made by it already) with its distributions as records."""
    data = k.to_dict() if data is None else data
    data["distribution"] = distribution(k.kernel.origin)
    data["overrides"] = _overrides(plan, k)
    return data


def _refused(refused: RefusedKernel) -> list[dict[str, Any]]:
    """One listing row per distribution whose kernel was refused."""
    data = refused.to_dict()
    return [{**data, "distribution": distribution(o)} for o in refused.problem.culprits] or [
        {**data, "distribution": None}]


def problem_dict(problem: Problem) -> dict[str, Any]:
    """``Problem.to_dict`` with its distributions as records (entry points included)."""
    data = problem.to_dict()
    del data["entry_points"]  # each record in "distributions" carries its entry point
    data["distributions"] = [entry_point_distribution(o) for o in problem.culprits]
    data["others"] = [distribution(o) for o in problem.others]
    return data


def _op(plan: Plan, op: OpPlan) -> dict[str, Any]:
    data = op.to_dict()
    data["distribution"] = distribution(op.op.origin)
    for row, k in zip(data["kernels"], op.kernels):
        _kernel(plan, k, row)
    return data


# -- list ----------------------------------------------------------------------------


def list_report(plan: Plan, *, namespaces: Iterable[str] = (), backends: Iterable[str] = (),
                statuses: Iterable[str] = ()) -> dict[str, Any]:
    """``opregistry list --json``: backends, namespaces, ops and their kernels, problems.

    Kernels the resolver refused are listed under their op with status
    ``conflict``.  ``namespaces`` keeps those namespaces and their ops;
    ``backends`` and ``statuses`` keep those kernels, and only the ops that
    still have one.
    """
    namespaces, backends, statuses = set(namespaces), set(backends), set(statuses)
    refused: dict[str, list[dict[str, Any]]] = {}
    for r in plan.refused_kernels():
        refused.setdefault(r.op, []).extend(_refused(r))
    backend_rows = []
    for b in plan.backends:
        row = b.to_dict()
        del row["version"]  # in the distribution record
        backend_rows.append({**row, "distribution": distribution(b.backend.origin)})
    ops = [_op(plan, op) for op in plan.ops]
    for op_row in ops:
        op_row["kernels"] += refused.get(op_row["name"], [])
    skipped = []
    for entry in plan.skipped:
        row = entry.to_dict()
        del row["entry_point"]  # in the distribution record
        skipped.append({**row, "distribution": entry_point_distribution(entry.origin)})
    data: dict[str, Any] = {
        "backends": backend_rows,
        "namespaces": [{**n.to_dict(), "owner": distribution(n.owner),
                        "fragments": [distribution(f) for f in n.fragments]}
                       for n in plan.namespaces],
        "ops": ops,
        "external_kernels": [_kernel(plan, k) for k in plan.external_kernels],
        "distributions": [entry_point_distribution(o) for o in plan.distributions],
        "excluded": [distribution(o) for o in
                     sorted({o.dist: o for o in plan.excluded}.values(), key=lambda o: o.dist)],
        "skipped": skipped,
        "problems": [problem_dict(p) for p in plan.problems],
        "switches": [{"switch": text, "source": source} for text, source in plan.switches],
        # native libraries (C++ TORCH_LIBRARY blocks): what loads each namespace's ops
        "natives": [{**n.to_dict(), "distribution": distribution(n.origin)}
                    for n in plan.natives],
    }
    data["adopted"] = adopted_rows(plan, namespaces)
    if namespaces:
        data["natives"] = [n for n in data["natives"] if n["namespace"] in namespaces]
        data["namespaces"] = [n for n in data["namespaces"] if n["name"] in namespaces]
        data["ops"] = [o for o in data["ops"] if o["name"].split("::")[0] in namespaces]
    for op in data["ops"]:
        op["kernels"] = [k for k in op["kernels"]
                         if (not backends or k["backend"] in backends)
                         and (not statuses or k["status"] in statuses)]
    if backends or statuses:
        data["ops"] = [o for o in data["ops"] if o["kernels"]]
    if backends:
        data["backends"] = [b for b in data["backends"] if b["name"] in backends]
    return {"format_version": FORMAT_VERSION, **data}


def adopted_rows(plan: Plan, namespaces: Iterable[str] = ()) -> list[dict[str, Any]]:
    """The adopted distributions (``Adopted.to_dict``), their ops in ``namespaces`` (all: empty).

    Each has ``namespace_kernels``: namespace -> the kernels its files register there that
    the scan could not tie to one op (:func:`namespace_kernels`).  Read from the scan of
    their installed files: torch is not imported.
    """
    wanted = set(namespaces)
    added: dict[str, list[KernelPlan]] = {}  # kernels op packages add to its ops, under policy
    for k in plan.external_kernels:
        added.setdefault(k.kernel.op, []).append(k)
    untied = namespace_kernels(plan)
    rows = []
    for adopted in plan.adoptions:
        row = adopted.to_dict()
        for op in row["ops"]:
            op["kernels_added"] = [_kernel(plan, k) for k in added.get(op["name"], [])]
            for kernel in op["kernels"]:
                kernel["overridden_by"] = next(
                    (distribution(k.kernel.origin) for k in added.get(op["name"], [])
                     if k.kernel.key == kernel["key"] and k.status == "active"
                     and k.overrides == f"{adopted.name}=={adopted.distribution.version}"), None)
        row["namespace_kernels"] = {ns: [k for k in kernels if k["distribution"]["name"]
                                         == adopted.name]
                                    for ns, kernels in untied.items()
                                    if any(k["distribution"]["name"] == adopted.name
                                           for k in kernels)}
        if wanted:
            row["ops"] = [op for op in row["ops"] if op["name"].split("::")[0] in wanted]
            row["namespaces"] = {ns: m for ns, m in row["namespaces"].items() if ns in wanted}
            row["namespace_kernels"] = {ns: k for ns, k in row["namespace_kernels"].items()
                                        if ns in wanted}
            if not row["ops"] and not row["namespaces"]:
                continue
        rows.append(row)
    return rows


def adopted_op_rows(plan: Plan, name: str) -> list[dict[str, Any]]:
    """The adopted distributions whose ops ``name`` designates, each with those ops only --
    read without torch.  ``name`` is spelled as for :func:`find_ops` (``ns::op[.overload]``,
    ``ns.op``, ``torch.ops.ns.op[.overload]``, ``op`` alone); empty when it names no adopted
    op, or ops of several namespaces (:func:`find_adopted` says which)."""
    match = find_adopted(plan, name)
    if match.kind != "adopted":
        return []
    wanted = set(match.candidates)
    rows = []
    for row in adopted_rows(plan):
        ops = [op for op in row["ops"] if op["name"] in wanted]
        if ops:
            rows.append({**row, "ops": ops})
    return rows


def _untied(reg: Any) -> str | None:
    """Why ``reg`` is a kernel of its namespace the scan could not tie to one op, or ``None``."""
    if reg.kind == "IMPL" and reg.key and "TORCH_LIBRARY_IMPL" in reg.api:
        return f"C++ {reg.api} block (its ops are not in the symbols)"
    if reg.kind == "kernel" and (not reg.op or not reg.key) and reg.unresolved:
        return f"unresolved: {reg.unresolved}"
    return None


def namespace_kernels(plan: Plan, namespaces: Iterable[str] = ()
                      ) -> dict[str, list[dict[str, Any]]]:
    """namespace -> the kernels adopted distributions register in it that the scan could not
    tie to one op: C++ ``TORCH_LIBRARY_IMPL`` blocks (their ops are not in the symbols) and
    registrations whose op (or key) is unresolved, such as torchvision's ``register_meta``
    helper.  Each may apply to any op of the namespace; none is known to.  Only the
    namespaces of adopted ops (``namespaces`` of them, when given)."""
    wanted = set(namespaces)
    found: dict[str, list[dict[str, Any]]] = {}
    for adopted in plan.adoptions:
        mine = set(adopted.namespaces) | {reg.namespace for reg in adopted.ops()}
        for reg in adopted.registrations:
            why = _untied(reg)
            if why is None or reg.namespace not in mine or (wanted and reg.namespace not in wanted):
                continue
            row = {"key": reg.key or "?", "op": reg.op, "api": reg.api, "module": reg.module,
                   "where": f"{reg.module}:{reg.line}" if reg.line is not None else
                   f"{reg.module} ({reg.file.rsplit('/', 1)[-1]})",
                   "source": reg.source, "why": why, "conditional": reg.conditional,
                   "at_import": reg.at_import,
                   "distribution": {"name": adopted.name,
                                    "version": adopted.distribution.version}}
            if row not in found.setdefault(reg.namespace, []):
                found[reg.namespace].append(row)
    return found


def first_touch(plan: Plan, namespace: str) -> list[dict[str, Any]]:
    """What the first touch of ``torch.ops.<namespace>`` imports, in order: one entry per
    adopted distribution (lazily) registering in it, with its modules -- the adopter's table
    (:class:`opregistry.adopting.Adopter`)."""
    return [{"distribution": {"name": a.name, "version": a.distribution.version},
             "modules": list(modules)}
            for a in plan.adoptions if a.active and a.load == "lazy"
            for ns, modules in a.modules if ns == namespace]


def not_imported(plan: Plan, namespaces: Iterable[str]) -> dict[str, list[str]]:
    """The namespaces of ``namespaces`` adopted lazily whose modules this process has not
    imported (torch's dispatcher holds none of their ops yet), each with those modules."""
    found: dict[str, list[str]] = {}
    wanted = set(namespaces)
    for adopted in plan.adoptions:
        if adopted.status != "adopted" or adopted.load != "lazy":
            continue
        for ns, modules in adopted.modules:
            missing = [m for m in modules if ns in wanted and m not in sys.modules]
            if missing:
                found[ns] = list(dict.fromkeys(found.get(ns, []) + missing))
    return found


def live_namespaces(plan: Plan, namespaces: Iterable[str] = ()) -> list[str]:
    """The namespaces ``list --live`` shows: ``namespaces``, or every namespace of the plan,
    every adopted one, and every namespace in torch's dispatcher that torch itself does not
    own."""
    from . import torch_state
    from .keys import RESERVED_NAMESPACES

    if namespaces:
        return list(namespaces)
    live = {op.split("::", 1)[0] for op in torch_state.registered_ops()}
    # each adopted namespace too: one adopted lazily and not imported has no ops there yet
    adopted = {ns for a in plan.adoptions if a.active for ns in a.namespaces}
    return sorted({n.name for n in plan.namespaces} | adopted | (live - RESERVED_NAMESPACES))


def live_namespace(namespace: str, plan: Plan, attributor: Any = None) -> list[dict[str, Any]]:
    """The dispatcher's ops of ``namespace`` next to what ``plan`` declared for them.

    Each op and each kernel is attributed to the distribution whose code
    registered it (:mod:`opregistry.attribution`).  Imports torch (what it
    shows lives in torch's dispatcher).
    """
    from . import torch_state
    from .attribution import Attributor

    attributor = attributor or Attributor(plan)
    declared = {op.op.qualname: op for op in plan.ops if op.op.namespace == namespace}
    live = {name for name in torch_state.registered_ops() if name.split("::", 1)[0] == namespace}
    return [_live_row(name, declared.get(name), name in live, attributor)
            for name in sorted(live | set(declared))]


def _live_row(name: str, op: OpPlan | None, in_dispatcher: bool, attributor: Any
              ) -> dict[str, Any]:
    from . import torch_state

    keys = torch_state.kernel_registrations(name) if in_dispatcher else {}
    declared_keys = sorted({k.kernel.key for k in op.kernels if k.status in ("active", "native")}
                           | ({"BackendSelect"} if op.parsed.is_factory else set())) if op else []
    return {
        "op": name,
        "declared": op is not None,
        "in_dispatcher": in_dispatcher,
        "declared_schema": op.op.full_schema if op else None,
        "dispatcher_schema": torch_state.op_schema(name) if in_dispatcher else None,
        "declared_keys": declared_keys,
        "dispatcher_keys": keys,
        "distribution": distribution(op.op.origin) if op else None,
        "defined_by": attributor.defined_by(name) if in_dispatcher else None,
        "kernels_by": {key: attributor.kernel_by(name, key, site) for key, site in keys.items()},
    }


# -- naming ops ----------------------------------------------------------------------


@frozen(kw_only=True)
class Match:
    """What a name typed on the command line designates in a plan.

    ``kind`` is ``"ops"`` (one op packet: ``ops`` holds it, or the one
    overload named), ``"namespace"``, ``"external"`` (a torch op that
    packages add kernels to), ``"left-out"`` (declared, but left out by
    ``problems``), ``"ambiguous"`` (``candidates`` lists the choices) or
    ``"unknown"`` (``candidates`` holds the close matches, for "did you mean"); from
    :func:`find_adopted` and :func:`find_op`, ``"adopted"``: ops of an adopted package,
    ``candidates`` their names (one op packet: ``ns::op`` and its overloads).
    """

    kind: Literal["ops", "namespace", "external", "left-out", "ambiguous", "unknown",
                  "adopted"]
    name: str
    ops: tuple[OpPlan, ...] = ()
    candidates: tuple[str, ...] = ()
    problems: tuple[Problem, ...] = field(default=())


def _spellings(text: str) -> list[tuple[str, str, str | None]]:
    """``(namespace or "", op, overload or None)`` readings of an op name as typed.

    ``ns::op[.overload]``, ``ns.op[.overload]``, ``torch.ops.ns.op[.overload]``
    and a bare ``op[.overload]`` (any namespace); ``default`` names the
    overload torch calls ``default``.
    """
    if text.startswith("torch.ops."):
        text = text[len("torch.ops."):]
        if "::" in text:
            return []
    if "::" in text:
        ns, _, rest = text.partition("::")
        op, _, overload = rest.partition(".")
        return [(ns, op, overload if "." in rest else None)]
    parts = text.split(".")
    readings: list[tuple[str, str, str | None]] = []
    if len(parts) == 1:
        readings.append(("", parts[0], None))
    if len(parts) == 2:
        readings += [(parts[0], parts[1], None), ("", parts[0], parts[1])]
    if len(parts) == 3:
        readings.append((parts[0], parts[1], parts[2]))
    return readings


def _matches(op: OpPlan, ns: str, name: str, overload: str | None) -> bool:
    if (ns and op.op.namespace != ns) or op.op.name != name:
        return False
    return overload is None or (op.op.overload or "default") == overload


def find_ops(plan: Plan, text: str) -> Match:
    """The op (or op packet) ``text`` names in ``plan``, as ``show`` and ``check`` read it.

    A name without an overload is the op's default overload, or every
    overload when it has no default; a name that fits ops of several
    namespaces is ``ambiguous``.
    """
    readings = _spellings(text)
    hits: dict[str, OpPlan] = {}
    for ns, name, overload in readings:
        for op in plan.ops:
            if _matches(op, ns, name, overload):
                hits[op.op.qualname] = op
    packets = sorted({op.op.base_qualname for op in hits.values()})
    if len(packets) == 1:
        default = [op for op in hits.values() if not op.op.overload]
        if default and all(overload is None for _, _, overload in readings):
            return Match(kind="ops", name=text, ops=tuple(default))  # ns::op is its default
        return Match(kind="ops", name=text, ops=tuple(hits[q] for q in sorted(hits)))
    if len(packets) > 1:
        return Match(kind="ambiguous", name=text, candidates=tuple(packets))
    qualname = text[len("torch.ops."):] if text.startswith("torch.ops.") else text
    if "::" not in qualname and len(readings) == 1 and readings[0][0]:
        ns, name, overload = readings[0]
        qualname = f"{ns}::{name}" + (f".{overload}" if overload else "")
    external = [k for k in plan.external_kernels if k.kernel.op == qualname]
    if external:
        return Match(kind="external", name=qualname)
    # declared, but left out: the problem says why (exit 1, not "unknown")
    namespaces = {ns for ns, _, _ in readings if ns}
    ops = {f"{ns}::{name}" for ns, name, _ in readings if ns}
    problems = tuple(p for p in plan.errors
                     if (p.op and p.op.split(".")[0] in ops) or (p.namespace in namespaces))
    if problems:
        return Match(kind="left-out", name=qualname, problems=problems)
    return Match(kind="unknown", name=text, candidates=tuple(_close(plan, text)))


def find_target(plan: Plan, text: str) -> Match:
    """What a ``check`` target names: a namespace (a bare word that is one), else :func:`find_ops`."""
    if "::" not in text and "." not in text and any(op.op.namespace == text for op in plan.ops):
        return Match(kind="namespace", name=text,
                     ops=tuple(op for op in plan.ops if op.op.namespace == text))
    return find_ops(plan, text)


def _adopted_names(plan: Plan) -> list[str]:
    """Every adopted op (``ns::op[.overload]``) as ``list`` shows them: the ops its files
    define, and those of its namespaces it gives kernels to (``Adopted.to_dict``)."""
    names: set[str] = set()
    for adopted in plan.adoptions:
        mine = set(adopted.namespaces)
        names |= {reg.op for reg in adopted.ops() if reg.op}
        names |= {k.op for k in adopted.kernels if k.op and k.op.split("::")[0] in mine}
    return sorted(names)


def _fits(qualname: str, ns: str, name: str, overload: str | None) -> bool:
    """Whether the op ``qualname`` fits a reading of :func:`_spellings`."""
    op_ns, _, rest = qualname.partition("::")
    base, _, op_overload = rest.partition(".")
    if (ns and op_ns != ns) or base != name:
        return False
    return overload is None or (op_overload or "default") == overload


def find_adopted(plan: Plan, text: str) -> Match:
    """The adopted ops ``text`` names, spelled as for :func:`find_ops` and read the same way.

    ``adopted`` (``candidates``: the op, its default overload, or every overload when it has
    no default), ``ambiguous`` (ops of several namespaces: ``candidates`` lists them) or
    ``unknown`` (``candidates``: close adopted names).  Read from the plan: no torch.
    """
    readings = _spellings(text)
    names = _adopted_names(plan)
    hits = sorted({q for q in names for reading in readings if _fits(q, *reading)})
    packets = sorted({q.split(".")[0] for q in hits})
    if len(packets) > 1:
        return Match(kind="ambiguous", name=text, candidates=tuple(packets))
    if not packets:
        return Match(kind="unknown", name=text,
                     candidates=tuple(_close_names(names, text)))
    default = [q for q in hits if "." not in q.partition("::")[2]]
    if default and all(overload is None for _, _, overload in readings):
        hits = default  # ns::op is its default overload
    return Match(kind="adopted", name=text, candidates=tuple(hits))


def find_op(plan: Plan, text: str) -> Match:
    """What ``show`` reads ``text`` as: :func:`find_ops` over the declared ops and
    :func:`find_adopted` over the adopted ones, as one registry.

    A name that fits ops of several namespaces, declared or adopted, is ``ambiguous``; one
    that fits none is ``unknown`` with the close names of both.  A declared op wins over
    an adopted op of the same name (an allowed override: ``external``), and an op left
    out stays ``left-out``.
    """
    declared = find_ops(plan, text)
    adopted = find_adopted(plan, text)
    if adopted.kind == "unknown":
        if declared.kind != "unknown":
            return declared
        names = [op.op.base_qualname for op in plan.ops] + _adopted_names(plan)
        return Match(kind="unknown", name=text, candidates=tuple(_close_names(names, text)))
    if declared.kind in ("left-out", "external"):
        return declared if declared.kind == "left-out" else adopted
    mine = set(adopted.candidates) if adopted.kind == "ambiguous" else {
        adopted.candidates[0].split(".")[0]}
    if declared.kind == "ops":
        mine |= {op.op.base_qualname for op in declared.ops}
    elif declared.kind == "ambiguous":
        mine |= set(declared.candidates)
    if len(mine) > 1:
        return Match(kind="ambiguous", name=text, candidates=tuple(sorted(mine)))
    return declared if declared.kind == "ops" else adopted


def _close(plan: Plan, text: str, n: int = 3) -> list[str]:
    """Op names close to ``text`` ("did you mean"), compared by op name within a namespace."""
    return _close_names([op.op.base_qualname for op in plan.ops], text, n)


def _close_names(qualnames: Iterable[str], text: str, n: int = 3) -> list[str]:
    """Of ``qualnames`` (``ns::op[.overload]``), the ops close to ``text``, by op name
    within a namespace."""
    readings = _spellings(text) or [("", text, None)]
    known = sorted({q.split(".")[0] for q in qualnames})
    found: list[str] = []
    for ns, name, _ in readings:
        by_name: dict[str, list[str]] = {}
        for qualname in known:
            op_ns, _, op_name = qualname.partition("::")
            if not ns or op_ns == ns:
                by_name.setdefault(op_name, []).append(qualname)
        import difflib  # here: only a mistake needs it

        for near in difflib.get_close_matches(name, sorted(by_name), n=n, cutoff=0.7):
            found += [q for q in sorted(set(by_name[near])) if q not in found]
    return found[:n]


# -- show ----------------------------------------------------------------------------


def _op_details(plan: Plan, op: OpPlan) -> dict[str, Any]:
    data = _op(plan, op)
    data["overloads"] = sorted(o.op.overload or "default" for o in plan.ops
                               if o.op.base_qualname == op.op.base_qualname)
    data["doc"] = op.op.doc
    data["origin"] = entry_point_distribution(op.op.origin)
    features: dict[str, Any] = {}
    for key, feature in FEATURES.items():
        k = op.kernel(key)
        features[feature] = None if k is None else {
            "kernel": describe_ref(k.kernel.fn), "status": k.status,
            "distribution": distribution(k.kernel.origin)}
    data["features"] = features
    data["problems"] = [problem_dict(p) for p in plan.problems if p.op == op.op.qualname]
    data["switches"] = [{"switch": text, "source": source} for text, source in plan.switches]
    return data


def steps_of(plan: Plan, qualnames: Iterable[str]) -> dict[str, list[dict[str, Any]]]:
    """The registration steps (:mod:`opregistry.steps`) of each op in ``qualnames``, in order."""
    from .steps import plan_steps

    wanted = set(qualnames)
    found: dict[str, list[dict[str, Any]]] = {name: [] for name in wanted}
    for step in plan_steps(plan).steps:
        if step.op in wanted:
            found[step.op].append(step.to_dict())
    return found


def live_ops(plan: Plan, text: str) -> list[dict[str, Any]]:
    """The dispatcher's ops named ``text`` that no distribution declared, with who registered them.

    ``opregistry show --live`` of an op a package registers with
    torch.library directly.  Every overload of a packet when ``text`` names
    none.  Imports torch.
    """
    from . import torch_state
    from .attribution import Attributor

    live = torch_state.registered_ops()
    found = []
    for ns, op, overload in _spellings(text):
        if not ns:
            continue
        base = f"{ns}::{op}"
        found += [name for name in live if name == base or (overload is None and
                                                             name.startswith(base + "."))
                  if overload in (None, "default") or name == f"{base}.{overload}"]
    declared = {o.op.qualname for o in plan.ops}
    attributor = Attributor(plan)
    return [_live_row(name, None, True, attributor)
            for name in sorted(set(found)) if name not in declared]


def show_report(plan: Plan, name: str, *, steps: bool = False) -> dict[str, Any]:
    """``opregistry show NAME --json``: the op(s) ``name`` designates, in full.

    ``ops`` holds one entry per overload ``name`` designates (see
    :func:`find_ops`); ``external_kernels`` the kernels packages add, under
    policy, to a torch op such as ``aten::add.Tensor``.  Raises
    :class:`LookupError` when ``name`` names nothing, an op left out, or
    several ops.
    """
    match = find_ops(plan, name)
    if match.kind == "external":
        return {"format_version": FORMAT_VERSION, "ops": [],
                "external_kernels": [_kernel(plan, k) for k in plan.external_kernels
                                     if k.kernel.op == match.name]}
    if match.kind != "ops":
        raise LookupError(f"{name!r}: {match.kind}" + (
            f" ({', '.join(match.candidates)})" if match.candidates else ""))
    ops = [_op_details(plan, op) for op in match.ops]
    if steps:  # ``--steps``: what the materializer will do for each, in order
        found = steps_of(plan, [op["name"] for op in ops])
        for op in ops:
            op["steps"] = found[op["name"]]
    return {"format_version": FORMAT_VERSION, "ops": ops, "external_kernels": []}


# -- plugins -------------------------------------------------------------------------


def plugins_report(plan: Plan) -> dict[str, Any]:
    """``opregistry plugins --json``: every entry point found, what it contributes, or why not.

    ``hooks`` are the ``opregistry_*`` hooks the plugin manager registered
    for the plugin (:attr:`Plan.hooks`).
    """
    from .discovery import BACKENDS_GROUP

    ops_of: dict[Origin | None, list[str]] = {}
    for op in plan.ops:
        ops_of.setdefault(op.op.origin, []).append(op.op.qualname)
    kernels_of = Counter(k.kernel.origin for k in plan.kernels())
    namespaces_of: dict[Origin | None, set[str]] = {}
    for n in plan.namespaces:
        namespaces_of.setdefault(n.owner, set()).add(f"{n.name} (DEF)")
        for fragment in n.fragments:
            namespaces_of.setdefault(fragment, set()).add(f"{n.name} (FRAGMENT)")
    excluded = {o.distribution for o in plan.excluded}
    problems_of: dict[str, list[str]] = {}
    for p in plan.errors:
        for o in p.culprits:
            problems_of.setdefault(o.distribution, []).append(f"[{p.code}] {p.message}")
    rows = []
    for o in plan.distributions:
        left_out = o.distribution in excluded
        contributes: dict[str, Any] = {}
        if o.group == BACKENDS_GROUP:
            contributes["backends"] = [
                {"name": b.backend.name, "keys": list(b.backend.keys),
                 "device_type": b.backend.device_type, "available": b.available}
                for b in plan.backends if b.backend.origin == o]
        else:
            contributes["namespaces"] = sorted(namespaces_of.get(o, ()))
            contributes["ops"] = ops_of.get(o, [])
            contributes["kernels"] = kernels_of[o]
        rows.append({
            "distribution": entry_point_distribution(o),
            "status": "left out" if left_out else "loaded",
            "reason": "; ".join(problems_of.get(o.distribution, [])) if left_out else "",
            "contributes": contributes,
            "hooks": sorted(plan.hooks.get(o, ())),
        })
    failed = {(o.distribution, o.entry_point) for p in plan.problems for o in p.culprits
              if p.code.startswith("plugin-")}
    for s in plan.skipped:
        o = s.origin
        rows.append({
            "distribution": entry_point_distribution(o),
            "status": "failed" if (o.distribution, o.entry_point) in failed else "skipped",
            "reason": s.reason, "contributes": {}, "hooks": [],
        })
    rows.sort(key=lambda r: (r["distribution"]["group"], r["distribution"]["name"],
                             r["distribution"]["entry_point"]))
    return {"format_version": FORMAT_VERSION, "plugins": rows}


# -- doctor --------------------------------------------------------------------------


def override_problems(plan: Plan) -> list[Problem]:
    """A warning for each kernel that replaces another's because the policy allows it.

    Allowed overrides are not errors, but someone's kernel is being
    replaced: the user should know, and know how to undo it.
    """
    found = []
    for k in plan.kernels():
        if not k.overrides or k.status == "overridden":
            continue
        origin = k.kernel.origin
        replaced = _replaced(plan, k)
        found.append(Problem(
            code="kernel-overrides", severity="warning",
            message=f"{origin} replaces the {k.kernel.key} kernel of {k.kernel.op} "
                    f"registered by {k.overrides} (allowed by policy)",
            hint="if this is not intended, remove the op or its namespace from "
                 "OPREGISTRY_ALLOW_OVERRIDE, or block "
                 f"{origin.distribution if origin else 'the distribution'}",
            culprits=(origin,) if origin else (),
            others=replaced,
            op=k.kernel.op, key=k.kernel.key, source=k.kernel.source))
    return found


def doctor_report(plan: Plan, problems: Sequence[Problem] | None = None, *,
                  include_info: bool = False, live: bool = False) -> dict[str, Any]:
    """``opregistry doctor --json``: a summary and every problem (default: ``plan.problems``).

    ``problems`` are a loaded registry's when it was checked against torch
    (``live``); notes (severity ``info``) only with ``include_info``.
    """
    problems = plan.problems if problems is None else problems
    found = [p for p in problems if include_info or p.severity != "info"]
    found += override_problems(plan)
    summary = {
        "errors": sum(1 for p in found if p.severity == "error"),
        "warnings": sum(1 for p in found if p.severity == "warning"),
        "distributions": len({o.distribution for o in plan.distributions}),
        "ops": len(plan.ops),
        "live": live,
    }
    return {"format_version": FORMAT_VERSION, "summary": summary,
            "problems": [problem_dict(p) for p in found]}


# -- check / verify ------------------------------------------------------------------


def check_report(plan: Plan, results: Sequence[CheckResult], *,
                 everything: bool = True) -> dict[str, Any]:
    """``opregistry check --json``: whether every check passed, each result, and what was not checked.

    ``excluded`` lists the distributions left out because of a problem: their
    ops were never registered, so none of them was checked.  When every op was
    to be checked (``everything``), that is a failure too: "all passed" would
    hide them.
    """
    rows = []
    # an adopted op's result: its package's, or the adapter's that declared its samples
    owners = {str(o): distribution(o) for a in plan.adoptions for o in a.declared_by}
    owners.update({a.distribution.text: {"name": a.name, "version": a.distribution.version}
                   for a in plan.adoptions})
    for r in results:
        op = plan.op(r.op)
        owner = distribution(op.op.origin) if op else owners.get(r.distribution or "")
        rows.append({**r.to_dict(), "distribution": owner})
    codes: dict[str, list[str]] = {}
    for p in plan.errors:
        for o in p.culprits:
            codes.setdefault(o.distribution, []).append(p.code)
    excluded = [{"distribution": distribution(o), "problems": sorted(set(codes.get(o.distribution, [])))}
                for o in sorted({o.distribution: o for o in plan.excluded}.values())]
    failed = any(r.status == "fail" for r in results)
    return {"format_version": FORMAT_VERSION, "ok": not failed and not (everything and excluded),
            "results": rows, "excluded": excluded}


def verify_report(lockfile: str, *, fingerprint: str | None = None,
                  differences: Sequence[str] = (), error: str | None = None,
                  not_covered: Sequence[str] = ()) -> dict[str, Any]:
    """``opregistry verify --json``: ``ok`` when this environment resolves the locked registry.

    ``not_covered``: ``dist: what`` for each file neither the lock nor this
    environment could hash (``ok`` does not prove those).
    """
    return {"format_version": FORMAT_VERSION, "ok": not differences and error is None,
            "lockfile": lockfile, "fingerprint": fingerprint, "differences": list(differences),
            "error": error, "not_covered": list(not_covered)}


def cache_report(settings: Any = None) -> dict[str, Any]:
    """``opregistry cache info``: the plan cache's directory, entries, and this environment's."""
    from .config import Settings
    from .plancache import info

    return {"format_version": FORMAT_VERSION,
            **info(settings if settings is not None else Settings.from_env())}
