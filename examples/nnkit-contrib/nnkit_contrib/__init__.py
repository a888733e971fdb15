"""nnkit-contrib: what a third party adds to someone else's op package.

* a FRAGMENT of the ``nnkit`` namespace (owned by the ``nnkit``
  distribution): ``nnkit::gelu_and_mul`` and ``nnkit::fused_add_rms_norm``;
* an IMPL: a CUDA kernel for ``nnkit::nms``, which nnkit ships for CPU only.

``opregistry list`` shows each of them with this distribution as its origin.
Like nnkit, importing it imports neither torch nor the kernels.
"""
