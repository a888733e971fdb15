"""Porting a torch.library package: bitsandbytes' schemas, declared through ``OpLibrary``.

bitsandbytes 0.50.2 defines its ops with ``torch.library.define`` in
``bitsandbytes/_ops.py``; :data:`BITSANDBYTES` holds some of them verbatim
(``Tensor! out`` in the ``.out`` overloads, ``ScalarType``, ``int[]``,
``str`` arguments, tuples of returns).  A fixture distribution declares them
with plain-torch kernels, as a port would: every op is accepted before torch
is touched, registered, called, and passes ``torch.library.opcheck``.
"""

from __future__ import annotations

import textwrap
from typing import Any

import pytest
import torch

from .conftest import load, plan

#: (name as bitsandbytes/_ops.py defines it, its schema), bitsandbytes 0.50.2
BITSANDBYTES = (
    ("bitsandbytes::int8_linear_matmul", "(Tensor A, Tensor B) -> Tensor"),
    ("bitsandbytes::int8_linear_matmul.out", "(Tensor A, Tensor B, Tensor! out) -> ()"),
    ("bitsandbytes::int8_vectorwise_dequant", "(Tensor A, Tensor stats) -> Tensor"),
    ("bitsandbytes::dequantize_4bit",
     "(Tensor A, Tensor absmax, int blocksize, str quant_type, int[] shape, ScalarType dtype) "
     "-> Tensor"),
    ("bitsandbytes::dequantize_4bit.out",
     "(Tensor A, Tensor absmax, int blocksize, str quant_type, int[] shape, ScalarType dtype, "
     "Tensor! out) -> ()"),
    ("bitsandbytes::dequantize_blockwise",
     "(Tensor A, Tensor absmax, Tensor code, int blocksize, ScalarType dtype) -> Tensor"),
    ("bitsandbytes::dequantize_blockwise.out",
     "(Tensor A, Tensor absmax, Tensor code, int blocksize, ScalarType dtype, Tensor! out) -> ()"),
)

KERNELS = '''
import math

import torch

# the 4-bit NormalFloat code (QLoRA), what quant_type="nf4" names
NF4 = [-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
       -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
       0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
       0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0]


def int8_linear_matmul(A, B):
    return torch.matmul(A.float(), B.float().t()).to(torch.int32)


def int8_linear_matmul_fake(A, B):
    return A.new_empty((*A.shape[:-1], B.shape[0]), dtype=torch.int32)


def int8_linear_matmul_out(A, B, out):
    out.copy_(int8_linear_matmul(A, B))


def int8_linear_matmul_out_fake(A, B, out):
    torch._check(out.dtype == torch.int32, lambda: "out must be int32")


def int8_vectorwise_dequant(A, stats):
    return A.float() * (stats.view(-1, 1) * (1.0 / 127))


def int8_vectorwise_dequant_fake(A, stats):
    return A.new_empty(A.shape, dtype=torch.float32)


def _blocks(values, absmax, blocksize):
    return values * absmax.repeat_interleave(blocksize)[: values.numel()]


def dequantize_4bit(A, absmax, blocksize, quant_type, shape, dtype):
    torch._check(quant_type == "nf4", lambda: f"quant_type {quant_type!r}: only nf4 here")
    packed = A.reshape(-1).to(torch.int64)
    codes = torch.stack([packed // 16, packed % 16], dim=-1).reshape(-1)
    n = math.prod(shape)
    values = torch.tensor(NF4, device=A.device)[codes][:n]
    return _blocks(values, absmax, blocksize).reshape(shape).to(dtype)


def dequantize_4bit_fake(A, absmax, blocksize, quant_type, shape, dtype):
    return A.new_empty(shape, dtype=dtype)


def dequantize_4bit_out(A, absmax, blocksize, quant_type, shape, dtype, out):
    out.copy_(dequantize_4bit(A, absmax, blocksize, quant_type, shape, dtype))


def dequantize_4bit_out_fake(A, absmax, blocksize, quant_type, shape, dtype, out):
    torch._check(out.dtype == dtype, lambda: "out has the wrong dtype")


def dequantize_blockwise(A, absmax, code, blocksize, dtype):
    values = code[A.reshape(-1).to(torch.int64)]
    return _blocks(values, absmax, blocksize).reshape(A.shape).to(dtype)


def dequantize_blockwise_fake(A, absmax, code, blocksize, dtype):
    return A.new_empty(A.shape, dtype=dtype)


def dequantize_blockwise_out(A, absmax, code, blocksize, dtype, out):
    out.copy_(dequantize_blockwise(A, absmax, code, blocksize, dtype))


def dequantize_blockwise_out_fake(A, absmax, code, blocksize, dtype, out):
    torch._check(out.dtype == dtype, lambda: "out has the wrong dtype")
'''


def _declarations(ns: str, kernels: str) -> str:
    """The port's declaration module: bitsandbytes' schemas under this test's namespace, the
    first one written with its namespace, as torch prints it."""
    lines = ["from opregistry import OpLibrary", "", f"lib = OpLibrary({ns!r})"]
    for i, (qualname, schema) in enumerate(BITSANDBYTES):
        name = qualname.split("::", 1)[1]
        head = f"{ns}::{name}" if i == 0 else name
        fn = name.replace(".", "_")
        mutates = "['out']" if "Tensor! out" in schema else "None"
        lines.append(f"lib.define({head + schema!r}, kernels={{'cpu': '{kernels}:{fn}'}}, "
                     f"fake='{kernels}:{fn}_fake', mutates_args={mutates})")
    return "\n".join(lines) + "\n"


def _install(dists: Any, ns: str) -> None:
    mod = f"bnbport_{ns}"
    dists.make("bnbport", ops={"ops": f"{mod}:lib"},
               modules={mod: _declarations(ns, f"{mod}_kernels"),
                        f"{mod}_kernels": textwrap.dedent(KERNELS)})


def _samples() -> dict[str, tuple[Any, ...]]:
    gen = torch.Generator().manual_seed(0)
    A = torch.randint(-127, 128, (4, 8), dtype=torch.int8, generator=gen)
    B = torch.randint(-127, 128, (3, 8), dtype=torch.int8, generator=gen)
    packed = torch.randint(0, 256, (16,), dtype=torch.uint8, generator=gen)  # 32 4-bit codes
    absmax = torch.rand(2, generator=gen) + 0.5
    q = torch.randint(0, 256, (4, 16), dtype=torch.uint8, generator=gen)
    code = torch.linspace(-1.0, 1.0, 256)
    absmax8 = torch.rand(4, generator=gen) + 0.5
    return {
        "int8_linear_matmul": (A, B),
        "int8_linear_matmul.out": (A, B, torch.empty(4, 3, dtype=torch.int32)),
        "int8_vectorwise_dequant": (A, torch.rand(4, generator=gen)),
        "dequantize_4bit": (packed, absmax, 16, "nf4", [4, 8], torch.float16),
        "dequantize_4bit.out": (packed, absmax, 16, "nf4", [4, 8], torch.float16,
                                torch.empty(4, 8, dtype=torch.float16)),
        "dequantize_blockwise": (q, absmax8, code, 16, torch.float32),
        "dequantize_blockwise.out": (q, absmax8, code, 16, torch.float32,
                                     torch.empty(4, 16, dtype=torch.float32)),
    }


def test_bitsandbytes_schemas_are_accepted_before_torch(dists: Any, ns: str) -> None:
    """The resolver takes every schema as bitsandbytes writes it (``Tensor! out`` included),
    with the ``.out`` overloads mutating ``out``."""
    _install(dists, ns)
    result = plan(dists)
    assert not result.errors, [str(p) for p in result.errors]
    planned = {op.op.qualname: op for op in result.ops}
    names = [f"{ns}::{q.split('::', 1)[1]}" for q, _ in BITSANDBYTES]
    assert sorted(planned) == sorted(names)
    for name in names:
        assert planned[name].parsed.mutated_args == (("out",) if name.endswith(".out") else ())


OPCHECK_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor",
                 "test_aot_dispatch_dynamic")


@pytest.mark.parametrize("name", [q.split("::", 1)[1] for q, _ in BITSANDBYTES])
def test_bitsandbytes_ops_run_and_pass_opcheck(dists: Any, ns: str, name: str) -> None:
    """Registered by the CPU and Meta backends from the port's declarations; each op's schema is
    the one bitsandbytes defines, it computes what its functional twin does, and opcheck passes."""
    _install(dists, ns)
    reg = load(dists)
    assert not reg.errors, [str(p) for p in reg.errors]
    base, _, overload = name.partition(".")
    op = getattr(getattr(getattr(torch.ops, ns), base), overload or "default")
    schema = dict(BITSANDBYTES)[f"bitsandbytes::{name}"]
    assert str(op._schema) == str(torch._C.parse_schema(f"{ns}::{name}{schema}"))
    args = _samples()[name]
    if overload == "out":
        functional = getattr(getattr(torch.ops, ns), base).default
        out = args[-1]
        assert op(*args) is None
        torch.testing.assert_close(out, functional(*args[:-1]))
    result = torch.library.opcheck(op, args, test_utils=OPCHECK_UTILS)
    assert all(v == "SUCCESS" for v in result.values()), result
