"""Where a warm-cache load's time goes, stage by stage, in one process.

    python benchmarks/warm_stages.py [--dists 100] [--ops-per-dist 10] [--reps 3]

Generates the ops (as ``bench_startup.py``), loads them once to write the
plan cache, then, in fresh processes (``OPREGISTRY_AUTOLOAD=0``, then
``opregistry.load()``: a plan-cache hit), times each stage with
``time.perf_counter``: the cache lookup (stamps checked, the entry's header
read), the environment checked again (``plancache.reuse``), the entry's
registration program parsed (``plancache.program_of``) and replayed
(``materializer.Replay.run``) -- or, for an entry without a program, the
plan decoded (in ``reuse``), its steps (``steps.plan_steps``) and the
executor; and once more with every backend hook and ``define`` replaced by
a no-op, which leaves opregistry's own path.  Medians of ``--reps``
processes per variant.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import benchops  # noqa: E402

CHILD = r'''
import collections, json, sys, time
import torch, opregistry
from opregistry import collect, materializer, registry
spent = collections.Counter()
def timed(owner, name, label):
    fn = getattr(owner, name)
    def run(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            spent[label] += time.perf_counter() - t
    setattr(owner, name, run)
timed(registry.PlanCache, "lookup", "lookup")
timed(registry, "reuse", "reuse")
timed(registry, "program_of", "program")
timed(materializer.Replay, "run", "replay")
timed(materializer, "plan_steps", "steps")
timed(materializer.Executor, "run", "executor")
if sys.argv[1] == "noop":
    collect._materializer = lambda impl: (lambda *args: True)
    materializer._define_op = lambda lib, op: None
t = time.perf_counter()
opregistry.load()
spent["load"] = time.perf_counter() - t
spent["hit"] = float(registry.process().plan_cache == "hit")
print(json.dumps(spent))
'''


def main() -> int:
    parser = benchops.size_parser(__doc__.splitlines()[0], reps=3)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        gen = Path(tmp) / "gen"
        benchops.write_many(gen, opts.dists, opts.ops_per_dist)
        env = benchops.environ([gen, HERE], OPREGISTRY_CACHE_DIR=str(Path(tmp) / "cache"),
                               OPREGISTRY_BLOCK=benchops.other_op_packages(),
                               OPREGISTRY_AUTOLOAD="0")

        def child(variant: str) -> dict[str, float]:
            out = subprocess.run([sys.executable, "-c", CHILD, variant], env=env, check=True,
                                 capture_output=True, text=True, cwd=benchops.neutral_cwd())
            return json.loads(out.stdout.strip().splitlines()[-1])

        child("real")  # writes the plan cache
        runs = {v: [child(v) for _ in range(opts.reps)] for v in ("real", "noop")}
    if not all(r["hit"] for rows in runs.values() for r in rows):
        raise RuntimeError("a timed load missed the plan cache")
    stages = ("lookup", "reuse", "program", "replay", "steps", "executor", "load")
    result = {v: {s: statistics.median(r.get(s, 0.0) for r in rows) for s in stages}
              for v, rows in runs.items()}
    n = opts.dists * opts.ops_per_dist
    print(f"warm-cache load of {n} ops, seconds, median of {opts.reps} processes")
    print(f"  {'':34s}" + "".join(f"{s:>10s}" for s in stages))
    for variant, label in (("real", "opregistry.load()"), ("noop", "same, backends' hooks no-ops")):
        print(f"  {label:34s}" + "".join(f"{result[variant][s]:10.3f}" for s in stages))
    if opts.json:
        opts.json.write_text(json.dumps({"ops": n, "seconds": result}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
