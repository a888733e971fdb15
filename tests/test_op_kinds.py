"""Every op kind torch.library supports, declared through opregistry, dispatched for real.

Each case is a temporary distribution (real entry points) whose op is
registered by the installed CPU / Meta backends; the test calls the op
through the dispatcher, checks the result against a reference, checks the
CPU kernel sits at the ``CPU`` key, and runs ``torch.library.opcheck`` with
all four default test utils over the op's samples.
"""

from __future__ import annotations

import textwrap
from typing import Any, Callable

import attrs
import pytest
import torch

from .conftest import load

#: torch.library.opcheck's default test utils, spelled out so that a change
#: of torch's default is seen here rather than silently testing less
OPCHECK_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor",
                 "test_aot_dispatch_dynamic")


@attrs.frozen
class Kind:
    """One op kind: its declaration, kernels, samples and how to check a call."""

    name: str
    schema: str
    kernels: str
    samples: str
    check: Callable[[Any, str], None]
    extra: str = ""  # keyword arguments of lib.define, as source


def _d(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.double)


def _check_functional(op: Any, ns: str) -> None:
    x = _d(3)
    torch.testing.assert_close(op(x, 2.5), x * 2.5)


def _check_mutable(op: Any, ns: str) -> None:
    x = _d(3)
    before = x.clone()
    assert op(x, 1.5) is None
    torch.testing.assert_close(x, before + 1.5)


def _check_inplace(op: Any, ns: str) -> None:
    x = _d(5)
    expected = x.clamp(min=0)
    result = op(x)
    assert result is x  # in-place: returns its (mutated) first argument
    torch.testing.assert_close(x, expected)
    assert torch.Tag.inplace in op.tags


def _check_out(op: Any, ns: str) -> None:
    a, b, out = _d(4), _d(4), torch.empty(4, dtype=torch.double)
    result = op(a, b, out=out)
    assert result is out
    torch.testing.assert_close(out, a + b)
    assert torch.Tag.out in op.tags
    functional = getattr(torch.ops, ns).plus.default
    torch.testing.assert_close(functional(a, b), a + b)
    # torch 2.13 pairs a functional op with its Tag.out overload (inductor lowers
    # to it); a private lookup, so a torch change shows up here, loudly
    if torch.__version__ < "2.13":  # no pairing to check before 2.13
        return
    from torch._library._out_variant import to_out_variant

    assert to_out_variant(functional) == op


def _check_factory(op: Any, ns: str) -> None:
    torch.testing.assert_close(op(4, device="cpu"), torch.arange(4, dtype=torch.double))
    # no tensor argument: only the BackendSelect kernel the materializer
    # registers can route a call by its device argument; "meta" must reach the fake kernel
    meta = op(6, device=torch.device("meta"))
    assert meta.device.type == "meta" and meta.shape == (6,)
    assert torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "BackendSelect")


def _check_multi(op: Any, ns: str) -> None:
    x = _d(2, 5)
    lo, hi = op(x)
    torch.testing.assert_close(lo, x.amin(dim=-1))
    torch.testing.assert_close(hi, x.amax(dim=-1))


def _check_optional(op: Any, ns: str) -> None:
    x, bias = _d(3), _d(3)
    torch.testing.assert_close(op(x, None), x)
    torch.testing.assert_close(op(x, bias), x + bias)


def _check_list(op: Any, ns: str) -> None:
    xs = [_d(2, 2) for _ in range(3)]
    torch.testing.assert_close(op(xs), xs[0] + xs[1] + xs[2])


def _check_scalars(op: Any, ns: str) -> None:
    x = _d(3)
    torch.testing.assert_close(op(x, 2, 3, 0.5, True, "neg"), -(x * 2 * 3 + 0.5))
    torch.testing.assert_close(op(x, 1.5, 1, 0.0, False, "id"), x * 1.5)


def _check_symint(op: Any, ns: str) -> None:
    x = _d(2, 3)
    torch.testing.assert_close(op(x, 3), x.repeat(3, 1))

    # a symbolic n reaches the fake kernel as a SymInt under dynamic shapes
    def f(x: torch.Tensor) -> torch.Tensor:
        return op(x, x.shape[0]) * 2

    compiled = torch.compile(f, backend="aot_eager", dynamic=True, fullgraph=True)
    for rows in (2, 5):
        y = _d(rows, 3)
        torch.testing.assert_close(compiled(y), y.repeat(rows, 1) * 2)


def _check_list_mutable(op: Any, ns: str) -> None:
    xs = [_d(2), _d(3)]
    before = [x.clone() for x in xs]
    assert op(xs, 2.0) is None
    for x, b in zip(xs, before):
        torch.testing.assert_close(x, b + 2.0)


def _check_sizes(op: Any, ns: str) -> None:
    x = _d(6)
    torch.testing.assert_close(op(x, [2, 3], None), x.reshape(2, 3))
    torch.testing.assert_close(op(x, [3, 2], 0.5), x.reshape(3, 2) * 0.5)


def _check_optional_list(op: Any, ns: str) -> None:
    a, b = _d(3), _d(3)
    torch.testing.assert_close(op([a, None, b]), a + b)
    torch.testing.assert_close(op([None, b]), b)


KINDS = [
    Kind("functional", "scale(Tensor x, float alpha) -> Tensor",
         """
         def scale(x, alpha):
             return x * alpha
         def scale_fake(x, alpha):
             return torch.empty_like(x)
         """,
         "[((d(3), 2.0), {}), ((d(2, 2), -1.0), {})]", _check_functional,
         'fake=f"{K}:scale_fake"'),
    Kind("mutable", "bump(Tensor(a!) x, float v) -> ()",
         """
         def bump(x, v):
             x.add_(v)
         def bump_fake(x, v):
             return None
         """,
         "[((d(3), 1.0), {})]", _check_mutable,
         'fake=f"{K}:bump_fake", mutates_args=["x"]'),
    Kind("inplace", "relu_(Tensor(a!) x) -> Tensor(a!)",
         """
         def relu_(x):
             return x.clamp_(min=0)
         def relu_fake(x):
             return x
         """,
         "[((d(4),), {})]", _check_inplace,
         'fake=f"{K}:relu_fake", mutates_args=["x"], tags=["inplace"]'),
    Kind("out", "plus.out(Tensor a, Tensor b, *, Tensor(a!) out) -> Tensor(a!)",
         """
         def plus_out(a, b, *, out):
             return torch.add(a, b, out=out)
         def plus_out_fake(a, b, *, out):
             return out
         def plus(a, b):
             return a + b
         def plus_fake(a, b):
             return torch.empty_like(a)
         """,
         "[((d(4), d(4)), {'out': torch.empty(4, dtype=torch.double)})]", _check_out,
         'fake=f"{K}:plus_out_fake", mutates_args=["out"], tags=["out"]'),
    Kind("factory", "ramp(int n, *, Device? device=None) -> Tensor",
         """
         def ramp(n, *, device=None):
             return torch.arange(n, dtype=torch.double, device=device)
         def ramp_fake(n, *, device=None):
             return torch.empty(n, dtype=torch.double, device=device)
         """,
         "[((5,), {'device': 'cpu'}), ((1,), {'device': torch.device('cpu')})]",
         _check_factory, 'fake=f"{K}:ramp_fake"'),
    Kind("multiple-returns", "minmax(Tensor x) -> (Tensor, Tensor)",
         """
         def minmax(x):
             return x.amin(dim=-1), x.amax(dim=-1)
         def minmax_fake(x):
             shape = x.shape[:-1]
             return x.new_empty(shape), x.new_empty(shape)
         """,
         "[((d(2, 5),), {}), ((d(3),), {})]", _check_multi, 'fake=f"{K}:minmax_fake"'),
    Kind("optional-tensor", "add_bias(Tensor x, Tensor? bias) -> Tensor",
         """
         def add_bias(x, bias):
             return x.clone() if bias is None else x + bias
         def add_bias_fake(x, bias):
             return torch.empty_like(x)
         """,
         "[((d(3), None), {}), ((d(3), d(3)), {})]", _check_optional,
         'fake=f"{K}:add_bias_fake"'),
    Kind("tensor-list", "sum_all(Tensor[] xs) -> Tensor",
         """
         def sum_all(xs):
             out = xs[0].clone()
             for x in xs[1:]:
                 out += x
             return out
         def sum_all_fake(xs):
             return torch.empty_like(xs[0])
         """,
         "[(([d(2, 2), d(2, 2), d(2, 2)],), {}), (([d(3)],), {})]", _check_list,
         'fake=f"{K}:sum_all_fake"'),
    Kind("scalars", "axpb(Tensor x, Scalar a, int n, float b, bool neg, str mode) -> Tensor",
         """
         def axpb(x, a, n, b, neg, mode):
             y = x * a * n + b
             return -y if neg and mode == "neg" else y
         def axpb_fake(x, a, n, b, neg, mode):
             return torch.empty_like(x)
         """,
         "[((d(3), 2, 3, 0.5, True, 'neg'), {}), ((d(2), 1.5, 1, 0.0, False, 'id'), {})]",
         _check_scalars, 'fake=f"{K}:axpb_fake"'),
    Kind("symint", "repeat_rows(Tensor x, SymInt n) -> Tensor",
         """
         def repeat_rows(x, n):
             return x.repeat(n, 1)
         def repeat_rows_fake(x, n):
             return x.new_empty(x.shape[0] * n, x.shape[1])
         """,
         "[((d(2, 3), 3), {}), ((d(1, 4), 1), {})]", _check_symint,
         'fake=f"{K}:repeat_rows_fake"'),
    Kind("tensor-list-mutable", "add_all_(Tensor(a!)[] xs, float v) -> ()",
         """
         def add_all_(xs, v):
             for x in xs:
                 x.add_(v)
         def add_all_fake(xs, v):
             return None
         """,
         "[(([d(2), d(3, 2)], 1.0), {})]", _check_list_mutable,
         'fake=f"{K}:add_all_fake", mutates_args=["xs"]'),
    Kind("optional-tensor-list", "sum_present(Tensor?[] xs) -> Tensor",
         """
         def sum_present(xs):
             present = [x for x in xs if x is not None]
             out = present[0].clone()
             for x in present[1:]:
                 out += x
             return out
         def sum_present_fake(xs):
             return torch.empty_like(next(x for x in xs if x is not None))
         """,
         "[(([d(2), None, d(2)],), {}), (([None, d(3, 1)],), {})]", _check_optional_list,
         'fake=f"{K}:sum_present_fake"'),
    Kind("symint-list-optional-scalar",
         "shaped(Tensor x, SymInt[] size, float? scale=None) -> Tensor",
         """
         def shaped(x, size, scale=None):
             y = x.reshape(size).clone()
             return y if scale is None else y * scale
         def shaped_fake(x, size, scale=None):
             return x.new_empty(size)
         """,
         "[((d(6), [2, 3]), {}), ((d(4), [4, 1], 2.0), {})]", _check_sizes,
         'fake=f"{K}:shaped_fake"'),
]


def _install(dists: Any, ns: str, kind: Kind) -> str:
    """A distribution declaring ``kind``'s op in ``ns``; returns the module prefix."""
    mod = f"kinds_{ns}"
    schema_name = kind.schema.split("(", 1)[0]
    fn_name = schema_name.replace(".", "_")
    decl = f"""
        from opregistry import OpLibrary

        K = "{mod}_kernels"
        lib = OpLibrary({ns!r})
        lib.define({kind.schema!r}, kernels={{"cpu": f"{{K}}:{fn_name}"}},
                   samples=f"{{K}}:samples", {kind.extra})
        """
    if kind.name == "out":
        # the functional op an out= variant belongs to
        decl += """
        lib.define("plus(Tensor a, Tensor b) -> Tensor", kernels={"cpu": f"{K}:plus"},
                   fake=f"{K}:plus_fake")
        """
    kernels = ("import torch\n\n"
               "def d(*shape):\n    return torch.randn(*shape, dtype=torch.double)\n"
               + textwrap.dedent(kind.kernels)
               + f"\ndef samples():\n    return {kind.samples}\n")
    dists.make(f"kinds-{kind.name}", ops={"ops": f"{mod}_decl:lib"},
               modules={f"{mod}_decl": textwrap.dedent(decl), f"{mod}_kernels": kernels})
    return mod


def _missing_tags(declaration: str) -> list[str]:
    """The tags of ``declaration`` (``tags=["out"]``) that this torch's ``torch.Tag`` lacks."""
    import re

    found = re.search(r"tags=\[([^\]]*)\]", declaration)
    names = re.findall(r"\w+", found.group(1)) if found else []
    return [t for t in names if not hasattr(torch.Tag, t)]


def _refused_for_missing_tags(reg: Any, qualname: str, declaration: str) -> bool:
    """On a torch without the op's tags (``out`` / ``inplace`` arrive in 2.13) opregistry
    must not register it, and must say which tag is the reason; then the test ends."""
    missing = _missing_tags(declaration)
    if not missing:
        return False
    assert qualname not in reg.op_names
    text = " ".join(str(p) for p in reg.problems)
    assert any(repr(t) in text or f"Tag.{t}" in text for t in missing), text
    return True


def samples_of(module: str) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    import importlib

    return importlib.import_module(f"{module}_kernels").samples()


@pytest.mark.parametrize("kind", KINDS, ids=[k.name for k in KINDS])
def test_op_kind_dispatches_and_passes_opcheck(dists, ns, kind):
    """Declared through opregistry, each op kind runs through the dispatcher and passes opcheck."""
    mod = _install(dists, ns, kind)
    reg = load(dists)
    name, _, overload = kind.schema.split("(", 1)[0].partition(".")
    if _refused_for_missing_tags(reg, f"{ns}::{name}" + (f".{overload}" if overload else ""),
                                 kind.extra):
        return
    assert not reg.errors, [str(p) for p in reg.errors]
    packet = getattr(getattr(torch.ops, ns), name)
    op = getattr(packet, overload or "default")
    qualname = op.name()
    # registered by the CPU backend at the CPU key, the fake at Meta, nothing else
    assert torch._C._dispatch_has_kernel_for_dispatch_key(qualname, "CPU")
    assert torch._C._dispatch_has_kernel_for_dispatch_key(qualname, "Meta")
    assert not torch._C._dispatch_has_kernel_for_dispatch_key(qualname, "CUDA")
    kind.check(op, ns)
    for args, kwargs in samples_of(mod):
        result = torch.library.opcheck(op, args, kwargs, test_utils=OPCHECK_UTILS)
        assert set(result) == set(OPCHECK_UTILS)
        assert all(v == "SUCCESS" for v in result.values()), result


def test_mutates_args_disagreeing_with_schema_is_refused_before_torch(dists, ns):
    """mutates_args must match the (a!) annotations: the resolver says so, torch never sees it."""
    mod = f"badmut_{ns}"
    dists.make("bad-mutation", ops={"ops": f"{mod}:lib"}, modules={mod: f"""
        from opregistry import OpLibrary
        lib = OpLibrary({ns!r})
        lib.define("bump(Tensor(a!) x, Tensor y) -> ()", kernels={{"cpu": "{mod}:bump"}},
                   mutates_args=["y"])
        def bump(x, y):
            x.add_(y)
        """})
    reg = load(dists)
    problems = [p for p in reg.errors if p.op == f"{ns}::bump"]
    assert problems, reg.problems
    assert "bad-mutation==1.0" in problems[0].message
    assert not hasattr(getattr(torch.ops, ns), "bump")


DECORATED_TAGGED = '''
import torch
from opregistry import OpLibrary

lib = OpLibrary(NS)

@lib.op("relu_", mutates_args=("x",), tags=["inplace"])
def relu_(x: torch.Tensor) -> torch.Tensor:
    return x.clamp_(min=0)

@relu_.register_fake
def _(x):
    return x

@lib.op("plus.out", mutates_args=("out",), tags=["out"])
def plus_out(a: torch.Tensor, b: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    return torch.add(a, b, out=out)

@plus_out.register_fake
def _(a, b, *, out):
    return out
'''


def test_decorator_infers_inplace_and_out_aliasing_from_tags(dists, ns):
    """@lib.op(tags=["inplace"] / ["out"]): the inferred schema returns the mutated argument."""
    dists.module_dist("tagged", ns, DECORATED_TAGGED)
    reg = load(dists)
    if not hasattr(torch.Tag, "out"):  # torch < 2.13: neither tag, nor infer_schema(tags=)
        assert f"{ns}::relu_" not in reg.op_names and f"{ns}::plus.out" not in reg.op_names
        text = " ".join(str(p) for p in reg.problems)
        assert "'out'" in text and "'inplace'" in text, text
        return
    assert not reg.errors, [str(p) for p in reg.errors]
    assert reg.op(f"{ns}::relu_").op.schema == "(Tensor(a0!) x) -> Tensor(a0!)"
    assert reg.op(f"{ns}::plus.out").op.schema == \
        "(Tensor a, Tensor b, *, Tensor(a2!) out) -> Tensor(a2!)"
    ops = getattr(torch.ops, ns)
    _check_inplace(ops.relu_.default, ns)
    a, b, out = _d(3), _d(3), torch.empty(3, dtype=torch.double)
    assert ops.plus.out(a, b, out=out) is out
    torch.testing.assert_close(out, a + b)
    for op, args, kwargs in ((ops.relu_.default, (_d(4),), {}),
                             (ops.plus.out, (_d(2), _d(2)), {"out": torch.empty(2, dtype=torch.double)})):
        result = torch.library.opcheck(op, args, kwargs, test_utils=OPCHECK_UTILS)
        assert all(v == "SUCCESS" for v in result.values()), result
