"""A native library an op package loads by itself, undeclared: seen, judged, its distribution out.

The watch around plugin code (opregistry.guard, docs/reliability.md) wraps
``torch.ops.load_library`` and the import of extension modules; what such a
library registers is judged by the rules for Python registrations, but
cannot be undone.  Each case runs in a child process: a shared library
cannot be unloaded, and the test process loads the same test library
elsewhere (tests/test_native.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path


from .conftest import BACKENDS, DistFactory, op_dist
from .native_build import NS

PROBE = """
import json, torch, opregistry
registry = opregistry.load()
print(json.dumps({
    "problems": [[p.code, p.severity, p.message, p.op, p.key, p.source,
                  [o.distribution for o in p.culprits]] for p in registry.problems],
    "ops": sorted(registry.op_names),
    "native_twice": hasattr(torch.ops.%(ns)s, "twice"),
    "add": torch.add(torch.ones(2), torch.ones(2)).tolist(),
}))
"""


def _probe(dists: DistFactory, plugins: list[str]) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PROBE % {"ns": NS}], capture_output=True, text=True,
        env={**os.environ, "OPREGISTRY_AUTOLOAD": "0",
             "OPREGISTRY_PLUGINS": ",".join([*BACKENDS, *plugins]),
             "PYTHONPATH": os.pathsep.join([str(dists.root), *sys.path])})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _loader(dists: DistFactory, ns: str, name: str, load: str) -> str:
    """An op distribution whose kernel module runs ``load`` (Python) when it is imported."""
    kernels = f"import torch\n{load}\ndef clone(x):\n    return x.clone()\n"
    return op_dist(dists, name, ns, "lib.define('f(Tensor x) -> Tensor', "
                   "kernels={'cpu': 'KMOD:clone'})\n", kernels=kernels)


def test_load_library_by_a_plugin_defining_ops_is_caught(
        dists: DistFactory, ns: str, native_test_library: Path) -> None:
    """``torch.ops.load_library`` in a kernel module: its TORCH_LIBRARY ops are outside the plan."""
    bad = _loader(dists, ns, "self-loader", f"torch.ops.load_library({str(native_test_library)!r})")
    good = op_dist(dists, "bystander", f"{ns}b", "lib.define('g(Tensor x) -> Tensor', "
                   "kernels={'cpu': 'KMOD:clone'})\n")
    found = _probe(dists, [bad, good])
    [problem] = [p for p in found["problems"] if p[0] == "plugin-registered-outside-plan"]
    code, severity, message, op, _, source, culprits = problem
    assert severity == "error" and culprits == ["self-loader"]
    assert op in (f"{NS}::hidden", f"{NS}::twice")
    assert f"the shared library {native_test_library}" in message
    assert "cannot be unloaded" in message and "self-loader is left out" in message
    assert source and source.startswith(str(dists.root)), "the plugin's line that loaded it"
    assert f"{ns}::f" not in found["ops"], "nothing of the distribution is registered"
    assert f"{ns}b::g" in found["ops"], "the others load"
    assert found["native_twice"], "the library's ops stay: it cannot be unloaded (as said)"


def test_allowed_by_the_policy_it_is_a_warning(
        dists: DistFactory, ns: str, native_test_library: Path, monkeypatch) -> None:
    bad = _loader(dists, ns, "self-loader", f"torch.ops.load_library({str(native_test_library)!r})")
    monkeypatch.setenv("OPREGISTRY_ALLOW_OVERRIDE", NS)
    found = _probe(dists, [bad])
    [problem] = [p for p in found["problems"] if p[0] == "plugin-registration-allowed"]
    assert problem[1] == "warning" and "allows it" in problem[2]
    assert not [p for p in found["problems"] if p[0] == "plugin-registered-outside-plan"]
    assert f"{ns}::f" in found["ops"]


def test_extension_module_import_by_a_plugin_is_seen(
        dists: DistFactory, ns: str, native_test_library: Path) -> None:
    """The other way: importing an extension module (its ``TORCH_LIBRARY`` runs when it is opened).

    The test library is no Python module (no ``PyInit_``): the import fails
    after the library was opened and registered its ops -- which the watch
    sees all the same.
    """
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    shutil.copy(native_test_library, dists.root / f"{ns}_ext{suffix}")
    bad = _loader(dists, ns, "ext-importer",
                  f"try:\n    import {ns}_ext\nexcept ImportError:\n    pass")
    found = _probe(dists, [bad])
    [problem] = [p for p in found["problems"] if p[0] == "plugin-registered-outside-plan"]
    assert f"the extension module {ns}_ext" in problem[2] and problem[6] == ["ext-importer"]
    assert f"{ns}::f" not in found["ops"]


def test_library_replacing_an_aten_kernel_loaded_by_a_plugin_is_caught(
        dists: DistFactory, ns: str, native_libraries: dict[str, Path]) -> None:
    swap = native_libraries["swap_aten"]
    bad = _loader(dists, ns, "swapper", f"torch.ops.load_library({str(swap)!r})")
    found = _probe(dists, [bad])
    [problem] = [p for p in found["problems"] if p[0] == "plugin-replaced-torch-kernel"]
    assert (problem[3], problem[4], problem[6]) == ("aten::add.Tensor", "CPU", ["swapper"])
    assert "stays replaced" in problem[2] and "swapper is left out" in problem[2]
    assert found["add"] == [0.0, 0.0], "the replacement stays in effect (as the problem says)"
    assert f"{ns}::f" not in found["ops"]


def test_an_extension_module_that_registers_nothing_costs_no_problem(
        dists: DistFactory, ns: str) -> None:
    """A plugin importing an ordinary extension module (one of CPython's own) is fine."""
    import importlib.util

    module = next((m for m in ("xxlimited", "_testbuffer", "_xxtestfuzz", "_testcapi")
                   if (spec := importlib.util.find_spec(m)) and spec.origin
                   and spec.origin.endswith(sysconfig.get_config_var("EXT_SUFFIX"))), None)
    assert module, "this Python has none of CPython's test extension modules"
    # the import must open the library (an assertion error would fail the distribution)
    good = _loader(dists, ns, "plain", f"import sys\nassert {module!r} not in sys.modules\n"
                   f"import {module}")
    found = _probe(dists, [good])
    assert not [p for p in found["problems"] if "plain" in p[6]], found["problems"]
    assert f"{ns}::f" in found["ops"]
