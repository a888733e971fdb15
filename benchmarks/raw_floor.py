"""The floor under start-up at scale: N ops registered with torch's own calls and nothing else.

    python benchmarks/raw_floor.py [--ops 10000] [--reps 3] [--json out.json]

Times whole processes, interleaved: bare ``import torch``
(``TORCH_DEVICE_BACKEND_AUTOLOAD=0``), and ``import torch`` followed by the
cheapest registration of N ops that torch offers for what opregistry
registers per op: one ``Library`` per 10 ops, ``define``, ``impl`` for CPU,
Autograd and FuncTorchBatched, and the fake kernel through torch's
fake-kernel registry (``FakeImplHolder.register``, as ``opregistry-meta``
does; the public ``register_fake`` on a torch without it).  No discovery,
no resolution, no records: whatever opregistry adds on top of this is its
own cost.  Also prints the objects the registrations leave tracked by the
garbage collector and the time of one full collection.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

#: the registrations alone (``python -c REGISTER N``): what startup_targets.py times
REGISTER = r'''
import gc, json, sys, time
import torch
n = int(sys.argv[1])
if n:
    from torch._library import fake_impl, simple_registry
    import inspect
    private = "lib" in inspect.signature(fake_impl.FakeImplHolder.register).parameters
    def cpu(x): return x.clone()
    def fake(x): return torch.empty_like(x)
    libs = []
    for d in range(n // 10):
        lib = torch.library.Library(f"rawfloor{d}", "DEF")
        libs.append(lib)
        for i in range(10):
            name = f"op{i}"
            lib.define(f"{name}(Tensor x) -> Tensor")
            lib.impl(name, cpu, "CPU")
            lib.impl(name, cpu, "Autograd")
            lib.impl(name, cpu, "FuncTorchBatched")
            if private:
                entry = simple_registry.singleton.find(f"rawfloor{d}::{name}")
                lib._registration_handles.append(entry.fake_impl.register(fake, "raw", lib=lib))
            else:
                torch.library.register_fake(f"rawfloor{d}::{name}", fake, lib=lib)
'''
CHILD = REGISTER + r'''
objects = len(gc.get_objects())
t = time.perf_counter()
gc.collect()
json.dump({"objects": objects, "full_gc": time.perf_counter() - t}, sys.stderr)
'''


def run(n_ops: int) -> tuple[float, dict[str, float]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPREGISTRY_")}
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", CHILD, str(n_ops)], env=env, check=True,
                          capture_output=True, text=True)
    wall = time.perf_counter() - start
    return wall, json.loads(done.stderr.strip().splitlines()[-1])


def options(description: str, reps: int) -> tuple[Any, int]:
    """``--ops N --reps R --json PATH`` parsed, and N rounded down to a multiple of 10."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--ops", type=int, default=10000, help="a multiple of 10")
    parser.add_argument("--reps", type=int, default=reps)
    parser.add_argument("--json", type=Path)
    opts = parser.parse_args()
    return opts, opts.ops - opts.ops % 10


def main() -> int:
    opts, n = options(__doc__.splitlines()[0], reps=3)
    cases = {"import torch (bare)": 0, f"import torch + {n} raw ops": n}
    walls: dict[str, list[float]] = {name: [] for name in cases}
    facts: dict[str, list[dict[str, float]]] = {name: [] for name in cases}
    run(0)  # warm the page cache
    for _ in range(opts.reps):
        for name, ops in cases.items():
            wall, fact = run(ops)
            walls[name].append(wall)
            facts[name].append(fact)
    bare = statistics.median(walls["import torch (bare)"])
    result = {}
    print(f"whole processes, wall seconds, median of {opts.reps} interleaved runs")
    for name, samples in walls.items():
        median = statistics.median(samples)
        objects = facts[name][-1]["objects"]  # the same in every run
        full_gc = statistics.median(f["full_gc"] for f in facts[name])
        result[name] = {"seconds": median, "ratio": median / bare, "objects": objects,
                        "full_gc": full_gc}
        print(f"  {name:32s} {median:7.3f} s  {median / bare:5.2f}x bare  "
              f"{objects:9d} objects  full gc {full_gc:.3f} s")
    if n:
        per_op = (result[f"import torch + {n} raw ops"]["objects"]
                  - result["import torch (bare)"]["objects"]) / n
        print(f"  objects per op: {per_op:.1f}")
    if opts.json:
        opts.json.write_text(json.dumps({"ops": n, "processes": result}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
