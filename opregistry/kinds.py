"""Registration kinds: a small frozen payload per kind, and the descriptor that owns its behaviour.

A :class:`~opregistry.model.Kernel` says which op and dispatch key it serves,
who declared it and under which conditions; its ``payload`` says *what* is
registered there.  Each kind of registration is one payload class and one
:class:`Kind` descriptor (the payload's ``kind`` class attribute), which
owns everything opregistry does differently for that kind:

* its declaration checks (which keys it may serve, what its fields must be),
* the schema-fit rule the resolver applies (torch would refuse an autograd
  formula for a mutable op),
* the references it imports when it is materialized,
* its fields in listings, JSON and the lock (:func:`kernel_fields`, the one
  serializer), and
* which backend materializes it (the key family it is served under).

============== ===================================== =================================
kind           payload                               keys
============== ===================================== =================================
device         :class:`DeviceKernel` ``(fn)``        device keys, composite keys
fake           :class:`FakeKernel` ``(fn)``          ``Meta``
autograd       :class:`AutogradFormula`              ``Autograd``
vmap           :class:`VmapRule` ``(fn)``            ``FuncTorchBatched``
autocast       :class:`AutocastRule` ``(dtype)``     ``Autocast<Device>``
triton         :class:`TritonKernel` ``(fn)``        device keys
torch_dispatch :class:`DispatchRule` ``(fn, cls)``   ``TorchDispatch[module:Class]``
native         :class:`NativeKernel`                 any; its C++ library registers it
============== ===================================== =================================

A new kind is a payload class and a descriptor, defined anywhere -- in the
distribution of the backend that registers it -- without a change to the
core (``docs/architecture.md`` shows one).  Nothing here imports torch.
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

from attrs import field, frozen

from . import keys as _keys
from .errors import DeclarationError
from .references import KernelRef, NativeLibrary, check_ref, describe_ref

__all__ = [
    "Kind",
    "Misfit",
    "DeviceKernel",
    "FakeKernel",
    "AutogradFormula",
    "VmapRule",
    "AutocastRule",
    "autocast_dtype",
    "TritonKernel",
    "DispatchRule",
    "NativeKernel",
    "BUILTIN_KINDS",
    "payload_for",
    "kernel_fields",
]


class Misfit(NamedTuple):
    """Why a registration does not fit its op's schema: torch would refuse it."""

    code: str
    what: str      # "autograd", "a vmap rule"
    why: str       # the schema's own words
    api: str       # the torch API that would refuse it
    verdict: str   # "refuses such ops"
    fix: str       # the hint


class Kind:
    """What opregistry does with one kind of registration; subclass it for a new kind.

    Attach an instance to the payload class as its ``kind`` class attribute.
    Every method has a default that suits a plain function registered at a
    torch dispatch key; override what differs.
    """

    #: the kind's name in listings, JSON and the lock
    name: ClassVar[str] = ""
    #: the payload fields holding references, imported when it is materialized, each with
    #: what it must import as: ``"callable"``, ``"class"`` or ``"object"`` (an autocast dtype)
    references: ClassVar[tuple[tuple[str, str], ...]] = (("fn", "callable"),)
    #: the payload field listings show as "the kernel"
    primary: ClassVar[str] = "fn"
    #: whether a kernel of this kind may be a candidate (``when=``, ``predicate=``, ``priority=``)
    candidates: ClassVar[bool] = False
    #: ``False`` for a kind no backend registers (a C++ kernel: its library does)
    by_backend: ClassVar[bool] = True
    #: whether torch calls it with the op's arguments, so that its calls can be counted
    countable: ClassVar[bool] = False
    #: ``"module:function"`` turning the imported payload into the callable a chain of
    #: candidates calls (``None``: the payload's primary reference itself)
    candidate_adapter: ClassVar[str | None] = None
    #: Python distributions its kernels need at run time besides their backend
    requires: ClassVar[tuple[str, ...]] = ()

    def accepts(self, key: str) -> bool:
        """Whether a kernel of this kind may be declared for ``key`` (canonical)."""
        return key in _keys.DEVICE_KEYS or key in _keys.COMPOSITE_KEYS

    def wrong_key(self, op: str, key: str) -> str:
        """The message for a kernel of this kind declared for a key it cannot serve."""
        return (f"kernel for {op}: a {self.name} registration cannot serve the dispatch key "
                f"{key!r}")

    def check(self, kernel: Any) -> None:
        """Further declaration checks on ``kernel``; raise :class:`DeclarationError`."""

    def family(self, key: str) -> str:
        """The key whose backend registers this kind's kernels for ``key``."""
        return _keys.family(key)

    def fit(self, schema: Any, tags: tuple[str, ...]) -> Misfit | None:
        """Why torch would refuse this kind for an op with ``schema`` and ``tags``, or ``None``."""
        return None

    def fields(self, payload: Any) -> dict[str, Any]:
        """The payload's own fields in listings, JSON and the lock (``details``), as plain data.

        Beyond what every kind shows: its name, its primary reference and a
        ``setup_context``.
        """
        return {}

    def provider(self, key: str) -> str:
        """What to install so that a kernel of this kind for ``key`` is registered."""
        return _keys.provider_hint(key)

    def __repr__(self) -> str:
        return f"<kind {self.name}>"


# -- the built-in kinds ------------------------------------------------------------------


class _DeviceKind(Kind):
    name = "device"
    candidates = True
    countable = True


@frozen
class DeviceKernel:
    """A function registered for a device key (or for every device, a composite key)."""

    fn: KernelRef = field(validator=check_ref)
    kind: ClassVar[Kind] = _DeviceKind()


class _OneKeyKind(Kind):
    """A kind with exactly one key (fake: ``Meta``, autograd: ``Autograd``, vmap: ...)."""

    key: ClassVar[str] = ""

    def accepts(self, key: str) -> bool:
        return key == self.key


class _FakeKind(_OneKeyKind):
    name = "fake"
    key = "Meta"


@frozen
class FakeKernel:
    """A fake (meta) kernel: ``torch.library.register_fake`` semantics."""

    fn: KernelRef = field(validator=check_ref)
    kind: ClassVar[Kind] = _FakeKind()


def _misfit(refusal: tuple[str, str] | None, what: str, api: str, verdict: str) -> Misfit | None:
    if refusal is None:
        return None
    code, why = refusal
    return Misfit(code, what, why, api, verdict, _FIXES[code])


_FIXES = {
    "autograd-on-mutable-op": "define a functional op (no '(a!)' annotations) and register "
                              "autograd for it",
    "autograd-no-returns": "return the result (a new tensor), or drop the autograd kernel",
    "autograd-kwarg-only-tensor": "make the tensor arguments positional",
    "vmap-kwarg-only-tensor": "make the tensor arguments positional",
    "autocast-kwarg-only-argument": "make the arguments positional, or drop the autocast rule "
                                    "and cast inside the kernel",
    "autocast-on-mutable-op": "cast inside the kernel instead, or register autocast for a "
                              "functional variant",
}


class _AutogradKind(_OneKeyKind):
    name = "autograd"
    key = "Autograd"
    references = (("backward", "callable"), ("setup_context", "callable"))
    primary = "backward"

    def fit(self, schema: Any, tags: tuple[str, ...]) -> Misfit | None:
        return _misfit(schema.autograd_refusal(tags), "autograd",
                       "torch.library.register_autograd", "refuses such ops")


@frozen
class AutogradFormula:
    """A backward formula and its ``setup_context``: ``torch.library.register_autograd``."""

    backward: KernelRef = field(validator=check_ref)
    setup_context: KernelRef | None = field(default=None, validator=check_ref)
    kind: ClassVar[Kind] = _AutogradKind()


class _VmapKind(_OneKeyKind):
    name = "vmap"
    key = "FuncTorchBatched"

    def fit(self, schema: Any, tags: tuple[str, ...]) -> Misfit | None:
        return _misfit(schema.vmap_refusal(), "a vmap rule", "torch.library.register_vmap",
                       "refuses such ops")


@frozen
class VmapRule:
    """A batching rule: ``torch.library.register_vmap``."""

    fn: KernelRef = field(validator=check_ref)
    kind: ClassVar[Kind] = _VmapKind()


class _AutocastKind(Kind):
    name = "autocast"
    references = (("dtype", "object"),)
    primary = "dtype"

    def accepts(self, key: str) -> bool:
        return key in _keys.AUTOCAST_KEYS

    def check(self, kernel: Any) -> None:
        ref = kernel.payload.dtype
        dtype = ref.partition(":")[2] if isinstance(ref, str) and ref.startswith("torch:") else None
        if dtype not in _keys.AUTOCAST_DTYPES.values():
            raise DeclarationError(
                f"autocast rule for {kernel.op} on {_keys.AUTOCAST_KEYS[kernel.key]} (key "
                f"{kernel.key!r}): cast_inputs must be a floating torch.dtype (torch.float16, "
                f"torch.bfloat16, torch.float32 or torch.float64), got {describe_ref(ref)!r}",
                op=kernel.op, key=kernel.key)

    def fit(self, schema: Any, tags: tuple[str, ...]) -> Misfit | None:
        return _misfit(schema.autocast_refusal(), "an autocast rule",
                       "the kernel of torch.library.register_autocast", "cannot serve such ops")


def autocast_dtype(cast_inputs: Any) -> Any:
    """``"torch:bfloat16"`` for ``torch.bfloat16``, ``"bfloat16"`` or ``"torch.bfloat16"``.

    An autocast rule's dtype is referenced like a kernel (``module:attribute``)
    so that declaring it imports nothing; anything else is returned as given,
    for the kind's check to refuse.
    """
    text = str(cast_inputs) if type(cast_inputs).__name__ == "dtype" else cast_inputs
    if isinstance(text, str):
        name = text.removeprefix("torch.").removeprefix("torch:")
        if name in _keys.AUTOCAST_DTYPES:
            return f"torch:{_keys.AUTOCAST_DTYPES[name]}"
    return cast_inputs


@frozen
class AutocastRule:
    """Cast an op's floating inputs under ``torch.autocast``: ``torch.library.register_autocast``.

    ``dtype`` is referenced like a kernel (``"torch:bfloat16"``), so that
    declaring it imports nothing.
    """

    dtype: Any
    kind: ClassVar[Kind] = _AutocastKind()


class _TritonKind(Kind):
    name = "triton"
    candidates = True
    countable = True
    candidate_adapter = "opregistry.torch_state:eager_triton"
    requires = ("triton",)

    def accepts(self, key: str) -> bool:
        return key in _keys.DEVICE_KEYS

    def wrong_key(self, op: str, key: str) -> str:
        return (f"Triton kernel for {op}: {key!r} is not a device key; a Triton kernel is "
                f"declared for a device type (triton={{'cuda': ...}})")


@frozen
class TritonKernel:
    """A function launching Triton kernels through ``wrap_triton``: ``torch.library.triton_op``."""

    fn: KernelRef = field(validator=check_ref)
    kind: ClassVar[Kind] = _TritonKind()


class _DispatchKind(Kind):
    name = "torch_dispatch"
    references = (("fn", "callable"), ("cls", "class"))

    def accepts(self, key: str) -> bool:
        return key != _keys.TORCH_DISPATCH and _keys.family(key) == _keys.TORCH_DISPATCH

    def wrong_key(self, op: str, key: str) -> str:
        return (f"kernel for {op} on {key!r}: a torch_dispatch rule needs its class "
                f"(torch_dispatch={{'module:Mode': 'module:rule'}}), and only a torch_dispatch "
                f"rule has one")

    def check(self, kernel: Any) -> None:
        if kernel.payload.cls is None:
            raise DeclarationError(self.wrong_key(kernel.op, kernel.key), op=kernel.op,
                                   key=kernel.key)


@frozen
class DispatchRule:
    """A rule for a Tensor subclass or ``TorchDispatchMode``: ``register_torch_dispatch``."""

    fn: KernelRef = field(validator=check_ref)
    cls: KernelRef | None = field(default=None, validator=check_ref)
    kind: ClassVar[Kind] = _DispatchKind()


class _NativeKind(Kind):
    name = "native"
    references = ()
    primary = "target"
    by_backend = False

    def accepts(self, key: str) -> bool:
        return (key in _keys.DEVICE_KEYS or key in _keys.COMPOSITE_KEYS
                or key in _keys.FUNCTIONALITY_KEYS)


@frozen(kw_only=True)
class NativeKernel:
    """A C++ kernel (``TORCH_LIBRARY_IMPL``): registered by loading its library, never by a backend.

    ``target`` names the library as listings show it; ``library`` is set for a
    kernel of an IMPL library (``OpLibrary(ns, "IMPL", native=...)``), whose
    ``TORCH_LIBRARY_IMPL`` blocks add kernels to ops another distribution
    defines, and ``None`` for the C++ kernels of a DEF or FRAGMENT library's
    own ops (the namespace's library registers them).
    """

    target: str
    library: NativeLibrary | None = None
    kind: ClassVar[Kind] = _NativeKind()


#: every kind the core ships, by name
BUILTIN_KINDS: dict[str, Kind] = {
    k.kind.name: k.kind for k in (DeviceKernel, FakeKernel, AutogradFormula, VmapRule,
                                  AutocastRule, TritonKernel, DispatchRule, NativeKernel)}

#: the kind a plain ``fn`` declares, by key family (any other key: a device kernel)
_BY_KEY: dict[str, type] = {"Meta": FakeKernel, "Autograd": AutogradFormula,
                            "FuncTorchBatched": VmapRule, _keys.TORCH_DISPATCH: DispatchRule,
                            **dict.fromkeys(_keys.AUTOCAST_KEYS, AutocastRule)}


def payload_for(op: str, key: str, fn: Any, *, setup_context: Any = None, triton: bool = False,
                dispatch_class: Any = None, native: bool = False,
                library: NativeLibrary | None = None) -> Any:
    """The payload ``Kernel(op=..., key=..., fn=..., ...)`` declares: the kind follows the key.

    ``triton=True`` and ``native=True`` choose their kinds; otherwise the key
    does (``Meta``: a fake kernel, ``Autograd``: a formula, ...).  The keyword
    arguments each belong to one kind and are refused elsewhere.
    """
    if library is not None and not native:
        raise DeclarationError(f"kernel for {op} on {key}: a native library belongs to a C++ "
                               f"kernel (native=True)", op=op, key=key)
    if setup_context is not None and key != "Autograd":
        raise DeclarationError(
            f"kernel for {op} on {key}: setup_context only belongs to an Autograd kernel")
    family = _keys.family(key)
    if (dispatch_class is not None) != (family == _keys.TORCH_DISPATCH) and not native:
        raise DeclarationError(_DispatchKind().wrong_key(op, key), op=op, key=key)
    if native:
        return NativeKernel(target=fn, library=library)
    if triton:
        return TritonKernel(fn)
    payload = _BY_KEY.get(family, DeviceKernel)
    if payload is AutogradFormula:
        return AutogradFormula(fn, setup_context)
    if payload is DispatchRule:
        return DispatchRule(fn, dispatch_class)
    return payload(fn)


def kernel_fields(kernel: Any, *, candidate: bool = False) -> dict[str, Any]:
    """A kernel as listings, JSON and the lock show it: the one serializer of every kind.

    ``kind``; ``kernel``, the primary reference (``module:function``);
    ``setup_context`` (an autograd formula's, else ``None``); ``details``, the
    kind's own fields (:meth:`Kind.fields`), only for a kind that has some;
    for a candidate (``candidate=True``) also its ``priority``, ``when`` and
    ``predicate``.
    """
    payload = kernel.payload
    kind = payload.kind
    fields = {"kind": kind.name, "kernel": describe_ref(getattr(payload, kind.primary)),
              "setup_context": describe_ref(getattr(payload, "setup_context", None))}
    details = kind.fields(payload)
    if details:
        fields["details"] = details
    if candidate:
        fields.update(priority=kernel.priority, predicate=describe_ref(kernel.predicate),
                      when=kernel.when.describe() if kernel.when is not None else None)
    return fields
