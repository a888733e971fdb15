"""Rules 5 and 6 for kernels, and the override policy.

Rule 5: one kernel per (op, dispatch key); replacing another distribution's
(or torch's) kernel needs ``override=True`` and a policy that allows it.
Rule 6: a kernel needs a defined op and a known key; without an installed
backend for its key it is *inactive*, without the device *unavailable*.
The backend rules on which ops a feature kernel fits (autograd, vmap) are
the schema's own predicates (:meth:`~opregistry.schema.Schema.autograd_refusal`).
"""

from __future__ import annotations

from collections import defaultdict

import attrs

from .. import keys as _keys
from ..model import Backend, Kernel
from ..plan import KernelPlan, OpPlan
from .context import Context, dist_name, names

__all__ = ["check_kernels"]


def check_kernels(ctx: Context, ops: dict[str, OpPlan], owners: dict[str, Backend]
                  ) -> tuple[dict[str, OpPlan], tuple[KernelPlan, ...]]:
    """``ops`` with their kernels planned, and the kernels for torch's own ops."""
    groups: dict[tuple[str, str], list[Kernel]] = defaultdict(list)
    declared_here = {op.qualname for op in ctx.ops}
    for k in ctx.kernels:
        if k.op not in ops and k.op in declared_here:
            continue  # its op was refused, and that is reported; dependents next pass
        fits = _fits(ctx, k, ops[k.op]) if k.op in ops else _external_allowed(ctx, k)
        if fits:
            groups[(k.op, k.key)].append(k)

    planned: dict[str, list[KernelPlan]] = defaultdict(list)
    external: list[KernelPlan] = []
    for (qualname, key), group in sorted(groups.items()):
        op_plan = ops.get(qualname)
        definer = dist_name(op_plan.op.origin) if op_plan else None
        winner, losers = _choose(ctx, qualname, key, group, definer)
        if winner is None:
            continue
        existing = None
        if op_plan is None and ctx.torch is not None and ctx.torch.has_kernel(qualname, key):
            if not winner.override:
                ctx.refuse("kernel-override-undeclared",
                           f"{winner.origin} registers a {key} kernel for {qualname}, which torch "
                           f"already implements for {key}",
                           "declare override=True (and allow it with OPREGISTRY_ALLOW_OVERRIDE) "
                           "if replacing torch's kernel is intended",
                           (winner.origin,), op=qualname, key=key, source=winner.source)
                continue
            existing = "torch"
        elif op_plan is None and ctx.torch is None and winner.override:
            # without torch (``opregistry list``) the dispatcher cannot be asked; the
            # declaration says it replaces torch's kernel, and listings must show that
            existing = "torch"
        backend = owners.get(key)
        for loser in losers:
            planned[qualname].append(KernelPlan(kernel=loser, status="overridden",
                                                backend=backend.name if backend else None))
        overrides = existing or (names(l.origin for l in losers) if losers else None)
        entry = _status(ctx, winner, owners, overrides)
        (planned[qualname] if op_plan else external).append(entry)

    result = {qualname: attrs.evolve(plan, kernels=tuple(sorted(
        planned.get(qualname, []), key=lambda k: (k.kernel.key, k.status))))
        for qualname, plan in ops.items()}
    return result, tuple(external)


def _fits(ctx: Context, k: Kernel, op: OpPlan) -> bool:
    """Whether the feature kernel ``k`` suits its op's schema (torch would refuse it otherwise)."""
    if k.native:
        return _native_fits(ctx, k, op)
    if k.key == "Autograd":
        refusal, what = op.parsed.autograd_refusal(op.op.tags), "autograd"
        api = "torch.library.register_autograd"
    elif k.key == "FuncTorchBatched":
        refusal, what = op.parsed.vmap_refusal(), "a vmap rule"
        api = "torch.library.register_vmap"
    else:
        return True
    if refusal is None:
        return True
    code, why = refusal
    ctx.refuse(code, f"{k.origin} registers {what} for {k.op}, but {why}; {api} refuses such ops",
               _FIXES[code], (k.origin,), op=k.op, key=k.key, source=k.source)
    return False


def _native_fits(ctx: Context, k: Kernel, op: OpPlan) -> bool:
    """A C++ kernel belongs to an op its own distribution's native library defines."""
    if (op.op.namespace, dist_name(k.origin)) in ctx.natives and \
            dist_name(op.op.origin) == dist_name(k.origin):
        return True
    ctx.refuse("native-kernel-foreign",
               f"{k.origin} declares a C++ {k.key} kernel for {k.op}, which its native library "
               f"does not define",
               "declare native= keys only on ops of an OpLibrary(..., native=...) of your own",
               (k.origin,), op=k.op, key=k.key, source=k.source)
    return False


_FIXES = {
    "autograd-on-mutable-op": "define a functional op (no '(a!)' annotations) and register "
                              "autograd for it",
    "autograd-no-returns": "return the result (a new tensor), or drop the autograd kernel",
    "autograd-kwarg-only-tensor": "make the tensor arguments positional",
    "vmap-kwarg-only-tensor": "make the tensor arguments positional",
}


def _external_allowed(ctx: Context, k: Kernel) -> bool:
    """Rule 6 and the policy for a kernel whose op no distribution defines."""
    if not ctx.torch_owns(k.namespace):
        hint = "check the op name; the op must be defined by an installed distribution"
        message = f"{k.origin} registers a {k.key} kernel for {k.op}, which no distribution defines"
        if k.op in ctx.excluded_ops:
            message += f" (its definer {ctx.excluded_ops[k.op]} was left out: see its problem)"
            hint = f"fix {ctx.excluded_ops[k.op].distribution} first"
        ctx.refuse("kernel-for-undefined-op", message, hint, (k.origin,),
                   op=k.op, key=k.key, source=k.source)
        return False
    if ctx.torch is not None and k.op not in ctx.torch.ops:
        ctx.refuse("kernel-for-undefined-op",
                   f"{k.origin} registers a {k.key} kernel for {k.op}, which torch does not have",
                   "check the op name and overload (e.g. aten::add.Tensor)", (k.origin,),
                   op=k.op, key=k.key, source=k.source)
        return False
    if not ctx.policy.allows(k.op):
        ctx.refuse("kernel-torch-op-denied",
                   f"{k.origin} registers a {k.key} kernel for {k.op}, an op torch owns; "
                   f"this is denied unless the policy names {k.namespace!r}",
                   f"if intended, set OPREGISTRY_ALLOW_OVERRIDE={k.namespace} (or {k.op})",
                   (k.origin,), op=k.op, key=k.key, source=k.source)
        return False
    return True


def _choose(ctx: Context, qualname: str, key: str, group: list[Kernel], definer: str | None
            ) -> tuple[Kernel | None, list[Kernel]]:
    """Rule 5: the kernel that serves (op, key), and the kernels it overrides."""
    if _duplicates(ctx, qualname, key, group):
        return None, []
    if len(group) == 1:
        return group[0], []
    # by identity, not ==: records compare without their origin
    overrides = [k.override and dist_name(k.origin) != definer for k in group]
    overriders = [k for k, o in zip(group, overrides) if o]
    base = [k for k, o in zip(group, overrides) if not o]
    definer_base = [k for k in base if dist_name(k.origin) == definer]
    standing = definer_base or (base if len(base) == 1 else [])
    if definer_base:
        for k in base:
            if dist_name(k.origin) == definer:
                continue
            ctx.refuse("kernel-conflict",
                       f"{k.origin} registers a second {key} kernel for {qualname}, which "
                       f"{definer_base[0].origin} already implements (torch would silently "
                       f"replace one with the other)",
                       "remove the kernel, or declare override=True and allow it with "
                       "OPREGISTRY_ALLOW_OVERRIDE", (k.origin,),
                       others=tuple(d.origin for d in definer_base if d.origin),
                       op=qualname, key=key, source=k.source)
    elif len(base) > 1:
        ctx.refuse("kernel-conflict",
                   f"{qualname} gets several {key} kernels, from {names(k.origin for k in base)}",
                   "uninstall or block all but one, or mark one override=True and allow it "
                   "with OPREGISTRY_ALLOW_OVERRIDE", (k.origin for k in base), op=qualname, key=key)
    allowed = _allowed_overrides(ctx, qualname, key, overriders, base)
    if len(allowed) == 1:
        return allowed[0], standing
    return (standing[0] if standing else None), []


def _duplicates(ctx: Context, qualname: str, key: str, group: list[Kernel]) -> bool:
    """One distribution declaring two kernels for one (op, key): refused, ``True``."""
    by_dist: dict[str, list[Kernel]] = defaultdict(list)
    for k in group:
        by_dist[dist_name(k.origin)].append(k)
    found = False
    for ks in by_dist.values():
        if len(ks) > 1:
            ctx.refuse("kernel-duplicate",
                       f"{ks[0].origin} declares {len(ks)} {key} kernels for {qualname}",
                       "keep one", (ks[0].origin,), op=qualname, key=key, source=ks[-1].source)
            found = True
    return found


def _allowed_overrides(ctx: Context, qualname: str, key: str, overriders: list[Kernel],
                       base: list[Kernel]) -> list[Kernel]:
    """The overriding kernels the policy allows; more than one is a conflict."""
    allowed = []
    for k in overriders:
        if ctx.policy.allows(qualname):
            allowed.append(k)
            continue
        ctx.refuse("kernel-override-denied",
                   f"{k.origin} overrides the {key} kernel of {qualname} registered by "
                   f"{names(b.origin for b in base)}, and the policy does not allow "
                   f"overriding {qualname}",
                   f"if intended, set OPREGISTRY_ALLOW_OVERRIDE={qualname.split('::')[0]} "
                   f"(or {qualname})",
                   (k.origin,), others=tuple(b.origin for b in base if b.origin),
                   op=qualname, key=key, source=k.source)
    if len(allowed) > 1:
        ctx.refuse("kernel-conflict",
                   f"{qualname} gets several overriding {key} kernels, from "
                   f"{names(k.origin for k in allowed)}; at most one may override",
                   "uninstall or block all but one", (k.origin for k in allowed),
                   op=qualname, key=key)
    return allowed


def _status(ctx: Context, k: Kernel, owners: dict[str, Backend], overrides: str | None
            ) -> KernelPlan:
    """Rule 6: active, inactive (no backend installed) or unavailable (no device).

    A C++ kernel is ``native``: its library registers it, not a backend.
    """
    if k.native:
        return KernelPlan(kernel=k, status="native",
                          reason="C++ (TORCH_LIBRARY_IMPL)", overrides=overrides)
    backend = owners.get(k.key)
    if backend is None:
        return KernelPlan(kernel=k, status="inactive", reason=_keys.provider_hint(k.key),
                          overrides=overrides)
    if not ctx.available.get(backend.name, True):
        return KernelPlan(kernel=k, status="unavailable", backend=backend.name,
                          reason=f"backend {backend.name} is installed but not available on "
                                 f"this machine", overrides=overrides)
    return KernelPlan(kernel=k, status="active", backend=backend.name, overrides=overrides)
