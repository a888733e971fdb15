"""The ``opregistry`` command (also ``python -m opregistry``).

Commands that only read declarations (``list``) never import torch; they
stop after the resolver.  Output is a plain table by default and JSON with
``--json``; the exit status is 0 when the registry is healthy and 1 when it
has errors.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Sequence, TextIO

from .resolver import Plan

__all__ = ["main"]

STATUSES = ("active", "inactive", "unavailable", "overridden")


def _configure_logging(verbose: int) -> None:
    """The CLI, unlike the library, decides where logs go: stderr, by -v level."""
    import logging

    from .logs import LOGGER_NAME

    level = logging.DEBUG if verbose > 1 else logging.INFO if verbose else logging.ERROR
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger(LOGGER_NAME)
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False


def _table(rows: list[Sequence[str]], out: TextIO, indent: str = "  ") -> None:
    if not rows:
        return
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = [str(c).ljust(w) for c, w in zip(row, widths)]
        out.write(indent + "  ".join(cells).rstrip() + "\n")


def _filter(plan: Plan, args: argparse.Namespace) -> dict[str, Any]:
    data = plan.to_dict()
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


def _print_list(data: dict[str, Any], out: TextIO) -> None:
    out.write("Backends\n")
    rows = [("NAME", "KEYS", "DISTRIBUTION", "AVAILABLE")]
    rows += [(b["name"], ",".join(b["keys"]), f"{b['distribution']}=={b['version']}",
              "yes" if b["available"] else "no") for b in data["backends"]]
    _table(rows, out) if data["backends"] else out.write("  (none installed)\n")
    out.write("\nNamespaces\n")
    rows = [("NAME", "OWNER", "FRAGMENTS")]
    rows += [(n["name"], n["owner"] or "-", ", ".join(n["fragments"]) or "-")
             for n in data["namespaces"]]
    _table(rows, out) if data["namespaces"] else out.write("  (none)\n")
    out.write("\nOps\n")
    if not data["ops"]:
        out.write("  (none)\n")
    for op in data["ops"]:
        tags = f"  tags: {', '.join(op['tags'])}" if op["tags"] else ""
        out.write(f"  {op['schema'].replace(op['name'].split('::')[1], op['name'], 1)}"
                  f"  [{op['distribution']}]{tags}\n")
        rows = []
        for k in op["kernels"]:
            note = k["reason"]
            if k["overrides"]:
                note = f"overrides {k['overrides']}"
            dist = k["distribution"] if k["distribution"] != op["distribution"] else ""
            rows.append((k["key"], k["status"], k["kernel"] or "", dist, note))
        _table(rows, out, indent="      ")
    if data.get("external_kernels"):
        out.write("\nKernels for torch's own ops (allowed by policy)\n")
        _table([(k["op"], k["key"], k["status"], k["kernel"], k["distribution"])
                for k in data["external_kernels"]], out)
    problems = [p for p in data["problems"] if p["severity"] != "info"]
    if problems:
        out.write("\nProblems\n")
        for p in problems:
            out.write(f"  {p['severity'].upper()} [{p['code']}] {p['message']}\n")
            if p["hint"]:
                out.write(f"      -> {p['hint']}\n")


def cmd_list(args: argparse.Namespace, out: TextIO) -> int:
    from .registry import plan

    resolved = plan()
    data = _filter(resolved, args)
    if args.json:
        json.dump(data, out, indent=2, sort_keys=False)
        out.write("\n")
    else:
        _print_list(data, out)
    return 1 if resolved.errors else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="opregistry",
        description="See and check the PyTorch custom operators that installed packages "
        "contribute through opregistry.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log more (repeatable)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser(
        "list",
        help="backends, namespaces, ops and kernels, without importing torch",
        description="Show the resolved registry: backends, namespaces (owner, fragments), ops "
        "(schema, tags) and each op's kernels per dispatch key with their status and the "
        "distribution they came from. Does not import torch.",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("-n", "--namespace", action="append", help="only this namespace (repeatable)")
    p.add_argument("-b", "--backend", action="append", help="only kernels of this backend")
    p.add_argument("-s", "--status", action="append", choices=STATUSES,
                   help="only kernels with this status")
    p.set_defaults(func=cmd_list)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _configure_logging(args.verbose)
    return int(args.func(args, sys.stdout) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
