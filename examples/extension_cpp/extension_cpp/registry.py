"""The declarations: the native library, its schemas and keys, the Python pieces. No torch import."""

from opregistry import NativeLibrary, OpLibrary, installed_torch_build

from . import _build

# what the build recorded (torch version, C++ ABI, CUDA); nothing when the
# library is built at its first load, for the running torch
native = NativeLibrary.from_build_info(_build.BUILD_INFO, module="extension_cpp._load")
_torch = installed_torch_build()
# the keys the TORCH_LIBRARY_IMPL blocks fill: CUDA where muladd.cu was (or will be) compiled
KEYS = ["CPU", "CUDA"] if (native.cuda if native.torch else
                           _build.with_cuda(_torch[1] if _torch else None)) else ["CPU"]

lib = OpLibrary("extension_cpp", native=native,
                description="the C++ custom-ops tutorial's ops: C++ kernels, Python fake and "
                            "autograd")

P = "extension_cpp.ops"

lib.define(
    "mymuladd(Tensor a, Tensor b, float c) -> Tensor",
    native=KEYS,
    fake=f"{P}:mymuladd_fake",
    autograd=(f"{P}:mymuladd_backward", f"{P}:mymuladd_setup_context"),
    samples=f"{P}:mymuladd_samples",
    doc="a * b + c",
)

lib.define(
    "mymul(Tensor a, Tensor b) -> Tensor",
    native=KEYS,
    fake=f"{P}:mymul_fake",
    autograd=(f"{P}:mymul_backward", f"{P}:mymul_setup_context"),
    samples=f"{P}:mymul_samples",
    doc="a * b",
)

lib.define(
    "myadd_out(Tensor a, Tensor b, Tensor(a!) out) -> ()",
    native=KEYS,
    fake=f"{P}:myadd_out_fake",
    samples=f"{P}:myadd_out_samples",
    doc="out = a + b, in place",
)
