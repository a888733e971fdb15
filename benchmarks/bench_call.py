"""Per-call overhead: opregistry ops vs torch.library baselines, in one process, interleaved.

    python benchmarks/bench_call.py [--device cpu|cuda] [--reps 15] [--ops one twelve three]
                                    [--json out.json]

Prints, for each op (1 argument, 12 arguments, a 3-op kernel) and mode
(no-grad inputs, grad forward+backward, inference_mode), the median time per
call of every style, and the ratios the issues set targets for.  The header
names the torch version and whether its PyObject dispatch (torch 2.14+) is
used for opregistry's ops: run it once per torch version for the
per-version table of docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchops  # noqa: E402

benchops.ensure_importable()

import torch  # noqa: E402

import opregistry  # noqa: E402
from opregistry import torch_state  # noqa: E402

STYLES = ["direct", "define/impl", "define/impl+full", "custom_op", "custom_op+autograd",
          "opregistry cpu", "opregistry full",
          # kernel candidates (docs/op-authors.md): a CPU kernel with a predicate in front
          # of a fallback, the predicate accepting / declining; and the predicate alone
          "candidate accepts", "candidate declines", "predicate alone",
          # the full op kept on the dispatcher's C++ path (torch 2.14+'s PyObject dispatch off)
          "opregistry full, C++ path"]
MODES = ["no-grad", "grad fwd+bwd", "inference_mode"]
#: styles that can run backward (the others have no autograd formula)
GRAD_STYLES = ["direct", "define/impl+full", "custom_op+autograd", "opregistry full",
               "opregistry full, C++ path"]


def styles_for(mode: str) -> list[str]:
    return GRAD_STYLES if mode == "grad fwd+bwd" else STYLES


def base_for(mode: str) -> str:
    return "define/impl+full" if mode == "grad fwd+bwd" else "define/impl"


OPS = ["one", "twelve", "three"]


def build(ns: str, root: Path, names: list[str] | None = None
          ) -> tuple[dict[str, dict[str, Callable[..., Any]]], Any]:
    """Every style of the ops ``names``; returns ``{op: {style: callable}}`` and the registry."""
    ops: dict[str, dict[str, Callable[..., Any]]] = {name: {} for name in names or OPS}
    keep: list[Any] = []
    for name in ops:
        ops[name]["direct"] = benchops.PARTS[name]["cpu"]
        op, libs = benchops.define_impl(f"{ns}_di", name)
        ops[name]["define/impl"] = op.default
        keep += libs
        op, libs = benchops.define_impl(f"{ns}_dif", name, full=True)
        ops[name]["define/impl+full"] = op.default
        keep += libs
        op, libs = benchops.custom_op(f"{ns}_co", name)
        ops[name]["custom_op"] = op
        keep += libs
        op, libs = benchops.custom_op(f"{ns}_coa", name, autograd=True)
        ops[name]["custom_op+autograd"] = op
        keep += libs
    sys.path.insert(0, str(root))
    benchops.write_distribution(root, f"bench-cpu-{ns}", f"{ns}_oc", full=False)
    benchops.write_distribution(root, f"bench-full-{ns}", f"{ns}_of", full=True)
    _write_candidates(root, ns)
    benchops.write_distribution(root, f"bench-fullcpp-{ns}", f"{ns}_ofc", full=True)
    registry = opregistry.load(plugins=[*benchops.BACKENDS, f"bench-cpu-{ns}",
                                        f"bench-full-{ns}", f"bench-cand-{ns}",
                                        f"bench-fullcpp-{ns}"], strict=True,
                                reload=True)
    import importlib

    predicates = importlib.import_module(f"{ns}_preds")
    for name in ops:
        ops[name]["opregistry cpu"] = getattr(getattr(torch.ops, f"{ns}_oc"), name).default
        ops[name]["opregistry full"] = getattr(getattr(torch.ops, f"{ns}_of"), name).default
        ops[name]["candidate accepts"] = getattr(getattr(torch.ops, f"{ns}_ca"), name).default
        ops[name]["candidate declines"] = getattr(getattr(torch.ops, f"{ns}_cd"), name).default
        ops[name]["predicate alone"] = predicates.yes
        # the same op kept on the dispatcher's C++ path: what the PyObject dispatch
        # (torch 2.14+) buys; on an older torch, a second measurement of "opregistry full"
        cpp = getattr(getattr(torch.ops, f"{ns}_ofc"), name).default
        cpp(*benchops.inputs(name))  # the first eager call switches it where torch can...
        if torch_state.fast_dispatch_available():
            cpp._enable_pyobj_dispatch(False)  # ...and this switches it back, for good
        ops[name]["opregistry full, C++ path"] = cpp
    build.keep = keep  # type: ignore[attr-defined]
    return ops, registry


def _write_candidates(root: Path, ns: str) -> None:
    """Distribution ``bench-cand-NS``: every op, CPU only, as a candidate with a predicate
    (``NS_ca``: it accepts every call; ``NS_cd``: it declines every call) and a fallback."""
    (root / f"{ns}_preds.py").write_text(
        "def yes(*args, **kwargs):\n    return True\n\n\n"
        "def no(*args, **kwargs):\n    return False\n")
    lines = ["from opregistry import Candidate, OpLibrary"]
    for suffix, predicate in (("ca", "yes"), ("cd", "no")):
        lines.append(f"lib_{suffix} = OpLibrary('{ns}_{suffix}')")
        for name in benchops.SCHEMAS:
            lines.append(
                f"lib_{suffix}.define({name + benchops.SCHEMAS[name]!r}, kernels={{'cpu': ["
                f"Candidate('benchops:{name}', predicate='{ns}_preds:{predicate}'), "
                f"'benchops:{name}']}})")
    module = f"bench_cand_{ns}"
    info = root / f"{module}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: bench-cand-{ns}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        f"[opregistry.ops]\nca = {module}:lib_ca\ncd = {module}:lib_cd\n")
    (root / f"{module}.py").write_text("\n".join(lines) + "\n")


def chain_overhead(number: int = 200_000) -> dict[str, float]:
    """What :func:`opregistry.selection.chain` adds to a call, measured without the dispatcher."""
    import timeit

    from opregistry.selection import Step, chain, counted, observer

    x = torch.ones(1)

    def kernel(x: Any) -> Any:
        return x

    def yes(x: Any) -> bool:
        return True

    def no(x: Any) -> bool:
        return False

    calls = {
        "kernel": kernel,
        "predicate": yes,
        "chain of one candidate (is the kernel)": chain("b::op", "CPU", [Step(kernel)]),
        "chain, predicate accepts": chain("b::op", "CPU", [Step(kernel, yes), Step(kernel)],
                                          keywords=False),
        "chain, predicate declines": chain("b::op", "CPU", [Step(kernel, no), Step(kernel)],
                                           keywords=False),
        "chain, predicate accepts (with **kwargs)": chain(
            "b::op", "CPU", [Step(kernel, yes), Step(kernel)]),
        # which kernel ran (OPREGISTRY_KERNEL_COUNTS=1); off, torch calls `kernel` itself
        "kernel, counting on": counted("b::op", "CPU", "k", kernel),
        "chain, predicate accepts, counting on": chain(
            "b::op", "CPU", [Step(kernel, yes), Step(kernel)],
            observer("b::op", "CPU", ["a", "b"]), keywords=False),
    }
    return {label: min(timeit.repeat(lambda f=f: f(x), number=number, repeat=7)) / number * 1e6
            for label, f in calls.items()}


def runner(fn: Callable[..., Any], args: tuple[Any, ...], mode: str, grad_out: Any
           ) -> Callable[[int], float]:
    """A loop of ``n`` calls in ``mode``; returns seconds."""
    if mode == "no-grad":
        def run(n: int) -> float:
            t = time.perf_counter()
            for _ in range(n):
                fn(*args)
            return time.perf_counter() - t
    elif mode == "grad fwd+bwd":
        def run(n: int) -> float:
            t = time.perf_counter()
            for _ in range(n):
                fn(*args).backward(grad_out)
            return time.perf_counter() - t
    else:
        def run(n: int) -> float:
            with torch.inference_mode():
                t = time.perf_counter()
                for _ in range(n):
                    fn(*args)
                return time.perf_counter() - t
    return run


def measure(ops: dict[str, dict[str, Callable[..., Any]]], device: str, reps: int,
            number: int) -> dict[tuple[str, str, str], float]:
    """Median microseconds per call, ``(op, mode, style) -> us``; styles interleaved."""
    samples: dict[tuple[str, str, str], list[float]] = {}
    runs: dict[tuple[str, str, str], Callable[[int], float]] = {}
    for name, styles in ops.items():
        for mode in MODES:
            args = benchops.inputs(name, grad=mode == "grad fwd+bwd", device=device)
            grad_out = torch.ones(8, device=device)
            for style in styles_for(mode):
                run = runner(styles[style], args, mode, grad_out)
                run(50)  # warm-up: caches, lazily built autograd.Function
                runs[(name, mode, style)] = run
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(reps):
        for key, run in runs.items():
            n = number // 4 if key[1] == "grad fwd+bwd" else number
            sync()
            elapsed = run(n)
            sync()
            samples.setdefault(key, []).append(elapsed / n * 1e6)
    return {k: statistics.median(v) for k, v in samples.items()}


TARGETS = [
    # (op mode, numerator style, denominator style, comparison, bound, text)
    ("no-grad", "opregistry full", "define/impl", "<=", 1.3, "full op vs define/impl, no grad"),
    ("no-grad", "custom_op+autograd", "opregistry full", ">=", 2.5,
     "custom_op (same registrations) / full op, no grad"),
    ("no-grad", "custom_op+autograd", "opregistry full", ">=", 1.5,
     "same, issue 18's bound on every torch version"),
    ("grad fwd+bwd", "custom_op+autograd", "opregistry full", ">=", 1.5,
     "custom_op+autograd / full op, fwd+bwd"),
    ("inference_mode", "opregistry full", "define/impl", "<=", 1.1,
     "full op vs define/impl, inference_mode"),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--number", type=int, default=2000)
    parser.add_argument("--ops", nargs="+", choices=OPS, default=OPS)
    parser.add_argument("--json", type=Path)
    opts = parser.parse_args()
    ns = f"bench{uuid.uuid4().hex[:6]}"
    with tempfile.TemporaryDirectory() as tmp:
        ops, registry = build(ns, Path(tmp), opts.ops)
        results = measure(ops, opts.device, opts.reps, opts.number)
        fast = sorted(op for op in torch_state.fast_dispatch_enabled()
                      if op.startswith(f"{ns}_of::"))
        registry.unload()
    print(f"torch {torch.__version__}, device {opts.device}, median of {opts.reps} interleaved reps,"
          f" us per call; PyObject dispatch for opregistry's ops: "
          f"{'on' if fast else 'off'} ({len(fast)} ops; torch has it: "
          f"{torch_state.fast_dispatch_available()})")
    rows = []
    for name in ops:
        for mode in MODES:
            print(f"\n{name} ({len(benchops.inputs(name))} args), {mode}")
            for style in styles_for(mode):
                us = results[(name, mode, style)]
                base = results[(name, mode, base_for(mode))]
                print(f"  {style:26s} {us:8.2f} us   {us / base:5.2f}x {base_for(mode)}")
    print("\ntargets")
    for name in ops:
        for mode, num, den, cmp, bound, text in TARGETS:
            ratio = results[(name, mode, num)] / results[(name, mode, den)]
            met = ratio <= bound if cmp == "<=" else ratio >= bound
            rows.append({"op": name, "target": text, "ratio": round(ratio, 3),
                         "bound": f"{cmp} {bound}", "met": met})
            print(f"  {name:7s} {text:50s} {ratio:5.2f}  (target {cmp} {bound})  "
                  f"{'met' if met else 'NOT MET'}")
    candidates: list[dict[str, Any]] = []
    print("\nkernel candidates (CPU kernel, no autograd): extra cost over the plain kernel, "
          "in predicate calls")
    for name in ops:
        for mode in ("no-grad", "inference_mode"):
            plain = results[(name, mode, "opregistry cpu")]
            alone = results[(name, mode, "predicate alone")]
            for style in ("candidate accepts", "candidate declines"):
                us = results[(name, mode, style)]
                candidates.append({"op": name, "case": f"{style} / opregistry cpu, {mode}",
                                   "ratio": round(us / plain, 3)})
                print(f"  {name:7s} {mode:15s} {style:18s} {us:7.2f} us = {us / plain:4.2f}x "
                      f"opregistry cpu; +{us - plain:5.2f} us = {(us - plain) / alone:4.2f} "
                      f"predicate calls ({alone:.2f} us each)")
    chain_us = chain_overhead()
    print("\nthe candidates' chain alone, in Python (no dispatcher: less noise), us per call, "
          "min of 7")
    for label, us in chain_us.items():
        print(f"  {label:40s} {us:6.3f} us")
    extra = chain_us["chain, predicate accepts"] - chain_us["kernel"]
    print(f"  extra cost of a predicate candidate: {extra:.3f} us = "
          f"{extra / chain_us['predicate'] :.2f}x one predicate call")
    candidates.append({"op": "-", "case": "chain extra / predicate call (chain alone)",
                       "ratio": round(extra / chain_us["predicate"], 3)})
    if opts.json:
        opts.json.write_text(json.dumps({
            "device": opts.device, "torch": torch.__version__, "pyobj_dispatch": fast,
            "us": {" | ".join(k): round(v, 3) for k, v in results.items()},
            "targets": rows, "candidates": candidates,
            "chain_us": {k: round(v, 4) for k, v in chain_us.items()}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
