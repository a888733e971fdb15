"""Stage 3, resolve: decide what may be registered, before torch is touched.

:func:`resolve` is a pure function from :class:`~opregistry.collect.Declarations`
(plus, when torch is already imported, a :class:`TorchState` of what torch's
dispatcher holds) to a :class:`Plan`.  It enforces the rules of
``docs/resolution.md``; every violation is a :class:`~opregistry.model.Problem`
naming every distribution involved.  A distribution with an error problem is
left out whole and the rules run again on the rest, until nothing changes,
so a kernel for an op of a left-out distribution is reported too.  Inputs are
sorted first: the plan does not depend on the order of entry points.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable, Iterable, Literal

import attrs
from attrs import field, frozen

from . import keys as _keys
from .collect import Declarations
from .config import Policy
from .discovery import Skipped
from .errors import SchemaError
from .model import Backend, Kernel, Namespace, OpDef, Origin, Problem, describe_ref, is_identifier
from .schema import SCHEMA_KEYWORDS, Schema, check_mutates_args, check_tags, parse_signature

__all__ = [
    "RESERVED_NAMESPACES",
    "TorchState",
    "KernelPlan",
    "OpPlan",
    "NamespacePlan",
    "BackendPlan",
    "Plan",
    "resolve",
]

#: Namespaces torch owns; no distribution may DEF or FRAGMENT them.
RESERVED_NAMESPACES: frozenset[str] = frozenset(
    {
        "_",
        "aten",
        "prim",
        "prims",
        "quantized",
        "_quantized",
        "sparse",
        "mkl",
        "mkldnn",
        "mkldnn_prepacked",
        "onednn",
        "inductor",
        "inductor_prims",
        "higher_order",
        "debugprims",
        "rngprims",
        "profiler",
        "c10d",
        "_c10d_functional",
        "_c10d_functional_autograd",
        "_dtensor",
        "symm_mem",
        "export",
        "_native",
        "_test",
        "quantization",
        "static_runtime",
        "debug_mode_ops",
        # defined by torch's Python modules when they are first imported
        # (torch.compile, torch.distributed, torch.onnx, flex attention), so
        # the dispatcher shows them only after a compile / export has run
        "_inductor_test",
        "c10d_functional",
        "cplib",
        "flex_lib",
        "fsdp",
        "onnx",
        "onnx_symbolic",
        "quantized_decomposed",
        "streams",
    }
)

#: ``torch.Tag`` members (torch 2.13); a tag outside them is an error.
KNOWN_TAGS: frozenset[str] = frozenset(
    {
        "core",
        "cudagraph_unsafe",
        "data_dependent_output",
        "dynamic_output_shape",
        "flexible_layout",
        "generated",
        "inplace",
        "inplace_view",
        "maybe_aliasing_or_mutating",
        "needs_contiguous_strides",
        "needs_exact_strides",
        "needs_fixed_stride_order",
        "nondeterministic_bitwise",
        "nondeterministic_seeded",
        "out",
        "out_variant",
        "pointwise",
        "pt2_compliant_tag",
        "reduction",
        "view_copy",
    }
)

KernelStatus = Literal["active", "inactive", "unavailable", "overridden"]


@frozen(kw_only=True)
class TorchState:
    """What torch's dispatcher holds that opregistry did not put there.

    Built by :func:`opregistry.torch_state.snapshot` when torch is imported;
    the resolver only reads it.
    """

    ops: frozenset[str] = frozenset()
    namespaces: frozenset[str] = frozenset()
    has_kernel: Callable[[str, str], bool] = field(default=lambda op, key: False, eq=False)
    tags: frozenset[str] = KNOWN_TAGS


@frozen(kw_only=True)
class KernelPlan:
    kernel: Kernel
    status: KernelStatus
    backend: str | None = None
    #: for inactive / unavailable kernels: what would activate them
    reason: str = ""
    #: what this kernel replaces: a distribution (``name==version``) or ``"torch"``
    overrides: str | None = None

    def to_dict(self) -> dict[str, Any]:
        k = self.kernel
        return {
            "op": k.op,
            "key": k.key,
            "status": self.status,
            "kernel": describe_ref(k.fn),
            "setup_context": describe_ref(k.setup_context),
            "backend": self.backend,
            "reason": self.reason,
            "override": k.override,
            "overrides": self.overrides,
            "distribution": k.origin.dist if k.origin else None,
        }


@frozen(kw_only=True)
class OpPlan:
    op: OpDef
    parsed: Schema = field(eq=False, repr=False)
    kernels: tuple[KernelPlan, ...] = ()

    def kernel(self, key: str) -> KernelPlan | None:
        for k in self.kernels:
            if k.kernel.key == key and k.status != "overridden":
                return k
        return None

    def to_dict(self) -> dict[str, Any]:
        op = self.op
        return {
            "name": op.qualname,
            "schema": op.full_schema,
            "mutates_args": list(self.parsed.mutated_args),
            "tags": list(op.tags),
            "samples": describe_ref(op.samples),
            "distribution": op.origin.dist if op.origin else None,
            "source": op.source,
            "kernels": [k.to_dict() for k in self.kernels],
        }


@frozen(kw_only=True)
class NamespacePlan:
    name: str
    owner: Origin | None
    fragments: tuple[Origin, ...] = ()
    closed: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "owner": self.owner.dist if self.owner else None,
            "fragments": [f.dist for f in self.fragments],
            "closed": self.closed,
        }


@frozen(kw_only=True)
class BackendPlan:
    backend: Backend
    available: bool

    def to_dict(self) -> dict[str, Any]:
        b = self.backend
        return {
            "name": b.name,
            "keys": list(b.keys),
            "device_type": b.device_type,
            "available": self.available,
            "distribution": b.origin.distribution if b.origin else None,
            "version": b.origin.version if b.origin else None,
        }


@frozen(kw_only=True)
class Plan:
    """The resolved registry: what will be registered, and everything wrong."""

    backends: tuple[BackendPlan, ...] = ()
    namespaces: tuple[NamespacePlan, ...] = ()
    ops: tuple[OpPlan, ...] = ()
    #: kernels for ops opregistry does not define (torch's own, under policy)
    external_kernels: tuple[KernelPlan, ...] = ()
    problems: tuple[Problem, ...] = ()
    distributions: tuple[Origin, ...] = ()
    excluded: tuple[Origin, ...] = ()
    skipped: tuple[Skipped, ...] = ()

    @property
    def errors(self) -> tuple[Problem, ...]:
        return tuple(p for p in self.problems if p.severity == "error")

    def op(self, qualname: str) -> OpPlan | None:
        for op in self.ops:
            if op.op.qualname == qualname:
                return op
        return None

    def kernels(self) -> tuple[KernelPlan, ...]:
        return tuple(k for op in self.ops for k in op.kernels) + self.external_kernels

    def to_dict(self) -> dict[str, Any]:
        return {
            "backends": [b.to_dict() for b in self.backends],
            "namespaces": [n.to_dict() for n in self.namespaces],
            "ops": [o.to_dict() for o in self.ops],
            "external_kernels": [k.to_dict() for k in self.external_kernels],
            "distributions": [
                {"name": o.distribution, "version": o.version, "group": o.group,
                 "entry_point": o.entry_point_spec}
                for o in self.distributions
            ],
            "excluded": sorted({o.dist for o in self.excluded}),
            "skipped": [
                {"distribution": s.origin.dist, "entry_point": s.origin.entry_point_spec,
                 "reason": s.reason}
                for s in self.skipped
            ],
            "problems": [p.to_dict() for p in self.problems],
        }


# ---------------------------------------------------------------------------


def _dist(origin: Origin | None) -> str:
    return origin.distribution if origin is not None else "<unknown>"


def _problem(code: str, message: str, hint: str, culprits: Iterable[Origin | None], **kw: Any) -> Problem:
    unique = sorted({o for o in culprits if o is not None})
    return Problem(code=code, message=message, hint=hint, culprits=tuple(unique), **kw)


def _names(origins: Iterable[Origin | None]) -> str:
    return " and ".join(sorted({str(o) for o in origins if o is not None}))


class _Pass:
    """One pass of the rules over the declarations of the distributions still in."""

    def __init__(self, decl: Declarations, keep: Callable[[Origin | None], bool],
                 torch: TorchState | None, policy: Policy,
                 excluded_ops: dict[str, Origin]) -> None:
        self.torch = torch
        self.policy = policy
        self.excluded_ops = excluded_ops
        self.problems: list[Problem] = []
        # ``decl``'s records come sorted (by :func:`_order`, once, in resolve):
        # filtering a sorted list keeps it sorted
        self.namespaces = [n for n in decl.namespaces if keep(n.origin)]
        self.ops = [o for o in decl.ops if keep(o.origin)]
        self.kernels = [k for k in decl.kernels if keep(k.origin)]
        self.backends = [b for b in decl.backends if keep(b.origin)]
        self.available = decl.available

    def add(self, code: str, message: str, hint: str, culprits: Iterable[Origin | None],
            **kw: Any) -> None:
        self.problems.append(_problem(code, message, hint, culprits, **kw))

    def warn(self, code: str, message: str, hint: str, severity: str = "warning", **kw: Any) -> None:
        self.problems.append(Problem(code=code, message=message, hint=hint, severity=severity, **kw))

    # -- backends ---------------------------------------------------------
    def check_backends(self) -> dict[str, Backend]:
        by_key: dict[str, list[Backend]] = defaultdict(list)
        by_name: dict[str, list[Backend]] = defaultdict(list)
        for b in self.backends:
            by_name[b.name].append(b)
            for key in b.keys:
                by_key[key].append(b)
        for name, group in by_name.items():
            if len(group) > 1:
                self.add("backend-conflict",
                         f"backend {name!r} is declared by {_names(b.origin for b in group)}",
                         "uninstall or block (OPREGISTRY_BLOCK) all but one",
                         (b.origin for b in group))
        owners: dict[str, Backend] = {}
        for key, group in by_key.items():
            if len(group) > 1:
                self.add("backend-conflict",
                         f"dispatch key {key} is served by several backends: "
                         f"{_names(b.origin for b in group)}",
                         "uninstall or block (OPREGISTRY_BLOCK) all but one",
                         (b.origin for b in group), key=key)
            else:
                owners[key] = group[0]
        return owners

    # -- namespaces -------------------------------------------------------
    def check_namespaces(self) -> dict[str, NamespacePlan]:
        defs: dict[str, list[Namespace]] = defaultdict(list)
        frags: dict[str, list[Namespace]] = defaultdict(list)
        for ns in self.namespaces:
            if not self._valid_namespace(ns.name, ns.origin, ns.kind, ns.source):
                continue
            (defs if ns.kind == "DEF" else frags)[ns.name].append(ns)
        plans: dict[str, NamespacePlan] = {}
        for name in sorted(set(defs) | set(frags)):
            owners = defs.get(name, [])
            owner_dists = {_dist(n.origin) for n in owners}
            if len(owner_dists) > 1:
                self.add("namespace-conflict",
                         f"namespace {name!r} is defined (DEF) by {_names(n.origin for n in owners)}; "
                         f"a namespace has one owner",
                         "uninstall one of them, or block it with OPREGISTRY_BLOCK=<distribution>",
                         (n.origin for n in owners), namespace=name, source=owners[0].source)
                continue
            if self.torch is not None and name in self.torch.namespaces and owners:
                self.add("namespace-held-by-torch",
                         f"namespace {name!r} already exists in torch (a C++ TORCH_LIBRARY or a "
                         f"Library('{name}', 'DEF') made outside opregistry); "
                         f"{_names(n.origin for n in owners)} cannot DEF it",
                         "rename the namespace, or declare it FRAGMENT to add ops to it",
                         (n.origin for n in owners), namespace=name, source=owners[0].source)
                continue
            owner = owners[0] if owners else None
            fragments = []
            for frag in frags.get(name, []):
                if owner is not None and _dist(frag.origin) == _dist(owner.origin):
                    continue
                if owner is not None and owner.closed:
                    self.add("namespace-closed",
                             f"{frag.origin} adds a FRAGMENT to namespace {name!r}, which its owner "
                             f"{owner.origin} closed to other distributions",
                             f"ask {_dist(owner.origin)} to open it, or use your own namespace",
                             (frag.origin,), others=(owner.origin,) if owner.origin else (),
                             namespace=name, source=frag.source)
                    continue
                fragments.append(frag.origin)
            plans[name] = NamespacePlan(
                name=name,
                owner=owner.origin if owner else None,
                fragments=tuple(sorted({f for f in fragments if f is not None})),
                closed=bool(owner and owner.closed),
            )
        return plans

    def _valid_namespace(self, name: str, origin: Origin | None, kind: str,
                         source: str | None = None) -> bool:
        if not is_identifier(name):
            self.add("namespace-invalid",
                     f"{origin} declares namespace {name!r}, which is not a valid identifier "
                     f"(ASCII letters, digits and '_', not starting with a digit)",
                     "rename the namespace, e.g. to " + repr(_suggest_identifier(name)),
                     (origin,), namespace=name, source=source)
            return False
        if name in SCHEMA_KEYWORDS:
            self.add("namespace-invalid",
                     f"{origin} declares namespace {name!r}, a keyword of torch's schema "
                     f"language, which torch cannot parse as a namespace",
                     "rename the namespace, e.g. to " + repr(name.lower() + "_ops"),
                     (origin,), namespace=name, source=source)
            return False
        if name in RESERVED_NAMESPACES:
            self.add("namespace-reserved",
                     f"{origin} declares {kind} of namespace {name!r}, which belongs to torch",
                     "use a namespace of your own; to add a kernel to a torch op, use "
                     "OpLibrary(ns, 'IMPL') with override policy",
                     (origin,), namespace=name, source=source)
            return False
        return True

    # -- ops --------------------------------------------------------------
    def check_ops(self, namespaces: dict[str, NamespacePlan]) -> dict[str, OpPlan]:
        declared: dict[tuple[str, str], bool] = {}
        for ns in self.namespaces:
            declared[(ns.name, _dist(ns.origin))] = True
        by_name: dict[str, list[OpDef]] = defaultdict(list)
        parsed: dict[int, Schema] = {}
        for op in self.ops:
            where = op.source
            if (op.namespace, _dist(op.origin)) not in declared:
                self.add("op-namespace-undeclared",
                         f"{op.origin} defines {op.qualname} but does not declare namespace "
                         f"{op.namespace!r}",
                         f"declare it: OpLibrary({op.namespace!r}) to own it, or "
                         f"OpLibrary({op.namespace!r}, 'FRAGMENT') to add to it",
                         (op.origin,), op=op.qualname, source=where)
                continue
            if op.namespace not in namespaces:
                continue  # the namespace itself is invalid or in conflict: reported already
            if not is_identifier(op.name) or (op.overload and not is_identifier(op.overload)):
                self.add("op-name-invalid",
                         f"{op.origin} defines op {op.qualname!r}: names and overloads must be "
                         f"identifiers", "rename the op", (op.origin,), op=op.qualname, source=where)
                continue
            if {op.name, op.overload} & SCHEMA_KEYWORDS:
                self.add("op-name-invalid",
                         f"{op.origin} defines op {op.qualname!r}: "
                         f"{sorted({op.name, op.overload} & SCHEMA_KEYWORDS)[0]!r} is a keyword "
                         f"of torch's schema language, which torch cannot parse as a name",
                         "rename the op", (op.origin,), op=op.qualname, source=where)
                continue
            try:
                schema = parse_signature(op.schema)
                check_mutates_args(schema, op.mutates_args, op.qualname)
                check_tags(schema, op.tags, op.qualname)
            except SchemaError as exc:
                self.add("schema-invalid", f"{op.origin}: {op.qualname}: {exc}",
                         "fix the schema (see docs/op-authors.md#schemas)",
                         (op.origin,), op=op.qualname, source=where)
                continue
            if self.torch is not None:
                unknown = set(op.tags) - self.torch.tags
            else:
                unknown = set(op.tags) - KNOWN_TAGS
            if unknown:
                self.add("op-tag-unknown",
                         f"{op.origin}: {op.qualname} has unknown tag(s) {sorted(unknown)}",
                         "use names of torch.Tag members, e.g. 'pt2_compliant_tag'",
                         (op.origin,), op=op.qualname, source=where)
                continue
            if self.torch is not None and op.qualname in self.torch.ops:
                self.add("op-held-by-torch",
                         f"{op.origin} defines {op.qualname}, which torch already has "
                         f"(registered outside opregistry)",
                         "rename the op or its overload", (op.origin,), op=op.qualname, source=where)
                continue
            parsed[id(op)] = schema
            by_name[op.qualname].append(op)
        plans: dict[str, OpPlan] = {}
        for qualname, defs in by_name.items():
            dists = {_dist(o.origin) for o in defs}
            if len(defs) > 1:
                owner = namespaces[defs[0].namespace].owner
                owner_defs = [o for o in defs if owner is not None and _dist(o.origin) == _dist(owner)]
                if len(dists) == 1:
                    culprits = [defs[0].origin]
                    msg = f"{defs[0].origin} defines {qualname} twice"
                elif len(owner_defs) == 1:
                    culprits = [o.origin for o in defs if all(o is not d for d in owner_defs)]
                    msg = (f"{_names(culprits)} redefine(s) {qualname}, which namespace owner "
                           f"{owner} already defines; a FRAGMENT may add ops, never redefine one")
                else:
                    culprits = [o.origin for o in defs]
                    msg = f"{qualname} is defined by {_names(culprits)}"
                self.add("op-conflict", msg,
                         "rename the op (or give it another overload name), or uninstall one "
                         "of the distributions", culprits, op=qualname,
                         others=tuple(o.origin for o in owner_defs if o.origin),
                         # the line to fix is the culprit's, not the owner's
                         source=next((o.source for o in defs
                                      if o.origin in culprits and o.source), defs[-1].source))
                if len(owner_defs) != 1:
                    continue
                defs = owner_defs
            plans[qualname] = OpPlan(op=defs[0], parsed=parsed[id(defs[0])])
        return plans

    # -- kernels ----------------------------------------------------------
    def check_kernels(self, ops: dict[str, OpPlan], owners: dict[str, Backend]
                      ) -> tuple[dict[str, OpPlan], tuple[KernelPlan, ...]]:
        groups: dict[tuple[str, str], list[Kernel]] = defaultdict(list)
        declared_here = {op.qualname for op in self.ops}
        for k in self.kernels:
            if k.op not in ops and k.op in declared_here:
                continue  # its op was refused, and that is reported; dependents next pass
            if k.op in ops:
                if not self._kernel_fits(k, ops[k.op]):
                    continue
            elif not self._external_allowed(k):
                continue
            groups[(k.op, k.key)].append(k)

        planned: dict[str, list[KernelPlan]] = defaultdict(list)
        external: list[KernelPlan] = []
        for (qualname, key), group in sorted(groups.items()):
            op_plan = ops.get(qualname)
            definer = _dist(op_plan.op.origin) if op_plan else None
            winner, losers = self._choose(qualname, key, group, definer)
            if winner is None:
                continue
            existing = None
            if op_plan is None and self.torch is not None and self.torch.has_kernel(qualname, key):
                if not winner.override:
                    self.add("kernel-override-undeclared",
                             f"{winner.origin} registers a {key} kernel for {qualname}, which torch "
                             f"already implements for {key}",
                             "declare override=True (and allow it with OPREGISTRY_ALLOW_OVERRIDE) "
                             "if replacing torch's kernel is intended",
                             (winner.origin,), op=qualname, key=key, source=winner.source)
                    continue
                existing = "torch"
            elif op_plan is None and self.torch is None and winner.override:
                # without torch (``opregistry list``) the dispatcher cannot be asked; the
                # declaration says it replaces torch's kernel, and listings must show that
                existing = "torch"
            for loser in losers:
                planned[qualname].append(KernelPlan(kernel=loser, status="overridden",
                                                    backend=_owner_name(owners, key)))
            overrides = existing or (_names(l.origin for l in losers) if losers else None)
            entry = self._status(winner, owners, overrides)
            (planned[qualname] if op_plan else external).append(entry)

        result = {}
        for qualname, plan in ops.items():
            result[qualname] = attrs.evolve(plan, kernels=tuple(sorted(
                planned.get(qualname, []), key=lambda k: (k.kernel.key, k.status))))
        return result, tuple(external)

    def _kernel_fits(self, k: Kernel, op: OpPlan) -> bool:
        schema = op.parsed
        if k.key == "Autograd":
            not_functional = schema.is_mutable or any(r.type.alias for r in schema.returns)
            if not_functional or "out" in op.op.tags:
                self.add("autograd-on-mutable-op",
                         f"{k.origin} registers autograd for {k.op}, which mutates or aliases its "
                         f"inputs; torch.library.register_autograd refuses such ops",
                         "define a functional op (no '(a!)' annotations) and register autograd "
                         "for it", (k.origin,), op=k.op, key=k.key, source=k.source)
                return False
            if not schema.returns:
                self.add("autograd-no-returns",
                         f"{k.origin} registers autograd for {k.op}, which returns nothing: "
                         f"there is nothing to differentiate",
                         "return the result (a new tensor), or drop the autograd kernel",
                         (k.origin,), op=k.op, key=k.key, source=k.source)
                return False
            if _has_kwarg_only_tensor(schema):
                self.add("autograd-kwarg-only-tensor",
                         f"{k.origin} registers autograd for {k.op}, whose tensors are "
                         f"keyword-only; torch does not support that",
                         "make the tensor arguments positional", (k.origin,),
                         op=k.op, key=k.key, source=k.source)
                return False
        if k.key == "FuncTorchBatched" and _has_kwarg_only_tensor(schema):
            # torch.library.register_vmap raises NotImplementedError for these
            self.add("vmap-kwarg-only-tensor",
                     f"{k.origin} registers a vmap rule for {k.op}, whose tensors are "
                     f"keyword-only; torch.library.register_vmap does not support that",
                     "make the tensor arguments positional", (k.origin,),
                     op=k.op, key=k.key, source=k.source)
            return False
        return True

    def _external_allowed(self, k: Kernel) -> bool:
        namespace = k.namespace
        torch_owned = namespace in RESERVED_NAMESPACES or (
            self.torch is not None and namespace in self.torch.namespaces)
        if not torch_owned:
            hint = "check the op name; the op must be defined by an installed distribution"
            message = f"{k.origin} registers a {k.key} kernel for {k.op}, which no distribution defines"
            if k.op in self.excluded_ops:
                message += f" (its definer {self.excluded_ops[k.op]} was left out: see its problem)"
                hint = f"fix {self.excluded_ops[k.op].distribution} first"
            self.add("kernel-for-undefined-op", message, hint, (k.origin,),
                     op=k.op, key=k.key, source=k.source)
            return False
        if self.torch is not None and k.op not in self.torch.ops:
            self.add("kernel-for-undefined-op",
                     f"{k.origin} registers a {k.key} kernel for {k.op}, which torch does not have",
                     "check the op name and overload (e.g. aten::add.Tensor)", (k.origin,),
                     op=k.op, key=k.key, source=k.source)
            return False
        if not self.policy.allows(k.op):
            self.add("kernel-torch-op-denied",
                     f"{k.origin} registers a {k.key} kernel for {k.op}, an op torch owns; "
                     f"this is denied unless the policy names {namespace!r}",
                     f"if intended, set OPREGISTRY_ALLOW_OVERRIDE={namespace} (or {k.op})",
                     (k.origin,), op=k.op, key=k.key, source=k.source)
            return False
        return True

    def _choose(self, qualname: str, key: str, group: list[Kernel], definer: str | None
                ) -> tuple[Kernel | None, list[Kernel]]:
        """Rule 5: one kernel per (op, key); an override needs a flag and policy."""
        by_dist: dict[str, list[Kernel]] = defaultdict(list)
        for k in group:
            by_dist[_dist(k.origin)].append(k)
        ok = True
        for dist, ks in by_dist.items():
            if len(ks) > 1:
                self.add("kernel-duplicate",
                         f"{ks[0].origin} declares {len(ks)} {key} kernels for {qualname}",
                         "keep one", (ks[0].origin,), op=qualname, key=key, source=ks[-1].source)
                ok = False
        if not ok:
            return None, []
        if len(group) == 1:
            return group[0], []
        overriders = [k for k in group if k.override and _dist(k.origin) != definer]
        base = [k for k in group if not (k.override and _dist(k.origin) != definer)]
        definer_base = [k for k in base if _dist(k.origin) == definer]
        standing = definer_base or (base if len(base) == 1 else [])
        if definer_base:
            for k in base:
                if _dist(k.origin) == definer:
                    continue
                self.add("kernel-conflict",
                         f"{k.origin} registers a second {key} kernel for {qualname}, which "
                         f"{definer_base[0].origin} already implements (torch would silently "
                         f"replace one with the other)",
                         "remove the kernel, or declare override=True and allow it with "
                         "OPREGISTRY_ALLOW_OVERRIDE", (k.origin,),
                         others=tuple(d.origin for d in definer_base if d.origin),
                         op=qualname, key=key, source=k.source)
        elif len(base) > 1:
            self.add("kernel-conflict",
                     f"{qualname} gets several {key} kernels, from {_names(k.origin for k in base)}",
                     "uninstall or block all but one, or mark one override=True and allow it "
                     "with OPREGISTRY_ALLOW_OVERRIDE", (k.origin for k in base), op=qualname, key=key)
        allowed = []
        for k in overriders:
            if self.policy.allows(qualname):
                allowed.append(k)
                continue
            self.add("kernel-override-denied",
                     f"{k.origin} overrides the {key} kernel of {qualname} registered by "
                     f"{_names(b.origin for b in base)}, and the policy does not allow "
                     f"overriding {qualname}",
                     f"if intended, set OPREGISTRY_ALLOW_OVERRIDE={qualname.split('::')[0]} "
                     f"(or {qualname})",
                     (k.origin,), others=tuple(b.origin for b in base if b.origin),
                     op=qualname, key=key, source=k.source)
        if len(allowed) > 1:
            self.add("kernel-conflict",
                     f"{qualname} gets several overriding {key} kernels, from "
                     f"{_names(k.origin for k in allowed)}; at most one may override",
                     "uninstall or block all but one", (k.origin for k in allowed),
                     op=qualname, key=key)
        if len(allowed) == 1:
            return allowed[0], standing
        return (standing[0] if standing else None), []

    def _status(self, k: Kernel, owners: dict[str, Backend], overrides: str | None) -> KernelPlan:
        backend = owners.get(k.key)
        if backend is None:
            return KernelPlan(kernel=k, status="inactive", reason=_keys.provider_hint(k.key),
                              overrides=overrides)
        if not self.available.get(backend.name, True):
            return KernelPlan(kernel=k, status="unavailable", backend=backend.name,
                              reason=f"backend {backend.name} is installed but not available on "
                                     f"this machine", overrides=overrides)
        return KernelPlan(kernel=k, status="active", backend=backend.name, overrides=overrides)

    # -- reports ----------------------------------------------------------
    def report_gaps(self, ops: dict[str, OpPlan]) -> None:
        for qualname, plan in ops.items():
            active = {k.kernel.key for k in plan.kernels if k.status == "active"}
            declared = {k.kernel.key for k in plan.kernels}
            origin = plan.op.origin
            devices = {k for k in declared if k in _keys.DEVICE_KEYS}
            if not devices & active:
                self.warn("op-no-active-kernel",
                          f"{qualname} ({origin}) has no active device kernel "
                          f"(declared: {', '.join(sorted(devices)) or 'none'})",
                          "install the backend its kernels need, or add a kernel",
                          op=qualname, culprits=(origin,) if origin else ())
            if "Meta" not in declared:
                self.warn("op-no-fake",
                          f"{qualname} ({origin}) has no fake kernel: torch.compile and "
                          f"torch.export will fail on it",
                          "add one with register_fake / fake=", op=qualname,
                          others=(origin,) if origin else ())
            elif "Meta" not in active:
                self.warn("op-fake-inactive",
                          f"{qualname} ({origin}) declares a fake kernel but it is not active",
                          _keys.provider_hint("Meta"), op=qualname)
            if "FuncTorchBatched" not in declared:
                self.warn("op-no-vmap", f"{qualname} ({origin}) has no vmap rule",
                          "add one with register_vmap / vmap= to use it under torch.vmap",
                          severity="info", op=qualname)


def _has_kwarg_only_tensor(schema: Schema) -> bool:
    """torch's register_autograd and register_vmap refuse keyword-only tensors."""
    return any(a.kwarg_only and a.type.is_tensor_like for a in schema.arguments)


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


def _owner_name(owners: dict[str, Backend], key: str) -> str | None:
    b = owners.get(key)
    return b.name if b else None


def _suggest_identifier(name: str) -> str:
    import re

    text = re.sub(r"\W", "_", name.encode("ascii", "ignore").decode() or "ns")
    return text if is_identifier(text) else f"ns_{text}"


def resolve(decl: Declarations, *, policy: Policy | None = None,
            torch_state: TorchState | None = None) -> Plan:
    """Apply the resolution rules to ``decl``; never raises for a bad declaration."""
    policy = policy or Policy()
    excluded: dict[str, Origin] = {}
    errors: dict[tuple[str, str], Problem] = {}
    for p in decl.problems:
        errors[(p.code, p.message)] = p
    excluded_ops: dict[str, Origin] = {}
    # rule 9: a distribution whose entry point failed before resolution (import
    # error, invalid hooks, installed twice) is left out whole, not just that
    # entry point: its other entry points would register half a package
    for p in decl.problems:
        if p.severity == "error":
            for o in p.culprits:
                excluded.setdefault(o.distribution, o)
    # every pass (and the first definer named below) must not depend on the
    # order of discovery; sorting once here spares each pass its own sort
    ordered = attrs.evolve(decl, namespaces=sorted(decl.namespaces, key=_order),
                           ops=sorted(decl.ops, key=_order),
                           kernels=sorted(decl.kernels, key=_order),
                           backends=sorted(decl.backends, key=_order))
    for op in ordered.ops:
        if op.origin is not None and op.origin.distribution in excluded:
            excluded_ops.setdefault(op.qualname, op.origin)

    while True:
        step = _Pass(ordered, lambda o: o is None or o.distribution not in excluded,
                     torch_state, policy, excluded_ops)
        owners = step.check_backends()
        namespaces = step.check_namespaces()
        ops = step.check_ops(namespaces)
        ops, external = step.check_kernels(ops, owners)
        new = [p for p in step.problems if p.severity == "error"]
        for p in new:
            errors.setdefault((p.code, p.message), p)
        culprits = {o.distribution: o for p in new for o in p.culprits}
        if not culprits.keys() - excluded.keys():
            break
        excluded.update(culprits)
        for op in ordered.ops:  # sorted: the first definer named must not depend on order
            if op.origin is not None and op.origin.distribution in excluded:
                excluded_ops.setdefault(op.qualname, op.origin)

    step.report_gaps(ops)
    warnings = [p for p in step.problems if p.severity != "error"]
    # namespaces left with no op and no owner (every contributor excluded) drop out
    backends = tuple(
        BackendPlan(backend=b, available=decl.available.get(b.name, True))
        for b in step.backends if b.name in {o.name for o in owners.values()}
    )
    excluded_origins = tuple(sorted(
        o for o in decl.distributions if o.distribution in excluded))
    return Plan(
        backends=backends,
        namespaces=tuple(namespaces[n] for n in sorted(namespaces)),
        ops=tuple(ops[q] for q in sorted(ops)),
        external_kernels=external,
        problems=tuple(sorted(errors.values(), key=_problem_order)) + tuple(warnings),
        distributions=tuple(sorted(decl.distributions)),
        excluded=excluded_origins,
        skipped=tuple(sorted(decl.skipped, key=lambda s: s.origin)),
    )


def _problem_order(p: Problem) -> tuple[str, str]:
    return (p.code, p.message)
