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

import os
import sys
from typing import Any, Callable, Iterable, Literal, Mapping, Sequence, TypeVar, overload

from .errors import DeclarationError
from .seal import running_origin
from .hookspecs import hookimpl
from .schema import split_name
from . import keys as _keys
from .kinds import Kind, autocast_dtype
from .model import (Candidate, Kernel, KernelRef, Namespace, NativeLibrary, OpDef, Origin,
                    describe_ref, source_of)

__all__ = ["OpLibrary", "OpHandle", "kernel"]

F = TypeVar("F", bound=Callable[..., Any])
LibraryKind = Literal["DEF", "FRAGMENT", "IMPL"]


#: opregistry's own folder: its frames are never the author of a declaration
_OURS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "")


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


def _device_keys(device_types: Any) -> tuple[str, ...]:
    """``device_types`` of ``custom_op`` / ``register_kernel`` as kernel keys.

    ``None`` is every device: ``CompositeExplicitAutograd``, what
    :func:`torch.library.custom_op` registers when it is given no device types.
    """
    if device_types is None:
        return ("CompositeExplicitAutograd",)
    if isinstance(device_types, str):
        return (device_types,)
    try:
        devices = tuple(device_types)
    except TypeError:
        raise DeclarationError(
            f"device_types must be a device type ('cpu'), a sequence of them, or None "
            f"(every device), not {type(device_types).__name__}") from None
    if not devices or not all(isinstance(d, str) for d in devices):
        raise DeclarationError(
            f"device_types must be a device type ('cpu'), a non-empty sequence of them, or "
            f"None (every device), not {device_types!r}")
    return devices


def kernel(op: str, key: str | Sequence[str], when: Any = None, priority: int = 0,
           override: bool = False) -> Callable[[F], F]:
    """Mark a kernel in a kernel module of an ``OpLibrary(..., kernel_modules=[...])``.

    ``@kernel("quantkit::quantize", "cpu")`` says what ``lib.impl("quantize",
    "cpu", "thismodule:fn")`` would, next to the function: opregistry reads
    the decorator from the module's source (:mod:`opregistry.kernel_modules`)
    before anything is imported, so its arguments must be constants.  At run
    time it returns the function unchanged: importing the module registers
    nothing by itself.  ``key`` may be a list (``["cpu", "cuda"]``); ``when``,
    ``priority`` and ``override`` are those of :meth:`OpLibrary.impl`.
    """
    def mark(fn: F) -> F:
        try:
            fn.__opregistry_kernel__ = (op, key)  # type: ignore[attr-defined]
        except (AttributeError, TypeError):  # a builtin or a slotted callable: nothing to mark
            pass
        return fn

    return mark


def _one_or_many(value: str | Sequence[str]) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value)


def _schema_name(namespace: str, head: str, schema: str) -> tuple[str, str]:
    """``(name, overload)`` of a schema's head, in every form torch takes and prints:
    ``"f"``, ``"f.out"``, ``"mylib::f.out"`` (the namespace must be the library's).
    A head torch cannot read is kept whole as the name: the resolver refuses it."""
    split = split_name(head)
    if split is None:
        return head.strip(), ""
    written, name, overload = split
    if written and written != namespace:
        raise DeclarationError(
            f"{namespace}: schema {schema!r} names namespace {written!r}, but "
            f"OpLibrary({namespace!r}) defines ops in {namespace!r}: leave the "
            f"namespace out, or declare the op in OpLibrary({written!r})")
    return name, overload


def _split_name(name: str) -> tuple[str, str]:
    base, _, overload = name.partition(".")
    return base, overload


def _note(library: "OpLibrary", record: Any, author: str | None = None,
          replaced: Any = None) -> None:
    """Remember, on ``library``, whose code declared ``record``, where that is not plain from it.

    The common case -- declared in the file that made the library, while the
    same distribution's code runs -- records nothing.  Otherwise: whose code
    was running, and the files of every frame of the code that declared it
    (so that a helper called by the library's own code counts as its own);
    ``author``: the ``file:line`` of a change made after the record's own
    line (``register_samples``), whose record ``replaced`` was the one before.
    Read at collection by :mod:`opregistry.ownership`.
    """
    now = running_origin()
    if author is None and (now is library._made_during or now == library._made_during) and \
            (record.source or "").startswith(library._made_in):
        return
    frame = sys._getframe(2)
    files: list[str] = []
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(_OURS) and name not in files:
            files.append(name)
        frame = frame.f_back
    library._late[id(record)] = (now, tuple(files), replaced)


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

    def register_kernel(self, device_types: str | Sequence[str] | None,
                        fn: KernelRef | None = None) -> Any:
        """Add the kernel for device types (``"cpu"``, ``["cpu", "cuda"]``).

        ``None`` means every device (``CompositeExplicitAutograd``), as in
        :func:`torch.library.register_kernel`.
        """
        source = _source(1)

        def record(f: Any) -> None:
            for device in _device_keys(device_types):
                self._library._add_kernel(self.qualname, device, f, source=source)

        return _decorator_or_call(fn, record)

    def register_fake(self, fn: KernelRef | None = None) -> Any:
        """Add the fake (meta) kernel, with :func:`torch.library.register_fake` semantics."""
        return self._register("Meta", fn, 2)

    def register_vmap(self, fn: KernelRef | None = None) -> Any:
        """Add the vmap rule, with :func:`torch.library.register_vmap` semantics."""
        return self._register("FuncTorchBatched", fn, 2)

    def register_autocast(self, device_type: str, cast_inputs: Any) -> None:
        """Add an autocast rule, as :func:`torch.library.register_autocast`.

        Under ``torch.autocast(device_type)``, the op's floating inputs on that
        device are cast to ``cast_inputs`` (``torch.bfloat16`` or ``"bfloat16"``)
        and the op runs with autocast off.
        """
        self._library._add_autocast(self.qualname, device_type, cast_inputs, _source(1))

    def register_triton(self, device_type: str = "cuda", fn: KernelRef | None = None) -> Any:
        """Add a Triton kernel for ``device_type``, with :func:`torch.library.triton_op` semantics.

        ``fn`` calls its Triton kernels through ``torch.library.wrap_triton``,
        so that ``torch.compile`` traces into them.
        """
        source = _source(1)
        return _decorator_or_call(fn, lambda f: self._library._add_kernel(
            self.qualname, device_type, f, triton=True, source=source))

    def register_torch_dispatch(self, torch_dispatch_class: KernelRef,
                                fn: KernelRef | None = None) -> Any:
        """Add a rule for a Tensor subclass or ``TorchDispatchMode``, as
        :func:`torch.library.register_torch_dispatch`."""
        source = _source(1)
        return _decorator_or_call(fn, lambda f: self._library._add_torch_dispatch(
            self.qualname, torch_dispatch_class, f, source))

    def register_autograd(
        self, backward: KernelRef, /, *, setup_context: KernelRef | None = None
    ) -> None:
        """Add backward and setup_context, as :func:`torch.library.register_autograd`."""
        self._library._add_kernel(
            self.qualname, "Autograd", backward, setup_context=setup_context, source=_source(1)
        )

    def register_samples(self, fn: KernelRef | None = None) -> Any:
        """Name the function that returns sample inputs for ``opcheck``."""
        source = _source(1)
        return _decorator_or_call(fn, lambda f: self._library._set_samples(self.qualname, f,
                                                                           source))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        op = self._overload
        if op is None:
            op = self._overload = self._library._lookup(self._op)
        return op(*args, **kwargs)


class _Records:
    """The records an :class:`OpLibrary` holds, and the hooks that hand them over."""

    namespace: str
    kind: LibraryKind
    native: NativeLibrary | None
    _namespace: Namespace | None
    _ops: dict[str, OpDef]
    _kernels: list[Kernel]
    #: modules whose ``@kernel(...)`` decorators declare more kernels (read when collected)
    kernel_modules: tuple[str, ...] = ()

    def _check_define(self, schema: Any, native_keys: tuple[str, ...]) -> None:
        """Refuse a ``define(...)`` this library cannot hold, before anything is recorded."""
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

    def _add_op_kernels(self, qualname: str, source: str | None, *,
                        kernels: Mapping[str, KernelRef] | None, fake: KernelRef | None,
                        autograd: Any, vmap: KernelRef | None, autocast: Mapping[str, Any] | None,
                        triton: Any, torch_dispatch: Mapping[KernelRef, KernelRef] | None,
                        native_keys: tuple[str, ...]) -> None:
        """The kernels ``define(...)`` declares with the op, each at the op author's line."""
        for key, value in (kernels or {}).items():
            for fn in (value if isinstance(value, (list, tuple)) else (value,)):
                if isinstance(fn, Candidate):
                    self._add_kernel(qualname, key, fn.fn, when=fn.when, predicate=fn.predicate,
                                     priority=fn.priority, source=source)
                else:
                    self._add_kernel(qualname, key, fn, source=source)
        tritons = ({"cuda": triton} if isinstance(triton, str) or callable(triton)
                   else dict(triton or {}))
        for device, fn in tritons.items():
            self._add_kernel(qualname, device, fn, triton=True, source=source)
        if fake is None and tritons:
            # as torch.library.triton_op: the function is traceable, so it is its own fake
            fake = next(iter(tritons.values()))
        for device, dtype in (autocast or {}).items():
            self._add_autocast(qualname, device, dtype, source)
        for cls, rule in (torch_dispatch or {}).items():
            self._add_torch_dispatch(qualname, cls, rule, source)
        for key in native_keys:
            self._add_kernel(qualname, key, self.native.target,  # type: ignore[union-attr]
                             native=True, source=source)
        if fake is not None:
            self._add_kernel(qualname, "Meta", fake, source=source)
        if autograd is not None:
            backward, setup = autograd if isinstance(autograd, tuple) else (autograd, None)
            self._add_kernel(qualname, "Autograd", backward, setup_context=setup, source=source)
        if vmap is not None:
            self._add_kernel(qualname, "FuncTorchBatched", vmap, source=source)

    def _add_native_impl(self, qualname: str, key: str | None, fn: Any, keys: tuple[str, ...],
                         override: bool, source: str | None, extras: bool) -> None:
        where = (f"OpLibrary({self.namespace!r}, {self.kind!r}).impl({qualname!r}, "
                 f"native={list(keys)!r})")
        if self.native is None:
            raise DeclarationError(
                f"{where} names C++ kernels, but the library declares no native library "
                f"(OpLibrary(ns, 'IMPL', native=NativeLibrary(...)))", op=qualname)
        if self.kind != "IMPL":
            raise DeclarationError(
                f"{where}: the C++ kernels of a {self.kind} library's own ops are declared with "
                f"define(..., native=[...]); impl(..., native=...) belongs to an IMPL library "
                f"(kernels for ops another distribution defines)", op=qualname)
        if key is not None or fn is not None or extras:
            raise DeclarationError(
                f"{where}: a C++ kernel is registered by its library, so it takes no key, "
                f"function, conditions or priority: impl(op, native=['CPU', ...])", op=qualname)
        for k in keys:
            self._add_kernel(qualname, k, self.native.target, native=True, library=self.native,
                             override=override, source=source)

    def _add_op(self, name: str, overload: str, schema: str, **kwargs: Any) -> OpHandle:
        op = OpDef(namespace=self.namespace, name=name, overload=overload, schema=schema, **kwargs)
        if op.qualname in self._ops:
            raise DeclarationError(
                f"{op.qualname} is declared twice in this OpLibrary "
                f"(first at {self._ops[op.qualname].source}, again at {op.source})",
                op=op.qualname,
            )
        self._ops[op.qualname] = op
        _note(self, op)
        return OpHandle(self, op)

    def _add_kernel(self, qualname: str, key: str, fn: Any, **kwargs: Any) -> None:
        # a reference string, the common case, is no payload (and a failed class attribute
        # lookup costs an exception inside getattr)
        if type(fn) is not str and isinstance(getattr(type(fn), "kind", None), Kind):
            # a payload of a registration kind (opregistry.kinds, or a backend's own)
            given = sorted(k for k in ("triton", "setup_context", "dispatch_class", "native",
                                       "library") if kwargs.pop(k, None))
            if given:
                raise DeclarationError(
                    f"kernel for {qualname}: {type(fn).__name__}(...) is the whole "
                    f"registration; {', '.join(given)}= belongs to a kernel given by reference",
                    op=qualname)
            kernel = Kernel(op=qualname, key=key, payload=fn, **kwargs)
            self._kernels.append(kernel)
            _note(self, kernel)
            return
        if (isinstance(key, str) and key.endswith("]") and kwargs.get("dispatch_class") is None
                and _keys.family(key) == _keys.TORCH_DISPATCH):
            # impl(op, "TorchDispatch[module:Mode]", rule): the class is named in the key
            kwargs["dispatch_class"] = key[len(_keys.TORCH_DISPATCH) + 1:-1]
        kernel = Kernel(op=qualname, key=key, fn=fn, **kwargs)
        self._kernels.append(kernel)
        _note(self, kernel)

    def _add_autocast(self, qualname: str, device_type: str, cast_inputs: Any,
                      source: str | None) -> None:
        key = _keys.autocast_key(device_type) if isinstance(device_type, str) else None
        if key is None:
            raise DeclarationError(
                f"autocast rule for {qualname}: torch has no autocast dispatch key for device "
                f"type {device_type!r}; register_autocast serves "
                f"{', '.join(repr(d) for d in _keys.AUTOCAST_KEYS.values())}",
                op=qualname)
        dtype = autocast_dtype(cast_inputs)
        if not (isinstance(dtype, str) and dtype.startswith("torch:")):
            raise DeclarationError(
                f"autocast rule for {qualname} on {device_type}: cast_inputs must be a floating "
                f"torch.dtype (torch.float16, torch.bfloat16, torch.float32 or torch.float64, "
                f"or its name), got {cast_inputs!r}", op=qualname, key=key)
        self._add_kernel(qualname, key, dtype, source=source)

    def _add_torch_dispatch(self, qualname: str, cls: KernelRef, rule: KernelRef,
                            source: str | None) -> None:
        if not isinstance(cls, str) and not isinstance(cls, type):
            raise DeclarationError(
                f"torch_dispatch rule for {qualname}: the class must be a 'module:Class' "
                f"string or the class itself, got {type(cls).__name__}", op=qualname)
        key = _keys.torch_dispatch_key(describe_ref(cls) or "")
        self._add_kernel(qualname, key, rule, dispatch_class=cls, source=source)

    def _set_samples(self, qualname: str, fn: KernelRef, source: str | None = None) -> None:
        from attrs import evolve

        before = self._ops[qualname]
        op = self._ops[qualname] = evolve(before, samples=fn)
        _note(self, op, source, before)  # the line of register_samples: whoever chose them

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
        if not self.kernel_modules:
            return list(self._kernels)
        from .kernel_modules import read_kernel_modules

        return self._kernels + read_kernel_modules(self.namespace, self.kernel_modules)


class OpLibrary(_Records):
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
        ``TORCH_LIBRARY_IMPL`` blocks fill).  On an ``IMPL`` library, the
        compiled library only has ``TORCH_LIBRARY_IMPL`` blocks, for ops
        another distribution defines: :meth:`impl` (``native=[keys]``)
        declares each kernel, which the resolver judges as any other kernel
        before the library is loaded (after the ops are defined).
    :param kernel_modules: modules (``"mylib.backends.cpu"``) whose functions
        marked ``@opregistry.kernel(op, key)`` are kernels of this library's
        ops: one module per device, each declaring its own kernels, read from
        their source before anything is imported (:mod:`opregistry.kernel_modules`).
    """

    def __init__(
        self,
        namespace: str,
        kind: LibraryKind = "DEF",
        *,
        closed: bool = False,
        description: str = "",
        native: NativeLibrary | None = None,
        kernel_modules: Sequence[str] = (),
    ) -> None:
        if kind not in ("DEF", "FRAGMENT", "IMPL"):
            raise DeclarationError(f"OpLibrary kind must be DEF, FRAGMENT or IMPL, not {kind!r}")
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
        self.kernel_modules = _one_or_many(kernel_modules)
        # which distribution's code was running when the library was made, and, for each
        # record declared while another's was, that one: a declaration through someone
        # else's library is found and attributed at collection (opregistry.ownership)
        self._made_during = running_origin()
        self._made_in = (_source(1) or "").rpartition(":")[0] + ":"  # "file:", the prefix
        #: id(record) -> (whose code was running, the files of the code that declared it,
        #: innermost first; the record it replaced), for the records declared elsewhere than
        #: in the file that made the library, or while another distribution's code ran
        self._late: dict[int, tuple[Origin | None, tuple[str, ...], Any]] = {}

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
        autocast: Mapping[str, Any] | None = None,
        triton: Mapping[str, KernelRef] | KernelRef | None = None,
        torch_dispatch: Mapping[KernelRef, KernelRef] | None = None,
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
        :param autocast: device type to the dtype its floating inputs are cast to
            under ``torch.autocast`` (``{"cpu": "bfloat16"}``).
        :param triton: device type to a function calling Triton kernels through
            ``wrap_triton`` (``triton_op`` semantics); a single reference means
            ``{"cuda": ref}``.  Without ``fake``, it also serves as the fake
            kernel, as with ``triton_op``.
        :param torch_dispatch: Tensor subclass or ``TorchDispatchMode`` to its
            rule (``register_torch_dispatch`` semantics).
        :param mutates_args: if given, must agree with the ``(a!)`` annotations.
        :param tags: ``torch.Tag`` names, e.g. ``"pt2_compliant_tag"``.
        :param samples: function returning sample inputs for ``opcheck``.
        :param native: in a library with a native library, the dispatch keys its
            ``TORCH_LIBRARY_IMPL`` blocks fill for this op (``("CPU",)``); the
            schema is then the one its ``TORCH_LIBRARY`` block defines.
        """
        native_keys = tuple(native)
        self._check_define(schema, native_keys)
        source = _source(1)  # the op author's line, for the op and each of its kernels
        name, _, rest = schema.partition("(")
        base, overload = _schema_name(self.namespace, name, schema)
        handle = self._add_op(
            base,
            overload,
            "(" + rest,
            mutates_args=mutates_args,
            tags=tags,
            samples=samples,
            doc=doc,
            source=source,
        )
        self._add_op_kernels(handle.qualname, source, kernels=kernels, fake=fake,
                             autograd=autograd, vmap=vmap, autocast=autocast, triton=triton,
                             torch_dispatch=torch_dispatch, native_keys=native_keys)
        return handle

    @overload
    def impl(self, op: str, key: str, fn: None = None, *, override: bool = False) -> Callable[[F], F]: ...
    @overload
    def impl(self, op: str, key: str, fn: F, *, override: bool = False) -> F: ...
    @overload
    def impl(self, op: str, *, native: Iterable[str], override: bool = False) -> None: ...

    def impl(self, op: str, key: str | None = None, fn: Any = None, *, override: bool = False,
             triton: bool = False, when: Any = None, predicate: KernelRef | None = None,
             priority: int = 0, native: Iterable[str] = ()) -> Any:
        """Add a kernel for ``op`` (``"name"`` in this namespace, or ``"ns::name"``).

        ``fn`` is a ``"module:function"`` reference or the callable, registered
        as the kind ``key`` implies (a device kernel for ``"cpu"``, a fake
        kernel for ``"fake"``, ...), or the payload of a registration kind
        (``opregistry.kinds``: a kind a backend distribution defines, say).

        ``override=True`` declares the intent to replace a kernel another
        distribution or torch registered for that key; policy must allow it.
        ``triton=True`` marks a Triton kernel (``triton_op`` semantics).
        ``when`` (``{"torch": ">=2.10", "requires": ["triton>=3.2"],
        "capability": ">=9.0", "platform": "linux"}``) and ``predicate`` (a
        function of the op's arguments) make it a *candidate* that serves
        where they hold, in front of the key's other kernels; ``priority``
        orders candidates (highest first).

        In an ``IMPL`` library with a native library, ``native=["CPU"]`` (no
        ``key``, no ``fn``) declares the dispatch keys its
        ``TORCH_LIBRARY_IMPL`` blocks fill for ``op``, as ``define(...,
        native=...)`` does for a library's own ops.
        """
        qualname = op if "::" in op else f"{self.namespace}::{op}"
        source = _source(1)
        native_keys = (native,) if isinstance(native, str) else tuple(native)
        if native_keys:
            self._add_native_impl(qualname, key, fn, native_keys, override, source,
                                  bool(triton or when is not None or predicate is not None
                                       or priority))
            return None
        if key is None:
            raise DeclarationError(f"impl({op!r}): name the dispatch key (impl(op, 'cpu', fn)), "
                                   f"or the C++ kernels' keys (impl(op, native=['CPU']))",
                                   op=qualname)
        return _decorator_or_call(
            fn, lambda f: self._add_kernel(qualname, key, f, override=override, triton=triton,
                                           when=when,
                                           predicate=predicate, priority=priority,
                                           source=source))

    # -- decorator style ---------------------------------------------------
    def op(
        self,
        name: str | None = None,
        *,
        mutates_args: Iterable[str] | str,
        device_types: str | Sequence[str] | None = None,
        schema: str | None = None,
        tags: Iterable[str] = (),
    ) -> Callable[[Callable[..., Any]], OpHandle]:
        """Decorator: declare an op whose kernel is the decorated function.

        As :func:`torch.library.custom_op`, the schema is inferred from type
        hints (pass ``schema=`` to write it yourself) and ``mutates_args``
        is required.  The function becomes the kernel for ``device_types``:
        by default (``None``) for every device, ``CompositeExplicitAutograd``,
        as ``custom_op`` registers it; ``"cpu"`` or ``["cpu", "cuda"]`` for
        those devices only.  An op that returns a mutated input
        (``-> Tensor(a!)``) needs ``tags=["inplace"]`` (torch >= 2.13), so
        that the inferred schema says the return aliases it.
        """
        if isinstance(mutates_args, str):
            raise DeclarationError(
                "mutates_args must list argument names (use () for a functional op); "
                "opregistry does not support 'unknown'"
            )
        mutated = tuple(mutates_args)
        tag_names = tuple(tags)  # read twice below: a generator would be empty the second time
        devices = _device_keys(device_types)
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
