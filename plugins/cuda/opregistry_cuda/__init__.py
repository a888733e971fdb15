"""opregistry-cuda: registers the CUDA kernels that op packages declare.

Installed on a machine without a GPU it reports itself unavailable, and the
CUDA kernels are listed as ``unavailable`` and never imported (so a kernel
module that imports Triton is never imported there either).
"""

from __future__ import annotations

import importlib.util
import os
import sys

from opregistry.backend import DeviceBackend


#: the library a CUDA (or ROCm, which torch also calls "cuda") build of torch ships
_TORCH_GPU_LIBRARIES = ("libtorch_cuda.so", "libtorch_hip.so", "torch_cuda.dll")


def torch_is_cuda_build() -> bool:
    """Whether the installed torch was built with CUDA or ROCm, without importing it.

    A CPU-only wheel on a machine with an NVIDIA driver cannot run CUDA
    kernels: look for the GPU library inside torch's package instead of
    asking ``torch.version.cuda`` (which would import torch).
    """
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return False
    return any(os.path.exists(os.path.join(root, "lib", name))
               for root in spec.submodule_search_locations for name in _TORCH_GPU_LIBRARIES)


def _driver_present() -> bool:
    if os.path.exists("/proc/driver/nvidia/version") or os.path.exists("/dev/nvidia0"):
        return True
    if not os.path.exists("/dev/nvidiactl"):
        return False
    # find_library runs ldconfig in a subprocess (~10 ms), and ctypes.util imports
    # subprocess (~3 ms for a CLI that has not): only where a driver node exists
    import ctypes.util

    return ctypes.util.find_library("cuda") is not None


def cuda_available() -> bool:
    """A CUDA device is usable; asks torch only if torch is already imported."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "cuda"):
        return bool(torch.cuda.is_available())
    return _driver_present() and torch_is_cuda_build()


backend = DeviceBackend(
    "cuda",
    key="CUDA",
    device_type="cuda",
    available=cuda_available,
    description="CUDA kernels via Library.impl(..., 'CUDA')",
)
