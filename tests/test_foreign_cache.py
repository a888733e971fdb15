"""The scan of foreign distributions is cached per version and file digest, and never stale.

A wheel-style distribution (``*.dist-info`` with a ``RECORD``, as pip writes
it) in a temporary folder on ``sys.path``; each test edits it the way an
upgrade, a hand edit or a reinstall would, and checks the next scan sees it.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from opregistry.foreign import ForeignScan
from opregistry.scan import CACHE_NAME, scan_installed

NAME = "fx-cached"
SOURCE = 'import torch\nlib = torch.library.Library("fx_aa", "FRAGMENT")\n'


class Site:
    """One wheel-style install of ``fx-cached`` whose package source the test rewrites."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root = root
        self.cache = root.parent / "cache"
        self.module = root / "fx_cached" / "__init__.py"
        self.module.parent.mkdir(parents=True)
        self.module.write_text(SOURCE)
        self.install("1.0")
        monkeypatch.syspath_prepend(str(root))

    def install(self, version: str) -> None:
        for old in self.root.glob("fx_cached-*.dist-info"):
            for f in old.iterdir():
                f.unlink()
            old.rmdir()
        info = self.root / f"fx_cached-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {version}\nRequires-Dist: torch\n")
        (info / "RECORD").write_text(f"fx_cached/__init__.py,,\n{info.name}/METADATA,,\n"
                                     f"{info.name}/RECORD,,\n")
        importlib.invalidate_caches()

    def scan(self, **kwargs: object) -> ForeignScan:
        extra: dict[str, str] = kwargs.pop("environ", {})  # type: ignore[assignment]
        env = {"OPREGISTRY_CACHE_DIR": str(self.cache), **extra}
        return scan_installed(only=[NAME], environ=env, **kwargs)  # type: ignore[arg-type]

    def namespaces(self, **kwargs: object) -> tuple[set[str], int]:
        found = self.scan(**kwargs)
        [dist] = found.distributions
        return set(dist.namespaces()), found.cached

    def rewrite(self, text: str, *, keep_mtime: bool = False, bump: bool = True) -> None:
        st = self.module.stat()
        self.module.write_text(text)
        if keep_mtime:
            os.utime(self.module, ns=(st.st_atime_ns, st.st_mtime_ns))
        elif bump:  # a later mtime, even on a file system with a coarse clock
            os.utime(self.module, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Site:
    return Site(tmp_path / "site", monkeypatch)


def test_second_scan_is_a_cache_hit(site: Site) -> None:
    first = site.scan()
    second = site.scan()
    assert (first.cached, second.cached) == (0, 1)
    assert first.distributions == second.distributions
    assert second.distributions[0].namespaces() == {"fx_aa"}
    assert second.distributions[0].digest.startswith("stat:")


def test_same_size_edit_is_seen(site: Site) -> None:
    """``fx_aa`` -> ``fx_bb``: same size, a new mtime."""
    site.scan()
    site.rewrite(SOURCE.replace("fx_aa", "fx_bb"))
    assert site.namespaces() == ({"fx_bb"}, 0)


def test_edit_that_keeps_the_mtime_but_not_the_size_is_seen(site: Site) -> None:
    site.scan()
    site.rewrite(SOURCE.replace("fx_aa", "fx_aaa"), keep_mtime=True)
    assert site.namespaces() == ({"fx_aaa"}, 0)


def test_content_digests_see_an_edit_that_keeps_size_and_mtime(site: Site) -> None:
    """What size+mtime cannot see (PEP 552's trade-off), the locked mode's sha256 does."""
    site.scan()
    site.rewrite(SOURCE.replace("fx_aa", "fx_zz"), keep_mtime=True)
    assert site.namespaces() == ({"fx_aa"}, 1)  # size and mtime unchanged: the stale entry
    assert site.namespaces(content_digests=True) == ({"fx_zz"}, 0)
    found = site.scan(environ={"OPREGISTRY_LOCK": "/some/opregistry.lock"})
    assert found.cached == 1 and found.distributions[0].digest.startswith("sha256:")


def test_cache_check_content_reaches_the_scan(site: Site) -> None:
    """``OPREGISTRY_CACHE_CHECK=content`` checks the scan's cache by content too, as the plan
    cache's: an edit that keeps size and mtime is seen (before: the stale scan was reused)."""
    site.scan()
    site.rewrite(SOURCE.replace("fx_aa", "fx_zz"), keep_mtime=True)
    found = site.scan(environ={"OPREGISTRY_CACHE_CHECK": "content"})
    assert found.cached == 0 and found.distributions[0].namespaces() == {"fx_zz"}
    assert found.distributions[0].digest.startswith("sha256:")
    again = site.scan(environ={"OPREGISTRY_CACHE_CHECK": "Content"})
    assert again.cached == 1 and again.distributions[0].namespaces() == {"fx_zz"}


def test_cache_clear_removes_the_scan_cache(site: Site) -> None:
    """``opregistry cache clear`` removes the scan's entries (before: only the plan cache's,
    so an edit that kept size and mtime stayed unseen), and ``cache info`` shows them."""
    site.scan()
    site.rewrite(SOURCE.replace("fx_aa", "fx_zz"), keep_mtime=True)
    env = {**os.environ, "OPREGISTRY_CACHE_DIR": str(site.cache),
           "PYTHONPATH": os.pathsep.join([str(site.root), *sys.path])}

    def cli(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "opregistry", "cache", *args],
                              capture_output=True, text=True, env=env)
        assert done.returncode == 0, done.stderr
        return done.stdout

    info = json.loads(cli("info", "--json"))["scan"]
    assert info["directory"] == str(site.cache / CACHE_NAME)
    assert info["entries"] == 1 and info["bytes"] > 0 and info["check"] == "stat"
    assert "scan cache (what the installed distributions register" in cli("info")
    cleared = json.loads(cli("clear", "--json"))["scan"]
    assert cleared == {"directory": str(site.cache / CACHE_NAME), "removed": 1}
    assert not list((site.cache / CACHE_NAME).glob("*.json"))
    assert site.namespaces() == ({"fx_zz"}, 0)
    assert "removed 1 scan cache entry from" in cli("clear")


def test_upgrade_is_seen(site: Site) -> None:
    site.scan()
    site.rewrite(SOURCE.replace("fx_aa", "fx_up"), bump=False)
    site.install("2.0")
    found = site.scan()
    assert found.cached == 0 and found.distributions[0].version == "2.0"
    assert found.distributions[0].namespaces() == {"fx_up"}


def _entry(site: Site) -> Path:
    [entry] = (site.cache / CACHE_NAME).glob("*.json")
    return entry


@pytest.mark.parametrize("damage", ["truncate", "garbage", "other stamp"])
def test_a_damaged_entry_means_a_new_scan(site: Site, damage: str) -> None:
    site.scan()
    entry = _entry(site)
    if damage == "truncate":
        entry.write_bytes(entry.read_bytes()[: entry.stat().st_size // 2])
    elif damage == "garbage":
        entry.write_bytes(b"\x00" * 64)
    else:
        data = json.loads(entry.read_text())
        entry.write_text(json.dumps({**data, "stamp": "opregistry 0.0.1 scan-format 0"}))
    assert site.namespaces() == ({"fx_aa"}, 0)
    assert site.namespaces() == ({"fx_aa"}, 1)  # rewritten whole


def test_no_cache_when_off_or_read_only(site: Site, tmp_path: Path) -> None:
    assert site.namespaces(environ={"OPREGISTRY_CACHE": "0"}) == ({"fx_aa"}, 0)
    assert site.namespaces(environ={"OPREGISTRY_CACHE": "0"}) == ({"fx_aa"}, 0)
    assert not site.cache.exists()
    site.cache.parent.joinpath("file").touch()
    unusable = {"OPREGISTRY_CACHE_DIR": str(site.cache.parent / "file" / "cache")}
    assert site.namespaces(environ=unusable) == ({"fx_aa"}, 0)
    assert site.namespaces(environ=unusable) == ({"fx_aa"}, 0)
    assert site.namespaces(cache=False) == ({"fx_aa"}, 0)


def test_a_failing_scan_is_reported_and_not_cached(site: Site,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A scanner bug on one distribution: said on that distribution, the others unaffected."""
    import opregistry.scan.pysource as pysource

    def broken(*args: object) -> None:
        raise RecursionError("maximum recursion depth exceeded")

    original = pysource.scan_modules
    monkeypatch.setattr(pysource, "scan_modules", broken)
    [dist] = site.scan().distributions
    assert dist.error == "the scan failed: RecursionError: maximum recursion depth exceeded"
    assert dist.registrations == () and not (site.cache / CACHE_NAME).exists()
    monkeypatch.setattr(pysource, "scan_modules", original)
    assert site.namespaces() == ({"fx_aa"}, 0)


def test_cache_dir_variable(site: Site, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    site.scan(environ={"OPREGISTRY_CACHE_DIR": str(elsewhere)})
    assert len(list((elsewhere / CACHE_NAME).glob("*.json"))) == 1
    assert not site.cache.exists()


SCANNER = """
import json, sys
from opregistry.scan import scan_installed
found = scan_installed(only=["fx-cached"], environ={"OPREGISTRY_CACHE_DIR": sys.argv[1]})
print(json.dumps(found.to_dict()["distributions"]))
"""


def test_processes_scanning_at_once_share_the_cache(site: Site) -> None:
    """Eight cold processes at once (DataLoader workers, ranks): same answer, a whole entry."""
    env = {**os.environ, "PYTHONPATH": str(site.root), "OPREGISTRY_AUTOLOAD": "0"}
    procs = [subprocess.Popen([sys.executable, "-c", SCANNER, str(site.cache)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(8)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * 8, [e for _, e in outs]
    results = {out for out, _ in outs}
    assert len(results) == 1
    json.loads(_entry(site).read_text())
    assert site.namespaces() == ({"fx_aa"}, 1)


def test_a_distribution_without_torch_is_checked_by_its_metadata(site: Site) -> None:
    """No torch in it (nor in Requires-Dist): the next scans read only its METADATA and RECORD
    stamps, and a reinstall that brings torch in is seen."""
    info = next(site.root.glob("fx_cached-*.dist-info"))
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {NAME}\nVersion: 1.0\n")
    site.rewrite("VALUE = 1\n")
    assert (site.scan().distributions, site.scan().skipped) == ((), 1)
    assert site.scan().cached == 1
    site.rewrite(SOURCE)  # an edit in place, no reinstall: not looked at (PEP 376 files unchanged)
    assert site.scan().distributions == ()
    site.install("1.0")  # pip rewrites METADATA (now requiring torch) and RECORD
    found = site.scan()
    assert found.cached == 0 and found.distributions[0].namespaces() == {"fx_aa"}


def test_a_distribution_without_record_and_without_torch_is_checked_by_its_files(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No ``RECORD`` (its files are found by walking its package): a second scan is a cache
    hit from the digest of the files the first scan read, and an edit of one of them (no
    reinstall) makes a new scan, which finds torch now."""
    site = tmp_path / "bare"
    package = site / "fx_bare"
    package.mkdir(parents=True)
    module = package / "__init__.py"
    module.write_text("VALUE = 1\n")
    info = site / "fx_bare-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fx-bare\nVersion: 1.0\n")
    (info / "top_level.txt").write_text("fx_bare\n")
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    env = {"OPREGISTRY_CACHE_DIR": str(tmp_path / "cache")}
    first = scan_installed(only=["fx-bare"], environ=env)
    assert (first.distributions, first.cached, first.skipped) == ((), 0, 1)
    assert scan_installed(only=["fx-bare"], environ=env).cached == 1
    module.write_text(SOURCE.replace("fx_aa", "fx_bare"))
    found = scan_installed(only=["fx-bare"], environ=env)
    assert found.cached == 0 and found.distributions[0].namespaces() == {"fx_bare"}
    assert scan_installed(only=["fx-bare"], environ=env).cached == 1


def _second_distribution(site: Site, name: str = "fx_other") -> str:
    """A second wheel-style install beside ``fx-cached``, in the same folder."""
    package = site.root / name
    package.mkdir()
    (package / "__init__.py").write_text(SOURCE.replace("fx_aa", "fx_ot"))
    info = site.root / f"{name}-1.0.dist-info"
    info.mkdir()
    dist = name.replace("_", "-")
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\nRequires-Dist: torch\n")
    (info / "RECORD").write_text(f"{name}/__init__.py,,\n{info.name}/METADATA,,\n"
                                 f"{info.name}/RECORD,,\n")
    importlib.invalidate_caches()
    return dist


def test_one_entry_per_folder_of_distributions(site: Site) -> None:
    """Two distributions of one folder: one cache file, written once, holding both; a scan
    of one of them keeps the other's entry."""
    other = _second_distribution(site)
    env = {"OPREGISTRY_CACHE_DIR": str(site.cache)}
    first = scan_installed(only=[NAME, other], environ=env)
    assert (first.cached, len(first.distributions)) == (0, 2)
    entry = _entry(site)
    assert len(json.loads(entry.read_text())["value"]) == 2
    written = entry.stat().st_mtime_ns
    assert scan_installed(only=[NAME, other], environ=env).cached == 2
    assert entry.stat().st_mtime_ns == written  # nothing changed: nothing written
    site.rewrite(SOURCE.replace("fx_aa", "fx_bb"))
    assert site.namespaces() == ({"fx_bb"}, 0)  # a scan of fx-cached alone
    again = scan_installed(only=[NAME, other], environ=env)
    assert again.cached == 2
    assert {d.name: set(d.namespaces()) for d in again.distributions} == {
        NAME: {"fx_bb"}, other: {"fx_ot"}}


def test_a_whole_scan_drops_the_entries_of_distributions_gone(tmp_path: Path) -> None:
    from opregistry.diskcache import DiskCache
    from opregistry.scan import _Folders

    disk = DiskCache(str(tmp_path), "stamp")
    disk.store("distributions in /site", {"a 1.0": {"x": 1}, "gone 1.0": {"x": 2}})
    partial = _Folders(disk)
    assert partial.entry("/site", "a 1.0") == {"x": 1}
    partial.write(whole=False)  # a scan of some distributions: the others' entries stay
    assert disk.load("distributions in /site") == {"a 1.0": {"x": 1}, "gone 1.0": {"x": 2}}
    whole = _Folders(disk)
    assert whole.entry("/site", "a 1.0") == {"x": 1}
    whole.put("/site", "new 1.0", {"x": 3})
    whole.write(whole=True)
    assert disk.load("distributions in /site") == {"a 1.0": {"x": 1}, "new 1.0": {"x": 3}}


@pytest.mark.parametrize("cached", [False, True], ids=["scanned", "from the cache"])
def test_the_scan_records_the_files_a_cache_of_it_stamps(site: Site, tmp_path: Path,
                                                         cached: bool) -> None:
    """What the scan records as its inputs is what ``scan_inputs`` lists again for a scan
    rebuilt from data: every installed distribution's ``METADATA`` and ``RECORD``, and the
    files of those that register, of editable installs and of those without ``RECORD``."""
    from opregistry.scan import scan_inputs

    bare = tmp_path / "bare"  # a dist-info without RECORD: its module is stamped
    info = bare / "fx_norecord-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fx-norecord\nVersion: 1.0\n")
    (info / "top_level.txt").write_text("fx_norecord\n")
    (bare / "fx_norecord.py").write_text("X = 1\n")
    sys.path.insert(0, str(bare))
    try:
        importlib.invalidate_caches()
        env = {"OPREGISTRY_CACHE_DIR": str(site.cache)}
        if cached:
            scan_installed(environ=env)
        found = scan_installed(environ=env)
        assert (found.cached > 0) == cached
        assert found.inputs is not None
        listed = scan_inputs(ForeignScan.from_dict(found.to_dict()))
        assert sorted(found.inputs) == sorted(listed)
        assert str(site.module) in found.inputs
        assert str(bare / "fx_norecord.py") in found.inputs
        assert str(info / "METADATA") in found.inputs
    finally:
        sys.path.remove(str(bare))
        importlib.invalidate_caches()
