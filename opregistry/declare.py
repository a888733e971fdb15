"""How op authors declare ops: :class:`OpLibrary`, in two styles.

*Declarative, lazy* — the module imports neither torch nor the kernels::

    lib = OpLibrary("mylib")
    lib.define(
        "muladd(Tensor a, Tensor b, float c) -> Tensor",
        kernels={"cpu": "mylib.kernels:muladd_cpu"},
        fake="mylib.kernels:muladd_fake",
        autograd=("mylib.kernels:muladd_backward", "mylib.kernels:muladd_setup"),
    )

*Decorators* — in the spirit of :func:`torch.library.custom_op`, for modules
that import torch anyway; the schema is inferred from the type hints::

    @lib.op(mutates_args=())
    def numpy_sin(x: torch.Tensor) -> torch.Tensor: ...

    @numpy_sin.register_fake
    def _(x): return torch.empty_like(x)

Either way the library only *records* declarations; nothing reaches torch
until :func:`opregistry.load` resolves every installed package together.
The entry point of the op package names the :class:`OpLibrary` object.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Iterable, Literal, Mapping, Sequence, TypeVar, overload

from .errors import DeclarationError
from .hookspecs import hookimpl
from .model import Kernel, KernelRef, Namespace, NativeLibrary, OpDef, source_of

__all__ = ["OpLibrary", "OpHandle"]

F = TypeVar("F", bound=Callable[..., Any])
LibraryKind = Literal["DEF", "FRAGMENT", "IMPL"]


def _source(depth: int) -> str | None:
    """``file:line`` of the caller ``depth`` frames up: the op author's line."""
    return source_of(sys._getframe(depth + 1))


def _decorator_or_call(fn: Any, record: Callable[[Any], None]) -> Any:
    """``record(fn)`` and return ``fn``; with ``fn=None``, a decorator that does so.

    The one path behind every registration helper, so each works both as
    ``@handle.register_fake`` and as ``handle.register_fake(fn)``, as in
    ``torch.library``.
    """
    def add(f: Any) -> Any:
        record(f)
        return f

    return add if fn is None else add(fn)


def _infer_schema(fn: Callable[..., Any], mutated: tuple[str, ...], tags: tuple[str, ...]) -> str:
    """:func:`torch.library.infer_schema`, told the ``inplace`` / ``out`` tags.

    Since torch 2.13 those tags decide how the return aliases the mutated
    argument (``Tensor(a!) x -> Tensor(a!)``); without them an in-place op
    would get a fresh-tensor return its kernel does not honour.  Unknown tag
    names are left to the resolver, which reports them with their origin.
    """
    import inspect

    import torch.library

    kwargs: dict[str, Any] = {}
    if tags and "tags" in inspect.signature(torch.library.infer_schema).parameters:
        kwargs["tags"] = tuple(getattr(torch.Tag, t) for t in tags if hasattr(torch.Tag, t))
    return torch.library.infer_schema(fn, mutates_args=mutated, **kwargs)


def _split_name(name: str) -> tuple[str, str]:
    base, _, overload = name.partition(".")
    return base, overload


class OpHandle:
    """One declared op.  Registration methods work as decorators or direct calls.

    Calling the handle calls ``torch.ops.<ns>.<op>``; the first call loads
    the registry if nothing has yet.
    """

    def __init__(self, library: OpLibrary, op: OpDef) -> None:
        self._library = library
        self._op = op
        self._overload: Any = None

    @property
    def qualname(self) -> str:
        return self._op.qualname

    @property
    def definition(self) -> OpDef:
        return self._op

    def __repr__(self) -> str:
        return f"<OpHandle {self.qualname}{self._op.schema}>"

    def _register(self, key: str, fn: KernelRef | None, depth: int) -> Any:
        source = _source(depth)
        return _decorator_or_call(
            fn, lambda f: self._library._add_kernel(self.qualname, key, f, source=source))

    def register_kernel(self, device_type: str, fn: KernelRef | None = None) -> Any:
        """Add the kernel for one device type (``"cpu"``, ``"cuda"``, ...)."""
        return self._register(device_type, fn, 2)

    def register_fake(self, fn: KernelRef | None = None) -> Any:
        """Add the fake (meta) kernel, with :func:`torch.library.register_fake` semantics."""
        return self._register("Meta", fn, 2)

    def register_vmap(self, fn: KernelRef | None = None) -> Any:
        """Add the vmap rule, with :func:`torch.library.register_vmap` semantics."""
        return self._register("FuncTorchBatched", fn, 2)

    def register_autograd(
        self, backward: KernelRef, /, *, setup_context: KernelRef | None = None
    ) -> None:
        """Add backward and setup_context, as :func:`torch.library.register_autograd`."""
        self._library._add_kernel(
            self.qualname, "Autograd", backward, setup_context=setup_context, source=_source(1)
        )

    def register_samples(self, fn: KernelRef | None = None) -> Any:
        """Name the function that returns sample inputs for ``opcheck``."""
        return _decorator_or_call(fn, lambda f: self._library._set_samples(self.qualname, f))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        op = self._overload
        if op is None:
            op = self._overload = self._library._lookup(self._op)
        return op(*args, **kwargs)


class OpLibrary:
    """The declarations of one distribution for one namespace.

    :param namespace: the namespace, a Python identifier.
    :param kind: ``"DEF"`` to own the namespace, ``"FRAGMENT"`` to add ops
        to a namespace another distribution owns, ``"IMPL"`` to only add
        kernels to ops defined elsewhere.
    :param closed: for a ``DEF``, refuse fragments from other distributions.
    :param native: the compiled library whose ``TORCH_LIBRARY`` (or
        ``TORCH_LIBRARY_FRAGMENT``) block defines the ops this library
        declares: opregistry loads it, instead of defining them from Python,
        once the resolver has admitted the namespace, and checks it registered
        what :meth:`define` declared (``native=`` there names the keys its
        ``TORCH_LIBRARY_IMPL`` blocks fill).
    """

    def __init__(
        self,
        namespace: str,
        kind: LibraryKind = "DEF",
        *,
        closed: bool = False,
        description: str = "",
        native: NativeLibrary | None = None,
    ) -> None:
        if kind not in ("DEF", "FRAGMENT", "IMPL"):
            raise DeclarationError(f"OpLibrary kind must be DEF, FRAGMENT or IMPL, not {kind!r}")
        if native is not None and kind == "IMPL":
            raise DeclarationError(
                f"OpLibrary({namespace!r}, 'IMPL', native=...): a native library is declared "
                f"on the namespace its TORCH_LIBRARY or TORCH_LIBRARY_FRAGMENT defines (DEF or "
                f"FRAGMENT); native kernels for other distributions' ops are not supported")
        if native is not None and type(native) is not NativeLibrary:
            raise DeclarationError(
                f"OpLibrary({namespace!r}, native=...) takes a NativeLibrary, "
                f"not {type(native).__name__}")
        self.namespace = namespace
        self.kind = kind
        self.native = native
        self._namespace = (
            None
            if kind == "IMPL"
            else Namespace(name=namespace, kind=kind, closed=closed, description=description,
                           source=_source(1), native=native)
        )
        self._ops: dict[str, OpDef] = {}
        self._kernels: list[Kernel] = []

    def __repr__(self) -> str:
        return f"<OpLibrary {self.namespace} {self.kind}: {len(self._ops)} ops>"

    # -- declarative style ---------------------------------------------------
    def define(
        self,
        schema: str,
        *,
        kernels: Mapping[str, KernelRef] | None = None,
        fake: KernelRef | None = None,
        autograd: tuple[KernelRef, KernelRef | None] | KernelRef | None = None,
        vmap: KernelRef | None = None,
        mutates_args: Sequence[str] | None = None,
        tags: Iterable[str] = (),
        samples: KernelRef | None = None,
        doc: str = "",
        native: Iterable[str] = (),
    ) -> OpHandle:
        """Declare an op from a schema string, as ``Library.define`` does.

        :param schema: ``"name.overload(args) -> returns"``.
        :param kernels: device type (or dispatch key) to kernel reference.
        :param fake: the fake kernel.
        :param autograd: ``(backward, setup_context)`` or just ``backward``.
        :param vmap: the vmap rule.
        :param mutates_args: if given, must agree with the ``(a!)`` annotations.
        :param tags: ``torch.Tag`` names, e.g. ``"pt2_compliant_tag"``.
        :param samples: function returning sample inputs for ``opcheck``.
        :param native: in a library with a native library, the dispatch keys its
            ``TORCH_LIBRARY_IMPL`` blocks fill for this op (``("CPU",)``); the
            schema is then the one its ``TORCH_LIBRARY`` block defines.
        """
        native_keys = tuple(native)
        if native_keys and self.native is None:
            raise DeclarationError(
                f"{self.namespace}: define(..., native={native_keys!r}) names C++ kernels, but "
                f"OpLibrary({self.namespace!r}) declares no native library (native=NativeLibrary(...))")
        if self.kind == "IMPL":
            raise DeclarationError(
                f"OpLibrary({self.namespace!r}, 'IMPL') only adds kernels; "
                f"define ops in a DEF or FRAGMENT library"
            )
        if not isinstance(schema, str) or "(" not in schema:
            raise DeclarationError(
                f"{self.namespace}: schema {schema!r} must look like 'name(Tensor x) -> Tensor'"
            )
        name, _, rest = schema.partition("(")
        base, overload = _split_name(name.strip())
        handle = self._add_op(
            base,
            overload,
            "(" + rest,
            mutates_args=mutates_args,
            tags=tags,
            samples=samples,
            doc=doc,
            source=_source(1),
        )
        qualname = handle.qualname
        for key in native_keys:
            self._add_kernel(qualname, key, self.native.target,  # type: ignore[union-attr]
                             native=True, source=_source(1))
        for key, fn in (kernels or {}).items():
            self._add_kernel(qualname, key, fn, source=_source(1))
        if fake is not None:
            self._add_kernel(qualname, "Meta", fake, source=_source(1))
        if autograd is not None:
            backward, setup = autograd if isinstance(autograd, tuple) else (autograd, None)
            self._add_kernel(qualname, "Autograd", backward, setup_context=setup, source=_source(1))
        if vmap is not None:
            self._add_kernel(qualname, "FuncTorchBatched", vmap, source=_source(1))
        return handle

    @overload
    def impl(self, op: str, key: str, fn: None = None, *, override: bool = False) -> Callable[[F], F]: ...
    @overload
    def impl(self, op: str, key: str, fn: F, *, override: bool = False) -> F: ...

    def impl(self, op: str, key: str, fn: Any = None, *, override: bool = False) -> Any:
        """Add a kernel for ``op`` (``"name"`` in this namespace, or ``"ns::name"``).

        ``override=True`` declares the intent to replace a kernel another
        distribution or torch registered for that key; policy must allow it.
        """
        qualname = op if "::" in op else f"{self.namespace}::{op}"
        source = _source(1)
        return _decorator_or_call(
            fn, lambda f: self._add_kernel(qualname, key, f, override=override, source=source))

    # -- decorator style ---------------------------------------------------
    def op(
        self,
        name: str | None = None,
        *,
        mutates_args: Iterable[str] | str,
        device_types: str | Sequence[str] = "cpu",
        schema: str | None = None,
        tags: Iterable[str] = (),
    ) -> Callable[[Callable[..., Any]], OpHandle]:
        """Decorator: declare an op whose kernel is the decorated function.

        As :func:`torch.library.custom_op`, the schema is inferred from type
        hints (pass ``schema=`` to write it yourself) and ``mutates_args``
        is required.  The function becomes the kernel for ``device_types``.
        """
        if isinstance(mutates_args, str):
            raise DeclarationError(
                "mutates_args must list argument names (use () for a functional op); "
                "opregistry does not support 'unknown'"
            )
        mutated = tuple(mutates_args)
        tag_names = tuple(tags)  # read twice below: a generator would be empty the second time
        devices = (device_types,) if isinstance(device_types, str) else tuple(device_types)
        source = _source(1)

        def decorate(fn: Callable[..., Any]) -> OpHandle:
            base, overload = _split_name(name or fn.__name__)
            signature = schema
            if signature is None:
                signature = _infer_schema(fn, mutated, tag_names)
            handle = self._add_op(
                base,
                overload,
                signature,
                mutates_args=mutated,
                tags=tag_names,
                doc=fn.__doc__ or "",
                source=source,
            )
            for device in devices:
                self._add_kernel(handle.qualname, device, fn, source=source)
            return handle

        return decorate

    # -- records -------------------------------------------------------------
    def _add_op(self, name: str, overload: str, schema: str, **kwargs: Any) -> OpHandle:
        op = OpDef(namespace=self.namespace, name=name, overload=overload, schema=schema, **kwargs)
        if op.qualname in self._ops:
            raise DeclarationError(
                f"{op.qualname} is declared twice in this OpLibrary "
                f"(first at {self._ops[op.qualname].source}, again at {op.source})",
                op=op.qualname,
            )
        self._ops[op.qualname] = op
        return OpHandle(self, op)

    def _add_kernel(self, qualname: str, key: str, fn: KernelRef, **kwargs: Any) -> None:
        self._kernels.append(Kernel(op=qualname, key=key, fn=fn, **kwargs))

    def _set_samples(self, qualname: str, fn: KernelRef) -> None:
        from attrs import evolve

        self._ops[qualname] = evolve(self._ops[qualname], samples=fn)

    def _lookup(self, op: OpDef) -> Any:
        import torch

        from .registry import load

        namespace = getattr(torch.ops, op.namespace)
        if not hasattr(namespace, op.name):
            load()  # loads the registry, or completes the packages it deferred
        packet = getattr(namespace, op.name)
        return getattr(packet, op.overload or "default")

    # -- hook implementations ---------------------------------------------
    @hookimpl
    def opregistry_namespaces(self) -> list[Namespace]:
        return [self._namespace] if self._namespace is not None else []

    @hookimpl
    def opregistry_ops(self) -> list[OpDef]:
        return list(self._ops.values())

    @hookimpl
    def opregistry_kernels(self) -> list[Kernel]:
        return list(self._kernels)
