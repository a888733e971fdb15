"""opregistry-vmap: registers vmap rules (``torch.library.register_vmap`` semantics)."""

from __future__ import annotations

from typing import Any

from opregistry import Backend, Kernel, OpDef, hookimpl
from opregistry.backend import deferred_import

BACKEND = Backend(name="vmap", keys=("FuncTorchBatched",), description="vmap rules via register_vmap")

#: torch's private calls: imported at the first registration (``opregistry list`` loads
#: this plugin without torch)
_private = deferred_import(f"{__name__}._torch_private")


@hookimpl
def opregistry_backends() -> list[Backend]:
    return [BACKEND]


@hookimpl
def opregistry_materialize_kernel(
    library: Any, op: OpDef | None, kernel: Kernel, payload: Any
) -> bool:
    fn = payload.fn
    if op is None:
        # an op opregistry did not define: torch's public path, with its checks
        import torch.library

        torch.library.register_vmap(kernel.op, fn, lib=library)
        return True
    _private().register_vmap_rule(library, kernel.op, op.name_with_overload, fn)
    return True
