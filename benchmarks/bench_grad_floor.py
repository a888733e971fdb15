"""The floor under a Python autograd formula: what fwd+bwd costs before opregistry adds anything.

    python benchmarks/bench_grad_floor.py [--reps 15]

Interleaved, for the 1-argument benchmark op (``x.clone()``, backward
``grad * scale``), forward + backward of:

* ``direct``: ``x.clone()`` (C++ autograd, backward in C++);
* ``Function``: a plain ``torch.autograd.Function`` with the same forward,
  setup and backward, called directly (no dispatcher);
* ``Function via dispatcher``: the same Function applied from inside a
  ``Library.impl(..., "Autograd")`` kernel of a ``define/impl`` op — the
  least any Python autograd kernel can cost;
* ``opregistry full`` and ``custom_op + register_autograd``.

Shows how much of the ``custom_op`` / opregistry ratio is left to win.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchops  # noqa: E402

benchops.ensure_importable()

import torch  # noqa: E402

import opregistry  # noqa: E402


class Clone(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        benchops.one_setup(ctx, (x,), None)
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return benchops.one_backward(ctx, grad)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--number", type=int, default=500)
    opts = parser.parse_args()
    ns = f"floor{uuid.uuid4().hex[:6]}"
    lib = torch.library.Library(ns, "DEF")
    lib.define("one(Tensor x) -> Tensor")
    lib.impl("one", benchops.one, "CPU")
    lib.impl("one", lambda keyset, x: Clone.apply(x), "Autograd", with_keyset=True)
    co, _ = benchops.custom_op(f"{ns}_co", "one", autograd=True)
    with tempfile.TemporaryDirectory() as tmp:
        sys.path.insert(0, tmp)
        benchops.write_distribution(Path(tmp), f"floor-{ns}", f"{ns}_of", full=True)
        registry = opregistry.load(plugins=[*benchops.BACKENDS, f"floor-{ns}"], reload=True,
                                   strict=True)
        cases: dict[str, Callable[..., Any]] = {
            "direct": benchops.one,
            "Function": Clone.apply,
            "Function via dispatcher": getattr(torch.ops, ns).one.default,
            "opregistry full": getattr(torch.ops, f"{ns}_of").one.default,
            "custom_op + register_autograd": co,
        }
        x = torch.randn(8, requires_grad=True)
        go = torch.ones(8)
        samples: dict[str, list[float]] = {k: [] for k in cases}
        for fn in cases.values():
            fn(x).backward(go)
        for _ in range(opts.reps):
            for name, fn in cases.items():
                t = time.perf_counter()
                for _ in range(opts.number):
                    fn(x).backward(go)
                samples[name].append((time.perf_counter() - t) / opts.number * 1e6)
        registry.unload()
    lib._destroy()
    res = {k: statistics.median(v) for k, v in samples.items()}
    print(f"fwd+bwd of the 1-argument op, us per call, median of {opts.reps} interleaved reps")
    for name, us in res.items():
        print(f"  {name:32s} {us:7.2f} us  "
              f"custom_op / this = {res['custom_op + register_autograd'] / us:4.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
