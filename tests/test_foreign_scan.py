"""The static scan of packages that register with torch by themselves, against torch's dispatcher.

The distributions of tests/foreign_dists.py (one per registration style,
pip-installed into a folder of their own) are scanned without importing
them, then imported in a fresh interpreter: what the scan predicts must be
what torch's dispatcher holds afterwards, and what it cannot read must say
so, with file and line.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opregistry.foreign import STRIPPED_API, ForeignDistribution, ForeignScan, Registration
from opregistry.keys import RESERVED_NAMESPACES
from opregistry.scan.elf import open_elf
from opregistry.scan.native import scan_library
from opregistry.scan.pysource import scan_modules
from opregistry.scan.pyvalues import ModuleSource

from . import adoption_dists, foreign_dists

NAMES = sorted(foreign_dists.DISTRIBUTIONS)

#: imports each module named in argv in turn, in one interpreter, and reports the ops each
#: added to torch's dispatcher with the keys that have a kernel
GROUND_TRUTH = """
import json, sys, importlib
import torch
keys = ("CPU", "CUDA", "Meta", "Autograd", "FuncTorchBatched", "AutocastCPU",
        "CompositeExplicitAutograd", "CompositeImplicitAutograd")
has = torch._C._dispatch_has_kernel_for_dispatch_key
out = {}
for name in sys.argv[1:]:
    before = set(torch._C._dispatch_get_all_op_names())
    importlib.import_module(name)
    new = sorted(set(torch._C._dispatch_get_all_op_names()) - before)
    out[name] = {op: [k for k in keys if has(op, k)] for op in new}
print(json.dumps(out))
"""

SCAN = """
import json, sys
from opregistry.scan import scan_installed
print(json.dumps(scan_installed(only=sys.argv[1:]).to_dict()))
"""


def _env(site: Path, cache: Path | None = None) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(site), "OPREGISTRY_AUTOLOAD": "0"}
    if cache is None:
        env["OPREGISTRY_CACHE"] = "0"
    else:
        env["OPREGISTRY_CACHE_DIR"] = str(cache)
    return env


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, native_libraries: dict[str, Path]) -> Path:
    """The synthetic foreign distributions, pip-installed into a folder of their own."""
    root = tmp_path_factory.mktemp("foreign")
    foreign_dists.install(root / "site", root / "work", native_libraries)
    return root / "site"


@pytest.fixture(scope="module")
def scan(site: Path) -> ForeignScan:
    out = subprocess.run([sys.executable, "-c", SCAN, *NAMES], capture_output=True, text=True,
                         env=_env(site), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return ForeignScan.from_dict(json.loads(out.stdout))


@pytest.fixture(scope="module")
def real(site: Path) -> dict[str, dict[str, list[str]]]:
    """package -> {op: [keys with a kernel]} of what importing it registers (torch's own
    namespaces, which importing torch's submodules fills, left out)."""
    out = subprocess.run([sys.executable, "-c", GROUND_TRUTH, *foreign_dists.EXPECTED_OPS],
                         capture_output=True, text=True, env=_env(site), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout)
    return {pkg: {op: keys for op, keys in ops.items()
                  if op.split("::")[0] not in RESERVED_NAMESPACES} for pkg, ops in found.items()}


def _dist(scan: ForeignScan, name: str) -> ForeignDistribution:
    found = scan.get(name)
    assert found is not None, f"{name} not scanned: {[d.name for d in scan.distributions]}"
    return found


def _kernels(dist: ForeignDistribution) -> set[tuple[str, str]]:
    return {(r.op, r.key) for r in dist.registrations if r.kind == "kernel" and r.op and r.key}


def test_the_fixtures_register_what_they_say(real: dict[str, dict[str, list[str]]]) -> None:
    """Imported for real, each synthetic package registers exactly its expected ops."""
    for package, ops in foreign_dists.EXPECTED_OPS.items():
        assert set(real[package]) == ops, package


@pytest.mark.parametrize("dist,package", [("fx-pylib", "fx_pylib"),
                                          ("fx-customop", "fx_customop"),
                                          ("fx-aliases", "fx_aliases"),
                                          ("fx-native-single", "fx_native_single"),
                                          ("fx-ext", "fx_ext"),
                                          ("fx-undeclared", "fx_undeclared")])
def test_predicted_ops_are_the_real_ones(scan: ForeignScan, real: dict[str, dict[str, list[str]]],
                                         dist: str, package: str) -> None:
    """Python ``Library`` / ``custom_op`` / aliases / a one-namespace C++ library: same ops."""
    found = _dist(scan, dist)
    assert found.ops() == set(real[package])
    assert found.namespaces("DEF", "FRAGMENT", "op") == {o.split("::")[0] for o in real[package]}
    assert not [r for r in found.registrations if r.unresolved and r.at_import
                and r.kind != "load_library"]


@pytest.mark.parametrize("dist,package", [("fx-native", "fx_native"),
                                          ("fx-native-single", "fx_native_single")])
def test_cpp_impl_blocks_are_in_the_dispatcher(scan: ForeignScan,
                                               real: dict[str, dict[str, list[str]]],
                                               dist: str, package: str) -> None:
    """Each ``TORCH_LIBRARY_IMPL(ns, key)`` block found gives kernels for ``key`` in ``ns``."""
    blocks = {(r.namespace, r.key) for r in _dist(scan, dist).registrations if r.kind == "IMPL"}
    assert blocks
    for ns, key in blocks:
        assert any(op.split("::")[0] == ns and key in keys
                   for op, keys in real[package].items()), (ns, key)


@pytest.mark.parametrize("dist,package", [("fx-pylib", "fx_pylib"),
                                          ("fx-customop", "fx_customop"),
                                          ("fx-aliases", "fx_aliases")])
def test_predicted_kernels_are_in_the_dispatcher(scan: ForeignScan,
                                                 real: dict[str, dict[str, list[str]]],
                                                 dist: str, package: str) -> None:
    """Every kernel the scan predicts is registered, for the key it names."""
    kernels = _kernels(_dist(scan, dist))
    assert kernels
    missing = sorted(k for k in kernels if k[1] not in real[package].get(k[0], []))
    assert not missing


def test_decorator_stacks_and_custom_op_methods(scan: ForeignScan) -> None:
    """``@register_fake`` over ``@register_kernel``, ``@op.register_fake``, ``op.register_autograd``."""
    kernels = _kernels(_dist(scan, "fx-customop"))
    assert {("fx_custom::triple", "Meta"), ("fx_custom::triple", "CPU"),
            ("fx_custom::triple", "CUDA"), ("fx_custom::triple", "FuncTorchBatched"),
            ("fx_custom::triple", "AutocastCPU"), ("fx_custom::double", "Meta"),
            ("fx_custom::double", "Autograd"), ("fx_custom::quad", "Meta"),
            ("fx_custom::quad", "CompositeExplicitAutograd"),
            ("fx_custom::tri", "CompositeExplicitAutograd")} <= kernels


def test_library_kinds_and_lines(scan: ForeignScan, site: Path) -> None:
    """DEF, FRAGMENT and IMPL libraries, each at the line of its call, in the module imported."""
    regs = _dist(scan, "fx-pylib").registrations
    libs = {(r.kind, r.namespace, r.key) for r in regs if r.kind in ("DEF", "FRAGMENT", "IMPL")}
    assert libs == {("DEF", "fx_pylib", None), ("FRAGMENT", "fx_pylib_frag", None),
                    ("IMPL", "fx_pylib_frag", "Meta")}
    source = (site / "fx_pylib" / "__init__.py").read_text().splitlines()
    for reg in regs:
        assert reg.module == "fx_pylib" and reg.file == str(site / "fx_pylib" / "__init__.py")
        assert reg.line is not None and reg.at_import
        text = source[reg.line - 1]
        assert ("Library(" in text) if reg.kind in ("DEF", "FRAGMENT", "IMPL") else (
            ".define(" in text or "impl(" in text), (reg, text)


def test_aliases_across_modules_and_helpers(scan: ForeignScan, site: Path) -> None:
    """bitsandbytes' layout: the alias bound in ``_ops`` registers from ``backends/cpu.py``;
    a helper's op is attributed to the line that calls it."""
    regs = _dist(scan, "fx-aliases").registrations
    gemm = [r for r in regs if r.op == "fx_alias::gemm" and r.kind == "kernel"]
    assert [(r.module, r.key, r.api) for r in gemm] == [
        ("fx_aliases.backends.cpu", "CPU", "torch.library.register_kernel")]
    named = [(r.kind, r.key, r.line) for r in regs if r.op == "fx_alias::from_name"]
    decorated = _line(site / "fx_aliases" / "_ops.py", "@register_named")
    assert named == [("op", None, decorated), ("kernel", "CompositeExplicitAutograd", decorated)]
    helper = [r for r in regs if r.op == "fx_alias::helper_op" and r.kind == "op"]
    assert [r.line for r in helper] == [_line(site / "fx_aliases" / "_ops.py",
                                              '_define("helper_op"')]
    assert "through fx_aliases._ops._define" in helper[0].how
    # the helper's own body, seen alone, names its op by a parameter: said, not guessed
    inside = [r for r in regs if r.kind == "op" and not r.at_import and r.api.endswith("define")]
    assert inside and all(r.op is None and "parameter" in r.unresolved for r in inside)


def _line(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def test_a_dynamic_namespace_is_unresolved_with_its_line(scan: ForeignScan, site: Path,
                                                         real: dict[str, dict[str, list[str]]]
                                                         ) -> None:
    """A namespace read from the environment: no namespace predicted, the call named."""
    found = _dist(scan, "fx-dynamic")
    assert set(real["fx_dynamic"]) == {"fx_dyn::op"}  # what the scan could not know
    assert found.namespaces() == frozenset() and found.ops() == frozenset()
    [lib] = [r for r in found.registrations if r.kind == "FRAGMENT"]
    module = site / "fx_dynamic" / "__init__.py"
    assert lib.source == f"{module}:{_line(module, 'Library(')}"
    assert "os.environ.get" in lib.unresolved and lib.namespace is None


def test_cpp_library_namespaces_keys_and_loader(scan: ForeignScan, site: Path,
                                                real: dict[str, dict[str, list[str]]]) -> None:
    """TORCH_LIBRARY / _FRAGMENT / _IMPL from the symbols; the module that loads the library."""
    found = _dist(scan, "fx-native")
    blocks = {(r.kind, r.namespace, r.key) for r in found.registrations
              if r.kind in ("DEF", "FRAGMENT", "IMPL")}
    assert blocks == {("DEF", "fx_native", None), ("FRAGMENT", "fx_native_frag", None),
                      ("IMPL", "fx_native", "CPU"),
                      ("IMPL", "fx_native_frag", "CompositeExplicitAutograd")}
    library = str(site / "fx_native" / "_C.so")
    for reg in found.registrations:
        if reg.kind != "load_library":
            assert (reg.file, reg.module, reg.line) == (library, "fx_native", None)
            assert reg.how.startswith("loaded by torch.ops.load_library at ")
    ops = {r.op for r in found.registrations if r.kind == "op"}
    assert ops == {"fx_native_frag::frag_op", None}
    # the unqualified schema strings could be either namespace's: both named, none chosen
    vague = [r for r in found.registrations if r.kind == "op" and r.op is None]
    assert sorted(r.name for r in vague) == ["scale", "scale"]
    assert all("fx_native, fx_native_frag" in r.unresolved for r in vague)
    assert {f"fx_native::{r.name}" + (f".{r.overload}" if r.overload else "")
            for r in vague} | {"fx_native_frag::frag_op"} == set(real["fx_native"])


def test_an_extension_module_is_attributed_to_the_module_importing_it(scan: ForeignScan,
                                                                     site: Path) -> None:
    """``from . import _ext``: importing ``fx_ext`` runs the library's registrations."""
    found = _dist(scan, "fx-ext")
    assert {(r.kind, r.namespace, r.op, r.module, r.how) for r in found.registrations} == {
        (kind, "fx_ext", op, "fx_ext", "imports the extension module fx_ext._ext")
        for kind, op in (("DEF", None), ("IMPL", None), ("op", "fx_ext::triple"))}
    assert all(Path(r.file).parent == site / "fx_ext" for r in found.registrations)


def test_a_library_of_the_older_registration_api_is_read_from_its_schemas(
        scan: ForeignScan, real: dict[str, dict[str, list[str]]]) -> None:
    """``c10::RegisterOperators().op("ns::name(...) -> ...")`` (torchvision's ``image`` up to
    0.28): no macro block; its namespace and ops from the qualified strings, an op given by
    its name alone included -- what torch holds once the library is loaded."""
    found = _dist(scan, "fx-legacy")
    regs = [r for r in found.registrations if r.kind != "load_library"]
    assert {(r.kind, r.namespace, r.op, r.api) for r in regs} == {
        ("FRAGMENT", "fx_legacy", None, "c10::RegisterOperators"),
        ("op", "fx_legacy", "fx_legacy::decode", "m.def"),
        ("op", "fx_legacy", "fx_legacy::named", "c10::RegisterOperators.op")}
    assert not any(r.unresolved for r in regs) and {r.module for r in regs} == {"fx_legacy"}
    assert set(real["fx_legacy"]) == found.ops()


def test_stripped_library_is_unresolved(scan: ForeignScan) -> None:
    """Without ``.symtab`` the namespace is unknown: said, plus the one qualified schema string."""
    found = _dist(scan, "fx-native-stripped")
    kinds = {(r.kind, r.namespace, r.op) for r in found.registrations if r.kind != "load_library"}
    assert kinds == {("library", None, None), ("op", "fx_single", "fx_single::hidden")}
    assert all(r.unresolved for r in found.registrations if r.kind != "load_library")


HINTED = '''
import os

import torch

torch.ops.load_library(os.path.join(os.path.dirname(__file__), "libfxhinted.so"))


@torch.library.register_fake("fx_single::plain")
def _(x):
    return torch.empty_like(x)


elsewhere = torch.library.Library("fx_elsewhere", "FRAGMENT")
elsewhere.define("op(Tensor x) -> Tensor")
'''

TOUCH_HINTED = """
import json, sys
import torch
from opregistry import plan, report
adopted = report.list_report(plan(), namespaces=["fx_single"])["adopted"]
out = torch.ops.fx_single.plain(torch.ones(2))
print(json.dumps({"adopted": [(a["distribution"]["name"], a["namespaces"]) for a in adopted],
                  "ops": [(op["name"], op["schema"], [k["key"] for k in op["kernels"]])
                          for a in adopted for op in a["ops"]],
                  "out": out.tolist(), "imported": "fx_hinted" in sys.modules}))
"""


def test_a_stripped_library_holds_the_namespace_its_package_registers_in(
        native_libraries: dict[str, Path], tmp_path: Path) -> None:
    """fbgemm-gpu's layout: C++ libraries stripped of their symbols, whose ops the package's
    Python gives fake kernels.  The namespace its Python names and the library holds as a
    string (``TORCH_LIBRARY(fx_single, m)`` passes ``"fx_single"`` to torch) is the
    library's: adopted (the first touch loads it, the op dispatches) and protected; one the
    library does not hold is not given to it."""
    library = tmp_path / "libfxhinted.so"
    foreign_dists._strip(native_libraries["foreign_single"], library)
    site = tmp_path / "site"
    adoption_dists.write(site, "fx-hinted", {"fx_hinted/__init__.py": HINTED,
                                             "fx_hinted/libfxhinted.so": library.read_bytes()})
    out = subprocess.run([sys.executable, "-c", SCAN, "fx-hinted"], capture_output=True,
                         text=True, env=_env(site), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    (dist,) = ForeignScan.from_dict(json.loads(out.stdout)).distributions
    assert {(r.kind, r.namespace, r.unresolved) for r in dist.registrations
            if r.file.endswith(".so")} == {
        ("library", "fx_single", ""),
        ("op", "fx_single", "read from the strings of a stripped library")}
    # the listing says where the namespace came from, and the claim is the weaker kind
    assert {(r.api, r.inferred) for r in dist.registrations if r.kind == "library"} == {
        (STRIPPED_API, True)}
    assert _kernels(dist) == {("fx_single::plain", "Meta")}
    assert dist.ops() == {"fx_elsewhere::op", "fx_single::hidden"}
    touched = subprocess.run([sys.executable, "-c", TOUCH_HINTED], capture_output=True,
                             text=True, env={**_env(site, tmp_path / "cache"),
                                             "OPREGISTRY_AUTOLOAD": "1"}, timeout=300)
    assert touched.returncode == 0, touched.stderr[-3000:]
    # plain: defined in the library (its schema string unqualified, not read), named by the
    # fake kernel; hidden: the qualified schema string
    assert json.loads(touched.stdout.splitlines()[-1]) == {
        "adopted": [["fx-hinted", {"fx_single": ["fx_hinted"]}]], "out": [2.0, 2.0],
        "ops": [["fx_single::hidden", "(Tensor x) -> Tensor", []],
                ["fx_single::plain", None, ["Meta"]]], "imported": True}
    listed = subprocess.run([sys.executable, "-m", "opregistry", "list", "-n", "fx_single"],
                            capture_output=True, text=True, env=_env(site, tmp_path / "cache"),
                            timeout=300)
    assert "fx_single::plain  (defined where the scan cannot read it" in listed.stdout, \
        listed.stdout[-2000:]


TWO_LOADS_TOUCH = """
import json, sys
import torch
out = torch.ops.fx_single.plain(torch.ones(2))
print(json.dumps({"out": out.tolist(), "loaders": sorted(m for m in sys.modules
                                                        if m.startswith("fx_twoloads."))}))
"""


def test_a_library_loaded_by_a_computed_path_goes_to_the_module_naming_its_file(
        native_libraries: dict[str, Path], tmp_path: Path) -> None:
    """executorch 1.5's layout: a command-line script loads a library named by an argument
    (``load_library(args.so_library)``, in a function), and the module beside the library
    finds it with ``glob("*fxsingle_aot.*")``.  The library is the globbing module's: the
    first touch imports it, not the script that comes first in the distribution."""
    site = tmp_path / "site"
    adoption_dists.write(site, "fx-twoloads", {
        "fx_twoloads/__init__.py": "",
        "fx_twoloads/a_cli.py": textwrap.dedent("""
            import sys
            import torch
            def main():
                if len(sys.argv) > 1:
                    torch.ops.load_library(sys.argv[1])
        """),
        "fx_twoloads/kernels/__init__.py": textwrap.dedent("""
            from pathlib import Path
            import torch
            for _lib in Path(__file__).parent.glob("*fxsingle_aot.*"):
                torch.ops.load_library(_lib)
        """),
        "fx_twoloads/kernels/libfxsingle_aot.so": native_libraries["foreign_single"].read_bytes()})
    out = subprocess.run([sys.executable, "-c", SCAN, "fx-twoloads"], capture_output=True,
                         text=True, env=_env(site), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    (dist,) = ForeignScan.from_dict(json.loads(out.stdout)).distributions
    from_library = {(r.module, r.how) for r in dist.registrations if r.file.endswith(".so")}
    assert len(from_library) == 1, from_library
    [(module, how)] = from_library
    assert module == "fx_twoloads.kernels"
    assert how.endswith("in a module that names the library's file (fxsingle_aot)"), how
    touched = subprocess.run([sys.executable, "-c", TWO_LOADS_TOUCH], capture_output=True,
                             text=True, env={**_env(site, tmp_path / "cache"),
                                             "OPREGISTRY_AUTOLOAD": "1"}, timeout=300)
    assert touched.returncode == 0, touched.stderr[-3000:]
    assert json.loads(touched.stdout.splitlines()[-1]) == {
        "out": [2.0, 2.0], "loaders": ["fx_twoloads.kernels"]}


def test_a_distribution_without_record_nor_top_level_is_found_by_its_name(
        tmp_path: Path) -> None:
    """A ``.dist-info`` with neither ``RECORD`` nor ``top_level.txt`` (hatchling and flit
    write no ``top_level.txt``; a hand-made or vendored install no ``RECORD``): its package
    is the one named after it, beside its ``.dist-info`` -- not one of that name elsewhere on
    ``sys.path``."""
    source = """
        import torch
        torch.library.define("fx_noreco::neg", "(Tensor x) -> Tensor")
    """
    site, elsewhere = tmp_path / "site", tmp_path / "elsewhere"
    adoption_dists.write(site, "fx-noreco", {"fx_noreco/__init__.py": source})
    adoption_dists.write(site, "fx-moved", {"other_name/__init__.py": source.replace(
        "fx_noreco::", "fx_moved::")})
    (elsewhere / "fx_moved").mkdir(parents=True)  # a package named after it, not its own
    (elsewhere / "fx_moved" / "__init__.py").write_text(textwrap.dedent(source).replace(
        "fx_noreco::", "fx_elsewhere::"))
    for info in site.glob("*.dist-info"):
        (info / "RECORD").unlink()
        (info / "top_level.txt").unlink()
    env = {**_env(site), "PYTHONPATH": f"{site}{os.pathsep}{elsewhere}"}
    out = subprocess.run([sys.executable, "-c", SCAN, "fx-noreco", "fx-moved"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    found = {d.name: d for d in ForeignScan.from_dict(json.loads(out.stdout)).distributions}
    assert found["fx-noreco"].ops() == {"fx_noreco::neg"}
    assert found["fx-moved"].ops() == frozenset()


def test_plugins_are_scanned_and_marked(scan: ForeignScan) -> None:
    """An opregistry op package that also makes a raw ``Library(..., "DEF")`` is seen, marked."""
    found = _dist(scan, "fx-plugin")
    assert found.plugin_groups == ("opregistry.ops",) and found.requires_torch
    assert {(r.kind, r.namespace, r.module) for r in found.registrations} == {
        ("DEF", "fx_plugin8", "fx_plugin.ops"), ("op", "fx_plugin8", "fx_plugin.ops")}


def test_which_distributions_are_scanned(scan: ForeignScan) -> None:
    """Torch users are scanned (by metadata, or because their files mention torch); others not."""
    names = {d.name for d in scan.distributions}
    assert "fx-notorch" not in names and scan.skipped == 1
    assert names == set(NAMES) - {"fx-notorch"}
    undeclared = _dist(scan, "fx-undeclared")
    assert not undeclared.requires_torch and undeclared.ops() == {"fx_undeclared::quiet"}


def test_which_module_to_import_for_a_namespace(scan: ForeignScan) -> None:
    """The modules whose import registers a namespace: definitions at import first."""
    assert [(d.name, m) for d, m in scan.importers("fx_alias")] == [
        ("fx-aliases", "fx_aliases._ops"), ("fx-aliases", "fx_aliases.backends.cpu")]
    assert [(d.name, m) for d, m in scan.importers("fx_native")] == [("fx-native", "fx_native")]
    assert scan.importers("no_such_namespace") == []


def test_records_round_trip_through_json(scan: ForeignScan) -> None:
    assert ForeignScan.from_dict(json.loads(json.dumps(scan.to_dict()))) == scan


def test_registration_kind_is_checked() -> None:
    with pytest.raises(ValueError, match="kind='impl'"):
        Registration(kind="impl")


# -- the evaluator, one construct at a time ---------------------------------------


def _scan_sources(tmp_path: Path, files: dict[str, str]) -> list[Registration]:
    modules = {}
    texts = {}
    for rel, source in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
        name = rel[:-3].replace("/", ".").removesuffix(".__init__")
        modules[name] = ModuleSource(name, str(path), rel.endswith("__init__.py"))
        texts[str(path)] = path.read_bytes()
    return scan_modules(modules, texts)


@pytest.mark.parametrize("expr,op", [
    ('f"{NS}::a"', "ns1::a"),
    ('NS + "::b.out"', "ns1::b.out"),
    ('"%s::c" % NS', "ns1::c"),
    ('"{}::{}".format(NS, "d")', "ns1::d"),
    ('"{ns}::e".format(ns=NS)', "ns1::e"),
    ("PREFIX[1:] + '::f'", "ns1::f"),
    ("OPS[1]", "ns1::g"),
    ("consts.QUALIFIED", "ns1::h"),
])
def test_constant_propagation(tmp_path: Path, expr: str, op: str) -> None:
    found = _scan_sources(tmp_path, {
        "pkg/consts.py": 'NS = "ns1"\nQUALIFIED = f"{NS}::h"\n',
        "pkg/__init__.py": f"""
            import torch
            from . import consts
            from .consts import NS
            PREFIX = "_" + NS
            OPS = (f"{{NS}}::x", f"{{NS}}::g")
            torch.library.define({expr}, "(Tensor x) -> Tensor")
        """})
    assert [r.op for r in found] == [op]


@pytest.mark.parametrize("source,why", [
    ('torch.library.define(name_from_somewhere(), "(Tensor x) -> Tensor")',
     "name_from_somewhere is not assigned"),
    ('for n in read(): torch.library.define(n, "(Tensor x) -> Tensor")', "a loop variable"),
    ('X = "a"\nX = "b"\ntorch.library.define(f"ns::{X}", "(Tensor x) -> Tensor")',
     "X is assigned different values"),
    ('torch.library.define("ns::op", SCHEMA)', "the schema: SCHEMA is not assigned"),
])
def test_what_cannot_be_read_is_said(tmp_path: Path, source: str, why: str) -> None:
    found = _scan_sources(tmp_path, {"pkg/__init__.py": "import torch\n" + source + "\n"})
    assert len(found) == 1 and why in found[0].unresolved, found


def test_library_kind_that_is_not_a_constant(tmp_path: Path) -> None:
    found = _scan_sources(tmp_path, {"pkg/__init__.py": """
        import torch, os
        lib = torch.library.Library("nsk", os.environ["KIND"])
    """})
    assert [(r.kind, r.namespace) for r in found] == [("library", "nsk")]
    assert "the kind" in found[0].unresolved


def test_fallback_aliases_and_scoped_library(tmp_path: Path) -> None:
    """``impl_abstract`` as a fallback for ``register_fake``; ``_scoped_library``; conditions."""
    found = _scan_sources(tmp_path, {"pkg/__init__.py": """
        import torch
        try:
            from torch.library import register_fake
        except ImportError:
            from torch.library import impl_abstract as register_fake
        with torch.library._scoped_library("nss", "FRAGMENT") as lib:
            lib.define("s(Tensor x) -> Tensor")
        if torch.cuda.is_available():
            register_fake("nss::s")(lambda x: x)
    """})
    assert [(r.kind, r.op, r.key, r.conditional) for r in found] == [
        ("FRAGMENT", None, None, False), ("op", "nss::s", None, False),
        ("kernel", "nss::s", "Meta", True)]


def test_a_helper_imported_through_a_packages_re_export(tmp_path: Path) -> None:
    """quack-kernels 0.6.5's layout: ``from quack.dsl import cute_op``, where
    ``quack/dsl/__init__.py`` re-exports the helper from the module that calls
    ``custom_op``; and once more through the top package.  Each op is found at the line that
    calls the helper, not only the one whose module imports the helper's own module."""
    found = _scan_sources(tmp_path, {
        "rx/__init__.py": "from .dsl import my_op\nfrom . import a, b, c\n",
        "rx/dsl/__init__.py": "from rx.dsl.library_op import my_op\n",
        "rx/dsl/library_op.py": """
            import torch
            def my_op(name):
                def dec(fn):
                    return torch.library.custom_op(name, fn, mutates_args=())
                return dec
        """,
        "rx/a.py": """
            import torch
            from rx.dsl import my_op
            @my_op("rx::via_package")
            def via_package(x: torch.Tensor) -> torch.Tensor:
                return x + 1
        """,
        "rx/b.py": """
            import torch
            from rx.dsl.library_op import my_op
            @my_op("rx::via_module")
            def via_module(x: torch.Tensor) -> torch.Tensor:
                return x + 2
        """,
        "rx/c.py": """
            import torch
            from rx import my_op
            @my_op("rx::via_top")
            def via_top(x: torch.Tensor) -> torch.Tensor:
                return x + 3
        """})
    ops = {(r.op, r.module, r.line) for r in found if r.kind == "op" and r.op}
    assert ops == {("rx::via_package", "rx.a", 4), ("rx::via_module", "rx.b", 4),
                   ("rx::via_top", "rx.c", 4)}


def test_aliases_bound_by_torch_version_in_two_branches(tmp_path: Path) -> None:
    """bitsandbytes 0.46-0.49: ``register_kernel`` is ``torch.library.register_kernel`` where
    ``register_fake`` exists, ``torch.library.impl`` before; the backends import it.  Both
    bind the same call: the kernels are found, named as torch >= 2.8 runs them."""
    found = _scan_sources(tmp_path, {
        "pkg/__init__.py": "from . import _ops\nfrom .backends import cpu\n",
        "pkg/_ops.py": """
            import torch
            if hasattr(torch.library, "register_fake"):
                register_fake = torch.library.register_fake
                register_kernel = torch.library.register_kernel
            else:
                register_fake = torch.library.impl_abstract
                register_kernel = torch.library.impl
            torch.library.define("pkg::neg", "(Tensor x) -> Tensor")
            @register_fake("pkg::neg")
            def _(x):
                return torch.empty_like(x)
        """,
        "pkg/backends/__init__.py": "",
        "pkg/backends/cpu.py": """
            import torch
            from .._ops import register_kernel
            @register_kernel("pkg::neg", "cpu")
            def _(x):
                return -x
        """})
    assert {(r.key, r.api, r.module) for r in found if r.kind == "kernel"} == {
        ("Meta", "torch.library.register_fake", "pkg._ops"),
        ("CPU", "torch.library.register_kernel", "pkg.backends.cpu")}


def test_string_methods_on_known_strings_are_evaluated(tmp_path: Path) -> None:
    """torch-harmonics 0.9.3: ``f"Autocast{device_type.upper()}"`` in a helper called with
    ``"cuda"`` and ``"cpu"``."""
    found = _scan_sources(tmp_path, {"pkg/__init__.py": """
        import torch
        torch.library.define("nsu::f", "(Tensor x) -> Tensor")
        def _make(device_type):
            @torch.library.impl("nsu::f", f"Autocast{device_type.upper()}")
            def _(x):
                return x
            return _
        _make("cuda")
        _make(" cpu ".strip())
    """})
    assert {(r.key, r.unresolved) for r in found if r.kind == "kernel"} == {
        ("AutocastCUDA", ""), ("AutocastCPU", "")}


def test_a_builtins_value_is_said_to_be_known_at_run_time(tmp_path: Path) -> None:
    """``list(...)``: a built-in's value, not a name the module forgot to assign."""
    found = _scan_sources(tmp_path, {"pkg/__init__.py": """
        import torch
        from pathlib import Path
        torch.ops.load_library(list(Path(__file__).parent.glob("*.so"))[0])
    """})
    assert [(r.kind, r.unresolved) for r in found] == [
        ("load_library", "the library's path: the value of the built-in list(...) is known "
                         "only at run time")]


def test_calls_inside_functions_are_not_at_import(tmp_path: Path) -> None:
    found = _scan_sources(tmp_path, {"pkg/__init__.py": """
        import torch
        def later():
            torch.library.define("nsf::late", "(Tensor x) -> Tensor")
        class Holder:
            lib = torch.library.Library("nsf", "FRAGMENT")
    """})
    assert [(r.kind, r.op, r.at_import) for r in found] == [
        ("op", "nsf::late", False), ("FRAGMENT", None, True)]


def test_not_torch_is_not_a_registration(tmp_path: Path) -> None:
    """A ``define`` / ``impl`` / ``Library`` that is not torch's registers nothing."""
    found = _scan_sources(tmp_path, {"pkg/__init__.py": """
        import torch
        from mylib import Library, define
        Library("x", "DEF")
        define("x::y", "(Tensor x) -> Tensor")
        class Lib:
            def define(self, s): ...
        Lib().define("z(Tensor x) -> Tensor")
    """})
    assert found == []


@pytest.mark.parametrize("source", [
    '"""Define the model; a fallback impl for torch users."""\nimport torch\n',
    "import torch\n# we define an impl here, and a fallback\nx = 1\n",
    "import torch\nHELP = 'define the impl; see Library docs'\nDOC = \"\"\"\nimpl\n\"\"\"\n",
    "import torch\ns = '#'  # a hash in a string, then a comment: define impl\n",
    "import torch\nattn_implementation = 'eager'  # library\n",
    # an object or a module of the name: self.impl.forward, vllm's custom_op module
    "import torch\nfrom vllm.model_executor.custom_op import CustomOp\n"
    "class A(CustomOp):\n    def forward(self, x):\n        return self.impl .forward(x)\n",
    "import torch\nimport vllm\nx = vllm.model_executor.custom_op.A\n",
])
def test_prose_is_not_code(source: str) -> None:
    """API names in comments, docstrings and strings alone: the module is not parsed (in
    transformers, 116 modules name torch and "define", "impl" or "fallback" in prose)."""
    from opregistry.scan.pysource import _may_register

    assert not _may_register(source.encode())


@pytest.mark.parametrize("source", [
    "import torch\nlib.impl (\"nsp::a\", f)\n",
    "import torch\nregister = torch.library.register_fake\n",
    "import torch\nfrom torch.library import (custom_op,\n    impl)\n",
    "import torch\nfrom mypkg import custom_op\n",
    "import torch\nreg = lib.impl\\\n    (\"nsp::a\", \"CPU\")\n",
    "import torch\nimport torch.library as tl\ntl.Library.define(lib, \"a(Tensor x) -> Tensor\")\n",
])
def test_a_name_called_or_bound_is_code(source: str) -> None:
    """A registration name called, bound or imported (not followed by ``.`` or ``import``)
    marks the module for parsing, however it is spaced."""
    from opregistry.scan.pysource import _may_register

    assert _may_register(source.encode())


@pytest.mark.parametrize("source,found", [
    ('lib = torch.library.Library("nsp", "FRAGMENT")\n', [("FRAGMENT", None)]),
    ('from torch import library\nlibrary.define("nsp::a", "(Tensor x) -> Tensor")\n',
     [("op", "nsp::a")]),
    ('torch.library . define ("nsp::b", "(Tensor x) -> Tensor")\n', [("op", "nsp::b")]),
    ('s = "#"; torch.library.define("nsp::c", "(Tensor x) -> Tensor")  # "\n',
     [("op", "nsp::c")]),
    ('"""A docstring naming \\"""quotes\\"""."""\ntorch.library.define("nsp::d", "(Tensor x) -> '
     'Tensor")\n', [("op", "nsp::d")]),
    ("x = '''it''' + 'is'  # define\ntorch.library.define('nsp::e', '(Tensor x) -> Tensor')\n",
     [("op", "nsp::e")]),
    ('"""A line break \\\nescaped."""\ntorch.library.define("nsp::f", "(Tensor x) -> Tensor")\n'
     '"""A later docstring."""\n', [("op", "nsp::f")]),
    ('# old Mac line breaks\rtorch.library.define("nsp::g", "(Tensor x) -> Tensor")\r',
     [("op", "nsp::g")]),
])
def test_code_among_prose_is_scanned(tmp_path: Path, source: str, found: list[Any]) -> None:
    """Registrations next to strings and comments that look like code are still read."""
    regs = _scan_sources(tmp_path, {"pkg/__init__.py": "import torch\n" + source})
    assert [(r.kind, r.op) for r in regs] == found


_PROSE = st.lists(st.sampled_from([*"ab #'\"\\\n\r\t", "\\\n", "define", "impl", "Library",
                                   "library", '"""', "'''"]), max_size=40).map("".join)


def _literal(text: str, how: int) -> str:
    """``text`` as a Python string literal (five forms, one with raw backslashes) or a comment."""
    if how == 0:
        return repr(text)
    if how == 1:
        return '"""' + text.replace("\\", "\\\\").replace('"', '\\"') + '"""'
    if how == 2:
        return "'''" + text.replace("\\", "\\\\").replace("'", "\\'") + "'''"
    if how == 3:
        return repr(text.encode())
    if how == 4:  # raw backslashes: escaped line breaks and quotes
        return '"""' + text.replace('"', "'").rstrip("\\") + '"""'
    return "# " + text.replace("\n", " ").replace("\r", " ")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_PROSE, st.integers(0, 5)), max_size=6), st.integers(0, 6),
       st.booleans())
def test_the_code_filter_never_hides_code(prose: list[tuple[str, int]], at: int,
                                          register: bool) -> None:
    """Random strings, docstrings and comments full of quotes, backslashes, line breaks
    and API names around one registration: it is seen in code; without it, none is."""
    import ast
    import warnings

    from opregistry.scan.pysource import _may_register

    lines = ["import torch"] + [
        (_literal(text, how) if how == 5 else f"x = {_literal(text, how)}") for text, how in prose]
    if register:
        lines.insert(min(at, len(lines)) or 1,
                     'torch.library.define("nsq::op", "(Tensor x) -> Tensor")')
    source = "\n".join(lines) + "\n"
    with warnings.catch_warnings():  # "\\L": an invalid escape sequence, valid Python
        warnings.simplefilter("ignore")
        ast.parse(source)  # the generator writes valid Python
    assert _may_register(source.encode()) is register, source


_SOUP = st.lists(st.sampled_from([*"ab_1 #'\"\\\n\r.", '"""', "'''", "impl", "define",
                                  "register_", "fake", "lib", "rary", "op"]),
                 max_size=60).map("".join).map(str.encode)


@settings(max_examples=500, deadline=None)
@given(_SOUP, st.lists(st.sampled_from(["impl", "impl_abstract", "define", "register_fake",
                                        "_register_fake", "register_", "lib", "library", "op",
                                        "a", "b_1"]), min_size=1, max_size=5),
       st.integers(0, 80), st.integers(0, 80))
def test_names_word_is_a_whole_word_search(text: bytes, names: list[str], i: int, j: int) -> None:
    """The word search (one anchor for words sharing a prefix, the word read around each
    hit) answers as the regular expression ``\\b(?:w1|w2)\\b`` does, a match counting only
    inside ``text[start:stop]`` (its boundaries read in the whole text)."""
    import re

    from opregistry.scan.pysource import _names_word, _words

    start, stop = sorted((min(i, len(text)), min(j, len(text))))
    pattern = re.compile(rb"\b(?:" + b"|".join(re.escape(n.encode()) for n in names) + rb")\b")
    expected = False
    for k in range(start, stop + 1):
        m = pattern.match(text, k)
        if m is not None and (k == 0 or not re.match(rb"\w", text[k - 1:k])) \
                and m.end() <= stop:
            expected = True
    assert _names_word(text, _words(names), start, stop) is expected


def test_an_empty_name_is_no_word() -> None:
    """An empty name (a module named by a trailing dot) is left out of the search rather than
    found at every offset: the searches end."""
    from opregistry.scan.pysource import _names_word, _whole_words, _words

    assert not _names_word(b" x = 1\n", _words([""]))
    assert list(_whole_words(b" ab, ab.", _words(["", "ab"]))) == [(b"ab", 3), (b"ab", 7)]


@settings(max_examples=500, deadline=None)
@given(_SOUP)
def test_the_unrolled_strings_pattern_strips_what_the_plain_one_does(text: bytes) -> None:
    """Strings and comments are stripped by a pattern whose loops take a run of plain bytes
    at once; on any text, valid Python or not (an unterminated string, a lone backslash),
    it strips exactly what the plain pattern, a byte at a time, strips."""
    import re

    from opregistry.scan.pysource import _NOT_CODE

    plain = re.compile(rb'"""(?:\\.|[^\\])*?"""|' + rb"'''(?:\\.|[^\\])*?'''|"
                       rb'"(?:\\.|[^"\\\r\n])*"|' + rb"'(?:\\.|[^'\\\r\n])*'|#[^\r\n]*",
                       re.DOTALL)
    assert _NOT_CODE.sub(b"|", text) == plain.sub(b"|", text)


def test_a_scan_leaves_no_cycles(tmp_path: Path) -> None:
    """What the evaluation made is freed by reference counting, syntax trees included: the
    collector is paused during a load, and vllm's scan left ~600,000 objects to it."""
    import ast
    import gc

    from opregistry.scan.pyvalues import ModuleSource as Source, Scope

    files = {"pkg/consts.py": 'NS = "ns1"\n',
             "pkg/ops.py": "import torch\nlib = torch.library.Library('ns1', 'FRAGMENT')\n"
                           "def reg(name):\n    lib.define(name + '(Tensor x) -> Tensor')\n",
             "pkg/__init__.py": "import torch\nfrom .ops import reg, lib\nfrom .consts import NS\n"
                                "reg('a')\nfor n in ('b', 'c'):\n    reg(n)\n"
                                "@torch.library.register_fake(f'{NS}::a')\ndef _(x):\n"
                                "    return x\n"}
    gc.collect()
    gc.disable()
    try:
        found = _scan_sources(tmp_path, files)
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        left = [o for o in gc.garbage if isinstance(o, (ast.AST, Source, Scope))]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert {("op", "ns1::a"), ("op", "ns1::b"), ("op", "ns1::c"), ("kernel", "ns1::a")} <= {
        (r.kind, r.op) for r in found}
    assert left == [], f"{len(left)} scan objects in cycles"


#: registrations in every place the walks look, among code that names no registration (which
#: they skip by its lines); a raw carriage return in a string is a line break to the tokenizer
_AMONG_QUIET_CODE = {
    "pkg/_helpers.py": (
        "import torch\n"
        "def add(name):\n"
        "    torch.library.define(name, '(Tensor x) -> Tensor')\n"),
    "pkg/__init__.py": (
        "import torch\n"
        "from ._helpers import add\n"
        "NOTE = '''spans lines,\rwith a carriage return'''\n"
        "TABLE = {'a': [1, 2, 3],\n"
        "         'b': (lambda x: x + 1)}\n"
        "def quiet(x):\n"
        "    y = [i * 2 for i in range(x)]\n"
        "    return {'y': y}\n"
        "class Quiet:\n"
        "    '''Nothing here registers.'''\n"
        "    def method(self):\n"
        "        return sorted(set('abc'))\n"
        "if TABLE:\n"
        "    torch.library.define('nsw::at_module', '(Tensor x) -> Tensor')\n"
        "def later(): torch.library.define('nsw::one_line', '(Tensor x) -> Tensor')\n"
        "def outer():\n"
        "    def inner():\n"
        "        add('nsw::nested')\n"
        "    return inner\n"
        "class Holder:\n"
        "    lib = torch.library.Library('nsw', 'FRAGMENT')\n"
        "    def method(self):\n"
        "        add('nsw::in_method')\n"
        "NOTE2 = '''more lines\n"
        "\r\r\n"
        "'''\n"
        "@torch.library.register_fake('nsw::at_module')\n"
        "def _(x):\n"
        "    return x\n"
        "add('nsw::called')\n"),
}


@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"], ids=["lf", "crlf", "cr"])
def test_the_walks_skip_only_code_that_names_no_registration(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, newline: str) -> None:
    """A function or class body, or a module-level statement, whose lines name no
    registration name is not walked; what is found is what a walk of every node finds,
    whatever the file's line breaks (a node's lines are found by the tokenizer's)."""
    from opregistry.scan import pysource

    def scan(folder: Path) -> list[tuple[str, str | None, str | None, bool]]:
        modules, texts = {}, {}
        for rel, source in _AMONG_QUIET_CODE.items():
            path = folder / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(source.replace("\n", newline).encode())
            name = rel[:-3].replace("/", ".").removesuffix(".__init__")
            texts[str(path)] = path.read_bytes()
            modules[name] = ModuleSource(name, str(path), rel.endswith("__init__.py"),
                                         texts[str(path)])
        return [(r.kind, r.op, r.key, r.at_import) for r in scan_modules(modules, texts)]

    skipping = scan(tmp_path / "skipping")
    monkeypatch.setattr(pysource, "_may_hold", lambda *args: True)
    every_node = scan(tmp_path / "every")
    assert skipping == every_node
    assert {op for _, op, _, _ in skipping} >= {
        "nsw::at_module", "nsw::one_line", "nsw::nested", "nsw::in_method", "nsw::called"}
    assert ("kernel", "nsw::at_module", "Meta", True) in skipping
    assert ("FRAGMENT", None, None, True) in skipping


# -- shared libraries -------------------------------------------------------------


def test_elf_reader_agrees_with_nm(native_libraries: dict[str, Path]) -> None:
    """The pure-Python reader lists the symbol names binutils' nm lists."""
    library = native_libraries["foreign"]
    out = subprocess.run(["nm", "--defined-only", "-a", str(library)], capture_output=True,
                         text=True, check=True)
    expected = {line.split()[-1] for line in out.stdout.splitlines()
                if len(line.split()) == 3 and line.split()[1] not in "aNn"}
    elf = open_elf(str(library))
    assert elf is not None
    with elf:
        ours = {s.name for s in elf.symbols() if s.defined}
        assert not elf.symbol_names(dynamic=False) == b""
    assert expected - ours == set()


#: the one-pattern form of what :func:`opregistry.scan.native._identifiers` finds: length
#: digits, a wrapper macro's prefix (dropped), torch's identifier
_REFERENCE = re.compile(
    rb"(\d*)([A-Za-z_]*?)((?:STABLE_)?TORCH_LIBRARY(?:_FRAGMENT|_IMPL)?_(?:static_)?init_\w+)")


def _reference_identifiers(blob: bytes) -> set[str]:
    out = set()
    for m in _REFERENCE.finditer(blob):
        digits, prefix, rest = m.group(1), m.group(2), m.group(2) + m.group(3)
        ident = rest
        while digits:
            if 0 < int(digits) <= len(rest):
                ident = rest[:int(digits)]
                break
            digits = digits[1:]
        out.add(ident[len(prefix):].decode("ascii", "replace"))
    return out


@pytest.mark.parametrize("blob", [
    b"\0_Z12TORCH_LIBRARY_init_ab\0", b"xSTABLE_TORCH_LIBRARY_IMPL_init_ns_CPU_3\0",
    b"7STABLE_TORCH_LIBRARY_init_a\0", b"TORCH_LIBRARY_init_a2TORCH_LIBRARY_init_b",
    b"99TORCH_LIBRARY_FRAGMENT_init_x_1 0TORCH_LIBRARY_static_init_y",
    b"_ZN5torch3TORCH_LIBRARY_init_q", b"TORCH_LIBRARY_init_", b"", b"123",
    b"_ZN12_GLOBAL__N_1L45IPEX_TORCH_LIBRARY_FRAGMENT_init_torch_ipex_2ERN5torch7LibraryE\0",
    b"\0MY_STABLE_TORCH_LIBRARY_init_w\0", b"_ZL9xTORCH_LIBRARY_init_abRN5torch7LibraryE"])
def test_macro_identifiers_as_the_one_pattern_reads_them(blob: bytes) -> None:
    from opregistry.scan.native import _identifiers

    assert _identifiers(blob) == _reference_identifiers(blob)


def test_a_wrapper_macros_prefix_names_the_block_of_torchs_macro() -> None:
    """IPEX's ``IPEX_TORCH_LIBRARY_FRAGMENT(torch_ipex, m)`` (intel-extension-for-pytorch
    2.8.0): the identifier's length says where it ends, the prefix is dropped -- not a
    namespace ``torch_ipex_2ERN5torch7LibraryE`` read to the end of the mangled name."""
    from opregistry.scan.native import _blocks, _identifiers

    blob = (b"\0_ZN12_GLOBAL__N_1L45IPEX_TORCH_LIBRARY_FRAGMENT_init_torch_ipex_2ERN5torch7LibraryE"
            b"\0_ZN12_GLOBAL__N_1L46IPEX_TORCH_LIBRARY_FRAGMENT_init_torchvision_3ERN5torch7LibraryE"
            b"\0")
    assert _identifiers(blob) == {"TORCH_LIBRARY_FRAGMENT_init_torch_ipex_2",
                                  "TORCH_LIBRARY_FRAGMENT_init_torchvision_3"}
    assert _blocks(_identifiers(blob)) == {
        ("FRAGMENT", "torch_ipex", None, "TORCH_LIBRARY_FRAGMENT"),
        ("FRAGMENT", "torchvision", None, "TORCH_LIBRARY_FRAGMENT")}


def test_macro_identifiers_of_real_libraries(native_libraries: dict[str, Path]) -> None:
    """The same identifiers as the one pattern, in every symbol table of the test libraries
    and of torch's CPU library (thousands of ``TORCH_LIBRARY`` blocks)."""
    import glob

    import torch

    from opregistry.scan.native import _identifiers

    paths = [*map(str, native_libraries.values()),
             *glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.*"))]
    seen = 0
    for path in paths:
        elf = open_elf(path)
        if elf is None:
            continue
        with elf:
            for blob in (elf.symbol_names(dynamic=True), elf.symbol_names(dynamic=False)):
                found = _identifiers(blob)
                assert found == _reference_identifiers(blob), path
                seen += len(found)
    assert seen > 100


def test_elf_reader_refuses_what_is_not_elf(tmp_path: Path, native_libraries: dict[str, Path]
                                            ) -> None:
    (tmp_path / "text.so").write_text("not a library")
    truncated = tmp_path / "truncated.so"
    truncated.write_bytes(native_libraries["foreign"].read_bytes()[:100])
    assert open_elf(str(tmp_path / "text.so")) is None
    assert open_elf(str(truncated)) is None
    assert scan_library(str(truncated)) == []


def test_non_elf_libraries_are_searched_byte_by_byte(tmp_path: Path) -> None:
    """A Mach-O or PE file: the initializer names are found in its bytes."""
    blob = (b"\xcf\xfa\xed\xfe" + b"\0" * 60 + b"__ZL25TORCH_LIBRARY_init_fx_macRN5torch7LibraryE\0"
            + b"__ZL37TORCH_LIBRARY_IMPL_init_fx_mac_CUDA_0RN5torch7LibraryE\0"
            + b"mac_op(Tensor x) -> Tensor\0")
    (tmp_path / "libmac.dylib").write_bytes(blob)
    found = scan_library(str(tmp_path / "libmac.dylib"))
    assert {(r.kind, r.namespace, r.key, r.op) for r in found} == {
        ("DEF", "fx_mac", None, None), ("IMPL", "fx_mac", "CUDA", None),
        ("op", "fx_mac", None, "fx_mac::mac_op")}
