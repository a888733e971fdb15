"""The thirteen distributions as a package index would see them: built wheels and the core's sdist.

Every wheel is built from a clean copy of the checkout (``pip wheel --no-deps
--no-build-isolation``, offline) and its metadata is read back and checked:
the license file is in the wheel, Project-URLs, classifiers, keywords and a
markdown readme whose links work off the repository, torch required within
the tested range, every extra bounded, and each example op package depends on
the backends its kernels need.  ``twine check --strict`` runs over all of it
too.  The core's sdist leaves the tests out (they exercise the whole
repository, not one distribution) and must build a wheel by itself.
"""

from __future__ import annotations

import email.parser
import functools
import email.policy
import json
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from packaging.metadata import Metadata
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent

#: distribution name -> source directory, for all thirteen distributions
DISTRIBUTIONS = {
    "opregistry": ".",
    "opregistry-cpu": "plugins/cpu",
    "opregistry-cuda": "plugins/cuda",
    "opregistry-meta": "plugins/meta",
    "opregistry-autograd": "plugins/autograd",
    "opregistry-vmap": "plugins/vmap",
    "opregistry-autocast": "plugins/autocast",
    "opregistry-torch-dispatch": "plugins/torchdispatch",
    "tutorial-ops": "examples/tutorial",
    "nnkit": "examples/nnkit",
    "nnkit-contrib": "examples/nnkit-contrib",
    "int8kit": "examples/int8kit",
    # built with --no-build-isolation, so its C++ library is compiled now (~15 s of g++)
    "extension-cpp": "examples/extension_cpp",
}
#: the torch versions opregistry is tested with; every distribution declares exactly this
TORCH_RANGE = SpecifierSet(">=2.8,<2.16")
REPOSITORY = "https://github.com/opregistry/opregistry"
PROJECT_URLS = {"Homepage", "Documentation", "Source", "Issues", "Changelog"}
#: the backends an op package must depend on outright; opregistry-cuda goes in an extra
BACKEND_DISTS = {f"opregistry-{b}" for b in ("cpu", "cuda", "meta", "autograd", "vmap")}

_LINK = re.compile(r"\]\(\s*([^)\s]+)")


def _copy_checkout(dst: Path) -> Path:
    """The checkout without build outputs, so that building never writes into it."""
    shutil.copytree(ROOT, dst, ignore=shutil.ignore_patterns(
        ".git", ".venv", "*.egg-info", "build", "dist", "site", "__pycache__", ".pytest_cache",
        ".hypothesis", ".whl", ".venv-compat"))
    return dst


def _run(*cmd: str, cwd: Path) -> str:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """All thirteen wheels and the core's sdist, in one directory."""
    tmp = tmp_path_factory.mktemp("wheels")
    src = _copy_checkout(tmp / "src")
    dist = tmp / "dist"
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "-w", str(dist),
         *(str(src / d) for d in DISTRIBUTIONS.values()), cwd=tmp)
    # the sdist through setuptools' own PEP 517 hook: no extra build front-end needed offline
    _run(sys.executable, "-c", "import sys; from setuptools import build_meta; "
         "build_meta.build_sdist(sys.argv[1])", str(dist), cwd=src)
    return dist


def _wheel(dist_dir: Path, name: str) -> Path:
    found = sorted(dist_dir.glob(f"{name.replace('-', '_')}-*.whl"))
    assert len(found) == 1, f"{name}: expected one wheel, found {found}"
    return found[0]


def _metadata_text(wheel: Path) -> tuple[str, list[str]]:
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
        return zf.read(meta).decode(), names


def problems(name: str, text: str, files: list[str]) -> list[str]:
    """What is wrong with the METADATA ``text`` of distribution ``name`` (wheel ``files``)."""
    found: list[str] = []
    msg = email.parser.Parser(policy=email.policy.compat32).parsestr(text)
    try:
        meta = Metadata.from_email(text, validate=True)
    except Exception as exc:  # ExceptionGroup of every invalid field
        return [f"invalid metadata: {exc!r}: " + "; ".join(
            map(str, getattr(exc, "exceptions", [])))]
    if canonicalize_name(meta.name) != canonicalize_name(name):
        found.append(f"Name is {meta.name}, not {name}")
    if meta.license_expression != "BSD-3-Clause":
        found.append(f"License-Expression is {meta.license_expression!r}")
    if meta.license_files != ["LICENSE"]:
        found.append(f"License-File is {meta.license_files!r}, not ['LICENSE']")
    if not any(f.endswith(".dist-info/licenses/LICENSE") for f in files):
        found.append("the wheel has no *.dist-info/licenses/LICENSE")
    if str(meta.requires_python) != ">=3.10":
        found.append(f"Requires-Python is {meta.requires_python}")
    urls = meta.project_urls or {}
    if set(urls) != PROJECT_URLS:
        found.append(f"Project-URLs are {sorted(urls)}, not {sorted(PROJECT_URLS)}")
    if not all(u.startswith(REPOSITORY) or u.startswith("https://opregistry.github.io/opregistry/")
               for u in urls.values()):
        found.append(f"a Project-URL points elsewhere: {urls}")
    if not meta.classifiers or not any(c.startswith("Programming Language :: Python :: 3")
                                       for c in meta.classifiers):
        found.append(f"classifiers missing: {meta.classifiers}")
    if any(c.startswith("License ::") for c in meta.classifiers or []):
        found.append("a License :: classifier beside License-Expression")
    if not meta.keywords:
        found.append("no Keywords")
    if not meta.author:
        found.append("no Author")
    if meta.description_content_type != "text/markdown":
        found.append(f"Description-Content-Type is {meta.description_content_type!r}")
    description = meta.description or msg.get_payload() or ""
    if len(description.strip()) < 200:
        found.append("no readme (empty or stub long description)")
    for link in _LINK.findall(description):
        if not link.startswith(("https://", "http://", "#")):
            found.append(f"readme link {link!r} only works inside the repository")
    torch = [r for r in meta.requires_dist or [] if r.name == "torch"]
    if len(torch) != 1 or torch[0].specifier != TORCH_RANGE or torch[0].marker is not None:
        found.append(f"torch requirement is {[str(r) for r in torch]}, not torch{TORCH_RANGE}")
    for req in meta.requires_dist or []:
        extra = req.marker is not None and "extra" in str(req.marker)
        if extra and not any(s.operator in ("<", "<=", "==", "~=") for s in req.specifier):
            found.append(f"extra requirement {req} has no upper bound")
    return found


@pytest.mark.slow
def test_all_ten_wheels_and_the_core_sdist_are_built(built: Path) -> None:
    wheels = sorted(p.name for p in built.glob("*.whl"))
    assert len(wheels) == len(DISTRIBUTIONS), wheels
    for name in DISTRIBUTIONS:
        _wheel(built, name)
    assert [p.name for p in built.glob("*.tar.gz")] == ["opregistry-0.1.0.tar.gz"]


@pytest.mark.slow
@pytest.mark.parametrize("name", DISTRIBUTIONS)
def test_wheel_metadata(built: Path, name: str) -> None:
    """License file, URLs, classifiers, keywords, readme, torch range, bounded extras."""
    text, files = _metadata_text(_wheel(built, name))
    assert problems(name, text, files) == []
    assert "Version: 0.1.0\n" in text


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n, d in DISTRIBUTIONS.items() if d.startswith("examples/")])
def test_op_package_depends_on_the_backends_its_kernels_need(built: Path, name: str) -> None:
    """`pip install <op package>` is enough: every backend its kernels use is a dependency
    (opregistry-cuda in the ``cuda`` extra), as op-authors.md recommends."""
    meta = Metadata.from_email(_metadata_text(_wheel(built, name))[0], validate=True)
    plain = {canonicalize_name(r.name) for r in meta.requires_dist if r.marker is None}
    extra = {canonicalize_name(r.name) for r in meta.requires_dist
             if r.marker is not None and r.marker.evaluate({"extra": "cuda"})}
    used = set(_backends_used().get(name, ())) or None
    if used is None:  # not installed in this environment (int8kit): its declared keys
        used = {"cpu", "meta", "autograd", "vmap", "cuda"}
    for backend in used:
        dist = f"opregistry-{backend}"
        if backend == "cuda":
            assert dist in extra and dist not in plain, f"{name}: {dist} belongs in the cuda extra"
        else:
            assert dist in plain, f"{name} uses backend {backend} but does not depend on {dist}"
    assert plain & BACKEND_DISTS == {f"opregistry-{b}" for b in used} - {"opregistry-cuda"}


@functools.cache
def _backends_used() -> dict[str, set[str]]:
    """distribution -> the backends serving its kernels, from `opregistry list --json`."""
    opregistry = shutil.which("opregistry", path=str(Path(sys.executable).parent))
    assert opregistry
    out = subprocess.run([opregistry, "list", "--json"], capture_output=True, text=True,
                         timeout=120)
    data = json.loads(out.stdout)
    used: dict[str, set[str]] = {}
    for op in data["ops"]:
        for kernel in op["kernels"]:
            dist = kernel["distribution"]["name"]
            if kernel["status"] == "native":  # C++, registered by its library: no backend
                used.setdefault(dist, set())
                continue
            used.setdefault(dist, set()).add(kernel["backend"])
    return used


@pytest.mark.slow
def test_twine_check_strict(built: Path) -> None:
    """What the package index checks at upload (README renders, metadata valid)."""
    twine = shutil.which("twine", path=str(Path(sys.executable).parent))
    assert twine, "twine is not installed: pip install -r requirements-dev.txt"
    out = _run(twine, "check", "--strict", *map(str, sorted(built.iterdir())), cwd=built)
    assert out.count("PASSED") == len(DISTRIBUTIONS) + 1, out


@pytest.mark.slow
def test_core_sdist_leaves_tests_out_and_builds_a_wheel(built: Path, tmp_path: Path) -> None:
    """The tests need the whole repository (backends, examples, docs): they are not in the
    core's sdist, which holds the package, README, LICENSE and pyproject and builds by itself."""
    sdist = built / "opregistry-0.1.0.tar.gz"
    with tarfile.open(sdist) as tf:
        names = tf.getnames()
        tf.extractall(tmp_path, filter="data")
    top = "opregistry-0.1.0/"
    for required in ("PKG-INFO", "pyproject.toml", "README.md", "LICENSE", "opregistry/__init__.py",
                     "opregistry/py.typed"):
        assert top + required in names, f"{required} missing from the sdist"
    stray = [n for n in names if n.startswith(tuple(top + d for d in (
        "tests", "benchmarks", "docs", "plugins", "examples")))]
    assert stray == [], stray
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "-w", str(tmp_path / "out"), str(tmp_path / top), cwd=tmp_path)
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["opregistry-0.1.0-py3-none-any.whl"]


def test_every_distribution_has_the_license_and_a_readme() -> None:
    """Each source directory carries its own copy of LICENSE (setuptools takes license
    files from inside the project only) and a README.md; the copies do not drift."""
    license_text = (ROOT / "LICENSE").read_text()
    assert "BSD 3-Clause License" in license_text and "the opregistry developers" in license_text
    for name, directory in DISTRIBUTIONS.items():
        assert (ROOT / directory / "LICENSE").read_text() == license_text, name
        assert (ROOT / directory / "README.md").is_file(), name


def test_metadata_check_catches_what_is_missing() -> None:
    """The check can fail: the metadata the wheels had before (no license file, no URLs,
    classifiers or keywords, no readme, torch>=2.6, unbounded extra) is reported."""
    old = ("Metadata-Version: 2.4\nName: nnkit\nVersion: 0.1.0\nSummary: x\n"
           "License-Expression: BSD-3-Clause\nRequires-Python: >=3.10\n"
           "Description-Content-Type: text/markdown\n"
           "Requires-Dist: opregistry<0.2,>=0.1\nRequires-Dist: torch>=2.6\n"
           "Provides-Extra: cuda\nRequires-Dist: triton; extra == \"cuda\"\n\n"
           "See [the CLI](docs/cli.md).\n")
    found = "\n".join(problems("nnkit", old, ["nnkit/__init__.py"]))
    for expected in ("License-File is None", "no *.dist-info/licenses/LICENSE", "Project-URLs",
                     "classifiers missing", "no Keywords", "no Author", "no readme",
                     "'docs/cli.md' only works inside the repository", "torch requirement",
                     "triton; extra == \"cuda\" has no upper bound"):
        assert expected in found, f"{expected!r} not reported in:\n{found}"
