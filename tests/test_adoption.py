"""Adoption of packages that register with torch.library by themselves, in this process.

Synthetic distributions (tests/adoption_dists.py: real dist-info with
METADATA and RECORD) register their ops at their own import, the way
bitsandbytes does.  The registry is loaded for real; the first touch of
``torch.ops.<ns>`` must import them, with real dispatch afterwards; a switch
must stop it; a failing import must be named, never raised.
"""

from __future__ import annotations

import importlib
import json
import sys
import textwrap
from pathlib import Path
from typing import Callable

import pytest
import torch
from structlog.testing import capture_logs

from opregistry import report

from . import adoption_dists, foreign_dists
from .conftest import DistFactory, load, op_dist, plan
from .test_cli import doc_schemas, schema_errors


def _package(ns: str) -> dict[str, str]:
    """bitsandbytes' layout: ops defined in ``_ops``, a CPU kernel in ``backends/cpu``."""
    pkg = f"fp_{ns}"
    return {
        f"{pkg}/__init__.py": """
            from . import _ops
            from .backends import cpu
        """,
        f"{pkg}/_ops.py": f"""
            import torch

            NS = "{ns}"
            register_kernel = torch.library.register_kernel
            torch.library.define(f"{{NS}}::scale", "(Tensor x, float f) -> Tensor")


            @torch.library.register_fake(f"{{NS}}::scale")
            def _(x, f):
                return torch.empty_like(x)


            @register_kernel(f"{{NS}}::scale", "default")
            def _(x, f):
                return x * f
        """,
        f"{pkg}/backends/__init__.py": "",
        f"{pkg}/backends/cpu.py": """
            from .._ops import NS, register_kernel


            @register_kernel(f"{NS}::scale", "cpu")
            def _(x, f):
                return x * f + 1000
        """,
    }


@pytest.fixture
def foreign(site: Path, ns: str) -> Callable[..., str]:
    def make(files: dict[str, str] | None = None, name: str | None = None, **kw: object) -> str:
        return adoption_dists.write(site, name or f"fp-{ns}", files or _package(ns), **kw)
    return make


def test_a_namespace_is_adopted_on_its_first_touch(foreign, dists: DistFactory, ns) -> None:
    """Nothing is imported at load; ``torch.ops.<ns>`` imports the package, then dispatches."""
    name = foreign()
    registry = load(dists)
    adopted = registry.plan.adopted(name)
    assert adopted is not None and adopted.status == "adopted" and adopted.load == "lazy"
    assert dict(adopted.modules) == {ns: (f"fp_{ns}",)}
    assert f"fp_{ns}" not in sys.modules and ns not in vars(torch.ops)
    out = getattr(torch.ops, ns).scale(torch.ones(2), 3.0)
    assert out.tolist() == [1003.0, 1003.0]  # the package's CPU kernel, from backends/cpu.py
    assert f"fp_{ns}.backends.cpu" in sys.modules
    assert registry.adopter.outcomes[name] == "imported"
    assert not registry.errors


@pytest.mark.parametrize("load_when", ["lazy", "eager"])
def test_below_a_namespace_package_the_regular_package_is_imported(
        foreign, dists: DistFactory, ns, load_when) -> None:
    """optimum-quanto's layout: ``optimum/`` has no ``__init__.py`` (PEP 420), so ``import
    optimum`` imports nothing of it; the first touch (or the load, eager) imports
    ``optimum.quanto``, whose own import registers the kernels."""
    root = f"fp_{ns}_org"
    name = foreign({f"{root}/quant/{rel.partition('/')[2]}": src
                    for rel, src in _package(ns).items()})
    if load_when == "eager":
        dists.make(f"ad-{ns}", ops={"adopt": f"ad_{ns}"},
                   modules={f"ad_{ns}": ADAPTER.format(dist=name, ns=ns)})
    registry = load(dists)
    adopted = registry.plan.adopted(name)
    assert adopted.load == load_when and dict(adopted.modules) == {ns: (f"{root}.quant",)}
    getattr(torch.ops, ns)  # the touch alone: no op looked up
    assert f"{root}.quant.backends.cpu" in sys.modules
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"{ns}::scale", "CPU")
    assert getattr(torch.ops, ns).scale(torch.ones(1), 3.0).item() == 1003.0
    (row,) = report.list_report(registry.plan, namespaces=[ns])["adopted"]
    assert row["namespaces"] == {ns: [f"{root}.quant"]}


def test_listed_without_torch_and_attributed(foreign, dists: DistFactory, ns) -> None:
    """The plan lists the adopted ops and kernels, with the module and line of each."""
    name = foreign()
    data = report.list_report(plan(dists), namespaces=[ns])
    (row,) = data["adopted"]
    assert row["distribution"] == {"name": name, "version": "1.0"}
    (op,) = row["ops"]
    assert op["name"] == f"{ns}::scale" and op["where"] == f"fp_{ns}._ops:5"
    keys = {k["key"]: k["where"] for k in op["kernels"]}
    assert keys == {"Meta": f"fp_{ns}._ops:8", "CompositeExplicitAutograd": f"fp_{ns}._ops:13",
                    "CPU": f"fp_{ns}.backends.cpu:4"}
    assert f"fp_{ns}" not in sys.modules


def test_an_op_outside_the_packages_own_import_is_imported_when_looked_up(
        foreign, dists: DistFactory, ns) -> None:
    """torchao's prototypes: a module the package does not import defines an op."""
    files = {**_package(ns), f"fp_{ns}/extra.py": f"""
        import torch


        @torch.library.custom_op("{ns}::twice", mutates_args=())
        def twice(x: torch.Tensor) -> torch.Tensor:
            return x * 2


        if torch.ones(1).item() == 2.0:
            torch.library.define("{ns}::never", "(Tensor x) -> Tensor")
    """}
    foreign(files)
    load(dists)
    assert getattr(torch.ops, ns).twice(torch.ones(1)).item() == 2.0
    assert f"fp_{ns}.extra" in sys.modules
    with pytest.raises(AttributeError) as missing:  # the package imported: torch's own message
        getattr(torch.ops, ns).thrice
    assert str(missing.value) == f"'_OpNamespace' '{ns}' object has no attribute 'thrice'"
    # an op the scan knows, its module imported, that the module did not define (a condition
    # false here): torch's own message as well
    with pytest.raises(AttributeError) as missing:
        getattr(torch.ops, ns).never
    assert str(missing.value) == f"'_OpNamespace' '{ns}' object has no attribute 'never'"


def test_an_op_missing_because_its_module_failed_to_import_says_so(
        foreign, dists: DistFactory, ns) -> None:
    """An op of another namespace, defined in a module the package does not import (torchao's
    prototypes), whose import fails: its lookup says which module failed, and why."""
    files = {**_package(ns), f"fp_{ns}/extra.py": f"""
        import torch

        torch.library.define("{ns}x::twice", "(Tensor x) -> Tensor")
        raise ImportError("needs a newer triton")
    """}
    name = foreign(files)
    load(dists)
    with pytest.raises(AttributeError) as missing:
        getattr(torch.ops, f"{ns}x").thrice
    assert str(missing.value) == f"'_OpNamespace' '{ns}x' object has no attribute 'thrice'"
    with pytest.raises(AttributeError) as missing:  # the op the failing module defines
        getattr(torch.ops, f"{ns}x").twice.default
    assert str(missing.value).startswith(
        f"'_OpNamespace' '{ns}x' object has no attribute 'twice': {name}==1.0, adopted by "
        f"opregistry for torch.ops.{ns}x, failed to import (importing fp_{ns}.extra: "
        f"ImportError: needs a newer triton)"), str(missing.value)
    # the package's own namespace imported: a missing op there is torch's message alone
    assert getattr(torch.ops, ns).scale(torch.ones(1), 2.0).item() == 1002.0
    with pytest.raises(AttributeError) as missing:
        getattr(torch.ops, ns).thrice
    assert str(missing.value) == f"'_OpNamespace' '{ns}' object has no attribute 'thrice'"


def test_a_failing_import_is_named_never_raised(foreign, dists: DistFactory, ns) -> None:
    files = {f"fp_{ns}/__init__.py": f"""
        import torch

        torch.library.define("{ns}::op", "(Tensor x) -> Tensor")
        raise RuntimeError("no native library for this machine")
    """}
    name = foreign(files)
    registry = load(dists)
    with capture_logs() as logs:
        namespace = getattr(torch.ops, ns)  # no exception here
        with pytest.raises(AttributeError) as missing:
            namespace.nothing_else
        assert not hasattr(namespace, "nor_this")
    # the lookup says why an op may be missing: the package that registers in the namespace
    # failed to import
    assert str(missing.value).startswith(
        f"'_OpNamespace' '{ns}' object has no attribute 'nothing_else': ")
    assert f"{name}==1.0, adopted by opregistry for torch.ops.{ns}, failed to import" in str(
        missing.value)
    assert "no native library for this machine" in str(missing.value)
    assert f"import fp_{ns} yourself" in str(missing.value)
    (problem,) = [p for p in registry.problems if p.code == "adoption-import-failed"]
    assert name in problem.message and f"fp_{ns}" in problem.message
    assert "no native library for this machine" in problem.message
    (warning,) = [e for e in logs if e["event"] == "adopted package failed to import"]
    assert warning["distribution"] == f"{name}==1.0" and warning["module"] == f"fp_{ns}"
    assert warning["log_level"] == "warning"


def _failing_after_its_ops(ns: str, defines_some: bool) -> dict[str, str]:
    """torchvision 0.29.1 on torch 2.13: ``__init__`` imports the module that defines the
    ops, then raises; Python keeps that module in ``sys.modules`` without its package.
    The module defines ``twice`` only under a condition false here, and, ``defines_some``,
    ``scale`` unconditionally."""
    scale = f"""
        torch.library.define("{ns}::scale", "(Tensor x, float f) -> Tensor")


        @torch.library.register_kernel("{ns}::scale", "default")
        def _(x, f):
            return x * f
    """ if defines_some else ""
    return {
        f"fp_{ns}/__init__.py": """
            from . import _ops

            raise RuntimeError("this build needs torch>=9.0")
        """,
        f"fp_{ns}/_ops.py": textwrap.dedent(f"""
            import torch

            if torch.ones(1).item() == 2.0:
                torch.library.define("{ns}::twice", "(Tensor x) -> Tensor")
        """) + textwrap.dedent(scale),
    }


@pytest.mark.parametrize("defines_some", [False, True], ids=["defines-none", "defines-some"])
def test_a_package_failing_after_importing_its_ops_module_says_why_at_every_lookup(
        foreign, dists: DistFactory, ns, defines_some) -> None:
    """The lookup of an op the package would have defined -- the first and every later one,
    with ``.default`` after it, and as ``hasattr`` probes it -- says why it is missing, as
    the lookup of an op the scan does not know does; ``hasattr`` stays ``False``."""
    name = foreign(_failing_after_its_ops(ns, defines_some))
    registry = load(dists)
    because = (f"{name}==1.0, adopted by opregistry for torch.ops.{ns}, failed to import "
               f"(importing fp_{ns}: RuntimeError: this build needs torch>=9.0); import fp_{ns} "
               f"yourself to see the whole error")
    with capture_logs() as logs:
        namespace = getattr(torch.ops, ns)  # no exception here
        assert f"fp_{ns}._ops" in sys.modules and f"fp_{ns}" not in sys.modules
        for _ in range(2):  # the first lookup (the scan knows the op) and a later one
            with pytest.raises(AttributeError) as missing:
                namespace.twice.default
            assert str(missing.value) == (
                f"'_OpNamespace' '{ns}' object has no attribute 'twice': {because}")
        with pytest.raises(AttributeError) as missing:  # an op the scan does not know
            namespace.thrice
        assert str(missing.value) == (
            f"'_OpNamespace' '{ns}' object has no attribute 'thrice': {because}")
        assert not hasattr(namespace, "twice") and not hasattr(namespace, "thrice")
    if defines_some:  # what the module defined before its package failed is there
        assert namespace.scale.default(torch.ones(1), 3.0).item() == 3.0
    # the failure is reported once, at the first touch; the lookups import nothing again
    (problem,) = [p for p in registry.problems if p.code == "adoption-import-failed"]
    assert f"importing fp_{ns} (because torch.ops.{ns} was first touched)" in problem.message
    assert [e["module"] for e in logs if e["event"] == "adopted package failed to import"] \
        == [f"fp_{ns}"]
    assert registry.adopter.outcomes[name].startswith(f"failed: importing fp_{ns}: ")


def test_a_module_left_behind_by_its_users_failed_import_says_why(
        foreign, dists: DistFactory, ns) -> None:
    """The package's user imported a subpackage that failed after importing the module that
    defines an op: that module is in ``sys.modules``, its subpackage is not.  The lookup of
    the op imports the subpackage, as ``import`` would, and says why it is missing."""
    files = {**_package(ns),
             f"fp_{ns}/gpu/__init__.py": """
                 from . import kernels

                 raise RuntimeError("no GPU here")
             """,
             f"fp_{ns}/gpu/kernels.py": f"""
                 import torch

                 if torch.cuda.is_available() and torch.ones(1).item() == 2.0:
                     torch.library.define("{ns}::twice", "(Tensor x) -> Tensor")
             """}
    name = foreign(files)
    registry = load(dists)
    with pytest.raises(RuntimeError, match="no GPU here"):
        importlib.import_module(f"fp_{ns}.gpu")  # the user's own import
    assert f"fp_{ns}.gpu.kernels" in sys.modules and f"fp_{ns}.gpu" not in sys.modules
    namespace = getattr(torch.ops, ns)
    assert namespace.scale(torch.ones(1), 2.0).item() == 1002.0  # the package itself imports
    with pytest.raises(AttributeError) as missing:
        namespace.twice
    assert str(missing.value) == (
        f"'_OpNamespace' '{ns}' object has no attribute 'twice': {name}==1.0, adopted by "
        f"opregistry for torch.ops.{ns}, failed to import (importing fp_{ns}.gpu: "
        f"RuntimeError: no GPU here); import fp_{ns}.gpu yourself to see the whole error")
    assert not hasattr(namespace, "twice")
    (problem,) = [p for p in registry.problems if p.code == "adoption-import-failed"]
    assert f"importing fp_{ns}.gpu (because torch.ops.{ns}.twice was looked up)" in \
        problem.message


def test_an_op_its_own_module_does_not_define_says_why_the_package_failed(
        foreign, dists: DistFactory, ns) -> None:
    """The namespace's package failed to import; the module the scan says defines the op
    (another top-level module of the distribution) imports, but does not define it: the
    lookup says that the package failed all the same."""
    files = {f"fp_{ns}/__init__.py": f"""
                 import torch

                 torch.library.define("{ns}::op", "(Tensor x) -> Tensor")
                 raise RuntimeError("no native library for this machine")
             """,
             f"fp_{ns}_extra.py": f"""
                 import torch

                 if torch.ones(1).item() == 2.0:
                     torch.library.define("{ns}::twice", "(Tensor x) -> Tensor")
             """}
    name = foreign(files)
    registry = load(dists)
    assert registry.plan.adopted(name).modules == ((ns, (f"fp_{ns}",)),)
    namespace = getattr(torch.ops, ns)
    with pytest.raises(AttributeError) as missing:
        namespace.twice
    assert f"fp_{ns}_extra" in sys.modules  # imported by the lookup, and fine
    assert str(missing.value) == (
        f"'_OpNamespace' '{ns}' object has no attribute 'twice': {name}==1.0, adopted by "
        f"opregistry for torch.ops.{ns}, failed to import (importing fp_{ns}: RuntimeError: "
        f"no native library for this machine); import fp_{ns} yourself to see the whole error")
    assert not hasattr(namespace, "twice")


@pytest.mark.parametrize("how", ["variable", "block", "config"])
def test_adoption_switched_off(foreign, dists: DistFactory, ns, how, monkeypatch,
                               tmp_path) -> None:
    """OPREGISTRY_ADOPT=0, OPREGISTRY_ADOPT_BLOCK and the config keys leave the package alone."""
    name = foreign()
    if how == "variable":
        monkeypatch.setenv("OPREGISTRY_ADOPT", "0")
    elif how == "block":
        monkeypatch.setenv("OPREGISTRY_ADOPT_BLOCK", name)
    else:
        config = tmp_path / "opregistry.toml"
        config.write_text(f'adopt_block = ["{name}"]\n')
        monkeypatch.setenv("OPREGISTRY_CONFIG", str(config))
    registry = load(dists)
    adopted = registry.plan.adopted(name)
    assert adopted is not None and adopted.status == "off"
    assert ("OPREGISTRY_ADOPT" in adopted.reason if how != "config"
            else "adopt_block" in adopted.reason)
    with pytest.raises(AttributeError):
        getattr(torch.ops, ns).scale
    assert f"fp_{ns}" not in sys.modules
    __import__(f"fp_{ns}")  # the package still works when its user imports it
    assert getattr(torch.ops, ns).scale(torch.ones(1), 2.0).item() == 1002.0


def test_an_unknown_name_in_the_block_list_is_reported(foreign, dists, monkeypatch) -> None:
    name = foreign()
    monkeypatch.setenv("OPREGISTRY_ADOPT_BLOCK", name + "x")
    (problem,) = [p for p in plan(dists).problems if p.code == "config-unknown-distribution"]
    assert problem.severity == "error" and f"did you mean {name!r}" in problem.message


def test_a_plugin_in_the_block_list_is_reported(foreign, dists, monkeypatch, ns) -> None:
    """An opregistry plugin is no candidate for adoption: OPREGISTRY_ADOPT_BLOCK naming one
    is an error naming the variable and OPREGISTRY_BLOCK (before: silently accepted)."""
    foreign()
    plugin = dists.make(f"ab-plugin-{ns}", ops={"ops": f"ab_plugin_{ns}:lib"},
                        modules={f"ab_plugin_{ns}": "from opregistry import OpLibrary\n"
                                                    f"lib = OpLibrary('abp_{ns}', 'DEF')\n"},
                        requires=("opregistry",))
    monkeypatch.setenv("OPREGISTRY_ADOPT_BLOCK", plugin)
    (problem,) = [p for p in plan(dists).problems if p.code == "config-unknown-distribution"]
    assert problem.severity == "error"
    assert f"OPREGISTRY_ADOPT_BLOCK names {plugin!r}, which is an opregistry plugin" \
        in problem.message
    assert "OPREGISTRY_BLOCK" in problem.hint


def test_show_of_an_adopted_op_without_torch_imported_by_show(foreign, dists: DistFactory, ns,
                                                                capsys) -> None:
    """``show ns::op``: the package, where the op is defined, what the touch imports, kernels."""
    import json

    from opregistry.cli import main

    name = foreign()
    assert main(["show", f"{ns}::scale"]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"{ns}::scale(Tensor x, float f) -> Tensor")
    assert f"{name}==1.0, adopted" in text and f"fp_{ns}._ops:" in text
    assert f"the first touch of torch.ops.{ns} imports fp_{ns}" in text
    assert main(["show", f"torch.ops.{ns}.scale", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    schemas = doc_schemas()
    assert not schema_errors(data, schemas["show"], schemas["types"])
    [row] = data["adopted"]
    [op] = row["ops"]
    assert {(k["key"], k["where"].split(":")[0]) for k in op["kernels"]} == {
        ("Meta", f"fp_{ns}._ops"), ("CompositeExplicitAutograd", f"fp_{ns}._ops"),
        ("CPU", f"fp_{ns}.backends.cpu")}
    assert f"fp_{ns}" not in sys.modules, "read from its files, not imported"
    assert main(["show", f"{ns}::nosuch"]) == 2


def test_a_package_declares_its_own_adoption(site, dists: DistFactory, ns, monkeypatch) -> None:
    """A namespace the scan cannot read (from the environment), named in entry points."""
    monkeypatch.setenv(f"FP_NS_{ns}", ns)
    files = {f"fp_{ns}/__init__.py": f"""
        import os

        import torch

        lib = torch.library.Library(os.environ["FP_NS_{ns}"], "FRAGMENT")
        lib.define("neg(Tensor x) -> Tensor")
        lib.impl("neg", lambda x: -x, "CompositeExplicitAutograd")
    """}
    name = adoption_dists.write(site, f"fp-{ns}", files,
                                entry_points=f"[opregistry.adopt]\n{ns} = fp_{ns}\n")
    registry = load(dists)
    adopted = registry.plan.adopted(name)
    assert adopted.declared_by[0].group == "opregistry.adopt"
    assert dict(adopted.modules) == {ns: (f"fp_{ns}",)}
    assert getattr(torch.ops, ns).neg(torch.ones(1)).item() == -1.0


ADAPTER_NAMESPACES = """
from opregistry import Adoption


def opregistry_adoptions():
    return [Adoption(distribution={dist!r}, namespaces={namespaces!r})]
"""


@pytest.mark.parametrize("known", [False, True])
def test_an_adapters_namespace_without_modules_imports_the_package(
        site, dists: DistFactory, ns, monkeypatch, known) -> None:
    """``Adoption(namespaces=[...])`` without ``modules``: a namespace the scan cannot read
    imports the package -- what the scan's namespaces of it import (``known``), else the
    import root of its registering modules (before: nothing, and the touch found no op)."""
    extra = f"{ns}_env"
    monkeypatch.setenv(f"FP_NS_{ns}", extra)
    files = _package(ns) if known else {}
    files[f"fp_{ns}/__init__.py"] = ("from . import _ops\nfrom .backends import cpu\n"
                                     if known else "") + "from . import dyn\n"
    files[f"fp_{ns}/dyn.py"] = f"""
        import os

        import torch

        lib = torch.library.Library(os.environ["FP_NS_{ns}"], "FRAGMENT")
        lib.define("neg(Tensor x) -> Tensor")
        lib.impl("neg", lambda x: -x, "CompositeExplicitAutograd")
    """
    name = adoption_dists.write(site, f"fp-{ns}", files)
    dists.make(f"ad-{ns}", ops={"adopt": f"ad_{ns}"},
               modules={f"ad_{ns}": ADAPTER_NAMESPACES.format(dist=name, namespaces=[extra])})
    registry = load(dists)
    adopted = registry.plan.adopted(name)
    assert adopted.status == "adopted", adopted.reason
    assert dict(adopted.modules) == ({ns: (f"fp_{ns}",), extra: (f"fp_{ns}",)} if known
                                     else {extra: (f"fp_{ns}",)})
    assert f"fp_{ns}" not in sys.modules
    assert getattr(torch.ops, extra).neg(torch.ones(1)).item() == -1.0
    assert not registry.errors


def test_a_declared_namespace_is_protected_before_torch(site, dists: DistFactory, ns,
                                                       monkeypatch) -> None:
    """The scan cannot read the name; the package's entry points name it: a DEF of it is refused."""
    monkeypatch.setenv(f"FP_NS_{ns}", ns)
    files = {f"fp_{ns}/__init__.py": f"""
        import os

        import torch

        lib = torch.library.Library(os.environ["FP_NS_{ns}"], "DEF")
        lib.define("neg(Tensor x) -> Tensor")
    """}
    name = adoption_dists.write(site, f"fp-{ns}", files,
                                entry_points=f"[opregistry.adopt]\n{ns} = fp_{ns}\n")
    claimant = op_dist(dists, "claimant", ns, "lib.define('neg(Tensor x) -> Tensor')\n")
    [held] = [p for p in plan(dists).errors if p.code == "namespace-held-by-package"]
    assert f"{name}==1.0" in held.message and "declared adoption" not in held.message
    assert [o.distribution for o in held.culprits] == [claimant]


#: the namespace of tests/native_build.py's ``test`` library, whose schema strings are
#: unqualified: stripped of its symbols, nothing but its strings names it
NATIVE_NS = "opregistry_native_test"


def _stripped_package(site: Path, native_libraries: dict[str, Path], tmp_path: Path) -> str:
    """fbgemm-gpu's layout: ``TORCH_LIBRARY(opregistry_native_test)`` in a library stripped of
    its symbols, fake kernels for its ops in Python; installed, its name returned."""
    library = tmp_path / "libfxhinted.so"
    foreign_dists._strip(native_libraries["test"], library)
    return adoption_dists.write(site, "fp-hinted", {"fp_hinted/__init__.py": f"""
        import os

        import torch

        torch.ops.load_library(os.path.join(os.path.dirname(__file__), "libfxhinted.so"))


        @torch.library.register_fake("{NATIVE_NS}::twice")
        def _(x):
            return torch.empty_like(x)
    """, "fp_hinted/libfxhinted.so": library.read_bytes()})


def test_a_stripped_librarys_namespace_is_protected_before_torch(
        site, dists: DistFactory, native_libraries: dict[str, Path], tmp_path: Path) -> None:
    """The namespace read from the stripped library's strings: a DEF of it is refused."""
    name = _stripped_package(site, native_libraries, tmp_path)
    claimant = op_dist(dists, "claimant", NATIVE_NS, "lib.define('other(Tensor x) -> Tensor')\n")
    [held] = [p for p in plan(dists).errors if p.code == "namespace-held-by-package"]
    assert f"{name}==1.0 (" in held.message and "libfxhinted.so" in held.message
    assert [o.distribution for o in held.culprits] == [claimant]


def test_a_stripped_librarys_namespace_yields_to_a_package_that_defines_it(
        site, dists: DistFactory, native_libraries: dict[str, Path], tmp_path: Path) -> None:
    """What a stripped library's strings say is weaker than source: a package whose source
    defines the namespace is its owner, adopted alone, with no conflict."""
    hinted = _stripped_package(site, native_libraries, tmp_path)
    owner = adoption_dists.write(site, "fp-owner", {"fp_owner/__init__.py": f"""
        import torch

        torch.library.define("{NATIVE_NS}::other", "(Tensor x) -> Tensor")
    """})
    op_dist(dists, "claimant", NATIVE_NS, "lib.define('third(Tensor x) -> Tensor')\n")
    found = plan(dists)
    [held] = [p for p in found.errors if p.code == "namespace-held-by-package"]
    assert f"{owner}==1.0 (" in held.message
    assert found.adopted(owner).status == "adopted" and found.adopted(hinted) is None
    assert "adoption-conflict" not in {p.code for p in found.problems}


def test_eager_self_declared_adoption_imports_at_load(site, dists: DistFactory, ns) -> None:
    files = _package(ns)
    adoption_dists.write(site, f"fp-{ns}", files,
                         entry_points=f"[opregistry.adopt.eager]\n{ns} = fp_{ns}._ops\n")
    load(dists)
    assert f"fp_{ns}._ops" in sys.modules
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"{ns}::scale", "CPU")


ADAPTER = """
from opregistry import Adoption


def opregistry_adoptions():
    return [Adoption(distribution={dist!r}, load="eager",
                     samples={{"{ns}::scale": "ad_{ns}:samples"}})]


def samples():
    import torch
    return [((torch.ones(2), 2.0), {{}})]
"""


def test_an_adapter_adopts_a_package_eagerly(foreign, dists: DistFactory, ns) -> None:
    name = foreign()
    adapter = dists.make(f"ad-{ns}", ops={"adopt": f"ad_{ns}"},
                         modules={f"ad_{ns}": ADAPTER.format(dist=name, ns=ns)})
    registry = load(dists)
    adopted = registry.plan.adopted(name)
    assert adopted.load == "eager" and adopted.declared_by[0].distribution == adapter
    assert adopted.samples == {f"{ns}::scale": f"ad_{ns}:samples"}
    assert f"fp_{ns}" in sys.modules  # imported when the registry loaded


def test_an_adapter_adopting_what_is_not_installed_is_left_out(dists: DistFactory, ns,
                                                                site) -> None:
    adapter = dists.make(f"ad-{ns}", ops={"adopt": f"ad_{ns}"},
                         modules={f"ad_{ns}": ADAPTER.format(dist="no-such-thing", ns=ns)})
    resolved = plan(dists)
    (problem,) = [p for p in resolved.problems if p.code == "adoption-unknown-distribution"]
    assert [o.distribution for o in problem.culprits] == [adapter]
    assert adapter in {o.distribution for o in resolved.excluded}


HIJACK = """
from opregistry import Adoption


def opregistry_adoptions():
    return [Adoption(distribution={dist!r}, load="eager", modules={modules!r},
                     namespaces={namespaces!r})]
"""


@pytest.mark.parametrize("module", ["os", "OTHER", "fp_NS"])
def test_an_adoption_imports_only_the_adopted_distributions_modules(
        foreign, dists: DistFactory, ns, module) -> None:
    """An adapter naming Python's own module or another package's is refused; the package's own
    module is what it imports."""
    name = foreign()
    other = foreign({f"other_{ns}/__init__.py": "HIJACKED = True\n"}, name=f"other-{ns}")
    module = module.replace("OTHER", f"other_{ns}").replace("NS", ns)
    adapter = dists.make(f"ad-{ns}", ops={"adopt": f"ad_{ns}"}, modules={
        f"ad_{ns}": HIJACK.format(dist=name, modules=[module], namespaces=[])})
    registry = load(dists)
    refused = [p for p in registry.problems if p.code == "adoption-module-not-owned"]
    if module == f"fp_{ns}":
        assert not refused and f"fp_{ns}" in sys.modules  # eager: imported at load
        return
    (problem,) = refused
    assert [o.distribution for o in problem.culprits] == [adapter]
    assert (f"{other}==1.0 installed" if module != "os" else "no installed distribution"
            ) in problem.message
    assert f"other_{ns}" not in sys.modules
    assert registry.plan.adopted(name).load == "lazy", "adopted as the scan found it"


@pytest.mark.parametrize("held", ["aten", "PACKAGE", "PLUGIN"])
def test_an_adoption_cannot_take_anothers_namespace(foreign, dists: DistFactory, ns,
                                                    held) -> None:
    """The first touch of torch.ops.<ns> must not import a package that does not hold ns."""
    foreign()  # fp-<ns> registers namespace <ns>
    intruder = foreign({f"in_{ns}/__init__.py": "HIJACKED = True\n"}, name=f"in-{ns}")
    plugin_ns = f"{ns}_plug"
    op_dist(dists, "plug", plugin_ns, "lib.define('f(Tensor x) -> Tensor')\n")
    namespace = {"aten": "aten", "PACKAGE": ns, "PLUGIN": plugin_ns}[held]
    adapter = dists.make(f"ad-{ns}", ops={"adopt": f"ad_{ns}"}, modules={
        f"ad_{ns}": HIJACK.format(dist=intruder, modules=[f"in_{ns}"], namespaces=[namespace])})
    resolved = plan(dists)
    (problem,) = [p for p in resolved.problems if p.code == "adoption-namespace-held"]
    assert [o.distribution for o in problem.culprits] == [adapter]
    holder = {"aten": "which torch holds", "PACKAGE": f"fp-{ns}==1.0 (",
              "PLUGIN": "plug==1.0 ("}[held]
    assert holder in problem.message
    assert resolved.adopted(intruder) is None or namespace not in dict(
        resolved.adopted(intruder).modules)


def test_a_kernel_switch_leaves_the_registration_out(foreign, dists: DistFactory, ns,
                                                     monkeypatch) -> None:
    """-ns::scale:CPU: the package's CPU kernel is never registered; the default one serves."""
    name = foreign()
    monkeypatch.setenv("OPREGISTRY_KERNELS", f"-{ns}::scale:CPU")
    registry = load(dists)
    (kernel,) = [k for k in registry.plan.adopted(name).kernels if k.key == "CPU"]
    assert kernel.status == "disabled"
    assert getattr(torch.ops, ns).scale(torch.ones(1), 3.0).item() == 3.0  # the default kernel
    assert not torch._C._dispatch_has_kernel_for_dispatch_key(f"{ns}::scale", "CPU")
    assert (f"{ns}::scale", "CPU") in registry.adopter.switched
    assert not [p for p in registry.problems if p.code == "kernel-switch-unknown"]


def test_a_custom_op_kernel_cannot_be_switched_off(foreign, dists: DistFactory, ns,
                                                   monkeypatch) -> None:
    files = {f"fp_{ns}/__init__.py": f"""
        import torch


        @torch.library.custom_op("{ns}::twice", mutates_args=(), device_types="cpu")
        def twice(x: torch.Tensor) -> torch.Tensor:
            return x * 2
    """}
    foreign(files)
    monkeypatch.setenv("OPREGISTRY_KERNELS", f"-{ns}::twice:CPU")
    registry = load(dists)
    (problem,) = [p for p in registry.problems if p.code == "kernel-switch-not-applied"]
    assert "custom_op" in problem.message and problem.op == f"{ns}::twice"
    assert getattr(torch.ops, ns).twice(torch.ones(1)).item() == 2.0


DEADLOCK_PROBE = """
import json, threading, time
import torch

t = threading.Thread(target=lambda: __import__("dla_NS"), daemon=True)
t.start()
time.sleep(0.3)          # the thread holds dla's import lock, sleeping
torch.ops.NS_b           # imports dlb, which imports dla: waits for the thread
t.join(60)
print(json.dumps([not t.is_alive(), hasattr(torch.ops.NS_b, "g"), hasattr(torch.ops.NS_a, "f"),
                  hasattr(torch.ops.NS_c, "h")]))
"""


def test_touches_from_two_threads_in_the_middle_of_imports_do_not_deadlock(
        foreign, ns, site) -> None:
    """One thread imports a package that touches an adopted namespace while the main thread's
    touch of another imports a package importing the first: Python's module locks alone order
    them (opregistry holds no lock of its own across an import)."""
    import os
    import subprocess

    foreign({"dla_NS/__init__.py".replace("NS", ns): f"""
        import time
        import torch
        lib = torch.library.Library("{ns}_a", "DEF")
        lib.define("f(Tensor x) -> Tensor")
        time.sleep(1.0)
        torch.ops.{ns}_c.h   # another adopted namespace, touched mid-import
    """}, name=f"dla-{ns}")
    foreign({"dlc_NS/__init__.py".replace("NS", ns): f"""
        import torch
        lib = torch.library.Library("{ns}_c", "DEF")
        lib.define("h(Tensor x) -> Tensor")
    """}, name=f"dlc-{ns}")
    foreign({"dlb_NS/__init__.py".replace("NS", ns): f"""
        import torch
        import dla_{ns}
        lib = torch.library.Library("{ns}_b", "DEF")
        lib.define("g(Tensor x) -> Tensor")
    """}, name=f"dlb-{ns}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *sys.path])}
    out = subprocess.run([sys.executable, "-c", DEADLOCK_PROBE.replace("NS", ns)],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.splitlines()[-1]) == [True, True, True, True]


RACE_PROBE = """
import json, os, threading, time
import torch

signal, out = os.environ["RACE_SIGNAL"], []
if os.environ["RACE_FIRST"] == "touch":  # opregistry's import, on the first touch
    first = threading.Thread(target=lambda: out.append(torch.ops.NS_r.f(torch.zeros(1)).item()))
else:  # the user's own import, in a worker thread
    first = threading.Thread(target=lambda: out.append(float(bool(__import__("rc_NS")))))
first.start()
while not os.path.exists(signal):  # the package is being imported, its kernel not yet there
    time.sleep(0.01)


def later():
    try:
        out.append(torch.ops.NS_r.f(torch.zeros(1)).item())
    except Exception as exc:
        out.append(type(exc).__name__)


others = [threading.Thread(target=later) for _ in range(3)]
[t.start() for t in others]
[t.join(60) for t in [first, *others]]
print(json.dumps(out))
"""


@pytest.mark.parametrize("first", ["touch", "import"])
def test_touches_from_other_threads_wait_for_the_packages_import(foreign, ns, site, tmp_path,
                                                                 first) -> None:
    """bitsandbytes touches torch.ops.bitsandbytes while its import (the first touch, or its
    user's ``import bitsandbytes``, in one thread) registers: torch caches the namespace then,
    and other threads used to reach its ops through it -- defined, their CPU kernels not yet
    registered: NotImplementedError.  The namespace stays out of torch.ops until the import is
    done, and their touches wait for it."""
    import os
    import subprocess

    foreign({f"rc_{ns}/__init__.py": f"""
        import os
        import time
        import torch
        lib = torch.library.Library("{ns}_r", "DEF")
        lib.define("f(Tensor x) -> Tensor")
        torch.ops.{ns}_r.f   # the package uses its own op while it registers
        open(os.environ["RACE_SIGNAL"], "w").close()
        time.sleep(1.0)
        lib.impl("f", lambda x: x + 1, "CPU")
    """}, name=f"rc-{ns}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *sys.path]),
           "RACE_SIGNAL": str(tmp_path / "importing"), "RACE_FIRST": first}
    out = subprocess.run([sys.executable, "-c", RACE_PROBE.replace("NS", ns)],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.splitlines()[-1]) == [1.0, 1.0, 1.0, 1.0]


def test_a_registry_unloaded_adopts_nothing_more(foreign, dists: DistFactory, ns) -> None:
    foreign()
    registry = load(dists)
    registry.unload()
    with pytest.raises(AttributeError):
        getattr(torch.ops, ns).scale
    assert f"fp_{ns}" not in sys.modules


def test_opregistry_plugins_are_never_adopted(dists: DistFactory, ns, site) -> None:
    dists.make(f"pl-{ns}", ops={"ops": f"pl_{ns}:lib"}, modules={f"pl_{ns}": f"""
        from opregistry import OpLibrary
        lib = OpLibrary({ns!r})
        lib.define("op(Tensor x) -> Tensor", kernels={{"cpu": "pl_{ns}:op"}})
        def op(x):
            return x
    """})
    assert all(not a.name.startswith("pl-") for a in plan(dists).adoptions)


def test_an_adopted_op_is_checked_over_its_adapters_samples(foreign, dists: DistFactory,
                                                             ns) -> None:
    """opregistry check: opcheck of an adopted op, on the samples an adapter declares."""
    from opregistry.checking import run_checks

    name = foreign()
    dists.make(f"ad-{ns}", ops={"adopt": f"ad_{ns}"},
               modules={f"ad_{ns}": ADAPTER.format(dist=name, ns=ns)})
    registry = load(dists)
    results, unknown = run_checks(registry, [f"{ns}::scale"])
    assert not unknown
    checks = {(r.check, r.status) for r in results}
    assert ("test_schema", "ok") in checks and ("test_faketensor", "ok") in checks
    assert all(r.status != "fail" for r in results), results
    assert {r.distribution for r in results} == {f"{name}==1.0"}


def _overrider(dists: DistFactory, ns: str) -> str:
    """An op package adding, with override=True, a CPU kernel to the adopted ``ns::scale``."""
    return dists.make(f"ovr-{ns}", ops={"ops": f"ovr_{ns}:lib"}, modules={f"ovr_{ns}": f"""
        from opregistry import OpLibrary
        lib = OpLibrary({ns!r}, "IMPL")
        lib.impl("scale", "cpu", "ovr_{ns}:scale", override=True)
        def scale(x, f):
            return x * f + 7
    """})


def test_an_allowed_override_waiting_for_its_package_is_not_drift(
        foreign, dists: DistFactory, ns, monkeypatch) -> None:
    """Before the package is imported, the override waits for it (registered right after the
    package's own): drift() -- doctor --live -- must not call it unregistered."""
    foreign()
    _overrider(dists, ns)
    monkeypatch.setenv("OPREGISTRY_ALLOW_OVERRIDE", ns)
    registry = load(dists)
    assert f"fp_{ns}" not in sys.modules
    assert registry.drift() == ()
    assert getattr(torch.ops, ns).scale(torch.ones(1), 3.0).item() == 10.0  # the override
    assert registry.drift() == ()


def test_list_and_show_of_an_adopted_op_name_the_kernel_that_overrides_it(
        foreign, dists: DistFactory, ns, monkeypatch, scoped, capsys) -> None:
    """An op package's allowed override of an adopted op: the op stays the package's, with
    its kernels; the override is listed under it, and the kernel it replaces says by whom."""
    from opregistry.cli import main

    name = foreign()
    over = _overrider(dists, ns)
    monkeypatch.setenv("OPREGISTRY_ALLOW_OVERRIDE", ns)
    scoped()
    assert main(["show", f"{ns}::scale"]) == 0
    text = capsys.readouterr().out
    assert "defined by torch" not in text
    assert f"{name}==1.0, adopted" in text and f"fp_{ns}.backends.cpu:4" in text
    assert f"overridden by {over}==1.0 (allowed by policy)" in text
    assert f"ovr_{ns}:scale" in text and f"overrides {name}==1.0" in text
    assert main(["show", f"{ns}::scale", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    schemas = doc_schemas()
    assert not schema_errors(data, schemas["show"], schemas["types"])
    [op] = data["adopted"][0]["ops"]
    [added] = op["kernels_added"]
    assert (added["key"], added["distribution"]["name"], added["overrides"]["name"]) == (
        "CPU", over, name)
    assert {k["key"]: k["overridden_by"] for k in op["kernels"]}["CPU"] == {
        "name": over, "version": "1.0"}
    assert data["external_kernels"] == [added]

    assert main(["list", "-n", ns]) == 0
    text = capsys.readouterr().out
    assert "Kernels for torch's own ops" not in text
    adopted = text[text.index("Adopted ("):]
    assert f"ovr_{ns}:scale ({over}==1.0)" in adopted
    assert f"overridden by {over}==1.0" in adopted


def test_live_views_of_a_namespace_adopted_lazily_and_not_imported_say_so(
        foreign, dists: DistFactory, ns, scoped, capsys) -> None:
    """list --live / show --live import no adopted package: they say how to see its ops."""
    from opregistry.cli import main

    foreign()
    scoped()
    note = (f"adopted lazily, not imported in this process: pass --import fp_{ns} "
            f"(or touch torch.ops.{ns})")
    assert main(["list", "--live", "-n", ns]) == 0
    text = capsys.readouterr().out
    assert note in text and "none declared" not in text
    assert main(["list", "--live", "-n", ns, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    schemas = doc_schemas()
    assert not schema_errors(data, schemas["list"], schemas["types"])
    assert data["live_not_imported"] == {ns: [f"fp_{ns}"]}
    assert main(["show", "--live", f"{ns}::scale"]) == 0
    assert note in capsys.readouterr().out
    assert f"fp_{ns}" not in sys.modules
    assert main(["show", "--live", "--import", f"fp_{ns}", f"{ns}::scale"]) == 0
    text = capsys.readouterr().out
    # imported: the adopted view (what its files say) and the dispatcher's, side by side
    assert "not imported in this process" not in text and "adopted:" in text
    assert "Live dispatcher (torch)" in text and "CPU" in text.split("Live dispatcher")[1]
    assert main(["show", "--live", "--import", f"fp_{ns}", f"{ns}::scale", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert not schema_errors(data, schemas["show"], schemas["types"])
    assert data["adopted"] and [row["op"] for row in data["live_ops"]] == [f"{ns}::scale"]


def _two_ops(ns: str) -> dict[str, str]:
    """A package defining ``ns::scale`` and ``ns::shift`` at its import."""
    return {f"fp_{ns}/__init__.py": f"""
        import torch

        torch.library.define("{ns}::scale", "(Tensor x, float f) -> Tensor")
        torch.library.define("{ns}::shift", "(Tensor x, float f) -> Tensor")


        @torch.library.register_kernel("{ns}::scale", "cpu")
        def _(x, f):
            return x * f


        @torch.library.register_fake("{ns}::scale")
        def _(x, f):
            return torch.empty_like(x)


        @torch.library.register_kernel("{ns}::shift", "cpu")
        def _(x, f):
            return x + f
    """}


def test_check_of_an_adopted_namespace_lists_its_ops_skipped_without_samples(
        foreign, dists: DistFactory, ns, scoped, capsys) -> None:
    """``check ns`` / ``check ns::op`` of an adopted package without samples: its ops are
    listed as skipped (how to declare samples said), exit 0 -- not "no op or namespace"."""
    from opregistry.cli import main

    name = foreign(_two_ops(ns))
    scoped()
    for target in (ns, f"{ns}::shift", f"torch.ops.{ns}.shift"):
        assert main(["check", target, "--json", "-q"]) == 0, target
        data = json.loads(capsys.readouterr().out)
        assert not schema_errors(data, doc_schemas()["check"], doc_schemas()["types"])
        wanted = {f"{ns}::scale", f"{ns}::shift"} if target == ns else {f"{ns}::shift"}
        assert {r["op"] for r in data["results"]} == wanted
        for r in data["results"]:
            assert (r["check"], r["status"]) == ("samples", "skip")
            assert "Adoption(samples=" in r["message"] and f"{name}==1.0" in r["message"]
            assert r["distribution"] == {"name": name, "version": "1.0"}
    assert f"fp_{ns}" not in sys.modules  # nothing to check: nothing imported
    assert main(["check", ns, "-q"]) == 0
    assert "nothing checked: 2 op(s) skipped, see the table" in capsys.readouterr().out


SAMPLES_ADAPTER = """
from opregistry import Adoption


def opregistry_adoptions():
    return [Adoption(distribution={dist!r}, samples={samples!r})]


def samples():
    import torch
    return [((torch.ones(2), 2.0), {{}})]
"""


def test_the_adopted_ops_an_adapter_gives_no_samples_are_listed_skipped(
        foreign, dists: DistFactory, ns) -> None:
    from opregistry.checking import run_checks

    name = foreign(_two_ops(ns))
    dists.make(f"ad-{ns}", ops={"adopt": f"ad_{ns}"}, modules={f"ad_{ns}": SAMPLES_ADAPTER.format(
        dist=name, samples={f"{ns}::scale": f"ad_{ns}:samples"})})
    results, unknown = run_checks(load(dists), [ns])
    assert not unknown
    by_op: dict[str, set[tuple[str, str]]] = {}
    for r in results:
        by_op.setdefault(r.op, set()).add((r.check, r.status))
    assert ("test_schema", "ok") in by_op[f"{ns}::scale"]
    assert by_op[f"{ns}::shift"] == {("samples", "skip")}


def test_bad_adapter_samples_are_problems_of_the_adapter_and_check_blames_it(
        foreign, dists: DistFactory, ns) -> None:
    """Samples for an op the package does not define, a reference that does not resolve:
    reported before torch (the adapter, its entry point, "did you mean"), and a failure of
    ``check`` attributed to the adapter, not to the adopted package."""
    from opregistry.checking import run_checks

    name = foreign(_two_ops(ns))
    adapter = dists.make(f"ad-{ns}", ops={"adopt": f"ad_{ns}"}, modules={
        f"ad_{ns}": SAMPLES_ADAPTER.format(dist=name, samples={
            f"{ns}::scal": f"ad_{ns}:samples", f"{ns}::shift": f"ad_{ns}:missing"})})
    [unknown_op] = [p for p in plan(dists).problems if p.code == "adoption-samples-unknown-op"]
    assert [o.distribution for o in unknown_op.culprits] == [adapter]
    assert f"entry point 'adopt = ad_{ns}'" in unknown_op.message
    assert f"for {ns}::scal, which is not an op of {name}==1.0" in unknown_op.message
    assert f"did you mean '{ns}::scale'?" in unknown_op.message
    assert unknown_op.source and unknown_op.source.endswith(f"ad_{ns}.py:6")
    resolved = plan(dists, references=True)
    [ref] = [p for p in resolved.problems if p.code == "adoption-samples-ref-invalid"]
    assert [o.distribution for o in ref.culprits] == [adapter] and ref.op == f"{ns}::shift"
    assert f"'ad_{ns}:missing'" in ref.message and "has no attribute 'missing'" in ref.message
    assert not resolved.excluded  # only check imports samples: nobody is left out

    registry = load(dists)
    results, _ = run_checks(registry, [ns])
    failed = {r.op: r for r in results if r.status == "fail"}
    assert set(failed) == {f"{ns}::scal", f"{ns}::shift"}
    for r in failed.values():
        assert r.distribution.startswith(f"{adapter}==1.0 (entry point"), r
    rows = report.check_report(registry.plan, results)["results"]
    assert {r["distribution"]["name"] for r in rows if r["status"] == "fail"} == {adapter}


def test_an_op_the_scan_cannot_name_is_found_beside_an_op_packages_fragment(
        foreign, dists: DistFactory, ns, monkeypatch) -> None:
    """vLLM's ``direct_register_custom_op``: ops named at run time in a module-level FRAGMENT
    library, and an op package adding an op of its own to that namespace (allowed).  The op
    package's registration at load makes ``torch.ops.<ns>`` before any touch of it, so the
    touch never comes; the first lookup of an op the scan cannot name imports the package."""
    monkeypatch.setenv(f"FP_OP_{ns}", "half")
    files = {f"fp_{ns}/__init__.py": f"""
        import os

        import torch

        _lib = torch.library.Library("{ns}", "FRAGMENT")


        def register(name, fn):
            _lib.define(name + "(Tensor x) -> Tensor")
            _lib.impl(name, fn, "CompositeExplicitAutograd")


        register("double", lambda x: x * 2)
        register(os.environ["FP_OP_{ns}"], lambda x: x / 2)
    """}
    name = foreign(files)
    op_dist(dists, f"frag-{ns}", ns, 'lib.define("triple(Tensor x) -> Tensor", '
            'kernels={"cpu": "KMOD:twice"}, fake="KMOD:clone")\n', kind="FRAGMENT")
    registry = load(dists)
    assert not registry.errors and registry.plan.adopted(name).status == "adopted"
    assert f"fp_{ns}" not in sys.modules
    assert getattr(torch.ops, ns).half(torch.ones(1)).item() == 0.5
    assert f"fp_{ns}" in sys.modules and registry.adopter.outcomes[name] == "imported"
    assert getattr(torch.ops, ns).triple(torch.ones(1)).item() == 2.0
    with pytest.raises(AttributeError) as missing:  # imported: torch's own message
        getattr(torch.ops, ns).thrice
    assert str(missing.value) == f"'_OpNamespace' '{ns}' object has no attribute 'thrice'"
