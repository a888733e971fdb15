"""A FIFO, a device or a folder among a distribution's files is refused, never read.

opregistry reads files of installed distributions without importing them:
the scan reads every Python file and shared library of every distribution
at the first ``import torch``, the locked mode hashes them.  Reading a FIFO
blocks until a writer comes; reading ``/dev/zero`` never ends.  Such a file
is skipped as unreadable (:mod:`opregistry.regular`), and what the
distribution's regular files say is still seen.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from opregistry.regular import open_fd, open_regular, read_regular

from .foreign_dists import _project

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo") or not os.path.exists("/dev/zero"),
                                reason="FIFOs and /dev/zero are POSIX's")

PACKAGE = {
    "fx_unreadable/__init__.py": '''
        import torch

        torch.library.define("fx_unreadable::seen", "(Tensor x) -> Tensor")

        @torch.library.impl("fx_unreadable::seen", "CPU")
        def _(x):
            return x + 1
    ''',
    "fx_unreadable/piped.py": '''
        import torch

        torch.library.define("fx_unreadable::piped", "(Tensor x) -> Tensor")
    ''',
    "fx_unreadable/_native.so": "not yet a FIFO",
}


def _within(seconds: float, call: Callable[[], Any]) -> dict[str, Any]:
    """``call()``'s value or error, asserting it returned within ``seconds`` (not blocked)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{call} still blocked after {seconds} s"
    return box


def _unblock(fifo: Path) -> None:
    """Open ``fifo`` for writing once: a reader blocked on it (a failing test) goes on."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass  # nobody reading: nothing to release


def test_a_fifo_a_device_and_a_folder_are_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "piped.py"
    os.mkfifo(fifo)
    zero = tmp_path / "zero.py"
    zero.symlink_to("/dev/zero")
    try:
        for path in (fifo, zero, tmp_path, Path("/dev/null")):
            for opening in (lambda: open_fd(str(path)), lambda: open_regular(str(path)),
                            lambda: read_regular(str(path))):
                error = _within(10, opening).get("error")
                assert isinstance(error, OSError), (path, error)
                assert "not a regular file" in str(error) and str(path) in str(error)
    finally:
        _unblock(fifo)
    regular = tmp_path / "ok.py"
    regular.write_text("x = 1\n")
    fd, st = open_fd(str(regular))
    os.close(fd)
    assert st.st_size == 6
    with open_regular(str(regular), "r", encoding="utf-8") as f:
        assert f.read() == "x = 1\n"
    assert read_regular(str(regular))[0] == b"x = 1\n"
    assert read_regular(str(regular))[1].st_size == 6


def test_a_file_that_grew_after_its_fstat_is_read_to_its_end(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """``read_regular`` reads the size ``fstat`` gave, and then whatever the file holds
    beyond it (written between the two): the whole file, never its first part alone."""
    grown = tmp_path / "grown.py"
    text = b"".join(b"line %d\n" % i for i in range(300_000))  # > one 1 MiB chunk after
    grown.write_bytes(text)
    real = os.fstat

    def smaller(fd: int) -> os.stat_result:  # the size the file had before it grew
        st = real(fd)
        return os.stat_result((st.st_mode, *st[1:6], 10, *st[7:]))

    monkeypatch.setattr(os, "fstat", smaller)
    data, st = read_regular(str(grown))
    assert st.st_size == 10 and data == text


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """``fx-unreadable``, pip-installed; then one of its modules and its shared library
    turned into FIFOs and a module added that links to ``/dev/zero`` (listed in RECORD)."""
    root = tmp_path_factory.mktemp("unreadable")
    project = _project(root / "work", "fx-unreadable", PACKAGE, ["torch"], "")
    target = root / "site"
    out = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                          "--no-build-isolation", "--no-index", "--target", str(target),
                          str(project)], capture_output=True, text=True,
                         env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    package = target / "fx_unreadable"
    for name in ("piped.py", "_native.so"):
        (package / name).unlink()
        os.mkfifo(package / name)
    (package / "zero.py").symlink_to("/dev/zero")
    record = next(target.glob("fx_unreadable-*.dist-info")) / "RECORD"
    with open(record, "a", encoding="utf-8") as f:
        # with a hash (the sha256 of nothing): the locked mode hashes only hashed rows
        f.write("fx_unreadable/zero.py,sha256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU,0\n")
    yield target
    for name in ("piped.py", "_native.so"):
        _unblock(package / name)


def _run(site: Path, code: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=180, cwd=tmp_path,
                              env={**os.environ, "PYTHONPATH": str(site),
                                   "OPREGISTRY_CACHE_DIR": str(tmp_path / "cache"), **env})
    except subprocess.TimeoutExpired:
        pytest.fail(f"blocked on a FIFO or /dev/zero: {code!r} did not end in 180 s")


SCAN = """
import json
from opregistry.scan import scan_installed
found = scan_installed(only=["fx-unreadable"]).get("fx-unreadable")
print(json.dumps(sorted({r.op for r in found.registrations if r.op})))
"""


@pytest.mark.parametrize("check", ["stat", "content"])
def test_the_scan_skips_them_and_reads_the_rest(site: Path, tmp_path: Path, check: str) -> None:
    out = _run(site, SCAN, tmp_path, OPREGISTRY_AUTOLOAD="0", OPREGISTRY_CACHE_CHECK=check)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout) == ["fx_unreadable::seen"]


def test_import_torch_and_the_listing_end(site: Path, tmp_path: Path) -> None:
    """The first ``import torch`` scans every installed distribution, this one included."""
    out = _run(site, "import torch", tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    kept = [json.loads(p.read_text()) for p in (tmp_path / "cache" / "foreign-scan").iterdir()]
    scanned = [e for e in kept if e["key"] == f"distributions in {site}"]
    assert scanned and "fx_unreadable::seen" in json.dumps(scanned), [e["key"] for e in kept]
    listed = _run(site, "from opregistry.cli import main; raise SystemExit(main(['list', "
                        "'--json']))", tmp_path)
    assert listed.returncode in (0, 1), listed.stderr[-3000:]
    assert json.loads(listed.stdout)


def test_the_locked_mode_digest_calls_them_missing(site: Path) -> None:
    from importlib_metadata import PathDistribution

    from opregistry.digests import contents

    info = next(site.glob("fx_unreadable-*.dist-info"))
    record = _within(60, lambda: contents(PathDistribution(info)))["value"]
    files = record["files"]
    assert files["fx_unreadable/piped.py"] is None
    assert files["fx_unreadable/_native.so"] is None
    assert files["fx_unreadable/zero.py"] is None
    assert len(files["fx_unreadable/__init__.py"]) == 64
    assert set(record["differs_from_record"]) == {"fx_unreadable/piped.py",
                                                  "fx_unreadable/_native.so",
                                                  "fx_unreadable/zero.py"}
