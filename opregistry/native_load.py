"""Loading a native library an op package declares, and checking what it registered.

A library cannot be unloaded: one that loads but does not match its
declaration stays in the process; its distribution is left out (none of its
Python pieces is registered) and the problem says so.  The materializer
calls :func:`load_native` for each ``load-native`` step; the dispatcher is
compared before and after (C++ registrations bypass every Python hook).
"""

from __future__ import annotations

from typing import Iterable

import attrs

from . import guard
from .config import Policy
from .errors import MaterializationError
from .model import Origin, Problem
from .plans import NativePlan

__all__ = ["load_native", "load_failure"]


def load_failure(origin: Origin, what: str, exc: BaseException, op: str | None,
                 key: str | None, source: str | None) -> Problem:
    """The ``materialize-failed`` problem of a registration torch (or a plugin) raised on."""
    from .containment import describe

    message = f"{origin}: {what} failed: {describe(exc)}"
    error = MaterializationError(message, origin=origin, op=op, key=key)
    error.__cause__ = exc  # torch's own exception, for the traceback
    return Problem(
        code="materialize-failed",
        message=message,
        error=error,
        hint=f"fix {origin.distribution}; nothing of it was registered",
        culprits=(origin,),
        op=op,
        key=key,
        source=source,
    )


def load_native(native: NativePlan, watched: frozenset[str], policy: Policy,
                 warnings: list[Problem], planned: frozenset[str]) -> Problem | None:
    """Load ``native``'s library, contained, and check it registered what was declared.

    A library cannot be unloaded: one that loads but does not match its
    declaration stays in the process; its distribution is left out (none of
    its Python pieces is registered) and the problem says so.
    """
    from . import torch_state
    origin, library = native.origin, native.library
    where = (f"the native library {library.target} of namespace {native.namespace!r}"
             if native.kind != "IMPL" else
             f"the native library {library.target} (kernels for namespace {native.namespace!r})")
    version, abi, cuda = torch_state.torch_build()
    mismatch = library.mismatch(version, cuda, abi)
    if mismatch is not None:  # the C++11 ABI, which only a running torch tells
        return _native_problem(
            "native-torch-mismatch", origin, native,
            f"{origin}: {where} was built for {library.built_for()}; the running torch is "
            f"{version} ({mismatch}): it is not loaded",
            f"install the build of {origin.distribution} made for this torch, or rebuild it")
    ops_before, pairs_before = torch_state.dispatcher_registrations()
    outcome = guard.run(torch_state.load_native, library.module, library.path, origin=origin,
                        what=f"loading {library.target}", protected=watched, policy=policy,
                        owns=guard.owned_by(library.module) if library.module else None)
    warnings.extend(p for p in outcome.problems if p.severity != "error")
    if outcome.error is not None:
        problem = load_failure(origin, f"loading {where}", outcome.error, None, None, None)
        return attrs.evolve(problem, code="native-load-failed", namespace=native.namespace,
                            hint=f"rebuild or reinstall {origin.distribution} for this torch, or "
                                 f"block it (OPREGISTRY_BLOCK={origin.distribution})")
    errors = [p for p in outcome.problems if p.severity == "error"]
    if errors:
        return errors[0]
    ops_after, pairs_after = torch_state.dispatcher_registrations()
    # a replaced kernel first: unlike the rest, it changes what existing ops do
    return (_replacements(native, where, outcome.result or ())
            or _verify_native(native, where, ops_after, ops_after - ops_before,
                              torch_state.new_kernels(pairs_before, pairs_after), planned))


def _replacements(native: NativePlan, where: str,
                  replaced: Iterable[tuple[str, str, str]]) -> Problem | None:
    """A problem if the library replaced a kernel it does not own (``replaced_kernels``).

    Its own ops' declared keys are its own business; any other (op, key) --
    an aten kernel, another package's -- had a kernel already, which the
    library's ``TORCH_LIBRARY_IMPL`` pushed down.
    """
    origin = native.origin
    own = set(native.keys)
    found = sorted({(op, key, site) for op, key, site in replaced if (op, key) not in own})
    if not found:
        return None
    named = [f"{op} ({key}, registered at {site})" if site else f"{op} ({key})"
             for op, key, site in found]
    shown = ", ".join(named[:5]) + (f" and {len(named) - 5} more" if len(named) > 5 else "")
    return _native_problem(
        "native-undeclared-registration", origin, native,
        f"{origin}: {where} replaced the kernel torch already had for {shown}; "
        f"{origin.distribution} does not declare it (kernels for ops it does not own). The "
        f"replacement stays in effect (a shared library cannot be unloaded, and torch cannot "
        f"take back one C++ kernel); {origin.distribution} is left out.",
        f"a library that replaces other namespaces' kernels (aten's included) is not trusted: "
        f"block it (OPREGISTRY_BLOCK={origin.distribution}) or uninstall it, and restart the "
        f"process to get the original kernel back",
        op=found[0][0], key=found[0][1])


def _native_problem(code: str, origin: Origin, native: NativePlan, message: str, hint: str,
                    op: str | None = None, key: str | None = None) -> Problem:
    error = MaterializationError(message, origin=origin, op=op, key=key)
    return Problem(code=code, message=message, hint=hint, culprits=(origin,), op=op, key=key,
                   namespace=native.namespace, error=error)


def _verify_native(native: NativePlan, where: str, all_ops: frozenset[str],
                   new_ops: frozenset[str], new_pairs: frozenset[tuple[str, str]],
                   planned: frozenset[str]) -> Problem | None:
    """Compare what the library registered with its declaration; the first difference.

    Every op of its namespace must be declared (by it, or by another planned
    distribution): checked on the dispatcher's whole namespace, so that a
    library loaded before (by an earlier registry, or an import) is checked
    too.  Outside its namespace only what appeared during this load is seen.
    """
    from . import torch_state

    origin, ns = native.origin, native.namespace
    stays = (" The library stays loaded (a shared library cannot be unloaded); "
             f"{origin.distribution} is left out.")
    for qualname, declared in native.ops:
        found = torch_state.op_schema(qualname)
        if found is None:
            return _native_problem(
                "native-mismatch", origin, native,
                f"{origin}: {where} was loaded but does not define {qualname}, which "
                f"{origin.distribution} declares.{stays}",
                "declare what its TORCH_LIBRARY block defines, or rebuild it", op=qualname)
        if torch_state.normal_schema(found) != torch_state.normal_schema(declared):
            return _native_problem(
                "native-mismatch", origin, native,
                f"{origin}: {where} defines {found}, but {origin.distribution} declares "
                f"{declared}.{stays}",
                "make the declared schema (define(...)) the one in its TORCH_LIBRARY block",
                op=qualname)
    for qualname, key in native.keys:
        if key not in torch_state.kernel_registrations(qualname):
            return _native_problem(
                "native-mismatch", origin, native,
                f"{origin}: {where} was loaded but registers no {key} kernel for {qualname}, "
                f"which {origin.distribution} declares (native=[{key!r}]).{stays}",
                "declare the keys its TORCH_LIBRARY_IMPL blocks fill, or rebuild it",
                op=qualname, key=key)
    own = f"{ns}::"
    undeclared = sorted(op for op in all_ops if op.startswith(own) and op not in planned)
    # torch's Python modules imported meanwhile (by the extension module) may register
    # their own ops: what torch's files registered is torch's business
    torch_root = torch_state.torch_dir()

    def foreign(where: str | None) -> bool:
        return where is None or not where.startswith(torch_root)

    outside = sorted(op for op in new_ops if not op.startswith(own)
                     and foreign(torch_state.definition_site(op)))
    # an IMPL library owns no op: every (op, key) it was not declared for is foreign
    declared = frozenset(native.keys) if native.kind == "IMPL" else frozenset()
    touched = sorted(f"{op} ({key})" for op, key in new_pairs
                     if (not op.startswith(own) or native.kind == "IMPL")
                     and (op, key) not in declared and op not in new_ops
                     and foreign(torch_state.kernel_registrations(op).get(key)))
    if undeclared or outside or touched:
        found = undeclared + outside + touched
        shown = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
        return _native_problem(
            "native-undeclared-registration", origin, native,
            f"{origin}: {where} registered {shown} with torch, which {origin.distribution} "
            f"does not declare{' (kernels for ops it does not own)' if touched else ''}."
            f"{stays}",
            ("declare every kernel of its TORCH_LIBRARY_IMPL blocks (impl(op, native=[...])); a "
             if native.kind == "IMPL" else
             "declare every op of its TORCH_LIBRARY block (define(..., native=[...])); a ") +
            f"library that replaces kernels of other namespaces' ops is not trusted: block it "
            f"(OPREGISTRY_BLOCK={origin.distribution}) or uninstall it",
            op=found[0].partition(" ")[0])
    return None

