"""Building blocks for backend authors.

A backend is any object implementing the backend hooks of
:mod:`opregistry.hookspecs`.  :class:`DeviceBackend` implements them for the
common case — one device dispatch key whose kernels are registered with
``Library.impl`` — so that ``opregistry-cpu``, ``opregistry-cuda`` and an
out-of-tree device (``PrivateUse1``, ``XPU``) are each a few lines::

    backend = DeviceBackend("npu", key="PrivateUse1", device_type="npu",
                            available=lambda: importlib.util.find_spec("torch_npu") is not None)

and an entry point ``npu = my_backend:backend`` in ``opregistry.backends``.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

from .errors import DeclarationError
from .hookspecs import hookimpl
from .keys import COMPOSITE_KEYS, DEVICE_KEYS, canonical_key
from .kinds import TritonKernel
from .model import Backend, Kernel
from .state import process
from .torch_state import (eager_triton, enable_fast_dispatch, functional_tensor_mode, library_alive,
                          traceable_tensor_type, triton_decomposition_disabled)

__all__ = ["DeviceBackend", "op_name", "device_kernel", "triton_kernel", "eager_triton",
           "enable_fast_dispatch", "deferred_import"]


def deferred_import(module: str) -> Callable[[], Any]:
    """A function that returns ``module``, imported the first time it is called.

    For a backend's materialize hook: a backend is loaded without torch
    (``opregistry list``), so the module of its torch calls is imported at
    the first registration; an import statement inside the hook would cost
    a few microseconds at each of thousands of registrations, at ``import torch``.
    """
    found: list[Any] = []

    def get() -> Any:
        if not found:
            import importlib

            found.append(importlib.import_module(module))
        return found[0]

    return get


def device_kernel(qualname: str, key: str) -> tuple[Any, Callable[..., Any]] | None:
    """``(library, fn)`` of the live kernel a DeviceBackend registered for ``qualname`` on ``key``.

    ``qualname`` is ``ns::name`` or ``ns::name.overload``; ``None`` when no
    DeviceBackend registered one or its ``Library`` has been destroyed.
    """
    table = process().device_kernels
    found = (qualname, key)
    entry = table.get(found)
    if entry is None and "." not in qualname.split("::", 1)[-1]:
        found = (f"{qualname}.default", key)
        entry = table.get(found)
    if entry is None and key in DEVICE_KEYS:
        # no kernel of its own for this device: torch runs the op's
        # CompositeExplicitAutograd kernel there, if it has one
        return device_kernel(qualname, COMPOSITE_KEYS[0])
    if entry is None:
        return None
    library = entry[0]()
    if library is None or not library_alive(library):  # its Library was destroyed: forget it
        table.pop(found, None)
        return None
    return library, entry[1]


def op_name(kernel: Kernel) -> str:
    """The op as ``Library.impl`` wants it: ``name.overload``, without namespace."""
    return kernel.op.split("::", 1)[1]


class DeviceBackend:
    """A backend that registers device kernels for one dispatch key.

    :param name: the backend's name in listings (``"cuda"``).
    :param key: the device dispatch key (``"CUDA"``, ``"PrivateUse1"``).
    :param device_type: the ``torch.device`` type (``"cuda"``); default:
        torch's type for ``key`` (``"privateuseone"`` for ``PrivateUse1``).
    :param available: called once per load; must not import torch unless
        torch is already imported.  Default: always available.
    :param composite: also serve ``CompositeExplicitAutograd`` and
        ``CompositeImplicitAutograd``, the kernels for every device
        (``opregistry-cpu`` does; they are registered the same way).
    :raises DeclarationError: ``key`` is not a device key: fake kernels,
        autograd and vmap rules are not registered with ``Library.impl``
        alone, and have backends of their own.
    """

    def __init__(self, name: str, *, key: str, device_type: str | None = None,
                 available: Callable[[], bool] | None = None, description: str = "",
                 composite: bool = False) -> None:
        canonical = canonical_key(key)
        if canonical not in DEVICE_KEYS:
            raise DeclarationError(
                f"DeviceBackend {name!r}: {key!r} is not a device dispatch key "
                f"(one of {', '.join(sorted(DEVICE_KEYS))}); fake kernels, autograd and vmap "
                f"rules are served by opregistry-meta, -autograd and -vmap")
        self.record = Backend(name=name, keys=(canonical, *(COMPOSITE_KEYS if composite else ())),
                              device_type=device_type or DEVICE_KEYS[canonical],
                              description=description)
        self._available = available

    def __repr__(self) -> str:
        return f"<DeviceBackend {self.record.name} {self.record.keys[0]}>"

    @hookimpl
    def opregistry_backends(self) -> list[Backend]:
        return [self.record]

    @hookimpl
    def opregistry_backend_available(self, backend: Backend) -> bool:
        return True if self._available is None else bool(self._available())

    @hookimpl
    def opregistry_materialize_kernel(self, library: Any, kernel: Kernel,
                                      fn: Callable[..., Any]) -> bool:
        if isinstance(kernel.payload, TritonKernel):
            fn = triton_kernel(library, kernel, fn, self.record.device_type or "")
        # the resolver decided what may replace what (rule 5); torch 2.8-2.12 would
        # refuse to replace a Python kernel without this, 2.13+ allows it by default
        library.impl(op_name(kernel), fn, kernel.key, allow_override=True)
        process().device_kernels[(kernel.op, kernel.key)] = (weakref.ref(library), fn)
        return True


def triton_kernel(library: Any, kernel: Kernel, fn: Callable[..., Any],
                  device_type: str) -> Callable[..., Any]:
    """Register what ``torch.library.triton_op`` registers besides the kernel; return the kernel.

    ``fn`` launches Triton kernels through ``torch.library.wrap_triton``.  As
    with ``triton_op``:

    * the device kernel calls ``fn`` with ``wrap_triton`` switched off (real
      tensors need no tracing; the higher-order op costs ~1 ms a call);
    * the op gets a ``torch_dispatch`` rule for ``FunctionalTensorMode`` that
      runs ``fn`` itself, so ``torch.compile`` (AOTDispatcher) traces into the
      Triton kernels, which Inductor can then optimize.  ``torch.export``
      keeps the op whole (torch disables the decomposition there).

    Under ``TRITON_INTERPRET=1`` (Triton's CPU interpreter) ``wrap_triton``
    returns the kernel unwrapped, so nothing can be traced into it: the rule
    then leaves the op whole, and ``torch.compile`` / ``torch.export`` use the
    op's fake kernel instead.  One rule per op and library: the resolver
    refuses Triton kernels of one op from two distributions (``triton-split``).
    """
    import os

    tables = process().triton_kernels.setdefault(library, {})
    table = tables.get(kernel.op)
    if table is None:
        table = tables[kernel.op] = {}
        _register_decomposition(library, kernel.op, table, os.environ)
    table[device_type] = fn

    return eager_triton(fn)


def _register_decomposition(library: Any, qualname: str, table: dict[str, Callable[..., Any]],
                            environ: Any) -> None:
    """The op's FunctionalTensorMode rule: run its Triton kernel function under the mode."""
    import torch
    import torch.library

    def functional_decomposition(mode: Any, op: Any, types: Any, args: Any, kwargs: Any) -> Any:
        device = next((a.device.type for a in (*args, *kwargs.values())
                       if isinstance(a, torch.Tensor)), None)
        fn = table.get(device) if device is not None else None
        if (fn is None or triton_decomposition_disabled()
                or environ.get("TRITON_INTERPRET") == "1"):
            return mode.__torch_dispatch__(op, types, args, kwargs)  # the op stays whole
        if any(not traceable_tensor_type(t) for t in types):
            return NotImplemented
        with mode:
            return fn(*args, **kwargs)

    torch.library.register_torch_dispatch(qualname, functional_tensor_mode(),
                                          functional_decomposition, lib=library)
