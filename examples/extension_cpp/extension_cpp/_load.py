"""Importing this module loads the native library: opregistry imports it, after resolving.

The library built at install time (``_C*.so`` beside this file) is loaded
with ``torch.ops.load_library``; without one, it is built now with
``torch.utils.cpp_extension.load`` (ninja, g++) into
``$EXTENSION_CPP_CACHE`` (default ``~/.cache/extension_cpp``), one directory
per torch version (and CUDA or not), and loaded from there: later loads only
compare its time with the sources'.
"""

from __future__ import annotations

import glob
import os

import torch

from . import _build


def _prebuilt() -> str | None:
    found = sorted(glob.glob(os.path.join(_build.HERE, "_C*.so"))
                   + glob.glob(os.path.join(_build.HERE, "_C*.pyd")))
    return found[0] if found else None


def _build_now() -> None:
    cache = os.environ.get("EXTENSION_CPP_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "extension_cpp")
    cuda = _build.with_cuda(torch.version.cuda)
    directory = os.path.join(cache, f"torch-{torch.__version__}" + ("-cuda" if cuda else ""))
    sources = list(_build.SOURCES) + (_build.CUDA_SOURCES if cuda else [])
    built = os.path.join(directory, f"{_build.NAME}.so")
    # built already, from these sources: load it (cpp_extension.load would import setuptools
    # and run ninja to find that out: ~1 s at every `import torch`)
    if os.path.exists(built) and os.path.getmtime(built) >= max(map(os.path.getmtime, sources)):
        torch.ops.load_library(built)
        return
    from torch.utils import cpp_extension

    os.makedirs(directory, exist_ok=True)
    cpp_extension.load(name=_build.NAME, sources=sources, build_directory=directory,
                       extra_cflags=["-O2"], is_python_module=False, verbose=False)


LIBRARY = _prebuilt()
if LIBRARY is not None:
    torch.ops.load_library(LIBRARY)
else:
    _build_now()
