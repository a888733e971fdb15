"""verify_consistent for real: gloo process groups of separate processes on the loopback."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from opregistry.distributed import verify_consistent

from .conftest import BACKENDS

WORKER = """
import datetime, json, sys
import torch.distributed as dist  # importing torch autoloads this rank's registry
import opregistry
from opregistry.distributed import verify_consistent

def attempt(group=None):
    try:
        return {"ok": True, "fingerprint": verify_consistent(group)}
    except opregistry.LockMismatchError as exc:
        return {"ok": False, "message": str(exc), "differences": list(exc.differences)}

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
try:
    result = attempt()
    # a subgroup of the first and the last rank: messages name global ranks
    last = dist.get_world_size() - 1
    pair = dist.new_group([0, last])
    if dist.get_rank() in (0, last):
        result["pair"] = attempt(pair)
finally:
    dist.destroy_process_group()
print(json.dumps(result))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(rank_env: list[dict[str, str]], allow: list[str]) -> list[dict]:
    """Start one process per entry of ``rank_env`` in one gloo group; each rank's JSON result."""
    port = str(free_port())
    procs = []
    for rank, extra in enumerate(rank_env):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
               "RANK": str(rank), "WORLD_SIZE": str(len(rank_env)), "GLOO_SOCKET_IFNAME": "lo",
               "OPREGISTRY_PLUGINS": ",".join(allow)}
        for var in ("OPREGISTRY_BLOCK", "OPREGISTRY_AUTOLOAD", "OPREGISTRY_ALLOW_OVERRIDE"):
            env.pop(var, None)
        if "PYTHONPATH" in extra:
            extra = {**extra, "PYTHONPATH": os.pathsep.join(
                [extra["PYTHONPATH"], *filter(None, [os.environ.get("PYTHONPATH")])])}
        env.update(extra)
        procs.append(subprocess.Popen([sys.executable, "-c", WORKER], env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    results = []
    try:
        for rank, proc in enumerate(procs):
            out, err = proc.communicate(timeout=150)
            assert proc.returncode == 0, f"rank {rank} failed:\n{err}"
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return results


ALLOW = [*BACKENDS, "tutorial-ops"]


@pytest.mark.slow
def test_consistent_ranks_agree():
    """Two ranks with the same plugins get the same fingerprint, and no error."""
    results = run_ranks([{}, {}], ALLOW)
    assert all(r["ok"] for r in results), results
    assert results[0]["fingerprint"] == results[1]["fingerprint"]
    assert results[0]["fingerprint"].startswith("sha256:")
    assert results[0]["pair"] == results[1]["pair"] == {"ok": True,
                                                        "fingerprint": results[0]["fingerprint"]}


@pytest.mark.slow
def test_planted_differences_raise_on_every_rank(dists):
    """Rank 1 blocks a backend, rank 2 has one more distribution: all three ranks raise."""
    mod = f"only_on_rank2_{os.getpid()}"
    dists.make("rank-two-ops", version="2.5", ops={"ops": f"{mod}:lib"}, modules={mod: (
        "from opregistry import OpLibrary\n"
        "lib = OpLibrary('ranktwo')\n"
        "lib.define('f(Tensor x) -> Tensor', kernels={'cpu': 'nowhere:f'})\n")})
    # the temporary distribution is on rank 2's path only
    results = run_ranks(
        [{}, {"OPREGISTRY_BLOCK": "opregistry-vmap"}, {"PYTHONPATH": str(dists.root)}],
        [*ALLOW, "rank-two-ops"])
    assert not any(r["ok"] for r in results), results
    assert len({r["message"] for r in results}) == 1, "every rank raises the same error"
    message, diffs = results[0]["message"], results[0]["differences"]
    assert "the ranks resolved 3 different registries" in message
    assert "rank 1 differs from rank 0:" in message and "rank 2 differs from rank 0:" in message
    assert "distribution opregistry-vmap==0.1.0: in rank 0, missing from rank 1" in diffs
    assert any("op tutorial::muladd FuncTorchBatched kernel" in d and "rank 1 has 'inactive'" in d
               for d in diffs)
    assert "distribution rank-two-ops==2.5: in rank 2, not in rank 0" in diffs
    assert "op ranktwo::f (from rank-two-ops==2.5): in rank 2, not in rank 0" in diffs
    # the pair (0, 2) differs only by rank 2's distribution, named by its global rank
    assert "pair" not in results[1]
    pair = results[2]["pair"]
    assert not pair["ok"] and pair == results[0]["pair"]
    assert "rank 2 differs from rank 0:" in pair["message"] and "rank 1" not in pair["message"]
    assert "distribution rank-two-ops==2.5: in rank 2, not in rank 0" in pair["differences"]


def test_needs_an_initialized_process_group():
    with pytest.raises(RuntimeError, match="init_process_group"):
        verify_consistent()


def test_single_process_group(tmp_path: Path):
    """World size 1 (a file store, no network): the fingerprint of this process's plan."""
    import torch.distributed as dist

    from opregistry.lockfile import fingerprint
    from opregistry.registry import plan

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        resolved = plan(plugins=ALLOW)
        assert verify_consistent(plan=resolved) == fingerprint(resolved)
    finally:
        dist.destroy_process_group()
