"""Real packages from the index, installed once per machine for the tests and benchmarks.

The packages that register ops with ``torch.library`` by themselves
(bitsandbytes, torchao, vllm...) are installed with ``pip install --no-deps
--target`` into a folder of the temporary directory named after their pins
(``opregistry-foreign-real/bitsandbytes-0.50.2+torchao-0.18.0``), put on
``PYTHONPATH`` by whoever uses them: they never pull another torch, and
the development environment stays as it is.  torch is not imported here
(``tests/conftest.py`` uses this module too).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["REAL_PINS", "PROSE_PINS", "MORE_PROSE_PINS", "HEAVY_PINS", "NAMESPACE_PINS",
           "STRIPPED_PINS", "TORCHVISION_PINS", "site_of", "ensure_site"]

#: register ops with torch.library at their own import (bitsandbytes needs numpy and
#: packaging at import, which the development environment has)
REAL_PINS = ("bitsandbytes==0.50.2", "torchao==0.18.0")
#: names torch in nearly every module and registers nothing: what the scan must not parse
PROSE_PINS = ("transformers==4.46.3",)
#: the same, with the packages usually installed beside it
MORE_PROSE_PINS = ("transformers==4.46.3", "diffusers==0.35.2", "timm==1.0.20", "peft==0.17.1",
                   "accelerate==1.10.1")
#: register hundreds of ops from Python and C++
HEAVY_PINS = ("vllm==0.33.0", "sglang==0.5.23", "flashinfer-python==0.7.2.post1")
#: registers below a namespace package (PEP 420: ``optimum/`` has no ``__init__.py``); its
#: import needs numpy and packaging, which the development environment has
NAMESPACE_PINS = ("optimum-quanto==0.2.7",)
#: registers from C++ libraries stripped of their symbols (``TORCH_LIBRARY(fbgemm, m)``), and
#: adds fake kernels to their ops from Python (6 MB; built for one torch: its import may fail)
STRIPPED_PINS = ("fbgemm-gpu-cpu==1.9.0",)
#: registers from C++ (``TORCH_LIBRARY_FRAGMENT``, ``TORCH_LIBRARY_IMPL`` blocks, the older
#: ``c10::RegisterOperators`` in its ``image`` library) and from Python (fake kernels, a
#: ``register_meta`` helper naming its ops at run time); the index's wheel is a CUDA build
#: of torch 2.13's: beside a CPU torch its library does not load, so the scan alone is
#: tested (7.7 MB)
TORCHVISION_PINS = ("torchvision==0.28.0",)


def site_of(pins: tuple[str, ...]) -> Path:
    """The folder ``pins`` are installed into."""
    return Path(tempfile.gettempdir()) / "opregistry-foreign-real" / "+".join(
        p.replace("==", "-") for p in pins)


def ensure_site(pins: tuple[str, ...] = REAL_PINS, site: Path | None = None, *,
                timeout: float = 900) -> Path:
    """``pins`` installed into ``site`` (default :func:`site_of`) once; returns the folder.

    Atomic: pip installs into a fresh folder beside it, renamed into place
    when complete, so a session interrupted mid-install or running beside
    another never leaves (or sees) a half-installed folder; when two install
    at once, the first rename wins.  A failed install raises
    :class:`RuntimeError` with pip's output; so does a folder that is there
    but was not completed (a copy made by hand: remove it).
    """
    root = site_of(pins) if site is None else Path(site)
    if (root / ".complete").exists():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".install-", dir=root.parent))
    try:
        out = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                              "--disable-pip-version-check", "--target", str(work), *pins],
                             capture_output=True, text=True, timeout=timeout)
        if out.returncode != 0:
            raise RuntimeError(f"could not install {' '.join(pins)} from the index:\n"
                               f"{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
        (work / ".complete").touch()
        try:
            os.replace(work, root)
        except OSError:  # another install finished first: its folder is kept
            pass
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if not (root / ".complete").exists():
        raise RuntimeError(f"{root} exists but is not a complete install of {' '.join(pins)}: "
                           f"remove it, and it is installed again")
    return root
