"""The CUDA kernel of ``nnkit::rms_norm``, in Triton.

This module imports Triton at the top, which is why it is named only by the
``"cuda"`` kernel reference in :mod:`nnkit.registry`: opregistry imports it
when the CUDA backend is installed *and* available, never on a CPU-only
machine.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import kernels


@triton.jit
def _rms_norm_rows(x_ptr, w_ptr, out_ptr, x_stride, out_stride, n_cols, eps,  # type: ignore[no-untyped-def]
                   BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    r = tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    tl.store(out_ptr + row * out_stride + cols, (x * r * w).to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    if x.dtype == torch.float64 or x.numel() == 0:
        # the Triton kernel accumulates in float32; double stays exact on the torch path
        return kernels.rms_norm(x, weight, eps)
    kernels._check_weight(x, weight)
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    out = torch.empty_like(rows)
    n_cols = rows.shape[1]
    _rms_norm_rows[(rows.shape[0],)](rows, weight.contiguous(), out, rows.stride(0),
                                     out.stride(0), n_cols, eps,
                                     BLOCK=triton.next_power_of_2(n_cols))
    return out.view(x.shape)
