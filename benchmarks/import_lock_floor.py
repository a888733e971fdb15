"""What torch charges a registration made while ``import torch`` is still running.

    python benchmarks/import_lock_floor.py [--ops 10000] [--reps 5] [--json out.json]

opregistry registers its ops at ``import torch`` (the device-backend
autoload runs inside torch's own import); the floor (``raw_floor.py``)
registers after ``import torch`` returned.  Each ``Library.impl`` (from
C++) and each fake-kernel registration imports ``torch`` again, and while the module is still
initializing Python takes its import lock for that (``_lock_unlock_module``):
a cost per registration that only registrations made inside ``import
torch`` pay.  This script times ``raw_floor.py``'s registrations of N ops in
fresh processes, after ``import torch`` and with ``torch.__spec__._initializing``
set as during torch's import, interleaved, and prints the medians and their
difference.  No opregistry code runs.  opregistry itself does not pay it when
the process has no other Python thread (``torch_state.torch_importing_alone``).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from raw_floor import REGISTER, options  # noqa: E402

CHILD = ("import sys, time\nimport torch\n"
         "torch.__spec__._initializing = sys.argv[2] == '1'\n"
         "_start = time.perf_counter()\n" + REGISTER +
         "\nprint(time.perf_counter() - _start)\n")


def run(n_ops: int, initializing: bool) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPREGISTRY_")}
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    out = subprocess.run([sys.executable, "-c", CHILD, str(n_ops), "1" if initializing else "0"],
                         env=env, check=True, capture_output=True, text=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> int:
    opts, n = options(__doc__.splitlines()[0], reps=5)
    after, during = [], []
    for _ in range(opts.reps):
        after.append(run(n, False))
        during.append(run(n, True))
    a, d = statistics.median(after), statistics.median(during)
    print(f"registering {n} ops (define + CPU, Autograd, FuncTorchBatched impl + fake kernel), "
          f"median of {opts.reps} processes")
    print(f"  after import torch           {a:.3f} s")
    print(f"  while torch is initializing  {d:.3f} s")
    print(f"  difference                   {d - a:+.3f} s ({(d - a) / n * 1e6:+.2f} us per op)")
    if opts.json:
        opts.json.write_text(json.dumps({"ops": n, "seconds": {"after": after,
                                                                "initializing": during}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
