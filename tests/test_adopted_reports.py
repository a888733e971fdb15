"""``show`` and ``list`` of adopted packages: every spelling of an op, the unfiltered
``list --live``, what the first touch of a shared namespace imports, and the kernels of a
namespace the scan could not tie to one op.

The packages are real distributions (tests/adoption_dists.py: dist-info with METADATA and
RECORD) that register with torch.library at their own import, as vLLM and torchvision do;
one ships a compiled C++ ``TORCH_LIBRARY_IMPL`` library (tests/native_build.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Callable

import pytest

from opregistry import report
from opregistry.cli import main

from . import adoption_dists
from .conftest import DistFactory, op_dist, plan
from .test_cli import doc_schemas, schema_errors


def _ops_package(ns: str, *names: str, overloads: tuple[str, ...] = ()) -> dict[str, str]:
    """A package defining ``ns::NAME`` for each name (and ``ns::NAME.OVERLOAD`` of the first),
    each with a CPU kernel, at its import -- vLLM's ``_moe_C`` ops, as Python registers them."""
    lines = ["import torch", ""]
    for name in names:
        lines += [f'torch.library.define("{ns}::{name}", "(Tensor x) -> Tensor")',
                  f'torch.library.impl("{ns}::{name}", "cpu")(lambda x: x * 2)']
    for overload in overloads:
        lines += [f'torch.library.define("{ns}::{names[0]}.{overload}", '
                  f'"(Tensor x, *, Tensor(a!) out) -> Tensor(a!)")']
    return {f"fr_{ns}/__init__.py": "\n".join(lines) + "\n"}


@pytest.fixture
def adopted(site: Path) -> Callable[..., str]:
    def make(files: dict[str, str | bytes], name: str) -> str:
        return adoption_dists.write(site, name, files)
    return make


def _show(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["show", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


# -- naming an adopted op --------------------------------------------------------------


def test_every_documented_spelling_names_an_adopted_op(adopted, dists: DistFactory, ns,
                                                       scoped, capsys) -> None:
    """docs/cli.md "Naming an op": ``ns::op``, ``ns.op``, ``torch.ops.ns.op``, each with
    ``.default``, and the op alone -- for an adopted op as for a declared one."""
    name = adopted(_ops_package(ns, "topk_softmax", f"only_{ns}"), f"fr-{ns}")
    scoped()
    for spelling in (f"{ns}::topk_softmax", f"{ns}.topk_softmax", f"torch.ops.{ns}.topk_softmax",
                     f"{ns}::topk_softmax.default", f"{ns}.topk_softmax.default",
                     f"torch.ops.{ns}.topk_softmax.default"):
        code, out, err = _show(capsys, spelling)
        assert code == 0, (spelling, err)
        assert out.startswith(f"{ns}::topk_softmax(Tensor x) -> Tensor"), spelling
        assert f"{name}==1.0, adopted" in out
        code, out, err = _show(capsys, spelling, "--json")
        assert code == 0, (spelling, err)
        data = json.loads(out)
        assert [op["name"] for row in data["adopted"] for op in row["ops"]] == [
            f"{ns}::topk_softmax"], spelling
    code, out, err = _show(capsys, f"only_{ns}")  # the op alone: one namespace has it
    assert code == 0, err
    assert out.startswith(f"{ns}::only_{ns}(Tensor x) -> Tensor")
    assert f"fr_{ns}" not in sys.modules, "read from its files, not imported"


def test_an_adopted_ops_overloads_are_named_as_a_declared_ops(adopted, dists: DistFactory, ns,
                                                              scoped, capsys) -> None:
    """``ns::op`` is its default overload; ``ns::op.out`` and ``ns.op.out`` that overload."""
    adopted(_ops_package(ns, "scale", overloads=("out",)), f"fr-{ns}")
    scoped()
    for spelling, names in ((f"{ns}::scale", [f"{ns}::scale"]),
                            (f"{ns}::scale.out", [f"{ns}::scale.out"]),
                            (f"{ns}.scale.out", [f"{ns}::scale.out"]),
                            (f"torch.ops.{ns}.scale.out", [f"{ns}::scale.out"])):
        code, out, err = _show(capsys, spelling, "--json")
        assert code == 0, (spelling, err)
        assert [op["name"] for row in json.loads(out)["adopted"] for op in row["ops"]] == names


def test_a_misspelt_adopted_op_gets_did_you_mean(adopted, dists: DistFactory, ns, scoped,
                                                 capsys) -> None:
    adopted(_ops_package(ns, "topk_softmax"), f"fr-{ns}")
    scoped()
    for spelling in (f"{ns}::topk_sofmax", f"{ns}.topk_sofmax", f"torch.ops.{ns}.topk_sofmax"):
        code, out, err = _show(capsys, spelling)
        assert code == 2 and not out
        assert f"did you mean '{ns}::topk_softmax'?" in err, (spelling, err)


def test_a_name_several_namespaces_have_is_ambiguous(adopted, dists: DistFactory, ns, scoped,
                                                     capsys) -> None:
    """Two adopted namespaces, or an adopted and a declared one, with an op of that name."""
    twin = f"twin_{ns}"
    adopted(_ops_package(ns, twin), f"fr-{ns}")
    adopted(_ops_package(f"{ns}b", twin), f"fr-{ns}b")
    scoped()
    code, _, err = _show(capsys, twin)
    assert code == 2 and "is ambiguous" in err
    assert f"{ns}::{twin}" in err and f"{ns}b::{twin}" in err
    assert _show(capsys, f"{ns}::{twin}")[0] == 0  # the namespace says which

    lone = f"lone_{ns}"
    adopted(_ops_package(f"{ns}c", lone), f"fr-{ns}c")
    op_dist(dists, "declares", f"{ns}d", f'lib.define("{lone}(Tensor x) -> Tensor")\n')
    scoped()
    code, _, err = _show(capsys, lone)
    assert code == 2 and "is ambiguous" in err
    assert f"{ns}c::{lone}" in err and f"{ns}d::{lone}" in err


# -- list --live -------------------------------------------------------------------------


def test_list_live_without_a_namespace_lists_the_adopted_ones(adopted, dists: DistFactory, ns,
                                                              scoped, capsys) -> None:
    """A namespace adopted lazily and not imported: listed, with the note that says so."""
    adopted(_ops_package(ns, "scale"), f"fr-{ns}")
    scoped()
    note = (f"adopted lazily, not imported in this process: pass --import fr_{ns} "
            f"(or touch torch.ops.{ns})")
    assert main(["list", "--live"]) == 0
    text = capsys.readouterr().out
    live = text[text.index("Live dispatcher (torch)"):]
    assert f"  namespace {ns}\n" in live and note in live
    assert main(["list", "--live", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    schemas = doc_schemas()
    assert not schema_errors(data, schemas["list"], schemas["types"])
    assert data["live"][ns] == [] and data["live_not_imported"][ns] == [f"fr_{ns}"]
    assert f"fr_{ns}" not in sys.modules


# -- what the first touch of a shared namespace imports ----------------------------------


def test_show_names_every_module_the_first_touch_imports(adopted, dists: DistFactory, ns,
                                                         scoped, capsys) -> None:
    """Two distributions register in one namespace (vLLM's and a plugin's ``_C``): its first
    touch imports both, in the adopter's order, and ``show`` says so."""
    from opregistry.adopting import Adopter

    first = adopted(_ops_package(ns, "my_scale"), f"fr-{ns}")
    second = adopted({f"fr_{ns}_b/__init__.py": "from . import kernels\n",
                      f"fr_{ns}_b/kernels.py": f"""
        import torch

        torch.library.define("{ns}::my_shift", "(Tensor x) -> Tensor")
    """}, f"fr-{ns}-b")
    scoped()
    code, out, err = _show(capsys, f"{ns}::my_scale")
    assert code == 0, err
    assert (f"the first touch of torch.ops.{ns} imports fr_{ns} ({first}==1.0), "
            f"then fr_{ns}_b ({second}==1.0)") in out
    found = plan(dists)
    table = [(a.name, list(modules)) for a, modules in Adopter(found, None, print).namespaces[ns]]
    assert [(e["distribution"]["name"], e["modules"]) for e in report.first_touch(found, ns)] \
        == table == [(first, [f"fr_{ns}"]), (second, [f"fr_{ns}_b"])]
    code, out, _ = _show(capsys, f"{ns}::my_scale", "--json")
    data = json.loads(out)
    schemas = doc_schemas()
    assert not schema_errors(data, schemas["show"], schemas["types"])
    assert [(e["distribution"]["name"], e["modules"]) for e in data["first_touch"][ns]] == table


# -- kernels of a namespace not tied to one op --------------------------------------------


#: the namespace of tests/native_build.py's ``impl`` library: ``TORCH_LIBRARY_IMPL(
#: opregistry_nimpl, CPU, m)``, whose ops are not in its symbols
IMPL_NS = "opregistry_nimpl"


def _torchvision_like(ns: str, library: bytes) -> dict[str, str | bytes]:
    """torchvision's layout: ops defined in Python, CPU kernels in a C++ IMPL block, Meta
    kernels through a helper that names the op by a parameter (``register_meta``), an
    Autograd kernel registered by name."""
    return {f"fr_{ns}/__init__.py": f"""
        import functools
        import os

        import torch

        torch.library.define("{IMPL_NS}::roi_{ns}", "(Tensor x) -> Tensor")
        torch.ops.load_library(os.path.join(os.path.dirname(__file__), "_C.so"))


        @functools.lru_cache(None)
        def get_meta_lib():
            return torch.library.Library("{IMPL_NS}", "IMPL", "Meta")


        def register_meta(op_name, overload_name="default"):
            def wrapper(fn):
                get_meta_lib().impl(getattr(getattr(torch.ops.{IMPL_NS}, op_name),
                                            overload_name), fn)
                return fn
            return wrapper


        @register_meta("roi_{ns}")
        def meta_roi(x):
            return x.new_empty(x.shape)


        torch.library.register_autograd("{IMPL_NS}::roi_{ns}", lambda ctx, g: g)
    """, f"fr_{ns}/_C.so": library}


def test_show_and_list_name_the_kernels_of_a_namespace_not_tied_to_one_op(
        adopted, dists: DistFactory, ns, scoped, capsys,
        native_libraries: dict[str, Path]) -> None:
    name = adopted(_torchvision_like(ns, native_libraries["impl"].read_bytes()), f"fr-{ns}")
    scoped()
    code, out, err = _show(capsys, f"{IMPL_NS}::roi_{ns}")
    assert code == 0, err
    own = out[out.index("Kernels (read"):out.index("Kernels of ")]
    assert "Autograd" in own and "CPU" not in own and "Meta" not in own, "not claimed as its own"
    untied = out[out.index(f"Kernels of {IMPL_NS} the scan could not tie to one op"):]
    assert "may apply to it" in untied
    lines = untied.splitlines()
    assert any(line.split()[:1] == ["CPU"] and f"fr_{ns} (_C.so)" in line
               and "C++ TORCH_LIBRARY_IMPL block (its ops are not in the symbols)" in line
               for line in lines), untied
    assert any(line.split()[:1] == ["Meta"] and f"fr_{ns}:" in line
               and "unresolved: the op name" in line for line in lines), untied
    code, out, _ = _show(capsys, f"{IMPL_NS}.roi_{ns}", "--json")
    data = json.loads(out)
    schemas = doc_schemas()
    assert not schema_errors(data, schemas["show"], schemas["types"])
    keys = {(k["key"], k["why"].split(":")[0].split(" ")[0]) for k in
            data["namespace_kernels"][IMPL_NS]}
    assert keys == {("CPU", "C++"), ("Meta", "unresolved")}
    assert {k["distribution"]["name"] for k in data["namespace_kernels"][IMPL_NS]} == {name}

    assert main(["list", "-n", IMPL_NS]) == 0
    text = capsys.readouterr().out
    listed = text[text.index("Adopted ("):]
    assert f"kernels of {IMPL_NS} the scan could not tie to one op" in listed
    assert any(line.split()[:2] == ["CPU", "may"] for line in listed.splitlines())
    assert any(line.split()[:2] == ["Meta", "may"] for line in listed.splitlines())
    assert main(["list", "-n", IMPL_NS, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert not schema_errors(data, schemas["list"], schemas["types"])
    (row,) = data["adopted"]
    assert {k["key"] for k in row["namespace_kernels"][IMPL_NS]} == {"CPU", "Meta"}
    assert f"fr_{ns}" not in sys.modules
