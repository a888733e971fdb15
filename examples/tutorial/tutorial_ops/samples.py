"""Sample inputs for ``opcheck`` and ``gradcheck``: lists of ``(args, kwargs)``."""

from __future__ import annotations

import torch


def _t(*shape: int, grad: bool = False) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.double, requires_grad=grad)


def numpy_sin():  # type: ignore[no-untyped-def]
    return [((_t(3),), {}), ((_t(2, 3, grad=True),), {})]


def muladd():  # type: ignore[no-untyped-def]
    return [((_t(3), _t(3), 1.5), {}), ((_t(2, 2, grad=True), _t(2, 2, grad=True), -0.5), {})]


def add_out():  # type: ignore[no-untyped-def]
    return [((_t(4), _t(4), torch.empty(4, dtype=torch.double)), {})]
