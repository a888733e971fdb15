"""The declarations of nnkit: schemas and kernel references, nothing imported.

This is the lazy, declarative style: ``opregistry list`` reads this module
without importing torch; kernels (``nnkit.kernels``), the Triton CUDA kernel
(``nnkit.triton_kernels``) and sample inputs (``nnkit.samples``) are imported
only when opregistry registers them with torch.
"""

from opregistry import OpLibrary, installed_torch

lib = OpLibrary("nnkit", description="ops that model code registers: norms, activations, NMS, ...")

K = "nnkit.kernels"
S = "nnkit.samples"

# A normalization with every piece: CPU kernel, a Triton kernel for CUDA,
# fake (for torch.compile / torch.export), autograd and a vmap rule.
lib.define(
    "rms_norm(Tensor x, Tensor weight, float eps=1e-06) -> Tensor",
    kernels={"cpu": f"{K}:rms_norm", "cuda": "nnkit.triton_kernels:rms_norm"},
    fake=f"{K}:rms_norm_fake",
    autograd=(f"{K}:rms_norm_backward", f"{K}:rms_norm_setup"),
    vmap=f"{K}:rms_norm_vmap",
    samples=f"{S}:rms_norm",
    tags=["pt2_compliant_tag"],
    doc="x / sqrt(mean(x**2, -1) + eps) * weight",
)

# A fused activation (vLLM's gated MLP): silu(x[..., :d]) * x[..., d:].
lib.define(
    "silu_and_mul(Tensor x) -> Tensor",
    kernels={"cpu": f"{K}:silu_and_mul", "cuda": f"{K}:silu_and_mul"},
    fake=f"{K}:silu_and_mul_fake",
    autograd=(f"{K}:silu_and_mul_backward", f"{K}:save_x"),
    vmap=f"{K}:silu_and_mul_vmap",
    samples=f"{S}:silu_and_mul",
    tags=["pt2_compliant_tag"],
    doc="silu(x[..., :d]) * x[..., d:] with d = x.shape[-1] // 2",
)

# Its out= overload: writes into a caller-provided buffer, returns it.  torch compiles an
# op that returns the tensor it mutates from 2.13, where such an out= variant is tagged
# `out` (torch.Tag.out); nnkit supports torch>=2.8 and declares the overload where the
# installed torch has that tag.  installed_torch() reads torch's files: no torch import.
_TORCH = installed_torch()
if _TORCH is None or "out" in _TORCH.tags:
    lib.define(
        "silu_and_mul.out(Tensor x, *, Tensor(a!) out) -> Tensor(a!)",
        mutates_args=["out"],
        kernels={"cpu": f"{K}:silu_and_mul_out", "cuda": f"{K}:silu_and_mul_out"},
        fake=f"{K}:silu_and_mul_out_fake",
        samples=f"{S}:silu_and_mul_out",
        tags=["out"],
        doc="silu_and_mul written into `out`",
    )

# Data-dependent output size: how many boxes survive depends on the values.
# Only a CPU kernel here; the nnkit-contrib distribution adds a CUDA one.
lib.define(
    "nms(Tensor boxes, Tensor scores, float iou_threshold) -> Tensor",
    kernels={"cpu": f"{K}:nms"},
    fake=f"{K}:nms_fake",
    samples=f"{S}:nms",
    doc="indices of the boxes kept by greedy non-maximum suppression, by descending score",
)

# A mutating op: updates a running-average buffer in place.
lib.define(
    "ema_update(Tensor(a!) average, Tensor value, float decay) -> ()",
    mutates_args=["average"],
    kernels={"cpu": f"{K}:ema_update", "cuda": f"{K}:ema_update"},
    fake=f"{K}:ema_update_fake",
    samples=f"{S}:ema_update",
    doc="average = decay * average + (1 - decay) * value, in place",
)

# A factory op: no tensor argument, so the `device` argument picks the kernel.
lib.define(
    "rope_cache(int max_positions, int rotary_dim, float base=10000.0, *, "
    "ScalarType? dtype=None, Device? device=None) -> Tensor",
    kernels={"cpu": f"{K}:rope_cache", "cuda": f"{K}:rope_cache"},
    fake=f"{K}:rope_cache_fake",
    samples=f"{S}:rope_cache",
    doc="the [max_positions, rotary_dim] cos|sin table of rotary position embeddings",
)

# Wrapping a third-party library: torch has no interp, NumPy does.
lib.define(
    "interp(Tensor x, Tensor xp, Tensor fp) -> Tensor",
    kernels={"cpu": f"{K}:interp"},
    fake=f"{K}:interp_fake",
    autograd=(f"{K}:interp_backward", f"{K}:save_inputs"),
    vmap=f"{K}:interp_vmap",
    samples=f"{S}:interp",
    doc="numpy.interp: piecewise-linear interpolation of (xp, fp) at x",
)
