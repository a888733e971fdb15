"""Every private torch API the autograd backend relies on, in one place.

These buy the fast path its speed; ``tests/test_autograd_backend.py`` checks
each of them, so that a torch release that changes one fails loudly there
instead of silently slowing down (or breaking) every op.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import _C
from torch._functorch import utils as _functorch_utils
from torch._library import autograd as _library_autograd
from torch._library import utils as _library_utils

__all__ = [
    "AFTER_AUTOGRAD",
    "below_autograd",
    "any_requires_grad",
    "grad_enabled",
    "keyset_id",
    "first_key_after_autograd",
    "library_alive",
    "lookup_op",
    "supports_tensorlist",
    "has_tensorlist",
    "has_kwarg_only_tensors",
    "function_apply",
    "op_handle",
]

#: the keys below Autograd; ``keyset & AFTER_AUTOGRAD`` is what torch's own
#: register_autograd kernel redispatches to
AFTER_AUTOGRAD: Any = _C._after_autograd_keyset
#: context manager that excludes the autograd keys (what torch runs kernels under)
below_autograd: Callable[[], Any] = _C._AutoDispatchBelowAutograd


def _py_any_requires_grad(*args: Any) -> bool:
    """What ``_C._any_requires_grad`` computes, in Python (torch < 2.8 has no C++ one).

    A tensor argument, or a tensor inside a list argument (a ``Tensor[]``);
    like the C++ function, it does not look inside tuples.
    """
    tensor = torch.Tensor
    for a in args:
        if isinstance(a, tensor):
            if a.requires_grad:
                return True
        elif isinstance(a, list):
            for t in a:
                if isinstance(t, tensor) and t.requires_grad:
                    return True
    return False


#: C++ "does any of these tensors (or tensor lists) require grad" (torch >= 2.8)
NATIVE_ANY_REQUIRES_GRAD: bool = callable(getattr(_C, "_any_requires_grad", None))
any_requires_grad: Callable[..., bool] = (
    _C._any_requires_grad if NATIVE_ANY_REQUIRES_GRAD else _py_any_requires_grad)
grad_enabled: Callable[[], bool] = _C.is_grad_enabled
lookup_op: Callable[[str], Any] = _library_utils.lookup_op
supports_tensorlist: Callable[[type], type] = _library_autograd.supports_tensorlist
has_kwarg_only_tensors: Callable[[Any], bool] = _library_utils.has_kwarg_only_tensors


def function_apply(function: type) -> Callable[..., Any]:
    """``function.apply`` without the Python-level ``Function.apply`` wrapper, when it may.

    ``torch.autograd.Function.apply`` checks for a ``setup_context``
    staticmethod (ours has none) and for functorch transforms; outside a
    transform it unwraps dead functorch wrappers and calls the C++ apply.
    This does the same, minus the ``inspect``-based checks it does not need.
    """
    c_apply = super(torch.autograd.Function, function).apply  # type: ignore[misc]
    py_apply = function.apply  # type: ignore[attr-defined]
    transforms_active = _C._are_functorch_transforms_active
    unwrap_dead = _functorch_utils.unwrap_dead_wrappers

    def apply(*args: Any) -> Any:
        if transforms_active():
            return py_apply(*args)
        return c_apply(*unwrap_dead(args))

    return apply


def op_handle(qualname: str) -> Any:
    """The dispatcher's handle of ``ns::name[.overload]``: ``.schema()`` and ``.redispatch_boxed``.

    Much cheaper than ``torch.ops.ns.name.overload`` (no ``OpOverloadPacket``
    built), which matters when 1,000 ops are registered at ``import torch``.
    """
    name, _, overload = qualname.partition(".")
    return _C._dispatch_find_schema_or_throw(name, overload)


def keyset_id(keyset: Any) -> int:
    """A hashable identity of a ``DispatchKeySet`` (its 64-bit representation)."""
    return keyset.raw_repr()


def first_key_after_autograd(keyset: Any) -> str:
    """Name of the dispatch key torch would run after Autograd for ``keyset``.

    ``"CPU"`` for a plain CPU tensor; ``"Python"``, ``"Functionalize"``,
    ``"Conjugate"``... when a mode, subclass or view bit has to run first.
    """
    return (keyset & AFTER_AUTOGRAD).highestPriorityTypeId().name


def library_alive(library: Any) -> bool:
    """Whether a ``torch.library.Library`` has not been destroyed."""
    return library.m is not None


def has_tensorlist(schema: Any) -> bool:
    """Whether an argument or return is a ``Tensor[]``-like list (needs pytree handling)."""
    return any(_library_utils.is_tensorlist_like_type(a.type)
               for a in (*schema.arguments, *schema.returns))


def _takes(function: Any, *names: str) -> bool:
    """Whether ``function``'s signature has parameters named ``names`` (not only the name exists)."""
    import inspect

    try:
        return set(names) <= set(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return False


def _check() -> None:
    """Fail at import if torch moved one of the above (clear message, not a deep traceback)."""
    missing = [name for name, ok in (
        ("torch._library.utils.lookup_op(qualname)", _takes(lookup_op, "qualname")),
        ("torch._library.utils.is_tensorlist_like_type(typ)",
         _takes(_library_utils.is_tensorlist_like_type, "typ")),
        ("torch._library.autograd.supports_tensorlist(cls)",
         _takes(supports_tensorlist, "cls")),
        ("torch._C._after_autograd_keyset", isinstance(AFTER_AUTOGRAD, _C.DispatchKeySet)),
        ("DispatchKeySet.raw_repr", hasattr(_C.DispatchKeySet, "raw_repr")),
        ("DispatchKeySet.highestPriorityTypeId", hasattr(_C.DispatchKeySet, "highestPriorityTypeId")),
    ) if not ok]
    if missing:
        raise ImportError(
            f"opregistry-autograd does not support torch {torch.__version__}: it lacks "
            f"{', '.join(missing)}; upgrade opregistry-autograd")


_check()
