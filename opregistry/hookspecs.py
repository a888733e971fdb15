"""Hook specifications: the contract between opregistry and its plugins.

Two kinds of plugins implement these hooks, each found through its own
entry-point group:

* **op packages** (group ``opregistry.ops``) declare namespaces, ops and
  kernels.  Most use :class:`~opregistry.OpLibrary`, which implements the
  three op hooks for them.
* **backends** (group ``opregistry.backends``) say which dispatch keys they
  serve, whether they can run on this machine, and register a kernel for
  their key with torch.

Every hook is prefixed ``opregistry_``; a plugin function with that prefix
is taken as a hook implementation even without the :data:`hookimpl` marker,
the way pytest treats ``pytest_`` functions.  opregistry calls each plugin's
implementation on its own, so one plugin raising is that plugin's problem and
the others still load; the "collect-all" hooks below are gathered from every
plugin, the ``firstresult`` hooks are called on the one backend that owns the
dispatch key in question.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

import pluggy

if TYPE_CHECKING:
    from torch.library import Library

    from .adoption import Adoption
    from .model import Backend, Kernel, Namespace, OpDef

__all__ = ["PROJECT", "hookspec", "hookimpl"]

PROJECT = "opregistry"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

# -------------------------------------------------------------------------
# Op packages (entry-point group ``opregistry.ops``)
# -------------------------------------------------------------------------


@hookspec
def opregistry_namespaces() -> Iterable[Namespace]:
    """Declare the namespaces this plugin defines or adds ops to.

    Called once per :func:`opregistry.load` (and by ``opregistry list``),
    before torch is imported; must not import torch.

    :returns: :class:`~opregistry.Namespace` records.  ``kind="DEF"`` claims
        ownership of the namespace (at most one distribution may);
        ``kind="FRAGMENT"`` adds ops to a namespace defined elsewhere.

    Collect-all: the results of every plugin are gathered.
    """


@hookspec
def opregistry_ops() -> Iterable[OpDef]:
    """Declare operator definitions.

    Called once per load, before torch is imported; must not import torch.
    Each op's namespace must be declared by the same distribution, as DEF or
    FRAGMENT.

    :returns: :class:`~opregistry.OpDef` records.

    Collect-all.
    """


@hookspec
def opregistry_kernels() -> Iterable[Kernel]:
    """Declare kernels: one implementation of one op for one dispatch key.

    Called once per load, before torch is imported; kernels given as
    ``"module:function"`` strings are imported only when materialized.
    A kernel may target an op of another distribution (torch's IMPL): adding
    a key the op lacks is allowed, replacing another distribution's kernel
    needs ``override=True`` and a policy that allows it.

    :returns: :class:`~opregistry.Kernel` records.

    Collect-all.
    """


@hookspec
def opregistry_adoptions() -> Iterable[Adoption]:
    """Adopt distributions that register with ``torch.library`` by themselves.

    For an *adapter*: an op package that brings a package such as
    bitsandbytes into the registry without changing its code.  Called once
    per load (and by ``opregistry list``), before torch is imported; must not
    import torch or the adopted package.  The adopted distribution's ops are
    read from its installed files; they are listed, locked and judged like
    declared ones, and its modules are imported on the first touch of
    ``torch.ops.<namespace>`` (``load="lazy"``) or when the registry loads
    (``load="eager"``).  A package can declare its own adoption without
    opregistry code, through entry points (docs/ecosystem.md).

    :returns: :class:`~opregistry.Adoption` records.

    Collect-all.
    """


# -------------------------------------------------------------------------
# Backends (entry-point group ``opregistry.backends``)
# -------------------------------------------------------------------------


@hookspec
def opregistry_backends() -> Iterable[Backend]:
    """Declare which dispatch keys this backend registers kernels for.

    Called once per load, before torch is imported; must not import torch
    or any device library.  Two backends serving the same key is a conflict.

    :returns: :class:`~opregistry.Backend` records.

    Collect-all.
    """


@hookspec(firstresult=True)
def opregistry_backend_available(backend: Backend) -> bool | None:
    """Whether ``backend`` can run on this machine (a GPU is present, say).

    Called once per load on the plugin that declared ``backend``.  It runs
    for ``opregistry list`` too, so it must answer without importing torch
    when torch is not already imported (look for the driver instead).
    Kernels of an unavailable backend are not registered and are listed as
    ``unavailable``.

    :param backend: the record this plugin returned from
        :func:`opregistry_backends`.
    :returns: ``True`` / ``False``; ``None`` means available.

    Stops at first non-None result.
    """


@hookspec(firstresult=True)
def opregistry_materialize_kernel(
    library: Library,
    op: OpDef | None,
    kernel: Kernel,
    payload: Any,
    fn: Any,
) -> bool | None:
    """Register ``kernel`` for ``kernel.key`` with torch.

    Called during :func:`opregistry.load`, after the op is defined, once per
    active kernel, on the backend that owns the kernel's key family
    (``kernel.kind.family(kernel.key)``) only.  Register through ``library``
    (or pass ``lib=library`` to ``torch.library`` helpers) so that opregistry
    can roll the registration back.

    :param library: the ``torch.library.Library`` of the kernel's
        distribution for the op's namespace.
    :param op: the op being implemented; ``None`` when the kernel targets an
        op opregistry did not define (an allowed override of an ``aten`` kernel).
    :param kernel: the declaration, with its origin; ``kernel.kind`` is its
        registration kind (:mod:`opregistry.kinds`).
    :param payload: ``kernel.payload`` with every reference imported (the
        fields its kind lists in :attr:`~opregistry.kinds.Kind.references`):
        ``payload.fn`` of a device kernel, fake kernel, vmap rule or Triton
        kernel; ``payload.backward`` and ``payload.setup_context`` of an
        autograd formula; ``payload.dtype`` (a ``torch.dtype``) of an autocast
        rule; ``payload.fn`` and ``payload.cls`` of a torch_dispatch rule.
    :param fn: the payload's primary reference, imported (``getattr(payload,
        kernel.kind.primary)``): the function (or backward formula, or dtype)
        that most backends register as it is.
    :returns: ``True`` once registered.  ``None`` means "not mine" and is a
        materialization problem of the backend.

    Stops at first non-None result.
    """
