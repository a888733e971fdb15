"""Scaling: registration and start-up from 10 to 100 to 1,000 distributions (100 to 10,000 ops).

    python benchmarks/bench_scaling.py [--sizes 10 100 1000] [--reps 3] [--json scaling.json]
    python benchmarks/plot_scaling.py scaling.json docs/img/scaling.png

For each size (distributions of 10 ops each, CPU + fake + autograd + vmap;
registration runs without vmap to match the raw torch.library calls):

* registration, in this process: ``opregistry materialize``, ``opregistry
  load`` and the raw ``torch.library`` calls (bench_register.py);
* start-up, as processes: ``opregistry list --json`` and ``import torch``
  with the ops autoloaded, next to a bare ``import torch`` (bench_startup.py).

Prints seconds and seconds per op; per-op cost that stays flat (or falls)
from one size to the next is linear (or better) scaling.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_register  # noqa: E402
import bench_startup  # noqa: E402
from opregistry.state import process  # noqa: E402

PER_DIST = 10


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", type=Path)
    opts = parser.parse_args()
    process().registry = None
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n_dists in opts.sizes:
            root = Path(tmp) / f"size{n_dists}"
            reg = bench_register.measure(n_dists, PER_DIST, opts.reps, root / "reg")
            start = bench_startup.measure(n_dists, PER_DIST, opts.reps, root / "start")
            ops = n_dists * PER_DIST
            rows.append({"distributions": n_dists, "ops": ops, "registration": reg,
                         "startup": start})
            print(f"{n_dists:5d} distributions, {ops:6d} ops:")
            for group in (reg, start):
                for name, sec in group.items():
                    per_op = "" if name.startswith("import torch") and "N ops" not in name else \
                        f"{sec / ops * 1e6:8.1f} us/op"
                    print(f"    {name:26s} {sec:8.3f} s  {per_op}")
            sys.stdout.flush()
    if opts.json:
        opts.json.write_text(json.dumps({"per_dist": PER_DIST, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
