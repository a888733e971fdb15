"""Declarations only; kernels are ``"module:function"`` references."""

from opregistry import OpLibrary

K = "nnkit_contrib.kernels"
S = "nnkit_contrib.samples"

#: new ops in a namespace another distribution owns (nnkit): a FRAGMENT may
#: add ops, never redefine one nnkit defines.
fragment = OpLibrary("nnkit", "FRAGMENT")

fragment.define(
    "gelu_and_mul(Tensor x) -> Tensor",
    kernels={"cpu": f"{K}:gelu_and_mul", "cuda": f"{K}:gelu_and_mul"},
    fake=f"{K}:gelu_and_mul_fake",
    autograd=(f"{K}:gelu_and_mul_backward", f"{K}:save_x"),
    vmap=f"{K}:gelu_and_mul_vmap",
    samples=f"{S}:gelu_and_mul",
    tags=["pt2_compliant_tag"],
    doc="gelu(x[..., :d]) * x[..., d:] with d = x.shape[-1] // 2",
)

fragment.define(
    "fused_add_rms_norm(Tensor(a!) x, Tensor(b!) residual, Tensor weight, float eps=1e-06) -> ()",
    mutates_args=["x", "residual"],
    kernels={"cpu": f"{K}:fused_add_rms_norm", "cuda": f"{K}:fused_add_rms_norm"},
    fake=f"{K}:fused_add_rms_norm_fake",
    samples=f"{S}:fused_add_rms_norm",
    doc="residual += x; x = rms_norm(residual, weight, eps), both in place",
)

#: kernels only, for an op nnkit defines: nnkit has no CUDA kernel for nms,
#: so this is the only one for (nnkit::nms, CUDA) and needs no override.
cuda_kernels = OpLibrary("nnkit", "IMPL")
cuda_kernels.impl("nnkit::nms", "cuda", "nnkit_contrib.cuda_nms:nms")
