"""What a Python Autograd kernel costs per call before opregistry adds anything, on this torch.

    python benchmarks/autograd_layer_floor.py [--number 200000] [--reps 7] [--json FILE]

opregistry's full op has an ``Autograd`` kernel in Python, registered
``with_keyset=True``: on a no-grad call it checks grad mode and the inputs,
reads the call's dispatch key set (``keyset.raw_repr()``, the key of its
per-keyset cache of the device kernel) and calls the device kernel
directly.  Issue 18 bounds that no-grad call at 1.3x a plain ``define/impl``
op with only a CPU kernel, on every supported torch.  This script times, on
the running torch, the pieces torch itself charges for that design, with an
8-element float tensor, ``min`` of ``--reps`` timeit runs of ``--number``
calls each:

* ``cpu only``: a ``define/impl`` op with a Python CPU kernel (``x -> x``);
* ``Autograd kernel``: an op whose Python ``Autograd`` kernel returns the
  input itself (the CPU kernel never runs): one Python kernel call, as the
  CPU-only op;
* ``Autograd kernel, with_keyset``: the same, registered ``with_keyset=True``
  (torch builds a ``DispatchKeySet`` object per call);
* ``keyset.raw_repr()``, ``torch._C._any_requires_grad(x)``,
  ``torch.is_grad_enabled()``: the torch calls the kernel's hot path makes.

The sum of the keyset's two costs is the part of opregistry's per-call
overhead that belongs to torch's pybind layer, and differs by version
(docs/performance.md, "Per torch version").  No opregistry code runs here.
"""

from __future__ import annotations

import argparse
import json
import sys
import timeit
import uuid
from pathlib import Path
from typing import Any, Callable

import torch


def _time(fn: Callable[[], Any], number: int, reps: int) -> float:
    """Microseconds per call, the minimum of ``reps`` runs."""
    return min(timeit.repeat(fn, number=number, repeat=reps)) / number * 1e6


def measure(number: int, reps: int) -> dict[str, float]:
    ns = f"agfloor{uuid.uuid4().hex[:6]}"
    lib = torch.library.Library(ns, "DEF")
    try:
        for name in ("cpu", "plain", "keyset"):
            lib.define(f"{name}(Tensor x) -> Tensor")
            lib.impl(name, lambda x: x, "CPU")
        lib.impl("plain", lambda x: x, "Autograd")
        lib.impl("keyset", lambda keyset, x: x, "Autograd", with_keyset=True)
        ops = getattr(torch.ops, ns)
        cpu, plain, keyset = ops.cpu.default, ops.plain.default, ops.keyset.default
        x = torch.randn(8)
        ks = torch._C._dispatch_keys(x)
        any_requires_grad = getattr(torch._C, "_any_requires_grad", None)
        times = {
            "cpu only": _time(lambda: cpu(x), number, reps),
            "Autograd kernel": _time(lambda: plain(x), number, reps),
            "Autograd kernel, with_keyset": _time(lambda: keyset(x), number, reps),
            "keyset.raw_repr()": _time(ks.raw_repr, number, reps),
            "torch.is_grad_enabled()": _time(torch.is_grad_enabled, number, reps),
        }
        if any_requires_grad is not None:  # torch >= 2.8
            times["torch._C._any_requires_grad(x)"] = _time(lambda: any_requires_grad(x),
                                                            number, reps)
    finally:
        lib._destroy()
    times["with_keyset + raw_repr"] = (times["Autograd kernel, with_keyset"]
                                       - times["Autograd kernel"] + times["keyset.raw_repr()"])
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=200_000)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--json", type=Path)
    opts = parser.parse_args()
    times = measure(opts.number, opts.reps)
    print(f"torch {torch.__version__}, us per call (min of {opts.reps} x {opts.number})")
    for name, us in times.items():
        print(f"  {name:34s} {us:7.3f} us")
    if opts.json is not None:
        opts.json.write_text(json.dumps({"torch": torch.__version__, "us": times}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
