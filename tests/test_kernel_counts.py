"""Which kernel ran: opregistry.kernel_counts() and OPREGISTRY_KERNEL_COUNTS."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import opregistry
from opregistry.backend import device_kernel

from .conftest import BACKENDS, load

SOURCE = """
import torch
from opregistry import OpLibrary
lib = OpLibrary({ns!r})
lib.define("scale(Tensor x) -> Tensor", kernels={{"cpu": "kc_ops:plain"}}, fake="kc_ops:fake")
lib.impl("scale", "cpu", "kc_ops:fast", predicate="kc_ops:small")
lib.define("plus(Tensor x) -> Tensor", kernels={{"default": "kc_ops:plus"}})
def plain(x):
    return x * 2
def fast(x):
    return x * 2
def small(x):
    return x.numel() <= 4
def fake(x):
    return torch.empty_like(x)
def plus(x):
    return x + 1
"""


@pytest.fixture
def kc(dists, ns):
    dists.make("kc-ops", ops={"ops": "kc_ops:lib"}, modules={"kc_ops": SOURCE.format(ns=ns)})
    return ns


def test_counts_each_kernel_and_the_fallbacks(kc, dists) -> None:
    ns = kc
    with opregistry.kernel_counts() as counts:
        load(dists)  # registered inside the block: counting
        ops = getattr(torch.ops, ns)
        for n in (1, 2, 8, 8, 8):
            ops.scale(torch.ones(n))
        ops.plus(torch.ones(2))
    rows = {(op, key, kernel.split(" ")[0]): (calls, fallbacks)
            for op, key, kernel, calls, fallbacks in counts.rows}
    assert rows == {
        (f"{ns}::scale", "CPU", "kc_ops:fast"): (2, 3),
        (f"{ns}::scale", "CPU", "kc_ops:plain"): (3, 3),
        (f"{ns}::plus", "CompositeExplicitAutograd", "kc_ops:plus"): (1, 0),
    }
    table = str(counts)
    assert table.splitlines()[0].split() == ["OP", "KEY", "KERNEL", "CALLS", "FALLBACKS"]
    assert "kc_ops:plain (kc-ops==1.0)" in table
    # a second block counts only its own calls
    with opregistry.kernel_counts() as again:
        getattr(torch.ops, ns).scale(torch.ones(1))
    assert [(r[2].split(" ")[0], r[3], r[4]) for r in again.rows] == [("kc_ops:fast", 1, 0)]


def test_off_by_default_registers_the_kernels_themselves(kc, dists, monkeypatch) -> None:
    """Loaded without counting: the kernel itself is registered, and a block says counting is
    off -- whatever an earlier test of this process counted (the counters are process-wide)."""
    monkeypatch.delenv("OPREGISTRY_KERNEL_COUNTS", raising=False)
    ns = kc
    with opregistry.kernel_counts():  # fill the process-wide counters first, as a test may
        load(dists)
        getattr(torch.ops, ns).plus(torch.ones(1))
    load(dists)  # again, outside any block: not counting
    # zero cost when off: torch calls the kernel function itself, no wrapper in between
    fn = device_kernel(f"{ns}::plus", "CompositeExplicitAutograd")[1]
    assert fn.__name__ == "plus" and fn.__module__ == "kc_ops"
    with opregistry.kernel_counts() as counts:
        getattr(torch.ops, ns).plus(torch.ones(1))
    assert counts.rows == []
    assert not counts.counting
    assert str(counts).startswith("kernel counts: off (set OPREGISTRY_KERNEL_COUNTS=1")


def test_environment_switch_prints_the_table_at_exit(kc, dists) -> None:
    ns = kc
    env = {**os.environ, "OPREGISTRY_KERNEL_COUNTS": "1",
           "OPREGISTRY_PLUGINS": ",".join([*BACKENDS, *dists.names]),
           "PYTHONPATH": os.pathsep.join(sys.path)}
    code = f"import torch; torch.ops.{ns}.scale(torch.ones(9)); torch.ops.{ns}.scale(torch.ones(1))"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "opregistry: which kernel served each op call" in proc.stderr
    line = next(l for l in proc.stderr.splitlines() if "kc_ops:plain" in l)
    assert line.split()[-2:] == ["1", "1"], proc.stderr


def test_invalid_switch_value_is_a_config_error() -> None:
    from opregistry.config import Settings
    from opregistry.errors import ConfigError

    with pytest.raises(ConfigError, match="OPREGISTRY_KERNEL_COUNTS"):
        Settings.from_env({"OPREGISTRY_KERNEL_COUNTS": "maybe"})
