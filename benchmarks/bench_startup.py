"""Start-up: ``opregistry list --json`` and ``import torch`` with N generated ops, as whole processes.

    python benchmarks/bench_startup.py [--dists 100] [--ops-per-dist 10] [--reps 7]
                                       [--baseline DIR]

Generates ``--dists`` op distributions (``*.dist-info`` + declarations
module, CPU + fake + autograd + vmap per op) in a temporary directory put on
``PYTHONPATH``, then times, interleaved, as separate processes:

* ``import torch (bare)``: ``TORCH_DEVICE_BACKEND_AUTOLOAD=0 python -c "import torch"``;
* ``import torch``: ``python -c "import torch"`` with only this repository's
  distributions installed (opregistry autoloads them);
* ``import torch + N ops``: the same with the generated distributions;
* ``opregistry list --json``: the CLI, with the generated distributions.

With ``--baseline DIR`` (an export of another commit of this repository,
e.g. ``git archive COMMIT | tar -x -C DIR``), the two opregistry processes
also run with that commit's code (``DIR`` and its plugins' and examples'
source folders first on ``PYTHONPATH``; ``opregistry list`` as
``python -m opregistry`` for both), alternating with this checkout's, and it
reports the median of the per-pair ratios: a before/after comparison that a
shared machine's load cannot skew as much as two separate runs.

Every timed process runs in an empty working directory
(``benchops.neutral_cwd``): ``python -c`` / ``-m`` put the working
directory first on ``sys.path``, so run from a checkout's root a
``[baseline]`` process would import that checkout's ``opregistry``.

It also checks (untimed) that the autoloaded registry holds the generated
ops and that ``opregistry list`` never imported torch.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import benchops  # noqa: E402  (imports torch here only; the timed processes are separate)

CHECK_LIST = (
    "import sys, io, contextlib\n"
    "from opregistry import cli\n"
    "with contextlib.redirect_stdout(io.StringIO()):\n"
    "    cli.main(['list', '--json'])\n"
    "assert 'torch' not in sys.modules, 'opregistry list imported torch'\n"
    "print('torch not imported')\n"
)
CHECK_AUTOLOAD = ("import torch, opregistry\n"
                  "r = opregistry.get_registry()\n"
                  "print(len(r.ops), len(r.errors))\n")


environ = benchops.environ


def source_paths(root: Path) -> list[Path]:
    """The folders of a checkout that hold importable code: the core, plugins, examples."""
    return [root, *sorted(p for p in (root / "plugins").iterdir() if p.is_dir()),
            *sorted(p for p in (root / "examples").iterdir() if p.is_dir())]


def commands(gen: Path, baseline: Path | None = None
             ) -> dict[str, tuple[list[str], dict[str, str]]]:
    py = sys.executable
    cli = shutil.which("opregistry", path=str(Path(py).parent)) or "opregistry"
    cmds = {
        "import torch (bare)": ([py, "-c", "import torch"],
                                environ([HERE], TORCH_DEVICE_BACKEND_AUTOLOAD="0")),
        "import torch": ([py, "-c", "import torch"], environ([HERE])),
        "import torch + N ops": ([py, "-c", "import torch"], environ([gen, HERE])),
        "opregistry list --json": ([cli, "list", "--json"], environ([gen, HERE])),
    }
    if baseline is not None:
        here = source_paths(HERE.parent)
        base = source_paths(baseline)
        cmds["import torch + N ops [this]"] = ([py, "-c", "import torch"],
                                              environ([*here, gen, HERE]))
        cmds["import torch + N ops [baseline]"] = ([py, "-c", "import torch"],
                                                  environ([*base, gen, HERE]))
        cmds["python -m opregistry list --json [this]"] = (
            [py, "-m", "opregistry", "list", "--json"], environ([*here, gen, HERE]))
        cmds["python -m opregistry list --json [baseline]"] = (
            [py, "-m", "opregistry", "list", "--json"], environ([*base, gen, HERE]))
    return cmds


#: what ``run`` measures: ``"wall"`` seconds, or ``"cpu"``, the process' user + system CPU seconds
CLOCK = ["wall"]


def run(cmd: list[str], env: dict[str, str]) -> float:
    t = time.perf_counter()
    # in an empty directory: python -c / -m put the working directory first on sys.path
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            cwd=benchops.neutral_cwd())
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, cmd)
    return usage.ru_utime + usage.ru_stime if CLOCK[0] == "cpu" else wall


def check(gen: Path, n_ops: int) -> None:
    env = environ([gen, HERE])
    out = subprocess.run([sys.executable, "-c", CHECK_LIST], env=env, check=True,
                         capture_output=True, text=True, cwd=benchops.neutral_cwd()).stdout
    assert "torch not imported" in out, out
    out = subprocess.run([sys.executable, "-c", CHECK_AUTOLOAD], env=env, check=True,
                         capture_output=True, text=True, cwd=benchops.neutral_cwd()).stdout
    ops = int(out.split()[0])
    assert ops >= n_ops, f"autoload registered {ops} ops, expected >= {n_ops}"


def measure(n_dists: int, per_dist: int, reps: int, root: Path,
            baseline: Path | None = None) -> dict[str, float]:
    gen = root / f"gen{n_dists}"
    benchops.write_many(gen, n_dists, per_dist)
    check(gen, n_dists * per_dist)
    cmds = commands(gen, baseline)
    for cmd, env in cmds.values():  # warm the page cache and .pyc files
        run(cmd, env)
    samples = benchops.interleaved(
        {name: (lambda c=cmd, e=env: run(c, e)) for name, (cmd, env) in cmds.items()}, reps)
    result = {k: statistics.median(v) for k, v in samples.items()}
    for name in list(samples):
        if name.endswith(" [this]"):  # the median of the per-pair ratios, this / baseline
            other = samples[name[:-len(" [this]")] + " [baseline]"]
            result[name[:-len(" [this]")] + " this/baseline"] = statistics.median(
                a / b for a, b in zip(samples[name], other))
    return result


def main() -> int:
    parser = benchops.size_parser(__doc__.splitlines()[0], reps=7)
    parser.add_argument("--cpu", action="store_true",
                        help="time each process' CPU (user + system) instead of its wall time: "
                             "steadier on a machine other jobs share (torch's thread pools "
                             "count too)")
    parser.add_argument("--baseline", type=Path, metavar="DIR",
                        help="another commit's source tree, timed in alternation with this one")
    opts = parser.parse_args()
    CLOCK[0] = "cpu" if opts.cpu else "wall"
    n = opts.dists * opts.ops_per_dist
    with tempfile.TemporaryDirectory() as tmp:
        res = measure(opts.dists, opts.ops_per_dist, opts.reps, Path(tmp), opts.baseline)
    bare = res["import torch (bare)"]
    print(f"start-up with {n} generated ops ({opts.dists} distributions), {CLOCK[0]} seconds, "
          f"median of {opts.reps} interleaved runs")
    for name, sec in res.items():
        if name.endswith("this/baseline"):
            print(f"  {name:50s} {sec:5.2f}x (median of the per-pair ratios)")
        else:
            print(f"  {name:50s} {sec:7.3f} s  {sec / bare:5.2f}x bare import torch")
    targets = [
        ("opregistry list --json / bare import torch (<= 0.15)",
         res["opregistry list --json"] / bare, res["opregistry list --json"] / bare <= 0.15),
        ("import torch + N ops / bare import torch (<= 1.2)",
         res["import torch + N ops"] / bare, res["import torch + N ops"] / bare <= 1.2),
    ]
    benchops.report_targets(targets, 55, opts.json, {"ops": n, "seconds": res})
    print("  checked: opregistry list did not import torch; autoload registered the ops")
    return 0


if __name__ == "__main__":
    sys.exit(main())
