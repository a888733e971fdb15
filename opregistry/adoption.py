"""Adoption: a package that registers with ``torch.library`` by itself joins the registry.

bitsandbytes, torchao, torchvision register their ops at their own import;
opregistry reads what they register from their installed files
(:mod:`opregistry.scan`).  *Adopting* such a distribution makes its ops part
of the registry without changing its code: listed without torch (from the
scan), attributed, locked (their files' digests), judged against every op
package's declarations, switchable per kernel where torch can undo a
registration, and available without an explicit import -- the first touch of
``torch.ops.<namespace>`` imports the modules that register the namespace
(``lazy``), or the registry imports them when it loads (``eager``).

Three ways in, in this order of precedence:

* **declared by the package itself**, metadata only: an entry point in the
  group :data:`ADOPT_GROUP` (``opregistry.adopt``, lazy) or
  :data:`ADOPT_EAGER_GROUP` (``opregistry.adopt.eager``) whose *name* is a
  namespace it registers and whose *value* the module whose import registers
  it (``bitsandbytes = "bitsandbytes"``).  Nothing of the package is imported
  to read it;
* **declared by an adapter**, an opregistry op package (group
  ``opregistry.ops``) whose ``opregistry_adoptions`` hook returns
  :class:`Adoption` records (``Adoption(distribution="bitsandbytes",
  load="eager", samples={...})``);
* **by default**: every distribution the scan finds registering a namespace,
  lazily, unless ``OPREGISTRY_ADOPT=0`` or ``OPREGISTRY_ADOPT_BLOCK`` says
  otherwise (:meth:`opregistry.config.Policy.adopts`).

:class:`Adoption` is the declaration; :class:`Adopted` is what the resolver
decided for one distribution (:mod:`opregistry.resolver.adoption`), kept on
the :class:`~opregistry.plans.Plan`; :mod:`opregistry.adopting` carries it out.
"""

from __future__ import annotations

import re
import sys
from typing import TYPE_CHECKING, Any, Literal, Mapping

from attrs import field, frozen

from .variables import canonical_name
from .errors import DeclarationError
from .foreign import ForeignScan, InstalledDistribution, Registration

if TYPE_CHECKING:
    from .model import Origin

__all__ = ["ADOPT_GROUP", "ADOPT_EAGER_GROUP", "ADOPT_GROUPS", "Load", "AdoptionStatus",
           "Adoption", "AdoptedKernel", "Adopted", "adopted_ops"]

#: entry-point group of a package that declares its own (lazy) adoption: name = namespace,
#: value = the module whose import registers it
ADOPT_GROUP = "opregistry.adopt"
#: the same, imported when the registry loads (at ``import torch``)
ADOPT_EAGER_GROUP = "opregistry.adopt.eager"
ADOPT_GROUPS = (ADOPT_GROUP, ADOPT_EAGER_GROUP)

Load = Literal["lazy", "eager"]
#: ``adopted``: imported by opregistry (on first touch, or at load); ``off``: a switch
#: says not to (listed, never imported by opregistry); ``refused``: a problem says not to
AdoptionStatus = Literal["adopted", "off", "refused"]

_MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*\Z")
_IDENT = re.compile(r"[A-Za-z_]\w*\Z")
_OP = re.compile(r"[A-Za-z_]\w*::[A-Za-z_]\w*(\.[A-Za-z_]\w*)?\Z")
_REF = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*\Z")


def _names(value: Any, pattern: re.Pattern[str], field: str, what: str) -> tuple[str, ...]:
    """``value`` (one name or several) as a tuple, each checked against ``pattern``."""
    items = (value,) if isinstance(value, str) else tuple(value)
    for name in items:
        if not isinstance(name, str) or not pattern.match(name):
            raise DeclarationError(f"Adoption({field}=...): {name!r} is not {what}")
    return items


def _modules(value: Any) -> tuple[str, ...]:
    return _names(value, _MODULE, "modules", "a module name (dotted identifiers: "
                  "'bitsandbytes', 'pkg.backends.cpu')")


def _namespaces(value: Any) -> tuple[str, ...]:
    return _names(value, _IDENT, "namespaces", "a namespace (a Python identifier)")


def _samples(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise DeclarationError(f"Adoption(samples=...) maps an op ('ns::name') to a "
                               f"'module:function' returning its sample inputs, not {value!r}")
    for op, ref in value.items():
        if not isinstance(op, str) or not _OP.match(op):
            raise DeclarationError(f"Adoption(samples=...): {op!r} is not an op name "
                                   f"('ns::name' or 'ns::name.overload')")
        if not isinstance(ref, str) or not _REF.match(ref):
            raise DeclarationError(f"Adoption(samples=...): the samples of {op} must be a "
                                   f"'module:function' reference, not {ref!r}")
    return dict(value)


def _load(instance: Any, attribute: Any, value: str) -> None:
    if value not in ("lazy", "eager"):
        raise DeclarationError(f"Adoption(load={value!r}): 'lazy' (on the first touch of "
                               f"torch.ops.<namespace>) or 'eager' (when the registry loads)")


def _distribution(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise DeclarationError(f"Adoption(distribution=...) names the adopted distribution as "
                               f"pip does ('bitsandbytes'), not {value!r}")
    return canonical_name(value.strip())


def _caller(depth: int) -> str | None:
    frame = sys._getframe(depth)
    return f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else None


@frozen(kw_only=True)
class Adoption:
    """A declaration: ``distribution``, which registers with torch.library by itself, is adopted.

    :param distribution: the adopted distribution, as pip names it.
    :param modules: the modules whose import registers its ops; empty: the
        ones the scan found (per namespace, those that define its ops at
        import, before those that only add kernels).
    :param namespaces: namespaces its modules register that the scan cannot
        read (a name computed at run time); each maps to ``modules``, or, when
        that is empty, to the package: the modules of the namespaces the scan
        finds of it, else the top-level packages of its registering modules.
    :param load: ``"lazy"`` -- imported on the first touch of
        ``torch.ops.<namespace>`` -- or ``"eager"``, imported when the
        registry loads (``import torch``).
    :param samples: op -> ``"module:function"`` returning sample inputs,
        for ``opregistry check``.
    """

    distribution: str = field(converter=_distribution)
    modules: tuple[str, ...] = field(default=(), converter=_modules)
    namespaces: tuple[str, ...] = field(default=(), converter=_namespaces)
    load: str = field(default="lazy", validator=_load)
    samples: Mapping[str, str] = field(factory=dict, converter=_samples, hash=False)
    #: who declared it: the adapter's entry point, or the package's own (set by collect)
    origin: Origin | None = field(default=None, eq=False)
    #: where it was declared (``file:line``), or the entry point's text
    source: str | None = field(default=None, eq=False)

    def __attrs_post_init__(self) -> None:
        if self.source is None:  # the adapter author's line: the caller of __init__
            object.__setattr__(self, "source", _caller(3))

    @property
    def by_itself(self) -> bool:
        """Whether the adopted distribution declared this itself (entry points), not an adapter."""
        return self.origin is not None and self.origin.distribution == self.distribution


def _where(reg: Registration) -> str:
    """``module:line`` of a registration (the module alone for a shared library)."""
    return f"{reg.module}:{reg.line}" if reg.line is not None else reg.module


@frozen(kw_only=True)
class AdoptedKernel:
    """One kernel an adopted distribution registers, and whether a switch turns it off."""

    registration: Registration
    #: the switch that turns it off (``-bitsandbytes::op:CPU (OPREGISTRY_KERNELS)``), or ``""``
    disabled_by: str = ""

    @property
    def status(self) -> str:
        """``disabled`` (a switch), ``conditional`` (under an ``if`` in its module: it may not
        register), or ``adopted`` (registered when its module is imported)."""
        if self.disabled_by:
            return "disabled"
        return "conditional" if self.registration.conditional else "adopted"

    @property
    def op(self) -> str:
        return self.registration.op or ""

    @property
    def key(self) -> str:
        return self.registration.key or ""

    def to_dict(self) -> dict[str, Any]:
        reg = self.registration
        return {"op": self.op, "key": self.key, "status": self.status,
                "reason": f"disabled by {self.disabled_by}" if self.disabled_by else (
                    "registered only if a condition holds" if reg.conditional else ""),
                "api": reg.api, "module": reg.module, "where": _where(reg), "source": reg.source,
                "conditional": reg.conditional, "at_import": reg.at_import}


@frozen(kw_only=True)
class Adopted:
    """What the resolver decided for one distribution that registers with torch by itself."""

    distribution: InstalledDistribution
    load: str = "lazy"
    status: str = "adopted"
    #: why it is off or refused; for an adopted one, who adopted it
    reason: str = ""
    #: the declaration(s) behind it; empty: adopted by default (found by the scan)
    declared_by: tuple[Origin, ...] = ()
    #: namespace -> the modules imported, in order, on its first touch (or at load: eager)
    modules: tuple[tuple[str, tuple[str, ...]], ...] = ()
    #: op -> the module that defines it, imported when the op is looked up and missing
    op_modules: tuple[tuple[str, str], ...] = ()
    #: its op definitions and library registrations, from the scan
    registrations: tuple[Registration, ...] = ()
    kernels: tuple[AdoptedKernel, ...] = ()
    samples: Mapping[str, str] = field(factory=dict, hash=False)

    @property
    def name(self) -> str:
        return self.distribution.name

    @property
    def namespaces(self) -> tuple[str, ...]:
        return tuple(ns for ns, _ in self.modules)

    @property
    def active(self) -> bool:
        """Whether opregistry imports it (lazily or at load)."""
        return self.status == "adopted"

    def ops(self) -> tuple[Registration, ...]:
        """Its op definitions (``kind == "op"``), one per op, sorted by name."""
        seen: dict[str, Registration] = {}
        for reg in self.registrations:
            if reg.kind == "op" and reg.op and reg.op not in seen:
                seen[reg.op] = reg
        return tuple(seen[op] for op in sorted(seen))

    def all_modules(self) -> tuple[str, ...]:
        """Every module imported for it, each once, in order."""
        return tuple(dict.fromkeys(m for _, modules in self.modules for m in modules))

    def to_dict(self) -> dict[str, Any]:
        kernels: dict[str, list[dict[str, Any]]] = {}
        for k in self.kernels:
            kernels.setdefault(k.op, []).append(k.to_dict())
        ops = [{"name": reg.op, "schema": reg.schema, "api": reg.api, "module": reg.module,
                "where": _where(reg), "source": reg.source, "conditional": reg.conditional,
                "samples": self.samples.get(reg.op or ""),
                "kernels": kernels.get(reg.op or "", [])} for reg in self.ops()]
        # ops of its namespaces it gives kernels to but whose definition the scan did not
        # read (a stripped C++ library's: fbgemm-gpu's fake kernels): named, schema unknown
        named, mine = {op["name"] for op in ops}, set(self.namespaces)
        ops += [{"name": op, "schema": None, "api": "", "module": "", "where": "", "source": "",
                 "conditional": False, "samples": self.samples.get(op), "kernels": kernels[op]}
                for op in sorted(kernels) if op not in named and op.split("::")[0] in mine]
        return {
            "distribution": {"name": self.name, "version": self.distribution.version},
            "load": self.load, "status": self.status, "reason": self.reason,
            "declared_by": [o.dist for o in self.declared_by],
            "namespaces": {ns: list(modules) for ns, modules in self.modules},
            "ops": sorted(ops, key=lambda op: op["name"]),
        }


def adopted_ops(scan: ForeignScan | None) -> frozenset[str]:
    """Every op the scan found defined by a distribution that is not an opregistry plugin."""
    if scan is None:
        return frozenset()
    return frozenset(op for d in scan.distributions if not d.is_plugin for op in d.ops())
