"""``import torch`` + N ops against the floor, in pairs: in process and whole, nothing wrapped.

    python benchmarks/import_pairs.py [--dists 1000] [--ops-per-dist 10] [--reps 8]

Generates the ops (as ``startup_targets.py``: one-argument, CPU + fake +
autograd + vmap), writes the plan cache once, then runs, interleaved, one
process with opregistry autoloading them (warm plan cache, every other op
package blocked) and one registering the same ops by hand
(``raw_floor.REGISTER``).  Each child prints the process CPU time of its
``import torch`` statement (and, for the floor, its registrations after it);
the parent takes each child's CPU time (user + system) from ``wait4``.
Per pair: the in-process ratio and the whole-process one (the latter with
the process's start and exit, where torch takes the registrations back).
Nothing of opregistry is imported or wrapped before ``import torch``, unlike
the in-process phase of ``startup_targets.py``, whose wrapped entry point
resolves a part of a few milliseconds but charges opregistry the modules it
imports first.
"""

from __future__ import annotations

import json
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import benchops  # noqa: E402
import raw_floor  # noqa: E402

#: ``import torch`` alone, timed in process (CPU seconds, printed)
TIMED_IMPORT = "import time\nt = time.process_time()\nimport torch\nprint(time.process_time() - t)\n"
#: the floor: ``import torch`` and the registrations, timed together in process
TIMED_FLOOR = ("import time\nt = time.process_time()\n" + raw_floor.REGISTER
               + "\nprint(time.process_time() - t)\n")


def main() -> int:
    parser = benchops.size_parser(__doc__.splitlines()[0], reps=8)
    parser.set_defaults(dists=1000)
    opts = parser.parse_args()
    n = opts.dists * opts.ops_per_dist
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        gen = root / "gen"
        benchops.write_many(gen, opts.dists, opts.ops_per_dist)
        ours_env = benchops.environ([gen, HERE], OPREGISTRY_CACHE_DIR=str(root / "cache"),
                                    OPREGISTRY_BLOCK=benchops.other_op_packages())
        floor_env = benchops.environ([HERE], TORCH_DEVICE_BACKEND_AUTOLOAD="0")
        cases = {"opregistry": lambda: timed([py, "-c", TIMED_IMPORT], ours_env),
                 "floor": lambda: timed([py, "-c", TIMED_FLOOR, str(n)], floor_env)}
        for case in cases.values():  # warm: .pyc files, page cache, the plan cache
            case()
        samples = benchops.interleaved(cases, opts.reps)
    ours, floor = samples["opregistry"], samples["floor"]
    print(f"import torch + {n} ops against the floor, {opts.reps} interleaved pairs (CPU s)")
    for (a, b), (c, d) in zip(ours, floor):
        print(f"  opregistry {a:6.3f} in process {b:6.3f} whole   floor {c:6.3f} / {d:6.3f}"
              f"   ratios {a / c:5.3f} / {b / d:5.3f}")
    found = {}
    for i, clock in enumerate(("in process", "whole")):
        per_pair = [x[i] / y[i] for x, y in zip(ours, floor)]
        found[clock] = {"median": statistics.median(per_pair), "min": min(per_pair),
                        "max": max(per_pair)}
        print(f"  {clock:10s} median {found[clock]['median']:.3f} "
              f"[{found[clock]['min']:.3f}-{found[clock]['max']:.3f}]")
    if opts.json:
        opts.json.write_text(json.dumps({"ratios": found, "seconds": samples}, indent=1))
    return 0


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """``(in-process CPU seconds the child printed, the whole process's CPU seconds)``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=benchops.neutral_cwd())
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise RuntimeError(f"{cmd[:2]} failed: {done.stderr[-3000:]}")
    whole = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return float(done.stdout.split()[-1]), whole


if __name__ == "__main__":
    sys.exit(main())
