"""A GPU-friendly kernel for ``nnkit::nms``, registered for CUDA only.

nnkit's CPU kernel compares one box with all others per kept box; on a GPU
the usual approach computes the whole IoU matrix in one go and runs the
cheap greedy pass over it on the host.  Written in plain torch, so it is
also checked on CPU tensors by the tests (it must agree with nnkit's).
"""

from __future__ import annotations

import torch

from nnkit.kernels import _check_boxes


def nms(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    _check_boxes(boxes, scores)
    order = scores.argsort(descending=True, stable=True)
    ordered = boxes[order]
    lt = torch.maximum(ordered[:, None, :2], ordered[None, :, :2])
    rb = torch.minimum(ordered[:, None, 2:], ordered[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(dim=2)
    areas = (ordered[:, 2:] - ordered[:, :2]).prod(dim=1)
    overlaps = (inter / (areas[:, None] + areas[None, :] - inter) > iou_threshold).cpu()
    n = boxes.shape[0]
    suppressed = torch.zeros(n, dtype=torch.bool)
    keep = []
    for i in range(n):
        if suppressed[i]:
            continue
        keep.append(i)
        suppressed |= overlaps[i]
    return order[torch.tensor(keep, dtype=torch.long, device=boxes.device)]
