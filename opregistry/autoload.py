"""Ops available at ``import torch``: the ``torch.backends`` entry point.

torch calls :func:`autoload` at the end of ``import torch`` (its
device-backend autoload mechanism, RFC pytorch/pytorch#122468), unless
``TORCH_DEVICE_BACKEND_AUTOLOAD=0``.  torch turns any exception raised here
into a failed ``import torch`` (a ``RuntimeError`` whose ``__cause__`` is
ours).  ``OPREGISTRY_AUTOLOAD=0`` turns it off.

* **Default (not strict)**: nothing escapes.  A distribution with a problem
  is left out whole, the rest registers; every problem is logged and kept on
  the registry (``opregistry.get_registry().problems``).  An invalid
  configuration (a variable that is not a boolean, an unreadable
  ``OPREGISTRY_CONFIG``) registers *nothing* -- opregistry cannot tell what
  was meant -- and is logged as one error line; :func:`opregistry.load`
  raises the same :class:`~opregistry.ConfigError` when called.
* **Strict** (``OPREGISTRY_STRICT=1``, or ``strict = true`` in the file):
  the same as ``load(strict=True)``.  On any error problem nothing is
  registered and the :class:`~opregistry.ResolutionError` listing every
  problem propagates, so ``import torch`` fails with it as the cause: the
  user asked for exactly that.  A configuration error fails it the same way
  when ``OPREGISTRY_STRICT`` itself says strict.
"""

from __future__ import annotations

from typing import Any

from .containment import must_propagate
from .errors import ConfigError
from .logs import get_logger
from .state import gc_paused, process
from .variables import autoload_enabled, strict_requested

__all__ = ["autoload"]

log = get_logger()


def autoload() -> None:
    """Load the registry at ``import torch``; raises only in strict mode.

    The cyclic garbage collector is paused for the whole of it, opregistry's
    own imports included: with torch's million objects on the heap, a full
    collection costs about a tenth of ``import torch``, and the allocations
    of a load would otherwise set one off in the middle of it (the load
    creates no garbage cycles worth collecting; the collector is restored,
    and runs as usual, afterwards).
    """
    with gc_paused():
        _autoload()


def variables() -> dict[str, str]:
    """The ``OPREGISTRY_*`` variables as they are now: what a deferred load's settings are
    made of, whatever the process sets later."""
    import os

    return {k: v for k, v in os.environ.items() if k.startswith("OPREGISTRY_")}


class Waiting:
    """``process().adopter`` while the load waits (:mod:`opregistry.idle`), for a plan whose
    adoptions are all lazy.

    The first touch of ``torch.ops.<ns>`` for an adopted namespace, or the
    lookup of a missing op in a namespace whose ops an adopted package's
    modules define (:func:`opregistry.torch_state.install_ops_hooks` routes
    both here), loads the registry; its :class:`~opregistry.adopting.Adopter`,
    the process's adopter from then on, imports what registers the namespace
    or defines the op, as if the load had run at ``import torch``.
    """

    __slots__ = ("namespaces", "op_namespaces")

    def __init__(self, namespaces: frozenset[str], op_namespaces: frozenset[str]) -> None:
        #: the namespaces whose first touch loads the registry
        self.namespaces = namespaces
        #: the namespaces whose missing ops load it
        self.op_namespaces = op_namespaces

    def namespace_touched(self, namespace: str) -> None:
        adopter = self._loaded()
        if adopter is not None and namespace in adopter.namespaces:
            adopter.namespace_touched(namespace)

    def op_missing(self, namespace: str, name: str) -> bool:
        if namespace not in self.op_namespaces:
            return False
        adopter = self._loaded()
        return adopter is not None and bool(adopter.op_missing(namespace, name))

    def _loaded(self) -> Any:
        """The loaded registry's adopter (``None``: the load failed, adopts nothing, or is
        this thread's own, under way)."""
        from .registry import get_registry

        get_registry()
        state = process()
        if state.adopter is not self:
            return state.adopter
        if state.deferred is None:  # loaded, or failed: nothing adopts any more
            state.adopter = None
        return None


def _wait(adopted: frozenset[str], adopted_ops: frozenset[str]) -> bool:
    """Leave the load for later (:mod:`opregistry.idle`); ``False`` when it cannot wait: an
    adopted namespace, and a ``torch.ops`` of another shape than the hooks know."""
    from .torch_state import install_ops_hooks, recorder

    state = process()
    if adopted or adopted_ops:
        if not install_ops_hooks():
            return False
        state.adopter = Waiting(adopted, adopted_ops)
    state.deferred = variables()
    recorder()  # what is registered with torch from now on is attributed, as after a load
    return True


def _autoload() -> None:
    if process().loading:
        # a plugin opregistry is importing imported torch: the load (or plan) in progress
        # goes on and registers what it found; what the plugin registers with torch from
        # now on is watched, as when torch was imported first (whatever OPREGISTRY_AUTOLOAD
        # says: this is opregistry's own plan, not an autoload)
        from .guard import torch_arrived

        torch_arrived()
        return
    try:
        if not autoload_enabled():
            return
        from .idle import idle_start

        waiting = idle_start()
        if waiting is not None and _wait(*waiting):  # the registry is loaded when asked for
            return
        from .config import Settings

        strict = Settings.from_env().strict
    except ConfigError as exc:
        log.error("opregistry configuration is invalid; no ops were registered at import torch",
                  error=str(exc))
        if strict_requested():
            raise
        return
    try:
        from .registry import load

        load(strict=strict)
    except BaseException as exc:  # noqa: BLE001 - must never break a non-strict `import torch`
        if must_propagate(exc):  # a real Ctrl-C stops `import torch`, as the user asked
            raise
        if strict:
            log.error("opregistry strict mode: nothing was registered", error=str(exc))
            raise
        log.error("opregistry autoload failed; ops were not registered", error=repr(exc))
