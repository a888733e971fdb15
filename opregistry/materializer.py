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
from typing import Any, Callable, Iterator

from attrs import define, field

from . import guard
from .config import Policy
from .containment import describe, must_propagate
from .errors import MaterializationError
from .logs import get_logger
from .model import Origin, Problem, describe_ref, resolve_ref
from .plan import OpPlan, Plan
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
        return _materialize(plan, chosen, policy or Policy())


def _imported(ref: Any, kernel: Any, watched: frozenset[str], policy: Policy,
              warnings: list[Problem]) -> tuple[Any, Problem | None]:
    """The callable ``ref`` names, imported contained; or the problem that fails its distribution."""
    module = ref.partition(":")[0] if isinstance(ref, str) else None
    loaded = sys.modules.get(module) if module else None
    # a module imported already runs no code of its own: no watch needed (the common case)
    fresh = module is not None and (loaded is None or getattr(
        getattr(loaded, "__spec__", None), "_initializing", False))
    if not fresh:
        # no watch to set up (guard.run with protected=None would only contain the
        # error): per kernel at import torch, the guard's bookkeeping cost more
        # than the attribute lookup itself
        try:
            return resolve_ref(ref), None
        except BaseException as exc:  # noqa: BLE001 - contained, see opregistry.containment
            if must_propagate(exc):
                raise
            return None, _failure(kernel.origin, f"importing {describe_ref(ref)} for {kernel.op}",
                                  exc, kernel.op, kernel.key,
                                  guard.raised_at(exc) or kernel.source)
    outcome = guard.run(resolve_ref, ref, origin=kernel.origin, what=f"importing {module or ref}",
                        protected=watched if fresh else None, policy=policy,
                        owns=guard.owned_by(module) if module else None)
    errors = [p for p in outcome.problems if p.severity == "error"]
    warnings.extend(p for p in outcome.problems if p.severity != "error")
    if outcome.error is not None:
        # the line that raised in the kernel module, else the kernel's declaration
        return None, _failure(kernel.origin, f"importing {describe_ref(ref)} for {kernel.op}",
                              outcome.error, kernel.op, kernel.key,
                              guard.raised_at(outcome.error) or kernel.source)
    return outcome.result, (errors[0] if errors else None)


def _materialize(plan: Plan, materializers: dict[str, Callable[..., Any]],
                 policy: Policy) -> Materialized:
    owned: dict[str, dict[str, str]] = defaultdict(dict)
    origins: dict[str, Origin] = {}
    for ns in plan.namespaces:
        if ns.owner is not None:
            owned[ns.owner.distribution][ns.name] = "DEF"
            origins[ns.owner.distribution] = ns.owner
        for frag in ns.fragments:
            owned[frag.distribution].setdefault(ns.name, "FRAGMENT")
            origins[frag.distribution] = frag
    kernels_by_dist: dict[str, list[tuple[OpPlan | None, Any]]] = defaultdict(list)
    for op in plan.ops:
        for k in op.kernels:
            if k.status == "active" and k.kernel.origin is not None:
                kernels_by_dist[k.kernel.origin.distribution].append((op, k))
                origins.setdefault(k.kernel.origin.distribution, k.kernel.origin)
    for k in plan.external_kernels:
        if k.status == "active" and k.kernel.origin is not None:
            kernels_by_dist[k.kernel.origin.distribution].append((None, k))
            origins.setdefault(k.kernel.origin.distribution, k.kernel.origin)

    libs = {d: _DistLibraries(origins[d], owned.get(d, {})) for d in sorted(origins)}
    # what kernel modules must not touch by themselves: the plan's namespaces and
    # those of the torch ops it adds kernels to (guard adds torch's reserved ones)
    watched = frozenset(ns.name for ns in plan.namespaces) | frozenset(
        k.kernel.namespace for k in plan.external_kernels)
    result = Materialized()
    failed: dict[str, Problem] = {}

    # definitions first, so that kernels of any distribution find their op
    for op in plan.ops:
        origin = op.op.origin
        assert origin is not None
        dist = origin.distribution
        if dist in failed:
            continue
        try:
            _define(libs[dist].get(op.op.namespace), op)
        except Exception as exc:
            failed[dist] = _failure(origin, f"defining {op.op.full_schema}", exc,
                                    op.op.qualname, None, op.op.source)

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
            if problem is not None:
                failed[dist] = problem
                break
            try:
                done = materializers[k.backend](
                    library=libs[dist].get(kernel.namespace),
                    op=op.op if op else None, kernel=kernel, fn=fn, setup_context=setup)
                if not done:
                    raise MaterializationError(
                        f"backend {k.backend} did not register it (returned {done!r})")
            except BaseException as exc:  # noqa: BLE001 - a backend's code, contained
                if must_propagate(exc):
                    raise
                what = f"registering the {kernel.key} kernel of {kernel.op} (backend {k.backend})"
                failed[dist] = _failure(kernel.origin, what, exc, kernel.op, kernel.key,
                                        kernel.source)
                break

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
