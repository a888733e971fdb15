"""Locked mode: ``import torch`` with OPREGISTRY_LOCK vs without, N generated ops, whole processes.

    python benchmarks/bench_lock.py [--dists 100] [--ops-per-dist 10] [--reps 9]

Generates ``--dists`` op distributions (as ``bench_startup.py``: dist-info +
declarations module, CPU + fake + autograd + vmap per op) twice, in two
temporary directories put on ``PYTHONPATH``:

* ``wheel``: each with a ``RECORD`` of sha256 hashes (``METADATA``,
  ``entry_points.txt``, the module and its ``.pyc``), as pip writes it;
* ``source``: no ``RECORD`` (the editable / hand-made case: the module the
  entry point names is walked and hashed).

Writes one lockfile per directory (``opregistry lock``), then times,
interleaved, as separate processes: bare ``import torch`` (autoload off),
and ``import torch`` unlocked and locked (``OPREGISTRY_LOCK``) for each
directory.  The locked mode re-hashes every locked file at every start
(no cache: see docs/performance.md).  It also times, in this process, the
check itself (:func:`opregistry.lock_gate.gate`) against the 100 distributions,
and checks (untimed) that a locked ``import torch`` registers every op with
no error.
"""

from __future__ import annotations

import base64
import hashlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import benchops  # noqa: E402

CHECK = ("import torch, opregistry\n"
         "r = opregistry.get_registry()\n"
         "print(len(r.ops), len(r.errors), sum(p.code.startswith('lock-') for p in r.problems))\n")


environ = benchops.environ


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def write_records(root: Path) -> None:
    """Give every generated distribution in ``root`` a pip-style RECORD with sha256 hashes."""
    for info in sorted(root.glob("*.dist-info")):
        module = info.name.split("-")[0]
        files = [f"{info.name}/METADATA", f"{info.name}/entry_points.txt", f"{module}.py"]
        files += [str(p.relative_to(root)) for p in (root / "__pycache__").glob(f"{module}.*.pyc")]
        rows = []
        for rel in files:
            data = (root / rel).read_bytes()
            rows.append(f"{rel},sha256={_b64(data)},{len(data)}")
        rows.append(f"{info.name}/RECORD,,")
        (info / "RECORD").write_text("\n".join(rows) + "\n")


def run(cmd: list[str], env: dict[str, str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


def lock(gen: Path, path: Path) -> None:
    cli = shutil.which("opregistry", path=str(Path(sys.executable).parent)) or "opregistry"
    subprocess.run([cli, "lock", "-o", str(path)], env=environ([gen, HERE]), check=True,
                   stdout=subprocess.DEVNULL)


def check(gen: Path, path: Path, n_ops: int) -> None:
    out = subprocess.run([sys.executable, "-c", CHECK], check=True, capture_output=True,
                         text=True, env=environ([gen, HERE], OPREGISTRY_LOCK=str(path))).stdout
    ops, errors, lock_problems = map(int, out.split())
    assert ops >= n_ops and errors == 0 and lock_problems == 0, \
        f"locked import torch: {ops} ops, {errors} errors, {lock_problems} lock problems"


def gate_seconds(gen: Path, path: Path, reps: int) -> float:
    """The locked mode's own check (no import of any plugin), in a fresh process, median."""
    code = ("import sys, time, statistics\n"
            "from opregistry.config import Settings\n"
            "from opregistry.lock_gate import gate\n"
            f"s = Settings(lock={str(path)!r})\n"
            "gate(s)\n"
            "t = []\n"
            f"for _ in range({reps}):\n"
            "    a = time.perf_counter(); g = gate(s); t.append(time.perf_counter() - a)\n"
            "    assert not g.refused and not g.problems, g.problems\n"
            "print(statistics.median(t))\n")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True, env=environ([gen, HERE])).stdout
    return float(out)


def main() -> int:
    parser = benchops.size_parser(__doc__.splitlines()[0], reps=9)
    opts = parser.parse_args()
    n = opts.dists * opts.ops_per_dist
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        cmds = {"import torch (bare)": ([py, "-c", "import torch"],
                                        environ([HERE], TORCH_DEVICE_BACKEND_AUTOLOAD="0"))}
        gates = {}
        for kind in ("wheel", "source"):
            gen = root / kind
            benchops.write_many(gen, opts.dists, opts.ops_per_dist)
            if kind == "wheel":
                write_records(gen)
            path = root / f"{kind}.lock"
            lock(gen, path)
            check(gen, path, n)
            gates[kind] = gate_seconds(gen, path, opts.reps)
            cmds[f"import torch, {kind}, unlocked"] = ([py, "-c", "import torch"],
                                                       environ([gen, HERE]))
            cmds[f"import torch, {kind}, locked"] = (
                [py, "-c", "import torch"], environ([gen, HERE], OPREGISTRY_LOCK=str(path)))
        for cmd, env in cmds.values():  # warm the page cache
            run(cmd, env)
        samples = benchops.interleaved(
            {name: (lambda c=cmd, e=env: run(c, e)) for name, (cmd, env) in cmds.items()},
            opts.reps)
    res = {k: statistics.median(v) for k, v in samples.items()}
    bare = res["import torch (bare)"]
    print(f"locked mode with {n} generated ops ({opts.dists} distributions), wall seconds, "
          f"median of {opts.reps} interleaved runs")
    for name, sec in res.items():
        print(f"  {name:32s} {sec:7.3f} s  {sec / bare:5.2f}x bare import torch")
    for kind, sec in gates.items():
        print(f"  the lock check alone ({kind}, {opts.dists} distributions, in process): "
              f"{sec * 1000:.1f} ms")
    targets = []
    for kind in ("wheel", "source"):
        ratio = res[f"import torch, {kind}, locked"] / res[f"import torch, {kind}, unlocked"]
        targets.append((f"locked / unlocked import torch, {kind} (<= 1.1)", ratio, ratio <= 1.1))
    benchops.report_targets(targets, 50, opts.json,
                            {"ops": n, "seconds": res, "gate_seconds": gates})
    print("  checked: a locked import torch registered every op, with no error")
    return 0


if __name__ == "__main__":
    sys.exit(main())
