"""Builds the native library when torch can be imported by the build, else installs the sources.

See ``extension_cpp/_build.py``: under pip's default build isolation torch is
not importable (and it is not a build requirement, on purpose), so the
library is built at its first load; ``pip install --no-build-isolation`` with
torch installed builds ``extension_cpp/_C*.so`` now, and records the torch
version, C++ ABI and CUDA version it was built for in ``_build.json``, which
opregistry compares with the installed torch before it loads the library.
"""

import json
import os
import sys

from setuptools import setup

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "extension_cpp"))
import _build  # noqa: E402  (the package's own module, imported without the package)

try:
    import torch
    from torch.utils import cpp_extension
except ImportError:  # build isolation: built at first load instead
    torch = None

ext_modules = []
cmdclass = {}
if torch is not None and not os.environ.get("EXTENSION_CPP_JIT"):
    cuda = _build.with_cuda(torch.version.cuda)
    here = os.path.dirname(os.path.abspath(__file__))
    sources = [os.path.relpath(s, here) for s in _build.SOURCES + (_build.CUDA_SOURCES if cuda else [])]
    Extension = cpp_extension.CUDAExtension if cuda else cpp_extension.CppExtension
    ext_modules = [Extension("extension_cpp._C", sources, extra_compile_args={"cxx": ["-O2"], "nvcc": ["-O2"]})]
    cmdclass = {"build_ext": cpp_extension.BuildExtension}
    with open(_build.BUILD_INFO, "w", encoding="utf-8") as fh:
        json.dump({"torch": torch.__version__, "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI),
                   "cuda": torch.version.cuda if cuda else None}, fh)
        fh.write("\n")
elif os.path.exists(_build.BUILD_INFO):
    os.remove(_build.BUILD_INFO)  # no library built now: no record of one

setup(ext_modules=ext_modules, cmdclass=cmdclass)
