"""Native libraries (C++ ``TORCH_LIBRARY`` blocks): what can be refused before one is loaded.

A native library is declared on its namespace
(``OpLibrary(ns, native=NativeLibrary(...))``), so the namespace rules
(one DEF, FRAGMENTs, closed namespaces, allow/block lists) apply to it like
to any other, and a distribution they leave out never reaches the loader.
This module adds what only a compiled library has:

* ``native-torch-mismatch``: it was built for another torch (release or CUDA
  version) than the installed one, read from torch's files without importing
  it.  libtorch has no stable C++ ABI: loading it could fail with an
  undefined symbol, or worse, load and crash.  (The C++11 ABI flag is
  compared when the library is loaded: only a running torch says it.)
* ``native-library-missing``: the module to import or the file to load is
  not there (a build that did not happen, a wheel without its ``.so``).
* ``native-load-failed``, before loading: the file is no shared library of
  this platform (its first bytes are not ELF, Mach-O or PE): loading it
  would fail the same way.

An IMPL library's native library (``OpLibrary(ns, "IMPL", native=...)``) only
adds C++ kernels, each declared (``impl(op, native=[keys])``) and judged by the
kernel rules like any other (conflicts, overrides, an op someone defines);
``native-kernel-displaced`` refuses one the rules keep from serving, since
loading its library would register it all the same.

:func:`plan_natives` then lists, for the materializer, each admitted library
with the schemas and (op, key) pairs it must register.
"""

from __future__ import annotations

from typing import Iterable

from ..errors import DOCS_URL
from ..kinds import NativeKernel
from ..model import Kernel, NativeLibrary, Origin
from ..plans import NamespacePlan, NativePlan, OpPlan
from .context import Context, dist_name

__all__ = ["check_native_impls", "check_natives", "plan_natives"]


def _release(version: str) -> str:
    """``"2.13.0+cu128"`` -> ``"2.13.0"``: the release, without the local label."""
    return version.partition("+")[0]


def _refuse(ctx: Context, library: NativeLibrary, origin: Origin | None, namespace: str,
            source: str | None) -> None:
    missing = ctx.env.natives.get(library.target)
    if missing is not None:
        ctx.refuse("native-library-missing",
                   f"{origin} declares the native library of namespace {namespace!r}, but "
                   f"{missing}; nothing of {dist_name(origin)} is loaded",
                   f"reinstall {dist_name(origin)} (its build may have failed), or block it "
                   f"with OPREGISTRY_BLOCK={dist_name(origin)}",
                   (origin,), namespace=namespace, source=source)
        return
    broken = ctx.env.natives_broken.get(library.target)
    if broken is not None:
        file, why = broken
        ctx.refuse("native-load-failed",
                   f"{origin}: the native library {file} of namespace {namespace!r} cannot be "
                   f"loaded: {why}; nothing of {dist_name(origin)} is loaded",
                   f"reinstall {dist_name(origin)} (its build may have failed or been "
                   f"replaced), or block it with OPREGISTRY_BLOCK={dist_name(origin)}",
                   (origin,), namespace=namespace, source=source)
        return
    installed = ctx.env.torch_build
    if installed is None:
        return  # no torch installed: nothing can load, and the resolver says so elsewhere
    why = library.mismatch(*installed)
    if why is not None:
        ctx.refuse("native-torch-mismatch",
                   f"{origin}: the native library {library.target} of namespace {namespace!r} "
                   f"was built for {library.built_for()}; the installed torch is "
                   f"{installed[0]}" + (f" (CUDA {installed[1]})" if installed[1] else "")
                   + f" ({why}): it is not loaded",
                   f"install the build of {dist_name(origin)} made for torch "
                   f"{_release(installed[0])} (or rebuild it: pip install --no-build-isolation "
                   f"--force-reinstall ...), or install torch=={_release(library.torch or '?')}",
                   (origin,), namespace=namespace, source=source)


def _impl_library(k: Kernel) -> NativeLibrary | None:
    """The IMPL library of a C++ kernel declared by ``impl(op, native=[...])``, else ``None``."""
    return k.payload.library if isinstance(k.payload, NativeKernel) else None


def _impl_libraries(kernels: Iterable[Kernel]) -> dict[tuple[str, NativeLibrary], list[Kernel]]:
    """The C++ kernels of IMPL libraries, by (distribution, library), in declaration order."""
    found: dict[tuple[str, NativeLibrary], list[Kernel]] = {}
    for k in kernels:
        library = _impl_library(k)
        if library is not None:
            found.setdefault((dist_name(k.origin), library), []).append(k)
    return found


def _python_registrations(ctx: Context, library: NativeLibrary, origin: Origin | None,
                          namespace: str) -> tuple[str, str] | None:
    """``(distribution, file:line)`` when another distribution registers ``namespace`` from
    Python in the package ``library`` imports (the scan says so), else ``None``."""
    scan = ctx.env.foreign
    if scan is None or library.module is None:
        return None
    top = library.module.split(".")[0]
    for dist in scan.distributions:
        if dist.name == dist_name(origin) or dist.is_plugin:
            continue
        for reg in dist.registrations:
            if (reg.namespace == namespace and reg.file.endswith(".py")
                    and reg.kind in ("DEF", "FRAGMENT", "library", "op")
                    and reg.module.split(".")[0] == top):
                return dist.distribution.text, f"{reg.api} at {reg.source}"
    return None


def _refuse_python(ctx: Context, library: NativeLibrary, origin: Origin | None,
                   namespace: str, source: str | None) -> bool:
    """A native library declared for a package that registers from Python: refused.

    Loading it as a native library would list its Python ops as C++, then
    judge what its import registers as registered behind the plan's back --
    undone, leaving the package broken.  Adoption is the way in.
    """
    found = _python_registrations(ctx, library, origin, namespace)
    if found is None:
        return False
    dist, where = found
    ctx.refuse("native-library-registers-from-python",
               f"{origin} declares NativeLibrary(module={library.module!r}) for namespace "
               f"{namespace!r}, but {dist} registers that namespace from Python ({where}), at "
               f"its own import, not from a C++ TORCH_LIBRARY block; nothing of "
               f"{dist_name(origin)} is loaded, and {dist.split('==')[0]} is left as it is",
               f"NativeLibrary is for compiled libraries; to bring {dist.split('==')[0]} into "
               f"the registry, adopt it: an opregistry_adoptions hook returning "
               f"Adoption(distribution={dist.split('==')[0]!r}), or nothing at all (it is "
               f"adopted lazily by default), see {DOCS_URL}ecosystem/#adoption",
               (origin,), namespace=namespace, source=source)
    return True


def check_natives(ctx: Context) -> None:
    """Refuse native libraries that are missing or built for another torch, or not native."""
    for ns in ctx.namespaces:
        if ns.native is not None and not _refuse_python(ctx, ns.native, ns.origin, ns.name,
                                                        ns.source):
            _refuse(ctx, ns.native, ns.origin, ns.name, ns.source)
    for (_, library), kernels in sorted(_impl_libraries(ctx.kernels).items(),
                                        key=lambda item: (item[0][0], item[0][1].target)):
        first = kernels[0]
        _refuse(ctx, library, first.origin, first.namespace, first.source)


def check_native_impls(ctx: Context, ops: dict[str, OpPlan]) -> None:
    """Refuse an IMPL library's C++ kernel that the rules keep from serving.

    Loading the library registers every kernel of its ``TORCH_LIBRARY_IMPL``
    blocks: one that another distribution's kernel overrides, or that the
    user switched off, would be registered all the same.  Its library is not
    loaded, and its distribution is left out, before torch sees either.
    """
    for k in ctx.kernels:
        library = _impl_library(k)
        if library is None or k.op not in ops:
            continue
        planned = next((p for p in ops[k.op].kernels if p.kernel is k), None)
        if planned is None or planned.status == "native":
            continue
        why = planned.reason or planned.status
        ctx.refuse("native-kernel-displaced",
                   f"{k.origin} declares a C++ {k.key} kernel for {k.op} (native library "
                   f"{library.target}), but it would not serve ({planned.status}: {why}); "
                   f"loading the library would register it all the same, so it is not loaded",
                   f"drop the kernel that overrides it (or the switch), or block "
                   f"{dist_name(k.origin)} (OPREGISTRY_BLOCK={dist_name(k.origin)})",
                   (k.origin,), op=k.op, key=k.key, source=k.source)


def plan_natives(ctx: Context, namespaces: dict[str, NamespacePlan],
                 ops: dict[str, OpPlan]) -> tuple[NativePlan, ...]:
    """The admitted native libraries, each with the schemas and keys it must register."""
    plans = []
    for ns in ctx.namespaces:
        if ns.native is None or ns.origin is None or ns.name not in namespaces:
            continue
        admitted = namespaces[ns.name]
        if ns.origin != admitted.owner and ns.origin not in admitted.fragments:
            continue
        dist = dist_name(ns.origin)
        own = [op for op in ops.values()
               if op.op.namespace == ns.name and dist_name(op.op.origin) == dist]
        plans.append(NativePlan(
            namespace=ns.name, kind=ns.kind, library=ns.native, origin=ns.origin,
            ops=tuple(sorted((op.op.qualname, f"{ns.name}::{op.op.full_schema}") for op in own)),
            keys=tuple(sorted((k.kernel.op, k.kernel.key) for op in own for k in op.kernels
                              if isinstance(k.kernel.payload, NativeKernel)
                              and k.kernel.payload.library is None
                              and k.status == "native"))))
    for (dist, library), kernels in _impl_libraries(ctx.kernels).items():
        keys = {(k.op, k.key) for k in kernels
                for p in (ops[k.op].kernels if k.op in ops else ())
                if p.kernel is k and p.status == "native"}
        if len(keys) != len(kernels):
            continue  # refused (an IMPL library loads whole, or not at all)
        origin = kernels[0].origin
        assert origin is not None
        plans.append(NativePlan(namespace=min(k.namespace for k in kernels), kind="IMPL",
                                library=library, origin=origin, keys=tuple(sorted(keys))))
    return tuple(sorted(plans, key=lambda p: (p.namespace, p.origin.distribution, p.kind)))
