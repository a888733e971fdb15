"""A Triton kernel for ``int8kit::quantize_with_scales``, imported only when it serves.

:mod:`int8kit.ops` names these functions by ``"module:function"`` strings,
so a machine without triton never imports this module: the candidates are
``unmet`` there (``requires triton``) and the op's plain kernel serves.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch.library import wrap_triton


@triton.jit
def _quantize_kernel(x_ptr, scale_ptr, q_ptr, n, n_cols, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    scale = tl.load(scale_ptr + offsets // n_cols, mask=mask, other=1.0).to(tl.float32)
    q = tl.floor(x / scale + 0.5)  # round half up, as the plain kernel
    q = tl.minimum(tl.maximum(q, -127.0), 127.0)
    tl.store(q_ptr + offsets, q.to(tl.int8), mask=mask)


def quantize_with_scales(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    x, scale = x.contiguous(), scale.contiguous()
    q = torch.empty_like(x, dtype=torch.int8)
    n = x.numel()
    if n:
        wrap_triton(_quantize_kernel)[(triton.cdiv(n, 256),)](
            x, scale, q, n, x.shape[-1], BLOCK=256)
    return q


def interpreted(x: torch.Tensor, scale: torch.Tensor) -> bool:
    """The CPU candidate's per-call condition: Triton runs CPU tensors only in its interpreter."""
    return os.environ.get("TRITON_INTERPRET") == "1"
