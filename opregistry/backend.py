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

from typing import Any, Callable

from .errors import DeclarationError
from .hookspecs import hookimpl
from .keys import DEVICE_KEYS, canonical_key
from .model import Backend, Kernel
from .torch_state import enable_fast_dispatch, library_alive

__all__ = ["DeviceBackend", "op_name", "device_kernel", "enable_fast_dispatch"]

#: ``(qualname, key) -> (library, fn)``: the device kernels DeviceBackends
#: registered.  The autograd backend calls them directly when nothing requires
#: grad, instead of a second trip through the dispatcher (see
#: ``opregistry_autograd.kernel``); the library tells whether it is still live.
_device_kernels: dict[tuple[str, str], tuple[Any, Callable[..., Any]]] = {}


def device_kernel(qualname: str, key: str) -> tuple[Any, Callable[..., Any]] | None:
    """``(library, fn)`` of the live kernel a DeviceBackend registered for ``qualname`` on ``key``.

    ``qualname`` is ``ns::name`` or ``ns::name.overload``; ``None`` when no
    DeviceBackend registered one or its ``Library`` has been destroyed.
    """
    found = (qualname, key)
    entry = _device_kernels.get(found)
    if entry is None and "." not in qualname.split("::", 1)[-1]:
        found = (f"{qualname}.default", key)
        entry = _device_kernels.get(found)
    if entry is None:
        return None
    if not library_alive(entry[0]):  # its Library was destroyed: forget it
        _device_kernels.pop(found, None)
        return None
    return entry


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
    :raises DeclarationError: ``key`` is not a device key: fake kernels,
        autograd and vmap rules are not registered with ``Library.impl``
        alone, and have backends of their own.
    """

    def __init__(self, name: str, *, key: str, device_type: str | None = None,
                 available: Callable[[], bool] | None = None, description: str = "") -> None:
        canonical = canonical_key(key)
        if canonical not in DEVICE_KEYS:
            raise DeclarationError(
                f"DeviceBackend {name!r}: {key!r} is not a device dispatch key "
                f"(one of {', '.join(sorted(DEVICE_KEYS))}); fake kernels, autograd and vmap "
                f"rules are served by opregistry-meta, -autograd and -vmap")
        self.record = Backend(name=name, keys=(canonical,),
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
        # the resolver decided what may replace what (rule 5); torch 2.8-2.12 would
        # refuse to replace a Python kernel without this, 2.13+ allows it by default
        library.impl(op_name(kernel), fn, kernel.key, allow_override=True)
        _device_kernels[(kernel.op, kernel.key)] = (library, fn)
        return True
