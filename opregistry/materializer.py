"""Stage 4, materialize: execute a plan's registration steps, rolling back a distribution whole.

:func:`opregistry.steps.plan_steps` lists what to register, in order; the
executor here runs each step.  The core defines ops itself
(``Library.define``); every kernel is registered by the backend plugin that
owns its kind and key, through the ``opregistry_materialize_kernel`` hook.
Each distribution gets its own ``torch.library.Library`` objects, kept alive
by the returned :class:`Materialized` (a collected ``Library`` unregisters
its ops).  One distribution is all-or-nothing: if torch rejects any of its
registrations, or a kernel reference does not import, every ``Library`` of
that distribution is destroyed, and so are those of distributions whose
kernels target its ops.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any, Callable, Iterable, Mapping

import attrs
from attrs import define, field

from . import guard
from .config import Policy
from .errors import MaterializationError
from .containment import contain
from .imports import after_import
from .logs import get_logger
from .kinds import DeviceKernel
from .model import Kernel, OpDef, Origin, Problem, describe_ref, evolve_unchecked
from .native_load import load_failure, load_native
from .plans import OpPlan, Plan
from .program import NO_EXTRAS, SAME_AS_OP
from .selection import Step as Link
from .selection import chain, counted, counting_forced, observer, print_counts_at_exit
from .state import gc_paused, process
from .steps import Step, Steps, plan_steps
from .torch_state import (destroy_library, device_keyset, forget_destroyed_kernels, lookup_op,
                          new_library, recorder, registering, torch_importing_alone)

__all__ = ["Materialized", "materialize", "gc_paused", "defined_ops", "Replay", "counting"]

log = get_logger()


def defined_ops() -> frozenset[str]:
    """Ops defined through opregistry (by any live registry) in this process."""
    return frozenset(process().defined)


@define
class Materialized:
    """The live registrations: ``Library`` objects per distribution."""

    libraries: dict[str, list[Any]] = field(factory=dict)
    ops: list[str] = field(factory=list)
    problems: list[Problem] = field(factory=list)
    failed: dict[str, Origin] = field(factory=dict)
    #: unloaded: registrations still waiting for a package's import are dropped
    destroyed: bool = False

    def roll_back(self, origin: Origin, ops: Iterable[str], problem: Problem) -> None:
        """Unregister one distribution after the fact (``ops``: those it defined), with its problem.

        For a verdict reached once registration is over (its code changed
        opregistry's own state while it ran: :mod:`opregistry.seal`).
        """
        for lib in reversed(self.libraries.pop(origin.distribution, [])):
            destroy_library(lib)
        forget_destroyed_kernels()
        gone = set(ops)
        self.ops[:] = [op for op in self.ops if op not in gone]
        process().defined.difference_update(gone)
        self.failed[origin.distribution] = origin
        self.problems.append(problem)

    def destroy(self) -> None:
        """Unregister everything, in reverse order of registration."""
        self.destroyed = True
        for libs in reversed(list(self.libraries.values())):
            for lib in reversed(libs):
                destroy_library(lib)
        forget_destroyed_kernels()
        process().defined.difference_update(self.ops)
        self.libraries.clear()
        self.ops.clear()


class _DistLibraries:
    """The ``Library`` objects of one distribution, created on first use."""

    def __init__(self, origin: Origin, owned: dict[str, str],
                 sites: Mapping[tuple[str, str], str]) -> None:
        self.origin = origin
        self.owned = owned  # namespace -> "DEF" | "FRAGMENT"
        self.sites = sites
        self.libs: dict[str, Any] = {}

    def get(self, namespace: str) -> Any:
        lib = self.libs.get(namespace)
        if lib is None:
            # torch names the declaration's line in its own messages, not opregistry's
            site = self.sites.get((self.origin.distribution, namespace))
            with registering():  # opregistry's own: the recorder of foreign registrations skips it
                lib = self.libs[namespace] = new_library(
                    namespace, self.owned.get(namespace, "IMPL"), site)
            if site:
                process().library_sites.add(site)
            if self.owned.get(namespace) == "DEF":  # torch refuses a second DEF, not a FRAGMENT
                process().namespace_holders[namespace] = self.origin.dist + (
                    f" ({site})" if site else "")
        return lib

    def destroy(self) -> None:
        holders = process().namespace_holders
        for namespace, lib in reversed(list(self.libs.items())):
            destroy_library(lib)
            if self.owned.get(namespace) == "DEF":
                holders.pop(namespace, None)
        self.libs.clear()
        forget_destroyed_kernels()


def _define(lib: Any, plan: OpPlan) -> None:
    _define_op(lib, plan.op)


def _define_op(lib: Any, op: OpDef) -> None:
    # torch is imported (the recorder is installed first): read, not imported, 10,000 times
    # at ``import torch``, where an import statement of torch waits on its module lock
    torch = sys.modules["torch"]
    missing = [t for t in op.tags if not hasattr(torch.Tag, t)]
    if missing:  # the resolver refuses these first (op-tag-needs-newer-torch)
        raise MaterializationError(f"torch {torch.__version__} has no torch.Tag {missing}")
    tags = tuple(getattr(torch.Tag, t) for t in op.tags)
    lib.define(op.full_schema, tags=tags)


def _route_factory(lib: Any, plan: OpPlan) -> None:
    """A factory op has no tensor to dispatch on: route by its ``device`` argument."""
    import torch

    schema = plan.parsed
    index = next(i for i, a in enumerate(schema.arguments) if a.type.base == "Device")
    name = schema.arguments[index].name
    kwarg_only = schema.arguments[index].kwarg_only
    qualname = plan.op.qualname
    cache: dict[str, Any] = {}

    def backend_select(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        device = kwargs.get(name) if kwarg_only or len(args) <= index else args[index]
        device_type = torch.device(device).type if device is not None else "cpu"
        key = cache.get(device_type)
        if key is None:
            key = cache[device_type] = device_keyset(device_type)
        overload = cache.get("op")
        if overload is None:
            overload = cache["op"] = lookup_op(qualname)
        return overload.redispatch(key, *args, **kwargs)

    lib.impl(plan.op.name_with_overload, backend_select, "BackendSelect", with_keyset=True)


def materialize(plan: Plan, materializers: dict[tuple[str, str], Callable[..., Any]],
                policy: Policy | None = None, steps: Steps | None = None) -> Materialized:
    """Register ``plan`` with torch; a failing distribution is rolled back whole.

    Kernel modules are imported here, each the first time under
    :func:`opregistry.guard.run`: what one raises, or registers with torch by
    itself outside the plan (undone unless ``policy`` allows it), fails its
    distribution.  ``steps``: the plan's, when they were made already
    (:func:`~opregistry.steps.plan_steps`).
    """
    # the hook of the backend the resolver chose for each key: materializers are
    # keyed by (distribution, backend name), and a left-out distribution may reuse a name
    chosen = {b.backend.name: materializers[(b.backend.origin.distribution, b.backend.name)]
              for b in plan.backends if b.backend.origin is not None
              and (b.backend.origin.distribution, b.backend.name) in materializers}
    with gc_paused():
        steps = steps if steps is not None else plan_steps(plan)
        recorder()  # from now on, every registration through torch.library is attributed
        return Executor(steps, chosen, policy or Policy(), _counting()).run()


def _counting() -> bool:
    """Whether kernels are registered counting (``OPREGISTRY_KERNEL_COUNTS``, ``kernel_counts()``)."""
    if _counts_asked():
        print_counts_at_exit()
        return True
    return counting_forced()


def _counts_asked() -> bool:
    import os

    from .config import COUNTS_VAR, parse_flag

    return parse_flag(os.environ.get(COUNTS_VAR), False, COUNTS_VAR)


def counting() -> bool:
    """Whether a load now would register kernels counting: a program is then not replayed
    (its kernels are registered as they are)."""
    return _counts_asked() or counting_forced()


_MISSING = object()


def imported_in_full(module: str) -> bool:
    """Whether ``module`` is imported and done initializing."""
    loaded = sys.modules.get(module)
    return loaded is not None and not guard.initializing(loaded)


def _read(ref: Any, must_call: bool) -> Any:
    """What ``ref`` names when its module is imported in full already; ``_MISSING`` otherwise.

    The common case, a function of a module imported in full: read from the
    module's own namespace, no code of the plugin runs, so there is nothing
    to contain.
    """
    if not isinstance(ref, str):
        return ref
    module, _, attribute = ref.partition(":")
    loaded = sys.modules.get(module)
    if type(loaded) is not ModuleType or guard.initializing(loaded):
        return _MISSING
    found = loaded.__dict__.get(attribute, _MISSING)
    return found if found is _MISSING or callable(found) or not must_call else _MISSING


_BUILTIN = DeviceKernel.__module__


class _Importer:
    """Imports what kernel declarations reference, contained, for one materialization.

    A reference into a module imported in full already is read from its
    namespace; anything else is imported through :func:`opregistry.guard.run`,
    which contains what the module raises and, for a module imported for the
    first time, watches what it registers with torch by itself (``watched``:
    the namespaces it must not touch).  Warnings go to ``warnings``.
    """

    def __init__(self, watched: frozenset[str], policy: Policy, warnings: list[Problem]) -> None:
        self.watched = watched
        self.policy = policy
        self.warnings = warnings
        #: (reference, must be callable) -> what it names, once read from a module imported in
        #: full (one fake kernel or backward often serves many ops)
        self.read: dict[tuple[str, bool], Any] = {}

    def payload(self, kernel: Any) -> tuple[Any, Problem | None]:
        """``kernel.payload`` with every reference its kind lists imported, or the problem."""
        payload = kernel.payload
        changes = {}
        read = self.read
        for name, want in payload.kind.references:
            ref = getattr(payload, name)
            if ref is None:
                continue
            must_call = want != "object"
            value = read.get((ref, must_call), _MISSING) if isinstance(ref, str) else ref
            if value is _MISSING:
                value, problem = self.reference(ref, kernel, must_call)
                if problem is not None:
                    return None, problem
            changes[name] = value
        if not changes:
            return payload, None
        if type(payload).__module__ == _BUILTIN:  # the core's own kinds: known to take it
            return evolve_unchecked(payload, **changes), None
        return attrs.evolve(payload, **changes), None

    def reference(self, ref: Any, kernel: Any, must_call: bool) -> tuple[Any, Problem | None]:
        """What ``ref`` names, imported contained; or the problem that fails its distribution."""
        found = _read(ref, must_call)
        if found is not _MISSING:
            self.read[(ref, must_call)] = found
            return found, None
        module = ref.partition(":")[0] if isinstance(ref, str) else None
        loaded = sys.modules.get(module) if module else None
        # a module imported already runs no code of its own: contained, but not watched
        fresh = module is not None and (loaded is None or guard.initializing(loaded))
        outcome = guard.run(guard.resolve_ref, ref, must_call, origin=kernel.origin,
                            what=f"importing {module or ref}",
                            protected=self.watched if fresh else None, policy=self.policy,
                            owns=guard.owned_by(module) if fresh and module else None)
        error = None
        for p in outcome.problems:
            if p.severity != "error":
                self.warnings.append(p)
            elif error is None:
                error = p
        if outcome.error is not None:
            # the line that raised in the kernel module, else the kernel's declaration
            return None, load_failure(kernel.origin,
                                      f"importing {describe_ref(ref)} for {kernel.op}",
                                      outcome.error, kernel.op, kernel.key,
                                      guard.raised_at(outcome.error) or kernel.source)
        return outcome.result, error


def _call_backend(hook: Callable[..., Any], backend: str | None, culprit: Any, what: str | None,
                  *registration: Any) -> Problem | None:
    """Call ``backend``'s materialize ``hook``, contained: ``None``, or the problem that fails it.

    ``registration``: the hook's arguments, in the order of
    :data:`opregistry.collect.MATERIALIZE_ARGS` (library, op, kernel, payload,
    fn). ``culprit``: the kernel whose distribution fails; ``what`` names the
    registration in the message (``None``: the culprit kernel's, made only
    on failure -- thousands of kernels succeed).
    """
    thread = process().thread  # registering(), inlined: entered for each of 40,000 kernels
    outer, thread.registering = thread.registering, True
    importing = torch_importing_alone()  # inside `import torch`: its imports skip the lock
    if importing is not None:
        importing._initializing = False
    try:
        done, exc = contain(hook, *registration)
    finally:
        thread.registering = outer
        if importing is not None:
            importing._initializing = True
    if exc is None and not done:
        exc = MaterializationError(f"backend {backend} did not register it (returned {done!r})")
    if exc is not None:
        what = what or f"the {culprit.key} kernel of {culprit.op}"
        return load_failure(culprit.origin, f"registering {what} (backend {backend})", exc,
                            culprit.op, culprit.key, culprit.source)
    return None


class Executor:
    """Runs the steps of a plan (:class:`~opregistry.steps.Steps`) and rolls back what fails.

    A step of a distribution that failed already is skipped; a distribution
    whose kernels target an op of a failed one fails too
    (``materialize-dependency-failed``), decided once every plain kernel is
    registered and again at the end.  Failed distributions lose every
    ``Library`` they had.
    """

    def __init__(self, steps: Steps, materializers: dict[str, Callable[..., Any]],
                 policy: Policy, count: bool) -> None:
        self.steps = steps
        self.materializers = materializers
        self.policy = policy
        self.count = count
        self.libs = {d: _DistLibraries(o, dict(steps.owned.get(d, {})), steps.sites)
                     for d, o in sorted(steps.origins.items())}
        self.result = Materialized()
        self.failed: dict[str, Problem] = {}
        self.importer = _Importer(steps.watched, policy, self.result.problems)
        #: id of a candidate's KernelPlan -> (the callable a chain calls, its predicate)
        self.imported: dict[int, tuple[Any, Any]] = {}

    def run(self) -> Materialized:
        settled = False
        failed, actions = self.failed, _ACTIONS
        for step in self.steps.steps:
            if step.action == "register-candidates" and not settled:
                self._settle()  # chains are anchored in distributions that stay
                settled = True
            distribution = step.origin.distribution
            if distribution in failed:
                continue
            problem = actions[step.action](self, step)
            if problem is not None:
                failed[distribution] = problem
        self._settle()
        return self._finish()

    # -- the actions ----------------------------------------------------------------

    def _load_native(self, step: Step) -> Problem | None:
        if any(d in self.failed for d in step.definers):
            return None  # its kernels would wait in the dispatcher for ops that never come
        return load_native(step.subject, self.steps.watched, self.policy,
                           self.result.problems, self.steps.planned)

    def _define(self, step: Step) -> Problem | None:
        return self._defining(step, _define)

    def _route_factory(self, step: Step) -> Problem | None:
        return self._defining(step, _route_factory)

    def _defining(self, step: Step, action: Callable[[Any, OpPlan], None]) -> Problem | None:
        op: OpPlan = step.subject
        try:
            with registering():
                action(self.libs[step.distribution].get(step.namespace), op)
        except Exception as exc:
            return load_failure(step.origin, f"defining {op.op.full_schema}", exc,
                                op.op.qualname, None, op.op.source)
        return None

    def _register(self, step: Step) -> Problem | None:
        op, planned = step.subject
        if planned.after and not imported_in_full(planned.after):
            # a kernel for a package's op: once the package registered its own, or it wins
            self._defer(step, planned)
            return None
        kernel = planned.kernel
        payload, problem = self.importer.payload(kernel)
        if problem is not None:
            return problem
        kind = payload.kind
        if self.count and kind.countable:
            label = f"{describe_ref(kernel.fn)} ({kernel.origin.dist})"
            payload = attrs.evolve(payload, **{kind.primary: counted(
                kernel.op, kernel.key, label, getattr(payload, kind.primary))})
        backend = planned.backend
        return _call_backend(self.materializers[backend], backend, kernel, None,
                             self.libs[step.origin.distribution].get(step.namespace),
                             op.op if op else None, kernel, payload,
                             getattr(payload, kind.primary))

    def _defer(self, step: Step, planned: Any) -> None:
        """Register ``step`` right after the package registers its own kernel for the key
        (seen by the recorder), or after its module is imported (a C++ kernel): the first."""
        done: list[bool] = []

        def once(*_: Any) -> None:
            if not done:
                done.append(True)
                self._register_late(step)

        kernel = planned.kernel
        slots = [(kernel.op, kernel.key)] + ([(kernel.op, "Fake")] if kernel.key == "Meta" else [])
        for slot in slots:
            process().after_registration.setdefault(slot, []).append(once)
        after_import(planned.after, once)

    def _register_late(self, step: Step) -> None:
        """``step``, once the package whose op it targets has registered its own kernel."""
        if step.distribution in self.failed or self.result.destroyed:
            return
        _, planned = step.subject
        planned = attrs.evolve(planned, after=None)
        problem = self._register(step._replace(subject=(step.subject[0], planned)))
        if problem is not None:
            process().late_problems.append(problem)
            log.warning("a kernel registered after its package's import failed",
                        distribution=step.origin.dist, problem=problem.message)
            return
        dl = self.libs[step.distribution]
        self.result.libraries[step.distribution] = list(dl.libs.values())

    def _import_candidate(self, step: Step) -> Problem | None:
        planned = step.subject
        kernel = planned.kernel
        payload, problem = self.importer.payload(kernel)
        predicate = None
        if problem is None and kernel.predicate is not None:
            predicate, problem = self.importer.reference(kernel.predicate, kernel, True)
        if problem is not None:
            return problem
        fn = getattr(payload, kernel.kind.primary)
        if kernel.kind.candidate_adapter is not None:
            fn = guard.resolve_ref(kernel.kind.candidate_adapter)(fn)
        self.imported[id(planned)] = (fn, predicate)
        return None

    def _register_candidates(self, step: Step) -> Problem | None:
        """Each chain of candidates is one kernel for torch, registered by its key's backend
        in the library of its last surviving candidate (usually the op owner's fallback)."""
        op, members = step.subject
        if op.op.origin is not None and op.op.origin.distribution in self.failed:
            return None
        alive = [k for k in members
                 if k.kernel.origin.distribution not in self.failed and id(k) in self.imported]
        if not alive:
            return None
        anchor = alive[-1].kernel
        candidates = [Link(fn=self.imported[id(k)][0], predicate=self.imported[id(k)][1],
                                capability=k.kernel.when.capability if k.kernel.when else None,
                                label=f"{describe_ref(k.kernel.fn)} ({k.kernel.origin.dist})")
                      for k in alive]
        qualname, key = step.op, step.key
        fn = chain(qualname, key, candidates,
                   observer(qualname, key, [c.label for c in candidates]) if self.count else None,
                   keywords=any(a.kwarg_only for a in op.parsed.arguments))
        problem = _call_backend(
            self.materializers[alive[-1].backend], alive[-1].backend, anchor, f"the {key} kernel candidates of {qualname}",
            self.libs[anchor.origin.distribution].get(anchor.namespace), op.op,
            attrs.evolve(anchor, payload=DeviceKernel(fn)), DeviceKernel(fn), fn)
        if problem is not None:
            self.failed[anchor.origin.distribution] = problem
        return None

    # -- roll-back ------------------------------------------------------------------

    def _settle(self) -> None:
        """Fail every distribution whose kernels target an op of a failed one, until none is left."""
        while self.failed:  # none failed (the usual case): no step to look at
            failed_ops = {op for op, dist in self.steps.definers.items() if dist in self.failed}
            dependents = {}
            for step in self.steps.steps:
                dist = step.distribution
                if (step.action != "register" or dist in self.failed or dist in dependents
                        or step.op not in failed_ops):
                    continue
                op = step.subject[0]
                dependents[dist] = _dependency_failed(self.steps.origins[dist], step.op,
                                                      step.key, op.op.origin if op else None)
            if not dependents:
                return
            self.failed.update(dependents)

    def _finish(self) -> Materialized:
        result = self.result
        for dist, problem in self.failed.items():
            self.libs[dist].destroy()
            result.problems.append(problem)
            result.failed[dist] = self.steps.origins[dist]
            log.warning("distribution rolled back", distribution=self.steps.origins[dist].dist,
                        problem=problem.message)
        for dist, dl in self.libs.items():
            if dist not in self.failed and dl.libs:
                result.libraries[dist] = list(dl.libs.values())
        result.ops = [op for op, dist in self.steps.definers.items() if dist not in self.failed]
        process().defined.update(result.ops)
        return result


def _dependency_failed(origin: Origin, op: str | None, key: str | None,
                       owner: Origin | None) -> Problem:
    """The problem of ``origin``, left out because it implements ``op`` of ``owner``, which
    failed."""
    return Problem(code="materialize-dependency-failed",
                   message=f"{origin}: left out because the op {op} it implements could not "
                           f"be registered by {owner}",
                   hint=f"fix {owner.distribution if owner else 'its definer'} first",
                   culprits=(origin,), op=op, key=key)


#: each step's action, by name: functions of the class, not an instance's bound methods (a
#: table of those on the instance would hold it in a reference cycle, and with it every step
#: and record of the plan until the next full collection)
_ACTIONS: dict[str, Callable[[Executor, Step], Problem | None]] = {
    "load-native": Executor._load_native, "define": Executor._define,
    "route-factory": Executor._route_factory, "load-native-impl": Executor._load_native,
    "register": Executor._register, "import-candidate": Executor._import_candidate,
    "register-candidates": Executor._register_candidates}


class Replay:
    """Registers a cached plan's program (:mod:`opregistry.program`) as the executor would.

    The same calls the :class:`Executor` makes for the same plan, in the same
    order, from the program's rows: an :class:`~opregistry.model.OpDef` per op
    and a :class:`~opregistry.model.Kernel` per kernel are all that is built,
    no plan nor step.  A distribution whose registration fails is rolled back
    whole, with those whose kernels implement its ops, as the executor does.
    :meth:`run` returns ``None`` only when a row cannot be read (a program this
    opregistry did not write): nothing is registered then, and the load
    registers the decoded plan.
    """

    def __init__(self, program: Mapping[str, Any], decoder: Any,
                 materializers: dict[tuple[str, str], Callable[..., Any]],
                 policy: Policy | None = None) -> None:
        self.program = program
        self.decoder = decoder
        self.hooks = {name: materializers[(dist, name)]
                      for dist, name in program["backends"] if (dist, name) in materializers}
        self.result = Materialized()
        self.importer = _Importer(frozenset(program["watched"]), policy or Policy(),
                                  self.result.problems)
        owned: dict[str, dict[str, str]] = {}
        for dist, namespace, kind in program["libraries"]:
            owned.setdefault(dist, {})[namespace] = kind
        self.owned = owned
        self.sites = {(dist, namespace): site for dist, namespace, site in program["sites"]}
        self.libs: dict[str, _DistLibraries] = {}
        #: distribution -> the problem that failed it, and its origin
        self.failed: dict[str, Problem] = {}
        self.origins: dict[str, Origin] = {}

    def run(self) -> Materialized | None:
        try:
            ops, kernels = self._decode()
        except Exception as exc:  # noqa: BLE001 - a row it cannot read: the plan is registered
            log.debug("program not replayed", error=repr(exc))
            return None
        with gc_paused():
            recorder()  # from now on, every registration through torch.library is attributed
            self._define(ops)
            self._register(ops, kernels)
            self._settle(ops, kernels)
            return self._finish(ops)

    def _decode(self) -> tuple[list[OpDef], list[tuple[Any, str, Kernel]]]:
        """Every op and kernel of the program, before anything is registered."""
        program, decoder = self.program, self.decoder
        ops = [decoder.op(row) for row in program["ops"]]
        qualnames = [op.qualname for op in ops]
        names = program["names"]
        payloads = [decoder.payload(row) for row in program["payloads"]]
        make, kernels = decoder.kernel_of, []
        for at, backend, name, key, payload, source, origin, *extras in program["kernels"]:
            op = ops[at] if at >= 0 else None
            if op is not None:
                name = qualnames[at] if name == SAME_AS_OP else name
                source = op.source if source == SAME_AS_OP else source
            backend, key = names[backend], names[key]
            kernel = make((name, key, payloads[payload], *(extras or NO_EXTRAS), source, origin))
            if kernel.origin is None or backend not in self.hooks:
                raise ValueError(f"the {key} kernel of {name}: no distribution or backend")
            kernels.append((op, backend, kernel))
        if any(op.origin is None for op in ops):
            raise ValueError("an op without its distribution")
        return ops, kernels

    def _library(self, origin: Origin, namespace: str) -> Any:
        dl = self.libs.get(origin.distribution)
        if dl is None:
            dl = self.libs[origin.distribution] = _DistLibraries(
                origin, self.owned.get(origin.distribution, {}), self.sites)
        return dl.get(namespace)

    def _define(self, ops: list[OpDef]) -> None:
        failed = self.failed
        with registering():
            for op in ops:
                origin = op.origin
                if origin.distribution in failed:
                    continue
                try:
                    _define_op(self._library(origin, op.namespace), op)
                except Exception as exc:
                    failed[origin.distribution] = load_failure(
                        origin, f"defining {op.full_schema}", exc, op.qualname, None, op.source)
                    self.origins[origin.distribution] = origin

    def _register(self, ops: list[OpDef], kernels: list[tuple[Any, str, Kernel]]) -> None:
        payload_of, hooks, failed = self.importer.payload, self.hooks, self.failed
        lib, where = None, None  # an op's kernels of one distribution come one after another
        # kernels share the program's payloads: each imported once (a failure is each
        # kernel's own, named for its distribution)
        imported: dict[int, Any] = {}
        for op, backend, kernel in kernels:
            origin = kernel.origin
            if origin.distribution in failed:
                continue
            payload = imported.get(id(kernel.payload))
            problem = None
            if payload is None:
                payload, problem = payload_of(kernel)
                if problem is None:
                    imported[id(kernel.payload)] = payload
            if problem is None:
                if where != (op, origin) or op is None:
                    where = (op, origin)
                    lib = self._library(origin, op.namespace if op is not None
                                        else kernel.namespace)
                problem = _call_backend(hooks[backend], backend, kernel, None, lib, op, kernel,
                                        payload, getattr(payload, payload.kind.primary))
            if problem is not None:
                failed[origin.distribution] = problem
                self.origins[origin.distribution] = origin

    def _settle(self, ops: list[OpDef], kernels: list[tuple[Any, str, Kernel]]) -> None:
        """Fail every distribution whose kernels implement an op of a failed one (as
        :meth:`Executor._settle`)."""
        while self.failed:
            failed_ops = {op.qualname: op.origin for op in ops
                          if op.origin.distribution in self.failed}
            dependents = {}
            for _, _, kernel in kernels:
                dist = kernel.origin.distribution
                if dist in self.failed or dist in dependents or kernel.op not in failed_ops:
                    continue
                dependents[dist] = _dependency_failed(kernel.origin, kernel.op, kernel.key,
                                                      failed_ops[kernel.op])
                self.origins[dist] = kernel.origin
            if not dependents:
                return
            self.failed.update(dependents)

    def _finish(self, ops: list[OpDef]) -> Materialized:
        result = self.result
        for dist, problem in self.failed.items():
            dl = self.libs.get(dist)
            origin = self.origins[dist]
            if dl is not None:
                dl.destroy()
            result.problems.append(problem)
            result.failed[dist] = origin
            log.warning("distribution rolled back", distribution=origin.dist,
                        problem=problem.message)
        result.libraries = {d: list(self.libs[d].libs.values()) for d in sorted(self.libs)
                            if d not in self.failed and self.libs[d].libs}
        result.ops = [op.qualname for op in ops if op.origin.distribution not in self.failed]
        process().defined.update(result.ops)
        return result
