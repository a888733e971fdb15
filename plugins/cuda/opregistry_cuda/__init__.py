"""opregistry-cuda: registers the CUDA kernels that op packages declare.

Installed on a machine without a GPU it reports itself unavailable, and the
CUDA kernels are listed as ``unavailable`` and never imported (so a kernel
module that imports Triton is never imported there either).
"""

from __future__ import annotations

import ctypes.util
import os
import sys

from opregistry.backend import DeviceBackend


def cuda_available() -> bool:
    """A CUDA device is usable; asks torch only if torch is already imported."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "cuda"):
        return bool(torch.cuda.is_available())
    if os.path.exists("/proc/driver/nvidia/version") or os.path.exists("/dev/nvidia0"):
        return True
    # find_library runs ldconfig in a subprocess (~10 ms): only where a driver node exists
    return os.path.exists("/dev/nvidiactl") and ctypes.util.find_library("cuda") is not None


backend = DeviceBackend(
    "cuda",
    key="CUDA",
    device_type="cuda",
    available=cuda_available,
    description="CUDA kernels via Library.impl(..., 'CUDA')",
)
