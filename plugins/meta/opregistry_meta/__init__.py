"""opregistry-meta: registers fake kernels (``torch.library.register_fake`` semantics).

A fake kernel runs for FakeTensor and meta tensors: it computes output
metadata (shape, dtype, device) without touching data, and is what
``torch.compile`` and ``torch.export`` trace through.  Data-dependent output
sizes use ``torch.library.get_ctx().new_dynamic_size()``.
"""

from __future__ import annotations

from typing import Any

from opregistry import Backend, Kernel, OpDef, hookimpl
from opregistry.backend import deferred_import
from opregistry.model import source_of

BACKEND = Backend(name="meta", keys=("Meta",), description="fake kernels (torch.library.register_fake semantics)")

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
        # an op opregistry did not define (maybe in C++): torch's public path,
        # with its check of the C++ ``set_python_module`` stub
        import torch.library

        torch.library.register_fake(kernel.op, fn, lib=library)
        return True
    # torch records where a fake kernel was registered; the declaration's line
    # says it best, the kernel's own line otherwise
    _private().register_fake_kernel(library, kernel.op, fn,
                                    kernel.source or source_of(fn) or repr(fn))
    return True
