"""The Autograd kernel: ``register_autograd`` semantics at ``Library.impl`` cost.

torch's ``register_autograd`` registers, per op, a Python kernel for the
``Autograd`` key that on *every* call checks the op's tags, builds a
``Metadata`` dataclass, enters ``_AutoDispatchBelowAutograd`` and redispatches
through the dispatcher's boxed Python path, even when nothing requires grad.
This kernel does the same job with less work per call:

* **no input requires grad** (or grad mode is off): the kernel calls the
  device kernel registered by an opregistry device backend *directly* (a
  Python-to-Python call), when the keyset says that device key is the next
  one torch would run.  For any other keyset (FakeTensor, functionalization,
  a ``TorchDispatchMode``, a conjugate view...) it redispatches below
  Autograd exactly as torch does.  The decision is cached per keyset.
* **an input requires grad**: an ``autograd.Function`` built once per op (on
  the first such call, so registration stays cheap) runs the op below
  Autograd, calls ``setup_context(ctx, inputs, output)`` and, in backward,
  the op's ``backward(ctx, *grads)``; a differentiable backward gives
  higher-order gradients, as with torch's own.
* ``inference_mode`` never reaches this kernel (torch skips Autograd there).

One difference from torch's kernel, on the no-grad path only: the device
kernel runs with autograd still enabled.  No input requires grad, so nothing
is recorded; a kernel that reads a *global* tensor requiring grad would see
its result tracked, where torch's path would not.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from . import _torch_private as tp

__all__ = ["make_autograd_kernel", "DeviceKernelLookup"]

#: ``(qualname, dispatch_key) -> (library, fn)`` of a live device kernel, or ``None``
DeviceKernelLookup = Callable[[str, str], "tuple[Any, Callable[..., Any]] | None"]


class _Pending(threading.local):
    """Per thread, the ``(keyset, kwargs)`` of the calls whose forward is about to run.

    ``autograd.Function.apply`` takes only the op's inputs, so that
    ``ctx.needs_input_grad`` and backward's return value are exactly the
    user's (no extra argument to hide, as torch's own kernel must); forward
    reads the rest from the top of this stack.  Forward runs synchronously
    inside ``apply`` on the same thread, and a nested call pushes and pops
    its own entry, so the top is always the caller's.
    """

    def __init__(self) -> None:
        self.stack: list[tuple[Any, dict[str, Any]]] = []


_pending = _Pending()


def _fresh(default: Any) -> Any:
    """A default value as the schema would give it: a new list each time."""
    return list(default) if isinstance(default, list) else default


class _Op:
    """Everything one op's Autograd kernel needs besides its hot path: one object, not ~14 cells.

    At 10,000 ops every object an op keeps alive costs twice more: at each
    full collection of the program and at the interpreter's exit.  The hot
    path reads only ``fast`` (a closure cell) and the module's globals.
    """

    __slots__ = ("qualname", "backward", "setup_context", "device_kernel", "handle",
                 "enable_fast", "fast", "apply")

    def __init__(self, qualname: str, backward: Callable[..., Any],
                 setup_context: Callable[..., Any] | None, device_kernel: DeviceKernelLookup,
                 handle: Any, enable_fast: Callable[[str], bool] | None) -> None:
        self.qualname = qualname
        self.backward = backward
        self.setup_context = setup_context
        self.device_kernel = device_kernel
        self.handle = handle
        # called once, then cleared: see _below
        self.enable_fast = enable_fast
        # keyset id -> (library, device fn) for the direct call, or False: redispatch
        self.fast: dict[int, Any] = {}
        # the autograd.Function's apply, built on the first grad-requiring call:
        # 1,000 ops are registered at ``import torch``, and most never see one
        self.apply: Any = None


def make_autograd_kernel(
    qualname: str,
    backward: Callable[..., Any],
    setup_context: Callable[..., Any] | None,
    device_kernel: DeviceKernelLookup,
    handle: Any = None,
    enable_fast: Callable[[str], bool] | None = None,
) -> Callable[..., Any]:
    """Build the ``with_keyset=True`` Autograd kernel of the op ``qualname``.

    :param handle: the op's dispatcher handle, when the caller already has it.
    :param enable_fast: called with ``qualname`` once, the first time a call
        takes the direct path (plain eager tensors): switches the op to torch's
        PyObject dispatch where torch has it (``opregistry.backend.enable_fast_dispatch``).
        Lazily, because building the ``OpOverload`` costs ~0.2 ms per op, too
        much for 1,000 ops at ``import torch``.
    """
    op = _Op(qualname, backward, setup_context, device_kernel,
             tp.op_handle(qualname) if handle is None else handle, enable_fast)
    fast = op.fast

    def autograd_kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        if _grad_enabled() and _any_requires_grad(*args):
            return _with_grad(op, keyset, args, kwargs)
        # hot path: one dict lookup, one liveness check, one Python call
        entry = fast.get(keyset.raw_repr())
        if entry and entry[0].m is not None:
            return entry[1](*args, **kwargs)
        return _below(op, keyset, args, kwargs)

    autograd_kernel.__qualname__ = autograd_kernel.__name__ = f"autograd_kernel[{qualname}]"
    return autograd_kernel


_grad_enabled = tp.grad_enabled
_any_requires_grad = tp.any_requires_grad


def _below(op: _Op, keyset: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run the op below Autograd: the device kernel itself, or a redispatch."""
    ident = keyset.raw_repr()
    fast = op.fast
    entry = fast.get(ident)
    if entry is None or (entry and not tp.library_alive(entry[0])):
        entry = fast[ident] = op.device_kernel(
            op.qualname, tp.first_key_after_autograd(keyset)) or False
        if entry and op.enable_fast is not None:
            enable, op.enable_fast = op.enable_fast, None
            enable(op.qualname)  # idempotent, never raises
    if entry:
        return entry[1](*args, **kwargs)
    with tp.below_autograd():
        return op.handle.redispatch_boxed(keyset & tp.AFTER_AUTOGRAD, *args, **kwargs)


def _with_grad(op: _Op, keyset: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A call with an input requiring grad: through the op's ``autograd.Function``."""
    apply = op.apply if op.apply is not None else _build(op)
    stack = _pending.stack
    stack.append((keyset, kwargs))
    try:
        return apply(*args)
    finally:
        stack.pop()


def _build(op: _Op) -> Any:
    """Build the op's ``autograd.Function``; set and return its apply."""
    import torch

    schema = op.handle.schema()
    setup_context = op.setup_context
    fast = op.fast
    n_positional = sum(1 for a in schema.arguments if not a.kwarg_only)
    n_kwarg_only = len(schema.arguments) - n_positional
    has_kwarg_only = n_kwarg_only > 0
    defaults: list[tuple[tuple[str, bool, Any], ...]] = []

    def with_defaults(args: tuple[Any, ...], kwargs: dict[str, Any]
                      ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """``fill_defaults``, from defaults read once: reading ``default_value`` off
        the schema costs ~5 us per argument, every call, in torch's version."""
        if not defaults:
            defaults.append(tuple((a.name, a.kwarg_only, a.default_value)
                                  for a in schema.arguments))
        filled = list(args)
        new_kwargs = {}
        for i, (name, kwarg_only, default) in enumerate(defaults[0]):
            if kwarg_only:
                value = kwargs[name] if name in kwargs else _fresh(default)
                new_kwargs[name] = value
            elif i >= len(args):
                filled.append(_fresh(default))
        return tuple(filled), new_kwargs

    def forward(ctx: Any, *args: Any) -> Any:
        # autograd.Function runs forward with grad mode off, so the direct call
        # records nothing; only a redispatch needs the below-autograd guard
        keyset, kwargs = _pending.stack[-1]
        entry = fast.get(keyset.raw_repr())
        if entry and entry[0].m is not None:
            result = entry[1](*args, **kwargs)
        else:
            result = _below(op, keyset, args, kwargs)
        if setup_context is not None:
            # the dispatcher drops arguments equal to their defaults; put them back
            if len(args) < n_positional or len(kwargs) < n_kwarg_only:
                args, kwargs = with_defaults(args, kwargs)
            if has_kwarg_only:
                setup_context(ctx=ctx, inputs=args, keyword_only_inputs=kwargs, output=result)
            else:
                setup_context(ctx=ctx, inputs=args, output=result)
        return result

    generated: Any = type(
        "OpregistryAutograd_" + op.qualname.replace("::", "_").replace(".", "_"),
        (torch.autograd.Function,),
        {"forward": staticmethod(forward), "backward": staticmethod(op.backward)},
    )
    if tp.has_tensorlist(schema):
        op.apply = tp.supports_tensorlist(generated).apply
    else:
        op.apply = tp.function_apply(generated)
    return op.apply
