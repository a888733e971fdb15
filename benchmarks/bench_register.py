"""Registration cost: N ops (define + CPU + fake + autograd) three ways, one process, interleaved.

    python benchmarks/bench_register.py [--dists 100] [--ops-per-dist 10] [--reps 5]

* ``torch.library``: ``Library.define`` + ``Library.impl(CPU)`` +
  ``register_fake`` + ``register_autograd``, the raw calls;
* ``custom_op``: ``torch.library.custom_op`` + ``register_fake`` + ``register_autograd``;
* ``opregistry materialize``: :func:`opregistry.materializer.materialize` of
  the resolved plan of generated distributions (the same registrations);
* ``opregistry load``: the whole :func:`opregistry.load` — discover (entry
  points, modules already imported after the first rep), collect, resolve,
  materialize.

Each rep registers into fresh namespaces (or unloads first) and tears down
outside the timed region.  Prints median seconds and ratios.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchops  # noqa: E402

benchops.ensure_importable()

import torch  # noqa: E402

import opregistry  # noqa: E402
from opregistry.state import process  # noqa: E402

SCHEMA = "(Tensor x) -> Tensor"


def raw_torch(n_dists: int, per_dist: int) -> Callable[[], float]:
    def run() -> float:
        tag = uuid.uuid4().hex[:6]
        libs = []
        t = time.perf_counter()
        for d in range(n_dists):
            ns = f"raw{tag}_{d}"
            lib = torch.library.Library(ns, "DEF")
            libs.append(lib)
            for i in range(per_dist):
                lib.define(f"op{i}{SCHEMA}")
                lib.impl(f"op{i}", benchops.one, "CPU")
                torch.library.register_fake(f"{ns}::op{i}", benchops.one_fake, lib=lib)
                torch.library.register_autograd(f"{ns}::op{i}", benchops.one_backward,
                                                setup_context=benchops.one_setup, lib=lib)
        elapsed = time.perf_counter() - t
        for lib in libs:
            lib._destroy()
        return elapsed
    return run


def custom_op(n_dists: int, per_dist: int) -> Callable[[], float]:
    def run() -> float:
        tag = uuid.uuid4().hex[:6]
        ops = []
        t = time.perf_counter()
        for d in range(n_dists):
            for i in range(per_dist):
                op = torch.library.custom_op(f"co{tag}_{d}::op{i}", benchops.one, mutates_args=(),
                                             schema=SCHEMA)
                op.register_fake(benchops.one_fake)
                op.register_autograd(benchops.one_backward, setup_context=benchops.one_setup)
                ops.append(op)
        elapsed = time.perf_counter() - t
        for op in ops:
            op._lib._destroy()
        return elapsed
    return run


def opregistry_runs(root: Path, n_dists: int, per_dist: int
                    ) -> tuple[Callable[[], float], Callable[[], float]]:
    """(materialize only, whole load) over ``n_dists`` generated distributions."""
    from opregistry.collect import collect
    from opregistry.config import Settings
    from opregistry.discovery import discover
    from opregistry.materializer import materialize
    from opregistry.resolver import resolve

    tag = f"reg{uuid.uuid4().hex[:6]}"
    names = benchops.write_many(root, n_dists, per_dist, tag=tag, vmap=False)
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    allow = [*benchops.BACKENDS, *names]

    def materialize_only() -> float:
        settings = Settings(allow=frozenset(allow), strict=True)
        collected = collect(discover(settings))
        plan = resolve(collected.declarations, policy=settings.policy)
        assert not plan.errors, plan.errors
        t = time.perf_counter()
        done = materialize(plan, collected.materializers)
        elapsed = time.perf_counter() - t
        assert len(done.ops) == n_dists * per_dist and not done.problems, done.problems
        done.destroy()
        return elapsed

    def whole_load() -> float:
        t = time.perf_counter()
        registry = opregistry.load(plugins=allow, strict=True, reload=True)
        elapsed = time.perf_counter() - t
        assert len(registry.ops) == n_dists * per_dist
        registry.unload()
        return elapsed

    return materialize_only, whole_load


def measure(n_dists: int, per_dist: int, reps: int, root: Path) -> dict[str, float]:
    """Median seconds per style, styles interleaved within each rep."""
    materialize_only, whole_load = opregistry_runs(root, n_dists, per_dist)
    runs = {"torch.library": raw_torch(n_dists, per_dist), "custom_op": custom_op(n_dists, per_dist),
            "opregistry materialize": materialize_only, "opregistry load": whole_load}
    whole_load()  # first import of the generated modules happens here, not in a timed rep
    samples = benchops.interleaved(runs, reps)
    return {k: statistics.median(v) for k, v in samples.items()}


def main() -> int:
    parser = benchops.size_parser(__doc__.splitlines()[0], reps=5)
    opts = parser.parse_args()
    process().registry = None  # what autoload loaded at `import torch` stays registered
    with tempfile.TemporaryDirectory() as tmp:
        res = measure(opts.dists, opts.ops_per_dist, opts.reps, Path(tmp))
    n = opts.dists * opts.ops_per_dist
    print(f"torch {torch.__version__}: registering {n} ops (define + CPU + fake + autograd), "
          f"{opts.dists} namespaces, median of {opts.reps} interleaved reps")
    for name, sec in res.items():
        print(f"  {name:24s} {sec * 1e3:9.1f} ms  {sec / n * 1e6:7.1f} us/op  "
              f"{sec / res['torch.library']:5.2f}x torch.library")
    mat, raw, co = res["opregistry materialize"], res["torch.library"], res["custom_op"]
    targets = [("materialize vs torch.library (<= 1.0)", mat / raw, mat / raw <= 1.0),
               ("custom_op / materialize (>= 5)", co / mat, co / mat >= 5)]
    benchops.report_targets(targets, 40, opts.json, {"ops": n, "seconds": res})
    return 0


if __name__ == "__main__":
    sys.exit(main())
