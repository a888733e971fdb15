"""What opregistry knows about torch without importing it: dispatch keys, namespaces, tags.

Kernels name the dispatch key they implement.  Op authors may use the
device-type spelling (``"cpu"``, ``"cuda"``) or the name of the feature
(``"fake"``, ``"autograd"``, ``"vmap"``); the records store torch's own
dispatch-key name.  A key in :data:`KNOWN_KEYS` whose backend is not
installed makes its kernels *inactive*; any other key is an error.

The other torch facts the resolver needs before torch is imported live here
too: the namespaces torch owns (:data:`RESERVED_NAMESPACES`) and the
``torch.Tag`` members (:data:`KNOWN_TAGS`).  ``tests/test_torch_state.py``
compares them with a fresh ``import torch``.
"""

from __future__ import annotations

import difflib

__all__ = [
    "DEVICE_KEYS",
    "FUNCTIONALITY_KEYS",
    "KNOWN_KEYS",
    "ALIASES",
    "PROVIDERS",
    "FEATURES",
    "RESERVED_NAMESPACES",
    "KNOWN_TAGS",
    "canonical_key",
    "suggest_key",
    "is_known_key",
    "provider_hint",
]

#: torch dispatch keys a kernel can be declared for.  Device keys first, then
#: the functionality keys opregistry's own backends serve.
DEVICE_KEYS: dict[str, str] = {
    "CPU": "cpu",
    "CUDA": "cuda",
    "HIP": "hip",
    "XPU": "xpu",
    "MPS": "mps",
    "MTIA": "mtia",
    "HPU": "hpu",
    "XLA": "xla",
    "Lazy": "lazy",
    "IPU": "ipu",
    "MAIA": "maia",
    "VE": "ve",
    "Vulkan": "vulkan",
    "PrivateUse1": "privateuseone",
}
FUNCTIONALITY_KEYS: tuple[str, ...] = ("Meta", "Autograd", "FuncTorchBatched")
KNOWN_KEYS: frozenset[str] = frozenset(DEVICE_KEYS) | frozenset(FUNCTIONALITY_KEYS)

ALIASES: dict[str, str] = {
    **{device: key for key, device in DEVICE_KEYS.items()},
    "privateuse1": "PrivateUse1",
    "fake": "Meta",
    "meta": "Meta",
    "abstract": "Meta",
    "autograd": "Autograd",
    "vmap": "FuncTorchBatched",
    "batched": "FuncTorchBatched",
}

#: The distribution that serves a key, named when its kernels are inactive.
PROVIDERS: dict[str, str] = {
    "CPU": "opregistry-cpu",
    "CUDA": "opregistry-cuda",
    "Meta": "opregistry-meta",
    "Autograd": "opregistry-autograd",
    "FuncTorchBatched": "opregistry-vmap",
}

#: Human names of the functionality keys, for listings.
FEATURES: dict[str, str] = {"Meta": "fake", "Autograd": "autograd", "FuncTorchBatched": "vmap"}


def canonical_key(key: str) -> str:
    """torch's name for ``key`` (``"cuda"`` -> ``"CUDA"``); unknown keys pass through."""
    if key in KNOWN_KEYS:
        return key
    # exact spellings only: "CPu" is a typo to report, not a key to guess
    return ALIASES.get(key, key)


def is_known_key(key: str) -> bool:
    return key in KNOWN_KEYS


def suggest_key(key: str) -> str:
    """A "did you mean" suffix for an unknown key, or a list of the known ones."""
    candidates = sorted(KNOWN_KEYS | set(ALIASES))
    close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
    if not close:
        close = difflib.get_close_matches(key.lower(), [c.lower() for c in candidates], n=1)
        close = [c for c in candidates if close and c.lower() == close[0]][:1]
    if close:
        return f"did you mean {canonical_key(close[0])!r}?"
    return "known keys: " + ", ".join(sorted(KNOWN_KEYS))


def provider_hint(key: str) -> str:
    """What to install to activate kernels for ``key``."""
    dist = PROVIDERS.get(key)
    if dist:
        return f"pip install {dist}"
    return f"install an opregistry backend that serves {key}"


#: Namespaces torch owns; no distribution may DEF or FRAGMENT them.
RESERVED_NAMESPACES: frozenset[str] = frozenset(
    {
        "_",
        "aten",
        "prim",
        "prims",
        "quantized",
        "_quantized",
        "sparse",
        "mkl",
        "mkldnn",
        "mkldnn_prepacked",
        "onednn",
        "inductor",
        "inductor_prims",
        "higher_order",
        "debugprims",
        "rngprims",
        "profiler",
        "c10d",
        "_c10d_functional",
        "_c10d_functional_autograd",
        "_dtensor",
        "symm_mem",
        "export",
        "_native",
        "_test",
        "quantization",
        "static_runtime",
        "debug_mode_ops",
        # defined by torch's Python modules when they are first imported
        # (torch.compile, torch.distributed, torch.onnx, flex attention), so
        # the dispatcher shows them only after a compile / export has run
        "_inductor_test",
        "c10d_functional",
        "cplib",
        "flex_lib",
        "fsdp",
        "onnx",
        "onnx_symbolic",
        "quantized_decomposed",
        "streams",
    }
)

#: ``torch.Tag`` members (torch 2.13); a tag outside them is an error.
KNOWN_TAGS: frozenset[str] = frozenset(
    {
        "core",
        "cudagraph_unsafe",
        "data_dependent_output",
        "dynamic_output_shape",
        "flexible_layout",
        "generated",
        "inplace",
        "inplace_view",
        "maybe_aliasing_or_mutating",
        "needs_contiguous_strides",
        "needs_exact_strides",
        "needs_fixed_stride_order",
        "nondeterministic_bitwise",
        "nondeterministic_seeded",
        "out",
        "out_variant",
        "pointwise",
        "pt2_compliant_tag",
        "reduction",
        "view_copy",
    }
)
