"""A tiny C++ library for the native-package tests, compiled once per torch and cached.

``NS`` is its namespace: ``TORCH_LIBRARY(opregistry_native_test)`` defines
``twice`` (declared by the tests) and ``hidden`` (never declared: the
undeclared-op case), with CPU kernels.  It is built in a subprocess, so that
building does not load it into the test process (``cpp_extension.load``
loads what it builds); the tests load it, or prove it was never loaded.
The build lands in ``$TMPDIR/opregistry-native-tests/torch-<version>`` and
is reused by later sessions while the source is unchanged (~15 s of g++ on
one core the first time, well under a second after).
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

_BUILD = """
import sys
from torch.utils import cpp_extension
cpp_extension.load(name=sys.argv[1], sources=[sys.argv[2]], build_directory=sys.argv[3],
                   extra_cflags=["-O0"], is_python_module=False, verbose=False)
"""


def build() -> Path:
    """The path of the compiled library (built now if the cache lacks it)."""
    import torch

    digest = hashlib.sha256(SOURCE.encode()).hexdigest()[:12]
    root = Path(tempfile.gettempdir()) / "opregistry-native-tests" / f"torch-{torch.__version__}"
    root.mkdir(parents=True, exist_ok=True)
    name = f"native_test_{digest}"
    library = root / f"{name}.so"
    if library.exists():
        return library
    source = root / f"{name}.cpp"
    source.write_text(SOURCE)
    env = {**os.environ, "OPREGISTRY_AUTOLOAD": "0"}
    subprocess.run([sys.executable, "-c", _BUILD, name, str(source), str(root)], check=True,
                   env=env, capture_output=True, text=True, timeout=600)
    return library
