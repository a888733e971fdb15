"""Two tiny C++ libraries for the native-package tests, compiled once per torch and cached.

``SOURCE``: ``TORCH_LIBRARY(opregistry_native_test)`` (``NS``) defines
``twice`` (declared by the tests) and ``hidden`` (never declared: the
undeclared-op case), with CPU kernels.  ``RIVAL``: a second
``TORCH_LIBRARY(extension_cpp)``, the example package's namespace -- loaded
beside the example, torch would refuse it ("Only a single TORCH_LIBRARY can
be used to register the namespace"); the tests prove it never is.
``SWAP_ATEN`` and ``SWAP_OWN``: a ``TORCH_LIBRARY_IMPL`` each that replaces a
kernel torch already has (aten::add.Tensor's CPU kernel; ``twice``'s).  ``IMPL``,
``IMPL_EXTRA`` and ``FRAGMENT``: C++ kernels and ops for namespaces Python DEFs own
(``IMPL_NS``, ``FRAG_NS``), as IMPL and FRAGMENT libraries ship them; ``IMPL_META``:
a C++ Meta kernel for ``SOURCE``'s ``twice``, an IMPL library for a native DEF.
``FOREIGN``, ``FOREIGN_SINGLE`` and ``FOREIGN_EXTENSION``: ``TORCH_LIBRARY`` packages that do not use
opregistry, for the static scan of installed files.

Each is built in a subprocess, so that building does not load it into the
test process (``cpp_extension.load`` loads what it builds); both build at
once.  The builds land in ``$TMPDIR/opregistry-native-tests/torch-<version>``
and are reused by later sessions while the sources are unchanged (~15 s of
g++ per library the first time, well under a second after).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

NS = "opregistry_native_test"

SOURCE = r"""
#include <ATen/core/Tensor.h>
#include <ATen/ops/mul.h>
#include <torch/library.h>

static at::Tensor twice(const at::Tensor& x) { return at::mul(x, 2); }

TORCH_LIBRARY(opregistry_native_test, m) {
  m.def("twice(Tensor x) -> Tensor");
  m.def("hidden(Tensor x) -> Tensor");
}

TORCH_LIBRARY_IMPL(opregistry_native_test, CPU, m) {
  m.impl("twice", &twice);
  m.impl("hidden", &twice);
}
"""

RIVAL = r"""
#include <torch/library.h>

TORCH_LIBRARY(extension_cpp, m) {
  m.def("mymuladd(Tensor a, Tensor b, float c) -> Tensor");
}
"""

#: replaces the CPU kernel torch has for aten::add.Tensor (by a subtraction, so that the
#: replacement shows): load it only in a child process
SWAP_ATEN = r"""
#include <ATen/core/Tensor.h>
#include <ATen/ops/sub.h>
#include <torch/library.h>

static at::Tensor add(const at::Tensor& a, const at::Tensor& b, const at::Scalar& alpha) {
  return at::sub(a, b, alpha);
}

TORCH_LIBRARY_IMPL(aten, CPU, m) { m.impl("add.Tensor", &add); }
"""

#: replaces the CPU kernel of ``SOURCE``'s ``twice`` (load that first) by one that computes
#: the same: harmless in the test process, yet a replacement of another package's kernel
SWAP_OWN = r"""
#include <ATen/core/Tensor.h>
#include <ATen/ops/mul.h>
#include <torch/library.h>

static at::Tensor twice(const at::Tensor& x) { return at::mul(x, 2); }

TORCH_LIBRARY_IMPL(opregistry_native_test, CPU, m) { m.impl("twice", &twice); }
"""

#: the namespaces the IMPL and FRAGMENT libraries below add to: Python DEFs of the tests
IMPL_NS = "opregistry_nimpl"
FRAG_NS = "opregistry_nfrag"

#: an IMPL library: a C++ CPU kernel for ``triple``, an op a Python DEF defines
IMPL = r"""
#include <ATen/core/Tensor.h>
#include <ATen/ops/mul.h>
#include <torch/library.h>

static at::Tensor triple(const at::Tensor& x) { return at::mul(x, 3); }

TORCH_LIBRARY_IMPL(opregistry_nimpl, CPU, m) { m.impl("triple", &triple); }
"""

#: an IMPL library that also registers a CPU kernel for ``quad`` (its package declares
#: only ``triple``'s): the undeclared-registration case
IMPL_EXTRA = r"""
#include <ATen/core/Tensor.h>
#include <ATen/ops/mul.h>
#include <torch/library.h>

static at::Tensor triple(const at::Tensor& x) { return at::mul(x, 3); }

TORCH_LIBRARY_IMPL(opregistry_nimpl, CPU, m) {
  m.impl("triple", &triple);
  m.impl("quad", &triple);
}
"""

#: a FRAGMENT library: ``halve`` added to a namespace a Python DEF owns
FRAGMENT = r"""
#include <ATen/core/Tensor.h>
#include <ATen/ops/mul.h>
#include <torch/library.h>

static at::Tensor halve(const at::Tensor& x) { return at::mul(x, 0.5); }

TORCH_LIBRARY_FRAGMENT(opregistry_nfrag, m) { m.def("halve(Tensor x) -> Tensor"); }

TORCH_LIBRARY_IMPL(opregistry_nfrag, CPU, m) { m.impl("halve", &halve); }
"""

#: an IMPL library for ``SOURCE``'s native DEF: a C++ Meta kernel for ``twice``
IMPL_META = r"""
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

static at::Tensor twice_meta(const at::Tensor& x) { return at::empty_like(x); }

TORCH_LIBRARY_IMPL(opregistry_native_test, Meta, m) { m.impl("twice", &twice_meta); }
"""

#: a package that does not use opregistry (tests/test_foreign_scan.py): a DEF with two ops (one
#: an overload), a FRAGMENT of a second namespace (its schema spelt qualified), IMPL blocks for
#: both (the namespaces have underscores, the keys none: the scanner reads them back from the
#: symbol names; the unqualified schema strings could belong to either namespace)
FOREIGN = r"""
#include <ATen/core/Tensor.h>
#include <ATen/ops/mul.h>
#include <torch/library.h>

static at::Tensor scale(const at::Tensor& x, double f) { return at::mul(x, f); }
static at::Tensor twice(const at::Tensor& x) { return at::mul(x, 2); }

TORCH_LIBRARY(fx_native, m) {
  m.def("scale(Tensor x, float f) -> Tensor");
  m.def("scale.twice(Tensor x, float f) -> Tensor");
}

TORCH_LIBRARY_FRAGMENT(fx_native_frag, m) { m.def("fx_native_frag::frag_op(Tensor x) -> Tensor"); }

TORCH_LIBRARY_IMPL(fx_native, CPU, m) {
  m.impl("scale", &scale);
  m.impl("scale.twice", &scale);
}

TORCH_LIBRARY_IMPL(fx_native_frag, CompositeExplicitAutograd, m) { m.impl("frag_op", &twice); }
"""

#: one namespace: every schema string is its own; stripped of its symbols, one qualified
#: schema string (``fx_single::hidden``) is all that names the namespace
FOREIGN_SINGLE = r"""
#include <ATen/core/Tensor.h>
#include <ATen/ops/mul.h>
#include <torch/library.h>

static at::Tensor twice(const at::Tensor& x) { return at::mul(x, 2); }

TORCH_LIBRARY(fx_single, m) {
  m.def("fx_single::hidden(Tensor x) -> Tensor");
  m.def("plain(Tensor x) -> Tensor");
}

TORCH_LIBRARY_IMPL(fx_single, CPU, m) {
  m.impl("hidden", &twice);
  m.impl("plain", &twice);
}
"""

#: a Python extension module (it exports ``PyInit__ext``) whose import registers an op, as
#: packages that ``from . import _C`` do: the scan names the module that imports it
FOREIGN_EXTENSION = r"""
#include <Python.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/mul.h>
#include <torch/library.h>

static at::Tensor triple(const at::Tensor& x) { return at::mul(x, 3); }

TORCH_LIBRARY(fx_ext, m) { m.def("triple(Tensor x) -> Tensor"); }

TORCH_LIBRARY_IMPL(fx_ext, CPU, m) { m.impl("triple", &triple); }

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_ext", nullptr, -1, nullptr};

PyMODINIT_FUNC PyInit__ext(void) { return PyModule_Create(&module); }
"""

#: torch's older registration API (torchvision's ``image`` library up to 0.28): no macro
#: block, every schema qualified; one op by its name alone, its schema inferred
FOREIGN_LEGACY = r"""
#include <ATen/core/Tensor.h>
#include <ATen/core/op_registration/op_registration.h>
#include <ATen/ops/mul.h>

static at::Tensor decode(const at::Tensor& x) { return at::mul(x, 2); }
static at::Tensor named(const at::Tensor& x) { return at::mul(x, 3); }

static auto registry = c10::RegisterOperators()
    .op("fx_legacy::decode(Tensor x) -> Tensor", &decode)
    .op("fx_legacy::named", &named);
"""

_SOURCES = {"test": (SOURCE, "native_test"), "rival": (RIVAL, "native_rival"),
            "swap_aten": (SWAP_ATEN, "native_swap_aten"), "swap_own": (SWAP_OWN, "native_swap_own"),
            "impl": (IMPL, "native_impl"), "impl_extra": (IMPL_EXTRA, "native_impl_extra"),
            "fragment": (FRAGMENT, "native_fragment"), "impl_meta": (IMPL_META, "native_impl_meta"),
            "foreign": (FOREIGN, "native_foreign"),
            "foreign_single": (FOREIGN_SINGLE, "native_foreign_single"),
            "foreign_extension": (FOREIGN_EXTENSION, "native_foreign_extension"),
            "foreign_legacy": (FOREIGN_LEGACY, "native_foreign_legacy")}

_BUILD = """
import sys
from torch.utils import cpp_extension
cpp_extension.load(name=sys.argv[1], sources=[sys.argv[2]], build_directory=sys.argv[3],
                   extra_cflags=["-O0"], is_python_module=False, verbose=False)
"""


def _paths(source: str, stem: str) -> tuple[str, Path, Path]:
    import torch

    digest = hashlib.sha256(source.encode()).hexdigest()[:12]
    root = Path(tempfile.gettempdir()) / "opregistry-native-tests" / f"torch-{torch.__version__}"
    root.mkdir(parents=True, exist_ok=True)
    name = f"{stem}_{digest}"
    root = root / name  # a directory each: cpp_extension writes build.ninja and a lock there
    root.mkdir(exist_ok=True)
    return name, root, root / f"{name}.so"


def build() -> dict[str, Path]:
    """``{"test": path, "rival": path, ...}`` (the keys of ``_SOURCES``) of the compiled
    libraries (built now if not cached)."""
    wanted = {key: _paths(source, stem) for key, (source, stem) in _SOURCES.items()}
    env = {**os.environ, "OPREGISTRY_AUTOLOAD": "0"}
    running = []
    for key, (name, root, library) in wanted.items():
        if library.exists():
            continue
        source = root / f"{name}.cpp"
        source.write_text(_SOURCES[key][0])
        running.append(subprocess.Popen([sys.executable, "-c", _BUILD, name, str(source),
                                         str(root)], env=env, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True))
    for proc in running:
        output, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"building a test library failed:\n{output[-3000:]}"
    return {key: library for key, (_, _, library) in wanted.items()}
