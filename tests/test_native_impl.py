"""Native IMPL and FRAGMENT libraries (issue 14): C++ kernels and ops for namespaces a
Python DEF of another distribution owns.

``OpLibrary(ns, "IMPL", native=NativeLibrary(...))`` with ``impl(op, native=[keys])``:
a compiled ``TORCH_LIBRARY_IMPL`` library, judged by the kernel rules (conflicts,
overrides, an op someone defines) before it is loaded, loaded once the ops are
defined, and checked against what it declared.  ``OpLibrary(ns, "FRAGMENT",
native=...)``: a compiled ``TORCH_LIBRARY_FRAGMENT`` beside a Python DEF.

The libraries (``tests/native_build.py``: ``impl``, ``impl_extra``, ``fragment``) are
loaded only in child processes: a shared library cannot be unloaded, and its
kernels would stay registered for the namespaces later tests define again.
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

from opregistry import DeclarationError, NativeLibrary, OpLibrary, Policy

from .conftest import BACKENDS, DistFactory, load, plan
from .native_build import FRAG_NS, IMPL_NS

KERNELS = ("import torch\n"
           "def fake(x):\n    return torch.empty_like(x)\n"
           "def cpu(x):\n    return x * 3\n"
           "def ident(x):\n    return x.clone()\n")


def _dist(dists: DistFactory, name: str, namespace: str, kind: str, library: str | None,
          body: str) -> str:
    """A distribution whose entry point is ``OpLibrary(namespace, kind, native=library)``
    then ``body`` (``KMOD`` names its kernel module: ``fake``, ``cpu``)."""
    module = f"{name.replace('-', '_')}_{uuid.uuid4().hex[:8]}"
    native = f"NativeLibrary(path={library!r})" if library else "None"
    source = (f"from opregistry import OpLibrary, NativeLibrary\n"
              f"lib = OpLibrary({namespace!r}, {kind!r}, native={native})\n" + body)
    return dists.make(name, ops={"ops": f"{module}:lib"},
                      modules={module: source.replace("KMOD", f"{module}_k"),
                               f"{module}_k": KERNELS})


#: the Python DEF the IMPL libraries add kernels to: ``triple`` and ``quad``, fake kernels only
DEFINER = ("lib.define('triple(Tensor x) -> Tensor', fake='KMOD:fake')\n"
           "lib.define('quad(Tensor x) -> Tensor', fake='KMOD:fake')\n")
TRIPLE_CPU = "lib.impl('triple', native=['CPU'])\n"


def _copy(library: Path, tmp_path: Path, name: str) -> str:
    """A copy of ``library`` under a name of its own: whether it was mapped is then its own."""
    copy = tmp_path / f"{name}.so"
    shutil.copy(library, copy)
    return str(copy)


# -- declaration --------------------------------------------------------------------


def test_impl_library_declares_native_kernels():
    lib = OpLibrary("ni_decl", "IMPL", native=NativeLibrary(module="pkg._C"))
    assert lib.impl("other::f", native=["CPU", "cuda"]) is None
    kernels = lib.opregistry_kernels()
    assert [(k.op, k.key, k.kind.name, k.payload.library) for k in kernels] == [
        ("other::f", "CPU", "native", NativeLibrary(module="pkg._C")),
        ("other::f", "CUDA", "native", NativeLibrary(module="pkg._C"))]
    assert lib.opregistry_namespaces() == []


def test_native_impl_declaration_mistakes():
    plain = OpLibrary("ni_plain", "IMPL")
    with pytest.raises(DeclarationError, match="declares no native library"):
        plain.impl("f", native=["CPU"])
    native_def = OpLibrary("ni_def", native=NativeLibrary(module="pkg._C"))
    with pytest.raises(DeclarationError, match=r"define\(\.\.\., native=\[\.\.\.\]\)"):
        native_def.impl("f", native=["CPU"])
    impl = OpLibrary("ni_impl", "IMPL", native=NativeLibrary(module="pkg._C"))
    with pytest.raises(DeclarationError, match="takes no key, function"):
        impl.impl("f", "CPU", native=["CPU"])
    with pytest.raises(DeclarationError, match="takes no key, function"):
        impl.impl("f", native=["CPU"], priority=2)
    with pytest.raises(DeclarationError, match="name the dispatch key"):
        impl.impl("f")


# -- refused before loading ----------------------------------------------------------------


def test_two_native_impls_for_one_kernel_conflict_before_load(dists, native_libraries, tmp_path):
    """Two distributions' C++ CPU kernels for one op: both named, neither library loaded."""
    definer = _dist(dists, "ni-definer", IMPL_NS, "DEF", None, DEFINER)
    first = _dist(dists, "ni-first", IMPL_NS, "IMPL",
                  _copy(native_libraries["impl"], tmp_path, "ni_first"), TRIPLE_CPU)
    second = _dist(dists, "ni-second", IMPL_NS, "IMPL",
                   _copy(native_libraries["impl"], tmp_path, "ni_second"), TRIPLE_CPU)
    p = plan(dists)
    problem = next(e for e in p.errors if e.code == "kernel-conflict")
    assert {o.distribution for o in problem.culprits} == {first, second}
    assert problem.op == f"{IMPL_NS}::triple" and problem.key == "CPU"
    assert p.natives == ()
    assert {o.distribution for o in p.excluded} == {first, second}
    assert definer not in {o.distribution for o in p.excluded}
    registry = load(dists)
    maps = Path("/proc/self/maps").read_text()
    assert "ni_first.so" not in maps and "ni_second.so" not in maps
    assert registry.op(f"{IMPL_NS}::triple") is not None  # the definer is in


def test_native_impl_for_an_op_nobody_defines_is_refused(dists, native_libraries, tmp_path):
    d = _dist(dists, "ni-nowhere", "ni_nobody", "IMPL",
              _copy(native_libraries["impl"], tmp_path, "ni_nowhere"), TRIPLE_CPU)
    p = plan(dists)
    problem = next(e for e in p.errors if e.code == "kernel-for-undefined-op")
    assert problem.culprits[0].distribution == d and problem.op == "ni_nobody::triple"
    assert p.natives == ()


def test_native_impl_whose_definer_is_left_out_is_not_loaded(dists, native_libraries, tmp_path):
    """The definer is blocked: the op is not planned, so neither is the library."""
    definer = _dist(dists, "ni-blocked", IMPL_NS, "DEF", None, DEFINER)
    d = _dist(dists, "ni-orphan", IMPL_NS, "IMPL",
              _copy(native_libraries["impl"], tmp_path, "ni_orphan"), TRIPLE_CPU)
    p = plan(dists, block=[definer])
    problem = next(e for e in p.errors if e.code == "kernel-for-undefined-op")
    assert problem.culprits[0].distribution == d and problem.op == f"{IMPL_NS}::triple"
    assert p.natives == ()
    # unblocked, the same two are planned, the library with them
    assert [(n.kind, n.keys) for n in plan(dists).natives] == [
        ("IMPL", ((f"{IMPL_NS}::triple", "CPU"),))]


def test_native_impl_for_a_torch_op_is_refused(dists, native_libraries, tmp_path):
    d = _dist(dists, "ni-aten", "aten", "IMPL",
              _copy(native_libraries["impl"], tmp_path, "ni_aten"),
              "lib.impl('add.Tensor', native=['CPU'], override=True)\n")
    p = plan(dists, policy=Policy(allow_override={"aten"}))
    problem = next(e for e in p.errors if e.code == "native-kernel-foreign")
    assert problem.culprits[0].distribution == d and problem.op == "aten::add.Tensor"
    assert "an op torch owns" in problem.message
    assert p.natives == ()


def test_overridden_native_kernel_keeps_its_library_out(dists, native_libraries, tmp_path):
    """A Python kernel overrides the C++ one: loading the library would register it anyway."""
    _dist(dists, "ni-def2", IMPL_NS, "DEF", None, DEFINER)
    d = _dist(dists, "ni-overridden", IMPL_NS, "IMPL",
              _copy(native_libraries["impl"], tmp_path, "ni_overridden"), TRIPLE_CPU)
    _dist(dists, "ni-overrider", IMPL_NS, "IMPL", None,
          "lib.impl('triple', 'cpu', 'KMOD:cpu', override=True)\n")
    p = plan(dists, policy=Policy(allow_override={IMPL_NS}))
    problem = next(e for e in p.errors if e.code == "native-kernel-displaced")
    assert problem.culprits[0].distribution == d and problem.key == "CPU"
    assert "overridden" in problem.message and "not loaded" in problem.message
    assert p.natives == ()


def test_switched_off_native_kernel_keeps_its_library_out(dists, native_libraries, tmp_path,
                                                          monkeypatch):
    """The user switches the C++ kernel off: its library is not loaded (it would register it)."""
    _dist(dists, "ni-def4", IMPL_NS, "DEF", None, DEFINER)
    d = _dist(dists, "ni-switched", IMPL_NS, "IMPL",
              _copy(native_libraries["impl"], tmp_path, "ni_switched"), TRIPLE_CPU)
    monkeypatch.setenv("OPREGISTRY_KERNELS", f"-{IMPL_NS}::triple:CPU")
    p = plan(dists)
    problem = next(e for e in p.errors if e.code == "native-kernel-displaced")
    assert problem.culprits[0].distribution == d and "disabled" in problem.message
    assert p.natives == ()


def test_missing_impl_library_is_refused(dists, tmp_path):
    _dist(dists, "ni-def3", IMPL_NS, "DEF", None, DEFINER)
    d = _dist(dists, "ni-gone", IMPL_NS, "IMPL", str(tmp_path / "gone.so"), TRIPLE_CPU)
    problem = next(e for e in plan(dists).errors if e.code == "native-library-missing")
    assert problem.culprits[0].distribution == d and "gone.so does not exist" in problem.message


# -- loaded (in a child process) -------------------------------------------------------------


_PROBE = textwrap.dedent("""
    import json, sys
    import opregistry
    registry = opregistry.load()
    import torch
    ns, op = sys.argv[2], sys.argv[3]
    x = torch.arange(4.0)

    def meta(packet):
        try:
            return str(packet(x.to("meta")).device)
        except NotImplementedError:
            return "no Meta kernel"

    row = registry.op(f"{ns}::{op}")
    packet = getattr(getattr(torch.ops, ns), op, None) if row is not None else None
    print(json.dumps({
        "errors": [[p.code, p.message, [o.distribution for o in p.culprits]]
                   for p in registry.errors],
        "mapped": sys.argv[1] in open("/proc/self/maps").read(),
        "result": packet(x).tolist() if packet is not None else None,
        "meta": meta(packet) if packet is not None else None,
        "kernels": sorted([k.kernel.key, k.status] for k in row.kernels) if row else None,
        "natives": [[n.namespace, n.kind] for n in registry.plan.natives],
    }))
""")


def _probe(dists: DistFactory, library: str, ns: str, op: str, **env: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, library, ns, op], capture_output=True, text=True,
        env={**os.environ, **env, "OPREGISTRY_AUTOLOAD": "0",
             "OPREGISTRY_PLUGINS": ",".join([*BACKENDS, *dists.names]),
             "PYTHONPATH": os.pathsep.join([str(dists.root), *sys.path])})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_native_impl_kernel_runs_for_a_python_defined_op(dists, native_libraries):
    """The C++ CPU kernel serves ``triple``, which a Python DEF defines (with its fake)."""
    _dist(dists, "ni-owner", IMPL_NS, "DEF", None, DEFINER)
    _dist(dists, "ni-kernels", IMPL_NS, "IMPL", str(native_libraries["impl"]), TRIPLE_CPU)
    found = _probe(dists, str(native_libraries["impl"]), IMPL_NS, "triple")
    assert found["errors"] == []
    assert found["mapped"] is True
    assert found["result"] == [0.0, 3.0, 6.0, 9.0]  # the C++ kernel: x * 3
    assert found["kernels"] == [["CPU", "native"], ["Meta", "active"]]
    assert found["natives"] == [[IMPL_NS, "IMPL"]]


def test_native_impl_for_a_native_def(dists, native_libraries):
    """A C++ Meta kernel (an IMPL library) for an op a native DEF's TORCH_LIBRARY defines:
    the DEF's library loads first, the IMPL's after the definitions, both checked."""
    from .native_build import NS

    _dist(dists, "nd-owner", NS, "DEF", str(native_libraries["test"]),
          "lib.define('twice(Tensor x) -> Tensor', native=['CPU'])\n"
          "lib.define('hidden(Tensor x) -> Tensor', native=['CPU'])\n")
    _dist(dists, "nd-meta", NS, "IMPL", str(native_libraries["impl_meta"]),
          "lib.impl('twice', native=['Meta'])\n")
    found = _probe(dists, str(native_libraries["impl_meta"]), NS, "twice")
    assert found["errors"] == []
    assert found["mapped"] is True
    assert found["result"] == [0.0, 2.0, 4.0, 6.0]
    assert found["meta"] == "meta"  # the C++ Meta kernel
    assert found["kernels"] == [["CPU", "native"], ["Meta", "native"]]
    assert sorted(found["natives"]) == [[NS, "DEF"], [NS, "IMPL"]]


def test_native_impl_overriding_the_definers_python_kernel(dists, native_libraries):
    """``override=True`` and the policy: the C++ kernel replaces the definer's Python one,
    which is then never registered (no replacement for torch to warn about)."""
    _dist(dists, "ni-owner3", IMPL_NS, "DEF", None,
          DEFINER.replace("fake='KMOD:fake')\n",
                          "fake='KMOD:fake', kernels={'cpu': 'KMOD:ident'})\n", 1))
    _dist(dists, "ni-better", IMPL_NS, "IMPL", str(native_libraries["impl"]),
          "lib.impl('triple', native=['CPU'], override=True)\n")
    refused = _probe(dists, str(native_libraries["impl"]), IMPL_NS, "triple")
    assert [code for code, _, _ in refused["errors"]] == ["kernel-override-denied"]
    assert refused["mapped"] is False and refused["result"] == [0.0, 1.0, 2.0, 3.0]
    found = _probe(dists, str(native_libraries["impl"]), IMPL_NS, "triple",
                   OPREGISTRY_ALLOW_OVERRIDE=IMPL_NS)
    assert found["errors"] == []
    assert found["result"] == [0.0, 3.0, 6.0, 9.0]
    assert found["kernels"] == [["CPU", "native"], ["CPU", "overridden"], ["Meta", "active"]]


def test_native_impl_registering_an_undeclared_kernel_is_caught(dists, native_libraries):
    """``impl_extra`` also fills ``quad``'s CPU kernel, which its package does not declare."""
    _dist(dists, "ni-owner2", IMPL_NS, "DEF", None, DEFINER)
    d = _dist(dists, "ni-sneaky", IMPL_NS, "IMPL", str(native_libraries["impl_extra"]),
              TRIPLE_CPU)
    found = _probe(dists, str(native_libraries["impl_extra"]), IMPL_NS, "triple")
    [(code, message, culprits)] = found["errors"]
    assert (code, culprits) == ("native-undeclared-registration", [d])
    assert f"{IMPL_NS}::quad (CPU)" in message and "cannot be unloaded" in message
    assert "impl(op, native=" not in message  # the hint says it, the message says what
    # the definer stays in: its op exists, and runs the C++ kernel (which stays loaded)
    assert ["Meta", "active"] in found["kernels"]
    assert found["result"] == [0.0, 3.0, 6.0, 9.0]


def test_native_fragment_beside_a_python_def(dists, native_libraries):
    """``TORCH_LIBRARY_FRAGMENT`` adds ``halve`` to a namespace a Python DEF owns."""
    _dist(dists, "nf-owner", FRAG_NS, "DEF", None,
          "lib.define('triple(Tensor x) -> Tensor', kernels={'cpu': 'KMOD:cpu'})\n")
    _dist(dists, "nf-frag", FRAG_NS, "FRAGMENT", str(native_libraries["fragment"]),
          "lib.define('halve(Tensor x) -> Tensor', native=['CPU'], fake='KMOD:fake')\n")
    found = _probe(dists, str(native_libraries["fragment"]), FRAG_NS, "halve")
    assert found["errors"] == []
    assert found["mapped"] is True
    assert found["result"] == [0.0, 0.5, 1.0, 1.5]
    assert found["kernels"] == [["CPU", "native"], ["Meta", "active"]]
    assert found["natives"] == [[FRAG_NS, "FRAGMENT"]]
    # the Python DEF's own op works beside it
    assert _probe(dists, str(native_libraries["fragment"]), FRAG_NS, "triple")["result"] == [
        0.0, 3.0, 6.0, 9.0]


def test_list_shows_impl_and_fragment_libraries_without_torch(dists, native_libraries):
    _dist(dists, "nl-owner", IMPL_NS, "DEF", None, DEFINER)
    _dist(dists, "nl-kernels", IMPL_NS, "IMPL", str(native_libraries["impl"]), TRIPLE_CPU)
    _dist(dists, "nl-fowner", FRAG_NS, "DEF", None,
          "lib.define('triple(Tensor x) -> Tensor', kernels={'cpu': 'KMOD:cpu'})\n")
    _dist(dists, "nl-frag", FRAG_NS, "FRAGMENT", str(native_libraries["fragment"]),
          "lib.define('halve(Tensor x) -> Tensor', native=['CPU'], fake='KMOD:fake')\n")
    code = textwrap.dedent("""
        import sys
        from opregistry.cli import main
        rc = main(["list"])
        assert "torch" not in sys.modules, sorted(m for m in sys.modules if "torch" in m)
        sys.exit(rc)
    """)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True,
        env={**os.environ, "COLUMNS": "250", "OPREGISTRY_PLUGINS": ",".join([*BACKENDS,
                                                                             *dists.names]),
             "PYTHONPATH": os.pathsep.join([str(dists.root), *sys.path])})
    assert done.returncode == 0, done.stderr + done.stdout
    lines = [" ".join(line.split()) for line in done.stdout.splitlines()]
    assert any(line.startswith(f"{IMPL_NS} (IMPL) {native_libraries['impl']}")
               and line.endswith("nl-kernels==1.0") for line in lines), done.stdout
    assert any(line.startswith(f"{FRAG_NS} (FRAGMENT) {native_libraries['fragment']}")
               for line in lines), done.stdout
    assert any(line.startswith("CPU native") and "nl-kernels" in line for line in lines), \
        done.stdout
