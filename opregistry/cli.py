"""The ``opregistry`` command (also ``python -m opregistry``).

Commands follow the conventions of the packaging world (``pip list``,
``pip show``, ``datasette plugins``): a plain table by default, ``--json``
for tools, and one exit status table for every command (:data:`EXIT_CODES`).

This module parses arguments and renders text; what a command shows comes
from :mod:`opregistry.report`, whose dicts are also what ``--json`` prints.
``list``, ``show``, ``plugins``, ``doctor``, ``lock`` and ``verify`` read
declarations only and never import torch: they stop after the resolver.
``check`` and the ``--live`` views import torch, because what they show
lives in torch's dispatcher.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import gc
import json
import os
import sys
from typing import TYPE_CHECKING, Any, Callable, Sequence, TextIO

from . import report
from .errors import DOCS_URL, ConfigError
from .lockfile import DEFAULT_LOCKFILE
from .model import elide
from .report import STATUSES

if TYPE_CHECKING:
    from .plans import Plan

__all__ = ["main", "run", "build_parser", "EXIT_CODES", "DOCS_URL"]

#: Exit status of every command (docs/cli.md shows this table; a test compares).
EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
EXIT_CODES = {
    EXIT_OK: "healthy: no error, every check passed, the lockfile matches",
    EXIT_PROBLEMS: "problems found: an error in the registry, an op or plugin left out, "
                   "a failed check, a difference from the lockfile, a lockfile `verify` "
                   "cannot use (missing, unreadable, not JSON, another format version); "
                   "`lock` with errors and no `--force`; `doctor` on an invalid "
                   "configuration",
    EXIT_USAGE: "usage error: an unknown command, option or help topic; an op or check "
                "target that names nothing, or several ops; an invalid configuration "
                "(an `OPREGISTRY_*` value, `OPREGISTRY_CONFIG`) for every command but "
                "`doctor`; a `lock -o` file that cannot be written",
    EXIT_INTERRUPTED: "interrupted: a real Ctrl-C (a KeyboardInterrupt a plugin raises "
                      "itself is that plugin's problem, not this)",
}



def _configure_logging(verbose: int) -> None:
    """The CLI, unlike the library, decides where logs go: stderr, by -v level (without -v,
    errors only: ``logging`` is imported when one is emitted, :func:`opregistry.logs.configure`)."""
    from .logs import LOGGER_NAME, configure

    def apply() -> None:
        import logging

        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler.set_name("opregistry-cli")
        logger = logging.getLogger(LOGGER_NAME)
        for previous in [h for h in logger.handlers if h.name == handler.name]:
            logger.removeHandler(previous)  # main() run again in one process: log each line once
        logger.addHandler(handler)
        logger.setLevel(level)
        logger.propagate = False

    level = 10 if verbose > 1 else 20 if verbose else 40  # logging.DEBUG, INFO, ERROR
    configure(level, apply)


# -- text output -----------------------------------------------------------------------


def _isatty(stream: Any) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def _width(args: argparse.Namespace, out: TextIO) -> int | None:
    """Columns to fit text into: ``None`` (no limit) with --wide or into a pipe or file.

    ``COLUMNS`` wins, as for every tool that reads the terminal width; a
    pipe gets whole lines, so that ``opregistry list | grep`` finds them.
    """
    if getattr(args, "wide", False):
        return None
    if os.environ.get("COLUMNS", "").isdigit():
        return max(int(os.environ["COLUMNS"]), 40)
    if _isatty(out):
        import shutil

        return max(shutil.get_terminal_size().columns, 40)
    return None


def _color(stream: Any) -> bool:
    """Colour only on a terminal, never with ``NO_COLOR`` set (no-color.org) or TERM=dumb."""
    return _isatty(stream) and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


_PAINT = {"ERROR": "31;1", "FAIL": "31;1", "FAILED": "31;1", "WARNING": "33", "ok": "32"}


def _elide(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 3, 0)] + "..."


class Text:
    """Where a command writes: the stream, the width to fit, whether to paint."""

    def __init__(self, out: TextIO, width: int | None, color: bool) -> None:
        self.out, self.width, self.color = out, width, color

    def paint(self, word: str) -> str:
        code = _PAINT.get(word.strip())
        return f"\x1b[{code}m{word}\x1b[0m" if code and self.color else word

    def line(self, text: str = "", *, wrap: str | None = None) -> None:
        """One line, fitted: elided with ``...``, or wrapped with ``wrap`` as indent."""
        if self.width is not None and len(text) > self.width:
            if wrap is not None:
                import textwrap  # here, as difflib: imported by the commands that use them

                for part in textwrap.wrap(text, self.width, subsequent_indent=wrap,
                                          break_on_hyphens=False, drop_whitespace=True):
                    self.out.write(part + "\n")
                return
            text = _elide(text, self.width)
        self.out.write(text + "\n")

    def widths(self, rows: Sequence[Sequence[Any]], header: Sequence[str] = ()) -> list[int]:
        rows = [header, *rows] if header else list(rows)
        return [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))] if rows else []

    def fit(self, widths: Sequence[int], indent: str, header: Sequence[str] = ()) -> list[int]:
        """``widths`` narrowed, widest column first, until a row fits the terminal."""
        widths = list(widths)
        if self.width is None or not widths:
            return widths
        overflow = len(indent) + sum(widths) + 2 * (len(widths) - 1) - self.width
        while overflow > 0:
            floor = [max(12, len(header[i]) if header else 0) for i in range(len(widths))]
            last = len(widths) - 1  # the last column is the notes: it gives way first
            i = last if widths[last] > max(floor[last], 24) else max(
                range(len(widths)), key=lambda j: widths[j] - floor[j])
            if widths[i] <= floor[i]:
                break  # nothing left to narrow: the row is elided at the end
            cut = min(overflow, widths[i] - floor[i])
            widths[i] -= cut
            overflow -= cut
        return widths

    def row(self, cells: Sequence[Any], widths: Sequence[int], indent: str = "  ") -> None:
        padded = [_elide(str(c), w).ljust(w) for c, w in zip(cells, widths)]
        text = (indent + "  ".join(padded)).rstrip()
        if self.width is not None and len(text) > self.width:
            text = _elide(text, self.width)
        if self.color:  # painted after fitting: escape codes take no columns
            text = " ".join(self.paint(w) if w in _PAINT else w for w in text.split(" "))
        self.out.write(text + "\n")

    def table(self, rows: Sequence[Sequence[Any]], indent: str = "  ", *,
              header: Sequence[str] = (), empty: str = "",
              widths: Sequence[int] | None = None) -> None:
        """``rows`` in aligned columns under ``header``; the ``empty`` line when there are none."""
        if not rows:
            if empty:
                self.line(f"{indent}{empty}")
            return
        widths = self.fit(widths or self.widths(rows, header), indent, header)
        for r in ([header] if header else []) + list(rows):
            self.row(r, widths, indent)


def _dump(data: Any, out: TextIO) -> None:
    # Indented JSON for a person at a terminal; compact JSON for a pipe, because
    # only json.dumps without indent uses the C encoder (5-10x faster on the
    # megabytes `list --json` prints for thousands of ops; see docs/performance.md).
    out.write(json.dumps(data, indent=2 if _isatty(out) else None, default=str))
    out.write("\n")


def _dist(record: dict[str, Any] | None) -> str:
    """A distribution record as pip spells it: ``name==version``."""
    if not record:
        return "-"
    return f"{record['name']}=={record['version']}" if record.get("version") else record["name"]


def _usage_error(command: str, message: str) -> int:
    sys.stderr.write(f"opregistry {command}: {message}\n")
    return EXIT_USAGE


def _plan(references: bool = False) -> Plan:
    from .registry import plan

    return plan(references=references)


def _live_registry(imports: Sequence[str] = ()) -> Any:
    """Import torch, then ``imports`` (C++ extensions, say), then load the registry.

    torch's autoload is held back while torch is imported here, so that the
    registry is resolved against everything ``imports`` put into the
    dispatcher (their ``TORCH_LIBRARY`` namespaces included).
    """
    import importlib

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
    from .torch_state import recorder

    recorder()  # what the imported modules register is attributed to their distributions
    for module in imports:
        try:
            importlib.import_module(module)
        except Exception as exc:
            missing = isinstance(exc, ModuleNotFoundError) and exc.name is not None and (
                module == exc.name or module.startswith(exc.name + "."))
            raise SystemExit(
                f"opregistry: --import {module} failed: {type(exc).__name__}: {exc}; "
                + ("the module must be importable here (installed, or on PYTHONPATH)" if missing
                   else f"it is found, and its import raised: python -c 'import {module}' "
                        f"shows the whole error (a package built for another torch fails so)"))
    from .registry import load

    return load()


def _kernel_note(kernel: dict[str, Any]) -> str:
    """What the NOTE column says about a kernel row: whose kernel it replaces, or why its status."""
    return f"overrides {_dist(kernel['overrides'])}" if kernel["overrides"] else kernel["reason"]


def _print_problems(problems: list[dict[str, Any]], t: Text) -> None:
    problems = [p for p in problems if p["severity"] != "info"]
    if problems:
        t.line("\nProblems (details: opregistry doctor)")
        for p in problems:
            t.line(f"  {t.paint(p['severity'].upper())} [{p['code']}] {elide(p['message'])}",
                   wrap="      ")
            if p["hint"]:
                t.line(f"      -> {elide(p['hint'])}", wrap="         ")


def _did_you_mean(candidates: Sequence[str]) -> str:
    if not candidates:
        return ""
    return " did you mean " + " or ".join(repr(c) for c in candidates) + "?"


def _explain_match(command: str, match: report.Match) -> int:
    """The message and exit status for a name that designates no op (or several)."""
    if match.kind == "ambiguous":
        return _usage_error(command, f"{match.name!r} is ambiguous; it names "
                            f"{', '.join(match.candidates)}: write one as NAMESPACE::OP")
    if match.kind == "left-out":
        sys.stderr.write(f"opregistry {command}: {match.name} is not in the registry: "
                         f"it was left out.\n")
        for p in match.problems:
            sys.stderr.write(f"  {p}\n")
        return EXIT_PROBLEMS
    what = "op or namespace" if command == "check" else "op"
    return _usage_error(command, f"no {what} {match.name} in the registry;"
                        f"{_did_you_mean(match.candidates) or ' see opregistry list'} "
                        f"(names: 'opregistry help names')")


# -- list ------------------------------------------------------------------------------


def _op_line(op: dict[str, Any]) -> str:
    tags = f"  tags: {', '.join(op['tags'])}" if op["tags"] else ""
    schema = op["schema"].replace(op["name"].split("::")[1], op["name"], 1)
    return f"  {schema}  [{_dist(op['distribution'])}]{tags}"


def _backend_keys(keys: list[str]) -> str:
    """A backend's keys in a table cell: ``AutocastCPU,...(7 keys)`` for many (``--json`` has all)."""
    return ",".join(keys) if len(keys) <= 3 else f"{keys[0]},...({len(keys)} keys)"
def _built_for(built: dict[str, Any]) -> str:
    """``torch 2.13.0+cpu, CUDA 12.8``, or what a library built at load time is built for."""
    if not built["torch"]:
        return "the running torch (built at load)"
    return f"torch {built['torch']}" + (f", CUDA {built['cuda']}" if built["cuda"] else "")


def _print_list(data: dict[str, Any], t: Text) -> None:
    t.line("Backends")
    t.table([(b["name"], _backend_keys(b["keys"]), b["device_type"] or "-",
              _dist(b["distribution"]), "yes",
              "yes" if b["available"] else "no (not on this machine)") for b in data["backends"]],
            header=("NAME", "KEYS", "DEVICE", "DISTRIBUTION", "INSTALLED", "AVAILABLE"),
            empty="(none installed)")
    t.line("\nNamespaces")
    t.table([(n["name"], _dist(n["owner"]), ", ".join(map(_dist, n["fragments"])) or "-",
              "yes" if n["closed"] else "no") for n in data["namespaces"]],
            header=("NAME", "OWNER", "FRAGMENTS", "CLOSED"), empty="(none)")
    if data.get("natives"):  # only where a native (C++) op package is installed
        t.line("\nNative libraries")
        t.table([(n["namespace"] + ("" if n["kind"] == "DEF" else f' ({n["kind"]})'),
                  n["module"] or n["path"], _built_for(n["built_for"]),
                  _dist(n["distribution"])) for n in data["natives"]],
                header=("NAMESPACE", "LOADS", "BUILT FOR", "DISTRIBUTION"))
    t.line("\nOps")
    if not data["ops"]:
        t.line("  (none)")
    rows = {op["name"]: [(k["key"], k["status"], k["kernel"] or "-",
                          _dist(k["distribution"]) if k["distribution"] != op["distribution"]
                          else "", _kernel_note(k)) for k in op["kernels"]]
            for op in data["ops"]}
    # one set of column widths for the whole section: kernels line up from op to op
    widths = t.widths([r for op_rows in rows.values() for r in op_rows])
    for op in data["ops"]:
        t.line(_op_line(op), wrap="      ")
        t.table(rows[op["name"]], indent="      ", widths=widths)
    if data.get("adopted"):
        _print_adopted(data["adopted"], t)
    if data.get("switches"):
        t.line("\nKernel switches (in order; the last that matches a kernel decides)")
        t.table([(s["switch"], s["source"]) for s in data["switches"]])
    # kernels for an adopted package's op are listed under it, in the Adopted section
    shown = {op["name"] for a in data.get("adopted", []) for op in a["ops"]}
    external = [k for k in data.get("external_kernels", []) if k["op"] not in shown]
    if external:
        t.line("\nKernels for torch's own ops (allowed by policy)")
        t.table([(k["op"], k["key"], k["status"], k["kernel"], _dist(k["distribution"]))
                 for k in external])
    _print_problems(data["problems"], t)


def _adoption_line(a: dict[str, Any]) -> str:
    how = {"adopted": f"adopted, {a['load']}", "off": "not adopted", "refused": "refused"}
    imports = "; ".join(f"torch.ops.{ns} imports {', '.join(m)}"
                        for ns, m in a["namespaces"].items())
    return (f"  {a['distribution']['name']}=={a['distribution']['version']}  "
            f"[{how.get(a['status'], a['status'])}: {a['reason']}]"
            + (f"  {imports}" if imports and a["status"] == "adopted" else ""))


def _overridden_note(kernel: dict[str, Any]) -> str:
    """An adopted kernel's NOTE: why its status, and the op package whose kernel serves instead."""
    by = kernel.get("overridden_by")
    notes = [kernel["reason"]] + ([f"overridden by {_dist(by)} (allowed by policy)"] if by else [])
    return "; ".join(n for n in notes if n)


def _adopted_kernel_rows(op: dict[str, Any]) -> list[tuple[str, ...]]:
    """An adopted op's kernels (key, status, where, note), then those op packages add to it."""
    return [(k["key"], k["status"], k["where"], _overridden_note(k)) for k in op["kernels"]] + [
        (k["key"], k["status"], f"{k['kernel']} ({_dist(k['distribution'])})", _kernel_note(k))
        for k in op.get("kernels_added", [])]


def _print_adopted(adopted: list[dict[str, Any]], t: Text) -> None:
    t.line("\nAdopted (packages that register with torch.library by themselves; "
           "read from their files)")
    rows = {(a["distribution"]["name"], op["name"]): _adopted_kernel_rows(op)
            for a in adopted for op in a["ops"]}
    # kernels of a namespace the scan could not tie to one op: they may apply to any of its ops
    untied = {(a["distribution"]["name"], ns): [(k["key"], "may apply", k["where"], k["why"])
                                                for k in kernels]
              for a in adopted for ns, kernels in a.get("namespace_kernels", {}).items()}
    widths = t.widths([r for op_rows in (*rows.values(), *untied.values()) for r in op_rows])
    for a in adopted:
        t.line(_adoption_line(a), wrap="      ")
        for op in a["ops"]:
            if op["schema"]:
                t.line(f"    {op['name']}{op['schema']}  [{op['where']}]", wrap="        ")
            elif op["where"]:
                t.line(f"    {op['name']}  (schema from its type hints: custom_op)  "
                       f"[{op['where']}]", wrap="        ")
            else:
                t.line(f"    {op['name']}  (defined where the scan cannot read it: a stripped "
                       f"C++ library, a computed name; schema unknown)", wrap="        ")
            t.table(rows[(a["distribution"]["name"], op["name"])], indent="        ",
                    widths=widths)
        for ns in a.get("namespace_kernels", {}):
            t.line(f"    kernels of {ns} the scan could not tie to one op (they may apply to "
                   f"any of its ops; none is known to)", wrap="        ")
            t.table(untied[(a["distribution"]["name"], ns)], indent="        ", widths=widths)


def _owner_text(owner: dict[str, Any] | None) -> str:
    """``bitsandbytes==0.50.2``, ``torch``, or ``?``: who registered an op or kernel."""
    if owner is None:
        return "?"
    if owner["how"] == "torch":
        return "torch"
    return f"{owner['name']}=={owner['version']}" if owner["version"] else owner["name"]


def _live_note(row: dict[str, Any]) -> str:
    if not row["declared"]:
        return f"registered outside opregistry, by {_owner_text(row['defined_by'])}"
    if not row["in_dispatcher"]:
        return "declared, but NOT in the dispatcher (see opregistry doctor --live)"
    missing = sorted(set(row["declared_keys"]) - set(row["dispatcher_keys"]))
    extra = sorted(key for key in set(row["dispatcher_keys"]) - set(row["declared_keys"])
                   if (row["kernels_by"].get(key) or {}).get("how") != "opregistry")
    notes = []
    if missing:
        notes.append(f"declared but not registered: {', '.join(missing)}")
    if extra:
        notes.append("registered outside opregistry: " + ", ".join(
            f"{key} (by {_owner_text(row['kernels_by'].get(key))})" for key in extra))
    return "; ".join(notes) or "matches"


def _print_live(live: dict[str, list[dict[str, Any]]], t: Text,
                not_imported: dict[str, list[str]] | None = None) -> None:
    t.line("\nLive dispatcher (torch) vs declared (opregistry)")
    header = ("OP", "DEFINED BY", "DECLARED KEYS", "DISPATCHER KEYS", "NOTE")
    rows = {ns: [(r["op"], _owner_text(r["defined_by"]) if r["in_dispatcher"] else "-",
                  ",".join(r["declared_keys"]) or "-",
                  ",".join(sorted(r["dispatcher_keys"])) or "-", _live_note(r)) for r in rs]
            for ns, rs in live.items()}
    widths = t.widths([r for rs in rows.values() for r in rs], header)
    for namespace, ns_rows in rows.items():
        t.line(f"  namespace {namespace}")
        if not_imported and namespace in not_imported and not ns_rows:
            t.line(f"      (no ops in the dispatcher: "
                   f"{_not_imported_note(namespace, not_imported[namespace])})")
            continue
        t.table(ns_rows, indent="      ", header=header, widths=widths,
                empty="(no ops in the dispatcher, none declared)")


def _whole_listing(args: argparse.Namespace, t: Text) -> bool:
    """Whether this is the listing of everything as JSON for a program (not a terminal)."""
    return (args.json and not args.live and not (args.namespace or args.backend or args.status)
            and not _isatty(t.out))


def _kept_listing(args: argparse.Namespace, t: Text) -> int | None:
    """``list --json`` printed from the listing kept of this environment's cached plan.

    The listing is a function of the plan alone: when the cached plan is the
    one this command would use, its listing is printed as it was made (no
    plan decoded, no listing built).  ``None`` when there is none.
    """
    if not _whole_listing(args, t):
        return None
    from .plancache import listing
    from .registry import cached_plan_id

    entry = cached_plan_id()
    found = listing(entry, "list --json") if entry is not None else None
    if found is None:
        return None
    t.out.write(found[0])
    return EXIT_PROBLEMS if found[1] else EXIT_OK


def cmd_list(args: argparse.Namespace, t: Text) -> int:
    kept = _kept_listing(args, t)
    if kept is not None:
        return kept
    # --live compares with the plan the loaded registry was resolved to: a plan
    # made now would count opregistry's own namespaces, grown by fragments
    # registered outside it since, as held by torch.
    resolved = _live_registry(args.imports).plan if args.live else _plan()
    data = report.list_report(resolved, namespaces=args.namespace or (),
                              backends=args.backend or (), statuses=args.status or ())
    if args.live:
        from .attribution import Attributor

        attributor = Attributor(resolved)
        data["live"] = {ns: report.live_namespace(ns, resolved, attributor)
                        for ns in report.live_namespaces(resolved, args.namespace or ())}
        # adopted lazily and not imported here: the dispatcher has none of their ops yet
        data["live_not_imported"] = report.not_imported(resolved, data["live"])
    if args.json:
        _dump(data, t.out)
        _keep_listing(args, t, data, bool(resolved.errors))
    else:
        _print_list(data, t)
        if args.live:
            _print_live(data["live"], t, data["live_not_imported"])
    return EXIT_PROBLEMS if resolved.errors else EXIT_OK


def _keep_listing(args: argparse.Namespace, t: Text, data: Any, errors: bool) -> None:
    """Keep the listing of a plan that came from the cache as it is, for the next command."""
    from .plancache import store_listing
    from .state import process

    entry = process().plan_entry
    if entry is not None and _whole_listing(args, t):
        store_listing(entry, "list --json", json.dumps(data, default=str) + "\n", errors)


# -- show ------------------------------------------------------------------------------


def _print_show(data: dict[str, Any], t: Text) -> None:
    name = data["name"]
    t.line(data["schema"].replace(name.split("::")[1], name, 1), wrap="    ")
    origin = data["origin"]
    where = _dist(origin) + (f" (entry point '{origin['entry_point']}' in {origin['group']})"
                             if origin and origin["entry_point"] else "")
    rows: list[Sequence[Any]] = [
        ("distribution:", where),
        ("defined at:", data["source"] or "-"),
        ("overloads:", ", ".join(data["overloads"])),
        ("mutates:", ", ".join(data["mutates_args"]) or "nothing (functional)"),
        ("tags:", ", ".join(data["tags"]) or "-"),
    ]
    if data["doc"]:
        rows.append(("doc:", data["doc"]))
    for feature, info in data["features"].items():
        rows.append((f"{feature}:", "no" if info is None else
                     f"yes, {info['status']} ({info['kernel']} from {_dist(info['distribution'])})"))
    rows.append(("samples:", data["samples"] or "none declared (opregistry check skips it)"))
    t.table(rows)
    t.line("\nKernels")
    t.table([(k["key"], k["kind"] or "-", k["status"], k["kernel"] or "-",
              _dist(k["distribution"]), k["backend"] or "-", _kernel_note(k))
             for k in data["kernels"]],
            header=("KEY", "KIND", "STATUS", "KERNEL", "DISTRIBUTION", "BACKEND", "NOTE"),
            empty="(none)")
    if "steps" in data:
        t.line("\nRegistration steps (in the order opregistry makes them)")
        t.table([(s["action"], s["key"] or "-", s["kind"] or "-", s["what"] or "-",
                  s["backend"] or "-", s["distribution"]) for s in data["steps"]],
                header=("STEP", "KEY", "KIND", "WHAT", "BACKEND", "DISTRIBUTION"), empty="(none)")
    _print_problems(data["problems"], t)
    live = data.get("live")
    if live is not None:
        t.line("\nLive dispatcher (torch)")
        if not live["in_dispatcher"]:
            t.line("  not in the dispatcher (see opregistry doctor --live)")
            return
        t.line(f"  schema: {live['dispatcher_schema']}", wrap="    ")
        t.table([(key, where, "yes" if key in live["declared_keys"] else "no")
                 for key, where in sorted(live["dispatcher_keys"].items())],
                header=("KEY", "REGISTERED AT", "DECLARED"))
        t.line(f"  {_live_note(live)}")


def _show_live_ops(rows: list[dict[str, Any]], args: argparse.Namespace, t: Text) -> int:
    """``show --live`` of ops registered outside opregistry: schema, kernels, who registered them."""
    if args.json:
        _dump({"format_version": report.FORMAT_VERSION, "ops": [], "external_kernels": [],
               "live_ops": rows}, t.out)
        return EXIT_OK
    for i, row in enumerate(rows):
        if i:
            t.line()
        t.line(row["dispatcher_schema"] or row["op"], wrap="    ")
        owner = row["defined_by"]
        t.table([("registered by:", _owner_text(owner) + (f" (at {owner['site']})"
                                                          if owner and owner["site"] else "")),
                 ("declared:", "no: registered with torch.library outside opregistry")])
        t.line("\nKernels (live dispatcher)")
        _live_kernels(row, t)
    return EXIT_OK


def _live_kernels(row: dict[str, Any], t: Text) -> None:
    """The dispatcher's kernels of a live op (:func:`report.live_ops`), with who registered each."""
    t.table([(key, _owner_text(row["kernels_by"].get(key)),
              (row["kernels_by"].get(key) or {}).get("site") or where)
             for key, where in sorted(row["dispatcher_keys"].items())],
            header=("KEY", "REGISTERED BY", "REGISTERED AT"), empty="(none)")


def _not_imported_note(namespace: str, modules: list[str]) -> str:
    """What ``--live`` says of a namespace adopted lazily that this process did not import."""
    return (f"adopted lazily, not imported in this process: pass --import {modules[0]} "
            f"(or touch torch.ops.{namespace})")


def _show_adopted_ops(plan: Plan, rows: list[dict[str, Any]], args: argparse.Namespace,
                      t: Text, not_imported: dict[str, list[str]] | None = None,
                      live: list[dict[str, Any]] | None = None) -> int:
    """``show`` of an adopted package's op: where it is defined, how it loads, its kernels
    (and those op packages add to it, and those of its namespace the scan could not tie to
    one op); ``not_imported``: with ``--live``, its namespaces the process did not import,
    so that the dispatcher holds none of their ops; ``live``: with ``--live``, the
    dispatcher's view of those it did (:func:`report.live_ops`)."""
    namespaces = sorted({op["name"].split("::")[0] for row in rows for op in row["ops"]})
    touch = {ns: report.first_touch(plan, ns) for ns in namespaces}
    untied = report.namespace_kernels(plan, namespaces)
    if args.json:
        data = {"format_version": report.FORMAT_VERSION, "ops": [],
                "external_kernels": [k for row in rows for op in row["ops"]
                                     for k in op["kernels_added"]], "adopted": rows,
                "first_touch": touch, "namespace_kernels": untied}
        if not_imported is not None:
            data["live_not_imported"] = not_imported
        if live:
            data["live_ops"] = live
        _dump(data, t.out)
        return EXIT_OK
    live_by_op = {row["op"].split(".")[0]: row for row in live or ()}
    first = True
    for row in rows:
        for op in row["ops"]:
            if not first:
                t.line()
            first = False
            ns = op["name"].split("::")[0]
            _print_adopted_op(row, op, touch[ns], untied.get(ns, []), t)
            if not_imported and ns in not_imported:
                t.line("\nLive dispatcher (torch)")
                t.line(f"  none of its ops: {_not_imported_note(ns, not_imported[ns])}")
            elif op["name"].split(".")[0] in live_by_op:
                found = live_by_op[op["name"].split(".")[0]]
                owner = found["defined_by"]
                t.line("\nLive dispatcher (torch)")
                t.table([("registered by:", _owner_text(owner) + (
                    f" (at {owner['site']})" if owner and owner["site"] else ""))])
                _live_kernels(found, t)
    return EXIT_OK


def _first_touch_text(ns: str, touch: list[dict[str, Any]]) -> str:
    """What the first touch of ``torch.ops.<ns>`` imports: every adopted distribution's
    modules for it, in import order (each with its distribution when there are several)."""
    if len(touch) <= 1:
        modules = ", ".join(touch[0]["modules"]) if touch else "(nothing known)"
        return f"the first touch of torch.ops.{ns} imports {modules}"
    return f"the first touch of torch.ops.{ns} imports " + ", then ".join(
        f"{', '.join(entry['modules'])} ({_dist(entry['distribution'])})" for entry in touch)


def _print_adopted_op(row: dict[str, Any], op: dict[str, Any], touch: list[dict[str, Any]],
                      untied: list[dict[str, Any]], t: Text) -> None:
    """One adopted op, as ``show`` prints it (read from its package's files)."""
    dist = f"{row['distribution']['name']}=={row['distribution']['version']}"
    ns = op["name"].split("::")[0]
    schema = (op["name"] + op["schema"][op["schema"].index("("):]
              if op["schema"] and "(" in op["schema"] else op["name"])
    t.line(schema, wrap="    ")
    loads = (_first_touch_text(ns, touch) if row["load"] == "lazy"
             else "imported when the registry loads")
    t.table([("adopted:", f"{dist}, {row['status']} ({row['reason']})"),
             ("defined at:", (f"{op['where']} ({op['api']})"
                              + ("; under a condition" if op["conditional"] else ""))
              if op["where"] else "not read: a stripped C++ library, or a computed "
                                  "name; its kernels name it"),
             ("loads:", loads if row["status"] == "adopted" else "not imported"),
             ("declared:", "no: registered with torch.library by its package; "
                           "read from its files")])
    t.line("\nKernels (read from the package's files)")
    t.table([(k["key"], k["status"], k["where"], "; ".join(
        filter(None, (k["api"], _overridden_note(k))))) for k in op["kernels"]],
        header=("KEY", "STATUS", "REGISTERED AT", "HOW"), empty="(none)")
    if untied:
        t.line(f"\nKernels of {ns} the scan could not tie to one op (they may apply to it; "
               f"none is known to)")
        t.table([(k["key"], k["where"], _dist(k["distribution"]), k["why"]) for k in untied],
                header=("KEY", "REGISTERED AT", "DISTRIBUTION", "WHY"))
    if op["kernels_added"]:
        t.line("\nKernels op packages add (allowed by OPREGISTRY_ALLOW_OVERRIDE)")
        t.table([(k["key"], k["status"], k["kernel"], _dist(k["distribution"]),
                  _kernel_note(k)) for k in op["kernels_added"]],
                header=("KEY", "STATUS", "KERNEL", "DISTRIBUTION", "NOTE"))


def cmd_show(args: argparse.Namespace, t: Text) -> int:
    resolved = _live_registry(args.imports).plan if args.live else _plan()
    match = report.find_op(resolved, args.op)
    # registered with torch.library directly, by a package opregistry sees
    found = report.live_ops(resolved, args.op) \
        if match.kind in ("unknown", "left-out") and args.live else []
    if match.kind == "adopted":
        # registered by an adopted package at its import (op packages may add kernels to
        # it, under policy): what its files say, and with --live what the dispatcher holds
        adopted = report.adopted_op_rows(resolved, args.op)
        if args.live:
            found = list({row["op"]: row for name in match.candidates
                          for row in report.live_ops(resolved, name)}.values())
        waiting = report.not_imported(resolved, {op["name"].split("::")[0]
                                                 for row in adopted for op in row["ops"]})
        return _show_adopted_ops(resolved, adopted, args, t, waiting if args.live else None,
                                 found)
    if found:
        return _show_live_ops(found, args, t)
    if match.kind not in ("ops", "external"):
        return _explain_match("show", match)
    data = report.show_report(resolved, args.op, steps=args.steps)
    if args.live and data["ops"]:
        namespace = data["ops"][0]["name"].split("::")[0]
        live = {row["op"]: row for row in report.live_namespace(namespace, resolved)}
        for d in data["ops"]:
            d["live"] = live.get(d["name"])
    if args.json:
        _dump(data, t.out)
    elif data["external_kernels"]:
        # a torch op (aten::add.Tensor) that installed packages add kernels to, under policy
        t.line(f"{match.name}  [defined by torch; kernels added under OPREGISTRY_ALLOW_OVERRIDE]")
        t.table([(k["key"], k["status"], k["kernel"], _dist(k["distribution"]), _kernel_note(k))
                 for k in data["external_kernels"]],
                header=("KEY", "STATUS", "KERNEL", "DISTRIBUTION", "NOTE"))
    else:
        for i, d in enumerate(data["ops"]):
            if i:
                t.line()
            _print_show(d, t)
    errors = any(p["severity"] == "error" for d in data["ops"] for p in d["problems"])
    return EXIT_PROBLEMS if errors else EXIT_OK


# -- plugins ---------------------------------------------------------------------------


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


def cmd_plugins(args: argparse.Namespace, t: Text) -> int:
    from .discovery import BACKENDS_GROUP, OPS_GROUP

    data = report.plugins_report(_plan())
    rows = data["plugins"]
    if args.json:
        _dump(data, t.out)
    else:
        header = ("DISTRIBUTION", "VERSION", "ENTRY POINT", "STATUS", "CONTRIBUTES / REASON")
        cells = [(r["distribution"]["name"], r["distribution"]["version"],
                  r["distribution"]["entry_point"], r["status"], _contribution(r)) for r in rows]
        widths = t.widths(cells, header)
        for group, title in ((BACKENDS_GROUP, "Backends"), (OPS_GROUP, "Op packages")):
            t.line(f"{title} (entry-point group {group})")
            t.table([c for c, r in zip(cells, rows) if r["distribution"]["group"] == group],
                    header=header, widths=widths, empty="(none)")
            t.line()
    bad = any(r["status"] in ("failed", "left out") for r in rows)
    return EXIT_PROBLEMS if bad else EXIT_OK


# -- doctor ----------------------------------------------------------------------------


def _cache_drift() -> tuple[Any, ...]:
    """The declarations read again, compared with the plan cache's (``cache-declarations-differ``)."""
    from .registry import check_cache

    return check_cache()


def cmd_doctor(args: argparse.Namespace, t: Text) -> int:
    if args.live:
        registry = _live_registry(args.imports)
        # and every planned kernel torch no longer dispatches to
        plan, problems = registry.plan, registry.problems + registry.drift()
    else:
        plan = _plan(references=True)
        problems = plan.problems + _cache_drift()
    data = report.doctor_report(plan, problems, include_info=args.all, live=bool(args.live))
    summary, findings = data["summary"], data["problems"]
    status = EXIT_PROBLEMS if summary["errors"] else EXIT_OK
    if args.json:
        _dump(data, t.out)
        return status
    t.line(f"opregistry doctor: {summary['errors']} error(s), {summary['warnings']} "
           f"warning(s) in {summary['distributions']} distribution(s), {summary['ops']} op(s)")
    order = {"error": 0, "warning": 1, "info": 2}
    for f in sorted(findings, key=lambda f: order.get(f["severity"], 3)):
        t.line()
        severity = t.paint(f"{f['severity'].upper():7}")
        # bounded: a 100,000-character schema must not give pages of text (--json is whole)
        t.line(f"{severity} [{f['code']}] {elide(f['message'])}", wrap="        ")
        if f["source"]:
            t.line(f"        at: {f['source']}")
        if f["distributions"]:
            t.line(f"        distribution(s): {', '.join(map(_dist, f['distributions']))}",
                   wrap="          ")
        if f["hint"]:
            t.line(f"        fix: {elide(f['hint'])}", wrap="          ")
    if not findings:
        t.line("No problems found.")
    if not args.live:
        t.line()
        t.line("Not checked without torch: namespaces and kernels held by torch outside "
               "opregistry (C++ TORCH_LIBRARY), and registration itself (what kernel modules "
               "and native libraries do when they are imported or loaded; references are "
               "checked statically). Run 'opregistry doctor --live' for those.", wrap="")
    return status


# -- check -----------------------------------------------------------------------------


#: A check's mark in the table; over several samples the worst shows.
_MARKS = {"skip": "skip", "ok": "ok", "fail": "FAIL"}
_WORST = list(_MARKS)


def _print_check(results: list[Any], t: Text) -> None:
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
    t.table(table, header=("OP", "DEVICE", *(c.replace("test_", "") for c in columns)))
    notes = [r for r in results if r.status == "fail"]
    if notes:
        t.line("\nFailures")
        for r in notes:
            sample = f", sample {r.sample}" if r.sample is not None else ""
            t.line(f"  {r.op} on {r.device}{sample}: {r.check} failed: {r.message}",
                   wrap="      ")
            if r.distribution:
                t.line(f"      from {r.distribution}")


class _Progress:
    """``check``'s progress on stderr: one line redrawn in place on a terminal, else nothing."""

    def __init__(self, stream: TextIO, quiet: bool) -> None:
        self.stream = stream
        self.on = not quiet and _isatty(stream)
        self.drawn = False

    def __call__(self, text: str) -> None:
        if not self.on:
            return
        import shutil

        width = shutil.get_terminal_size().columns - 1
        self.stream.write("\r" + text[:width] + "\x1b[K")
        self.stream.flush()
        self.drawn = True

    def done(self) -> None:
        if self.drawn:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


def _adopted_target(plan: Plan, text: str) -> str | None:
    """``text`` as a ``check`` target naming adopted ops (a namespace, ``ns::op[.overload]``,
    or as Python spells it, ``torch.ops.ns.op``), or ``None`` when it names none."""
    from .checking import adopted_names, names_adopted

    forms = [text] + [f"{ns}::{name}" + (f".{overload}" if overload else "")
                      for ns, name, overload in report._spellings(text) if ns]
    for form in forms:
        if any(names_adopted(form, op) for a in plan.adoptions for op in adopted_names(a)):
            return form
    return None


def cmd_check(args: argparse.Namespace, t: Text) -> int:
    from .checking import run_checks

    registry = _live_registry(args.imports)
    targets = []
    for target in args.targets:
        match = report.find_target(registry.plan, target)
        adopted = _adopted_target(registry.plan, target)
        if match.kind == "namespace":
            targets.append(target)
        elif match.kind == "ops":
            targets += [op.op.qualname for op in match.ops]
        elif adopted is not None:
            targets.append(adopted)  # an adopted op or namespace: skipped without samples
        else:
            return _explain_match("check", match)
    progress = _Progress(sys.stderr, args.quiet)
    try:
        results, unknown = run_checks(registry, targets, devices=args.device, progress=progress)
    finally:
        progress.done()
    if unknown:  # resolved above; kept as a guard should checking select otherwise
        return _usage_error("check", f"no op or namespace {', '.join(unknown)} in the "
                            f"registry; see 'opregistry list'")
    data = report.check_report(registry.plan, results, everything=not args.targets)
    if args.json:
        _dump(data, t.out)
        return EXIT_OK if data["ok"] else EXIT_PROBLEMS
    if not results:
        t.line("no ops to check")
    else:
        _print_check(results, t)
        failed = {r.op for r in results if r.status == "fail"}
        skipped = {r.op for r in results} - {r.op for r in results if r.status != "skip"}
        ops = {r.op for r in results}
        if skipped == ops:  # none had anything to run: nothing passed
            t.line(f"\nnothing checked: {len(ops)} op(s) skipped, see the table")
        else:
            t.line(f"\n{len(ops)} op(s) checked: "
                   + (f"{len(failed)} {t.paint('FAILED')}" if failed else "all passed")
                   + (f" ({len(skipped)} skipped, see the table)" if skipped else ""))
    if data["excluded"] and not args.targets:
        names = ", ".join(f"{e['distribution']['name']} [{', '.join(e['problems'])}]"
                          for e in data["excluded"])
        t.line(f"{len(data['excluded'])} distribution(s) left out, their ops not checked: "
               f"{names} (see 'opregistry doctor')", wrap="  ")
    return EXIT_OK if data["ok"] else EXIT_PROBLEMS


# -- lock / verify ---------------------------------------------------------------------


def cmd_lock(args: argparse.Namespace, t: Text) -> int:
    from .lockfile import not_covered, record_differences, write_lock

    resolved = _plan()
    if resolved.errors and not args.force:
        sys.stderr.write(f"opregistry lock: the registry has {len(resolved.errors)} error(s); "
                         f"nothing written. See 'opregistry doctor', or lock what resolves "
                         f"anyway with --force.\n")
        return EXIT_PROBLEMS
    try:
        data = write_lock(resolved, t.out if args.output == "-" else args.output)
    except OSError as exc:
        return _usage_error("lock", f"cannot write {args.output}: {exc.strerror or exc}")
    if args.output != "-":
        t.line(f"wrote {args.output}: {data['fingerprint']} (torch {data['torch']}, "
               f"{len(data['distributions'])} distributions, {len(data['ops'])} ops)")
    _print_not_covered(not_covered(data), "opregistry lock")
    differences = record_differences(data)
    if differences:  # stderr: stdout may be the lockfile
        sys.stderr.write("opregistry lock: files that differ from their wheel's RECORD (locked as "
                         "they are on disk; review them: edited after install, or a wrong RECORD "
                         "in the wheel):\n" + "".join(f"  - {line}\n" for line in differences))
    return EXIT_OK


def _print_not_covered(missing: list[str], command: str) -> None:
    """Name every file the lock cannot prove, on stderr (stdout may be the lockfile)."""
    if missing:
        sys.stderr.write(f"{command}: files not covered (their content is not in the lock, so "
                         f"a change to them goes unnoticed):\n"
                         + "".join(f"  - {line}\n" for line in missing))


def cmd_verify(args: argparse.Namespace, t: Text) -> int:
    from .errors import LockMismatchError
    from .lockfile import verify_plan

    uncovered: list[str] = []
    try:
        # this process's plan, not a registry loaded earlier in it (tests call main())
        current = verify_plan(args.lockfile, _plan(), uncovered=uncovered)
    except LockMismatchError as exc:
        if args.json:
            _dump(report.verify_report(args.lockfile, differences=exc.differences,
                                       error=exc.message, not_covered=uncovered), t.out)
        else:
            sys.stderr.write(f"opregistry verify: {exc.message}\n")
            _print_not_covered(uncovered, "opregistry verify")
        return EXIT_PROBLEMS
    if args.json:
        _dump(report.verify_report(args.lockfile, fingerprint=current, not_covered=uncovered),
              t.out)
    else:
        t.line(f"{args.lockfile}: OK, this environment resolves the locked registry ({current})")
        _print_not_covered(uncovered, "opregistry verify")
    return EXIT_OK


# -- help / completion -----------------------------------------------------------------


def cmd_help(args: argparse.Namespace, t: Text) -> int:
    from . import helptopics as topics

    if args.topic is None:
        t.line("Topics (opregistry help TOPIC; commands: opregistry COMMAND --help):")
        t.table([(name, topics.summary(name)) for name in topics.names()])
        t.line(f"\nThe whole documentation: {DOCS_URL}")
        return EXIT_OK
    if args.topic in _COMMANDS:
        try:
            build_parser().parse_args([args.topic, "--help"])
        except SystemExit:  # argparse's --help prints, then exits 0
            return EXIT_OK
    if args.topic not in topics.names():
        import difflib

        close = difflib.get_close_matches(args.topic, [*topics.names(), *_COMMANDS], n=2)
        return _usage_error("help", f"no topic {args.topic!r};{_did_you_mean(close)} "
                            f"'opregistry help' lists them")
    t.out.write(topics.text(args.topic))
    t.line(f"\n(from {DOCS_URL}{topics.page(args.topic)})")
    return EXIT_OK


def cmd_completion(args: argparse.Namespace, t: Text) -> int:
    from . import completion

    if args.names:  # what the scripts ask for op names: no torch, read declarations
        for name in completion.op_names(_plan()):
            t.out.write(name + "\n")
        return EXIT_OK
    if args.shell is None:
        return _usage_error("completion", "name a shell: bash, zsh or fish")
    t.out.write(completion.script(args.shell, build_parser()))
    return EXIT_OK


# -- cache -----------------------------------------------------------------------------


def cmd_cache(args: argparse.Namespace, t: Text) -> int:
    from .plancache import clear, clear_scan

    if args.action == "clear":
        failed: list[str] = []
        folder, removed = clear(failed=failed)
        scan_folder, scan_removed = clear_scan(failed=failed)
        if failed:  # stderr, whether or not --json: the cache is still there
            sys.stderr.write("opregistry cache clear: could not remove (the cache stays as it "
                             "was; check the folder's permissions, or OPREGISTRY_CACHE_DIR):\n"
                             + "".join(f"  - {line}\n" for line in failed))
        if args.json:
            _dump({"format_version": report.FORMAT_VERSION, "directory": folder,
                   "removed": removed, "failed": failed,
                   "scan": {"directory": scan_folder, "removed": scan_removed}}, t.out)
        else:
            t.line(f"removed {removed} plan cache entr{'y' if removed == 1 else 'ies'}"
                   + (f" from {folder}" if folder else " (the cache is off)"))
            if scan_folder:
                t.line(f"removed {scan_removed} scan cache entr"
                       f"{'y' if scan_removed == 1 else 'ies'} from {scan_folder} (the next "
                       f"start scans the installed distributions again)")
        return EXIT_PROBLEMS if failed else EXIT_OK
    data = report.cache_report()
    if args.json:
        _dump(data, t.out)
        return EXIT_OK
    folder = data["directory"] or "off (OPREGISTRY_CACHE=0, or no home directory)"
    t.line(f"plan cache: {folder}")
    t.line(f"  entries: {data['entries']} ({data['bytes']:,} bytes)")
    t.line(f"  inputs checked by: {'content' if data['check'] == 'content' else 'size and time'}")
    for what, status in data["this_environment"].items():
        detail = {"valid": lambda s: f"valid ({s['ops']} ops, {s['distributions']} "
                                     f"distributions" + ("; registers nothing at import torch: "
                                     "loaded when asked for, or when an adopted namespace is "
                                     "touched" if s.get("registers_nothing") else "") + ")",
                  "stale": lambda s: f"stale ({s['changed']} changed)",
                  "uncacheable": lambda s: f"not cached: {s['reason']}"}.get(
            status["status"], lambda s: s["status"])(status)
        t.line(f"  {what}: {detail}", wrap="    ")
    scan = data.get("scan")
    if scan is not None and scan["directory"]:
        t.line(f"scan cache (what the installed distributions register, read from their "
               f"files): {scan['directory']}", wrap="  ")
        t.line(f"  entries: {scan['entries']} ({scan['bytes']:,} bytes; one per folder of "
               f"distributions)")
        check = "content" if scan["check"] == "content" else "size and time"
        t.line(f"  files checked by: {check}")
    return EXIT_OK


# -- parser ----------------------------------------------------------------------------

_COMMANDS = ("list", "show", "plugins", "doctor", "check", "lock", "verify", "cache", "help",
             "completion")


def _global_options(parser: argparse.ArgumentParser, *, sub: bool) -> None:
    """Options every command takes, before or after its name.

    On a subcommand they default to SUPPRESS, so that one given before the
    command is not reset by the subparser.
    """
    default = {"default": argparse.SUPPRESS} if sub else {}
    parser.add_argument("-v", "--verbose", action="count", help="log more (repeatable)",
                        **(default or {"default": 0}))
    parser.add_argument("--wide", action="store_true",
                        help="do not fit text to the terminal width", **default)


class _VersionAction(argparse.Action):
    """``--version``, computed when asked: reading the metadata costs every other command
    ~50 ms (importlib-metadata and the email parser), a quarter of ``opregistry list``."""

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        sys.stdout.write(_version() + "\n")
        parser.exit()


def _version() -> str:
    from importlib_metadata import PackageNotFoundError, version

    try:
        mine = version("opregistry")
    except PackageNotFoundError:  # running from a source tree
        mine = "unknown"
    return f"opregistry {mine} (python {sys.version.split()[0]})"


_NAMES_HELP = ("an op: NS::OP[.OVERLOAD], NS.OP, torch.ops.NS.OP, or OP alone when only "
               "one namespace has it")

#: ``add(name, func, help, description, json_help=...)``: adds one command's parser
_Add = Callable[..., argparse.ArgumentParser]


def _import_option(p: argparse.ArgumentParser, when: str) -> None:
    """``--import MODULE``: a package that registers with torch.library itself, imported first."""
    p.add_argument("--import", dest="imports", action="append", metavar="MODULE", default=[],
                   help=f"{when}import this module (a package that registers ops with "
                        f"torch.library itself, a C++ extension) before the registry is resolved, "
                        f"so that its ops are seen and attributed (repeatable)")


def _add_list_and_show(add: _Add) -> None:
    p = add("list", cmd_list,
            "backends, namespaces, ops and kernels, without importing torch",
            "Show the resolved registry: backends (distribution, version, device type, "
            "available), namespaces (owner, fragments), ops (schema, tags) and each op's kernels "
            "per dispatch key with their status (active, inactive with the package that would "
            "activate it, unavailable, overridden, conflict, native: C++; for kernel "
            "candidates unmet, unreached, and disabled by a kernel switch) and the "
            "distribution they came from. Does not import torch unless --live.")
    p.add_argument("-n", "--namespace", action="append", help="only this namespace (repeatable)")
    p.add_argument("-b", "--backend", action="append", help="only kernels of this backend")
    p.add_argument("-s", "--status", action="append", choices=STATUSES,
                   help="only kernels with this status")
    p.add_argument("--live", action="store_true",
                   help="also show what torch's dispatcher holds for each namespace, ops "
                   "registered outside opregistry included (imports torch)")
    _import_option(p, "with --live: ")
    p = add("show", cmd_show, "one op in full: schema, kernels, origins, samples",
            "Show one op: schema, overloads, mutated arguments, tags, each kernel with its "
            "origin (module:function and distribution), fake / autograd / vmap presence and "
            "the sample inputs declared for 'opregistry check'. Exit 2 if OP names no op, or "
            "ops of several namespaces (they are listed).")
    p.add_argument("op", metavar="OP", help=_NAMES_HELP)
    p.add_argument("--live", action="store_true",
                   help="also show the dispatcher's schema and kernels for it (imports torch)")
    _import_option(p, "with --live: ")
    p.add_argument("--steps", action="store_true",
                   help="also show the registration steps opregistry takes for it, in order "
                        "(define, each kernel with the backend that registers it)")


def _add_plugins_and_doctor(add: _Add) -> None:
    add("plugins", cmd_plugins,
        "discovered distributions, what each contributes, and those skipped",
        "List every distribution found in the entry-point groups opregistry.backends and "
        "opregistry.ops: version, entry point, what it contributes (with --json: the hooks it "
        "implements), and those skipped or left out (blocked, not allowed, failed to import, "
        "conflicting) with the reason. Exit 1 if any failed or was left out.")
    p = add("doctor", cmd_doctor, "every problem, with what to do",
            "Report every problem: conflicts, broken plugins, ops without a fake kernel "
            "(torch.compile / torch.export will fail on them), ops without an active kernel, "
            "kernels that override another distribution's or torch's own. Each with what to "
            "do. Exit 1 if there is an error. Without torch; --live also checks against "
            "torch's dispatcher.")
    p.add_argument("--live", action="store_true",
                   help="import torch and load the registry: also finds namespaces and kernels "
                   "held by torch outside opregistry (C++ TORCH_LIBRARY) and registration failures")
    _import_option(p, "with --live: ")
    p.add_argument("-a", "--all", action="store_true",
                   help="also show notes (e.g. ops without vmap)")


def _add_check(add: _Add) -> None:
    p = add("check", cmd_check, "run opcheck and gradcheck over every op's sample inputs",
            "Load the registry into torch and run torch.library.opcheck (test_schema, "
            "test_autograd_registration, test_faketensor, test_aot_dispatch_dynamic) over each "
            "op's sample inputs on every available device with an active kernel, and "
            "torch.autograd.gradcheck where an Autograd kernel is active. A table goes to "
            "stdout; progress is redrawn on stderr when it is a terminal. Exit 1 on any "
            "failure, 2 if a target names nothing. Imports torch.")
    p.add_argument("targets", nargs="*", metavar="TARGET",
                   help="namespaces or ops to check, ops named as for 'show' (default: all)")
    p.add_argument("-d", "--device", action="append",
                   help="only this device type (repeatable; default: every available one)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    _import_option(p, "")


def _add_lock_and_verify(add: _Add) -> None:
    p = add("lock", cmd_lock, "write a lockfile of the resolved registry",
            "Write the resolved registry (torch version, distributions and versions, backends, "
            "namespaces, ops and schemas, kernel origins and status) with its sha256 "
            "fingerprint as JSON. Refuses when the registry has errors, unless --force. Does "
            "not import torch.", json_help=None)
    p.add_argument("-o", "--output", default=DEFAULT_LOCKFILE, metavar="FILE",
                   help=f"where to write it; '-' for stdout (default: {DEFAULT_LOCKFILE})")
    p.add_argument("--force", action="store_true", help="lock even if the registry has errors")
    p = add("verify", cmd_verify, "compare this environment with a lockfile",
            "Check that this environment resolves the registry recorded in LOCKFILE, and "
            "explain every difference (other torch version, missing distribution, other "
            "version, other schema, other kernel origin). Exit 1 on any difference. Does not "
            "import torch. The Python equivalent is opregistry.verify_lock(path).")
    p.add_argument("lockfile", nargs="?", default=DEFAULT_LOCKFILE, metavar="LOCKFILE",
                   help=f"the lockfile (default: {DEFAULT_LOCKFILE})")


def _add_cache(add: _Add) -> None:
    p = add("cache", cmd_cache, "the plan cache: where it is and what it holds, or clear it",
            "The resolved plan is cached on disk and reused at import torch and by the "
            "commands while none of its inputs changed (installed distributions, sys.path, "
            "the op and backend packages' files, OPREGISTRY_* variables, the configuration "
            "file, Python). 'info' shows the directory (OPREGISTRY_CACHE_DIR, else the "
            "platform's cache directory), its entries, and whether this environment's are "
            "valid, and the cache of the static scan of the installed distributions (what "
            "the packages that register with torch by themselves register); 'clear' removes "
            "every entry of both. OPREGISTRY_CACHE=0 turns them off. Does not import torch.")
    p.add_argument("action", choices=("info", "clear"), metavar="ACTION",
                   help="info or clear")


def _add_help_and_completion(add: _Add) -> None:
    p = add("help", cmd_help, "a help topic, from the documentation",
            "Print a help topic (a section of the documentation, shipped with opregistry), "
            "or list the topics. 'opregistry help COMMAND' is 'opregistry COMMAND --help'.",
            json_help=None)
    p.add_argument("topic", nargs="?", metavar="TOPIC", help="the topic (default: list them)")
    p = add("completion", cmd_completion, "a shell completion script",
            "Print the completion script for SHELL. bash: add 'eval \"$(opregistry completion "
            "bash)\"' to ~/.bashrc; zsh: the same line in ~/.zshrc; fish: 'opregistry "
            "completion fish | source' in ~/.config/fish/config.fish.", json_help=None)
    p.add_argument("shell", nargs="?", choices=("bash", "zsh", "fish"), metavar="SHELL",
                   help="bash, zsh or fish")
    p.add_argument("--names", action="store_true", help=argparse.SUPPRESS)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``opregistry`` command (its --help is docs/cli.md)."""
    parser = argparse.ArgumentParser(
        prog="opregistry",
        description="See and check the PyTorch custom operators that installed packages "
        "contribute through opregistry.",
        epilog="Exit status: 0 healthy, 1 problems found, 2 usage error. list, show, plugins, "
        "doctor, lock and verify do not import torch; check and --live do. "
        "OPREGISTRY_PLUGINS / OPREGISTRY_BLOCK scope every command. "
        f"Topics: opregistry help. Documentation: {DOCS_URL}",
    )
    parser.add_argument("--version", action=_VersionAction, nargs=0,
                        help="show opregistry's and python's version and exit")
    _global_options(parser, sub=False)
    common = argparse.ArgumentParser(add_help=False)
    _global_options(common, sub=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    def add(name: str, func: Callable[..., int], help: str, description: str,
            json_help: str | None = "machine-readable output") -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=description, parents=[common])
        if json_help:
            p.add_argument("--json", action="store_true", help=json_help)
        p.set_defaults(func=func)
        return p

    for adding in (_add_list_and_show, _add_plugins_and_doctor, _add_check,
                   _add_lock_and_verify, _add_cache, _add_help_and_completion):
        adding(add)
    return parser


def _mistyped_command(argv: Sequence[str]) -> str | None:
    """The message for an unknown command, with what was probably meant."""
    words = [a for a in argv if not a.startswith("-")]
    if not words or words[0] in _COMMANDS or any(a in ("-h", "--help", "--version")
                                                  for a in argv[:argv.index(words[0])]):
        return None
    import difflib

    close = difflib.get_close_matches(words[0], _COMMANDS, n=2)
    return (f"opregistry: unknown command {words[0]!r};{_did_you_mean(close)} "
            f"commands: {', '.join(_COMMANDS)}\n")


def _doctor_config_invalid(exc: ConfigError, args: argparse.Namespace, t: Text) -> int:
    """``doctor`` with an invalid configuration: that is its one error problem."""
    from .model import Problem
    from .plans import Plan

    problem = Problem(code="config-invalid", message=str(exc),
                      hint="fix the variable or the file named here, or unset it")
    data = report.doctor_report(Plan(), (problem,), live=bool(args.live))
    if args.json:
        _dump(data, t.out)
    else:
        t.line(f"opregistry doctor: {data['summary']['errors']} error(s)")
        t.line("")
        t.line(f"ERROR   {problem.text()}")
    return EXIT_PROBLEMS


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    mistyped = _mistyped_command(argv)
    if mistyped:
        parser.print_usage(sys.stderr)
        sys.stderr.write(mistyped)
        return EXIT_USAGE
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version (0) or argparse's usage error (2)
        return int(exc.code or 0)
    except BrokenPipeError:  # `opregistry --help | head -1`, unbuffered
        return _reader_gone()
    _configure_logging(args.verbose)
    out = Text(sys.stdout, _width(args, sys.stdout), _color(sys.stdout))
    enabled = gc.isenabled()
    if args.command != "check" and not getattr(args, "live", False):
        # a command that does not import torch makes no garbage cycles worth collecting:
        # the collector's passes over its records would only cost time
        gc.disable()
    try:
        return _run(args, out)
    finally:
        if enabled:
            gc.enable()


def run() -> None:
    """The ``opregistry`` command (its console script, ``python -m opregistry``): :func:`main`
    on ``sys.argv``, then the process exits with its status.

    When the command did not import torch and no other thread runs, the
    process ends without the interpreter's teardown (every module and
    object freed one by one: 17 ms of a 170 ms ``list --json`` of 1,000
    ops): the exit handlers run (``atexit``: logging's flush, coverage's, a
    plugin's own), the standard streams are flushed, then ``os._exit``.
    Otherwise it exits as any program does.
    """
    status = main()
    if _may_end_now():
        _end_now(status)
    sys.exit(status)


def _may_end_now() -> bool:
    """Whether this process may end without the interpreter's teardown: torch not
    imported (its own exit handlers and threads are torch's business), no thread but
    this one that the interpreter would wait for, and atexit's handlers can be run."""
    if "torch" in sys.modules or not hasattr(atexit, "_run_exitfuncs"):
        return False
    threading = sys.modules.get("threading")
    return threading is None or not any(
        t is not threading.current_thread() and not t.daemon and t.is_alive()
        for t in threading.enumerate())


def _end_now(status: int) -> None:
    """Run the exit handlers, flush the standard streams, and end the process with ``status``."""
    atexit._run_exitfuncs()  # what the interpreter's exit runs first; it forgets them after
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except BrokenPipeError:  # the reader of `opregistry list | head` has gone
            with contextlib.suppress(OSError):
                _to_devnull(stream)
        except (OSError, ValueError):  # closed, or no file behind it: nothing to flush
            pass
    os._exit(status)


def _reader_gone() -> int:
    """`opregistry list | head` closed the pipe: not an error of ours.  Point stdout at
    devnull so the final flush does not raise again; status 0."""
    _to_devnull(sys.stdout)
    return 0


def _to_devnull(stream: TextIO) -> None:
    """Point ``stream``'s file descriptor at the null device."""
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, stream.fileno())
    finally:
        os.close(null)


def _run(args: argparse.Namespace, out: Text) -> int:
    """Run the parsed command, turning the errors every command can meet into a status."""
    try:
        return int(args.func(args, out) or 0)
    except ConfigError as exc:
        # a bad variable or OPREGISTRY_CONFIG file: one line, no traceback, status 2;
        # doctor, whose job is to diagnose, reports it as its one error problem (status 1)
        if args.func is cmd_doctor:
            return _doctor_config_invalid(exc, args, out)
        sys.stderr.write(f"opregistry: {exc}\n")
        return EXIT_USAGE
    except BrokenPipeError:
        return _reader_gone()
    except KeyboardInterrupt:
        # a real Ctrl-C (one raised by plugin code is contained as its problem):
        # stop, as shells expect, without a traceback
        sys.stderr.write("opregistry: interrupted\n")
        return EXIT_INTERRUPTED


if __name__ == "__main__":  # pragma: no cover
    run()
