"""Kernels for every device: CompositeExplicitAutograd / CompositeImplicitAutograd.

Each case is a temporary distribution with real entry points, registered by
the installed backends (opregistry-cpu serves both composite keys), called
through torch's dispatcher, and compared with what ``torch.library`` itself
registers for the same declaration.
"""

from __future__ import annotations

import re

import pytest
import torch

import opregistry
from opregistry.checking import devices_for, run_checks
from opregistry.errors import DeclarationError
from opregistry.keys import PROVIDERS, canonical_key

from .conftest import load, plan


def _has(qualname: str, key: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(qualname, key)


def _codes(p: object) -> list[str]:
    return [x.code for x in p.errors]  # type: ignore[attr-defined]


def test_spellings_and_provider() -> None:
    assert canonical_key("default") == "CompositeExplicitAutograd"
    assert canonical_key("CompositeImplicitAutograd") == "CompositeImplicitAutograd"
    # the backend that serves them is the one every op package depends on
    assert PROVIDERS["CompositeExplicitAutograd"] == PROVIDERS["CompositeImplicitAutograd"] \
        == "opregistry-cpu"
    with pytest.raises(DeclarationError, match="did you mean 'CompositeExplicitAutograd'"):
        opregistry.Kernel(op="a::b", key="CompositeExplicitAutogard", fn="m:f")


def test_default_kernel_serves_every_device_and_a_device_kernel_wins(dists, ns) -> None:
    """A kernel for every device from the owner, a CPU kernel from another distribution."""
    dists.make("comp-owner", ops={"ops": "comp_owner:lib"}, modules={"comp_owner": f"""
        import torch
        from opregistry import OpLibrary
        lib = OpLibrary({ns!r})
        lib.define("twice(Tensor x) -> Tensor", kernels={{"default": "comp_owner:twice"}},
                   fake="comp_owner:fake", samples="comp_owner:samples")
        def twice(x):
            return x * 2
        def fake(x):
            return torch.empty_like(x)
        def samples():
            return [((torch.randn(3),), {{}})]
    """})
    dists.make("comp-cpu", ops={"ops": "comp_cpu:lib"}, modules={"comp_cpu": f"""
        from opregistry import OpLibrary
        lib = OpLibrary({ns!r}, "IMPL")
        lib.impl("twice", "cpu", "comp_cpu:twice")
        def twice(x):
            return x * 2 + 1000   # tells which kernel ran
    """})
    registry = load(dists)
    assert not registry.errors, registry.errors
    op = registry.plan.op(f"{ns}::twice")
    rows = {k.kernel.key: k for k in op.kernels}
    assert rows["CompositeExplicitAutograd"].status == "active"
    assert rows["CompositeExplicitAutograd"].backend == "cpu"
    assert rows["CompositeExplicitAutograd"].reason == "every device but CPU (own kernel)"
    assert _has(f"{ns}::twice", "CompositeExplicitAutograd") and _has(f"{ns}::twice", "CPU")
    x = torch.ones(2)
    # CPU: the device kernel wins; meta: its fake; any other device: the default kernel
    assert torch.equal(getattr(torch.ops, ns).twice(x), x * 2 + 1000)
    assert getattr(torch.ops, ns).twice(torch.empty(2, device="meta")).device.type == "meta"
    # a device with no kernel of its own at all: the default kernel, read through the dispatcher
    compiled = torch.compile(getattr(torch.ops, ns).twice, fullgraph=True)
    assert torch.equal(compiled(x), x * 2 + 1000)
    assert devices_for(op, ["cpu", "cuda"]) == ["cpu", "cuda"]


def test_default_kernel_alone_runs_and_checks_on_every_device(dists, ns) -> None:
    dists.make("comp-alone", ops={"ops": "comp_alone:lib"}, modules={"comp_alone": f"""
        import torch
        from opregistry import OpLibrary
        lib = OpLibrary({ns!r})
        lib.define("plus1(Tensor x) -> Tensor",
                   kernels={{"CompositeExplicitAutograd": "comp_alone:plus1"}},
                   fake="comp_alone:fake", samples="comp_alone:samples",
                   autograd=("comp_alone:backward", None))
        def plus1(x):
            return x + 1
        def fake(x):
            return torch.empty_like(x)
        def backward(ctx, grad):
            return grad
        def samples():
            return [((torch.randn(3, dtype=torch.double, requires_grad=True),), {{}})]
    """})
    registry = load(dists)
    assert not registry.errors, registry.errors
    op = registry.plan.op(f"{ns}::plus1")
    assert op.kernel("CompositeExplicitAutograd").reason == "every device"
    x = torch.zeros(3, requires_grad=True)
    y = getattr(torch.ops, ns).plus1(x)
    y.sum().backward()
    assert torch.equal(x.grad, torch.ones(3))
    # the no-grad fast path of the autograd backend finds the default kernel for CPU
    from opregistry.backend import device_kernel

    assert device_kernel(f"{ns}::plus1", "CPU")[1].__name__ == "plus1"
    assert torch.equal(getattr(torch.ops, ns).plus1(torch.zeros(2)), torch.ones(2))
    results, _ = run_checks(registry, [f"{ns}::plus1"])
    assert results and all(r.status == "ok" for r in results), results
    assert {r.device for r in results} == {"cpu"}


def test_implicit_kernel_decomposes(dists, ns) -> None:
    """CompositeImplicitAutograd: autograd and fake tensors come from the ops it calls."""
    dists.make("comp-implicit", ops={"ops": "comp_implicit:lib"}, modules={"comp_implicit": f"""
        import torch
        from opregistry import OpLibrary
        lib = OpLibrary({ns!r})
        lib.define("softsq(Tensor x) -> Tensor",
                   kernels={{"CompositeImplicitAutograd": "comp_implicit:softsq"}},
                   samples="comp_implicit:samples")
        def softsq(x):
            return torch.tanh(x) * x
        def samples():
            return [((torch.randn(3, dtype=torch.double, requires_grad=True),), {{}})]
    """})
    registry = load(dists)
    assert not registry.errors, registry.errors
    codes = {p.code for p in registry.plan.problems if p.op == f"{ns}::softsq"}
    assert "op-no-fake" not in codes  # a decomposition needs none
    x = torch.randn(4, dtype=torch.double, requires_grad=True)
    torch.autograd.gradcheck(getattr(torch.ops, ns).softsq, (x,))
    compiled = torch.compile(getattr(torch.ops, ns).softsq, fullgraph=True)
    torch.testing.assert_close(compiled(x), torch.tanh(x) * x)
    results, _ = run_checks(registry, [f"{ns}::softsq"])
    assert results and all(r.status == "ok" for r in results), results


@pytest.mark.parametrize("other,blamed", [
    ('fake="M:f"', "same"),                                 # torch raises on Library.impl(Meta)
    ('autograd=("M:f", None)', "same"),                     # silently not used under compile
    ('kernels={"cpu": "M:f", "CompositeImplicitAutograd": "M:f"}', "same"),
    ("IMPL cpu", "impl"),                                   # another distribution's CPU kernel
])
def test_implicit_kernel_refused_beside_others(dists, ns, other, blamed) -> None:
    kernels = '{"CompositeImplicitAutograd": "M:f"}'
    extra = "" if other == "IMPL cpu" or other.startswith("kernels=") else other
    if other.startswith("kernels="):
        kernels = other[len("kernels="):]
    source = f"""
        from opregistry import OpLibrary
        lib = OpLibrary({ns!r})
        lib.define("g(Tensor x) -> Tensor", kernels={kernels}{', ' + extra if extra else ''})
        def f(x): return x
    """.replace("M:", "mix_owner:")
    dists.make("mix-owner", ops={"ops": "mix_owner:lib"}, modules={"mix_owner": source})
    if other == "IMPL cpu":
        dists.make("mix-impl", ops={"ops": "mix_impl:lib"}, modules={"mix_impl": f"""
            from opregistry import OpLibrary
            lib = OpLibrary({ns!r}, "IMPL")
            lib.impl("g", "cpu", "mix_impl:f")
            def f(x): return x
        """})
    p = plan(dists)
    problems = [x for x in p.errors if x.code == "composite-implicit-mixed"]
    assert len(problems) == 1, p.errors
    culprits = {o.distribution for o in problems[0].culprits}
    assert culprits == ({"mix-owner"} if blamed == "same" else {"mix-impl"})
    assert "CompositeExplicitAutograd" in problems[0].hint
    if blamed == "impl":  # the owner's op stays, with its decomposition
        assert p.op(f"{ns}::g") is not None
    else:
        assert p.op(f"{ns}::g") is None


def test_implicit_kernel_with_vmap_rule_is_fine(dists, ns) -> None:
    dists.make("mix-vmap", ops={"ops": "mix_vmap:lib"}, modules={"mix_vmap": f"""
        from opregistry import OpLibrary
        lib = OpLibrary({ns!r})
        lib.define("g(Tensor x) -> Tensor", kernels={{"CompositeImplicitAutograd": "mix_vmap:f"}},
                   vmap="mix_vmap:f")
        def f(x): return x
    """})
    assert not plan(dists).errors


def test_decorator_default_is_every_device_as_custom_op(dists, ns) -> None:
    """``@lib.op`` without device_types, and with None, registers what custom_op registers."""
    dists.make("deco-ops", ops={"ops": "deco_ops:lib"}, modules={"deco_ops": f"""
        import torch
        from opregistry import OpLibrary
        lib = OpLibrary({ns!r})

        @lib.op(mutates_args=())
        def plain(x: torch.Tensor) -> torch.Tensor:
            return x + 1

        @lib.op(mutates_args=(), device_types=None)
        def none(x: torch.Tensor) -> torch.Tensor:
            return x + 2

        @lib.op(mutates_args=(), device_types="cpu")
        def cpu_only(x: torch.Tensor) -> torch.Tensor:
            return x + 3
    """})
    registry = load(dists)
    assert not registry.errors, registry.errors

    def ref(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    torch.library.custom_op(f"{ns}ref::plain", ref, mutates_args=())
    for name in ("plain", "none"):
        for key in ("CompositeExplicitAutograd", "CPU", "CUDA"):
            assert _has(f"{ns}::{name}", key) == _has(f"{ns}ref::plain", key), (name, key)
    assert _has(f"{ns}::cpu_only", "CPU") and not _has(f"{ns}::cpu_only", "CompositeExplicitAutograd")
    assert torch.equal(getattr(torch.ops, ns).none(torch.zeros(2)), torch.full((2,), 2.0))


@pytest.mark.skipif(not hasattr(torch.Tag, "inplace"), reason="torch.Tag.inplace is new in 2.13")
def test_decorator_inplace_op_returning_its_input(dists, ns) -> None:
    """``-> Tensor(a!)``: the ``inplace`` tag tells infer_schema the return aliases ``x``."""
    dists.make("deco-inplace", ops={"ops": "deco_inplace:lib"}, modules={"deco_inplace": f"""
        import torch
        from opregistry import OpLibrary
        lib = OpLibrary({ns!r})

        @lib.op(mutates_args=["x"], tags=["inplace"])
        def bump_(x: torch.Tensor) -> torch.Tensor:
            x.add_(1)
            return x

        @bump_.register_fake
        def _(x):
            return x
    """})
    registry = load(dists)
    assert not registry.errors, registry.errors
    assert registry.plan.op(f"{ns}::bump_").op.schema == "(Tensor(a0!) x) -> Tensor(a0!)"
    x = torch.zeros(2)
    assert getattr(torch.ops, ns).bump_(x) is x and torch.equal(x, torch.ones(2))
    torch.library.opcheck(getattr(torch.ops, ns).bump_.default, (torch.zeros(3),))


@pytest.mark.parametrize("bad", [3, [], [1]])
def test_decorator_bad_device_types(bad) -> None:
    lib = opregistry.OpLibrary("badtypes")
    with pytest.raises(DeclarationError, match="device_types must be"):
        lib.op(mutates_args=(), device_types=bad)


def test_listing_names_what_a_default_kernel_serves(dists, ns, capsys, monkeypatch) -> None:
    from opregistry.cli import main

    dists.make("comp-list", ops={"ops": "comp_list:lib"}, modules={"comp_list": f"""
        from opregistry import OpLibrary
        lib = OpLibrary({ns!r})
        lib.define("h(Tensor x) -> Tensor",
                   kernels={{"default": "comp_list:h", "cpu": "comp_list:h"}})
    """})
    monkeypatch.setenv("OPREGISTRY_PLUGINS", "opregistry-cpu,comp-list")
    main(["show", f"{ns}::h"])
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.strip().startswith("CompositeExplicit"))
    assert "active" in line and "every device but CPU (own kernel)" in line, out


def _table_cases() -> list[tuple[str, str]]:
    """``(custom_op's device_types, @lib.op's)`` of each row of migrating.md's table naming them."""
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "migrating.md").read_text()
    spelled = re.compile(r"device_types=(None|\"[^\"]*\"|\([^)]*\))")
    cases = []
    for line in text.splitlines():
        cells = line.strip().strip("|").split("|")
        if len(cells) == 2 and all("device_types=" in c for c in cells):
            left, right = (spelled.search(c) for c in cells)
            assert left and right, line
            cases.append((left.group(1), right.group(1)))
    return cases


def test_migrating_table_has_the_device_types_rows() -> None:
    assert [c[0] for c in _table_cases()] == ["None", '"cpu"', '("cpu", "cuda")']


@pytest.mark.parametrize("custom_op_types,lib_op_types", _table_cases() + [("OMITTED", "OMITTED")])
def test_migrating_table_device_types(dists, ns, custom_op_types, lib_op_types) -> None:
    """Each row of docs/migrating.md registers the same dispatcher keys both ways."""
    import ast

    def kwargs(spelled: str) -> dict[str, object]:
        return {} if spelled == "OMITTED" else {"device_types": ast.literal_eval(spelled)}

    def f(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    torch.library.custom_op(f"{ns}ref::f", f, mutates_args=(), **kwargs(custom_op_types))
    lib_args = "" if lib_op_types == "OMITTED" else f", device_types={lib_op_types}"
    dists.make("table-ops", ops={"ops": "table_ops:lib"}, modules={"table_ops": f"""
        import torch
        from opregistry import OpLibrary
        lib = OpLibrary({ns!r})

        @lib.op(mutates_args=(){lib_args})
        def f(x: torch.Tensor) -> torch.Tensor:
            return x + 1
    """})
    registry = load(dists)
    assert not registry.errors, registry.errors
    keys = ("CompositeExplicitAutograd", "CompositeImplicitAutograd", "CPU", "CUDA")
    # declared: a CUDA kernel is only registered where CUDA is available (never imported
    # elsewhere), where custom_op registers it anyway
    planned = registry.plan.op(f"{ns}::f").kernels
    assert {k.kernel.key for k in planned} == {k for k in keys if _has(f"{ns}ref::f", k)}
    active = {k.kernel.key for k in planned if k.status == "active"}
    assert active and active == {k for k in keys if _has(f"{ns}::f", k)}
