"""Sample inputs for ``opcheck`` / ``gradcheck``."""

from __future__ import annotations

from typing import Any

import torch

Samples = list[tuple[tuple[Any, ...], dict[str, Any]]]


def gelu_and_mul() -> Samples:
    return [((torch.randn(3, 8, dtype=torch.double),), {}),
            ((torch.randn(2, 2, 6, dtype=torch.double, requires_grad=True),), {})]


def fused_add_rms_norm() -> Samples:
    x, residual, weight = (torch.randn(4, 8), torch.randn(4, 8), torch.randn(8))
    return [((x, residual, weight), {}), ((x.double(), residual.double(), weight.double(), 1e-5), {})]
