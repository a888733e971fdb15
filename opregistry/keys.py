"""What opregistry knows about torch without importing it: dispatch keys, namespaces, tags.

Kernels name the dispatch key they implement.  Op authors may use the
device-type spelling (``"cpu"``, ``"cuda"``) or the name of the feature
(``"fake"``, ``"autograd"``, ``"vmap"``); the records store torch's own
dispatch-key name.  Autocast rules use torch's ``Autocast<Device>`` keys
(:data:`AUTOCAST_KEYS`); ``torch_dispatch`` rules use one key per class,
``TorchDispatch[module:Class]``, all served by the backend of the
:data:`TORCH_DISPATCH` family (:func:`family`).  A key in :data:`KNOWN_KEYS` whose backend is not
installed makes its kernels *inactive*; any other key is an error.

The other torch facts the resolver needs before torch is imported live here
too, per release of the supported range: the namespaces torch owns
(:data:`RESERVED_NAMESPACES`), the ``torch.Tag`` members (:data:`TAG_SINCE`,
:func:`tags_of`), and what the schema language of each release takes: its types
(:data:`SCHEMA_TYPES`, :data:`TYPE_SINCE`, :data:`TYPE_UNTIL`), the dtype names of
``ScalarType`` defaults (:data:`DTYPE_SINCE`), the device types of ``Device`` defaults
(:data:`DEVICE_TYPES`) and the custom classes torch registers (:data:`TORCH_CLASSES`);
:func:`installed_torch` reads the installed torch's version and tag list from its files,
without importing it.
``tests/test_torch_state.py`` compares them with a fresh ``import torch``.
"""

from __future__ import annotations

import functools
import os
import re
import sys
import types
from typing import Iterable, NamedTuple

__all__ = [
    "DEVICE_KEYS",
    "FUNCTIONALITY_KEYS",
    "AUTOCAST_KEYS",
    "AUTOCAST_DTYPES",
    "TORCH_DISPATCH",
    "autocast_key",
    "torch_dispatch_key",
    "family",
    "COMPOSITE_KEYS",
    "KNOWN_KEYS",
    "ALIASES",
    "PROVIDERS",
    "FEATURES",
    "RESERVED_NAMESPACES",
    "NAMESPACE_SINCE",
    "LAZY_NAMESPACES",
    "LATE_NAMESPACES",
    "KNOWN_TAGS",
    "ALL_TAGS",
    "TAG_SINCE",
    "TYPE_SINCE",
    "TYPE_UNTIL",
    "SCHEMA_TYPES",
    "FAKE_INT_TYPES",
    "DEVICE_TYPES",
    "DTYPE_SINCE",
    "TORCH_CLASSES",
    "CUDA_CLASSES",
    "CLASS_PREFIX",
    "OPS_NAMESPACE_ATTRIBUTES",
    "TorchFacts",
    "installed_torch",
    "installed_torch_build",
    "installed_torch_dir",
    "TORCH_OPS_ATTRIBUTES",
    "OP_NAMESPACE_ATTRIBUTES",
    "OP_PACKET_ATTRIBUTES",
    "unreachable_name",
    "PYTHON_DUNDERS",
    "tags_of",
    "tag_since",
    "type_since",
    "type_until",
    "types_lacking",
    "all_dtype_names",
    "dtypes_lacking",
    "class_known",
    "shadowed_op_name",
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
#: torch's autocast dispatch keys, with the device type ``register_autocast`` takes for
#: each: the device types for which torch has both autocast and an ``Autocast<Key>``
#: (XLA, MTIA and MAIA have autocast but no such key in torch 2.13, so
#: ``register_autocast`` cannot serve them)
AUTOCAST_KEYS: dict[str, str] = {
    "AutocastCPU": "cpu",
    "AutocastCUDA": "cuda",
    "AutocastXPU": "xpu",
    "AutocastMPS": "mps",
    "AutocastHPU": "hpu",
    "AutocastIPU": "ipu",
    "AutocastPrivateUse1": "privateuseone",
}
#: the ``torch.dtype`` names an autocast rule may cast floating inputs to, by spelling
AUTOCAST_DTYPES: dict[str, str] = {
    "float16": "float16", "half": "float16", "bfloat16": "bfloat16",
    "float32": "float32", "float": "float32", "float64": "float64", "double": "float64",
}
#: the key family of ``register_torch_dispatch`` rules: a kernel's key is
#: ``TorchDispatch[module:Class]``, one per (op, class), as torch allows one rule each
TORCH_DISPATCH = "TorchDispatch"
_TORCH_DISPATCH_KEY = re.compile(
    r"TorchDispatch\[[A-Za-z_][\w]*(\.[A-Za-z_]\w*)*:[A-Za-z_<>][\w<>]*(\.[A-Za-z_<>][\w<>]*)*\]\Z")
#: torch's alias keys for one kernel that serves every device: ``CompositeExplicitAutograd``
#: (a kernel of its own; a device kernel beside it wins for its device, an Autograd
#: formula for gradients) and ``CompositeImplicitAutograd`` (built from other ops:
#: autograd and fake come from the ops it calls)
COMPOSITE_KEYS: tuple[str, ...] = ("CompositeExplicitAutograd", "CompositeImplicitAutograd")
KNOWN_KEYS: frozenset[str] = (frozenset(DEVICE_KEYS) | frozenset(FUNCTIONALITY_KEYS)
                              | frozenset(COMPOSITE_KEYS) | frozenset(AUTOCAST_KEYS)
                              | frozenset({TORCH_DISPATCH}))

ALIASES: dict[str, str] = {
    **{device: key for key, device in DEVICE_KEYS.items()},
    "privateuse1": "PrivateUse1",
    "fake": "Meta",
    "meta": "Meta",
    "abstract": "Meta",
    "autograd": "Autograd",
    "vmap": "FuncTorchBatched",
    "batched": "FuncTorchBatched",
    # torch.library.impl(..., "default") and custom_op(device_types=None): every device
    "default": "CompositeExplicitAutograd",
}

#: The distribution that serves a key, named when its kernels are inactive.
PROVIDERS: dict[str, str] = {
    "CPU": "opregistry-cpu",
    "CUDA": "opregistry-cuda",
    "Meta": "opregistry-meta",
    "Autograd": "opregistry-autograd",
    "FuncTorchBatched": "opregistry-vmap",
    **dict.fromkeys(AUTOCAST_KEYS, "opregistry-autocast"),
    TORCH_DISPATCH: "opregistry-torch-dispatch",
    # a composite kernel is a plain Library.impl of a Python function, as a CPU
    # kernel is, and every op package already depends on opregistry-cpu
    # (docs/op-authors.md#kernels-for-every-device)
    "CompositeExplicitAutograd": "opregistry-cpu",
    "CompositeImplicitAutograd": "opregistry-cpu",
}

#: Human names of the functionality keys, for listings.
FEATURES: dict[str, str] = {"Meta": "fake", "Autograd": "autograd", "FuncTorchBatched": "vmap"}


def autocast_key(device_type: str) -> str | None:
    """``"AutocastCPU"`` for ``"cpu"``; ``None`` for a device type torch has no autocast key for."""
    for key, device in AUTOCAST_KEYS.items():
        if device == device_type:
            return key
    return None


def torch_dispatch_key(class_ref: str) -> str:
    """The key of a ``register_torch_dispatch`` rule for the class ``module:Class``."""
    return f"{TORCH_DISPATCH}[{class_ref}]"


def family(key: str) -> str:
    """The key a backend serves for ``key``: ``TorchDispatch`` for every rule's key, else ``key``."""
    return TORCH_DISPATCH if key.startswith(TORCH_DISPATCH + "[") else key


def canonical_key(key: str) -> str:
    """torch's name for ``key`` (``"cuda"`` -> ``"CUDA"``); unknown keys pass through."""
    if key in KNOWN_KEYS:
        return key
    # exact spellings only: "CPu" is a typo to report, not a key to guess
    return ALIASES.get(key, key)


def is_known_key(key: str) -> bool:
    return key in KNOWN_KEYS or bool(_TORCH_DISPATCH_KEY.match(key))


def suggest_key(key: str) -> str:
    """A "did you mean" suffix for an unknown key, or a list of the known ones."""
    candidates = sorted(KNOWN_KEYS | set(ALIASES))
    import difflib  # here: only a mistake needs it

    close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
    if not close:
        close = difflib.get_close_matches(key.lower(), [c.lower() for c in candidates], n=1)
        close = [c for c in candidates if close and c.lower() == close[0]][:1]
    if close:
        return f"did you mean {canonical_key(close[0])!r}?"
    return "known keys: " + ", ".join(sorted(KNOWN_KEYS))


def provider_hint(key: str) -> str:
    """What to install to activate kernels for ``key``."""
    dist = PROVIDERS.get(family(key))
    if dist:
        return f"pip install {dist}"
    return f"install an opregistry backend that serves {key}"


#: torch.Tag members of torch 2.8 (and 2.9): tags.yaml == torch/_C/__init__.pyi's Tag enum
_TAGS_2_8: frozenset[str] = frozenset({
    "core", "cudagraph_unsafe", "data_dependent_output", "dynamic_output_shape",
    "flexible_layout", "generated", "inplace_view", "maybe_aliasing_or_mutating",
    "needs_contiguous_strides", "needs_exact_strides", "needs_fixed_stride_order",
    "nondeterministic_bitwise", "nondeterministic_seeded", "pointwise", "pt2_compliant_tag",
    "view_copy",
})
#: tags added after 2.8, with the first release that has them (none removed up to 2.15)
TAG_SINCE: dict[str, tuple[int, int]] = {
    "reduction": (2, 10),
    "out_variant": (2, 11),
    "inplace": (2, 13),
    "out": (2, 13),
}
#: every tag some supported release knows: a tag outside it is a typo, on any torch
ALL_TAGS: frozenset[str] = _TAGS_2_8 | frozenset(TAG_SINCE)

#: The named types of torch's schema language (the type table of
#: ``schema_type_parser.cpp``; ``Tensor`` is its own rule), every one some supported
#: release takes.  Not readable from torch's files (the parser is C++), so tables,
#: checked against the installed torch by tests/test_torch_state.py and
#: tests/test_schema_differential.py.
SCHEMA_TYPES: frozenset[str] = frozenset({
    "int", "SymInt", "float", "complex", "bool", "SymBool", "str", "Scalar", "ScalarType",
    "Layout", "MemoryFormat", "Device", "DeviceIndex", "Generator", "Storage", "Stream",
    "QScheme", "Quantizer", "ConstQuantizerPtr", "Dimname", "None", "NoneType", "Capsule", "Any",
    "AnyClassType", "AnyEnumType", "PyObject",
})
#: the types torch's schema parser reads as an ``int`` where it needs a value (defaults,
#: Union members): its "fake" type of them
FAKE_INT_TYPES: frozenset[str] = frozenset({
    "SymInt", "ScalarType", "Layout", "MemoryFormat", "DeviceIndex", "ConstQuantizerPtr"})
#: schema types that the parser of some supported release refuses ("unknown type
#: specifier"), with the first release that accepts them.  SymBool: 2.8.0 refuses it,
#: 2.9.1, 2.10.0, 2.11.0, 2.12.1, 2.13.0 and 2.15.0 accept it.  A release not checked
#: (2.14) counts as the last one checked before it: nothing the resolver accepts is
#: refused by torch.
TYPE_SINCE: dict[str, tuple[int, int]] = {
    "SymBool": (2, 9),
    "PyObject": (2, 12),  # 2.12.1 only: 2.11.0 and 2.13.0 refuse it (and TYPE_UNTIL)
}
#: schema types the parser of later releases refuses, with the last release known to take
#: them: ``Dimname`` (named tensors' dimension names) is in the tables of 2.8.0 to 2.12.1,
#: not in 2.13.0's nor 2.15.0's
TYPE_UNTIL: dict[str, tuple[int, int]] = {
    "Dimname": (2, 12),
    "PyObject": (2, 12),
}

#: what a ``Device`` default may name (``c10::Device``'s parser, 2.8 to 2.15 alike)
DEVICE_TYPES: frozenset[str] = frozenset({
    "cpu", "cuda", "ipu", "xpu", "mkldnn", "opengl", "opencl", "ideep", "hip", "ve", "fpga",
    "maia", "xla", "lazy", "vulkan", "mps", "meta", "hpu", "mtia", "privateuseone",
})
#: the dtype names a ``ScalarType`` default may use (``ScalarType x=bfloat16``): exactly the
#: ``torch.dtype`` attributes of torch 2.8 ...
_DTYPES_2_8: frozenset[str] = frozenset({
    "bfloat16", "bit", "bits16", "bits1x8", "bits2x4", "bits4x2", "bits8", "bool", "cdouble",
    "cfloat", "chalf", "complex128", "complex32", "complex64", "double", "float", "float16",
    "float32", "float4_e2m1fn_x2", "float64", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2",
    "float8_e5m2fnuz", "float8_e8m0fnu", "half", "int", "int1", "int16", "int2", "int3", "int32",
    "int4", "int5", "int6", "int64", "int7", "int8", "long", "qint32", "qint8", "quint2x4",
    "quint4x2", "quint8", "short", "uint1", "uint16", "uint2", "uint3", "uint32", "uint4",
    "uint5", "uint6", "uint64", "uint7", "uint8",
})
#: ... and those added since, with the first release known to have them (none removed)
DTYPE_SINCE: dict[str, tuple[int, int]] = {
    "bcomplex32": (2, 14),
}

#: The custom classes torch itself registers at ``import torch`` (the schema type
#: ``__torch__.torch.classes.NS.Class``), as ``NS.Class``: the first and last release known
#: to have each (``None``: every later one).  Classes that only CUDA builds register are in
#: :data:`CUDA_CLASSES`.  A class another library registers is known only once torch is
#: imported (:func:`opregistry.torch_state.has_class`).
TORCH_CLASSES: dict[str, tuple[tuple[int, int], tuple[int, int] | None]] = {
    **dict.fromkeys((
        "_nnapi.Compilation", "backendutils.BackendDebugInfo", "c10d.ProcessGroup",
        "c10d.ReduceOp", "c10d.Work", "dist_rpc.WorkerInfo", "mkldnn.ConvOpContext",
        "profiler._RecordFunction", "profiling.InstructionStats", "profiling.SourceRef",
        "profiling.SourceStats", "profiling._ScriptProfile", "quantized.Conv2dPackedParamsBase",
        "quantized.Conv3dPackedParamsBase", "quantized.EmbeddingPackedParamsBase",
        "quantized.LinearPackedParamsBase", "rnn.CellParamsBase", "sparse.LinearPackedParamsBase",
        "cuda.Event", "cuda.Stream",
    ), ((2, 8), None)),
    "aten.OpaqueObject": ((2, 10), None),
    "c10d.SymmetricMemory": ((2, 11), None),
    # XNNPACK's op contexts: in the wheels of 2.8 to 2.12.1, gone from 2.13's
    **dict.fromkeys(("xnnpack.Conv2dOpContext", "xnnpack.LinearOpContext",
                     "xnnpack.TransposeConv2dOpContext"), ((2, 8), (2, 12))),
}
CUDA_CLASSES: frozenset[str] = frozenset({"cuda.Event", "cuda.Stream"})
CLASS_PREFIX = "__torch__.torch.classes."

#: Attributes of a ``torch.ops.<ns>`` object besides its ops (torch._ops._OpNamespace, a
#: module): an op with one of these names is registered in C++, then ``Library.define``
#: fails refreshing ``torch.ops.<ns>.<name>`` ("'str' object has no attribute
#: '_qualified_op_name'").  A module's own attributes (``__name__``, ``__class__``...)
#: come from :func:`shadowed_op_name`.
OPS_NAMESPACE_ATTRIBUTES: frozenset[str] = frozenset({
    "name", "_dir", "__file__", "__getattr__", "__iter__"})

#: namespaces torch's dispatcher holds right after ``import torch`` (CUDA wheels of PyPI and
#: the 2.13 CPU wheel), with the first release of the range that has them (2.8 = "all")
NAMESPACE_SINCE: dict[str, tuple[int, int]] = {
    **dict.fromkeys((
        "_c10d_functional", "_c10d_functional_autograd", "_dtensor", "_quantized", "_test",
        "aten", "c10d", "debugprims", "export", "inductor", "mkl", "mkldnn", "mkldnn_prepacked",
        "onednn", "prims", "profiler", "quantization", "quantized", "rngprims", "sparse",
        "static_runtime", "symm_mem",
        "prepacked",  # 2.8 (XNNPACK prepacked ops); gone by 2.13
    ), (2, 8)),
    # absent from 2.8; present after `import torch` in 2.13 (CPU wheel) and 2.15
    **dict.fromkeys(("_native", "debug_mode_ops", "inductor_prims"), (2, 13)),
    # torch/fx/experimental/proxy_tensor.py (coor::current_device...) and
    # torch/_higher_order_ops/flex_gemm.py, from 2.14
    **dict.fromkeys(("coor", "flex_gemm"), (2, 14)),
    # torch._native's AOT kernels (_native_aot::...), from 2.15; fsdp is defined at import too
    **dict.fromkeys(("_native_aot", "fsdp"), (2, 15)),
}

#: namespaces ``import torch`` defines after its device-backend autoload (the last line of
#: torch/__init__.py, ``import torch._native``): a load at ``import torch`` never sees their ops,
#: a later one does; the resolver is shown neither (no op package may use them: reserved), so
#: that the plan does not depend on when it was made
LATE_NAMESPACES: frozenset[str] = frozenset({"_native", "_native_aot"})

#: namespaces torch's Python modules define when they are first imported (torch.compile,
#: torch.distributed, torch.onnx, flex attention), and "_" -- never in a fresh dispatcher
LAZY_NAMESPACES: frozenset[str] = frozenset({
    "_", "_inductor_test", "c10d_functional", "cplib", "flex_lib", "onnx", "onnx_symbolic",
    "quantized_decomposed", "streams", "higher_order", "prim",
    "mempool",  # 2.15: torch._dynamo.variables.memory's custom_ops (mempool::begin, ::end)
})


class TorchFacts(NamedTuple):
    version: str            # "2.8.0" (no local label)
    release: tuple[int, int]
    tags: frozenset[str]
    source: str             # where the tags were read from


def _release(version: str) -> tuple[int, int]:
    major, minor = (int(p) for p in re.findall(r"\d+", version)[:2])
    return major, minor


def tags_of(release: tuple[int, int]) -> frozenset[str]:
    """torch.Tag members of a release, from the table."""
    return _TAGS_2_8 | {t for t, since in TAG_SINCE.items() if release >= since}


def tag_since(tag: str) -> str | None:
    """``"2.13"`` for ``"out"``; ``None`` for tags every supported release has, or no release."""
    since = TAG_SINCE.get(tag)
    return None if since is None else f"{since[0]}.{since[1]}"


def _dotted(release: tuple[int, int] | None) -> str | None:
    return None if release is None else f"{release[0]}.{release[1]}"


def type_since(base: str) -> str | None:
    """``"2.9"`` for ``"SymBool"``; ``None`` for types every supported release parses."""
    return _dotted(TYPE_SINCE.get(base))


def type_until(base: str) -> str | None:
    """``"2.12"`` for ``"Dimname"`` (the last release known to parse it); ``None`` for types
    no supported release has dropped."""
    return _dotted(TYPE_UNTIL.get(base))


def types_lacking(bases: Iterable[str], release: tuple[int, int]) -> list[str]:
    """The schema base types among ``bases`` that ``release``'s schema parser refuses, sorted."""
    return sorted({b for b in bases if (b in TYPE_SINCE and release < TYPE_SINCE[b])
                   or (b in TYPE_UNTIL and release > TYPE_UNTIL[b])})


def all_dtype_names() -> frozenset[str]:
    """Every dtype name a ``ScalarType`` default may use on some supported release."""
    return _ALL_DTYPES


_ALL_DTYPES = _DTYPES_2_8 | frozenset(DTYPE_SINCE)


def dtypes_lacking(names: Iterable[str], release: tuple[int, int]) -> list[str]:
    """The dtype names among ``names`` that ``release`` does not have, sorted."""
    return sorted({n for n in names if n in DTYPE_SINCE and release < DTYPE_SINCE[n]})


def class_known(name: str, release: tuple[int, int], cuda: bool) -> bool:
    """Whether torch ``release`` registers custom class ``name`` (``NS.Class``) at import;
    ``cuda``: a CUDA build (:func:`installed_torch_build`)."""
    span = TORCH_CLASSES.get(name)
    if span is None or (name in CUDA_CLASSES and not cuda):
        return False
    return span[0] <= release and (span[1] is None or release <= span[1])


def shadowed_op_name(name: str) -> bool:
    """Whether ``torch.ops.<ns>.<name>`` is an attribute of the namespace object rather than
    the op: ``Library.define`` fails for such an op after registering it."""
    return name in OPS_NAMESPACE_ATTRIBUTES or (name[:2] == "__" and hasattr(_PROBE_MODULE, name))


class _ProbeModule(types.ModuleType):
    """Stands in for ``torch.ops.<ns>`` (a module) when asking which names it has."""


_PROBE_MODULE = _ProbeModule("torch.ops.probe")


def _torch_dir() -> str | None:
    """torch's package directory, found without importing torch."""
    import importlib.util

    torch = sys.modules.get("torch")
    if torch is not None and getattr(torch, "__file__", None):
        return os.path.dirname(torch.__file__)
    spec = importlib.util.find_spec("torch")  # a top-level package: nothing is imported
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def installed_torch_dir() -> str | None:
    """The folder of the installed ``torch`` package, found without importing it."""
    return _torch_dir()


@functools.lru_cache(maxsize=4)
def _facts(torch_dir: str, stamp: int) -> TorchFacts | None:
    """Cached per torch installation (its version.py's mtime changes when pip replaces it)."""
    try:
        with open(os.path.join(torch_dir, "version.py"), encoding="utf-8") as fh:
            found = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)", fh.read(), re.M)
    except OSError:
        return None
    if found is None:
        return None
    version = found.group(1).partition("+")[0]
    release = _release(version)
    tags_yaml = os.path.join(os.path.dirname(torch_dir), "torchgen", "packaged", "ATen", "native",
                             "tags.yaml")
    try:
        with open(tags_yaml, encoding="utf-8") as fh:
            # a YAML list of "- tag: NAME" entries: no YAML parser needed
            tags = frozenset(re.findall(r"^- tag: (\w+)\s*$", fh.read(), re.M))
        source = tags_yaml
    except OSError:
        tags, source = frozenset(), "table"
    if not tags:
        tags, source = tags_of(release), "table"
    return TorchFacts(version, release, tags, source)


def installed_torch() -> TorchFacts | None:
    """The installed torch's version and tags, without importing it; ``None`` without torch."""
    torch_dir = _torch_dir()
    if torch_dir is None:
        return None
    try:
        stamp = os.stat(os.path.join(torch_dir, "version.py")).st_mtime_ns
    except OSError:
        return None
    return _facts(torch_dir, stamp)


def installed_torch_build() -> tuple[str, str | None] | None:
    """The installed torch's full version (``"2.13.0+cpu"``) and CUDA version, from its files.

    Read from ``torch/version.py`` without importing torch (what a native
    library's recorded build is compared with before it is loaded); ``None``
    without torch.
    """
    torch_dir = _torch_dir()
    if torch_dir is None:
        return None
    try:
        with open(os.path.join(torch_dir, "version.py"), encoding="utf-8") as fh:
            text = fh.read()
    except OSError:
        return None
    version = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)", text, re.M)
    cuda = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]+)", text, re.M)
    if version is None:
        return None
    return version.group(1), (cuda.group(1) if cuda else None)


#: Names ``torch.ops.<name>`` cannot reach as a namespace: attributes of ``torch.ops``
#: itself (``torch._ops._Ops``: an instance of ``types.ModuleType``), found before its
#: ``__getattr__`` makes a namespace.  The same on 2.8, 2.13 and 2.15 (dunders aside:
#: :data:`PYTHON_DUNDERS`).
TORCH_OPS_ATTRIBUTES: frozenset[str] = frozenset({
    "_dir", "higher_order", "import_module", "load_library", "loaded_libraries"})
#: The dunder names ``torch.ops`` and a namespace object (``_OpNamespace``, a
#: ``types.ModuleType``) answer themselves on any supported Python (3.10 to 3.14):
#: those of a module and of a class defined in Python, and ``__origin__`` and
#: ``__self__``, which the namespace refuses.  Any other dunder (``__and__``, an op of
#: ``aten``) reaches the op as any name does.
PYTHON_DUNDERS: frozenset[str] = frozenset({
    "__annotate__", "__annotations__", "__class__", "__delattr__", "__dict__", "__dir__",
    "__doc__", "__eq__", "__file__", "__firstlineno__", "__format__", "__ge__", "__getattr__",
    "__getattribute__", "__getstate__", "__gt__", "__hash__", "__init__", "__init_subclass__",
    "__iter__", "__le__", "__loader__", "__lt__", "__module__", "__name__", "__ne__", "__new__",
    "__origin__", "__package__", "__reduce__", "__reduce_ex__", "__repr__", "__self__",
    "__setattr__", "__sizeof__", "__slots__", "__spec__", "__static_attributes__", "__str__",
    "__subclasshook__", "__weakref__"})
#: Names ``torch.ops.<ns>.<name>`` cannot reach as an op: attributes of a namespace
#: object (``torch._ops._OpNamespace``); ``Library.define`` of such a name fails inside
#: torch (``'str' object has no attribute '_qualified_op_name'``).  Same on 2.8-2.15.
OP_NAMESPACE_ATTRIBUTES: frozenset[str] = frozenset({"_dir", "name"})
#: Names ``torch.ops.<ns>.<op>.<name>`` cannot reach as an overload: attributes of an
#: op packet (``torch._ops.OpOverloadPacket``; ``op_overloads`` from 2.13), and
#: ``default``, which torch refuses as an overload name.  ``_is_protocol`` is
#: ``typing.Generic``'s, the packet's base, on Python < 3.12 only.
OP_PACKET_ATTRIBUTES: frozenset[str] = frozenset({
    "_dir", "_has_torchbind_op_overload", "_op", "_overload_names",
    "_qualified_op_name", "_schemas", "default", "op", "op_overloads", "overloads",
    *(("_is_protocol",) if sys.version_info < (3, 12) else ())})


def unreachable_name(name: str, kind: str) -> str | None:
    """Why ``torch.ops`` cannot reach ``name`` as a ``namespace``, ``op`` or ``overload``.

    ``None`` when it can.  A dunder name a Python object answers itself
    (:data:`PYTHON_DUNDERS`) is unreachable as a namespace or an op; an
    overload name starting with ``__`` always is (an op packet passes those to
    its C++ op).
    """
    table = {"namespace": (TORCH_OPS_ATTRIBUTES, "torch.ops"),
             "op": (OP_NAMESPACE_ATTRIBUTES, "torch.ops.<namespace>"),
             "overload": (OP_PACKET_ATTRIBUTES, "torch.ops.<namespace>.<op>")}[kind]
    names, owner = table
    if kind == "overload" and name.startswith("__"):
        return (f"which torch.ops cannot reach ({owner} looks a name starting with '__' up "
                f"on its C++ op, never as an overload)")
    if name in PYTHON_DUNDERS:
        return f"which torch.ops cannot reach (a dunder name {owner} answers itself)"
    if name in names:
        if kind == "overload" and name == "default":
            return ("which torch refuses as an overload name ('default' names the overload "
                    "without a name)")
        return f"which torch.ops cannot reach ({owner}.{name} is an attribute of torch's own)"
    return None


#: Namespaces torch owns, in any release of the supported range; no distribution
#: may DEF or FRAGMENT them.  The union, not the installed release's: a package
#: that claims ``coor`` works beside torch 2.13 but not beside 2.14.
RESERVED_NAMESPACES: frozenset[str] = frozenset(NAMESPACE_SINCE) | LAZY_NAMESPACES | frozenset(
    {'_', '_c10d_functional', '_c10d_functional_autograd', '_dtensor', '_inductor_test', '_native', '_quantized', '_test', 'aten', 'c10d', 'c10d_functional', 'cplib', 'debug_mode_ops', 'debugprims', 'export', 'flex_lib', 'fsdp', 'higher_order', 'inductor', 'inductor_prims', 'mkl', 'mkldnn', 'mkldnn_prepacked', 'onednn', 'onnx', 'onnx_symbolic', 'prim', 'prims', 'profiler', 'quantization', 'quantized', 'quantized_decomposed', 'rngprims', 'sparse', 'static_runtime', 'streams', 'symm_mem'})

#: ``torch.Tag`` members of any supported release; a tag outside them is an error
#: (a typo) on any torch, one the installed torch lacks is refused naming the release
KNOWN_TAGS: frozenset[str] = ALL_TAGS
