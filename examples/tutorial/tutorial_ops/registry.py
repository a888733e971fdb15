"""The declarations: schemas and kernel references only, no torch import."""

from opregistry import OpLibrary

lib = OpLibrary("tutorial", description="ops of the PyTorch custom C++/Python ops tutorial")

K = "tutorial_ops.kernels"
S = "tutorial_ops.samples"

lib.define(
    "numpy_sin(Tensor x) -> Tensor",
    kernels={"cpu": f"{K}:numpy_sin"},
    fake=f"{K}:same_like_first",
    autograd=(f"{K}:numpy_sin_backward", f"{K}:save_inputs"),
    vmap=f"{K}:numpy_sin_vmap",
    samples=f"{S}:numpy_sin",
    doc="sin computed by NumPy (the tutorial's 'wrap a third-party library' op)",
)

lib.define(
    "muladd(Tensor a, Tensor b, float c) -> Tensor",
    kernels={"cpu": f"{K}:muladd", "cuda": f"{K}:muladd"},
    fake=f"{K}:muladd_fake",
    autograd=(f"{K}:muladd_backward", f"{K}:save_inputs"),
    vmap=f"{K}:muladd_vmap",
    samples=f"{S}:muladd",
    tags=["pt2_compliant_tag"],
    doc="a * b + c",
)

lib.define(
    "add_out(Tensor a, Tensor b, Tensor(a!) out) -> ()",
    mutates_args=["out"],
    kernels={"cpu": f"{K}:add_out"},
    fake=f"{K}:add_out_fake",
    samples=f"{S}:add_out",
    doc="out = a + b, in place",
)
