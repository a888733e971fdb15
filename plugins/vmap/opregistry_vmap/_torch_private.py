"""Every private torch API the vmap backend relies on, in one place.

``torch.library.register_vmap`` looks the op up as a ``torch.ops`` overload
at registration (building its ``OpOverloadPacket``, ~30 us per op) only to
hand it to the rule's wrapper.  :func:`register_vmap_rule` registers the same
``FuncTorchBatched`` wrapper, calling the same
``custom_function_call_vmap_helper``, and looks the overload up on the
rule's first call instead.  ``tests/test_backends.py`` checks each API used
here, so that a torch release that changes one fails loudly there.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch._functorch.autograd_function import custom_function_call_vmap_helper
from torch._functorch.pyfunctorch import retrieve_current_functorch_interpreter
from torch._library.utils import lookup_op

__all__ = ["register_vmap_rule"]


class _VmapRule:
    """The ``FuncTorchBatched`` kernel of one op: ``register_vmap``'s wrapper, as one object.

    A callable instance instead of a closure: one tracked object per op instead
    of a function, its closure tuple and three cells (at 10,000 ops each object
    an op keeps alive costs at every full collection and at exit).
    """

    __slots__ = ("qualname", "fn", "overload")

    def __init__(self, qualname: str, fn: Callable[..., Any]) -> None:
        self.qualname = qualname
        self.fn = fn
        self.overload: Any = None

    def __call__(self, keyset: Any, *args: Any, **kwargs: Any) -> Any:
        if self.overload is None:
            self.overload = lookup_op(self.qualname)
        interpreter = retrieve_current_functorch_interpreter()
        return custom_function_call_vmap_helper(interpreter, self.fn, self.overload,
                                                *args, **kwargs)

    def __repr__(self) -> str:
        return f"<vmap rule of {self.qualname}: {self.fn!r}>"


def register_vmap_rule(library: Any, qualname: str, name: str, fn: Callable[..., Any]) -> None:
    """``torch.library.register_vmap(qualname, fn, lib=library)``, minus the eager op lookup.

    ``name`` is the op's name (with overload) inside ``library``'s namespace.
    The caller has checked what ``register_vmap`` checks (no keyword-only
    tensor arguments; opregistry's resolver refuses those).
    """
    library.impl(name, _VmapRule(qualname, fn), "FuncTorchBatched", with_keyset=True)


def _check() -> None:
    """Fail at import if torch changed the helper's signature (clear message)."""
    import inspect

    params = list(inspect.signature(custom_function_call_vmap_helper).parameters)
    if params[:3] != ["interpreter", "vmap_function", "op"]:
        raise ImportError(
            f"opregistry-vmap does not support torch {torch.__version__}: "
            f"custom_function_call_vmap_helper takes {params}; upgrade opregistry-vmap")


_check()
