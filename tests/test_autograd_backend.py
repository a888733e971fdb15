"""opregistry-autograd: register_autograd semantics through the lean Autograd kernel.

Ops are installed through temporary distributions with real entry points;
each test checks what torch's own ``register_autograd`` guarantees:
setup_context / backward contract, keyword-only inputs, tensor lists,
``ctx.needs_input_grad``, higher-order gradients, refusal of mutable ops —
and that the private torch APIs the fast path uses are still there.
"""

from __future__ import annotations

import pytest
import torch
from torch.library import Library

import opregistry
from opregistry import Kernel, MaterializationError, Origin

from .conftest import DistFactory, load

OPS = '''
import torch
from opregistry import OpLibrary

lib = OpLibrary(NS)
calls = []

def scale(x, *, factor=2.0):
    return x * factor

def scale_setup(ctx, inputs, keyword_only_inputs, output):
    calls.append(("setup", len(inputs), dict(keyword_only_inputs)))
    ctx.factor = keyword_only_inputs["factor"]

def scale_backward(ctx, grad):
    calls.append(("backward", tuple(ctx.needs_input_grad)))
    return grad * ctx.factor

def total(xs, w):
    return torch.stack(list(xs)).sum(0) * w

def total_setup(ctx, inputs, output):
    xs, w = inputs
    ctx.save_for_backward(*xs, w)
    ctx.n = len(xs)

def total_backward(ctx, grad):
    *xs, w = ctx.saved_tensors
    return [grad * w for _ in xs], grad * sum(xs)

def cube(x):
    return x ** 3

def cube_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])

def cube_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return grad * 3 * x ** 2          # differentiable: gives second derivatives

def fails_backward(ctx, grad):
    raise ValueError("backward of fails went wrong")

def add_(x, y):
    x.add_(y)

def mix(x, a=3, b=(1.0, 2.0), *, c=True, d=(4,)):
    return x * a

def mix_setup(ctx, inputs, keyword_only_inputs, output):
    calls.append(("mix", inputs[1:], dict(keyword_only_inputs)))
    ctx.a = inputs[1]

def mix_backward(ctx, grad):
    return grad * ctx.a, None, None  # one per positional input, as torch expects

lib.define("mix(Tensor x, int a=3, float[] b=[1.0, 2.0], *, bool c=True, int[] d=[4]) -> Tensor",
           kernels={"cpu": f"{__name__}:mix"},
           autograd=(f"{__name__}:mix_backward", f"{__name__}:mix_setup"))
lib.define("scale(Tensor x, *, float factor=2.0) -> Tensor", kernels={"cpu": f"{__name__}:scale"},
           autograd=(f"{__name__}:scale_backward", f"{__name__}:scale_setup"))
lib.define("total(Tensor[] xs, Tensor w) -> Tensor", kernels={"cpu": f"{__name__}:total"},
           autograd=(f"{__name__}:total_backward", f"{__name__}:total_setup"))
lib.define("cube(Tensor x) -> Tensor", kernels={"cpu": f"{__name__}:cube"},
           autograd=(f"{__name__}:cube_backward", f"{__name__}:cube_setup"))
lib.define("fails(Tensor x) -> Tensor", kernels={"cpu": f"{__name__}:cube"},
           autograd=f"{__name__}:fails_backward")
'''


@pytest.fixture
def ops(dists: DistFactory, ns: str):  # type: ignore[no-untyped-def]
    module = f"{ns}_ops"
    dists.make(f"ag-{ns}", ops={ns: f"{module}:lib"},
               modules={module: f"NS = {ns!r}\n" + OPS})
    load(dists, strict=True)
    import importlib

    return getattr(torch.ops, ns), importlib.import_module(module)


def test_keyword_only_inputs_reach_setup_context(ops) -> None:  # type: ignore[no-untyped-def]
    """setup_context(ctx, inputs, keyword_only_inputs, output), defaults filled in."""
    op, module = ops
    x = torch.randn(3, requires_grad=True)
    op.scale(x).sum().backward()  # factor left at its default
    torch.testing.assert_close(x.grad, torch.full_like(x, 2.0))
    assert ("setup", 1, {"factor": 2.0}) in module.calls
    x.grad = None
    op.scale(x, factor=3.0).sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 3.0))


def test_defaults_filled_like_torch(ops) -> None:  # type: ignore[no-untyped-def]
    """setup_context gets exactly what torch's fill_defaults would give, call after call."""
    from torch._library.utils import fill_defaults

    op, module = ops
    schema = op.mix.default._schema
    x = torch.randn(2, requires_grad=True)
    for args, kwargs in [((), {}), ((5,), {}), ((5, [0.5]), {"d": [7, 8]}), ((), {"c": False})]:
        module.calls.clear()
        out = op.mix(x, *args, **kwargs)
        out.sum().backward()
        # the dispatcher drops values equal to the defaults before our kernel sees them
        expected_args, expected_kwargs = fill_defaults(schema, (x, *args), kwargs)
        assert module.calls[0] == ("mix", tuple(expected_args[1:]), expected_kwargs)
    # a default list is a fresh object each call (setup_context may keep or mutate it)
    module.calls.clear()
    op.mix(x).sum().backward()
    op.mix(x).sum().backward()
    assert module.calls[0][1][1] is not module.calls[1][1][1]


def test_threads_keep_their_own_arguments(ops) -> None:  # type: ignore[no-untyped-def]
    """Concurrent grad calls with different keyword arguments each get their own."""
    from concurrent.futures import ThreadPoolExecutor

    op, _ = ops

    def run(factor: float) -> bool:
        ok = True
        for _ in range(200):
            x = torch.randn(4, requires_grad=True)
            op.scale(x, factor=factor).sum().backward()
            ok &= bool(torch.equal(x.grad, torch.full_like(x, factor)))
        return ok

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(run, [1.5, 2.5, 3.5, 4.5]))


def test_needs_input_grad_has_one_entry_per_input(ops) -> None:  # type: ignore[no-untyped-def]
    """backward sees ctx.needs_input_grad for the op's inputs only, as with torch's kernel."""
    op, module = ops
    op.scale(torch.randn(2, requires_grad=True)).sum().backward()
    assert ("backward", (True,)) in module.calls


def test_tensor_list_inputs(ops) -> None:  # type: ignore[no-untyped-def]
    """Tensor[] inputs get a gradient each (torch's tensor-list support)."""
    op, _ = ops
    xs = [torch.randn(3, dtype=torch.double, requires_grad=True) for _ in range(2)]
    w = torch.randn(3, dtype=torch.double, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b, w: op.total([a, b], w), (*xs, w))
    torch.testing.assert_close(op.total([x.detach() for x in xs], w.detach()),
                               (xs[0] + xs[1]).detach() * w.detach())


def test_higher_order_gradients(ops) -> None:  # type: ignore[no-untyped-def]
    """A differentiable backward gives second derivatives (gradgradcheck)."""
    op, _ = ops
    x = torch.randn(4, dtype=torch.double, requires_grad=True)
    assert torch.autograd.gradgradcheck(op.cube, (x,))
    (g,) = torch.autograd.grad(op.cube(x).sum(), x, create_graph=True)
    (gg,) = torch.autograd.grad(g.sum(), x)
    torch.testing.assert_close(gg, 6 * x.detach())


def test_errors_in_backward_propagate(ops) -> None:  # type: ignore[no-untyped-def]
    """An exception in the user's backward reaches the caller unchanged."""
    op, _ = ops
    out = op.fails(torch.randn(2, requires_grad=True))
    with pytest.raises(ValueError, match="backward of fails went wrong"):
        out.sum().backward()


def test_mutable_op_with_autograd_is_refused_before_torch(dists: DistFactory, ns: str) -> None:
    """The resolver names the distribution and says what to do; nothing of it loads."""
    module = f"{ns}_mut"
    dists.make(f"mut-{ns}", ops={ns: f"{module}:lib"},
               modules={module: f"NS = {ns!r}\n" + OPS.split("lib.define(")[0] + '''
lib.define("add_(Tensor(a!) x, Tensor y) -> ()", mutates_args=["x"],
           kernels={"cpu": f"{__name__}:add_"}, autograd=f"{__name__}:cube_backward")
'''})
    registry = load(dists)
    problems = [p for p in registry.problems if p.code == "autograd-on-mutable-op"]
    assert problems, registry.problems
    assert f"mut-{ns}==1.0" in problems[0].message and f"{ns}::add_" in problems[0].message
    assert "functional op" in problems[0].hint
    assert f"{ns}::add_" not in registry.op_names
    with pytest.raises(opregistry.ResolutionError, match="autograd-on-mutable-op"):
        load(dists, strict=True)


def test_backend_refuses_mutable_op_itself(ns: str) -> None:
    """Called directly (no resolver in front), the backend refuses with a clear error."""
    import opregistry_autograd

    lib = Library(ns, "DEF")
    try:
        lib.define("add_(Tensor(a!) x, Tensor y) -> ()")
        kernel = Kernel(op=f"{ns}::add_", key="Autograd", fn=lambda ctx, g: g,
                        origin=Origin(distribution="mut", version="2.0"))
        with pytest.raises(MaterializationError,
                           match=rf"cannot register autograd for {ns}::add_ from mut==2\.0: "
                                 r"it mutates or aliases"):
            opregistry_autograd.opregistry_materialize_kernel(
                library=lib, op=None, kernel=kernel, payload=kernel.payload)
        # torch.Tag.out exists from torch 2.13; refusal() reads the tag names it is given
        out_tag = (torch.Tag.out,) if hasattr(torch.Tag, "out") else ()
        lib.define("outish(Tensor x, *, Tensor(a!) out) -> Tensor(a!)", tags=out_tag)
        outish = getattr(torch.ops, ns).outish.default
        assert "torch.Tag.out" in opregistry_autograd.refusal(outish._schema, ["out"])
        lib.define("kwt(Tensor x, *, Tensor y) -> Tensor")
        assert "keyword-only Tensor" in opregistry_autograd.refusal(
            getattr(torch.ops, ns).kwt.default._schema)
        assert opregistry_autograd.refusal(torch.ops.aten.sin.default._schema) is None
    finally:
        lib._destroy()


def test_private_torch_apis_still_behave(ns: str) -> None:
    """Each private torch API of _torch_private does what the fast path assumes."""
    from opregistry_autograd import _torch_private as tp

    seen: dict[str, str] = {}
    lib = Library(ns, "DEF")
    try:
        lib.define("probe(Tensor x) -> Tensor")

        def probe(keyset, x):  # type: ignore[no-untyped-def]
            seen[x.dtype.__repr__()] = tp.first_key_after_autograd(keyset)
            assert isinstance(tp.keyset_id(keyset), int)
            with tp.below_autograd():
                return getattr(torch.ops, ns).probe.default.redispatch(
                    keyset & tp.AFTER_AUTOGRAD, x)

        lib.impl("probe", lambda x: x.clone(), "CPU")
        lib.impl("probe", probe, "Autograd", with_keyset=True)
        op = getattr(torch.ops, ns).probe
        op(torch.randn(2))
        op(torch.randn(2, dtype=torch.complex64).conj())
        assert seen == {"torch.float32": "CPU", "torch.complex64": "Conjugate"}
        assert tp.library_alive(lib)
        assert tp.op_handle(f"{ns}::probe").schema().name == f"{ns}::probe"
        assert str(tp.op_handle("aten::add.Tensor").schema()).startswith("aten::add.Tensor(")
        assert tp.any_requires_grad(torch.randn(1, requires_grad=True), 3)
        assert not tp.any_requires_grad(torch.randn(1), [torch.randn(1)])
        assert tp.lookup_op(f"{ns}::probe") is op.default
        assert tp.has_kwarg_only_tensors(torch.ops.aten.add.Tensor._schema) is False
    finally:
        lib._destroy()
    assert not tp.library_alive(lib)


def test_python_any_requires_grad_agrees_with_torch() -> None:
    """The fallback for torch < 2.8 answers what ``_C._any_requires_grad`` answers."""
    from opregistry_autograd import _torch_private as tp

    g, n = torch.randn(1, requires_grad=True), torch.randn(1)
    cases = [(), (n,), (g,), (n, 3), (3, g), (n, [n, n]), (n, [n, g]), ((g,),), ([], None, 1.0)]
    for args in cases:
        expected = tp.any_requires_grad(*args)
        assert tp._py_any_requires_grad(*args) is expected, args
    assert tp.NATIVE_ANY_REQUIRES_GRAD == (torch.__version__ >= "2.8")


def test_function_apply_matches_autograd_function_apply() -> None:
    """The wrapper around the C++ apply gives the same graph as Function.apply."""
    from opregistry_autograd import _torch_private as tp

    class Double(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, extra):  # type: ignore[no-untyped-def]
            return x * 2

        @staticmethod
        def backward(ctx, g):  # type: ignore[no-untyped-def]
            return g * 2, None

    x = torch.randn(3, requires_grad=True)
    out = tp.function_apply(Double)(x, object())
    assert type(out.grad_fn).__name__ == "DoubleBackward"
    out.sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 2.0))
    # under a functorch transform it defers to Function.apply (which refuses: no setup_context)
    with pytest.raises(RuntimeError, match="setup_context"):
        torch.func.grad(lambda t: tp.function_apply(Double)(t, None).sum())(torch.randn(3))


def test_outside_override_is_not_seen_by_the_fast_path(ops) -> None:  # type: ignore[no-untyped-def]
    """A plain Library.impl made after load reaches the dispatcher, not the no-grad fast path.

    docs/performance.md documents this limit; the sanctioned way to replace a
    kernel is an opregistry declaration with override=True and policy.
    """
    import warnings

    op, _ = ops
    ns = op.name
    x = torch.full((3,), 2.0)
    torch.testing.assert_close(op.cube(x), x ** 3)
    outside = Library(ns, "IMPL")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's "overriding a previously registered kernel"
            # explicit: Library.impl's allow_override defaults to False before torch 2.13
            outside.impl("cube", lambda t: t * 0, "CPU", allow_override=True)
        cpu = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
        torch.testing.assert_close(op.cube.default.redispatch(cpu, x), torch.zeros(3))
        torch.testing.assert_close(op.cube(x), x ** 3)  # still opregistry's kernel
    finally:
        outside._destroy()
