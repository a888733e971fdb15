"""Which distributions that register with torch by themselves are adopted, and how.

Reads the adoptions the plugins and packages declared
(:class:`~opregistry.adoption.Adoption`), the scan of the installed
distributions (:attr:`Environment.foreign <opregistry.environment.Environment.foreign>`)
and the user's switches (:meth:`Policy.adopts <opregistry.config.Policy.adopts>`,
kernel switches), and decides, per distribution, an
:class:`~opregistry.adoption.Adopted`: the namespaces it registers, the
modules imported on the first touch of each (or at load), and which of its
kernels a switch turns off.

Which modules: a declaration's ``modules``, or else, per namespace, the
top-level packages (below a namespace package, the first regular ones) of
the modules the scan found *defining* something in it (a library or an op),
at module level outside any condition when there are such -- what ``import
bitsandbytes`` imports, the package deciding which of
its modules load (bitsandbytes imports its CUDA kernels only where CUDA is
available; importing its XPU backend where there is no XPU would fail).
An op defined in a module the package does not import at its own import
(a torchao prototype) is imported when that op is looked up.  A namespace
a declaration names that the scan does not find for the package, without
``modules``, imports the package: the modules of its other namespaces, else
the import roots of its registering modules.
"""

from __future__ import annotations

import difflib
from typing import Iterable

import attrs

from ..adoption import Adopted, AdoptedKernel, Adoption
from ..config import canonical_name
from ..foreign import ForeignDistribution, ForeignScan, InstalledDistribution
from ..keys import COMPOSITE_KEYS, DEVICE_KEYS, RESERVED_NAMESPACES
from ..model import Origin
from .context import Context
from .foreign import owner_text

__all__ = ["plan_adoptions"]

#: registrations that make a namespace (or an op in it) exist
_DEFINING = frozenset({"DEF", "FRAGMENT", "library", "op"})


def _defining(scan: ForeignScan, dist: ForeignDistribution, namespace: str) -> dict[str, int]:
    """module -> 0 (defines something in ``namespace`` at import, outside any condition) or 1.

    A namespace read from a stripped library's strings counts only where no other
    distribution defines it by what its symbols or source say.
    """
    ranked: dict[str, int] = {}
    for reg in dist.registrations:
        if reg.namespace == namespace and reg.kind in _DEFINING and reg.module:
            if reg.inferred and scan.held_elsewhere(namespace, dist.name):
                continue
            rank = 0 if reg.at_import and not reg.conditional else 1
            ranked[reg.module] = min(rank, ranked.get(reg.module, rank))
    return ranked


def _entry_modules(scan: ForeignScan, dist: ForeignDistribution, namespace: str
                   ) -> tuple[str, ...]:
    """The packages of ``dist`` imported on the first touch of ``namespace``.

    The top-level packages of the modules that define something in it (at
    module level outside any condition, when there are such), or below a
    namespace package the first regular one (``optimum.quanto``): importing
    the package is what its users do, and brings what it registers at its
    own import.  An op defined in a module the package does not import is
    imported when that op is looked up (:func:`_op_modules`).
    """
    ranked = _defining(scan, dist, namespace)
    if not ranked:
        return ()
    best = min(ranked.values())
    order = [module for d, module in scan.importers(namespace) if d.name == dist.name]
    return tuple(dict.fromkeys(dist.import_root(m) for m in order if ranked.get(m) == best))


def _op_modules(dist: ForeignDistribution | None) -> tuple[tuple[str, str], ...]:
    """op -> the module that defines it (at module level first), for each op the scan names."""
    if dist is None:
        return ()
    found: dict[str, tuple[int, str]] = {}
    # an op a C++ library's schema string defines without a namespace: in each namespace the
    # library registers in (vLLM's _C ops, its library loaded by vllm.platforms.cuda)
    possible = [(op, reg) for op, reg in dist.possible_ops().items()]
    for op, reg in [(r.op, r) for r in dist.registrations if r.kind == "op"] + possible:
        if op and reg.module:
            rank = (0 if reg.at_import and not reg.conditional else 1, reg.module)
            if op not in found or rank < found[op]:
                found[op] = rank
    return tuple((op, module) for op, (_, module) in sorted(found.items()))


def _declared(adoptions: Iterable[Adoption]) -> dict[str, list[Adoption]]:
    """The declarations per adopted distribution, the package's own first, then by declarer."""
    out: dict[str, list[Adoption]] = {}
    for a in adoptions:
        out.setdefault(a.distribution, []).append(a)
    for found in out.values():
        found.sort(key=lambda a: (not a.by_itself, a.origin or Origin("", ""), a.source or ""))
    return out


def _chosen(ctx: Context, name: str, found: list[Adoption]) -> Adoption:
    """The declaration that decides how ``name`` loads; a disagreement is reported."""
    first = found[0]
    if first.by_itself:
        own = [a for a in found if a.by_itself]
        # the package's own entry points, one per namespace: merged
        first = Adoption(distribution=name, source=first.source,
                         load="eager" if any(a.load == "eager" for a in own) else "lazy",
                         namespaces=tuple(ns for a in own for ns in a.namespaces),
                         modules=tuple(dict.fromkeys(m for a in own for m in a.modules)))
        object.__setattr__(first, "origin", own[0].origin)
    others = [a for a in found if not a.by_itself and (a.load, a.modules) != (first.load,
                                                                             first.modules)]
    if others:
        ctx.warn("adoption-declared-twice",
                 f"{name} is adopted by {first.origin} (load={first.load!r}) and by "
                 f"{', '.join(str(a.origin) for a in others)}, which disagree; "
                 f"{first.origin} decides",
                 "remove one of the declarations, or make them agree",
                 others=tuple(a.origin for a in [first, *others] if a.origin is not None),
                 source=others[0].source)
    return first


def _namespaces(scan: ForeignScan | None, dist: ForeignDistribution | None,
                declared: Adoption | None) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """namespace -> modules imported on its first touch."""
    out: dict[str, tuple[str, ...]] = {}
    if dist is not None and scan is not None:
        for ns in sorted(dist.namespaces()):
            if ns in RESERVED_NAMESPACES:
                continue  # torch's own: a kernel it adds to aten is no reason to import it
            modules = _entry_modules(scan, dist, ns)
            if modules:
                out[ns] = modules
    if declared is not None:
        # a declared namespace the scan does not know imports the declared modules, or else
        # the package: what the scan's namespaces import, or the import roots of the modules
        # that register anything (``import bitsandbytes``), as its users would
        package = declared.modules or _package_modules(dist, out)
        for ns in declared.namespaces:
            out.setdefault(ns, package)
        if declared.modules:
            out = {ns: declared.modules for ns in out}
    return tuple(sorted((ns, modules) for ns, modules in out.items() if modules))


def _package_modules(dist: ForeignDistribution | None,
                     found: dict[str, tuple[str, ...]]) -> tuple[str, ...]:
    """What a namespace of ``dist`` that the scan cannot read imports: the modules of the
    namespaces it can (in order), else the import roots of those registering anything."""
    modules = tuple(dict.fromkeys(m for ns in sorted(found) for m in found[ns]))
    if modules or dist is None:
        return modules
    return tuple(dict.fromkeys(dist.import_root(r.module) for r in dist.registrations
                               if r.module))


#: what custom_op / triton_op register: one kernel of their own Library for every device,
#: choosing the function per call -- no Library.impl of a device kernel to leave out
_CUSTOM_OP = ("torch.library.custom_op", "torch.library.triton_op",
              "torch._library.custom_ops.custom_op", "torch._library.triton.triton_op")


def _custom_ops(dist: ForeignDistribution) -> frozenset[str]:
    """The ops ``dist`` defines with ``custom_op`` / ``triton_op``."""
    return frozenset(r.op for r in dist.registrations
                     if r.kind == "op" and r.op and (r.api in _CUSTOM_OP
                                                     or r.api.endswith(("custom_op", "triton_op"))))


def _kernels(ctx: Context, dist: ForeignDistribution | None) -> tuple[AdoptedKernel, ...]:
    """Its kernels, each with the switch that turns it off -- where torch allows it."""
    if dist is None:
        return ()
    out = []
    custom = _custom_ops(dist) if ctx.policy.kernels else frozenset()
    for reg in dist.registrations:
        if reg.kind != "kernel" or not reg.op or not reg.key:
            continue
        switch = None
        if ctx.policy.kernels and (reg.key in DEVICE_KEYS or reg.key in COMPOSITE_KEYS):
            switch = ctx.policy.disabled_by(reg.op, reg.key, dist.name,
                                            reg.key in COMPOSITE_KEYS, False)
        if switch is not None and (reg.op in custom or reg.api.startswith("custom_op.")):
            ctx.warn("kernel-switch-not-applied",
                     f"{switch.source} switches off the {reg.key} kernel of {reg.op} "
                     f"({dist.distribution.text}, {reg.api} at {reg.source}), but it is a kernel "
                     f"of a custom_op: torch registers one kernel for all its devices and "
                     f"chooses the function per call, so one device's cannot be left out; it "
                     f"stays", f"remove {switch.text!r} from {switch.source}",
                     op=reg.op, key=reg.key, source=reg.source)
            switch = None
        out.append(AdoptedKernel(registration=reg,
                                 disabled_by=f"{switch.source} ({switch.text})" if switch else ""))
    if ctx.policy.kernels:
        _native_switches(ctx, dist)
    return tuple(out)


def _native_switches(ctx: Context, dist: ForeignDistribution) -> None:
    """``kernel-switch-not-applied`` for a switch of a kernel ``dist`` may register only from
    a C++ ``TORCH_LIBRARY_IMPL`` block (torchvision's CPU ``nms``): torch cannot leave a C++
    registration out, so the switch would change nothing without a word."""
    python = {(r.op, r.key) for r in dist.registrations if r.kind == "kernel" and r.op}
    ops = sorted(dist.ops() | set(dist.possible_ops()))
    told: set[tuple[str, str, str]] = set()
    for reg in dist.registrations:
        if reg.kind != "IMPL" or reg.line is not None or not reg.key or (
                reg.key not in DEVICE_KEYS and reg.key not in COMPOSITE_KEYS):
            continue
        for op in ops:
            if op.partition("::")[0] != reg.namespace or (op, reg.key) in python:
                continue
            switch = ctx.policy.disabled_by(op, reg.key, dist.name, reg.key in COMPOSITE_KEYS,
                                            False)
            if switch is None or (switch.text, reg.namespace, reg.key) in told:
                continue
            told.add((switch.text, reg.namespace, reg.key))
            ctx.warn("kernel-switch-not-applied",
                     f"{switch.source} switches off the {reg.key} kernel of {op} "
                     f"({dist.distribution.text}), but {dist.name} registers {reg.key} kernels "
                     f"of namespace {reg.namespace} from C++ ({reg.api} in {reg.source}): torch "
                     f"cannot leave a C++ registration out, so it stays",
                     f"remove {switch.text!r} from {switch.source}; to replace the kernel, "
                     f"declare one with override=True and OPREGISTRY_ALLOW_OVERRIDE={op}",
                     op=op, key=reg.key, source=reg.source)


def _unknown(ctx: Context, name: str, adoption: Adoption, scan: ForeignScan | None) -> None:
    known = sorted(d.name for d in scan.distributions) if scan is not None else []
    close = difflib.get_close_matches(name, known, n=1)
    ctx.refuse("adoption-unknown-distribution",
               f"{adoption.origin} adopts {name}, which is not installed or registers "
               f"nothing with torch (the scan of the installed distributions does not find it)"
               + (f"; did you mean {close[0]!r}?" if close else ""),
               f"install {name}, or correct the name in the Adoption declared at "
               f"{adoption.source}", (adoption.origin,), source=adoption.source)


def _namespace_holder(ctx: Context, name: str, ns: str) -> str | None:
    """Who else holds ``ns`` (torch, an opregistry plugin, another package), or ``None``."""
    if ctx.torch_owns(ns):
        return "torch"
    held = ctx.foreign.namespaces.get(ns)
    if held is not None and held[0].name != name:
        return owner_text(held)
    owners = sorted({n.origin for n in ctx.namespaces if n.name == ns and n.origin is not None})
    return str(owners[0]) if owners else None


def _declaration_refused(ctx: Context, name: str, declared: Adoption) -> bool:
    """Refuse a declaration that would import another's code on a touch (whether it did).

    Its modules must be files ``name`` installed, and its namespaces ones no
    one else holds: the first touch of ``torch.ops.<ns>`` imports them, so
    either would let one package's code run when another's namespace is used.
    """
    refused = False
    for module in declared.modules:
        owner, text = ctx.env.module_owners.get(module, (canonical_name(name), ""))
        if owner != canonical_name(name):
            ctx.refuse("adoption-module-not-owned",
                       f"{declared.origin} adopts {name} with module {module}, which "
                       + (f"{text} installed" if owner is not None else text)
                       + ": an adoption imports only modules of the distribution it adopts",
                       f"name a module {name} installs (pip show -f {name}) in the "
                       f"Adoption declared at {declared.source}", (declared.origin,),
                       source=declared.source)
            refused = True
    for ns in declared.namespaces:
        holder = _namespace_holder(ctx, name, ns)
        if holder is not None:
            ctx.refuse("adoption-namespace-held",
                       f"{declared.origin} declares that {name} registers namespace {ns!r}, "
                       f"which {holder} holds: the first touch of torch.ops.{ns} would "
                       f"import {name}'s code",
                       f"remove {ns!r} from the Adoption declared at {declared.source}",
                       (declared.origin,), source=declared.source)
            refused = True
    return refused


def _unreadable(dist: ForeignDistribution, namespace: str) -> bool:
    """Whether the scan may miss ops of ``namespace`` in ``dist``: a name it could not read, a
    C++ block (its ops are not in the symbols), a library loaded from a computed path."""
    return any(reg.namespace in (namespace, None) and (
        reg.op is None and reg.kind in ("op", "DEF", "FRAGMENT", "IMPL", "library",
                                        "load_library") or bool(reg.unresolved))
        for reg in dist.registrations)


def _check_samples(ctx: Context, dist: ForeignDistribution, declared: Adoption) -> None:
    """``adoption-samples-unknown-op``: an adapter's ``samples`` for an op ``dist`` does not
    define, as far as its files say (a namespace or op the scan cannot read is taken as fine)."""
    known = sorted({reg.op for reg in dist.registrations if reg.op})
    for op in sorted(declared.samples):
        namespace = op.split("::")[0]
        if (op in known or op.removesuffix(".default") in known
                or namespace in declared.namespaces or _unreadable(dist, namespace)):
            continue
        close = difflib.get_close_matches(op, known, n=1, cutoff=0.6)
        why = (f"which is not an op of {dist.distribution.text}" if namespace in
               dist.namespaces() else f"but {dist.distribution.text} registers no namespace "
               f"{namespace!r}")
        ctx.warn("adoption-samples-unknown-op",
                 f"{declared.origin} declares sample inputs ({declared.samples[op]}) for {op}, "
                 f"{why} (its files, as scanned)"
                 + (f"; did you mean {close[0]!r}?" if close else "")
                 + "; opregistry check fails it",
                 f"name an op of {dist.name} (opregistry list -n {namespace}) in "
                 f"Adoption(samples=...), declared at {declared.source}",
                 culprits=(declared.origin,) if declared.origin else (), op=op,
                 source=declared.source)


def _one(ctx: Context, name: str, dist: ForeignDistribution | None,
         declared: Adoption | None, scan: ForeignScan | None) -> Adopted | None:
    if dist is not None and dist.is_plugin:
        if declared is not None:
            ctx.refuse("adoption-of-plugin",
                       f"{declared.origin} adopts {dist.distribution.text}, an opregistry plugin: "
                       f"its ops are declared through opregistry already",
                       "remove the Adoption", (declared.origin,), source=declared.source)
        return None
    modules = _namespaces(scan, dist, declared)
    if declared is not None and dist is not None and declared.samples:
        _check_samples(ctx, dist, declared)
    if declared is None and not modules:
        return None  # nothing it defines can be reached through torch.ops: nothing to adopt
    installed = dist.distribution if dist is not None else InstalledDistribution(
        name=name, version=declared.origin.version if declared and declared.origin else "?",
        location="")
    status, reason = "adopted", (f"declared by {declared.origin}" if declared is not None
                                 else "found by the scan (adopted by default)")
    off = ctx.policy.adopts(name)
    if off is not None:
        status, reason = "off", off
    elif not modules:
        status, reason = "refused", ("no namespace it registers is known: name them "
                                     "(Adoption(namespaces=[...], modules=[...]))")
        ctx.warn("adoption-nothing-found",
                 f"{name} is adopted by {declared.origin if declared else '?'}, but the scan "
                 f"finds no namespace it defines", "declare its namespaces and modules",
                 source=declared.source if declared else None)
    return Adopted(distribution=installed, load=declared.load if declared else "lazy",
                   status=status, reason=reason,
                   declared_by=(declared.origin,) if declared and declared.origin else (),
                   modules=modules, op_modules=_op_modules(dist),
                   # its kernels are ``kernels``, but for those the scan cannot tie to an
                   # op and key (listed as kernels of the namespace: opregistry.report)
                   registrations=tuple(r for r in (dist.registrations if dist else ())
                                       if r.kind != "kernel" or not (r.op and r.key)),
                   kernels=_kernels(ctx, dist),
                   samples=dict(declared.samples) if declared else {})


def _claims(dist: ForeignDistribution) -> dict[str, set[str]]:
    """namespace -> what ``dist`` claims in it: ``"DEF"``, ``"library"`` (a library whose kind
    is unknown: perhaps a DEF), and each op it defines."""
    out: dict[str, set[str]] = {}
    for reg in dist.registrations:
        if reg.namespace is None or reg.inferred:  # which macro is not known: no clash
            continue
        if reg.kind in ("DEF", "library"):
            out.setdefault(reg.namespace, set()).add(reg.kind)
        elif reg.kind == "op" and reg.op:
            out.setdefault(reg.namespace, set()).add(reg.op)
    for op in dist.possible_ops():  # perhaps in this namespace: torch aborts all the same
        out.setdefault(op.partition("::")[0], set()).add(op)
    return out


def _clashes(adopted: list[Adopted], by_name: dict[str, ForeignDistribution]
             ) -> dict[str, tuple[str, str]]:
    """distribution -> (the other distribution, what both claim), for adopted distributions
    that cannot both be imported: both DEF one namespace, or both define one op.

    torch refuses the second -- from a C++ static initializer, by aborting the
    process -- so lazy adoption must never import both.
    """
    claims = {a.name: _claims(by_name[a.name]) for a in adopted
              if a.active and a.name in by_name}
    out: dict[str, tuple[str, str]] = {}
    names = sorted(claims)
    defs = {"DEF", "library"}
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            for ns in sorted(set(claims[a]) & set(claims[b])):
                mine, theirs = claims[a][ns], claims[b][ns]
                ops = sorted(c for c in mine & theirs if "::" in c)
                if (mine & defs) and (theirs & defs) and (mine | theirs) & {"DEF"}:
                    what = f"namespace {ns} (DEF)"
                elif ops:
                    what = f"op {ops[0]}" + _perhaps(ops[0], by_name[a], by_name[b])
                else:
                    continue
                out.setdefault(a, (b, what))
                out.setdefault(b, (a, what))
    return out


def _perhaps(op: str, *dists: ForeignDistribution) -> str:
    """What says that ``op`` is perhaps, not certainly, defined by one of ``dists``."""
    for dist in dists:
        reg = dist.possible_ops().get(op)
        if reg is not None:
            return (f" (perhaps: {dist.distribution.text}'s C++ library {reg.file} holds its "
                    f"schema without a namespace and registers in "
                    f"{', '.join(dist.library_namespaces(reg.file))})")
    return ""


def _refuse_clashes(ctx: Context, adopted: list[Adopted],
                    by_name: dict[str, ForeignDistribution]) -> list[Adopted]:
    clashes = _clashes(adopted, by_name)
    out = []
    told: set[frozenset[str]] = set()
    for a in adopted:
        if a.name in clashes:
            other, what = clashes[a.name]
            reason = (f"{a.distribution.text} and {by_name[other].distribution.text} both "
                      f"define {what}: torch refuses the second (a C++ library aborts the "
                      f"process), so opregistry imports neither")
            if frozenset((a.name, other)) not in told:  # one problem for the pair
                told.add(frozenset((a.name, other)))
                ctx.warn("adoption-conflict", reason,
                         f"uninstall one of them, or import the one you use yourself; "
                         f"OPREGISTRY_ADOPT_BLOCK={a.name} (or {other}) silences this",
                         severity="error",
                         others=(Origin(a.name, a.distribution.version),
                                 Origin(other, by_name[other].distribution.version)))
            a = attrs.evolve(a, status="refused", reason=reason)
        out.append(a)
    return out


def plan_adoptions(ctx: Context, adoptions: Iterable[Adoption]) -> tuple[Adopted, ...]:
    """Decide every adoption: declared ones, and by default every distribution the scan finds.

    ``adoptions`` are those of the declarers still in (the rules' pass filters them).
    """
    scan = ctx.env.foreign
    declared = _declared(adoptions)
    by_name = {d.name: d for d in scan.distributions} if scan is not None else {}
    out = []
    for name in sorted(set(by_name) | set(declared)):
        dist = by_name.get(name)
        chosen = _chosen(ctx, name, declared[name]) if name in declared else None
        if chosen is not None and _declaration_refused(ctx, name, chosen):
            chosen = None  # its declarer is left out; the scan's findings still hold
        if dist is None and chosen is not None and not chosen.by_itself:
            _unknown(ctx, name, chosen, scan)
            continue
        adopted = _one(ctx, name, dist, chosen, scan)
        if adopted is not None:
            out.append(adopted)
    out = _refuse_clashes(ctx, out, by_name)
    # the candidates: what registers with torch by itself (an opregistry plugin is not one:
    # it is switched off by OPREGISTRY_BLOCK), and what a declaration adopts
    candidates = {n for n, d in by_name.items() if not d.is_plugin} | set(declared)
    for name in sorted(ctx.policy.adopt_block - candidates):
        where = ctx.policy.adopt_sources.get("adopt_block", "OPREGISTRY_ADOPT_BLOCK")
        plugin = by_name.get(name)
        if plugin is not None:
            ctx.warn("config-unknown-distribution",
                     f"{where} names {name!r}, which is an opregistry plugin "
                     f"({plugin.distribution.text}), not a distribution that registers with "
                     f"torch by itself: nothing of it is adopted, so the block-list leaves it "
                     f"loaded", f"remove {name!r} from {where}; to leave the plugin out, "
                     f"name it in OPREGISTRY_BLOCK (block in the configuration file)",
                     severity="error")
            continue
        close = difflib.get_close_matches(name, sorted(candidates), n=1)
        ctx.warn("config-unknown-distribution",
                 f"{where} names {name!r}, which is not an installed distribution that "
                 f"registers with torch by itself" + (f"; did you mean {close[0]!r}?"
                                                      if close else ""),
                 f"correct the name in {where}", severity="error")
    return tuple(out)
