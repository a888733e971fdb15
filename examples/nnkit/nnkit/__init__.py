"""nnkit: operators that model code registers, declared for opregistry.

``pip install nnkit`` plus the backends (``opregistry-cpu``, ``-meta``,
``-autograd``, ``-vmap``; ``opregistry-cuda`` on a GPU machine) and a plain
``import torch`` give ``torch.ops.nnkit.rms_norm``, ``silu_and_mul`` (and its
``out=`` overload), ``nms``, ``ema_update``, ``rope_cache`` and ``interp``.

Importing this package imports neither torch nor NumPy nor Triton: the
declarations in :mod:`nnkit.registry` name kernels as ``"module:function"``
strings, imported only when opregistry registers them.
"""
