"""The ops every benchmark (and tests/test_fast_path.py) uses, in every registration style.

Two ops, the same kernel math in every style:

* ``one(Tensor x) -> Tensor``: ``x.clone()`` (the issue's reference op);
* ``twelve(...)``: 12 arguments — tensors, an optional tensor, ints, floats,
  int and float lists, a bool, an optional int and a defaulted float —
  computing ``x + c * y``;
* ``three(Tensor x, Tensor w, Tensor b) -> Tensor``: a realistic small
  kernel of three torch ops, ``relu(x * w + b)``.

Styles: a direct Python call; ``Library.define`` + ``Library.impl``;
``torch.library.custom_op`` (+ ``register_fake``/``register_vmap``, +
``register_autograd``); and opregistry, through a real distribution
(``*.dist-info`` with an ``opregistry.ops`` entry point, written by
:func:`write_distribution`) whose declarations reference the kernels below
as ``"benchops:..."`` strings.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import importlib
import json
import py_compile
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable, List, Mapping, Optional, TypeVar

import torch
from torch import Tensor

HERE = Path(__file__).resolve().parent
BACKENDS = ["opregistry-cpu", "opregistry-cuda", "opregistry-meta", "opregistry-autograd",
            "opregistry-vmap"]


# -- kernels ----------------------------------------------------------------------------
def one(x: Tensor) -> Tensor:
    return x.clone()


def one_fake(x: Tensor) -> Tensor:
    return torch.empty_like(x)


def one_setup(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    ctx.scale = 1.0


def one_backward(ctx: Any, grad: Tensor) -> Tensor:
    return grad * ctx.scale


def one_vmap(info: Any, in_dims: tuple[Any, ...], x: Tensor) -> tuple[Tensor, Any]:
    return x.clone(), in_dims[0]


def twelve(x: Tensor, y: Tensor, z: Optional[Tensor], a: int, b: int, c: float, d: float,
           sizes: List[int], scales: List[float], flag: bool, maybe: Optional[int],
           alpha: float = 1.0) -> Tensor:
    return torch.add(x, y, alpha=c)


def twelve_fake(x: Tensor, y: Tensor, z: Optional[Tensor], a: int, b: int, c: float, d: float,
                sizes: List[int], scales: List[float], flag: bool, maybe: Optional[int],
                alpha: float = 1.0) -> Tensor:
    torch._check(x.shape == y.shape, lambda: f"twelve: shapes differ, {x.shape} vs {y.shape}")
    return torch.empty_like(x)


def twelve_setup(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    ctx.c = inputs[5]


def twelve_backward(ctx: Any, grad: Tensor) -> tuple[Any, ...]:
    return (grad, grad * ctx.c) + (None,) * 10


def _front(t: Tensor, dim: Optional[int], size: int) -> Tensor:
    return t.movedim(dim, 0) if dim is not None else t.expand(size, *t.shape)


def twelve_vmap(info: Any, in_dims: tuple[Any, ...], x: Tensor, y: Tensor, *rest: Any
                ) -> tuple[Tensor, int]:
    x = _front(x, in_dims[0], info.batch_size)
    y = _front(y, in_dims[1], info.batch_size)
    return torch.add(x, y, alpha=rest[3]), 0


def three(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    return torch.relu(x * w + b)


def three_fake(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    return torch.empty_like(x)


def three_setup(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    x, w, _ = inputs
    ctx.save_for_backward(x, w, output)


def three_backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    x, w, out = ctx.saved_tensors
    g = grad * (out > 0)
    return g * w, g * x, g


def three_vmap(info: Any, in_dims: tuple[Any, ...], x: Tensor, w: Tensor, b: Tensor
               ) -> tuple[Tensor, int]:
    x, w, b = (_front(t, d, info.batch_size) for t, d in zip((x, w, b), in_dims))
    return torch.relu(x * w + b), 0


SCHEMAS = {
    "one": torch.library.infer_schema(one, mutates_args=()),
    "twelve": torch.library.infer_schema(twelve, mutates_args=()),
    "three": torch.library.infer_schema(three, mutates_args=()),
}
PARTS: dict[str, dict[str, Callable[..., Any]]] = {
    "one": {"cpu": one, "fake": one_fake, "setup": one_setup, "backward": one_backward,
            "vmap": one_vmap},
    "twelve": {"cpu": twelve, "fake": twelve_fake, "setup": twelve_setup,
               "backward": twelve_backward, "vmap": twelve_vmap},
    "three": {"cpu": three, "fake": three_fake, "setup": three_setup,
              "backward": three_backward, "vmap": three_vmap},
}


def inputs(name: str, *, grad: bool = False, dtype: torch.dtype = torch.float32,
           device: str = "cpu") -> tuple[Any, ...]:
    """Small inputs (8 elements) for op ``name``."""
    x = torch.randn(8, dtype=dtype, device=device, requires_grad=grad)
    if name == "one":
        return (x,)
    if name == "three":
        return (x, torch.randn(8, dtype=dtype, device=device, requires_grad=grad),
                torch.randn(8, dtype=dtype, device=device, requires_grad=grad))
    y = torch.randn(8, dtype=dtype, device=device, requires_grad=grad)
    return (x, y, None, 3, 4, 0.5, 2.0, [1, 2, 3], [0.5, 0.25], True, None, 1.0)


# -- the baselines --------------------------------------------------------------------
def define_impl(ns: str, name: str, *, full: bool = False) -> tuple[Any, list[Any]]:
    """``Library.define`` + ``Library.impl(CPU)``; ``full`` adds fake, autograd and vmap."""
    lib = torch.library.Library(ns, "FRAGMENT")
    lib.define(f"{name}{SCHEMAS[name]}")
    parts = PARTS[name]
    lib.impl(name, parts["cpu"], "CPU")
    lib.impl(name, parts["cpu"], "CUDA")  # the same Python kernel serves CUDA tensors
    if full:
        qualname = f"{ns}::{name}"
        torch.library.register_fake(qualname, parts["fake"], lib=lib)
        torch.library.register_autograd(qualname, parts["backward"],
                                        setup_context=parts["setup"], lib=lib)
        torch.library.register_vmap(qualname, parts["vmap"], lib=lib)
    return getattr(getattr(torch.ops, ns), name), [lib]


def custom_op(ns: str, name: str, *, autograd: bool = False) -> tuple[Any, list[Any]]:
    """``torch.library.custom_op`` with fake and vmap; ``autograd`` adds register_autograd."""
    parts = PARTS[name]
    op = torch.library.custom_op(f"{ns}::{name}", parts["cpu"], mutates_args=(),
                                 schema=SCHEMAS[name])
    op.register_fake(parts["fake"])
    op.register_vmap(parts["vmap"])
    if autograd:
        op.register_autograd(parts["backward"], setup_context=parts["setup"])
    return op, [op._lib]


# -- the opregistry distribution ------------------------------------------------------------
def registry_source(ns: str, *, full: bool,
                    names: tuple[str, ...] = ("one", "twelve", "three")) -> str:
    """Source of a declarations module: ``lib`` declares ``names`` in namespace ``ns``."""
    lines = ["from opregistry import OpLibrary", f"lib = OpLibrary({ns!r})"]
    for name in names:
        extra = ""
        if full:
            extra = (f", fake='benchops:{name}_fake', vmap='benchops:{name}_vmap', "
                     f"autograd=('benchops:{name}_backward', 'benchops:{name}_setup')")
        lines.append(f"lib.define({name + SCHEMAS[name]!r}, "
                     f"kernels={{'cpu': 'benchops:{name}', 'cuda': 'benchops:{name}'}}{extra})")
    return "\n".join(lines) + "\n"


def write_distribution(root: Path, dist: str, ns: str, *, full: bool) -> str:
    """Write distribution ``dist`` (dist-info + module) declaring both ops into ``root``.

    ``root`` must be on ``sys.path`` (and so must this directory, for the
    ``benchops:`` kernel references); returns the module name.
    """
    module = _install(root, dist, ns, textwrap.dedent(registry_source(ns, full=full)))
    importlib.invalidate_caches()  # path finders cache directory listings
    return module


def _install(root: Path, dist: str, ns: str, source: str) -> str:
    """Write ``dist`` (one module, ``source``, the ``opregistry.ops`` entry point ``ns``
    naming its ``lib``) into ``root`` as pip installs a wheel: a
    ``.dist-info`` with ``METADATA``, ``entry_points.txt`` and ``RECORD``, the module
    byte-compiled (pip does both; a folder without ``RECORD`` is no installed
    distribution, and opregistry's scan walks its packages instead). Returns the module."""
    module = dist.replace("-", "_")
    info = root / f"{module}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[opregistry.ops]\n{ns} = {module}:lib\n")
    (root / f"{module}.py").write_text(source)
    # pip byte-compiles what it installs; do the same, even where
    # PYTHONDONTWRITEBYTECODE would stop Python from caching it
    pyc = Path(py_compile.compile(str(root / f"{module}.py"), doraise=True))
    rows = []
    for path in (root / f"{module}.py", pyc, info / "METADATA", info / "entry_points.txt"):
        data = path.read_bytes()
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        rows.append(f"{path.relative_to(root).as_posix()},sha256={digest},{len(data)}")
    rows.append(f"{info.name}/RECORD,,")
    (info / "RECORD").write_text("\n".join(rows) + "\n")
    return module


def ensure_importable() -> None:
    """Make ``benchops`` importable under that name (the kernel references use it)."""
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    sys.modules.setdefault("benchops", sys.modules[__name__])


def many_source(ns: str, n_ops: int, *, full: bool = True, vmap: bool = True) -> str:
    """A declarations module with ``n_ops`` one-argument ops ``op0..`` in namespace ``ns``.

    ``full``: CPU + fake + autograd (+ vmap unless ``vmap=False``); else CPU only.
    """
    extra = (", fake='benchops:one_fake', "
             "autograd=('benchops:one_backward', 'benchops:one_setup')") if full else ""
    if full and vmap:
        extra += ", vmap='benchops:one_vmap'"
    lines = ["from opregistry import OpLibrary", f"lib = OpLibrary({ns!r})"]
    lines += [f"lib.define('op{i}(Tensor x) -> Tensor', kernels={{'cpu': 'benchops:one'}}{extra})"
              for i in range(n_ops)]
    return "\n".join(lines) + "\n"


def write_many(root: Path, n_dists: int, ops_per_dist: int, *, tag: str = "gen",
               full: bool = True, vmap: bool = True) -> list[str]:
    """Write ``n_dists`` distributions of ``ops_per_dist`` ops each into ``root``.

    Distribution ``{tag}-ops-{i}`` defines namespace ``{tag}{i}``.  Returns the
    distribution names (for ``opregistry.load(plugins=...)``).
    """
    root.mkdir(parents=True, exist_ok=True)
    names = []
    for i in range(n_dists):
        dist = f"{tag}-ops-{i}"
        _install(root, dist, f"{tag}{i}", many_source(f"{tag}{i}", ops_per_dist, full=full,
                                                      vmap=vmap))
        names.append(dist)
    importlib.invalidate_caches()
    return names


T = TypeVar("T")


def size_parser(description: str, *, reps: int) -> argparse.ArgumentParser:
    """The options every generated-distribution benchmark takes."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--dists", type=int, default=100)
    parser.add_argument("--ops-per-dist", type=int, default=10)
    parser.add_argument("--reps", type=int, default=reps)
    parser.add_argument("--json", type=Path)
    return parser


def interleaved(cases: Mapping[str, Callable[[], T]], reps: int) -> dict[str, list[T]]:
    """Run every case once per rep, in turn (A B C, A B C, ...); the samples per case.

    Interleaving spreads a busy machine's noise over every case alike, so the
    ratios between cases hold even where the absolute times do not.
    """
    samples: dict[str, list[T]] = {name: [] for name in cases}
    for _ in range(reps):
        for name, case in cases.items():
            samples[name].append(case())
    return samples


def report_targets(targets: list[tuple[str, float, bool]], width: int, json_path: Path | None,
                   payload: dict[str, Any]) -> None:
    """Print ``(text, ratio, met)`` per target; with ``--json``, save them with ``payload``."""
    for text, ratio, met in targets:
        print(f"  target {text:{width}s} {ratio:5.2f}  {'met' if met else 'NOT MET'}")
    if json_path is not None:
        json_path.write_text(json.dumps(
            {**payload, "targets": [[t, r, m] for t, r, m in targets]}, indent=1))


_NEUTRAL: list[Any] = []


def neutral_cwd() -> str:
    """An empty directory to run timed children in (created once, removed at exit).

    ``python -c`` and ``python -m`` put the working directory first on
    ``sys.path``, ahead of ``PYTHONPATH``: run from a checkout's root, a child
    imports that checkout's ``opregistry`` whatever ``PYTHONPATH`` says, and a
    ``--baseline`` comparison would time this checkout's core on both sides.
    """
    if not _NEUTRAL:
        import tempfile

        _NEUTRAL.append(tempfile.TemporaryDirectory(prefix="opregistry-bench-cwd-"))
    return str(_NEUTRAL[0].name)


def environ(paths: "list[Path]", **extra: str) -> dict[str, str]:
    """This process' environment for a timed child: ``paths`` on ``PYTHONPATH``, no ``OPREGISTRY_*``.

    PYTHONDONTWRITEBYTECODE (set on some CI machines) would make every run
    compile the op packages from source; pip byte-compiles at install, so a
    user's machine has the .pyc files: the warm-up run writes them here.
    """
    import os

    env = {k: v for k, v in os.environ.items()
           if not k.startswith("OPREGISTRY_") and k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in paths)
    env.update(extra)
    return env


def other_op_packages() -> str:
    """The installed op packages but the generated ones, for ``OPREGISTRY_BLOCK``: only the
    measured ops count."""
    from opregistry.discovery import OPS_GROUP, entry_points

    return ",".join(sorted({ep.dist.name for group, ep in entry_points() if group == OPS_GROUP
                            and not ep.dist.name.startswith("gen-ops-")}))
