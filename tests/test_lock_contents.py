"""The lock proves the code: file digests in the lock, ``verify`` naming files, the locked mode.

Real temporary distributions on ``sys.path``: a wheel-style install (a
``*.dist-info`` with a ``RECORD`` of sha256 hashes, as pip writes it) and an
editable one (``direct_url.json`` with ``dir_info.editable``, the package in
a source folder elsewhere on ``sys.path``, ``RECORD`` listing only a ``.pth``).
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import io
import json
import os
import subprocess
import sys
import textwrap
from contextlib import redirect_stderr
from pathlib import Path

import pytest

import opregistry
from opregistry import LockMismatchError, cli
from opregistry.digests import contents
from opregistry.lockfile import LOCK_VERSION, fingerprint_of, lock_data, read_lock, write_lock
from opregistry.registry import verify_lock

from . import per_version
from .conftest import BACKENDS

KERNELS = """
def f(x):
    return x.clone()
"""


def _declarations(ns: str, package: str, marker: Path | None) -> str:
    mark = (f"open({str(marker)!r}, 'a').write('imported\\n')\n" if marker else "")
    return (f"{mark}from opregistry import OpLibrary\n"
            f"lib = OpLibrary({ns!r})\n"
            f"lib.define('f(Tensor x) -> Tensor', kernels={{'cpu': '{package}.kernels:f'}})\n")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


class Installs:
    """Writes wheel-style and editable-style distributions of one op package each."""

    def __init__(self, site: Path, src: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.site, self.src = site, src
        self.names: list[str] = []
        self.packages: list[str] = []
        site.mkdir(parents=True)
        src.mkdir(parents=True)
        monkeypatch.syspath_prepend(str(src))
        monkeypatch.syspath_prepend(str(site))

    def _info(self, name: str, package: str, version: str) -> tuple[Path, dict[str, bytes]]:
        info = self.site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        files = {
            f"{info.name}/METADATA":
                f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
            f"{info.name}/entry_points.txt": f"[opregistry.ops]\nops = {package}:lib\n".encode(),
        }
        return info, files

    def wheel(self, name: str, ns: str, *, marker: Path | None = None,
              version: str = "1.0") -> str:
        """A pip-style install into ``site``: the package, its dist-info and a RECORD."""
        package = f"{name.replace('-', '_')}_{ns}"
        info, files = self._info(name, package, version)
        files[f"{package}/__init__.py"] = _declarations(ns, package, marker).encode()
        files[f"{package}/kernels.py"] = KERNELS.encode()
        for rel, data in files.items():
            (self.site / rel).parent.mkdir(parents=True, exist_ok=True)
            (self.site / rel).write_bytes(data)
        record = [f"{rel},sha256={_b64(data)},{len(data)}" for rel, data in files.items()]
        record += [f"{info.name}/RECORD,,", f"{package}/__pycache__/kernels.cpython-311.pyc,,"]
        (info / "RECORD").write_text("\n".join(record) + "\n")
        return self._done(name, package)

    def editable(self, name: str, ns: str, *, marker: Path | None = None,
                 version: str = "1.0") -> str:
        """A PEP 660 install: dist-info in ``site``, the package in ``src`` (on sys.path)."""
        package = f"{name.replace('-', '_')}_{ns}"
        info, files = self._info(name, package, version)
        pth = f"__editable__.{package}-{version}.pth"
        files[pth] = f"{self.src}\n".encode()
        files[f"{info.name}/direct_url.json"] = json.dumps(
            {"url": self.src.as_uri(), "dir_info": {"editable": True}}).encode()
        for rel, data in files.items():
            (self.site / rel).write_bytes(data)
        record = [f"{rel},sha256={_b64(data)},{len(data)}" for rel, data in files.items()]
        (info / "RECORD").write_text("\n".join(record + [f"{info.name}/RECORD,,"]) + "\n")
        (self.src / package).mkdir()
        (self.src / package / "__init__.py").write_text(_declarations(ns, package, marker))
        (self.src / package / "kernels.py").write_text(KERNELS)
        return self._done(name, package)

    def _done(self, name: str, package: str) -> str:
        importlib.invalidate_caches()
        self.names.append(name)
        self.packages.append(package)
        return package

    def plugins(self) -> list[str]:
        return [*BACKENDS, *self.names]

    def cleanup(self) -> None:
        for module in list(sys.modules):
            if module.split(".")[0] in self.packages:
                del sys.modules[module]


@pytest.fixture
def installs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    factory = Installs(tmp_path / "site", tmp_path / "src", monkeypatch)
    yield factory
    factory.cleanup()


@pytest.fixture
def target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Installs two folders below ``tmp_path``: RECORD's ``../../bin`` is ``tmp_path/bin``."""
    factory = Installs(tmp_path / "target" / "site", tmp_path / "src", monkeypatch)
    yield factory
    factory.cleanup()


def _lock(installs: Installs, path: Path) -> dict:
    return write_lock(opregistry.plan(plugins=installs.plugins()), path)


def _verify(installs: Installs, path: Path) -> list[str]:
    with pytest.raises(LockMismatchError) as info:
        verify_lock(path, plan=opregistry.plan(plugins=installs.plugins()))
    return list(info.value.differences)


# -- what the lock records -------------------------------------------------------


def test_lock_records_file_digests_of_a_wheel_install(installs, ns, tmp_path):
    """A wheel: every hashed RECORD entry, relative names, RECORD's own sha256 values."""
    package = installs.wheel("cw-wheel", ns)
    data = _lock(installs, tmp_path / "opregistry.lock")
    assert data["lock_version"] == LOCK_VERSION == 4
    entry = data["contents"]["cw-wheel"]
    assert entry["install"] == "wheel"
    assert set(entry["files"]) == {f"{package}/__init__.py", f"{package}/kernels.py",
                                   "cw_wheel-1.0.dist-info/METADATA",
                                   "cw_wheel-1.0.dist-info/entry_points.txt"}
    kernels = (installs.site / package / "kernels.py").read_bytes()
    assert entry["files"][f"{package}/kernels.py"] == hashlib.sha256(kernels).hexdigest()
    assert entry["digest"].startswith("sha256:")
    assert str(tmp_path) not in json.dumps(data["contents"])  # no machine paths
    assert verify_lock(tmp_path / "opregistry.lock",
                       plan=opregistry.plan(plugins=installs.plugins())) == data["fingerprint"]


def test_lock_records_the_sources_of_an_editable_install(installs, ns, tmp_path):
    """Editable: the package's sources (not only the .pth RECORD lists), plus the metadata."""
    package = installs.editable("cw-edit", ns)
    (installs.src / package / "data.json").write_text("{}")  # every file, not only *.py
    (installs.src / package / "__pycache__").mkdir()
    (installs.src / package / "__pycache__" / "x.pyc").write_bytes(b"\0")
    entry = _lock(installs, tmp_path / "opregistry.lock")["contents"]["cw-edit"]
    assert entry["install"] == "editable"
    assert {f"{package}/__init__.py", f"{package}/kernels.py", f"{package}/data.json",
            f"__editable__.{package}-1.0.pth",
            "cw_edit-1.0.dist-info/entry_points.txt"} <= set(entry["files"])
    assert not any("__pycache__" in name for name in entry["files"])


def test_the_digest_does_not_depend_on_where_it_is_installed(tmp_path, monkeypatch, ns):
    """The same wheel in two folders: the same file names and digest."""
    found = []
    for where in ("one", "two"):
        with monkeypatch.context() as m:
            factory = Installs(tmp_path / where / "site", tmp_path / where / "src", m)
            factory.wheel("cw-where", ns)
            import importlib_metadata

            found.append(contents(importlib_metadata.distribution("cw-where")))
            factory.cleanup()
    assert found[0] == found[1]


# -- verify names every changed file -------------------------------------------


def test_verify_names_a_changed_kernel_body(installs, ns, tmp_path):
    package = installs.wheel("cw-body", ns)
    _lock(installs, tmp_path / "opregistry.lock")
    (installs.site / package / "kernels.py").write_text(KERNELS.replace("x.clone()", "x * 0"))
    diffs = _verify(installs, tmp_path / "opregistry.lock")
    assert len(diffs) == 1
    assert diffs[0].startswith(f"distribution cw-body: file {package}/kernels.py changed (sha256 ")
    assert "in the lockfile" in diffs[0] and "in this environment" in diffs[0]


def test_verify_names_an_added_os_system_in_a_kernel_module(installs, ns, tmp_path):
    package = installs.editable("cw-system", ns)
    _lock(installs, tmp_path / "opregistry.lock")
    kernels = installs.src / package / "kernels.py"
    kernels.write_text("import os\nos.system('true')\n" + kernels.read_text())
    diffs = _verify(installs, tmp_path / "opregistry.lock")
    assert [d for d in diffs if f"file {package}/kernels.py changed" in d] == diffs
    assert diffs[0].startswith("distribution cw-system: ")


def test_verify_names_import_time_code_in_a_declaration_module(installs, ns, tmp_path):
    package = installs.wheel("cw-import", ns)
    _lock(installs, tmp_path / "opregistry.lock")
    init = installs.site / package / "__init__.py"
    init.write_text("print('hello from import time')\n" + init.read_text())
    diffs = _verify(installs, tmp_path / "opregistry.lock")
    assert any(d.startswith(f"distribution cw-import: file {package}/__init__.py changed")
               for d in diffs), diffs


def test_a_same_size_edit_with_the_mtime_restored_is_found(installs, ns, tmp_path):
    """Every file is re-hashed: no cache keyed by size and mtime to fool."""
    package = installs.wheel("cw-mtime", ns)
    _lock(installs, tmp_path / "opregistry.lock")
    kernels = installs.site / package / "kernels.py"
    before = kernels.stat()
    kernels.write_text(KERNELS.replace("clone", "ravel"))  # same length
    os.utime(kernels, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert kernels.stat().st_size == before.st_size
    assert any(f"file {package}/kernels.py changed" in d
               for d in _verify(installs, tmp_path / "opregistry.lock"))


def test_verify_names_added_and_removed_files(installs, ns, tmp_path):
    package = installs.editable("cw-files", ns)
    _lock(installs, tmp_path / "opregistry.lock")
    (installs.src / package / "extra.py").write_text("import os\n")
    (installs.src / package / "kernels.py").unlink()
    diffs = _verify(installs, tmp_path / "opregistry.lock")
    assert any(f"file {package}/extra.py added" in d for d in diffs), diffs
    assert any(f"file {package}/kernels.py removed" in d for d in diffs), diffs


def test_a_file_edited_before_the_lock_is_locked_as_it_is_and_named(installs, ns, tmp_path):
    """The lock hashes what is on disk, so it verifies; the edit RECORD does not know is named."""
    package = installs.wheel("cw-early", ns)
    kernels = installs.site / package / "kernels.py"
    kernels.write_text("import os\n" + KERNELS)
    path = tmp_path / "opregistry.lock"
    data = _lock(installs, path)
    entry = data["contents"]["cw-early"]
    edited = hashlib.sha256(kernels.read_bytes()).hexdigest()
    assert entry["files"][f"{package}/kernels.py"] == edited
    plan = opregistry.plan(plugins=installs.plugins())
    assert verify_lock(path, plan=plan) == data["fingerprint"]
    listed = hashlib.sha256(KERNELS.encode()).hexdigest()
    assert entry["differs_from_record"] == {f"{package}/kernels.py": listed}
    from opregistry.lockfile import record_differences

    assert record_differences(data) == [(
        f"cw-early: file {package}/kernels.py: sha256 {edited[:12]}..., RECORD lists "
        f"{listed[:12]}...; locked as it is on disk")]


# -- a wheel whose RECORD is wrong (intel-extension-for-pytorch 2.8.0) ---------------------


def _wrong_record(installs: Installs, name: str, package: str) -> tuple[str, str]:
    """Make ``name``'s RECORD wrong the way intel-extension-for-pytorch 2.8.0's is.

    As published, its RECORD gives ``METADATA`` a sha256 and a size (8008)
    other than the file's (8004), and lists a script ``../../bin/ipexrun``
    that a ``pip install --target`` install does not have there.  Returns
    the two names.  Use the ``target`` fixture: ``../../bin`` stays in ``tmp_path``.
    """
    info = next(installs.site.glob(f"{name.replace('-', '_')}-*.dist-info"))
    metadata, script = f"{info.name}/METADATA", f"../../bin/{package}-run"
    size = (info / "METADATA").stat().st_size
    lines = [f"{metadata},sha256={_b64(b'not the METADATA installed')},{size + 4}"
             if line.startswith(f"{metadata},") else line
             for line in (info / "RECORD").read_text().splitlines()]
    lines.append(f"{script},sha256={_b64(b'#!python')},8")
    (info / "RECORD").write_text("\n".join(lines) + "\n")
    assert not (installs.site / script).exists()
    return metadata, script


def test_a_lock_verifies_against_the_install_it_was_made_on_when_record_is_wrong(
        target, ns, tmp_path, monkeypatch, capsys):
    """``lock``, ``verify`` on the untouched install: exit 0; an edit after the lock: caught."""
    installs = target
    package = installs.wheel("cw-record", ns)
    metadata, script = _wrong_record(installs, "cw-record", package)
    monkeypatch.setenv("OPREGISTRY_PLUGINS", ",".join(installs.plugins()))
    path = tmp_path / "opregistry.lock"
    assert cli.main(["lock", "-o", str(path)]) == 0
    told = capsys.readouterr().err  # the reviewer is told, on stderr
    assert "files that differ from their wheel's RECORD" in told
    assert f"file {metadata}: sha256 " in told and f"file {script}: listed in RECORD" in told
    data = read_lock(path)
    entry = data["contents"]["cw-record"]
    on_disk = (installs.site / metadata).read_bytes()
    assert entry["files"][metadata] == hashlib.sha256(on_disk).hexdigest()  # not RECORD's
    assert entry["files"][script] is None  # recorded as absent
    assert set(entry["differs_from_record"]) == {metadata, script}
    from opregistry.lockfile import record_differences

    assert [line.split(": ")[1] for line in record_differences(data)] == [
        f"file {script}", f"file {metadata}"]
    assert "locked as absent" in record_differences(data)[0]
    capsys.readouterr()
    assert cli.main(["verify", str(path)]) == 0, capsys.readouterr().err
    assert "OK" in capsys.readouterr().out
    # a real change after the lock is still caught, and only it is named
    (installs.site / package / "kernels.py").write_text(KERNELS + "import os\n")
    assert cli.main(["verify", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"file {package}/kernels.py changed" in err
    assert "METADATA" not in err and script not in err
    # and so is the script appearing where RECORD said it would be
    (installs.site / package / "kernels.py").write_text(KERNELS)
    assert cli.main(["verify", str(path)]) == 0
    capsys.readouterr()
    appeared = installs.site / script
    assert appeared.resolve().parent == tmp_path.resolve() / "bin"
    appeared.parent.mkdir()
    appeared.write_text("#!python")
    assert cli.main(["verify", str(path)]) == 1
    assert f"file {script} changed (sha256 missing in the lockfile" in capsys.readouterr().err


def test_locked_mode_imports_a_wheel_whose_record_is_wrong_and_refuses_it_edited(
        target, ns, tmp_path, monkeypatch):
    installs = target
    marker = tmp_path / "imported.txt"
    package = installs.wheel("cw-record-locked", ns, marker=marker)
    _wrong_record(installs, "cw-record-locked", package)
    path = tmp_path / "opregistry.lock"
    _lock(installs, path)
    installs.cleanup()
    marker.unlink()
    monkeypatch.setenv("OPREGISTRY_LOCK", str(path))
    registry = opregistry.load(plugins=installs.plugins(), reload=True)
    assert [p for p in registry.problems if p.code.startswith("lock")] == []
    assert registry.op(f"{ns}::f") is not None and marker.exists()
    installs.cleanup()
    marker.unlink()
    init = installs.site / package / "__init__.py"
    init.write_text("import os\n" + init.read_text())
    registry = opregistry.load(plugins=installs.plugins(), reload=True)
    (problem,) = [p for p in registry.problems if p.code == "lock-mismatch"]
    assert f"file {package}/__init__.py changed" in problem.message
    assert "METADATA" not in problem.message and "bin/" not in problem.message
    assert registry.op(f"{ns}::f") is None and not marker.exists()


def test_locked_mode_refuses_a_wheel_with_a_module_added_that_shadows_a_locked_one(
        installs, ns, tmp_path, monkeypatch):
    """``kernels/__init__.py`` added beside the locked ``kernels.py``: Python imports the
    package, which no RECORD lists -- the lock's check lists the package folders, so the
    added file is named and nothing of the distribution runs."""
    package = installs.wheel("cw-shadow", ns)
    path = tmp_path / "opregistry.lock"
    _lock(installs, path)
    installs.cleanup()
    ran = tmp_path / "shadow-ran.txt"
    (installs.site / package / "kernels").mkdir()
    (installs.site / package / "kernels" / "__init__.py").write_text(
        f"open({str(ran)!r}, 'w').write('ran')\ndef f(x):\n    return x * 100\n")
    importlib.invalidate_caches()
    assert any(f"file {package}/kernels/__init__.py added" in d
               for d in _verify(installs, path))
    monkeypatch.setenv("OPREGISTRY_LOCK", str(path))
    registry = opregistry.load(plugins=installs.plugins(), reload=True)
    (problem,) = [p for p in registry.problems if p.code == "lock-mismatch"]
    assert f"file {package}/kernels/__init__.py added" in problem.message, problem.message
    assert registry.op(f"{ns}::f") is None and not ran.exists()


def test_the_record_trusting_fingerprint_hashes_a_file_whose_size_record_gets_wrong(
        target, ns, tmp_path):
    """``lock_data`` by default (``verify_consistent``) trusts RECORD only at RECORD's size."""
    installs = target
    package = installs.wheel("cw-record-cheap", ns)
    metadata, script = _wrong_record(installs, "cw-record-cheap", package)
    cheap = lock_data(opregistry.plan(plugins=installs.plugins()))["contents"]["cw-record-cheap"]
    disk = hashlib.sha256((installs.site / metadata).read_bytes()).hexdigest()
    assert cheap["files"][metadata] == disk and cheap["files"][script] is None
    assert cheap == _lock(installs, tmp_path / "opregistry.lock")["contents"]["cw-record-cheap"]


def test_cli_verify_prints_each_changed_file(installs, ns, tmp_path, monkeypatch):
    package = installs.wheel("cw-cli", ns)
    monkeypatch.setenv("OPREGISTRY_PLUGINS", ",".join(installs.plugins()))
    path = tmp_path / "opregistry.lock"
    assert cli.main(["lock", "-o", str(path)]) == 0
    (installs.site / package / "kernels.py").write_text(KERNELS + "\n# edited\n")
    err = io.StringIO()
    with redirect_stderr(err):
        assert cli.main(["verify", str(path)]) != 0
    assert f"distribution cw-cli: file {package}/kernels.py changed (sha256 " in err.getvalue()


def test_an_older_lock_format_says_so(tmp_path):
    path = tmp_path / "old.lock"
    path.write_text(json.dumps({"lock_version": 2, "distributions": {}}))
    with pytest.raises(LockMismatchError, match="lock_version 2 .*older opregistry.*"
                                                "regenerate it with 'opregistry lock"):
        read_lock(path)


# -- the locked mode -------------------------------------------------------------


def test_locked_mode_leaves_a_changed_distribution_out_unimported(installs, ns, tmp_path,
                                                                  monkeypatch):
    marker = tmp_path / "imported.txt"
    good = installs.wheel("cw-good", ns)
    bad = installs.wheel("cw-bad", f"{ns}b", marker=marker)
    path = tmp_path / "opregistry.lock"
    _lock(installs, path)
    installs.cleanup()
    marker.unlink()
    kernels = installs.site / bad / "kernels.py"
    kernels.write_text("import os\nos.system('true')\n" + kernels.read_text())
    monkeypatch.setenv("OPREGISTRY_LOCK", str(path))
    registry = opregistry.load(plugins=installs.plugins(), reload=True)
    assert not marker.exists() and bad not in sys.modules  # never imported
    assert registry.op(f"{ns}::f") is not None and registry.op(f"{ns}b::f") is None
    (problem,) = [p for p in registry.problems if p.code == "lock-mismatch"]
    assert problem.severity == "error"
    assert [o.distribution for o in problem.culprits] == ["cw-bad"]
    assert f"file {bad}/kernels.py changed" in problem.message
    assert good in sys.modules
    skipped = [s for s in registry.plan.skipped if s.origin.distribution == "cw-bad"]
    assert skipped and "locked mode" in skipped[0].reason


def test_locked_mode_refuses_what_the_lock_does_not_name(installs, ns, tmp_path, monkeypatch):
    installs.editable("cw-known", ns)
    path = tmp_path / "opregistry.lock"
    _lock(installs, path)
    newcomer = installs.editable("cw-new", f"{ns}n")
    monkeypatch.setenv("OPREGISTRY_LOCK", str(path))
    resolved = opregistry.plan(plugins=installs.plugins())
    assert newcomer not in sys.modules
    (problem,) = [p for p in resolved.problems if p.code == "lock-mismatch"]
    assert "cw-new" in problem.message and "does not name cw-new" in problem.message
    assert resolved.op(f"{ns}::f") is not None


def test_locked_mode_checks_the_version(installs, ns, tmp_path, monkeypatch):
    installs.wheel("cw-version", ns)
    path = tmp_path / "opregistry.lock"
    data = _lock(installs, path)
    data["distributions"]["cw-version"] = "0.9"
    data["fingerprint"] = fingerprint_of(data)  # the lock of another install, as 'lock' writes it
    path.write_text(json.dumps(data))
    monkeypatch.setenv("OPREGISTRY_LOCK", str(path))
    problems = opregistry.plan(plugins=installs.plugins()).problems
    assert any(p.code == "lock-mismatch" and "version 1.0 is installed, the lockfile has 0.9"
               in p.message for p in problems)


@pytest.mark.parametrize("text", [None, "{not json", json.dumps({"lock_version": 3}),
                                  json.dumps({"lock_version": 4})])
def test_locked_mode_with_an_unusable_lock_loads_nothing(installs, ns, tmp_path, monkeypatch,
                                                         text):
    package = installs.wheel("cw-nolock", ns)
    path = tmp_path / "opregistry.lock"
    if text is not None:
        path.write_text(text)
    monkeypatch.setenv("OPREGISTRY_LOCK", str(path))
    registry = opregistry.load(plugins=installs.plugins(), reload=True)  # never raises
    assert registry.ops == () and package not in sys.modules
    (problem,) = registry.problems
    assert problem.code == "lock-unreadable" and problem.severity == "error"
    assert str(path) in problem.message and "nothing" not in problem.hint
    assert all("locked mode" in s.reason for s in registry.plan.skipped)


def test_locked_mode_strict_raises(installs, ns, tmp_path, monkeypatch):
    installs.wheel("cw-strict", ns)
    monkeypatch.setenv("OPREGISTRY_LOCK", str(tmp_path / "absent.lock"))
    with pytest.raises(opregistry.ResolutionError, match="lock-unreadable|cannot be used"):
        opregistry.load(plugins=installs.plugins(), reload=True, strict=True)


def test_locked_import_torch_never_imports_a_changed_distribution(installs, ns, tmp_path):
    """A fresh process: ``import torch`` under OPREGISTRY_LOCK skips the edited package."""
    marker = tmp_path / "imported.txt"
    good = installs.editable("cw-proc-good", ns)
    bad = installs.wheel("cw-proc-bad", f"{ns}b", marker=marker)
    path = tmp_path / "opregistry.lock"
    _lock(installs, path)
    marker.unlink()
    init = installs.site / bad / "__init__.py"
    init.write_text("import os\n" + init.read_text())
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPREGISTRY_")}
    env.update(OPREGISTRY_LOCK=str(path), OPREGISTRY_PLUGINS=",".join(installs.plugins()),
               PYTHONPATH=os.pathsep.join([str(installs.site), str(installs.src),
                                           env.get("PYTHONPATH", "")]))
    code = textwrap.dedent(f"""
        import sys, torch, opregistry
        r = opregistry.get_registry()
        assert {bad!r} not in sys.modules and {good!r} in sys.modules
        assert hasattr(torch.ops.{ns}, "f")
        print(sorted(p.code for p in r.problems))
    """)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert "lock-mismatch" in out.stdout
    assert not marker.exists()


def test_unlocked_mode_is_unchanged(installs, ns, tmp_path):
    """Without OPREGISTRY_LOCK, an edited distribution loads as before (verify is the check)."""
    package = installs.wheel("cw-free", ns)
    _lock(installs, tmp_path / "opregistry.lock")
    (installs.site / package / "kernels.py").write_text(KERNELS + "\n# edited\n")
    assert opregistry.plan(plugins=installs.plugins()).op(f"{ns}::f") is not None
    assert "contents" in lock_data(opregistry.plan(plugins=installs.plugins()))


def test_cli_plugins_in_locked_mode_does_not_import_a_refused_distribution(
        installs, ns, tmp_path, monkeypatch):
    installs.wheel("cw-plug-known", ns)
    path = tmp_path / "opregistry.lock"
    _lock(installs, path)
    marker = tmp_path / "imported.txt"
    installs.wheel("cw-plug-new", f"{ns}n", marker=marker)
    monkeypatch.setenv("OPREGISTRY_LOCK", str(path))
    monkeypatch.setenv("OPREGISTRY_PLUGINS", ",".join(installs.plugins()))
    with redirect_stderr(io.StringIO()):
        cli.main(["plugins"])
    assert not marker.exists()


def test_bench_lock_runs(tmp_path):
    """benchmarks/bench_lock.py runs end to end on a tiny generated set (no timing asserted)."""
    import opregistry

    # it locks the whole environment, which on torch < 2.13 has nnkit refused (tests/per_version.py)
    per_version.need_nnkit(opregistry.plan().problems)
    bench = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_lock.py"
    out = tmp_path / "lock.json"
    done = subprocess.run([sys.executable, str(bench), "--dists", "2", "--ops-per-dist", "2",
                           "--reps", "1", "--json", str(out)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    assert data["ops"] == 4 and len(data["targets"]) == 2
    assert set(data["gate_seconds"]) == {"wheel", "source"}


# -- every file the plan runs, whatever installed it ------------------------------------


def _beside(dists, ns: str, kernel_ref: str, modules: dict[str, str] | None = None) -> str:
    """A distribution without RECORD (a dist-info on sys.path) whose kernel is ``kernel_ref``.

    Its entry point names ``beside_<ns>``; ``modules`` are written beside it.
    """
    return dists.make("beside", ops={"ops": f"beside_{ns}:lib"}, modules={
        f"beside_{ns}": "from opregistry import OpLibrary\n"
                        f"lib = OpLibrary({ns!r})\n"
                        f"lib.define('f(Tensor x) -> Tensor', kernels={{'cpu': {kernel_ref!r}}})\n",
        **(modules or {})})


def test_the_lock_covers_a_kernel_module_beside_the_package(dists, ns, tmp_path):
    """No RECORD, a top-level kernel module the entry point does not name: locked all the same."""
    from .conftest import plan

    d = _beside(dists, ns, f"{ns}_kernels:clone", {f"{ns}_kernels": KERNELS.replace("f(x)", "clone(x)")})
    lock = tmp_path / "opregistry.lock"
    data = write_lock(plan(dists), lock)
    entry = data["contents"][d]
    assert entry["install"] == "source" and f"{ns}_kernels.py" in entry["files"]
    assert entry["references"] == [f"{ns}_kernels"] and "not_covered" not in entry
    kernels = dists.root / f"{ns}_kernels.py"
    kernels.write_text(kernels.read_text() + "import os\nos.system('true')\n")
    with pytest.raises(LockMismatchError) as info:
        verify_lock(lock, plan=plan(dists))
    assert f"distribution {d}: file {ns}_kernels.py changed" in "\n".join(info.value.differences)


def test_the_lock_covers_packages_on_the_way_to_a_reference(dists, ns, tmp_path):
    """``pkg.sub.mod:f``: pkg/__init__.py and pkg/sub/__init__.py run too, so they are locked."""
    from .conftest import plan

    d = _beside(dists, ns, f"k{ns}.sub.mod:f", {f"k{ns}.sub.mod": "def f(x):\n    return x\n"})
    for package in (dists.root / f"k{ns}", dists.root / f"k{ns}" / "sub"):
        (package / "__init__.py").write_text("")
    importlib.invalidate_caches()
    entry = write_lock(plan(dists), tmp_path / "opregistry.lock")["contents"][d]
    assert {f"k{ns}/__init__.py", f"k{ns}/sub/__init__.py", f"k{ns}/sub/mod.py"} <= set(entry["files"])


def test_lock_and_verify_name_files_not_covered(dists, ns, tmp_path, monkeypatch, capsys):
    """A kernel module inside a zip archive on sys.path cannot be hashed file by file: said."""
    import zipfile

    from opregistry.cli import main

    archive = tmp_path / "kernels.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr(f"zipped_{ns}.py", "def f(x):\n    return x\n")
    monkeypatch.syspath_prepend(str(archive))
    d = _beside(dists, ns, f"zipped_{ns}:f")
    monkeypatch.setenv("OPREGISTRY_PLUGINS", ",".join([*BACKENDS, *dists.names]))
    lock = tmp_path / "opregistry.lock"
    assert main(["lock", "-o", str(lock)]) == 0
    err = capsys.readouterr().err
    assert "files not covered" in err and f"{d}: module zipped_{ns}:" in err
    assert "inside an archive" in err
    assert main(["verify", str(lock)]) == 0
    captured = capsys.readouterr()
    assert "OK" in captured.out and f"{d}: module zipped_{ns}:" in captured.err
    assert main(["verify", "--json", str(lock)]) == 0
    [line] = json.loads(capsys.readouterr().out)["not_covered"]
    assert line.startswith(f"{d}: module zipped_{ns}:")


def test_locked_mode_refuses_an_edited_kernel_module_before_importing(dists, ns, tmp_path,
                                                                      monkeypatch):
    """The kernel module beside the package edited after the lock: nothing of it is imported."""
    from .conftest import load, plan

    d = _beside(dists, ns, f"{ns}_kernels:clone", {f"{ns}_kernels": KERNELS.replace("f(x)", "clone(x)")})
    lock = tmp_path / "opregistry.lock"
    write_lock(plan(dists), lock)
    for module in dists.modules:
        sys.modules.pop(module, None)
    kernels = dists.root / f"{ns}_kernels.py"
    kernels.write_text(kernels.read_text().replace("x.clone()", "x.clone() * 2 "))
    monkeypatch.setenv("OPREGISTRY_LOCK", str(lock))
    registry = load(dists)
    [problem] = [p for p in registry.errors if p.code == "lock-mismatch"]
    assert f"file {ns}_kernels.py changed" in problem.message and f"{d}==1.0" in problem.message
    assert not any(m in sys.modules for m in dists.modules), "nothing of it was imported"
