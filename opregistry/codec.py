"""Declarations, the environment they were resolved in, and the plan, as JSON data and back.

The plan cache (:mod:`opregistry.plancache`) keeps these three on disk; an
entry is JSON, so reading one never runs code.  The encoding is positional
and compact (a plan of 10,000 ops is read at every ``import torch``), and
the round trip is faithful: ``decode_plan(encode_plan(p)).to_dict() ==
p.to_dict()`` for every record, and the records decoded compare equal to
the originals.

* Records are lists of their fields; every :class:`~opregistry.model.Origin`
  is written once, in a table, and named by its index.
* A kernel's payload is written as its kind and its attrs fields: a
  built-in kind by name (``"device"``), a kind defined outside the core by
  its payload class, ``"module:Class"`` -- importing that module on read is
  the one import decoding can make, and the module is the backend
  distribution's that materialization imports anyway.
* The plan names the declaration records it holds by their index.

What cannot be data is refused with :class:`Uncacheable`, naming the
distribution: a callable where a ``"module:function"`` reference goes (the
decorator style), a problem that carries an exception (its traceback is the
user's context), a distribution deferred at ``import torch``.

Decoding trusts its input's shape only as far as Python does: a malformed
entry raises (``ValueError``, ``TypeError``, ``KeyError``, ``IndexError``),
and the cache treats any exception as a miss.  The records are rebuilt
without running their validators again: they were checked when declared.
"""

from __future__ import annotations

import hashlib
import importlib
import json
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

import attrs

from .conditions import Condition
from .environment import Environment, EnvironmentQuery
from .idle import FORMAT as _FORMAT
from .kinds import Kind
from .model import (Backend, Declarations, Kernel, Namespace, NativeLibrary, OpDef, Origin,
                    Problem, Skipped)
from .plans import BackendPlan, KernelPlan, NamespacePlan, NativePlan, OpPlan, Plan

if TYPE_CHECKING:  # imported where an adoption is decoded: most plans have none
    from .adoption import Adopted, Adoption

__all__ = ["FORMAT", "ENCODED", "Uncacheable", "Encoder", "Decoder", "encode_query", "decode_query",
           "encode_environment", "dispatcher_digest"]

#: the encoding's version: an entry of another format is ignored
FORMAT = _FORMAT

#: every field of every record the codec writes, in the order it writes them: a record that
#: gains a field must be written and read here too (tests/test_plan_cache.py compares)
ENCODED: dict[str, tuple[str, ...]] = {
    "Origin": ("distribution", "version", "group", "entry_point", "value"),
    "Namespace": ("name", "kind", "closed", "description", "source", "origin", "native"),
    "OpDef": ("namespace", "name", "schema", "overload", "mutates_args", "tags", "samples", "doc",
              "source", "origin"),
    "Kernel": ("op", "key", "payload", "override", "when", "predicate", "priority", "source",
               "origin"),
    "Backend": ("name", "keys", "device_type", "description", "kinds", "origin"),
    "Problem": ("code", "message", "hint", "severity", "culprits", "others", "op", "key",
                "namespace", "source", "error"),
    "Skipped": ("origin", "reason", "deferred"),
    "Declarations": ("namespaces", "ops", "kernels", "backends", "available", "distributions",
                     "skipped", "problems", "hooks", "adoptions"),
    "KernelPlan": ("kernel", "status", "backend", "reason", "overrides", "rank", "after"),
    "OpPlan": ("op", "parsed", "kernels"),
    "NamespacePlan": ("name", "owner", "fragments", "closed"),
    "NativePlan": ("namespace", "kind", "library", "origin", "ops", "keys"),
    "BackendPlan": ("backend", "available"),
    "Plan": ("backends", "namespaces", "ops", "external_kernels", "problems", "distributions",
             "excluded", "skipped", "hooks", "switches", "natives", "adoptions"),
    "Condition": ("torch", "requires", "capability", "platform", "check"),
    "NativeLibrary": ("module", "path", "torch", "cxx11_abi", "cuda"),
    "Environment": ("torch", "torch_build", "distributions", "modules", "natives",
                    "natives_broken", "platform", "dispatcher", "foreign", "checks",
                    "module_owners"),
    "EnvironmentQuery": ("distributions", "modules", "libraries", "checks", "adopted_modules"),
    "Adoption": ("distribution", "modules", "namespaces", "load", "samples", "origin", "source"),
    "Adopted": ("distribution", "load", "status", "reason", "declared_by", "modules",
                "op_modules", "registrations", "kernels", "samples"),
    "AdoptedKernel": ("registration", "disabled_by"),
    "InstalledDistribution": ("name", "version", "location"),
}

def _payload_classes() -> dict[str, type]:
    from . import kinds

    return {cls.kind.name: cls for cls in (
        kinds.DeviceKernel, kinds.FakeKernel, kinds.AutogradFormula, kinds.VmapRule,
        kinds.AutocastRule, kinds.TritonKernel, kinds.DispatchRule, kinds.NativeKernel)}


#: per payload class, the names of its attrs fields
_NAMES: dict[type, tuple[str, ...]] = {}

#: the payload class of each built-in kind, by the kind's name
_PAYLOADS: dict[str, type] = _payload_classes()


class Uncacheable(Exception):
    """Declarations that cannot be written as data, and why (naming the distribution)."""


def _setters(cls: type, names: Iterable[str]) -> tuple[Callable[[Any, Any], None], ...]:
    """The slot setters of an attrs class's fields: set without its frozen ``__setattr__``."""
    found = []
    for name in names:
        for klass in cls.__mro__:
            slot = klass.__dict__.get(name)
            if slot is not None and hasattr(slot, "__set__"):
                found.append(slot.__set__)
                break
        else:
            raise TypeError(f"{cls.__name__}.{name} is not a slot")
    return tuple(found)


class _Maker:
    """Builds records of one attrs class from positional values, without its validators.

    The builder is generated, as attrs generates ``__init__``: one slot store
    per field, unrolled (a plan of 10,000 ops is ~150,000 records, rebuilt at
    every ``import torch``).  Only this module's own code is generated; the
    values come from the entry, as arguments.
    """

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self.names = tuple(a.name for a in attrs.fields(cls))
        setters = _setters(cls, self.names)
        scope: dict[str, Any] = {"new": object.__new__, "cls": cls,
                                 **{f"s{i}": s for i, s in enumerate(setters)}}
        body = "".join(f"    s{i}(o, v[{i}])\n" for i in range(len(setters)))
        exec(f"def make(v):\n    o = new(cls)\n{body}    return o\n", scope)  # noqa: S102
        self.make = scope["make"]
        self.width = len(setters)

    def __call__(self, values: Any) -> Any:
        values = tuple(values)
        if len(values) != self.width:
            raise ValueError(f"{self.cls.__name__}: {len(values)} values, not {self.width}")
        return self.make(values)


_MAKERS: dict[type, _Maker] = {}


def _maker(cls: type) -> _Maker:
    found = _MAKERS.get(cls)
    if found is None:
        found = _MAKERS[cls] = _Maker(cls)
    return found


def _native(lib: NativeLibrary | None) -> list[Any] | None:
    if lib is None:
        return None
    return [lib.module, lib.path, lib.torch, lib.cxx11_abi, lib.cuda]


def _unnative(data: list[Any] | None) -> NativeLibrary | None:
    return None if data is None else _maker(NativeLibrary)(data)


def _ref(value: Any, what: str, origin: Origin | None) -> Any:
    """A ``"module:function"`` reference as it is; anything else cannot be data."""
    if value is None or isinstance(value, str):
        return value
    raise Uncacheable(f"{origin.dist if origin else 'a declaration'}: {what} is the object "
                      f"{value!r}, not a 'module:function' reference")


def _value(value: Any, where: str) -> Any:
    """A payload field of a kind defined outside the core, as JSON data."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, NativeLibrary):
        return {"native": _native(value)}
    if isinstance(value, tuple):
        return {"tuple": [_value(v, where) for v in value]}
    if isinstance(value, list):
        return {"list": [_value(v, where) for v in value]}
    raise Uncacheable(f"{where}: the payload field value {value!r} is not data")


def _field(value: Any, where: str, origin: Origin | None) -> Any:
    """A payload field as data: a callable where a reference goes cannot be."""
    if callable(value) and not isinstance(value, NativeLibrary):
        _ref(value, where, origin)
    return _value(value, where)


def _unvalue(data: Any) -> Any:
    if isinstance(data, dict):
        if "native" in data:
            return _unnative(data["native"])
        if "tuple" in data:
            return tuple(_unvalue(v) for v in data["tuple"])
        return [_unvalue(v) for v in data["list"]]
    return data


def _condition(when: Condition | None) -> list[Any] | None:
    if when is None:
        return None
    return [when.torch, list(when.requires), when.capability, list(when.platform), when.check]


def _uncondition(data: list[Any] | None) -> Condition | None:
    if data is None:
        return None
    torch, requires, capability, platform, check = data
    return _maker(Condition)((torch, tuple(requires), capability, tuple(platform), check))


def _kind_class(kind: Kind) -> str:
    cls = type(kind)
    return f"{cls.__module__}:{cls.__qualname__}"


def _import(reference: str) -> Any:
    module, _, name = reference.partition(":")
    found: Any = importlib.import_module(module)
    for part in name.split("."):
        found = getattr(found, part)
    return found


class Encoder:
    """Writes records as JSON data; :meth:`table` is the origins they name, by index."""

    def __init__(self) -> None:
        self.origins: list[list[str]] = []
        self._origin_at: dict[Origin, int] = {}
        self._op_at: dict[int, int] = {}
        self._kernel_at: dict[int, int] = {}
        #: id of a payload -> (the payload, its row): kernels declaring the same functions
        #: share their payload record (:class:`~opregistry.model.Kernel`), encoded once
        self._payload_rows: dict[int, tuple[Any, list[Any]]] = {}

    def origin(self, o: Origin | None) -> int | None:
        if o is None:
            return None
        found = self._origin_at.get(o)
        if found is None:
            found = self._origin_at[o] = len(self.origins)
            self.origins.append([o.distribution, o.version, o.group, o.entry_point, o.value])
        return found

    def payload(self, payload: Any, where: str, origin: Origin | None) -> list[Any]:
        cls = type(payload)
        names = _NAMES.get(cls)
        if names is None:
            names = _NAMES[cls] = tuple(a.name for a in attrs.fields(cls))
        values = [getattr(payload, n) for n in names]
        if _PAYLOADS.get(payload.kind.name) is cls:
            if all(v is None or type(v) is str for v in values):  # references: the common case
                return [payload.kind.name, *values]
            return [payload.kind.name, *(_field(v, f"{where} ({n})", origin)
                                         for n, v in zip(names, values))]
        return [f"{cls.__module__}:{cls.__qualname__}",
                {n: _field(v, f"{where} ({n})", origin) for n, v in zip(names, values)}]

    def kernel(self, k: Kernel) -> list[Any]:
        predicate = k.predicate
        if predicate is not None and type(predicate) is not str:
            _ref(predicate, f"the {k.key} kernel of {k.op} (predicate)", k.origin)
        known = self._payload_rows.get(id(k.payload))
        if known is not None and known[0] is k.payload:
            payload = known[1]
        else:
            payload = self.payload(k.payload, f"the {k.key} kernel of {k.op}", k.origin)
            self._payload_rows[id(k.payload)] = (k.payload, payload)
        return [k.op, k.key, payload, k.override,
                _condition(k.when), predicate, k.priority, k.source, self.origin(k.origin)]

    def op(self, op: OpDef) -> list[Any]:
        return [op.namespace, op.name, op.schema, op.overload,
                None if op.mutates_args is None else list(op.mutates_args), list(op.tags),
                _ref(op.samples, f"the samples of {op.qualname}", op.origin), op.doc,
                op.source, self.origin(op.origin)]

    def namespace(self, ns: Namespace) -> list[Any]:
        return [ns.name, ns.kind, ns.closed, ns.description, ns.source, self.origin(ns.origin),
                _native(ns.native)]

    def backend(self, b: Backend) -> list[Any]:
        return [b.name, list(b.keys), b.device_type, b.description,
                [_kind_class(k) for k in b.kinds], self.origin(b.origin)]

    def problem(self, p: Problem) -> list[Any]:
        if p.error is not None:
            who = ", ".join(o.dist for o in p.culprits) or "the load"
            raise Uncacheable(f"{who}: the problem [{p.code}] carries an exception "
                              f"({type(p.error).__name__})")
        return [p.code, p.message, p.hint, p.severity, [self.origin(o) for o in p.culprits],
                [self.origin(o) for o in p.others], p.op, p.key, p.namespace, p.source]

    def skipped(self, s: Skipped) -> list[Any]:
        if s.deferred:
            raise Uncacheable(f"{s.origin.dist}: deferred (its module was being imported)")
        return [self.origin(s.origin), s.reason, s.deferred]

    def hooks(self, hooks: Mapping[Origin, tuple[str, ...]]) -> list[Any]:
        return [[self.origin(o), list(names)] for o, names in hooks.items()]

    def adoption(self, a: Adoption) -> list[Any]:
        return [a.distribution, list(a.modules), list(a.namespaces), a.load, dict(a.samples),
                self.origin(a.origin), a.source]

    def adopted(self, a: Adopted) -> list[Any]:
        d = a.distribution
        return [[d.name, d.version, d.location], a.load, a.status, a.reason,
                [self.origin(o) for o in a.declared_by],
                [[ns, list(modules)] for ns, modules in a.modules],
                [list(p) for p in a.op_modules], [r.to_dict() for r in a.registrations],
                [[k.registration.to_dict(), k.disabled_by] for k in a.kernels], dict(a.samples)]

    def declarations(self, decl: Declarations) -> dict[str, Any]:
        """``decl`` as data; the plan encoded next names its ops and kernels by index."""
        self._op_at = {id(op): i for i, op in enumerate(decl.ops)}
        self._kernel_at = {id(k): i for i, k in enumerate(decl.kernels)}
        return {"namespaces": [self.namespace(ns) for ns in decl.namespaces],
                "ops": [self.op(op) for op in decl.ops],
                "kernels": [self.kernel(k) for k in decl.kernels],
                "backends": [self.backend(b) for b in decl.backends],
                "available": dict(decl.available),
                "distributions": [self.origin(o) for o in decl.distributions],
                "skipped": [self.skipped(s) for s in decl.skipped],
                "problems": [self.problem(p) for p in decl.problems],
                "hooks": self.hooks(decl.hooks),
                "adoptions": [self.adoption(a) for a in decl.adoptions]}

    def indices(self) -> tuple[Mapping[int, int], Mapping[int, int]]:
        """Where each op and kernel of the declarations encoded last is, by ``id`` of the record."""
        return self._op_at, self._kernel_at

    def kernel_plan(self, k: KernelPlan) -> list[Any]:
        at = self._kernel_at.get(id(k.kernel))
        return [at if at is not None else self.kernel(k.kernel), k.status, k.backend, k.reason,
                k.overrides, k.rank, k.after]

    def plan(self, plan: Plan) -> dict[str, Any]:
        """``plan`` as data, naming the records of the declarations encoded last by index."""
        ops = []
        for op in plan.ops:
            at = self._op_at.get(id(op.op))
            ops.append([at if at is not None else self.op(op.op),
                        [self.kernel_plan(k) for k in op.kernels]])
        return {
            "backends": [[self.origin(b.backend.origin), b.backend.name, b.available]
                         for b in plan.backends],
            "namespaces": [[n.name, self.origin(n.owner), [self.origin(f) for f in n.fragments],
                            n.closed] for n in plan.namespaces],
            "ops": ops,
            "external_kernels": [self.kernel_plan(k) for k in plan.external_kernels],
            "problems": [self.problem(p) for p in plan.problems],
            "distributions": [self.origin(o) for o in plan.distributions],
            "excluded": [self.origin(o) for o in plan.excluded],
            "skipped": [self.skipped(s) for s in plan.skipped],
            "hooks": self.hooks(plan.hooks),
            "switches": [list(s) for s in plan.switches],
            "natives": [[n.namespace, n.kind, _native(n.library), self.origin(n.origin),
                         [list(p) for p in n.ops], [list(p) for p in n.keys]]
                        for n in plan.natives],
            "adoptions": [self.adopted(a) for a in plan.adoptions]}

    def table(self) -> list[list[str]]:
        return self.origins


class Decoder:
    """Rebuilds records from :class:`Encoder`'s data: ``origins`` is its :meth:`~Encoder.table`,
    ``declarations`` what :meth:`~Encoder.declarations` returned.

    The plan's op and kernel records are those of the declarations, rebuilt
    on first use: a plan is rebuilt without the declarations it does not
    hold.  ``backends`` are the live backend records by ``(distribution,
    name)``, used in place of the cached ones (equal as data; their kinds are
    the live descriptors).
    """

    def __init__(self, origins: list[list[str]], declarations: Mapping[str, Any],
                 backends: Mapping[tuple[str, str], Backend] | None = None) -> None:
        make = _maker(Origin)
        self.origins = [make(o) for o in origins]
        self.data = declarations
        self.backends = backends or {}
        self._ops: list[OpDef | None] = [None] * len(declarations["ops"])
        self._kernels: list[Kernel | None] = [None] * len(declarations["kernels"])
        self._payload_makers = {name: (_maker(cls).make, _maker(cls).width)
                                for name, cls in _PAYLOADS.items()}
        self._kernel = _maker(Kernel).make
        self._kernel_plan = _maker(KernelPlan).make

    def origin(self, i: int | None) -> Origin | None:
        return None if i is None else self.origins[i]

    def payload(self, data: list[Any]) -> Any:
        make = self._payload_makers.get(data[0])
        if make is not None:
            values = tuple(data[1:])
            if len(values) != make[1]:
                raise ValueError(f"{data[0]} payload: {len(values)} values, not {make[1]}")
            if dict in map(type, values):
                values = tuple(_unvalue(v) for v in values)
            return make[0](values)
        cls = _import(data[0])
        if not attrs.has(cls) or not isinstance(getattr(cls, "kind", None), Kind):
            raise TypeError(f"{data[0]} is not a payload class")
        return cls(**{k: _unvalue(v) for k, v in data[1].items()})

    def kernel(self, d: list[Any]) -> Kernel:
        return self.kernel_of((*d[:2], self.payload(d[2]), *d[3:]))

    def kernel_of(self, d: tuple[Any, ...]) -> Kernel:
        """A kernel from its row (:meth:`Encoder.kernel`), its payload decoded already."""
        op, key, payload, override, when, predicate, priority, source, origin = d
        return self._kernel((op, key, payload, override, _uncondition(when),
                             predicate, priority, source,
                             None if origin is None else self.origins[origin]))

    def op(self, d: list[Any]) -> OpDef:
        namespace, name, schema, overload, mutates, tags, samples, doc, source, origin = d
        return _maker(OpDef).make((namespace, name, schema, overload,
                                   None if mutates is None else tuple(mutates), tuple(tags),
                                   samples, doc, source, self.origin(origin)))

    def op_at(self, i: int) -> OpDef:
        found = self._ops[i]
        if found is None:
            found = self._ops[i] = self.op(self.data["ops"][i])
        return found

    def kernel_at(self, i: int) -> Kernel:
        found = self._kernels[i]
        if found is None:
            found = self._kernels[i] = self.kernel(self.data["kernels"][i])
        return found

    def namespace(self, d: list[Any]) -> Namespace:
        name, kind, closed, description, source, origin, native = d
        return _maker(Namespace)((name, kind, closed, description, source, self.origin(origin),
                                  _unnative(native)))

    def backend(self, d: list[Any]) -> Backend:
        name, keys, device_type, description, _, origin = d
        o = self.origin(origin)
        live = self.backends.get((o.distribution if o else "", name))
        if live is not None:
            return live
        return _maker(Backend)((name, tuple(keys), device_type, description, (), o))

    def problem(self, d: list[Any]) -> Problem:
        code, message, hint, severity, culprits, others, op, key, namespace, source = d
        return _maker(Problem)((code, message, hint, severity,
                                tuple(self.origins[i] for i in culprits),
                                tuple(self.origins[i] for i in others), op, key, namespace,
                                source, None))

    def skipped(self, d: list[Any]) -> Skipped:
        return _maker(Skipped)((self.origins[d[0]], d[1], d[2]))

    def hooks(self, d: list[Any]) -> dict[Origin, tuple[str, ...]]:
        return {self.origins[i]: tuple(names) for i, names in d}

    def adoption(self, d: list[Any]) -> Adoption:
        from .adoption import Adoption

        distribution, modules, namespaces, load, samples, origin, source = d
        return Adoption(distribution=distribution, modules=tuple(modules),
                        namespaces=tuple(namespaces), load=load, samples=samples,
                        origin=self.origin(origin), source=source)

    def adopted(self, d: list[Any]) -> Adopted:
        from .adoption import Adopted, AdoptedKernel
        from .foreign import InstalledDistribution, Registration

        (name, version, location), load, status, reason, declared_by, modules, op_modules, \
            registrations, kernels, samples = d
        return Adopted(
            distribution=InstalledDistribution(name=name, version=version, location=location),
            load=load, status=status, reason=reason,
            declared_by=tuple(self.origins[i] for i in declared_by),
            modules=tuple((ns, tuple(m)) for ns, m in modules),
            op_modules=tuple((op, module) for op, module in op_modules),
            registrations=tuple(Registration.from_dict(r) for r in registrations),
            kernels=tuple(AdoptedKernel(registration=Registration.from_dict(r), disabled_by=off)
                          for r, off in kernels), samples=samples)

    def declarations(self) -> Declarations:
        d = self.data
        return Declarations(
            namespaces=[self.namespace(ns) for ns in d["namespaces"]],
            ops=[self.op_at(i) for i in range(len(self._ops))],
            kernels=[self.kernel_at(i) for i in range(len(self._kernels))],
            backends=[self.backend(b) for b in d["backends"]],
            available=dict(d["available"]),
            distributions=[self.origins[i] for i in d["distributions"]],
            skipped=[self.skipped(s) for s in d["skipped"]],
            problems=[self.problem(p) for p in d["problems"]], hooks=self.hooks(d["hooks"]),
            adoptions=[self.adoption(a) for a in d["adoptions"]])

    def kernel_plan(self, d: list[Any]) -> KernelPlan:
        kernel, status, backend, reason, overrides, rank, after = d
        return self._kernel_plan((self.kernel_at(kernel) if type(kernel) is int
                                  else self.kernel(kernel), status, backend, reason, overrides,
                                  rank, after))

    def op_plan(self, d: list[Any]) -> OpPlan:
        op = self.op_at(d[0]) if type(d[0]) is int else self.op(d[0])
        kernel_plan = self.kernel_plan
        from .schema import parse_signature  # a plan without ops (backends alone) needs none

        return _maker(OpPlan).make((op, parse_signature(op.schema),
                                    tuple([kernel_plan(k) for k in d[1]])))

    def plan(self, d: Mapping[str, Any]) -> Plan:
        """The plan; its backends are those of the declarations (the live ones, by name)."""
        backends = {(self.origins[b[5]].distribution if b[5] is not None else "", b[0]):
                    self.backend(b) for b in self.data["backends"]}
        make_ns, make_native = _maker(NamespacePlan), _maker(NativePlan)
        return Plan(
            backends=tuple(BackendPlan(backend=backends[(self.origins[o].distribution, name)],
                                       available=available)
                           for o, name, available in d["backends"]),
            namespaces=tuple(make_ns((name, self.origin(owner),
                                      tuple(self.origins[i] for i in fragments), closed))
                             for name, owner, fragments, closed in d["namespaces"]),
            ops=tuple([self.op_plan(op) for op in d["ops"]]),
            external_kernels=tuple(self.kernel_plan(k) for k in d["external_kernels"]),
            problems=tuple(self.problem(p) for p in d["problems"]),
            distributions=tuple(self.origins[i] for i in d["distributions"]),
            excluded=tuple(self.origins[i] for i in d["excluded"]),
            skipped=tuple(self.skipped(s) for s in d["skipped"]),
            hooks=self.hooks(d["hooks"]),
            switches=tuple((text, source) for text, source in d["switches"]),
            natives=tuple(make_native((ns, kind, _unnative(lib), self.origins[o],
                                       tuple(tuple(p) for p in ops), tuple(tuple(p) for p in keys)))
                          for ns, kind, lib, o, ops, keys in d["natives"]),
            adoptions=tuple(self.adopted(a) for a in d["adoptions"]))


def encode_query(query: EnvironmentQuery) -> list[Any]:
    return [list(query.distributions), list(query.modules),
            [_native(lib) for lib in query.libraries], list(query.checks),
            list(query.adopted_modules)]


def decode_query(data: list[Any]) -> EnvironmentQuery:
    names, modules, libraries, checks, adopted_modules = data
    return EnvironmentQuery(distributions=tuple(names), modules=tuple(modules),
                            libraries=tuple(_unnative(lib) for lib in libraries),
                            checks=tuple(checks), adopted_modules=tuple(adopted_modules))


def dispatcher_digest(ops: Iterable[str], tags: Iterable[str]) -> str:
    """One digest of what torch's dispatcher holds outside opregistry (its namespaces follow)."""
    h = hashlib.sha256()
    for name in sorted(ops):
        h.update(name.encode())
        h.update(b"\n")
    h.update(b"\0" + ",".join(sorted(tags)).encode())
    return h.hexdigest()


def encode_environment(env: Environment, kernels: Mapping[str, bool] | None = None
                       ) -> dict[str, Any]:
    """What the resolver read of the machine, as data to compare with a later load's.

    The dispatcher is written as a digest of its ops and tags and, in
    ``kernels``, the answers to each question the resolver asked of it
    (``has_kernel``, ``has_class``); the scan of packages that register with
    torch directly, as a digest of what it found.
    """
    torch = env.torch
    state = env.dispatcher
    foreign = env.foreign
    return {
        "foreign": None if foreign is None else hashlib.sha256(json.dumps(
            [d.to_dict() for d in foreign.distributions], sort_keys=True).encode()).hexdigest(),
        "torch": None if torch is None else [torch.version, list(torch.release),
                                             sorted(torch.tags), torch.source],
        "torch_build": None if env.torch_build is None else list(env.torch_build),
        "distributions": dict(sorted(env.distributions.items())),
        "modules": dict(sorted(env.modules.items())),
        "natives": dict(sorted(env.natives.items())),
        "natives_broken": {k: list(v) for k, v in sorted(env.natives_broken.items())},
        "platform": env.platform,
        "checks": {k: list(v) for k, v in sorted(env.checks.items())},
        "module_owners": {k: list(v) for k, v in sorted(env.module_owners.items())},
        "dispatcher": None if state is None else {
            "digest": dispatcher_digest(state.ops, state.tags),
            "kernels": dict(sorted((kernels or {}).items()))},
    }
