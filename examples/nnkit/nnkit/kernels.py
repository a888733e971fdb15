"""The kernels of nnkit, in plain PyTorch (and NumPy for ``interp``).

Imported only when opregistry registers them.  Every kernel computes in at
least float32 (as production kernels do for half precision inputs) and
returns a contiguous tensor, which is what the fake kernels promise.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

# -- helpers -----------------------------------------------------------------


def save_x(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    """setup_context that keeps the first input for backward."""
    ctx.save_for_backward(inputs[0])


def save_inputs(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    """setup_context that keeps every tensor input for backward."""
    ctx.save_for_backward(*[i for i in inputs if isinstance(i, torch.Tensor)])


def _to_front(t: torch.Tensor, dim: int | None, size: int) -> torch.Tensor:
    """A vmap input with its batch dimension first (broadcast if unbatched)."""
    return t.movedim(dim, 0) if dim is not None else t.expand(size, *t.shape)


def _select(t: torch.Tensor, dim: int | None, index: int) -> torch.Tensor:
    return t if dim is None else t.select(dim, index)


def _check_weight(x: torch.Tensor, weight: torch.Tensor) -> None:
    torch._check(
        weight.shape == x.shape[-1:],
        lambda: f"nnkit::rms_norm: weight has shape {tuple(weight.shape)}, "
        f"expected {tuple(x.shape[-1:])} (the last dimension of x)",
    )


# -- rms_norm ------------------------------------------------------------------


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    _check_weight(x, weight)
    xf = x.to(torch.promote_types(x.dtype, torch.float32))
    r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * r * weight.to(xf.dtype)).to(x.dtype).contiguous()


def rms_norm_fake(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    _check_weight(x, weight)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def rms_norm_setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    x, weight, eps = inputs
    ctx.save_for_backward(x, weight)
    ctx.eps = eps


def rms_norm_backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    # Written with differentiable torch ops, so double backward works too.
    x, weight = ctx.saved_tensors
    r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + ctx.eps)
    gw = grad * weight
    grad_x = r * gw - x * r.pow(3) * (gw * x).mean(-1, keepdim=True)
    grad_weight = (grad * x * r).reshape(-1, x.shape[-1]).sum(0)
    return grad_x, grad_weight, None


def rms_norm_vmap(info: Any, in_dims: tuple[Any, ...], x: torch.Tensor, weight: torch.Tensor,
                  eps: float = 1e-6) -> tuple[torch.Tensor, int]:
    x_dim, w_dim = in_dims[0], in_dims[1]  # in_dims omits eps when the caller did
    x = _to_front(x, x_dim, info.batch_size)
    if w_dim is None:
        # rms_norm normalizes the last dimension whatever the leading ones are
        return torch.ops.nnkit.rms_norm(x, weight, eps), 0
    # one weight per batch entry: normalize with unit weight, then scale
    weight = weight.movedim(w_dim, 0)
    scale = weight.reshape(weight.shape[0], *([1] * (x.dim() - 2)), weight.shape[-1])
    return torch.ops.nnkit.rms_norm(x, weight.new_ones(x.shape[-1]), eps) * scale, 0


# -- silu_and_mul --------------------------------------------------------------


def _check_even(x: torch.Tensor) -> None:
    torch._check(
        x.dim() >= 1 and x.shape[-1] % 2 == 0,
        lambda: f"nnkit::silu_and_mul: the last dimension of x must be even, got {tuple(x.shape)}",
    )


def _halves(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    d = x.shape[-1] // 2
    return x[..., :d], x[..., d:]


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    _check_even(x)
    gate, up = _halves(x)
    return (F.silu(gate) * up).contiguous()


def silu_and_mul_fake(x: torch.Tensor) -> torch.Tensor:
    _check_even(x)
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))


def silu_and_mul_backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
    (x,) = ctx.saved_tensors
    gate, up = _halves(x)
    s = torch.sigmoid(gate)
    grad_gate = grad * up * s * (1 + gate * (1 - s))
    grad_up = grad * F.silu(gate)
    return torch.cat([grad_gate, grad_up], dim=-1)


def silu_and_mul_vmap(info: Any, in_dims: tuple[Any, ...], x: torch.Tensor
                      ) -> tuple[torch.Tensor, int]:
    return torch.ops.nnkit.silu_and_mul(x.movedim(in_dims[0], 0)), 0


def _check_out(x: torch.Tensor, out: torch.Tensor) -> None:
    _check_even(x)
    expected = (*x.shape[:-1], x.shape[-1] // 2)
    torch._check(
        tuple(out.shape) == expected and out.dtype == x.dtype,
        lambda: f"nnkit::silu_and_mul.out: out must have shape {expected} and dtype {x.dtype}, "
        f"got {tuple(out.shape)} {out.dtype}",
    )


def silu_and_mul_out(x: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    _check_out(x, out)
    gate, up = _halves(x)
    torch.mul(F.silu(gate), up, out=out)
    return out


def silu_and_mul_out_fake(x: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    _check_out(x, out)
    return out


# -- nms -------------------------------------------------------------------------


def _check_boxes(boxes: torch.Tensor, scores: torch.Tensor) -> None:
    torch._check(
        boxes.dim() == 2 and boxes.shape[1] == 4 and scores.shape == boxes.shape[:1],
        lambda: f"nnkit::nms: expected boxes [N, 4] and scores [N], got "
        f"{tuple(boxes.shape)} and {tuple(scores.shape)}",
    )


def box_iou(box: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
    """IoU of one (x1, y1, x2, y2) box with each of ``boxes``."""
    lt = torch.maximum(box[:2], boxes[:, :2])
    rb = torch.minimum(box[2:], boxes[:, 2:])
    inter = (rb - lt).clamp(min=0).prod(dim=1)
    area = (box[2:] - box[:2]).prod()
    areas = (boxes[:, 2:] - boxes[:, :2]).prod(dim=1)
    return inter / (area + areas - inter)


def nms(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    _check_boxes(boxes, scores)
    order = scores.argsort(descending=True, stable=True)
    suppressed = torch.zeros(boxes.shape[0], dtype=torch.bool, device=boxes.device)
    keep = []
    for i in order.tolist():
        if suppressed[i]:
            continue
        keep.append(i)
        suppressed |= box_iou(boxes[i], boxes) > iou_threshold
    return torch.tensor(keep, dtype=torch.long, device=boxes.device)


def nms_fake(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    _check_boxes(boxes, scores)
    # how many boxes survive is only known from the data: an unbacked size
    kept = torch.library.get_ctx().new_dynamic_size()
    return boxes.new_empty((kept,), dtype=torch.long)


# -- ema_update ----------------------------------------------------------------


def _check_ema(average: torch.Tensor, value: torch.Tensor) -> None:
    torch._check(
        average.shape == value.shape,
        lambda: f"nnkit::ema_update: average {tuple(average.shape)} and value "
        f"{tuple(value.shape)} differ in shape",
    )


def ema_update(average: torch.Tensor, value: torch.Tensor, decay: float) -> None:
    _check_ema(average, value)
    average.mul_(decay).add_(value, alpha=1.0 - decay)


def ema_update_fake(average: torch.Tensor, value: torch.Tensor, decay: float) -> None:
    _check_ema(average, value)


# -- rope_cache ------------------------------------------------------------------


def _check_rope(rotary_dim: int) -> None:
    torch._check(rotary_dim % 2 == 0,
                 lambda: f"nnkit::rope_cache: rotary_dim must be even, got {rotary_dim}")


def rope_cache(max_positions: int, rotary_dim: int, base: float = 10000.0, *,
               dtype: torch.dtype | None = None, device: torch.device | None = None
               ) -> torch.Tensor:
    _check_rope(rotary_dim)
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.float32, device=device) / rotary_dim
    inv_freq = 1.0 / (base**exponents)
    positions = torch.arange(max_positions, dtype=torch.float32, device=device)
    freqs = torch.outer(positions, inv_freq)
    table = torch.cat([freqs.cos(), freqs.sin()], dim=-1)
    return table.to(dtype or torch.get_default_dtype())


def rope_cache_fake(max_positions: int, rotary_dim: int, base: float = 10000.0, *,
                    dtype: torch.dtype | None = None, device: torch.device | None = None
                    ) -> torch.Tensor:
    _check_rope(rotary_dim)
    return torch.empty((max_positions, rotary_dim), dtype=dtype or torch.get_default_dtype(),
                       device=device)


# -- interp (NumPy) -------------------------------------------------------------


def _check_table(xp: torch.Tensor, fp: torch.Tensor) -> None:
    torch._check(
        xp.dim() == 1 and fp.shape == xp.shape and xp.shape[0] >= 2,
        lambda: f"nnkit::interp: xp and fp must be 1-D of the same length >= 2, got "
        f"{tuple(xp.shape)} and {tuple(fp.shape)}",
    )


def interp(x: torch.Tensor, xp: torch.Tensor, fp: torch.Tensor) -> torch.Tensor:
    _check_table(xp, fp)
    result = np.interp(x.detach().cpu().numpy(), xp.detach().cpu().numpy(),
                       fp.detach().cpu().numpy())
    dtype = torch.promote_types(x.dtype, fp.dtype)
    return torch.from_numpy(np.asarray(result)).to(device=x.device, dtype=dtype)


def interp_fake(x: torch.Tensor, xp: torch.Tensor, fp: torch.Tensor) -> torch.Tensor:
    _check_table(xp, fp)
    return x.new_empty(x.shape, dtype=torch.promote_types(x.dtype, fp.dtype))


def interp_backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    # d interp / dx is the slope of the segment x falls in; zero outside
    # [xp[0], xp[-1]], where numpy.interp is constant.  Gradients flow to x only.
    x, xp, fp = ctx.saved_tensors
    i = torch.searchsorted(xp, x.detach().contiguous(), right=True).clamp(1, xp.shape[0] - 1)
    slope = (fp[i] - fp[i - 1]) / (xp[i] - xp[i - 1])
    inside = (x >= xp[0]) & (x <= xp[-1])
    return grad * torch.where(inside, slope, torch.zeros_like(slope)), None, None


def interp_vmap(info: Any, in_dims: tuple[Any, ...], x: torch.Tensor, xp: torch.Tensor,
                fp: torch.Tensor) -> tuple[torch.Tensor, int]:
    x_dim, xp_dim, fp_dim = in_dims
    if xp_dim is None and fp_dim is None:
        # one table for the whole batch: a single call
        return torch.ops.nnkit.interp(_to_front(x, x_dim, info.batch_size), xp, fp), 0
    # a table per batch entry: one call each
    outs = [torch.ops.nnkit.interp(_select(x, x_dim, b), _select(xp, xp_dim, b),
                                   _select(fp, fp_dim, b)) for b in range(info.batch_size)]
    return torch.stack(outs), 0
