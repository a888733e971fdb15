"""Which backend serves a dispatch key when several declare it (docs/resolution.md).

Before: any package declaring a backend for ``CPU`` made a ``backend-conflict``
that left out both it and opregistry-cpu -- every op package lost its CPU
kernels.  Now the first-party backend (or the user's choice) serves the key
and the other is ``backend-shadowed``: a warning naming both and the switch.
"""

from __future__ import annotations

import sys

import pytest
import torch

from .conftest import load, op_dist, plan

#: a third-party backend declaring CPU, recording what it registers
RIVAL = """
from opregistry.backend import DeviceBackend

registered = []


class Recording(DeviceBackend):
    def opregistry_materialize_kernel(self, library, kernel, fn):
        registered.append((kernel.op, kernel.key))
        return super().opregistry_materialize_kernel(library, kernel, fn)


backend = Recording(NAME, key="CPU")
"""


def rival(dists, ns, dist="rival-cpu", name="rivalcpu"):
    mod = f"{dist.replace('-', '_')}_{ns}"
    dists.make(dist, backends={"cpu": f"{mod}:backend"},
               modules={mod: RIVAL.replace("NAME", repr(name))})
    return mod


def user(dists, ns):
    return op_dist(dists, "user-ops", ns,
                   "lib.define('f(Tensor x) -> Tensor', kernels={'cpu': 'KMOD:twice'})\n")


def test_a_second_cpu_backend_is_shadowed_and_cpu_kernels_stay(dists, ns):
    user(dists, ns)
    mod = rival(dists, ns)
    reg = load(dists)
    assert not reg.errors, [str(p) for p in reg.errors]
    [kernel] = [k for k in reg.kernels if k.kernel.op == f"{ns}::f"]
    assert (kernel.status, kernel.backend) == ("active", "cpu")
    assert torch.equal(getattr(torch.ops, ns).f(torch.ones(2)), torch.full((2,), 2.0))
    assert sys.modules[mod].registered == [], "the shadowed backend registers nothing"
    [warning] = [p for p in reg.problems if p.code == "backend-shadowed"]
    assert warning.severity == "warning" and warning.key == "CPU"
    assert "opregistry-cpu==" in warning.message and "rival-cpu==1.0" in warning.message
    assert "OPREGISTRY_BACKEND_CPU=rival-cpu" in warning.hint
    assert not reg.plan.excluded


def test_the_user_picks_the_other_backend(dists, ns, monkeypatch):
    user(dists, ns)
    mod = rival(dists, ns)
    monkeypatch.setenv("OPREGISTRY_BACKEND_CPU", "Rival_CPU")
    reg = load(dists)
    assert not reg.errors
    [kernel] = [k for k in reg.kernels if k.kernel.op == f"{ns}::f"]
    assert (kernel.status, kernel.backend) == ("active", "rivalcpu")
    assert sys.modules[mod].registered == [(f"{ns}::f", "CPU")]
    assert torch.equal(getattr(torch.ops, ns).f(torch.ones(2)), torch.full((2,), 2.0))
    [note] = [p for p in reg.problems if p.code == "backend-shadowed"]
    assert note.severity == "info", "the user's own choice is a note, not a warning"
    assert "chosen by OPREGISTRY_BACKEND_CPU" in note.message


def test_a_choice_naming_no_backend_of_the_key_is_an_error(dists, ns, monkeypatch):
    user(dists, ns)
    rival(dists, ns)
    monkeypatch.setenv("OPREGISTRY_BACKEND_CPU", "rival-cpuu")
    resolved = plan(dists)
    [problem] = [p for p in resolved.errors if p.code == "config-backend-invalid"]
    assert "did you mean 'rival-cpu'?" in problem.message
    assert "backends for CPU: opregistry-cpu, rival-cpu" in problem.message
    assert problem.culprits == ()
    # the default rule still applies: CPU kernels are not lost
    [kernel] = [k for k in resolved.kernels() if k.kernel.op == f"{ns}::f"]
    assert (kernel.status, kernel.backend) == ("active", "cpu")


def test_without_a_first_party_backend_the_order_is_by_distribution_name(dists, ns):
    """Two third-party PrivateUse1 backends: the first by name serves, independent of order."""
    user(dists, ns)
    for dist in ("zeta-npu", "alpha-npu"):
        mod = f"{dist.replace('-', '_')}_{ns}"
        dists.make(dist, backends={"npu": f"{mod}:backend"}, modules={mod: (
            "from opregistry.backend import DeviceBackend\n"
            f"backend = DeviceBackend({dist.split('-')[0]!r}, key='PrivateUse1')\n")})
    resolved = plan(dists)
    assert not resolved.errors
    served = {b.backend.name for b in resolved.backends}
    assert "alpha" in served and "zeta" not in served
    [warning] = [p for p in resolved.problems if p.code == "backend-shadowed"]
    assert "OPREGISTRY_BACKEND_PRIVATEUSE1=zeta-npu" in warning.hint


def test_same_backend_name_leaves_out_only_the_newcomer(dists, ns):
    """A third party naming its backend 'cpu' too: it is left out, opregistry-cpu keeps CPU."""
    user(dists, ns)
    rival(dists, ns, name="cpu")
    resolved = plan(dists)
    [problem] = [p for p in resolved.errors if p.code == "backend-conflict"]
    assert {o.distribution for o in problem.culprits} == {"rival-cpu"}
    assert [o.distribution for o in problem.others] == ["opregistry-cpu"]
    [kernel] = [k for k in resolved.kernels() if k.kernel.op == f"{ns}::f"]
    assert kernel.status == "active"
    assert [o.distribution for o in resolved.excluded] == ["rival-cpu"]


@pytest.mark.parametrize("order", [False, True])
def test_the_choice_does_not_depend_on_discovery_order(dists, ns, monkeypatch, order):
    """Rule 8: the same backend serves CPU whichever order entry points are found in."""
    import importlib_metadata

    user(dists, ns)
    rival(dists, ns)
    if order:
        real = importlib_metadata.distributions
        monkeypatch.setattr(importlib_metadata, "distributions",
                            lambda *a, **k: list(real(*a, **k))[::-1])
    resolved = plan(dists)
    assert {b.backend.name for b in resolved.backends if "CPU" in b.backend.keys} == {"cpu"}


def test_same_backend_name_the_left_out_hook_is_never_called(dists, ns, monkeypatch):
    import importlib_metadata

    user(dists, ns)
    mod = rival(dists, ns, name="cpu")
    real = importlib_metadata.distributions
    monkeypatch.setattr(importlib_metadata, "distributions",
                        lambda *a, **k: list(real(*a, **k))[::-1])
    load(dists)
    assert sys.modules[mod].registered == []
