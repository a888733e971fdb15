"""Kernels of the ops nnkit-contrib adds to the nnkit namespace."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from nnkit.kernels import rms_norm, save_x

__all__ = ["gelu_and_mul", "gelu_and_mul_fake", "gelu_and_mul_backward", "gelu_and_mul_vmap",
           "fused_add_rms_norm", "fused_add_rms_norm_fake", "save_x"]


def _check_even(x: torch.Tensor) -> None:
    torch._check(
        x.dim() >= 1 and x.shape[-1] % 2 == 0,
        lambda: f"nnkit::gelu_and_mul: the last dimension of x must be even, got {tuple(x.shape)}",
    )


def gelu_and_mul(x: torch.Tensor) -> torch.Tensor:
    _check_even(x)
    d = x.shape[-1] // 2
    return (F.gelu(x[..., :d]) * x[..., d:]).contiguous()


def gelu_and_mul_fake(x: torch.Tensor) -> torch.Tensor:
    _check_even(x)
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))


def gelu_and_mul_backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
    (x,) = ctx.saved_tensors
    d = x.shape[-1] // 2
    gate, up = x[..., :d], x[..., d:]
    cdf = 0.5 * (1 + torch.erf(gate / math.sqrt(2)))
    pdf = torch.exp(-0.5 * gate * gate) / math.sqrt(2 * math.pi)
    return torch.cat([grad * up * (cdf + gate * pdf), grad * F.gelu(gate)], dim=-1)


def gelu_and_mul_vmap(info: Any, in_dims: tuple[Any, ...], x: torch.Tensor
                      ) -> tuple[torch.Tensor, int]:
    return torch.ops.nnkit.gelu_and_mul(x.movedim(in_dims[0], 0)), 0


def _check_fused(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor) -> None:
    torch._check(
        x.shape == residual.shape and weight.shape == x.shape[-1:],
        lambda: f"nnkit::fused_add_rms_norm: x {tuple(x.shape)}, residual "
        f"{tuple(residual.shape)} and weight {tuple(weight.shape)} do not fit",
    )


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float = 1e-6) -> None:
    _check_fused(x, residual, weight)
    residual.add_(x)
    x.copy_(rms_norm(residual, weight, eps))


def fused_add_rms_norm_fake(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                            eps: float = 1e-6) -> None:
    _check_fused(x, residual, weight)
