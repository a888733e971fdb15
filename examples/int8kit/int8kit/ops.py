"""The ops, their fake kernels, autograd, vmap rules and sample inputs."""

from __future__ import annotations

from typing import Any

import torch

from opregistry import OpLibrary

lib = OpLibrary("int8kit", description="symmetric per-row int8 quantization")


@lib.op(mutates_args=())
def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 quantization of each row: ``x ~= q * scale``."""
    scale = x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / 127
    q = torch.round(x / scale).clamp(-127, 127).to(torch.int8)
    return q, scale


@quantize_rows.register_fake
def _(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(x, dtype=torch.int8), x.new_empty((*x.shape[:-1], 1))


@quantize_rows.register_vmap
def _(info: Any, in_dims: tuple[Any, ...], x: torch.Tensor) -> Any:
    # rows are independent: batch dimensions are just more rows
    return quantize_rows(x.movedim(in_dims[0], 0)), (0, 0)


@quantize_rows.register_samples
def _() -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    return [((torch.randn(4, 16),), {}), ((torch.randn(2, 3, 8, dtype=torch.double),), {})]


@lib.op(mutates_args=())
def dequantize_rows(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``q * scale`` in ``dtype``."""
    return q.to(dtype) * scale.to(dtype)


@dequantize_rows.register_fake
def _(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    torch._check(scale.shape == (*q.shape[:-1], 1),
                 lambda: f"int8kit::dequantize_rows: scale {tuple(scale.shape)} does not fit "
                 f"q {tuple(q.shape)}")
    return torch.empty_like(q, dtype=dtype)


def _setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    q, scale, dtype = inputs
    ctx.save_for_backward(q)
    ctx.dtype = dtype
    ctx.scale_dtype = scale.dtype


def _backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    (q,) = ctx.saved_tensors
    # q is integer (no gradient); d(q * scale)/d scale sums over each row
    grad_scale = (grad * q.to(grad.dtype)).sum(dim=-1, keepdim=True)
    return None, grad_scale.to(ctx.scale_dtype), None


dequantize_rows.register_autograd(_backward, setup_context=_setup)


@dequantize_rows.register_vmap
def _(info: Any, in_dims: tuple[Any, ...], q: torch.Tensor, scale: torch.Tensor,
      dtype: torch.dtype) -> Any:
    def front(t: torch.Tensor, dim: int | None) -> torch.Tensor:
        return t.movedim(dim, 0) if dim is not None else t.expand(info.batch_size, *t.shape)

    return dequantize_rows(front(q, in_dims[0]), front(scale, in_dims[1]), dtype), 0


@dequantize_rows.register_samples
def _() -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    q = torch.randint(-127, 128, (4, 8), dtype=torch.int8)
    scale = torch.rand(4, 1, dtype=torch.double, requires_grad=True)
    return [((q, scale, torch.double), {}), ((q, scale.detach().float(), torch.float32), {})]
