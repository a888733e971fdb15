"""What opregistry does differently per torch release of the supported range (2.8 - 2.15).

Each test derives its expectation from the facts the resolver itself uses --
the installed torch's tags (``keys.installed_torch()``) and the per-release
tables (``keys.TAG_SINCE``, ``keys.TYPE_SINCE``) -- and checks both sides on
whatever torch runs it: where the installed torch lacks a tag or a schema type,
the op is refused before torch is imported, naming the release that has it;
where it has them, the same declaration registers and runs.  CI runs the suite
on the pinned torch and the non-slow tests on 2.8 and 2.15 (.ci/compat), so
both branches are exercised.  ``tests/test_torch_state.py`` checks the tables
against torch itself.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from opregistry import ResolutionError
from opregistry.keys import installed_torch, tag_since, type_since, types_lacking

from .conftest import DistFactory, load, op_dist, plan

SYMBOOL_KERNELS = """
def flip(x, flag):
    return -x if flag else x.clone()
"""

OUT_KERNELS = """
def neg_out(x, *, out):
    return out.copy_(-x)
"""


def _facts():  # type: ignore[no-untyped-def]
    facts = installed_torch()
    assert facts is not None, "tests run with torch installed"
    return facts


def _cli(*args: str, plugins: list[str]) -> dict:  # type: ignore[type-arg]
    """``opregistry ARGS --json`` in a fresh interpreter: the verdict without torch imported."""
    import os

    code = ("import sys\nfrom opregistry.cli import main\nrc = main(sys.argv[1:])\n"
            "assert 'torch' not in sys.modules, 'the CLI imported torch'\nsys.exit(rc)")
    env = {**os.environ, "OPREGISTRY_PLUGINS": ",".join(plugins),
           "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.run([sys.executable, "-c", code, *args, "--json"], capture_output=True,
                          text=True, env=env)
    assert proc.stdout, proc.stderr
    return json.loads(proc.stdout)


def test_symbool_in_a_schema_per_installed_torch(dists: DistFactory, ns: str) -> None:
    """``SymBool``: registered and called where torch's parser takes it, refused before torch
    (resolver, ``doctor`` without torch, strict ``load``) where it does not."""
    name = op_dist(dists, "symbool", ns, "lib.define('flip(Tensor x, SymBool flag) -> Tensor', "
                   "kernels={'cpu': 'KMOD:flip'})\n", kernels=SYMBOOL_KERNELS)
    facts = _facts()
    scope = ["opregistry-cpu", name]
    lacking = types_lacking(["SymBool"], facts.release)
    doctor = _cli("doctor", plugins=scope)
    codes = [p["code"] for p in doctor["problems"] if p["severity"] == "error"]
    if lacking:
        [problem] = plan(dists, plugins=scope).errors
        assert problem.code == "schema-type-needs-newer-torch"
        assert f"torch {type_since('SymBool')}" in problem.message
        assert f"installed torch ({facts.version})" in problem.message
        assert f"torch>={type_since('SymBool')}" in problem.hint
        assert problem.source is not None and problem.source.endswith(f"symbool_{ns}.py:3")
        assert codes == ["schema-type-needs-newer-torch"], "doctor agrees, without torch"
        with pytest.raises(ResolutionError, match="schema-type-needs-newer-torch|SymBool"):
            load(dists, plugins=scope, strict=True)
        assert f"{ns}::flip" not in torch._C._dispatch_get_all_op_names()
    else:
        assert not plan(dists, plugins=scope).errors
        assert codes == []
        reg = load(dists, plugins=scope, strict=True)
        assert not reg.errors
        op = getattr(torch.ops, ns).flip
        x = torch.arange(3.0)
        assert torch.equal(op(x, True), -x) and torch.equal(op(x, False), x)


def test_a_type_of_one_release_only_per_installed_torch(dists: DistFactory, ns: str) -> None:
    """``PyObject``: torch 2.12's parser takes it, 2.11's and 2.13's do not.  Before 2.12 the
    op needs a newer torch; after, the type is gone -- each said as such, before torch."""
    from opregistry.keys import type_until

    name = op_dist(dists, "pyobject", ns, "lib.define('keep(Tensor x, PyObject o) -> Tensor')\n")
    release = _facts().release
    problems = plan(dists, plugins=["opregistry-cpu", name]).errors
    if release == (2, 12):
        assert problems == ()
        return
    [problem] = problems
    if release < (2, 12):
        assert problem.code == "schema-type-needs-newer-torch"
        assert f"PyObject from torch {type_since('PyObject')}" in problem.message
    else:
        assert problem.code == "schema-type-gone-from-torch"
        assert f"PyObject up to torch {type_until('PyObject')}" in problem.message
    with pytest.raises(RuntimeError, match="PyObject"):
        torch._C.parse_schema(f"{ns}::keep(Tensor x, PyObject o) -> Tensor")


def test_out_tag_per_installed_torch(dists: DistFactory, ns: str) -> None:
    """``tags=['out']``: a real out= variant where torch.Tag.out exists, refused before torch
    (naming torch 2.13) where it does not -- the verdict of ``import torch`` and ``doctor``."""
    name = op_dist(dists, "outvariant", ns,
                   "lib.define('neg.out(Tensor x, *, Tensor(a!) out) -> Tensor(a!)', "
                   "mutates_args=('out',), tags=['out'], kernels={'cpu': 'KMOD:neg_out'})\n",
                   kernels=OUT_KERNELS)
    facts = _facts()
    scope = ["opregistry-cpu", name]
    codes = [p["code"] for p in _cli("doctor", plugins=scope)["problems"]
             if p["severity"] == "error"]
    if "out" not in facts.tags:
        [problem] = plan(dists, plugins=scope).errors
        assert problem.code == "op-tag-needs-newer-torch"
        assert f"torch.Tag.out exists from torch {tag_since('out')}" in problem.message
        assert f"installed torch ({facts.version})" in problem.message
        assert codes == ["op-tag-needs-newer-torch"], "doctor agrees, without torch"
        reg = load(dists, plugins=scope)
        assert [p.code for p in reg.errors] == ["op-tag-needs-newer-torch"]
        assert f"{ns}::neg.out" not in torch._C._dispatch_get_all_op_names()
    else:
        assert codes == []
        reg = load(dists, plugins=scope, strict=True)
        assert not reg.errors
        op = getattr(torch.ops, ns).neg.out
        assert torch.Tag.out in op.tags
        x, out = torch.arange(3.0), torch.empty(3)
        assert op(x, out=out) is out and torch.equal(out, -x)
