"""opregistry-meta: registers fake kernels (``torch.library.register_fake`` semantics).

A fake kernel runs for FakeTensor and meta tensors: it computes output
metadata (shape, dtype, device) without touching data, and is what
``torch.compile`` and ``torch.export`` trace through.  Data-dependent output
sizes use ``torch.library.get_ctx().new_dynamic_size()``.
"""

from __future__ import annotations

from typing import Any, Callable

from opregistry import Backend, Kernel, hookimpl

BACKEND = Backend(name="meta", keys=("Meta",), description="fake kernels via torch.library.register_fake")


@hookimpl
def opregistry_backends() -> list[Backend]:
    return [BACKEND]


@hookimpl
def opregistry_materialize_kernel(library: Any, kernel: Kernel, fn: Callable[..., Any]) -> bool:
    import torch.library

    torch.library.register_fake(kernel.op, fn, lib=library)
    return True
