"""int8kit: per-row int8 quantization, declared in the decorator style.

The module that declares the ops (:mod:`int8kit.ops`) imports torch and is
the kernels' own module, as with :func:`torch.library.custom_op`: schemas are
inferred from type hints.  The price: discovering this package imports
torch, so ``opregistry list`` with it installed is as slow as ``import
torch``.  Packages that want a torch-free listing use the declarative style
(see ``examples/nnkit``).
"""
