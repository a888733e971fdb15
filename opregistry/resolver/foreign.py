"""Packages that register with ``torch.library`` directly, as owners the rules protect.

bitsandbytes, torchao, vLLM and the like define their ops at their own
import (``torch.library.define``, ``custom_op``, ``TORCH_LIBRARY``), outside
opregistry.  The scan of their installed files (:mod:`opregistry.scan`, in
the :class:`~opregistry.environment.Environment`) says what each will
register; the rules treat such a distribution as the owner of what it
registers, as torch will once it is imported:

* ``namespace-held-by-package``: a DEF of a namespace it registers in;
* ``op-held-by-package``: a definition of an op it defines (a FRAGMENT may
  still add ops of other names to its namespace);
* ``kernel-package-op-denied``: a kernel for one of its ops, unless the
  override policy names the op or its namespace (then, as for torch's own
  ops, a key it already implements also needs ``override=True``).

opregistry's plugins are not foreign owners (what they register by
themselves is judged as registrations outside the plan), nor are torch's
reserved namespaces (torch owns those).  Every message names the owner as
``pip show`` does, ``name==version``, and the line that registers it.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from attrs import field, frozen

from ..foreign import Registration
from ..keys import RESERVED_NAMESPACES

__all__ = ["ForeignOwners", "foreign_owners", "owner_text", "possibly"]

#: the registrations that claim a namespace (a kernel for another's op claims nothing)
_CLAIMS = frozenset({"DEF", "FRAGMENT", "library", "op"})


@frozen
class ForeignOwners:
    """What non-opregistry distributions register, as the rules ask it.

    Each value is ``(distribution, registration)``: the first by distribution
    name, then file and line, so the owner named never depends on order.
    """

    namespaces: Mapping[str, tuple[Any, Any]] = field(factory=dict)
    ops: Mapping[str, tuple[Any, Any]] = field(factory=dict)
    kernels: Mapping[tuple[str, str], tuple[Any, Any]] = field(factory=dict)
    #: ops a package may define: a C++ library's schema string that names no namespace, in
    #: each namespace the library registers (:meth:`ForeignDistribution.possible_ops
    #: <opregistry.foreign.ForeignDistribution.possible_ops>`), and ops the scan knows only
    #: from kernels the package registers for them in a namespace it registers in (their
    #: definition is where it cannot read: a library without symbols, a computed name)
    possible_ops: Mapping[str, tuple[Any, Any]] = field(factory=dict)
    #: (namespace, key) -> a registration of kernels whose ops the scan cannot name: a C++
    #: ``TORCH_LIBRARY_IMPL`` block (its ops are not in the symbols), a Python kernel whose op
    #: name is computed (torchvision's ``register_meta`` helper)
    blocks: Mapping[tuple[str, str], tuple[Any, Any]] = field(factory=dict)

    def __bool__(self) -> bool:
        return bool(self.namespaces)

    def op_owner(self, qualname: str) -> tuple[Any, Any] | None:
        """The package that defines ``qualname``: for certain, else perhaps (:attr:`possible_ops`)."""
        return self.ops.get(qualname) or self.possible_ops.get(qualname)

    def kernel_owner(self, qualname: str, key: str) -> tuple[Any, Any] | None:
        """The package's registration that may implement ``key`` for its op ``qualname``: a
        kernel for it, else a block of kernels for the key in the op's namespace."""
        owner = self.op_owner(qualname)
        found = self.kernels.get((qualname, key))
        if found is None and owner is not None:
            block = self.blocks.get((qualname.partition("::")[0], key))
            found = block if block is not None and block[0] is owner[0] else None
        return found


def owner_text(owner: tuple[Any, Any]) -> str:
    """``bitsandbytes==0.50.2 (bitsandbytes/_ops.py:37)``: the owner and where it registers."""
    dist, registration = owner
    return f"{dist.distribution.text} ({registration.source})"


def foreign_owners(scan: Any, adoptions: Iterable[Any] = ()) -> ForeignOwners:
    """The owners of namespaces, ops and kernels in ``scan`` (a :class:`~opregistry.foreign.ForeignScan`).

    ``adoptions`` (:class:`~opregistry.adoption.Adoption`) add the namespaces
    a package registers under a name its files do not spell (computed at run
    time), as its own entry points or an adapter declare them.
    """
    if scan is None:
        return ForeignOwners()
    namespaces: dict[str, tuple[Any, Any]] = {}
    ops: dict[str, tuple[Any, Any]] = {}
    kernels: dict[tuple[str, str], tuple[Any, Any]] = {}
    # a namespace read from a stripped library's strings yields to a claim read from symbols
    # or source: those come first
    found = sorted(((d, r) for d in scan.distributions if not d.is_plugin
                    for r in d.registrations if r.namespace is not None
                    and r.namespace not in RESERVED_NAMESPACES),
                   key=lambda dr: (dr[1].inferred, dr[0].name, dr[1].file, dr[1].line or 0))
    for dist, reg in found:
        if reg.kind in _CLAIMS:
            namespaces.setdefault(reg.namespace, (dist, reg))
        if reg.kind == "op" and reg.op:
            ops.setdefault(reg.op, (dist, reg))
        if reg.kind == "kernel" and reg.op and reg.key:
            kernels.setdefault((reg.op, reg.key), (dist, reg))
    blocks: dict[tuple[str, str], tuple[Any, Any]] = {}
    for dist, reg in found:
        if reg.key and (reg.kind == "IMPL" and reg.line is None
                        or reg.kind == "kernel" and reg.name is None):
            blocks.setdefault((reg.namespace, reg.key), (dist, reg))
    possible: dict[str, tuple[Any, Any]] = {}
    for dist, reg in found:
        if reg.kind == "kernel" and reg.op and reg.op not in ops and \
                namespaces.get(reg.namespace, (None,))[0] is dist:
            possible.setdefault(reg.op, (dist, reg))
    for dist in sorted((d for d in scan.distributions if not d.is_plugin), key=lambda d: d.name):
        for op, reg in sorted(dist.possible_ops().items()):
            if op not in ops and op.partition("::")[0] not in RESERVED_NAMESPACES:
                possible.setdefault(op, (dist, reg))
    by_name = {d.name: d for d in scan.distributions if not d.is_plugin}
    for adoption in sorted(adoptions, key=lambda a: a.distribution):
        dist = by_name.get(adoption.distribution)
        for ns in adoption.namespaces if dist is not None else ():
            if ns not in RESERVED_NAMESPACES:
                declared = Registration(kind="library", namespace=ns, api="declared adoption",
                                        module=next(iter(adoption.modules), ""),
                                        file=adoption.source or "")
                namespaces.setdefault(ns, (dist, declared))
    return ForeignOwners(namespaces=namespaces, ops=ops, kernels=kernels, possible_ops=possible,
                         blocks=blocks)


def possibly(owner: tuple[Any, Any]) -> str:
    """Why a package may define an op the scan cannot tie to it for certain
    (:attr:`ForeignOwners.possible_ops <opregistry.resolver.foreign.ForeignOwners.possible_ops>`)."""
    dist, registration = owner
    if registration.kind == "kernel":
        return (f"gives a {registration.key} kernel at its import, in a namespace it "
                f"registers in (it defines the op where the scan cannot read it)")
    return (f"may define: its C++ library holds the schema string "
            f"{registration.name + (registration.schema or '')!r}, which names no namespace, "
            f"and registers in {', '.join(dist.library_namespaces(registration.file))}")
