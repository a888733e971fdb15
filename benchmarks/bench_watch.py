"""What watching registrations costs: opregistry's recorder of torch.library registrations, on and off.

Once opregistry is loaded (at ``import torch``), every registration made
through ``torch.library.Library`` is noted with the line of the code that
made it (``opregistry.torch_state.Recorder``), so that ``list --live`` can
name the distribution behind it.  Measured side by side, whole processes
(``import torch`` with opregistry's autoload off, then the recorder installed
or not), interleaved, median of ``--reps``:

* per registration: ``--ops`` ops defined the way bitsandbytes does
  (``torch.library.define``, ``register_kernel``, ``register_fake``), per op;
* ``import <package>`` wall time, for each package given with ``--import``
  (bitsandbytes, torchao: ``--site`` names a folder where they are installed,
  e.g. the one tests/test_foreign_real.py fills).

    python benchmarks/bench_watch.py --ops 500 --reps 9 \\
        --site /tmp/opregistry-foreign-real/bitsandbytes-0.50.2+torchao-0.18.0 \\
        --import bitsandbytes --import torchao
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Callable

import benchops

#: child: define --ops ops as bitsandbytes does, timing only the registrations
REGISTER = """
import json, sys, time, torch
from opregistry.torch_state import recorder
if sys.argv[1] == "on":
    recorder()
n, ns = int(sys.argv[2]), sys.argv[3]
def kernel(x):
    return x
def fake(x):
    return torch.empty_like(x)
# the first registration imports what torch needs for them: not timed, either way
torch.library.define(f"{ns}::warm", "(Tensor x) -> Tensor")
torch.library.register_kernel(f"{ns}::warm", "cpu", kernel)
torch.library.register_fake(f"{ns}::warm", fake)
start = time.perf_counter()
for i in range(n):
    torch.library.define(f"{ns}::op{i}", "(Tensor x) -> Tensor")
    torch.library.register_kernel(f"{ns}::op{i}", "cpu", kernel)
    torch.library.register_fake(f"{ns}::op{i}", fake)
print(json.dumps({"seconds": time.perf_counter() - start}))
"""

#: child: import one package, timing only its import
IMPORT = """
import importlib, json, sys, time, torch
from opregistry.torch_state import recorder
if sys.argv[1] == "on":
    recorder()
start = time.perf_counter()
importlib.import_module(sys.argv[2])
print(json.dumps({"seconds": time.perf_counter() - start}))
"""


def _child(code: str, args: list[str], site: str | None) -> float:
    # a real file, as a package's module is: torch reads the registering code's source file
    # for each fake kernel, and for ``-c`` code it searches every module (~1 ms a call)
    script = Path(benchops.neutral_cwd()) / f"bench_watch_{abs(hash(code))}.py"
    if not script.exists():
        script.write_text(code)
    env = benchops.environ([Path(site)] if site else [], OPREGISTRY_AUTOLOAD="0")
    out = subprocess.run([sys.executable, str(script), *args], capture_output=True,
                         text=True, env=env, cwd=benchops.neutral_cwd(), timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"bench_watch: child failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])["seconds"]


def _paired(code: str, args: Callable[[int], list[str]], reps: int,
            site: str | None) -> dict[str, list[float]]:
    found: dict[str, list[float]] = {"off": [], "on": []}
    for rep in range(reps):
        for mode in (("off", "on") if rep % 2 == 0 else ("on", "off")):
            found[mode].append(_child(code, [mode, *args(rep)], site))
    return found


def _row(name: str, times: dict[str, list[float]], per: int = 1) -> str:
    off, on = statistics.median(times["off"]), statistics.median(times["on"])
    ratios = [b / a for a, b in zip(times["off"], times["on"])]
    unit = 1e6 / per if per > 1 else 1e3
    label = "us per op" if per > 1 else "ms"
    return (f"  {name:36s} off {off * unit:9.2f} {label}  on {on * unit:9.2f} {label}  "
            f"on/off {statistics.median(ratios):.3f} (pairs {min(ratios):.3f}-{max(ratios):.3f})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=500)
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--site", help="a folder holding the packages to import")
    parser.add_argument("--import", dest="imports", action="append", default=[],
                        metavar="PACKAGE")
    opts = parser.parse_args()
    import torch

    print(f"torch {torch.__version__}, python {sys.version.split()[0]}: recorder off vs on, "
          f"whole processes, median of {opts.reps} interleaved reps")
    times = _paired(REGISTER, lambda rep: [str(opts.ops), f"benchwatch{rep}"], opts.reps, None)
    print(_row(f"register {opts.ops} ops (3 calls each)", times, per=opts.ops))
    for package in opts.imports:
        times = _paired(IMPORT, lambda rep, p=package: [p], opts.reps, opts.site)
        print(_row(f"import {package}", times))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
