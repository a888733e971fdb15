"""Native op packages (issue 14): C++ ``TORCH_LIBRARY`` blocks as op packages.

Declared lazily (``opregistry list`` without torch), resolved before they
are loaded (a namespace two distributions claim never reaches the loader),
checked against the installed torch before loading, and checked after
loading against what they really registered.  The example package
``extension-cpp`` (the C++ custom-ops tutorial's ops) is pip-installed by
requirements-dev.txt; ``tests/native_build.py`` compiles a second, tiny
library once per session.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
import torch

from opregistry import DeclarationError, NativeLibrary, OpLibrary

from .conftest import BACKENDS, DistFactory, load, plan
from .native_build import NS

EXAMPLE = "extension-cpp"


def _loaded_files() -> str:
    """The shared libraries mapped into this process (Linux)."""
    return Path("/proc/self/maps").read_text()


def native_dist(dists: DistFactory, name: str, library: str, body: str, *,
                namespace: str = NS, kind: str = "DEF") -> str:
    """A distribution ``OpLibrary(namespace, kind, native=<library>)`` then ``body``.

    ``library`` is Python source (``"NativeLibrary(path=...)"``, or ``"None"``);
    ``KMOD`` in ``body`` names its kernel module (``fake``, ``vmap``).
    """
    module = f"{name.replace('-', '_')}_native_{uuid.uuid4().hex[:8]}"
    source = (f"from opregistry import OpLibrary, NativeLibrary\n"
              f"lib = OpLibrary({namespace!r}, {kind!r}, native={library})\n" + body)
    kernels = ("import torch\ndef fake(x):\n    return torch.empty_like(x)\n"
               "def vmap(info, dims, x):\n    return x * 2, dims[0]\n")
    return dists.make(name, ops={"ops": f"{module}:lib"},
                      modules={module: source.replace("KMOD", f"{module}_k"),
                               f"{module}_k": kernels})


TWICE = "lib.define('twice(Tensor x) -> Tensor', native=['CPU'], fake='KMOD:fake')\n"
HIDDEN = "lib.define('hidden(Tensor x) -> Tensor', native=['CPU'])\n"


# -- declaration --------------------------------------------------------------------


def test_native_keys_need_a_native_library():
    lib = OpLibrary("nl_plain")
    with pytest.raises(DeclarationError, match="declares no native library"):
        lib.define("f(Tensor x) -> Tensor", native=["CPU"])


def test_native_library_needs_exactly_one_target():
    with pytest.raises(DeclarationError, match="exactly one of module="):
        NativeLibrary()
    with pytest.raises(DeclarationError, match="exactly one of module="):
        NativeLibrary(module="a._C", path="/x.so")
    with pytest.raises(DeclarationError, match="not a module name"):
        NativeLibrary(module="a/b")


def test_impl_library_cannot_define_ops():
    """An IMPL library's native library only adds kernels (tests/test_native_impl.py)."""
    lib = OpLibrary("nl_impl", "IMPL", native=NativeLibrary(module="a._C"))
    with pytest.raises(DeclarationError, match="only adds kernels"):
        lib.define("f(Tensor x) -> Tensor")


def test_build_info_is_read_from_its_file(tmp_path):
    info = tmp_path / "_build.json"
    info.write_text(json.dumps({"torch": "2.9.1+cu128", "cxx11_abi": True, "cuda": "12.8"}))
    lib = NativeLibrary.from_build_info(str(info), module="pkg._C")
    assert (lib.torch, lib.cxx11_abi, lib.cuda) == ("2.9.1+cu128", True, "12.8")
    assert lib.mismatch("2.9.1+cu128", "12.8", True) is None
    assert "torch 2.9.1 is not torch 2.13.0" in lib.mismatch("2.13.0+cpu", None)
    assert "CUDA 12.8 is not a torch without CUDA" in lib.mismatch("2.9.1", None)
    assert "_GLIBCXX_USE_CXX11_ABI=1 is not 0" in lib.mismatch("2.9.1", "12.8", False)
    # no file: nothing recorded (built at load time, for the running torch)
    none = NativeLibrary.from_build_info(str(tmp_path / "missing.json"), module="pkg._C")
    assert none.torch is None and none.mismatch("2.13.0", None, True) is None


# -- listing without torch ----------------------------------------------------------------


def test_list_shows_native_ops_without_torch_or_the_library():
    """`opregistry list --json` in a process that never imports torch nor loads the library."""
    code = textwrap.dedent("""
        import json, sys
        from opregistry.cli import main
        rc = main(["list", "--json", "-n", "extension_cpp"])
        assert "torch" not in sys.modules, sorted(m for m in sys.modules if "torch" in m)
        assert "extension_cpp._load" not in sys.modules
        sys.exit(rc)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "OPREGISTRY_PLUGINS": ",".join([*BACKENDS, EXAMPLE])})
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    ops = {op["name"]: op for op in data["ops"]}
    assert set(ops) == {"extension_cpp::mymuladd", "extension_cpp::mymul",
                        "extension_cpp::myadd_out"}
    rows = {(k["key"], k["status"]) for k in ops["extension_cpp::mymuladd"]["kernels"]}
    assert {("CPU", "native"), ("Meta", "active"), ("Autograd", "active")} <= rows
    native = next(k for k in ops["extension_cpp::mymuladd"]["kernels"] if k["key"] == "CPU")
    assert native["kernel"] == "extension_cpp._load"
    assert native["distribution"]["name"] == EXAMPLE
    assert [n["module"] for n in data["natives"]] == ["extension_cpp._load"]


# -- resolved before loading ------------------------------------------------------------


_CLAIM_PROBE = textwrap.dedent("""
    import json, sys
    import opregistry
    registry = opregistry.load()
    import torch
    ops = torch._C._dispatch_get_all_op_names()
    print(json.dumps({
        "codes": [[p.code, sorted(o.distribution for o in p.culprits)]
                  for p in registry.errors],
        "rival_mapped": sys.argv[1] in open("/proc/self/maps").read(),
        "ops": sorted(o for o in ops if o.startswith("extension_cpp::")),
        "example_imported": "extension_cpp._load" in sys.modules,
    }))
""")


def _claim(dists: DistFactory, rival: str, library: Path, **env: str) -> dict:
    """Load the example and ``rival`` in a fresh process (this one has extension_cpp loaded)."""
    done = subprocess.run(
        [sys.executable, "-c", _CLAIM_PROBE, str(library)], capture_output=True, text=True,
        env={**os.environ, "OPREGISTRY_AUTOLOAD": "0",
             "OPREGISTRY_PLUGINS": ",".join([*BACKENDS, EXAMPLE, rival]),
             "PYTHONPATH": os.pathsep.join([str(dists.root), *sys.path]), **env})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_two_distributions_claiming_one_native_namespace_never_reach_the_loader(
        dists, native_rival_library):
    """A second TORCH_LIBRARY(extension_cpp), packaged by another distribution.

    Loaded beside the example, torch would refuse it at load ("Only a single
    TORCH_LIBRARY can be used to register the namespace extension_cpp").  The
    resolver sees the two DEFs first: both distributions are named and left
    out, and neither library is loaded -- the rival's is never mapped, torch
    never sees an extension_cpp op.  Blocking one lets the other load.
    """
    rival = native_dist(dists, "rival-cpp", f"NativeLibrary(path={str(native_rival_library)!r})",
                        "lib.define('mymuladd(Tensor a, Tensor b, float c) -> Tensor', "
                        "native=[])\n", namespace="extension_cpp")
    both = _claim(dists, rival, native_rival_library)
    assert ["namespace-conflict", sorted([EXAMPLE, rival])] in both["codes"]
    assert both["rival_mapped"] is False
    assert both["ops"] == []
    assert both["example_imported"] is False
    # the documented way out: block one of them; the other loads, and the rival is never mapped
    example_only = _claim(dists, rival, native_rival_library, OPREGISTRY_BLOCK=rival)
    assert example_only["codes"] == []
    assert example_only["rival_mapped"] is False
    assert example_only["ops"] == ["extension_cpp::myadd_out", "extension_cpp::mymul",
                                   "extension_cpp::mymuladd"]


def test_native_torch_mismatch_is_refused_before_load(dists, native_test_library, tmp_path):
    copy = tmp_path / "built_for_old_torch.so"
    shutil.copy(native_test_library, copy)
    d = native_dist(dists, "oldtorch", f"NativeLibrary(path={str(copy)!r}, torch='2.0.1', "
                                       f"cxx11_abi=False, cuda='11.8')", TWICE)
    p = plan(dists)
    problem = next(p for p in p.errors if p.code == "native-torch-mismatch")
    assert problem.culprits[0].distribution == d
    assert "was built for torch 2.0.1, pre-C++11 ABI, CUDA 11.8" in problem.message
    assert f"the installed torch is {torch.__version__}" in problem.message
    assert "it is not loaded" in problem.message
    registry = load(dists)
    assert any(e.code == "native-torch-mismatch" for e in registry.errors)
    assert str(copy) not in _loaded_files()


def test_abi_mismatch_is_refused_at_load_before_loading(dists, native_test_library, tmp_path):
    """The C++11 ABI flag is only known to a running torch: checked just before loading."""
    copy = tmp_path / "other_abi.so"
    shutil.copy(native_test_library, copy)
    other = not torch._C._GLIBCXX_USE_CXX11_ABI
    d = native_dist(dists, "otherabi", f"NativeLibrary(path={str(copy)!r}, "
                                       f"torch={torch.__version__!r}, cxx11_abi={other})", TWICE)
    assert not [e for e in plan(dists).errors if e.culprits and e.culprits[0].distribution == d]
    registry = load(dists)
    problem = next(e for e in registry.errors if e.code == "native-torch-mismatch")
    assert "_GLIBCXX_USE_CXX11_ABI" in problem.message and problem.culprits[0].distribution == d
    assert str(copy) not in _loaded_files()


def test_missing_library_is_refused_before_load(dists, tmp_path):
    d = native_dist(dists, "nolib", f"NativeLibrary(path={str(tmp_path / 'gone.so')!r})", TWICE)
    m = native_dist(dists, "nomod", "NativeLibrary(module='no_such_extension._C')",
                    TWICE.replace("twice", "other"), namespace="nl_nomod")
    problems = {e.culprits[0].distribution: e for e in plan(dists).errors
                if e.code == "native-library-missing"}
    assert set(problems) == {d, m}
    assert "gone.so does not exist" in problems[d].message
    assert "no_such_extension" in problems[m].message


# -- loaded and verified -------------------------------------------------------------------


def test_load_verify_and_python_pieces_from_two_distributions(dists, native_test_library):
    """The library loads, its ops run, and Python pieces come from it and from an IMPL package."""
    d = native_dist(dists, "goodnative", f"NativeLibrary(path={str(native_test_library)!r})",
                    TWICE + HIDDEN)
    v = native_dist(dists, "vmapper", "None", "lib.impl('twice', 'vmap', 'KMOD:vmap')\n",
                    kind="IMPL")
    registry = load(dists)
    assert not [e for e in registry.errors if e.culprits and
                {o.distribution for o in e.culprits} & {d, v}], registry.errors
    assert str(native_test_library) in _loaded_files()
    x = torch.arange(4.0)
    assert torch.equal(torch.ops.opregistry_native_test.twice(x), x * 2)
    # the Python fake kernel: torch.compile traces the C++ op
    compiled = torch.compile(torch.ops.opregistry_native_test.twice.default, fullgraph=True,
                             backend="aot_eager")
    assert torch.equal(compiled(x), x * 2)
    # the vmap rule of another distribution
    assert torch.equal(torch.vmap(torch.ops.opregistry_native_test.twice)(x.reshape(2, 2)),
                       x.reshape(2, 2) * 2)
    row = registry.op(f"{NS}::twice")
    assert {(k.kernel.key, k.status) for k in row.kernels} == {
        ("CPU", "native"), ("Meta", "active"), ("FuncTorchBatched", "active")}


def test_python_kernel_for_a_native_key_is_a_conflict(dists, native_test_library):
    native_dist(dists, "owner", f"NativeLibrary(path={str(native_test_library)!r})",
                TWICE + HIDDEN)
    other = native_dist(dists, "othercpu", "None", "lib.impl('twice', 'cpu', 'KMOD:fake')\n",
                        kind="IMPL")
    problem = next(e for e in plan(dists).errors if e.code == "kernel-conflict")
    assert problem.culprits[0].distribution == other


def test_undeclared_op_is_caught(dists, native_test_library):
    d = native_dist(dists, "hides", f"NativeLibrary(path={str(native_test_library)!r})", TWICE)
    registry = load(dists)
    problem = next(e for e in registry.errors if e.code == "native-undeclared-registration")
    assert problem.culprits[0].distribution == d
    assert f"{NS}::hidden" in problem.message and "cannot be unloaded" in problem.message
    # left out: its Python fake kernel is not registered
    assert registry.op(f"{NS}::twice") is None


def test_declared_schema_must_match_the_library(dists, native_test_library):
    d = native_dist(dists, "wrongschema", f"NativeLibrary(path={str(native_test_library)!r})",
                    TWICE.replace("(Tensor x)", "(Tensor x, int n)") + HIDDEN)
    problem = next(e for e in load(dists).errors if e.code == "native-mismatch")
    assert problem.culprits[0].distribution == d
    assert "twice(Tensor x) -> Tensor" in problem.message
    assert "twice(Tensor x, int n) -> Tensor" in problem.message


def test_declared_keys_must_be_registered(dists, native_test_library):
    d = native_dist(dists, "wrongkeys", f"NativeLibrary(path={str(native_test_library)!r})",
                    TWICE.replace("['CPU']", "['CPU', 'CUDA']") + HIDDEN)
    problem = next(e for e in load(dists).errors if e.code == "native-mismatch")
    assert problem.culprits[0].distribution == d and problem.key == "CUDA"


def test_library_that_fails_to_load(dists, tmp_path):
    junk = tmp_path / "junk.so"
    junk.write_text("not a shared library")
    d = native_dist(dists, "junk", f"NativeLibrary(path={str(junk)!r})", TWICE)
    problem = next(e for e in load(dists).errors if e.code == "native-load-failed")
    assert problem.culprits[0].distribution == d and "junk.so" in problem.message


_SWAP_PROBE = textwrap.dedent("""
    import json, sys
    import torch
    # a replacement made before (from Python) uses up torch's once-per-process warning
    spent = torch.library.Library("aten", "IMPL")
    spent.impl("lcm", lambda a, b: a, "CPU")
    import opregistry
    registry = opregistry.load()
    problems = [p for p in registry.errors if p.code == "native-undeclared-registration"]
    print(json.dumps({
        "problems": [[p.message, p.op, p.key, [o.distribution for o in p.culprits]]
                     for p in problems],
        "add": torch.add(torch.ones(2), torch.ones(2)).tolist(),
        "left_out": [o.op.qualname for o in registry.ops if o.op.namespace == "swapper"],
    }))
""")


def _swap(dists: DistFactory, library: Path, **env: str) -> tuple[dict, str]:
    """Resolve and load ``swapper`` (``library``) in a fresh process: it replaces aten kernels."""
    d = native_dist(dists, "swapper", f"NativeLibrary(path={str(library)!r})",
                    "lib.define('own(Tensor x) -> Tensor')\n", namespace="swapper")
    done = subprocess.run(
        [sys.executable, "-c", _SWAP_PROBE], capture_output=True, text=True,
        env={**os.environ, "OPREGISTRY_AUTOLOAD": "0",
             "OPREGISTRY_PLUGINS": ",".join([*BACKENDS, d]),
             "PYTHONPATH": os.pathsep.join([str(dists.root), *sys.path]), **env})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


@pytest.mark.parametrize("log_level", ["", "ERROR"])
def test_library_replacing_an_aten_kernel_is_caught(dists, native_libraries, log_level):
    """A ``TORCH_LIBRARY_IMPL(aten, CPU)`` replacing aten::add.Tensor's kernel (by a subtraction).

    It registers no new (op, key): only torch's warning about the replaced
    kernel tells -- caught even when torch gave its once-per-process warning
    already, and (by comparing every op's kernels, slowly) when
    ``TORCH_CPP_LOG_LEVEL`` hides C++ warnings.  The library is loaded in a child
    process: the replacement stays (this process keeps torch's own add).
    """
    found, stderr = _swap(dists, native_libraries["swap_aten"], TORCH_CPP_LOG_LEVEL=log_level)
    assert found["add"] == [0.0, 0.0], "the library did replace add (and it stays replaced)"
    [(message, op, key, culprits)] = found["problems"]
    assert (op, key, culprits) == ("aten::add.Tensor", "CPU", ["swapper"])
    assert "replaced the kernel torch already had for aten::add.Tensor (CPU" in message
    assert "native_swap_aten" in message, "the new kernel's site is named"
    assert "cannot be unloaded" in message and "swapper is left out" in message
    assert found["left_out"] == [], "none of its declarations is registered"
    # opregistry reports the replacement: torch's warning is not echoed as well
    assert "operator: aten::add.Tensor" not in stderr
    assert torch.equal(torch.add(torch.ones(2), torch.ones(2)), torch.full((2,), 2.0))


# -- the example package ---------------------------------------------------------------


def test_example_passes_opcheck_gradcheck_and_compile(installed):
    from extension_cpp import ops

    assert not [e for e in installed.errors
                if any(o.distribution == EXAMPLE for o in e.culprits)]
    for name in ("mymuladd", "mymul", "myadd_out"):
        op = getattr(torch.ops.extension_cpp, name).default
        for args, kwargs in getattr(ops, f"{name}_samples")():
            result = torch.library.opcheck(op, args, kwargs)
            assert set(result.values()) == {"SUCCESS"}, (name, result)
    a = torch.randn(3, dtype=torch.double, requires_grad=True)
    b = torch.randn(3, dtype=torch.double, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: ops.mymuladd(a, b, 1.5), (a, b))
    f = torch.compile(lambda a, b: ops.mymuladd(a, b, 2.0) + ops.mymul(a, b), fullgraph=True)
    x, y = torch.randn(5), torch.randn(5)
    assert torch.allclose(f(x, y), x * y + 2.0 + x * y)


def test_example_exports_and_reloads_in_a_fresh_process(installed, tmp_path):
    from extension_cpp import ops

    class M(torch.nn.Module):
        def forward(self, a, b):
            return ops.mymuladd(a, b, 3.0)

    a, b = torch.randn(4), torch.randn(4)
    ep = torch.export.export(M(), (a, b))
    assert "extension_cpp.mymuladd" in str(ep.graph)
    path = tmp_path / "m.pt2"
    torch.export.save(ep, str(path))
    code = ("import sys, torch\n"  # import torch loads the registry: the library with it
            "ep = torch.export.load(sys.argv[1])\n"
            "a, b = torch.ones(4), torch.full((4,), 2.0)\n"
            "print(ep.module()(a, b).tolist())\n")
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[5.0, 5.0, 5.0, 5.0]"


def test_cli_doc_native_list_example_is_true():
    """docs/cli.md's `opregistry list -n extension_cpp` block: every line is in the real output."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "cli.md").read_text()
    block = text.split("<!-- list-native-example -->\n```text\n", 1)[1].split("```", 1)[0]
    command, *expected = block.splitlines()
    assert command == "$ opregistry list -n extension_cpp"
    done = subprocess.run([sys.executable, "-m", "opregistry", "list", "-n", "extension_cpp"],
                          capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "200", "OPREGISTRY_PLUGINS": ",".join(
                              ["opregistry-cpu", "opregistry-meta", "opregistry-autograd",
                               EXAMPLE])})
    assert done.returncode == 0, done.stderr
    lines = [line.rstrip() for line in done.stdout.splitlines()]
    for line in expected:
        if line != "...":
            assert line.rstrip() in lines, f"{line!r} is not in:\n{done.stdout}"


def test_import_torch_goes_on_past_a_library_built_for_another_torch(dists, native_test_library,
                                                                     tmp_path):
    """The autoload at ``import torch`` refuses the library, logs why, and torch imports."""
    copy = tmp_path / "built_for_2_9.so"
    shutil.copy(native_test_library, copy)
    d = native_dist(dists, "oldbuild", f"NativeLibrary(path={str(copy)!r}, torch='2.9.1+cu128', "
                                       f"cuda='12.8')", TWICE + HIDDEN)
    code = ("import sys, torch, opregistry\n"
            "r = opregistry.get_registry()\n"
            "print([p.code for p in r.errors], sys.argv[1] in open('/proc/self/maps').read(),\n"
            "      hasattr(torch.ops.opregistry_native_test, 'twice'))\n")
    done = subprocess.run([sys.executable, "-c", code, str(copy)], capture_output=True, text=True,
                          env={**os.environ, "OPREGISTRY_PLUGINS": ",".join([*BACKENDS, d]),
                               "PYTHONPATH": os.pathsep.join([str(dists.root), *sys.path])})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "['native-torch-mismatch'] False False"
    assert "built for torch 2.9.1+cu128" in done.stderr + done.stdout
