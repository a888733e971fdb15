"""Install and uninstall a backend distribution for real, with pip, in a throw-away virtualenv.

``pip install opregistry-cpu`` must be all it takes to activate the CPU
kernels installed op packages declare, and ``pip uninstall`` must make them
inactive again, visibly, in ``opregistry list --json``.  The virtualenv has
no torch: ``opregistry list`` never imports it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
#: the core's own dependencies, from the index / pip's cache; torch is not one
#: of them here because nothing in this environment imports it.  setuptools
#: >= 77 builds the PEP 639 ``license = "..."`` metadata without isolation.
DEPENDENCIES = ["setuptools>=77", "pluggy>=1.5", "attrs>=23.1", "structlog>=24.1",
                "importlib-metadata>=6.0"]


def _copy_source(src: Path, dst: Path) -> Path:
    """A clean copy, so that pip's in-tree build never writes into the checkout."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(
        "*.egg-info", "build", "__pycache__", ".venv", "tests", "docs", "benchmarks",
        "plugins", "examples", ".git", ".venv-compat"))
    return dst


def _env() -> dict[str, str]:
    """This process' environment, less what would let the virtualenv see the checkout."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith("OPREGISTRY_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def _pip(python: Path, *args: str) -> None:
    env = _env()
    out = subprocess.run([str(python), "-m", "pip", "--disable-pip-version-check", *args],
                         capture_output=True, text=True, env=env, timeout=180)
    assert out.returncode == 0, f"pip {' '.join(args)} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}"


def _status(bindir: Path, key: str = "CPU") -> dict[str, object]:
    """``key``'s kernel of tutorial::muladd and the backends, as `opregistry list --json` says."""
    out = subprocess.run([str(bindir / "opregistry"), "list", "--json"], capture_output=True,
                         text=True, env=_env(), timeout=60)
    assert out.returncode in (0, 1), out.stderr
    data = json.loads(out.stdout)
    op = next(o for o in data["ops"] if o["name"] == "tutorial::muladd")
    kernel = next(k for k in op["kernels"] if k["key"] == key)
    return {"status": kernel["status"], "reason": kernel["reason"], "backend": kernel["backend"],
            "backends": sorted(b["name"] for b in data["backends"])}


@pytest.mark.slow
def test_pip_install_and_uninstall_backend_flips_kernel_status(tmp_path):
    """pip install opregistry-cpu / -cuda: kernels active (or unavailable without a GPU);
    pip uninstall: inactive again, naming the distribution to install."""
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    bindir = env_dir / ("Scripts" if sys.platform == "win32" else "bin")
    python = bindir / "python"

    src = tmp_path / "src"
    core = _copy_source(REPO, src / "opregistry")
    tutorial = _copy_source(REPO / "examples" / "tutorial", src / "tutorial")
    cpu = _copy_source(REPO / "plugins" / "cpu", src / "cpu")
    cuda = _copy_source(REPO / "plugins" / "cuda", src / "cuda")

    _pip(python, "install", "-q", *DEPENDENCIES)
    _pip(python, "install", "-q", "--no-deps", "--no-build-isolation", str(core), str(tutorial))

    before = _status(bindir)
    assert before["status"] == "inactive"
    assert before["reason"] == "pip install opregistry-cpu"
    assert before["backends"] == []

    _pip(python, "install", "-q", "--no-deps", "--no-build-isolation", str(cpu))
    installed = _status(bindir)
    assert installed["status"] == "active" and installed["backend"] == "cpu"
    assert installed["backends"] == ["cpu"]

    _pip(python, "uninstall", "-y", "-q", "opregistry-cpu")
    assert _status(bindir) == before

    # opregistry-cuda: inactive -> (unavailable without a GPU | active) -> inactive
    before = _status(bindir, "CUDA")
    assert (before["status"], before["reason"]) == ("inactive", "pip install opregistry-cuda")
    _pip(python, "install", "-q", "--no-deps", "--no-build-isolation", str(cuda))
    probe = subprocess.run([str(python), "-c", "import opregistry_cuda, sys; "
                            "print(opregistry_cuda.cuda_available(), 'torch' in sys.modules)"],
                           capture_output=True, text=True, check=True, timeout=60, env=_env())
    gpu, imported_torch = probe.stdout.split()
    assert imported_torch == "False"
    installed = _status(bindir, "CUDA")
    assert installed["backend"] == "cuda"
    assert installed["status"] == ("active" if gpu == "True" else "unavailable")
    _pip(python, "uninstall", "-y", "-q", "opregistry-cuda")
    assert _status(bindir, "CUDA") == before
