"""Where the extra wall time of ``import torch`` with N autoloaded ops goes: import or exit.

    python benchmarks/startup_phases.py [--dists 100] [--ops-per-dist 10] [--reps 5]

Runs ``import torch`` as whole processes, with the N generated ops (as
``bench_startup.py``, warm plan cache, every other op package blocked), bare
(``TORCH_DEVICE_BACKEND_AUTOLOAD=0``) and the floor (the same N ops
registered with torch's own calls, ``raw_floor.REGISTER``, counted in the
import), interleaved, and splits each process's wall time into three parts:
the ``import torch`` statement itself; what comes after it up to the last
``atexit`` handler (nothing, here, but the handlers: torch's, and the
``weakref.finalize`` of every ``torch.library.Library``); and interpreter
finalization after the last handler (garbage collection of everything
still alive, module teardown, C++ static destructors) until the process
has exited; and, within the ``import torch`` statement, the time the
cyclic garbage collector's passes took (``gc.callbacks``).  A third variant destroys every opregistry registration by hand
before exiting: what opregistry itself does at exit (a control, expected
within the noise of the second).  A second run
of each variant times one full garbage collection right after ``import
torch`` (the interpreter's finalization runs such collections over
everything still alive) and counts the objects it tracks.  Medians of
``--reps`` runs; no timing is asserted anywhere.
"""

from __future__ import annotations

import ast
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import benchops  # noqa: E402
import raw_floor  # noqa: E402
from bench_startup import environ  # noqa: E402

CHILD = ("import atexit, gc, os, time\n"
         "atexit.register(lambda: os.write(W_EXIT, repr(time.time()).encode()))\n"
         "spent = [0.0]\n"
         "def collecting(phase, info, clock=time.perf_counter, spent=spent):\n"
         "    spent[0] += clock() if phase == 'stop' else -clock()\n"
         "gc.callbacks.append(collecting)\n"
         "t0 = time.time()\nimport torch\nREGISTER\n"
         "gc.callbacks.remove(collecting)\n"
         "os.write(W_IMPORT, repr((time.time() - t0, spent[0])).encode())\n")
#: appended to a child: one full collection timed, and the objects tracked, on a third pipe
COLLECT = ("import gc\ngc.collect()\nt1 = time.perf_counter()\ngc.collect()\n"
           "os.write(W_GC, repr((time.perf_counter() - t1, len(gc.get_objects()))).encode())\n")
DESTROY = ("import opregistry\nr = opregistry.get_registry()\n"
           "r is not None and r._materialized.destroy()\n")


def _child(env: dict[str, str], code: str, *names: str) -> list[bytes]:
    """Run ``code``; what it wrote on the pipe each of ``names`` (in ``code``) stands for."""
    pipes = [os.pipe() for _ in names]
    for name, (_, w) in zip(names, pipes):
        code = code.replace(name, str(w))
    proc = subprocess.Popen([sys.executable, "-c", code], env=env,
                            pass_fds=tuple(w for _, w in pipes))
    for _, w in pipes:
        os.close(w)
    proc.wait()
    found = [os.read(r, 100) for r, _ in pipes]
    for r, _ in pipes:
        os.close(r)
    if proc.returncode:
        raise RuntimeError(f"child exited with {proc.returncode}")
    return found


def run(env: dict[str, str], extra: str = "", register: str = ""
        ) -> tuple[float, float, float, float]:
    """(wall, import torch [+ ``register``], finalization after the last atexit handler,
    the garbage collector's passes within the import)."""
    start = time.time()
    last_handler, imported = _child(env, CHILD.replace("REGISTER", register) + extra,
                                    "W_EXIT", "W_IMPORT")
    end = time.time()
    seconds, collecting = ast.literal_eval(imported.decode())
    return end - start, seconds, end - float(last_handler), collecting


def collection(env: dict[str, str], register: str = "") -> tuple[float, int]:
    """(one full garbage collection after ``import torch`` [+ ``register``], objects tracked)."""
    [found] = _child(env, "import os, time\nimport torch\n" + register + "\n" + COLLECT, "W_GC")
    seconds, objects = ast.literal_eval(found.decode())
    return seconds, objects


def main() -> int:
    parser = benchops.size_parser(__doc__.splitlines()[0], reps=5)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        gen = Path(tmp) / "gen"
        n = opts.dists * opts.ops_per_dist
        benchops.write_many(gen, opts.dists, opts.ops_per_dist)
        ours = environ([gen, HERE], OPREGISTRY_CACHE_DIR=str(Path(tmp) / "cache"),
                       OPREGISTRY_BLOCK=benchops.other_op_packages())
        bare = environ([HERE], TORCH_DEVICE_BACKEND_AUTOLOAD="0")
        floor = f"import sys\nsys.argv[1:] = [{str(n)!r}]\n{raw_floor.REGISTER}"
        variants = {
            "bare import torch": (bare, "", ""),
            "import torch + N ops by hand (the floor)": (bare, "", floor),
            "import torch + N ops": (ours, "", ""),
            "same, registrations destroyed before exit": (ours, DESTROY, ""),
        }
        for env, extra, register in variants.values():  # warm up: .pyc files, the plan cache
            run(env, extra, register)
        samples = benchops.interleaved(
            {name: (lambda e=env, x=extra, r=register: (*run(e, x, r), *collection(e, r)))
             for name, (env, extra, register) in variants.items()}, opts.reps)
    result = {name: dict(zip(("wall", "import torch", "finalization", "gc in import",
                              "full collection", "objects"),
                             (statistics.median(col) for col in zip(*rows))))
              for name, rows in samples.items()}
    print(f"import torch with {opts.dists * opts.ops_per_dist} generated ops, seconds, "
          f"median of {opts.reps} interleaved runs; a full collection after import torch, "
          f"and the objects it tracks")
    print(f"  {'':44s} {'wall':>7s} {'import':>7s} {'final.':>7s} {'gc in import':>12s} "
          f"{'full gc':>8s} {'objects':>8s}")
    for name, parts in result.items():
        print(f"  {name:44s} {parts['wall']:7.3f} {parts['import torch']:7.3f} "
              f"{parts['finalization']:7.3f} {parts['gc in import']:12.3f} "
              f"{parts['full collection']:8.3f} {parts['objects']:8.0f}")
    if opts.json:
        opts.json.write_text(json.dumps({"ops": opts.dists * opts.ops_per_dist,
                                         "seconds": result}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
