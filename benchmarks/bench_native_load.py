"""Loading a native library: plain ``torch.ops.load_library`` vs under opregistry's watch.

    python benchmarks/bench_native_load.py [LIBRARY.so] [--reps 15]

``LIBRARY.so`` defaults to ``SWAP_OWN`` of tests/native_build.py (a one-kernel
``TORCH_LIBRARY_IMPL``; built and cached there).  Each rep loads two fresh
copies of it (a copy, so that the dynamic loader runs its static initializers
again), interleaved: one with ``torch.ops.load_library`` alone, one inside
:func:`opregistry.torch_state.replaced_kernels` (``set_warn_always`` on, file
descriptor 2 redirected to a temporary file, read and parsed after).  Prints
the medians and their difference, the cost added to every native load; and,
once, the per-op snapshot (:func:`opregistry.torch_state.kernel_sites`) taken
twice per load instead where ``TORCH_CPP_LOG_LEVEL`` hides C++ warnings.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("library", nargs="?")
    parser.add_argument("--reps", type=int, default=15)
    args = parser.parse_args()
    os.environ.setdefault("OPREGISTRY_AUTOLOAD", "0")
    if args.library is None:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from tests import native_build

        args.library = str(native_build.build()["swap_own"])
    import torch

    from opregistry import torch_state

    tmp = Path(tempfile.mkdtemp())
    plain, watched = [], []
    try:
        for i in range(args.reps):
            a, b = tmp / f"plain{i}.so", tmp / f"watched{i}.so"
            shutil.copy(args.library, a)
            shutil.copy(args.library, b)
            start = time.perf_counter()
            torch.ops.load_library(str(a))
            plain.append(time.perf_counter() - start)
            start = time.perf_counter()
            with torch_state.replaced_kernels():
                torch.ops.load_library(str(b))
            watched.append(time.perf_counter() - start)
        start = time.perf_counter()
        torch_state.kernel_sites()
        snapshot = time.perf_counter() - start
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    p, w = statistics.median(plain) * 1e3, statistics.median(watched) * 1e3
    print(f"torch.ops.load_library:            {p:.2f} ms (median of {args.reps})")
    print(f"  inside replaced_kernels():       {w:.2f} ms")
    print(f"  added:                           {w - p:.2f} ms")
    print(f"kernel_sites() (quiet-log fallback, x2 per load): {snapshot * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
