"""opregistry-autograd: registers backward formulas (``register_autograd`` semantics)."""

from __future__ import annotations

from typing import Any, Callable

from opregistry import Backend, Kernel, hookimpl

BACKEND = Backend(
    name="autograd", keys=("Autograd",), description="backward + setup_context via register_autograd"
)


@hookimpl
def opregistry_backends() -> list[Backend]:
    return [BACKEND]


@hookimpl
def opregistry_materialize_kernel(
    library: Any, kernel: Kernel, fn: Callable[..., Any], setup_context: Callable[..., Any] | None
) -> bool:
    import torch.library

    torch.library.register_autograd(kernel.op, fn, setup_context=setup_context, lib=library)
    return True
