"""What a planned op lacks: no active device kernel, no fake kernel, no vmap rule.

Warnings and notes, never errors: the op is registered as it is, and
``opregistry doctor`` says what it will not do (``torch.compile`` without a
fake kernel, ``torch.vmap`` without a rule).
"""

from __future__ import annotations

from .. import keys as _keys
from ..plan import OpPlan
from .context import Context

__all__ = ["report_gaps"]


def report_gaps(ctx: Context, ops: dict[str, OpPlan]) -> None:
    for qualname, plan in ops.items():
        active = {k.kernel.key for k in plan.kernels if k.status == "active"}
        declared = {k.kernel.key for k in plan.kernels}
        origin = plan.op.origin
        devices = {k for k in declared if k in _keys.DEVICE_KEYS}
        if not devices & active:
            ctx.warn("op-no-active-kernel",
                     f"{qualname} ({origin}) has no active device kernel "
                     f"(declared: {', '.join(sorted(devices)) or 'none'})",
                     "install the backend its kernels need, or add a kernel",
                     op=qualname, culprits=(origin,) if origin else ())
        if "Meta" not in declared:
            ctx.warn("op-no-fake",
                     f"{qualname} ({origin}) has no fake kernel: torch.compile and "
                     f"torch.export will fail on it",
                     "add one with register_fake / fake=", op=qualname,
                     others=(origin,) if origin else ())
        elif "Meta" not in active:
            ctx.warn("op-fake-inactive",
                     f"{qualname} ({origin}) declares a fake kernel but it is not active",
                     _keys.provider_hint("Meta"), op=qualname)
        if "FuncTorchBatched" not in declared:
            ctx.warn("op-no-vmap", f"{qualname} ({origin}) has no vmap rule",
                     "add one with register_vmap / vmap= to use it under torch.vmap",
                     severity="info", op=qualname)
