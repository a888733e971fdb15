"""Where the library comes from: built at install time, or at first load (shared by setup.py).

``pip install`` builds ``extension_cpp/_C*.so`` when torch can be imported by
the build (``pip install --no-build-isolation``, torch already installed: the
way to build a wheel for one torch) and records what it was built for in
``extension_cpp/_build.json``.  Under build isolation torch cannot be imported
(and must not be a build requirement: that would pull a torch other than the
installed one), so the package is installed with its sources only and
:mod:`extension_cpp._load` builds the library at its first load, for the
running torch, into a cache directory (once per torch release).
"""

from __future__ import annotations

import os
import shutil

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD_INFO = os.path.join(HERE, "_build.json")
SOURCES = [os.path.join(HERE, "csrc", "muladd.cpp")]
CUDA_SOURCES = [os.path.join(HERE, "csrc", "muladd.cu")]
#: the name of the shared library (``_C`` in the package, or in the cache directory)
NAME = "extension_cpp_C"


def nvcc() -> bool:
    """Whether a CUDA compiler is there (``CUDA_HOME``/``CUDA_PATH``, or ``nvcc`` on PATH)."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and os.path.exists(os.path.join(home, "bin", "nvcc")):
        return True
    return shutil.which("nvcc") is not None


def gpu_driver() -> bool:
    """Whether an NVIDIA driver is loaded (Linux: ``/proc/driver/nvidia``), read without torch."""
    return os.path.exists("/proc/driver/nvidia/version")


def with_cuda(torch_cuda: str | None) -> bool:
    """Whether the CUDA source is compiled: a CUDA torch, nvcc present, and a GPU driver.

    Without a driver there is no GPU to run the kernels on, and nvcc finds no
    architecture to compile for (torch's ``cpp_extension`` fails with an
    IndexError unless ``TORCH_CUDA_ARCH_LIST`` is set): a build box without a
    GPU sets ``EXTENSION_CPP_CUDA=1`` and ``TORCH_CUDA_ARCH_LIST`` to build the
    CUDA kernels anyway.  ``EXTENSION_CPP_NO_CUDA=1`` switches them off (a
    CPU-only build on a machine with nvcc and a GPU).
    """
    if not torch_cuda or not nvcc() or os.environ.get("EXTENSION_CPP_NO_CUDA"):
        return False
    return gpu_driver() or bool(os.environ.get("EXTENSION_CPP_CUDA"))
