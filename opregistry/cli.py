"""The ``opregistry`` command (also ``python -m opregistry``).

Commands follow the conventions of the packaging world (``pip list``,
``pip show``, ``datasette plugins``): a plain table by default, ``--json``
for tools, exit status 0 when the registry is healthy, 1 when something is
wrong, 2 for a usage error.

``list``, ``show``, ``plugins``, ``doctor``, ``lock`` and ``verify`` read
declarations only and never import torch: they stop after the resolver.
``check`` and the ``--live`` views import torch, because what they show
lives in torch's dispatcher.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from typing import TYPE_CHECKING, Any, Callable, Sequence, TextIO

from .errors import ConfigError
from .lockfile import DEFAULT_LOCKFILE

if TYPE_CHECKING:
    from .plan import Plan

__all__ = ["main", "build_parser"]

STATUSES = ("active", "inactive", "unavailable", "overridden", "conflict")

#: Exit status: healthy / problems found / bad usage (argparse's own).
EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE = 0, 1, 2

#: Dispatch keys shown as the "fake / autograd / vmap" features of an op.
FEATURE_KEYS = {"fake": "Meta", "autograd": "Autograd", "vmap": "FuncTorchBatched"}


def _configure_logging(verbose: int) -> None:
    """The CLI, unlike the library, decides where logs go: stderr, by -v level."""
    import logging

    from .logs import LOGGER_NAME

    level = logging.DEBUG if verbose > 1 else logging.INFO if verbose else logging.ERROR
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    handler.set_name("opregistry-cli")
    logger = logging.getLogger(LOGGER_NAME)
    for previous in [h for h in logger.handlers if h.name == handler.name]:
        logger.removeHandler(previous)  # main() run again in one process: log each line once
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False


def _table(rows: list[Sequence[Any]], out: TextIO, indent: str = "  ", *,
           header: Sequence[str] = (), empty: str = "") -> None:
    """``rows`` in aligned columns under ``header``; the ``empty`` line when there are none."""
    if not rows:
        if empty:
            out.write(f"{indent}{empty}\n")
        return
    if header:
        rows = [header, *rows]
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = [str(c).ljust(w) for c, w in zip(row, widths)]
        out.write(indent + "  ".join(cells).rstrip() + "\n")


def _dump(data: Any, out: TextIO) -> None:
    # Indented JSON for a person at a terminal; compact JSON for a pipe, because
    # only json.dumps without indent uses the C encoder (5-10x faster on the
    # megabytes `list --json` prints for thousands of ops; see docs/performance.md).
    isatty = getattr(out, "isatty", None)
    pretty = bool(isatty and isatty())
    out.write(json.dumps(data, indent=2 if pretty else None, default=str))
    out.write("\n")


def _plan() -> Plan:
    from .registry import plan

    return plan()


def _live_registry(imports: Sequence[str] = ()) -> Any:
    """Import torch, then ``imports`` (C++ extensions, say), then load the registry.

    torch's autoload is held back while torch is imported here, so that the
    registry is resolved against everything ``imports`` put into the
    dispatcher (their ``TORCH_LIBRARY`` namespaces included).
    """
    import importlib
    import os

    if "torch" not in sys.modules:
        saved = os.environ.get("OPREGISTRY_AUTOLOAD")
        os.environ["OPREGISTRY_AUTOLOAD"] = "0"
        try:
            import torch  # noqa: F401  (the point: what torch's dispatcher holds)
        finally:
            if saved is None:
                del os.environ["OPREGISTRY_AUTOLOAD"]
            else:
                os.environ["OPREGISTRY_AUTOLOAD"] = saved
    for module in imports:
        try:
            importlib.import_module(module)
        except Exception as exc:
            raise SystemExit(f"opregistry: --import {module} failed: {type(exc).__name__}: {exc}; "
                             f"the module must be importable here (installed, or on PYTHONPATH)")
    from .registry import load

    return load()


# -- list ----------------------------------------------------------------------


def _refused_kernels(plan: Plan) -> dict[str, list[dict[str, Any]]]:
    """Kernels the resolver refused (conflict, override denied, ...), per op, as listing rows.

    The plan leaves them out with their distribution; the listing still shows
    them under the op, with status ``conflict``, so the table answers "why is
    my kernel not there" where the user looks for it.
    """
    rows: dict[str, list[dict[str, Any]]] = {}
    planned = {op.op.qualname for op in plan.ops}
    for p in plan.errors:
        if p.op and p.key and p.op in planned:
            rows.setdefault(p.op, []).append({
                "op": p.op, "key": p.key, "status": "conflict", "kernel": None,
                "setup_context": None, "backend": None,
                "reason": f"[{p.code}] see opregistry doctor", "override": False,
                "overrides": None, "distribution": ", ".join(o.dist for o in p.culprits) or None,
            })
    return rows


def _filter(plan: Plan, args: argparse.Namespace) -> dict[str, Any]:
    data = plan.to_dict()
    refused = _refused_kernels(plan)
    for op in data["ops"]:
        op["kernels"] += refused.get(op["name"], [])
    namespaces = set(args.namespace or ())
    if namespaces:
        data["namespaces"] = [n for n in data["namespaces"] if n["name"] in namespaces]
        data["ops"] = [o for o in data["ops"] if o["name"].split("::")[0] in namespaces]
    for op in data["ops"]:
        kernels = op["kernels"]
        if args.backend:
            kernels = [k for k in kernels if k["backend"] in args.backend]
        if args.status:
            kernels = [k for k in kernels if k["status"] in args.status]
        op["kernels"] = kernels
    if args.backend or args.status:
        data["ops"] = [o for o in data["ops"] if o["kernels"]]
    if args.backend:
        data["backends"] = [b for b in data["backends"] if b["name"] in args.backend]
    return data


def _kernel_note(kernel: dict[str, Any]) -> str:
    """What the NOTE column says about a kernel row: whose kernel it replaces, or why its status."""
    return f"overrides {kernel['overrides']}" if kernel["overrides"] else kernel["reason"]


def _print_problems(problems: list[dict[str, Any]], out: TextIO) -> None:
    problems = [p for p in problems if p["severity"] != "info"]
    if problems:
        out.write("\nProblems (details: opregistry doctor)\n")
        for p in problems:
            out.write(f"  {p['severity'].upper()} [{p['code']}] {p['message']}\n")
            if p["hint"]:
                out.write(f"      -> {p['hint']}\n")


def _print_list(data: dict[str, Any], out: TextIO) -> None:
    out.write("Backends\n")
    _table([(b["name"], ",".join(b["keys"]), b["device_type"] or "-",
             f"{b['distribution']}=={b['version']}", "yes",
             "yes" if b["available"] else "no (not on this machine)") for b in data["backends"]],
           out, header=("NAME", "KEYS", "DEVICE", "DISTRIBUTION", "INSTALLED", "AVAILABLE"),
           empty="(none installed)")
    out.write("\nNamespaces\n")
    _table([(n["name"], n["owner"] or "-", ", ".join(n["fragments"]) or "-",
             "yes" if n["closed"] else "no") for n in data["namespaces"]],
           out, header=("NAME", "OWNER", "FRAGMENTS", "CLOSED"), empty="(none)")
    out.write("\nOps\n")
    if not data["ops"]:
        out.write("  (none)\n")
    for op in data["ops"]:
        tags = f"  tags: {', '.join(op['tags'])}" if op["tags"] else ""
        out.write(f"  {op['schema'].replace(op['name'].split('::')[1], op['name'], 1)}"
                  f"  [{op['distribution']}]{tags}\n")
        _table([(k["key"], k["status"], k["kernel"] or "-",
                 k["distribution"] if k["distribution"] != op["distribution"] else "",
                 _kernel_note(k)) for k in op["kernels"]], out, indent="      ")
    if data.get("external_kernels"):
        out.write("\nKernels for torch's own ops (allowed by policy)\n")
        _table([(k["op"], k["key"], k["status"], k["kernel"], k["distribution"])
                for k in data["external_kernels"]], out)
    _print_problems(data["problems"], out)


def _live_namespace(namespace: str, plan: Plan) -> list[dict[str, Any]]:
    """The dispatcher's ops of ``namespace`` next to what opregistry declared for them."""
    from . import torch_state

    declared = {op.op.qualname: op for op in plan.ops if op.op.namespace == namespace}
    live = {name for name in torch_state.registered_ops() if name.split("::", 1)[0] == namespace}
    rows = []
    for name in sorted(live | set(declared)):
        op = declared.get(name)
        registrations = torch_state.kernel_registrations(name) if name in live else {}
        rows.append({
            "op": name,
            "declared": op is not None,
            "in_dispatcher": name in live,
            "declared_schema": op.op.full_schema if op else None,
            "dispatcher_schema": torch_state.op_schema(name) if name in live else None,
            "declared_keys": sorted(k.kernel.key for k in op.kernels
                                    if k.status == "active") if op else [],
            "dispatcher_keys": registrations,
            "distribution": op.op.origin.dist if op and op.op.origin else None,
        })
    return rows


def _live_note(row: dict[str, Any]) -> str:
    if not row["declared"]:
        return "registered outside opregistry"
    if not row["in_dispatcher"]:
        return "declared, but NOT in the dispatcher (see opregistry doctor --live)"
    missing = sorted(set(row["declared_keys"]) - set(row["dispatcher_keys"]))
    extra = sorted(set(row["dispatcher_keys"]) - set(row["declared_keys"]))
    notes = []
    if missing:
        notes.append(f"declared but not registered: {', '.join(missing)}")
    if extra:
        notes.append(f"registered outside opregistry: {', '.join(extra)}")
    return "; ".join(notes) or "matches"


def _print_live(live: dict[str, list[dict[str, Any]]], out: TextIO) -> None:
    out.write("\nLive dispatcher (torch) vs declared (opregistry)\n")
    for namespace, rows in live.items():
        out.write(f"  namespace {namespace}\n")
        _table([(r["op"], ",".join(r["declared_keys"]) or "-",
                 ",".join(sorted(r["dispatcher_keys"])) or "-", _live_note(r)) for r in rows],
               out, indent="      ", header=("OP", "DECLARED KEYS", "DISPATCHER KEYS", "NOTE"),
               empty="(no ops in the dispatcher, none declared)")


def cmd_list(args: argparse.Namespace, out: TextIO) -> int:
    # --live compares with the plan the loaded registry was resolved to: a plan
    # made now would count opregistry's own namespaces, grown by fragments
    # registered outside it since, as held by torch.
    resolved = _live_registry().plan if args.live else _plan()
    data = _filter(resolved, args)
    if args.live:
        namespaces = args.namespace or [n["name"] for n in data["namespaces"]]
        data["live"] = {ns: _live_namespace(ns, resolved) for ns in namespaces}
    if args.json:
        _dump(data, out)
    else:
        _print_list(data, out)
        if args.live:
            _print_live(data["live"], out)
    return EXIT_PROBLEMS if resolved.errors else EXIT_OK


# -- show ----------------------------------------------------------------------


def _matching_ops(plan: Plan, name: str) -> list[Any]:
    exact = [op for op in plan.ops if op.op.qualname == name]
    if exact:
        return exact
    return [op for op in plan.ops if f"{op.op.namespace}::{op.op.name}" == name]


def _op_details(plan: Plan, op: Any) -> dict[str, Any]:
    from .model import describe_ref

    data = op.to_dict()
    base = f"{op.op.namespace}::{op.op.name}"
    data["overloads"] = sorted(o.op.overload or "default" for o in plan.ops
                               if f"{o.op.namespace}::{o.op.name}" == base)
    data["doc"] = op.op.doc
    data["entry_point"] = str(op.op.origin) if op.op.origin else None
    features = {}
    for feature, key in FEATURE_KEYS.items():
        k = op.kernel(key)
        features[feature] = None if k is None else {
            "kernel": describe_ref(k.kernel.fn), "status": k.status,
            "distribution": k.kernel.origin.dist if k.kernel.origin else None}
    data["features"] = features
    data["problems"] = [p.to_dict() for p in plan.problems if p.op == op.op.qualname]
    return data


def _print_show(data: dict[str, Any], out: TextIO) -> None:
    name = data["name"]
    out.write(f"{data['schema'].replace(name.split('::')[1], name, 1)}\n")
    rows: list[Sequence[Any]] = [
        ("distribution:", data["entry_point"] or "-"),
        ("defined at:", data["source"] or "-"),
        ("overloads:", ", ".join(data["overloads"])),
        ("mutates:", ", ".join(data["mutates_args"]) or "nothing (functional)"),
        ("tags:", ", ".join(data["tags"]) or "-"),
    ]
    if data["doc"]:
        rows.append(("doc:", data["doc"]))
    for feature, info in data["features"].items():
        rows.append((f"{feature}:", "no" if info is None else
                     f"yes, {info['status']} ({info['kernel']} from {info['distribution']})"))
    rows.append(("samples:", data["samples"] or "none declared (opregistry check skips it)"))
    _table(rows, out)
    out.write("\nKernels\n")
    _table([(k["key"], k["status"], k["kernel"], k["distribution"] or "-", k["backend"] or "-",
             _kernel_note(k)) for k in data["kernels"]],
           out, header=("KEY", "STATUS", "KERNEL", "DISTRIBUTION", "BACKEND", "NOTE"),
           empty="(none)")
    _print_problems(data["problems"], out)
    live = data.get("live")
    if live is not None:
        out.write("\nLive dispatcher (torch)\n")
        if not live["in_dispatcher"]:
            out.write("  not in the dispatcher (see opregistry doctor --live)\n")
            return
        out.write(f"  schema: {live['dispatcher_schema']}\n")
        _table([(key, where, "yes" if key in live["declared_keys"] else "no")
                for key, where in sorted(live["dispatcher_keys"].items())],
               out, header=("KEY", "REGISTERED AT", "DECLARED"))
        out.write(f"  {_live_note(live)}\n")


def cmd_show(args: argparse.Namespace, out: TextIO) -> int:
    if "::" not in args.op:
        sys.stderr.write(f"opregistry show: {args.op!r} is not an op name; write it as "
                         f"NAMESPACE::OP (e.g. mylib::foo), see 'opregistry list'\n")
        return EXIT_USAGE
    resolved = _live_registry().plan if args.live else _plan()
    ops = _matching_ops(resolved, args.op)
    external = [k for k in resolved.external_kernels if k.kernel.op == args.op]
    if not ops and external:
        # a torch op (aten::add.Tensor) that installed packages add kernels to, under policy
        data = {"name": args.op, "owner": "torch", "kernels": [k.to_dict() for k in external]}
        if args.json:
            _dump(data, out)
        else:
            out.write(f"{args.op}  [defined by torch; kernels added under OPREGISTRY_ALLOW_OVERRIDE]\n")
            _table([(k["key"], k["status"], k["kernel"], k["distribution"] or "-",
                     _kernel_note(k)) for k in data["kernels"]],
                   out, header=("KEY", "STATUS", "KERNEL", "DISTRIBUTION", "NOTE"))
        return EXIT_OK
    if not ops:
        problems = [p for p in resolved.problems if p.op and p.op.split(".")[0] == args.op.split(".")[0]]
        namespace = args.op.split("::", 1)[0]
        known = [op.op.qualname for op in resolved.ops if op.op.namespace == namespace]
        sys.stderr.write(f"opregistry show: no op {args.op} in the registry.\n")
        for p in problems:
            sys.stderr.write(f"  it was left out: {p}\n")
        if known:
            sys.stderr.write(f"  ops of namespace {namespace}: {', '.join(known)}\n")
        elif not problems:
            sys.stderr.write("  see 'opregistry list' for every op\n")
        return EXIT_PROBLEMS
    details = [_op_details(resolved, op) for op in ops]
    if args.live:
        live = {row["op"]: row for row in _live_namespace(ops[0].op.namespace, resolved)}
        for d in details:
            d["live"] = live.get(d["name"])
    if args.json:
        _dump(details[0] if len(details) == 1 else details, out)
    else:
        for i, d in enumerate(details):
            if i:
                out.write("\n")
            _print_show(d, out)
    return EXIT_PROBLEMS if any(p["severity"] == "error" for d in details for p in d["problems"]) \
        else EXIT_OK


# -- plugins -------------------------------------------------------------------


def _hooks_by_entry_point() -> dict[tuple[str, str, str], list[str]]:
    """``(group, name, value)`` -> the ``opregistry_*`` hooks its object implements.

    Like ``datasette plugins``: which hooks each plugin implements.  The
    entry points were loaded by discovery already, so loading them again
    only looks the objects up in ``sys.modules``.
    """
    from .collect import HOOK_GROUPS
    from .discovery import entry_points

    hooks = {}
    for group, ep in entry_points():
        try:
            obj = ep.load()
        except Exception:  # reported by discovery already, as a problem of its distribution
            continue
        hooks[(group, ep.name, ep.value)] = sorted(
            name for name in HOOK_GROUPS if callable(getattr(obj, name, None)))
    return hooks


def _plugins(plan: Plan) -> list[dict[str, Any]]:
    from .discovery import BACKENDS_GROUP

    hooks = _hooks_by_entry_point()
    # what each entry point contributes, grouped once: not a pass over every op per distribution
    ops_of: dict[Any, list[str]] = {}
    for op in plan.ops:
        ops_of.setdefault(op.op.origin, []).append(op.op.qualname)
    kernels_of = Counter(k.kernel.origin for k in plan.kernels())
    namespaces_of: dict[Any, set[str]] = {}
    for n in plan.namespaces:
        namespaces_of.setdefault(n.owner, set()).add(f"{n.name} (DEF)")
        for fragment in n.fragments:
            namespaces_of.setdefault(fragment, set()).add(f"{n.name} (FRAGMENT)")

    excluded = {o.distribution for o in plan.excluded}
    problems_of: dict[str, list[str]] = {}
    for p in plan.problems:
        if p.severity == "error":
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
            "hooks": hooks.get((o.group, o.entry_point, o.value), []),
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
    return sorted(rows, key=lambda r: (r["group"], r["distribution"], r["entry_point"]))


def _contribution(row: dict[str, Any]) -> str:
    c = row["contributes"]
    if row["status"] != "loaded":
        return row["reason"]
    if "backends" in c:
        return "; ".join(
            f"backend {b['name']} ({', '.join(b['keys'])}"
            + (f", device {b['device_type']}" if b["device_type"] else "")
            + ("" if b["available"] else ", not available here") + ")"
            for b in c["backends"]) or "-"
    parts = [f"namespace {n}" for n in c.get("namespaces", [])]
    parts.append(f"{len(c.get('ops', []))} op(s), {c.get('kernels', 0)} kernel(s)")
    return ", ".join(parts)


def cmd_plugins(args: argparse.Namespace, out: TextIO) -> int:
    from .discovery import BACKENDS_GROUP, OPS_GROUP

    rows = _plugins(_plan())
    if args.json:
        _dump(rows, out)
    else:
        for group, title in ((BACKENDS_GROUP, "Backends"), (OPS_GROUP, "Op packages")):
            mine = [r for r in rows if r["group"] == group]
            out.write(f"{title} (entry-point group {group})\n")
            _table([(r["distribution"], r["version"], r["entry_point"], r["status"],
                     _contribution(r)) for r in mine],
                   out, header=("DISTRIBUTION", "VERSION", "ENTRY POINT", "STATUS",
                                "CONTRIBUTES / REASON"), empty="(none)")
            out.write("\n")
    bad = any(r["status"] in ("failed", "left out") for r in rows)
    return EXIT_PROBLEMS if bad else EXIT_OK


# -- doctor --------------------------------------------------------------------


def _findings(plan: Plan, problems: Sequence[Any], include_info: bool) -> list[dict[str, Any]]:
    found = [p.to_dict() for p in problems if include_info or p.severity != "info"]
    # Allowed overrides are not errors, but someone's kernel is being replaced:
    # the user should know, and know how to undo it.
    for k in plan.kernels():
        if k.overrides and k.status != "overridden":
            origin = k.kernel.origin
            found.append({
                "code": "kernel-overrides", "severity": "warning",
                "message": f"{origin} replaces the {k.kernel.key} kernel of {k.kernel.op} "
                           f"registered by {k.overrides} (allowed by policy)",
                "hint": "if this is not intended, remove the op or its namespace from "
                        "OPREGISTRY_ALLOW_OVERRIDE, or block "
                        f"{origin.distribution if origin else 'the distribution'}",
                "distributions": [origin.dist] if origin else [], "entry_points": [],
                "others": [k.overrides], "op": k.kernel.op, "key": k.kernel.key,
                "namespace": None, "source": k.kernel.source,
            })
    return found


def cmd_doctor(args: argparse.Namespace, out: TextIO) -> int:
    if args.live:
        registry = _live_registry(args.imports or ())
        plan, problems = registry.plan, registry.problems
    else:
        plan = _plan()
        problems = plan.problems
    findings = _findings(plan, problems, args.all)
    errors = [f for f in findings if f["severity"] == "error"]
    summary = {
        "errors": len(errors),
        "warnings": sum(1 for f in findings if f["severity"] == "warning"),
        "distributions": len({o.distribution for o in plan.distributions}),
        "ops": len(plan.ops),
        "live": bool(args.live),
    }
    if args.json:
        _dump({"summary": summary, "problems": findings}, out)
        return EXIT_PROBLEMS if errors else EXIT_OK
    out.write(f"opregistry doctor: {summary['errors']} error(s), {summary['warnings']} "
              f"warning(s) in {summary['distributions']} distribution(s), {summary['ops']} op(s)\n")
    order = {"error": 0, "warning": 1, "info": 2}
    for f in sorted(findings, key=lambda f: order.get(f["severity"], 3)):
        out.write(f"\n{f['severity'].upper():7} [{f['code']}] {f['message']}\n")
        if f["source"]:
            out.write(f"        at: {f['source']}\n")
        if f["distributions"]:
            out.write(f"        distribution(s): {', '.join(f['distributions'])}\n")
        if f["hint"]:
            out.write(f"        fix: {f['hint']}\n")
    if not findings:
        out.write("No problems found.\n")
    if not args.live:
        out.write("\nNot checked without torch: namespaces and kernels held by torch outside "
                  "opregistry (C++ TORCH_LIBRARY), and registration itself. "
                  "Run 'opregistry doctor --live' for those.\n")
    return EXIT_PROBLEMS if errors else EXIT_OK


# -- check ---------------------------------------------------------------------


#: A check's mark in the table; over several samples the worst shows.
_MARKS = {"skip": "skip", "ok": "ok", "fail": "FAIL"}
_WORST = list(_MARKS)


def _print_check(results: list[Any], out: TextIO) -> None:
    from .checking import GRADCHECK, OPCHECK_UTILS

    columns = (*OPCHECK_UTILS, GRADCHECK)
    rows: dict[tuple[str, str], dict[str, str]] = {}
    for r in results:
        cells = rows.setdefault((r.op, r.device), {})
        if r.check not in columns:  # the op was not checked at all: say why across the row
            cells["_note"] = f"{r.status}: {r.message}"
        elif _WORST.index(r.status) >= _WORST.index(cells.get(r.check, "skip")):
            cells[r.check] = r.status
    table = []
    for (op, device), cells in rows.items():
        if "_note" in cells:
            table.append((op, device, cells["_note"], *([""] * (len(columns) - 1))))
        else:
            table.append((op, device, *(_MARKS[cells[c]] if c in cells else "-" for c in columns)))
    _table(table, out, header=("OP", "DEVICE", *(c.replace("test_", "") for c in columns)))
    notes = [r for r in results if r.status == "fail"]
    if notes:
        out.write("\nFailures\n")
        for r in notes:
            sample = f", sample {r.sample}" if r.sample is not None else ""
            out.write(f"  {r.op} on {r.device}{sample}: {r.check} failed: {r.message}\n")
            if r.distribution:
                out.write(f"      from {r.distribution}\n")


def cmd_check(args: argparse.Namespace, out: TextIO) -> int:
    from .checking import run_checks

    registry = _live_registry()

    def progress(text: str) -> None:
        if not args.quiet:
            sys.stderr.write(text + "\n")
            sys.stderr.flush()

    results, unknown = run_checks(registry, args.targets, devices=args.device, progress=progress)
    if unknown:
        sys.stderr.write(f"opregistry check: no op or namespace {', '.join(unknown)} in the "
                         f"registry; see 'opregistry list'\n")
        return EXIT_USAGE
    failed = [r for r in results if r.status == "fail"]
    if args.json:
        _dump({"ok": not failed, "results": [r.to_dict() for r in results]}, out)
    else:
        if not results:
            out.write("no ops to check\n")
        else:
            _print_check(results, out)
            ops = {r.op for r in results}
            out.write(f"\n{len(ops)} op(s) checked: "
                      + (f"{len({r.op for r in failed})} FAILED" if failed else "all passed") + "\n")
    return EXIT_PROBLEMS if failed else EXIT_OK


# -- lock / verify -------------------------------------------------------------


def cmd_lock(args: argparse.Namespace, out: TextIO) -> int:
    from .lockfile import write_lock

    resolved = _plan()
    if resolved.errors and not args.force:
        sys.stderr.write(f"opregistry lock: the registry has {len(resolved.errors)} error(s); "
                         f"nothing written. See 'opregistry doctor', or lock what resolves "
                         f"anyway with --force.\n")
        return EXIT_PROBLEMS
    data = write_lock(resolved, out if args.output == "-" else args.output)
    if args.output != "-":
        out.write(f"wrote {args.output}: {data['fingerprint']} (torch {data['torch']}, "
                  f"{len(data['distributions'])} distributions, {len(data['ops'])} ops)\n")
    return EXIT_OK


def cmd_verify(args: argparse.Namespace, out: TextIO) -> int:
    from .errors import LockMismatchError
    from .lockfile import verify_plan

    try:
        # this process's plan, not a registry loaded earlier in it (tests call main())
        current = verify_plan(args.lockfile, _plan())
    except LockMismatchError as exc:
        if args.json:
            _dump({"ok": False, "lockfile": args.lockfile, "differences": list(exc.differences),
                   "error": exc.message}, out)
        else:
            sys.stderr.write(f"opregistry verify: {exc.message}\n")
        return EXIT_PROBLEMS
    if args.json:
        _dump({"ok": True, "lockfile": args.lockfile, "fingerprint": current,
               "differences": []}, out)
    else:
        out.write(f"{args.lockfile}: OK, this environment resolves the locked registry "
                  f"({current})\n")
    return EXIT_OK


# -- parser --------------------------------------------------------------------


def _add(sub: Any, name: str, func: Callable[..., int], help: str, description: str,
         json_help: str | None = "machine-readable output") -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help, description=description)
    if json_help:
        p.add_argument("--json", action="store_true", help=json_help)
    p.set_defaults(func=func)
    return p


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``opregistry`` command (its --help is docs/cli.md)."""
    parser = argparse.ArgumentParser(
        prog="opregistry",
        description="See and check the PyTorch custom operators that installed packages "
        "contribute through opregistry.",
        epilog="Exit status: 0 healthy, 1 problems found, 2 bad usage. list, show, plugins, "
        "doctor, lock and verify do not import torch; check and --live do. "
        "OPREGISTRY_PLUGINS / OPREGISTRY_BLOCK scope every command.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log more (repeatable)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = _add(sub, "list", cmd_list,
             "backends, namespaces, ops and kernels, without importing torch",
             "Show the resolved registry: backends (distribution, version, device type, "
             "available), namespaces (owner, fragments), ops (schema, tags) and each op's kernels "
             "per dispatch key with their status (active, inactive with the package that would "
             "activate it, unavailable, overridden, conflict) and the distribution they came from. "
             "Does not import torch unless --live.")
    p.add_argument("-n", "--namespace", action="append", help="only this namespace (repeatable)")
    p.add_argument("-b", "--backend", action="append", help="only kernels of this backend")
    p.add_argument("-s", "--status", action="append", choices=STATUSES,
                   help="only kernels with this status")
    p.add_argument("--live", action="store_true",
                   help="also show what torch's dispatcher holds for each namespace, ops "
                   "registered outside opregistry included (imports torch)")

    p = _add(sub, "show", cmd_show, "one op in full: schema, kernels, origins, samples",
             "Show one op: schema, overloads, mutated arguments, tags, each kernel with its "
             "origin (module:function and distribution), fake / autograd / vmap presence and "
             "the sample inputs declared for 'opregistry check'.")
    p.add_argument("op", metavar="NS::OP", help="the op, e.g. mylib::foo or mylib::foo.out")
    p.add_argument("--live", action="store_true",
                   help="also show the dispatcher's schema and kernels for it (imports torch)")

    _add(sub, "plugins", cmd_plugins,
         "discovered distributions, what each contributes, and those skipped",
         "List every distribution found in the entry-point groups opregistry.backends and "
         "opregistry.ops: version, entry point, what it contributes (with --json: the hooks it "
         "implements), and those skipped or left out (blocked, not allowed, failed to import, "
         "conflicting) with the reason. Exit 1 if any failed or was left out.")

    p = _add(sub, "doctor", cmd_doctor, "every problem, with what to do",
             "Report every problem: conflicts, broken plugins, ops without a fake kernel "
             "(torch.compile / torch.export will fail on them), ops without an active kernel, "
             "kernels that override another distribution's or torch's own. Each with what to "
             "do. Exit 1 if there is an error. Without torch; --live also checks against "
             "torch's dispatcher.")
    p.add_argument("--live", action="store_true",
                   help="import torch and load the registry: also finds namespaces and kernels "
                   "held by torch outside opregistry (C++ TORCH_LIBRARY) and registration failures")
    p.add_argument("--import", dest="imports", action="append", metavar="MODULE",
                   help="with --live: import this module (e.g. a C++ extension) before the "
                   "registry is resolved, so that its namespaces are checked (repeatable)")
    p.add_argument("-a", "--all", action="store_true", help="also show notes (e.g. ops without vmap)")

    p = _add(sub, "check", cmd_check, "run opcheck and gradcheck over every op's sample inputs",
             "Load the registry into torch and run torch.library.opcheck (test_schema, "
             "test_autograd_registration, test_faketensor, test_aot_dispatch_dynamic) over each "
             "op's sample inputs on every available device with an active kernel, and "
             "torch.autograd.gradcheck where an Autograd kernel is active. Progress goes to "
             "stderr, a table to stdout. Exit 1 on any failure. Imports torch.")
    p.add_argument("targets", nargs="*", metavar="NS|NS::OP",
                   help="namespaces or ops to check (default: all)")
    p.add_argument("-d", "--device", action="append",
                   help="only this device type (repeatable; default: every available one)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")

    p = _add(sub, "lock", cmd_lock, "write a lockfile of the resolved registry",
             "Write the resolved registry (torch version, distributions and versions, backends, "
             "namespaces, ops "
             "and schemas, kernel origins and status) with its sha256 fingerprint as JSON. "
             "Refuses when the registry has errors, unless --force. Does not import torch.",
             json_help=None)
    p.add_argument("-o", "--output", default=DEFAULT_LOCKFILE, metavar="FILE",
                   help=f"where to write it; '-' for stdout (default: {DEFAULT_LOCKFILE})")
    p.add_argument("--force", action="store_true", help="lock even if the registry has errors")

    p = _add(sub, "verify", cmd_verify, "compare this environment with a lockfile",
             "Check that this environment resolves the registry recorded in LOCKFILE, and "
             "explain every difference (other torch version, missing distribution, other "
             "version, other schema, other kernel origin). Exit 1 on any difference. Does not import torch. The Python "
             "equivalent is opregistry.verify_lock(path).")
    p.add_argument("lockfile", nargs="?", default=DEFAULT_LOCKFILE, metavar="LOCKFILE",
                   help=f"the lockfile (default: {DEFAULT_LOCKFILE})")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    _configure_logging(args.verbose)
    try:
        return int(args.func(args, sys.stdout) or 0)
    except ConfigError as exc:
        # a bad variable or OPREGISTRY_CONFIG file: one line, no traceback, status 2;
        # doctor, whose job is to diagnose, reports it as its one error problem (status 1)
        if args.func is cmd_doctor:
            from .model import Problem

            problem = Problem(code="config-invalid", message=str(exc),
                              hint="fix the variable or the file named here, or unset it")
            if args.json:
                _dump({"summary": {"errors": 1, "warnings": 0, "distributions": 0, "ops": 0,
                                   "live": bool(args.live)}, "problems": [problem.to_dict()]},
                      sys.stdout)
            else:
                sys.stdout.write(f"opregistry doctor: 1 error(s)\n\nERROR   {problem}\n")
            return EXIT_PROBLEMS
        sys.stderr.write(f"opregistry: {exc}\n")
        return EXIT_USAGE
    except BrokenPipeError:
        # `opregistry list | head` closed the pipe: not an error of ours.  Point
        # stdout at devnull so the interpreter's final flush does not raise again.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
