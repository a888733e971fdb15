"""Where the time of loading N generated ops goes, stage by stage and backend by backend.

    python benchmarks/profile_load.py [--dists 100] [--ops-per-dist 10] [--cprofile 25] [--cpu] [--repeat 5]

Runs in a fresh process with ``OPREGISTRY_AUTOLOAD=0`` (so nothing is loaded
at ``import torch``), then times the pipeline's stages on the generated
distributions: import torch, discover (entry points + importing the
declaration modules), collect, torch state, resolve, and materialize, the
latter split by backend (define, cpu, meta = register_fake, autograd,
vmap = register_vmap).  ``--cprofile N`` adds the N most expensive functions
of a second, warm materialize.  This is the profile behind the start-up
figures in docs/performance.md.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHILD = r'''
import collections, cProfile, pstats, sys, time
clock = time.process_time if sys.argv[2] == "cpu" else time.perf_counter
t0 = clock()
import torch
t1 = clock()
import opregistry.materializer as mm
from opregistry.collect import collect
from opregistry.config import Settings
from opregistry.discovery import discover
from opregistry.resolver import resolve
from opregistry import torch_state
t2 = clock()
with mm.gc_paused():
    found = discover(Settings()); t3 = clock()
    collected = collect(found); t4 = clock()
    state = torch_state.snapshot(); t5 = clock()
    plan = resolve(collected.declarations, torch_state=state); t6 = clock()
spent = collections.Counter()
def timed(name, fn):
    def run(*args, **kw):
        t = clock()
        try:
            return fn(*args, **kw)
        finally:
            spent[name] += clock() - t
    return run
define = mm._define
mm._define = timed("define", define)
mats = {name: timed(name, fn) for name, fn in collected.materializers.items()}
t7 = clock()
done = mm.materialize(plan, mats)
t8 = clock()
n = len(done.ops)
print(f"{n} ops")
for name, sec in [("import torch", t1 - t0), ("import opregistry stages", t2 - t1),
                  ("discover", t3 - t2), ("collect", t4 - t3), ("torch state", t5 - t4),
                  ("resolve", t6 - t5), ("materialize", t8 - t7)]:
    print(f"  {name:26s} {sec:7.3f} s  {sec / n * 1e6:8.1f} us/op")
for name, sec in sorted(spent.items(), key=lambda kv: -kv[1]):
    name = "/".join(name) if isinstance(name, tuple) else name  # (distribution, backend)
    print(f"    materialize: {name:32s} {sec:7.3f} s  {sec / n * 1e6:8.1f} us/op")
repeat = int(sys.argv[3])
if repeat:
    # minimum of `repeat` runs of each stage: on a shared machine the minimum
    # is the run the other jobs disturbed least
    done.destroy()
    mm._define = define
    best = collections.defaultdict(lambda: float("inf"))
    with mm.gc_paused():
        for _ in range(repeat):
            a = clock(); again = collect(found); b = clock()
            plan = resolve(again.declarations, torch_state=state); c = clock()
            best["collect"] = min(best["collect"], b - a)
            best["resolve"] = min(best["resolve"], c - b)
        for _ in range(repeat):
            a = clock(); done = mm.materialize(plan, again.materializers); b = clock()
            best["materialize"] = min(best["materialize"], b - a)
            done.destroy()
    print(f"  minimum of {repeat} runs: " + ", ".join(
        f"{name} {sec / n * 1e6:.1f} us/op" for name, sec in best.items()))
top = int(sys.argv[1])
if top:
    done.destroy()
    mm._define = define
    profile = cProfile.Profile()
    profile.enable()
    mm.materialize(plan, collected.materializers)
    profile.disable()
    pstats.Stats(profile).sort_stats("tottime").print_stats(top)
'''


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dists", type=int, default=100)
    parser.add_argument("--ops-per-dist", type=int, default=10)
    parser.add_argument("--cprofile", type=int, default=0, metavar="N")
    parser.add_argument("--repeat", type=int, default=0, metavar="N",
                        help="then run collect + resolve and materialize N times more "
                             "each and print each stage's minimum")
    parser.add_argument("--cpu", action="store_true",
                        help="CPU time of the process (time.process_time) instead of wall "
                             "time: steadier on a shared machine")
    opts = parser.parse_args()
    sys.path.insert(0, str(HERE))
    import benchops

    with tempfile.TemporaryDirectory() as tmp:
        gen = Path(tmp) / "gen"
        benchops.write_many(gen, opts.dists, opts.ops_per_dist)
        env = {k: v for k, v in os.environ.items() if not k.startswith("OPREGISTRY_")}
        # a PYTHONPATH of the caller's comes after: another checkout's code to profile
        paths = [str(gen), str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])]
        env.update(OPREGISTRY_AUTOLOAD="0", PYTHONPATH=os.pathsep.join(paths))
        # run in an empty directory: python -c puts the working directory first on sys.path
        return subprocess.run([sys.executable, "-c", CHILD, str(opts.cprofile),
                               "cpu" if opts.cpu else "wall", str(opts.repeat)], env=env,
                              cwd=tmp).returncode


if __name__ == "__main__":
    sys.exit(main())
