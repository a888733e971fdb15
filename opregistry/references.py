"""How declarations name code without importing it: ``"module:attribute"`` references and native libraries.

A kernel, a fake kernel, a predicate or a samples function is given either
as the callable itself or as a reference string in the form of an entry
point's value, ``"package.module:function"``, imported only when the kernel
is materialized.  A compiled library (``TORCH_LIBRARY`` blocks) is named by a
:class:`NativeLibrary`: the extension module to import or the shared library
to load.  Nothing here imports the code it names.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Union

import attrs
from attrs import field, frozen

from .errors import DeclarationError
from .regular import open_regular

__all__ = ["KernelRef", "REFERENCE", "check_ref", "describe_ref", "is_reference",
           "NativeLibrary"]

#: A kernel is either a ``"package.module:function"`` string, imported only
#: when the kernel is materialized, or the callable itself.
KernelRef = Union[str, Callable[..., Any]]

#: the form of a reference: a dotted module, a colon, a dotted attribute path
REFERENCE = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*\Z")


def is_reference(value: object) -> bool:
    """Whether ``value`` is a well-formed ``"module:attribute"`` string."""
    return isinstance(value, str) and REFERENCE.match(value) is not None


def check_ref(instance: object, attribute: attrs.Attribute, value: object) -> None:
    """attrs validator: ``value`` is ``None``, a reference string or a callable."""
    if value is None:
        return
    if isinstance(value, str):
        if not REFERENCE.match(value):
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
        Read when the declaration is made (by the op package's declarations
        module), never by the resolver.
        """
        import json

        try:
            with open_regular(info, "r", encoding="utf-8") as fh:
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
