"""Stage 4, materialize: turn a :class:`~opregistry.plan.Plan` into torch registrations.

The core defines namespaces and ops itself (``Library.define``); every kernel
is registered by the backend plugin that owns its dispatch key, through the
``opregistry_materialize_kernel`` hook.  Each distribution gets its own
``torch.library.Library`` objects, kept alive by the returned
:class:`Materialized` (a collected ``Library`` unregisters its ops).  One
distribution is all-or-nothing: if torch rejects any of its registrations,
or a kernel reference does not import, every ``Library`` of that
distribution is destroyed, and so are those of distributions whose kernels
target its ops.
"""

from __future__ import annotations

import contextlib
import gc
import sys
from collections import defaultdict
from types import ModuleType
from typing import Any, Callable, Iterable, Iterator

import attrs
from attrs import define, field

from . import guard
from .backend import eager_triton
from .config import Policy
from .containment import describe, must_propagate
from .errors import MaterializationError
from .logs import get_logger
from .keys import AUTOCAST_KEYS, COMPOSITE_KEYS, DEVICE_KEYS
from .model import Origin, Problem, describe_ref, resolve_ref
from .plan import NativePlan, OpPlan, Plan
from .selection import Step, chain, counted, counting_forced, observer, print_counts_at_exit
from .torch_state import destroy_library, device_keyset, lookup_op

__all__ = ["Materialized", "materialize", "gc_paused", "defined_ops"]

log = get_logger()

#: every op opregistry has defined and not yet unregistered, in this process
_defined: set[str] = set()


def defined_ops() -> frozenset[str]:
    """Ops defined through opregistry (by any live registry) in this process."""
    return frozenset(_defined)


@define
class Materialized:
    """The live registrations: ``Library`` objects per distribution."""

    libraries: dict[str, list[Any]] = field(factory=dict)
    ops: list[str] = field(factory=list)
    problems: list[Problem] = field(factory=list)
    failed: dict[str, Origin] = field(factory=dict)

    def roll_back(self, origin: Origin, ops: Iterable[str], problem: Problem) -> None:
        """Unregister one distribution after the fact (``ops``: those it defined), with its problem.

        For a verdict reached once registration is over (its code changed
        opregistry's own state while it ran: :mod:`opregistry.seal`).
        """
        for lib in reversed(self.libraries.pop(origin.distribution, [])):
            destroy_library(lib)
        gone = set(ops)
        self.ops[:] = [op for op in self.ops if op not in gone]
        _defined.difference_update(gone)
        self.failed[origin.distribution] = origin
        self.problems.append(problem)

    def destroy(self) -> None:
        """Unregister everything, in reverse order of registration."""
        for libs in reversed(list(self.libraries.values())):
            for lib in reversed(libs):
                destroy_library(lib)
        _defined.difference_update(self.ops)
        self.libraries.clear()
        self.ops.clear()


class _DistLibraries:
    """The ``Library`` objects of one distribution, created on first use."""

    def __init__(self, origin: Origin, owned: dict[str, str]) -> None:
        self.origin = origin
        self.owned = owned  # namespace -> "DEF" | "FRAGMENT"
        self.libs: dict[str, Any] = {}

    def get(self, namespace: str) -> Any:
        lib = self.libs.get(namespace)
        if lib is None:
            from torch.library import Library

            lib = self.libs[namespace] = Library(namespace, self.owned.get(namespace, "IMPL"))
        return lib

    def destroy(self) -> None:
        for lib in reversed(list(self.libs.values())):
            destroy_library(lib)
        self.libs.clear()


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while the pipeline builds its records.

    Discovery, collection, resolution and materialization allocate tens of
    thousands of small, long-lived objects (records, closures, torch
    registrations).  With torch's million objects already on the heap, the
    collector's full passes made the pipeline grow faster than linearly:
    loading 10,000 ops took ~26 s with it and ~5 s without, on a loaded
    2-core machine (docs/performance.md).
    Nothing here depends on cycles being freed during the load; the collector
    is restored (and runs as usual) afterwards, also on error.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _failure(origin: Origin, what: str, exc: BaseException, op: str | None,
             key: str | None, source: str | None) -> Problem:
    message = f"{origin}: {what} failed: {describe(exc)}"
    error = MaterializationError(message, origin=origin, op=op, key=key)
    error.__cause__ = exc  # torch's own exception, for the traceback
    return Problem(
        code="materialize-failed",
        message=message,
        error=error,
        hint=f"fix {origin.distribution}; nothing of it was registered",
        culprits=(origin,),
        op=op,
        key=key,
        source=source,
    )


def _define(lib: Any, plan: OpPlan) -> None:
    import torch

    op = plan.op
    missing = [t for t in op.tags if not hasattr(torch.Tag, t)]
    if missing:  # the resolver refuses these first (op-tag-needs-newer-torch)
        raise MaterializationError(f"torch {torch.__version__} has no torch.Tag {missing}")
    tags = tuple(getattr(torch.Tag, t) for t in op.tags)
    lib.define(op.full_schema, tags=tags)
    if plan.parsed.is_factory:
        _register_backend_select(lib, plan)


def _register_backend_select(lib: Any, plan: OpPlan) -> None:
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
                policy: Policy | None = None) -> Materialized:
    """Register ``plan`` with torch; a failing distribution is rolled back whole.

    Kernel modules are imported here, each the first time under
    :func:`opregistry.guard.run`: what one raises, or registers with torch by
    itself outside the plan (undone unless ``policy`` allows it), fails its
    distribution.
    """
    # the hook of the backend the resolver chose for each key: materializers are
    # keyed by (distribution, backend name), and a left-out distribution may reuse a name
    chosen = {b.backend.name: materializers[(b.backend.origin.distribution, b.backend.name)]
              for b in plan.backends if b.backend.origin is not None
              and (b.backend.origin.distribution, b.backend.name) in materializers}
    with gc_paused():
        return _materialize(plan, chosen, policy or Policy(), _counting())


def _counting() -> bool:
    """Whether kernels are registered counting (``OPREGISTRY_KERNEL_COUNTS``, ``kernel_counts()``)."""
    import os

    from .config import COUNTS_VAR, parse_flag

    if parse_flag(os.environ.get(COUNTS_VAR), False, COUNTS_VAR):
        print_counts_at_exit()
        return True
    return counting_forced()


def _chained(op: OpPlan) -> dict[tuple[str, str], list[Any]]:
    """The (op, key)s whose active kernels are candidates needing a chain, with them in order.

    Several active candidates, or one that may decline a call; a single
    candidate that takes every call is registered as a plain kernel.
    """
    by_key: dict[str, list[Any]] = defaultdict(list)
    for k in op.kernels:
        if k.rank is not None and k.status == "active" and k.kernel.origin is not None:
            by_key[k.kernel.key].append(k)
    return {(op.op.qualname, key): sorted(members, key=lambda k: k.rank)
            for key, members in by_key.items()
            if len(members) > 1 or members[0].kernel.per_call}


def _resolve_any(ref: Any) -> Any:
    return resolve_ref(ref, want_callable=False)


_MISSING = object()


def _imported(ref: Any, kernel: Any, watched: frozenset[str], policy: Policy,
              warnings: list[Problem]) -> tuple[Any, Problem | None]:
    """The callable ``ref`` names, imported contained; or the problem that fails its distribution."""
    module, _, attribute = ref.partition(":") if isinstance(ref, str) else (None, "", "")
    loaded = sys.modules.get(module) if module else None
    initializing = getattr(getattr(loaded, "__spec__", None), "_initializing", False)
    if type(loaded) is ModuleType and not initializing:
        # the common case, a function of a module imported in full: read from the module's
        # own namespace, no code of the plugin runs, so there is nothing to contain
        found = loaded.__dict__.get(attribute, _MISSING)
        if found is not _MISSING and (callable(found) or kernel.key in AUTOCAST_KEYS):
            return found, None
    # a module imported already runs no code of its own: contained, but not watched
    fresh = module is not None and (loaded is None or initializing)
    # an autocast rule's "kernel" is the torch.dtype it casts to, not a callable
    resolve = resolve_ref if kernel.key not in AUTOCAST_KEYS else _resolve_any
    outcome = guard.run(resolve, ref, origin=kernel.origin, what=f"importing {module or ref}",
                        protected=watched if fresh else None, policy=policy,
                        owns=guard.owned_by(module) if fresh and module else None)
    error = None
    for p in outcome.problems:
        if p.severity != "error":
            warnings.append(p)
        elif error is None:
            error = p
    if outcome.error is not None:
        # the line that raised in the kernel module, else the kernel's declaration
        return None, _failure(kernel.origin, f"importing {describe_ref(ref)} for {kernel.op}",
                              outcome.error, kernel.op, kernel.key,
                              guard.raised_at(outcome.error) or kernel.source)
    return outcome.result, error


def _materialize(plan: Plan, materializers: dict[str, Callable[..., Any]],
                 policy: Policy, count: bool = False) -> Materialized:
    owned: dict[str, dict[str, str]] = defaultdict(dict)
    origins: dict[str, Origin] = {}
    # a namespace a native library defines: its TORCH_LIBRARY block is the DEF (or
    # FRAGMENT); Python adds kernels to it through an IMPL Library
    native = {(n.namespace, n.origin.distribution) for n in plan.natives if n.kind != "IMPL"}
    for ns in plan.namespaces:
        if ns.owner is not None:
            if (ns.name, ns.owner.distribution) not in native:
                owned[ns.owner.distribution][ns.name] = "DEF"
            origins[ns.owner.distribution] = ns.owner
        for frag in ns.fragments:
            if (ns.name, frag.distribution) not in native:
                owned[frag.distribution].setdefault(ns.name, "FRAGMENT")
            origins[frag.distribution] = frag
    kernels_by_dist: dict[str, list[tuple[OpPlan | None, Any]]] = defaultdict(list)
    #: (op, key) -> its active candidates in order, when they need a chain (see below)
    chains: dict[tuple[str, str], tuple[OpPlan, list[Any]]] = {}
    for op in plan.ops:
        for (qualname, key), members in _chained(op).items():
            chains[(qualname, key)] = (op, members)
        for k in op.kernels:
            if k.status == "active" and k.kernel.origin is not None:
                origins.setdefault(k.kernel.origin.distribution, k.kernel.origin)
                if (k.kernel.op, k.kernel.key) not in chains:
                    kernels_by_dist[k.kernel.origin.distribution].append((op, k))
    for k in plan.external_kernels:
        if k.status == "active" and k.kernel.origin is not None:
            kernels_by_dist[k.kernel.origin.distribution].append((None, k))
            origins.setdefault(k.kernel.origin.distribution, k.kernel.origin)

    for n in plan.natives:  # an IMPL library's: it may have no Python piece
        origins.setdefault(n.origin.distribution, n.origin)
    libs = {d: _DistLibraries(origins[d], owned.get(d, {})) for d in sorted(origins)}
    # what kernel modules must not touch by themselves: the plan's namespaces and
    # those of the torch ops it adds kernels to (guard adds torch's reserved ones)
    watched = frozenset(ns.name for ns in plan.namespaces) | frozenset(
        k.kernel.namespace for k in plan.external_kernels)
    result = Materialized()
    failed: dict[str, Problem] = {}

    # native libraries first: their TORCH_LIBRARY blocks define ops others add to
    planned = frozenset(op.op.qualname for op in plan.ops)
    for native_plan in plan.natives:
        dist = native_plan.origin.distribution
        if dist not in failed and native_plan.kind != "IMPL":
            problem = _load_native(native_plan, watched, policy, result.problems, planned)
            if problem is not None:
                failed[dist] = problem

    # definitions next, so that kernels of any distribution find their op
    for op in plan.ops:
        origin = op.op.origin
        assert origin is not None
        dist = origin.distribution
        if dist in failed or (op.op.namespace, dist) in native:
            continue
        try:
            _define(libs[dist].get(op.op.namespace), op)
        except Exception as exc:
            failed[dist] = _failure(origin, f"defining {op.op.full_schema}", exc,
                                    op.op.qualname, None, op.op.source)

    # IMPL libraries' native libraries once the ops they add kernels to are defined
    _load_native_impls(plan, watched, policy, result.problems, planned, failed)

    for dist in sorted(kernels_by_dist):
        if dist in failed:
            continue
        for op, k in kernels_by_dist[dist]:
            kernel = k.kernel
            fn, problem = _imported(kernel.fn, kernel, watched, policy, result.problems)
            if problem is None and kernel.setup_context is not None:
                setup, problem = _imported(kernel.setup_context, kernel, watched, policy,
                                           result.problems)
            else:
                setup = None
            dispatch_class = None
            if problem is None and kernel.dispatch_class is not None:
                dispatch_class, problem = _imported(kernel.dispatch_class, kernel, watched,
                                                    policy, result.problems)
            if problem is not None:
                failed[dist] = problem
                break
            if count and (kernel.key in DEVICE_KEYS or kernel.key in COMPOSITE_KEYS):
                label = f"{describe_ref(kernel.fn)} ({kernel.origin.dist})"
                fn = counted(kernel.op, kernel.key, label, fn)
            problem = _register(
                materializers, k.backend, kernel, f"the {kernel.key} kernel of {kernel.op}",
                library=libs[dist].get(kernel.namespace), op=op.op if op else None,
                kernel=kernel, fn=fn, setup_context=setup, dispatch_class=dispatch_class)
            if problem is not None:
                failed[dist] = problem
                break

    # candidates: every function imported under its own distribution first, so that
    # one that fails leaves out its distribution, not the chain
    imported: dict[int, tuple[Any, Any]] = {}
    for (qualname, key), (op, members) in sorted(chains.items()):
        for k in members:
            dist = k.kernel.origin.distribution
            if dist in failed:
                continue
            fn, problem = _imported(k.kernel.fn, k.kernel, watched, policy, result.problems)
            predicate = None
            if problem is None and k.kernel.predicate is not None:
                predicate, problem = _imported(k.kernel.predicate, k.kernel, watched, policy,
                                               result.problems)
            if problem is not None:
                failed[dist] = problem
                continue
            imported[id(k)] = (fn, predicate)

    # roll back failed distributions, and those whose kernels target their ops
    while True:
        failed_ops = {op.op.qualname for op in plan.ops
                      if op.op.origin and op.op.origin.distribution in failed}
        dependents = {}
        for dist, items in kernels_by_dist.items():
            if dist in failed:
                continue
            for op, k in items:
                if k.kernel.op in failed_ops:
                    owner = op.op.origin if op else None
                    dependents[dist] = Problem(
                        code="materialize-dependency-failed",
                        message=f"{origins[dist]}: left out because the op {k.kernel.op} it "
                                f"implements could not be registered by {owner}",
                        hint=f"fix {owner.distribution if owner else 'its definer'} first",
                        culprits=(origins[dist],), op=k.kernel.op, key=k.kernel.key)
                    break
        if not dependents:
            break
        failed.update(dependents)

    # each chain of candidates is one kernel for torch, registered by the backend of its
    # key in the library of its last surviving candidate (usually the op owner's fallback)
    for (qualname, key), (op, members) in sorted(chains.items()):
        if op.op.origin is not None and op.op.origin.distribution in failed:
            continue
        alive = [k for k in members
                 if k.kernel.origin.distribution not in failed and id(k) in imported]
        if not alive:
            continue
        anchor = alive[-1].kernel
        # a Triton candidate runs eagerly with wrap_triton off, as a Triton kernel does
        steps = [Step(fn=eager_triton(imported[id(k)][0]) if k.kernel.triton else imported[id(k)][0],
                      predicate=imported[id(k)][1],
                      capability=k.kernel.when.capability if k.kernel.when else None,
                      label=f"{describe_ref(k.kernel.fn)} ({k.kernel.origin.dist})")
                 for k in alive]
        problem = _register(
            materializers, alive[-1].backend, anchor,
            f"the {key} kernel candidates of {qualname}",
            library=libs[anchor.origin.distribution].get(anchor.namespace), op=op.op,
            kernel=anchor, setup_context=None,
            fn=chain(qualname, key, steps,
                     observer(qualname, key, [s.label for s in steps]) if count else None,
                     keywords=any(a.kwarg_only for a in op.parsed.arguments)))
        if problem is not None:
            failed[anchor.origin.distribution] = problem

    for dist, problem in failed.items():
        libs[dist].destroy()
        result.problems.append(problem)
        result.failed[dist] = origins[dist]
        log.warning("distribution rolled back", distribution=origins[dist].dist,
                    problem=problem.message)
    for dist, dl in libs.items():
        if dist not in failed and dl.libs:
            result.libraries[dist] = list(dl.libs.values())
    result.ops = [op.op.qualname for op in plan.ops
                  if op.op.origin and op.op.origin.distribution not in failed]
    _defined.update(result.ops)
    return result


def _register(materializers: dict[str, Callable[..., Any]], backend: str, culprit: Any,
              what: str, **registration: Any) -> Problem | None:
    """Call ``backend``'s materialize hook, contained: ``None``, or the problem that fails it."""
    try:
        done = materializers[backend](**registration)
        if not done:
            raise MaterializationError(f"backend {backend} did not register it (returned {done!r})")
    except BaseException as exc:  # noqa: BLE001 - a backend's code, contained
        if must_propagate(exc):
            raise
        # ``culprit``: the kernel whose distribution fails (registration has a ``kernel`` too)
        return _failure(culprit.origin, f"registering {what} (backend {backend})", exc,
                        culprit.op, culprit.key, culprit.source)
    return None


def _load_native(native: NativePlan, watched: frozenset[str], policy: Policy,
                 warnings: list[Problem], planned: frozenset[str]) -> Problem | None:
    """Load ``native``'s library, contained, and check it registered what was declared.

    A library cannot be unloaded: one that loads but does not match its
    declaration stays in the process; its distribution is left out (none of
    its Python pieces is registered) and the problem says so.
    """
    from . import torch_state
    origin, library = native.origin, native.library
    where = (f"the native library {library.target} of namespace {native.namespace!r}"
             if native.kind != "IMPL" else
             f"the native library {library.target} (kernels for namespace {native.namespace!r})")
    version, abi, cuda = torch_state.torch_build()
    mismatch = library.mismatch(version, cuda, abi)
    if mismatch is not None:  # the C++11 ABI, which only a running torch tells
        return _native_problem(
            "native-torch-mismatch", origin, native,
            f"{origin}: {where} was built for {library.built_for()}; the running torch is "
            f"{version} ({mismatch}): it is not loaded",
            f"install the build of {origin.distribution} made for this torch, or rebuild it")
    ops_before, pairs_before = torch_state.dispatcher_registrations()
    outcome = guard.run(torch_state.load_native, library.module, library.path, origin=origin,
                        what=f"loading {library.target}", protected=watched, policy=policy,
                        owns=guard.owned_by(library.module) if library.module else None)
    warnings.extend(p for p in outcome.problems if p.severity != "error")
    if outcome.error is not None:
        problem = _failure(origin, f"loading {where}", outcome.error, None, None, None)
        return attrs.evolve(problem, code="native-load-failed", namespace=native.namespace,
                            hint=f"rebuild or reinstall {origin.distribution} for this torch, or "
                                 f"block it (OPREGISTRY_BLOCK={origin.distribution})")
    errors = [p for p in outcome.problems if p.severity == "error"]
    if errors:
        return errors[0]
    ops_after, pairs_after = torch_state.dispatcher_registrations()
    # a replaced kernel first: unlike the rest, it changes what existing ops do
    return (_replacements(native, where, outcome.result or ())
            or _verify_native(native, where, ops_after, ops_after - ops_before,
                              torch_state.new_kernels(pairs_before, pairs_after), planned))


def _load_native_impls(plan: Plan, watched: frozenset[str], policy: Policy,
                       warnings: list[Problem], planned: frozenset[str],
                       failed: dict[str, Problem]) -> None:
    """Load each IMPL library's native library (``TORCH_LIBRARY_IMPL`` blocks only).

    After the definitions, so that what it registered can be checked on
    defined ops; one whose ops' definer failed is not loaded (its kernels would
    wait in the dispatcher for ops that never come).
    """
    definers = {op.op.qualname: op.op.origin.distribution for op in plan.ops
                if op.op.origin is not None}
    for native_plan in plan.natives:
        dist = native_plan.origin.distribution
        if native_plan.kind != "IMPL" or dist in failed or any(
                definers.get(op) in failed for op, _ in native_plan.keys):
            continue
        problem = _load_native(native_plan, watched, policy, warnings, planned)
        if problem is not None:
            failed[dist] = problem


def _replacements(native: NativePlan, where: str,
                  replaced: Iterable[tuple[str, str, str]]) -> Problem | None:
    """A problem if the library replaced a kernel it does not own (``replaced_kernels``).

    Its own ops' declared keys are its own business; any other (op, key) --
    an aten kernel, another package's -- had a kernel already, which the
    library's ``TORCH_LIBRARY_IMPL`` pushed down.
    """
    origin = native.origin
    own = set(native.keys)
    found = sorted({(op, key, site) for op, key, site in replaced if (op, key) not in own})
    if not found:
        return None
    named = [f"{op} ({key}, registered at {site})" if site else f"{op} ({key})"
             for op, key, site in found]
    shown = ", ".join(named[:5]) + (f" and {len(named) - 5} more" if len(named) > 5 else "")
    return _native_problem(
        "native-undeclared-registration", origin, native,
        f"{origin}: {where} replaced the kernel torch already had for {shown}; "
        f"{origin.distribution} does not declare it (kernels for ops it does not own). The "
        f"replacement stays in effect (a shared library cannot be unloaded, and torch cannot "
        f"take back one C++ kernel); {origin.distribution} is left out.",
        f"a library that replaces other namespaces' kernels (aten's included) is not trusted: "
        f"block it (OPREGISTRY_BLOCK={origin.distribution}) or uninstall it, and restart the "
        f"process to get the original kernel back",
        op=found[0][0], key=found[0][1])


def _native_problem(code: str, origin: Origin, native: NativePlan, message: str, hint: str,
                    op: str | None = None, key: str | None = None) -> Problem:
    error = MaterializationError(message, origin=origin, op=op, key=key)
    return Problem(code=code, message=message, hint=hint, culprits=(origin,), op=op, key=key,
                   namespace=native.namespace, error=error)


def _verify_native(native: NativePlan, where: str, all_ops: frozenset[str],
                   new_ops: frozenset[str], new_pairs: frozenset[tuple[str, str]],
                   planned: frozenset[str]) -> Problem | None:
    """Compare what the library registered with its declaration; the first difference.

    Every op of its namespace must be declared (by it, or by another planned
    distribution): checked on the dispatcher's whole namespace, so that a
    library loaded before (by an earlier registry, or an import) is checked
    too.  Outside its namespace only what appeared during this load is seen.
    """
    from . import torch_state

    origin, ns = native.origin, native.namespace
    stays = (" The library stays loaded (a shared library cannot be unloaded); "
             f"{origin.distribution} is left out.")
    for qualname, declared in native.ops:
        found = torch_state.op_schema(qualname)
        if found is None:
            return _native_problem(
                "native-mismatch", origin, native,
                f"{origin}: {where} was loaded but does not define {qualname}, which "
                f"{origin.distribution} declares.{stays}",
                f"declare what its TORCH_LIBRARY block defines, or rebuild it", op=qualname)
        if torch_state.normal_schema(found) != torch_state.normal_schema(declared):
            return _native_problem(
                "native-mismatch", origin, native,
                f"{origin}: {where} defines {found}, but {origin.distribution} declares "
                f"{declared}.{stays}",
                "make the declared schema (define(...)) the one in its TORCH_LIBRARY block",
                op=qualname)
    for qualname, key in native.keys:
        if key not in torch_state.kernel_registrations(qualname):
            return _native_problem(
                "native-mismatch", origin, native,
                f"{origin}: {where} was loaded but registers no {key} kernel for {qualname}, "
                f"which {origin.distribution} declares (native=[{key!r}]).{stays}",
                f"declare the keys its TORCH_LIBRARY_IMPL blocks fill, or rebuild it",
                op=qualname, key=key)
    own = f"{ns}::"
    undeclared = sorted(op for op in all_ops if op.startswith(own) and op not in planned)
    # torch's Python modules imported meanwhile (by the extension module) may register
    # their own ops: what torch's files registered is torch's business
    torch_root = torch_state.torch_dir()

    def foreign(where: str | None) -> bool:
        return where is None or not where.startswith(torch_root)

    outside = sorted(op for op in new_ops if not op.startswith(own)
                     and foreign(torch_state.definition_site(op)))
    # an IMPL library owns no op: every (op, key) it was not declared for is foreign
    declared = frozenset(native.keys) if native.kind == "IMPL" else frozenset()
    touched = sorted(f"{op} ({key})" for op, key in new_pairs
                     if (not op.startswith(own) or native.kind == "IMPL")
                     and (op, key) not in declared and op not in new_ops
                     and foreign(torch_state.kernel_registrations(op).get(key)))
    if undeclared or outside or touched:
        found = undeclared + outside + touched
        shown = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
        return _native_problem(
            "native-undeclared-registration", origin, native,
            f"{origin}: {where} registered {shown} with torch, which {origin.distribution} "
            f"does not declare{' (kernels for ops it does not own)' if touched else ''}."
            f"{stays}",
            ("declare every kernel of its TORCH_LIBRARY_IMPL blocks (impl(op, native=[...])); a "
             if native.kind == "IMPL" else
             "declare every op of its TORCH_LIBRARY block (define(..., native=[...])); a ") +
            f"library that replaces kernels of other namespaces' ops is not trusted: block it "
            f"(OPREGISTRY_BLOCK={origin.distribution}) or uninstall it",
            op=found[0].partition(" ")[0])
    return None

