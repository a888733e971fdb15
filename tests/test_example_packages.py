"""The example op packages: nnkit (DEF), nnkit-contrib (FRAGMENT + IMPL), int8kit (decorators).

nnkit and nnkit-contrib are pip-installed (requirements-dev.txt), so these
tests use their real entry points.  The generic opcheck / gradcheck /
compile / export sweep over every installed example op lives in
tests/test_examples.py; here: what each op computes, its vmap rule, the
FRAGMENT/IMPL origins in ``opregistry list``, laziness, and the decorator
style package (loaded through a temporary dist-info, see below).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from opregistry.guard import resolve_ref

from . import per_version
from .conftest import BACKENDS, load

HAS_TRITON = importlib.util.find_spec("triton") is not None
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
NNKIT_OPS = {
    "nnkit::rms_norm": "nnkit==0.1.0",
    "nnkit::silu_and_mul": "nnkit==0.1.0",
    "nnkit::silu_and_mul.out": "nnkit==0.1.0",
    "nnkit::nms": "nnkit==0.1.0",
    "nnkit::ema_update": "nnkit==0.1.0",
    "nnkit::rope_cache": "nnkit==0.1.0",
    "nnkit::interp": "nnkit==0.1.0",
    "nnkit::gelu_and_mul": "nnkit-contrib==0.1.0",
    "nnkit::fused_add_rms_norm": "nnkit-contrib==0.1.0",
}
#: nnkit declares its out= overload where torch has torch.Tag.out (2.13+, docs/op-authors.md)
HAS_OUT_OVERLOAD = "out" in per_version.TORCH_TAGS
if not HAS_OUT_OVERLOAD:
    del NNKIT_OPS["nnkit::silu_and_mul.out"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True)


def test_list_shows_owner_fragment_and_third_party_kernel():
    """`opregistry list --json` (no torch): nnkit owns the namespace, nnkit-contrib adds to it."""
    proc = _run("-m", "opregistry", "list", "--json", "-n", "nnkit")
    data = json.loads(proc.stdout)
    per_version.need_nnkit(data["problems"])  # on torch < 2.13: refused, as it must be
    assert proc.returncode == 0, proc.stderr
    [ns] = data["namespaces"]
    assert ns["owner"] == {"name": "nnkit", "version": "0.1.0"}
    assert ns["fragments"] == [{"name": "nnkit-contrib", "version": "0.1.0"}]
    ops = {op["name"]: op for op in data["ops"]}
    spelled = {name: "{name}=={version}".format(**op["distribution"]) for name, op in ops.items()}
    assert spelled == NNKIT_OPS
    kernels = {k["key"]: k for k in ops["nnkit::nms"]["kernels"]}
    assert kernels["CPU"]["distribution"] == {"name": "nnkit", "version": "0.1.0"}
    assert kernels["CUDA"]["distribution"] == {"name": "nnkit-contrib", "version": "0.1.0"}
    assert kernels["CUDA"]["kernel"] == "nnkit_contrib.cuda_nms:nms"
    expected = "active" if torch.cuda.is_available() else "unavailable"
    assert kernels["CUDA"]["status"] == expected
    assert not [p for p in data["problems"] if p["severity"] == "error"]


def test_list_table_names_the_contributing_distribution(capsys):
    import opregistry
    from opregistry.cli import main

    per_version.need_nnkit(opregistry.plan().problems)
    assert main(["list", "-n", "nnkit"]) == 0
    out = capsys.readouterr().out
    assert "nnkit  nnkit==0.1.0  nnkit-contrib==0.1.0" in out
    assert "nnkit::gelu_and_mul(Tensor x) -> Tensor  [nnkit-contrib==0.1.0]" in out
    cuda_row = next(line for line in out.splitlines() if "nnkit_contrib.cuda_nms:nms" in line)
    assert "nnkit-contrib==0.1.0" in cuda_row


def test_declarations_import_neither_torch_nor_kernels():
    """The declarative modules are read by `opregistry list` without torch, NumPy or Triton."""
    code = (
        "import sys, nnkit.registry, nnkit_contrib.registry\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'numpy', 'triton') or m.endswith('kernels') or m.endswith('cuda_nms'))\n"
        "assert not heavy, heavy\n"
        "print(len(nnkit.registry.lib.opregistry_ops()))\n"
    )
    proc = _run("-c", code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == ("7" if HAS_OUT_OVERLOAD else "6")  # .out: torch >= 2.13


def test_cuda_kernel_modules_are_not_imported_without_gpu(installed):
    """The Triton kernel and the contrib CUDA kernel stay unimported on a CPU-only machine."""
    per_version.need_nnkit(installed.problems)
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the CUDA kernels are imported there by design")
    assert "nnkit::rms_norm" in installed.op_names
    assert "nnkit.triton_kernels" not in sys.modules
    assert "nnkit_contrib.cuda_nms" not in sys.modules
    # Triton itself: in a fresh interpreter, since in this one torch may have
    # imported it for its own reasons (opcheck's torch.compile tests do on the
    # CUDA wheels of PyPI, which install Triton)
    code = (
        "import sys, torch\n"
        "x, w = torch.randn(2, 8), torch.ones(8)\n"
        "torch.ops.nnkit.rms_norm(x, w); torch.ops.nnkit.nms(torch.rand(3, 4), torch.rand(3), 0.5)\n"
        "print(sorted(m for m in ('triton', 'nnkit.triton_kernels', 'nnkit_contrib.cuda_nms')\n"
        "             if m in sys.modules))\n"
    )
    proc = _run("-c", code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def _double(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.double)


def test_rms_norm_matches_torch_and_vmaps(installed):
    per_version.need_nnkit(installed.problems)
    x, w = _double(3, 5, 8), _double(8)
    expected = F.rms_norm(x, (8,), w, eps=1e-6)
    torch.testing.assert_close(torch.ops.nnkit.rms_norm(x, w), expected)
    # vmap with an unbatched and with a batched weight
    torch.testing.assert_close(torch.vmap(torch.ops.nnkit.rms_norm, in_dims=(1, None))(x, w),
                               expected.movedim(1, 0))
    ws = _double(3, 8)
    got = torch.vmap(torch.ops.nnkit.rms_norm)(x, ws)
    torch.testing.assert_close(got, torch.stack([F.rms_norm(x[i], (8,), ws[i], 1e-6)
                                                 for i in range(3)]))
    with pytest.raises(RuntimeError, match=r"weight has shape \(7,\), expected \(8,\)"):
        torch.ops.nnkit.rms_norm(x, _double(7))


def test_rms_norm_grad_matches_torch(installed):
    per_version.need_nnkit(installed.problems)
    x, w = _double(4, 8).requires_grad_(), _double(8).requires_grad_()
    ours = torch.autograd.grad(torch.ops.nnkit.rms_norm(x, w).pow(2).sum(), (x, w))
    ref = torch.autograd.grad(F.rms_norm(x, (8,), w, 1e-6).pow(2).sum(), (x, w))
    torch.testing.assert_close(ours, ref)


def test_silu_and_mul_and_its_out_overload(installed):
    per_version.need_nnkit(installed.problems)
    x = _double(2, 3, 10)
    expected = F.silu(x[..., :5]) * x[..., 5:]
    torch.testing.assert_close(torch.ops.nnkit.silu_and_mul(x), expected)
    out = torch.empty(2, 3, 5, dtype=torch.double)
    if HAS_OUT_OVERLOAD:
        returned = torch.ops.nnkit.silu_and_mul.out(x, out=out)
        assert returned is out
        torch.testing.assert_close(out, expected)
    else:  # torch < 2.13 cannot compile an op returning the tensor it mutates: not declared
        assert not hasattr(torch.ops.nnkit.silu_and_mul, "out")
    torch.testing.assert_close(torch.vmap(torch.ops.nnkit.silu_and_mul, in_dims=2)(
        x.movedim(0, 2)), expected)
    with pytest.raises(RuntimeError, match="last dimension of x must be even"):
        torch.ops.nnkit.silu_and_mul(_double(3, 7))


def _reference_nms(boxes: torch.Tensor, scores: torch.Tensor, threshold: float) -> list[int]:
    """Textbook greedy NMS over Python floats."""
    def iou(a: list[float], b: list[float]) -> float:
        w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
        h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
        inter = w * h
        area = lambda r: (r[2] - r[0]) * (r[3] - r[1])  # noqa: E731
        return inter / (area(a) + area(b) - inter)

    rows = boxes.tolist()
    keep: list[int] = []
    for i in sorted(range(len(rows)), key=lambda i: -float(scores[i])):
        if all(iou(rows[i], rows[j]) <= threshold for j in keep):
            keep.append(i)
    return keep


def test_nms_cpu_and_contrib_cuda_kernel_agree_with_reference(installed):
    per_version.need_nnkit(installed.problems)
    from nnkit.samples import _boxes
    from nnkit_contrib.cuda_nms import nms as contrib_nms

    for n, seed, threshold in [(30, 3, 0.2), (30, 4, 0.5), (1, 5, 0.5), (0, 6, 0.5)]:
        boxes, scores = _boxes(n, seed)
        expected = _reference_nms(boxes, scores, threshold)
        assert torch.ops.nnkit.nms(boxes, scores, threshold).tolist() == expected
        # the IMPL kernel is device-agnostic torch: check it on CPU tensors too
        assert contrib_nms(boxes, scores, threshold).tolist() == expected


def test_nms_compiles_with_a_data_dependent_size(installed):
    """The fake kernel's new_dynamic_size() lets torch.compile trace nms without a graph break."""
    per_version.need_nnkit(installed.problems)
    from torch._dynamo.testing import CompileCounter

    from nnkit.samples import _boxes

    boxes, scores = _boxes(20, 7)
    counter = CompileCounter()

    @torch.compile(backend=counter, fullgraph=True)
    def kept_scores(boxes: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return scores[torch.ops.nnkit.nms(boxes, scores, 0.3)]

    torch._dynamo.reset()
    # torch 2.8 traces a data-dependent output size only with this switch (docs/op-authors.md)
    with torch._dynamo.config.patch(
            capture_dynamic_output_shape_ops=per_version.release() < (2, 13)):
        got = kept_scores(boxes, scores)
    assert counter.frame_count == 1
    torch.testing.assert_close(got, scores[_reference_nms(boxes, scores, 0.3)])


def test_ema_update_and_fused_add_rms_norm_mutate_in_place(installed):
    per_version.need_nnkit(installed.problems)
    average, value = torch.ones(4), torch.full((4,), 3.0)
    torch.ops.nnkit.ema_update(average, value, 0.75)
    torch.testing.assert_close(average, torch.full((4,), 1.5))

    x, residual, w = torch.randn(3, 8), torch.randn(3, 8), torch.randn(8)
    expected_residual = x + residual
    expected_x = F.rms_norm(expected_residual, (8,), w, 1e-6)
    torch.ops.nnkit.fused_add_rms_norm(x, residual, w)
    torch.testing.assert_close(residual, expected_residual)
    torch.testing.assert_close(x, expected_x)


def test_rope_cache_is_a_factory_routed_by_device(installed):
    per_version.need_nnkit(installed.problems)
    table = torch.ops.nnkit.rope_cache(6, 4, 100.0, dtype=torch.double, device="cpu")
    positions = torch.arange(6, dtype=torch.double)[:, None]
    freqs = positions / 100.0 ** (torch.tensor([0.0, 2.0], dtype=torch.double) / 4)
    torch.testing.assert_close(table, torch.cat([freqs.cos(), freqs.sin()], -1).to(table.dtype),
                               rtol=1e-6, atol=1e-6)
    assert torch.ops.nnkit.rope_cache(3, 2).dtype == torch.get_default_dtype()
    meta = torch.ops.nnkit.rope_cache(5, 8, device="meta")
    assert (meta.device.type, tuple(meta.shape)) == ("meta", (5, 8))


def test_interp_wraps_numpy_with_grad_and_vmap(installed):
    per_version.need_nnkit(installed.problems)
    xp = torch.tensor([0.0, 1.0, 3.0], dtype=torch.double)
    fp = torch.tensor([0.0, 2.0, 0.0], dtype=torch.double)
    x = torch.tensor([-1.0, 0.5, 2.0, 4.0], dtype=torch.double, requires_grad=True)
    y = torch.ops.nnkit.interp(x, xp, fp)
    np.testing.assert_allclose(y.detach().numpy(), np.interp(x.detach().numpy(), xp, fp))
    (grad,) = torch.autograd.grad(y.sum(), x)
    assert grad.tolist() == [0.0, 2.0, -1.0, 0.0]
    tables = torch.stack([fp, 2 * fp])
    batched = torch.vmap(torch.ops.nnkit.interp, in_dims=(None, None, 0))(x.detach(), xp, tables)
    torch.testing.assert_close(batched, torch.stack([y.detach(), 2 * y.detach()]))


def test_gelu_and_mul_from_the_fragment(installed):
    per_version.need_nnkit(installed.problems)
    x = _double(4, 6).requires_grad_()
    expected = F.gelu(x[..., :3]) * x[..., 3:]
    got = torch.ops.nnkit.gelu_and_mul(x)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(torch.autograd.grad(got.sum(), x)[0],
                               torch.autograd.grad(expected.sum(), x)[0])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_triton_rms_norm_and_contrib_nms_on_cuda(installed):
    """On a GPU: the Triton kernel and the contrib CUDA kernel are the ones torch calls."""
    per_version.need_nnkit(installed.problems)
    x, w = torch.randn(64, 1000, device="cuda"), torch.randn(1000, device="cuda")
    torch.testing.assert_close(torch.ops.nnkit.rms_norm(x, w), F.rms_norm(x, (1000,), w, 1e-6),
                               rtol=1e-4, atol=1e-4)
    assert "nnkit.triton_kernels" in sys.modules
    from nnkit.samples import _boxes

    boxes, scores = _boxes(50, 8)
    got = torch.ops.nnkit.nms(boxes.cuda(), scores.cuda(), 0.4)
    assert got.device.type == "cuda"
    assert got.tolist() == _reference_nms(boxes, scores, 0.4)
    assert "nnkit_contrib.cuda_nms" in sys.modules


# -- int8kit: the decorator style -------------------------------------------------
#
# int8kit's declaring module imports torch (it is the kernels' module, as with
# custom_op), so installing it in the dev environment would make every
# `opregistry list` import torch.  It is loaded here through a real entry point
# in a temporary dist-info instead; its sources are examples/int8kit.


@pytest.fixture
def int8kit(dists, monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES / "int8kit"))
    name = dists.make("int8kit", version="0.1.0", ops={"int8kit": "int8kit.ops:lib"})
    yield load(dists, plugins=[*BACKENDS, name])
    for module in [m for m in sys.modules if m.split(".")[0] == "int8kit"]:
        del sys.modules[module]


def test_int8kit_decorators_infer_schemas_and_pass_opcheck(int8kit):
    assert not int8kit.errors, int8kit.errors
    quantize = int8kit.op("int8kit::quantize_rows")
    assert quantize.op.schema == "(Tensor x) -> (Tensor, Tensor)"
    assert quantize.op.origin.dist == "int8kit==0.1.0"
    dequantize = int8kit.op("int8kit::dequantize_rows")
    assert dequantize.op.schema == "(Tensor q, Tensor scale, ScalarType dtype) -> Tensor"
    # @lib.op without device_types: one kernel for every device, as custom_op
    assert {k.kernel.key for k in dequantize.kernels} == {
        "CompositeExplicitAutograd", "Meta", "Autograd", "FuncTorchBatched"}
    for plan in (quantize, dequantize):
        overload = getattr(torch.ops.int8kit, plan.op.name).default
        for args, kwargs in resolve_ref(plan.op.samples)():
            torch.library.opcheck(overload, args, kwargs)


def test_int8kit_round_trip_grad_vmap_and_compile(int8kit):
    from torch._dynamo.testing import CompileCounter

    from int8kit.ops import dequantize_rows, quantize_rows

    x = torch.randn(5, 32)
    q, scale = quantize_rows(x)  # the handle calls torch.ops.int8kit.quantize_rows
    assert q.dtype == torch.int8 and scale.shape == (5, 1)
    torch.testing.assert_close(dequantize_rows(q, scale, torch.float32), x,
                               atol=scale.max().item(), rtol=0)
    s = scale.double().requires_grad_()
    assert torch.autograd.gradcheck(lambda s: dequantize_rows(q, s, torch.double), (s,))
    qs, scales = torch.vmap(quantize_rows)(x.reshape(5, 4, 8))
    torch.testing.assert_close(qs.reshape(5, 32), torch.stack(
        [quantize_rows(r.reshape(4, 8))[0].reshape(32) for r in x]))
    counter = CompileCounter()
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: dequantize_rows(*quantize_rows(t), torch.float32),
                             backend=counter, fullgraph=True)
    torch.testing.assert_close(compiled(x), dequantize_rows(q, scale, torch.float32))
    assert counter.frame_count == 1

    class RoundTrip(torch.nn.Module):
        def forward(self, t: torch.Tensor) -> torch.Tensor:
            return dequantize_rows(*quantize_rows(t), torch.float32)

    exported = torch.export.export(RoundTrip(), (x,))
    targets = {str(n.target) for n in exported.graph.nodes if n.op == "call_function"}
    assert {"int8kit.quantize_rows.default", "int8kit.dequantize_rows.default"} <= targets
    torch.testing.assert_close(exported.module()(x), dequantize_rows(q, scale, torch.float32))


def test_int8kit_discovery_imports_torch_as_documented(dists, monkeypatch):
    """The decorator style's cost, stated in docs/op-authors.md: listing it imports torch."""
    name = dists.make("int8kit", version="0.1.0", ops={"int8kit": "int8kit.ops:lib"})
    code = (
        "import sys\nfrom opregistry import plan\n"
        f"p = plan(plugins=[{name!r}])\n"
        "print(sorted(o.op.qualname for o in p.ops), 'torch' in sys.modules)\n"
    )
    env = {**__import__("os").environ,
           "PYTHONPATH": f"{dists.root}:{EXAMPLES / 'int8kit'}"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("]")[0] + "]" == str(
        ["int8kit::dequantize_rows", "int8kit::quantize_rows", "int8kit::quantize_with_scales",
         "int8kit::row_scales"])
    assert proc.stdout.strip().endswith("True")


# -- int8kit: a kernel for every device, and a Triton candidate with a fallback ----------


def test_int8kit_row_scales_is_one_kernel_for_every_device(int8kit):
    """``device_types="default"``: CompositeExplicitAutograd beside its fake; opcheck, compile."""
    from int8kit.ops import row_scales

    assert not int8kit.errors, int8kit.errors
    op = int8kit.op("int8kit::row_scales")
    assert {(k.kernel.key, k.status) for k in op.kernels} == {
        ("CompositeExplicitAutograd", "active"), ("Meta", "active")}
    for args, kwargs in resolve_ref(op.op.samples)():
        torch.library.opcheck(torch.ops.int8kit.row_scales.default, args, kwargs)
    x = torch.randn(3, 10)
    torch.testing.assert_close(row_scales(x), x.abs().amax(-1, keepdim=True) / 127)
    assert row_scales(x.to("meta")).shape == (3, 1)  # meta tensors: the fake kernel
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: torch.ops.int8kit.row_scales(t) * 2, fullgraph=True)
    torch.testing.assert_close(compiled(x), x.abs().amax(-1, keepdim=True) / 127 * 2)


def _reference_quantize(x, scale):
    return torch.floor(x.float() / scale.float() + 0.5).clamp(-127, 127).to(torch.int8)


def test_int8kit_triton_candidates_and_their_fallback_in_the_plan(int8kit):
    """On a machine without a GPU the plain kernel serves; the plan says why each candidate
    does or does not: the CUDA Triton candidate waits for a GPU (its capability is asked on
    the first call there), the CPU one declines outside Triton's interpreter."""
    assert not int8kit.errors, int8kit.errors
    op = int8kit.op("int8kit::quantize_with_scales")
    rows = [(k.kernel.key, k.status, k.kernel.fn, k.kernel.kind.name == "triton")
            for k in op.kernels
            if k.kernel.key in ("CPU", "CUDA")]
    triton_ref = "int8kit.triton_quant:quantize_with_scales"
    # candidates first, in the order they are tried; the plain kernel last
    assert [(key, fn == triton_ref, triton) for key, _, fn, triton in rows] == [
        ("CPU", True, True), ("CPU", False, False), ("CUDA", True, True), ("CUDA", False, False)]
    statuses = {(key, triton): status for key, status, _, triton in rows}
    if HAS_TRITON:
        assert statuses[("CPU", True)] == "active"  # with its per-call predicate
    else:
        assert statuses[("CPU", True)] in ("unmet", "inactive")
    assert statuses[("CPU", False)] == "active"
    if not torch.cuda.is_available():
        assert statuses[("CUDA", True)] != "active" and statuses[("CUDA", False)] != "active"
    # the samples (contiguous and not) through opcheck; eager equals the reference
    for args, kwargs in resolve_ref(op.op.samples)():
        torch.library.opcheck(torch.ops.int8kit.quantize_with_scales.default, args, kwargs)
        assert torch.equal(torch.ops.int8kit.quantize_with_scales(*args), _reference_quantize(*args))
    x = torch.randn(6, 33)
    scale = torch.ops.int8kit.row_scales(x)
    torch._dynamo.reset()
    compiled = torch.compile(
        lambda t, s: torch.ops.int8kit.quantize_with_scales(t, s).float() * s, fullgraph=True)
    torch.testing.assert_close(compiled(x, scale), _reference_quantize(x, scale).float() * scale)


def test_int8kit_show_says_why_each_candidate_serves_or_not(dists):
    """`opregistry show` on this (GPU-less or GPU) machine, through the real CLI."""
    name = dists.make("int8kit", version="0.1.0", ops={"int8kit": "int8kit.ops:lib"})
    env = {**__import__("os").environ, "OPREGISTRY_PLUGINS": ",".join([*BACKENDS, name]),
           "PYTHONPATH": f"{dists.root}:{EXAMPLES / 'int8kit'}"}
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([sys.executable, "-m", "opregistry", "show",
                           "int8kit::quantize_with_scales"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [" ".join(line.split()) for line in proc.stdout.splitlines()]
    triton_ref = "int8kit.triton_quant:quantize_with_scales"
    [cuda_triton] = [x for x in lines if x.startswith("CUDA") and triton_ref in x]
    [cpu_triton] = [x for x in lines if x.startswith("CPU") and triton_ref in x]
    [cpu_plain] = [x for x in lines if x.startswith("CPU") and "int8kit.ops" in x]
    # KEY KIND STATUS KERNEL ...
    assert "candidate 2, fallback" in cpu_plain and cpu_plain.split()[1:3] == ["device", "active"]
    if HAS_TRITON:
        assert cpu_triton.split()[1:3] == ["triton", "active"] and "candidate 1" in cpu_triton
        assert "per call: int8kit.triton_quant:interpreted" in cpu_triton
    else:
        assert cpu_triton.split()[1] == "triton" and cpu_triton.split()[2] != "active"
    if not torch.cuda.is_available():
        assert cuda_triton.split()[1:3] == ["triton", "unavailable"], cuda_triton


INT8KIT_TRITON_PROBE = """
import json, sys, torch, opregistry
with opregistry.kernel_counts() as counts:
    reg = opregistry.load(plugins=sys.argv[1].split(","))
    x = torch.randn(5, 77)
    scale = torch.ops.int8kit.row_scales(x)
    q = torch.ops.int8kit.quantize_with_scales(x, scale)
    xt = x.double().t().contiguous().t()
    qt = torch.ops.int8kit.quantize_with_scales(xt, scale.double())
    compiled = torch.compile(lambda a, s: torch.ops.int8kit.quantize_with_scales(a, s),
                             backend="aot_eager", fullgraph=True)
    qc = compiled(x, scale)
    torch.library.opcheck(torch.ops.int8kit.quantize_with_scales.default, (x, scale))
ref = torch.floor(x / scale + 0.5).clamp(-127, 127).to(torch.int8)
print(json.dumps({"errors": [str(p) for p in reg.errors], "q": torch.equal(q, ref),
                  "qt": torch.equal(qt, ref), "compiled": torch.equal(qc, ref),
                  "rows": [[r[0], r[1], r[2], r[3]] for r in counts.rows]}))
"""


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed "
                    "(requirements-dev.txt installs it on Linux)")
def test_int8kit_triton_kernel_serves_cpu_calls_under_the_interpreter(dists):
    """TRITON_INTERPRET=1: the CPU Triton candidate takes the calls (its predicate), and
    computes what the plain kernel does, contiguous or not; compile and opcheck pass."""
    from .test_kinds import _needs_interpreter_launch

    _needs_interpreter_launch()
    name = dists.make("int8kit", version="0.1.0", ops={"int8kit": "int8kit.ops:lib"})
    env = {**__import__("os").environ, "TRITON_INTERPRET": "1", "OPREGISTRY_AUTOLOAD": "0",
           "PYTHONPATH": __import__("os").pathsep.join(
               [str(dists.root), str(EXAMPLES / "int8kit"), *sys.path])}
    done = subprocess.run([sys.executable, "-c", INT8KIT_TRITON_PROBE, ",".join([*BACKENDS, name])],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["errors"] == [] and result["q"] and result["qt"] and result["compiled"]
    served = {(op, kernel.split(" ")[0]): calls for op, key, kernel, calls in result["rows"]
              if key == "CPU"}
    assert served[("int8kit::quantize_with_scales",
                   "int8kit.triton_quant:quantize_with_scales")] >= 2
    assert ("int8kit::quantize_with_scales", "int8kit.ops:quantize_with_scales") not in served
