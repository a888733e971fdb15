"""opregistry-torch-dispatch: registers ``__torch_dispatch__`` rules
(``torch.library.register_torch_dispatch`` semantics).

A rule tells how an op behaves under one ``TorchDispatchMode`` or for one
Tensor subclass, without touching the class or the op.  Its key is
``TorchDispatch[module:Class]``: torch keeps one rule per (op, class).
"""

from __future__ import annotations

from typing import Any

from opregistry import Backend, Kernel, MaterializationError, OpDef, hookimpl
from opregistry.keys import TORCH_DISPATCH

__all__ = ["BACKEND"]

BACKEND = Backend(
    name="torch_dispatch", keys=(TORCH_DISPATCH,),
    description="__torch_dispatch__ rules for a mode or subclass via register_torch_dispatch",
)


@hookimpl
def opregistry_backends() -> list[Backend]:
    return [BACKEND]


@hookimpl
def opregistry_materialize_kernel(library: Any, op: OpDef | None, kernel: Kernel,
                                  payload: Any) -> bool:
    import torch.library
    from torch.utils._python_dispatch import TorchDispatchMode

    fn, dispatch_class = payload.fn, payload.cls
    if not isinstance(dispatch_class, type) or not (
            issubclass(dispatch_class, TorchDispatchMode)
            or (issubclass(dispatch_class, torch.Tensor)
                and "__torch_dispatch__" in _attributes(dispatch_class))):
        raise MaterializationError(
            f"torch_dispatch rule for {kernel.op} from {kernel.origin}: "
            f"{kernel.payload.cls!r} is neither a TorchDispatchMode nor a Tensor subclass "
            f"with __torch_dispatch__", origin=kernel.origin, op=kernel.op, key=kernel.key)
    torch.library.register_torch_dispatch(kernel.op, dispatch_class, fn, lib=library)
    return True


def _attributes(cls: type) -> set[str]:
    """Names defined by ``cls`` or a base below ``torch.Tensor`` (which has a stub)."""
    import torch

    return {name for base in cls.__mro__ if base is not torch.Tensor and base is not object
            for name in vars(base)}
