"""``opregistry check``: real opcheck and gradcheck over declared sample inputs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch  # noqa: F401  (imported at collection: its autoload is not a test's)

from opregistry.checking import OPCHECK_UTILS, select_ops
from opregistry.cli import main

from .conftest import op_dist, plan

KERNELS = """
import torch

def clone(x):
    return x.clone()

def good_fake(x):
    return torch.empty_like(x)

def broken_fake(x):
    # wrong on purpose: one element too many
    return x.new_empty(x.shape[0] + 1)

def save(ctx, inputs, output):
    pass

def wrong_backward(ctx, grad):
    # d(clone)/dx is 1; this claims 2
    return grad * 2

def right_backward(ctx, grad):
    return grad

def samples():
    return [((torch.randn(3, dtype=torch.double),), {}),
            ((torch.randn(4, dtype=torch.double, requires_grad=True),), {})]
"""


def checked_dist(dists, ns: str, fake: str, backward: str | None = None,
                 samples: bool = True) -> str:
    """``ns::f``, a clone, with the given fake and backward kernels and (or not) samples."""
    autograd = f", autograd=('KMOD:{backward}', 'KMOD:save')" if backward else ""
    sample = ", samples='KMOD:samples'" if samples else ""
    body = (f"lib.define('f(Tensor x) -> Tensor', kernels={{'cpu': 'KMOD:clone'}}, "
            f"fake='KMOD:{fake}'{autograd}{sample})\n")
    return op_dist(dists, "checked", ns, body, kernels=KERNELS)


@pytest.mark.slow
def test_check_passes_on_the_example_ops():
    """A fresh process: every tutorial op passes every opcheck utility and gradcheck."""
    proc = subprocess.run([sys.executable, "-m", "opregistry", "check", "tutorial", "--json"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(proc.stdout)
    assert data["ok"] is True
    ok = {(r["op"], r["check"]) for r in data["results"] if r["status"] == "ok"}
    for op in ("tutorial::muladd", "tutorial::numpy_sin", "tutorial::add_out"):
        assert {(op, util) for util in OPCHECK_UTILS} <= ok
    assert ("tutorial::muladd", "gradcheck") in ok
    assert "tutorial::numpy_sin on cpu" not in proc.stderr  # no progress into a pipe


# sample 1 requires grad and this op has no autograd: torch warns while opcheck probes it
@pytest.mark.filterwarnings("ignore:.*an autograd kernel was not registered")
def test_check_fails_on_a_broken_fake_kernel(dists, ns, scoped, capsys):
    """A fake kernel with the wrong shape fails test_faketensor, naming op and utility."""
    dist = checked_dist(dists, ns, fake="broken_fake")
    scoped()
    assert main(["check", ns, "--json", "-q"]) == 1
    data = json.loads(capsys.readouterr().out)
    failures = {(r["op"], r["check"]) for r in data["results"] if r["status"] == "fail"}
    assert (f"{ns}::f", "test_faketensor") in failures
    assert ("test_schema" not in {c for _, c in failures}), "only what is broken fails"
    assert all(r["distribution"] == {"name": dist, "version": "1.0"} for r in data["results"])
    assert main(["check", ns]) == 1
    out = capsys.readouterr()
    assert f"{ns}::f on cpu, sample 0: test_faketensor failed:" in out.out
    assert "FAILED" in out.out and "sample(s)" not in out.err  # no progress: not a terminal


def test_check_runs_gradcheck_where_autograd_is_active(dists, ns, scoped, capsys):
    """A wrong backward passes opcheck but fails gradcheck on the sample that requires grad."""
    checked_dist(dists, ns, fake="good_fake", backward="wrong_backward")
    scoped()
    assert main(["check", f"{ns}::f", "--json", "-q"]) == 1
    results = json.loads(capsys.readouterr().out)["results"]
    grad = {r["sample"]: r for r in results if r["check"] == "gradcheck"}
    assert grad[0]["status"] == "skip" and grad[0]["message"] == "no input requires grad"
    assert grad[1]["status"] == "fail" and "Jacobian mismatch" in grad[1]["message"]


def test_check_passes_a_correct_op_and_skips_one_without_samples(dists, ns, scoped, capsys):
    checked_dist(dists, ns, fake="good_fake", backward="right_backward")
    scoped()
    assert main(["check", ns, "--json", "-q"]) == 0
    results = json.loads(capsys.readouterr().out)["results"]
    assert {r["status"] for r in results} == {"ok", "skip"}
    assert sum(r["check"] == "gradcheck" and r["status"] == "ok" for r in results) == 1


def test_op_without_samples_is_skipped_not_failed(dists, ns, scoped, capsys):
    checked_dist(dists, ns, fake="good_fake", samples=False)
    scoped()
    assert main(["check", ns, "--json", "-q"]) == 0
    [result] = json.loads(capsys.readouterr().out)["results"]
    assert result["status"] == "skip" and "samples=" in result["message"]


def test_unknown_target_is_a_usage_error(dists, ns, scoped, capsys):
    checked_dist(dists, ns, fake="good_fake")
    scoped()
    assert main(["check", f"{ns}::nope", "-q"]) == 2
    assert f"no op or namespace {ns}::nope" in capsys.readouterr().err


def test_select_ops_by_namespace_op_and_overload(dists, ns):
    kmod = f"{ns}_kernels"
    mod = f"sel_{ns}"
    dists.make("sel", ops={"ops": f"{mod}:lib"}, modules={mod: (
        "from opregistry import OpLibrary\n"
        f"lib = OpLibrary({ns!r})\n"
        f"lib.define('f(Tensor x) -> Tensor', kernels={{'cpu': '{kmod}:clone'}})\n"
        f"lib.define('f.two(Tensor x) -> Tensor', kernels={{'cpu': '{kmod}:clone'}})\n"
        f"lib.define('g(Tensor x) -> Tensor', kernels={{'cpu': '{kmod}:clone'}})\n")})
    ops = plan(dists).ops

    def names(*targets: str) -> tuple[list[str], list[str]]:
        chosen, unknown = select_ops(ops, targets)
        return [o.op.qualname for o in chosen], unknown

    assert names(ns) == ([f"{ns}::f", f"{ns}::f.two", f"{ns}::g"], [])
    assert names(f"{ns}::f") == ([f"{ns}::f", f"{ns}::f.two"], [])
    assert names(f"{ns}::f.two", "zzz") == ([f"{ns}::f.two"], ["zzz"])


def test_check_names_the_distributions_it_could_not_check(dists, ns, scoped, capsys):
    """A distribution left out has no ops to check: `check` says so and fails, not "all passed"."""
    checked_dist(dists, ns, fake="good_fake", backward="right_backward")
    broken = op_dist(dists, "broken", f"{ns}b",
                     "lib.define('g(Tensor x) -> Tensor', kernels={'cpu': 'KMOD:clone'}, "
                     "tags=['not_a_tag'])\n")
    scoped()
    assert main(["check", "--json", "-q"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is False
    assert data["excluded"] == [{"distribution": {"name": broken, "version": "1.0"},
                                 "problems": ["op-tag-unknown"]}]
    assert all(r["status"] != "fail" for r in data["results"]), "what was checked passed"
    assert main(["check", "-q"]) == 1
    out = capsys.readouterr().out
    assert "all passed" in out and f"1 distribution(s) left out, their ops not checked: {broken}" in out
    assert main(["check", ns, "-q"]) == 0, "a target that names only healthy ops is not affected"
