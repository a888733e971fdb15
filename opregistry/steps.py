"""Materialization planned: the ordered registration steps of a plan, as data.

:func:`plan_steps` turns a :class:`~opregistry.plans.Plan` into the list of
registrations the materializer will make, in order, each naming the
distribution it belongs to -- a distribution is rolled back whole, so every
step says whose it is.  It is a pure function (no torch), printed by
``opregistry show --steps``; :mod:`opregistry.materializer` executes it.

The order is torch's: a namespace's native library (its ``TORCH_LIBRARY``
block defines ops others add to) before any definition, every definition
before any kernel (a kernel of one distribution may target another's op),
IMPL native libraries once the ops they fill are defined, then the kernels
distribution by distribution, and last the chains of kernel candidates
(registered once the candidates of every distribution have imported, so
that one that fails leaves out its distribution, not the chain).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable, Literal, Mapping, NamedTuple

from attrs import field, frozen

from .model import Origin, describe_ref
from .plans import KernelPlan, NativePlan, OpPlan, Plan

__all__ = ["Action", "Step", "Steps", "plan_steps", "chained"]

#: what a step does, in the order the actions come
Action = Literal["load-native", "define", "route-factory", "load-native-impl", "register",
                 "import-candidate", "register-candidates"]


class Step(NamedTuple):
    """One registration: what is done, for which op and key, by whom, through which backend.

    ``subject`` is the plan record the executor acts on (an
    :class:`~opregistry.plans.OpPlan`, a :class:`~opregistry.plans.KernelPlan`,
    a :class:`~opregistry.plans.NativePlan`, or a chain's op and members);
    ``definers`` are the distributions defining the ops the step needs (a
    kernel cannot outlive its op).  A named tuple: a plan of 10,000 ops has
    ~50,000 steps, made at every ``import torch``.
    """

    action: Action
    origin: Origin
    namespace: str
    op: str | None = None
    key: str | None = None
    kind: str | None = None
    backend: str | None = None
    what: str = ""
    definers: tuple[str, ...] = ()
    subject: Any = None
    #: ``file:line`` of the declaration the step comes from
    source: str | None = None

    @property
    def distribution(self) -> str:
        return self.origin.distribution

    def text(self) -> str:
        """``register  nnkit::rms_norm  CUDA  triton  nnkit.kernels:rms_norm (backend cuda)``."""
        parts = [f"{self.action:<19}", self.op or self.namespace]
        if self.key:
            parts.append(self.key)
        if self.kind:
            parts.append(self.kind)
        if self.what:
            parts.append(self.what)
        if self.backend:
            parts.append(f"(backend {self.backend})")
        return "  ".join(parts) + f"  [{self.origin.dist}]"

    def to_dict(self) -> dict[str, Any]:
        return {"action": self.action, "distribution": self.origin.dist,
                "namespace": self.namespace, "op": self.op, "key": self.key,
                "kind": self.kind, "backend": self.backend, "what": self.what}


@frozen(kw_only=True)
class Steps:
    """The registration steps of a plan, and what the executor needs besides them."""

    steps: tuple[Step, ...] = ()
    #: every distribution that registers something, by name
    origins: Mapping[str, Origin] = field(factory=dict)
    #: distribution -> namespace -> the kind of ``Library`` it opens there (DEF, FRAGMENT)
    owned: Mapping[str, Mapping[str, str]] = field(factory=dict)
    #: namespaces third-party code must not register in by itself while it runs
    watched: frozenset[str] = frozenset()
    #: every op the plan defines, in the plan's order, with the distribution defining it
    definers: Mapping[str, str] = field(factory=dict)

    #: ``(distribution, namespace)`` -> where its ``Library`` is said to be created: the
    #: first declaration a step of it comes from (torch names it in its own messages)
    sites: Mapping[tuple[str, str], str] = field(factory=dict)

    @property
    def planned(self) -> frozenset[str]:
        """Every op the plan defines."""
        return frozenset(self.definers)

    def of(self, distributions: Iterable[str]) -> tuple[Step, ...]:
        """The steps of ``distributions``, in order."""
        wanted = set(distributions)
        return tuple(s for s in self.steps if s.distribution in wanted)

    def text(self) -> str:
        return "\n".join(s.text() for s in self.steps)

    def to_dict(self) -> list[dict[str, Any]]:
        return [s.to_dict() for s in self.steps]


def chained(op: OpPlan) -> dict[tuple[str, str], tuple[KernelPlan, ...]]:
    """The (op, key)s whose active kernels are candidates needing a chain, with them in order.

    Several active candidates, or one that may decline a call; a single
    candidate that takes every call is registered as a plain kernel.
    """
    by_key: dict[str, list[KernelPlan]] = defaultdict(list)
    for k in op.kernels:
        if k.rank is not None and k.status == "active" and k.kernel.origin is not None:
            by_key[k.kernel.key].append(k)
    return {(op.op.qualname, key): tuple(sorted(members, key=lambda k: k.rank or 0))
            for key, members in by_key.items()
            if len(members) > 1 or members[0].kernel.per_call}


def _owned(plan: Plan, natively: set[tuple[str, str]]) -> dict[str, dict[str, str]]:
    """Distribution -> namespace -> its Library kind; a native DEF's is opened as IMPL."""
    owned: dict[str, dict[str, str]] = defaultdict(dict)
    for ns in plan.namespaces:
        if ns.owner is not None and (ns.name, ns.owner.distribution) not in natively:
            owned[ns.owner.distribution][ns.name] = "DEF"
        for frag in ns.fragments:
            if (ns.name, frag.distribution) not in natively:
                owned[frag.distribution].setdefault(ns.name, "FRAGMENT")
    return owned


def _origins(plan: Plan) -> dict[str, Origin]:
    origins: dict[str, Origin] = {}
    for ns in plan.namespaces:
        for origin in (ns.owner, *ns.fragments):
            if origin is not None:
                origins[origin.distribution] = origin
    for k in plan.kernels():
        if k.status == "active" and k.kernel.origin is not None:
            origins.setdefault(k.kernel.origin.distribution, k.kernel.origin)
    for n in plan.natives:  # an IMPL library's: it may have no Python piece
        origins.setdefault(n.origin.distribution, n.origin)
    return origins


def _native_step(native: NativePlan, definers: Mapping[str, str]) -> Step:
    impl = native.kind == "IMPL"
    return Step(action="load-native-impl" if impl else "load-native", origin=native.origin,
                namespace=native.namespace, what=native.library.target, subject=native,
                definers=tuple(sorted({definers[op] for op, _ in native.keys if op in definers}))
                if impl else ())


def _definition_steps(plan: Plan, natively: set[tuple[str, str]]) -> list[Step]:
    steps = []
    for op in plan.ops:
        opdef = op.op
        origin = opdef.origin
        assert origin is not None
        namespace = opdef.namespace
        if natively and (namespace, origin.distribution) in natively:
            continue  # its library's TORCH_LIBRARY block defines it
        qualname = opdef.qualname
        steps.append(Step("define", origin, namespace, qualname, None, None, None,
                          opdef.full_schema, (), op, opdef.source))
        if op.parsed.is_factory:
            steps.append(Step(action="route-factory", origin=origin, namespace=namespace,
                              op=qualname, key="BackendSelect",
                              what="by its device argument", subject=op))
    return steps


def _kernel_step(action: Action, op: OpPlan | None, k: KernelPlan, subject: Any) -> Step:
    # one per kernel, at every import torch: built positionally (keywords cost twice as much)
    kernel = k.kernel
    assert kernel.origin is not None
    definer = op.op.origin.distribution if op is not None and op.op.origin else None
    return Step(action, kernel.origin, kernel.namespace, kernel.op, kernel.key, kernel.kind.name,
                k.backend, describe_ref(kernel.fn) or "", (definer,) if definer else (), subject,
                kernel.source)


def _kernel_steps(plan: Plan, chains: dict[tuple[str, str], Any]) -> list[Step]:
    """Every active kernel a backend registers, distribution by distribution; ``chains`` is
    filled with the chains of candidates of each op (:func:`chained`), found on the way.

    One pass over 40,000 kernels at every ``import torch`` of 10,000 ops: what is the
    same for every kernel of an op (its namespace, its definer) is read once per op.
    """
    by_dist: dict[str, list[Step]] = defaultdict(list)
    for op in plan.ops:
        kernels = op.kernels
        found = None
        for k in kernels:
            if k.rank is not None:  # a candidate: the op may have chains
                found = chained(op)
                chains.update((pair, (op, members)) for pair, members in found.items())
                break
        opdef = op.op
        namespace = opdef.namespace
        definers = (opdef.origin.distribution,) if opdef.origin else ()
        for k in kernels:
            kernel = k.kernel
            origin = kernel.origin
            if k.status != "active" or origin is None:
                continue
            payload = kernel.payload
            kind = payload.kind
            if not kind.by_backend or (found and (kernel.op, kernel.key) in found):
                continue
            ref = getattr(payload, kind.primary)
            by_dist[origin.distribution].append(Step(
                "register", origin, namespace, kernel.op, kernel.key, kind.name, k.backend,
                ref if type(ref) is str else describe_ref(ref) or "", definers,
                (op, k), kernel.source))
    for k in plan.external_kernels:
        if k.status == "active" and k.kernel.origin is not None and k.kernel.kind.by_backend:
            by_dist[k.kernel.origin.distribution].append(_kernel_step("register", None, k,
                                                                      (None, k)))
    return [step for dist in sorted(by_dist) for step in by_dist[dist]]


def _candidate_steps(chains: Mapping[tuple[str, str], tuple[OpPlan, tuple[KernelPlan, ...]]]
                     ) -> list[Step]:
    imports, registrations = [], []
    for (qualname, key), (op, members) in sorted(chains.items()):
        for k in members:
            imports.append(_kernel_step("import-candidate", op, k, k))
        anchor = members[-1]
        step = _kernel_step("register-candidates", op, anchor, (op, members))
        registrations.append(Step(
            action=step.action, origin=step.origin, namespace=step.namespace, op=qualname,
            key=key, kind=step.kind, backend=anchor.backend, definers=step.definers,
            what=f"{len(members)} candidates", subject=step.subject))
    return imports + registrations


def plan_steps(plan: Plan) -> Steps:
    """The registration steps of ``plan``, in the order the materializer takes them."""
    # a namespace a native library defines: its TORCH_LIBRARY block is the DEF (or
    # FRAGMENT); Python adds kernels to it through an IMPL Library
    natively = {(n.namespace, n.origin.distribution) for n in plan.natives if n.kind != "IMPL"}
    definers = {op.op.qualname: op.op.origin.distribution for op in plan.ops
                if op.op.origin is not None}
    chains: dict[tuple[str, str], tuple[OpPlan, tuple[KernelPlan, ...]]] = {}
    kernel_steps = _kernel_steps(plan, chains)
    steps = [_native_step(n, definers) for n in plan.natives if n.kind != "IMPL"]
    steps += _definition_steps(plan, natively)
    steps += [_native_step(n, definers) for n in plan.natives if n.kind == "IMPL"]
    steps += kernel_steps
    steps += _candidate_steps(chains)
    # what kernel modules must not touch by themselves: the plan's namespaces and
    # those of the torch ops it adds kernels to (guard adds torch's reserved ones)
    watched = frozenset(ns.name for ns in plan.namespaces) | frozenset(
        k.kernel.namespace for k in plan.external_kernels)
    sites: dict[tuple[str, str], str] = {}
    for step in steps:
        source = step.source
        if source:
            sites.setdefault((step.origin.distribution, step.namespace), source)
    return Steps(steps=tuple(steps), origins=_origins(plan), owned=_owned(plan, natively),
                 watched=watched, definers=definers, sites=sites)
