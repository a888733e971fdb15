"""docs/backend-authors.md: its example backend and op package, installed as written, work.

Every fenced block of the page whose first line is ``# <project>/<path>``
is a file of the example.  The test writes the files, turns each
``pyproject.toml`` into a temporary distribution with the same entry points,
and checks the page's claims: unavailable without the device runtime,
inactive without the backend, and with both, the kernels registered at
``PrivateUse1`` and really called.
"""

from __future__ import annotations

import importlib
import re
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import torch

from .conftest import load

DOC = Path(__file__).resolve().parent.parent / "docs" / "backend-authors.md"
FENCE = re.compile(r"^```(\w+)\n# ([\w.-]+/[\w./-]+)\n(.*?)^```", re.M | re.S)
MODULES = ("opregistry_npu", "opregistry_npu.hooks", "npu_demo", "npu_demo.registry",
           "npu_demo.kernels", "npu_demo.npu_kernels", "npu_runtime")

#: stands in for the device runtime the page's kernels import: it computes
#: on CPU and records each call, so the test can tell which kernel ran
RUNTIME = '''
import torch
calls = []

def is_available():
    return True

def scale(x, alpha):
    calls.append("scale")
    return x * alpha

def full(n, value):
    calls.append("full")
    return torch.full((n,), value)
'''


def _files() -> dict[str, tuple[str, str]]:
    """``project/path`` -> (language, source) for every example file of the page."""
    return {path: (lang, body) for lang, path, body in FENCE.findall(DOC.read_text())}


def test_page_has_the_complete_example():
    """The page holds both projects, each with its pyproject.toml (so the test below is real)."""
    assert set(_files()) >= {
        "opregistry-npu/pyproject.toml", "opregistry-npu/opregistry_npu/__init__.py",
        "npu-demo/pyproject.toml", "npu-demo/npu_demo/registry.py",
        "npu-demo/npu_demo/kernels.py", "npu-demo/npu_demo/npu_kernels.py"}


def _install(dists: Any, ns: str, projects: tuple[str, ...], runtime: bool,
             backend_entry_point: str | None = None) -> None:
    """Write the page's projects as distributions with real entry points."""
    for module in MODULES:
        sys.modules.pop(module, None)
    files = _files()
    for project in projects:
        meta = tomllib.loads(files[f"{project}/pyproject.toml"][1])
        for path, (_, source) in files.items():
            owner, _, relative = path.partition("/")
            if owner != project or relative == "pyproject.toml":
                continue
            if relative.endswith("registry.py"):
                source = source.replace('OpLibrary("npu_demo")', f"OpLibrary({ns!r})")
            target = dists.root / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(source)
        eps = dict(meta["project"]["entry-points"])
        if backend_entry_point and "opregistry.backends" in eps:
            eps["opregistry.backends"] = {"npu": backend_entry_point}
        dists.make(meta["project"]["name"], version=meta["project"]["version"],
                   ops=eps.get("opregistry.ops"), backends=eps.get("opregistry.backends"))
    if runtime:
        (dists.root / "npu_runtime.py").write_text(RUNTIME)
    importlib.invalidate_caches()


def _cleanup() -> None:
    for module in MODULES:
        sys.modules.pop(module, None)


@pytest.mark.parametrize("entry_point", [None, "opregistry_npu.hooks"],
                         ids=["DeviceBackend", "hooks-by-hand"])
def test_backend_and_op_package_from_the_page_work(dists, ns, entry_point):
    """With the runtime: active, registered at PrivateUse1, and both NPU kernels are called."""
    try:
        _install(dists, ns, ("opregistry-npu", "npu-demo"), runtime=True,
                 backend_entry_point=entry_point)
        reg = load(dists)
        assert not reg.errors, [str(p) for p in reg.errors]
        backend = next(b for b in reg.plan.backends if b.backend.name == "npu")
        assert backend.available and backend.backend.keys == ("PrivateUse1",)
        for op in ("scale", "filled"):
            plan = reg.op(f"{ns}::{op}").kernel("PrivateUse1")
            assert (plan.status, plan.backend) == ("active", "npu")
            assert torch._C._dispatch_has_kernel_for_dispatch_key(f"{ns}::{op}", "PrivateUse1")

        ops = getattr(torch.ops, ns)
        runtime = sys.modules["npu_runtime"]
        x = torch.arange(3.0)
        torch.testing.assert_close(ops.scale(x, 2.0), x * 2)  # CPU tensor: CPU kernel
        assert runtime.calls == []
        npu = torch._C.DispatchKeySet(torch._C.DispatchKey.PrivateUse1)
        torch.testing.assert_close(ops.scale.default.redispatch(npu, x, 3.0), x * 3)
        torch.testing.assert_close(ops.filled(2, 7.0, device="privateuseone"),
                                   torch.full((2,), 7.0))
        assert runtime.calls == ["scale", "full"]
        torch.testing.assert_close(ops.filled(2, 1.0, device="cpu"), torch.ones(2))
        meta = ops.filled(4, 1.0, device="meta")
        assert meta.device.type == "meta" and meta.shape == (4,)
    finally:
        _cleanup()


def test_without_runtime_the_kernels_are_unavailable_and_not_imported(dists, ns):
    """The page's claim: no runtime -> 'unavailable', and the kernel module is not imported."""
    try:
        _install(dists, ns, ("opregistry-npu", "npu-demo"), runtime=False)
        reg = load(dists)
        assert not reg.errors, [str(p) for p in reg.errors]
        plan = reg.op(f"{ns}::scale").kernel("PrivateUse1")
        assert plan.status == "unavailable"
        assert "npu_demo.npu_kernels" not in sys.modules  # its `import npu_runtime` would fail
        assert not torch._C._dispatch_has_kernel_for_dispatch_key(f"{ns}::scale", "PrivateUse1")
        torch.testing.assert_close(getattr(torch.ops, ns).scale(torch.ones(2), 2.0),
                                   torch.full((2,), 2.0))
    finally:
        _cleanup()


def test_without_backend_the_kernels_are_inactive_naming_the_fix(dists, ns):
    """Without opregistry-npu installed: 'inactive', with what to install."""
    try:
        _install(dists, ns, ("npu-demo",), runtime=True)
        reg = load(dists)
        plan = reg.op(f"{ns}::scale").kernel("PrivateUse1")
        assert plan.status == "inactive"
        assert plan.reason == "install an opregistry backend that serves PrivateUse1"
    finally:
        _cleanup()
