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


# -- a kernel for every device -------------------------------------------------------


@lib.op(mutates_args=(), device_types="default")
def row_scales(x: torch.Tensor) -> torch.Tensor:
    """The per-row scale of symmetric int8 quantization, ``absmax / 127``.

    Declared for ``"default"`` (``CompositeExplicitAutograd``): this one
    kernel serves every device, as ``custom_op`` registers it.
    """
    return x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / 127


@row_scales.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], 1))


@row_scales.register_samples
def _() -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    return [((torch.randn(4, 16),), {}), ((torch.randn(2, 3, 8, dtype=torch.double),), {})]


# -- a Triton kernel where it can run, a plain kernel elsewhere -----------------------


@lib.op(mutates_args=(), device_types=("cpu", "cuda"))
def quantize_with_scales(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x / scale`` rounded half up to int8 in [-127, 127]; ``scale`` is one per row.

    The plain kernel: the fallback of the Triton candidates below.
    """
    q = torch.floor(x.float() / scale.float() + 0.5)
    return q.clamp(-127, 127).to(torch.int8)


@quantize_with_scales.register_fake
def _(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    torch._check(scale.shape == (*x.shape[:-1], 1),
                 lambda: f"int8kit::quantize_with_scales: scale {tuple(scale.shape)} does not "
                 f"fit x {tuple(x.shape)}")
    return torch.empty_like(x, dtype=torch.int8)


@quantize_with_scales.register_samples
def _() -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    x = torch.randn(4, 37)
    return [((x, row_scales(x)), {}),
            ((x.double().t().contiguous().t(), row_scales(x).double()), {})]


# The Triton candidates, by reference: int8kit.triton_quant (which imports triton)
# is imported only where a candidate serves.  On CUDA: GPUs of compute capability
# 8.0 or newer (asked on the first call on each device); older ones get the plain
# kernel.  On CPU: only under Triton's interpreter (TRITON_INTERPRET=1), how the
# tests run the Triton kernel without a GPU.
lib.impl("quantize_with_scales", "cuda", "int8kit.triton_quant:quantize_with_scales",
         triton=True, when={"capability": ">=8.0", "requires": "triton>=3.2"})
lib.impl("quantize_with_scales", "cpu", "int8kit.triton_quant:quantize_with_scales",
         triton=True, when={"requires": "triton>=3.2"},
         predicate="int8kit.triton_quant:interpreted")
