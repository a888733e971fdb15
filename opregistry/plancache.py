"""The plan cache: a resolved plan kept on disk and reused while none of its inputs changed.

At ``import torch`` (and in ``opregistry list``) the declarations of every
installed op package are discovered, collected and resolved; with a valid
entry here, none of that runs.  An entry (one JSON file per *slot*, see
:mod:`opregistry.inputs`) holds:

* the **manifest**: a stamp of every input file (:func:`inputs.check_manifest`);
* the **declarations** of every distribution, as data (:mod:`opregistry.codec`);
* the **environment** they were resolved in -- what the resolver read of the
  machine (:class:`~opregistry.environment.EnvironmentQuery` and its
  answers), and a digest of torch's dispatcher when torch was imported;
* the backends' part of the declarations, compared with the backends
  collected again at every load (their materialize hooks are needed anyway,
  and whether a backend is available is a condition of this process);
* the **plan**.

A load whose manifest holds imports the backends, collects them, reads the
environment again (conditions are never frozen: only what the declarations
ask about is read) and, when both equal the cached ones, uses the cached
plan; when only the environment or the backends' availability differ, it
resolves the cached declarations again (pure: no discovery, no collection).
Anything else is a miss: the registry is built as without a cache, and the
entry written again.

Declarations that cannot be data (:class:`~opregistry.codec.Uncacheable`: a
decorator-style op package's callables, a deferred distribution, a problem
with an exception) are not cached: the entry records why, and every load of
that slot builds the registry as without a cache.

Nothing here raises to its caller for a bad entry or directory: a miss is
logged at debug level and the registry is built.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import Any, Callable, Iterator, Mapping

import attrs

from . import inputs
from .codec import (Decoder, Encoder, Uncacheable, decode_query, encode_environment,
                    encode_query)
from .config import CONFIG_VAR, Settings
from .diskcache import DiskCache, Entry
from .errors import DOCS_URL, ConfigError
from .environment import Environment, TorchState, environment_query, read_query, run_check
from .idle import CHECK_VAR, FORMAT, NAME, content_check, marker_key, plan_cache
from .logs import get_logger
from .model import Declarations, Origin, Problem
from .plans import Plan
from .steps import Steps
from .program import VERSION as PROGRAM_VERSION
from .program import compile_program

__all__ = ["CHECK_VAR", "LOCK_TIMEOUT", "NAME", "PlanCache", "Recorded", "backend_part",
           "backends_to_load", "compare", "reuse", "program_of", "cached_plan", "listing", "store_listing",
           "info", "clear", "clear_scan", "scan_cache", "drift"]

log = get_logger()

#: seconds a process waits for another that builds the same entry, then builds it too
LOCK_TIMEOUT = 30.0
#: the entry-point group of backends (``discovery.BACKENDS_GROUP``; discovery is a layer above)
BACKENDS_GROUP = "opregistry.backends"
#: the folder that holds listings made of cached plans (``opregistry list --json``)
LISTINGS = "listings"


def backend_part(decl: Declarations) -> str:
    """The backends' part of ``decl`` as one string (their availability aside)."""
    enc = Encoder()

    def ours(o: Origin | None) -> bool:
        return o is not None and o.group == BACKENDS_GROUP

    data = [[enc.backend(b) for b in decl.backends],
            [enc.origin(o) for o in decl.distributions if ours(o)],
            [enc.skipped(s) for s in decl.skipped if ours(s.origin)],
            [enc.problem(p) for p in decl.problems if any(ours(o) for o in p.culprits)],
            enc.hooks({o: h for o, h in decl.hooks.items() if ours(o)})]
    return json.dumps([data, enc.table()], separators=(",", ":"))


class Recorded:
    """A dispatcher whose answers to the resolver's questions are recorded.

    ``has_kernel(op, key)`` as ``"kernel op|key"``, ``has_class(name)`` as
    ``"class name"``: a later load asks the same questions of its dispatcher.
    """

    def __init__(self, state: TorchState | None) -> None:
        self.answers: dict[str, bool] = {}
        self.state = state
        if state is not None:
            ask_kernel, ask_class = state.has_kernel, state.has_class

            def has_kernel(op: str, key: str) -> bool:
                found = self.answers[f"kernel {op}|{key}"] = bool(ask_kernel(op, key))
                return found

            def has_class(name: str) -> bool:
                found = self.answers[f"class {name}"] = bool(ask_class(name))  # type: ignore[misc]
                return found

            self.state = attrs.evolve(state, has_kernel=has_kernel,
                                      has_class=has_class if ask_class is not None else None)


def _ask(dispatcher: TorchState, question: str) -> bool:
    what, _, subject = question.partition(" ")
    if what == "class":
        return dispatcher.has_class is not None and bool(dispatcher.has_class(subject))
    op, _, key = subject.rpartition("|")
    return bool(dispatcher.has_kernel(op, key))


def _environment(entry: Mapping[str, Any], dispatcher: TorchState | None,
                 run: Callable[[str], tuple[bool, str]] = run_check
                 ) -> tuple[Environment, dict[str, Any]]:
    """This load's environment for the cached query, and its encoding to compare.

    The scan of the packages that register with torch directly is the cached
    one: the manifest stamps every file it read (:func:`opregistry.scan.scan_inputs`).
    """
    env = read_query(decode_query(entry["query"]), dispatcher, run=run)
    asked = (entry["environment"].get("dispatcher") or {}).get("kernels", {})
    answers = {q: _ask(dispatcher, q) for q in asked} if dispatcher is not None else {}
    data = encode_environment(env, answers)
    data["foreign"] = entry["environment"]["foreign"]
    return env, data


def _foreign(entry: Mapping[str, Any]) -> Any:
    from .foreign import ForeignScan

    return None if entry["foreign"] is None else ForeignScan.from_dict(entry["foreign"])


class PlanCache:
    """The plan cache for one slot: this process's settings, ``sys.path``, torch imported or not."""

    def __init__(self, settings: Settings, *, torch_imported: bool,
                 environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self.settings = settings
        self.content = content_check(settings, env)
        self.disk = plan_cache(env)
        self.environ = env
        self.torch_imported = torch_imported
        #: the slot of this ``sys.path[0]`` alone, then the slot shared by the folders that
        #: hold nothing that can change the plan (:func:`inputs.plain_first`)
        self.keys = tuple(inputs.slot(settings, torch_imported=torch_imported,
                                      content=self.content, environ=env, own=own)
                          for own in (True, False))
        #: the slot of the entry :meth:`lookup` found, or :meth:`store` wrote
        self.key = self.keys[1]
        #: the bytes of the entry :meth:`lookup` returned last (:func:`cached_plan` decodes the
        #: plan from them again: a loaded registry keeps these, not the plan's records)
        self.data: bytes | None = None

    @property
    def enabled(self) -> bool:
        return self.disk.enabled

    def marker(self) -> str | None:
        """The key of this slot's idle marker (:mod:`opregistry.idle`): only the autoload's
        slot has one, that of torch imported and the settings the variables give."""
        if self.torch_imported and _from_variables(self.settings, self.environ):
            return marker_key(self.environ, own=self.key == self.keys[0])
        return None

    def lookup(self) -> dict[str, Any] | None:
        """The entry of this slot when its manifest still holds, else ``None`` (logged why)."""
        self.data = None
        for key in self.keys if self.enabled else ():
            found = self.disk.read(key)
            if found is None:
                continue
            entry, data = found
            try:
                changed = inputs.check_manifest(entry["manifest"])
            except Exception as exc:  # noqa: BLE001 - a malformed entry is a miss
                log.debug("plan cache entry malformed, ignored", error=repr(exc))
                continue
            if changed is not None:
                log.debug("plan cache entry stale", changed=changed)
                continue
            settled = None if self.content else inputs.settle(entry["manifest"])
            if settled is not None:  # its racy files are checked by time from now on
                entry["manifest"] = settled
                self.disk.restamp(key, data, manifest=settled)
            self.key, self.data = key, data
            return entry
        return None

    @contextlib.contextmanager
    def building(self) -> Iterator[bool]:
        """Held while this process builds the entry: others wait for it (:data:`LOCK_TIMEOUT`)."""
        if not self.enabled:
            yield False
            return
        with self.disk.lock(self.keys[1], LOCK_TIMEOUT) as held:
            yield held

    def stamper(self) -> inputs.Stamper:
        """Stamps of the inputs known before discovery: ``sys.path`` and what is installed."""
        stamper = inputs.Stamper(self.content)
        folders, files = inputs.sys_path_files(sys.path)
        stamper.watch(folders)
        stamper.add(files)
        extra = [os.environ.get(CONFIG_VAR, "").strip(), self.settings.lock or ""]
        stamper.add(os.path.abspath(p) for p in extra if p)
        return stamper

    def store(self, stamper: inputs.Stamper, decl: Declarations, plan: Plan,
              env: Environment, answers: Mapping[str, bool], imported: set[str],
              gate: str, steps: Steps | None = None) -> bool:
        """Write the entry for what was just built; ``imported``: modules new since discovery;
        ``steps``: the plan's registration steps (its program is written with them)."""
        plugins = [o.value.partition(":")[0] for o in (
            *decl.distributions, *(s.origin for s in decl.skipped))]
        stamper.add(inputs.package_files([*plugins, __name__]))
        stamper.add(inputs.module_files(sorted(imported)))
        if env.foreign is not None:
            from .scan import scan_inputs

            stamper.add(scan_inputs(env.foreign))
        manifest = stamper.manifest({m.partition(".")[0] for m in (*imported, *plugins, __name__)})
        if manifest is None:
            log.debug("plan not cached: sys.path or a file it read changed while it was "
                      "built")
            return False
        entry: dict[str, Any] = {"manifest": manifest, "gate": gate, "id": os.urandom(12).hex(),
                                 "foreign": None if env.foreign is None else env.foreign.to_dict()}
        sections: dict[str, Any] = {}
        try:
            enc = Encoder()
            # parsed when first read: a hit with a program reads neither (diskcache.Entry)
            sections.update(declarations=enc.declarations(decl), plan=enc.plan(plan))
            program = None if steps is None else compile_program(
                plan, steps, enc, sections["declarations"])
            if program is not None:
                sections["program"] = program
            entry.update(origins=enc.table(), backends=backend_part(decl),
                         distributions=sections["declarations"]["distributions"],
                         available=dict(decl.available),
                         query=encode_query(environment_query(decl)),
                         environment=encode_environment(env, answers))
        except Uncacheable as exc:
            log.debug("plan not cached", reason=str(exc))
            entry = {"manifest": manifest, "gate": gate, "uncacheable": str(exc)}
            sections = {}
        self.key = self.keys[1] if inputs.plain_first(manifest) else self.keys[0]
        marker = self.marker()
        if marker is not None:  # the entry's marker, when its plan is idle, comes after it
            self.disk.discard(marker)
        stored = self.disk.store(self.key, entry, sections)
        if stored:
            waits = waiting_load(decl, plan) if marker is not None and sections \
                and self.settings.lock is None else None
            if waits is not None:
                self.disk.store(marker, {"manifest": manifest, **waits})
            self.disk.prune(KEEP_PLANS)
        return stored


def _from_variables(settings: Settings, environ: Mapping[str, str]) -> bool:
    """Whether ``settings`` are those the ``OPREGISTRY_*`` variables give (not a load's
    arguments): an idle marker is keyed by the variables alone."""
    try:
        return settings == Settings.from_env(environ=environ)
    except ConfigError:
        return False


def waiting_load(decl: Declarations, plan: Plan) -> dict[str, list[str]] | None:
    """What ``import torch`` must know to leave the load of ``plan`` for later
    (:func:`opregistry.idle.idle_start`), or ``None`` when it cannot wait.

    It can wait when the load registers nothing and has nothing to report --
    no op package's declaration, no native library, no problem -- and every
    adoption is lazy: its package is imported on the first touch of one of its
    namespaces (or the lookup of an op a module it does not import defines),
    and no kernel of an adopted package is switched off (a switch applies as
    the package registers, whoever imports it: the adopter must be there
    first).  Returns the namespaces whose first touch loads the registry
    (``"adopted"``) and those whose missing op does (``"adopted_ops"``); both
    empty when nothing is adopted.
    """
    if (decl.namespaces or decl.ops or decl.kernels or decl.problems or plan.namespaces
            or plan.ops or plan.external_kernels or plan.natives or plan.problems):
        return None
    touched: set[str] = set()
    looked_up: set[str] = set()
    for adopted in plan.adoptions:
        if any(k.disabled_by for k in adopted.kernels):
            return None
        if not adopted.active:
            continue
        if adopted.load != "lazy":
            return None
        touched.update(adopted.namespaces)
        looked_up.update(op.split("::", 1)[0] for op, _ in adopted.op_modules)
    return {"adopted": sorted(touched), "adopted_ops": sorted(looked_up)}


def backends_to_load(entry: Mapping[str, Any]) -> list[Origin]:
    """The backend entry points the cached declarations came with, to import again."""
    origins = entry["origins"]
    found = []
    for i in entry["distributions"]:
        distribution, version, group, name, value = origins[i]
        if group == BACKENDS_GROUP:
            found.append(Origin(distribution=distribution, version=version, group=group,
                                entry_point=name, value=value))
    return found


def compare(entry: Mapping[str, Any], live: Declarations, dispatcher: TorchState | None,
            run: Callable[[str], tuple[bool, str]] = run_check
            ) -> tuple[str, Environment] | None:
    """How the cached plan stands, given the backends collected in this load.

    ``None`` when the backends differ from the cached ones in anything but
    their availability (a miss); ``("hit", env)`` when the environment and the
    availability are the cached ones (the cached plan holds); ``("resolved",
    env)`` when they are not (the cached declarations must be resolved again).
    """
    if backend_part(live) != entry["backends"]:
        log.debug("plan cache: the backends differ from the cached ones")
        return None
    env, env_data = _environment(entry, dispatcher, run)
    same = (env_data == entry["environment"]
            and entry["available"] == live.available)
    return ("hit" if same else "resolved"), env


def reuse(entry: Mapping[str, Any], live: Declarations, dispatcher: TorchState | None,
          resolve: Callable[[Declarations, Environment], Plan], *,
          run: Callable[[str], tuple[bool, str]] = run_check, decode: bool = True
          ) -> tuple[Plan | None, str] | None:
    """The cached plan, or the cached declarations resolved again (see :func:`compare`);
    ``run`` runs each load-time check.  ``decode=False``: a hit's plan is not decoded
    (``None``): its program is replayed (:func:`program_of`)."""
    found = compare(entry, live, dispatcher, run)
    if found is None:
        return None
    outcome, env = found
    if outcome == "hit":
        return (_decoder(entry, live).plan(entry["plan"]) if decode else None), "hit"
    log.debug("plan cache: resolving the cached declarations in this environment")
    decl = attrs.evolve(_decoder(entry, live).declarations(), available=dict(live.available))
    return resolve(decl, attrs.evolve(env, foreign=_foreign(entry))), "resolved"


def program_of(entry: Mapping[str, Any], live: Declarations) -> tuple[Any, Decoder] | None:
    """The registration program of ``entry`` (:mod:`opregistry.program`) and the decoder of
    its rows, or ``None`` when it has none (or one of another version)."""
    if "program" not in getattr(entry, "sections", ()):
        return None
    program = entry["program"]
    if not isinstance(program, dict) or program.get("version") != PROGRAM_VERSION:
        return None
    return program, _decoder(entry, live, {"ops": (), "kernels": ()})


def _decoder(entry: Mapping[str, Any], live: Declarations,
             declarations: Mapping[str, Any] | None = None) -> Decoder:
    backends = {(b.origin.distribution if b.origin else "", b.name): b for b in live.backends}
    return Decoder(entry["origins"],
                   entry["declarations"] if declarations is None else declarations, backends)


def cached_plan(cache: PlanCache, data: bytes, live: Declarations) -> Plan:
    """The plan of the entry ``data`` (what :meth:`PlanCache.lookup` read), decoded again.

    The same plan :func:`reuse` returned for it, a hit: its backends the live
    ones, ``live``.  Raises when ``data`` is not such an entry.
    """
    entry = cache.disk.parse(data, cache.key)
    if entry is None:
        raise ValueError("not an entry of this plan cache slot")
    return _decoder(entry, live).plan(entry["plan"])


def _listings(environ: Mapping[str, str] | None = None) -> DiskCache:
    return DiskCache.open(LISTINGS, stamp=f"listing-text-{FORMAT}", environ=environ)


def listing(entry_id: str, kind: str) -> tuple[str, bool] | None:
    """The listing ``kind`` (``"list --json"``) made of the cached plan ``entry_id``, and
    whether that plan has errors; ``None`` when none was stored.

    The text is kept as it was printed, a section of its entry taken whole
    (CRC-checked, never parsed): 1.3 MB for 1,000 ops, which took 10 ms to
    read as a JSON string and takes 2 ms so."""
    found = _listings().load(f"{entry_id} {kind}")
    raw = found.raw("text") if isinstance(found, Entry) else None
    if raw is None or not isinstance(found.get("errors"), bool):
        return None
    try:
        return raw.decode("utf-8"), found["errors"]
    except UnicodeDecodeError:
        return None


#: how many entries each folder keeps (the most recently written): one per environment, per
#: set of ``OPREGISTRY_*`` variables, per script folder or working directory that holds what
#: can change the plan (:func:`opregistry.inputs.plain_first`)
KEEP_PLANS = 64
KEEP_LISTINGS = 8


def store_listing(entry_id: str, kind: str, text: str, errors: bool) -> None:
    """Keep the listing ``kind`` of the cached plan ``entry_id`` for the next command."""
    listings = _listings()
    if listings.store(f"{entry_id} {kind}", {"errors": errors},
                      sections={"text": text.encode("utf-8")}):
        listings.prune(KEEP_LISTINGS)


def _status(cache: PlanCache) -> dict[str, Any]:
    """What the cache holds for ``cache``'s slot: ``none``, ``stale``, ``uncacheable``, ``valid``.

    As :meth:`PlanCache.lookup` reads it: the first of its keys whose entry holds; the first
    entry found, stale or malformed, only when none does (the slot of this ``sys.path[0]``
    may hold a stale entry that a process of another ``sys.path[0]`` never reads)."""
    entry, first = None, None
    for key in cache.keys if cache.enabled else ():
        found = cache.disk.load(key)
        if found is None:
            continue
        try:
            changed = inputs.check_manifest(found["manifest"])
        except Exception:  # noqa: BLE001 - a malformed entry is reported, never raised
            first = first or {"status": "malformed"}
            continue
        if changed is not None:
            first = first or {"status": "stale", "changed": changed}
            continue
        entry, cache.key = found, key
        break
    if entry is None:
        return first or {"status": "none"}
    if "uncacheable" in entry:
        return {"status": "uncacheable", "reason": entry["uncacheable"]}
    return {"status": "valid", "ops": len(entry["plan"]["ops"]),
            "distributions": len(entry["plan"]["distributions"]),
            "registers_nothing": (marker := cache.marker()) is not None
            and cache.disk.load(marker) is not None}


def info(settings: Settings, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The cache directory, its entries, and the entries of this environment's two slots."""
    env = os.environ if environ is None else environ
    without = PlanCache(settings, torch_imported=False, environ=env)
    folder = without.disk.folder
    entries, size = _files(folder)
    scan = scan_cache(env).folder
    scan_entries, scan_size = _files(scan)
    return {
        "directory": folder,
        "enabled": folder is not None,
        "check": "content" if without.content else "stat",
        "entries": entries,
        "bytes": size,
        "this_environment": {"opregistry list": _status(without),
                             "import torch": _status(PlanCache(settings, torch_imported=True,
                                                               environ=env))},
        # the static scan of the installed distributions (opregistry.scan): one entry per
        # folder of distributions (a site-packages, a PYTHONPATH entry)
        "scan": {"directory": scan, "entries": scan_entries, "bytes": scan_size,
                 "check": "content" if without.content else "stat"},
    }


def _files(folder: str | None) -> tuple[int, int]:
    """How many entries ``folder`` holds, and their bytes."""
    files = []
    if folder is not None and os.path.isdir(folder):
        files = [os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".json")]
    size = 0
    for path in files:
        with contextlib.suppress(OSError):
            size += os.path.getsize(path)
    return len(files), size


def scan_cache(environ: Mapping[str, str] | None = None) -> DiskCache:
    """The cache of the static scan of the installed distributions (:mod:`opregistry.scan`)."""
    from .scan import CACHE_NAME

    return DiskCache.open(CACHE_NAME, stamp="", environ=environ)


def clear(environ: Mapping[str, str] | None = None,
          failed: list[str] | None = None) -> tuple[str | None, int]:
    """Remove every plan cache entry (and the listings made of them): the folder, how many;
    ``failed`` gets what could not be removed.  :func:`clear_scan` removes the scan's."""
    disk = plan_cache(environ)
    _listings(environ).clear(failed)
    return disk.folder, disk.clear(failed)


def clear_scan(environ: Mapping[str, str] | None = None,
               failed: list[str] | None = None) -> tuple[str | None, int]:
    """Remove every entry of the scan's cache: the folder, how many (the next start scans the
    installed distributions again); ``failed`` gets what could not be removed."""
    disk = scan_cache(environ)
    return disk.folder, disk.clear(failed)


def _by_distribution(decl: Declarations) -> dict[str, str]:
    """Each distribution's records in ``decl``, as one string (origins written out)."""
    found: dict[str, list[Any]] = {}

    def add(origin: Origin | None, what: str, data: Any) -> None:
        if origin is not None:
            found.setdefault(origin.distribution, []).append([what, data])

    enc = Encoder()
    for ns in decl.namespaces:
        add(ns.origin, "namespace", enc.namespace(ns))
    for op in decl.ops:
        add(op.origin, "op", enc.op(op))
    for k in decl.kernels:
        add(k.origin, "kernel", enc.kernel(k))
    for b in decl.backends:
        add(b.origin, "backend", enc.backend(b))
    for s in decl.skipped:
        add(s.origin, "skipped", enc.skipped(s))
    table = enc.table()

    def named(data: Any) -> Any:  # origin indices -> the origins themselves
        return json.dumps(data) + json.dumps(table)

    return {dist: named(records) for dist, records in sorted(found.items())}


def drift(entry: Mapping[str, Any], fresh: Declarations) -> list[Problem]:
    """A ``cache-declarations-differ`` problem per distribution whose declarations, read again
    now, differ from those ``entry`` cached for the same inputs."""
    cached = Decoder(entry["origins"], entry["declarations"]).declarations()
    before, now = _by_distribution(cached), _by_distribution(fresh)
    origins = {o.distribution: o for o in (*cached.distributions, *fresh.distributions)}
    problems = []
    for dist in sorted(set(before) | set(now)):
        if before.get(dist) == now.get(dist):
            continue
        origin = origins.get(dist)
        problems.append(Problem(
            code="cache-declarations-differ",
            message=f"{origin or dist} declared something else now than what the plan cache "
                    f"holds for the same inputs: its declaration code reads something outside "
                    f"its inputs (the clock, the network, a file outside its package, the "
                    f"process's state), so a cached plan of it can be stale",
            hint=f"make {dist}'s declarations a function of its own files and the conditions "
                 f"opregistry evaluates (when=...), as {DOCS_URL}op-authors/"
                 f"#declarations-are-data asks; until then run with OPREGISTRY_CACHE=0",
            culprits=(origin,) if origin else ()))
    return problems
