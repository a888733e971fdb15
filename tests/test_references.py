"""``doctor`` checks every reference the plan would import, statically, with import torch's verdict."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from .conftest import BACKENDS, DistFactory, op_dist, plan


def _refs(dists: DistFactory, **kwargs: object) -> list:  # type: ignore[type-arg]
    return [p for p in plan(dists, references=True, **kwargs).errors
            if p.code.startswith("kernel-ref-")]


@pytest.mark.parametrize(("extra", "what", "key"), [
    ("kernels={'cpu': 'KMOD:clonee'}", "kernel", "CPU"),
    ("kernels={'cpu': 'KMOD:clone'}, fake='KMOD:fakee'", "kernel", "Meta"),
    ("kernels={'cpu': 'KMOD:clone'}, autograd=('KMOD:clone', 'KMOD:setupp')", "setup_context",
     "Autograd"),
    ("kernels={'cpu': 'KMOD:clone'}, vmap='KMOD:vmapp'", "kernel", "FuncTorchBatched"),
    ("kernels={'cpu': 'no_such_module_NS:clone'}", "kernel", "CPU"),
    ("kernels={'cpu': 'KMOD.sub:clone'}", "kernel", "CPU"),
])
def test_a_typo_is_reported_at_its_op(dists: DistFactory, ns: str, extra: str, what: str,
                                      key: str) -> None:
    """kernel-ref-missing names the op, the key, the reference, the define line, the distribution."""
    d = op_dist(dists, "typo", ns, f"lib.define('f(Tensor x) -> Tensor', "
                f"{extra.replace('NS', ns)})\n")
    [problem] = _refs(dists)
    assert problem.code == "kernel-ref-missing" and problem.op == f"{ns}::f"
    assert problem.key == key and (f"the {key} kernel of {ns}::f names" in problem.message
                                   if what == "kernel" else f"the {what} of" in problem.message)
    assert f"{d}==1.0" in problem.message and [o.distribution for o in problem.culprits] == [d]
    assert problem.source is not None and problem.source.endswith(f"typo_{ns}.py:3")
    assert not plan(dists, references=True).op(f"{ns}::f"), "left out, as registration would"
    assert plan(dists).op(f"{ns}::f"), "plan() alone does not read kernel modules"


def test_a_typo_gets_a_did_you_mean(dists: DistFactory, ns: str) -> None:
    op_dist(dists, "typo", ns, "lib.define('f(Tensor x) -> Tensor', kernels={'cpu': 'KMOD:clonee'})\n")
    [problem] = _refs(dists)
    assert "has no attribute 'clonee' (did you mean 'clone'?)" in problem.message


def test_references_that_cannot_work(dists: DistFactory, ns: str) -> None:
    """A literal where a function is wanted, a function where a torch_dispatch class is wanted."""
    op_dist(dists, "bad", ns, "lib.define('f(Tensor x) -> Tensor', kernels={'cpu': 'KMOD:value'}, "
                              "torch_dispatch={'KMOD:clone': 'KMOD:clone'})\n",
            kernels="import torch\nvalue = 42\n\ndef clone(x):\n    return x.clone()\n")
    found = {(p.code, p.key) for p in _refs(dists)}
    assert ("kernel-ref-invalid", "CPU") in found
    assert any(code == "kernel-ref-invalid" and key.startswith("TorchDispatch[") for code, key in found)


@pytest.mark.parametrize("kernels", [
    "from torch import *\n",  # a star import: any name may exist
    "def __getattr__(name):\n    return lambda x: x\n",  # a module __getattr__
    "import sys\nsetattr(sys.modules[__name__], 'clonee', lambda x: x)\n",
])
def test_never_a_false_typo(dists: DistFactory, ns: str, kernels: str) -> None:
    op_dist(dists, "dynamic", ns, "lib.define('f(Tensor x) -> Tensor', kernels={'cpu': 'KMOD:clonee'})\n",
            kernels=kernels)
    assert _refs(dists) == []


def test_an_inactive_kernel_is_not_checked(dists: DistFactory, ns: str) -> None:
    """Registration imports only active kernels: a CUDA kernel without the CUDA backend is not
    imported at import torch, so its reference is not a reason to leave the package out."""
    op_dist(dists, "cudaonly", ns, "lib.define('f(Tensor x) -> Tensor', "
                                   "kernels={'cpu': 'KMOD:clone', 'cuda': 'KMOD:cudaa'})\n")
    backends = [b for b in BACKENDS if b != "opregistry-cuda"]
    assert _refs(dists, plugins=[*backends, *dists.names]) == []


def test_what_depends_on_a_left_out_distribution_is_left_out_with_it(dists: DistFactory,
                                                                     ns: str) -> None:
    """Rule 9, as at registration: a kernel for an op of the distribution with the typo."""
    base = op_dist(dists, "base", ns, "lib.define('f(Tensor x) -> Tensor', kernels={'cpu': 'KMOD:clonee'})\n")
    addon = op_dist(dists, "addon", ns, f"lib.impl('{ns}::f', 'fake', 'KMOD:fake')\n", kind="IMPL")
    resolved = plan(dists, references=True)
    left_out = {o.distribution for p in resolved.errors for o in p.culprits}
    assert {base, addon} <= left_out
    assert "kernel-for-undefined-op" in {p.code for p in resolved.errors}


#: in a fresh interpreter: the distributions a fresh `import torch` leaves out
IMPORT_TORCH_VERDICT = """
import json, sys, torch, opregistry
registry = opregistry.get_registry()
print(json.dumps(sorted({o.distribution for p in registry.errors for o in p.culprits})))
"""
#: in a fresh interpreter: what plain `opregistry doctor --json` reports, and whether it
#: imported torch
DOCTOR_VERDICT = """
import contextlib, io, json, sys
from opregistry.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    rc = main(["doctor", "--json"])
report = json.loads(out.getvalue())
print(json.dumps({"rc": rc, "torch": "torch" in sys.modules, "left_out": sorted({
    d["name"] for p in report["problems"] if p["severity"] == "error"
    for d in p["distributions"]}), "codes": sorted({p["code"] for p in report["problems"]})}))
"""


def fresh(code: str, dists: DistFactory, **env: str) -> object:
    environ = {**os.environ, "PYTHONPATH": str(dists.root),
               "OPREGISTRY_PLUGINS": ",".join([*BACKENDS, *dists.names]), **env}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=environ, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_doctor_without_torch_and_import_torch_agree_on_a_typo(dists: DistFactory,
                                                               ns: str) -> None:
    """The issue's case: a typo showed `active`, passed doctor, failed only after import torch."""
    bad = op_dist(dists, "typo", ns, "lib.define('f(Tensor x) -> Tensor', kernels={'cpu': 'KMOD:clone'}, "
                                     "fake='KMOD:fakee')\n")
    op_dist(dists, "fine", f"{ns}ok", "lib.define('g(Tensor x) -> Tensor', kernels={'cpu': 'KMOD:clone'})\n")
    doctor = fresh(DOCTOR_VERDICT, dists)
    assert doctor["rc"] == 1 and not doctor["torch"], doctor
    assert "kernel-ref-missing" in doctor["codes"] and doctor["left_out"] == [bad]
    assert fresh(IMPORT_TORCH_VERDICT, dists) == [bad]
