"""The Python pieces of the C++ ops: fake kernels, autograd formulas, sample inputs.

As in the C++ custom-ops tutorial, with the registrations left to opregistry
(``registry.py`` names these functions).  Also the functions users call.
"""

from __future__ import annotations

from typing import Any

import torch


def mymuladd(a: torch.Tensor, b: torch.Tensor, c: float) -> torch.Tensor:
    """Performs a * b + c in an efficient fused kernel."""
    return torch.ops.extension_cpp.mymuladd.default(a, b, c)


def mymul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.ops.extension_cpp.mymul.default(a, b)


def myadd_out(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    torch.ops.extension_cpp.myadd_out.default(a, b, out)


def _check_pair(a: torch.Tensor, b: torch.Tensor) -> None:
    torch._check(a.shape == b.shape)
    torch._check(a.dtype == b.dtype)
    torch._check(a.dtype in (torch.float, torch.double))
    torch._check(a.device == b.device)


def mymuladd_fake(a: torch.Tensor, b: torch.Tensor, c: float) -> torch.Tensor:
    _check_pair(a, b)
    return torch.empty_like(a)


def mymul_fake(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    _check_pair(a, b)
    return torch.empty_like(a)


def myadd_out_fake(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    _check_pair(a, b)
    torch._check(out.shape == a.shape)


def mymuladd_setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    a, b, _ = inputs
    saved_a, saved_b = None, None
    if ctx.needs_input_grad[0]:
        saved_b = b
    if ctx.needs_input_grad[1]:
        saved_a = a
    ctx.save_for_backward(saved_a, saved_b)


def mymuladd_backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, Any, None]:
    a, b = ctx.saved_tensors
    grad_a = torch.ops.extension_cpp.mymul.default(grad, b) if ctx.needs_input_grad[0] else None
    grad_b = torch.ops.extension_cpp.mymul.default(grad, a) if ctx.needs_input_grad[1] else None
    return grad_a, grad_b, None


def mymul_setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    mymuladd_setup_context(ctx, (*inputs, None), output)


def mymul_backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, Any]:
    return mymuladd_backward(ctx, grad)[:2]


def _t(*shape: int, grad: bool = False) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.double, requires_grad=grad)


def mymuladd_samples() -> list[Any]:
    return [((_t(3), _t(3), 1.5), {}), ((_t(2, 2, grad=True), _t(2, 2, grad=True), -0.5), {}),
            ((torch.randn(5), torch.randn(5), 2.0), {})]


def mymul_samples() -> list[Any]:
    return [((_t(3), _t(3)), {}), ((_t(2, 3, grad=True), _t(2, 3, grad=True)), {})]


def myadd_out_samples() -> list[Any]:
    return [((_t(4), _t(4), torch.empty(4, dtype=torch.double)), {})]
