"""The plan: what the resolver decided, as frozen records every later stage reads.

:func:`opregistry.resolver.resolve` builds a :class:`Plan`; the materializer
registers it, the lockfile pins it, the report module and the CLI show it.
The records live here, below all of them, so that none of those stages
imports another to learn a type.  (The module is ``plans``, not ``plan``:
:func:`opregistry.plan`, the function, is the package's attribute of that
name.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from attrs import field, frozen

from .kinds import kernel_fields
from .model import Backend, Kernel, NativeLibrary, OpDef, Origin, Problem, Skipped, describe_ref

if TYPE_CHECKING:  # the parser is imported where a plan is decoded or resolved
    from .adoption import Adopted
    from .schema import Schema

__all__ = [
    "KernelStatus",
    "KernelPlan",
    "RefusedKernel",
    "OpPlan",
    "NamespacePlan",
    "NativePlan",
    "BackendPlan",
    "Plan",
]

#: ``conflict`` is never planned: it marks, in listings, a kernel the resolver
#: refused (see :meth:`Plan.refused_kernels`); ``native`` is a C++ kernel, registered by
#: loading its distribution's native library;
#: ``unmet`` and ``unreached`` are candidates (several kernels for one key) that do
#: not serve: a load-time condition fails, or an earlier candidate takes every call
#: ``disabled``: turned off by a kernel switch (``OPREGISTRY_KERNELS``)
KernelStatus = Literal["active", "inactive", "unavailable", "overridden", "conflict", "unmet",
                       "unreached", "disabled", "native"]


def _kernel_row(*, op: str, key: str, status: str, kernel: dict[str, Any] | None = None,
                backend: str | None = None, reason: str = "", override: bool = False,
                overrides: str | None = None, distribution: str | None = None
                ) -> dict[str, Any]:
    """One kernel as listings and JSON show it: the one place its shape is written.

    ``kernel`` is :func:`~opregistry.kinds.kernel_fields` of the declaration
    (its kind, reference and the kind's own fields); a refused kernel has none.
    """
    fields = kernel or {"kind": None, "kernel": None, "setup_context": None}
    return {"op": op, "key": key, "status": status, **fields, "backend": backend,
            "reason": reason, "override": override, "overrides": overrides,
            "distribution": distribution}


@frozen(kw_only=True)
class KernelPlan:
    """One declared kernel and what the resolver decided for it."""

    kernel: Kernel
    status: KernelStatus
    backend: str | None = None
    #: for inactive / unavailable kernels: what would activate them
    reason: str = ""
    #: what this kernel replaces: a distribution (``name==version``) or ``"torch"``
    overrides: str | None = None
    #: for candidates of one (op, key): the position in the order they are tried (0 first)
    rank: int | None = None
    #: a kernel for an op a package defines with torch.library at its own import: the
    #: module whose import registers the package's kernel; this one is registered after it
    after: str | None = None

    def to_dict(self) -> dict[str, Any]:
        k = self.kernel
        row = _kernel_row(op=k.op, key=k.key, status=self.status,
                          kernel=kernel_fields(k, candidate=self.rank is not None),
                          backend=self.backend, reason=self.reason, override=k.override,
                          overrides=self.overrides,
                          distribution=k.origin.dist if k.origin else None)
        if self.rank is not None:
            row["rank"] = self.rank
        return row


@frozen(kw_only=True)
class RefusedKernel:
    """A kernel the resolver refused for an op it planned (conflict, override denied...).

    The plan keeps the refusal as a :class:`~opregistry.model.Problem`; listings
    show it under the op, with status ``conflict``, so that "why is my kernel
    not there" is answered where the user looks.
    """

    problem: Problem

    @property
    def op(self) -> str:
        return self.problem.op or ""

    def to_dict(self) -> dict[str, Any]:
        p = self.problem
        return _kernel_row(op=self.op, key=p.key or "", status="conflict",
                           reason=f"[{p.code}] see opregistry doctor",
                           distribution=", ".join(o.dist for o in p.culprits) or None)


@frozen(kw_only=True)
class OpPlan:
    """One op that will be defined, its parsed schema, and its kernels."""

    op: OpDef
    parsed: Schema = field(eq=False, repr=False)
    kernels: tuple[KernelPlan, ...] = ()

    def kernel(self, key: str) -> KernelPlan | None:
        """The kernel that serves ``key`` (not one it overrides), or ``None``.

        Of several candidates, the first active one.
        """
        found = None
        for k in self.kernels:
            if k.kernel.key == key and k.status != "overridden":
                if k.status == "active":
                    return k
                found = found or k
        return found

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
class NativePlan:
    """A native library the materializer loads, and what it must register.

    ``ops`` are the schemas its ``TORCH_LIBRARY`` block must define (as
    ``ns::name[.overload]`` -> full schema), ``keys`` the (op, key) pairs its
    ``TORCH_LIBRARY_IMPL`` blocks must fill.
    """

    namespace: str
    kind: str
    library: NativeLibrary
    origin: Origin
    ops: tuple[tuple[str, str], ...] = ()
    keys: tuple[tuple[str, str], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        lib = self.library
        return {"namespace": self.namespace, "kind": self.kind, "module": lib.module,
                "path": lib.path, "built_for": {"torch": lib.torch, "cxx11_abi": lib.cxx11_abi,
                                                "cuda": lib.cuda},
                "distribution": self.origin.dist,
                "ops": [name for name, _ in self.ops],
                "keys": [f"{op}/{key}" for op, key in self.keys]}


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
    #: the ``opregistry_*`` hooks each loaded plugin implements, from the
    #: plugin manager (``opregistry plugins`` shows them)
    hooks: dict[Origin, tuple[str, ...]] = field(factory=dict, eq=False, repr=False)
    #: the kernel switches in effect, ``("-nnkit::rms_norm:CUDA", "OPREGISTRY_KERNELS")``, in order
    switches: tuple[tuple[str, str], ...] = ()
    #: native libraries to load (C++ ``TORCH_LIBRARY`` blocks), by namespace
    natives: tuple[NativePlan, ...] = ()
    #: distributions that register with torch by themselves, and how each is adopted
    adoptions: tuple[Adopted, ...] = ()

    @property
    def errors(self) -> tuple[Problem, ...]:
        return tuple(p for p in self.problems if p.severity == "error")

    def op(self, qualname: str) -> OpPlan | None:
        """The op named ``ns::name`` or ``ns::name.overload``, or ``None``."""
        for op in self.ops:
            if op.op.qualname == qualname:
                return op
        return None

    def kernels(self) -> tuple[KernelPlan, ...]:
        return tuple(k for op in self.ops for k in op.kernels) + self.external_kernels

    def refused_kernels(self) -> tuple[RefusedKernel, ...]:
        """Kernels refused for planned ops, one per error problem about an (op, key)."""
        planned = {op.op.qualname for op in self.ops}
        return tuple(RefusedKernel(problem=p) for p in self.errors
                     if p.op and p.key and p.op in planned)

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
            "skipped": [s.to_dict() for s in self.skipped],
            "problems": [p.to_dict() for p in self.problems],
            "switches": [{"switch": text, "source": source} for text, source in self.switches],
            # only when there are some: plans without native libraries keep their shape
            **({"natives": [n.to_dict() for n in self.natives]} if self.natives else {}),
            **({"adopted": [a.to_dict() for a in self.adoptions]} if self.adoptions else {}),
        }

    def adopted(self, name: str) -> Adopted | None:
        """How the distribution ``name`` (canonical) is adopted, or ``None``."""
        for a in self.adoptions:
            if a.name == name:
                return a
        return None
