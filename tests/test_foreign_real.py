"""The static scan against real packages from the index: bitsandbytes 0.50.2 and torchao 0.18.0
(and transformers 4.46.3, which registers nothing: what must not be parsed).

Both register their ops with ``torch.library`` at their own import.  The pinned
wheels are installed with ``pip install --no-deps --target`` into a folder
under the system's temporary directory, reused by later runs (as
tests/native_build.py reuses its builds); bitsandbytes needs numpy and
packaging at import, which the development environment has.

The scan runs in one interpreter with that folder on ``PYTHONPATH`` and no
torch; the ground truth in others, by importing each package and diffing
``torch._C._dispatch_get_all_op_names()`` (torch's own namespaces, which
importing torch's submodules fills, left out).  Asserted:

* **namespaces**: every namespace the package registers is predicted;
* **ops**: every op is predicted (recall 100%, for these pinned versions):
  bitsandbytes names each op with a constant string in ``_ops.py`` and
  registers kernels through an alias of ``register_kernel`` from its
  ``backends/*/ops.py``; torchao builds names with f-strings, helper
  functions (``register_custom_op_impl("blocksparse::addmm")``), and a
  decorator factory that names the op after the decorated function
  (``_register_custom_op(quant_lib)``: ``fn.__name__`` without its leading
  underscore), which the scan follows;
* **precision**: every op predicted at module level outside any ``if`` is
  registered once the module the scan names is imported.

The figures are printed (``pytest -s``) and quoted in docs/ecosystem.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from opregistry.foreign import ForeignDistribution, ForeignScan
from opregistry.keys import RESERVED_NAMESPACES

from .conftest import realsite

PINS = realsite.REAL_PINS

PACKAGES = {"bitsandbytes": "bitsandbytes", "torchao": "torchao"}

SCAN = """
import json, sys, time
start = time.perf_counter()
from opregistry.scan import scan_installed
found = scan_installed(only=sys.argv[1:])
print(json.dumps({"scan": found.to_dict(), "seconds": time.perf_counter() - start,
                  "torch_imported": "torch" in sys.modules}))
"""

#: argv: a module to import first (the package), then the modules whose ops to check
GROUND_TRUTH = """
import importlib, json, sys
import torch
before = set(torch._C._dispatch_get_all_op_names())
importlib.import_module(sys.argv[1])
after_package = set(torch._C._dispatch_get_all_op_names())
failed = {}
for name in sys.argv[2:]:
    try:
        importlib.import_module(name)
    except Exception as exc:
        failed[name] = repr(exc)[:300]
print(json.dumps({"package": sorted(after_package - before),
                  "modules": sorted(set(torch._C._dispatch_get_all_op_names())),
                  "failed": failed}))
"""


@pytest.fixture(scope="module")
def real_site(real_packages: Path) -> Path:
    return real_packages


def _env(site: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(site), "OPREGISTRY_AUTOLOAD": "0", **extra}


@pytest.fixture(scope="module")
def scanned(real_site: Path, tmp_path_factory: pytest.TempPathFactory) -> ForeignScan:
    cache = tmp_path_factory.mktemp("cache")
    out = subprocess.run([sys.executable, "-c", SCAN, *PACKAGES], capture_output=True, text=True,
                         env=_env(real_site, OPREGISTRY_CACHE_DIR=str(cache)), timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    data = json.loads(out.stdout)
    assert data["torch_imported"] is False
    print(f"\nscan of {', '.join(PINS)}: {data['seconds']:.2f} s cold (in process, no torch)")
    return ForeignScan.from_dict(data["scan"])


def _truth(site: Path, package: str, modules: list[str]) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", GROUND_TRUTH, package, *modules],
                         capture_output=True, text=True, env=_env(site), timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


def _own(ops: list[str]) -> set[str]:
    return {op for op in ops if op.split("::")[0] not in RESERVED_NAMESPACES}


def _sure(dist: ForeignDistribution) -> dict[str, str]:
    """op -> module, of the ops defined at module level outside any condition."""
    return {r.op: r.module for r in dist.registrations
            if r.kind == "op" and r.op and r.at_import and not r.conditional}


@pytest.mark.slow
@pytest.mark.parametrize("dist", sorted(PACKAGES))
def test_scan_predicts_the_real_package(real_site: Path, scanned: ForeignScan, dist: str) -> None:
    found = scanned.get(dist)
    assert found is not None
    sure = _sure(found)
    truth = _truth(real_site, PACKAGES[dist], sorted(set(sure.values())))
    assert not truth["failed"]
    real = _own(truth["package"])  # type: ignore[arg-type]
    predicted = found.ops()
    real_ns = {op.split("::")[0] for op in real}
    hit = real & predicted
    missed = real - predicted
    after_modules = set(truth["modules"])  # type: ignore[arg-type]
    confirmed = {op for op in sure if op in after_modules}
    print(f"\n{found.distribution.text}: namespaces {len(real_ns & found.namespaces())}/"
          f"{len(real_ns)} predicted ({sorted(found.namespaces())}); ops registered by "
          f"`import {PACKAGES[dist]}`: {len(hit)}/{len(real)} predicted, missed {sorted(missed)}; "
          f"{len(predicted)} ops predicted in all, {len(sure)} unconditionally at import, "
          f"{len(confirmed)} of these registered after importing their modules; "
          f"{len(found.unresolved())} registrations unresolved")
    assert real and real_ns <= found.namespaces()
    assert not missed
    if dist == "bitsandbytes":
        assert not found.unresolved()
        assert set(sure.values()) == {"bitsandbytes._ops"}
    assert confirmed == set(sure)


PROSE = """
import ast, json
from opregistry.scan import scan_installed
parsed = []
real_parse = ast.parse
def counting(source, filename="<unknown>", *args, **kwargs):
    parsed.append(str(filename))
    return real_parse(source, filename, *args, **kwargs)
ast.parse = counting
found = scan_installed(only=["transformers"], cache=False)
[dist] = found.distributions
print(json.dumps({"registrations": len(dist.registrations), "files": dist.files,
                  "parsed": parsed}))
"""


def test_a_package_that_names_torch_in_prose_is_not_parsed(prose_packages: Path) -> None:
    """transformers 4.46.3: 116 of its modules name torch and "define", "impl" or
    "fallback" in docstrings and comments, two in code; only modules whose code names a
    registration function are parsed (all 116 were: a first scan of 4 s)."""
    out = subprocess.run([sys.executable, "-c", PROSE], capture_output=True, text=True,
                         env=_env(prose_packages), timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    data = json.loads(out.stdout.splitlines()[-1])
    assert data["registrations"] == 0 and data["files"] > 1000, data
    assert len(data["parsed"]) <= 5, data["parsed"]
