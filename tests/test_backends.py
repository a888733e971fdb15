"""The backend distributions: device keys (CPU, CUDA, an out-of-tree PrivateUse1), Meta, vmap.

Every test installs temporary distributions with real entry points and
checks what the dispatcher holds and which kernel a call really reaches.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from .conftest import load

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# -------------------------------------------------------------------------
# an out-of-tree device, written against the public hookspecs only
# -------------------------------------------------------------------------

#: A third-party backend for PrivateUse1: no DeviceBackend helper, only the
#: hooks of opregistry.hookspecs, as a backend for a new device would be.
NPU_BACKEND = '''
from opregistry import Backend, hookimpl

BACKEND = Backend(name="npu", keys=("PrivateUse1",), device_type="privateuseone",
                  description="test device on PrivateUse1")
registered = []

@hookimpl
def opregistry_backends():
    return [BACKEND]

@hookimpl
def opregistry_backend_available(backend):
    return True

@hookimpl
def opregistry_materialize_kernel(library, op, kernel, fn):
    registered.append((kernel.op, kernel.key))
    library.impl(kernel.op.split("::", 1)[1], fn, kernel.key)
    return True
'''

NPU_OPS = '''
import torch
from opregistry import OpLibrary

lib = OpLibrary(NS)
lib.define("mark(Tensor x) -> Tensor",
           kernels={"cpu": f"{__name__}:mark_cpu", "privateuse1": f"{__name__}:mark_npu"})
lib.define("ones(int n, *, Device device) -> Tensor",
           kernels={"cpu": f"{__name__}:ones_cpu", "PrivateUse1": f"{__name__}:ones_npu"})

def mark_cpu(x):
    return x + 1

def mark_npu(x):
    return x + 100

def ones_cpu(n, *, device):
    return torch.ones(n)

def ones_npu(n, *, device):
    # a real backend allocates on its device; the value proves which kernel ran
    return torch.full((n,), 100.0)
'''


def _npu(dists, ns, *, with_backend: bool = True):
    mod = f"npu_{ns}"
    dists.make("npu-ops", ops={"ops": f"{mod}_ops:lib"},
               modules={f"{mod}_ops": NPU_OPS.replace("NS", repr(ns))})
    if with_backend:
        dists.make("opregistry-npu", backends={"npu": f"{mod}_backend"},
                   modules={f"{mod}_backend": NPU_BACKEND})
    return mod


def test_out_of_tree_device_backend_registers_and_is_dispatched_to(dists, ns):
    """A PrivateUse1 backend from a third party registers at PrivateUse1 and its kernel runs."""
    mod = _npu(dists, ns)
    reg = load(dists)
    assert not reg.errors, [str(p) for p in reg.errors]
    backend = sys.modules[f"{mod}_backend"]
    assert sorted(backend.registered) == [(f"{ns}::mark", "PrivateUse1"),
                                          (f"{ns}::ones", "PrivateUse1")]
    plan = reg.op(f"{ns}::mark").kernel("PrivateUse1")
    assert (plan.status, plan.backend) == ("active", "npu")
    for op in ("mark", "ones"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"{ns}::{op}", "PrivateUse1")

    ops = getattr(torch.ops, ns)
    x = torch.zeros(2)
    torch.testing.assert_close(ops.mark(x), x + 1)  # a CPU tensor reaches the CPU kernel
    npu_only = torch._C.DispatchKeySet(torch._C.DispatchKey.PrivateUse1)
    torch.testing.assert_close(ops.mark.default.redispatch(npu_only, x), x + 100)
    # a factory op routes by its device argument, through the BackendSelect kernel
    torch.testing.assert_close(ops.ones(3, device="privateuseone"), torch.full((3,), 100.0))
    torch.testing.assert_close(ops.ones(3, device="cpu"), torch.ones(3))


def test_a_backend_hook_gets_the_arguments_it_names_in_its_own_order(dists, ns):
    """pluggy's rule: a hook takes any subset of its arguments, in any order, by name."""
    mod = f"npu_{ns}"
    dists.make("npu-ops", ops={"ops": f"{mod}_ops:lib"},
               modules={f"{mod}_ops": NPU_OPS.replace("NS", repr(ns))})
    reordered = NPU_BACKEND.replace(
        "def opregistry_materialize_kernel(library, op, kernel, fn):",
        "def opregistry_materialize_kernel(fn, payload, library, kernel):\n"
        "    assert payload.fn is fn, (payload, fn)")
    dists.make("opregistry-npu", backends={"npu": f"{mod}_backend"},
               modules={f"{mod}_backend": reordered})
    reg = load(dists)
    assert not reg.errors, [str(p) for p in reg.errors]
    assert sorted(sys.modules[f"{mod}_backend"].registered) == [
        (f"{ns}::mark", "PrivateUse1"), (f"{ns}::ones", "PrivateUse1")]
    npu_only = torch._C.DispatchKeySet(torch._C.DispatchKey.PrivateUse1)
    x = torch.zeros(2)
    torch.testing.assert_close(getattr(torch.ops, ns).mark.default.redispatch(npu_only, x),
                               x + 100)


def test_the_materializer_passes_hook_arguments_in_the_hookspec_order():
    """The executor calls backend hooks positionally: its order is the hookspec's."""
    import inspect

    from opregistry import hookspecs
    from opregistry.collect import MATERIALIZE_ARGS

    spec = inspect.signature(hookspecs.opregistry_materialize_kernel).parameters
    assert tuple(spec) == MATERIALIZE_ARGS


def test_out_of_tree_kernel_is_inactive_without_its_backend(dists, ns):
    """Without the PrivateUse1 backend installed, its kernels are listed inactive, not registered."""
    _npu(dists, ns, with_backend=False)
    reg = load(dists)
    assert not reg.errors, [str(p) for p in reg.errors]
    plan = reg.op(f"{ns}::mark").kernel("PrivateUse1")
    assert plan.status == "inactive"
    assert "PrivateUse1" in plan.reason
    assert not torch._C._dispatch_has_kernel_for_dispatch_key(f"{ns}::mark", "PrivateUse1")
    torch.testing.assert_close(getattr(torch.ops, ns).mark(torch.zeros(1)), torch.ones(1))


# -------------------------------------------------------------------------
# CUDA: installed but unavailable without a GPU, CUDA-only modules never imported
# -------------------------------------------------------------------------

GPU_OPS = '''
from opregistry import OpLibrary

lib = OpLibrary(NS)
lib.define("twice(Tensor x) -> Tensor",
           kernels={"cpu": "MOD_cpu:twice", "cuda": "MOD_triton:twice"},
           fake="MOD_cpu:twice_fake")
'''

CPU_KERNELS = '''
import torch

def twice(x):
    return x * 2

def twice_fake(x):
    return torch.empty_like(x)
'''

#: a CUDA kernel module as a Triton user writes it: importing it on a
#: machine without Triton (or without a GPU) fails
TRITON_KERNELS = '''
import sys
sys.modules[__name__].__dict__["imported"] = True  # for the GPU test's own check
import triton  # noqa: F401  -- fails where Triton is not installed

def twice(x):
    return x * 2
'''


def _gpu_dist(dists, ns):
    mod = f"gpu_{ns}"
    dists.make("gpu-ops", ops={"ops": f"{mod}_ops:lib"}, modules={
        f"{mod}_ops": GPU_OPS.replace("NS", repr(ns)).replace("MOD", mod),
        f"{mod}_cpu": CPU_KERNELS, f"{mod}_triton": TRITON_KERNELS})
    return mod


def test_cuda_backend_without_gpu_is_unavailable_and_imports_no_cuda_module(dists, ns, monkeypatch):
    """No GPU: CUDA kernels are 'unavailable', their (Triton) module is never imported."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")  # a GPU machine behaves as one without
    mod = _gpu_dist(dists, ns)
    reg = load(dists)
    assert not reg.errors, [str(p) for p in reg.errors]
    cuda_backend = [b for b in reg.plan.backends if b.backend.name == "cuda"]
    assert cuda_backend and cuda_backend[0].available is False
    plan = reg.op(f"{ns}::twice").kernel("CUDA")
    assert plan.status == "unavailable"
    assert "not available on this machine" in plan.reason
    assert f"{mod}_triton" not in sys.modules
    assert not torch._C._dispatch_has_kernel_for_dispatch_key(f"{ns}::twice", "CUDA")
    torch.testing.assert_close(getattr(torch.ops, ns).twice(torch.ones(2)), torch.full((2,), 2.0))


def test_cuda_availability_is_answered_without_importing_torch():
    """opregistry_cuda.cuda_available() agrees with torch, and does not import torch to answer."""
    code = ("import sys, json, opregistry_cuda\n"
            "print(json.dumps([opregistry_cuda.cuda_available(), 'torch' in sys.modules]))")
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         check=True, timeout=60)
    available, imported_torch = json.loads(out.stdout)
    assert imported_torch is False
    assert available == torch.cuda.is_available()


def test_backends_import_their_torch_calls_at_their_first_registration_once():
    """The meta, vmap, autocast and autograd backends import without torch (``opregistry
    list`` collects them) and import the module of their torch calls at the first call of
    ``deferred_import``'s function, once: the same module object after."""
    code = ("import sys, json\n"
            "import opregistry_meta, opregistry_vmap, opregistry_autocast, opregistry_autograd\n"
            "before = 'torch' in sys.modules\n"
            "gets = [opregistry_meta._private, opregistry_vmap._private,\n"
            "        opregistry_autocast._private, opregistry_autograd._kernel_module]\n"
            "got = [get() for get in gets]\n"
            "print(json.dumps([before, [m.__name__ for m in got],\n"
            "                  all(get() is m for get, m in zip(gets, got)),\n"
            "                  'torch' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert json.loads(out.stdout) == [
        False, ["opregistry_meta._torch_private", "opregistry_vmap._torch_private",
                "opregistry_autocast._torch_private", "opregistry_autograd.kernel"], True, True]


def test_torch_build_is_read_without_importing_torch():
    """torch_is_cuda_build() agrees with torch.version, from torch's files alone."""
    import opregistry_cuda

    code = ("import json, sys, opregistry_cuda\n"
            "print(json.dumps([opregistry_cuda.torch_is_cuda_build(), 'torch' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    is_cuda_build, imported_torch = json.loads(out.stdout)
    assert imported_torch is False
    assert is_cuda_build == (torch.version.cuda is not None or torch.version.hip is not None)
    assert opregistry_cuda.torch_is_cuda_build() == is_cuda_build  # also once torch is imported


@pytest.mark.parametrize("files,libcuda,cuda_build,expected", [
    ((), "libcuda.so.1", True, False),  # no driver: no GPU, whatever the library path says
    (("/proc/driver/nvidia/version",), None, True, True),
    (("/dev/nvidiactl",), "libcuda.so.1", True, True),
    (("/dev/nvidiactl",), None, True, False),
    (("/proc/driver/nvidia/version",), None, False, False),  # a CPU-only torch wheel
], ids=["no-driver", "proc-driver", "devnode+libcuda", "devnode-only", "driver+cpu-torch"])
def test_cuda_availability_without_torch_looks_for_the_driver(monkeypatch, files, libcuda,
                                                               cuda_build, expected):
    """Before torch is imported, availability comes from the driver's files, cheaply."""
    import ctypes.util

    import opregistry_cuda

    monkeypatch.setattr(opregistry_cuda, "torch_is_cuda_build", lambda: cuda_build)

    asked: list[str] = []

    def find_library(name: str) -> str | None:
        asked.append(name)
        return libcuda

    monkeypatch.delitem(sys.modules, "torch")  # as in `opregistry list`; restored after
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(os.path, "exists", lambda path: path in files)
    monkeypatch.setattr(ctypes.util, "find_library", find_library)
    assert opregistry_cuda.cuda_available() is expected
    if not files:
        assert asked == []  # ldconfig is not run on a machine without a driver node
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    assert opregistry_cuda.cuda_available() is False


@pytest.mark.cuda
@cuda
def test_cuda_kernel_is_registered_and_runs_on_gpu(dists, ns):
    """With a GPU, the CUDA kernel is active, imported, registered at CUDA and runs there."""
    pytest.importorskip("triton")
    mod = _gpu_dist(dists, ns)
    reg = load(dists)
    assert not reg.errors, [str(p) for p in reg.errors]
    assert reg.op(f"{ns}::twice").kernel("CUDA").status == "active"
    assert sys.modules[f"{mod}_triton"].imported
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"{ns}::twice", "CUDA")
    x = torch.ones(3, device="cuda")
    y = getattr(torch.ops, ns).twice(x)
    assert y.device.type == "cuda"
    torch.testing.assert_close(y, x * 2)


@pytest.mark.cuda
@cuda
def test_tutorial_muladd_on_cuda_passes_opcheck(installed):
    """The tutorial's muladd declares a CUDA kernel: opcheck on CUDA tensors."""
    assert installed.op("tutorial::muladd").kernel("CUDA").status == "active"
    assert torch._C._dispatch_has_kernel_for_dispatch_key("tutorial::muladd", "CUDA")
    a = torch.randn(4, device="cuda", dtype=torch.double, requires_grad=True)
    b = torch.randn(4, device="cuda", dtype=torch.double, requires_grad=True)
    torch.library.opcheck(torch.ops.tutorial.muladd.default, (a, b, 0.5))
    torch.autograd.gradcheck(lambda a, b: torch.ops.tutorial.muladd(a, b, 0.5), (a, b))


# -------------------------------------------------------------------------
# Meta: fake kernels, data-dependent shapes, ops without one
# -------------------------------------------------------------------------

META_OPS = '''
import torch
from opregistry import OpLibrary

lib = OpLibrary(NS)
lib.define("positives(Tensor x) -> Tensor", kernels={"cpu": f"{__name__}:positives"},
           fake=f"{__name__}:positives_fake")
lib.define("double(Tensor x) -> Tensor", kernels={"cpu": f"{__name__}:double"},
           fake=f"{__name__}:double_fake")
lib.define("nofake(Tensor x) -> Tensor", kernels={"cpu": f"{__name__}:double"})

def positives(x):
    return x[x > 0]

def positives_fake(x):
    # the number of positives depends on the data: an unbacked symbolic size
    n = torch.library.get_ctx().new_dynamic_size()
    return x.new_empty(n)

def double(x):
    return x * 2

def double_fake(x):
    return torch.empty_like(x)
'''


def _meta_ops(dists, ns):
    _, mod = dists.module_dist("meta-ops", ns, META_OPS)
    reg = load(dists)
    assert not reg.errors, [str(p) for p in reg.errors]
    return reg, getattr(torch.ops, ns)


def test_fake_kernel_runs_for_meta_and_fake_tensors(dists, ns):
    """The Meta backend's fake kernel answers for meta tensors and under FakeTensorMode."""
    _, ops = _meta_ops(dists, ns)
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"{ns}::double", "Meta")
    out = ops.double(torch.empty(2, 3, device="meta"))
    assert out.device.type == "meta" and out.shape == (2, 3)
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(torch.ones(4, 5))
        assert ops.double(fake).shape == (4, 5)


def test_fake_kernel_with_data_dependent_output_size(dists, ns):
    """get_ctx().new_dynamic_size(): an unbacked SymInt under fake tensors, dynamic under compile."""
    _, ops = _meta_ops(dists, ns)
    with FakeTensorMode(shape_env=ShapeEnv()) as mode:
        out = ops.positives(mode.from_tensor(torch.randn(8)))
        assert isinstance(out.shape[0], torch.SymInt)
        assert out.shape[0].node.expr.free_symbols  # a fresh symbol, not a number

    def f(x):
        return ops.positives(x).sum() + 1

    torch._dynamo.reset()
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
        for x in (torch.tensor([1.0, -2.0, 3.0]), torch.tensor([-1.0, 5.0, 6.0, 7.0, -1.0])):
            torch.testing.assert_close(compiled(x), x[x > 0].sum() + 1)
    torch.library.opcheck(ops.positives.default, (torch.randn(6),))


def test_op_without_fake_kernel_is_reported_and_fails_under_fake_tensors(dists, ns):
    """No fake kernel: a warning naming the op and distribution; the warning is true."""
    reg, ops = _meta_ops(dists, ns)
    warnings = [p for p in reg.problems if p.code == "op-no-fake"]
    assert [p.op for p in warnings] == [f"{ns}::nofake"]
    assert warnings[0].severity == "warning"
    assert "meta-ops==1.0" in warnings[0].message and "torch.compile" in warnings[0].message
    # a warning, not an error: the op is registered and runs eagerly
    torch.testing.assert_close(ops.nofake(torch.ones(2)), torch.full((2,), 2.0))
    with FakeTensorMode() as mode, pytest.raises(Exception, match="nofake"):
        ops.nofake(mode.from_tensor(torch.ones(2)))


# -------------------------------------------------------------------------
# vmap
# -------------------------------------------------------------------------

VMAP_OPS = '''
import torch
from opregistry import OpLibrary

lib = OpLibrary(NS)
lib.define("rowsum(Tensor x) -> Tensor", kernels={"cpu": f"{__name__}:rowsum"},
           fake=f"{__name__}:rowsum_fake", vmap=f"{__name__}:rowsum_vmap")
lib.define("norule(Tensor x) -> Tensor", kernels={"cpu": f"{__name__}:rowsum"},
           fake=f"{__name__}:rowsum_fake")
calls = []

def rowsum(x):
    return x.sum(dim=-1)

def rowsum_fake(x):
    return x.new_empty(x.shape[:-1])

def rowsum_vmap(info, in_dims, x):
    calls.append((info.batch_size, in_dims))
    (dim,) = in_dims
    x = x.movedim(dim, 0) if dim is not None else x.expand(info.batch_size, *x.shape)
    return rowsum(x), 0
'''


def test_vmap_rule_is_used_by_torch_vmap(dists, ns):
    """torch.vmap over an op with a rule calls the rule (register_vmap semantics)."""
    _, mod = dists.module_dist("vmap-ops", ns, VMAP_OPS)
    reg = load(dists)
    assert not reg.errors, [str(p) for p in reg.errors]
    ops = getattr(torch.ops, ns)
    x = torch.randn(3, 4, 5)
    torch.testing.assert_close(torch.vmap(ops.rowsum, in_dims=1)(x), x.sum(-1).T)
    assert sys.modules[mod].calls == [(4, (1,))]
    info = [p for p in reg.problems if p.code == "op-no-vmap"]
    assert [(p.op, p.severity) for p in info] == [(f"{ns}::norule", "info")]
    # without a rule torch falls back to a per-sample loop (slow, hence the report);
    # torch 2.15 also warns about it ("performance drop ... batching rule"), 2.8-2.14 do not
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.testing.assert_close(torch.vmap(ops.norule)(x), x.sum(-1))
    assert all("batching rule" in str(w.message) for w in caught), [str(w.message) for w in caught]
    assert len(sys.modules[mod].calls) == 1


# -------------------------------------------------------------------------
# DeviceBackend, the helper for device backends
# -------------------------------------------------------------------------


def test_device_backend_derives_device_type_from_key():
    """DeviceBackend('npu', key='privateuse1'): torch's key name and device type."""
    from opregistry.backend import DeviceBackend

    record = DeviceBackend("npu", key="privateuse1").record
    assert (record.keys, record.device_type) == (("PrivateUse1",), "privateuseone")
    assert DeviceBackend("xpu", key="XPU", device_type="xpu").record.device_type == "xpu"


def test_device_backend_for_a_non_device_key_is_refused_naming_the_distribution(dists, ns):
    """A DeviceBackend for Meta is a declaration error of its distribution; the rest loads."""
    mod = f"badbackend_{ns}"
    dists.make("opregistry-badmeta", backends={"badmeta": f"{mod}:backend"}, modules={mod: """
        from opregistry.backend import DeviceBackend
        backend = DeviceBackend("badmeta", key="Meta")
        """})
    dists.make("meta-ops", ops={"ops": f"meta_{ns}:lib"},
               modules={f"meta_{ns}": META_OPS.replace("NS", repr(ns))})
    reg = load(dists)
    bad = [p for p in reg.errors if "opregistry-badmeta==1.0" in p.message]
    assert len(bad) == 1 and bad[0].code == "declaration-invalid", [str(p) for p in reg.errors]
    assert "not a device dispatch key" in bad[0].message and "opregistry-meta" in bad[0].message
    assert reg.op(f"{ns}::double").kernel("Meta").status == "active"  # the real meta backend


def test_vmap_rule_torch_cannot_register_is_refused_with_a_clear_problem(dists, ns):
    """register_vmap refuses kwarg-only tensors: a resolver problem says so, before torch raises."""
    mod = f"vmapkw_{ns}"
    dists.make("vmap-kwonly", ops={"ops": f"{mod}:lib"}, modules={mod: f"""
        import torch
        from opregistry import OpLibrary
        lib = OpLibrary({ns!r})
        lib.define("scale(Tensor x, *, Tensor w) -> Tensor", kernels={{"cpu": f"{{__name__}}:scale"}},
                   vmap=f"{{__name__}}:scale_vmap")
        def scale(x, *, w):
            return x * w
        def scale_vmap(info, in_dims, x, *, w):
            return scale(x, w=w), in_dims[0]
        """})
    reg = load(dists)
    problems = [p for p in reg.errors if p.op == f"{ns}::scale"]
    assert len(problems) == 1, [str(p) for p in reg.errors]
    problem = problems[0]
    # found by the resolver, before torch is asked (torch would raise NotImplementedError)
    assert problem.code == "vmap-kwarg-only-tensor" and problem.key == "FuncTorchBatched"
    assert "vmap-kwonly==1.0" in problem.message and "keyword-only" in problem.message
    assert "positional" in problem.hint
    assert not hasattr(getattr(torch.ops, ns), "scale")  # the distribution is left out whole


@pytest.mark.cuda
@cuda
def test_factory_op_routes_to_the_cuda_kernel_by_its_device_argument(dists, ns):
    """On a GPU, a factory op with device='cuda' reaches the CUDA kernel (BackendSelect)."""
    mod = f"gpufactory_{ns}"
    dists.make("gpu-factory", ops={"ops": f"{mod}:lib"}, modules={mod: f"""
        import torch
        from opregistry import OpLibrary
        lib = OpLibrary({ns!r})
        lib.define("ramp(int n, *, Device device) -> Tensor",
                   kernels={{"cpu": f"{{__name__}}:ramp_cpu", "cuda": f"{{__name__}}:ramp_cuda"}})
        def ramp_cpu(n, *, device):
            return torch.arange(n, device=device)
        def ramp_cuda(n, *, device):
            return torch.arange(n, device=device) * 10
        """})
    reg = load(dists)
    assert not reg.errors, [str(p) for p in reg.errors]
    ops = getattr(torch.ops, ns)
    on_gpu = ops.ramp(3, device="cuda")
    assert on_gpu.device.type == "cuda"
    assert on_gpu.cpu().tolist() == [0, 10, 20]
    assert ops.ramp(3, device="cpu").tolist() == [0, 1, 2]


# -------------------------------------------------------------------------
# The meta and vmap backends' private torch paths (cheaper than the public
# register_fake / register_vmap at registration; same registrations)
# -------------------------------------------------------------------------


def test_meta_private_path_registers_what_register_fake_registers(ns):
    """register_fake_kernel: same fake-impl entry, Meta kernel, get_ctx() and unregistration."""
    from torch._library import simple_registry
    from torch.library import Library

    from opregistry_meta import _torch_private as tp

    def fake(x):
        n = torch.library.get_ctx().new_dynamic_size()
        return x.new_empty(n)

    lib = Library(ns, "DEF")
    try:
        lib.define("pos(Tensor x) -> Tensor")
        lib.impl("pos", lambda x: x[x > 0], "CPU")
        tp.register_fake_kernel(lib, f"{ns}::pos", fake, "decl.py:7")
        # the entry torch's public register_fake fills, with the declaration's source line
        kernel = simple_registry.singleton.find(f"{ns}::pos").fake_impl.kernel
        assert kernel is tp.fake_kernel_of(f"{ns}::pos")
        assert (kernel.func, kernel.source) == (fake, "decl.py:7")
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"{ns}::pos", "Meta")
        op = getattr(torch.ops, ns).pos.default
        with FakeTensorMode(shape_env=ShapeEnv()) as mode:
            out = op(mode.from_tensor(torch.randn(5)))
            assert isinstance(out.shape[0], torch.SymInt)
        # meta tensors: torch's own error about data-dependent shapes, naming the source line
        with pytest.raises(RuntimeError, match="decl.py:7.*data-dependent"):
            op(torch.empty(5, device="meta"))
        torch.library.opcheck(op, (torch.randn(6),))
    finally:
        lib._destroy()
    # Library._destroy deregisters it, as it does register_fake's handle
    assert tp.fake_kernel_of(f"{ns}::pos") is None
    assert not hasattr(getattr(torch.ops, ns), "pos")


def test_meta_private_path_canaries_check_signatures():
    """The private path is taken only where FakeImplHolder.register takes ``lib`` (torch >= 2.8)."""
    import inspect

    from torch._library import fake_impl, simple_registry

    from opregistry_meta import _torch_private as tp

    takes_lib = "lib" in inspect.signature(fake_impl.FakeImplHolder.register).parameters
    assert tp.PRIVATE_REGISTER == takes_lib
    assert tp.PRIVATE_GET == hasattr(simple_registry.singleton, "get")
    assert not tp._accepts_lib(lambda func, source: None)
    assert tp._accepts_lib(lambda func, source, lib, *, allow_override=False: None)


def test_meta_public_fallback_registers_the_same_kernel(ns, monkeypatch):
    """Where the private path is unavailable, the public register_fake does the registration."""
    from torch.library import Library

    from opregistry_meta import _torch_private as tp

    monkeypatch.setattr(tp, "PRIVATE_REGISTER", False)
    monkeypatch.setattr(tp, "PRIVATE_GET", False)

    def fake(x):
        return torch.empty_like(x)

    lib = Library(ns, "DEF")
    try:
        lib.define("neg(Tensor x) -> Tensor")
        lib.impl("neg", lambda x: -x, "CPU")
        tp.register_fake_kernel(lib, f"{ns}::neg", fake, "decl.py:9")
        # the public function wraps the kernel (_check_pystubs_once) and records its caller
        assert tp.fake_kernel_of(f"{ns}::neg") is not None
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"{ns}::neg", "Meta")
        torch.library.opcheck(getattr(torch.ops, ns).neg.default, (torch.randn(3),))
    finally:
        lib._destroy()
    assert tp.fake_kernel_of(f"{ns}::neg") is None


def test_meta_backend_uses_the_declaration_source_line(dists, ns):
    """An opregistry op's fake kernel is recorded at its declaration, not inside the plugin."""
    from opregistry_meta import _torch_private as tp

    reg, ops = _meta_ops(dists, ns)
    kernel = tp.fake_kernel_of(f"{ns}::double")
    assert kernel.func is sys.modules[f"meta_ops_{ns}"].double_fake
    assert kernel.source == reg.op(f"{ns}::double").kernel("Meta").kernel.source
    assert f"meta_ops_{ns}" in kernel.source


def test_vmap_private_path_registers_what_register_vmap_registers(ns):
    """register_vmap_rule: the rule runs under torch.vmap; unbatched calls skip it; unregistered."""
    from torch.library import Library

    from opregistry_vmap import _torch_private as tp

    calls = []

    def rule(info, in_dims, x, *, k=1):
        calls.append((info.batch_size, in_dims, k))
        return x.movedim(in_dims[0], 0).sum(-1) * k, 0

    lib = Library(ns, "DEF")
    try:
        lib.define("rowsum(Tensor x, *, int k=1) -> Tensor")
        lib.impl("rowsum", lambda x, *, k=1: x.sum(-1) * k, "CPU")
        tp.register_vmap_rule(lib, f"{ns}::rowsum", "rowsum", rule)
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"{ns}::rowsum", "FuncTorchBatched")
        op = getattr(torch.ops, ns).rowsum
        x = torch.randn(3, 4, 5)
        torch.testing.assert_close(torch.vmap(lambda t: op(t, k=2), in_dims=1)(x), 2 * x.sum(-1).T)
        assert calls == [(4, (1,), 2)]
        # no batched input at this level: torch calls the op below vmap, not the rule
        y = torch.randn(4)
        torch.testing.assert_close(torch.vmap(lambda t: op(y) + t)(torch.zeros(3)),
                                   y.sum().expand(3))
        assert len(calls) == 1
    finally:
        lib._destroy()
    assert not hasattr(getattr(torch.ops, ns), "rowsum")
