"""opregistry ops under torch.compile(fullgraph=True) and torch.export, and an exported
program reloaded in a fresh process that has only the op package installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch._dynamo.utils import counters

TUTORIAL = ["tutorial-ops", "opregistry-cpu", "opregistry-cuda", "opregistry-meta",
            "opregistry-autograd", "opregistry-vmap"]


class GraphCapture:
    """A torch.compile backend that keeps every FX graph dynamo hands it, and runs it eagerly."""

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        self.graphs.append(gm)
        return gm.forward

    def calls(self) -> list[str]:
        """The ops called, by name (dynamo records the packet, AOT the overload)."""
        return [_op_name(n.target) for g in self.graphs for n in g.graph.nodes
                if n.op == "call_function"]


def _op_name(target: Any) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.name
    if isinstance(target, torch._ops.OpOverloadPacket):
        return target._qualified_op_name
    return getattr(target, "__name__", repr(target))


def _compile(fn: Any) -> tuple[Any, GraphCapture]:
    torch._dynamo.reset()
    counters.clear()
    capture = GraphCapture()
    return torch.compile(fn, backend=capture, fullgraph=True), capture


def test_compile_fullgraph_one_node_per_op(installed):
    """Functional and mutating ops each become one node of one graph: no graph break."""
    tutorial = torch.ops.tutorial

    def f(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        y = tutorial.muladd(a, b, 2.0)
        z = tutorial.numpy_sin(y)
        tutorial.add_out(z, a, out)
        return out * 2

    compiled, capture = _compile(f)
    a, b = torch.randn(5), torch.randn(5)
    out_eager, out_compiled = torch.empty(5), torch.empty(5)
    torch.testing.assert_close(compiled(a, b, out_compiled), f(a, b, out_eager))
    torch.testing.assert_close(out_compiled, out_eager)  # the mutation happened
    assert len(capture.graphs) == 1
    assert not counters["graph_break"], dict(counters["graph_break"])
    calls = capture.calls()
    for op in ("tutorial::muladd", "tutorial::numpy_sin", "tutorial::add_out"):
        assert calls.count(op) == 1, calls


def test_compile_with_aot_autograd_runs_fake_and_backward(installed):
    """aot_eager traces the fake kernels and the registered backward; gradients match eager."""
    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.ops.tutorial.numpy_sin(torch.ops.tutorial.muladd(a, b, 0.5)).sum()

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True, dynamic=True)
    for n in (3, 7):
        a = torch.randn(n, dtype=torch.double, requires_grad=True)
        b = torch.randn(n, dtype=torch.double, requires_grad=True)
        ga, gb = torch.autograd.grad(compiled(a, b), (a, b))
        ea, eb = torch.autograd.grad(f(a, b), (a, b))
        torch.testing.assert_close((ga, gb), (ea, eb))
    assert not counters["graph_break"]


class Model(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.ops.tutorial.numpy_sin(torch.ops.tutorial.muladd(a, b, 1.5)) + 1


def test_export_keeps_each_op_as_one_node(installed):
    """torch.export: the program holds the ops themselves and runs like eager."""
    a, b = torch.randn(4), torch.randn(4)
    ep = torch.export.export(Model(), (a, b))
    targets = [n.target for n in ep.graph.nodes if n.op == "call_function"]
    assert targets.count(torch.ops.tutorial.muladd.default) == 1
    assert targets.count(torch.ops.tutorial.numpy_sin.default) == 1
    torch.testing.assert_close(ep.module()(a, b), Model()(a, b))


RELOAD = """
import json, sys
import torch
ep = torch.export.load(sys.argv[1])
a, b = torch.load(sys.argv[2])
y = ep.module()(a, b)
print(json.dumps({"result": y.tolist(), "tests_imported": any(m.startswith("tests") for m in sys.modules)}))
"""


def _fresh(args: list[str], cwd: Path, **env_vars: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPREGISTRY_")}
    env.pop("PYTHONPATH", None)  # nothing of this test run: only what pip installed
    env.update(env_vars)
    return subprocess.run([sys.executable, "-c", RELOAD, *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=120)


@pytest.mark.slow
def test_exported_program_reloads_in_fresh_process(installed, tmp_path):
    """torch.export.save here; torch.export.load + run in a new process with only the op package."""
    a, b = torch.randn(4), torch.randn(4)
    ep = torch.export.export(Model(), (a, b))
    program, inputs = tmp_path / "model.pt2", tmp_path / "inputs.pt"
    torch.export.save(ep, program)
    torch.save((a, b), inputs)
    # only the op package (and the backends it needs) among installed op distributions
    only = ",".join(TUTORIAL)
    out = _fresh([str(program), str(inputs)], tmp_path, OPREGISTRY_PLUGINS=only)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["tests_imported"] is False
    torch.testing.assert_close(torch.tensor(result["result"]), Model()(a, b))

    # the control: without the op package loaded, the program cannot run
    out = _fresh([str(program), str(inputs)], tmp_path, OPREGISTRY_AUTOLOAD="0")
    assert out.returncode != 0
    assert "tutorial" in out.stderr
