"""Which installed distribution owns a file: from RECORD, folders, editable installs."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest

from opregistry import distfiles
from opregistry.distfiles import Owners, distributions, files_of, module_name, owner_of


def _wheel(site: Path, name: str, files: dict[str, str], requires: str = "") -> None:
    """A pip-style install: the files, and a dist-info whose RECORD lists them."""
    info = site / f"{name.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n"
                                   + (f"Requires-Dist: {requires}\n" if requires else ""))
    for rel, text in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
    rows = [*files, f"{info.name}/METADATA", f"{info.name}/RECORD"]
    (info / "RECORD").write_text("".join(f"{r},,\n" for r in rows))


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "site"
    _wheel(root, "fx-owner-a", {"fx_owner_a/__init__.py": "", "fx_owner_a/sub/mod.py": "",
                                "fx_nsshared/a/x.py": "", "fx_owner_a/_C.abi3.so": ""},
           requires='torch>=2.8; extra == "gpu"')
    _wheel(root, "fx-owner-b", {"fx_owner_b.py": "", "fx_nsshared/b/y.py": ""})
    monkeypatch.syspath_prepend(str(root))
    importlib.invalidate_caches()
    distfiles.owners.cache_clear()  # type: ignore[attr-defined]
    yield root
    distfiles.owners.cache_clear()  # type: ignore[attr-defined]


def _name(found: object) -> str | None:
    return getattr(found, "name", None)


def test_files_in_record(site: Path) -> None:
    assert _name(owner_of(str(site / "fx_owner_a" / "sub" / "mod.py"))) == "fx-owner-a"
    assert _name(owner_of(str(site / "fx_owner_b.py"))) == "fx-owner-b"
    assert _name(owner_of(str(site / "fx_owner_a" / "_C.abi3.so"))) == "fx-owner-a"


def test_a_file_written_after_install_belongs_to_its_folder(site: Path) -> None:
    """A JIT-built library in the package folder: the package's distribution."""
    late = site / "fx_owner_a" / "sub" / "built.so"
    late.touch()
    assert _name(owner_of(str(late))) == "fx-owner-a"


def test_a_shared_folder_names_nobody(site: Path) -> None:
    """A namespace package two distributions install into: only their own files are theirs."""
    assert _name(owner_of(str(site / "fx_nsshared" / "a" / "x.py"))) == "fx-owner-a"
    assert _name(owner_of(str(site / "fx_nsshared" / "b" / "y.py"))) == "fx-owner-b"
    assert owner_of(str(site / "fx_nsshared" / "new.py")) is None
    assert owner_of(str(site / "loose.py")) is None  # site-packages itself belongs to nobody


def test_a_link_is_followed(site: Path, tmp_path: Path) -> None:
    link = tmp_path / "link.py"
    link.symlink_to(site / "fx_owner_a" / "sub" / "mod.py")
    assert _name(owner_of(str(link))) == "fx-owner-a"


def test_installed_and_editable_distributions_of_this_environment() -> None:
    """torch (a wheel), nnkit and opregistry (editable installs): each file to its owner."""
    import nnkit
    import torch.library

    owners = Owners(distributions())
    assert _name(owners.owner_of(torch.library.__file__)) == "torch"
    assert _name(owners.owner_of(nnkit.__file__)) == "nnkit"
    assert _name(owners.owner_of(distfiles.__file__)) == "opregistry"
    assert owners.owner_of(os.__file__) is None  # the standard library


def test_metadata_says_what_it_requires(site: Path) -> None:
    infos = {i.installed.name: i for i in distributions()}
    assert infos["fx-owner-a"].requires_any({"torch"})
    assert not infos["fx-owner-b"].requires_any({"torch"})
    assert {rel for _, rel in files_of(infos["fx-owner-b"])} >= {"fx_owner_b.py"}


@pytest.mark.parametrize("rel,module", [
    ("pkg/sub/mod.py", "pkg.sub.mod"), ("pkg/__init__.py", "pkg"), ("top.py", "top"),
    ("pkg/_C.cpython-311-x86_64-linux-gnu.so", "pkg._C"), ("pkg/_C.abi3.so", "pkg._C"),
    ("pkg/_C.cp311-win_amd64.pyd", "pkg._C"), ("../../bin/tool.py", None),
    ("pkg-1.0.data/scripts/x.py", None), ("pkg/data.json", None),
])
def test_module_names(rel: str, module: str | None) -> None:
    assert module_name(rel) == module


@pytest.mark.parametrize("end", ["\n", "\r\n"])
@pytest.mark.parametrize("quoted", [True, False], ids=["a-quoted-row", "no-quoted-row"])
@pytest.mark.parametrize("folder", ["", "/a/site", "/a/site/", "rel/site", "/"])
def test_record_rows_are_joined_to_their_folder_as_os_path_join_does(
        tmp_path: Path, folder: str, quoted: bool, end: str) -> None:
    """``RECORD``'s rows joined to the folder holding the ``.dist-info`` (spelled out, not
    ``os.path.join``, for speed): the same paths, for a relative or empty folder (a
    ``sys.path`` entry of ``""``), an absolute row, a quoted row with a comma, a Windows
    separator, ``..`` and ``./`` parts.  The rows are the csv module's, whether the file
    quotes a row (read by the csv module) or none (split at each row's first comma), with
    either line end."""
    import csv

    rows = ["pkg/x.py,sha256=x,1", "../../bin/tool,,", "/abs/file.py,,", "pkg/./y.py,,",
            '"pkg/a,b.py",,', "pkg\\win.py,,", "", "pkg/z.py"]
    if not quoted:
        rows.remove('"pkg/a,b.py",,')
    (tmp_path / "RECORD").write_bytes((end.join(rows) + end).encode())

    class Dist:
        _path = tmp_path

    expected = []
    for row in csv.reader(rows):
        if not row:  # a blank line: no row
            continue
        rel = row[0].replace("\\", "/")
        path = os.path.join(folder, rel)
        expected.append((os.path.normpath(path) if ".." in rel or "/./" in rel else path, rel))
    assert distfiles._record(Dist(), folder) == expected
    assert [rel for _, rel in expected] == [
        "pkg/x.py", "../../bin/tool", "/abs/file.py", "pkg/./y.py",
        *(["pkg/a,b.py"] if quoted else []), "pkg/win.py", "pkg/z.py"]
