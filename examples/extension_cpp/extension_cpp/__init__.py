"""extension-cpp: the C++ custom-ops tutorial's ``extension_cpp`` ops, as an opregistry op package.

``mymuladd``, ``mymul`` and ``myadd_out`` are defined in C++
(``csrc/muladd.cpp``: a ``TORCH_LIBRARY`` block and CPU kernels in a
``TORCH_LIBRARY_IMPL`` block; ``csrc/muladd.cu`` adds CUDA kernels where nvcc
is present).  Their fake kernels and autograd formula are Python
(``extension_cpp.ops``), registered by opregistry's backends like any
other op's.  :mod:`extension_cpp.registry` declares all of it without
importing torch or loading the library; opregistry loads the library once
the resolver has admitted the namespace, and checks it registered what was
declared.  Importing this package imports neither torch nor the library.
"""

__version__ = "0.1.0"
