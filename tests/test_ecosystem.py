"""Packages that use torch.library directly: seen, attributed and protected, end to end.

Real installs, fresh interpreters, the real import order (``import torch``
loads the registry, then the package is imported).  A synthetic package of
each registration style (Python ``torch.library`` functions and
``custom_op``; a C++ ``TORCH_LIBRARY`` library loaded by
``torch.ops.load_library``), and bitsandbytes 0.50.2 from the index
(``real_packages``).  The rules themselves are tabled in
tests/test_resolver_table.py; here the whole way: the scan of the installed
files, ``doctor`` without torch, ``doctor --live``, ``import torch`` and the
package's own import, ``list --live`` / ``show --live``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from . import per_version
from .conftest import BACKENDS, DistFactory

#: a package that registers at its import with torch.library's functions, as bitsandbytes does
RAWPKG = '''
import torch

NS = "NSRAW"
torch.library.define(f"{NS}::scale", "(Tensor x, float s) -> Tensor")


@torch.library.register_kernel(f"{NS}::scale", "cpu")
def _(x, s):
    return x * s


@torch.library.register_fake(f"{NS}::scale")
def _(x, s):
    return torch.empty_like(x)


@torch.library.custom_op(f"{NS}::shift", mutates_args=())
def shift(x: torch.Tensor, by: float) -> torch.Tensor:
    return x + by
'''

PROBE = '''
import json, sys, importlib, torch, opregistry
reg = opregistry.get_registry()
errors = sorted((p.code, sorted(o.distribution for o in p.culprits)) for p in reg.errors)
for module in sys.argv[1:]:
    importlib.import_module(module)
print(json.dumps({"errors": errors}))
'''


def _run(args: list[str], env: dict[str, str], timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


#: the distributions of these tests that are no opregistry plugin (the allow-list names plugins)
PACKAGES = {"rawpkg", "dynpkg", "natpkg"}


def _env(dists: DistFactory, tmp_path: Path, *paths: Path, **extra: str) -> dict[str, str]:
    plugins = [name for name in dists.names if name not in PACKAGES]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(dists.root), *map(str, paths)]),
           "OPREGISTRY_PLUGINS": ",".join([*BACKENDS, *plugins]),
           "OPREGISTRY_CACHE_DIR": str(tmp_path / "cache"), **extra}
    env.pop("OPREGISTRY_AUTOLOAD", None)
    return env


def _claimants(dists: DistFactory, ns: str, suffix: str) -> None:
    """Op packages: one DEF of the package's namespace, one FRAGMENT adding an op, one IMPL."""
    dists.make(f"claimant-{suffix}", ops={"c": f"claim_{suffix}:lib"}, modules={f"claim_{suffix}": f'''
from opregistry import OpLibrary
lib = OpLibrary({ns!r})
lib.define("scale(Tensor x, float s) -> Tensor", kernels={{"cpu": "claim_{suffix}:k"}})
def k(x, s):
    return x
'''})
    dists.make(f"addon-{suffix}", ops={"a": f"addon_{suffix}:lib"}, modules={f"addon_{suffix}": f'''
from opregistry import OpLibrary
lib = OpLibrary({ns!r}, "FRAGMENT")
lib.define("twice(Tensor x) -> Tensor", kernels={{"cpu": "addon_{suffix}:k"}},
           fake="addon_{suffix}:k")
def k(x):
    return x * 2
'''})


def _cli(env: dict[str, str], *args: str) -> tuple[int, Any]:
    out = _run(["-m", "opregistry", *args, "--json"], env)
    assert out.returncode in (0, 1), out.stderr[-3000:]
    return out.returncode, json.loads(out.stdout)


def test_a_python_package_is_protected_and_attributed(dists: DistFactory, ns: str,
                                                      tmp_path: Path) -> None:
    """The whole way for a package using torch.library's functions and custom_op."""
    package = f"rawpkg_{ns}"
    dists.make("rawpkg", version="2.1", modules={package: RAWPKG.replace("NSRAW", ns)},
               requires=("torch",), record=True)
    _claimants(dists, ns, ns)
    env = _env(dists, tmp_path)

    # before torch: doctor names the package as pip does, with its line
    rc, doctor = _cli(env, "doctor")
    assert rc == 1
    errors = [p for p in doctor["problems"] if p["severity"] == "error"]
    assert len(errors) == 1, [p["message"] for p in errors]
    [held] = errors
    assert held["code"] == "namespace-held-by-package"
    assert "rawpkg==2.1" in held["message"] and f"{package}.py:5" in held["message"]
    assert [d["name"] for d in held["distributions"]] == [f"claimant-{ns}"]

    # the real order: import torch (the registry), then the package -- which works
    out = _run(["-c", PROBE + f"""
x = torch.ones(2)
print(json.dumps({{"scale": torch.ops.{ns}.scale(x, 3.0).tolist(),
                  "shift": torch.ops.{ns}.shift(x, 1.0).tolist(),
                  "twice": torch.ops.{ns}.twice(x).tolist()}}))
""", package], env)
    assert out.returncode == 0, out.stderr[-3000:]
    first, second = (json.loads(line) for line in out.stdout.splitlines()[-2:])
    assert first["errors"] == [["namespace-held-by-package", [f"claimant-{ns}"]]]
    assert second == {"scale": [3.0, 3.0], "shift": [2.0, 2.0], "twice": [2.0, 2.0]}

    # doctor --live, the package imported first: the same verdict
    rc, live = _cli(env, "doctor", "--live", "--import", package)
    assert rc == 1
    assert [(p["code"], [d["name"] for d in p["distributions"]]) for p in live["problems"]
            if p["severity"] == "error"] == [("namespace-held-by-package", [f"claimant-{ns}"])]

    # who registered what: every op and kernel named, opregistry's own ones included
    _, listing = _cli(env, "list", "--live", "--import", package, "-n", ns)
    rows = {row["op"]: row for row in listing["live"][ns]}
    assert set(rows) == {f"{ns}::scale", f"{ns}::shift", f"{ns}::twice"}
    for op in ("scale", "shift"):
        owner = rows[f"{ns}::{op}"]["defined_by"]
        assert (owner["name"], owner["version"], owner["how"]) == ("rawpkg", "2.1", "python")
        assert {o["name"] for o in rows[f"{ns}::{op}"]["kernels_by"].values()} == {"rawpkg"}
    assert rows[f"{ns}::scale"]["kernels_by"]["CPU"]["site"].endswith(f"{package}.py:8")
    twice = rows[f"{ns}::twice"]
    assert (twice["defined_by"]["name"], twice["defined_by"]["how"]) == (f"addon-{ns}",
                                                                        "opregistry")
    assert {o["how"] for o in twice["kernels_by"].values()} == {"opregistry"}

    _, shown = _cli(env, "show", "--live", "--import", package, f"{ns}::scale")
    [row] = shown["live_ops"]
    assert row["defined_by"]["name"] == "rawpkg" and row["dispatcher_schema"].startswith(
        f"{ns}::scale(Tensor x, float s)")


def test_a_clash_nobody_could_predict_names_the_op_package(dists: DistFactory, ns: str,
                                                           tmp_path: Path) -> None:
    """A namespace chosen at run time: torch raises, naming the op package's declaration line."""
    dists.make("dynpkg", modules={f"dyn_{ns}": '''
import os, torch
lib = torch.library.Library(os.environ["DYN_NS"], "DEF")
'''}, requires=("torch",), record=True)
    dists.make("owner", ops={"o": f"owner_{ns}:lib"}, modules={f"owner_{ns}": f'''
from opregistry import OpLibrary
lib = OpLibrary({ns!r})
lib.define("f(Tensor x) -> Tensor", kernels={{"cpu": "owner_{ns}:k"}})
def k(x):
    return x
'''})
    env = _env(dists, tmp_path, DYN_NS=ns)
    out = _run(["-c", PROBE, f"dyn_{ns}"], env)
    assert out.returncode != 0
    assert "Only a single TORCH_LIBRARY" in out.stderr
    message = out.stderr.rpartition("RuntimeError")[2]
    # the op package by name, and its define line (its module's 4th), whatever torch records
    # (2.8 writes /dev/null:LINE for every Library)
    site = f"{dists.root / f'owner_{ns}.py'}:4"
    assert (f"opregistry: namespace {ns!r} is defined by the op package owner==1.0 ({site})"
            in message), out.stderr[-2000:]
    assert "OPREGISTRY_BLOCK=owner" in message
    if per_version.records_registration_sites():  # and torch itself names it, not opregistry
        assert f"registered at {site};" in message, message
    assert "opregistry/" not in message


def test_a_cpp_library_is_attributed_to_its_distribution(dists: DistFactory, tmp_path: Path,
                                                         native_test_library: Path) -> None:
    """A TORCH_LIBRARY loaded by torch.ops.load_library: its ops are the distribution's."""
    from tests.native_build import NS

    folder = dists.root / "natpkg_lib"
    folder.mkdir()
    shutil.copy(native_test_library, folder / native_test_library.name)
    module = "natpkg_lib.loader"
    (folder / "__init__.py").write_text("")
    dists.make("natpkg", version="0.4", modules={module: f'''
import os, torch
torch.ops.load_library(os.path.join(os.path.dirname(__file__), {native_test_library.name!r}))
'''}, requires=("torch",), record=True)
    record = next(dists.root.glob("natpkg-0.4.dist-info")) / "RECORD"
    record.write_text(record.read_text() + f"natpkg_lib/__init__.py,,\n"
                      f"natpkg_lib/{native_test_library.name},,\n")
    env = _env(dists, tmp_path)
    _, listing = _cli(env, "list", "--live", "--import", module, "-n", NS)
    rows = listing["live"][NS]
    assert rows, "the library's ops are in the dispatcher"
    for row in rows:
        assert (row["defined_by"]["name"], row["defined_by"]["version"],
                row["defined_by"]["how"]) == ("natpkg", "0.4", "native"), row


@pytest.mark.slow
def test_bitsandbytes_is_protected_and_attributed(dists: DistFactory, real_packages: Path,
                                                  tmp_path: Path) -> None:
    """bitsandbytes 0.50.2 from the index: an op package cannot break it, and its ops are its own."""
    _claimants(dists, "bitsandbytes", "bnb")
    dists.make("overrider", ops={"o": "overrider_bnb:lib"}, modules={"overrider_bnb": '''
from opregistry import OpLibrary
lib = OpLibrary("bitsandbytes", "IMPL")
lib.impl("bitsandbytes::quantize_blockwise", "cpu", "overrider_bnb:q", override=True)
def q(A, code, blocksize):
    raise NotImplementedError
'''})
    env = _env(dists, tmp_path, real_packages)

    rc, doctor = _cli(env, "doctor")
    errors = {(p["code"], p["distributions"][0]["name"]) for p in doctor["problems"]
              if p["severity"] == "error"}
    assert errors == {("namespace-held-by-package", "claimant-bnb"),
                      ("kernel-package-op-denied", "overrider")}
    assert all("bitsandbytes==0.50.2" in p["message"] for p in doctor["problems"]
               if p["severity"] == "error")

    out = _run(["-c", PROBE + """
import bitsandbytes.functional as F
x = torch.randn(64)
q, state = F.quantize_blockwise(x)
print(json.dumps({"roundtrip": float((F.dequantize_blockwise(q, state) - x).abs().max()),
                  "twice": torch.ops.bitsandbytes.twice(torch.ones(2)).tolist()}))
""", "bitsandbytes"], env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    first, second = (json.loads(line) for line in out.stdout.splitlines()[-2:])
    assert sorted(map(tuple, [(c, tuple(n)) for c, n in first["errors"]])) == [
        ("kernel-package-op-denied", ("overrider",)),
        ("namespace-held-by-package", ("claimant-bnb",))]
    assert second["roundtrip"] < 0.1 and second["twice"] == [2.0, 2.0]

    # allowed by the policy, the override names bitsandbytes as what it replaces
    allowed = {**env, "OPREGISTRY_ALLOW_OVERRIDE": "bitsandbytes"}
    _, listing = _cli(allowed, "list", "-n", "bitsandbytes")
    [kernel] = listing["external_kernels"]
    assert (kernel["op"], kernel["overrides"]) == (
        "bitsandbytes::quantize_blockwise", {"name": "bitsandbytes", "version": "0.50.2"})
    out = _run(["-c", """
import torch, bitsandbytes.functional as F
try:
    F.quantize_blockwise(torch.randn(64))
except NotImplementedError:
    print("the override serves")
"""], allowed, timeout=600)
    assert out.stdout.strip().endswith("the override serves"), out.stdout + out.stderr[-2000:]

    _, listing = _cli(env, "list", "--live", "--import", "bitsandbytes", "-n", "bitsandbytes")
    rows = {row["op"]: row for row in listing["live"]["bitsandbytes"]}
    theirs = {op: row for op, row in rows.items() if op != "bitsandbytes::twice"}
    assert len(theirs) == 19
    for op, row in theirs.items():
        assert (row["defined_by"]["name"], row["defined_by"]["version"]) == (
            "bitsandbytes", "0.50.2"), op
        assert {o["name"] for o in row["kernels_by"].values() if o} == {"bitsandbytes"}, op
    assert rows["bitsandbytes::twice"]["defined_by"]["name"] == "addon-bnb"


@pytest.mark.parametrize("order", ["torch-first", "package-first"])
def test_an_allowed_override_of_a_package_kernel_wins(dists: DistFactory, ns: str,
                                                      tmp_path: Path, order: str) -> None:
    """Allowed by the policy, an override of a package's kernel is registered once the package
    registered its own -- whichever is imported first -- and names the package."""
    package = f"rawpkg_{ns}"
    dists.make("rawpkg", version="2.1", modules={package: RAWPKG.replace("NSRAW", ns)},
               requires=("torch",), record=True)
    dists.make("faster", ops={"f": f"faster_{ns}:lib"}, modules={f"faster_{ns}": f'''
from opregistry import OpLibrary
lib = OpLibrary({ns!r}, "IMPL")
lib.impl("{ns}::scale", "cpu", "faster_{ns}:scale", override=True)
def scale(x, s):
    return x * s + 100
'''})
    env = _env(dists, tmp_path, OPREGISTRY_ALLOW_OVERRIDE=ns)
    imports = f"import {package}, torch" if order == "package-first" else f"import torch, {package}"
    out = _run(["-c", f"""
import json
{imports}
import opregistry
reg = opregistry.get_registry()
[k] = [k for k in reg.plan.external_kernels if k.kernel.op == "{ns}::scale"]
print(json.dumps({{"scale": torch.ops.{ns}.scale(torch.ones(2), 2.0).tolist(),
                  "overrides": k.overrides, "after": k.after,
                  "errors": [str(p) for p in reg.errors]}}))
"""], env)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.splitlines()[-1])
    assert found == {"scale": [102.0, 102.0], "overrides": "rawpkg==2.1", "after": package,
                     "errors": []}


@pytest.mark.slow
def test_torchvision_is_read_and_protected_before_torch(dists: DistFactory,
                                                        torchvision_package: Path,
                                                        tmp_path: Path) -> None:
    """torchvision 0.28.0 from the index, scanned (its CUDA build does not load beside this
    torch): the ``image`` library of torch's older API is read, ``nms`` -- defined in a
    library without symbols, its fake kernel in Python -- is torchvision's, and a C++ CPU
    kernel of it needs ``override=True`` even where the policy allows replacing it."""
    dists.make("tvredef", ops={"r": "tvredef_ops:lib"}, modules={"tvredef_ops": '''
from opregistry import OpLibrary
lib = OpLibrary("torchvision", "FRAGMENT")
lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
           kernels={"cpu": "tvredef_ops:k"})
def k(dets, scores, iou_threshold):
    return scores.argsort()
'''})
    dists.make("tvimage", ops={"i": "tvimage_ops:lib"}, modules={"tvimage_ops": '''
from opregistry import OpLibrary
lib = OpLibrary("image")
lib.define("decode_png(Tensor data) -> Tensor", kernels={"cpu": "tvimage_ops:k"})
def k(data):
    return data
'''})
    dists.make("tvkernel", ops={"k": "tvkernel_ops:lib"}, modules={"tvkernel_ops": '''
from opregistry import OpLibrary
lib = OpLibrary("torchvision", "IMPL")
lib.impl("torchvision::deform_conv2d", "cpu", "tvkernel_ops:k")
def k(*args):
    raise NotImplementedError
'''})
    env = _env(dists, tmp_path, torchvision_package,
               OPREGISTRY_ALLOW_OVERRIDE="torchvision::deform_conv2d")
    _, listing = _cli(env, "list", "-n", "image")
    [row] = [a for a in listing["adopted"] if a["distribution"]["name"] == "torchvision"]
    assert {"image::decode_png", "image::decode_jpeg"} <= {op["name"] for op in row["ops"]}
    rc, doctor = _cli(env, "doctor")
    assert rc == 1
    errors = {(p["code"], p["distributions"][0]["name"]): p["message"]
              for p in doctor["problems"] if p["severity"] == "error"}
    assert set(errors) == {("op-held-by-package", "tvredef"),
                           ("namespace-held-by-package", "tvimage"),
                           ("kernel-override-undeclared", "tvkernel")}, errors
    assert "torchvision==0.28.0" in errors[("op-held-by-package", "tvredef")]
    assert "kernel at its import" in errors[("op-held-by-package", "tvredef")]
    assert "may already implement for CPU" in errors[("kernel-override-undeclared", "tvkernel")]
