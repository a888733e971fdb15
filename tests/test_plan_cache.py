"""The plan cache: never stale (one test per input), robust, conditions never frozen.

Each "never stale" test builds a small environment of real distributions
(``*.dist-info`` + modules in a folder on ``PYTHONPATH``), runs a fresh
process twice -- the second must be a cache hit, or the test could not fail
-- changes one input, and checks that the next ``opregistry.plan()``
(what ``opregistry list`` runs, no torch) and the next ``import torch``
(opregistry's autoload) both see the change.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import zlib
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opregistry import codec, inputs, plancache
from opregistry.config import Settings
from opregistry.diskcache import DiskCache

from . import adoption_dists

ROOT = Path(__file__).resolve().parent.parent
BACKENDS = ["opregistry-cpu", "opregistry-meta", "opregistry-autograd", "opregistry-vmap"]

#: prints what ``opregistry list`` (plan(), no torch) and ``import torch`` see, and the
#: cache's outcome of each
PROBE = r"""
import json, sys
import opregistry
from opregistry.state import process
out = {}
plan = opregistry.plan()
out["list"] = {"ops": sorted(op.op.qualname for op in plan.ops),
               "kernels": sorted(f"{k.kernel.op}/{k.kernel.key}/{k.status}" for k in plan.kernels()),
               "errors": sorted(p.code for p in plan.errors), "cache": process().plan_cache}
if "--torch" in sys.argv:
    import torch
    r = opregistry.get_registry()
    out["torch"] = {"ops": sorted(op.op.qualname for op in r.ops),
                    "kernels": sorted(f"{k.kernel.op}/{k.kernel.key}/{k.status}" for k in r.kernels),
                    "cache": process().plan_cache}
print(json.dumps(out))
"""

MODULE = """
from opregistry import OpLibrary
lib = OpLibrary({ns!r})
lib.define("{op}(Tensor x) -> Tensor", kernels={{"cpu": "{kmod}:clone"}})
"""
KERNELS = "def clone(x):\n    return x.clone()\n"


class Env:
    """A folder of distributions, a cache folder, and the processes that look at them."""

    def __init__(self, tmp: Path) -> None:
        self.site = tmp / "site"
        self.site.mkdir()
        self.cache = tmp / "cache"
        self.extra: list[Path] = []
        self.vars: dict[str, str] = {}
        #: the working directory, ``sys.path[0]`` of ``python -c``
        self.cwd = tmp
        (self.site / "pc_kernels.py").write_text(KERNELS)

    def dist(self, name: str, module: str, source: str, *, version: str = "1.0",
             group: str = "opregistry.ops", where: Path | None = None,
             attr: str = "lib") -> Path:
        where = where or self.site
        info = where / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        (info / "entry_points.txt").write_text(f"[{group}]\n{name} = {module}:{attr}\n")
        (where / f"{module}.py").write_text(textwrap.dedent(source))
        return info

    def op_dist(self, name: str, ns: str, op: str, **kw: Any) -> Path:
        return self.dist(name, name.replace("-", "_"), MODULE.format(ns=ns, op=op, kmod="pc_kernels"),
                         **kw)

    def environ(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OPREGISTRY_")}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env.update(self.vars)
        env["OPREGISTRY_CACHE_DIR"] = str(self.cache)
        env["OPREGISTRY_BLOCK"] = env.get("OPREGISTRY_BLOCK", "tutorial-ops,nnkit,nnkit-contrib,"
                                                               "extension-cpp")
        env["PYTHONPATH"] = os.pathsep.join(str(p) for p in [*self.extra, self.site])
        return env

    def run(self, code: str, *args: str, **extra: str) -> str:
        """The output of ``python -c code args`` in this environment (it must succeed)."""
        done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                              text=True, env={**self.environ(), **extra},
                              cwd=str(self.cwd), timeout=300)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def probe(self, *, torch: bool = True, **extra: str) -> dict[str, Any]:
        out = self.run(PROBE, *(["--torch"] if torch else []), **extra)
        return json.loads(out.strip().splitlines()[-1])

    def warm(self, **kw: Any) -> dict[str, Any]:
        """Probe twice: the second must come from the cache, for list and import torch alike."""
        self.probe(**kw)
        found = self.probe(**kw)
        assert found["list"]["cache"] == "hit", found
        if kw.get("torch", True):
            assert found["torch"]["cache"] == "hit", found
        return found


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return Env(tmp_path)


def rewrite_entry(path: Path, change: Any) -> None:
    """Change an entry's header and sections (``change(header, sections)``), their lengths and
    CRCs made right again: a well-formed file, whatever the change (diskcache.Entry)."""
    first, rest = path.read_bytes().split(b"\n", 1)
    header = json.loads(first)
    sections, at = {}, 0
    for name, length, _ in header["sections"]:
        sections[name] = json.loads(rest[at:at + length])
        at += length
    change(header, sections)
    blobs = [(name, json.dumps(value).encode()) for name, value in sections.items()]
    header["sections"] = [[name, len(b), zlib.crc32(b)] for name, b in blobs]
    path.write_bytes(json.dumps(header).encode() + b"\n" + b"".join(b for _, b in blobs))


def _header(path: Path) -> dict[str, Any]:
    """An entry's first line: its key, stamp and all but its sections (diskcache.Entry)."""
    return json.loads(path.read_bytes().split(b"\n", 1)[0])


def _sees(found: dict[str, Any], op: str, present: bool = True) -> None:
    for view in ("list", "torch"):
        if view in found:
            assert (op in found[view]["ops"]) is present, (view, found[view])


def _touch_later(path: Path) -> None:
    """Give ``path`` a modification time clearly later than before."""
    st_ = path.stat()
    os.utime(path, ns=(st_.st_atime_ns, st_.st_mtime_ns + 5_000_000_000))


# -- never stale: one test per input -----------------------------------------------------


def test_install_a_distribution(env: Env) -> None:
    env.op_dist("pc-one", "pcone", "f")
    _sees(env.warm(), "pcone::f")
    env.op_dist("pc-two", "pctwo", "g")
    _sees(env.probe(), "pctwo::g")


def test_uninstall_a_distribution(env: Env) -> None:
    env.op_dist("pc-one", "pcone", "f")
    info = env.op_dist("pc-two", "pctwo", "g")
    _sees(env.warm(), "pctwo::g")
    shutil.rmtree(info)
    found = env.probe()
    _sees(found, "pctwo::g", present=False)
    _sees(found, "pcone::f")


def test_upgrade_a_distribution(env: Env) -> None:
    info = env.op_dist("pc-one", "pcone", "f")
    _sees(env.warm(), "pcone::f")
    shutil.rmtree(info)
    env.op_dist("pc-one", "pcone", "f2", version="2.0")
    found = env.probe()
    _sees(found, "pcone::f2")
    _sees(found, "pcone::f", present=False)


def test_reinstall_the_same_version_with_other_entry_points(env: Env) -> None:
    info = env.op_dist("pc-one", "pcone", "f")
    (env.site / "pc_other.py").write_text(textwrap.dedent(MODULE.format(
        ns="pcother", op="h", kmod="pc_kernels")))
    _sees(env.warm(), "pcone::f")
    shutil.rmtree(info)
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pc-one\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[opregistry.ops]\npc-one = pc_other:lib\n")
    _sees(env.probe(), "pcother::h")


def test_pythonpath_change(env: Env, tmp_path: Path) -> None:
    env.op_dist("pc-one", "pcone", "f")
    _sees(env.warm(), "pcone::f")
    other = tmp_path / "other"
    other.mkdir()
    env.op_dist("pc-far", "pcfar", "g", where=other)
    env.extra.append(other)
    _sees(env.probe(), "pcfar::g")


def test_a_new_pth_file(env: Env, tmp_path: Path) -> None:
    """A ``.pth`` in site-packages adds a folder to sys.path: its distributions count."""
    import site

    env.op_dist("pc-one", "pcone", "f")
    _sees(env.warm(), "pcone::f")
    other = tmp_path / "viapth"
    other.mkdir()
    env.op_dist("pc-pth", "pcpth", "g", where=other)
    # the site folder is a site dir for this check: the probe adds it with site.addsitedir
    (env.site / "pc_extra.pth").write_text(str(other) + "\n")
    env.vars["PYTHONSTARTUP"] = ""
    code = f"import site; site.addsitedir({str(env.site)!r})\n" + PROBE
    done = subprocess.run([sys.executable, "-c", code, "--torch"], capture_output=True,
                          text=True, env=env.environ(), cwd=str(tmp_path), timeout=300)
    assert done.returncode == 0, done.stderr
    _sees(json.loads(done.stdout.strip().splitlines()[-1]), "pcpth::g")
    assert site  # the module the probe uses


def test_editable_source_tree_changes_without_its_dist_info(env: Env, tmp_path: Path) -> None:
    """An editable install: the dist-info stays, the source folder (on sys.path) changes."""
    src = tmp_path / "src"
    (src / "pcedit").mkdir(parents=True)
    (src / "pcedit" / "__init__.py").write_text("")
    decl = src / "pcedit" / "registry.py"
    decl.write_text(textwrap.dedent(MODULE.format(ns="pcedit", op="f", kmod="pc_kernels")))
    info = env.site / "pc_edit-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pc-edit\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[opregistry.ops]\npc-edit = pcedit.registry:lib\n")
    env.extra.append(src)
    _sees(env.warm(), "pcedit::f")
    decl.write_text(textwrap.dedent(MODULE.format(ns="pcedit", op="renamed", kmod="pc_kernels")))
    _sees(env.probe(), "pcedit::renamed")


#: prints the ops in namespace argv[1] of the packages adopted (those that register with
#: torch by themselves), as ``opregistry list`` and ``import torch`` see them
ADOPTED_PROBE = r"""
import json, sys
import opregistry
from opregistry.state import process

def ops(plan):
    return sorted(r.op for a in plan.adoptions for r in a.registrations
                  if r.kind == "op" and r.namespace == sys.argv[1])

out = {"list": {"ops": ops(opregistry.plan()), "cache": process().plan_cache}}
if "--torch" in sys.argv:
    import torch
    out["torch"] = {"ops": ops(opregistry.get_registry().plan), "cache": process().plan_cache}
print(json.dumps(out))
"""


def test_a_module_added_to_an_editable_foreign_package(env: Env, tmp_path: Path) -> None:
    """A package that registers with torch by itself, installed editable: its files are found
    by walking its source folder, so a module added there (no stamped file changes) counts."""
    package = tmp_path / "src" / "pcfed"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        "import torch\ntorch.library.define('pcfed::one', '(Tensor x) -> Tensor')\n")
    info = env.site / "pc_fed-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pc-fed\nVersion: 1.0\n"
                                   "Requires-Dist: torch\n")
    (info / "top_level.txt").write_text("pcfed\n")
    (info / "direct_url.json").write_text(json.dumps(
        {"url": package.parent.as_uri(), "dir_info": {"editable": True}}))
    env.extra.append(package.parent)
    env.run(ADOPTED_PROBE, "pcfed", "--torch")
    found = json.loads(env.run(ADOPTED_PROBE, "pcfed", "--torch").strip().splitlines()[-1])
    assert found["list"] == found["torch"] == {"ops": ["pcfed::one"], "cache": "hit"}
    (package / "more.py").write_text(
        "import torch\ntorch.library.define('pcfed::two', '(Tensor x) -> Tensor')\n")
    found = json.loads(env.run(ADOPTED_PROBE, "pcfed", "--torch").strip().splitlines()[-1])
    assert found["list"]["ops"] == found["torch"]["ops"] == ["pcfed::one", "pcfed::two"]


def test_edit_a_declaration_module_keeping_its_size(env: Env) -> None:
    env.op_dist("pc-one", "pcone", "f1")
    _sees(env.warm(), "pcone::f1")
    path = env.site / "pc_one.py"
    before = path.stat()
    path.write_text(path.read_text().replace("f1(", "f2("))
    assert path.stat().st_size == before.st_size
    # Python's own .pyc of it records the size and the second: within that second it would
    # import the old code, with or without opregistry
    shutil.rmtree(env.site / "__pycache__")
    _sees(env.probe(), "pcone::f2")


def test_edit_a_declaration_module_keeping_its_mtime(env: Env) -> None:
    env.op_dist("pc-one", "pcone", "f")
    path = env.site / "pc_one.py"
    _sees(env.warm(), "pcone::f")
    before = path.stat()
    path.write_text(path.read_text().replace('"f(', '"longer_name('))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_mtime_ns == before.st_mtime_ns
    _sees(env.probe(), "pcone::longer_name")


def test_edit_an_old_file_keeping_its_size_and_mtime_in_content_mode(env: Env) -> None:
    """Size and time alike: only OPREGISTRY_CACHE_CHECK=content sees it (as locked mode)."""
    env.op_dist("pc-one", "pcone", "f1")
    path = env.site / "pc_one.py"
    old = time.time_ns() - 3600 * 10**9  # not racy: size and time are all that is checked
    os.utime(path, ns=(old, old))
    env.vars["OPREGISTRY_CACHE_CHECK"] = "content"
    _sees(env.warm(), "pcone::f1")
    path.write_text(path.read_text().replace("f1(", "f2("))
    os.utime(path, ns=(old, old))
    # Python's own .pyc of it is checked by size and time too: it would import the old code
    shutil.rmtree(env.site / "__pycache__")
    _sees(env.probe(), "pcone::f2")


def test_a_racy_stamp_settles_once_its_file_is_old_enough(env: Env) -> None:
    """A file stamped within RACY_NS of its modification carries a digest, compared at every
    load; a load more than RACY_NS after the modification drops it from the entry (the next
    edit changes the time), and the entry still holds."""
    env.op_dist("pc-one", "pcone", "f1")
    path = env.site / "pc_one.py"
    now = time.time_ns()
    os.utime(path, ns=(now, now))
    env.warm(torch=False)

    def stamp() -> list[Any]:
        return _header(_entry(env))["value"]["manifest"]["files"][str(path)]

    if time.time_ns() - now < inputs.RACY_NS:  # a slow machine may be past it already
        assert len(stamp()) == 3, stamp()
    time.sleep(max(0.0, (now + inputs.RACY_NS - time.time_ns()) / 1e9) + 0.2)
    found = env.probe(torch=False)
    assert found["list"]["cache"] == "hit" and len(stamp()) == 2, stamp()
    assert env.probe(torch=False)["list"]["cache"] == "hit"
    path.write_text(path.read_text().replace("f1(", "f2("))  # the same size, a new time
    shutil.rmtree(env.site / "__pycache__", ignore_errors=True)
    _sees(env.probe(), "pcone::f2")


def test_settle_drops_the_digests_of_settled_racy_stamps_alone() -> None:
    second = 10**9
    manifest = {"files": {"old": [3, 10 * second, "d1"], "new": [3, 19 * second, "d2"],
                          "plain": [3, 5 * second], "gone": None},
                "folders": {"racy": [10 * second, "l1", True], "fresh": [19 * second, "l2", True],
                            "calm": [1 * second, "l3", False], "missing": None},
                "tops": [], "first": None}
    settled = inputs.settle(manifest, now=20 * second)
    assert settled is not None and settled["files"] == {
        "old": [3, 10 * second], "new": [3, 19 * second, "d2"], "plain": [3, 5 * second],
        "gone": None}
    assert settled["folders"] == {"racy": [10 * second, "l1", False],
                                  "fresh": [19 * second, "l2", True],
                                  "calm": [1 * second, "l3", False], "missing": None}
    assert manifest["files"]["old"] == [3, 10 * second, "d1"]  # a new manifest
    assert inputs.settle(settled, now=20 * second) is None


def test_a_data_file_the_declarations_read(env: Env) -> None:
    """Declaration code may read its package's files: a data file is an input."""
    pkg = env.site / "pcdata"
    pkg.mkdir()
    (pkg / "names.json").write_text('["a"]')
    (pkg / "__init__.py").write_text(textwrap.dedent("""
        import json, os
        from opregistry import OpLibrary
        lib = OpLibrary("pcdata")
        with open(os.path.join(os.path.dirname(__file__), "names.json")) as f:
            for name in json.load(f):
                lib.define(f"{name}(Tensor x) -> Tensor", kernels={"cpu": "pc_kernels:clone"})
    """))
    info = env.site / "pc_data-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pc-data\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[opregistry.ops]\npc-data = pcdata:lib\n")
    _sees(env.warm(), "pcdata::a")
    (pkg / "names.json").write_text('["b"]')
    _sees(env.probe(), "pcdata::b")


def _data_package(env: Env, name: str, body: str) -> Path:
    """Package ``name`` whose declarations define an op per name in ``data/names.json``."""
    pkg = env.site / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text(textwrap.dedent(f"""
        import json, os
        from opregistry import OpLibrary
        here = os.path.dirname(__file__)
        lib = OpLibrary({name!r})
        with open(os.path.join(here, "data", "names.json")) as f:
            for name in json.load(f):
                lib.define(f"{{name}}(Tensor x) -> Tensor", kernels={{"cpu": "pc_kernels:clone"}})
    """) + textwrap.dedent(body))
    info = env.site / f"{name}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[opregistry.ops]\n{name} = {name}:lib\n")
    return pkg


def test_a_data_file_in_a_linked_folder_of_the_package(env: Env, tmp_path: Path) -> None:
    """``data`` is a link to a folder shared elsewhere: its files are inputs as well."""
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "names.json").write_text('["a"]')
    pkg = _data_package(env, "pclinked", "")
    (pkg / "data").symlink_to(shared, target_is_directory=True)
    (shared / "loop").symlink_to(shared, target_is_directory=True)  # a loop ends
    _sees(env.warm(), "pclinked::a")
    (shared / "names.json").write_text('["bb"]')
    _sees(env.probe(), "pclinked::bb")


def test_a_file_written_while_the_plan_is_built_is_read_again(env: Env, tmp_path: Path
                                                              ) -> None:
    """An editor saves a file the declarations read after they read it, during the first
    build: the plan holds what it said before, so that build is not cached -- a stamp of
    the file as it is now would vouch for the old plan."""
    edited = tmp_path / "edited"
    pkg = _data_package(env, "pcracy", f"""
        if not os.path.exists({str(edited)!r}):
            open({str(edited)!r}, "w").close()
            with open(os.path.join(here, "data", "names.json"), "w") as f:
                json.dump(["b"], f)
    """)
    (pkg / "data").mkdir()
    (pkg / "data" / "names.json").write_text('["a"]')
    _sees(env.probe(torch=False), "pcracy::a")
    assert edited.exists()
    found = env.probe(torch=False)
    _sees(found, "pcracy::b")
    assert found["list"]["cache"] != "hit", found
    assert env.probe(torch=False)["list"]["cache"] == "hit"


def test_the_configuration_file(env: Env, tmp_path: Path) -> None:
    env.op_dist("pc-one", "pcone", "f")
    env.op_dist("pc-two", "pctwo", "g")
    config = tmp_path / "opregistry.toml"
    config.write_text("")
    env.vars["OPREGISTRY_CONFIG"] = str(config)
    found = env.warm()
    assert "pctwo::g/CPU/active" in found["list"]["kernels"], found
    config.write_text('kernels = ["-pctwo::g:CPU"]\n')
    found = env.probe()
    assert "pctwo::g/CPU/disabled" in found["list"]["kernels"], found
    assert "pctwo::g/CPU/disabled" in found["torch"]["kernels"], found


def test_an_opregistry_variable(env: Env) -> None:
    env.op_dist("pc-one", "pcone", "f")
    _sees(env.warm(), "pcone::f")
    env.vars["OPREGISTRY_KERNELS"] = "-pcone::f:CPU"
    found = env.probe()
    assert "pcone::f/CPU/disabled" in found["list"]["kernels"], found
    assert "pcone::f/CPU/disabled" in found["torch"]["kernels"], found


def test_uninstall_a_backend(env: Env) -> None:
    """A backend of the environment goes: the kernels it served become inactive."""
    env.dist("pc-backend", "pc_backend", """
        from opregistry.backend import DeviceBackend
        backend = DeviceBackend("pcxpu", key="XPU")
    """, group="opregistry.backends", attr="backend")
    env.dist("pc-xpu-ops", "pc_xpu_ops", MODULE.format(ns="pcxpu", op="f", kmod="pc_kernels")
             .replace('{"cpu": ', '{"xpu": "pc_kernels:clone", "cpu": '))
    found = env.warm()
    assert "pcxpu::f/XPU/active" in found["list"]["kernels"], found
    shutil.rmtree(env.site / "pc_backend-1.0.dist-info")
    found = env.probe()
    assert "pcxpu::f/XPU/inactive" in found["list"]["kernels"], found
    assert "pcxpu::f/XPU/inactive" in found["torch"]["kernels"], found


def test_swap_two_distributions_on_sys_path(env: Env, tmp_path: Path) -> None:
    """Two folders hold a module of the same name: the first on sys.path is imported."""
    first, second = tmp_path / "first", tmp_path / "second"
    for folder, op in ((first, "from_first"), (second, "from_second")):
        folder.mkdir()
        (folder / "pc_shared.py").write_text(textwrap.dedent(MODULE.format(
            ns="pcshared", op=op, kmod="pc_kernels")))
    info = env.site / "pc_shared-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pc-shared\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[opregistry.ops]\npc-shared = pc_shared:lib\n")
    env.extra[:] = [first, second]
    _sees(env.warm(), "pcshared::from_first")
    env.extra[:] = [second, first]
    _sees(env.probe(), "pcshared::from_second")


def test_a_script_run_from_another_folder_reuses_the_entry(env: Env, tmp_path: Path) -> None:
    """``sys.path[0]`` (the working directory of ``python -c``, a script's folder) names no
    slot: a folder that holds nothing the plan depends on reuses the entry, for ``list`` and
    ``import torch`` alike, and the folder it was written from still does too."""
    env.op_dist("pc-one", "pcone", "f")
    env.warm()
    for folder in ("elsewhere", "elsewhere/deeper"):
        env.cwd = tmp_path / folder
        env.cwd.mkdir()
        (env.cwd / "notes.txt").write_text("a file of the user's, unrelated to the plan")
        found = env.probe()
        assert found["list"]["cache"] == found["torch"]["cache"] == "hit", found
        _sees(found, "pcone::f")
    env.cwd = tmp_path
    assert env.probe()["list"]["cache"] == "hit"


def test_a_module_in_another_folder_shadows_a_declaration_module(env: Env, tmp_path: Path) -> None:
    """A new working directory with a module named like a declaration module imports that
    one first: the entry written elsewhere is not used, there or back in its own folder."""
    env.op_dist("pc-one", "pcone", "f")
    env.warm()
    env.cwd = tmp_path / "shadowing"
    env.cwd.mkdir()
    (env.cwd / "pc_one.py").write_text(textwrap.dedent(MODULE.format(
        ns="pcone", op="g", kmod="pc_kernels")))
    found = env.probe()
    assert found["list"]["cache"] != "hit", found
    _sees(found, "pcone::g")
    _sees(found, "pcone::f", present=False)
    _sees(env.warm(), "pcone::g")  # its own entry, reused there
    env.cwd = tmp_path
    found = env.probe()
    _sees(found, "pcone::f")
    _sees(found, "pcone::g", present=False)


def test_folders_that_matter_and_folders_that_do_not_keep_their_entries(env: Env,
                                                                         tmp_path: Path) -> None:
    """A checkout holding a distribution (``sys.path[0]`` that matters) has a slot of its own:
    starts alternating between it and plain folders reuse both entries, for ``list``,
    ``import torch`` and a start with nothing to register alike."""
    plain, checkout = tmp_path / "plain", tmp_path / "checkout"
    plain.mkdir()
    checkout.mkdir()
    info = checkout / "pc_dev-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pc-dev\nVersion: 0.1\n")
    idle = ("import torch\nfrom opregistry.state import process\n"
            "print(process().deferred is not None)")
    for folder in (plain, checkout):
        env.cwd = folder
        env.warm(torch=False)
        env.run(idle)  # writes the entry of import torch and its idle marker
    for folder in (plain, checkout, plain, checkout):
        env.cwd = folder
        assert env.probe(torch=False)["list"]["cache"] == "hit", folder
        assert env.run(idle).split() == ["True"], folder
    env.op_dist("pc-one", "pcone", "f")
    for folder in (plain, checkout):
        env.cwd = folder
        env.warm()
    for folder in (plain, checkout, plain):
        env.cwd = folder
        found = env.probe()
        assert found["list"]["cache"] == found["torch"]["cache"] == "hit", (folder, found)
        _sees(found, "pcone::f")


def test_a_console_scripts_folder_is_a_plain_folder(env: Env, tmp_path: Path) -> None:
    """A process started from a console script (``opregistry list``, ``vllm serve``) has the
    scripts' folder as ``sys.path[0]``, with a file named like a top module (``opregistry``):
    no import finds an extensionless file, so the folder is a plain one and the entry made
    from another folder serves; a folder (a namespace package) of that name still matters."""
    env.op_dist("pc-one", "pcone", "f")
    plain, scripts, shadow = tmp_path / "plain", tmp_path / "bin", tmp_path / "shadow"
    for folder in (plain, scripts, shadow):
        folder.mkdir()
    for name in ("opregistry", "torchrun", "pc_one"):
        (scripts / name).write_text("#!/usr/bin/env python\n")
    (shadow / "pc_one").mkdir()  # a namespace package named like the declaration module
    env.cwd = plain
    env.warm()
    env.cwd = scripts
    found = env.probe()
    assert found["list"]["cache"] == found["torch"]["cache"] == "hit", found
    _sees(found, "pcone::f")
    env.cwd = shadow
    found = env.probe()
    assert found["list"]["cache"] == found["torch"]["cache"] == "miss", found


def test_a_distribution_in_another_folder(env: Env, tmp_path: Path) -> None:
    """A working directory holding a distribution's metadata installs it for ``python -c``."""
    env.op_dist("pc-one", "pcone", "f")
    env.warm()
    env.cwd = tmp_path / "with-a-dist"
    env.cwd.mkdir()
    env.op_dist("pc-two", "pctwo", "g", where=env.cwd)
    found = env.probe()
    _sees(found, "pctwo::g")
    _sees(found, "pcone::f")


def test_a_relative_configuration_file_in_another_folder(env: Env, tmp_path: Path) -> None:
    """``OPREGISTRY_CONFIG`` relative to the working directory: another folder, another file.
    Here the first folder's file allows the backends alone, so ``import torch`` there starts
    with nothing to register (an idle start, keyed by the variables); the other folder's
    allows everything, and its ``import torch`` registers the op package."""
    env.op_dist("pc-one", "pcone", "f")
    env.vars["OPREGISTRY_CONFIG"] = "settings.toml"
    (tmp_path / "settings.toml").write_text(f"plugins = {json.dumps(BACKENDS)}\n")
    code = ("import torch\nfrom opregistry.state import process\n"
            "print(process().deferred is not None, hasattr(torch.ops.pcone, 'f'))")
    env.run(code)
    assert env.run(code).split() == ["True", "False"]
    env.cwd = tmp_path / "other"
    env.cwd.mkdir()
    (env.cwd / "settings.toml").write_text("")
    assert env.run(code).split() == ["False", "True"]


def test_another_torch_sharing_the_cache_directory(env: Env, tmp_path: Path) -> None:
    """Another environment with another torch (its files read, never imported, by ``list``):
    a candidate's torch condition is evaluated again, never taken from the cache."""
    env.dist("pc-cond", "pc_cond", """
        from opregistry import Candidate, OpLibrary
        lib = OpLibrary("pccond")
        lib.define("f(Tensor x) -> Tensor", kernels={"cpu": [
            Candidate("pc_kernels:clone", when={"torch": ">=99.0"}), "pc_kernels:clone"]})
    """)
    found = env.warm(torch=False)
    assert "pccond::f/CPU/unmet" in found["list"]["kernels"], found
    fake = tmp_path / "othertorch" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('a stand-in: read, never imported')\n")
    (fake / "version.py").write_text("__version__ = '99.1.0'\ncuda = None\n")
    env.extra.append(fake.parent)
    found = env.probe(torch=False)
    assert "pccond::f/CPU/active" in found["list"]["kernels"], found
    env.extra.clear()
    found = env.probe(torch=False)  # back in the first environment: its own entry
    assert "pccond::f/CPU/unmet" in found["list"]["kernels"], found
    assert found["list"]["cache"] == "hit"


def test_python_platform_and_settings_name_the_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    """Python's version, the platform and every OPREGISTRY_* variable are in the slot."""
    s = Settings()
    base = inputs.slot(s, torch_imported=False, content=False, environ={})
    assert base == inputs.slot(s, torch_imported=False, content=False, environ={})
    assert base != inputs.slot(s, torch_imported=True, content=False, environ={})
    assert base != inputs.slot(s, torch_imported=False, content=False,
                               environ={"OPREGISTRY_STRICT": "1"})
    monkeypatch.setattr(sys, "version", sys.version + " other")
    assert base != inputs.slot(s, torch_imported=False, content=False, environ={})
    monkeypatch.undo()
    monkeypatch.setattr(sys, "platform", "other")
    assert base != inputs.slot(s, torch_imported=False, content=False, environ={})
    monkeypatch.undo()
    monkeypatch.setattr(sys, "prefix", sys.prefix + "-other")  # another environment
    assert base != inputs.slot(s, torch_imported=False, content=False, environ={})


def test_names_of_one_interpreter_share_its_slots(tmp_path: Path) -> None:
    """``python``, ``python3`` and the console scripts' ``python3.11`` of one environment are
    links to one file: one slot (``opregistry cache info`` of the console script reports
    the entry ``python -c "import torch"`` uses)."""
    folder = Path(sys.executable).parent
    names = [folder / n for n in ("python", "python3", f"python3.{sys.version_info[1]}")
             if (folder / n).exists()]
    assert len(names) >= 2, f"a virtual environment has several names for its python: {names}"
    code = ("import json; from opregistry import inputs; from opregistry.config import Settings;"
            "print(inputs.slot(Settings(), torch_imported=True, content=False, environ={}))")
    slots = {subprocess.run([str(path), "-c", code], capture_output=True, text=True,
                            check=True, cwd=str(tmp_path)).stdout for path in names}
    assert len(slots) == 1, slots


def test_every_setting_names_the_slot() -> None:
    """Each field of the settings and their policy changes the slot (a field added later
    must be added here: the field names are compared)."""
    from opregistry.config import Policy, Switch

    policy = {"allow_override": ["pc-a"], "backends": {"CPU": "pc-cpu"},
              "backend_sources": {"CPU": "a file"}, "kernels": [Switch.parse("-pc::f", "here")],
              "adopt": False, "adopt_block": ["pc-b"], "adopt_sources": {"adopt": "a file"}}
    settings = {"allow": ["pc-a"], "block": ["pc-b"], "strict": True, "sources": {"block": "x"},
                "unknown_variables": ("OPREGISTRY_TYPO",), "lock": "opregistry.lock",
                "policy": Policy(adopt=False)}
    assert set(policy) == {f.name for f in attrs.fields(Policy)}
    assert set(settings) == {f.name for f in attrs.fields(Settings)}
    base = inputs.slot(Settings(), torch_imported=True, content=False, environ={})
    for name, value in policy.items():
        changed = Settings(policy=attrs.evolve(Policy(), **{name: value}))
        assert inputs.slot(changed, torch_imported=True, content=False, environ={}) != base, name
    for name, value in settings.items():
        changed = attrs.evolve(Settings(), **{name: value})
        assert inputs.slot(changed, torch_imported=True, content=False, environ={}) != base, name


def test_opregistry_itself_is_an_input(env: Env) -> None:
    """opregistry's own files (an editable checkout, a new version) are in the manifest."""
    env.op_dist("pc-one", "pcone", "f")
    env.warm(torch=False)
    [entry] = [_header(p) for p in (env.cache / "plans").glob("*.json")]
    files = entry["value"]["manifest"]["files"]
    assert str(ROOT / "opregistry" / "resolver" / "impls.py") in files
    assert str(env.site / "pc_one.py") in files


# -- conditions are never frozen -----------------------------------------------------------


def test_backend_availability_is_asked_at_every_load(env: Env) -> None:
    env.dist("pc-backend", "pc_backend", """
        import os
        from opregistry.backend import DeviceBackend
        backend = DeviceBackend("pcxpu", key="XPU",
                                available=lambda: os.environ.get("PC_XPU") == "1")
    """, group="opregistry.backends", attr="backend")
    env.dist("pc-xpu-ops", "pc_xpu_ops", MODULE.format(ns="pcxpu", op="f", kmod="pc_kernels")
             .replace('{"cpu": ', '{"xpu": "pc_kernels:clone", "cpu": '))
    found = env.warm(torch=False)
    assert "pcxpu::f/XPU/unavailable" in found["list"]["kernels"], found
    found = env.probe(torch=False, PC_XPU="1")
    assert "pcxpu::f/XPU/active" in found["list"]["kernels"], found
    assert found["list"]["cache"] == "resolved"


# -- what cannot be cached, and doctor -------------------------------------------------------


def test_a_decorator_style_package_is_not_cached(env: Env) -> None:
    env.dist("pc-deco", "pc_deco", """
        from opregistry import OpLibrary
        lib = OpLibrary("pcdeco")
        def clone(x):
            return x.clone()
        lib.define("f(Tensor x) -> Tensor", kernels={"cpu": clone})
    """)
    env.probe(torch=False)
    found = env.probe(torch=False)
    assert found["list"]["cache"] == "uncacheable"
    _sees(found, "pcdeco::f")
    info = subprocess.run([sys.executable, "-m", "opregistry", "cache", "info", "--json"],
                          capture_output=True, text=True, env=env.environ(),
                          cwd=str(env.site.parent))
    status = json.loads(info.stdout)["this_environment"]["opregistry list"]
    assert status["status"] == "uncacheable" and "pc-deco" in status["reason"], status


def test_doctor_names_a_distribution_whose_declarations_are_not_data(env: Env) -> None:
    env.dist("pc-drift", "pc_drift", """
        import os
        from opregistry import OpLibrary
        lib = OpLibrary("pcdrift")
        lib.define(os.environ.get("PC_NAME", "a") + "(Tensor x) -> Tensor",
                   kernels={"cpu": "pc_kernels:clone"})
    """)
    env.warm(torch=False)
    found = env.probe(torch=False, PC_NAME="b")
    assert found["list"]["ops"] == ["pcdrift::a"]  # the contract broken: a stale plan
    done = subprocess.run([sys.executable, "-m", "opregistry", "doctor", "--json"],
                          capture_output=True, text=True, env={**env.environ(), "PC_NAME": "b"},
                          cwd=str(env.site.parent))
    problems = json.loads(done.stdout)["problems"]
    [drift] = [p for p in problems if p["code"] == "cache-declarations-differ"]
    assert drift["distributions"][0]["name"] == "pc-drift"
    assert done.returncode == 1
    clean = subprocess.run([sys.executable, "-m", "opregistry", "doctor", "--json"],
                           capture_output=True, text=True, env=env.environ(),
                           cwd=str(env.site.parent))
    assert "cache-declarations-differ" not in clean.stdout


# -- robust ------------------------------------------------------------------------------


def _entry(env: Env) -> Path:
    [path] = list((env.cache / "plans").glob("*.json"))
    return path


@pytest.mark.parametrize("damage", ["truncated", "not json", "foreign version", "malformed",
                                    "unreadable"])
def test_a_bad_entry_is_ignored_and_rebuilt(env: Env, damage: str) -> None:
    env.op_dist("pc-one", "pcone", "f")
    env.warm(torch=False)
    path = _entry(env)
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif damage == "not json":
        path.write_bytes(b"\x00\xffnot json")
    elif damage == "foreign version":
        rewrite_entry(path, lambda header, sections: header.update(stamp="plan-999"))
    elif damage == "malformed":
        rewrite_entry(path, lambda header, sections: sections["plan"].update(
            ops=[["not", "an", "op"]]))
    else:  # a folder where the file should be: unreadable whoever runs the test
        path.unlink()
        path.mkdir()
    found = env.probe(torch=False)
    assert found["list"]["ops"] == ["pcone::f"] and found["list"]["errors"] == []
    assert found["list"]["cache"] == "miss"


@pytest.mark.parametrize("where", ["a file", "missing"])
def test_an_unusable_cache_directory_means_no_cache(env: Env, tmp_path: Path, where: str) -> None:
    env.op_dist("pc-one", "pcone", "f")
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    env.cache = blocker / "cache" if where == "a file" else tmp_path / "new" / "deeper"
    for _ in range(2):
        found = env.probe(torch=False)
        assert found["list"]["ops"] == ["pcone::f"]
    assert found["list"]["cache"] == ("miss" if where == "a file" else "hit")


def test_cache_off(env: Env) -> None:
    env.op_dist("pc-one", "pcone", "f")
    found = env.probe(OPREGISTRY_CACHE="0")
    assert found["list"]["cache"] == found["torch"]["cache"] == "off"
    assert not env.cache.exists()


def test_sixteen_processes_at_once_build_once(env: Env) -> None:
    """DataLoader workers, torchrun ranks: one process builds, the others wait and read it."""
    for i in range(20):
        env.op_dist(f"pc-many-{i}", f"pcmany{i}", "f")
    procs = [subprocess.Popen([sys.executable, "-c", PROBE], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env.environ(),
                              cwd=str(env.site.parent)) for _ in range(16)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1])["list"])
    assert all(r["ops"] == results[0]["ops"] for r in results) and len(results[0]["ops"]) == 20
    outcomes = sorted(r["cache"] for r in results)
    assert outcomes.count("miss") == 1, outcomes
    assert env.probe(torch=False)["list"]["cache"] == "hit"
    assert not [p for p in (env.cache / "plans").iterdir() if p.name.startswith(".tmp")]


def test_a_held_lock_times_out_and_the_process_builds(tmp_path: Path, monkeypatch) -> None:
    import opregistry
    from opregistry.state import process

    monkeypatch.setenv("OPREGISTRY_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(plancache, "LOCK_TIMEOUT", 0.2)
    cache = plancache.PlanCache(Settings.from_env(allow=frozenset(BACKENDS)),
                                torch_imported=False)
    with cache.disk.lock(cache.key, 1.0) as held:
        assert held
        started = time.monotonic()
        plan = opregistry.plan(plugins=BACKENDS)
        assert time.monotonic() - started < 20
    assert process().plan_cache == "miss" and plan.backends


def test_locked_mode_proves_files_before_a_cached_plan_is_used(env: Env, tmp_path: Path) -> None:
    env.op_dist("pc-one", "pcone", "f")
    lock = tmp_path / "reg.lock"
    done = subprocess.run([sys.executable, "-m", "opregistry", "lock", "-o", str(lock)],
                          capture_output=True, text=True, env=env.environ(),
                          cwd=str(env.site.parent))
    assert done.returncode == 0, done.stderr
    env.vars["OPREGISTRY_LOCK"] = str(lock)
    _sees(env.warm(torch=False), "pcone::f")
    path = env.site / "pc_one.py"
    before = path.stat()
    path.write_text(path.read_text().replace('"f(', '"g('))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    found = env.probe(torch=False)
    assert "lock-mismatch" in found["list"]["errors"], found
    _sees(found, "pcone::f", present=False)


def test_cache_command_info_and_clear(env: Env) -> None:
    env.op_dist("pc-one", "pcone", "f")
    env.warm(torch=False)

    def cli(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "opregistry", "cache", *args],
                              capture_output=True, text=True, env=env.environ(),
                              cwd=str(env.site.parent))
        assert done.returncode == 0, done.stderr
        return done.stdout

    info = json.loads(cli("info", "--json"))
    assert info["directory"] == str(env.cache / "plans") and info["entries"] == 1
    assert info["this_environment"]["opregistry list"]["status"] == "valid"
    assert "removed 1 plan cache entry" in cli("clear")
    assert json.loads(cli("info", "--json"))["entries"] == 0


def test_cache_info_reports_the_entry_a_lookup_would_use(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """The slot of the command's own ``sys.path[0]`` (a console script's folder) may hold a
    stale entry no ``import torch`` reads, while the shared slot's entry holds: ``cache
    info`` says what ``lookup`` does -- valid -- and stale only when no entry holds."""
    import types

    entries = {"own": {"manifest": "old"},
               "shared": {"manifest": "new", "plan": {"ops": {"a::b": 0}, "distributions": [0]}}}
    monkeypatch.setattr(plancache.inputs, "check_manifest",
                        lambda m: "site-packages changed" if m == "old" else None)

    def slot(*keys: str) -> Any:
        return types.SimpleNamespace(keys=keys, enabled=True, key=None, marker=lambda: None,
                                     disk=types.SimpleNamespace(load=entries.get))

    both = slot("own", "shared")
    assert plancache._status(both) == {"status": "valid", "ops": 1, "distributions": 1,
                                       "registers_nothing": False}
    assert both.key == "shared"
    assert plancache._status(slot("own")) == {"status": "stale",
                                              "changed": "site-packages changed"}
    assert plancache._status(slot("none")) == {"status": "none"}


def test_cache_clear_says_what_it_could_not_remove(tmp_path: Path) -> None:
    """An OPREGISTRY_CACHE_DIR that is not a folder: named on stderr, exit 1 -- not "removed
    0 entries" and success, with the cache (or the mistake) left as it was."""
    not_a_folder = tmp_path / "cache-file"
    not_a_folder.write_text("")
    done = subprocess.run([sys.executable, "-m", "opregistry", "cache", "clear"],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OPREGISTRY_CACHE_DIR": str(not_a_folder)})
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "could not remove" in done.stderr and str(not_a_folder) in done.stderr


# -- the codec -----------------------------------------------------------------------------


def test_codec_round_trip_of_the_installed_registry() -> None:
    """Every record of this environment's declarations and plan survives the round trip."""
    from opregistry.collect import collect
    from opregistry.discovery import discover
    from opregistry.environment import read_environment
    from opregistry.resolver import resolve

    decl = collect(discover(Settings())).declarations
    plan = resolve(decl, environment=read_environment(decl))
    enc = codec.Encoder()
    data = json.loads(json.dumps({"d": enc.declarations(decl), "p": enc.plan(plan),
                                  "o": enc.table()}))
    dec = codec.Decoder(data["o"], data["d"])
    assert dec.declarations() == decl
    again = dec.plan(data["p"])
    assert again == plan and again.to_dict() == plan.to_dict()


# -- the property: cached and uncached runs give equal plans ---------------------------------

_CHANGES = st.lists(st.sampled_from(["install", "uninstall", "edit", "edit-same-size",
                                     "variable", "nothing"]), min_size=1, max_size=4)


def _plan_dict(env: Env, **extra: str) -> str:
    code = "import json, opregistry; print(json.dumps(opregistry.plan().to_dict()))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**env.environ(), **extra}, cwd=str(env.site.parent), timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(changes=_CHANGES)
def test_cached_and_uncached_plans_are_equal(tmp_path_factory: pytest.TempPathFactory,
                                             changes: list[str]) -> None:
    env = Env(tmp_path_factory.mktemp("prop"))
    env.op_dist("pc-base", "pcbase", "f")
    installed = []
    for step, change in enumerate(changes):
        if change == "install":
            installed.append(env.op_dist(f"pc-new-{step}", f"pcnew{step}", "g"))
        elif change == "uninstall" and installed:
            shutil.rmtree(installed.pop())
        elif change in ("edit", "edit-same-size"):
            path = env.site / "pc_base.py"
            text = path.read_text()
            path.write_text(text.replace("Tensor x", "Tensor y") if change == "edit-same-size"
                            else text + f"lib.define('e{step}(Tensor x) -> Tensor', "
                                        f"kernels={{'cpu': 'pc_kernels:clone'}})\n")
        elif change == "variable":
            env.vars["OPREGISTRY_ALLOW_OVERRIDE"] = f"ns{step}"
        cached = _plan_dict(env)
        assert cached == _plan_dict(env)  # again: from the cache
        assert cached == _plan_dict(env, OPREGISTRY_CACHE="0")


def test_a_package_that_registers_with_torch_by_itself_changes(env: Env) -> None:
    """The scan of packages that use torch.library directly is an input: its files are stamped."""
    info = env.site / "pc_foreign-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pc-foreign\nVersion: 1.0\n"
                                   "Requires-Dist: torch\n")
    module = env.site / "pc_foreign.py"
    module.write_text('import torch\nlib = torch.library.Library("pcheld", "DEF")\n'
                      'lib.define("f(Tensor x) -> Tensor")\n')
    (info / "RECORD").write_text("pc_foreign.py,,\npc_foreign-1.0.dist-info/METADATA,,\n"
                                 "pc_foreign-1.0.dist-info/RECORD,,\n")
    env.op_dist("pc-one", "pcheld", "g")
    found = env.warm(torch=False)
    assert "namespace-held-by-package" in found["list"]["errors"], found
    module.write_text(module.read_text().replace('"pcheld"', '"pcelsewhere"'))
    found = env.probe(torch=False)
    assert found["list"]["errors"] == [] and "pcheld::g" in found["list"]["ops"], found


def test_a_package_that_only_mentions_torch_is_stamped_by_its_record(env: Env) -> None:
    """A distribution whose sources mention torch but register nothing (numpy, sympy) is
    stamped by METADATA and RECORD, which every install rewrites, not file by file."""
    info = env.site / "pc_user-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pc-user\nVersion: 1.0\n")
    module = env.site / "pc_user.py"
    module.write_text("import torch\n\ndef f():\n    return torch.ones(1)\n")
    record = info / "RECORD"
    record.write_text("pc_user.py,,\npc_user-1.0.dist-info/METADATA,,\n"
                      "pc_user-1.0.dist-info/RECORD,,\n")
    env.op_dist("pc-one", "pcheld", "g")
    env.warm(torch=False)
    [entry] = list((env.cache / "plans").glob("*.json"))
    stamped = _header(entry)["value"]["manifest"]["files"]
    assert str(record) in stamped and str(module) not in stamped, sorted(stamped)
    # reinstalled registering a namespace: pip writes RECORD again
    module.write_text('import torch\nlib = torch.library.Library("pcheld", "DEF")\n')
    record.write_text(record.read_text() + "pc_user-1.0.dist-info/INSTALLER,,\n")
    found = env.probe(torch=False)
    assert "namespace-held-by-package" in found["list"]["errors"], found


def test_a_package_without_record_is_stamped_file_by_file(env: Env) -> None:
    """A distribution with no ``RECORD`` (a hand-made ``dist-info`` on ``PYTHONPATH``, a
    legacy develop install): its sources change without its metadata, so they are stamped."""
    info = env.site / "pc_norecord-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pc-norecord\nVersion: 1.0\n")
    (info / "top_level.txt").write_text("pc_norecord\n")
    module = env.site / "pc_norecord.py"
    module.write_text("import torch\n\ndef f():\n    return torch.ones(1)\n")
    env.op_dist("pc-one", "pcheld", "g")
    env.warm(torch=False)
    module.write_text('import torch\nlib = torch.library.Library("pcheld", "DEF")\n')
    found = env.probe(torch=False)
    assert "namespace-held-by-package" in found["list"]["errors"], found


def test_a_warm_import_torch_runs_no_declaration_code(env: Env) -> None:
    """A cached plan is registered without the declarations: no declaration module, no
    resolver, not even opregistry's declaration API (``opregistry`` imports it on first use)."""
    env.op_dist("pc-one", "pcone", "f")
    env.warm()
    out = env.run(
        "import sys, torch\n"
        "from opregistry.state import process\n"
        "assert torch.ops.pcone.f(torch.ones(2)).tolist() == [1.0, 1.0]\n"
        "print(process().plan_cache, sorted(m for m in sys.modules if m == 'pc_one' or "
        "m.startswith(('opregistry.declare', 'opregistry.resolver', 'opregistry.scan'))))")
    assert out.split(None, 1) == ["hit", "[]\n"], out
    import opregistry  # the public API still answers every name it lists

    assert all(getattr(opregistry, name) is not None for name in opregistry.__all__)
    assert set(opregistry.__all__) <= set(dir(opregistry))
    assert opregistry.OpLibrary is __import__("opregistry.declare").declare.OpLibrary


IDLE_CHILD = r"""
import json, sys, torch
from opregistry.state import process
deferred = process().deferred is not None
imported = sorted(m for m in sys.modules if m.startswith(
    ("opregistry.registry", "opregistry.model", "opregistry.codec", "opregistry.schema",
     "opregistry.locate", "opregistry.config", "attr", "pluggy", "opregistry_cpu",
     "opregistry_meta")))
lib = torch.library.Library("pcidle", "DEF")  # after import torch: attributed, as after a load
lib.define("f(Tensor x) -> Tensor")
site = process().recorder.sites.get(("pcidle::f", "schema"))
import opregistry
r = opregistry.get_registry()
assert opregistry.load(block=["opregistry-cpu"]) is r  # the deferred load's registry
print(json.dumps({"deferred": deferred, "imported": imported, "site": site,
                  "cache": process().plan_cache, "ops": len(r.ops),
                  "backends": sorted(b.backend.name for b in r.plan.backends),
                  "problems": sorted(p.code for p in r.problems)}))
"""


def test_a_warm_start_with_nothing_to_register_imports_no_pipeline(env: Env) -> None:
    """opregistry installed with its backends and no op package: the cached plan registers
    nothing, so ``import torch`` reads its entry and stops there (no backend, pluggy, record
    class or decoder imported); the registry is loaded when asked for, the same as a load
    without the cache, and what is registered with torch meanwhile is attributed."""
    def run(**extra: str) -> dict[str, Any]:
        return json.loads(env.run(IDLE_CHILD, **extra).strip().splitlines()[-1])

    cold = run()
    assert not cold["deferred"] and "opregistry.registry" in cold["imported"], cold
    warm = run()
    assert warm["deferred"] and warm["imported"] == [], warm
    assert warm["site"] and warm["site"].startswith("<string>:"), warm
    uncached = run(OPREGISTRY_CACHE="0")
    assert not uncached["deferred"] and uncached["cache"] == "off", uncached
    for found in (cold, warm):
        assert {k: found[k] for k in ("ops", "backends", "problems")} == {
            k: uncached[k] for k in ("ops", "backends", "problems")}
    assert warm["ops"] == 0 and "cpu" in warm["backends"]


#: a package that registers with torch.library by itself (adopted lazily): ``pcad::scale`` at
#: its import, ``pcad2::twice`` in a module it does not import (torchao's prototypes)
ADOPTED = {
    "pc_adopt/__init__.py": """
        import torch

        torch.library.define("pcad::scale", "(Tensor x, float f) -> Tensor")


        @torch.library.register_kernel("pcad::scale", "default")
        def _(x, f):
            return x * f


        @torch.library.register_kernel("pcad::scale", "cpu")
        def _(x, f):
            return x * f + 1000
    """,
    "pc_adopt/extra.py": """
        import torch


        @torch.library.custom_op("pcad2::twice", mutates_args=())
        def twice(x: torch.Tensor) -> torch.Tensor:
            return x * 2
    """,
}
ADOPTED_CHILD = r"""
import json, sys, torch
from opregistry.state import process
adopter = type(process().adopter).__name__ if process().adopter is not None else None
deferred = process().deferred is not None
imported = sorted(m for m in sys.modules if m.startswith(
    ("pc_adopt", "opregistry.registry", "opregistry.adopting", "pluggy", "attr")))
first = sys.argv[1]
out = {}
for what in (first, *{"ns": ["op"], "op": ["ns"]}[first]):
    if what == "ns":
        out["scale"] = torch.ops.pcad.scale(torch.ones(2), 3.0).tolist()
    else:
        out["twice"] = torch.ops.pcad2.twice(torch.ones(1)).tolist()
import opregistry
r = opregistry.get_registry()
print(json.dumps({"adopter": adopter, "deferred": deferred, "imported": imported, "out": out,
                  "cache": process().plan_cache, "outcomes": r.adopter.outcomes,
                  "now": type(process().adopter).__name__,
                  "adopted": [[a.name, a.status, a.load] for a in r.plan.adoptions],
                  "problems": sorted(p.code for p in r.problems)}))
"""


@pytest.mark.parametrize("first", ["ns", "op"])
def test_a_warm_start_that_only_adopts_lazily_waits_for_the_first_touch(env: Env,
                                                                        first: str) -> None:
    """Only a package that registers by itself (vllm, bitsandbytes): nothing to register at
    ``import torch``, so a warm start loads nothing there (no pipeline, no package imported);
    the first touch of the adopted namespace -- or the lookup of an op a module the package
    does not import defines -- loads the registry, which adopts as a load at ``import torch``
    would have: the same outputs, outcomes and plan as without the cache."""
    adoption_dists.write(env.site, "pc-adopt", ADOPTED)

    def run(**extra: str) -> dict[str, Any]:
        return json.loads(env.run(ADOPTED_CHILD, first, **extra).strip().splitlines()[-1])

    cold = run()
    assert not cold["deferred"] and cold["adopter"] == "Adopter", cold
    warm = run()
    assert warm["deferred"] and warm["adopter"] == "Waiting" and warm["imported"] == [], warm
    # loaded after import torch, from the entry as it is: torch's own late namespaces
    # (torch._native's, defined after the autoload) do not make it resolve the plan again
    assert warm["now"] == "Adopter" and warm["cache"] == "hit", warm
    uncached = run(OPREGISTRY_CACHE="0")
    assert uncached["cache"] == "off" and not uncached["deferred"], uncached
    same = ("out", "outcomes", "adopted", "problems")
    for found in (cold, warm):
        assert {k: found[k] for k in same} == {k: uncached[k] for k in same}, (found, uncached)
    assert warm["out"] == {"scale": [1003.0, 1003.0], "twice": [2.0]}, warm
    assert warm["outcomes"] == {"pc-adopt": "imported"} and not warm["problems"], warm


BROKEN_CHILD = r"""
import json, torch
from opregistry.state import process
adopter = type(process().adopter).__name__
try:
    torch.ops.pcbk.missing
    message = None
except AttributeError as exc:
    message = str(exc)
print(json.dumps({"adopter": adopter, "message": message, "cache": process().plan_cache}))
"""


def test_an_op_missing_after_a_failed_adoption_says_why_on_a_warm_start(env: Env) -> None:
    """The waiting adopter hands the lookup to the loaded registry's: an op missing because
    the adopted package failed to import says so, the same as after a load at import torch."""
    adoption_dists.write(env.site, "pc-broken", {"pc_broken/__init__.py": """
        import torch

        torch.library.define("pcbk::op", "(Tensor x) -> Tensor")
        raise ImportError("built for another torch")
    """})
    found = [json.loads(env.run(BROKEN_CHILD).strip().splitlines()[-1]) for _ in range(2)]
    assert [f["adopter"] for f in found] == ["Adopter", "Waiting"], found
    assert found[1]["cache"] == "hit", found
    for f in found:
        assert f["message"] == (
            "'_OpNamespace' 'pcbk' object has no attribute 'missing': pc-broken==1.0, adopted "
            "by opregistry for torch.ops.pcbk, failed to import (importing pc_broken: "
            "ImportError: built for another torch); import pc_broken yourself to see the "
            "whole error"), f


@pytest.mark.parametrize("case", ["switch", "eager"])
def test_an_adoption_that_must_act_at_import_torch_takes_the_full_load(env: Env,
                                                                      case: str) -> None:
    """A kernel switch on an adopted package applies as the package registers, and an eager
    adoption imports it at load: ``import torch`` loads the registry, cache or not."""
    if case == "switch":
        adoption_dists.write(env.site, "pc-adopt", ADOPTED)
        env.vars["OPREGISTRY_KERNELS"] = "-pcad::scale:CPU"
    else:
        adoption_dists.write(env.site, "pc-adopt", ADOPTED,
                             entry_points="[opregistry.adopt.eager]\npcad = pc_adopt\n")
    for _ in range(2):
        found = json.loads(env.run(ADOPTED_CHILD, "ns").strip().splitlines()[-1])
        assert not found["deferred"] and found["adopter"] == "Adopter", found
    assert found["cache"] == "hit", found
    if case == "switch":  # the package's CPU kernel left out: its default kernel serves
        assert found["out"]["scale"] == [3.0, 3.0], found
    else:
        assert "pc_adopt" in found["imported"], found


def test_threads_asking_for_a_deferred_registry_all_wait_for_it(env: Env) -> None:
    """After a start with nothing to register, threads that ask for the registry while the
    first of them loads it wait for that load: each gets the same registry, never ``None``."""
    code = ("import threading, torch, opregistry\n"
            "from opregistry.state import process\n"
            "assert process().deferred is not None\n"
            "got, start = [], threading.Barrier(8)\n"
            "def ask():\n"
            "    start.wait()\n"
            "    got.append(opregistry.get_registry())\n"
            "threads = [threading.Thread(target=ask) for _ in range(8)]\n"
            "[t.start() for t in threads]\n"
            "[t.join() for t in threads]\n"
            "print(len(got), sum(r is None for r in got), len({id(r) for r in got}),\n"
            "      process().deferred, got[0] is opregistry.load())")
    env.run(IDLE_CHILD)  # writes the entry and its idle marker
    assert env.run(code).split()[-5:] == ["8", "0", "1", "None", "True"]


def test_a_new_op_package_ends_the_start_with_nothing_to_register(env: Env) -> None:
    """Installing an op package where the cached plan registered nothing: the next
    ``import torch`` sees the entry stale and registers the package's op."""
    def marked() -> bool:
        info = json.loads(env.run("from opregistry.cli import main; main(['cache', 'info', "
                                  "'--json'])"))
        return bool(info["this_environment"]["import torch"].get("registers_nothing"))

    env.run(IDLE_CHILD)
    assert json.loads(env.run(IDLE_CHILD).strip().splitlines()[-1])["deferred"]
    assert marked()
    env.op_dist("pc-one", "pcone", "f")
    out = env.run("import torch\nfrom opregistry.state import process\n"
                  "print(process().deferred, torch.ops.pcone.f(torch.ones(2)).tolist())")
    assert out.split() == ["None", "[1.0,", "1.0]"], out
    assert not marked()  # the entry written for the new plan took its marker away


def test_a_load_with_its_own_settings_leaves_import_torch_alone(env: Env) -> None:
    """``load(reload=True, block=[...])`` that registers nothing marks no idle start for
    ``import torch`` in the same variables: the next one registers the blocked package."""
    env.op_dist("pc-one", "pcone", "f")
    env.run("import os, torch, opregistry\n"
            "block = ['pc-one', *os.environ['OPREGISTRY_BLOCK'].split(',')]\n"
            "assert not opregistry.load(reload=True, block=block).ops")
    out = env.run("import torch\nfrom opregistry.state import process\n"
                  "print(process().deferred, torch.ops.pcone.f(torch.ones(2)).tolist())")
    assert out.split() == ["None", "[1.0,", "1.0]"], out


def test_counting_kernels_takes_the_full_load(env: Env) -> None:
    """``OPREGISTRY_KERNEL_COUNTS`` prints a table at exit, made by the load: never deferred,
    though the cached plan registers nothing."""
    def deferred() -> bool:
        out = env.run(IDLE_CHILD, OPREGISTRY_KERNEL_COUNTS="1")
        return bool(json.loads(out.strip().splitlines()[-1])["deferred"])

    assert (deferred(), deferred()) == (False, False)
    assert json.loads(env.run(IDLE_CHILD).strip().splitlines()[-1])["deferred"] is False
    assert json.loads(env.run(IDLE_CHILD).strip().splitlines()[-1])["deferred"] is True


def test_a_warm_registry_keeps_no_plan_records_and_decodes_them_when_asked(env: Env) -> None:
    """After a cache hit the registry holds the entry's bytes, not the plan's records (~15 per
    op, visited by every full collection); asked, it decodes the same plan again."""
    env.op_dist("pc-one", "pcone", "f")
    env.op_dist("pc-two", "pctwo", "g")
    child = (
        "import gc, json, torch, opregistry\n"
        "from opregistry.model import Problem\n"
        "from opregistry.plans import KernelPlan, OpPlan\n"
        "from opregistry.state import process\n"
        "def records():\n"
        "    return sum(type(o) in (OpPlan, KernelPlan) for o in gc.get_objects())\n"
        "r = opregistry.get_registry()\n"
        "assert opregistry.load() is r\n"  # the registry of the first load, nothing decoded
        "kept = records()\n"
        "seen = {'ops': sorted(op.op.qualname for op in r.ops), 'kernels': sorted(\n"
        "    f'{k.kernel.op}/{k.kernel.key}/{k.status}' for k in r.kernels)}\n"
        "r.add_problem(Problem(code='adoption-import-failed', message='m', hint='h'))\n"
        "r.release()\n"
        "problems = [p.code for p in r.problems]\n"
        "r.unload()\n"
        "print(json.dumps({'cache': process().plan_cache, 'kept': kept, 'after': records(),\n"
        "                  'seen': seen, 'problems': problems, 'unloaded': len(r.ops)}))\n")

    def run(**extra: str) -> dict[str, Any]:
        return json.loads(env.run(child, **extra).strip().splitlines()[-1])

    uncached = run(OPREGISTRY_CACHE="0")
    assert uncached["kept"] > 0  # a plan that cannot be decoded again is kept
    run()
    warm = run()
    assert warm["cache"] == "hit"
    assert warm["kept"] == 0, warm
    assert warm["after"] > 0  # asked, the registry decoded its plan
    assert warm["seen"] == uncached["seen"]
    assert {"pcone::f", "pctwo::g"} <= set(warm["seen"]["ops"])
    assert warm["problems"] == uncached["problems"]
    assert warm["problems"][-1] == "adoption-import-failed"
    assert warm["unloaded"] == uncached["unloaded"] == 0


def test_the_package_imports_its_submodules_on_first_use() -> None:
    """After ``import opregistry``, a submodule is reachable as an attribute; a name that is
    neither public nor a submodule is an AttributeError."""
    done = subprocess.run(
        [sys.executable, "-c",
         "import sys, opregistry\n"
         "assert 'opregistry.model' not in sys.modules\n"
         "assert opregistry.model.OpDef is opregistry.OpDef\n"
         "assert opregistry.report.__name__ == 'opregistry.report'\n"
         "assert not hasattr(opregistry, 'no_such_name')\n"
         "print('ok')"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_list_json_is_printed_from_the_listing_of_the_cached_plan(env: Env) -> None:
    """``opregistry list --json`` keeps the listing of a cached plan: the same bytes, never stale."""
    env.op_dist("pc-one", "pcone", "f")

    def listing(*args: str, status: int = 0) -> str:
        done = subprocess.run([sys.executable, "-m", "opregistry", "list", "--json", *args],
                              capture_output=True, text=True, env=env.environ(),
                              cwd=str(env.site.parent))
        assert done.returncode == status, done.stderr
        return done.stdout

    first, second, third = listing(), listing(), listing()
    assert first == second == third
    [kept] = list((env.cache / "listings").glob("*.json"))
    header = json.loads(kept.read_bytes().split(b"\n", 1)[0])
    assert header["value"] == {"errors": False}
    cache = DiskCache(str(kept.parent), header["stamp"])
    text = cache.load(header["key"]).raw("text").decode()
    assert text == first  # kept as it was printed
    cache.store(header["key"], {"errors": True},
                sections={"text": text.replace("pcone::f", "pcone::kept").encode()})
    # printed from the kept listing, not made again, with the status it was kept with
    assert '"pcone::kept"' in listing(status=1)
    data = kept.read_bytes()
    kept.write_bytes(data.replace(b'"pcone::kept"', b'"pcone::kepT"'))  # the CRC sees it
    assert listing() == first  # made again, and kept again
    path = env.site / "pc_one.py"
    path.write_text(path.read_text().replace('"f(', '"g('))
    shutil.rmtree(env.site / "__pycache__")  # same size, maybe the same second: see above
    after = listing()
    assert '"pcone::g"' in after and '"pcone::f"' not in after
    assert listing() == after
    assert json.loads(listing("-n", "pcone"))["ops"][0]["name"] == "pcone::g"


def test_old_entries_are_pruned(tmp_path: Path) -> None:
    from opregistry.diskcache import DiskCache

    disk = DiskCache.open("things", stamp="v1", environ={"OPREGISTRY_CACHE_DIR": str(tmp_path)})
    for i in range(5):
        assert disk.store(f"k{i}", i)
        os.utime(disk.path(f"k{i}"), ns=(i * 10**9, i * 10**9))
    assert disk.prune(2) == 3
    assert [disk.load(f"k{i}") for i in range(5)] == [None, None, None, 3, 4]


def test_the_backends_group_is_discoverys() -> None:
    from opregistry.discovery import BACKENDS_GROUP

    assert plancache.BACKENDS_GROUP == BACKENDS_GROUP


def test_the_codec_writes_every_field_of_every_record() -> None:
    """A field added to a record must be added to the codec: this fails until it is."""
    import importlib

    import attrs

    modules = [importlib.import_module(f"opregistry.{m}")
               for m in ("model", "plans", "conditions", "references", "environment", "adoption",
                         "foreign")]
    for name, fields in codec.ENCODED.items():
        [cls] = {getattr(m, name) for m in modules if isinstance(getattr(m, name, None), type)}
        assert tuple(a.name for a in attrs.fields(cls)) == fields, name


ADOPTION_PROBE = r"""
import json, sys
import torch
import opregistry
from opregistry.state import process
r = opregistry.get_registry()
before = "pcfp" in sys.modules
out = torch.ops.pcfp.scale(torch.ones(1), 3.0).item()
print(json.dumps({"cache": process().plan_cache, "imported_at_load": before, "out": out,
                  "errors": sorted(p.code for p in r.plan.errors),
                  "adopted": [a.name for a in r.plan.adoptions if a.active]}))
"""


def test_a_cached_plan_adopts_and_protects_as_a_fresh_one(env: Env) -> None:
    """Adoption and the foreign owners come from the cached plan: lazy import, the same refusal."""
    from . import adoption_dists

    adoption_dists.write(env.site, "pcfp", {"pcfp/__init__.py": """
        import torch
        lib = torch.library.Library("pcfp", "DEF")
        lib.define("scale(Tensor x, float f) -> Tensor")
        lib.impl("scale", lambda x, f: x * f, "CompositeExplicitAutograd")
    """})
    env.op_dist("pc-claim", "pcfp", "twice")  # a DEF of the package's namespace: refused
    runs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", ADOPTION_PROBE], capture_output=True,
                              text=True, env=env.environ(), cwd=str(env.site.parent), timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert [r["cache"] for r in runs] == ["miss", "hit"]
    for found in runs:
        assert found["errors"] == ["namespace-held-by-package"]
        assert found["adopted"] == ["pcfp"] and not found["imported_at_load"]
        assert found["out"] == 3.0


def test_load_with_a_policy_of_its_own_on_adoption_is_not_the_cached_plan(env: Env) -> None:
    """``load(policy=Policy(adopt=False))`` (or ``adopt_block``) after ``import torch`` adopted
    from the cache: its plan adopts nothing (the adoption switches name the slot too)."""
    from . import adoption_dists

    adoption_dists.write(env.site, "pcfp", {"pcfp/__init__.py": """
        import torch
        lib = torch.library.Library("pcfp", "DEF")
        lib.define("scale(Tensor x, float f) -> Tensor")
    """})
    code = ("import torch, opregistry\n"
            "from opregistry.config import Policy\n"
            "print([a.name for a in opregistry.load().plan.adoptions if a.active])\n"
            "for policy in (Policy(adopt=False), Policy(adopt_block=['pcfp'])):\n"
            "    r = opregistry.load(reload=True, policy=policy)\n"
            "    print([a.name for a in r.plan.adoptions if a.active])\n")
    for _ in range(2):  # the second: every load a cache hit, each of its own slot
        assert env.run(code, OPREGISTRY_AUTOLOAD="0").split() == ["['pcfp']", "[]", "[]"]


CHECK = """
import os

def feature():
    return os.environ.get("PC_FEATURE") == "1", "PC_FEATURE=" + os.environ.get("PC_FEATURE", "")
"""


def test_load_time_checks_run_on_every_load_of_a_cached_plan(env: Env) -> None:
    """A check's outcome is a fact of this load: the cached declarations are resolved again."""
    (env.site / "pc_check.py").write_text(CHECK)
    env.dist("pc-checked", "pc_checked", """
        from opregistry import Candidate, OpLibrary
        lib = OpLibrary("pcchk")
        lib.define("f(Tensor x) -> Tensor", kernels={"cpu": [
            Candidate("pc_kernels:clone", when={"check": "pc_check:feature"}), "pc_kernels:clone"]})
    """)
    first = env.probe(PC_FEATURE="1")
    again = env.probe(PC_FEATURE="1")
    other = env.probe(PC_FEATURE="0")
    assert again["torch"]["cache"] == "hit"
    assert "pcchk::f/CPU/active" in first["torch"]["kernels"]
    assert "pcchk::f/CPU/unmet" not in again["torch"]["kernels"]
    assert other["torch"]["cache"] == "resolved"
    assert "pcchk::f/CPU/unmet" in other["torch"]["kernels"]
