"""Lockfiles of the wrong shape, that are no regular file, or whose fingerprint was edited.

Each is refused the one way, wherever it is read (``opregistry.lockfile.read_lock``):
``verify`` exits 1 with one line naming the lockfile, the key that is wrong and what
to do; the locked mode (``OPREGISTRY_LOCK``) loads nothing, with one
``lock-unreadable`` error saying the same, and adopts nothing -- never a traceback
from inside opregistry, never a hang.  Real temporary distributions (an op package and
a package that registers its own ops, adopted), real ``write_lock`` output, mutated.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import torch

import opregistry
from opregistry import LockMismatchError, cli
from opregistry.lockfile import fingerprint_of, read_lock, write_lock

from . import adoption_dists
from .conftest import BACKENDS, DistFactory, load, op_dist, plan

FOREIGN = """
import torch

torch.library.define("{ns}::scale", "(Tensor x, float f) -> Tensor")


@torch.library.register_kernel("{ns}::scale", "cpu")
def _(x, f):
    return x * f
"""


class Locked:
    """An op package, an adopted package, and the lock ``write_lock`` wrote of them."""

    def __init__(self, dists: DistFactory, ns: str, tmp_path: Path) -> None:
        self.dists, self.ns, self.adopted_ns = dists, ns, f"{ns}ad"
        self.dist = op_dist(dists, "lm-ops", ns,
                            "lib.define('f(Tensor x) -> Tensor', kernels={'cpu': 'KMOD:clone'})\n")
        self.module = f"lm_ops_{ns}"  # its declarations (op_dist's naming)
        self.package = f"fp_{self.adopted_ns}"
        self.foreign = adoption_dists.write(
            dists.root, f"fp-{self.adopted_ns}",
            {f"{self.package}/__init__.py": FOREIGN.format(ns=self.adopted_ns)})
        self.path = tmp_path / "opregistry.lock"
        self.data = write_lock(plan(dists), self.path)
        assert self.foreign in self.data["adopted"] and self.dist in self.data["contents"]

    def write(self, mutate: Callable[[dict[str, Any], Locked], None], *,
              refingerprint: bool = True) -> Path:
        """The lock, mutated; re-fingerprinted, so that only the mutation is wrong (unless the
        mutation is the fingerprint's type)."""
        data = json.loads(json.dumps(self.data))
        mutate(data, self)
        if refingerprint and isinstance(data.get("fingerprint"), str):
            data["fingerprint"] = fingerprint_of(data)
        self.path.write_text(json.dumps(data, indent=2))
        return self.path

    def env(self, lock: Path | None = None) -> dict[str, str]:
        """A child process's environment: these distributions found, ``lock`` the lock."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("OPREGISTRY_")}
        env["OPREGISTRY_CACHE_DIR"] = os.environ.get("OPREGISTRY_CACHE_DIR", "")
        env["OPREGISTRY_PLUGINS"] = ",".join([*BACKENDS, *self.dists.names])
        env["PYTHONPATH"] = os.pathsep.join([str(self.dists.root), env.get("PYTHONPATH", "")])
        if lock is not None:
            env["OPREGISTRY_LOCK"] = str(lock)
        return env


@pytest.fixture
def locked(dists: DistFactory, ns: str, tmp_path: Path,
           monkeypatch: pytest.MonkeyPatch) -> Iterator[Locked]:
    made = Locked(dists, ns, tmp_path)
    monkeypatch.setenv("OPREGISTRY_PLUGINS", ",".join([*BACKENDS, *dists.names]))
    yield made
    for module in list(sys.modules):
        if module.split(".")[0] == made.package:
            del sys.modules[module]


def _first_file(data: dict[str, Any], lk: Locked) -> str:
    return sorted(data["contents"][lk.dist]["files"])[0]


def _set(data: dict[str, Any], keys: tuple[Any, ...], value: Any) -> None:
    for key in keys[:-1]:
        data = data[key]
    data[keys[-1]] = value


# (id, mutation, what the message says is wrong)
SHAPES: list[tuple[str, Callable[[dict[str, Any], Locked], None], Callable[[Locked], str]]] = [
    ("contents-dist-string", lambda d, lk: _set(d, ("contents", lk.dist), "x"),
     lambda lk: f"contents.{lk.dist}: expected an object, found a string"),
    ("files-list", lambda d, lk: _set(d, ("contents", lk.dist, "files"), ["a"]),
     lambda lk: f"contents.{lk.dist}.files: expected an object, found a list"),
    ("file-hash-int",
     lambda d, lk: _set(d, ("contents", lk.dist, "files", _first_file(d, lk)), 5),
     lambda lk: f"contents.{lk.dist}.files["),
    ("files-missing", lambda d, lk: d["contents"][lk.dist].pop("files"),
     lambda lk: f"contents.{lk.dist}: the key 'files' is missing"),
    ("references-int", lambda d, lk: _set(d, ("contents", lk.dist, "references"), 5),
     lambda lk: f"contents.{lk.dist}.references: expected a list, found an integer"),
    ("ops-null", lambda d, lk: _set(d, ("ops",), None),
     lambda lk: "ops: expected an object, found null"),
    ("kernels-list", lambda d, lk: _set(d, ("ops", f"{lk.ns}::f", "kernels"), [1]),
     lambda lk: f"ops.{lk.ns}::f.kernels: expected an object, found a list"),
    ("adopted-null", lambda d, lk: _set(d, ("adopted",), None),
     lambda lk: "adopted: expected an object, found null"),
    ("adopted-entry-null", lambda d, lk: _set(d, ("adopted", lk.foreign), None),
     lambda lk: f"adopted.{lk.foreign}: expected an object, found null"),
    ("distributions-list", lambda d, lk: _set(d, ("distributions",), [lk.dist]),
     lambda lk: "distributions: expected an object, found a list"),
    ("namespaces-list", lambda d, lk: _set(d, ("namespaces",), []),
     lambda lk: "namespaces: expected an object, found a list"),
    ("fingerprint-int", lambda d, lk: _set(d, ("fingerprint",), 5),
     lambda lk: "fingerprint: expected a string, found an integer"),
]


def _verify(path: Path) -> tuple[int, str]:
    err, out = io.StringIO(), io.StringIO()
    with redirect_stderr(err), redirect_stdout(out):
        code = cli.main(["verify", str(path)])
    return code, err.getvalue() + out.getvalue()


def _unreadable(registry: opregistry.Registry) -> opregistry.model.Problem:
    """The one lock problem of a registry loaded under an unusable lock, which loaded nothing."""
    assert registry.ops == ()
    (problem,) = [p for p in registry.problems if p.code.startswith("lock-")]
    assert problem.code == "lock-unreadable" and problem.severity == "error"
    return problem


@pytest.mark.parametrize("mutate, wrong", [s[1:] for s in SHAPES], ids=[s[0] for s in SHAPES])
def test_verify_names_the_key_of_the_wrong_shape(locked, mutate, wrong):
    """One line: the lockfile, the key path, what was expected and found, what to do."""
    path = locked.write(mutate)
    code, text = _verify(path)
    assert code == 1 and "Traceback" not in text
    assert text.startswith(f"opregistry verify: lockfile {str(path)!r} is malformed (")
    assert wrong(locked) in text
    assert text.rstrip().endswith(f"regenerate it with 'opregistry lock -o {path}'")
    assert len(text.strip().splitlines()) == 1
    with pytest.raises(LockMismatchError, match="is malformed"):
        read_lock(path)


@pytest.mark.parametrize("mutate, wrong", [s[1:] for s in SHAPES], ids=[s[0] for s in SHAPES])
def test_locked_mode_loads_nothing_under_a_lock_of_the_wrong_shape(locked, monkeypatch,
                                                                   mutate, wrong):
    path = locked.write(mutate)
    monkeypatch.setenv("OPREGISTRY_LOCK", str(path))
    registry = load(locked.dists)  # never raises
    problem = _unreadable(registry)
    assert f"lockfile {str(path)!r} is malformed (" in problem.message
    assert wrong(locked) in problem.message


@pytest.mark.parametrize("case", ["adopted-null", "adopted-entry-null", "edited-fingerprint"])
def test_an_adopted_namespace_under_an_unusable_lock_is_refused_with_its_reason(
        locked, monkeypatch, case):
    """The first touch of an adopted namespace: the package is not imported, and the error
    at ``torch.ops.<ns>.<op>`` says why -- no AttributeError from inside opregistry."""
    mutate = {"adopted-null": lambda d, lk: _set(d, ("adopted",), None),
              "adopted-entry-null": lambda d, lk: _set(d, ("adopted", lk.foreign), None),
              "edited-fingerprint": lambda d, lk: _set(d, ("fingerprint",), "sha256:00")}[case]
    path = locked.write(mutate, refingerprint=case != "edited-fingerprint")
    monkeypatch.setenv("OPREGISTRY_LOCK", str(path))
    registry = load(locked.dists)
    _unreadable(registry)
    with pytest.raises(AttributeError) as info:
        getattr(torch.ops, locked.adopted_ns).scale
    text = str(info.value)
    assert "NoneType" not in text and locked.package not in sys.modules
    assert f"{locked.foreign}==1.0" in text and f"lockfile {str(path)!r}" in text
    assert ("edited by hand" if case == "edited-fingerprint" else "is malformed (adopted") in text


# -- no regular file ------------------------------------------------------------------


def _not_regular(tmp_path: Path, kind: str) -> tuple[Path, str]:
    path = tmp_path / f"{kind}.lock"
    if kind == "folder":
        path.mkdir()
        return path, "it is a folder, not a regular file"
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs here")
    os.mkfifo(path)
    return path, "it is a FIFO (named pipe), not a regular file"


@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_a_lockfile_that_is_no_regular_file_is_refused_without_reading_it(locked, tmp_path,
                                                                         kind):
    """verify, the locked mode at ``import torch`` and ``list``: a clean error, no hang."""
    path, why = _not_regular(tmp_path, kind)
    said = f"lockfile {str(path)!r} cannot be read ({why}); give the path of a lockfile"
    verify = subprocess.run([sys.executable, "-m", "opregistry", "verify", str(path)],
                            env=locked.env(), capture_output=True, text=True, timeout=120)
    assert verify.returncode == 1 and "Traceback" not in verify.stderr
    assert verify.stderr.startswith(f"opregistry verify: {said}")
    code = textwrap.dedent(f"""
        import json, sys, torch, opregistry
        r = opregistry.get_registry()
        print(json.dumps({{"ops": len(r.ops), "problems": [[p.code, p.message] for p in r.problems],
                          "imported": {locked.module!r} in sys.modules}}))
    """)
    run = subprocess.run([sys.executable, "-c", code], env=locked.env(path),
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout.strip().splitlines()[-1])
    assert found["ops"] == 0 and not found["imported"]
    assert [c for c, _ in found["problems"] if c.startswith("lock-")] == ["lock-unreadable"]
    assert any(said in m for _, m in found["problems"])
    listed = subprocess.run([sys.executable, "-m", "opregistry", "list"], env=locked.env(path),
                            capture_output=True, text=True, timeout=120)
    assert "Traceback" not in listed.stderr and "lock-unreadable" in listed.stdout + listed.stderr


# -- the fingerprint ------------------------------------------------------------------


@pytest.mark.parametrize("case", ["edited", "deleted"])
def test_a_lock_whose_fingerprint_was_edited_or_deleted_is_unusable(locked, monkeypatch, case):
    """``verify`` fails, and the locked mode loads nothing: both say why."""
    data = json.loads(locked.path.read_text())
    if case == "edited":
        data["fingerprint"] = "sha256:00"
        said = (f"lockfile {str(locked.path)!r} was edited by hand: its fingerprint sha256:00 "
                f"does not match its content ({locked.data['fingerprint']})")
    else:
        del data["fingerprint"]
        said = f"lockfile {str(locked.path)!r} has no fingerprint (it was edited by hand"
    locked.path.write_text(json.dumps(data, indent=2))
    code, text = _verify(locked.path)
    assert code == 1 and said in text and "Traceback" not in text
    assert f"regenerate it with 'opregistry lock -o {locked.path}'" in text
    monkeypatch.setenv("OPREGISTRY_LOCK", str(locked.path))
    assert said in _unreadable(load(locked.dists)).message


def test_what_opregistry_lock_writes_verifies_and_loads_in_locked_mode(locked, tmp_path,
                                                                      monkeypatch):
    """The fingerprint check holds for the real output: a file, and stdout (``-o -``)."""
    path = tmp_path / "cli.lock"
    with redirect_stderr(io.StringIO()), redirect_stdout(io.StringIO()):
        assert cli.main(["lock", "-o", str(path)]) == 0
    out = io.StringIO()
    with redirect_stderr(io.StringIO()), redirect_stdout(out):
        assert cli.main(["lock", "-o", "-"]) == 0
    piped = tmp_path / "piped.lock"
    piped.write_text(out.getvalue())
    for lock in (path, piped, locked.path):
        code, text = _verify(lock)
        assert code == 0, text
        assert read_lock(lock)["fingerprint"] == fingerprint_of(read_lock(lock))
    monkeypatch.setenv("OPREGISTRY_LOCK", str(path))
    registry = load(locked.dists)
    assert registry.op(f"{locked.ns}::f") is not None
    assert not [p for p in registry.problems if p.code.startswith("lock-")]
    assert getattr(torch.ops, locked.adopted_ns).scale(torch.ones(2), 3.0).tolist() == [3.0, 3.0]
