"""opregistry-vmap: registers vmap rules (``torch.library.register_vmap`` semantics)."""

from __future__ import annotations

from typing import Any, Callable

from opregistry import Backend, Kernel, hookimpl

BACKEND = Backend(name="vmap", keys=("FuncTorchBatched",), description="vmap rules via register_vmap")


@hookimpl
def opregistry_backends() -> list[Backend]:
    return [BACKEND]


@hookimpl
def opregistry_materialize_kernel(library: Any, kernel: Kernel, fn: Callable[..., Any]) -> bool:
    import torch.library

    torch.library.register_vmap(kernel.op, fn, lib=library)
    return True
