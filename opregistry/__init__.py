"""opregistry: a plugin-based registry for PyTorch custom operators.

Op packages declare ops through the entry-point group ``opregistry.ops``;
backends (``opregistry-cpu``, ``opregistry-cuda``, ...) register kernels for
their dispatch key; :func:`load` resolves every installed package together
and registers the result with ``torch.library``.  Importing this package
does not import torch.
"""

from __future__ import annotations

import gc as _gc

# the collector is paused while the package is imported: torch's autoload imports it at
# the end of `import torch`, with torch's million objects on the heap, where the
# allocations of these imports would set off a full collection (about a tenth of
# `import torch`); it is restored, and runs as usual, right after
_collecting = _gc.isenabled()
_gc.disable()
try:
    from .config import Policy, Settings
    from .adoption import Adoption
    from .declare import OpHandle, OpLibrary, kernel
    from .errors import (
        ConfigError,
        DeclarationError,
        LockMismatchError,
        MaterializationError,
        OpRegistryError,
        PluginLoadError,
        PluginValidationError,
        ReentrantLoadError,
        ResolutionError,
        SchemaError,
    )
    from .hookspecs import hookimpl, hookspec
    from .keys import installed_torch, installed_torch_build
    from .model import (Backend, Candidate, Condition, Kernel, Namespace, NativeLibrary, OpDef,
                        Origin, Problem)
    from .selection import KernelCounts, kernel_counts
    from . import report
    from .registry import Registry, get_registry, load, plan, verify_lock
finally:
    if _collecting:
        _gc.enable()
    del _collecting

__all__ = [
    "Adoption",
    "Backend",
    "Candidate",
    "Condition",
    "ConfigError",
    "DeclarationError",
    "Kernel",
    "LockMismatchError",
    "MaterializationError",
    "Namespace",
    "OpDef",
    "OpHandle",
    "OpLibrary",
    "NativeLibrary",
    "OpRegistryError",
    "Origin",
    "PluginLoadError",
    "PluginValidationError",
    "Policy",
    "Problem",
    "Registry",
    "ReentrantLoadError",
    "ResolutionError",
    "SchemaError",
    "Settings",
    "KernelCounts",
    "get_registry",
    "kernel",
    "kernel_counts",
    "hookimpl",
    "hookspec",
    "installed_torch",
    "installed_torch_build",
    "load",
    "plan",
    "report",
    "verify_lock",
    "__version__",
]


def __getattr__(name: str) -> str:
    if name == "__version__":
        from importlib_metadata import version

        return version("opregistry")
    raise AttributeError(f"module 'opregistry' has no attribute {name!r}")
