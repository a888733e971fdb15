"""The example op packages' device kernels, run for real on every device this machine has.

Every test is parametrized over the device: ``cpu`` always runs (it proves the
test's own logic against the CPU kernels), ``cuda`` is marked ``cuda`` and
skipped without a GPU (``benchmarks/gpu.sh`` runs this file on one).  The
kernels checked are the ones the example packages declare for CUDA:

- nnkit's Triton ``rms_norm``; its torch kernels ``silu_and_mul``, ``ema_update``,
  the factory ``rope_cache``; nnkit-contrib's ``gelu_and_mul``,
  ``fused_add_rms_norm`` and its IMPL kernel for ``nnkit::nms``;
- tutorial's ``muladd``; extension_cpp's native ``mymuladd`` / ``mymul`` /
  ``myadd_out`` (``csrc/muladd.cu`` on a GPU: float32 and float64 only);
- int8kit's ``quantize_with_scales`` (a Triton candidate for compute capability
  >= 8.0 in front of a plain kernel), loaded through a temporary dist-info as
  tests/test_example_packages.py does (requirements-dev.txt does not install it).

Results are compared with plain-torch (or plain-Python) references computed in
float64 from the same rounded inputs, and on CUDA also with the op's CPU kernel.
Then: opcheck on the device (in process, float32 samples so that the Triton
path is the one checked) and ``opregistry check -d DEVICE``; autograd;
``torch.compile(fullgraph=True)``, default and (CUDA) ``mode="reduce-overhead"``;
``torch.export`` with device tensors reloaded in a fresh process; on CUDA a
CUDA graph captured and replayed, and ops called on a non-default stream.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F

import opregistry

from . import per_version
from .conftest import BACKENDS, load

HAS_CUDA = torch.cuda.is_available()
cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
#: the device parameter: cpu always, cuda marked ``cuda`` and skipped without a GPU
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, cuda], id="cuda")]
CUDA_ONLY = [pytest.param("cuda", marks=[pytest.mark.cuda, cuda], id="cuda")]
FLOATS = [pytest.param(t, id=str(t).removeprefix("torch.")) for t in
          (torch.float32, torch.float16, torch.bfloat16)]
#: extension_cpp's kernels (C++ and .cu) take float32 and float64 only
NATIVE_FLOATS = [pytest.param(t, id=str(t).removeprefix("torch."))
                 for t in (torch.float32, torch.float64)]
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
#: the installed op distributions with a CUDA kernel (int8kit is added per test)
OP_DISTS = ["tutorial-ops", "nnkit", "nnkit-contrib", "extension-cpp"]

#: tolerances of a kernel that computes in float32 and rounds once or twice to ``dtype``,
#: against a float64 reference: about two units in the last place
TOL = {
    torch.float64: {"rtol": 1e-9, "atol": 1e-12},
    torch.float32: {"rtol": 1e-4, "atol": 1e-5},
    torch.float16: {"rtol": 4e-3, "atol": 2e-3},
    torch.bfloat16: {"rtol": 3e-2, "atol": 2e-2},
}


def _rand(*shape: int, dtype: torch.dtype, device: str, seed: int = 0,
          scale: float = 1.0) -> torch.Tensor:
    """Seeded normal values, drawn on the CPU (the same on every device), rounded to ``dtype``."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype).to(device)


def _close(got: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, device: str) -> None:
    """``got`` (on ``device``, in ``dtype``) is ``expected`` (a float64 reference) to the
    tolerance of ``dtype``."""
    assert got.device.type == device, got.device
    assert got.dtype == dtype, got.dtype
    torch.testing.assert_close(got.cpu().double(), expected.cpu().double(), **TOL[dtype])


def _same_on_cpu(got: torch.Tensor, op: Callable[..., Any], *args: Any, dtype: torch.dtype,
                 **kwargs: Any) -> None:
    """On a GPU, the device kernel agrees with the op's CPU kernel on the same inputs."""
    if got.device.type == "cpu":
        return
    moved = [a.cpu() if isinstance(a, torch.Tensor) else a for a in args]
    on_cpu = op(*moved, **kwargs)
    torch.testing.assert_close(got.cpu().double(), on_cpu.double(), **TOL[dtype])


@pytest.fixture(scope="module")
def registry(installed):
    """The installed registry, loaded without an error (every example op package admitted)."""
    assert not installed.errors, [str(p) for p in installed.errors]
    return installed


def _cuda_kernel_is_live(registry: Any, qualname: str, fn: str | None = None) -> None:
    """On a GPU the op's CUDA kernel (``fn``, where given) is active and torch holds it."""
    kernel = registry.op(qualname).kernel("CUDA")
    assert kernel.status in ("active", "native"), (qualname, kernel.status)
    if fn is not None:
        assert kernel.kernel.fn == fn, (qualname, kernel.kernel.fn)
    assert torch._C._dispatch_has_kernel_for_dispatch_key(qualname.split(".")[0], "CUDA")


# -- float64 references, in plain torch ------------------------------------------------------


def ref_rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    x, w = x.cpu().double(), w.cpu().double()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def ref_silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    x = x.cpu().double()
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


def ref_gelu_and_mul(x: torch.Tensor) -> torch.Tensor:
    x = x.cpu().double()
    d = x.shape[-1] // 2
    return F.gelu(x[..., :d]) * x[..., d:]


def ref_rope_cache(n: int, dim: int, base: float) -> torch.Tensor:
    inv_freq = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    freqs = torch.outer(torch.arange(n, dtype=torch.float64), inv_freq)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)


def ref_nms(boxes: torch.Tensor, scores: torch.Tensor, threshold: float) -> list[int]:
    """Greedy NMS in plain Python floats (float64)."""
    rows, score = boxes.cpu().double().tolist(), scores.cpu().double().tolist()

    def iou(a: list[float], b: list[float]) -> float:
        w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
        h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
        inter = w * h
        union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
        return inter / union

    keep: list[int] = []
    for i in sorted(range(len(rows)), key=lambda i: -score[i]):
        if all(iou(rows[i], rows[j]) <= threshold for j in keep):
            keep.append(i)
    return keep


def ref_quantize(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return torch.floor(x.cpu().float() / scale.cpu().float() + 0.5).clamp(-127, 127).to(torch.int8)


# -- the kernels against the references, over shapes and dtypes ------------------------------

RMS_SHAPES = [pytest.param((1, 8), False, id="1x8"),
              pytest.param((4, 1000), False, id="4x1000"),
              pytest.param((2, 3, 64), False, id="2x3x64"),
              pytest.param((5, 48), True, id="5x48-transposed")]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape,transposed", RMS_SHAPES)
def test_rms_norm_matches_reference(registry, device, dtype, shape, transposed):
    """nnkit::rms_norm (Triton on CUDA) against float64 torch, contiguous or not."""
    if transposed:
        x = _rand(*reversed(shape), dtype=dtype, device=device, seed=1).t()
        assert not x.is_contiguous()
    else:
        x = _rand(*shape, dtype=dtype, device=device, seed=1)
    w = _rand(shape[-1], dtype=dtype, device=device, seed=2)
    got = torch.ops.nnkit.rms_norm(x, w, 1e-5)
    assert got.shape == x.shape and got.is_contiguous()
    _close(got, ref_rms_norm(x, w, 1e-5), dtype, device)
    _same_on_cpu(got, torch.ops.nnkit.rms_norm, x, w, 1e-5, dtype=dtype)
    if device == "cuda":
        _cuda_kernel_is_live(registry, "nnkit::rms_norm", "nnkit.triton_kernels:rms_norm")
        assert "nnkit.triton_kernels" in sys.modules  # the Triton kernel served, not torch's


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name,reference", [("silu_and_mul", ref_silu_and_mul),
                                            ("gelu_and_mul", ref_gelu_and_mul)])
def test_gated_activations_match_reference(registry, device, dtype, name, reference):
    """nnkit::silu_and_mul and nnkit-contrib's gelu_and_mul (FRAGMENT) against float64 torch."""
    op = getattr(torch.ops.nnkit, name)
    for seed, shape in enumerate([(3, 8), (2, 5, 130), (1, 2)]):
        x = _rand(*shape, dtype=dtype, device=device, seed=seed)
        got = op(x)
        assert got.shape == (*shape[:-1], shape[-1] // 2)
        _close(got, reference(x), dtype, device)
        _same_on_cpu(got, op, x, dtype=dtype)
    if device == "cuda":
        _cuda_kernel_is_live(registry, f"nnkit::{name}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOATS)
def test_in_place_ops_match_reference(registry, device, dtype):
    """nnkit::ema_update and nnkit::fused_add_rms_norm update their arguments in place."""
    average = _rand(4, 33, dtype=dtype, device=device, seed=3)
    value = _rand(4, 33, dtype=dtype, device=device, seed=4)
    expected = 0.75 * average.cpu().double() + 0.25 * value.cpu().double()
    before = average.data_ptr()
    assert torch.ops.nnkit.ema_update(average, value, 0.75) is None
    assert average.data_ptr() == before
    _close(average, expected, dtype, device)

    x = _rand(3, 64, dtype=dtype, device=device, seed=5)
    residual = _rand(3, 64, dtype=dtype, device=device, seed=6)
    w = _rand(64, dtype=dtype, device=device, seed=7)
    summed = x.cpu().double() + residual.cpu().double()
    # the kernel adds in dtype, then normalizes the rounded sum
    expected_x = ref_rms_norm(summed.to(dtype), w)
    torch.ops.nnkit.fused_add_rms_norm(x, residual, w)
    _close(residual, summed, dtype, device)
    _close(x, expected_x, dtype, device)
    if device == "cuda":
        _cuda_kernel_is_live(registry, "nnkit::ema_update")
        _cuda_kernel_is_live(registry, "nnkit::fused_add_rms_norm")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOATS)
def test_tutorial_muladd_matches_reference(registry, device, dtype):
    for seed, shape in enumerate([(7,), (3, 17), (2, 4, 8)]):
        a = _rand(*shape, dtype=dtype, device=device, seed=seed)
        b = _rand(*shape, dtype=dtype, device=device, seed=seed + 10)
        got = torch.ops.tutorial.muladd(a, b, 0.5)
        _close(got, a.cpu().double() * b.cpu().double() + 0.5, dtype, device)
        _same_on_cpu(got, torch.ops.tutorial.muladd, a, b, 0.5, dtype=dtype)
    if device == "cuda":
        _cuda_kernel_is_live(registry, "tutorial::muladd")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", NATIVE_FLOATS)
def test_extension_cpp_native_kernels_match_reference(registry, device, dtype):
    """extension_cpp's C++ ops; on a GPU the kernels compiled from csrc/muladd.cu."""
    if device == "cuda":
        for name in ("mymuladd", "mymul", "myadd_out"):
            assert torch._C._dispatch_has_kernel_for_dispatch_key(f"extension_cpp::{name}",
                                                                  "CUDA"), \
                f"extension_cpp::{name} has no CUDA kernel: was muladd.cu compiled?"
    ops = torch.ops.extension_cpp
    for seed, shape in enumerate([(5,), (3, 300), (0, 4)]):
        a = _rand(*shape, dtype=dtype, device=device, seed=seed)
        b = _rand(*shape, dtype=dtype, device=device, seed=seed + 20)
        ad, bd = a.cpu().double(), b.cpu().double()
        got = ops.mymuladd(a, b, 1.5)
        _close(got, ad * bd + 1.5, dtype, device)
        _same_on_cpu(got, ops.mymuladd, a, b, 1.5, dtype=dtype)
        _close(ops.mymul(a, b), ad * bd, dtype, device)
        out = torch.empty_like(a)
        assert ops.myadd_out(a, b, out) is None
        _close(out, ad + bd, dtype, device)
    # half precision is refused by the kernel itself, on every device
    with pytest.raises(RuntimeError, match="float|Float|dtype|scalar"):
        h = torch.ones(2, dtype=torch.float16, device=device)
        ops.mymuladd(h, h, 1.0)


def _grid_boxes(n: int, seed: int, dtype: torch.dtype, device: str
                ) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Boxes with small integer corners and scores k/64 (exact in bfloat16), and an IoU
    threshold at least 0.01 away from every pairwise IoU, so that rounding in ``dtype``
    cannot flip a comparison: every dtype has one right answer."""
    g = torch.Generator().manual_seed(seed)
    corners = torch.randint(0, 24, (n, 2), generator=g).double()
    sizes = torch.randint(1, 9, (n, 2), generator=g).double()
    boxes = torch.cat([corners, corners + sizes], dim=1)
    scores = (torch.randperm(n, generator=g).double() + 1) / 64
    ious = [0.0]
    for i in range(n):
        for j in range(i + 1, n):
            lt = torch.maximum(boxes[i, :2], boxes[j, :2])
            rb = torch.minimum(boxes[i, 2:], boxes[j, 2:])
            inter = (rb - lt).clamp(min=0).prod().item()
            union = (sizes[i].prod() + sizes[j].prod()).item() - inter
            ious.append(inter / union)
    # the lowest candidate clear of every IoU: the one that suppresses most
    clear = [t for t in (0.2 + 0.01 * k for k in range(50))
             if min(abs(t - v) for v in ious) > 0.01]
    assert clear, "no threshold far from every IoU"
    threshold = clear[0]
    return boxes.to(dtype).to(device), scores.to(dtype).to(device), threshold


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [*FLOATS, pytest.param(torch.float64, id="float64")])
def test_nms_matches_reference(registry, device, dtype):
    """nnkit::nms: nnkit's CPU kernel, nnkit-contrib's IMPL kernel on CUDA."""
    kept_some = False
    for n, seed in [(0, 1), (1, 2), (12, 3), (40, 4)]:
        boxes, scores, threshold = _grid_boxes(n, seed, dtype, device)
        got = torch.ops.nnkit.nms(boxes, scores, threshold)
        assert got.device.type == device and got.dtype == torch.long
        expected = ref_nms(boxes, scores, threshold)
        assert got.tolist() == expected, (n, threshold)
        kept_some |= 0 < len(expected) < n
        if device == "cuda":
            assert torch.ops.nnkit.nms(boxes.cpu(), scores.cpu(), threshold).tolist() == expected
    assert kept_some, "no sample suppressed a box: the test would not see a wrong kernel"
    if device == "cuda":
        _cuda_kernel_is_live(registry, "nnkit::nms", "nnkit_contrib.cuda_nms:nms")
        assert "nnkit_contrib.cuda_nms" in sys.modules


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOATS)
def test_rope_cache_factory_builds_on_the_device_argument(registry, device, dtype):
    """nnkit::rope_cache has no tensor argument: ``device=`` picks the kernel (BackendSelect)."""
    for n, dim, base in [(16, 8, 500.0), (3, 2, 10000.0)]:
        for where in (device, torch.device(device)):
            table = torch.ops.nnkit.rope_cache(n, dim, base, dtype=dtype, device=where)
            assert tuple(table.shape) == (n, dim)
            _close(table, ref_rope_cache(n, dim, base), dtype, device)
    if device == "cuda":
        _cuda_kernel_is_live(registry, "nnkit::rope_cache")


# -- int8kit: the decorator style, a Triton candidate and its fallback ------------------------


@pytest.fixture
def int8kit(dists, monkeypatch):
    """int8kit loaded through a real entry point in a temporary dist-info (as in
    tests/test_example_packages.py), inside ``opregistry.kernel_counts()``: the test sees
    which kernel served each call.  Yields ``(registry, counts)``."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.syspath_prepend(str(EXAMPLES / "int8kit"))
    name = dists.make("int8kit", version="0.1.0", ops={"int8kit": "int8kit.ops:lib"})
    with opregistry.kernel_counts() as counts:
        reg = load(dists, plugins=[*BACKENDS, name])
        assert not reg.errors, [str(p) for p in reg.errors]
        yield reg, counts
    for module in [m for m in sys.modules if m.split(".")[0] == "int8kit"]:
        del sys.modules[module]


def _assert_quantized(got: torch.Tensor, x: torch.Tensor, scale: torch.Tensor) -> None:
    """``got`` is the int8 quantization of ``x``: equal to the reference, except one step off
    where ``x / scale + 0.5`` lies within float32 rounding of an integer (a division that
    rounds differently lands on the other side of ``floor``)."""
    assert got.dtype == torch.int8 and got.shape == x.shape
    expected = ref_quantize(x, scale)
    diff = got.cpu().int() - expected.int()
    exact = x.cpu().double() / scale.cpu().double() + 0.5
    at_tie = (exact - exact.round()).abs() <= 1e-6 * exact.abs().clamp(min=1)
    assert bool((diff.abs() <= 1).all()), "off by more than one step"
    assert bool(at_tie[diff != 0].all()), f"{int((diff != 0).sum())} values differ off a tie"


@pytest.mark.parametrize("device", DEVICES)
def test_int8kit_quantize_kernels_match_reference(int8kit, device):
    """int8kit::quantize_with_scales over shapes and dtypes: on a GPU of capability >= 8.0
    the Triton candidate serves, on CPU (no interpreter) the plain kernel."""
    reg, counts = int8kit
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for seed, shape in enumerate([(4, 37), (2, 3, 256), (1, 1), (0, 5)]):
            x = _rand(*shape, dtype=dtype, device=device, seed=seed, scale=3.0)
            scale = torch.ops.int8kit.row_scales(x)
            assert scale.device.type == device and scale.shape == (*shape[:-1], 1)
            torch.testing.assert_close(
                scale.cpu().double(),
                (x.cpu().double().abs().amax(-1, keepdim=True).clamp(min=1e-12) / 127)
                if x.numel() else torch.empty(*shape[:-1], 1, dtype=torch.float64),
                **TOL[dtype])
            q = torch.ops.int8kit.quantize_with_scales(x, scale)
            assert q.device.type == device
            _assert_quantized(q, x, scale)
        # the decorator-style round trip, one kernel for every device
        x = _rand(6, 40, dtype=dtype, device=device, seed=9)
        q, s = torch.ops.int8kit.quantize_rows(x)
        back = torch.ops.int8kit.dequantize_rows(q, s, torch.float32)
        assert back.device.type == device
        # half a step, plus the rounding of x / scale in dtype (bfloat16: up to 0.5 of a step
        # near 127), plus the rounding of x itself
        steps = {torch.float32: 0.51, torch.float16: 0.6, torch.bfloat16: 1.01}[dtype]
        torch.testing.assert_close(back.cpu(), x.cpu().float(), rtol=0,
                                   atol=float(s.float().max()) * steps + TOL[dtype]["atol"])
    counts._end()  # the counts so far (the block stays open until the fixture ends)
    served = {(key, label.split(" ")[0]): calls for _, key, label, calls, _ in counts.rows}
    key = "CUDA" if device == "cuda" else "CPU"
    triton_ref = "int8kit.triton_quant:quantize_with_scales"
    plain_ref = "int8kit.ops:quantize_with_scales"
    if device == "cuda" and torch.cuda.get_device_capability() >= (8, 0):
        assert served.get((key, triton_ref), 0) >= 9, counts.rows
        assert (key, plain_ref) not in served, counts.rows
    else:
        assert served.get((key, plain_ref), 0) >= 9, counts.rows
        assert (key, triton_ref) not in served, counts.rows


# -- opcheck on the device -------------------------------------------------------------------


def _opcheck_cases(device: str) -> list[tuple[str, tuple[Any, ...], dict[str, Any]]]:
    """(op, args, kwargs) on ``device``: float32 (the Triton path of rms_norm), and float64
    with requires_grad for the ops with an autograd formula."""
    def f(*shape: int, seed: int = 0) -> torch.Tensor:
        return _rand(*shape, dtype=torch.float32, device=device, seed=seed)

    def d(*shape: int, seed: int = 0) -> torch.Tensor:
        return _rand(*shape, dtype=torch.float64, device=device, seed=seed).requires_grad_()

    boxes, scores, threshold = _grid_boxes(20, 5, torch.float32, device)
    return [
        ("nnkit::rms_norm", (f(4, 100), f(100, seed=1)), {}),
        ("nnkit::rms_norm", (f(2, 3, 16), f(16, seed=1), 1e-5), {}),
        ("nnkit::rms_norm", (d(3, 8), d(8, seed=1)), {}),
        ("nnkit::silu_and_mul", (f(3, 10),), {}),
        ("nnkit::silu_and_mul", (d(2, 6),), {}),
        ("nnkit::gelu_and_mul", (f(3, 10),), {}),
        ("nnkit::gelu_and_mul", (d(2, 6),), {}),
        ("nnkit::ema_update", (f(5), f(5, seed=1), 0.9), {}),
        ("nnkit::fused_add_rms_norm", (f(3, 8), f(3, 8, seed=1), f(8, seed=2)), {}),
        ("nnkit::nms", (boxes, scores, threshold), {}),
        ("nnkit::rope_cache", (8, 4, 100.0), {"dtype": torch.float32, "device": device}),
        ("tutorial::muladd", (f(6), f(6, seed=1), 2.0), {}),
        ("tutorial::muladd", (d(2, 3), d(2, 3, seed=1), 2.0), {}),
        ("extension_cpp::mymuladd", (f(6), f(6, seed=1), 2.0), {}),
        ("extension_cpp::mymuladd", (d(2, 3), d(2, 3, seed=1), -1.0), {}),
        ("extension_cpp::mymul", (d(4), d(4, seed=1)), {}),
        ("extension_cpp::myadd_out", (f(4), f(4, seed=1), f(4, seed=2)), {}),
    ]


OPCHECK_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor",
                 "test_aot_dispatch_dynamic")


def _overload(qualname: str) -> Any:
    ns, _, name = qualname.partition("::")
    return getattr(getattr(torch.ops, ns), name).default


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_on_the_device(registry, device):
    """torch.library.opcheck, all four utilities, on tensors of the device."""
    checked = set()
    for qualname, args, kwargs in _opcheck_cases(device):
        result = torch.library.opcheck(_overload(qualname), args, kwargs, test_utils=OPCHECK_UTILS)
        assert result == dict.fromkeys(OPCHECK_UTILS, "SUCCESS"), (qualname, result)
        checked.add(qualname)
    assert len(checked) == 11


@pytest.mark.parametrize("device", DEVICES)
def test_int8kit_opcheck_on_the_device(int8kit, device):
    x = _rand(4, 37, dtype=torch.float32, device=device, seed=1)
    scale = torch.ops.int8kit.row_scales(x)
    q, s = torch.ops.int8kit.quantize_rows(x)
    for overload, args in [(torch.ops.int8kit.quantize_with_scales.default, (x, scale)),
                           (torch.ops.int8kit.row_scales.default, (x,)),
                           (torch.ops.int8kit.quantize_rows.default, (x,)),
                           (torch.ops.int8kit.dequantize_rows.default,
                            (q, s.double().requires_grad_(), torch.float64))]:
        result = torch.library.opcheck(overload, args, test_utils=OPCHECK_UTILS)
        assert result == dict.fromkeys(OPCHECK_UTILS, "SUCCESS"), (overload, result)


#: the ops with a CUDA kernel, as `opregistry check` targets
CHECK_TARGETS = ["tutorial::muladd", "nnkit::rms_norm", "nnkit::silu_and_mul", "nnkit::nms",
                 "nnkit::ema_update", "nnkit::rope_cache", "nnkit::gelu_and_mul",
                 "nnkit::fused_add_rms_norm", "extension_cpp", "int8kit"]
CHECKED_OPS = {"tutorial::muladd", "nnkit::rms_norm", "nnkit::silu_and_mul", "nnkit::nms",
               "nnkit::ema_update", "nnkit::rope_cache", "nnkit::gelu_and_mul",
               "nnkit::fused_add_rms_norm", "extension_cpp::mymuladd", "extension_cpp::mymul",
               "extension_cpp::myadd_out", "int8kit::quantize_rows", "int8kit::dequantize_rows",
               "int8kit::row_scales", "int8kit::quantize_with_scales"}
if "out" in per_version.TORCH_TAGS:  # nnkit declares its out= overload from torch 2.13
    CHECKED_OPS.add("nnkit::silu_and_mul.out")


@pytest.mark.parametrize("device", DEVICES)
def test_opregistry_check_cli_on_the_device(dists, tmp_path, device):
    """`opregistry check -d DEVICE` in a fresh process: every op with a CUDA kernel (int8kit
    through a temporary dist-info) passes every opcheck utility on the device, and gradcheck."""
    name = dists.make("int8kit", version="0.1.0", ops={"int8kit": "int8kit.ops:lib"})
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("OPREGISTRY_") and k != "TRITON_INTERPRET"}
    env["OPREGISTRY_PLUGINS"] = ",".join([*BACKENDS, *OP_DISTS, name])
    env["PYTHONPATH"] = os.pathsep.join(
        [str(dists.root), str(EXAMPLES / "int8kit"), *filter(None, [os.environ.get("PYTHONPATH")])])
    proc = subprocess.run([sys.executable, "-m", "opregistry", "check", *CHECK_TARGETS,
                           "-d", device, "--json", "-q"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=500)
    assert proc.returncode == 0, (proc.stdout[-4000:], proc.stderr[-4000:])
    data = json.loads(proc.stdout)
    assert data["ok"] is True
    results = data["results"]
    assert {r["device"] for r in results} == {device}
    assert not [r for r in results if r["status"] == "fail"]
    ok = {(r["op"], r["check"]) for r in results if r["status"] == "ok"}
    assert {r["op"] for r in results} == CHECKED_OPS
    for op in CHECKED_OPS:
        assert {(op, util) for util in OPCHECK_UTILS} <= ok, op
    for op in ("nnkit::rms_norm", "tutorial::muladd", "extension_cpp::mymuladd",
               "int8kit::dequantize_rows"):
        assert (op, "gradcheck") in ok, op


# -- autograd ----------------------------------------------------------------------------------


def _grad_cases() -> list[tuple[str, Callable[..., torch.Tensor], Callable[..., torch.Tensor],
                                 list[tuple[int, ...]]]]:
    """(name, op, float64 reference, input shapes)."""
    def ref_muladd(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a * b + 0.5

    return [
        ("rms_norm", lambda x, w: torch.ops.nnkit.rms_norm(x, w), ref_rms_norm, [(3, 40), (40,)]),
        ("silu_and_mul", torch.ops.nnkit.silu_and_mul, ref_silu_and_mul, [(4, 12)]),
        ("gelu_and_mul", torch.ops.nnkit.gelu_and_mul, ref_gelu_and_mul, [(4, 12)]),
        ("muladd", lambda a, b: torch.ops.tutorial.muladd(a, b, 0.5), ref_muladd,
         [(2, 9), (2, 9)]),
        ("mymuladd", lambda a, b: torch.ops.extension_cpp.mymuladd(a, b, 0.5), ref_muladd,
         [(2, 9), (2, 9)]),
    ]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", _grad_cases(), ids=lambda c: c[0])
def test_autograd_matches_reference(registry, device, case):
    """float32 gradients on the device (the Triton forward for rms_norm) equal float64 torch's,
    and gradcheck passes in float64 on the device."""
    name, op, reference, shapes = case
    inputs = [_rand(*s, dtype=torch.float32, device=device, seed=i).requires_grad_()
              for i, s in enumerate(shapes)]
    out = op(*inputs)
    assert out.device.type == device and out.requires_grad
    upstream = _rand(*out.shape, dtype=torch.float32, device=device, seed=99)
    grads = torch.autograd.grad(out, inputs, upstream)
    ref_inputs = [t.detach().cpu().double().requires_grad_() for t in inputs]
    ref_grads = torch.autograd.grad(reference(*ref_inputs), ref_inputs, upstream.cpu().double())
    for got, expected in zip(grads, ref_grads):
        _close(got, expected, torch.float32, device)
    doubles = [t.detach().double().requires_grad_() for t in inputs]
    assert torch.autograd.gradcheck(op, doubles)


# -- torch.compile and torch.export ----------------------------------------------------------


class Block(torch.nn.Module):
    """A layer of the example ops (and aten ops between them for the compiler to fuse)."""

    def __init__(self, width: int, device: str) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(_rand(width, dtype=torch.float32, device=device, seed=7))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = torch.ops.nnkit.rms_norm(x, self.weight)
        g = torch.ops.nnkit.silu_and_mul(h)
        e = torch.ops.nnkit.gelu_and_mul(h)
        m = torch.ops.tutorial.muladd(g, e, 0.5)
        n = torch.ops.extension_cpp.mymuladd(m, y, -1.0)
        return torch.tanh(n) * 2 + y


BLOCK_OPS = {"nnkit.rms_norm.default", "nnkit.silu_and_mul.default", "nnkit.gelu_and_mul.default",
             "tutorial.muladd.default", "extension_cpp.mymuladd.default"}


def _block_inputs(device: str, seed: int, rows: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    return (_rand(rows, 32, dtype=torch.float32, device=device, seed=seed),
            _rand(rows, 16, dtype=torch.float32, device=device, seed=seed + 1))


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph_default_matches_eager(registry, device):
    """torch.compile(fullgraph=True) with the default backend (inductor): one graph, forward
    and backward equal eager's."""
    torch._dynamo.reset()
    block = Block(32, device)
    compiled = torch.compile(block, fullgraph=True)
    for seed in (0, 10):
        x, y = _block_inputs(device, seed)
        xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
        expected = block(xe, y)
        got = compiled(xc, y)
        assert got.device.type == device
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
        (ge,) = torch.autograd.grad(expected.sum(), xe)
        (gc,) = torch.autograd.grad(got.sum(), xc)
        torch.testing.assert_close(gc, ge, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("device", CUDA_ONLY)
def test_compile_reduce_overhead_matches_eager(registry, device):
    """mode="reduce-overhead" (CUDA graphs through inductor): replays equal eager, with no
    CUDA-graph skip."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    block = Block(32, device).requires_grad_(False)
    compiled = torch.compile(block, fullgraph=True, mode="reduce-overhead")
    for seed in range(5):  # warm-up, recording, then replays
        x, y = _block_inputs(device, seed)
        got = compiled(x, y).clone()  # the next replay overwrites the graph's output
        torch.testing.assert_close(got, block(x, y), rtol=1e-4, atol=1e-5)
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])


EXPORT_RELOAD = """
import json, sys
import torch
ep = torch.export.load(sys.argv[1])
x, y = torch.load(sys.argv[2])
out = ep.module()(x, y)
torch.save(out.cpu(), sys.argv[3])
print(json.dumps({"device": out.device.type,
                  "tests_imported": any(m.split(".")[0] == "tests" for m in sys.modules)}))
"""


@pytest.mark.parametrize("device", DEVICES)
def test_export_with_device_tensors_reloads_in_a_fresh_process(registry, device, tmp_path):
    """torch.export with device tensors, torch.export.save here; torch.export.load in a new
    process (where `import torch` loads the installed op packages) runs it on the device."""
    block = Block(32, device).requires_grad_(False)
    x, y = _block_inputs(device, 3)
    ep = torch.export.export(block, (x, y))
    targets = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert BLOCK_OPS <= targets, targets
    expected = block(x, y)
    torch.testing.assert_close(ep.module()(x, y), expected)
    program, inputs, output = tmp_path / "block.pt2", tmp_path / "inputs.pt", tmp_path / "out.pt"
    torch.export.save(ep, program)
    torch.save((x, y), inputs)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPREGISTRY_")}
    proc = subprocess.run([sys.executable, "-c", EXPORT_RELOAD, str(program), str(inputs),
                           str(output)], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {"device": device, "tests_imported": False}
    torch.testing.assert_close(torch.load(output), expected.cpu())


# -- CUDA only: graphs and streams -----------------------------------------------------------


@pytest.mark.parametrize("device", CUDA_ONLY)
def test_cuda_graph_capture_and_replay_matches_eager(registry, int8kit, device):
    """A module of the example ops (Triton, torch and .cu kernels, and int8kit's Triton
    candidate) captured in a CUDA graph; replays on new inputs equal eager."""
    block = Block(32, device).requires_grad_(False)

    def step(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = block(x, y)
        q = torch.ops.int8kit.quantize_with_scales(out, torch.ops.int8kit.row_scales(out))
        return out, q

    static_x, static_y = _block_inputs(device, 0)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: Triton compiles, lazy imports, first calls
        for _ in range(3):
            step(static_x, static_y)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out, static_q = step(static_x, static_y)
    for seed in (1, 2, 3):
        x, y = _block_inputs(device, seed * 10)
        static_x.copy_(x)
        static_y.copy_(y)
        graph.replay()
        torch.cuda.synchronize()
        out, q = step(x, y)
        torch.testing.assert_close(static_out, out)
        assert torch.equal(static_q, q)


def _stream_cases(device: str) -> list[tuple[str, Callable[[torch.Tensor], Any],
                                            Callable[[torch.Tensor], Any]]]:
    """(name, op of x, reference of x): each op reads x, which the stream writes first."""
    w = _rand(64, dtype=torch.float32, device=device, seed=1)
    other = _rand(8, 64, dtype=torch.float32, device=device, seed=2)

    def nms(x: torch.Tensor) -> torch.Tensor:
        boxes = torch.cat([x[:, :2].abs() * 4, x[:, :2].abs() * 4 + 1 + x[:, 2:4].abs() * 4], 1)
        return torch.ops.nnkit.nms(boxes, x[:, 4].abs(), 0.3)

    def nms_ref(x: torch.Tensor) -> list[int]:
        x = x.cpu().double()
        boxes = torch.cat([x[:, :2].abs() * 4, x[:, :2].abs() * 4 + 1 + x[:, 2:4].abs() * 4], 1)
        return ref_nms(boxes, x[:, 4].abs(), 0.3)

    return [
        ("rms_norm (Triton)", lambda x: torch.ops.nnkit.rms_norm(x, w),
         lambda x: ref_rms_norm(x, w)),
        ("silu_and_mul", torch.ops.nnkit.silu_and_mul, ref_silu_and_mul),
        ("muladd", lambda x: torch.ops.tutorial.muladd(x, other, 0.5),
         lambda x: x.cpu().double() * other.cpu().double() + 0.5),
        ("mymuladd (.cu)", lambda x: torch.ops.extension_cpp.mymuladd(x, other, 0.5),
         lambda x: x.cpu().double() * other.cpu().double() + 0.5),
        ("nms (contrib)", nms, nms_ref),
        ("quantize_with_scales (Triton)",
         lambda x: torch.ops.int8kit.quantize_with_scales(x, torch.full_like(x[:, :1], 0.05)),
         lambda x: ref_quantize(x, torch.full((x.shape[0], 1), 0.05))),
    ]


@pytest.mark.parametrize("device", CUDA_ONLY)
def test_ops_run_on_the_current_non_default_stream(registry, int8kit, device):
    """Each op's kernels are enqueued on the current (non-default) stream: the stream first
    sleeps, then writes the op's input; an op launched on another stream would read the old
    input and return the wrong values."""
    side = torch.cuda.Stream()
    assert side != torch.cuda.default_stream()
    for name, op, reference in _stream_cases(device):
        x = torch.zeros(8, 64, device=device)
        fresh = _rand(8, 64, dtype=torch.float32, device=device, seed=5)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.cuda._sleep(50_000_000)  # tens of milliseconds of GPU time, on `side`
            x.copy_(fresh)
            got = op(x)
        side.synchronize()
        expected = reference(fresh)
        if isinstance(expected, list):
            assert got.tolist() == expected, name
        elif expected.dtype == torch.int8:
            _assert_quantized(got, fresh, torch.full((8, 1), 0.05))
        else:
            torch.testing.assert_close(got.cpu().double(), expected, rtol=1e-4, atol=1e-5,
                                       msg=lambda m, name=name: f"{name}: {m}")


def test_cpu_reference_helpers_can_fail():
    """The references and tolerances reject a wrong kernel: a kernel off by a little more than
    the tolerance, or keeping one box too many, fails the comparisons used above."""
    x = _rand(4, 16, dtype=torch.float32, device="cpu", seed=1)
    w = _rand(16, dtype=torch.float32, device="cpu", seed=2)
    good = torch.ops.nnkit.rms_norm(x, w)
    _close(good, ref_rms_norm(x, w), torch.float32, "cpu")
    with pytest.raises(AssertionError):
        _close(good * (1 + 1e-3), ref_rms_norm(x, w), torch.float32, "cpu")
    boxes, scores, threshold = _grid_boxes(40, 4, torch.float32, "cpu")
    expected = ref_nms(boxes, scores, threshold)
    assert 0 < len(expected) < 40
    assert ref_nms(boxes, scores, 1.0) == sorted(range(40), key=lambda i: -float(scores[i]))
    assert torch.ops.nnkit.nms(boxes, scores, threshold).tolist() == expected
    q = ref_quantize(x, torch.full((4, 1), 0.01))
    _assert_quantized(q, x, torch.full((4, 1), 0.01))
    with pytest.raises(AssertionError):
        _assert_quantized((q.int() + 1).clamp(-127, 127).to(torch.int8), x,
                          torch.full((4, 1), 0.01))
    assert math.isclose(float(ref_rope_cache(2, 2, 10.0)[1, 0]), math.cos(1.0))
