"""Adoption of a real package from the index: bitsandbytes 0.50.2, which registers its 19 ops
with torch.library at its own import, unchanged.

Installed ``--no-deps`` into a folder under the system's temporary directory,
reused by later runs (the ``real_packages`` fixture of tests/conftest.py).  Every check runs
in fresh interpreters with that folder on ``PYTHONPATH`` and opregistry's
autoload on, as a user's process would:

* listed without torch (from the scan), attributed (the distribution and the
  module and line of every op and kernel; live, torch's registration sites
  belong to bitsandbytes' files);
* locked: ``opregistry lock`` records its files; a tampered file makes
  ``verify`` fail and, in locked mode, opregistry refuses to import it --
  while ``import bitsandbytes`` by hand still works;
* a kernel switched off (``OPREGISTRY_KERNELS``): the CPU kernel is never
  registered, the package's default kernel serves;
* available without an explicit import: a program exported with
  ``torch.export`` reloaded in a fresh process, a spawn DataLoader worker,
  the ranks of ``torchrun``;
* ``NativeLibrary(module="bitsandbytes")`` is refused, and bitsandbytes works;
* optimum-quanto 0.2.7, below the namespace package ``optimum`` (no
  ``__init__.py``): the first touch of ``torch.ops.quanto`` imports
  ``optimum.quanto``, not ``optimum``, and its CPU kernel runs;
* fbgemm-gpu-cpu 1.9.0, whose C++ libraries are stripped of their symbols:
  its namespace read from their strings, listed and adopted.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from . import adoption_dists

pytestmark = pytest.mark.slow

OP = "bitsandbytes::quantize_blockwise"


@pytest.fixture(scope="module")
def bnb_site(real_packages: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """bitsandbytes alone (no torchao), copied: the lock test edits a file of it."""
    site = tmp_path_factory.mktemp("bnb") / "site"
    site.mkdir()
    for entry in real_packages.iterdir():
        if entry.name.startswith("bitsandbytes"):
            shutil.copytree(entry, site / entry.name, ignore=shutil.ignore_patterns("__pycache__"))
    return site


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


def _env(site: Path, cache: Path, **extra: str) -> dict[str, str]:
    """This environment without opregistry's settings, the site on PYTHONPATH, ``extra`` last."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OPREGISTRY_")}
    environ.update({"PYTHONPATH": str(site), "OPREGISTRY_CACHE_DIR": str(cache), **extra})
    return environ


def run(site: Path, cache: Path, code: str, cwd: Path | None = None,
        **env: str) -> subprocess.CompletedProcess[str]:
    """``python -c code`` (or ``python -m ...`` when ``code`` starts with ``-m``)."""
    argv = code.split() if code.startswith("-m") else ["-c", textwrap.dedent(code)]
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True,
                          env=_env(site, cache, **env), timeout=600, cwd=cwd)


def last_json(out: subprocess.CompletedProcess[str]) -> dict:
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


def test_listed_without_torch(bnb_site: Path, cache: Path) -> None:
    found = last_json(run(bnb_site, cache, """
        import json, sys
        from opregistry import plan, report
        data = report.list_report(plan(), namespaces=["bitsandbytes"])
        print(json.dumps({"adopted": data["adopted"], "torch": "torch" in sys.modules,
                          "bnb": "bitsandbytes" in sys.modules}))
    """))
    assert found["torch"] is False and found["bnb"] is False
    (adopted,) = found["adopted"]
    assert adopted["distribution"] == {"name": "bitsandbytes", "version": "0.50.2"}
    assert (adopted["status"], adopted["load"]) == ("adopted", "lazy")
    assert adopted["namespaces"] == {"bitsandbytes": ["bitsandbytes"]}
    assert len(adopted["ops"]) == 19
    assert all(op["where"].startswith("bitsandbytes._ops:") for op in adopted["ops"])
    op = next(o for o in adopted["ops"] if o["name"] == OP)
    keys = {k["key"]: k["where"] for k in op["kernels"]}
    assert keys["CPU"].startswith("bitsandbytes.backends.cpu.ops:")
    assert keys["CompositeExplicitAutograd"].startswith("bitsandbytes.backends.default.ops:")
    text = run(bnb_site, cache, "-m opregistry list -n bitsandbytes")
    assert "bitsandbytes==0.50.2  [adopted, lazy" in text.stdout, text.stdout[-2000:]
    assert f"{OP}(Tensor A, Tensor code, int blocksize) -> (Tensor, Tensor)" in text.stdout


def test_attributed_live_to_its_distribution(bnb_site: Path, cache: Path) -> None:
    """After the first touch, the registering code of its op's kernels is bitsandbytes' files."""
    found = last_json(run(bnb_site, cache, f"""
        import json, sys
        import torch
        from opregistry import torch_state
        from opregistry.distfiles import owner_of
        imported_before = "bitsandbytes" in sys.modules
        torch.ops.bitsandbytes.quantize_blockwise
        # torch records every Python registration at torch/library.py: the Recorder knows
        # the registering code's file:line
        sites = {{slot: site for (op, slot), site in torch_state.recorder().sites.items()
                  if op == "{OP}"}}
        owners = {{key: owner_of(site.rpartition(":")[0]).text for key, site in sites.items()}}
        print(json.dumps({{"before": imported_before, "owners": owners}}))
    """))
    assert found["before"] is False
    assert found["owners"]["CPU"] == "bitsandbytes==0.50.2"
    assert found["owners"]["CompositeExplicitAutograd"] == "bitsandbytes==0.50.2"


FIRST_TOUCH = """
    import json, sys, torch
    from opregistry.state import process
    adopter = type(process().adopter).__name__
    before = sorted(m for m in sys.modules
                    if m.startswith(("bitsandbytes", "opregistry.registry", "pluggy")))
    q, _ = torch.ops.bitsandbytes.quantize_blockwise(
        torch.linspace(-1, 1, 256), torch.linspace(-1, 1, 256), 256)
    import opregistry
    r = opregistry.get_registry()
    print(json.dumps({"adopter": adopter, "before": before, "sum": int(q.sum()),
                      "cache": process().plan_cache,
                      "outcome": r.adopter.outcomes.get("bitsandbytes")}))
"""


def test_a_warm_import_torch_leaves_the_load_to_the_first_touch(bnb_site: Path,
                                                                tmp_path: Path) -> None:
    """bitsandbytes the only package that registers (the example op packages blocked): a warm
    ``import torch`` loads nothing, imports nothing of the pipeline or of bitsandbytes; the
    first touch of ``torch.ops.bitsandbytes`` loads the registry from its entry (a hit),
    which imports bitsandbytes, and the op gives what it gives without the cache."""
    cache = tmp_path / "cache"
    block = {"OPREGISTRY_BLOCK": "tutorial-ops,nnkit,nnkit-contrib,extension-cpp"}
    cold, warm, uncached = (last_json(run(bnb_site, cache, FIRST_TOUCH, **block, **extra))
                            for extra in ({}, {}, {"OPREGISTRY_CACHE": "0"}))
    assert cold["adopter"] == "Adopter" and "opregistry.registry" in cold["before"], cold
    assert warm["adopter"] == "Waiting" and warm["before"] == [], warm
    assert warm["cache"] == "hit" and uncached["cache"] == "off", (warm, uncached)
    assert warm["sum"] == cold["sum"] == uncached["sum"] != 0, (cold, warm, uncached)
    assert warm["outcome"] == uncached["outcome"] == "imported", (warm, uncached)


def test_locked_and_a_tampered_file_refused(bnb_site: Path, cache: Path,
                                            tmp_path: Path) -> None:
    site = tmp_path / "site"
    shutil.copytree(bnb_site, site)
    lock = tmp_path / "opregistry.lock"
    assert run(site, cache, f"-m opregistry lock -o {lock}").returncode == 0
    assert json.loads(lock.read_text())["adopted"]["bitsandbytes"]["version"] == "0.50.2"
    assert run(site, cache, f"-m opregistry verify {lock}").returncode == 0
    touch = """
        import json, torch, opregistry
        try:
            torch.ops.bitsandbytes.quantize_blockwise
            found, why = True, None
        except AttributeError as exc:
            found, why = False, str(exc)
        problems = [p.message for p in opregistry.get_registry().problems
                    if p.code == "lock-mismatch"]
        import bitsandbytes.functional as F
        q, state = F.quantize_blockwise(torch.linspace(-1, 1, 512))
        print(json.dumps({"found": found, "why": why, "problems": problems,
                          "by_hand": list(q.shape)}))
    """
    ok = last_json(run(site, cache, touch, OPREGISTRY_LOCK=str(lock)))
    assert ok == {"found": True, "why": None, "problems": [], "by_hand": [512]}
    target = site / "bitsandbytes" / "backends" / "cpu" / "ops.py"
    target.write_text(target.read_text() + "\n# edited after the lock\n")
    verify = run(site, cache, f"-m opregistry verify {lock}")
    assert verify.returncode == 1 and "bitsandbytes/backends/cpu/ops.py changed" in verify.stderr
    refused = last_json(run(site, cache, touch, OPREGISTRY_LOCK=str(lock)))
    assert refused["found"] is False and refused["by_hand"] == [512]
    (message,) = refused["problems"]
    assert "bitsandbytes==0.50.2" in message and "bitsandbytes/backends/cpu/ops.py" in message
    # the lookup says why the op is missing
    assert refused["why"].startswith(
        "'_OpNamespace' 'bitsandbytes' object has no attribute 'quantize_blockwise': "
        "bitsandbytes==0.50.2, adopted by opregistry for torch.ops.bitsandbytes, was not "
        "imported: the lock refuses it ("), refused["why"]
    assert "bitsandbytes/backends/cpu/ops.py" in refused["why"]


SWITCH = f"""
    import json, torch
    from opregistry import torch_state
    q, absmax = torch.ops.bitsandbytes.quantize_blockwise(
        torch.linspace(-1, 1, 512), torch.linspace(-1, 1, 256), 256)
    print(json.dumps({{"cpu": torch_state.has_kernel("{OP}", "CPU"),
                       "other": torch_state.has_kernel("bitsandbytes::dequantize_blockwise", "CPU"),
                       "default": torch_state.has_kernel("{OP}", "CompositeExplicitAutograd"),
                       "q": q[:8].tolist()}}))
"""


def test_a_kernel_switched_off(bnb_site: Path, cache: Path) -> None:
    plain = last_json(run(bnb_site, cache, SWITCH))
    switched = last_json(run(bnb_site, cache, SWITCH,
                             OPREGISTRY_KERNELS=f"-{OP}:CPU"))
    assert plain["cpu"] is True and switched["cpu"] is False  # never registered
    assert switched["other"] is True and switched["default"] is True
    assert switched["q"] == plain["q"]  # bitsandbytes' default kernel computes the same
    listed = run(bnb_site, cache, "-m opregistry list -n bitsandbytes",
                 OPREGISTRY_KERNELS=f"-{OP}:CPU")
    assert f"disabled by OPREGISTRY_KERNELS (-{OP}:CPU)" in listed.stdout


@pytest.mark.parametrize("op_packages", ["loaded", "blocked"])
def test_an_exported_program_reloads_in_a_fresh_process(bnb_site: Path, tmp_path: Path,
                                                        op_packages: str) -> None:
    """Blocked, the example op packages leave bitsandbytes the only package that registers:
    the process that loads the program starts with the load waiting (the idle marker the
    saving process wrote), and torch.export.load's touch of the namespace loads it."""
    cache = tmp_path / "cache"
    block = {"OPREGISTRY_BLOCK": "tutorial-ops,nnkit,nnkit-contrib,extension-cpp"} \
        if op_packages == "blocked" else {}
    saved = last_json(run(bnb_site, cache, """
        import json, torch, bitsandbytes

        class Quantize(torch.nn.Module):
            def forward(self, a, code):
                return torch.ops.bitsandbytes.quantize_blockwise(a, code, 256)

        args = (torch.linspace(-1, 1, 512), torch.linspace(-1, 1, 256))
        program = torch.export.export(Quantize(), args)
        torch.export.save(program, "quantize.pt2")
        print(json.dumps({"q": program.module()(*args)[0][:16].tolist()}))
    """, cwd=tmp_path, **block))
    load = """
        import json, sys, torch
        from opregistry.state import process
        waited = process().deferred is not None
        program = torch.export.load("quantize.pt2")
        imported = "bitsandbytes" in sys.modules
        args = (torch.linspace(-1, 1, 512), torch.linspace(-1, 1, 256))
        print(json.dumps({"imported": imported, "q": program.module()(*args)[0][:16].tolist(),
                          "waited": waited}))
    """
    loaded = last_json(run(bnb_site, cache, load, cwd=tmp_path, **block))
    # imported by adoption, not by hand
    assert loaded == {"imported": True, "q": saved["q"], "waited": op_packages == "blocked"}
    without = run(bnb_site, cache, load, cwd=tmp_path, OPREGISTRY_ADOPT="0", **block)
    assert without.returncode != 0  # what every user sees without adoption


WORKERS = """
import json, sys

import torch
from torch.utils.data import DataLoader, Dataset


class Quantized(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        before = "bitsandbytes" in sys.modules
        q, _ = torch.ops.bitsandbytes.quantize_blockwise(
            torch.linspace(-1, 1, 256) * (i + 1) / 4, torch.linspace(-1, 1, 256), 256)
        return before, int(q.sum())


if __name__ == "__main__":
    loader = DataLoader(Quantized(), batch_size=None, num_workers=2,
                        multiprocessing_context="spawn")
    rows = list(loader)
    print(json.dumps({"rows": [[bool(b), s] for b, s in rows],
                       "main": "bitsandbytes" in sys.modules}))
"""


def test_a_spawn_dataloader_worker_calls_an_adopted_op(bnb_site: Path, cache: Path,
                                                       tmp_path: Path) -> None:
    script = tmp_path / "workers.py"
    script.write_text(WORKERS)
    found = last_json(subprocess.run([sys.executable, str(script)], capture_output=True,
                                     text=True, timeout=600, cwd=tmp_path,
                                     env=_env(bnb_site, cache)))
    assert found["main"] is False  # the main process never touched it
    # each of the two workers imported nothing by hand: its first item found bitsandbytes
    # not imported, and the op worked; adoption imported it then
    assert len(found["rows"]) == 4 and [b for b, _ in found["rows"]].count(False) == 2
    assert all(isinstance(s, int) and s > 0 for _, s in found["rows"])


RANKS = """
import json, os, sys
import torch
q, _ = torch.ops.bitsandbytes.quantize_blockwise(
    torch.linspace(-1, 1, 256), torch.linspace(-1, 1, 256), 256)
rank = int(os.environ["RANK"])
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as out:  # not a pipe shared by two
    json.dump({"rank": rank, "sum": int(q.sum())}, out)
"""


def test_torchrun_ranks_call_an_adopted_op(bnb_site: Path, cache: Path, tmp_path: Path) -> None:
    script = tmp_path / "ranks.py"
    script.write_text(RANKS)
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node", "2", str(script), str(tmp_path)],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path,
                         env=_env(bnb_site, cache))
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("rank*.json"))]
    assert sorted(r["rank"] for r in rows) == [0, 1]
    assert len({r["sum"] for r in rows}) == 1


def test_native_library_for_bitsandbytes_is_refused_and_it_works(bnb_site: Path, cache: Path,
                                                                 tmp_path: Path) -> None:
    """The issue's trap: an op package declaring bitsandbytes' namespace as a native library."""
    site = tmp_path / "ops"
    adoption_dists.write(site, "bnb-native-wrap", {"bnb_native_wrap.py": """
        from opregistry import NativeLibrary, OpLibrary

        lib = OpLibrary("bitsandbytes", "FRAGMENT", native=NativeLibrary(module="bitsandbytes"))
        lib.define("quantize_blockwise(Tensor A, Tensor code, int blocksize) -> (Tensor, Tensor)",
                   native=["CPU"])
    """}, requires=("opregistry",),
        entry_points="[opregistry.ops]\nbnb = bnb_native_wrap:lib\n")
    found = last_json(run(bnb_site, cache, """
        import json, torch, opregistry
        import bitsandbytes.functional as F
        q, state = F.quantize_blockwise(torch.linspace(-1, 1, 512))
        codes = [p.code for p in opregistry.get_registry().problems if p.severity == "error"]
        print(json.dumps({"codes": codes, "q": list(q.shape)}))
    """, PYTHONPATH=f"{site}{os.pathsep}{bnb_site}"))
    # refused at resolve time, pointing at adoption (and, by the rules that protect packages,
    # as a redefinition of bitsandbytes' op); bitsandbytes works
    assert found["q"] == [512]
    assert set(found["codes"]) == {"native-library-registers-from-python", "op-held-by-package"}


def _adopted_row(site: Path, cache: Path, name: str, namespace: str) -> dict:
    """``name``'s row of ``opregistry list --json``'s adopted packages (no torch imported)."""
    found = last_json(run(site, cache, f"""
        import json
        from opregistry import plan, report
        print(json.dumps(report.list_report(plan(), namespaces=[{namespace!r}])["adopted"]))
    """))
    (row,) = [row for row in found if row["distribution"]["name"] == name]
    return row


def _adopted(site: Path, cache: Path, name: str, namespace: str) -> tuple[str, str, dict]:
    """``(status, load, namespaces)`` of ``name``'s adoption, as ``opregistry list`` plans it."""
    row = _adopted_row(site, cache, name, namespace)
    return row["status"], row["load"], row["namespaces"]


def test_a_package_below_a_namespace_package(namespace_package: Path, tmp_path: Path) -> None:
    """``import optimum`` imports nothing of optimum-quanto (``optimum/`` is a PEP 420
    namespace package): the first touch of ``torch.ops.quanto`` imports ``optimum.quanto``,
    whose own import registers its kernels, before any op is looked up."""
    cache = tmp_path / "cache"
    assert _adopted(namespace_package, cache, "optimum-quanto", "quanto") == (
        "adopted", "lazy", {"quanto": ["optimum.quanto"]})
    touched = last_json(run(namespace_package, cache, """
        import json, sys
        import torch
        before = "optimum.quanto" in sys.modules
        torch.ops.quanto  # the touch alone
        registered = torch._C._dispatch_has_kernel_for_dispatch_key("quanto::qbytes_mm", "CPU")
        a = torch.randn(2, 4)
        w = torch.randint(-8, 8, (3, 4), dtype=torch.int8)
        s = torch.rand(3, 1)
        out = torch.ops.quanto.qbytes_mm(a, w, s)
        print(json.dumps({"before": before, "registered": registered,
                          "close": torch.allclose(out, a @ (s * w.float()).t())}))
    """))
    assert touched == {"before": False, "registered": True, "close": True}


def test_a_package_of_stripped_libraries(stripped_package: Path, tmp_path: Path) -> None:
    """fbgemm-gpu-cpu's libraries are stripped (``TORCH_LIBRARY(fbgemm, m)`` unreadable from
    their symbols) and its Python only adds fake kernels to their ops: the namespace is read
    from the libraries' strings, so it is listed (its ops named by their fake kernels),
    adopted, and its touch imports the package.
    Built for one torch, the import may fail here: then the lookup says so."""
    cache = tmp_path / "cache"
    row = _adopted_row(stripped_package, cache, "fbgemm-gpu-cpu", "fbgemm")
    assert (row["status"], row["load"], row["namespaces"]) == (
        "adopted", "lazy", {"fbgemm": ["fbgemm_gpu"]})
    # its ops are defined in the stripped libraries (no schema read); the fake kernels its
    # Python registers name them
    ops = {op["name"]: op for op in row["ops"]}
    assert len(ops) > 50 and all(op["schema"] is None for op in ops.values())
    permute = ops["fbgemm::permute_2D_sparse_data"]
    assert {k["key"] for k in permute["kernels"]} == {"Meta", "Autograd"}
    assert all(k["where"].startswith("fbgemm_gpu.") for k in permute["kernels"])
    touched = last_json(run(stripped_package, cache, """
        import json, sys
        import torch
        try:
            torch.ops.fbgemm.asynchronous_complete_cumsum
            error = ""
        except AttributeError as exc:
            error = str(exc)
        print(json.dumps({"error": error, "imported": "fbgemm_gpu" in sys.modules}))
    """))
    if touched["error"]:  # built for another torch: named, never a bare "no attribute"
        assert "fbgemm-gpu-cpu==1.9.0, adopted by opregistry for torch.ops.fbgemm, failed to " \
               "import (importing fbgemm_gpu: " in touched["error"], touched["error"]
    else:
        assert touched["imported"]
