"""Distributions that register with torch by themselves, for the static scan's tests.

Each is a real project (``pyproject.toml`` + package), installed with
``pip install --no-deps --no-build-isolation --target DIR``: a real
``*.dist-info`` with ``METADATA`` and ``RECORD``, as pip installs bitsandbytes.
One per registration style:

``fx-pylib``        ``Library`` DEF / FRAGMENT / IMPL, ``define``, ``impl``,
                    ``torch.library.impl(lib, name, key)``, names from another
                    module's constants, ``%`` and ``.format``, a loop over ``range``
``fx-customop``     ``custom_op`` and its methods, ``torch.library.define`` +
                    ``register_kernel`` / ``register_fake`` / ``register_vmap`` /
                    ``register_autocast`` / ``impl_abstract``, ``triton_op``,
                    decorator stacks
``fx-aliases``      bitsandbytes' layout: ``register_kernel = torch.library.register_kernel``
                    in ``_ops``, used from ``backends/cpu.py``; a helper function
                    that defines the op its caller names; decorator factories, one
                    naming the op after the function it decorates (as torchao)
``fx-dynamic``      a namespace read from the environment: the scan must say
                    "unresolved", with file:line
``fx-native``       a C++ ``TORCH_LIBRARY`` library (two namespaces) loaded with
                    ``torch.ops.load_library`` from a path built on ``__file__``
``fx-native-single`` a C++ library with one namespace, loaded from a computed path
``fx-native-stripped`` the same library stripped of its symbols
``fx-ext``          a C++ library that is a Python extension module, imported by its package
``fx-legacy``       a C++ library registering with ``c10::RegisterOperators`` (no macro block)
``fx-plugin``       an opregistry op package that also makes a raw ``Library(..., "DEF")``
``fx-notorch``      no torch anywhere: skipped
``fx-undeclared``   registers ops without declaring a dependency on torch (as torchao 0.18)

:data:`EXPECTED_OPS` is what importing each registers (checked against torch's
dispatcher by the tests, so that it cannot drift from reality).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

PROJECT = """\
[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "{name}"
version = "{version}"
dependencies = [{deps}]
{entry_points}
[tool.setuptools]
packages = {packages}

[tool.setuptools.package-data]
"*" = ["*.so"]
"""

PYLIB = {
    "fx_pylib/_names.py": '''
        NS = "fx_pylib"
        FRAG = NS + "_frag"
    ''',
    "fx_pylib/__init__.py": '''
        import torch
        import torch.library as tl
        from torch.library import Library

        from ._names import FRAG, NS

        lib = Library(NS, "DEF")
        lib.define("scale(Tensor x, float f) -> Tensor")
        lib.define(f"shift.{'int'}(Tensor x, int n) -> Tensor")
        lib.define("%s(Tensor x) -> Tensor" % "neg2")
        lib.define("{}(Tensor x) -> Tensor".format("neg3"))


        def _scale(x, f):
            return x * f


        lib.impl("scale", _scale, "CPU")


        @tl.impl(lib, "shift.int", "CPU")
        def _shift(x, n):
            return x + n


        frag = tl.Library(FRAG, "FRAGMENT")
        frag.define("extra(Tensor x) -> Tensor")
        frag.impl("extra", lambda x: x.clone(), "CompositeExplicitAutograd")
        for i in range(2):
            frag.define(f"looped{i}(Tensor x) -> Tensor")

        meta = Library(FRAG, "IMPL", "Meta")
        meta.impl("extra", lambda x: torch.empty_like(x))
    ''',
}

CUSTOMOP = {
    "fx_customop/__init__.py": '''
        import torch
        from torch.library import custom_op, register_fake, register_kernel, register_vmap
        from torch.library import triton_op

        NS = "fx_custom"


        @custom_op(f"{NS}::double", mutates_args=())
        def double(x: torch.Tensor) -> torch.Tensor:
            return x * 2


        @double.register_fake
        def _(x):
            return torch.empty_like(x)


        def _backward(ctx, grad):
            return grad * 2


        double.register_autograd(_backward)

        torch.library.define(NS + "::triple", "(Tensor x) -> Tensor")


        @register_fake(f"{NS}::triple")
        @register_kernel(f"{NS}::triple", ["cpu", "cuda"])
        def _triple(x):
            return x * 3


        @register_vmap(f"{NS}::triple")
        def _triple_vmap(info, in_dims, x):
            return x * 3, in_dims[0]


        torch.library.register_autocast(f"{NS}::triple", "cpu", torch.bfloat16)

        torch.library.define("fx_custom::quad", "(Tensor x) -> Tensor")
        torch.library.impl_abstract("fx_custom::quad")(lambda x: torch.empty_like(x))
        torch.library.impl("fx_custom::quad", "default")(lambda x: x * 4)


        @triton_op("fx_custom::tri", mutates_args=())
        def tri(x: torch.Tensor) -> torch.Tensor:
            return x + 1
    ''',
}

ALIASES = {
    "fx_aliases/__init__.py": '''
        import torch

        from . import _ops
        from .backends import cpu
    ''',
    "fx_aliases/_ops.py": '''
        import torch

        NAMESPACE = "fx_alias"
        register_kernel = torch.library.register_kernel
        lib = torch.library.Library(NAMESPACE, "FRAGMENT")

        torch.library.define(f"{NAMESPACE}::gemm", "(Tensor a, Tensor b) -> Tensor")


        def _define(name, schema):
            torch.library.define(f"{NAMESPACE}::{name}", schema)


        _define("helper_op", "(Tensor x) -> Tensor")


        def op_factory(suffix):
            def decorator(fn):
                lib.define(f"made_{suffix}(Tensor x) -> Tensor")
                lib.impl(f"made_{suffix}", fn, "CPU")
                return fn

            return decorator


        @op_factory("one")
        def _made_one(x):
            return x.clone()


        def named_after(target):
            """torchao's _register_custom_op: the op is named after the function it decorates."""
            def decorator(fn):
                op_name = fn.__name__
                if op_name[0] == "_":
                    op_name = op_name[1:]
                target.define(op_name + torch.library.infer_schema(fn, mutates_args=()))
                target.impl(op_name, fn, "CompositeExplicitAutograd")
                return fn

            return decorator


        register_named = named_after(lib)


        @register_named
        def _from_name(x: torch.Tensor) -> torch.Tensor:
            return x.clone()
    ''',
    "fx_aliases/backends/__init__.py": "",
    "fx_aliases/backends/cpu.py": '''
        from .. import _ops
        from .._ops import NAMESPACE, register_kernel


        @register_kernel(f"{NAMESPACE}::gemm", "cpu")
        def _gemm(a, b):
            return a @ b


        @_ops.register_kernel("fx_alias::helper_op", "cpu")
        def _helper(x):
            return x.clone()
    ''',
}

DYNAMIC = {
    "fx_dynamic/__init__.py": '''
        import os

        import torch

        namespace = os.environ.get("FX_DYNAMIC_NAMESPACE", "fx_dyn")
        lib = torch.library.Library(namespace, "FRAGMENT")
        lib.define("op(Tensor x) -> Tensor")
    ''',
}

NATIVE = {
    "fx_native/__init__.py": '''
        import os

        import torch

        torch.ops.load_library(os.path.join(os.path.dirname(__file__), "_C.so"))
    ''',
}

NATIVE_SINGLE = {
    "fx_native_single/__init__.py": '''
        import glob
        import os

        import torch

        for _library in glob.glob(os.path.join(os.path.dirname(__file__), "lib*.so")):
            torch.ops.load_library(_library)
    ''',
}

NATIVE_STRIPPED = {
    "fx_native_stripped/__init__.py": '''
        import glob
        import os

        import torch

        for _library in glob.glob(os.path.join(os.path.dirname(__file__), "lib*.so")):
            torch.ops.load_library(_library)
    ''',
}

LEGACY = {
    "fx_legacy/__init__.py": '''
        import os

        import torch

        torch.ops.load_library(os.path.join(os.path.dirname(__file__), "_legacy.so"))
    ''',
}

EXTENSION = {
    "fx_ext/__init__.py": '''
        import torch

        from . import _ext
    ''',
}

PLUGIN = {
    "fx_plugin/__init__.py": "",
    "fx_plugin/ops.py": '''
        import torch

        from opregistry import OpLibrary

        lib = OpLibrary("fx_plugin")
        raw = torch.library.Library("fx_plugin8", "DEF")
        raw.define("rogue(Tensor x) -> Tensor")
    ''',
}

NOTORCH = {
    "fx_notorch/__init__.py": '''
        def define(schema):
            return schema


        define("looks(Tensor x) -> Tensor")
    ''',
}

UNDECLARED = {
    "fx_undeclared/__init__.py": '''
        import torch

        lib = torch.library.Library("fx_undeclared", "FRAGMENT")
        lib.define("quiet(Tensor x) -> Tensor")
    ''',
}

#: distribution -> (package files, Requires-Dist, entry points)
DISTRIBUTIONS: dict[str, tuple[dict[str, str], list[str], str]] = {
    "fx-pylib": (PYLIB, ["torch"], ""),
    "fx-customop": (CUSTOMOP, ["torch>=2.8"], ""),
    "fx-aliases": (ALIASES, ["torch", "numpy"], ""),
    "fx-dynamic": (DYNAMIC, ["torch"], ""),
    "fx-native": (NATIVE, ["torch"], ""),
    "fx-native-single": (NATIVE_SINGLE, ["torch"], ""),
    "fx-native-stripped": (NATIVE_STRIPPED, ["torch"], ""),
    "fx-ext": (EXTENSION, ["torch"], ""),
    "fx-legacy": (LEGACY, ["torch"], ""),
    "fx-plugin": (PLUGIN, ["opregistry"], '[project.entry-points."opregistry.ops"]\n'
                                         'fx = "fx_plugin.ops:lib"\n'),
    "fx-notorch": (NOTORCH, [], ""),
    "fx-undeclared": (UNDECLARED, [], ""),
}

#: the ops importing each distribution's top-level package registers
EXPECTED_OPS: dict[str, set[str]] = {
    "fx_pylib": {"fx_pylib::scale", "fx_pylib::shift.int", "fx_pylib::neg2", "fx_pylib::neg3",
                 "fx_pylib_frag::extra", "fx_pylib_frag::looped0", "fx_pylib_frag::looped1"},
    "fx_customop": {"fx_custom::double", "fx_custom::triple", "fx_custom::quad",
                    "fx_custom::tri"},
    "fx_aliases": {"fx_alias::gemm", "fx_alias::helper_op", "fx_alias::made_one",
                   "fx_alias::from_name"},
    "fx_dynamic": {"fx_dyn::op"},
    "fx_native": {"fx_native::scale", "fx_native::scale.twice", "fx_native_frag::frag_op"},
    "fx_native_single": {"fx_single::hidden", "fx_single::plain"},
    "fx_undeclared": {"fx_undeclared::quiet"},
    "fx_ext": {"fx_ext::triple"},
    "fx_legacy": {"fx_legacy::decode", "fx_legacy::named"},
}


def _project(root: Path, name: str, files: dict[str, str], deps: list[str],
             entry_points: str, version: str = "1.0") -> Path:
    project = root / name
    packages = sorted({f.split("/")[0] for f in files} | {
        "/".join(f.split("/")[:-1]).replace("/", ".") for f in files if f.count("/") > 1})
    (project).mkdir(parents=True)
    (project / "pyproject.toml").write_text(PROJECT.format(
        name=name, version=version, deps=", ".join(f'"{d}"' for d in deps),
        entry_points=entry_points, packages=packages))
    for rel, source in files.items():
        path = project / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source).lstrip("\n"))
    return project


def _strip(library: Path, target: Path) -> None:
    shutil.copyfile(library, target)
    out = subprocess.run(["strip", "--strip-all", str(target)], capture_output=True, text=True)
    assert out.returncode == 0, f"strip failed: {out.stderr}"


def _extension_tag() -> str:
    """``cpython-311-x86_64-linux-gnu``: this interpreter's tag for extension modules."""
    import sysconfig

    return str(sysconfig.get_config_var("EXT_SUFFIX")).strip(".").rpartition(".")[0]


def install(target: Path, work: Path, libraries: dict[str, Path]) -> None:
    """Write every project under ``work`` and pip-install them all into ``target``."""
    projects = [_project(work, name, files, deps, eps)
                for name, (files, deps, eps) in DISTRIBUTIONS.items()]
    shutil.copyfile(libraries["foreign"], work / "fx-native" / "fx_native" / "_C.so")
    shutil.copyfile(libraries["foreign_single"],
                    work / "fx-native-single" / "fx_native_single" / "libfxsingle.so")
    shutil.copyfile(libraries["foreign_extension"],
                    work / "fx-ext" / "fx_ext" / "_ext.cpython-311-x86_64-linux-gnu.so"
                    .replace("cpython-311-x86_64-linux-gnu", _extension_tag()))
    shutil.copyfile(libraries["foreign_legacy"], work / "fx-legacy" / "fx_legacy" / "_legacy.so")
    _strip(libraries["foreign_single"],
           work / "fx-native-stripped" / "fx_native_stripped" / "libfxstripped.so")
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    out = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                          "--no-build-isolation", "--no-index", "--target", str(target),
                          *map(str, projects)], capture_output=True, text=True, env=env,
                         cwd=work)
    assert out.returncode == 0, f"pip install failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
