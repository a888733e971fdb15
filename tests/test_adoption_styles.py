"""Lazy adoption of every registration style, in fresh interpreters: nothing imported by hand.

The distributions of tests/foreign_dists.py (Python ``Library``, ``custom_op``
and decorator stacks, bitsandbytes' aliases and helpers, C++ ``TORCH_LIBRARY``
libraries loaded with ``torch.ops.load_library`` and as extension modules)
are pip-installed into a folder of their own.  A fresh interpreter imports
torch only; every op each registers must then be reachable through
``torch.ops`` -- the first touch imports the package -- and be the op torch's
dispatcher holds.  A namespace read from the environment cannot be known
before its package runs: it is not adopted.  Two packages that define the
same ops (a C++ library and its stripped copy) are never both imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from . import foreign_dists

#: touches each op given in argv through torch.ops (ns::name[.overload]), after `import torch`
#: only; reports, per op, whether it resolved, its schema, and the packages imported by then
TOUCH = """
import json, sys
import torch
# fx_plugin is an opregistry plugin: import torch loads it (discovery), adoption does not
before = sorted(m for m in sys.modules if m.startswith("fx_") and not m.startswith("fx_plugin"))
out = {}
for qualname in sys.argv[1:]:
    ns, _, rest = qualname.partition("::")
    name, _, overload = rest.partition(".")
    try:
        op = getattr(getattr(getattr(torch.ops, ns), name), overload or "default")
        out[qualname] = {"schema": str(op._schema),
                         "imported": sorted(m for m in sys.modules if m.startswith("fx_"))}
    except AttributeError as exc:
        out[qualname] = {"error": str(exc)}
import opregistry
problems = [p.code for p in opregistry.get_registry().problems
            if p.code.startswith(("adoption", "lock"))]
print(json.dumps({"before": before, "ops": out, "problems": problems}))
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, native_libraries: dict[str, Path]) -> Path:
    root = tmp_path_factory.mktemp("styles")
    foreign_dists.install(root / "site", root / "work", native_libraries)
    return root / "site"


def _touch(site: Path, ops: list[str], **env: str) -> dict[str, object]:
    environ = {**os.environ, "PYTHONPATH": str(site), "OPREGISTRY_CACHE": "0", **env}
    environ.pop("OPREGISTRY_PLUGINS", None)
    out = subprocess.run([sys.executable, "-c", TOUCH, *ops], capture_output=True, text=True,
                         env=environ, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.slow
def test_every_registration_style_is_reachable_without_an_import(site: Path) -> None:
    # fx_dynamic: its namespace is read from the environment; fx_native_single: its library's
    # stripped copy (fx-native-stripped) defines the same ops (both tested below)
    packages = sorted(set(foreign_dists.EXPECTED_OPS) - {"fx_dynamic", "fx_native_single"})
    ops = sorted(op for p in packages for op in foreign_dists.EXPECTED_OPS[p])
    found = _touch(site, ops)
    assert found["before"] == []  # import torch imported none of them
    missing = {op: r["error"] for op, r in found["ops"].items() if "error" in r}
    assert not missing, missing
    for package in packages:
        for op in foreign_dists.EXPECTED_OPS[package]:
            result = found["ops"][op]
            assert result["schema"].startswith(op.partition(".")[0]), result
            assert package in result["imported"], (op, result["imported"])
    assert found["problems"] == ["adoption-conflict"]  # one problem for the pair


@pytest.mark.slow
def test_a_namespace_no_scan_can_read_is_not_adopted(site: Path) -> None:
    """fx-dynamic reads its namespace from the environment: it must declare it to be adopted."""
    found = _touch(site, ["fx_dyn::op"])
    assert "error" in found["ops"]["fx_dyn::op"] and found["before"] == []


@pytest.mark.slow
def test_two_packages_defining_one_op_are_never_both_imported(site: Path) -> None:
    """fx-native-single and its stripped copy: importing both aborts the process (torch refuses
    the second TORCH_LIBRARY from a static initializer); neither is adopted, and it is said."""
    found = _touch(site, ["fx_single::plain", "fx_single::hidden"])
    assert all("error" in r for r in found["ops"].values()), found
    assert found["problems"] == ["adoption-conflict"]  # one problem for the pair


@pytest.mark.slow
def test_switched_off_nothing_is_imported(site: Path) -> None:
    found = _touch(site, ["fx_pylib::scale", "fx_native::scale"], OPREGISTRY_ADOPT="0")
    assert all("error" in r for r in found["ops"].values()), found
