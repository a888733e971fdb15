"""tutorial-ops: the ops of the PyTorch custom-ops tutorial, declared for opregistry.

After ``pip install tutorial-ops opregistry-cpu opregistry-meta
opregistry-autograd opregistry-vmap``, a plain ``import torch`` makes
``torch.ops.tutorial.numpy_sin``, ``muladd`` and ``add_out`` available.
Importing this package imports neither torch nor numpy.
"""
