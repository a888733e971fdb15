"""Every private torch API the meta backend relies on, in one place.

``torch.library.register_fake`` costs 50-100 us per op at registration, most
of it spent inspecting the caller's frame and source file (to record "where
was this registered") and wrapping the kernel in a check that only matters
for ops defined in C++.  For an op opregistry itself defined in Python,
:func:`register_fake_kernel` performs the same registration -- the same
``FakeImplHolder`` entry FakeTensor, ``torch.compile``, ``torch.export`` and
``get_ctx()`` read, the same ``Meta`` kernel, the same handle that
``Library._destroy`` deregisters -- with the source line opregistry already
recorded.  ``tests/test_backends.py`` checks each API used here, so that a
torch release that changes one fails loudly there.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch._library import fake_impl as _fake_impl
from torch._library import simple_registry as _simple_registry

__all__ = ["register_fake_kernel", "fake_kernel_of", "PRIVATE_REGISTER", "PRIVATE_GET"]


def _accepts_lib(method: Any) -> bool:
    """Whether ``FakeImplHolder.register`` takes the ``lib`` it ties its Meta kernel to (torch >= 2.8)."""
    import inspect

    try:
        return "lib" in inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False


_singleton: Any = getattr(_simple_registry, "singleton", None)
#: torch >= 2.8: ``FakeImplHolder.register(func, source, lib, *, allow_override=...)``
#: registers the Meta kernel on ``lib`` itself; older ones take ``(func, source)``.
PRIVATE_REGISTER: bool = (
    callable(getattr(_singleton, "find", None))
    and _accepts_lib(getattr(getattr(_fake_impl, "FakeImplHolder", None), "register", None))
)
#: torch >= 2.13: ``SimpleLibraryRegistry.get`` (a lookup that creates no entry)
PRIVATE_GET: bool = callable(getattr(_singleton, "get", None))


def register_fake_kernel(library: Any, qualname: str, fn: Callable[..., Any], source: str) -> None:
    """``torch.library.register_fake(qualname, fn, lib=library)`` for an op defined in Python.

    What the public function adds on top, and why it is not needed here:
    the caller's source line (``source`` is the kernel's declaration
    instead), and ``_check_pystubs_once``, which only checks ops defined in
    C++ (for an op defined in Python it returns at its first call).

    On a torch whose ``FakeImplHolder.register`` does not take ``lib``, this
    is the public ``register_fake`` (same registration; torch records the
    caller's line instead of ``source``).
    """
    if not PRIVATE_REGISTER:
        torch.library.register_fake(qualname, fn, lib=library)
        return
    entry = _singleton.find(qualname)
    handle = entry.fake_impl.register(fn, source, lib=library)
    library._registration_handles.append(handle)


def fake_kernel_of(qualname: str) -> Any:
    """The fake kernel torch's registry holds for ``qualname`` (``None`` if none): for tests."""
    if PRIVATE_GET:
        entry = _singleton.get(qualname)
    else:  # torch < 2.13: the registry's dict, read without creating an entry
        entry = getattr(_singleton, "_data", {}).get(qualname)
    return None if entry is None else entry.fake_impl.kernel


def _check() -> None:
    """Fail at import if torch moved what no fallback covers (clear message, not a deep traceback).

    Names are not enough: torch 2.7's ``FakeImplHolder.register`` exists but
    takes no ``lib`` (that case uses the public ``register_fake``).
    """
    missing = [name for name, ok in (
        ("torch.library.register_fake(..., lib=)",
         PRIVATE_REGISTER or _accepts_lib(getattr(torch.library, "register_fake", None))),
    ) if not ok]
    if missing:
        raise ImportError(
            f"opregistry-meta does not support torch {torch.__version__}: it lacks "
            f"{', '.join(missing)}; upgrade opregistry-meta")


_check()
