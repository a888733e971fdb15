"""What lazy adoption costs ``import torch`` with N adopted packages nobody uses, whole processes.

    python benchmarks/bench_adoption.py [--packages 20] [--ops 5] [--reps 9] [--real] [--json PATH]

N generated distributions register their ops with ``torch.library`` at their
own import, as bitsandbytes does (``torch.library.define`` + ``register_fake``
in ``_ops.py``, a CPU kernel through ``register_kernel`` in
``backends/cpu.py``), installed as pip installs them (``*.dist-info`` with
``METADATA`` and ``RECORD``).  opregistry adopts every one of them lazily.
Timed, interleaved, as whole processes (``python -c "import torch"``), each
case beside the yardstick:

* ``bare``: ``import torch`` with opregistry's autoload off -- torch alone;
* ``none``: ``import torch`` with opregistry, no such package installed;
* ``N adopted, unused``: the N packages installed, adopted, none touched;
* ``N installed, adoption off``: the same with ``OPREGISTRY_ADOPT=0`` (the
  scan that protects them still runs: what adoption adds is the rest);
* ``N imported``: ``import torch`` and then every package -- what eager
  adoption (or importing them by hand) costs, the design lazy adoption avoids.

The scan's disk cache is warmed by an untimed round first (a user's second
``import torch`` onwards).  The first touch of one adopted namespace is
timed inside a child (``torch.ops.<ns>``: import of its package + its
registrations).  With ``--real``, bitsandbytes 0.50.2 and torchao 0.18.0
(the folder tests/test_foreign_real.py installs them in) instead of
generated packages: both adopted and unused vs none vs both imported.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import benchops  # noqa: E402
import realsite  # noqa: E402

OPS = '''
import torch

NS = "{ns}"
register_kernel = torch.library.register_kernel
'''
OP = '''
torch.library.define(f"{{NS}}::op{i}", "(Tensor x, float f) -> Tensor")


@torch.library.register_fake(f"{{NS}}::op{i}")
def _(x, f):
    return torch.empty_like(x)
'''
CPU = '''
from .._ops import NS, register_kernel
'''
KERNEL = '''

@register_kernel(f"{{NS}}::op{i}", "cpu")
def _(x, f):
    return x * f
'''

TOUCH = """
import json, sys, time
import torch
start = time.perf_counter()
getattr(torch.ops, sys.argv[1])
print(json.dumps({"touch": time.perf_counter() - start,
                  "imported": [m for m in sys.argv[2:] if m in sys.modules]}))
"""


def _record(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def write_package(site: Path, index: int, ops: int) -> str:
    """One adoptable distribution, ``adoptbench-<index>``; returns its top-level package."""
    pkg, ns = f"adoptbench_{index}", f"adoptbench{index}"
    files = {
        f"{pkg}/__init__.py": "from . import _ops\nfrom .backends import cpu\n",
        f"{pkg}/_ops.py": OPS.format(ns=ns) + "".join(OP.format(i=i) for i in range(ops)),
        f"{pkg}/backends/__init__.py": "",
        f"{pkg}/backends/cpu.py": CPU + "".join(KERNEL.format(i=i) for i in range(ops)),
    }
    info = f"adoptbench_{index}-1.0.dist-info"
    files[f"{info}/METADATA"] = (f"Metadata-Version: 2.1\nName: adoptbench-{index}\n"
                                 f"Version: 1.0\nRequires-Dist: torch\n")
    files[f"{info}/top_level.txt"] = pkg + "\n"
    rows = []
    for rel, text in files.items():
        data = textwrap.dedent(text).encode()
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(data)
        rows.append(f"{rel},{_record(data)},{len(data)}")
    (site / info / "RECORD").write_text("\n".join(rows + [f"{info}/RECORD,,"]) + "\n")
    return pkg


def timed(code: str, env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, check=True, cwd=benchops.neutral_cwd(),
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def first_touch(env: dict[str, str], namespace: str, modules: list[str], reps: int) -> float:
    samples = []
    for _ in range(reps):
        out = subprocess.run([sys.executable, "-c", TOUCH, namespace, *modules], env=env,
                             check=True, capture_output=True, text=True,
                             cwd=benchops.neutral_cwd())
        found = json.loads(out.stdout.splitlines()[-1])
        assert found["imported"] == modules[:1], found  # the package was imported by the touch
        samples.append(found["touch"])
    return statistics.median(samples)


def cases(site: Path, empty: Path, cache: Path, modules: list[str], label: str
          ) -> dict[str, tuple[str, dict[str, str]]]:
    env = {"OPREGISTRY_CACHE_DIR": str(cache)}
    return {
        "bare import torch (no opregistry)": (
            "import torch", benchops.environ([empty], OPREGISTRY_AUTOLOAD="0", **env)),
        "import torch, none installed": ("import torch", benchops.environ([empty], **env)),
        f"import torch, {label} adopted, unused": ("import torch", benchops.environ([site], **env)),
        f"import torch, {label} installed, adoption off": (
            "import torch", benchops.environ([site], OPREGISTRY_ADOPT="0", **env)),
        f"import torch + import of the {label}": (
            "import torch\n" + "\n".join(f"import {m}" for m in modules),
            benchops.environ([site], **env)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packages", type=int, default=20)
    parser.add_argument("--ops", type=int, default=5, help="ops per package")
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--real", action="store_true",
                        help="bitsandbytes 0.50.2 + torchao 0.18.0 instead of generated packages")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="opregistry-bench-adopt-") as tmp:
        root = Path(tmp)
        empty, cache = root / "empty", root / "cache"
        empty.mkdir()
        if args.real:
            site = realsite.ensure_site(realsite.REAL_PINS)
            modules, label = ["bitsandbytes", "torchao"], "2 (bitsandbytes, torchao)"
            namespace = "bitsandbytes"
        else:
            site = root / "site"
            site.mkdir()
            modules = [write_package(site, i, args.ops) for i in range(args.packages)]
            label, namespace = f"{args.packages} packages", "adoptbench0"
        table = cases(site, empty, cache, modules, label)
        for code, env in table.values():  # untimed: .pyc files written, the scan cache filled
            timed(code, env)
        samples = benchops.interleaved(
            {name: (lambda c=code, e=env: timed(c, e)) for name, (code, env) in table.items()},
            args.reps)
        touch = first_touch(table[f"import torch, {label} adopted, unused"][1], namespace,
                            modules, max(3, args.reps // 3))
    medians = {name: statistics.median(s) for name, s in samples.items()}
    base = medians["import torch, none installed"]
    bare = medians["bare import torch (no opregistry)"]
    print(f"torch {_torch_version()}, python {sys.version.split()[0]}, {args.reps} interleaved "
          f"reps, whole processes (median)")
    width = max(map(len, medians))
    print(f"  {'case':{width}s}  seconds  vs none  vs bare torch")
    for name, value in medians.items():
        print(f"  {name:{width}s}  {value:7.3f}  {value / base:6.3f}x  {value / bare:6.3f}x")
    print(f"  first touch of torch.ops.{namespace} (in process: imports its package): "
          f"{touch * 1000:.1f} ms")
    if args.json is not None:
        args.json.write_text(json.dumps({"medians": medians, "samples": samples,
                                         "first_touch": touch, "label": label}, indent=1))


def _torch_version() -> str:
    import importlib.metadata

    return importlib.metadata.version("torch")


if __name__ == "__main__":
    main()
