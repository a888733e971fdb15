"""Stage 3, resolve: decide what may be registered, before torch is touched.

:func:`resolve` is a pure function from :class:`~opregistry.model.Declarations`
(plus, when torch is already imported, a :class:`~opregistry.environment.TorchState`
of what torch's dispatcher holds) to a :class:`~opregistry.plans.Plan`.  It
enforces the rules of ``docs/resolution.md``, one module per group of them:

=================  ==========================================================
:mod:`.adoption`   which packages that register with torch by themselves are
                   adopted, what each import brings, which kernels are off
:mod:`.backends`   which backend serves each dispatch key
:mod:`.namespaces` rules 1-4: valid names, one DEF, FRAGMENTs, torch's own
:mod:`.native`     native libraries: missing, built for another torch, IMPL
                   kernels that would not serve
:mod:`.ops`        op names, schemas and mutation (rule 7), no redefinition
:mod:`.impls`      rules 5-6 (IMPL: kernels) and the override policy
:mod:`.gaps`       what a planned op lacks (warnings)
=================  ==========================================================

Every violation is a :class:`~opregistry.model.Problem` naming every
distribution involved.  A distribution with an error problem is left out
whole and the rules run again on the rest, until nothing changes, so a kernel
for an op of a left-out distribution is reported too (rule 9).  Inputs are
sorted first: the plan does not depend on the order of entry points (rule 8).
"""

from __future__ import annotations

from typing import Any, Iterable

import attrs

from ..config import Policy
from ..environment import Environment, TorchState, read_environment
from ..model import Declarations, Kernel, OpDef, Origin, Problem, describe_ref
from ..plans import BackendPlan, Plan
from .adoption import plan_adoptions
from .backend_choice import check_backends
from .context import Context
from .foreign import foreign_owners
from .gaps import report_gaps
from .impls import check_kernels
from .namespaces import check_namespaces
from .native import check_native_impls, check_natives, plan_natives
from .ops import check_ops

__all__ = ["resolve"]


def resolve(decl: Declarations, *, policy: Policy | None = None,
            torch_state: TorchState | None = None, environment: Environment | None = None
            ) -> Plan:
    """Apply the resolution rules to ``decl``; never raises for a bad declaration.

    A pure function of its arguments when ``environment`` is given (the
    rules read nothing else); without it, the environment is read first
    (:func:`~opregistry.environment.read_environment`), with ``torch_state``
    as what torch's dispatcher holds.
    """
    policy = policy or Policy()
    env = environment if environment is not None else read_environment(decl, torch_state)
    errors: dict[tuple[str, str], Problem] = {(p.code, p.message): p for p in decl.problems}
    # rule 9: a distribution whose entry point failed before resolution (import
    # error, invalid hooks, installed twice) is left out whole, not just that
    # entry point: its other entry points would register half a package
    excluded: dict[str, Origin] = {}
    for p in decl.problems:
        if p.leaves_out:
            for o in p.culprits:
                excluded.setdefault(o.distribution, o)
    # every pass (and the first definer named below) must not depend on the
    # order of discovery; sorting once here spares each pass its own sort
    ordered = _sorted(decl)
    excluded_ops: dict[str, Origin] = {}
    foreign = foreign_owners(env.foreign, ordered.adoptions)
    while True:
        _note_excluded_ops(ordered.ops, excluded, excluded_ops)
        ctx = Context(ordered, lambda o: o is None or o.distribution not in excluded,
                      env, policy, excluded_ops, foreign)
        owners = check_backends(ctx)
        check_natives(ctx)
        namespaces = check_namespaces(ctx)
        ops, external = check_kernels(ctx, check_ops(ctx, namespaces), owners)
        check_native_impls(ctx, ops)
        adopted = plan_adoptions(ctx, [a for a in ordered.adoptions if ctx.keeps(a.origin)])
        new = [p for p in ctx.problems if p.severity == "error"]
        for p in new:
            errors.setdefault((p.code, p.message), p)
        # rule 9: the culprits of a problem whose code leaves them out (opregistry.problems)
        culprits = {o.distribution: o for p in new if p.leaves_out for o in p.culprits}
        if not culprits.keys() - excluded.keys():
            break
        excluded.update(culprits)

    # what planned ops lack: reported, never a reason to leave a distribution out
    # (an op without an active kernel is an error of its own, not of its package)
    errors_before = len(ctx.problems)
    report_gaps(ctx, ops)
    gaps = ctx.problems[errors_before:]
    warnings = [p for p in ctx.problems[:errors_before] if p.severity != "error"]
    served = {b.name for b in owners.values()}
    return Plan(
        backends=tuple(BackendPlan(backend=b, available=decl.available.get(b.name, True))
                       for b in ctx.backends if b.name in served),
        # namespaces left with no op and no owner (every contributor excluded) drop out
        namespaces=tuple(namespaces[n] for n in sorted(namespaces)),
        ops=tuple(ops[q] for q in sorted(ops)),
        external_kernels=external,
        problems=tuple(sorted(errors.values(), key=lambda p: (p.code, p.message)))
        + tuple(warnings) + tuple(gaps),
        distributions=tuple(sorted(decl.distributions)),
        excluded=tuple(sorted(o for o in decl.distributions if o.distribution in excluded)),
        skipped=tuple(sorted(decl.skipped, key=lambda s: s.origin)),
        hooks=dict(decl.hooks),
        switches=tuple((s.text, s.source) for s in policy.kernels),
        natives=plan_natives(ctx, namespaces, ops),
        adoptions=adopted,
    )


def _sorted(decl: Declarations) -> Declarations:
    """``decl`` with its records sorted (rule 8), once for every pass."""
    return attrs.evolve(decl, namespaces=sorted(decl.namespaces, key=_order),
                        ops=sorted(decl.ops, key=_order),
                        kernels=sorted(decl.kernels, key=_kernel_order),
                        backends=sorted(decl.backends, key=_order))


def _note_excluded_ops(ops: Iterable[OpDef], excluded: dict[str, Origin],
                       excluded_ops: dict[str, Origin]) -> None:
    """Record the definer of each op of a left-out distribution (first in sorted order)."""
    for op in ops:  # sorted: the first definer named must not depend on order
        if op.origin is not None and op.origin.distribution in excluded:
            excluded_ops.setdefault(op.qualname, op.origin)


def _kernel_order(k: Any) -> tuple[str, ...]:
    """:func:`_order` for a :class:`~opregistry.model.Kernel` (five in six records), less the
    fields every kernel has alike: the same order, for half the cost."""
    if type(k) is not Kernel:
        return _order(k)
    o = k.origin
    return (k.key, o.distribution if o else "", o.entry_point if o else "",
            describe_ref(k.fn) or "", str(k.override), k.source or "",
            o.value if o else "", o.group if o else "")


def _order(record: Any) -> tuple[str, ...]:
    o = record.origin
    ident = getattr(record, "qualname", None) or getattr(record, "name", None) or ""
    extra = getattr(record, "key", "") or getattr(record, "op", "")
    # every field that can tell two records apart takes part: records that tie
    # would keep their discovery order, and the plan would depend on it (rule 8)
    return (str(ident), str(extra), o.distribution if o else "", o.entry_point if o else "",
            describe_ref(getattr(record, "fn", None)) or "",
            str(getattr(record, "kind", "")), str(getattr(record, "schema", "")),
            str(getattr(record, "override", "")), str(getattr(record, "closed", "")),
            getattr(record, "source", None) or "", repr(getattr(record, "mutates_args", None)),
            repr(getattr(record, "tags", ())), o.value if o else "", o.group if o else "")
