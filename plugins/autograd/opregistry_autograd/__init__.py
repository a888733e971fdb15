"""opregistry-autograd: registers backward formulas (``register_autograd`` semantics).

The kernel it registers (see :mod:`opregistry_autograd.kernel`) keeps
``torch.library.register_autograd``'s contract — ``setup_context(ctx, inputs,
output)`` in forward, ``backward(ctx, *grads)``, higher-order gradients when
backward is differentiable, refusal for mutable and out= ops — and costs
almost nothing when no input requires grad.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from opregistry import Backend, Kernel, MaterializationError, OpDef, hookimpl
from opregistry.backend import device_kernel, op_name

__all__ = ["BACKEND", "refusal"]

BACKEND = Backend(
    name="autograd", keys=("Autograd",),
    description="backward + setup_context (register_autograd semantics, lean no-grad path)",
)


@hookimpl
def opregistry_backends() -> list[Backend]:
    return [BACKEND]


def refusal(schema: Any, tags: Iterable[str] = ()) -> str | None:
    """Why torch's ``register_autograd`` would refuse an op, or ``None``.

    :param schema: the op's ``torch.FunctionSchema``.
    :param tags: the op's tag names (``"out"``...).
    """
    from ._torch_private import has_kwarg_only_tensors

    if "out" in tags:
        return "it is tagged torch.Tag.out, and out= variants do not support autograd"
    if schema.is_mutable or any(r.alias_info is not None for r in schema.returns):
        return "it mutates or aliases its inputs (its schema has '(a!)' / '(a)' annotations)"
    if not schema.returns:
        return "it returns nothing, so there is nothing to differentiate"
    if any(a.kwarg_only for a in schema.arguments) and has_kwarg_only_tensors(schema):
        return "it has keyword-only Tensor arguments, which torch's autograd kernels do not support"
    return None


@hookimpl
def opregistry_materialize_kernel(
    library: Any, op: OpDef | None, kernel: Kernel, fn: Callable[..., Any],
    setup_context: Callable[..., Any] | None,
) -> bool:
    from ._torch_private import lookup_op, op_handle
    from .kernel import make_autograd_kernel

    if op is not None:  # an op opregistry defined: its tags are in the declaration
        tags: Iterable[str] = op.tags
    else:  # a kernel for someone else's op: ask torch (slower, and rare)
        tags = [t.name for t in lookup_op(kernel.op).tags]
    handle = op_handle(kernel.op)
    why = refusal(handle.schema(), tags)
    if why is not None:
        raise MaterializationError(
            f"cannot register autograd for {kernel.op} from {kernel.origin}: {why}. "
            f"Define a functional op (no '(a!)' annotations, returns a new tensor) and "
            f"register autograd for that one",
            origin=kernel.origin, op=kernel.op, key=kernel.key)
    autograd_kernel = make_autograd_kernel(kernel.op, fn, setup_context, device_kernel, handle)
    library.impl(op_name(kernel), autograd_kernel, "Autograd", with_keyset=True)
    return True
