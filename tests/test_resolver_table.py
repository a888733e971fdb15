"""The resolution rules as a table: declarations and an Environment built by hand, the verdict expected.

The resolver is a pure function of the declarations, the policy and the
:class:`~opregistry.environment.Environment` (what the machine holds: the
installed torch, the dispatcher when torch is imported, versions of the
distributions conditions name, importable modules, native libraries, the
packages that register with torch.library directly).  Each row builds those
records -- no distribution is installed, nothing is imported -- and states
the errors expected, by code and culprit, and what the plan says of the
kernels involved.  The end-to-end suites (test_fault_matrix.py,
test_ecosystem.py) check the same rules through real installs.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest

from opregistry.config import Policy
from opregistry.environment import Environment, TorchState
from opregistry.foreign import ForeignDistribution, ForeignScan, InstalledDistribution, Registration
from opregistry.keys import TorchFacts, tags_of
from opregistry.kinds import TritonKernel
from opregistry.model import Backend, Declarations, Kernel, Namespace, NativeLibrary, OpDef, Origin
from opregistry.plans import Plan
from opregistry.resolver import resolve


def origin(name: str, version: str = "1.0", group: str = "opregistry.ops") -> Origin:
    return Origin(distribution=name, version=version, group=group, entry_point=name,
                  value=f"{name.replace('-', '_')}:lib")


A, B = origin("a"), origin("b", "2.0")
BACKENDS = tuple(Backend(name=name, keys=keys, origin=origin(f"opregistry-{name}", "0.1.0",
                                                              "opregistry.backends"))
                 for name, keys in (("cpu", ("CPU", "CompositeExplicitAutograd")),
                                    ("cuda", ("CUDA",)), ("meta", ("Meta",)),
                                    ("autograd", ("Autograd",))))


def ns(owner: Origin, name: str, kind: str = "DEF", **kw: Any) -> Namespace:
    return Namespace(name=name, kind=kind, origin=owner, source=f"/site/{owner.distribution}.py:2",
                     **kw)


def op(owner: Origin, qualname: str, schema: str = "(Tensor x) -> Tensor", **kw: Any) -> OpDef:
    namespace, _, name = qualname.partition("::")
    base, _, overload = name.partition(".")
    return OpDef(namespace=namespace, name=base, overload=overload, schema=schema, origin=owner,
                 source=f"/site/{owner.distribution}.py:3", **kw)


def kernel(owner: Origin, qualname: str, key: str = "cpu", **kw: Any) -> Kernel:
    if "payload" not in kw:
        kw.setdefault("fn", "k:f")
    return Kernel(op=qualname, key=key, origin=owner, source=f"/site/{owner.distribution}.py:4",
                  **kw)


def decl(*records: Any) -> Declarations:
    by_type: dict[type, list[Any]] = {Namespace: [], OpDef: [], Kernel: []}
    for record in records:
        by_type[type(record)].append(record)
    origins = {r.origin for r in records} | {b.origin for b in BACKENDS}
    return Declarations(namespaces=by_type[Namespace], ops=by_type[OpDef],
                        kernels=by_type[Kernel], backends=BACKENDS,
                        distributions=tuple(sorted(o for o in origins if o is not None)))


def package(name: str, version: str, *registrations: Registration,
            plugin: bool = False) -> ForeignDistribution:
    return ForeignDistribution(
        distribution=InstalledDistribution(name=name, version=version,
                                           location=f"/site/{name}-{version}.dist-info"),
        requires_torch=True, plugin_groups=("opregistry.ops",) if plugin else (),
        registrations=registrations)


def reg(kind: str, namespace: str, name: str | None = None, key: str | None = None,
        **kw: Any) -> Registration:
    return Registration(kind=kind, namespace=namespace, name=name, key=key,
                        module=f"{namespace}._ops", file=f"/site/{namespace}/_ops.py",
                        line=kw.pop("line", 10), **kw)


BNB = package("bitsandbytes", "0.50.2", reg("FRAGMENT", "bnb"), reg("op", "bnb", "quantize"),
              reg("kernel", "bnb", "quantize", "CPU", line=20))
#: vLLM's ``_C`` library: one .so, two namespaces, schema strings without a namespace
_VLLM_SO = "/site/vllm/_C.abi3.so"
VLLM = package("vllm", "0.33.0", *(
    Registration(kind="FRAGMENT", namespace=n, api="TORCH_LIBRARY_FRAGMENT", file=_VLLM_SO,
                 line=None, module="vllm.platforms.cuda") for n in ("_C", "_C_cache_ops")),
    Registration(kind="op", name="silu_and_mul", schema="(Tensor! out, Tensor input) -> ()",
                 api="m.def", file=_VLLM_SO, line=None, module="vllm.platforms.cuda",
                 unresolved="the schema string does not say which of the library's namespaces "
                            "(_C, _C_cache_ops) it belongs to"))
#: torchvision 0.28: nms defined in a library the scan cannot read, its fake kernel in Python
TV = package("torchvision", "0.28.0", reg("FRAGMENT", "torchvision"),
             reg("kernel", "torchvision", "nms", "Meta", line=30))
#: a package whose own ``TORCH_LIBRARY(_C, m)`` defines an op vLLM's library may define
MYEXT = package("myext", "0.1.0", Registration(
    kind="DEF", namespace="_C", api="TORCH_LIBRARY", file="/site/myext/_C.so", line=None,
    module="myext"), Registration(kind="op", namespace="_C", name="silu_and_mul",
                                  schema="(Tensor! out, Tensor input) -> ()", api="m.def",
                                  file="/site/myext/_C.so", line=None, module="myext"))
#: torchvision 0.29: ops and a CPU block from C++, Meta kernels by a helper naming the op at
#: run time (``register_meta``)
_TV_SO = "/site/torchvision/_C.so"
TV29 = package("torchvision", "0.29.1", reg("FRAGMENT", "torchvision"), *(
    Registration(kind="op", namespace="torchvision", name=name, schema="(Tensor x) -> Tensor",
                 api="m.def", file=_TV_SO, line=None, module="torchvision")
    for name in ("nms", "roi_align")),
    Registration(kind="IMPL", namespace="torchvision", key="CPU",
                 api="STABLE_TORCH_LIBRARY_IMPL", file=_TV_SO, line=None, module="torchvision"),
    reg("kernel", "torchvision", None, "Meta", line=19, api="Library.impl",
        unresolved="the op name: the result of getattr(...)"))
TORCH = TorchFacts("2.13.0", (2, 13), tags_of((2, 13)), "table")


def env(*packages: ForeignDistribution, **facts: Any) -> Environment:
    facts.setdefault("torch", TORCH)
    return Environment(foreign=ForeignScan(distributions=packages), **facts)


#: a row's check of the plan, beyond its errors
Check = Callable[[Plan], None]


def _kernel(plan: Plan, qualname: str, key: str) -> Any:
    found = plan.op(qualname)
    if found is not None:
        return found.kernel(key)
    return next(k for k in plan.external_kernels if (k.kernel.op, k.kernel.key) == (qualname, key))


def _overrides(qualname: str, key: str, expected: str | None) -> Check:
    def check(plan: Plan) -> None:
        k = _kernel(plan, qualname, key)
        assert (k.status, k.overrides) == ("active", expected), (k.status, k.overrides)
    return check


def _status(qualname: str, key: str, status: str, reason: str = "") -> Check:
    def check(plan: Plan) -> None:
        k = _kernel(plan, qualname, key)
        assert k.status == status and reason in k.reason, (k.status, k.reason)
    return check


def _candidate(qualname: str, ref: str, status: str, reason: str) -> Check:
    def check(plan: Plan) -> None:
        [k] = [k for k in plan.op(qualname).kernels if k.kernel.fn == ref]
        assert k.status == status and reason in k.reason, (k.status, k.reason)
    return check


def _problem(code: str, *fragments: str) -> Check:
    def check(plan: Plan) -> None:
        [found] = [p for p in plan.problems if p.code == code]
        text = found.message + found.hint
        assert all(f in text for f in fragments), text
    return check


def _adopted(expected: dict[str, str]) -> Check:
    def check(plan: Plan) -> None:
        assert {a.name: a.status for a in plan.adoptions} == expected, plan.adoptions
    return check


def _op_modules(name: str, expected: dict[str, str]) -> Check:
    """What looking each op up imports, for the adopted ``name``."""
    def check(plan: Plan) -> None:
        assert dict(plan.adopted(name).op_modules) == expected, plan.adopted(name)
    return check


ALLOW_BNB = Policy(allow_override={"bnb"})

#: case -> (declarations, environment, policy, {error code: culprit distributions}, checks)
CASES: dict[str, tuple[Declarations, Environment, Policy | None, dict[str, list[str]],
                       tuple[Check, ...]]] = {
    # -- packages that use torch.library directly --------------------------------------
    "def-of-a-package-namespace": (
        decl(ns(A, "bnb"), op(A, "bnb::mine"), kernel(A, "bnb::mine")), env(BNB), None,
        {"namespace-held-by-package": ["a"]},
        (_problem("namespace-held-by-package", "bitsandbytes==0.50.2 (/site/bnb/_ops.py:10)"),)),
    "fragment-redefining-a-package-op": (
        decl(ns(A, "bnb", "FRAGMENT"), op(A, "bnb::quantize"), kernel(A, "bnb::quantize")),
        env(BNB), None, {"op-held-by-package": ["a"]},
        (_problem("op-held-by-package", "bnb::quantize", "bitsandbytes==0.50.2"),)),
    "fragment-defining-what-a-package-library-may-define": (
        decl(ns(A, "_C", "FRAGMENT"), op(A, "_C::silu_and_mul"), kernel(A, "_C::silu_and_mul")),
        env(VLLM), None, {"op-held-by-package": ["a"]},
        (_problem("op-held-by-package", "vllm==0.33.0 (/site/vllm/_C.abi3.so) may define",
                  "'silu_and_mul(Tensor! out, Tensor input) -> ()'", "_C, _C_cache_ops"),)),
    "fragment-adding-a-name-a-package-library-lacks": (
        decl(ns(A, "_C", "FRAGMENT"), op(A, "_C::mine"), kernel(A, "_C::mine")), env(VLLM),
        None, {}, (_status("_C::mine", "CPU", "active"),)),
    "fragment-defining-an-op-a-package-registers-kernels-for": (
        decl(ns(A, "torchvision", "FRAGMENT"), op(A, "torchvision::nms"),
             kernel(A, "torchvision::nms")), env(TV), None, {"op-held-by-package": ["a"]},
        (_problem("op-held-by-package", "torchvision==0.28.0 (/site/torchvision/_ops.py:30) "
                  "gives a Meta kernel at its import"),)),
    "two-packages-that-may-define-one-op-are-not-adopted": (
        decl(), env(VLLM, MYEXT), None, {"adoption-conflict": []},
        (_problem("adoption-conflict", "myext==0.1.0 and vllm==0.33.0 both define op "
                  "_C::silu_and_mul (perhaps: vllm==0.33.0's C++ library", "_C, _C_cache_ops"),
         _adopted({"myext": "refused", "vllm": "refused"}))),
    "an-op-a-package-library-may-define-is-looked-up-through-its-loader": (
        decl(), env(VLLM), None, {}, (_op_modules("vllm", {
            "_C::silu_and_mul": "vllm.platforms.cuda",
            "_C_cache_ops::silu_and_mul": "vllm.platforms.cuda"}),)),
    "allowed-override-of-a-c++-block-without-override-declared": (
        decl(kernel(A, "torchvision::nms")), env(TV29),
        Policy(allow_override={"torchvision::nms"}), {"kernel-override-undeclared": ["a"]},
        (_problem("kernel-override-undeclared", "torchvision==0.29.1 may already implement for "
                  "CPU (its C++ STABLE_TORCH_LIBRARY_IMPL(torchvision, CPU) block"),)),
    "allowed-override-of-a-c++-block": (
        decl(kernel(A, "torchvision::nms", override=True)), env(TV29),
        Policy(allow_override={"torchvision::nms"}), {},
        (_overrides("torchvision::nms", "CPU", "torchvision==0.29.1"),)),
    "allowed-override-of-a-kernel-named-at-run-time": (
        decl(kernel(A, "torchvision::roi_align", "meta")), env(TV29),
        Policy(allow_override={"torchvision"}), {"kernel-override-undeclared": ["a"]},
        (_problem("kernel-override-undeclared", "may already implement for Meta (Library.impl "
                  "at /site/torchvision/_ops.py:19, for an op it names at run time)"),)),
    "a-switch-of-a-c++-kernel-is-not-applied": (
        decl(), env(TV29), Policy.from_env({"OPREGISTRY_KERNELS": "-torchvision::nms:CPU"}), {},
        (_problem("kernel-switch-not-applied", "switches off the CPU kernel of torchvision::nms "
                  "(torchvision==0.29.1)", "torch cannot leave a C++ registration out"),)),
    "fragment-adding-a-new-op": (
        decl(ns(A, "bnb", "FRAGMENT"), op(A, "bnb::mine"), kernel(A, "bnb::mine")), env(BNB),
        None, {}, (_status("bnb::mine", "CPU", "active"),)),
    "kernel-for-a-package-op": (
        decl(kernel(A, "bnb::quantize", "cuda")), env(BNB), None,
        {"kernel-package-op-denied": ["a"]},
        (_problem("kernel-package-op-denied", "OPREGISTRY_ALLOW_OVERRIDE=bnb"),)),
    "allowed-override-of-a-package-kernel": (
        decl(kernel(A, "bnb::quantize", override=True)), env(BNB), ALLOW_BNB, {},
        (_overrides("bnb::quantize", "CPU", "bitsandbytes==0.50.2"),)),
    "allowed-but-no-override-declared": (
        decl(kernel(A, "bnb::quantize")), env(BNB), ALLOW_BNB,
        {"kernel-override-undeclared": ["a"]},
        (_problem("kernel-override-undeclared", "bitsandbytes==0.50.2 already implements"),)),
    "allowed-key-the-package-lacks": (
        decl(kernel(A, "bnb::quantize", "cuda")), env(BNB), ALLOW_BNB, {},
        (_overrides("bnb::quantize", "CUDA", None),)),
    "a-c++-kernel-for-a-package-op": (
        decl(kernel(A, "bnb::quantize", "cuda", fn="pkg._C", native=True,
                    library=NativeLibrary(module="pkg._C"))),
        env(BNB), ALLOW_BNB, {"kernel-package-op-denied": ["a"]},
        (_problem("kernel-package-op-denied", "a C++ kernel never"),)),
    "a-conditional-kernel-for-a-package-op": (
        decl(kernel(A, "bnb::quantize", "cuda", when={"platform": "linux"})), env(BNB),
        ALLOW_BNB, {"kernel-condition-unsupported": ["a"]}, ()),
    "an-opregistry-plugin-is-no-package-owner": (
        decl(ns(A, "bnb"), op(A, "bnb::quantize"), kernel(A, "bnb::quantize")),
        env(package("other", "1.0", reg("op", "bnb", "quantize"), plugin=True)), None, {},
        (_status("bnb::quantize", "CPU", "active"),)),
    "torch-namespaces-are-never-a-package's": (
        decl(ns(A, "mine"), op(A, "mine::f"), kernel(A, "mine::f")),
        env(package("vendor", "1.0", reg("FRAGMENT", "aten"), reg("op", "aten", "vendor_op"))),
        None, {}, ()),
    "the-package-named-first-is-the-first-by-name": (
        decl(ns(A, "shared")),
        env(package("zeta", "1.0", reg("op", "shared", "z")),
            package("alpha", "1.0", reg("op", "shared", "a"))), None,
        {"namespace-held-by-package": ["a"]},
        (_problem("namespace-held-by-package", "alpha==1.0"),)),
    # -- what torch's dispatcher holds (torch imported) ---------------------------------
    "def-of-a-namespace-torch-holds": (
        decl(ns(A, "held"), op(A, "held::f"), kernel(A, "held::f")),
        env(dispatcher=TorchState(namespaces=frozenset({"held"}), ops=frozenset({"held::g"}))),
        None, {"namespace-held-by-torch": ["a"]}, ()),
    "fragment-redefining-an-op-torch-holds": (
        decl(ns(A, "held", "FRAGMENT"), op(A, "held::g"), kernel(A, "held::g")),
        env(dispatcher=TorchState(namespaces=frozenset({"held"}), ops=frozenset({"held::g"}))),
        None, {"op-held-by-torch": ["a"]}, ()),
    "kernel-replacing-torch's-without-override": (
        decl(kernel(A, "aten::add.Tensor")),
        env(dispatcher=TorchState(ops=frozenset({"aten::add.Tensor"}),
                                  namespaces=frozenset({"aten"}),
                                  has_kernel=lambda op, key: True)),
        Policy(allow_override={"aten"}), {"kernel-override-undeclared": ["a"]}, ()),
    # -- the installed torch, distributions and modules -------------------------------
    "tag-the-installed-torch-lacks": (
        decl(ns(A, "t"), op(A, "t::f", tags=("out",)), kernel(A, "t::f")),
        env(torch=TorchFacts("2.8.0", (2, 8), tags_of((2, 8)), "table")), None,
        {"op-tag-needs-newer-torch": ["a"]},
        (_problem("op-tag-needs-newer-torch", "install torch>=2.13"),)),
    "candidate-whose-requirement-is-older": (
        decl(ns(A, "c"), op(A, "c::f"), kernel(A, "c::f", when={"requires": "z>=2"}),
             kernel(B, "c::f", fn="k:fallback")),
        env(distributions={"z": "1.0"}), None, {},
        (_candidate("c::f", "k:f", "unmet", "z 1.0 is not >=2"),
         _candidate("c::f", "k:fallback", "active", "fallback"))),
    "candidate-condition-met-and-unmet": (
        decl(ns(A, "c"), op(A, "c::f"), kernel(A, "c::f", when={"requires": "z>=2"}),
             kernel(A, "c::f", fn="k:other", when={"requires": "y>=1"}),
             kernel(A, "c::f", fn="k:plain")),
        env(distributions={"z": "1.0", "y": "3.1"}), None, {},
        (_status("c::f", "CPU", "active", "candidate 1"),)),
    "triton-not-importable": (
        decl(ns(A, "tr"), op(A, "tr::f"), kernel(A, "tr::f", payload=TritonKernel("k:f")),
             kernel(A, "tr::f", "fake", fn="k:fake")),
        env(modules={"triton": False}), None, {"op-no-active-kernel": ["a"]},
        (_status("tr::f", "CPU", "inactive", "pip install triton"),
         _problem("triton-missing", "a triton kernel (k:f)"))),
    "native-library-missing": (
        decl(ns(A, "nat", native=NativeLibrary(module="nat._C")), op(A, "nat::f")),
        env(natives={"nat._C": "module nat._C does not exist"}), None,
        {"native-library-missing": ["a"]}, ()),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_rule(case: str) -> None:
    declarations, environment, policy, errors, checks = CASES[case]
    plan = resolve(declarations, policy=policy, environment=environment)
    found: dict[str, set[str]] = {}
    for problem in plan.errors:
        found.setdefault(problem.code, set()).update(o.distribution for o in problem.culprits)
    assert {code: sorted(names) for code, names in found.items()} == errors, \
        [str(p) for p in plan.errors]
    for check in checks:
        check(plan)


def test_the_resolver_reads_nothing_but_its_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    """Given an Environment, resolve() reads no file and imports nothing."""
    import builtins
    import importlib

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"the resolver read the machine: {args[:1]}")

    declarations, environment, policy, _, _ = CASES["candidate-condition-met-and-unmet"]
    import importlib.util

    import importlib_metadata

    monkeypatch.setattr(importlib.util, "find_spec", refuse)
    monkeypatch.setattr(importlib_metadata, "version", refuse)
    monkeypatch.setattr(builtins, "open", refuse)
    monkeypatch.setattr(importlib, "import_module", refuse)
    resolve(declarations, policy=policy, environment=environment)
