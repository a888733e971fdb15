"""The static scan of packages that use torch.library directly: cold and cached, whole processes.

    python benchmarks/bench_foreign_scan.py [--reps 5] [--site DIR] [--json PATH]
                                            [--heavy] [--baseline DIR]

What ``opregistry.scan.scan_installed()`` costs, without torch, for the real
packages bitsandbytes 0.50.2 and torchao 0.18.0 (installed with
``pip install --no-deps --target`` into ``--site``; by default the folder
tests/test_foreign_real.py installs them in, under the system's temporary
directory, installed here when missing), for every distribution of this
environment plus those two, and for five packages that name torch on every
page and register nothing (transformers, diffusers, timm, peft, accelerate:
``PROSE_PINS``, installed the same way into a folder of their own); with
``--heavy``, also for three that register hundreds of ops (vllm, sglang,
flashinfer: ``HEAVY_PINS``, ~440 MB of wheels).  Each is timed as a whole process
(``python -c "from opregistry.scan import scan_installed; scan_installed(...)"``)
and as the call alone (the child reports it, and the import of opregistry
before it: ~0.1 s, what any opregistry command pays), interleaved with bare
``import torch`` as the yardstick:

* **cold**: an empty cache directory (``OPREGISTRY_CACHE_DIR``) for every run,
  so every distribution is read and parsed (the operating system's file
  cache is warm: the first, untimed round reads every file once);
* **cached**: the cache filled by a previous run: each distribution's files
  are ``stat``-ed and its entry read.

With ``--baseline DIR`` (another tree of this repository: ``git archive REV |
tar -x -C DIR``, then ``python -m compileall DIR``), every cold scan is also
run with that tree's opregistry, interleaved, and the ratio of each pair's
scan call (this tree / the baseline) is reported: median and range, of wall
time and of the call's CPU time (user + system of the child during the call:
steadier on a shared machine).
"""

from __future__ import annotations

import argparse
import json
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
import realsite  # noqa: E402

PINS, DEFAULT_SITE = realsite.REAL_PINS, realsite.site_of(realsite.REAL_PINS)
#: packages whose modules name torch, and "define", "impl" or "fallback" in their prose
PROSE_PINS = realsite.MORE_PROSE_PINS
PROSE_SITE = realsite.site_of(PROSE_PINS)
#: packages that register hundreds of ops from Python and C++ (``--heavy``)
HEAVY_PINS = realsite.HEAVY_PINS
HEAVY_SITE = realsite.site_of(HEAVY_PINS)

CHILD = """
import json, sys, time
start = time.perf_counter()
import opregistry
from opregistry.scan import scan_installed
imported, cpu = time.perf_counter(), time.process_time()
only = sys.argv[1:] or None
found = scan_installed(only=only)
seconds, cpu = time.perf_counter() - imported, time.process_time() - cpu
print(json.dumps({"seconds": seconds, "cpu": cpu, "import": imported - start, "dists": len(found.distributions), "cached": found.cached,
                  "skipped": found.skipped, "ops": sum(len(d.ops()) for d in found.distributions),
                  "torch": "torch" in sys.modules, "code": opregistry.__file__}))
"""


class Runner:
    """Runs the scanning child; a fresh cache directory per cold run."""

    def __init__(self, site: Path, root: Path) -> None:
        self.site, self.root = site, root
        self.count = 0
        self.warm = False  # set after the untimed round: from then on "cached" must hit
        self.inner: dict[str, list[float]] = {}
        self.cpu: dict[str, list[float]] = {}  # the call's CPU time: steadier when shared
        self.last: dict[str, dict[str, object]] = {}

    def scan(self, name: str, only: list[str], cold: bool, site: Path | None = None,
             code: Path | None = None) -> float:
        """One child; ``code``: the tree whose opregistry it imports (default: this one)."""
        self.count += 1
        cache = self.root / (f"cold-{self.count}" if cold else f"warm-{name}")
        # the baseline's core first on the path (its plugins and examples are not scanned
        # code: the scan never imports them; the installed distributions are the same)
        env = benchops.environ([*([code] if code is not None else []), site or self.site],
                               OPREGISTRY_CACHE_DIR=str(cache))
        start = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", CHILD, *only], env=env, check=True,
                             capture_output=True, text=True, cwd=benchops.neutral_cwd())
        wall = time.perf_counter() - start
        data = json.loads(out.stdout)
        assert data["torch"] is False, "the scan imported torch"
        assert code is None or Path(data["code"]).resolve().is_relative_to(code.resolve()), \
            f"the child imported {data['code']}, not the baseline's opregistry"
        # every distribution but torch and opregistry (never scanned) from the cache
        assert cold or not self.warm or data["cached"] == data["dists"] + data["skipped"] - (
            0 if only else 2), data
        self.inner.setdefault(name, []).append(data["seconds"])
        self.cpu.setdefault(name, []).append(data["cpu"])
        self.last[name] = data
        return wall


def baseline_cases(runner: Runner, tree: Path, real: list[str], prose: list[str],
                   heavy: list[str] | None) -> dict[str, Callable[[], float]]:
    """The cold cases again with the baseline tree's opregistry (``base-*`` in ``runner.inner``)."""
    found: dict[str, Callable[[], float]] = {
        "bitsandbytes + torchao, cold, baseline": lambda: runner.scan(
            "base-real-cold", real, True, code=tree),
        "whole environment, cold, baseline": lambda: runner.scan(
            "base-all-cold", [], True, code=tree),
        "five prose packages, cold, baseline": lambda: runner.scan(
            "base-prose-cold", prose, True, PROSE_SITE, code=tree)}
    if heavy is not None:
        found["vllm + sglang + flashinfer, cold, baseline"] = lambda: runner.scan(
            "base-heavy-cold", heavy, True, HEAVY_SITE, code=tree)
    return found


def bare_torch() -> float:
    env = benchops.environ([], TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], env=env, check=True,
                   cwd=benchops.neutral_cwd())
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--site", type=Path, default=DEFAULT_SITE)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--heavy", action="store_true",
                        help="also scan vllm, sglang and flashinfer (~440 MB of wheels)")
    parser.add_argument("--baseline", type=Path, metavar="DIR",
                        help="another tree of this repository: its cold scans too, paired")
    opts = parser.parse_args()
    realsite.ensure_site(PINS, opts.site)
    realsite.ensure_site(PROSE_PINS, PROSE_SITE)
    real = ["bitsandbytes", "torchao"]
    prose = [p.partition("==")[0] for p in PROSE_PINS]
    heavy = [p.partition("==")[0] for p in HEAVY_PINS]
    if opts.heavy:
        realsite.ensure_site(HEAVY_PINS, HEAVY_SITE)
    with tempfile.TemporaryDirectory() as tmp:
        runner = Runner(opts.site, Path(tmp))
        cases = {
            "bitsandbytes + torchao, cold": lambda: runner.scan("real-cold", real, True),
            "bitsandbytes + torchao, cached": lambda: runner.scan("real", real, False),
            "whole environment, cold": lambda: runner.scan("all-cold", [], True),
            "whole environment, cached": lambda: runner.scan("all", [], False),
            "five prose packages, cold": lambda: runner.scan("prose-cold", prose, True,
                                                             PROSE_SITE),
            "five prose packages, cached": lambda: runner.scan("prose", prose, False,
                                                               PROSE_SITE),
            **({"vllm + sglang + flashinfer, cold": lambda: runner.scan(
                    "heavy-cold", heavy, True, HEAVY_SITE),
                "vllm + sglang + flashinfer, cached": lambda: runner.scan(
                    "heavy", heavy, False, HEAVY_SITE)} if opts.heavy else {}),
            "import torch (bare)": bare_torch,
        }
        if opts.baseline is not None:
            cases.update(baseline_cases(runner, opts.baseline, real, prose, heavy if opts.heavy
                                        else None))
        for case in cases.values():  # fills the warm caches and the OS file cache
            case()
        runner.inner.clear()
        runner.cpu.clear()
        runner.warm = True
        samples = benchops.interleaved(cases, opts.reps)
    res = {k: statistics.median(v) for k, v in samples.items()}
    inner = {k: statistics.median(v) for k, v in runner.inner.items()}
    bare = res["import torch (bare)"]
    everything = runner.last["all"]
    print(f"foreign scan, wall seconds of whole processes (and of the scan_installed call "
          f"alone), median of {opts.reps} interleaved runs; torch is never imported")
    names = dict(zip(cases, ["real-cold", "real", "all-cold", "all", "prose-cold", "prose",
                             *(["heavy-cold", "heavy"] if opts.heavy else []), None]))
    for case, sec in res.items():
        if case not in names:  # a baseline's case: reported as the pairs' ratio below
            continue
        call = f"  (the call {inner[names[case]] * 1000:7.1f} ms)" if names[case] else ""
        print(f"  {case:34s} {sec:7.3f} s  {sec / bare:5.2f}x bare import torch{call}")
    for name in ("real-cold", "all-cold", "prose-cold", "heavy-cold"):
        base = f"base-{name}"  # baseline_cases' names
        for clock, times in (("wall", runner.inner), ("CPU", runner.cpu)):
            if base in times:
                pairs = [a / b for a, b in zip(times[name], times[base])]
                print(f"  {name:12s} this / baseline (the call, {clock}, per pair): "
                      f"{statistics.median(pairs):.2f}x [{min(pairs):.2f}-{max(pairs):.2f}]  "
                      f"({statistics.median(times[name]) * 1000:.0f} ms vs "
                      f"{statistics.median(times[base]) * 1000:.0f} ms)")
    print(f"  import of opregistry.scan in the child: {everything['import'] * 1000:.0f} ms")
    print(f"  whole environment: {everything['dists']} distributions use torch, "
          f"{everything['skipped']} skipped, {everything['ops']} ops predicted")
    if opts.json is not None:
        opts.json.write_text(json.dumps({"seconds": res, "call_seconds": inner,
                                         "call_cpu_seconds": {k: statistics.median(v) for k, v
                                                              in runner.cpu.items()},
                                         "environment": everything}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
