"""The conflict scenarios of the core issue, end to end: real entry points, real torch."""

from __future__ import annotations

import pytest
import torch

import opregistry
from opregistry import ResolutionError

from .conftest import load, op_dist, plan

def define(name: str, kernels: str = "{'cpu': 'KMOD:clone'}", extra: str = "") -> str:
    return f"lib.define('{name}(Tensor x) -> Tensor', kernels={kernels}{extra})\n"


def has_op(ns: str, name: str) -> bool:
    return f"{ns}::{name}" in torch._C._dispatch_get_all_op_names()


@pytest.fixture
def kmod(ns):
    """The kernel module (:data:`conftest.KERNELS`) of the test's distributions."""
    return f"{ns}_kernels"


def make(dists, kmod, name, ns, body, kind="DEF"):
    return op_dist(dists, name, ns, body, kind=kind)


def test_loads_and_calls(dists, ns, kmod):
    """A declared op is callable as torch.ops.<ns>.<op> after load."""
    make(dists, kmod, "good", ns, define("foo", extra=f", fake='{kmod}:fake'"))
    reg = load(dists)
    assert not reg.errors
    x = torch.arange(4.0)
    assert torch.equal(getattr(torch.ops, ns).foo(x), x)
    torch.library.opcheck(getattr(torch.ops, ns).foo.default, (x,))


def test_two_def_of_one_namespace(dists, ns, kmod):
    """Both DEF-ers are named and left out; an unrelated distribution still loads."""
    a = make(dists, kmod, "dist-a", ns, define("foo"))
    b = make(dists, kmod, "dist-b", ns, define("bar"))
    other = f"{ns}o"
    make(dists, kmod, "dist-c", other, define("baz"))
    reg = load(dists)
    [problem] = [p for p in reg.errors if p.code == "namespace-conflict"]
    assert {o.distribution for o in problem.culprits} == {a, b}
    assert "dist-a==1.0" in problem.message and "dist-b==1.0" in problem.message
    assert not has_op(ns, "foo") and not has_op(ns, "bar")
    assert has_op(other, "baz")


def test_fragment_redefining_an_op(dists, ns, kmod):
    """A FRAGMENT may add ops but not redefine one; only the fragment is left out."""
    make(dists, kmod, "owner", ns, define("foo"))
    frag = make(dists, kmod, "frag", ns, define("foo") + define("extra"), kind="FRAGMENT")
    reg = load(dists)
    [problem] = [p for p in reg.errors if p.code == "op-conflict"]
    assert [o.distribution for o in problem.culprits] == [frag]
    assert "owner==1.0" in problem.message and "frag==1.0" in problem.message
    assert has_op(ns, "foo")
    assert not has_op(ns, "extra"), "nothing of the faulty distribution is registered"


def test_fragment_adding_an_op(dists, ns, kmod):
    make(dists, kmod, "owner", ns, define("foo"))
    frag = make(dists, kmod, "frag", ns, define("extra"), kind="FRAGMENT")
    reg = load(dists)
    assert not reg.errors
    assert has_op(ns, "extra")
    [namespace] = [n for n in reg.plan.namespaces if n.name == ns]
    assert [f.distribution for f in namespace.fragments] == [frag]


def test_two_kernels_for_one_op_and_key(dists, ns, kmod):
    """A second CPU kernel from another distribution is a conflict, never a silent override."""
    make(dists, kmod, "owner", ns, define("foo"))
    intruder = make(dists, kmod, "intruder", ns,
                    f"lib.impl('{ns}::foo', 'cpu', '{kmod}:twice')\n", kind="IMPL")
    reg = load(dists)
    [problem] = [p for p in reg.errors if p.code == "kernel-conflict"]
    assert [o.distribution for o in problem.culprits] == [intruder]
    assert "owner==1.0" in problem.message
    x = torch.ones(3)
    assert torch.equal(getattr(torch.ops, ns).foo(x), x), "the owner's kernel is in effect"


def test_override_with_flag_and_policy(dists, ns, kmod):
    make(dists, kmod, "owner", ns, define("foo"))
    make(dists, kmod, "patch", ns,
         f"lib.impl('{ns}::foo', 'cpu', '{kmod}:twice', override=True)\n", kind="IMPL")
    denied = plan(dists)
    assert [p.code for p in denied.errors] == ["kernel-override-denied"]
    reg = load(dists, policy=opregistry.Policy(allow_override={ns}))
    assert not reg.errors
    assert torch.equal(getattr(torch.ops, ns).foo(torch.ones(2)), torch.full((2,), 2.0))
    statuses = {(k.kernel.origin.distribution, k.status) for k in reg.op(f"{ns}::foo").kernels}
    assert statuses == {("owner", "overridden"), ("patch", "active")}


def test_kernel_for_undefined_op(dists, ns, kmod):
    bad = make(dists, kmod, "stray", ns, f"lib.impl('{ns}::nope', 'cpu', '{kmod}:clone')\n",
               kind="IMPL")
    reg = load(dists)
    [problem] = [p for p in reg.errors if p.code == "kernel-for-undefined-op"]
    assert problem.culprits[0].distribution == bad
    assert f"{ns}::nope" in problem.message


def test_missing_module_and_raising_plugin(dists, ns, kmod):
    dists.make("ghost", ops={"ops": "no_such_module_xyz:lib"})
    mod = f"boom_{ns}"
    dists.make("boom", ops={"ops": f"{mod}:lib"}, modules={mod: "raise RuntimeError('kaput')\n"})
    make(dists, kmod, "fine", ns, define("foo"))
    reg = load(dists)
    codes = {p.code: p for p in reg.errors}
    assert codes["plugin-missing-module"].culprits[0].distribution == "ghost"
    assert "no_such_module_xyz" in codes["plugin-missing-module"].message
    assert codes["plugin-import-error"].culprits[0].distribution == "boom"
    assert "kaput" in codes["plugin-import-error"].message
    assert codes["plugin-import-error"].source.endswith(f"{mod}.py:1")
    assert has_op(ns, "foo")


def test_aten_add_needs_policy(dists, ns, kmod):
    mod = f"evil_{ns}"
    dists.make("evil", ops={"ops": f"{mod}:lib"}, modules={
        mod: "from opregistry import OpLibrary\n"
             "lib = OpLibrary('aten', 'IMPL')\n"
             f"lib.impl('add.Tensor', 'cpu', '{kmod}:twice', override=True)\n",
        kmod: "def twice(a, b, alpha=1):\n    return a.sub(b)\n"})
    reg = load(dists)
    [problem] = [p for p in reg.errors if p.code == "kernel-torch-op-denied"]
    assert problem.culprits[0].distribution == "evil"
    assert "OPREGISTRY_ALLOW_OVERRIDE=aten" in problem.hint
    assert torch.equal(torch.ones(2) + torch.ones(2), torch.full((2,), 2.0))


def test_strict_raises_before_registering(dists, ns, kmod):
    make(dists, kmod, "dist-a", ns, define("foo"))
    make(dists, kmod, "dist-b", ns, define("bar"))
    other = f"{ns}o"
    make(dists, kmod, "dist-c", other, define("baz"))
    with pytest.raises(ResolutionError, match="namespace-conflict") as info:
        load(dists, strict=True)
    assert info.value.problems[0].code == "namespace-conflict"
    assert not has_op(other, "baz"), "strict mode registers nothing"


def test_rollback_when_torch_rejects_halfway(dists, ns, kmod):
    """A kernel that fails to import rolls back the ops its distribution already defined."""
    make(dists, kmod, "half", ns, define("foo") + define("bar", "{'cpu': 'KMOD:does_not_exist'}"))
    other = f"{ns}o"
    make(dists, kmod, "whole", other, define("baz"))
    reg = load(dists)
    [problem] = [p for p in reg.errors if p.code == "materialize-failed"]
    assert problem.culprits[0].distribution == "half"
    assert "does_not_exist" in problem.message
    assert not has_op(ns, "foo") and not has_op(ns, "bar")
    assert has_op(other, "baz")


def test_load_is_idempotent(dists, ns, kmod):
    make(dists, kmod, "good", ns, define("foo"))
    first = load(dists)
    assert opregistry.load() is first
    first.unload()
    assert not has_op(ns, "foo")
