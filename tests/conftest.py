"""Fixtures: temporary distributions with real entry points, and a clean registry.

``dists.make(...)`` writes a ``<name>-<version>.dist-info`` folder (METADATA
and entry_points.txt) plus the plugin modules into a temporary directory on
``sys.path``: importlib-metadata then finds real entry points, exactly as it
finds pip-installed ones.  Tests scope discovery with ``plugins=`` (the
allow-list) so that the repo's own installed distributions do not interfere.
"""

from __future__ import annotations

import importlib
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Callable, Iterator

import pytest

import opregistry
from opregistry.state import process


def _load_realsite():  # type: ignore[no-untyped-def]
    """``benchmarks/realsite.py`` (torch-free), loaded without putting benchmarks/ on sys.path."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "realsite.py"
    spec = importlib.util.spec_from_file_location("realsite", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


realsite = _load_realsite()

BACKENDS = ["opregistry-cpu", "opregistry-cuda", "opregistry-meta", "opregistry-autograd",
            "opregistry-vmap", "opregistry-autocast", "opregistry-torch-dispatch"]


class DistFactory:
    """Writes temporary distributions; every module name is made unique per test."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root = root
        self.names: list[str] = []
        self.modules: list[str] = []
        monkeypatch.syspath_prepend(str(root))

    def make(self, name: str, *, version: str = "1.0", ops: dict[str, str] | None = None,
             backends: dict[str, str] | None = None, modules: dict[str, str] | None = None,
             requires: tuple[str, ...] = (), record: bool = False,
             ) -> str:
        """Create distribution ``name``; returns its canonical name.

        ``ops`` / ``backends`` map entry-point names to values
        (``"module:attr"``); ``modules`` maps module names to source code;
        ``requires`` are its ``Requires-Dist`` lines (a package that uses torch
        says ``("torch",)``); ``record=True`` writes a RECORD listing its files
        (without hashes), as an installer of an unhashed install would.
        """
        info = self.root / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                       + "".join(f"Requires-Dist: {r}\n" for r in requires))
        lines = []
        for group, eps in (("opregistry.ops", ops), ("opregistry.backends", backends)):
            if eps:
                lines.append(f"[{group}]")
                lines += [f"{k} = {v}" for k, v in eps.items()]
        (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
        listed = [f"{info.name}/METADATA,,", f"{info.name}/entry_points.txt,,",
                  f"{info.name}/RECORD,,"]
        for module, source in (modules or {}).items():
            path = self.root / (module.replace(".", "/") + ".py")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(source))
            listed.append(f"{path.relative_to(self.root).as_posix()},,")
            self.modules.append(module)
        if record:
            (info / "RECORD").write_text("\n".join(listed) + "\n")
        importlib.invalidate_caches()
        canonical = name.lower().replace("_", "-")
        self.names.append(canonical)
        return canonical

    def module_dist(self, name: str, ns: str, source: str) -> tuple[str, str]:
        """Distribution ``name`` whose ``ops`` entry point is ``lib`` of one module.

        ``NS`` in ``source`` stands for ``repr(ns)``.  Returns the distribution's
        canonical name and the module's name (unique per namespace).
        """
        module = f"{name.replace('-', '_')}_{ns}"
        dist = self.make(name, ops={"ops": f"{module}:lib"},
                         modules={module: source.replace("NS", repr(ns))})
        return dist, module

    def cleanup(self) -> None:
        for module in self.modules:
            sys.modules.pop(module, None)


@pytest.fixture
def dists(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[DistFactory]:
    factory = DistFactory(tmp_path / "site", monkeypatch)
    factory.root.mkdir()
    yield factory
    factory.cleanup()


@pytest.fixture
def ns() -> str:
    """A namespace no other test uses."""
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture(autouse=True, scope="session")
def plan_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The on-disk caches of the whole run (and of its subprocesses) in a folder of its own."""
    import os

    folder = tmp_path_factory.mktemp("opregistry-cache")
    previous = os.environ.get("OPREGISTRY_CACHE_DIR")
    os.environ["OPREGISTRY_CACHE_DIR"] = str(folder)
    yield folder
    if previous is None:
        os.environ.pop("OPREGISTRY_CACHE_DIR", None)
    else:
        os.environ["OPREGISTRY_CACHE_DIR"] = previous


@pytest.fixture(autouse=True)
def clean_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every test starts and ends without a loaded registry or opregistry env vars."""
    for var in ("OPREGISTRY_PLUGINS", "OPREGISTRY_BLOCK", "OPREGISTRY_STRICT",
                "OPREGISTRY_ALLOW_OVERRIDE", "OPREGISTRY_AUTOLOAD", "OPREGISTRY_CONFIG",
                "OPREGISTRY_LOCK"):
        monkeypatch.delenv(var, raising=False)
    state = process()
    previous = state.registry
    state.registry = None
    yield
    current = state.registry
    if current is not None and current is not previous:
        current.unload()
    state.registry = previous


def load(dists: DistFactory, **kwargs: object) -> opregistry.Registry:
    """Load only the temporary distributions of this test, plus the real backends."""
    kwargs.setdefault("plugins", [*BACKENDS, *dists.names])
    return opregistry.load(reload=True, **kwargs)  # type: ignore[arg-type]


def plan(dists: DistFactory, **kwargs: object) -> opregistry.plans.Plan:  # type: ignore[name-defined]
    kwargs.setdefault("plugins", [*BACKENDS, *dists.names])
    return opregistry.plan(**kwargs)  # type: ignore[arg-type]


@pytest.fixture
def scoped(dists: DistFactory, monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """``scoped()`` points OPREGISTRY_PLUGINS (read by the CLI) at the backends and ``dists``."""
    def scope() -> None:
        monkeypatch.setenv("OPREGISTRY_PLUGINS", ",".join([*BACKENDS, *dists.names]))
    return scope


#: Kernels for :func:`op_dist` distributions: ``'KMOD:clone'`` in a body refers to ``clone``.
KERNELS = """
import torch

def clone(x):
    return x.clone()

def twice(x):
    return x * 2

def fake(x):
    return torch.empty_like(x)
"""


def op_dist(dists: DistFactory, name: str, ns: str, body: str, *, kind: str = "DEF",
            version: str = "1.0", kernels: str = KERNELS) -> str:
    """A temporary op distribution whose entry point is ``OpLibrary(ns, kind)`` after ``body``.

    ``KMOD`` in ``body`` stands for its kernel module ``{ns}_kernels``, whose
    source is ``kernels``.  Returns the distribution's name.
    """
    mod = f"{name.replace('-', '_')}_{ns}"
    kmod = f"{ns}_kernels"
    source = f"from opregistry import OpLibrary\nlib = OpLibrary({ns!r}, {kind!r})\n" + body
    return dists.make(name, version=version, ops={"ops": f"{mod}:lib"},
                      modules={mod: source.replace("KMOD", kmod), kmod: kernels})


@pytest.fixture(scope="module")
def installed() -> opregistry.Registry:
    """The registry of everything pip-installed: the one ``import torch`` autoloaded.

    Module-scoped, so it runs before the per-test ``clean_registry`` stashes
    the process' registry away; loads it here when autoload was switched off.
    Never reload the installed distributions in a test: their namespaces are
    already defined in this process.
    """
    import torch  # noqa: F401  -- runs the autoload entry point

    return opregistry.load()


#: ``import torch`` in a fresh interpreter, reporting whether it failed, the
#: opregistry error behind it, and which of the ops named in ``sys.argv`` exist
#: in torch's dispatcher (still loaded after a failed import)
STRICT_IMPORT_PROBE = """
import json, sys
try:
    import torch
    failed = None
except RuntimeError as exc:
    failed = exc
ops = set(sys.modules["torch._C"]._dispatch_get_all_op_names())
cause = failed.__cause__ if failed is not None else None
print(json.dumps({
    "failed": failed is not None,
    "cause": type(cause).__name__ if cause is not None else None,
    "codes": [p.code for p in getattr(cause, "problems", ())],
    "message": str(cause) if cause is not None else "",
    "present": {op: op in ops for op in sys.argv[1:]},
}))
"""


@pytest.fixture(scope="session")
def native_libraries() -> dict[str, Path]:
    """The compiled test libraries of tests/native_build.py, built once per torch; not loaded."""
    from . import native_build

    return native_build.build()


@pytest.fixture(scope="session")
def native_test_library(native_libraries: dict[str, Path]) -> Path:
    """``TORCH_LIBRARY(opregistry_native_test)``: ``twice`` and ``hidden``, CPU kernels."""
    return native_libraries["test"]


@pytest.fixture(scope="session")
def native_rival_library(native_libraries: dict[str, Path]) -> Path:
    """A second ``TORCH_LIBRARY(extension_cpp)``: the example package's namespace, claimed again."""
    return native_libraries["rival"]


@pytest.fixture(scope="session")
def real_packages() -> Path:
    """:data:`realsite.REAL_PINS`, installed once per machine under the temporary directory
    (``pip install --no-deps --target``: they never pull another torch)."""
    return _installed(realsite.REAL_PINS)


@pytest.fixture(scope="session")
def prose_packages() -> Path:
    """:data:`realsite.PROSE_PINS` (a package that names torch in nearly every module and
    registers nothing: what the scan must not parse module by module), installed as
    :func:`real_packages` (never imported by the tests)."""
    return _installed(realsite.PROSE_PINS)


@pytest.fixture(scope="session")
def namespace_package() -> Path:
    """:data:`realsite.NAMESPACE_PINS` (a package below a namespace package), installed as
    :func:`real_packages`."""
    return _installed(realsite.NAMESPACE_PINS)


@pytest.fixture(scope="session")
def stripped_package() -> Path:
    """:data:`realsite.STRIPPED_PINS` (C++ libraries stripped of their symbols), installed as
    :func:`real_packages`."""
    return _installed(realsite.STRIPPED_PINS)


@pytest.fixture(scope="session")
def torchvision_package() -> Path:
    """:data:`realsite.TORCHVISION_PINS`, installed as :func:`real_packages` (never imported:
    built for another torch)."""
    return _installed(realsite.TORCHVISION_PINS)


def _installed(pins: tuple[str, ...]) -> Path:
    try:
        return realsite.ensure_site(pins)
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A site folder on ``sys.path`` for foreign distributions (tests/adoption_dists.py); their
    modules (``fp_*``, ``fr_*``) forgotten after."""
    root = tmp_path / "foreign-site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setenv("OPREGISTRY_CACHE_DIR", str(tmp_path / "cache"))
    for var in ("OPREGISTRY_ADOPT", "OPREGISTRY_ADOPT_BLOCK", "OPREGISTRY_KERNELS"):
        monkeypatch.delenv(var, raising=False)
    before = set(sys.modules)
    yield root
    for name in set(sys.modules) - before:
        if name.split(".")[0].startswith(("fp_", "fr_")):  # fr_: test_adopted_reports.py
            del sys.modules[name]
