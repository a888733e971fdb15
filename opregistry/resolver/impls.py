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
from typing import Any

import attrs

from .. import keys as _keys
from ..adoption import adopted_ops
from ..kinds import TritonKernel
from ..model import Backend, Kernel, describe_ref
from ..plans import KernelPlan, OpPlan
from .context import Context, dist_name, names
from .foreign import owner_text

__all__ = ["check_kernels"]


def check_kernels(ctx: Context, ops: dict[str, OpPlan], owners: dict[str, Backend]
                  ) -> tuple[dict[str, OpPlan], tuple[KernelPlan, ...]]:
    """``ops`` with their kernels planned, and the kernels for torch's own ops."""
    planned: dict[str, list[KernelPlan]] = defaultdict(list)
    _check_switches(ctx)
    groups = _groups(ctx, ops, planned)
    _check_composite(ctx, groups, ops)
    _check_triton(ctx, groups, ops)
    external: list[KernelPlan] = []
    for (qualname, key), declared in sorted(groups.items()):
        _plan_group(ctx, qualname, key, declared, ops.get(qualname), owners,
                    planned[qualname], external)
    result = {qualname: attrs.evolve(plan, kernels=_serving(tuple(sorted(
        planned.get(qualname, []), key=lambda k: (k.kernel.key, k.rank or 0, k.status)))))
        for qualname, plan in ops.items()}
    return result, tuple(external)


def _groups(ctx: Context, ops: dict[str, OpPlan], planned: dict[str, list[KernelPlan]]
            ) -> dict[tuple[str, str], list[Kernel]]:
    """The kernels that may serve, by (op, key): rule 6, the kinds' schema rules, switches."""
    groups: dict[tuple[str, str], list[Kernel]] = defaultdict(list)
    declared_here = {op.qualname for op in ctx.ops}
    for k in ctx.kernels:
        if k.op not in ops and k.op in declared_here:
            continue  # its op was refused, and that is reported; dependents next pass
        if k.op not in ops and k.conditional and (ctx.torch_owns(k.namespace)
                                                  or ctx.foreign.op_owner(k.op)):
            ctx.refuse("kernel-condition-unsupported",
                       f"{k.origin} declares a {k.key} kernel with conditions for {k.op}, an "
                       f"op torch owns; conditions choose between kernels of ops opregistry "
                       f"defines", "drop when=/predicate=, or define an op of your own",
                       (k.origin,), op=k.op, key=k.key, source=k.source)
            continue
        fits = _fits(ctx, k, ops[k.op]) if k.op in ops else _external_allowed(ctx, k)
        if not fits:
            continue
        switch = _switched_off(ctx, k) if k.op in ops else None
        if switch is not None:  # the user's switch: the next candidate takes over
            planned[k.op].append(KernelPlan(
                kernel=k, status="disabled", reason=f"disabled by {switch.source} ({switch.text})"))
            continue
        groups[(k.op, k.key)].append(k)
    return groups


def _plan_group(ctx: Context, qualname: str, key: str, declared: list[Kernel],
                op_plan: OpPlan | None, owners: dict[str, Backend], planned: list[KernelPlan],
                external: list[KernelPlan]) -> None:
    """Rule 5 for one (op, key): which kernel serves, what it overrides, its candidates."""
    definer = dist_name(op_plan.op.origin) if op_plan else None
    # candidates with conditions sit in front of the key's one plain kernel (rule 5b)
    if len(declared) == 1 and not declared[0].conditional:
        conditioned, group = [], declared  # the common case: one plain kernel
    else:
        conditioned = [k for k in declared if k.conditional]
        group = [k for k in declared if not k.conditional]
    if not group:
        planned.extend(_candidates(ctx, conditioned, None, owners))
        return
    winner, losers = _choose(ctx, qualname, key, group, definer)
    if winner is None:
        return
    existing = _replaces_torch(ctx, op_plan, winner, qualname, key)
    if existing is False:
        return
    backend = owners.get(winner.kind.family(key))
    for loser in losers:
        planned.append(KernelPlan(kernel=loser, status="overridden",
                                  backend=backend.name if backend else None))
    overrides = existing or (names(l.origin for l in losers) if losers else None)
    entry = _status(ctx, winner, owners, overrides)
    held = ctx.foreign.op_owner(qualname) if op_plan is None else None
    if held is not None:
        # registered after the package's own registration, or the package's would win
        held = ctx.foreign.kernel_owner(qualname, key) or held
        entry = attrs.evolve(entry, after=held[1].module or None)
    if conditioned:
        planned.extend(_candidates(ctx, conditioned, entry, owners))
    else:
        (planned if op_plan else external).append(entry)


def _replaces_torch(ctx: Context, op_plan: OpPlan | None, winner: Kernel, qualname: str,
                    key: str) -> str | None | bool:
    """What ``winner`` replaces: ``"torch"``, a package's ``name==version`` (an op it defines
    with torch.library), or ``None``; ``False`` when replacing without ``override=True``."""
    if op_plan is not None:
        return None
    package = ctx.foreign.kernel_owner(qualname, key)
    if package is not None:
        existing = package[0].distribution.text
    elif ctx.torch is not None and ctx.torch.has_kernel(qualname, key):
        existing = "torch"
    elif ctx.torch is None and winner.override and ctx.foreign.op_owner(qualname) is None:
        # without torch (``opregistry list``) the dispatcher cannot be asked; the
        # declaration says it replaces torch's kernel, and listings must show that
        return "torch"
    else:
        return None
    if winner.override:
        return existing
    block = package is not None and package[1].name is None
    ctx.refuse("kernel-override-undeclared",
               f"{winner.origin} registers a {key} kernel for {qualname}, which {existing} "
               + (f"may already implement for {key} ({_block_text(package[1])})" if block
                  else f"already implements for {key}"),
               "declare override=True (and allow it with OPREGISTRY_ALLOW_OVERRIDE) "
               "if replacing its kernel is intended",
               (winner.origin,), op=qualname, key=key, source=winner.source)
    return False


#: what a kernel for every device may not share its op with (torch's rules, below)
_IMPLICIT = _keys.COMPOSITE_KEYS[1]


def _check_composite(ctx: Context, groups: dict[tuple[str, str], list[Kernel]],
                     ops: dict[str, OpPlan]) -> None:
    """The rules torch has (or should have) for a ``CompositeImplicitAutograd`` kernel.

    Such a kernel is a decomposition: torch runs it on every device and
    derives autograd and fake tensors from the ops it calls.  Beside it,
    torch refuses a fake kernel (``Library.impl(..., "Meta")`` and
    ``register_fake`` raise), and silently does not use it where another kernel
    takes the call: an Autograd formula replaces the decomposition's autograd
    in eager but not under ``torch.compile`` (which decomposes first), and a
    device (or ``CompositeExplicitAutograd``) kernel takes that device away
    from it -- and with it any gradient there.  The resolver refuses all of
    them; only a vmap rule may stand beside it.  Whom it blames: the
    distributions other than the op's definer, or the definer if it declared
    both.  ``CompositeExplicitAutograd`` needs no rule of its own: a device
    kernel beside it wins for its device, as in torch.
    """
    by_op: dict[str, dict[str, list[Kernel]]] = defaultdict(dict)
    for (qualname, key), group in groups.items():
        by_op[qualname][key] = group
    for qualname, by_key in sorted(by_op.items()):
        implicit = by_key.get(_IMPLICIT)
        if not implicit:
            continue
        others = [k for key, group in sorted(by_key.items())
                  if key not in (_IMPLICIT, "FuncTorchBatched") for k in group]
        if not others:
            continue
        op_plan = ops.get(qualname)
        definer = dist_name(op_plan.op.origin) if op_plan else None
        involved = [*implicit, *others]
        culprits = [k.origin for k in involved if dist_name(k.origin) != definer] or [
            k.origin for k in involved]
        keys = ", ".join(sorted({k.key for k in others}))
        ctx.refuse("composite-implicit-mixed",
                   f"{qualname} has a CompositeImplicitAutograd kernel (from "
                   f"{names(k.origin for k in implicit)}) and {keys} kernel(s) (from "
                   f"{names(k.origin for k in others)}); a CompositeImplicitAutograd kernel "
                   f"serves every device and derives autograd and fake tensors from the ops it "
                   f"calls, so torch refuses a fake kernel beside it and silently bypasses it "
                   f"for the rest (gradients lost on the device with its own kernel, an "
                   f"autograd formula used in eager but not under torch.compile)",
                   "declare the kernel for every device as 'CompositeExplicitAutograd' (or "
                   "'default') to add device kernels, a fake kernel or an autograd formula "
                   "beside it; or drop the other kernels",
                   culprits, others=tuple(sorted({k.origin for k in involved if k.origin}
                                                 - {o for o in culprits if o})),
                   op=qualname, key=_IMPLICIT,
                   source=next((k.source for k in involved
                                if k.origin in culprits and k.source), None))


def _serving(kernels: tuple[KernelPlan, ...]) -> tuple[KernelPlan, ...]:
    """Each active kernel for every device, with the devices it serves in its reason."""
    if not any(k.kernel.key in _keys.COMPOSITE_KEYS for k in kernels):
        return kernels
    own = sorted({k.kernel.key for k in kernels
                  if k.kernel.key in _keys.DEVICE_KEYS and k.status == "active"})
    result = []
    for k in kernels:
        if k.kernel.key in _keys.COMPOSITE_KEYS and k.status == "active" and not k.reason:
            reason = ("every device" if not own else
                      f"every device but {', '.join(own)} (own kernel)")
            k = attrs.evolve(k, reason=reason)
        result.append(k)
    return tuple(result)


def _switched_off(ctx: Context, k: Kernel):  # type: ignore[no-untyped-def]
    """The kernel switch (``OPREGISTRY_KERNELS``, config ``kernels``) that disables ``k``."""
    if not ctx.policy.kernels or (k.key not in _keys.DEVICE_KEYS
                                  and k.key not in _keys.COMPOSITE_KEYS):
        return None
    return ctx.policy.disabled_by(k.op, k.key, dist_name(k.origin),
                                  k.key in _keys.COMPOSITE_KEYS, k.conditional)


def _check_switches(ctx: Context) -> None:
    """A switch must name a declared op or a distribution that declares kernels."""
    if not ctx.policy.kernels:
        return
    import difflib

    ops = {op.qualname for op in ctx.ops} | {op.base_qualname for op in ctx.ops}
    dists = {dist_name(k.origin) for k in ctx.kernels}
    # the ops and kernels of packages that register with torch by themselves (adopted):
    # a switch applies to them once they are imported (opregistry.adopting)
    foreign = adopted_ops(ctx.env.foreign)
    ops |= foreign | {op.split(".", 1)[0] for op in foreign}
    dists |= {d.name for d in ctx.env.foreign.distributions} if ctx.env.foreign else set()
    for switch in ctx.policy.kernels:
        known = dists if switch.distribution is not None else ops
        name = switch.distribution or switch.op or ""
        if switch.key and switch.key not in _keys.DEVICE_KEYS \
                and switch.key not in _keys.COMPOSITE_KEYS:
            # a fake kernel, an autograd or vmap rule: no next kernel could serve the key
            ctx.warn("kernel-switch-not-applied",
                     f"{switch.source} switches {switch.text!r}, but switches apply to device "
                     f"kernels ({', '.join(sorted(_keys.DEVICE_KEYS))}, and the kernels for every "
                     f"device); the {switch.key} kernel of {switch.op} is not switched off: it "
                     f"stays", f"remove {switch.text!r} from {switch.source}",
                     op=switch.op, key=switch.key)
            continue
        if name in known:
            continue
        what = "distribution declaring kernels" if switch.distribution else "op"
        close = difflib.get_close_matches(name, sorted(known), n=1)
        ctx.warn("kernel-switch-unknown",
                 f"{switch.source} switches {switch.text!r}, but no {what} {name!r} is loaded"
                 + (f"; did you mean {close[0]!r}?" if close else ""),
                 f"correct or remove {switch.text!r} in {switch.source}", severity="error",
                 op=switch.op, key=switch.key)


def candidate_order(k: Kernel) -> tuple[int, str, str, str]:
    """How candidates of one (op, key) are tried: priority (highest first), then by
    distribution name, kernel reference and declaration line -- never install order."""
    return (-k.priority, dist_name(k.origin), describe_ref(k.fn) or "", k.source or "")


def _candidates(ctx: Context, conditioned: list[Kernel], fallback: KernelPlan | None,
                owners: dict[str, Backend]) -> list[KernelPlan]:
    """Every candidate of one (op, key), in the order tried, with why it serves or not.

    The plain kernel (``fallback``), if any, comes last: it accepts every call.
    """
    result: list[KernelPlan] = []
    taker: str | None = None  # the first candidate that takes every call
    position = 0
    for k in sorted(conditioned, key=candidate_order):
        plan = _status(ctx, k, owners, None)
        unmet = k.when.unmet(ctx.env) if k.when is not None else None
        ref = describe_ref(k.fn)
        if unmet is not None:
            plan = attrs.evolve(plan, status="unmet", reason=f"condition not met: {unmet}")
        elif taker is not None:
            plan = attrs.evolve(plan, status="unreached",
                                reason=f"never tried: {taker} takes every call before it")
        elif plan.status == "active":
            position += 1
            tests = [f"per call: {describe_ref(k.predicate)}"] if k.predicate else []
            if k.when is not None and k.when.capability:
                tests.insert(0, f"per CUDA device: capability{k.when.capability}")
            pending = k.when.pending(ctx.env) if k.when is not None else None
            tests = [pending, *tests] if pending else tests
            said = k.when.held(ctx.env) if k.when is not None else ""
            held = f"{said} holds; " if said else ""
            if tests:
                plan = attrs.evolve(plan, reason=f"candidate {position}: {held}"
                                                 f"takes the calls it accepts ({'; '.join(tests)})")
            else:
                taker = ref
                plan = attrs.evolve(plan, reason=f"candidate {position}: {held}takes every call")
        result.append(plan)
    if fallback is not None:
        if taker is not None and fallback.status == "active":
            fallback = attrs.evolve(fallback, status="unreached",
                                    reason=f"never tried: {taker} takes every call before it")
        elif fallback.status == "active":
            position += 1
            note = "fallback: the calls the candidates before it decline" if position > 1 \
                else "fallback: no candidate before it is in effect"
            fallback = attrs.evolve(fallback, reason=f"candidate {position}, {note}"
                                    + (f"; overrides {fallback.overrides}" if fallback.overrides
                                       else ""))
        result.append(fallback)
    return [attrs.evolve(p, rank=i) for i, p in enumerate(result)]


def _fits(ctx: Context, k: Kernel, op: OpPlan) -> bool:
    """Whether ``k`` suits its op (its kind's schema rule: torch would refuse it otherwise)."""
    if not k.kind.by_backend:
        return _native_fits(ctx, k, op)
    misfit = k.kind.fit(op.parsed, op.op.tags)
    if misfit is None:
        return True
    ctx.refuse(misfit.code, f"{k.origin} registers {misfit.what} for {k.op}, but {misfit.why}; "
               f"{misfit.api} {misfit.verdict}", misfit.fix, (k.origin,), op=k.op, key=k.key,
               source=k.source)
    return False


def _native_fits(ctx: Context, k: Kernel, op: OpPlan) -> bool:
    """A C++ kernel belongs to an op its own distribution's native library defines,
    or comes from an IMPL library's native library (``payload.library``): any op then."""
    if k.payload.library is not None:
        return True  # an IMPL library's: the rules for any other distribution's kernel
    if (op.op.namespace, dist_name(k.origin)) in ctx.natives and \
            dist_name(op.op.origin) == dist_name(k.origin):
        return True
    ctx.refuse("native-kernel-foreign",
               f"{k.origin} declares a C++ {k.key} kernel for {k.op}, which its native library "
               f"does not define",
               "declare native= keys only on ops of an OpLibrary(..., native=...) of your own",
               (k.origin,), op=k.op, key=k.key, source=k.source)
    return False


#: the mode whose torch_dispatch rule a Triton kernel registers (triton_op semantics)
FUNCTIONAL_MODE_RULE = _keys.torch_dispatch_key(
    "torch._subclasses.functional_tensor:FunctionalTensorMode")


def _check_triton(ctx: Context, groups: dict[tuple[str, str], list[Kernel]],
                  ops: dict[str, OpPlan]) -> None:
    """Triton kernels of one op come from one distribution, and own its FunctionalTensorMode rule.

    Each registers, as ``torch.library.triton_op`` does, the op's one
    ``torch_dispatch`` rule for ``FunctionalTensorMode`` (which decomposes
    the op into its Triton kernels under ``torch.compile``); torch allows one
    such rule per op, so a second distribution's Triton kernels, or a declared
    rule for that mode, would fail inside torch.  Refused kernels leave their
    groups.
    """
    by_op: dict[str, list[Kernel]] = defaultdict(list)
    for (qualname, _key), group in groups.items():
        by_op[qualname] += [k for k in group if isinstance(k.payload, TritonKernel)]
    for qualname, tritons in sorted(by_op.items()):
        if not tritons:
            continue
        op_plan = ops.get(qualname)
        definer = dist_name(op_plan.op.origin) if op_plan else None
        dists = sorted({dist_name(k.origin) for k in tritons},
                       key=lambda d: (d != definer, d))
        keep = dists[0]
        refused = [k for k in tritons if dist_name(k.origin) != keep]
        rules = groups.get((qualname, FUNCTIONAL_MODE_RULE), [])
        if refused:
            ctx.refuse("triton-split",
                       f"{qualname} gets Triton kernels from {names(k.origin for k in tritons)}; "
                       f"the Triton kernels of one op must come from one distribution (each "
                       f"registers the op's FunctionalTensorMode rule, and torch allows one)",
                       f"keep {keep}'s Triton kernels; give the others' as plain kernels "
                       f"(kernels=) or uninstall one", (k.origin for k in refused),
                       op=qualname, key=refused[0].key, source=refused[0].source)
        for rule in rules:
            ctx.refuse("torch-dispatch-taken-by-triton",
                       f"{rule.origin} registers a torch_dispatch rule for FunctionalTensorMode "
                       f"on {qualname}, whose Triton kernel already registers that rule "
                       f"(torch.library.triton_op semantics)",
                       "drop the rule: the Triton kernel's own rule decomposes the op under "
                       "torch.compile", (rule.origin,), op=qualname, key=rule.key,
                       source=rule.source)
        gone = {id(k) for k in refused}  # by identity: records compare without their origin
        for key in {k.key for k in refused}:
            groups[(qualname, key)] = [k for k in groups[(qualname, key)] if id(k) not in gone]
        if rules:
            del groups[(qualname, FUNCTIONAL_MODE_RULE)]


def _block_text(registration: Any) -> str:
    """What a registration of kernels whose ops the scan cannot name is, and where."""
    if registration.kind == "IMPL":
        return (f"its C++ {registration.api}({registration.namespace}, {registration.key}) "
                f"block in {registration.source}, whose ops are not in the symbols")
    return f"{registration.api} at {registration.source}, for an op it names at run time"


def _package_op_allowed(ctx: Context, k: Kernel) -> bool:
    """A kernel for an op a package defines with torch.library directly: as for torch's ops.

    Denied unless the policy names the op or its namespace; a C++ kernel
    never (its library cannot be unloaded).
    """
    owner = ctx.foreign.op_owner(k.op)
    if k.kind.by_backend and ctx.policy.allows(k.op):
        return True
    ctx.refuse("kernel-package-op-denied",
               f"{k.origin} registers a {k.key} kernel for {k.op}, an op {owner_text(owner)} "
               f"defines with torch.library; this is denied unless the policy names "
               f"{k.namespace!r}" + ("" if k.kind.by_backend else
                                     " (and a C++ kernel never: torch cannot take it back)"),
               f"if intended, set OPREGISTRY_ALLOW_OVERRIDE={k.namespace} (or {k.op})",
               (k.origin,), op=k.op, key=k.key, source=k.source,
               others=())
    return False


def _external_allowed(ctx: Context, k: Kernel) -> bool:
    """Rule 6 and the policy for a kernel whose op no distribution defines."""
    if ctx.foreign.op_owner(k.op) is not None:
        return _package_op_allowed(ctx, k)
    if not k.kind.by_backend and ctx.torch_owns(k.namespace):
        ctx.refuse("native-kernel-foreign",
                   f"{k.origin} declares a C++ {k.key} kernel for {k.op}, an op torch owns; "
                   f"native libraries may add kernels only to ops installed distributions "
                   f"define (torch cannot take a replaced C++ kernel back)",
                   "register a Python kernel (impl(op, key, fn, override=True)) if replacing "
                   "torch's kernel is intended", (k.origin,), op=k.op, key=k.key,
                   source=k.source)
        return False
    if not ctx.torch_owns(k.namespace):
        hint = "check the op name; the op must be defined by an installed distribution"
        message = f"{k.origin} registers a {k.key} kernel for {k.op}, which no distribution defines"
        held = ctx.foreign.namespaces.get(k.namespace)
        if held is not None:
            message += (f" (its namespace is {owner_text(held)}'s, which registers no op of "
                        f"that name that opregistry can read)")
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
    if len(group) == 1:  # nothing to compare it with
        return group[0], []
    if _duplicates(ctx, qualname, key, group):
        return None, []
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
    kind = k.kind
    if not kind.by_backend:
        return KernelPlan(kernel=k, status="native",
                          reason="C++ (TORCH_LIBRARY_IMPL)", overrides=overrides)
    backend = owners.get(kind.family(k.key))
    if backend is None:
        return KernelPlan(kernel=k, status="inactive", reason=kind.provider(k.key),
                          overrides=overrides)
    available = ctx.available.get(backend.name, True)
    missing = [m for m in kind.requires if not ctx.env.importable(m)] if available else []
    if missing:
        _warn_missing(ctx, k, missing)
        return KernelPlan(kernel=k, status="inactive", backend=backend.name,
                          reason=f"requires the {missing[0]} package: pip install {missing[0]}",
                          overrides=overrides)
    if not available:
        return KernelPlan(kernel=k, status="unavailable", backend=backend.name,
                          reason=f"backend {backend.name} is installed but not available on "
                                 f"this machine", overrides=overrides)
    return KernelPlan(kernel=k, status="active", backend=backend.name, overrides=overrides)


def _warn_missing(ctx: Context, k: Kernel, missing: list[str]) -> None:
    """A kind's required package is not installed: the kernel is inactive (a warning)."""
    package = missing[0]
    ctx.warn(f"{package}-missing",
             f"{k.origin} declares a {k.kind.name} kernel ({describe_ref(k.fn)}) for {k.op} "
             f"on {k.key}, but the {package} package is not installed; the kernel is inactive",
             f"pip install {package} (the version your torch requires: "
             f"`pip show torch` lists it on a CUDA build)", op=k.op, key=k.key,
             source=k.source, others=(k.origin,) if k.origin else ())
