"""What the ``opregistry`` commands show, as plain data, for the CLI and for Python.

Each ``*_report`` function takes a :class:`~opregistry.plan.Plan` (from
:func:`opregistry.plan`, or a loaded registry's ``.plan``) and returns a
JSON-ready dict: the object ``opregistry COMMAND --json`` prints.  The CLI
only parses arguments and renders these dicts as text; like ``datasette
plugins``, what a command shows is available from Python too::

    import opregistry
    from opregistry import report

    data = report.list_report(opregistry.plan(), namespaces=["mylib"])

Every report is built from the records' own ``to_dict``.  Nothing here
imports torch except :func:`live_namespace`, which reads torch's dispatcher.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from .keys import FEATURES
from .model import Origin, Problem, describe_ref

if TYPE_CHECKING:
    from .plan import KernelPlan, OpPlan, Plan

__all__ = [
    "STATUSES",
    "override_problems",
    "find_ops",
    "list_report",
    "show_report",
    "plugins_report",
    "doctor_report",
    "live_namespace",
]

#: Kernel statuses, as listings show them (``conflict``: refused by the resolver).
STATUSES = ("active", "inactive", "unavailable", "overridden", "conflict")


def _op(plan: Plan, op: OpPlan) -> dict[str, Any]:
    return op.to_dict()


def problem_dict(problem: Problem) -> dict[str, Any]:
    return problem.to_dict()


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
    data = plan.to_dict()
    refused: dict[str, list[dict[str, Any]]] = {}
    for r in plan.refused_kernels():
        refused.setdefault(r.op, []).append(r.to_dict())
    for op in data["ops"]:
        op["kernels"] += refused.get(op["name"], [])
    if namespaces:
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
    return data


def live_namespace(namespace: str, plan: Plan) -> list[dict[str, Any]]:
    """The dispatcher's ops of ``namespace`` next to what ``plan`` declared for them.

    Imports torch (what it shows lives in torch's dispatcher).
    """
    from . import torch_state

    declared = {op.op.qualname: op for op in plan.ops if op.op.namespace == namespace}
    live = {name for name in torch_state.registered_ops() if name.split("::", 1)[0] == namespace}
    rows = []
    for name in sorted(live | set(declared)):
        op = declared.get(name)
        rows.append({
            "op": name,
            "declared": op is not None,
            "in_dispatcher": name in live,
            "declared_schema": op.op.full_schema if op else None,
            "dispatcher_schema": torch_state.op_schema(name) if name in live else None,
            "declared_keys": sorted(k.kernel.key for k in op.kernels
                                    if k.status == "active") if op else [],
            "dispatcher_keys": torch_state.kernel_registrations(name) if name in live else {},
            "distribution": op.op.origin.dist if op and op.op.origin else None,
        })
    return rows


# -- naming ops ----------------------------------------------------------------------


def find_ops(plan: Plan, name: str) -> list[OpPlan]:
    """The ops ``name`` (``ns::op`` or ``ns::op.overload``) designates: one, or every overload."""
    exact = [op for op in plan.ops if op.op.qualname == name]
    if exact:
        return exact
    return [op for op in plan.ops if op.op.base_qualname == name]


# -- show ----------------------------------------------------------------------------


def _op_details(plan: Plan, op: OpPlan) -> dict[str, Any]:
    data = _op(plan, op)
    data["overloads"] = sorted(o.op.overload or "default" for o in plan.ops
                               if o.op.base_qualname == op.op.base_qualname)
    data["doc"] = op.op.doc
    data["entry_point"] = str(op.op.origin) if op.op.origin else None
    features: dict[str, Any] = {}
    for key, feature in FEATURES.items():
        k = op.kernel(key)
        features[feature] = None if k is None else {
            "kernel": describe_ref(k.kernel.fn), "status": k.status,
            "distribution": k.kernel.origin.dist if k.kernel.origin else None}
    data["features"] = features
    data["problems"] = [problem_dict(p) for p in plan.problems if p.op == op.op.qualname]
    return data


def show_report(plan: Plan, name: str) -> dict[str, Any]:
    """``opregistry show NAME``: the op(s) ``name`` designates, in full.

    ``ops`` holds one entry per overload named (every overload of the op
    when ``name`` has none); ``external_kernels`` the kernels packages add,
    under policy, to a torch op such as ``aten::add.Tensor``.  Both are
    empty when ``name`` names nothing.
    """
    ops = find_ops(plan, name)
    return {"ops": [_op_details(plan, op) for op in ops],
            "external_kernels": [] if ops else [k.to_dict() for k in plan.external_kernels
                                                 if k.kernel.op == name]}


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
            "distribution": o.distribution, "version": o.version, "group": o.group,
            "entry_point": o.entry_point_spec,
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
            "distribution": o.distribution, "version": o.version, "group": o.group,
            "entry_point": o.entry_point_spec,
            "status": "failed" if (o.distribution, o.entry_point) in failed else "skipped",
            "reason": s.reason, "contributes": {}, "hooks": [],
        })
    rows.sort(key=lambda r: (r["group"], r["distribution"], r["entry_point"]))
    return {"plugins": rows}


# -- doctor --------------------------------------------------------------------------


def _replaced(plan: Plan, k: KernelPlan) -> tuple[Origin, ...]:
    """Whose kernels ``k`` replaces: the overridden kernels of its (op, key); none for torch's."""
    op = plan.op(k.kernel.op)
    if op is None:
        return ()
    return tuple(o.kernel.origin for o in op.kernels if o.kernel.key == k.kernel.key
                 and o.status == "overridden" and o.kernel.origin is not None)


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
    return {"summary": summary,
            "problems": [problem_dict(p) for p in found]}
