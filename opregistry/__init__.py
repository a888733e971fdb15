"""opregistry: a plugin-based registry for PyTorch custom operators.

Op packages declare ops through the entry-point group ``opregistry.ops``;
backends (``opregistry-cpu``, ``opregistry-cuda``, ...) register kernels for
their dispatch key; :func:`load` resolves every installed package together
and registers the result with ``torch.library``.  Importing this package
does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

#: public name -> the module defining it, imported on first use (PEP 562): ``import
#: torch`` with a warm plan cache needs the records, the cache and the materializer,
#: not the declaration API, the schema parser or the reports
_LAZY = {
    "Policy": "config", "Settings": "config",
    "Adoption": "adoption",
    "OpHandle": "declare", "OpLibrary": "declare", "kernel": "declare",
    "ConfigError": "errors", "DeclarationError": "errors", "LockMismatchError": "errors",
    "MaterializationError": "errors", "OpRegistryError": "errors", "PluginLoadError": "errors",
    "PluginValidationError": "errors", "ReentrantLoadError": "errors",
    "ResolutionError": "errors", "SchemaError": "errors",
    "hookimpl": "hookspecs", "hookspec": "hookspecs",
    "installed_torch": "keys", "installed_torch_build": "keys",
    "Backend": "model", "Candidate": "model", "Condition": "model", "Kernel": "model",
    "Namespace": "model", "NativeLibrary": "model", "OpDef": "model", "Origin": "model",
    "Problem": "model",
    "KernelCounts": "selection", "kernel_counts": "selection",
    "Registry": "registry", "get_registry": "registry", "load": "registry", "plan": "registry",
    "verify_lock": "registry",
}

if TYPE_CHECKING:
    from . import report
    from .adoption import Adoption
    from .config import Policy, Settings
    from .declare import OpHandle, OpLibrary, kernel
    from .errors import (ConfigError, DeclarationError, LockMismatchError,
                         MaterializationError, OpRegistryError, PluginLoadError,
                         PluginValidationError, ReentrantLoadError, ResolutionError,
                         SchemaError)
    from .hookspecs import hookimpl, hookspec
    from .keys import installed_torch, installed_torch_build
    from .model import (Backend, Candidate, Condition, Kernel, Namespace, NativeLibrary,
                        OpDef, Origin, Problem)
    from .registry import Registry, get_registry, load, plan, verify_lock
    from .selection import KernelCounts, kernel_counts

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


def __getattr__(name: str) -> Any:
    """The public API, each name imported from its module when first used.

    Nothing is bound on the package: the seal (:mod:`opregistry.seal`)
    compares its bindings, and a plugin reading ``opregistry.OpLibrary`` must
    not look like one changing them.
    """
    module = _LAZY.get(name)
    if module is not None:
        from importlib import import_module

        return getattr(import_module(f"{__name__}.{module}"), name)
    if name == "__version__":
        from importlib_metadata import version

        return version("opregistry")
    if not name.startswith("_"):
        # a submodule (``opregistry.report``, ``opregistry.registry``...): reachable as an
        # attribute after ``import opregistry`` as when the package imported them all
        from importlib import import_module
        from importlib.util import find_spec

        if find_spec(f"{__name__}.{name}") is not None:
            return import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'opregistry' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
