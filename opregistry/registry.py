"""The pipeline end to end: :func:`plan` (no torch) and :func:`load` (registers).

``load()`` is idempotent and thread-safe: the first call discovers,
collects, resolves and materializes; later calls return the same
:class:`Registry`.  Call it as often as you like — in DataLoader workers,
spawned processes, on every rank.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, Iterator, NamedTuple, Tuple

import attrs

from .codec import Encoder
from .collect import Collected, collect
from .config import Policy, Settings
from .containment import interrupts_watched
from .discovery import discover, load_origins, still_importing
from .errors import ReentrantLoadError, ResolutionError
from .lockfile import DEFAULT_LOCKFILE, PathLike, verify_plan
from .lock_gate import Gate, gate
from .logs import get_logger
from .model import Declarations, Problem, elide
from .environment import Environment, TorchState, read_environment, run_check
from .plans import KernelPlan, OpPlan, Plan
from .plancache import (PlanCache, Recorded, backends_to_load, cached_plan, compare, drift,
                        program_of, reuse)
from .state import gc_paused, process
from .seal import Seal
from .steps import Steps, plan_steps

if TYPE_CHECKING:  # imported where used: `opregistry list` needs neither
    from .adopting import Adopter
    from .materializer import Materialized

__all__ = ["Registry", "load", "plan", "get_registry", "loading", "current_plan", "verify_lock",
           "check_cache", "cached_plan_id"]

log = get_logger()


def _settings(strict: bool | None, plugins: Iterable[str] | None, block: Iterable[str] | None,
              policy: Policy | None) -> Settings:
    return Settings.from_env(
        strict=strict,
        allow=None if plugins is None else frozenset(plugins),
        block=None if block is None else frozenset(block),
        policy=policy,
    )


#: the backends' materialize hooks, by (distribution, backend name)
Materializers = Dict[Tuple[str, str], Callable[..., Any]]

class Built(NamedTuple):
    """What a load registers, and with which backends' hooks."""

    materializers: Materializers
    #: the plan; ``None`` only beside a ``program``: a cache hit, decoded when first asked
    plan: Plan | None
    #: how to decode the plan again from the plan cache's entry when it is a cache hit
    #: (``None``: it is not; a :class:`Registry` keeps the records of such a plan)
    reread: Callable[[], Plan] | None
    #: a cache hit's registration program and the decoder of its rows (:mod:`opregistry.program`)
    program: Any = None
    #: the plan's registration steps, when they were made already (to write its program)
    steps: Steps | None = None


def _collect_and_resolve(settings: Settings, torch_state: Callable[[], TorchState | None],
                         references: bool = False, program: bool = False) -> Built:
    """``program``: a cache hit with a registration program returns it, its plan undecoded."""
    with gc_paused(), interrupts_watched():
        if not references:
            return _collect_and_resolve_unpaused(settings, torch_state, program)
        # the references checked (doctor): built from the declarations, never from the cache
        collected, resolved, env, _ = _build(settings, gate(settings), torch_state)
        collected, resolved = _with_reference_checks(collected, resolved, settings, env)
        return Built(collected.materializers, resolved, None)


def _with_reference_checks(collected: Collected, resolved: Plan, settings: Settings,
                           env: Environment) -> tuple[Collected, Plan]:
    """Resolve again, leaving out each distribution with a reference that cannot be imported.

    What the materializer would find at registration, found statically
    (:func:`opregistry.plan_modules.check_references`), with the same
    consequence: the distribution is left out whole, and what depended on it
    with it (rule 9).  Repeated until no new problem appears: leaving one
    out can make another's kernel the active one.
    """
    from .plan_modules import check_references

    seen = {(p.code, p.message) for p in collected.declarations.problems}
    while True:
        found = [p for p in check_references(resolved) if (p.code, p.message) not in seen]
        if not found:
            return collected, resolved
        # what this pass left out stays out, as registration keeps the plan's verdicts and
        # only rolls back (a conflict is reported beside the typo, not hidden by it)
        found += [p for p in resolved.errors if (p.code, p.message) not in seen]
        seen.update((p.code, p.message) for p in found)
        declarations = attrs.evolve(collected.declarations,
                                    problems=collected.declarations.problems + tuple(found))
        collected = attrs.evolve(collected, declarations=declarations)
        resolved = _resolve(declarations, policy=settings.policy, environment=env)


def _collect_and_resolve_unpaused(settings: Settings,
                                  torch_state: Callable[[], TorchState | None],
                                  program: bool = False) -> Built:
    # locked mode (OPREGISTRY_LOCK): checked before any plugin module is imported
    lock_gate = gate(settings)
    cache = PlanCache(settings, torch_imported="torch" in sys.modules)
    state = process()
    if not cache.enabled:
        state.plan_cache = "off"
        return _built(_build(settings, lock_gate, torch_state))
    found = _cached(cache, settings, lock_gate, torch_state, program)
    if found == "uncacheable":
        return _built(_build(settings, lock_gate, torch_state))
    if found is not None:
        return found  # type: ignore[return-value]  # a Built
    with cache.building() as held:
        # another process may have written the entry while this one waited for the lock
        found = _cached(cache, settings, lock_gate, torch_state, program) if held else None
        if isinstance(found, tuple):
            return found
        state.plan_cache = "miss"
        stamper = cache.stamper()
        before = set(sys.modules)
        collected, resolved, env, answers = _build(settings, lock_gate, torch_state)
        steps = None
        if found != "uncacheable":
            steps = plan_steps(resolved)  # the entry's program is written with them
            cache.store(stamper, collected.declarations, resolved, env, answers,
                        set(sys.modules) - before, _gate_part(lock_gate), steps)
        return Built(collected.materializers, resolved, None, steps=steps)


def _built(built: tuple[Collected, Plan, Environment, dict[str, bool]]) -> Built:
    return Built(built[0].materializers, built[1], None)


def _resolve(decl: Any, **kwargs: Any) -> Plan:
    """The resolver, imported when a plan is resolved (a warm plan cache needs none of it)."""
    from .resolver import resolve

    return resolve(decl, **kwargs)


def _build(settings: Settings, lock_gate: Gate, torch_state: Callable[[], TorchState | None]
           ) -> tuple[Collected, Plan, Environment, dict[str, bool]]:
    """Discover, collect and resolve; also the environment read and the dispatcher's answers."""
    collected = collect(lock_gate.apply(discover(lock_gate.settings)))
    # torch's state is read after the plugins are imported: a plugin may register
    # with torch itself at import (a Library of its own), and the resolver must see it
    dispatcher = Recorded(torch_state())
    decl, env = _read_environment(collected.declarations, dispatcher.state, read_foreign())
    collected = attrs.evolve(collected, declarations=decl)
    return collected, _resolve(decl, policy=settings.policy, environment=env), env, \
        dispatcher.answers


def _cached(cache: PlanCache, settings: Settings, lock_gate: Gate,
            torch_state: Callable[[], TorchState | None], program: bool = False
            ) -> Built | str | None:
    """The cached plan (``"uncacheable"``: the entry says it cannot be; ``None``: a miss).

    Imports and collects the backends only: their materialize hooks are needed,
    and whether each is available is this process's to say.  ``program``: a
    hit whose entry has a registration program returns it, the plan undecoded.
    """
    entry = cache.lookup()
    if entry is None:
        return None
    if "uncacheable" in entry:
        log.debug("plan cache: not cacheable", reason=entry["uncacheable"])
        process().plan_cache = "uncacheable"
        return "uncacheable"
    try:
        if entry["gate"] != _gate_part(lock_gate):
            return None
        live = collect(load_origins(lock_gate.settings, backends_to_load(entry)))
        run, changed = _sealed_checks()
        replay = program_of(entry, live.declarations) if program else None
        found = reuse(entry, live.declarations, torch_state(),
                      lambda decl, env: _resolve(decl, policy=settings.policy, environment=env),
                      run=run, decode=replay is None)
    except Exception as exc:  # noqa: BLE001 - an unusable entry is a miss, never an error
        log.debug("plan cache entry unusable", error=repr(exc))
        return None
    if found is None or changed:  # a check changed opregistry's state: judged uncached
        return None
    resolved, outcome = found
    log.debug("plan cache", outcome=outcome)
    state = process()
    state.plan_cache = outcome
    state.plan_entry = entry["id"] if outcome == "hit" else None
    data, declarations = cache.data, live.declarations
    reread = None if data is None else (lambda: cached_plan(cache, data, declarations))
    if resolved is None:  # a hit left undecoded: its program is replayed
        return None if reread is None else Built(live.materializers, None, reread, replay)
    return Built(live.materializers, resolved, reread if outcome == "hit" else None)


def _gate_part(lock_gate: Gate) -> str:
    """What the locked mode decided, as a string to compare with the cached one."""
    enc = Encoder()
    return json.dumps([sorted(lock_gate.refused.items()),
                       [enc.problem(p) for p in lock_gate.problems], lock_gate.everything,
                       enc.table()])


def _sealed_checks() -> tuple[Callable[[str], tuple[bool, str]], dict[str, list[Any]]]:
    """A runner of load-time checks under the seal, and what each changed (filled as they run)."""
    changed: dict[str, list[Any]] = {}

    def sealed(ref: str) -> tuple[bool, str]:
        seal = Seal()
        outcome = run_check(ref)
        changes = seal.check()
        if not changes:
            return outcome
        changed[ref] = changes
        return False, f"{ref} changed opregistry's own state (put back)"

    return sealed, changed


def _read_environment(decl: Declarations, dispatcher: TorchState | None, foreign: Any
                      ) -> tuple[Declarations, Environment]:
    """The environment, each load-time check run under the seal.

    A check (``when={"check": ...}``) is a distribution's code: one that
    changes opregistry's own state is put back, unmet, and leaves its
    distribution out (``opregistry-state-changed``), as at collection.
    """
    sealed, changed = _sealed_checks()
    env = read_environment(decl, dispatcher, foreign, run=sealed)
    if not changed:
        return decl, env
    from .ownership import state_problem

    problems = tuple(state_problem(k.origin, changed[k.when.check],
                                   f"its load-time check {k.when.check} ran")
                     for k in decl.kernels if k.when is not None and k.when.check in changed)
    return attrs.evolve(decl, problems=decl.problems + tuple(dict.fromkeys(problems))), env


def read_foreign() -> Any:
    """The scan of installed packages that register with torch.library directly (cached on disk).

    ``None`` when the scan cannot be made: the rules then protect what they
    can see without it (torch's dispatcher, declared owners), and say nothing
    false.
    """
    from .scan import scan_installed

    try:
        return scan_installed()
    except Exception as exc:  # noqa: BLE001 - a scanner bug must never break a load
        log.warning("the scan of installed packages failed; packages that register with "
                    "torch.library directly are not protected before torch, nor adopted", error=repr(exc))
        return None


@contextlib.contextmanager
def _importing_plugins(caller: str) -> Iterator[None]:
    """Mark the span in which plugins are imported; a plugin calling ``caller`` then is refused.

    Held under the process lock.  A plugin that calls :func:`load` or :func:`plan` at
    import would register from inside the registry's own load.
    """
    state = process()
    if state.loading:
        raise ReentrantLoadError(
            f"opregistry.{caller}() was called while opregistry was importing plugins; a plugin "
            f"must not load the registry at import: remove the call (opregistry loads every "
            f"installed op package itself)")
    state.loading = True
    try:
        yield
    finally:
        state.loading = False


def plan(*, plugins: Iterable[str] | None = None, block: Iterable[str] | None = None,
         policy: Policy | None = None, references: bool = False) -> Plan:
    """Discover, collect and resolve, without registering anything.

    Does not import torch.  When torch is already imported, what its
    dispatcher holds is taken into account (rules 4 and 5).

    ``references=True`` also checks, statically, that every reference the
    materializer would import names a module and an attribute that exist
    (``kernel-ref-missing``, ``kernel-ref-invalid``), leaving out what
    registration would: what ``opregistry doctor`` does.
    """
    settings = _settings(None, plugins, block, policy)

    def torch_state() -> TorchState | None:
        # a plugin that imports torch counts: torch is what it is by then
        if "torch" not in sys.modules:
            return None
        return _snapshot()

    # plugins are imported here too: one that calls load() at import must meet
    # the same refusal as under load(), not start registering from inside plan()
    with process().lock, _importing_plugins("plan"):
        return _collect_and_resolve(settings, torch_state, references)[1]


def _snapshot() -> TorchState:
    """What torch's dispatcher holds outside opregistry (every live registry's ops left out)."""
    from . import torch_state
    from .materializer import defined_ops

    return torch_state.snapshot(mine=defined_ops())


class Registry:
    """The loaded registry: the plan, what was registered, and every problem.

    :attr:`plan` is what the resolver decided; :attr:`loaded` is the same plan
    less the distributions torch refused at registration (rolled back whole),
    with their problems added.  ``errors``, ``op()`` and ``kernels`` answer
    from :attr:`loaded`.

    A plan that came from the plan cache (``reread``) is not kept once the
    load is over: its records (~15 per op) would stay on the heap of every
    process for nothing but these questions, visited by each full collection
    of the garbage collector.  It is decoded again from the entry's bytes the
    first time one is asked.
    """

    def __init__(self, plan: Plan, materialized: Materialized, settings: Settings,
                 reread: Callable[[], Plan] | None = None) -> None:
        self.settings = settings
        self._materialized = materialized
        self._plan: Plan | None = plan
        self._reread = reread
        self._loaded: Plan | None = None
        #: problems found after loading, and whether the registry was unloaded
        self._later: tuple[Problem, ...] = ()
        self._unloaded = False
        self.op_names: frozenset[str] = frozenset(materialized.ops)
        #: the adoptions in effect (imports on first touch of torch.ops.<ns>), or ``None``
        self.adopter: Adopter | None = None

    @property
    def plan(self) -> Plan:
        with process().lock:
            plan = self._plan
            if plan is None:
                assert self._reread is not None
                plan = self._plan = self._reread()
            return plan

    @plan.setter
    def plan(self, plan: Plan) -> None:
        self._plan, self._reread, self._loaded = plan, None, None

    @property
    def loaded(self) -> Plan:
        with process().lock:
            loaded = self._loaded
            if loaded is None:
                loaded = _effective(self.plan, self._materialized)
                if self._later or self._unloaded:
                    loaded = attrs.evolve(loaded, problems=loaded.problems + self._later,
                                          ops=() if self._unloaded else loaded.ops)
                self._loaded = loaded
            return loaded

    def release(self) -> None:
        """Let go of the plan's records when they can be decoded again (see the class)."""
        with process().lock:
            if self._reread is not None:
                self._plan = self._loaded = None

    def add_problem(self, problem: Problem) -> None:
        """Record a problem found after loading (an adopted package that failed to import)."""
        with process().lock:
            self._later += (problem,)
            self._loaded = None

    @property
    def problems(self) -> tuple[Problem, ...]:
        """Every problem: the plan's, registration's, and those of kernels registered after a
        package's import (a kernel for an op the package defines with torch.library)."""
        return self.loaded.problems + tuple(process().late_problems)

    @property
    def ops(self) -> tuple[OpPlan, ...]:
        return self.loaded.ops

    @property
    def errors(self) -> tuple[Problem, ...]:
        return tuple(p for p in self.problems if p.severity == "error")

    @property
    def namespaces(self) -> tuple[str, ...]:
        return tuple(sorted({op.op.namespace for op in self.ops}))

    @property
    def kernels(self) -> tuple[KernelPlan, ...]:
        return self.loaded.kernels()

    def op(self, qualname: str) -> OpPlan | None:
        return self.loaded.op(qualname)

    def complete(self) -> tuple[Problem, ...]:
        """Load the deferred distributions whose import has finished; return their problems.

        A decorator-style op package imported before torch imports torch before
        it declares its ops, so torch's autoload meets it half-imported and
        defers it (:attr:`~opregistry.model.Skipped.deferred`).  Its first op
        call (or :func:`load`) comes here: the registry is resolved again with
        it, and -- when that changes nothing already registered -- its ops and
        kernels are registered; otherwise it is left out with a problem.
        """
        from .materializer import materialize

        with process().lock:
            if self._plan is None:  # released: a cache hit, and a plan that defers is not cached
                return ()
            deferred = [s.origin for s in self.plan.skipped if s.deferred]
            if not deferred or any(still_importing(o.value.partition(":")[0])
                                   for o in deferred):
                return ()
            with _importing_plugins("load"):
                materializers, full = _collect_and_resolve(self.settings, _snapshot)[:2]
            late = {o.distribution for o in deferred}
            problems = [p for p in full.problems
                        if p.leaves_out and {o.distribution for o in p.culprits} & late]
            settled = {o.distribution for o in self.plan.distributions}
            if not problems and _share(full, settled) != _share(self.plan, settled):
                problems.append(Problem(
                    code="deferred-changes-registry",
                    message=f"{', '.join(sorted(late))} finished importing after the registry "
                            f"loaded, and adding it now would change what is registered "
                            f"already (a kernel for an op of another distribution, or a "
                            f"conflict): it is left out",
                    hint="import torch before it, or call opregistry.load(reload=True)",
                    culprits=tuple(o for o in deferred)))
            if problems:
                self._later += tuple(problems)
                self.plan = attrs.evolve(self.plan, skipped=tuple(
                    attrs.evolve(s, deferred=False) for s in self.plan.skipped))
                return tuple(problems)
            added = materialize(_part(full, late), materializers, self.settings.policy)
            self._materialized.libraries.update(added.libraries)
            self._materialized.ops.extend(added.ops)
            self._materialized.failed.update(added.failed)
            self._materialized.problems.extend(added.problems)
            self.plan = full
            self.op_names = self.op_names | frozenset(added.ops)
            return tuple(added.problems)

    def drift(self) -> tuple[Problem, ...]:
        """Every planned kernel torch no longer dispatches to, as ``kernel-replaced`` problems.

        After :func:`load`, other code may replace a kernel opregistry
        registered (a plain ``Library.impl``), and torch itself registers
        in-tree overrides of some aten kernels at the end of ``import torch``
        (torch 2.12+), which can shadow a kernel opregistry added to an aten
        op.  Asks torch's dispatcher, per op and key, where the kernel it
        holds was registered; ``opregistry doctor --live`` reports the result.
        On a torch that does not record the file of a kernel registered from
        Python (2.8: ``/dev/null:LINE``), only unregistered kernels are found.
        A kernel for an adopted package's op that waits for the package's import
        (:meth:`~opregistry.materializer.Executor._defer`) is not drift: it is
        registered right after the package registers its own.
        """
        from . import materializer, torch_state

        ours = os.path.abspath(materializer.__file__) + ":"
        sites = process().library_sites
        torch_root = torch_state.torch_dir()
        active: dict[str, list[KernelPlan]] = {}
        for k in self.kernels:
            if k.status == "active" and (k.kernel.op in self.op_names
                                         or k in self.plan.external_kernels):
                active.setdefault(k.kernel.op, []).append(k)
        problems = []
        for op, kernels in sorted(active.items()):
            found = torch_state.kernel_registrations(op)
            for k in kernels:
                if k.after and not materializer.imported_in_full(k.after):
                    continue  # deferred until the adopted package registers its own: not drift
                where = found.get(k.kernel.key)
                if where is not None and (where in sites or where.startswith(ours)):
                    continue
                if where is not None and not torch_state.site_recorded(where):
                    continue  # torch 2.8: no file for Python registrations, nothing to attribute
                origin = k.kernel.origin
                if where is None:
                    what, hint = "no longer has it (unregistered)", "reload the registry"
                elif where.startswith(torch_root):
                    what = f"dispatches to torch's own kernel, registered at {where}"
                    hint = ("torch shadows this kernel with one of its own; check whether "
                            "torch's kernel suffices, or ask torch how to switch it off")
                else:
                    what = f"dispatches to a kernel registered outside opregistry, at {where}"
                    hint = ("find the code at that line: replace kernels through opregistry "
                            "(override=True, OPREGISTRY_ALLOW_OVERRIDE), not Library.impl")
                problems.append(Problem(
                    code="kernel-replaced",
                    message=f"the {k.kernel.key} kernel of {op} from {origin} is no longer the "
                            f"one torch dispatches to: torch {what}",
                    hint=hint, others=(origin,) if origin else (), op=op, key=k.kernel.key,
                    source=where))
        return tuple(problems)

    def unload(self) -> None:
        """Unregister everything this registry registered."""
        from .adopting import deactivate

        state = process()
        with state.lock:
            deactivate(self.adopter)
            self.adopter = None
            self._materialized.destroy()
            self._unloaded, self._loaded = True, None
            self.op_names = frozenset()
            if state.registry is self:
                state.registry = None

    def __repr__(self) -> str:
        return (f"<opregistry.Registry: {len(self.ops)} ops in {len(self.namespaces)} namespaces, "
                f"{len(self.errors)} errors>")


def _effective(plan: Plan, materialized: Materialized) -> Plan:
    """``plan`` less the distributions torch refused at registration, with their problems."""
    failed = set(materialized.failed)
    return attrs.evolve(
        plan, ops=tuple(op for op in plan.ops
                        if op.op.origin is None or op.op.origin.distribution not in failed),
        problems=plan.problems + tuple(materialized.problems))


def _share(plan: Plan, distributions: set[str]) -> list[dict[str, object]]:
    """What ``plan`` registers for ``distributions``: their ops and every kernel on them."""
    return [op.to_dict() for op in plan.ops
            if op.op.origin is not None and op.op.origin.distribution in distributions]


def _part(plan: Plan, distributions: set[str]) -> Plan:
    """``plan`` restricted to what ``distributions`` define (their namespaces, ops, kernels)."""
    namespaces = []
    for ns in plan.namespaces:
        owner = ns.owner if ns.owner and ns.owner.distribution in distributions else None
        fragments = tuple(f for f in ns.fragments if f.distribution in distributions)
        if owner or fragments:
            namespaces.append(attrs.evolve(ns, owner=owner, fragments=fragments))
    return attrs.evolve(
        plan, namespaces=tuple(namespaces),
        ops=tuple(op for op in plan.ops
                  if op.op.origin is not None and op.op.origin.distribution in distributions),
        external_kernels=tuple(k for k in plan.external_kernels if k.kernel.origin is not None
                               and k.kernel.origin.distribution in distributions),
        natives=tuple(n for n in plan.natives if n.origin.distribution in distributions))


def loading() -> bool:
    """Whether opregistry is importing plugins right now (in :func:`load` or :func:`plan`)."""
    return process().loading


def get_registry() -> Registry | None:
    """The registry :func:`load` returned, or ``None`` if nothing is loaded.

    After an ``import torch`` that deferred its load (its cached plan registers
    nothing: :mod:`opregistry.idle`), the registry that load gives, loaded now.
    """
    state = process()
    if state.registry is None and state.deferred is not None:
        with state.lock:
            _load_deferred(state)
    return state.registry


def load(*, strict: bool | None = None, plugins: Iterable[str] | None = None,
         block: Iterable[str] | None = None, policy: Policy | None = None,
         reload: bool = False) -> Registry:
    """Load every installed op package into torch and return the registry.

    :param strict: raise :class:`~opregistry.ResolutionError` on any error
        problem, before anything is registered (default:
        ``OPREGISTRY_STRICT``).  Without it, distributions with problems
        are left out whole and the rest loads.
    :param plugins: allow-list of distribution names (default:
        ``OPREGISTRY_PLUGINS``).
    :param block: block-list (default: ``OPREGISTRY_BLOCK``).
    :param policy: override policy (default: ``OPREGISTRY_ALLOW_OVERRIDE``).
    :param reload: unload the current registry and load again.

    A second call returns the registry of the first (the arguments of the
    second are ignored unless ``reload=True``).
    """
    state = process()
    with state.lock:
        if reload:
            state.deferred = None  # loaded below, with this call's arguments
        _load_deferred(state)
        if state.registry is not None and not reload:
            state.registry.complete()
            return state.registry
        with _importing_plugins("load"):
            if state.registry is not None:
                state.registry.unload()
            state.registry = _load(_settings(strict, plugins, block, policy))
        return state.registry


def _load_deferred(state: Any) -> None:
    """Load what ``import torch`` deferred (the caller holds the state's lock), as the
    autoload would have: a failure is logged, never raised, and leaves nothing loaded.

    ``state.deferred`` stays set until the load is over, so that another thread's
    :func:`get_registry` waits for it on the lock instead of returning ``None``
    meanwhile; a call from inside the load itself (same thread) does nothing.
    """
    variables = state.deferred
    if variables is None or state.deferred_loading:
        return
    if state.registry is not None:
        state.deferred = None
        return
    state.deferred_loading = True
    try:
        with _importing_plugins("load"):
            state.registry = _load(Settings.from_env(environ=variables))
    except Exception as exc:  # noqa: BLE001 - the autoload's failure, met later: logged
        log.error("opregistry autoload failed; ops were not registered", error=repr(exc))
    finally:
        state.deferred, state.deferred_loading = None, False


def _load(settings: Settings) -> Registry:
    # One pause of the cyclic collector for the whole load, ended once the plan's records
    # are let go: the first allocation after the collector is back runs a young collection
    # over everything allocated while it was off and still alive -- with the pause ended
    # after each stage, that was the records too (docs/performance.md, "Records")
    with gc_paused():
        return _load_paused(settings)


def _load_paused(settings: Settings) -> Registry:
    from .adopting import activate
    from .materializer import counting

    built = _collect_and_resolve(settings, _snapshot, program=not counting())
    seal = Seal()  # kernel modules and backends run now: opregistry's own state is sealed
    with interrupts_watched():
        materialized, built = _materialize(built, settings)
    resolved, reread, program = built.plan, built.reread, built.program
    _undo_state_changes(seal, resolved if resolved is not None else reread, materialized)
    if settings.strict and materialized.problems:
        materialized.destroy()
        raise ResolutionError(materialized.problems)
    registry = Registry(resolved, materialized, settings, reread)
    if program is None or program[0]["adoptions"]:
        registry.adopter = activate(registry.plan, settings.lock, registry.add_problem)
    # a replayed program's plan has no problem: what registering it met, without decoding it
    problems = registry.problems if registry._plan is not None else (
        *materialized.problems, *process().late_problems)
    for problem in problems:
        if problem.severity == "error":
            log.warning("problem", code=problem.code, message=elide(problem.message),
                        hint=elide(problem.hint))
    log.info("loaded", ops=len(registry.op_names),
             errors=sum(p.severity == "error" for p in problems))
    registry.release()
    _unload_at_exit()
    return registry


def _materialize(built: Built, settings: Settings) -> tuple[Materialized, Built]:
    """Register the plan; or replay its program (:mod:`opregistry.program`) when it comes
    undecoded with one, and register the plan decoded when the program cannot be read (and
    built again when the plan cannot be decoded): returns what was registered, and from what."""
    from .materializer import Replay, materialize

    process().plan_replayed = False
    if built.plan is None:
        materialized = Replay(built.program[0], built.program[1], built.materializers,
                              settings.policy).run()
        if materialized is not None:
            process().plan_replayed = True
            return materialized, built
        try:  # a program this opregistry cannot read: nothing registered, the plan is
            assert built.reread is not None
            built = built._replace(plan=built.reread(), program=None)
        except Exception as exc:  # noqa: BLE001 - an unusable entry is a miss, never an error
            log.debug("plan cache entry unusable", error=repr(exc))
            built = _collect_and_resolve(settings, _snapshot)
    assert built.plan is not None
    if settings.strict and built.plan.errors:
        raise ResolutionError(built.plan.errors)
    return materialize(built.plan, built.materializers, settings.policy,
                       steps=built.steps), built


def _unload_at_exit() -> None:
    """Unregister what opregistry registered when the interpreter exits, before torch does.

    torch unregisters every ``Library`` at exit anyway (a ``weakref.finalize``
    each, run by the handler ``atexit`` got at ``import torch``, so after this
    one); done here, the registry lets go of its libraries and the backends'
    per-op state before the interpreter's finalization, whose full collections
    would otherwise visit all of it (docs/performance.md, "Exit"), and the ops'
    PyObject dispatch is switched off first, as :func:`~opregistry.torch_state.destroy_library`
    does.  Handlers registered after this one -- any registered after ``import
    torch`` -- run before it and still see every op.
    """
    state = process()
    if state.unload_at_exit:
        return
    state.unload_at_exit = True
    import atexit

    def unload() -> None:
        # a thread still loading at exit keeps the lock: leave its registry to torch
        if not state.lock.acquire(blocking=False):
            return
        try:
            if state.registry is not None:
                state.registry.unload()
        except Exception as exc:  # noqa: BLE001 - exit goes on; torch unregisters the rest
            log.debug("unload at exit failed", error=repr(exc))
        finally:
            state.lock.release()

    atexit.register(unload)


def _undo_state_changes(seal: Seal, plan: Plan | Callable[[], Plan] | None,
                        materialized: Materialized) -> None:
    """Put back what registration's third-party code changed of opregistry; roll its author back.

    ``plan``: the plan registered, or how to decode it (a replayed program's).

    The author is the distribution owning the file of the code that made the
    change (a kernel module is its distribution's, wherever it lies); with
    none, the problem names nobody and nothing is rolled back.  The
    distributions whose kernels are for the rolled-back one's ops go with it.
    """
    changes = seal.check()
    if not changes:
        return
    from .ownership import Owners, change_culprit, state_problem
    from .plan_modules import modules_by_distribution

    resolved = plan() if callable(plan) else plan
    assert resolved is not None

    origins = {o.distribution: o for o in resolved.distributions}
    owners = Owners([], files=_reference_files(modules_by_distribution(resolved), origins))
    culprit = change_culprit(changes, None, owners)
    if culprit is None:
        materialized.problems.append(state_problem(None, changes, "registering kernels"))
        return
    out = {culprit.distribution}
    materialized.roll_back(culprit, _ops_of(resolved, out), state_problem(
        culprit, changes, "its kernels were registered"))
    for k in resolved.kernels():
        origin = k.kernel.origin
        if k.status == "active" and origin is not None and origin.distribution not in out and \
                k.kernel.op in _ops_of(resolved, {culprit.distribution}):
            out.add(origin.distribution)
            materialized.roll_back(origin, _ops_of(resolved, {origin.distribution}), Problem(
                code="materialize-dependency-failed",
                message=f"{origin}: left out because the op {k.kernel.op} it implements was "
                        f"rolled back with {culprit.dist}", hint=f"fix {culprit.distribution} first",
                culprits=(origin,), op=k.kernel.op, key=k.kernel.key))


def _ops_of(plan: Plan, distributions: set[str]) -> list[str]:
    return [op.op.qualname for op in plan.ops
            if op.op.origin is not None and op.op.origin.distribution in distributions]


def _reference_files(modules: dict[str, set[str]], origins: dict[str, Any]) -> dict[str, Any]:
    """file -> the distribution whose plan references the module it belongs to."""
    import os

    from .locate import locate_module

    files = {}
    for dist, names in modules.items():
        for module in names:
            if module.startswith(("file:", "path:")) or dist not in origins:
                continue
            found = locate_module(module).file
            if found is not None:
                files.setdefault(os.path.abspath(found), origins[dist])
    return files


def cached_plan_id() -> str | None:
    """The id of this environment's cached plan when :func:`plan` would return it as it is.

    The checks of a load (the entry's stamps, the backends collected again,
    the environment read again), without decoding the plan: what ``opregistry
    list --json`` needs to print a listing kept of it (:func:`opregistry.plancache.listing`).
    """
    settings = _settings(None, None, None, None)
    with process().lock, _importing_plugins("plan"), gc_paused():
        lock_gate = gate(settings)
        cache = PlanCache(settings, torch_imported="torch" in sys.modules)
        entry = cache.lookup() if cache.enabled else None
        if entry is None or "uncacheable" in entry or entry["gate"] != _gate_part(lock_gate):
            return None
        try:
            live = collect(load_origins(lock_gate.settings, backends_to_load(entry)))
            dispatcher = _snapshot() if "torch" in sys.modules else None
            found = compare(entry, live.declarations, dispatcher)
        except Exception as exc:  # noqa: BLE001 - an unusable entry is a miss
            log.debug("plan cache entry unusable", error=repr(exc))
            return None
    return entry["id"] if found is not None and found[0] == "hit" else None


def check_cache(*, plugins: Iterable[str] | None = None, block: Iterable[str] | None = None,
                policy: Policy | None = None) -> tuple[Problem, ...]:
    """Read every distribution's declarations again and compare them with the plan cache's.

    One ``cache-declarations-differ`` problem per distribution whose
    declarations differ from those cached for the same inputs (its
    declaration code reads something outside them); ``()`` when the cache
    holds no valid entry for this environment.  ``opregistry doctor`` runs it.
    """
    settings = _settings(None, plugins, block, policy)
    entry = PlanCache(settings, torch_imported="torch" in sys.modules).lookup()
    if entry is None or "uncacheable" in entry:
        return ()
    with process().lock, _importing_plugins("plan"), gc_paused():
        lock_gate = gate(settings)
        fresh = collect(lock_gate.apply(discover(lock_gate.settings))).declarations
    return tuple(drift(entry, fresh))


def current_plan() -> Plan:
    """The plan of the loaded registry, or :func:`plan` (no torch) when none is loaded."""
    loaded = get_registry()
    return loaded.plan if loaded is not None else plan()


def verify_lock(path: PathLike = DEFAULT_LOCKFILE, plan: Plan | None = None) -> str:
    """Check that this environment resolves the registry recorded in the lockfile ``path``.

    Compares the lockfile with ``plan`` (default: the plan of the loaded
    registry, or :func:`opregistry.plan` when nothing is loaded -- which does
    not import torch).  Returns the fingerprint when they agree; raises
    :class:`~opregistry.LockMismatchError` listing every difference otherwise.
    """
    return verify_plan(path, plan if plan is not None else current_plan())
