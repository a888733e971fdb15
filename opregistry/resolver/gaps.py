"""What a planned op lacks: no active device kernel, no fake kernel, no vmap rule.

Warnings and notes, never errors: the op is registered as it is, and
``opregistry doctor`` says what it will not do (``torch.compile`` without a
fake kernel, ``torch.vmap`` without a rule).
"""

from __future__ import annotations

from .. import keys as _keys
from ..plans import OpPlan
from .context import Context

__all__ = ["report_gaps"]


def report_gaps(ctx: Context, ops: dict[str, OpPlan]) -> None:
    for qualname, plan in ops.items():
        statuses: dict[str, str] = {}
        for k in plan.kernels:  # of several candidates for a key, an active one speaks for it
            # a C++ kernel (``native``) is registered when its library loads: as good as active
            status = "active" if k.status == "native" else k.status
            if status != "overridden" and statuses.get(k.kernel.key) != "active":
                statuses[k.kernel.key] = status
        origin = plan.op.origin
        devices = {key: status for key, status in statuses.items()
                   if key in _keys.DEVICE_KEYS or key in _keys.COMPOSITE_KEYS}
        if "active" not in devices.values():
            _no_active_kernel(ctx, qualname, plan, devices)
        if statuses.get("CompositeImplicitAutograd") == "active":
            pass  # a decomposition: fake tensors go through the ops it calls (torch's rule)
        elif "Meta" not in statuses:
            ctx.warn("op-no-fake",
                     f"{qualname} ({origin}) has no fake kernel: torch.compile and "
                     f"torch.export will fail on it",
                     "add one with register_fake / fake=", op=qualname,
                     others=(origin,) if origin else ())
        elif statuses["Meta"] != "active":
            ctx.warn("op-fake-inactive",
                     f"{qualname} ({origin}) declares a fake kernel but it is not active",
                     _keys.provider_hint("Meta"), op=qualname)
        # an op without autograd is fine (torch says so when grad is needed); one that
        # declares it and gets none computes gradients of None silently: a warning
        if statuses.get("Autograd") in ("inactive", "unavailable"):
            ctx.warn("op-autograd-inactive",
                     f"{qualname} ({origin}) declares an autograd formula but it is not "
                     f"active: backward leaves .grad as None",
                     _keys.provider_hint("Autograd"), op=qualname,
                     others=(origin,) if origin else ())
        if "FuncTorchBatched" not in statuses:
            ctx.warn("op-no-vmap", f"{qualname} ({origin}) has no vmap rule",
                     "add one with register_vmap / vmap= to use it under torch.vmap",
                     severity="info", op=qualname)


def _no_active_kernel(ctx: Context, qualname: str, plan: OpPlan,
                      devices: dict[str, str]) -> None:
    """No device kernel is active: an error when installing a backend would fix it."""
    origin = plan.op.origin
    inactive = sorted(key for key, status in devices.items() if status == "inactive")
    declared = ", ".join(sorted(devices)) or "none"
    if inactive:
        # the op is defined and callable, but every call fails in torch's dispatcher
        ctx.warn("op-no-active-kernel",
                 f"{qualname} ({origin}) has no active device kernel: its "
                 f"{', '.join(inactive)} kernel(s) need a backend that is not installed, so "
                 f"every call fails (declared: {declared})",
                 "install a backend for it: "
                 + ", or ".join(_keys.provider_hint(key) for key in inactive),
                 severity="error", op=qualname, culprits=(origin,) if origin else ())
    else:
        ctx.warn("op-no-active-kernel",
                 f"{qualname} ({origin}) has no active device kernel on this machine "
                 f"(declared: {declared})",
                 "run it where its device is present, or add a kernel for a device here",
                 op=qualname, culprits=(origin,) if origin else ())
