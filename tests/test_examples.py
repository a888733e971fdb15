"""Every op of every installed op package that declares samples, through torch's own checks.

The ops are found, not listed: whatever distribution pip installed into this
environment (``examples/*``) and whatever op of it declares sample inputs is
checked with ``torch.library.opcheck`` (all four default test utils),
``torch.autograd.gradcheck`` where an Autograd kernel is active,
``torch.compile(fullgraph=True)`` (one graph, the op in it once, no graph
break) and ``torch.export``.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch._dynamo.utils import counters
from torch.utils import _pytree as pytree

import opregistry
from opregistry.guard import resolve_ref

OPCHECK_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor",
                 "test_aot_dispatch_dynamic")

Sample = tuple[tuple[Any, ...], dict[str, Any]]


def _installed_ops_with_samples(key: str | None = None) -> list[str]:
    """Op names, at collection time, without importing the op packages' kernels.

    With ``key``, only the ops that declare a kernel for that dispatch key
    which is active here (``CUDA`` is ``unavailable`` without a GPU).
    """
    names = []
    for op in opregistry.plan().ops:
        if op.op.samples is None:
            continue
        if key is not None:
            kernel = op.kernel(key)
            if kernel is None or kernel.status != "active":
                continue
        names.append(op.op.qualname)
    return sorted(names)


EXAMPLE_OPS = _installed_ops_with_samples()
#: the ops whose gradients are checked: those with an active Autograd kernel
AUTOGRAD_OPS = _installed_ops_with_samples("Autograd")
#: the ops checked on a GPU: those whose CUDA kernel is active (none without one)
CUDA_OPS = _installed_ops_with_samples("CUDA") if torch.cuda.is_available() else []


def test_examples_are_installed():
    """The repo's example op packages are installed, so the checks below have ops to check."""
    assert {"tutorial::muladd", "tutorial::numpy_sin", "tutorial::add_out"} <= set(EXAMPLE_OPS)
    assert {"tutorial::muladd", "tutorial::numpy_sin"} <= set(AUTOGRAD_OPS)


def _samples(op: Any) -> list[Sample]:
    raw = resolve_ref(op.op.samples)()
    samples = []
    for item in raw:
        if isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], dict):
            args, kwargs = item
        else:  # an object with .args / .kwargs
            args, kwargs = item.args, getattr(item, "kwargs", {}) or {}
        samples.append((tuple(args), dict(kwargs)))
    assert samples, f"{op.op.qualname}: samples() returned no sample"
    return samples


def _copy(sample: Sample) -> Sample:
    """Independent copies of a sample's tensors, leaves with the same requires_grad."""
    def clone(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return x.detach().clone().requires_grad_(x.requires_grad)
        return x

    return pytree.tree_map(clone, sample)


def _tensors(sample: Sample) -> list[torch.Tensor]:
    """The sample's tensors, to compare what an op mutated."""
    return [x for x in pytree.tree_leaves(sample) if isinstance(x, torch.Tensor)]


def _overload(qualname: str) -> Any:
    ns, _, name = qualname.partition("::")
    name, _, overload = name.partition(".")
    return getattr(getattr(getattr(torch.ops, ns), name), overload or "default")


@pytest.fixture
def example(installed, request):
    """(op plan, OpOverload, samples) of one installed example op; fails if it did not load."""
    qualname = request.param
    op = installed.op(qualname)
    if op is None or qualname not in installed.op_names:
        problems = [str(p) for p in installed.problems if p.severity == "error"]
        pytest.fail(f"{qualname} is installed but was not registered: {problems}")
    return op, _overload(qualname), _samples(op)


@pytest.mark.parametrize("example", EXAMPLE_OPS, indirect=True)
def test_opcheck(example):
    """torch.library.opcheck with all four default test utils, on every sample."""
    op, overload, samples = example
    for args, kwargs in samples:
        result = torch.library.opcheck(overload, args, kwargs, test_utils=OPCHECK_UTILS)
        assert result == dict.fromkeys(OPCHECK_UTILS, "SUCCESS"), result


@pytest.mark.parametrize("example", AUTOGRAD_OPS, indirect=True)
def test_gradcheck(example):
    """With an active Autograd kernel: gradcheck on every sample that requires grad."""
    op, overload, samples = example
    checked = 0
    for args, kwargs in samples:
        leaves, spec = pytree.tree_flatten((args, kwargs))
        grad_at = [i for i, x in enumerate(leaves)
                   if isinstance(x, torch.Tensor) and x.requires_grad]
        if not grad_at:
            continue

        def call(*inputs: torch.Tensor, leaves: list[Any] = leaves, grad_at: list[int] = grad_at,
                 spec: Any = spec) -> Any:
            full = list(leaves)
            for i, t in zip(grad_at, inputs):
                full[i] = t
            a, k = pytree.tree_unflatten(full, spec)
            return overload(*a, **k)

        assert all(leaves[i].dtype == torch.double for i in grad_at), \
            f"{op.op.qualname}: gradcheck needs double-precision samples"
        assert torch.autograd.gradcheck(call, tuple(leaves[i] for i in grad_at))
        checked += 1
    assert checked, (f"{op.op.qualname} has an active Autograd kernel but no sample requires "
                     f"grad: add one (double precision, requires_grad=True)")


def _graph_calls(graphs: list[torch.fx.GraphModule]) -> list[str]:
    names = []
    for g in graphs:
        for node in g.graph.nodes:
            if node.op != "call_function":
                continue
            t = node.target
            if isinstance(t, torch._ops.OpOverload):
                names.append(t._schema.name)
            elif isinstance(t, torch._ops.OpOverloadPacket):
                names.append(t._qualified_op_name)
    return names


@pytest.mark.parametrize("example", EXAMPLE_OPS, indirect=True)
def test_compile_fullgraph(example):
    """torch.compile(fullgraph=True): one graph holding the op once, same results as eager."""
    op, overload, samples = example
    base = op.op.qualname.split(".")[0]
    for sample in samples:
        graphs: list[torch.fx.GraphModule] = []

        def backend(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
            graphs.append(gm)
            return gm.forward

        def f(*args: Any, **kwargs: Any) -> Any:
            return overload(*args, **kwargs)

        torch._dynamo.reset()
        counters.clear()
        eager_in, compiled_in = _copy(sample), _copy(sample)
        expected = f(*eager_in[0], **eager_in[1])
        with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True,
                                        capture_scalar_outputs=True):
            got = torch.compile(f, backend=backend, fullgraph=True)(*compiled_in[0],
                                                                    **compiled_in[1])
        torch.testing.assert_close(got, expected, equal_nan=True)
        torch.testing.assert_close(_tensors(compiled_in), _tensors(eager_in), equal_nan=True)
        assert len(graphs) == 1 and not counters["graph_break"]
        assert _graph_calls(graphs).count(base) == 1, _graph_calls(graphs)


class _Call(torch.nn.Module):
    def __init__(self, overload: Any, kwargs: dict[str, Any]) -> None:
        super().__init__()
        self.overload = overload
        self.kwargs = kwargs

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.overload(*args, **kwargs, **self.kwargs)


@pytest.mark.parametrize("example", EXAMPLE_OPS, indirect=True)
def test_export(example):
    """torch.export: the op is one node of the exported program, which runs like eager."""
    op, overload, samples = example
    base = op.op.qualname.split(".")[0]
    for sample in samples:
        eager_in, export_in = _copy(sample), _copy(sample)
        args, kwargs = export_in
        tensor_kwargs = {k: v for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
        const_kwargs = {k: v for k, v in kwargs.items() if k not in tensor_kwargs}
        with torch.no_grad():
            ep = torch.export.export(_Call(overload, const_kwargs), args, kwargs=tensor_kwargs)
            calls = _graph_calls([ep.graph_module])
            assert calls.count(base) == 1, calls
            expected = overload(*eager_in[0], **eager_in[1])
            got = ep.module()(*args, **tensor_kwargs)
        torch.testing.assert_close(got, expected, equal_nan=True)
        torch.testing.assert_close(_tensors(export_in), _tensors(eager_in), equal_nan=True)


def _to_cuda(sample: Sample) -> Sample:
    """The sample on the GPU: tensors moved (leaves stay leaves), 'cpu' devices become 'cuda'."""
    def move(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return x.detach().to("cuda").requires_grad_(x.requires_grad)
        if isinstance(x, torch.device) and x.type == "cpu" or x == "cpu":
            return torch.device("cuda")
        return x

    return pytree.tree_map(move, sample)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("example", CUDA_OPS or [pytest.param(None, marks=pytest.mark.skip(
    reason="no op with an active CUDA kernel"))], indirect=True)
def test_opcheck_cuda(example):
    """On a GPU, every op with an active CUDA kernel passes opcheck on CUDA tensors."""
    op, overload, samples = example
    for sample in samples:
        args, kwargs = _to_cuda(sample)
        result = torch.library.opcheck(overload, args, kwargs, test_utils=OPCHECK_UTILS)
        assert result == dict.fromkeys(OPCHECK_UTILS, "SUCCESS"), result
