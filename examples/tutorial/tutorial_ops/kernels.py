"""The kernels; imported only when the registry materializes them."""

from __future__ import annotations

import numpy as np
import torch


def numpy_sin(x: torch.Tensor) -> torch.Tensor:
    result = np.sin(x.detach().cpu().numpy())
    return torch.from_numpy(result).to(x.device)


def same_like_first(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def save_inputs(ctx, inputs, output) -> None:  # type: ignore[no-untyped-def]
    ctx.save_for_backward(*[i for i in inputs if isinstance(i, torch.Tensor)])


def numpy_sin_backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[no-untyped-def]
    (x,) = ctx.saved_tensors
    return grad * x.cos()


def numpy_sin_vmap(info, in_dims, x):  # type: ignore[no-untyped-def]
    return torch.ops.tutorial.numpy_sin(x), in_dims[0]


def muladd(a: torch.Tensor, b: torch.Tensor, c: float) -> torch.Tensor:
    torch._check(a.shape == b.shape, lambda: f"muladd: shapes differ, {a.shape} vs {b.shape}")
    return a * b + c


def muladd_fake(a: torch.Tensor, b: torch.Tensor, c: float) -> torch.Tensor:
    torch._check(a.shape == b.shape, lambda: f"muladd: shapes differ, {a.shape} vs {b.shape}")
    return torch.empty_like(a)


def muladd_backward(ctx, grad: torch.Tensor):  # type: ignore[no-untyped-def]
    a, b = ctx.saved_tensors
    return grad * b, grad * a, None


def _batched(t: torch.Tensor, dim: int | None, size: int) -> torch.Tensor:
    return t.movedim(dim, 0) if dim is not None else t.expand(size, *t.shape)


def muladd_vmap(info, in_dims, a, b, c):  # type: ignore[no-untyped-def]
    a_dim, b_dim, _ = in_dims
    a = _batched(a, a_dim, info.batch_size)
    b = _batched(b, b_dim, info.batch_size)
    return torch.ops.tutorial.muladd(a, b, c), 0


def add_out(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    out.copy_(a + b)


def add_out_fake(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    return None
