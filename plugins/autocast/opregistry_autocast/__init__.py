"""opregistry-autocast: registers autocast rules (``torch.library.register_autocast`` semantics).

An op's autocast rule for a device type names the dtype its floating inputs
are cast to inside ``torch.autocast(device_type)``; the op then runs with
autocast off, as with ``torch.library.register_autocast``.  The backend
serves every ``Autocast<Device>`` dispatch key torch has.
"""

from __future__ import annotations

from typing import Any

from opregistry import Backend, Kernel, OpDef, hookimpl
from opregistry.backend import deferred_import
from opregistry.keys import AUTOCAST_KEYS

__all__ = ["BACKEND"]

BACKEND = Backend(
    name="autocast", keys=tuple(AUTOCAST_KEYS),
    description="autocast rules via register_autocast (cast floating inputs, run without autocast)",
)

#: torch's private calls: imported at the first registration (``opregistry list`` loads
#: this plugin without torch)
_private = deferred_import(f"{__name__}._torch_private")


@hookimpl
def opregistry_backends() -> list[Backend]:
    return [BACKEND]


@hookimpl
def opregistry_materialize_kernel(library: Any, op: OpDef | None, kernel: Kernel,
                                  payload: Any) -> bool:
    # ``payload.dtype`` is the torch.dtype (the declaration's "torch:bfloat16", imported)
    _private().register_autocast_rule(library, kernel.op, kernel.key,
                                      AUTOCAST_KEYS[kernel.key], payload.dtype)
    return True
