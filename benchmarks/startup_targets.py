"""Start-up against its floors, every target in one run: whole processes, warm plan cache.

    python benchmarks/startup_targets.py [--sizes 1000 10000] [--reps 5] [--baseline DIR]
                                         [--json out.json]

Generates one-argument ops (CPU + fake + autograd + vmap, 10 per
distribution) into temporary folders put on ``PYTHONPATH``, blocks every
other installed op package (``OPREGISTRY_BLOCK``: only the measured ops
count), and times, as separate processes, interleaved (A B C ..., A B C ...):

* ``bare``: ``import torch`` without opregistry (``TORCH_DEVICE_BACKEND_AUTOLOAD=0``);
* ``backends``: ``import torch`` with opregistry and its backends, no op package;
* ``adopted`` and ``bare adopted``: the same two, with bitsandbytes and torchao
  (``realsite.REAL_PINS``, installed with ``--no-deps`` into
  ``realsite.site_of(REAL_PINS)`` when missing) on ``PYTHONPATH``: packages that
  register with torch by themselves, adopted (imported on their first touch),
  the machine of most users;
* ``floor N``: ``import torch`` + the same N ops registered with torch's own calls
  (``raw_floor.REGISTER``: define, CPU / Autograd / FuncTorchBatched impl, fake);
* ``import torch + N``: opregistry autoloading the N ops, warm plan cache;
* ``list --json N``: ``opregistry list --json``, warm plan cache;
* with ``--baseline DIR`` (``git archive main | tar -x -C DIR``, compiled first):
  ``cold N``, the first ``import torch`` with an empty cache folder (the plan
  built and written), this checkout vs ``DIR``'s code, each with its source
  folders first on ``PYTHONPATH``; and ``rebuild N``, the same with only the
  plan cache emptied, the scan of installed packages kept: the first start
  after an op package is installed or upgraded (no target; for a baseline
  without a plan cache, such as 12182fd, it is that baseline's cold start).

Each ratio is the median of the per-pair ratios (A/B of the same rep), for
wall time and for CPU time (user + system: steadier on a shared machine);
the min and max of the pairs show the noise.

Then the same cases again, **in process** (``--no-parts`` skips this): each
child times, in CPU seconds, its ``import torch`` and the part of it that is
opregistry's (importing ``opregistry.autoload`` and running the entry point
torch calls; for a floor, the hand-made registrations after ``import
torch``). The ratios are rebuilt from the parts on the same rep's bare
``import torch``: ``(bare + part) / bare`` for ``backends``, ``(bare + ours)
/ (bare + floor's)`` for ``import torch + N``, ``(bare + ours) / (bare +
baseline's)`` for ``cold`` and ``rebuild``.  A whole process on a shared
machine varies by more than a tenth from run to run, more than the
backends-only target's margin; the part is a few milliseconds, measured
alone.  Process start and exit are not in them (``list --json`` has no
in-process row: it is all process start).  Objects kept per op: the
objects the garbage collector tracks after the load and a full collection,
less bare ``import torch``'s, per op, for opregistry and the floor.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import benchops  # noqa: E402
import raw_floor  # noqa: E402
import realsite  # noqa: E402
from bench_startup import source_paths  # noqa: E402

#: the objects alive after the load: counted after a full collection (what a load leaves as
#: garbage is not kept, and whether a collection ran before the count is chance)
OBJECTS = "import gc, torch; gc.collect(); print(len(gc.get_objects()))"
#: ``import torch`` timed in process, with opregistry's part of it (CPU seconds, printed):
#: ``opregistry.autoload`` imported first and its entry point wrapped, so that torch's
#: backend autoload calls the wrapper (modules it imports that torch imports later are
#: charged to opregistry: the part is an upper bound)
PART = """
import time
t0 = time.process_time()
part = 0.0
try:
    import opregistry.autoload as entry
except ImportError:
    entry = None
else:
    part = time.process_time() - t0
    inner = entry.autoload
    def autoload():
        global part
        t = time.process_time()
        try:
            inner()
        finally:
            part += time.process_time() - t
    entry.autoload = autoload
import torch
print(part, time.process_time() - t0)
"""
#: the floor's registrations after ``import torch``, timed in process (CPU seconds, printed)
FLOOR_PART = ("import time\n" + raw_floor.REGISTER.replace(
    "import torch\n", "t0 = time.process_time()\nimport torch\nt1 = time.process_time()\n", 1)
    + "\nprint(time.process_time() - t1, time.process_time() - t0)\n")

TARGETS = {"backends / bare": 1.03, "adopted / bare adopted": 1.03, "import torch + 1000 / floor 1000": 1.05,
           "import torch + 10000 / floor 10000": 1.15, "list --json 1000 / bare": 0.10,
           "list --json 10000 / bare": 0.30, "cold 1000 / baseline": 1.0,
           "cold 10000 / baseline": 1.0}


def run(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds of one process."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            cwd=benchops.neutral_cwd())
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status):
        raise RuntimeError(f"{cmd} failed: {proc.stderr.read().decode() if proc.stderr else ''}")
    return wall, usage.ru_utime + usage.ru_stime


def run_part(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """opregistry's (or the floor's) CPU seconds inside one process, and the whole import's."""
    out = subprocess.run(cmd, env=env, capture_output=True, text=True,
                         cwd=benchops.neutral_cwd())
    if out.returncode:
        raise RuntimeError(f"{cmd} failed: {out.stderr[-3000:]}")
    part, whole = out.stdout.split()[-2:]
    return float(part), float(whole)


def cases(root: Path, sizes: list[int], baseline: Path | None, parts: bool = False
          ) -> dict[str, Callable[[], tuple[float, float]]]:
    """Each case's run: whole processes, or (``parts``) the in-process parts (``PART``)."""
    py = sys.executable
    torch_cmd = [py, "-c", PART if parts else "import torch"]
    floor_code = FLOOR_PART if parts else raw_floor.REGISTER
    runner = run_part if parts else run
    cli = shutil.which("opregistry", path=str(Path(py).parent)) or "opregistry"
    block = benchops.other_op_packages()
    cache = root / "cache"

    def env(paths: list[Path], **extra: str) -> dict[str, str]:
        return benchops.environ([*paths, HERE], OPREGISTRY_CACHE_DIR=str(cache),
                                OPREGISTRY_BLOCK=block, **extra)

    found: dict[str, Callable[[], tuple[float, float]]] = {
        "bare": lambda: runner(torch_cmd, env([], TORCH_DEVICE_BACKEND_AUTOLOAD="0")),
        "backends": lambda: runner(torch_cmd, env([]))}
    adopted = realsite.ensure_site(realsite.REAL_PINS)
    found["bare adopted"] = lambda: runner(torch_cmd, env([adopted],
                                                          TORCH_DEVICE_BACKEND_AUTOLOAD="0"))
    found["adopted"] = lambda: runner(torch_cmd, env([adopted]))
    counter = [0]

    def cold(paths: list[Path]) -> tuple[float, float]:
        counter[0] += 1
        return runner(torch_cmd,
                      {**env(paths), "OPREGISTRY_CACHE_DIR":
                       str(root / f"cold{'-part' if parts else ''}{counter[0]}")})

    def rebuild(paths: list[Path], folder: Path) -> tuple[float, float]:
        shutil.rmtree(folder / "plans", ignore_errors=True)
        return runner(torch_cmd, {**env(paths), "OPREGISTRY_CACHE_DIR": str(folder)})

    for n in sizes:
        gen = root / f"gen{n}"
        if not gen.exists():
            benchops.write_many(gen, n // 10, 10)
        found[f"floor {n}"] = (lambda n=n: runner([py, "-c", floor_code, str(n)],
                                                  env([], TORCH_DEVICE_BACKEND_AUTOLOAD="0")))
        found[f"import torch + {n}"] = lambda g=gen: runner(torch_cmd, env([g]))
        if not parts:
            found[f"list --json {n}"] = lambda g=gen: run([cli, "list", "--json"], env([g]))
        if baseline is not None:
            this, base = source_paths(HERE.parent), source_paths(baseline)
            found[f"cold {n}"] = lambda g=gen, p=this: cold([*p, g])
            found[f"cold {n} baseline"] = lambda g=gen, p=base: cold([*p, g])
            found[f"rebuild {n}"] = (lambda g=gen, p=this, n=n:
                                     rebuild([*p, g], root / f"rebuild{n}"))
            found[f"rebuild {n} baseline"] = (lambda g=gen, p=base, n=n:
                                              rebuild([*p, g], root / f"rebuild{n}-baseline"))
    return found


def _pairs(sizes: list[int]) -> list[tuple[str, str, str]]:
    """``(ratio, case, the case it is divided by)``."""
    pairs = [("backends / bare", "backends", "bare"),
             ("adopted / bare adopted", "adopted", "bare adopted")]
    for n in sizes:
        pairs += [(f"import torch + {n} / floor {n}", f"import torch + {n}", f"floor {n}"),
                  (f"list --json {n} / bare", f"list --json {n}", "bare"),
                  (f"cold {n} / baseline", f"cold {n}", f"cold {n} baseline"),
                  (f"rebuild {n} / baseline", f"rebuild {n}", f"rebuild {n} baseline")]
    return pairs


def part_ratios(samples: dict[str, list[tuple[float, float]]], sizes: list[int]
                ) -> dict[str, dict[str, float]]:
    """The ratios rebuilt from in-process parts on the same rep's bare ``import torch``."""
    found = {}
    for name, a, b in _pairs(sizes):
        if a not in samples or b not in samples:
            continue
        bare = "bare adopted" if "adopted" in a else "bare"
        per_pair = []
        for i, (part, _) in enumerate(samples[a]):
            bare_part, bare_whole = samples[bare][i]
            base = bare_whole - bare_part  # import torch alone (its autoload off)
            per_pair.append((base + part) / (base if b == bare else base + samples[b][i][0]))
        found[name] = {"cpu": statistics.median(per_pair), "cpu_min": min(per_pair),
                       "cpu_max": max(per_pair)}
    return found


def ratios(samples: dict[str, list[tuple[float, float]]], sizes: list[int]
           ) -> dict[str, dict[str, float]]:
    found = {}
    for name, a, b in _pairs(sizes):
        if a not in samples or b not in samples:
            continue
        row = {}
        for i, clock in enumerate(("wall", "cpu")):
            per_pair = [x[i] / y[i] for x, y in zip(samples[a], samples[b])]
            row[clock] = statistics.median(per_pair)
            row[f"{clock}_min"], row[f"{clock}_max"] = min(per_pair), max(per_pair)
        found[name] = row
    return found


def objects_per_op(root: Path, sizes: list[int]) -> dict[str, float]:
    py = sys.executable
    block = benchops.other_op_packages()

    def count(cmd: list[str], paths: list[Path], **extra: str) -> int:
        env = benchops.environ([*paths, HERE], OPREGISTRY_CACHE_DIR=str(root / "cache"),
                               OPREGISTRY_BLOCK=block, **extra)
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True,
                             cwd=benchops.neutral_cwd()).stdout
        return int(out.split()[-1])

    bare = count([py, "-c", OBJECTS], [], TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    found = {}
    for n in sizes:
        floor = count([py, "-c", raw_floor.REGISTER + "\n" + OBJECTS.partition("; ")[2], str(n)],
                      [], TORCH_DEVICE_BACKEND_AUTOLOAD="0")
        ours = count([py, "-c", OBJECTS], [root / f"gen{n}"])
        found[f"opregistry {n}"] = (ours - bare) / n
        found[f"floor {n}"] = (floor - bare) / n
    return found


def main() -> int:
    parser = benchops.size_parser(__doc__.splitlines()[0], reps=5)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--baseline", type=Path, metavar="DIR",
                        help="today's main, exported and compiled (cold start vs it)")
    parser.add_argument("--no-parts", action="store_true",
                        help="whole processes only (no in-process parts)")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        todo = cases(root, opts.sizes, opts.baseline)
        for case in todo.values():  # warm: .pyc files, page cache, the plan cache
            case()
        samples = benchops.interleaved(todo, opts.reps)
        objects = objects_per_op(root, opts.sizes)
        parts: dict[str, list[tuple[float, float]]] = {}
        if not opts.no_parts:
            todo = cases(root, opts.sizes, opts.baseline, parts=True)
            parts = benchops.interleaved(todo, opts.reps)
    print(f"whole processes, {opts.reps} interleaved reps; median [min-max] of per-pair ratios")
    for name, values in samples.items():
        print(f"  {name:28s} wall {statistics.median(v[0] for v in values):7.3f} s   "
              f"cpu {statistics.median(v[1] for v in values):7.3f} s")
    found = ratios(samples, opts.sizes)
    _print_ratios(found)
    for name, per_op in objects.items():
        print(f"  objects kept per op, {name:18s} {per_op:7.1f}")
    in_process = part_ratios(parts, opts.sizes) if parts else {}
    if parts:
        print("in process (CPU): opregistry's part (the floor's registrations) inside import "
              "torch, and the ratios rebuilt on bare import torch")
        for name, values in parts.items():
            print(f"  {name:28s} part {statistics.median(v[0] for v in values):7.3f} s   "
                  f"import torch {statistics.median(v[1] for v in values):7.3f} s")
        _print_ratios(in_process)
    if opts.json:
        opts.json.write_text(json.dumps({"ratios": found, "objects_per_op": objects,
                                         "seconds": samples, "in_process": in_process,
                                         "parts": parts}, indent=1))
    return 0


def _print_ratios(found: dict[str, dict[str, float]]) -> None:
    for name, row in found.items():
        target = TARGETS.get(name)
        verdict = "" if target is None else (
            f"target <= {target:.2f}: {'met' if row['cpu'] <= target else 'NOT MET'} (cpu)")
        wall = (f"wall {row['wall']:5.2f} [{row['wall_min']:.2f}-{row['wall_max']:.2f}]  "
                if "wall" in row else "")
        print(f"  {name:36s} {wall}cpu {row['cpu']:5.2f} "
              f"[{row['cpu_min']:.2f}-{row['cpu_max']:.2f}]  {verdict}")


if __name__ == "__main__":
    sys.exit(main())
