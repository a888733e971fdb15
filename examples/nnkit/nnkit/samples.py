"""Sample inputs for ``opcheck`` / ``gradcheck``: lists of ``(args, kwargs)``.

Double precision and ``requires_grad`` where the op has autograd, so that
``gradcheck`` is meaningful; several shapes per op, including an empty one
where the op allows it.
"""

from __future__ import annotations

from typing import Any

import torch

Samples = list[tuple[tuple[Any, ...], dict[str, Any]]]


def _t(*shape: int, grad: bool = False) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.double, requires_grad=grad)


def rms_norm() -> Samples:
    return [
        ((_t(4, 8), _t(8)), {}),
        ((_t(2, 3, 8, grad=True), _t(8, grad=True), 1e-5), {}),
        ((_t(0, 8), _t(8)), {"eps": 1e-3}),
    ]


def silu_and_mul() -> Samples:
    return [((_t(3, 8),), {}), ((_t(2, 2, 6, grad=True),), {})]


def silu_and_mul_out() -> Samples:
    x = _t(3, 8)
    return [((x,), {"out": torch.empty(3, 4, dtype=torch.double)})]


def _boxes(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    corners = torch.rand(n, 2, generator=g) * 10
    sizes = torch.rand(n, 2, generator=g) * 4 + 0.5
    return torch.cat([corners, corners + sizes], dim=1), torch.rand(n, generator=g)


def nms() -> Samples:
    return [(_boxes(12, 0) + (0.3,), {}), (_boxes(5, 1) + (0.7,), {})]


def ema_update() -> Samples:
    return [((torch.zeros(5, dtype=torch.double), _t(5), 0.9), {}),
            ((torch.ones(2, 3), torch.randn(2, 3), 0.5), {})]


def rope_cache() -> Samples:
    return [((16, 8), {}), ((4, 6, 500.0), {"dtype": torch.double, "device": "cpu"})]


def interp() -> Samples:
    xp = torch.tensor([0.0, 1.0, 2.5, 4.0, 7.0], dtype=torch.double)
    fp = torch.tensor([1.0, -1.0, 0.5, 3.0, 2.0], dtype=torch.double)
    # points away from the knots (where the slope jumps) and outside the table
    x = torch.tensor([[-1.0, 0.3, 1.7], [3.1, 5.5, 8.0]], dtype=torch.double, requires_grad=True)
    return [((x, xp, fp), {}), ((torch.linspace(0.1, 6.9, 7, dtype=torch.double), xp, fp), {})]
