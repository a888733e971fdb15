"""The dispatch keys opregistry knows, without importing torch.

Kernels name the dispatch key they implement.  Op authors may use the
device-type spelling (``"cpu"``, ``"cuda"``) or the name of the feature
(``"fake"``, ``"autograd"``, ``"vmap"``); the records store torch's own
dispatch-key name.  A key in :data:`KNOWN_KEYS` whose backend is not
installed makes its kernels *inactive*; any other key is an error.
"""

from __future__ import annotations

import difflib

__all__ = ["KNOWN_KEYS", "ALIASES", "PROVIDERS", "canonical_key", "suggest_key", "is_known_key"]

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
