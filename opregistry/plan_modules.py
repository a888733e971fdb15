"""The code a plan runs: which modules each distribution's plan imports, and whether each exists.

Every piece of an op package's code the plan can run is named by a
``"module:attribute"`` reference (kernels, fakes, autograd formulas and
their ``setup_context``, vmap rules, ``torch_dispatch`` classes and rules,
predicates, sample inputs) or is a module the entry point names, or a native
library.  Two users, both before torch is imported and without running a
plugin's module (:mod:`opregistry.locate`):

* the lock (:mod:`opregistry.lockfile`) records a digest of every file those
  modules' imports run (:func:`modules_by_distribution`);
* ``opregistry doctor`` checks that each reference the materializer would
  import names a module and an attribute that exist
  (:func:`check_references`), so that a typo is reported at its op, with the
  verdict ``import torch`` would reach: the distribution is left out
  (there, ``materialize-failed``; here ``kernel-ref-missing`` /
  ``kernel-ref-invalid``, found without importing anything).
"""

from __future__ import annotations

import os
import sys
from typing import Iterable, Iterator

from .locate import attribute_status, locate_module, split_ref
from .model import Kernel, Problem
from .plans import KernelPlan, Plan

__all__ = ["modules_by_distribution", "check_references", "native_file_ref"]


def _kernel_refs(kernel: Kernel) -> Iterator[tuple[str, str, str]]:
    """``(what, reference, want)`` of each string reference of ``kernel`` that names Python code.

    The payload's references, as its kind lists them (an autocast rule's dtype
    names torch, a C++ kernel its library: neither is Python code of the
    distribution), and a candidate's predicate.
    """
    kind = kernel.kind
    for name, want in kind.references:
        ref = getattr(kernel.payload, name)
        if isinstance(ref, str) and want != "object":
            yield ("kernel" if name == kind.primary else name), ref, want
    if isinstance(kernel.predicate, str):
        yield "predicate", kernel.predicate, "callable"
    if kernel.when is not None and kernel.when.check:
        yield "load-time check", kernel.when.check, "callable"


def _all_kernels(plan: Plan) -> Iterator[KernelPlan]:
    for op in plan.ops:
        yield from op.kernels
    yield from plan.external_kernels


def native_file_ref(path: str) -> str | None:
    """``file:<name>`` of a native library's path, relative to the ``sys.path`` entry holding it.

    ``None`` when no entry holds it: its name would differ between machines.
    """
    full = os.path.abspath(path)
    for entry in sys.path:
        base = os.path.join(os.path.abspath(entry or os.curdir), "")
        if full.startswith(base):
            return "file:" + os.path.relpath(full, base).replace(os.sep, "/")
    return None


def modules_by_distribution(plan: Plan) -> dict[str, set[str]]:
    """Per distribution of the plan, every module (and native ``file:`` name) its plan may run.

    Its entry points' modules, and the module of every string reference of
    its kernels and ops, whatever their status: what is inactive here (no
    backend for the key) runs where the backend is installed.
    """
    out: dict[str, set[str]] = {}
    for origin in plan.distributions:
        module = origin.value.partition(":")[0].strip()
        if module:
            out.setdefault(origin.distribution, set()).add(module)
    for op in plan.ops:
        if isinstance(op.op.samples, str) and op.op.origin is not None:
            out.setdefault(op.op.origin.distribution, set()).add(split_ref(op.op.samples)[0])
    for k in _all_kernels(plan):
        if k.kernel.origin is None:
            continue
        mine = out.setdefault(k.kernel.origin.distribution, set())
        mine.update(split_ref(ref)[0] for _, ref, _ in _kernel_refs(k.kernel))
    for native in plan.natives:
        mine = out.setdefault(native.origin.distribution, set())
        if native.library.module is not None:
            mine.add(native.library.module)
        elif native.library.path is not None:
            mine.add(native_file_ref(native.library.path) or f"path:{native.library.path}")
    return out


def _imported_by_materialize(plan: Plan) -> Iterable[KernelPlan]:
    """The kernels whose references the materializer imports: the active ones."""
    return (k for k in _all_kernels(plan) if k.status == "active" and k.kernel.origin is not None)


def check_references(plan: Plan) -> list[Problem]:
    """A problem for each reference the materializer would import that cannot be imported.

    Static (:mod:`opregistry.locate`): a module that is not found, an
    attribute no statement of the module binds, an attribute bound only to a
    literal value where a callable is wanted, a function where a
    ``torch_dispatch`` class is wanted.  Whatever cannot be known without
    running the module is taken as fine.  One problem per distribution and
    reference, in the plan's order.
    """
    problems: list[Problem] = []
    seen: set[tuple[str, str, str]] = set()
    for k in _imported_by_materialize(plan):
        kernel = k.kernel
        for what, ref, want in _kernel_refs(kernel):
            assert kernel.origin is not None
            if what == "load-time check":
                continue  # one that fails is unmet, with its reason: registration goes on
            if (kernel.origin.distribution, ref, want) in seen:
                continue
            seen.add((kernel.origin.distribution, ref, want))
            module, attribute = split_ref(ref)
            status, why = attribute_status(locate_module(module), attribute, want)  # type: ignore[arg-type]
            if status in ("defined", "unknown"):
                continue
            code = "kernel-ref-missing" if status == "missing" else "kernel-ref-invalid"
            # unimportable (a SyntaxError, a top-level raise or sys.exit): invalid
            subject = f"the {kernel.key} kernel of {kernel.op}" if what == "kernel" else \
                f"the {what} of the {kernel.key} kernel of {kernel.op}"
            problems.append(Problem(
                code=code,
                message=f"{kernel.origin}: {subject} names {ref!r}, which cannot be imported: "
                        f"{why}; registration would leave {kernel.origin.distribution} out",
                hint=f"fix the reference in the declaration (a 'module:attribute' string naming "
                     f"{'a class' if want == 'class' else 'a function'} of an importable module)",
                culprits=(kernel.origin,), op=kernel.op, key=kernel.key, source=kernel.source))
    return problems + _adoption_sample_refs(plan)


def _adoption_sample_refs(plan: Plan) -> list[Problem]:
    """``adoption-samples-ref-invalid``: an adapter's ``Adoption(samples=...)`` reference that
    cannot be imported, checked as a kernel's is; only ``opregistry check`` imports it, so
    nobody is left out."""
    problems = []
    for adopted in plan.adoptions:
        adapter = adopted.declared_by[0] if adopted.declared_by else None
        for op, ref in sorted(adopted.samples.items()):
            module, attribute = split_ref(ref)
            status, why = attribute_status(locate_module(module), attribute, "callable")  # type: ignore[arg-type]
            if status in ("defined", "unknown"):
                continue
            problems.append(Problem(
                code="adoption-samples-ref-invalid", severity="warning",
                message=f"{adapter or adopted.name}: the sample inputs of {op} (adopted "
                        f"{adopted.distribution.text}) name {ref!r}, which cannot be imported: "
                        f"{why}; opregistry check fails it",
                hint="fix the reference in Adoption(samples=...) (a 'module:function' string "
                     "naming a function of an importable module)",
                culprits=(adapter,) if adapter else (), op=op))
    return problems
