"""Porting a torch.library package: kernels in one module per device, load-time checks, and
the way in that is not native.

* ``OpLibrary(ns, kernel_modules=[...])``: each module marks its kernels with
  ``@opregistry.kernel(op, key)``, read from its source before anything is
  imported (opregistry/kernel_modules.py);
* ``when={"check": "module:function"}``: a load-time condition that is a
  function (a CPU feature, "did my ctypes library load"), run once per load,
  its reason shown in listings;
* ``NativeLibrary(module=...)`` for a package that registers from Python is
  refused at resolve time, pointing at adoption, and the package keeps working.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from opregistry import report

from . import adoption_dists
from .conftest import DistFactory, load, plan

DECLARATIONS = """
from opregistry import OpLibrary

lib = OpLibrary(NS, kernel_modules=["PKG.backends.cpu", "PKG.backends.default"])
lib.define("scale(Tensor x, float f) -> Tensor", fake="PKG.backends.default:fake")
lib.define("shift(Tensor x, float f) -> Tensor")
"""

NAMES = "NAMESPACE = NS\n"

CPU = """
import torch

from opregistry import kernel

from .._names import NAMESPACE

CPU_KEYS = ["cpu"]


@kernel(f"{NAMESPACE}::scale", CPU_KEYS)
def scale_cpu(x, f):
    return x * f + 1000


@kernel("shift", "cpu")
def shift_cpu(x, f):
    return x + f
"""

DEFAULT = """
import torch

from opregistry import kernel as register_kernel


@register_kernel(NS + "::scale", "default")
def scale(x, f):
    return x * f


def fake(x, f):
    return torch.empty_like(x)
"""


def _kernel_package(dists: DistFactory, ns: str, cpu: str = CPU) -> tuple[str, str]:
    pkg = f"km_{ns}"
    modules = {
        f"{pkg}": "", f"{pkg}.ops": DECLARATIONS, f"{pkg}._names": NAMES,
        f"{pkg}.backends": "", f"{pkg}.backends.cpu": cpu, f"{pkg}.backends.default": DEFAULT,
    }
    for name in list(modules):  # packages get an __init__.py
        if any(other.startswith(name + ".") for other in modules):
            modules[f"{name}.__init__"] = modules.pop(name)
    dist = dists.make(f"km-{ns}", ops={"ops": f"{pkg}.ops:lib"}, modules={
        m: s.replace("PKG", pkg).replace("NS", repr(ns)) for m, s in modules.items()})
    return dist, pkg


def test_kernels_spread_over_modules_are_known_before_anything_is_imported(dists, ns) -> None:
    dist, pkg = _kernel_package(dists, ns)
    resolved = plan(dists)
    assert not resolved.errors, resolved.errors
    op = resolved.op(f"{ns}::scale")
    kernels = {k.kernel.key: (k.kernel.fn, k.kernel.source, k.status) for k in op.kernels}
    cpu_file = str(dists.root / pkg / "backends" / "cpu.py")
    assert kernels["CPU"] == (f"{pkg}.backends.cpu:scale_cpu", f"{cpu_file}:11", "active")
    assert kernels["CompositeExplicitAutograd"][0] == f"{pkg}.backends.default:scale"
    assert resolved.op(f"{ns}::shift").kernel("CPU").kernel.fn == f"{pkg}.backends.cpu:shift_cpu"
    assert f"{pkg}.backends.cpu" not in sys.modules and f"{pkg}.backends" not in sys.modules


def test_kernels_from_kernel_modules_dispatch(dists, ns) -> None:
    _, pkg = _kernel_package(dists, ns)
    registry = load(dists)
    assert not registry.errors, registry.errors
    ops = getattr(torch.ops, ns)
    assert ops.scale(torch.ones(1), 2.0).item() == 1002.0  # the CPU kernel of backends/cpu.py
    assert ops.shift(torch.ones(1), 2.0).item() == 3.0
    assert ops.scale(torch.ones(1, device="meta"), 2.0).device.type == "meta"


@pytest.mark.parametrize("body,match", [
    ("import os\nfrom opregistry import kernel\nif os.environ.get('X'):\n"
     "    @kernel('NSQ::scale', 'cpu')\n    def f(x, f):\n        return x\n",
     r"cpu.py:4: @kernel marks f, which is not defined at the top level"),
    ("import os\nfrom opregistry import kernel\n\n@kernel(os.environ['OP'], 'cpu')\n"
     "def f(x, f):\n    return x\n", r"cpu.py:4: @kernel\(op, key\) on f: the op .* constants"),
    ("from opregistry import kernel\nW = dict(torch='>=2.8')\n\n"
     "@kernel('NSQ::scale', 'cpu', when=W)\ndef f(x, f):\n    return x\n",
     r"cpu.py:4: when= must be written out"),
    ("def f(x):\n    return x\n", r"has no @opregistry.kernel"),
])
def test_what_cannot_be_read_is_refused_with_its_line(dists, ns, body, match) -> None:
    dist, _ = _kernel_package(dists, ns, cpu=body.replace("NSQ", ns))
    resolved = plan(dists)
    problems = [p for p in resolved.problems if dist in {o.distribution for o in p.culprits}]
    assert {p.code for p in problems} == {"declaration-invalid"}, problems
    assert problems and any(__import__("re").search(match, p.message) for p in problems), [
        p.message for p in problems]
    # the hook failed: the distribution is skipped whole, nothing of it is registered
    assert dist in {s.origin.distribution for s in resolved.skipped}
    assert not any(op.op.namespace == ns for op in resolved.ops)


CHECKS = """
import os
calls = []

def yes():
    calls.append("yes")
    return True, "AVX512 found"

def no():
    return False

def broken():
    raise OSError("libfast.so: cannot open shared object file")
"""

CANDIDATES = """
from opregistry import Candidate, OpLibrary

lib = OpLibrary(NS)
lib.define("op(Tensor x) -> Tensor", kernels={"cpu": [
    Candidate("CHK:fast", when={"check": "CHK:no"}, priority=3),
    Candidate("CHK:broken_kernel", when={"check": "CHK:broken"}, priority=2),
    Candidate("CHK:avx", when={"check": "CHK:yes"}, priority=1),
    "CHK:plain"]})

def fast(x): return x + 1
def broken_kernel(x): return x + 2
def avx(x): return x + 3
def plain(x): return x + 4
"""


def _checked(dists: DistFactory, ns: str) -> str:
    chk = f"chk_{ns}"
    dists.make(f"chk-{ns}", ops={"ops": f"chk_{ns}_ops:lib"}, modules={
        chk: CHECKS,
        f"chk_{ns}_ops": CANDIDATES.replace("CHK", f"chk_{ns}_ops").replace("NS", repr(ns))
        .replace(f'"chk_{ns}_ops:no"', f'"{chk}:no"').replace(f'"chk_{ns}_ops:yes"', f'"{chk}:yes"')
        .replace(f'"chk_{ns}_ops:broken"', f'"{chk}:broken"')})
    return chk


def test_a_check_is_a_load_time_condition_run_once_with_its_reason(dists, ns) -> None:
    chk = _checked(dists, ns)
    registry = load(dists)
    assert getattr(torch.ops, ns).op(torch.zeros(1)).item() == 3.0  # the candidate whose check holds
    assert sys.modules[chk].calls == ["yes"]  # once per load
    data = report.list_report(registry.plan, namespaces=[ns])
    rows = {k["kernel"].split(":")[1]: (k["status"], k["reason"]) for k in data["ops"][0]["kernels"]}
    assert rows["fast"] == ("unmet", f"condition not met: check {chk}:no() returned false")
    status, reason = rows["broken_kernel"]
    assert status == "unmet" and "raised OSError: libfast.so: cannot open shared object file" \
        in reason
    assert rows["avx"][0] == "active" and f"check {chk}:yes() returned true: AVX512 found" \
        in rows["avx"][1]


def test_without_torch_a_check_is_not_run_and_listings_say_so(dists, ns) -> None:
    chk = _checked(dists, ns)
    code = textwrap.dedent(f"""
        import json, sys
        from opregistry import plan, report
        data = report.list_report(plan(plugins={[f"chk-{ns}", "opregistry-cpu"]!r}),
                                  namespaces=[{ns!r}])
        print(json.dumps([data["ops"][0]["kernels"], "torch" in sys.modules,
                          {chk!r} in sys.modules]))
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(dists.root), *sys.path])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    kernels, torch_imported, check_imported = json.loads(out.stdout.splitlines()[-1])
    assert not torch_imported and not check_imported
    avx = next(k for k in kernels if k["kernel"].endswith(":avx"))
    assert "not run without torch; it runs when the registry loads" in avx["reason"]


REBINDING_CHECK = """
import opregistry

def has_feature():
    opregistry.OpLibrary = None
    return True
"""


def test_a_check_that_changes_opregistry_is_put_back_and_its_distribution_left_out(
        dists, ns) -> None:
    """A check is the distribution's code: sealed as its declarations are."""
    import opregistry

    library = opregistry.OpLibrary
    chk = f"rebind_{ns}"
    name = dists.make(f"rebind-{ns}", ops={"ops": f"{chk}_ops:lib"}, modules={
        chk: REBINDING_CHECK,
        f"{chk}_ops": f"""
from opregistry import OpLibrary
lib = OpLibrary({ns!r})
lib.define("f(Tensor x) -> Tensor", kernels={{"cpu": [
    Candidate("{chk}_ops:k", when={{"check": "{chk}:has_feature"}})]}})
def k(x):
    return x
""".replace("from opregistry import OpLibrary", "from opregistry import Candidate, OpLibrary")})
    registry = load(dists)
    assert opregistry.OpLibrary is library, "put back"
    (problem,) = [p for p in registry.problems if p.code == "opregistry-state-changed"]
    assert [o.distribution for o in problem.culprits] == [name]
    assert "opregistry.OpLibrary" in problem.message and "load-time check" in problem.message
    assert name in {o.distribution for o in registry.plan.excluded}


def test_a_checks_module_is_locked(dists, ns) -> None:
    """The check's module is code the plan runs: the lock hashes its files."""
    from opregistry.plan_modules import modules_by_distribution

    chk = _checked(dists, ns)
    assert chk in modules_by_distribution(plan(dists))[f"chk-{ns}"]


def test_a_check_that_is_not_a_reference_is_refused_at_declaration() -> None:
    from opregistry import Condition, DeclarationError

    with pytest.raises(DeclarationError, match="not a 'module:function' reference"):
        Condition(check="has_avx512")


def test_a_native_library_for_a_python_package_is_refused_and_the_package_works(
        dists, ns, tmp_path, monkeypatch) -> None:
    """The issue's trap: NativeLibrary(module=...) on a package that registers from Python."""
    site = tmp_path / "foreign"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("OPREGISTRY_CACHE_DIR", str(tmp_path / "cache"))
    foreign = adoption_dists.write(site, f"fp-{ns}", {f"fp_{ns}/__init__.py": f"""
        import torch

        torch.library.define("{ns}::quantize", "(Tensor x) -> Tensor")


        @torch.library.register_kernel("{ns}::quantize", "cpu")
        def _(x):
            return x.round()
    """})
    op_dist = dists.make(f"wrap-{ns}", ops={"ops": f"wrap_{ns}:lib"}, modules={f"wrap_{ns}": f"""
        from opregistry import NativeLibrary, OpLibrary
        lib = OpLibrary({ns!r}, "FRAGMENT", native=NativeLibrary(module="fp_{ns}"))
        lib.define("quantize(Tensor x) -> Tensor", native=["CPU"])
    """})
    registry = load(dists)
    (problem,) = [p for p in registry.problems if p.code == "native-library-registers-from-python"]
    assert [o.distribution for o in problem.culprits] == [op_dist]
    assert f"{foreign}==1.0 registers that namespace from Python" in problem.message
    assert "adopt it" in problem.hint
    assert f"fp_{ns}" not in sys.modules  # nothing loaded it behind the plan
    assert getattr(torch.ops, ns).quantize(torch.tensor([1.4])).item() == 1.0  # adopted, works
    del sys.modules[f"fp_{ns}"]
