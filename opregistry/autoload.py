"""Ops available at ``import torch``: the ``torch.backends`` entry point.

torch calls :func:`autoload` at the end of ``import torch`` (its
device-backend autoload mechanism, RFC pytorch/pytorch#122468), unless
``TORCH_DEVICE_BACKEND_AUTOLOAD=0``.  torch turns any exception raised here
into a failed ``import torch``, so nothing may escape: every problem is
logged and kept on the registry (``opregistry.get_registry().problems``).
``OPREGISTRY_AUTOLOAD=0`` turns it off.
"""

from __future__ import annotations


from .config import autoload_enabled
from .logs import get_logger

__all__ = ["autoload"]

log = get_logger()


def autoload() -> None:
    """Load the registry; never raises."""
    if not autoload_enabled():
        return
    try:
        from .registry import load, loading

        if loading():
            # a plugin opregistry is importing imported torch: the load (or plan) in
            # progress goes on and registers what it found; nothing to do here
            return
        load(strict=False)
    except BaseException as exc:  # noqa: BLE001 - must never break `import torch`
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        log.error("opregistry autoload failed; ops were not registered", error=repr(exc))
