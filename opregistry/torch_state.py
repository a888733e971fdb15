"""What torch's dispatcher already holds — the one module of the core that reads torch internals.

The resolver needs to know which ops and namespaces exist in torch outside
opregistry (rule 4: a DEF of a namespace a C++ ``TORCH_LIBRARY`` holds) and
whether torch already has a kernel for an (op, key) (rule 5); the
materializer and the device backends need a few private handles on a
``Library`` and on dispatch keys.  torch has no public API for any of these,
so every private call of the core is here, and ``tests/test_torch_state.py``
fails loudly if torch renames one or changes its signature.  (Each backend
plugin keeps its own private calls in its ``_torch_private.py``.)
"""

from __future__ import annotations

from typing import Any, Iterable

from .plan import TorchState

__all__ = ["snapshot", "registered_ops", "has_kernel", "op_schema", "kernel_registrations",
           "python_kernels", "destroy_library", "library_alive", "device_keyset", "lookup_op"]


def registered_ops() -> list[str]:
    """Every op in the dispatcher, as ``ns::name`` or ``ns::name.overload``."""
    import torch

    return list(torch._C._dispatch_get_all_op_names())


def has_kernel(op: str, key: str) -> bool:
    """Whether the dispatcher has a kernel for ``op`` registered directly at ``key``."""
    import torch

    try:
        return bool(torch._C._dispatch_has_kernel_for_dispatch_key(op, key))
    except RuntimeError:
        return False


def op_schema(op: str) -> str | None:
    """The schema the dispatcher holds for ``op`` (``ns::name[.overload]``), or ``None``."""
    import torch

    name, _, overload = op.partition(".")
    try:
        return str(torch._C._get_schema(name, overload))
    except RuntimeError:
        return None


def kernel_registrations(op: str) -> dict[str, str]:
    """Dispatch key -> where its kernel was registered (``file:line``), for ``op``.

    Read from ``torch._C._dispatch_dump``, the dispatcher's own debug text:
    it lists every key with a kernel registered directly (alias keys such as
    ``Autograd`` included, written ``Autograd[alias]``), which is what
    ``opregistry list --live`` shows.  Fallbacks are not listed.
    """
    import re

    import torch

    try:
        dump = torch._C._dispatch_dump(op)
    except RuntimeError:
        return {}
    found: dict[str, str] = {}
    for line in dump.splitlines():
        match = re.match(r"(\w+)(?:\[alias\])?: registered at (.*?)(?: :: .*)?$", line)
        if match and match.group(1) not in ("debug", "schema", "name"):
            found[match.group(1)] = match.group(2).strip()
    return found


def python_kernels() -> frozenset[str]:
    """Kernels registered from Python with ``Library.impl``, as ``"ns/name.overload/KEY"``.

    ``torch.library._impls`` (private) is the only record of Python code adding
    a kernel to an existing op -- a plugin replacing ``aten::add`` at import,
    outside opregistry.  Call it only when torch is imported.
    """
    import torch.library

    return frozenset(getattr(torch.library, "_impls", ()))


def destroy_library(library: Any) -> None:
    """Unregister everything ``library`` registered (``Library._destroy``; no public API)."""
    library._destroy()


def library_alive(library: Any) -> bool:
    """Whether ``library`` still holds its registrations (not destroyed)."""
    return getattr(library, "m", None) is not None


def device_keyset(device_type: str) -> Any:
    """The ``DispatchKeySet`` of a device type (``"cuda"`` -> ``{CUDA}``), to redispatch to."""
    import torch

    key = torch._C._dispatch_key_for_device(device_type)
    return torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, key))


def lookup_op(qualname: str) -> Any:
    """The ``OpOverload`` for ``ns::name`` or ``ns::name.overload``."""
    import torch._library.utils

    return torch._library.utils.lookup_op(qualname)


def snapshot(mine: Iterable[str] = ()) -> TorchState:
    """The dispatcher's ops and namespaces, less ``mine`` (the ops opregistry registered)."""
    import torch

    mine = frozenset(mine)
    ops = frozenset(op for op in registered_ops() if op not in mine)
    namespaces = frozenset(op.split("::", 1)[0] for op in ops)
    tags = frozenset(name for name in dir(torch.Tag) if not name.startswith("_")) - {"name", "value"}
    return TorchState(ops=ops, namespaces=namespaces, has_kernel=has_kernel, tags=tags)
