"""OpLibrary, both styles: what it records, and that the records load into torch."""

from __future__ import annotations

import pytest
import torch

from opregistry import DeclarationError, Kernel, OpLibrary

from .conftest import load

DECORATED = '''
import torch
from opregistry import OpLibrary

lib = OpLibrary(NS)

@lib.op(mutates_args=())
def scale(x: torch.Tensor, factor: float) -> torch.Tensor:
    """x * factor"""
    return x * factor

@scale.register_fake
def _(x, factor):
    return torch.empty_like(x)

def setup(ctx, inputs, output):
    ctx.factor = inputs[1]

def backward(ctx, grad):
    return grad * ctx.factor, None

scale.register_autograd(backward, setup_context=setup)

@scale.register_samples
def samples():
    return [((torch.randn(3, dtype=torch.double, requires_grad=True), 2.0), {})]

@lib.op("bump", mutates_args=("buf",))
def bump(buf: torch.Tensor) -> None:
    buf.add_(1)

@bump.register_fake
def _(buf):
    return None
'''


def test_decorator_style_infers_schema_and_loads(dists, ns):
    """@lib.op infers the schema with torch.library.infer_schema; the op works end to end."""
    _, mod = dists.module_dist("decorated", ns, DECORATED)
    reg = load(dists)
    assert not reg.errors, reg.errors
    scale = reg.op(f"{ns}::scale")
    assert scale.op.schema == "(Tensor x, float factor) -> Tensor"
    assert scale.op.doc == "x * factor"
    # no device_types: one kernel for every device, as torch.library.custom_op registers it
    assert {k.kernel.key for k in scale.kernels} == {"CompositeExplicitAutograd", "Meta",
                                                      "Autograd"}
    assert reg.op(f"{ns}::bump").op.schema == "(Tensor(a0!) buf) -> ()"

    import importlib

    module = importlib.import_module(mod)
    x = torch.randn(3, dtype=torch.double, requires_grad=True)
    assert torch.allclose(module.scale(x, 2.0), x * 2)  # the handle calls torch.ops
    assert torch.autograd.gradcheck(lambda t: getattr(torch.ops, ns).scale(t, 3.0), (x,))
    (args, kwargs), = module.samples()
    torch.library.opcheck(getattr(torch.ops, ns).scale.default, args, kwargs)
    buf = torch.zeros(2)
    getattr(torch.ops, ns).bump(buf)
    assert torch.equal(buf, torch.ones(2))


def test_define_records_kernels_by_canonical_key():
    import inspect

    lib = OpLibrary("recorded")
    defined_at = inspect.currentframe().f_lineno + 1  # the line of the define() call, below
    lib.define("f(Tensor x) -> Tensor", kernels={"cpu": "m:f", "cuda": "m:g"}, fake="m:fake",
               autograd=("m:bw", "m:setup"), vmap="m:vmap")
    keys = {k.key: k for k in lib.opregistry_kernels()}
    assert set(keys) == {"CPU", "CUDA", "Meta", "Autograd", "FuncTorchBatched"}
    assert keys["Autograd"].payload.setup_context == "m:setup"
    [ns] = lib.opregistry_namespaces()
    assert (ns.name, ns.kind) == ("recorded", "DEF")
    assert ns.source == f"{__file__}:{defined_at - 2}", "the OpLibrary(...) line"
    [op] = lib.opregistry_ops()
    # the author's line, computed here, not read from the value under test
    assert op.source == f"{__file__}:{defined_at}"
    assert {k.source for k in keys.values()} == {op.source}, "each kernel: the same line"


def test_kernels_declaring_the_same_references_share_one_payload():
    """Two ops (of two libraries) declaring the same functions share each payload record --
    frozen, so nothing can tell -- and a wrong declaration is refused every time, with its
    own op named, however often the same mistake was made."""
    first, second = OpLibrary("shared_a"), OpLibrary("shared_b")
    for lib in (first, second):
        lib.define("f(Tensor x) -> Tensor", kernels={"cpu": "m:f"}, autograd=("m:bw", "m:setup"))
    a = {k.key: k for k in first.opregistry_kernels()}
    b = {k.key: k for k in second.opregistry_kernels()}
    assert a["CPU"].payload is b["CPU"].payload
    assert a["Autograd"].payload is b["Autograd"].payload
    assert (a["CPU"].op, b["CPU"].op) == ("shared_a::f", "shared_b::f")
    other = Kernel(op="x::g", key="cpu", fn="m:other")
    assert other.payload.fn == "m:other" and other.payload is not a["CPU"].payload
    assert Kernel(op="x::g", key="CUDA", fn="m:f").payload is not a["CPU"].payload, \
        "another key, another record"
    for op in ("x::one", "x::two"):
        with pytest.raises(DeclarationError, match=f"kernel for {op}: unknown dispatch key"):
            Kernel(op=op, key="CPu", fn="m:f")
        with pytest.raises(DeclarationError, match="setup_context only belongs"):
            Kernel(op=op, key="cpu", fn="m:f", setup_context="m:setup")


def test_define_twice_is_refused_with_both_places():
    lib = OpLibrary("twice")
    lib.define("f(Tensor x) -> Tensor")
    with pytest.raises(DeclarationError, match=r"twice::f is declared twice .*test_declare.py:\d+"):
        lib.define("f(Tensor x) -> Tensor")


def test_impl_library_cannot_define():
    with pytest.raises(DeclarationError, match="only adds kernels"):
        OpLibrary("x", "IMPL").define("f(Tensor x) -> Tensor")


def test_bad_kernel_reference_is_refused_at_declaration():
    with pytest.raises(DeclarationError, match="'package.module:function'"):
        OpLibrary("x").define("f(Tensor x) -> Tensor", kernels={"cpu": "not a ref"})


def test_unknown_key_suggests_the_right_one():
    with pytest.raises(DeclarationError, match="unknown dispatch key 'CPu'; did you mean 'CPU'"):
        Kernel(op="x::f", key="CPu", fn="m:f")


def test_mutates_args_unknown_is_refused():
    with pytest.raises(DeclarationError, match="does not support 'unknown'"):
        OpLibrary("x").op(mutates_args="unknown")
