"""torch's PyObject dispatch (torch 2.14+, pytorch#187949) for opregistry's ops.

Feature-detected (``opregistry.torch_state.fast_dispatch_available``), never
by version.  On a torch that has it, the op's first eager call through the
autograd kernel switches its ``OpOverload`` to it, as ``custom_op`` does for
its ops; everything else (grad, FakeTensor, unload) keeps working.  On a
torch without it, nothing changes.  No timing here: benchmarks/bench_call.py.
"""

from __future__ import annotations

import inspect
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from opregistry import torch_state

from .conftest import DistFactory, load, op_dist

BODY = """
lib.define("f(Tensor x) -> Tensor", kernels={"cpu": "KMOD:twice"}, fake="KMOD:fake",
           autograd=("KMOD:backward", "KMOD:setup"))
"""
KERNELS = """
import torch

def twice(x):
    return x * 2

def fake(x):
    return torch.empty_like(x)

def setup(ctx, inputs, output):
    pass

def backward(ctx, grad):
    return grad * 2
"""

HAS_CPP_HALF = callable(getattr(torch._C, "_dispatch_make_pyobj_dispatch_fns", None))


def test_canary_private_api_shape() -> None:
    """Both halves of the private API or neither: a torch that keeps the C++ half but
    renames or reshapes the Python methods must fail here, not silently slow down."""
    overload = torch._ops.OpOverload
    python_half = [name for name in ("_enable_pyobj_dispatch", "_is_pyobj_dispatcher_enabled",
                                     "_can_enable_pyobj_dispatch") if hasattr(overload, name)]
    if HAS_CPP_HALF:
        assert python_half == ["_enable_pyobj_dispatch", "_is_pyobj_dispatcher_enabled",
                               "_can_enable_pyobj_dispatch"]
        params = list(inspect.signature(overload._enable_pyobj_dispatch).parameters)
        assert params == ["self", "enabled"]
        assert torch_state.fast_dispatch_available()
    else:
        assert python_half == []
        assert not torch_state.fast_dispatch_available()


def _load(dists: DistFactory, ns: str) -> torch._ops.OpOverload:
    op_dist(dists, "fastd", ns, BODY, kernels=KERNELS)
    load(dists, strict=True)
    return getattr(torch.ops, ns).f.default


def test_first_eager_call_switches_the_op(dists: DistFactory, ns: str) -> None:
    op = _load(dists, ns)
    qualname = f"{ns}::f"
    assert qualname not in torch_state.fast_dispatch_enabled()  # lazily: not at load
    x = torch.arange(4.0)
    assert torch.equal(op(x), x * 2)
    available = torch_state.fast_dispatch_available()
    assert (qualname in torch_state.fast_dispatch_enabled()) == available
    if available:
        assert op._is_pyobj_dispatcher_enabled()
    # the same answers on either path, through the overload and the packet
    assert torch.equal(op(x), x * 2)
    assert torch.equal(getattr(torch.ops, ns).f(x), x * 2)
    # grad: the autograd kernel's Function, entered through the fast dispatch
    leaf = torch.arange(3.0, requires_grad=True)
    op(leaf).sum().backward()
    assert torch.equal(leaf.grad, torch.full((3,), 2.0))
    # FakeTensor: redispatched below Autograd to the fake kernel
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    with FakeTensorMode() as mode:
        out = op(mode.from_tensor(x))
    assert isinstance(out, FakeTensor) and out.shape == x.shape
    # schema errors are torch's, as on the C++ path
    with pytest.raises(RuntimeError, match="Expected a value of type 'Tensor'"):
        op("not a tensor")


def test_unload_switches_it_off_first(dists: DistFactory, ns: str) -> None:
    """torch 2.15 crashes (SIGSEGV) calling a PyObject-dispatch op whose op was destroyed;
    unloading switches it off first, so a stale overload raises as on the C++ path."""
    op = _load(dists, ns)
    op(torch.ones(2))
    __import__("opregistry").get_registry().unload()
    assert f"{ns}::f" not in torch_state.fast_dispatch_enabled()
    if torch_state.fast_dispatch_available():
        assert not op._is_pyobj_dispatcher_enabled()


def test_stale_overload_after_destroy_behaves_as_without_it() -> None:
    """Calling an overload whose op was destroyed, in a child process, with and without
    the PyObject dispatch switched on: the same outcome (torch 2.15: a RuntimeError on the
    C++ path, where a still-switched-on overload crashes with SIGSEGV; older torch crash
    either way, torch's own behaviour)."""
    code = textwrap.dedent("""
        import sys
        import torch
        from torch.library import Library
        from opregistry import torch_state
        lib = Library("fastdstale", "DEF")
        lib.define("f(Tensor x) -> Tensor")
        lib.impl("f", lambda x: x * 2, "CPU")
        op = torch.ops.fastdstale.f.default
        if sys.argv[1] == "fast":
            assert torch_state.enable_fast_dispatch("fastdstale::f") == \\
                torch_state.fast_dispatch_available()
        op(torch.ones(1))
        torch_state.destroy_library(lib)
        try:
            op(torch.ones(1))
        except RuntimeError:
            print("raised", flush=True)
    """)
    outcomes = []
    for mode in ("cpp", "fast"):
        done = subprocess.run([sys.executable, "-c", code, mode], capture_output=True,
                              text=True, timeout=300)
        assert "AssertionError" not in done.stderr, done.stderr[-2000:]
        outcomes.append((done.returncode, done.stdout))
    if torch_state.fast_dispatch_available():
        assert outcomes[0] == outcomes[1]
    else:
        # nothing was switched on (the child checked): both runs are torch's own path, whose
        # use of a freed op is undefined -- on torch 2.8 a crash or a RuntimeError, by chance
        assert set(outcomes) <= {(-signal.SIGSEGV, ""), (0, "raised\n")}, outcomes


def test_non_tensor_returns_stay_on_the_cpp_path() -> None:
    """torch's own restriction (#187974): only ops returning tensors get it."""
    from torch.library import Library

    lib = Library("fastdint", "DEF")
    try:
        lib.define("n(Tensor x) -> int")
        lib.impl("n", lambda x: x.numel(), "CPU")
        assert not torch_state.enable_fast_dispatch("fastdint::n")
        assert torch.ops.fastdint.n.default(torch.ones(3)) == 3
    finally:
        torch_state.destroy_library(lib)
