"""The registration kinds beyond kernels: autocast rules, Triton kernels, torch_dispatch rules.

Each is declared lazily (``"module:function"`` strings) in a temporary
distribution with real entry points, materialized by its backend plugin
(``opregistry-autocast``, the device backends, ``opregistry-torch-dispatch``)
and checked through torch itself: the dtype the kernel sees under
``torch.autocast``, a ``TorchDispatchMode`` that sees the op, a Triton kernel
running (on CPU under ``TRITON_INTERPRET=1``, on a GPU when there is one),
``opcheck``, ``torch.compile(fullgraph=True)`` and ``torch.export``.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

import opregistry
from opregistry.errors import DeclarationError

from .conftest import BACKENDS, load, op_dist, plan

HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed "
                                  "(requirements-dev.txt installs it on Linux)")


@functools.cache
def _interpreter_refused() -> str | None:
    """Why this torch cannot launch Triton's interpreter through ``wrap_triton``, or None.

    Under ``TRITON_INTERPRET=1`` ``@triton.jit`` returns an interpreted function;
    torch 2.13's ``wrap_triton`` launches it eagerly, torch 2.8's refuses it
    ("only works on functions annotated with triton.jit").  Probed once, in a
    child process (Triton reads the variable when ``@triton.jit`` runs).
    """
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "probe_interpreter.py"
        probe.write_text("import triton\nfrom torch.library import wrap_triton\n\n\n"
                         "@triton.jit\ndef k(x):\n    pass\n\n\nwrap_triton(k)\n")
        done = subprocess.run([sys.executable, str(probe)], capture_output=True, text=True,
                              env={**os.environ, "TRITON_INTERPRET": "1"}, timeout=300)
    return None if done.returncode == 0 else (done.stderr.strip().splitlines() or ["?"])[-1]


def _needs_interpreter_launch() -> None:
    why = _interpreter_refused()
    if why is not None:  # a fact of this torch release, probed; the main suite (2.13) runs it
        pytest.skip(f"torch {torch.__version__}'s wrap_triton does not launch Triton's "
                    f"interpreter (TRITON_INTERPRET=1): {why}")


def _codes(p: object) -> list[str]:
    return [x.code for x in p.problems]  # type: ignore[attr-defined]


# -- autocast ------------------------------------------------------------------------

AUTOCAST_KERNELS = """
import torch

SEEN = []

def scale(x, w):
    SEEN.append((x.dtype, w.dtype))
    return x * w

def scale_fake(x, w):
    return torch.empty_like(x)

def samples():
    return [((torch.randn(3), torch.randn(3)), {})]
"""


def _autocast_dist(dists, ns, rule="{'cpu': 'bfloat16'}", schema="scale(Tensor x, Tensor w) -> Tensor"):
    return op_dist(dists, "ac-ops", ns, f"""
lib.define("{schema}", kernels={{"cpu": "KMOD:scale"}}, fake="KMOD:scale_fake",
           autocast={rule}, samples="KMOD:samples")
""", kernels=AUTOCAST_KERNELS)


def test_autocast_rule_casts_inputs_the_kernel_sees(dists, ns):
    _autocast_dist(dists, ns)
    reg = load(dists)
    assert not reg.errors, reg.errors
    [rule] = [k for k in reg.plan.op(f"{ns}::scale").kernels if k.kernel.key == "AutocastCPU"]
    assert (rule.status, rule.backend, rule.kernel.fn) == ("active", "autocast", "torch:bfloat16")
    seen = sys.modules[f"{ns}_kernels"].SEEN
    op = getattr(torch.ops, ns).scale
    x, w = torch.randn(4), torch.randn(4)
    op(x, w)
    assert seen[-1] == (torch.float32, torch.float32)  # no autocast: untouched
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = op(x, w)
    assert seen[-1] == (torch.bfloat16, torch.bfloat16)
    assert out.dtype == torch.bfloat16
    # integers are left alone, as torch's _cast does
    with torch.autocast("cpu", dtype=torch.bfloat16):
        op(torch.arange(3), torch.arange(3))
    assert seen[-1] == (torch.int64, torch.int64)
    torch.library.opcheck(op.default, (x, w))


def test_autocast_rule_is_undone_with_its_distribution(dists, ns):
    _autocast_dist(dists, ns)
    reg = load(dists)
    op = getattr(torch.ops, ns).scale.default
    key = torch._C.DispatchKey.AutocastCPU
    assert op.has_kernel_for_dispatch_key(key)
    # torch 2.13's register_autocast adds a Python kernel to the overload too (2.8's does not)
    reg.unload()
    assert not hasattr(getattr(torch.ops, ns), "scale")
    assert key not in op.py_kernels  # undone with the library, not left on the overload


def test_autocast_refusals_before_torch(dists, ns):
    """What torch's autocast kernel would refuse (at call time) is refused at resolution."""
    op_dist(dists, "ac-kw", ns, """
lib.define("kw(Tensor x, *, float alpha=1.0) -> Tensor", kernels={"cpu": "KMOD:clone"},
           autocast={"cpu": "float16"})
lib.define("mut(Tensor(a!) x) -> ()", kernels={"cpu": "KMOD:clone"}, mutates_args=["x"],
           autocast={"cpu": "float16"})
""")
    p = plan(dists)
    by_code = {x.code: x for x in p.errors}
    assert set(by_code) == {"autocast-kwarg-only-argument", "autocast-on-mutable-op"}
    assert "ac-kw==1.0" in by_code["autocast-kwarg-only-argument"].message
    assert "torch.library.register_autocast" in by_code["autocast-on-mutable-op"].message


@pytest.mark.parametrize("rule, expected", [
    ("{'vulkan': 'bfloat16'}", "no autocast dispatch key for device type 'vulkan'"),
    ("{'cpu': 'int8'}", "cast_inputs must be a floating torch.dtype"),
])
def test_autocast_declaration_errors(rule, expected):
    lib = opregistry.OpLibrary("tacerr")
    with pytest.raises(DeclarationError, match=expected):
        lib.define("f(Tensor x) -> Tensor", autocast=eval(rule))


def test_autocast_duplicate_and_conflict_name_distributions(dists, ns):
    _autocast_dist(dists, ns)
    op_dist(dists, "ac-other", ns, f"""
lib.impl("{ns}::scale", "AutocastCPU", "torch:float16")
""", kind="IMPL")
    p = plan(dists)
    [conflict] = [x for x in p.errors if x.code == "kernel-conflict"]
    assert "ac-other==1.0" in conflict.message and "AutocastCPU" in conflict.message


def test_autocast_override_with_policy_replaces_the_owners_rule(dists, ns, monkeypatch):
    _autocast_dist(dists, ns)
    op_dist(dists, "ac-over", ns, f"""
lib.impl("{ns}::scale", "AutocastCPU", "torch:float16", override=True)
""", kind="IMPL", kernels=AUTOCAST_KERNELS)
    assert "kernel-override-denied" in _codes(plan(dists))
    monkeypatch.setenv("OPREGISTRY_ALLOW_OVERRIDE", ns)
    reg = load(dists)
    assert not reg.errors, reg.errors
    seen = sys.modules[f"{ns}_kernels"].SEEN
    with torch.autocast("cpu", dtype=torch.bfloat16):
        getattr(torch.ops, ns).scale(torch.randn(2), torch.randn(2))
    assert seen[-1] == (torch.float16, torch.float16)


def test_autocast_decorator_style_and_listing(dists, ns, scoped):
    module = f"acdeco_{ns}"
    dists.make("ac-deco", ops={"ops": f"{module}:lib"}, modules={module: f"""
import torch
from opregistry import OpLibrary

lib = OpLibrary({ns!r})

@lib.op(mutates_args=())
def double(x: torch.Tensor) -> torch.Tensor:
    return x * 2

double.register_autocast("cpu", torch.float16)
"""})
    reg = load(dists)
    assert not reg.errors, reg.errors
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert getattr(torch.ops, ns).double(torch.ones(2)).dtype == torch.float16
    scoped()
    from opregistry.cli import main

    import io
    import contextlib
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["show", f"{ns}::double"])
    assert "AutocastCPU" in out.getvalue() and "torch:float16" in out.getvalue()


# -- torch_dispatch ------------------------------------------------------------------

DISPATCH_KERNELS = """
import torch
from torch.utils._python_dispatch import TorchDispatchMode

CALLS = []

class Recording(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))

def rule(mode, func, types, args, kwargs):
    CALLS.append((type(mode).__name__, str(func)))
    return args[0] + 100

class Tagged(torch.Tensor):
    @staticmethod
    def __new__(cls, data):
        return torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=data.dtype)

    def __init__(self, data):
        self.data_ = data

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise AssertionError(f"{func} reached Tagged.__torch_dispatch__")

def subclass_rule(cls, func, types, args, kwargs):
    CALLS.append((cls.__name__, str(func)))
    return args[0].data_ * 3

def clone(x):
    return x.clone()

NOT_A_MODE = 3
"""


def _dispatch_dist(dists, ns, extra=""):
    return op_dist(dists, "td-ops", ns, f"""
lib.define("ident(Tensor x) -> Tensor", kernels={{"cpu": "KMOD:clone"}},
           torch_dispatch={{"KMOD:Recording": "KMOD:rule", "KMOD:Tagged": "KMOD:subclass_rule"}})
{extra}""", kernels=DISPATCH_KERNELS)


def test_torch_dispatch_rules_for_a_mode_and_a_subclass(dists, ns):
    _dispatch_dist(dists, ns)
    reg = load(dists)
    assert not reg.errors, reg.errors
    kernels = {k.kernel.key: k for k in reg.plan.op(f"{ns}::ident").kernels}
    key = f"TorchDispatch[{ns}_kernels:Recording]"
    assert kernels[key].status == "active" and kernels[key].backend == "torch_dispatch"
    mod = sys.modules[f"{ns}_kernels"]
    op = getattr(torch.ops, ns).ident
    x = torch.zeros(2)
    torch.testing.assert_close(op(x), x)  # no mode: the CPU kernel
    with mod.Recording():
        out = op(x)
    torch.testing.assert_close(out, x + 100)
    assert mod.CALLS[-1] == ("Recording", f"{ns}.ident.default")
    out = op(mod.Tagged(torch.ones(2)))
    torch.testing.assert_close(out, torch.full((2,), 3.0))
    assert mod.CALLS[-1] == ("Tagged", f"{ns}.ident.default")
    reg.unload()
    from torch._library.simple_registry import singleton
    assert singleton.find(f"{ns}::ident").torch_dispatch_rules.find(mod.Recording) is None


def test_torch_dispatch_duplicate_rule_names_both_distributions(dists, ns):
    _dispatch_dist(dists, ns)
    op_dist(dists, "td-other", ns, f"""
lib.impl("{ns}::ident", "TorchDispatch[{ns}_kernels:Recording]", "{ns}_kernels:clone")
""", kind="IMPL", kernels=DISPATCH_KERNELS)
    p = plan(dists)
    [conflict] = [x for x in p.errors if x.code == "kernel-conflict"]
    assert "td-other==1.0" in conflict.message and "td-ops==1.0" in conflict.message


def test_torch_dispatch_class_that_is_not_a_mode_fails_its_distribution(dists, ns):
    op_dist(dists, "td-bad", ns, """
lib.define("ident(Tensor x) -> Tensor", kernels={"cpu": "KMOD:clone"},
           torch_dispatch={"KMOD:clone": "KMOD:rule"})
""", kernels=DISPATCH_KERNELS)
    reg = load(dists)
    [problem] = reg.errors
    assert problem.code == "materialize-failed"
    assert "neither a TorchDispatchMode nor a Tensor subclass" in problem.message
    assert not hasattr(getattr(torch.ops, ns), "ident")  # rolled back whole


def test_rule_module_that_fails_to_import_fails_its_distribution(dists, ns):
    op_dist(dists, "td-missing", ns, """
lib.define("ident(Tensor x) -> Tensor", kernels={"cpu": "KMOD:clone"},
           torch_dispatch={"no_such_module_td:Mode": "KMOD:rule"})
""", kernels=DISPATCH_KERNELS)
    reg = load(dists)
    [problem] = reg.errors
    assert problem.code == "materialize-failed" and "no_such_module_td" in problem.message


# -- Triton --------------------------------------------------------------------------

TRITON_KERNELS = """
import torch
import triton
import triton.language as tl
from torch.library import wrap_triton


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask)
             + tl.load(y_ptr + offsets, mask=mask), mask=mask)


def add(x, y):
    out = torch.empty_like(x)
    n = out.numel()
    wrap_triton(add_kernel)[(triton.cdiv(n, 16),)](x, y, out, n, BLOCK=16)
    return out


def add_fake(x, y):
    return torch.empty_like(x)


def samples():
    return [((torch.randn(37), torch.randn(37)), {})]
"""

TRITON_PROBE = """
import json, sys, torch, opregistry
reg = opregistry.load(plugins=sys.argv[1].split(","))
ns = sys.argv[2]
op = getattr(torch.ops, ns).add
x, y = torch.randn(37), torch.randn(37)
eager = torch.allclose(op(x, y), x + y)
compiled = torch.compile(lambda a, b: op(a, b) * 2, backend="aot_eager", fullgraph=True)
compiled_ok = torch.allclose(compiled(x, y), (x + y) * 2)
class M(torch.nn.Module):
    def forward(self, a, b):
        return op(a, b)
ep = torch.export.export(M(), (x, y))
exported = torch.allclose(ep.module()(x, y), x + y)
targets = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
torch.library.opcheck(op.default, (x, y))
print(json.dumps({"errors": [str(p) for p in reg.errors], "eager": eager,
                  "compiled": compiled_ok, "exported": exported, "targets": targets}))
"""


@needs_triton
def test_triton_kernel_on_cpu_under_the_interpreter(dists, ns):
    """TRITON_INTERPRET=1: the kernel runs on CPU tensors; compile and export keep the op whole.

    A fresh process: Triton reads TRITON_INTERPRET when ``@triton.jit`` runs.
    """
    _needs_interpreter_launch()
    import json

    op_dist(dists, "tr-ops", ns, """
lib.define("add(Tensor x, Tensor y) -> Tensor", triton={"cpu": "KMOD:add"},
           fake="KMOD:add_fake", samples="KMOD:samples")
""", kernels=TRITON_KERNELS)
    env = {**os.environ, "TRITON_INTERPRET": "1", "OPREGISTRY_AUTOLOAD": "0",
           "PYTHONPATH": os.pathsep.join([str(dists.root), *sys.path])}
    done = subprocess.run([sys.executable, "-c", TRITON_PROBE, ",".join([*BACKENDS, *dists.names]),
                           ns], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"errors": [], "eager": True, "compiled": True, "exported": True,
                      "targets": [f"{ns}.add.default"]}


@needs_triton
def test_triton_kernel_is_listed_and_its_function_is_the_fake(dists, ns):
    op_dist(dists, "tr-list", ns, """
lib.define("add(Tensor x, Tensor y) -> Tensor", triton="KMOD:add")
""", kernels=TRITON_KERNELS)
    p = plan(dists)
    kernels = {k.kernel.key: k for k in p.op(f"{ns}::add").kernels}
    assert kernels["CUDA"].kernel.kind.name == "triton" and kernels["CUDA"].status == "unavailable" or (
        torch.cuda.is_available() and kernels["CUDA"].status == "active")
    assert kernels["Meta"].kernel.fn == f"{ns}_kernels:add"  # as triton_op: fn is its own fake


@pytest.mark.skipif(not torch.cuda.is_available() or not HAS_TRITON, reason="needs a CUDA GPU")
def test_triton_kernel_compiles_into_the_graph_on_a_gpu(dists, ns):  # pragma: no cover - GPU
    op_dist(dists, "tr-gpu", ns, """
lib.define("add(Tensor x, Tensor y) -> Tensor", triton="KMOD:add")
""", kernels=TRITON_KERNELS)
    reg = load(dists)
    assert not reg.errors, reg.errors
    op = getattr(torch.ops, ns).add
    x, y = torch.randn(37, device="cuda"), torch.randn(37, device="cuda")
    torch.testing.assert_close(op(x, y), x + y)
    compiled = torch.compile(lambda a, b: op(a, b) * 2, fullgraph=True)
    torch.testing.assert_close(compiled(x, y), (x + y) * 2)
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch._subclasses.functional_tensor import dispatch_functionalize
    graph = make_fx(dispatch_functionalize(lambda a, b: op(a, b)))(x, y)
    assert "triton_kernel_wrapper" in graph.code
    ep = torch.export.export(type("M", (torch.nn.Module,), {"forward": lambda s, a, b: op(a, b)})(),
                             (x, y))
    torch.testing.assert_close(ep.module()(x, y), x + y)
    torch.library.opcheck(op.default, (x, y))


def test_triton_missing_makes_the_kernel_inactive_with_the_requirement(dists, ns, monkeypatch):
    op_dist(dists, "tr-missing", ns, """
lib.define("add(Tensor x, Tensor y) -> Tensor", kernels={"cuda": "KMOD:clone"},
           triton={"cpu": "KMOD:clone"}, fake="KMOD:fake")
""")
    monkeypatch.setitem(sys.modules, "triton", None)  # find_spec answers None, as uninstalled
    p = plan(dists)
    # no kernel of the op can run here (the CUDA one lacks a GPU): that is its own error
    assert [x.code for x in p.errors] == (
        [] if torch.cuda.is_available() else ["op-no-active-kernel"])
    [missing] = [x for x in p.problems if x.code == "triton-missing"]
    assert "tr-missing==1.0" in missing.message and "pip install triton" in missing.hint
    [cpu] = [k for k in p.op(f"{ns}::add").kernels if k.kernel.key == "CPU"]
    assert cpu.status == "inactive" and "triton" in cpu.reason


def test_triton_kernels_of_one_op_from_two_distributions_are_refused(dists, ns):
    op_dist(dists, "tr-owner", ns, """
lib.define("add(Tensor x, Tensor y) -> Tensor", triton={"cpu": "KMOD:clone"}, fake="KMOD:fake")
""")
    op_dist(dists, "tr-plain", ns, f"""
lib.impl("{ns}::add", "cuda", "KMOD:clone")
""", kind="IMPL")
    assert "triton-split" not in _codes(plan(dists))  # a plain kernel from another is fine
    op_dist(dists, "tr-contrib", ns, f"""
lib.impl("{ns}::add", "cpu", "KMOD:clone", triton=True)
""", kind="IMPL")
    p = plan(dists)
    [split] = [x for x in p.errors if x.code == "triton-split"]
    assert [o.distribution for o in split.culprits] == ["tr-contrib"]
    assert "tr-owner==1.0" in split.message and "tr-contrib==1.0" in split.message
    # the owner's op and Triton kernel stand (the contrib's equal record is not mistaken for it)
    cpu = p.op(f"{ns}::add").kernel("CPU")
    assert cpu is not None and cpu.kernel.origin.distribution == "tr-owner"


def test_functional_mode_rule_beside_a_triton_kernel_is_refused(dists, ns):
    op_dist(dists, "tr-rule", ns, """
lib.define("add(Tensor x, Tensor y) -> Tensor", triton={"cpu": "KMOD:clone"}, fake="KMOD:fake",
           torch_dispatch={"torch._subclasses.functional_tensor:FunctionalTensorMode":
                           "KMOD:clone"})
""")
    assert "torch-dispatch-taken-by-triton" in _codes(plan(dists))


def test_triton_kernel_declared_for_a_non_device_key_is_refused():
    lib = opregistry.OpLibrary("trbad")
    handle = lib.define("f(Tensor x) -> Tensor")
    with pytest.raises(DeclarationError, match="not a device key"):
        handle.register_triton("fake", "m:f")


DOC_TRITON_PROBE = """
import sys, torch, opregistry
reg = opregistry.load(plugins=sys.argv[1].split(","))
assert not reg.errors, reg.errors
exec(sys.argv[2])  # the page's (not run) usage block
x, y = torch.randn(37), torch.randn(37)
torch.library.opcheck(torch.ops.tritonops.add.default, (x, y))
ep = torch.export.export(type("M", (torch.nn.Module,), {
    "forward": lambda self, a, b: torch.ops.tritonops.add(a, b)})(), (x, y))
torch.testing.assert_close(ep.module()(x, y), x + y)
print("OK")
"""


@needs_triton
def test_op_authors_triton_example_runs_under_the_interpreter(dists):
    """docs/op-authors.md's Triton blocks (not run by test_docs: triton is optional), run here."""
    _needs_interpreter_launch()
    from .test_docs import blocks

    found = {b.arg.split(" ")[0]: b for b in blocks("op-authors.md") if b.directive}
    kernels = found["tritonops_kernels.py"].code
    declaration = found["tritonops"].code
    [usage] = [b for b in blocks("op-authors.md")
               if b.directive == "not run" and "tritonops" in b.code]
    dists.make("tritonops", ops={"tritonops": "tritonops_decl:lib"},
               modules={"tritonops_decl": declaration, "tritonops_kernels": kernels})
    env = {**os.environ, "TRITON_INTERPRET": "1", "OPREGISTRY_AUTOLOAD": "0",
           "PYTHONPATH": os.pathsep.join([str(dists.root), *sys.path])}
    done = subprocess.run([sys.executable, "-c", DOC_TRITON_PROBE,
                           ",".join([*BACKENDS, *dists.names]), usage.code],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("OK"), done.stderr[-3000:]


TRACEABLE_KERNELS = """
import torch

def double(x):
    # a Triton kernel function may also call torch ops; this one calls only those,
    # so that its decomposition can be seen on CPU without Triton's interpreter
    return x * 2

def double_fake(x):
    return torch.empty_like(x)
"""


@needs_triton
def test_compile_traces_into_the_triton_kernel_function(dists, ns, monkeypatch):
    """The FunctionalTensorMode rule decomposes the op under torch.compile (AOTDispatcher):
    the graph handed to the compiler holds the function's ops, not the op; export keeps it."""
    from torch._dynamo.backends.common import aot_autograd

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    op_dist(dists, "tr-trace", ns, """
lib.define("double(Tensor x) -> Tensor", triton={"cpu": "KMOD:double"}, fake="KMOD:double_fake")
""", kernels=TRACEABLE_KERNELS)
    reg = load(dists)
    assert not reg.errors, reg.errors
    op = getattr(torch.ops, ns).double
    graphs: list[str] = []

    def capture(gm, example_inputs):
        graphs.append(gm.code)
        return gm.forward

    compiled = torch.compile(lambda x: op(x) + 1, fullgraph=True,
                             backend=aot_autograd(fw_compiler=capture))
    x = torch.randn(5)
    torch.testing.assert_close(compiled(x), x * 2 + 1)
    [code] = graphs
    assert "aten.mul" in code and f"{ns}.double" not in code, code
    ep = torch.export.export(type("M", (torch.nn.Module,), {"forward": lambda s, a: op(a)})(), (x,))
    assert [str(n.target) for n in ep.graph.nodes if n.op == "call_function"] == [
        f"{ns}.double.default"]
    # the same function as a plain CPU kernel: AOTDispatcher keeps the op whole
    reg.unload()
    graphs.clear()
    op_dist(dists, "plain-trace", f"{ns}p", """
lib.define("double(Tensor x) -> Tensor", kernels={"cpu": "KMOD:double"}, fake="KMOD:double_fake")
""", kernels=TRACEABLE_KERNELS)
    load(dists)
    plain = getattr(torch.ops, f"{ns}p").double
    torch._dynamo.reset()
    torch.compile(lambda x: plain(x) + 1, fullgraph=True,
                  backend=aot_autograd(fw_compiler=capture))(x)
    assert f"{ns}p.double" in graphs[0]


def test_lock_records_each_kind_and_sees_a_kernel_become_triton(dists, ns):
    from opregistry.lockfile import diff_lock, lock_data

    op_dist(dists, "lk-ops", ns, """
lib.define("f(Tensor x) -> Tensor", kernels={"cpu": "KMOD:clone"}, fake="KMOD:fake",
           autocast={"cuda": "float16"}, torch_dispatch={"KMOD:Recording": "KMOD:rule"})
""", kernels=DISPATCH_KERNELS + "\ndef fake(x):\n    return torch.empty_like(x)\n")
    before = lock_data(plan(dists))
    text = json.dumps(before)
    assert '"AutocastCUDA"' in text and '"torch:float16"' in text
    assert f'"TorchDispatch[{ns}_kernels:Recording]"' in text
    assert '"triton"' not in text
    # the same distribution, its CPU kernel now declared as a Triton kernel
    dists.cleanup()
    for info in dists.root.glob("lk_ops-*.dist-info"):
        shutil.rmtree(info)
    dists.names.remove("lk-ops")
    op_dist(dists, "lk-ops", ns, """
lib.define("f(Tensor x) -> Tensor", triton={"cpu": "KMOD:clone"}, fake="KMOD:fake",
           autocast={"cuda": "float16"}, torch_dispatch={"KMOD:Recording": "KMOD:rule"})
""", kernels=DISPATCH_KERNELS + "\ndef fake(x):\n    return torch.empty_like(x)\n")
    after = lock_data(plan(dists))
    diffs = diff_lock(before, after)
    assert any("CPU" in d and "triton" in d for d in diffs), diffs
