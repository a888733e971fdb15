"""A warm ``import torch`` replays the cached plan's registration program (opregistry.program).

The replay must register what the plan registers -- torch's dispatcher holds
the same kernels, registered at the same lines, after a cold and a warm
start -- and, when anything goes wrong during it, leave the load to the
executor as if there were no program: same problems, same roll-backs, and a
kernel module is not imported twice.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from .test_plan_cache import Env, _header, rewrite_entry

#: the dispatcher's view of the ops of the namespaces given, and what the load did
PROBE = r"""
import json, os, sys
import torch, opregistry
from opregistry.state import process
from torch.library import opcheck
r = opregistry.get_registry()
out = {"cache": process().plan_cache, "replayed": process().plan_replayed, "pid": os.getpid(),
       "ops": sorted(r.op_names), "errors": sorted((p.code, p.message) for p in r.errors),
       "dumps": {}, "checked": []}
for ns in sys.argv[1:]:
    for op in sorted(o for o in r.op_names if o in (ns + "::f", ns + "::g")):
        out["dumps"][op] = torch._C._dispatch_dump(op)
        packet = getattr(getattr(torch.ops, ns), op.split("::")[1])
        x = torch.randn(3, requires_grad=True)
        opcheck(packet.default, (x,))
        packet(x).sum().backward()
        out["checked"].append(op)
    out["present"] = sorted(n for n in dir(getattr(torch.ops, ns)) if not n.startswith("_"))
handle = getattr(sys.modules.get("pg_three_kernels"), "HANDLE", None)
# a handle to an op rolled back is dead: called only when its op stayed registered
out["handle"] = handle(torch.ones(2)).tolist() if handle and "pgtwo::f" in r.op_names else None
print(json.dumps(out))
"""

FULL = '''
from opregistry import OpLibrary
lib = OpLibrary({ns!r})
for name in ("f", "g"):
    lib.define(name + "(Tensor x) -> Tensor", kernels={{"cpu": "{kmod}:clone"}},
               fake="{kmod}:fake", vmap="{kmod}:vmap",
               autograd=("{kmod}:backward", "{kmod}:setup"))
'''
KERNELS = '''
import os, torch
if os.environ.get("PC_COUNT"):
    with open(os.environ["PC_COUNT"], "a") as f:  # by process: torch.compile's workers too
        f.write(f"{os.getpid()} {__name__}\\n")
if os.environ.get("PC_BREAK") == __name__:
    raise RuntimeError("PC_BREAK")
if __name__ == "pg_three_kernels":  # a handle to another distribution's op, taken at import
    try:
        HANDLE = torch.ops.pgtwo.f.default
    except (AttributeError, RuntimeError):
        HANDLE = None
def clone(x): return x.clone()
def fake(x): return torch.empty_like(x)
def vmap(info, in_dims, x): return x.clone(), in_dims[0]
def setup(ctx, inputs, output): pass
def backward(ctx, grad): return grad
'''


#: pg-one's op with a CPU kernel alone; pg-three adds its fake kernel
H = '''
lib.define("h(Tensor x) -> Tensor", kernels={"cpu": "pgone_kernels:clone"})
'''
THREE = '''
from opregistry import OpLibrary
lib = OpLibrary("pgone", "IMPL")
lib.impl("pgone::h", "fake", "pg_three_kernels:fake")
'''


def _env(tmp_path: Path) -> Env:
    env = Env(tmp_path)
    for dist, ns in (("pg-one", "pgone"), ("pg-two", "pgtwo")):
        kmod = f"{ns}_kernels"
        (env.site / f"{kmod}.py").write_text(KERNELS)
        env.dist(dist, dist.replace("-", "_"), FULL.format(ns=ns, kmod=kmod))
    return env


def _probe(env: Env, **extra: str) -> dict[str, Any]:
    out = env.run(PROBE, "pgone", "pgtwo", **extra)
    return json.loads(out.strip().splitlines()[-1])


def test_a_warm_start_replays_and_registers_what_a_cold_one_does(tmp_path: Path) -> None:
    env = _env(tmp_path)
    cold = _probe(env)
    warm = _probe(env)
    assert (cold["cache"], cold["replayed"]) == ("miss", False)
    assert (warm["cache"], warm["replayed"]) == ("hit", True)
    assert warm["ops"] == cold["ops"] == ["pgone::f", "pgone::g", "pgtwo::f", "pgtwo::g"]
    assert warm["checked"] == warm["ops"] and warm["errors"] == cold["errors"] == []
    # every kernel torch holds, and the line that registered it, the same
    assert warm["dumps"] == cold["dumps"]
    for dump in warm["dumps"].values():
        for key in ("CPU", "Autograd", "FuncTorchBatched", "Meta"):
            assert f"\n{key}" in dump or f"{key}[" in dump or f"{key}:" in dump, dump
    # 16 kernels, 8 distinct payloads (f and g of a namespace share their functions)
    programs = []
    for path in (env.cache / "plans").glob("*.json"):
        if "program" in {name for name, *_ in _header(path).get("sections", [])}:
            rewrite_entry(path, lambda header, sections: programs.append(sections["program"]))
    assert programs
    for program in programs:
        rows = program["kernels"]
        payloads = [program["payloads"][row[4]] for row in rows]
        assert len(rows) == 16 and len(program["payloads"]) == len(set(map(str, payloads))) == 8
        assert {p[1] for p in payloads} == {f"{ns}_kernels:{fn}" for ns in ("pgone", "pgtwo")
                                            for fn in ("clone", "fake", "vmap", "backward")}
        assert {program["names"][row[3]] for row in rows} == {"CPU", "Autograd",
                                                             "FuncTorchBatched", "Meta"}


def test_without_a_program_a_hit_decodes_the_plan(tmp_path: Path) -> None:
    """Kernel counting registers kernels wrapped: the plan is registered, not the program."""
    env = _env(tmp_path)
    _probe(env, OPREGISTRY_KERNEL_COUNTS="1")
    counted = _probe(env, OPREGISTRY_KERNEL_COUNTS="1")
    assert (counted["cache"], counted["replayed"]) == ("hit", False)
    assert counted["checked"] == counted["ops"] and len(counted["ops"]) == 4


@pytest.mark.parametrize("broken", ["pgone_kernels", "pgtwo_kernels"])
def test_a_failure_during_the_replay_rolls_back_its_distribution_alone(tmp_path: Path,
                                                                       broken: str) -> None:
    """A kernel module that fails to import on a warm start (the first distribution's, or
    the second's once the first is registered): the replay leaves out the culprit, as an
    uncached load does, and the other stays registered."""
    env = _env(tmp_path)
    _probe(env)
    count = tmp_path / "imports.txt"
    warm = _probe(env, PC_BREAK=broken, PC_COUNT=str(count))
    assert (warm["cache"], warm["replayed"]) == ("hit", True)
    assert count.read_text().splitlines().count(f"{warm['pid']} {broken}") == 1
    count.unlink()
    uncached = _probe(env, PC_BREAK=broken, PC_COUNT=str(count), OPREGISTRY_CACHE="0")
    assert warm["errors"] == uncached["errors"] and warm["errors"]
    assert [code for code, _ in warm["errors"]] == ["materialize-failed"]
    assert "PC_BREAK" in warm["errors"][0][1]
    survivor = "pgtwo" if broken.startswith("pgone") else "pgone"
    assert warm["ops"] == uncached["ops"] == [f"{survivor}::f", f"{survivor}::g"]
    assert warm["checked"] == warm["ops"] and warm["dumps"] == uncached["dumps"]


def test_a_distribution_that_implements_a_failed_ones_op_goes_with_it(tmp_path: Path) -> None:
    """pg-three adds the fake kernel of pgone::h: when pg-one fails, pg-three is left out too
    (materialize-dependency-failed), in the replay as in an uncached load; pg-two stays
    registered once: a handle to its op that pg-three's module took while the replay ran
    still works."""
    env = _env(tmp_path)
    (env.site / "pg_three_kernels.py").write_text(KERNELS)
    env.dist("pg-three", "pg_three", THREE)
    (env.site / "pg_one.py").write_text((env.site / "pg_one.py").read_text() + H)
    cold = _probe(env)
    assert "pgone::h" in cold["ops"] and cold["errors"] == []
    warm = _probe(env, PC_BREAK="pgone_kernels")
    uncached = _probe(env, PC_BREAK="pgone_kernels", OPREGISTRY_CACHE="0")
    assert (warm["cache"], warm["replayed"]) == ("hit", True)
    assert warm["errors"] == uncached["errors"]
    assert sorted(code for code, _ in warm["errors"]) == ["materialize-dependency-failed",
                                                           "materialize-failed"]
    assert warm["ops"] == uncached["ops"] == ["pgtwo::f", "pgtwo::g"]
    assert warm["dumps"] == uncached["dumps"]
    assert warm["handle"] == uncached["handle"] == [1.0, 1.0]


@pytest.mark.parametrize("damage", ["a row", "the version"])
def test_a_program_it_cannot_replay_leaves_the_load_to_the_plan(tmp_path: Path,
                                                                damage: str) -> None:
    """A well-formed entry whose program is not what this opregistry writes: a row it cannot
    read fails the replay (undone, the plan registered); a version it does not know is not
    replayed at all."""
    env = _env(tmp_path)
    cold = _probe(env)

    def change(header: dict[str, Any], sections: dict[str, Any]) -> None:
        program = sections["program"]
        if damage == "a row":  # a payload of a kind this opregistry does not know
            program["payloads"][program["kernels"][-1][4]] = ["no-such-kind",
                                                              "pgtwo_kernels:clone"]
        else:
            program["version"] = 999

    # torch.compile's worker processes (opcheck) may have entries of their own slot
    for path in (env.cache / "plans").glob("*.json"):
        if "program" in {name for name, *_ in _header(path).get("sections", [])}:
            rewrite_entry(path, change)
    warm = _probe(env)
    assert (warm["cache"], warm["replayed"]) == ("hit", False)
    assert warm["ops"] == cold["ops"] and warm["errors"] == []
    assert warm["checked"] == warm["ops"] and warm["dumps"] == cold["dumps"]
