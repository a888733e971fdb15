"""What each loaded op keeps alive: objects tracked by the garbage collector, per op and by type.

    python benchmarks/objects_per_op.py [--dists 100] [--ops-per-dist 10] [--top 20]
                                        [--cold] [--json out.json]

In a fresh process (``OPREGISTRY_AUTOLOAD=0``, so ``import torch`` loads
nothing), counts ``gc.get_objects()`` by type after a full collection,
then ``opregistry.load()`` of the generated distributions (CPU + fake +
autograd + vmap per op, as ``bench_startup.py``), collects again and counts
again.  The load is a plan-cache hit (an untimed process writes the entry
first, in a cache folder of its own), as at a user's ``import torch``; with
``--cold``, no cache.  Every object an op leaves alive is visited by each later full
collection of the program and freed one by one at interpreter exit: at
10,000 ops this is a large part of what the ops cost the process
(docs/performance.md, "Start-up").  Counts, not times: the figure does not
depend on the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHILD = r'''
import collections, gc, json, sys
import torch
import opregistry

def census():
    gc.collect()
    return collections.Counter(type(o).__qualname__ for o in gc.get_objects())

before = census()
registry = opregistry.load()
after = census()
ops = len(registry.ops)
added = after - before
from opregistry.state import process
json.dump({"ops": ops, "objects": sum(after.values()) - sum(before.values()),
           "by_type": dict(added.most_common()), "plan_cache": process().plan_cache},
          sys.stdout)
'''


def main() -> int:
    sys.path.insert(0, str(HERE))
    import benchops

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dists", type=int, default=100)
    parser.add_argument("--ops-per-dist", type=int, default=10)
    parser.add_argument("--top", type=int, default=20, help="how many types to print")
    parser.add_argument("--cold", action="store_true", help="no plan cache")
    parser.add_argument("--json", type=Path)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        gen = Path(tmp) / "gen"
        benchops.write_many(gen, opts.dists, opts.ops_per_dist)
        # a PYTHONPATH of the caller's comes after: another checkout's code to count
        paths = [gen, HERE, *[Path(p) for p in filter(None, [os.environ.get("PYTHONPATH")])]]
        env = benchops.environ(paths, OPREGISTRY_AUTOLOAD="0",
                               OPREGISTRY_CACHE_DIR=str(Path(tmp) / "cache"),
                               **({"OPREGISTRY_CACHE": "0"} if opts.cold else {}))
        for _ in range(1 if opts.cold else 2):  # the first writes the plan cache
            out = subprocess.run([sys.executable, "-c", CHILD], env=env, check=True,
                                 capture_output=True, text=True,
                                 cwd=benchops.neutral_cwd()).stdout
    data = json.loads(out.strip().splitlines()[-1])
    ops = data["ops"]
    print(f"{ops} ops loaded (the generated ones and this repository's; plan cache: "
          f"{data['plan_cache']}): {data['objects'] / ops:.1f} tracked objects per op")
    for name, count in list(data["by_type"].items())[:opts.top]:
        print(f"  {name:40s} {count / ops:6.2f} per op")
    if opts.json:
        opts.json.write_text(json.dumps(data, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
