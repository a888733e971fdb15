"""Parsing 10,000 distinct schemas with opregistry's schema parser (no torch).

    python benchmarks/bench_schema_parse.py [--count 10000] [--reps 15] [--baseline DIR]

The resolver parses every op's schema at every start-up (``opregistry list``
and ``import torch`` alike), so the parser's cost is a per-op start-up cost.
The schemas are the forms op packages write (bitsandbytes, vLLM and
``torch.library.infer_schema`` style: tensors, optional tensors, ints, floats,
lists, defaults, keyword-only arguments, ``Tensor(a!)`` mutation, tuples
of returns; no form the parser of an older commit refuses, so that
``--baseline`` times the same work), each made distinct by its argument
names so that :func:`opregistry.schema.parse_signature`'s memo never answers: what is
timed is the parser itself, through its public entry point, with the memo
cleared before every repetition.

With ``--baseline DIR`` (another commit of this repository, e.g.
``git archive COMMIT | tar -x -C DIR``), the same schemas are parsed by that
checkout's parser too, in a child process per repetition, alternating with
this checkout's (also a child per repetition, so both pay the same): the
printed ratio is the median of the per-pair ratios, this / baseline.  Run it
from any directory; the children run in an empty one so that only the
PYTHONPATH given decides which ``opregistry`` they import.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

#: what op packages write; ``{s}`` makes each copy distinct (an argument name's suffix)
TEMPLATES = (
    "(Tensor x{s}) -> Tensor",
    "(Tensor x{s}, Tensor y) -> Tensor",
    "(Tensor A{s}, Tensor absmax, int blocksize, str quant_type, int[] shape, "
    "ScalarType dtype) -> Tensor",
    "(Tensor A{s}, Tensor B, Tensor? bias=None, float alpha=1.0, *, bool transpose=False) "
    "-> Tensor",
    "(Tensor(a!) out{s}, Tensor input, Tensor weight, float epsilon) -> ()",
    "(Tensor input{s}, Tensor weight, Tensor? bias, int[] stride, SymInt[] padding, "
    "int[] dilation, int groups) -> Tensor",
    "(Tensor self{s}, int dim=-1, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor",
    "(Tensor q{s}, Tensor k, Tensor v, Tensor? attn_mask=None, float dropout_p=0.0, "
    "bool is_causal=False, float? scale=None) -> (Tensor, Tensor)",
    "(Tensor[] tensors{s}, int dim=0) -> Tensor",
    "(Tensor x{s}, int[2] kernel_size, int[2] stride=[1, 1], int[2] padding=0) -> Tensor",
    "(Tensor(a!) self{s}, Tensor src, bool non_blocking=False) -> Tensor(a!)",
    "(Tensor x{s}, Scalar other, *, Scalar alpha=1) -> Tensor",
    "(Tensor x{s}, str mode=\"mean\", float eps=1e-05) -> Tensor",
    "(Tensor input{s}, Tensor weight, Tensor? bias=None, *, Tensor(a!) out) -> Tensor(a!)",
    "(Tensor x{s}, Tensor y, Tensor? z=None, SymInt n=1, bool flag=True) -> "
    "(Tensor values, Tensor indices)",
    "(Tensor x{s}, Device? device=None, Layout? layout=None, bool? pin_memory=None) -> Tensor",
    "(Tensor x{s}, Generator? generator=None) -> Tensor",
)


def schemas(count: int) -> list[str]:
    return [TEMPLATES[i % len(TEMPLATES)].format(s=i) for i in range(count)]


CHILD = r'''
import json, sys, time
from opregistry import schema as S
texts = json.loads(sys.stdin.read())
parse = S.parse_signature
clear = S._parse_signature_cached.cache_clear
clear()
for t in texts[:200]:  # warm the interpreter's caches (regexes, attribute lookups)
    parse(t)
clear()
t0 = time.perf_counter()
for t in texts:
    parse(t)
print(time.perf_counter() - t0)
'''


def run(texts: list[str], source: Path, cwd: str) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPREGISTRY_")}
    env["PYTHONPATH"] = str(source)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # timed children use bytecode as users' do
    out = subprocess.run([sys.executable, "-c", CHILD], input=json.dumps(texts), text=True,
                         capture_output=True, env=env, cwd=cwd, check=True)
    return float(out.stdout.strip())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--baseline", type=Path, metavar="DIR",
                        help="another checkout's tree: its parser is timed alternately")
    parser.add_argument("--json", type=Path, metavar="PATH")
    opts = parser.parse_args()
    texts = schemas(opts.count)
    samples: dict[str, list[float]] = {"this": [], "baseline": []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(opts.reps):
            samples["this"].append(run(texts, ROOT, tmp))
            if opts.baseline is not None:
                samples["baseline"].append(run(texts, opts.baseline.resolve(), tmp))
    result: dict[str, float] = {}
    for name, values in samples.items():
        if values:
            result[f"{name} us/schema"] = statistics.median(values) / opts.count * 1e6
            print(f"{name:9s} median {statistics.median(values) * 1e3:8.1f} ms for "
                  f"{opts.count} schemas = {result[f'{name} us/schema']:.2f} us/schema "
                  f"(min {min(values) * 1e3:.1f} ms)")
    if samples["baseline"]:
        ratios = [a / b for a, b in zip(samples["this"], samples["baseline"])]
        result["this/baseline"] = statistics.median(ratios)
        print(f"this/baseline: {result['this/baseline']:.3f} (median of per-pair ratios)")
    if opts.json:
        opts.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
