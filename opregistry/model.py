"""Frozen records: what plugins declare, and what discovery and collection hand on.

Every stage of the pipeline hands the next one plain, frozen attrs data, so
each can be printed, compared and tested without torch.  Op and backend
authors build :class:`Namespace`, :class:`OpDef`, :class:`Kernel` and
:class:`Backend` records (usually through :class:`~opregistry.OpLibrary`);
the collector stamps each with the :class:`Origin` it came from.  The
records two stages exchange live here too -- :class:`Plugin`,
:class:`Skipped` and :class:`Discovered` (discover -> collect),
:class:`Declarations` (collect -> resolve) -- so that no stage imports
another to learn a type; what the resolver decides is in :mod:`opregistry.plan`.
"""

from __future__ import annotations

import inspect
import re
import sys
from typing import Any, Callable, Iterable, Literal, Mapping, Union

import attrs
from attrs import field, frozen

from . import keys as _keys
from .errors import DeclarationError

__all__ = [
    "Origin",
    "Namespace",
    "NativeLibrary",
    "OpDef",
    "Kernel",
    "Candidate",
    "Condition",
    "parse_range",
    "in_range",
    "parse_requirement",
    "Backend",
    "Problem",
    "Severity",
    "Plugin",
    "Skipped",
    "Discovered",
    "Declarations",
    "KernelRef",
    "describe_ref",
    "resolve_ref",
    "autocast_dtype",
    "is_identifier",
    "source_of",
    "elide",
    "TEXT_LIMIT",
]

#: A kernel is either a ``"package.module:function"`` string, imported only
#: when the kernel is materialized, or the callable itself.
KernelRef = Union[str, Callable[..., Any]]

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_REF = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*\Z")

NamespaceKind = Literal["DEF", "FRAGMENT"]


def source_of(where: Any) -> str | None:
    """``file:line`` of a function, a code object, a frame or a traceback entry.

    The one way opregistry computes a source location (declarations record
    the line of their ``define(...)`` call, problems the line of the hook or
    module at fault); ``None`` when ``where`` has no code (a builtin, a
    ``functools.partial``).
    """
    if where is None:
        return None
    if hasattr(where, "f_code"):  # a frame
        return f"{where.f_code.co_filename}:{where.f_lineno}"
    if hasattr(where, "filename") and hasattr(where, "lineno"):  # traceback.FrameSummary
        return f"{where.filename}:{where.lineno}"
    code = where if hasattr(where, "co_filename") else getattr(
        inspect.unwrap(where) if callable(where) else where, "__code__", None)
    return f"{code.co_filename}:{code.co_firstlineno}" if code is not None else None


def is_identifier(name: str) -> bool:
    """Whether ``name`` is an ASCII identifier, as torch requires of names."""
    return bool(_IDENT.match(name))


def _check_ref(instance: object, attribute: attrs.Attribute, value: object) -> None:
    if value is None:
        return
    if getattr(instance, "native", False) and isinstance(value, str):
        return  # a native kernel's "fn" names its library (a module or a path)
    if isinstance(value, str):
        if not _REF.match(value):
            raise DeclarationError(
                f"{attribute.name}={value!r} is not a kernel reference: write it as "
                f"'package.module:function' (the form of an entry point's value)"
            )
    elif not callable(value):
        raise DeclarationError(
            f"{attribute.name} must be a 'module:function' string or a callable, "
            f"got {type(value).__name__}"
        )


def describe_ref(ref: KernelRef | None) -> str | None:
    """``module:qualname`` of a kernel reference, for listings and lockfiles."""
    if ref is None or isinstance(ref, str):
        return ref
    module = getattr(ref, "__module__", None) or "?"
    qualname = getattr(ref, "__qualname__", None) or getattr(ref, "__name__", repr(ref))
    return f"{module}:{qualname}"


def resolve_ref(ref: KernelRef, *, want_callable: bool = True) -> Any:
    """Import a ``"module:function"`` reference, or return a callable as is.

    ``want_callable=False`` accepts any object (an autocast rule's ``torch:bfloat16``).
    """
    if not isinstance(ref, str):
        return ref
    module_name, _, attr_path = ref.partition(":")
    obj: Any = sys.modules.get(module_name)
    # materializing resolves thousands of references into a few modules, all
    # imported already: sys.modules answers ~10x faster than import_module,
    # which is still asked for anything not there or still being imported
    if obj is None or getattr(getattr(obj, "__spec__", None), "_initializing", False):
        import importlib

        obj = importlib.import_module(module_name)
    for part in attr_path.split("."):
        obj = getattr(obj, part)
    if want_callable and not callable(obj):
        raise TypeError(f"{ref} is a {type(obj).__name__}, not a callable")
    return obj


@frozen(order=True)
class Origin:
    """Where a declaration came from: a distribution and one of its entry points."""

    distribution: str
    version: str
    group: str = ""
    entry_point: str = ""
    value: str = ""

    @property
    def dist(self) -> str:
        """``name==version``, the way pip spells a pinned distribution."""
        return f"{self.distribution}=={self.version}"

    @property
    def entry_point_spec(self) -> str:
        return f"{self.entry_point} = {self.value}" if self.entry_point else ""

    def __str__(self) -> str:
        if not self.entry_point:
            return self.dist
        return f"{self.dist} (entry point '{self.entry_point} = {self.value}' in {self.group})"


def _check_native_target(instance: "NativeLibrary", attribute: attrs.Attribute,
                         value: object) -> None:
    if (instance.module is None) == (instance.path is None):
        raise DeclarationError(
            "NativeLibrary needs exactly one of module= (an extension module to import, "
            "'package.module') and path= (a shared library for torch.ops.load_library)")
    if instance.module is not None and not re.match(
            r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*\Z", instance.module):
        raise DeclarationError(
            f"NativeLibrary(module={instance.module!r}) is not a module name "
            f"('package.module')")


@frozen(kw_only=True)
class NativeLibrary:
    """A compiled library (``TORCH_LIBRARY``/``TORCH_LIBRARY_IMPL`` blocks) and how to load it.

    Exactly one of ``module`` (an extension module, imported: its import loads
    the library) and ``path`` (a shared library, loaded with
    ``torch.ops.load_library``).  ``torch``, ``cxx11_abi`` and ``cuda``
    record what it was built for (``torch.__version__``,
    ``torch._C._GLIBCXX_USE_CXX11_ABI``, ``torch.version.cuda``); ``None``
    means not recorded (a library built at load time, for the running torch).
    Declared on the namespace (``OpLibrary(ns, native=...)``): nothing here
    is loaded until the resolver has admitted the namespace.
    """

    module: str | None = field(default=None, validator=_check_native_target)
    path: str | None = None
    torch: str | None = None
    cxx11_abi: bool | None = None
    cuda: str | None = None

    @classmethod
    def from_build_info(cls, info: str, *, module: str | None = None,
                        path: str | None = None) -> "NativeLibrary":
        """A library whose build recorded what it was built for in the JSON file ``info``.

        ``{"torch": "2.13.0+cpu", "cxx11_abi": true, "cuda": null}``, written at
        build time from ``torch.__version__``, ``torch._C._GLIBCXX_USE_CXX11_ABI``
        and ``torch.version.cuda`` (``examples/extension_cpp/setup.py``).  A
        missing file records nothing: the library is then one built at load time.
        """
        import json

        try:
            with open(info, encoding="utf-8") as fh:
                data = json.load(fh)
        except FileNotFoundError:
            data = {}
        except (OSError, ValueError) as exc:
            raise DeclarationError(f"NativeLibrary: cannot read build info {info}: {exc}") from exc
        return cls(module=module, path=path, torch=data.get("torch"),
                   cxx11_abi=data.get("cxx11_abi"), cuda=data.get("cuda"))

    def mismatch(self, version: str, cuda: str | None, cxx11_abi: bool | None = None) -> str | None:
        """What differs between the recorded build and a torch, or ``None``.

        Nothing recorded (``None``) is never a mismatch: a library built at
        load time is built for the running torch.  The release must match
        exactly (``2.13.0``: libtorch has no stable C++ ABI), as must the CUDA
        version of a library built with CUDA, and the C++11 ABI flag.
        """
        def release(v: str) -> str:
            return v.partition("+")[0]

        differences = []
        if self.torch is not None and release(self.torch) != release(version):
            differences.append(f"torch {release(self.torch)} is not torch {release(version)}")
        if self.cuda is not None and self.cuda != cuda:
            differences.append(f"CUDA {self.cuda} is not " + (f"CUDA {cuda}" if cuda else "a "
                                                                  "torch without CUDA"))
        if self.cxx11_abi is not None and cxx11_abi is not None and self.cxx11_abi != cxx11_abi:
            differences.append(f"_GLIBCXX_USE_CXX11_ABI={int(self.cxx11_abi)} is not "
                               f"{int(cxx11_abi)}")
        return "; ".join(differences) or None

    @property
    def target(self) -> str:
        """What is loaded, as listings show it: the module name or the path."""
        return self.module if self.module is not None else str(self.path)

    def built_for(self) -> str:
        """``torch 2.13.0+cpu, C++11 ABI, CUDA 12.8`` (what was recorded)."""
        parts = [f"torch {self.torch}" if self.torch else "torch ?"]
        if self.cxx11_abi is not None:
            parts.append("C++11 ABI" if self.cxx11_abi else "pre-C++11 ABI")
        parts.append(f"CUDA {self.cuda}" if self.cuda else "no CUDA")
        return ", ".join(parts)


@frozen(kw_only=True)
class Namespace:
    """A namespace a distribution defines (``DEF``) or adds ops to (``FRAGMENT``).

    ``closed=True`` on a ``DEF`` refuses fragments from other distributions.
    """

    name: str
    kind: NamespaceKind = field(default="DEF", validator=attrs.validators.in_(("DEF", "FRAGMENT")))
    closed: bool = False
    description: str = ""
    #: ``file:line`` of the declaration (the ``OpLibrary(...)`` call)
    source: str | None = field(default=None, eq=False)
    origin: Origin | None = field(default=None, eq=False, order=False)
    #: the compiled library whose ``TORCH_LIBRARY`` defines this namespace's
    #: declared ops (``None``: opregistry defines them from Python)
    native: NativeLibrary | None = None

    def __attrs_post_init__(self) -> None:
        if self.closed and self.kind != "DEF":
            raise DeclarationError(
                f"namespace {self.name!r}: only the DEF of a namespace can close it "
                f"(closed=True on a FRAGMENT means nothing)"
            )


@frozen(kw_only=True)
class OpDef:
    """One operator: ``namespace::name.overload`` and its schema.

    ``schema`` is the signature without the name, as
    :func:`torch.library.infer_schema` returns it: ``"(Tensor x) -> Tensor"``.
    ``samples`` names a function returning sample inputs for ``opcheck``: a
    list of ``(args, kwargs)`` pairs, or of objects with ``.args`` and
    ``.kwargs`` (as torch's ``SampleInput``).
    """

    namespace: str
    name: str
    schema: str
    overload: str = ""
    mutates_args: tuple[str, ...] | None = field(
        default=None, converter=attrs.converters.optional(tuple)
    )
    tags: tuple[str, ...] = field(default=(), converter=tuple)
    samples: KernelRef | None = field(default=None, validator=_check_ref)
    doc: str = ""
    source: str | None = field(default=None, eq=False)
    origin: Origin | None = field(default=None, eq=False, order=False)

    @property
    def qualname(self) -> str:
        """``ns::name`` or ``ns::name.overload``, as torch spells it."""
        return f"{self.namespace}::{self.name_with_overload}"

    @property
    def base_qualname(self) -> str:
        """``ns::name``: the op packet, every overload of it."""
        return f"{self.namespace}::{self.name}"

    @property
    def name_with_overload(self) -> str:
        return f"{self.name}.{self.overload}" if self.overload else self.name

    @property
    def full_schema(self) -> str:
        """The schema string given to ``Library.define``."""
        return f"{self.name_with_overload}{self.schema}"


# -- conditions of kernel candidates (opregistry.selection runs them) --------------------

_CLAUSE = re.compile(r"\s*(>=|<=|==|!=|>|<)\s*(\d+(?:\.\d+)*)\s*\Z")
_NAME = re.compile(r"\s*([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*(.*)\Z")
_RELEASE = re.compile(r"\d+(?:\.\d+)*")
_COMPARE: dict[str, Callable[[tuple[int, ...], tuple[int, ...]], bool]] = {
    ">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b, "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b, ">": lambda a, b: a > b, "<": lambda a, b: a < b,
}
_EXAMPLE = "'>=2.10,<2.15'"


def parse_range(text: str, what: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """``">=2.10,<2.15"`` as ``((">=", (2, 10)), ("<", (2, 15)))``.

    The subset of PEP 440 specifiers conditions need: comparisons of release
    numbers, joined by commas.  Anything else is a :class:`DeclarationError`.
    """
    if not isinstance(text, str) or not text.strip():
        raise DeclarationError(f"{what}: {text!r} is not a version range; write e.g. {_EXAMPLE}")
    clauses = []
    for part in text.split(","):
        found = _CLAUSE.match(part)
        if found is None:
            raise DeclarationError(
                f"{what}: {part.strip()!r} in {text!r} is not a version comparison; write "
                f"e.g. {_EXAMPLE} (operators >=, <=, ==, !=, >, <; release numbers only)")
        clauses.append((found.group(1), tuple(int(p) for p in found.group(2).split("."))))
    return tuple(clauses)


def in_range(version: str | tuple[int, ...], clauses: Iterable[tuple[str, tuple[int, ...]]]) -> bool:
    """Whether ``version`` (``"2.13.0+cpu"`` or a tuple) satisfies every clause."""
    if isinstance(version, str):
        found = _RELEASE.match(version)
        release: tuple[int, ...] = tuple(int(p) for p in found.group(0).split(".")) if found else ()
    else:
        release = tuple(version)
    for op, wanted in clauses:
        width = max(len(release), len(wanted))
        a = release + (0,) * (width - len(release))
        b = wanted + (0,) * (width - len(wanted))
        if not _COMPARE[op](a, b):
            return False
    return True


def parse_requirement(text: str) -> tuple[str, str]:
    """``"triton>=3.2"`` as ``("triton", ">=3.2")``; the range may be empty."""
    found = _NAME.match(text) if isinstance(text, str) else None
    if found is None:
        raise DeclarationError(
            f"requires: {text!r} is not a requirement; write e.g. 'triton>=3.2'")
    name, spec = found.group(1), found.group(2).strip()
    if spec:
        parse_range(spec, f"requires {text!r}")
    return name, spec


def _strings(value: Any, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise DeclarationError(f"{what} must be a string or a list of strings, not {value!r}")


@frozen(kw_only=True)
class Condition:
    """When a kernel candidate may serve: all of the given conditions must hold.

    :param torch: torch versions, ``">=2.10,<2.15"`` (read from torch's files).
    :param requires: installed Python distributions, ``["triton>=3.2"]``
        (``importlib.metadata``; nothing is imported).
    :param capability: CUDA compute capability of the call's device,
        ``">=9.0"`` (a CUDA kernel only; read on the first call on each device).
    :param platform: ``sys.platform`` prefixes, ``"linux"`` or ``["linux", "win32"]``.
    """

    torch: str | None = None
    requires: tuple[str, ...] = field(default=(), converter=lambda v: _strings(v, "requires"))
    capability: str | None = None
    platform: tuple[str, ...] = field(default=(), converter=lambda v: _strings(v, "platform"))

    def __attrs_post_init__(self) -> None:
        if self.torch is not None:
            parse_range(self.torch, "torch")
        for requirement in self.requires:
            parse_requirement(requirement)
        if self.capability is not None:
            parse_range(self.capability, "capability")

    @classmethod
    def of(cls, value: Condition | Mapping[str, Any] | None) -> Condition | None:
        """A :class:`Condition` from itself or a mapping of its fields (``when={...}``)."""
        if value is None or isinstance(value, Condition):
            return value
        if not isinstance(value, Mapping):
            raise DeclarationError(
                f"when= must be a dict (torch, requires, capability, platform) or an "
                f"opregistry.Condition, not {type(value).__name__}")
        unknown = sorted(set(value) - {f.name for f in attrs.fields(cls)})
        if unknown:
            raise DeclarationError(
                f"when= has unknown condition(s) {unknown}; known: torch, requires, "
                f"capability, platform")
        return cls(**value)

    def describe(self) -> str:
        parts = []
        if self.torch:
            parts.append(f"torch{self.torch}")
        parts += list(self.requires)
        if self.capability:
            parts.append(f"capability{self.capability}")
        if self.platform:
            parts.append("platform " + "|".join(self.platform))
        return ", ".join(parts)

    def unmet(self, torch_version: str | None) -> str | None:
        """Why the load-time conditions fail here, or ``None`` when they hold."""
        from importlib import metadata

        if self.torch is not None:
            if torch_version is None:
                return "torch is not installed"
            if not in_range(torch_version, parse_range(self.torch, "torch")):
                return f"torch {torch_version} is not {self.torch}"
        for requirement in self.requires:
            name, spec = parse_requirement(requirement)
            try:
                installed = metadata.version(name)
            except metadata.PackageNotFoundError:
                return f"{name} is not installed (needs {requirement})"
            if spec and not in_range(installed, parse_range(spec, requirement)):
                return f"{name} {installed} is not {spec}"
        if self.platform and not any(sys.platform.startswith(p) for p in self.platform):
            return f"platform {sys.platform} is not {'|'.join(self.platform)}"
        return None


@frozen(kw_only=True)
class Kernel:
    """An implementation of an op for one dispatch key.

    ``key`` accepts torch's dispatch-key names (``CPU``, ``CUDA``,
    ``PrivateUse1``, ``Meta``, ``Autograd``, ``FuncTorchBatched``) and the
    aliases op authors use (``cpu``, ``cuda``, ``fake``, ``autograd``,
    ``vmap``); it is stored canonical.  ``setup_context`` is only meaningful
    for ``Autograd``.  ``override=True`` asks to replace a kernel another
    distribution (or torch) registered for the same key; the user's policy
    must allow it too.
    """

    op: str
    key: str = field(converter=_keys.canonical_key)
    fn: KernelRef = field(validator=_check_ref)
    setup_context: KernelRef | None = field(default=None, validator=_check_ref)
    override: bool = False
    #: a Triton kernel (``torch.library.triton_op`` semantics): ``fn`` calls
    #: ``wrap_triton(kernel)[grid](...)``; only for a device key
    triton: bool = False
    #: the Tensor subclass or ``TorchDispatchMode`` of a ``TorchDispatch[...]`` rule
    dispatch_class: KernelRef | None = field(default=None, validator=_check_ref)
    #: a candidate's conditions (:mod:`opregistry.selection`): checked once at load ...
    when: Condition | None = field(default=None, converter=Condition.of)
    #: ... and per call: a function of the op's arguments, true to take the call
    predicate: KernelRef | None = field(default=None, validator=_check_ref)
    #: candidates of one (op, key) are tried by priority, highest first
    priority: int = 0
    source: str | None = field(default=None, eq=False)
    origin: Origin | None = field(default=None, eq=False, order=False)
    #: a C++ kernel (``TORCH_LIBRARY_IMPL``) of the distribution's native library:
    #: registered by loading the library, never by a backend; ``fn`` names the library
    native: bool = False
    #: the library of a C++ kernel declared in an IMPL library
    #: (``OpLibrary(ns, "IMPL", native=...)``): its ``TORCH_LIBRARY_IMPL`` blocks add
    #: kernels to ops another distribution defines.  ``None`` for the C++ kernels of a
    #: DEF or FRAGMENT library's own ops (the namespace's library registers them)
    library: NativeLibrary | None = None

    @property
    def conditional(self) -> bool:
        """Whether this kernel is a candidate with conditions (it may decline)."""
        return self.when is not None or self.predicate is not None

    @property
    def per_call(self) -> bool:
        """Whether a call may be declined by this kernel's conditions."""
        return self.predicate is not None or (
            self.when is not None and self.when.capability is not None)

    def __attrs_post_init__(self) -> None:
        if not _keys.is_known_key(self.key):
            raise DeclarationError(
                f"kernel for {self.op}: unknown dispatch key {self.key!r}; "
                f"{_keys.suggest_key(self.key)}",
                op=self.op,
                key=self.key,
            )
        _check_kind(self)
        if self.library is not None and not self.native:
            raise DeclarationError(f"kernel for {self.op} on {self.key}: a native library "
                                   f"belongs to a C++ kernel (native=True)",
                                   op=self.op, key=self.key)
        if self.setup_context is not None and self.key != "Autograd":
            raise DeclarationError(
                f"kernel for {self.op} on {self.key}: setup_context only belongs to "
                f"an Autograd kernel"
            )
        if not isinstance(self.priority, int) or isinstance(self.priority, bool):
            raise DeclarationError(
                f"kernel for {self.op} on {self.key}: priority must be an int, "
                f"not {self.priority!r}", op=self.op, key=self.key)
        if (self.conditional or self.priority) and self.key not in _keys.DEVICE_KEYS \
                and self.key not in _keys.COMPOSITE_KEYS:
            raise DeclarationError(
                f"kernel for {self.op} on {self.key}: conditions and priorities choose "
                f"between device kernels (a key such as CPU, CUDA, or 'default'); a {self.key} "
                f"kernel has none", op=self.op, key=self.key)
        if self.when is not None and self.when.capability is not None and self.key != "CUDA":
            raise DeclarationError(
                f"kernel for {self.op} on {self.key}: a compute-capability condition "
                f"belongs to a CUDA kernel", op=self.op, key=self.key)

    @property
    def namespace(self) -> str:
        return self.op.split("::", 1)[0]


#: keys whose kernels are plain functions: nothing more to check (the common case, first)
_PLAIN_KEYS: frozenset[str] = (frozenset(_keys.DEVICE_KEYS) | frozenset(_keys.FUNCTIONALITY_KEYS)
                               | frozenset(_keys.COMPOSITE_KEYS))


def _check_kind(k: Kernel) -> None:
    """The rules of the registration kinds that are not plain kernels (autocast, Triton, torch_dispatch)."""
    if k.key in _PLAIN_KEYS and not k.triton and k.dispatch_class is None:
        return
    if k.key in _keys.AUTOCAST_KEYS:
        dtype = k.fn.partition(":")[2] if isinstance(k.fn, str) and k.fn.startswith("torch:") else None
        if dtype not in _keys.AUTOCAST_DTYPES.values():
            raise DeclarationError(
                f"autocast rule for {k.op} on {_keys.AUTOCAST_KEYS[k.key]} (key {k.key!r}): "
                f"cast_inputs must be a "
                f"floating torch.dtype (torch.float16, torch.bfloat16, torch.float32 or "
                f"torch.float64), got {describe_ref(k.fn)!r}", op=k.op, key=k.key)
    if k.triton and k.key not in _keys.DEVICE_KEYS:
        raise DeclarationError(
            f"Triton kernel for {k.op}: {k.key!r} is not a device key; a Triton kernel is "
            f"declared for a device type (triton={{'cuda': ...}})", op=k.op, key=k.key)
    is_rule = _keys.family(k.key) == _keys.TORCH_DISPATCH
    if is_rule != (k.dispatch_class is not None) or k.key == _keys.TORCH_DISPATCH:
        raise DeclarationError(
            f"kernel for {k.op} on {k.key!r}: a torch_dispatch rule needs its class "
            f"(torch_dispatch={{'module:Mode': 'module:rule'}}), and only a torch_dispatch rule "
            f"has one", op=k.op, key=k.key)


def autocast_dtype(cast_inputs: Any) -> str:
    """``"torch:bfloat16"`` for ``torch.bfloat16``, ``"bfloat16"`` or ``"torch.bfloat16"``.

    An autocast rule's "kernel" is the dtype it casts to, referenced like a
    kernel (``module:attribute``) so that declaring it imports nothing;
    anything else is returned as given, for :class:`Kernel` to refuse.
    """
    text = str(cast_inputs) if type(cast_inputs).__name__ == "dtype" else cast_inputs
    if isinstance(text, str):
        name = text.removeprefix("torch.").removeprefix("torch:")
        if name in _keys.AUTOCAST_DTYPES:
            return f"torch:{_keys.AUTOCAST_DTYPES[name]}"
    return cast_inputs
@frozen
class Candidate:
    """A kernel with conditions, as a value of ``define(kernels={...})``.

    ``kernels={"cuda": [Candidate("pkg.triton:f", when={"requires": "triton>=3.2"},
    predicate="pkg.triton:fits"), "pkg.kernels:f"]}``: the first whose
    conditions hold serves, the others are fallbacks (``docs/op-authors.md``).
    """

    fn: KernelRef = field(validator=_check_ref)
    when: Any = None
    predicate: KernelRef | None = field(default=None, kw_only=True, validator=_check_ref)
    priority: int = field(default=0, kw_only=True)


@frozen(kw_only=True)
class Backend:
    """What a backend plugin serves: one or more dispatch keys.

    ``device_type`` is the ``torch.device`` type for device backends
    (``"cpu"``, ``"cuda"``, ``"privateuseone"``), ``None`` for the others.
    """

    name: str
    keys: tuple[str, ...] = field(converter=lambda ks: tuple(_keys.canonical_key(k) for k in ks))
    device_type: str | None = None
    description: str = ""
    origin: Origin | None = field(default=None, eq=False, order=False)

    def __attrs_post_init__(self) -> None:
        unknown = [k for k in self.keys if not _keys.is_known_key(k)]
        if unknown:
            raise DeclarationError(
                f"backend {self.name!r} serves unknown dispatch key(s) {unknown}; "
                f"{_keys.suggest_key(unknown[0])}"
            )


#: the longest message, hint or source :meth:`Problem.text` shows whole
TEXT_LIMIT = 600


def elide(text: str, limit: int | None = TEXT_LIMIT) -> str:
    """``text`` if it has at most ``limit`` characters, else its head and tail around a marker.

    ``"ab...[12,345 characters elided]...yz"``: both ends stay, because a
    schema's name is at the start and what went wrong is often at the end.
    The result has at most ``limit`` characters (for ``limit >= 60``).
    """
    if limit is None or len(text) <= limit:
        return text
    marker = f" ...[{len(text):,} characters elided]... "  # no shorter than the real one
    keep = max(limit - len(marker), 20)
    head = keep - keep // 3
    tail = keep - head
    cut = len(text) - head - tail
    marker = f" ...[{cut:,} characters elided]... "
    return f"{text[:head]}{marker}{text[len(text) - tail:]}"


#: ``error`` leaves a distribution out; ``warning`` and ``info`` (an op without a
#: vmap rule, say) are reported and change nothing
Severity = Literal["error", "warning", "info"]


@frozen(kw_only=True)
class Problem:
    """Something wrong, found by discovery, resolution or materialization.

    ``culprits`` are the distributions left out because of it (every
    distribution named in an error); ``others`` are named for context only
    (the owner whose kernel would have been overridden, say).
    """

    code: str
    message: str
    hint: str = ""
    severity: Severity = "error"
    culprits: tuple[Origin, ...] = ()
    others: tuple[Origin, ...] = ()
    op: str | None = None
    key: str | None = None
    namespace: str | None = None
    source: str | None = None
    #: the exception behind the problem, as an opregistry error whose
    #: ``__cause__`` is the original (pluggy's ``PluginValidationError``, the
    #: plugin's ``ImportError``...); ``None`` for rules the resolver checks
    error: BaseException | None = field(default=None, eq=False, repr=False)

    def __str__(self) -> str:
        return self.text()

    def text(self, limit: int | None = TEXT_LIMIT) -> str:
        """One line: ``[code] message (at source) -> hint``, each part elided to ``limit``.

        :attr:`message` and :attr:`hint` stay whole (``to_dict``, ``--json``);
        text for people is bounded, because they quote user strings -- a
        100,000-character schema would otherwise fill a terminal.
        ``limit=None`` keeps everything.
        """
        text = f"[{self.code}] {elide(self.message, limit)}"
        if self.source:
            text += f" (at {elide(self.source, limit)})"
        if self.hint:
            text += f" -> {elide(self.hint, limit)}"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "severity": self.severity,
            "message": self.message,
            "hint": self.hint,
            "distributions": [o.dist for o in self.culprits],
            "entry_points": [o.entry_point_spec for o in self.culprits],
            "others": [o.dist for o in self.others],
            "op": self.op,
            "key": self.key,
            "namespace": self.namespace,
            "source": self.source,
        }


@frozen
class Plugin:
    """A loaded entry point: the object it names, and where it came from."""

    origin: Origin
    obj: Any = attrs.field(eq=False, repr=False)


@frozen
class Skipped:
    """An entry point that was found but not loaded, and why.

    ``deferred`` marks one whose module was still being imported -- a
    decorator-style op package that imports torch before it defines its ops,
    imported before torch: :meth:`opregistry.Registry.complete` loads it once
    the import has finished.
    """

    origin: Origin
    reason: str
    deferred: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"distribution": self.origin.dist, "entry_point": self.origin.entry_point_spec,
                "reason": self.reason, "deferred": self.deferred}


@frozen
class Discovered:
    """What discovery hands to collection: loaded plugins, skipped ones, problems."""

    plugins: tuple[Plugin, ...]
    skipped: tuple[Skipped, ...]
    problems: tuple[Problem, ...]


@frozen(kw_only=True)
class Declarations:
    """Everything the admitted plugins declared, with problems found so far."""

    namespaces: tuple[Namespace, ...] = field(default=(), converter=tuple)
    ops: tuple[OpDef, ...] = field(default=(), converter=tuple)
    kernels: tuple[Kernel, ...] = field(default=(), converter=tuple)
    backends: tuple[Backend, ...] = field(default=(), converter=tuple)
    #: backend name -> whether it can run on this machine
    available: dict[str, bool] = field(factory=dict, eq=False)
    #: every distribution whose plugin loaded
    distributions: tuple[Origin, ...] = field(default=(), converter=tuple)
    skipped: tuple[Skipped, ...] = field(default=(), converter=tuple)
    problems: tuple[Problem, ...] = field(default=(), converter=tuple)
    #: the ``opregistry_*`` hooks each loaded plugin implements
    hooks: dict[Origin, tuple[str, ...]] = field(factory=dict, eq=False)
