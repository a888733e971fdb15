"""Property tests (hypothesis): determinism of the plan, and fuzzed declarations.

* Determinism: the plan (``Plan.to_dict()``) and its fingerprint
  (:func:`opregistry.lockfile.fingerprint`) do not depend on the order in
  which distributions, entry points and their declarations are found --
  including when the declarations conflict.
* Fuzzing: generated schemas, names, namespaces and dispatch keys never make
  opregistry raise anything but its own errors, and whatever the resolver
  accepts, torch accepts (defined for real in a unique namespace, then
  destroyed), with the same arguments and mutability.

Example counts are modest: these run in CI on every push.
"""

from __future__ import annotations

import collections
import functools
import os
import uuid
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opregistry import DeclarationError, OpRegistryError
from opregistry.model import Declarations
from opregistry.config import Policy
from opregistry.discovery import BACKENDS_GROUP, OPS_GROUP
from opregistry.keys import ALIASES, KNOWN_KEYS
from opregistry.lockfile import fingerprint
from opregistry.model import Backend, Kernel, Namespace, OpDef, Origin, Problem
from opregistry.resolver import resolve
from opregistry.schema import parse_signature
from opregistry.torch_state import snapshot

from .conftest import DistFactory

#: examples per property: modest for CI; OPREGISTRY_FUZZ_EXAMPLES=2000 for a long local run
EXAMPLES = int(os.environ.get("OPREGISTRY_FUZZ_EXAMPLES", "60"))
CI = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])

#: how often the fuzzers got past the resolver: a fuzzer that never does tests nothing
COUNTS: collections.Counter[str] = collections.Counter()

# -- determinism ------------------------------------------------------------------

DISTS = ("alpha", "beta", "gamma", "delta")
#: mostly valid namespaces, so that most examples resolve to something
NAMESPACES = ("n1", "n2", "n3") * 3 + ("aten", "bad-ns")
OP_NAMES = ("f", "g")
SCHEMAS = ("(Tensor x) -> Tensor", "(Tensor x) -> Tensor", "(Tensor x, *, int n=1) -> Tensor",
           "(Tensor(a!) x) -> ()", "(Tensor x, Tensor x) -> Tensor")
KEYS = ("CPU", "CUDA", "Meta", "Autograd", "FuncTorchBatched")


def origin(dist: str, entry_point: str = "ops", group: str = OPS_GROUP) -> Origin:
    return Origin(distribution=dist, version="1.0", group=group, entry_point=entry_point,
                  value=f"{dist}_{entry_point}:lib")


@st.composite
def declarations(draw: Any) -> Declarations:
    """Several distributions, often in conflict: namespaces, ops, kernels, backends."""
    dists = draw(st.lists(st.sampled_from(DISTS), min_size=1, max_size=4, unique=True))
    namespaces, ops, kernels, origins = [], [], [], []
    for dist in dists:
        where = origin(dist, draw(st.sampled_from(("ops", "more"))))
        origins.append(where)
        for ns in draw(st.lists(st.sampled_from(NAMESPACES), max_size=2, unique=True)):
            kind = draw(st.sampled_from(("DEF", "FRAGMENT")))
            namespaces.append(Namespace(name=ns, kind=kind, closed=kind == "DEF" and draw(st.booleans()),
                                        origin=where))
            for name in draw(st.lists(st.sampled_from(OP_NAMES), max_size=2)):
                ops.append(OpDef(namespace=ns, name=name, schema=draw(st.sampled_from(SCHEMAS)),
                                 mutates_args=draw(st.sampled_from((None, None, (), ("x",)))),
                                 source=f"{dist}.py:{len(ops)}", origin=where))
        own = [o.qualname for o in ops if o.origin == where]
        for _ in range(draw(st.integers(0, 3))):
            if own and draw(st.integers(0, 5)):  # mostly kernels for its own ops
                op = draw(st.sampled_from(own))
            else:
                ns = draw(st.sampled_from(NAMESPACES))
                op = f"{ns}::{draw(st.sampled_from(OP_NAMES + ('add.Tensor',)))}"
            kernels.append(Kernel(op=op, key=draw(st.sampled_from(KEYS)),
                                  fn=f"{dist}_kernels:{draw(st.sampled_from(('k1', 'k2')))}",
                                  override=draw(st.booleans()), origin=where))
    backends = [Backend(name="cpu", keys=("CPU",), origin=origin("opregistry-cpu", "cpu", BACKENDS_GROUP)),
                Backend(name="meta", keys=("Meta",), origin=origin("opregistry-meta", "meta", BACKENDS_GROUP))]
    if draw(st.booleans()):  # a second backend for CPU: a backend conflict
        backends.append(Backend(name="cpu2", keys=("CPU",), origin=origin("other-cpu", "cpu", BACKENDS_GROUP)))
    problems = [Problem(code="plugin-import-error", message=f"{dist} failed", culprits=(origin(dist, "broken"),))
                for dist in draw(st.lists(st.sampled_from(DISTS), max_size=1))
                if draw(st.integers(0, 3)) == 0]
    return Declarations(namespaces=namespaces, ops=ops, kernels=kernels, backends=backends,
                        available={b.name: True for b in backends},
                        distributions=origins + [b.origin for b in backends], problems=problems)


def shuffled(decl: Declarations, rnd: Any) -> Declarations:
    def mix(items: tuple[Any, ...]) -> list[Any]:
        items = list(items)
        rnd.shuffle(items)
        return items

    return Declarations(namespaces=mix(decl.namespaces), ops=mix(decl.ops), kernels=mix(decl.kernels),
                        backends=mix(decl.backends), available=dict(reversed(decl.available.items())),
                        distributions=mix(decl.distributions), skipped=mix(decl.skipped),
                        problems=mix(decl.problems))


@CI
@given(decl=declarations(), rnd=st.randoms(use_true_random=False),
       allow=st.sampled_from((frozenset(), frozenset({"n1"}), frozenset({"aten", "n2::f"}))))
def test_plan_does_not_depend_on_discovery_order(decl: Declarations, rnd: Any, allow: frozenset[str]) -> None:
    """Rule 8: the same declarations in any order give the same plan and fingerprint."""
    policy = Policy(allow_override=allow)
    first = resolve(decl, policy=policy)
    again = resolve(shuffled(decl, rnd), policy=policy)
    assert again.to_dict() == first.to_dict()
    assert fingerprint(again) == fingerprint(first)


def test_generated_declarations_exercise_conflicts() -> None:
    """The generator above is not vacuous: it produces conflicts and accepted ops alike."""
    seen: set[str] = set()
    accepted = 0

    @settings(max_examples=150, deadline=None, database=None, derandomize=True)
    @given(declarations())
    def collect(decl: Declarations) -> None:
        nonlocal accepted
        plan = resolve(decl)
        seen.update(p.code for p in plan.errors)
        accepted += len(plan.ops)

    collect()
    assert accepted > 5
    assert len({"namespace-conflict", "op-conflict", "schema-invalid", "namespace-invalid",
                "namespace-reserved", "kernel-conflict", "namespace-closed"} & seen) >= 5, seen


def test_entry_point_order_of_real_distributions(dists: DistFactory, ns: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end: importlib-metadata's order reversed, the plan and fingerprint are the same."""
    from opregistry import discovery
    from opregistry.registry import plan

    kmod = f"k_{ns}"
    for dist, body in [
        ("one", f"lib = OpLibrary({ns!r})\nlib.define('f(Tensor x) -> Tensor', kernels={{'cpu': '{kmod}:k'}})\n"),
        ("two", f"lib = OpLibrary({ns!r}, 'FRAGMENT')\nlib.define('g(Tensor x) -> Tensor', fake='{kmod}:k')\n"),
        ("three", f"lib = OpLibrary({ns!r}, 'IMPL')\nlib.impl('f', 'cpu', '{kmod}:k')\n"),
        ("four", f"lib = OpLibrary({ns!r})\n"),
    ]:
        dists.make(dist, ops={"ops": f"{dist}_{ns}:lib"},
                   modules={f"{dist}_{ns}": "from opregistry import OpLibrary\n" + body,
                            kmod: "def k(x):\n    return x\n"})
    scope = ["opregistry-cpu", "opregistry-meta", *dists.names]
    forward = plan(plugins=scope)
    found_forward = discovery.entry_points()
    import importlib_metadata

    found = importlib_metadata.distributions
    monkeypatch.setattr(importlib_metadata, "distributions", lambda **kw: list(found(**kw))[::-1])
    assert discovery.entry_points() != found_forward
    backward = plan(plugins=scope)
    # one and four both DEF the namespace: both out, so three's kernel has no op
    assert [p.code for p in forward.errors] == ["kernel-for-undefined-op", "namespace-conflict"]
    assert backward.to_dict() == forward.to_dict()
    assert fingerprint(backward) == fingerprint(forward)


# -- fuzzing ----------------------------------------------------------------------

IDENT = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True)
NAME = st.one_of(IDENT, st.sampled_from(("x", "self", "out", "1x", "a-b", "", "ñ", "def", "None",
                                         "n" * 300)))
BASE = st.sampled_from(("Tensor", "int", "SymInt", "float", "bool", "str", "Scalar", "ScalarType",
                        "Device", "Layout", "MemoryFormat", "Generator", "complex", "Tensr", "Any",
                        "int64", "Dimname", "SymFloat", "SymBool"))
ALIAS = st.sampled_from(("", "", "", "(a)", "(a!)", "(b!)", "(a )", "(!)"))
DEFAULT = st.sampled_from(("", "", "", "=None", "=1", "=-2", "=1.5", "=True", "=False", "='s'",
                           "=\"s\"", "=[1, 2]", "=[]", "=inf", "=1e3", "=cpu", "=contiguous_format",
                           "=0.", "=[1.0]", "=nan", "=-inf", "=+1", "=9223372036854775808",
                           "=-9223372036854775809", "=1e400", "='a\\nb'", "=\"it's\"", "=[inf]"))


@st.composite
def argument(draw: Any) -> str:
    base = draw(BASE)
    text = base + draw(st.sampled_from(("", "", "?"))) + draw(ALIAS)
    text += draw(st.sampled_from(("", "", "", "[]", "[2]", "[]?")))
    return f"{text} {draw(NAME)}{draw(DEFAULT)}"


@st.composite
def signature(draw: Any) -> str:
    # now and then past torch's limit of 64 arguments
    args = draw(st.one_of(st.lists(argument(), max_size=4),
                          st.lists(st.just("Tensor t"), min_size=63, max_size=66).map(
                              lambda ts: [f"{t}{i}" for i, t in enumerate(ts)])))
    if args and draw(st.booleans()):
        args.insert(draw(st.integers(0, len(args))), "*")
    ret = draw(st.one_of(
        st.sampled_from(("Tensor", "()", "int", "Tensor[]", "Tensor(a)", "Tensor(a!)", "Foo",
                         "(Tensor, Tensor)", "(Tensor x, int y)", "Tensor?", "bool", "float",
                         "(Tensor(a!), Tensor)", "SymInt")),
        argument().map(lambda a: a.split(" ")[0])))
    return f"({', '.join(args)}) -> {ret}"


@st.composite
def plausible_signature(draw: Any) -> str:
    """Mostly well-formed signatures, so that many get past the resolver to torch."""
    names = draw(st.lists(st.sampled_from(("x", "y", "z", "w", "out")), max_size=4, unique=True))
    args = [f"{draw(st.sampled_from(PLAUSIBLE_TYPES))} {name}" for name in names]
    if args and draw(st.booleans()):
        args.insert(draw(st.integers(0, len(args))), "*")
    ret = draw(st.sampled_from(("Tensor", "Tensor", "(Tensor, Tensor)", "()", "int", "Tensor[]",
                                "Tensor(a!)", "Tensor(a)")))
    return f"({', '.join(args)}) -> {ret}"


PLAUSIBLE_TYPES = ("Tensor", "Tensor", "Tensor", "Tensor?", "Tensor[]", "int", "float", "bool",
                   "SymInt", "Scalar", "str", "int[]", "int[2]", "Tensor(a!)", "Tensor(a)",
                   "ScalarType?", "Device?", "Generator?", "Tensor?[]")
SIGNATURES = st.one_of(plausible_signature(), plausible_signature(), signature())


def declared(namespace: str, name: str, schema: str, mutates: Any, tags: tuple[str, ...],
             where: Origin | None = None) -> tuple[OpDef | None, Exception | None]:
    try:
        return OpDef(namespace=namespace, name=name, schema=schema, mutates_args=mutates, tags=tags,
                     origin=where or origin("fuzz")), None
    except OpRegistryError as exc:  # ours: fine
        return None, exc


FUZZ_DECLARATIONS = dict(
    schemas=st.lists(st.one_of(SIGNATURES, SIGNATURES, st.text(max_size=30)), min_size=1,
                     max_size=4),
    names=st.lists(NAME, min_size=4, max_size=4),
    namespace=st.one_of(IDENT, st.sampled_from(("", "my-ns", "ñs", "1abc", "a.b", "_", "aten"))),
    mutates=st.sampled_from((None, None, (), ("x",), ("self", "out"))),
    tags=st.sampled_from(((), ("pt2_compliant_tag",), ("core",), ("not_a_tag",))),
)


@CI
@given(**FUZZ_DECLARATIONS)
def test_fuzzed_declarations(schemas: list[str], names: list[str], namespace: str, mutates: Any,
                             tags: tuple[str, ...]) -> None:
    """Never anything but our errors; what the resolver accepts, torch accepts, alike."""
    # one distribution per op (FRAGMENTs of one namespace), so that one refused op
    # does not take the others with it: more of them reach torch
    ops, namespaces, origins = [], [], []
    for i, (name, schema) in enumerate(zip(names, schemas)):
        where = origin(f"fuzz{i}")
        op, _ = declared(namespace, name, schema, mutates, tags, where)
        if op is not None:
            ops.append(op)
            namespaces.append(Namespace(name=namespace, kind="FRAGMENT", origin=where))
            origins.append(where)
    decl = Declarations(namespaces=namespaces, ops=ops, distributions=origins)
    state = snapshot()
    plan = resolve(decl, torch_state=state)  # must not raise, whatever it is given
    accepted = [op for op in plan.ops]
    if not accepted:
        return
    COUNTS["ops defined in torch"] += len(accepted)
    # the resolver accepted the namespace: torch must give it to us, under a unique name
    # when torch already has it (a namespace is held by one Library at a time)
    assert namespace not in state.namespaces
    unique = f"{namespace}_{uuid.uuid4().hex[:8]}"
    lib = torch.library.Library(unique, "DEF")
    try:
        for op_plan in accepted:
            op = op_plan.op
            lib.define(op.full_schema, tags=tuple(getattr(torch.Tag, t) for t in op.tags))
            theirs = getattr(getattr(torch.ops, unique), op.name).default._schema
            ours = op_plan.parsed
            assert [a.name for a in theirs.arguments] == [a.name for a in ours.arguments]
            assert [a.kwarg_only for a in theirs.arguments] == [a.kwarg_only for a in ours.arguments]
            assert theirs.is_mutable == ours.is_mutable, op.full_schema
            assert len(theirs.returns) == len(ours.returns)
        assert hasattr(torch.ops, namespace) or namespace.startswith("_")
    finally:
        lib._destroy()


@CI
@given(key=st.one_of(st.text(max_size=12), st.sampled_from(sorted(KNOWN_KEYS | set(ALIASES)))))
def test_fuzzed_dispatch_keys(key: str) -> None:
    """A key opregistry accepts is a real torch dispatch key; any other is a DeclarationError."""
    try:
        kernel = Kernel(op="fz::f", key=key, fn="m:f")
    except DeclarationError as exc:
        assert repr(key) in str(exc) or "did you mean" in str(exc) or "known keys" in str(exc)
        return
    assert kernel.key in KNOWN_KEYS
    # torch parses the key (c10::parseDispatchKey raises for a name it does not know)
    torch._C._dispatch_has_kernel_for_dispatch_key("aten::add.Tensor", kernel.key)


@CI
@given(ref=st.one_of(st.text(max_size=30),
                     # never import arbitrary real modules (``antigravity`` opens a browser)
                     st.from_regex(r"no_such_[a-z_.]{0,8}:[a-z_.]{1,12}", fullmatch=True),
                     st.from_regex(r"os(\.path)?:[a-z_.]{1,12}", fullmatch=True),
                     st.sampled_from(("os:getcwd", "os.path:join", "math:pi", "json:nope",
                                      "no_such_mod_x:f", "os:path.join", "os:", ":f"))))
def test_fuzzed_kernel_references(ref: str) -> None:
    """A reference is refused when declared, or resolves to a callable, or fails to import:
    never accepted as something the materializer would register without a callable."""
    from opregistry.guard import resolve_ref

    try:
        kernel = Kernel(op="fz::f", key="cpu", fn=ref)
    except DeclarationError as exc:
        assert repr(ref) in str(exc)
        return
    try:
        fn = resolve_ref(kernel.fn)
    except (ImportError, AttributeError, TypeError):
        return  # reported as materialize-failed, the distribution rolled back
    assert callable(fn)


def test_schema_keywords_match_torch() -> None:
    """Every word the parser refuses as a name, torch refuses too (and 'from' it accepts)."""
    from opregistry.schema import SCHEMA_KEYWORDS

    for word in SCHEMA_KEYWORDS:
        with pytest.raises(RuntimeError):
            torch._C.parse_schema(f"fz::f(Tensor {word}) -> Tensor")
    torch._C.parse_schema("fz::f(Tensor from) -> Tensor")


@CI
@given(text=st.text(max_size=40))
def test_fuzzed_schema_text_only_raises_schema_errors(text: str) -> None:
    """Arbitrary text: the parser answers with a SchemaError or a schema torch also parses."""
    from opregistry import SchemaError

    try:
        ours = parse_signature(text)
    except SchemaError:
        return
    theirs = torch._C.parse_schema(f"fz::f{text}")
    assert [a.name for a in theirs.arguments] == [a.name for a in ours.arguments]


# -- fuzzing kernel sets through the real backends --------------------------------


def _kernel(*args: Any, **kwargs: Any) -> Any:
    """Stands in for every kernel: registration never calls it."""
    return None


def _setup_context(ctx: Any, inputs: Any, output: Any) -> None:
    return None


@functools.lru_cache(maxsize=None)
def _real_backends() -> Any:
    """The installed CPU, Meta, Autograd and vmap backends, collected once."""
    from opregistry.collect import collect
    from opregistry.config import Settings
    from opregistry.discovery import discover

    wanted = {"opregistry-cpu", "opregistry-meta", "opregistry-autograd", "opregistry-vmap"}
    collected = collect(discover(Settings(allow=wanted)))
    assert not collected.declarations.problems, collected.declarations.problems
    return collected


FUZZ_KERNEL_SETS = dict(
    schema=SIGNATURES,
    keys=st.sets(st.sampled_from(("CPU", "Meta", "Autograd", "FuncTorchBatched")), min_size=1),
    tags=st.sampled_from(((), ("pt2_compliant_tag",), ("out",), ("inplace_view",))),
)


@CI
@given(**FUZZ_KERNEL_SETS)
def test_fuzzed_kernel_sets_materialize(schema: str, keys: set[str], tags: tuple[str, ...]) -> None:
    """Whatever kernel set the resolver accepts, the real backends register without error."""
    from opregistry.materializer import materialize

    backends = _real_backends()
    namespace = f"fz{uuid.uuid4().hex[:10]}"
    where = origin("fuzz")
    op, _ = declared(namespace, "f", schema, None, tags)
    if op is None:
        return
    COUNTS["declared kernel sets"] += 1
    kernels = [Kernel(op=op.qualname, key=key, fn=_kernel, origin=where,
                      setup_context=_setup_context if key == "Autograd" else None) for key in keys]
    base = backends.declarations
    decl = Declarations(namespaces=[Namespace(name=namespace, origin=where)], ops=[op],
                        kernels=kernels, backends=base.backends, available=base.available,
                        distributions=[where, *base.distributions])
    plan = resolve(decl, torch_state=snapshot())
    if plan.errors:
        return  # refused before torch: that is the resolver's job
    COUNTS["materialized kernel sets"] += 1
    COUNTS["materialized autograd kernels"] += "Autograd" in keys
    done = materialize(plan, backends.materializers)
    try:
        assert not done.problems, [str(p) for p in done.problems]
        assert op.qualname in torch._C._dispatch_get_all_op_names()
        for key in keys:
            assert torch._C._dispatch_has_kernel_for_dispatch_key(op.qualname, key), key
    finally:
        done.destroy()
    assert op.qualname not in torch._C._dispatch_get_all_op_names()


def test_fuzzers_are_not_vacuous() -> None:
    """Run the fuzzers above with fixed seeds: each must get past the resolver often."""
    COUNTS.clear()
    fixed = settings(max_examples=80, deadline=None, database=None, derandomize=True)
    for test, strategies in ((test_fuzzed_declarations, FUZZ_DECLARATIONS),
                             (test_fuzzed_kernel_sets_materialize, FUZZ_KERNEL_SETS)):
        fixed(given(**strategies)(test.hypothesis.inner_test))()
    assert COUNTS["ops defined in torch"] >= 10, COUNTS
    assert COUNTS["materialized kernel sets"] >= 10, COUNTS
    assert COUNTS["materialized autograd kernels"] >= 3, COUNTS
