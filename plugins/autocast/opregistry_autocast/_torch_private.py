"""Every private torch API the autocast backend relies on, in one place.

The rule itself is registered by the public ``torch.library.register_autocast``.
Since torch 2.13 that also installs a Python kernel on the op's
``OpOverload`` (``py_impl`` for the autocast key), which outlives the
``Library`` it was registered with: :func:`register_autocast_rule` ties its
removal to the library, so that unloading (or rolling back) a distribution
leaves no rule behind on an op it does not own (``aten::...``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.library
from torch._library.utils import RegistrationHandle, lookup_op

__all__ = ["register_autocast_rule"]


def register_autocast_rule(library: Any, qualname: str, key: str, device_type: str,
                           dtype: Any) -> None:
    """``torch.library.register_autocast(qualname, device_type, dtype, lib=library)``, undone with it.

    ``key`` is the autocast dispatch key of ``device_type`` (``"AutocastCPU"``).
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"cast_inputs must be a floating torch.dtype, got {dtype!r}")
    torch.library.register_autocast(qualname, device_type, dtype, lib=library)
    op = lookup_op(qualname)
    dispatch_key = getattr(torch._C.DispatchKey, key)
    installed = op.py_kernels.get(dispatch_key)
    if installed is None:
        return  # a torch without the Python kernel (before 2.13): nothing outlives the library

    def remove() -> None:
        if op.py_kernels.get(dispatch_key) is installed:
            op.py_kernels.pop(dispatch_key, None)
            op._dispatch_cache.clear()

    # Library._destroy destroys these handles (torch's own register_torch_dispatch uses them)
    library._registration_handles.append(RegistrationHandle(remove))


def _check() -> None:
    """Fail at import if torch moved what this module uses (clear message, not a deep traceback)."""
    missing = [name for name, ok in (
        ("torch.library.register_autocast", callable(getattr(torch.library, "register_autocast", None))),
        ("torch._library.utils.RegistrationHandle", callable(RegistrationHandle)),
    ) if not ok]
    if missing:
        raise ImportError(
            f"opregistry-autocast does not support torch {torch.__version__}: it lacks "
            f"{', '.join(missing)}; upgrade opregistry-autocast")


_check()
