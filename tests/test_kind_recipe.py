"""A registration kind added from outside the core: docs/architecture.md's recipe, run.

The blocks of the page's "Registration kinds" section become two real
distributions (a backend defining the ``tally`` kind, an op package using
it); the kind is declared, resolved, listed, locked and materialized without
a module of the core naming it.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

import opregistry
from opregistry.lockfile import diff_lock, lock_data
from opregistry.steps import plan_steps

from .conftest import load, plan
from .test_docs import blocks

ROOT = Path(__file__).resolve().parents[1]


def _recipe() -> dict[str, str]:
    """The ``<!-- file: ... -->`` blocks of the architecture page: module name -> source."""
    found = {b.arg.removesuffix(".py"): b.code for b in blocks("architecture.md")
             if b.directive == "file"}
    assert set(found) == {"opregistry_tally", "tallied_ops"}, sorted(found)
    return found


def _install(dists, *, backend: bool = True, ops: str | None = None) -> None:
    recipe = _recipe()
    if backend:
        dists.make("opregistry-tally", backends={"tally": "opregistry_tally"},
                   modules={"opregistry_tally": recipe["opregistry_tally"]})
    dists.make("tallied-ops", ops={"tallied": "tallied_ops:lib"},
               modules={"tallied_ops": ops or recipe["tallied_ops"]})


def test_no_core_module_knows_the_kind():
    """The recipe touches no module of the core: none names it."""
    hits = [str(p) for p in (ROOT / "opregistry").rglob("*.py")
            if re.search(r"\btally\b|\bTally\b", p.read_text())]
    assert not hits, hits


def test_the_kind_is_resolved_listed_and_materialized(dists):
    _install(dists)
    reg = load(dists)
    assert not reg.errors, [str(p) for p in reg.errors]
    kernel = reg.op("tallied::twice").kernel("CPU")
    assert (kernel.status, kernel.backend, kernel.kernel.kind.name) == ("active", "tally", "tally")
    row = kernel.to_dict()
    assert (row["kind"], row["kernel"], row["details"]) == (
        "tally", "tallied_ops:twice", {"label": "twice"})
    listed = opregistry.report.list_report(reg.plan)
    [op] = [o for o in listed["ops"] if o["name"] == "tallied::twice"]
    assert [(k["key"], k["kind"]) for k in op["kernels"]] == [("CPU", "tally"), ("Meta", "fake")]

    steps = [s for s in plan_steps(reg.plan).steps if s.op == "tallied::twice"]
    assert [(s.action, s.key, s.kind, s.backend) for s in steps] == [
        ("define", None, None, None), ("register", "CPU", "tally", "tally"),
        ("register", "Meta", "fake", "meta")]

    import opregistry_tally

    x = torch.arange(3.0)
    before = opregistry_tally.calls.get("twice", 0)
    torch.testing.assert_close(torch.ops.tallied.twice(x), x * 2)
    assert opregistry_tally.calls["twice"] == before + 1
    torch.library.opcheck(torch.ops.tallied.twice.default, (x,))


def test_the_lock_records_the_kind_and_its_fields(dists):
    _install(dists)
    before = lock_data(plan(dists))
    entry = before["ops"]["tallied::twice"]["kernels"]["CPU"]
    assert (entry["kind"], entry["details"]) == ("tally", {"label": "twice"})
    relabelled = dists.root / "tallied_ops.py"
    relabelled.write_text(relabelled.read_text().replace('label="twice"', 'label="double"'))
    dists.cleanup()  # forget the imported declarations module: the next plan imports the edit
    diffs = diff_lock(before, lock_data(plan(dists)))
    assert any("details" in d and "'twice'" in d and "'double'" in d for d in diffs), diffs


def test_without_its_backend_the_kernel_is_inactive(dists):
    """The backend blocked: the kernel is listed inactive, with what to install."""
    _install(dists)
    p = plan(dists, block=["opregistry-tally"])
    kernel = p.op("tallied::twice").kernel("CPU")
    assert (kernel.status, kernel.reason) == ("inactive", "pip install opregistry-tally")


def test_without_the_kinds_distribution_the_op_package_is_named(dists):
    """The op package imports the kind: without its distribution it fails to load, named."""
    _install(dists, backend=False)
    p = plan(dists)
    [problem] = p.errors
    assert problem.code == "plugin-missing-module" and "opregistry_tally" in problem.message
    assert [o.distribution for o in problem.culprits] == ["tallied-ops"]


def test_the_kinds_schema_rule_and_the_kernel_rules_apply(dists):
    source = _recipe()["tallied_ops"] + '''
lib.define("bump_(Tensor(a!) x) -> ()", fake="tallied_ops:twice_fake")
lib.impl("bump_", "cpu", Tally("tallied_ops:twice"))
lib.impl("twice", "cpu", "tallied_ops:twice")
'''
    _install(dists, ops=source)
    p = plan(dists)
    codes = sorted(x.code for x in p.errors)
    assert codes == ["kernel-duplicate", "tally-on-mutable-op"], [str(x) for x in p.errors]
    [misfit] = [x for x in p.errors if x.code == "tally-on-mutable-op"]
    assert "it mutates its arguments" in misfit.message and misfit.op == "tallied::bump_"
