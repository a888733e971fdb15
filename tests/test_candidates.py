"""Several kernels for one (op, key): candidates with conditions, and their fallbacks.

Each case is a temporary distribution with real entry points; the chain of
candidates is registered with torch's dispatcher and called for real.
"""

from __future__ import annotations

import sys

import pytest
import torch

import opregistry
from opregistry.errors import DeclarationError
from opregistry.conditions import Condition, in_range, parse_range
from opregistry.environment import Environment

from .conftest import load, plan

OWNER = """
import torch
from opregistry import OpLibrary
lib = OpLibrary({ns!r})
lib.define("scale(Tensor x) -> Tensor", kernels={{"cpu": "{mod}:plain"}}, fake="{mod}:fake")
def plain(x):
    return x * 2
def fake(x):
    return torch.empty_like(x)
"""

FAST = """
import torch
from opregistry import OpLibrary
lib = OpLibrary({ns!r}, "IMPL")
{impls}
def fast(x):
    return x * 2 + 1000          # tells which kernel ran
def faster(x):
    return x * 2 + 2000
def small(x):
    return x.numel() <= 4
def floats(x):
    return x.dtype == torch.float32
def broken(x):
    raise ValueError("bug in a predicate")
"""


def make(dists, ns: str, impls: str) -> None:
    dists.make("cand-owner", ops={"ops": "cand_owner:lib"},
               modules={"cand_owner": OWNER.format(ns=ns, mod="cand_owner")})
    dists.make("cand-fast", ops={"ops": "cand_fast:lib"},
               modules={"cand_fast": FAST.format(ns=ns, impls=impls)})


def rows(resolved, ns: str) -> list[tuple[str, str, str]]:
    """``(kernel, status, reason)`` of the CPU kernels of ``ns::scale``, in the order tried."""
    op = resolved.op(f"{ns}::scale")
    return [(k.kernel.fn, k.status, k.reason) for k in op.kernels if k.kernel.key == "CPU"]


def test_predicate_falls_back_to_the_owners_kernel(dists, ns) -> None:
    make(dists, ns, 'lib.impl("scale", "cpu", "cand_fast:fast", predicate="cand_fast:small")')
    registry = load(dists)
    assert not registry.errors, registry.errors
    op = getattr(torch.ops, ns).scale
    assert torch.equal(op(torch.ones(2)), torch.full((2,), 1002.0))      # the candidate
    assert torch.equal(op(torch.ones(8)), torch.full((8,), 2.0))         # the fallback
    found = rows(registry.plan, ns)
    assert [(f, s) for f, s, _ in found] == [("cand_fast:fast", "active"),
                                             ("cand_owner:plain", "active")]
    assert "candidate 1" in found[0][2] and "cand_fast:small" in found[0][2]
    assert found[1][2].startswith("candidate 2, fallback")
    # the same chain under torch.compile and opcheck
    compiled = torch.compile(op, fullgraph=True)
    assert torch.equal(compiled(torch.ones(2)), torch.full((2,), 1002.0))
    torch.library.opcheck(op.default, (torch.ones(3),))


def test_load_time_conditions_are_recorded_for_every_candidate(dists, ns) -> None:
    impls = "\n".join([
        'lib.impl("scale", "cpu", "cand_fast:fast", when={"requires": "no-such-dist-xyz>=1"})',
        'lib.impl("scale", "cpu", "cand_fast:faster", priority=5, when={"torch": "<2.0"})',
        f'lib.impl("scale", "cpu", "cand_fast:fast", priority=1, '
        f'when={{"platform": {sys.platform[:3]!r}}}, predicate="cand_fast:floats")',
    ])
    make(dists, ns, impls)
    registry = load(dists)
    assert not registry.errors, registry.errors
    found = rows(registry.plan, ns)
    # priority first (5, 1, 0), the plain kernel last
    assert [s for _, s, _ in found] == ["unmet", "active", "unmet", "active"]
    assert found[0][2].startswith("condition not met: torch ") and "<2.0" in found[0][2]
    assert "no-such-dist-xyz is not installed" in found[2][2]
    op = getattr(torch.ops, ns).scale
    assert torch.equal(op(torch.ones(2)), torch.full((2,), 1002.0))
    assert torch.equal(op(torch.ones(2, dtype=torch.double)), torch.full((2,), 2.0,
                                                                        dtype=torch.double))


def test_a_candidate_without_per_call_condition_takes_every_call(dists, ns) -> None:
    make(dists, ns, f'lib.impl("scale", "cpu", "cand_fast:fast", '
                    f'when={{"platform": {sys.platform!r}}})')
    registry = load(dists)
    found = rows(registry.plan, ns)
    assert [s for _, s, _ in found] == ["active", "unreached"]
    assert "never tried: cand_fast:fast takes every call" in found[1][2]
    # registered as a plain kernel: no chain in between
    from opregistry.backend import device_kernel

    assert device_kernel(f"{ns}::scale", "CPU")[1].__name__ == "fast"
    assert torch.equal(getattr(torch.ops, ns).scale(torch.ones(1)), torch.full((1,), 1002.0))


def test_a_raising_predicate_declines_and_warns_once(dists, ns) -> None:
    make(dists, ns, 'lib.impl("scale", "cpu", "cand_fast:fast", predicate="cand_fast:broken")')
    registry = load(dists)
    assert not registry.errors, registry.errors
    op = getattr(torch.ops, ns).scale
    with pytest.warns(RuntimeWarning, match="raised ValueError: bug in a predicate") as caught:
        assert torch.equal(op(torch.ones(2)), torch.full((2,), 2.0))
    # the predicate is named (the function with the bug), and the candidate it guards
    [message] = [str(w.message) for w in caught if "bug in a predicate" in str(w.message)]
    assert "the predicate cand_fast:broken of the candidate cand_fast:fast" in message
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(op(torch.ones(2)), torch.full((2,), 2.0))  # once only


def test_unconditioned_second_kernel_is_still_a_conflict(dists, ns) -> None:
    make(dists, ns, 'lib.impl("scale", "cpu", "cand_fast:fast")')
    assert [p.code for p in plan(dists).errors] == ["kernel-conflict"]


def test_candidates_only_no_fallback_raises_when_all_decline(dists, ns) -> None:
    dists.make("cand-only", ops={"ops": "cand_only:lib"}, modules={"cand_only": f"""
        import torch
        from opregistry import OpLibrary
        lib = OpLibrary({ns!r})
        lib.define("scale(Tensor x) -> Tensor", fake="cand_only:fake")
        lib.impl("scale", "cpu", "cand_only:fast", predicate="cand_only:small")
        def fast(x):
            return x * 2
        def small(x):
            return x.numel() <= 4
        def fake(x):
            return torch.empty_like(x)
    """})
    registry = load(dists)
    assert not registry.errors, registry.errors
    op = getattr(torch.ops, ns).scale
    assert torch.equal(op(torch.ones(2)), torch.full((2,), 2.0))
    with pytest.raises(NotImplementedError, match="no CPU kernel accepts this call"):
        op(torch.ones(8))


def test_candidates_are_listed_by_show(dists, ns, capsys, monkeypatch) -> None:
    from opregistry.cli import main

    make(dists, ns, 'lib.impl("scale", "cpu", "cand_fast:fast", predicate="cand_fast:small", '
                    'when={"requires": "no-such-dist-xyz"})')
    monkeypatch.setenv("OPREGISTRY_PLUGINS", "opregistry-cpu,opregistry-meta,cand-owner,cand-fast")
    main(["show", f"{ns}::scale"])
    out = capsys.readouterr().out
    assert "unmet" in out and "condition not met: no-such-dist-xyz is not installed" in out
    assert "candidate 1, fallback: no candidate before it is in effect" in out


@pytest.mark.parametrize("when,match", [
    ({"torch": ">=two"}, "not a version comparison"),
    ({"requires": "triton>>3"}, "not a version comparison"),
    ({"cuda": ">=9.0"}, "unknown condition"),
    ({"capability": ">=9.0"}, "belongs to a CUDA kernel"),
    ("linux", "must be a dict"),
])
def test_bad_conditions_are_refused_at_declaration(when, match) -> None:
    lib = opregistry.OpLibrary("badcond", "IMPL")
    with pytest.raises(DeclarationError, match=match):
        lib.impl("badcond::f", "cpu", "m:f", when=when)


def test_conditions_on_a_fake_kernel_are_refused() -> None:
    with pytest.raises(DeclarationError, match="choose between device kernels"):
        opregistry.Kernel(op="a::b", key="Meta", fn="m:f", predicate="m:p")


def test_ranges() -> None:
    assert in_range("2.13.0+cpu", parse_range(">=2.10,<2.15", "torch"))
    assert not in_range("2.15", parse_range(">=2.10,<2.15", "torch"))
    assert in_range((9, 0), parse_range(">=9.0", "capability"))
    assert not in_range((8, 6), parse_range(">=9.0", "capability"))
    env = Environment(distributions={"pytest": "8.3.1"}, platform="linux")
    assert Condition(requires="pytest>=1").unmet(env) is None
    assert Condition(requires="pytest<1").unmet(env) == "pytest 8.3.1 is not <1"
    assert Condition(requires="absent-dist").unmet(env) == (
        "absent-dist is not installed (needs absent-dist)")
    assert Condition(torch=">=2.8").unmet(env) == "torch is not installed"
    assert Condition(platform="win32").unmet(env) == "platform linux is not win32"


def test_lock_records_candidates_in_order_with_their_conditions(dists, ns) -> None:
    from opregistry.lockfile import lock_data

    make(dists, ns, 'lib.impl("scale", "cpu", "cand_fast:fast", predicate="cand_fast:small", '
                    'when={"requires": "no-such-dist-xyz"})')
    data = lock_data(plan(dists))
    op = data["ops"][f"{ns}::scale"]
    entries = op["kernels"]["CPU (candidates)"]
    assert [(e["kernel"], e["when"], e["predicate"], e["status"]) for e in entries] == [
        ("cand_fast:fast", "no-such-dist-xyz", "cand_fast:small", "candidate"),
        ("cand_owner:plain", None, None, "candidate")]


def test_capability_condition_is_read_per_device_and_cached(monkeypatch) -> None:
    """``when={"capability": ">=9.0"}``: each CUDA device is asked once (no GPU needed:
    fake CUDA tensors, and torch.cuda.get_device_capability answered by the test)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from opregistry.selection import Step, chain

    asked: list[int] = []
    capabilities = {0: (8, 6), 1: (9, 0)}

    def capability(index: int) -> tuple[int, int]:
        asked.append(index)
        return capabilities[index]

    monkeypatch.setattr(torch.cuda, "get_device_capability", capability)
    kernel = chain("a::op", "CUDA", [Step(lambda x: "sm90", capability=">=9.0", label="fast"),
                                     Step(lambda x: "portable", label="portable")])
    with FakeTensorMode():
        on0, on1 = torch.empty(2, device="cuda:0"), torch.empty(2, device="cuda:1")
    assert [kernel(on0), kernel(on1), kernel(on1), kernel(on0)] == \
        ["portable", "sm90", "sm90", "portable"]
    assert asked == [0, 1]


def test_a_triton_candidate_runs_with_wrap_triton_off(dists, ns) -> None:
    """As a Triton kernel's device kernel does: real tensors need no tracing of the launch."""
    pytest.importorskip("triton", reason="requirements-dev.txt installs triton on Linux")
    make(dists, ns, 'lib.impl("scale", "cpu", "cand_fast:records", triton=True, '
                    'predicate="cand_fast:small")\n'
                    'SEEN = []\n'
                    'def records(x):\n'
                    '    from torch._library.triton import is_wrap_triton_enabled\n'
                    '    SEEN.append(is_wrap_triton_enabled())\n'
                    '    return x * 2 + 1000')
    registry = load(dists)
    assert not registry.errors, registry.errors
    assert torch.equal(getattr(torch.ops, ns).scale(torch.ones(2)), torch.full((2,), 1002.0))
    assert sys.modules["cand_fast"].SEEN == [False]
    from torch._library.triton import is_wrap_triton_enabled

    assert is_wrap_triton_enabled()  # switched off for the call only
