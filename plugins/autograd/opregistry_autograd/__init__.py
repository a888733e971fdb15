"""opregistry-autograd: registers backward formulas (``register_autograd`` semantics).

The kernel it registers (see :mod:`opregistry_autograd.kernel`) keeps
``torch.library.register_autograd``'s contract — ``setup_context(ctx, inputs,
output)`` in forward, ``backward(ctx, *grads)``, higher-order gradients when
backward is differentiable, refusal for mutable and out= ops — and costs
almost nothing when no input requires grad.
"""

from __future__ import annotations

from typing import Any, Iterable

from opregistry import Backend, Kernel, MaterializationError, OpDef, hookimpl
from opregistry.backend import deferred_import, device_kernel, enable_fast_dispatch, op_name

__all__ = ["BACKEND", "refusal"]

BACKEND = Backend(
    name="autograd", keys=("Autograd",),
    description="backward + setup_context (register_autograd semantics, lean no-grad path)",
)

#: the kernel's module (torch's private calls as ``kernel.tp``): imported at the first
#: registration (``opregistry list`` loads this plugin without torch)
_kernel_module = deferred_import(f"{__name__}.kernel")


@hookimpl
def opregistry_backends() -> list[Backend]:
    return [BACKEND]


def refusal(schema: Any, tags: Iterable[str] = ()) -> str | None:
    """Why torch's ``register_autograd`` would refuse an op, or ``None``.

    The rule is opregistry's own (:meth:`opregistry.schema.Schema.autograd_refusal`,
    which the resolver applies to every declared op before torch is imported);
    this applies it to an op opregistry did not declare, from torch's schema.

    :param schema: the op's ``torch.FunctionSchema``.
    :param tags: the op's tag names (``"out"``...).
    """
    from opregistry.errors import SchemaError
    from opregistry.schema import parse_schema

    head, paren, tail = str(schema).partition("(")
    try:
        parsed = parse_schema(head.rpartition("::")[2] + paren + tail)
    except SchemaError:
        return None  # a type custom ops cannot use (aten's Dimname...): torch decides
    found = parsed.autograd_refusal(tags)
    return found[1] if found else None


@hookimpl
def opregistry_materialize_kernel(
    library: Any, op: OpDef | None, kernel: Kernel, payload: Any,
) -> bool:
    kernel_module = _kernel_module()
    tp = kernel_module.tp
    handle = tp.op_handle(kernel.op)
    # an op opregistry defined was checked by the resolver (the same rule); a
    # kernel for someone else's op is checked here, from torch's schema and tags
    why = None if op is not None else refusal(
        handle.schema(), [t.name for t in tp.lookup_op(kernel.op).tags])
    if why is not None:
        raise MaterializationError(
            f"cannot register autograd for {kernel.op} from {kernel.origin}: {why}. "
            f"Define a functional op (no '(a!)' annotations, returns a new tensor) and "
            f"register autograd for that one",
            origin=kernel.origin, op=kernel.op, key=kernel.key)
    autograd_kernel = kernel_module.make_autograd_kernel(
        kernel.op, payload.backward, payload.setup_context, device_kernel, handle,
        enable_fast=enable_fast_dispatch)
    library.impl(op_name(kernel), autograd_kernel, "Autograd", with_keyset=True)
    return True
