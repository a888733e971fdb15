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

:func:`plan_natives` then lists, for the materializer, each admitted library
with the schemas and (op, key) pairs it must register.
"""

from __future__ import annotations

import importlib.util
import os

from ..keys import installed_torch_build
from ..model import NativeLibrary, Namespace
from ..plan import NamespacePlan, NativePlan, OpPlan
from .context import Context, dist_name

__all__ = ["check_natives", "plan_natives"]


def _release(version: str) -> str:
    """``"2.13.0+cu128"`` -> ``"2.13.0"``: the release, without the local label."""
    return version.partition("+")[0]


def _missing(library: NativeLibrary) -> str | None:
    """Why ``library`` cannot be found without loading it, or ``None``."""
    if library.path is not None:
        return None if os.path.isfile(library.path) else f"the file {library.path} does not exist"
    try:
        found = importlib.util.find_spec(library.module)  # type: ignore[arg-type]
    except (ImportError, ValueError) as exc:
        return f"module {library.module} cannot be found ({exc})"
    return None if found is not None else f"module {library.module} does not exist"


def _refuse(ctx: Context, ns: Namespace) -> None:
    library = ns.native
    assert library is not None
    missing = _missing(library)
    if missing is not None:
        ctx.refuse("native-library-missing",
                   f"{ns.origin} declares the native library of namespace {ns.name!r}, but "
                   f"{missing}; nothing of {dist_name(ns.origin)} is loaded",
                   f"reinstall {dist_name(ns.origin)} (its build may have failed), or block it "
                   f"with OPREGISTRY_BLOCK={dist_name(ns.origin)}",
                   (ns.origin,), namespace=ns.name, source=ns.source)
        return
    installed = installed_torch_build()
    if installed is None:
        return  # no torch installed: nothing can load, and the resolver says so elsewhere
    why = library.mismatch(*installed)
    if why is not None:
        ctx.refuse("native-torch-mismatch",
                   f"{ns.origin}: the native library {library.target} of namespace {ns.name!r} "
                   f"was built for {library.built_for()}; the installed torch is "
                   f"{installed[0]}" + (f" (CUDA {installed[1]})" if installed[1] else "")
                   + f" ({why}): it is not loaded",
                   f"install the build of {dist_name(ns.origin)} made for torch "
                   f"{_release(installed[0])} (or rebuild it: pip install --no-build-isolation "
                   f"--force-reinstall ...), or install torch=={_release(library.torch or '?')}",
                   (ns.origin,), namespace=ns.name, source=ns.source)


def check_natives(ctx: Context) -> None:
    """Refuse native libraries that are missing or built for another torch."""
    for ns in ctx.namespaces:
        if ns.native is not None:
            _refuse(ctx, ns)


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
                              if k.kernel.native and k.status == "native"))))
    return tuple(sorted(plans, key=lambda p: (p.namespace, p.origin.distribution)))
