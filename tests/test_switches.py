"""Kernel switches: OPREGISTRY_KERNELS and the config key ``kernels``.

Real distributions (entry points), real dispatch: a switched-off kernel is not
registered with torch, and the next candidate serves the call.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from opregistry.config import Settings
from opregistry.errors import ConfigError
from opregistry.lockfile import diff_lock, lock_data

from .conftest import BACKENDS, load, plan

OWNER = """
import torch
from opregistry import OpLibrary
lib = OpLibrary({ns!r})
lib.define("scale(Tensor x) -> Tensor",
           kernels={{"default": "sw_owner:portable", "cpu": "sw_owner:cpu"}},
           fake="sw_owner:fake")
def portable(x):
    return x * 2
def cpu(x):
    return x * 2 + 100
def fake(x):
    return torch.empty_like(x)
"""

CONTRIB = """
from opregistry import OpLibrary
lib = OpLibrary({ns!r}, "IMPL")
lib.impl("scale", "cpu", "sw_contrib:fast", predicate="sw_contrib:always")
def fast(x):
    return x * 2 + 1000
def always(x):
    return True
"""


@pytest.fixture
def two(dists, ns):
    dists.make("sw-owner", ops={"ops": "sw_owner:lib"}, modules={"sw_owner": OWNER.format(ns=ns)})
    dists.make("sw-contrib", ops={"ops": "sw_contrib:lib"},
               modules={"sw_contrib": CONTRIB.format(ns=ns)})
    return ns


def call(ns: str) -> float:
    return float(getattr(torch.ops, ns).scale(torch.ones(1))[0])


def statuses(registry, ns: str) -> dict[tuple[str, str], tuple[str, str]]:
    op = registry.plan.op(f"{ns}::scale")
    return {(k.kernel.key, str(k.kernel.fn)): (k.status, k.reason) for k in op.kernels}


@pytest.mark.parametrize("switch,expected,disabled", [
    ("", 1002.0, []),                                       # the contrib candidate first
    ("-sw-contrib", 102.0, ["sw_contrib:fast"]),             # a distribution's kernels
    ("-NS::scale:CPU", 2.0, ["sw_contrib:fast", "sw_owner:cpu"]),  # one key: default serves
    ("-NS::scale", 2.0, ["sw_contrib:fast", "sw_owner:cpu"]),  # custom kernels: all but default
    ("-NS::scale,+sw-owner", 102.0, ["sw_contrib:fast"]),    # the last that matches decides
])
def test_switches_hand_the_call_to_the_next_candidate(two, dists, monkeypatch, switch, expected,
                                                      disabled) -> None:
    ns = two
    if switch:
        monkeypatch.setenv("OPREGISTRY_KERNELS", switch.replace("NS", ns))
    registry = load(dists)
    assert not registry.errors, registry.errors
    assert call(ns) == expected
    found = statuses(registry, ns)
    off = sorted(fn for (_, fn), (status, _) in found.items() if status == "disabled")
    assert off == disabled
    for (_, fn), (status, reason) in found.items():
        if status == "disabled":
            assert reason.startswith("disabled by OPREGISTRY_KERNELS (-"), reason
    if switch:
        assert [s for s, _ in registry.plan.switches] == switch.replace("NS", ns).split(",")


def test_config_file_switches_come_before_the_variable(two, dists, tmp_path, monkeypatch) -> None:
    ns = two
    config = tmp_path / "opregistry.toml"
    config.write_text(f'kernels = ["-{ns}::scale"]\n')
    monkeypatch.setenv("OPREGISTRY_CONFIG", str(config))
    registry = load(dists)
    assert call(ns) == 2.0
    reason = statuses(registry, ns)[("CPU", "sw_owner:cpu")][1]
    assert reason == f"disabled by OPREGISTRY_CONFIG={config} (key 'kernels') (-{ns}::scale)"
    monkeypatch.setenv("OPREGISTRY_KERNELS", "+sw-owner")
    registry = load(dists)
    assert call(ns) == 102.0


@pytest.mark.parametrize("value,match", [
    ("nnkit::rms_norm", "must start with '-'"),
    ("-nnkit::rms_norm:GPU", "not a dispatch key"),
    ("-nn kit", "neither an op"),
])
def test_invalid_switches_are_config_errors(value, match) -> None:
    with pytest.raises(ConfigError, match=match):
        Settings.from_env({"OPREGISTRY_KERNELS": value})


def test_invalid_config_key_value(tmp_path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('kernels = ["rms_norm"]\n')
    with pytest.raises(ConfigError, match=r"key 'kernels'.*must start with"):
        Settings.from_env({"OPREGISTRY_CONFIG": str(config)})


def test_cli_exits_2_on_an_invalid_switch(two, dists) -> None:
    import os

    env = {**os.environ, "OPREGISTRY_KERNELS": "rms_norm",
           "OPREGISTRY_PLUGINS": ",".join([*BACKENDS, *dists.names]),
           "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-m", "opregistry", "list"], env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert "OPREGISTRY_KERNELS" in proc.stderr and "must start with" in proc.stderr


def test_unknown_switch_target_is_an_error_naming_it(two, dists, monkeypatch) -> None:
    monkeypatch.setenv("OPREGISTRY_KERNELS", f"-{two}::scal,-sw-contrb")
    p = plan(dists)
    found = [x for x in p.errors if x.code == "kernel-switch-unknown"]
    assert len(found) == 2
    assert f"did you mean '{two}::scale'" in found[0].message + found[1].message
    assert "did you mean 'sw-contrib'" in found[0].message + found[1].message
    assert not p.excluded  # a typo in a switch leaves nothing out


@pytest.mark.parametrize("key", ["Meta", "Autograd"])
def test_a_switch_of_a_fake_kernel_or_rule_is_said_not_applied(two, dists, monkeypatch,
                                                               key) -> None:
    """Switches leave out device kernels, for the next one to serve: a fake kernel or an
    autograd rule has no next one.  Said, not silently ignored; the kernel stays."""
    monkeypatch.setenv("OPREGISTRY_KERNELS", f"-{two}::scale:{key}")
    registry = load(dists)
    (problem,) = [x for x in registry.problems if x.code == "kernel-switch-not-applied"]
    assert problem.severity == "warning" and problem.op == f"{two}::scale"
    assert f"the {key} kernel of {two}::scale is not switched off: it stays" in problem.message
    assert not registry.plan.excluded and not [x for x in registry.problems
                                               if x.code == "kernel-switch-unknown"]
    # the fake kernel serves all the same
    out = getattr(torch.ops, two).scale(torch.ones(2, device="meta"))
    assert out.device.type == "meta"


def test_list_show_and_lock_name_the_switch(two, dists, monkeypatch, capsys) -> None:
    from opregistry.cli import main

    ns = two
    monkeypatch.setenv("OPREGISTRY_KERNELS", "-sw-contrib")
    monkeypatch.setenv("OPREGISTRY_PLUGINS", ",".join([*BACKENDS, *dists.names]))
    main(["show", f"{ns}::scale"])
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if "sw_contrib:fast" in line)
    assert "disabled" in row and "disabled by OPREGISTRY_KERNELS (-sw-contrib)" in row
    main(["list", "-n", ns])
    out = capsys.readouterr().out
    assert "Kernel switches" in out and "-sw-contrib  OPREGISTRY_KERNELS" in out
    main(["list", "--json", "-s", "disabled"])
    data = json.loads(capsys.readouterr().out)
    assert [k["kernel"] for op in data["ops"] for k in op["kernels"]] == ["sw_contrib:fast"]

    with_switch = lock_data(plan(dists))
    assert with_switch["kernel_switches"] == ["-sw-contrib (OPREGISTRY_KERNELS)"]
    monkeypatch.delenv("OPREGISTRY_KERNELS")
    without = lock_data(plan(dists))
    assert "kernel_switches" not in without
    assert any(d.startswith("kernel switches:") for d in diff_lock(with_switch, without))
