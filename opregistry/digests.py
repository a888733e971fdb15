"""What a distribution's installed files hold: one sha256 per file, one digest per distribution.

The lock (:mod:`opregistry.lockfile`) records these, ``opregistry verify``
compares them, and the locked mode (:mod:`opregistry.lock_gate`) checks them
before a plugin module is imported.  Which files count depends on how the
distribution was installed:

``wheel``
    a ``*.dist-info`` with a ``RECORD`` (pip, uv, installer): every file
    ``RECORD`` lists with a hash -- the package's modules, its data files,
    ``METADATA`` and ``entry_points.txt``.  Files without a hash in ``RECORD``
    (``RECORD`` itself, ``.pyc`` files some installers add) are left out.  A
    listed file that is not there (a script ``../../bin/x`` that ``pip install
    --target`` put elsewhere) is recorded as absent (``None``).
``editable``
    ``direct_url.json`` says ``dir_info.editable`` (PEP 660): ``RECORD``
    lists only a ``.pth`` file or an import finder, so the source files of
    the top-level packages and modules the distribution's entry points name
    (and its ``top_level.txt`` names) are hashed as they are on disk, every
    file of each package folder except ``__pycache__``, plus the ``RECORD``
    entries with a hash and the dist-info's ``METADATA`` and
    ``entry_points.txt``.
``source``
    no ``RECORD`` (an ``.egg-info``, a hand-made ``*.dist-info``): as
    ``editable``.

File names are relative -- to ``site-packages`` as ``RECORD`` writes them,
or to the folder holding the top-level package -- and use ``/``, so the
same install on two machines gives the same names and digests.

:func:`contents` with ``trust_record=False`` (the default) hashes every file
on disk: what ``opregistry lock`` records, and what ``opregistry verify`` and
the locked mode compare with it, so that a lock made on an install verifies
against that install.  ``RECORD`` is not proof of content: pip copies a
wheel's ``RECORD`` without checking it, and published wheels with a wrong
hash in it exist (intel-extension-for-pytorch 2.8.0's ``METADATA``).  Where a
wheel's file differs from what ``RECORD`` says (edited after install, or a
wrong ``RECORD``), the record says so in ``differs_from_record`` -- for the
reviewer of the lock; it is not compared.  ``trust_record=True`` (a
fingerprint that must be cheap: :func:`opregistry.distributed.verify_consistent`)
takes a wheel file's sha256 from ``RECORD`` when the file exists at the size
``RECORD`` gives (a ``stat``, no read), and hashes it otherwise.  Nothing
here imports a plugin's module: a top-level package is located with
:func:`importlib.util.find_spec`, which runs no code of the package.
"""

from __future__ import annotations

import importlib.machinery
import json
import os
from typing import Any, Iterable

from .keys import installed_torch_dir
from .regular import open_regular

__all__ = ["contents", "install_kind", "digest_of", "file_differences", "short"]

_CHUNK = 1 << 20


def _sha256_file(path: str) -> str | None:
    """Hex sha256 of the file at ``path``, or ``None`` when it cannot be read."""
    import hashlib  # here: OpenSSL's import is a cost only the locked mode should pay

    h = hashlib.sha256()
    try:
        with open_regular(path) as f:
            while True:
                chunk = f.read(_CHUNK)
                if not chunk:
                    break
                h.update(chunk)
    except OSError:
        return None
    return h.hexdigest()


def short(value: str | None) -> str:
    """The first 12 hex digits of a sha256, for messages; ``missing`` for ``None``."""
    return "missing" if value is None else str(value)[:12] + "..."


def digest_of(files: dict[str, str | None]) -> str:
    """``sha256:<hex>`` of a file map (name -> hex sha256), independent of its order."""
    import hashlib

    body = json.dumps(sorted(files.items()), separators=(",", ":"), ensure_ascii=True)
    return "sha256:" + hashlib.sha256(body.encode()).hexdigest()


def _folder(dist: Any) -> str | None:
    """The dist-info / egg-info folder of ``dist``; ``None`` for a custom provider."""
    path = getattr(dist, "_path", None)
    return None if path is None else str(path)


def _read_text(dist: Any, name: str) -> str | None:
    """``dist.read_text(name)``, with plain ``open`` for a folder (no pathlib on the hot path)."""
    folder = _folder(dist)
    if folder is None:
        return dist.read_text(name)
    try:
        with open_regular(os.path.join(folder, name), "r", encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None


def _locate_file(dist: Any, name: str) -> str:
    folder = _folder(dist)
    if folder is None:
        return str(dist.locate_file(name))
    return os.path.join(os.path.dirname(folder), name)


def install_kind(dist: Any, record: str | None = None) -> str:
    """``wheel``, ``editable`` or ``source`` (see the module docstring).

    ``record``: the text of ``RECORD`` when the caller has read it already.
    """
    direct = _read_text(dist, "direct_url.json")
    if direct:
        try:
            info = json.loads(direct)
        except ValueError:
            info = {}
        if isinstance(info, dict) and (info.get("dir_info") or {}).get("editable"):
            return "editable"
    return "wheel" if (record if record is not None else _read_text(dist, "RECORD")) else "source"


def _record(text: str) -> list[tuple[str, str | None, int | None]]:
    """``(relative name, hex sha256 or None, size or None)`` of every RECORD entry with a hash.

    The hex value is ``None`` when RECORD uses another algorithm (sha384,
    ...) or a malformed value: the file is then hashed with sha256 on disk,
    and not compared with RECORD.  The size is ``None`` when RECORD gives none.
    """
    import csv

    out = []
    for row in csv.reader(text.splitlines()):
        if len(row) < 2 or not row[0] or not row[1]:
            continue
        algo, _, b64 = row[1].partition("=")
        hexval = None
        if algo == "sha256":
            try:
                import base64

                hexval = base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4)).hex()
            except (ValueError, TypeError):
                hexval = None
        size = int(row[2]) if len(row) > 2 and row[2].strip().isdigit() else None
        out.append((row[0].replace(os.sep, "/"), hexval, size))
    return out


def _has_size(path: str, size: int | None) -> bool:
    """Whether ``path`` is a file of ``size`` bytes (any size when ``None``): one ``stat``."""
    import stat

    try:
        st = os.stat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and (size is None or st.st_size == size)


def _top_levels(dist: Any, entry_points: Any = None) -> list[str]:
    """Top-level module names the entry points (all groups) and ``top_level.txt`` name."""
    names = set()
    for ep in dist.entry_points if entry_points is None else entry_points:
        module = ep.value.partition(":")[0].strip()
        if module:
            names.add(module)
    for line in (_read_text(dist, "top_level.txt") or "").splitlines():
        if line.strip():
            names.add(line.strip())
    return sorted(names)


def _locate(module: str) -> list[tuple[str, str]]:
    """``(path, base)`` pairs holding ``module``'s top-level package, without running its code.

    ``base`` is the folder relative to which names are written.  A namespace
    package (no ``__init__``, no code) is descended into, so that
    ``ns.mylib.ops`` is located at ``ns/mylib``; a regular package is never
    descended into, since finding its submodules would import it.
    """
    import importlib.util

    parts = module.split(".")
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError, AttributeError):
            return []
        if spec is None:
            return []
        locations = list(spec.submodule_search_locations or [])
        if spec.origin not in (None, "namespace") and spec.has_location:
            if locations:  # a regular package: its folder
                folder = os.path.dirname(spec.origin)
                return [(folder, _base(folder, depth))]
            return [(spec.origin, _base(os.path.dirname(spec.origin), depth - 1))]
        if not locations:
            return []
        if depth == len(parts):  # the named module is itself a namespace package
            return [(loc, _base(loc, depth)) for loc in locations]
    return []


def _base(folder: str, depth: int) -> str:
    for _ in range(depth):
        folder = os.path.dirname(folder)
    return folder


def _walk(path: str, base: str) -> Iterable[tuple[str, str]]:
    """``(relative name, absolute path)`` of every file under ``path`` but ``__pycache__``."""
    if os.path.isfile(path):
        yield os.path.relpath(path, base).replace(os.sep, "/"), path
        return
    for folder, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            full = os.path.join(folder, name)
            yield os.path.relpath(full, base).replace(os.sep, "/"), full


def contents(dist: Any, *, trust_record: bool = False, entry_points: Any = None,
             references: Iterable[str] = ()) -> dict[str, Any]:
    """The content record of ``dist``: install kind, per-file sha256 and a digest.

    ``{"install": kind, "digest": "sha256:...", "files": {name: hex}}``; a file
    that RECORD lists but that is missing on disk has ``None``.  Every file is
    hashed on disk unless ``trust_record`` (see the module docstring).  For a
    wheel, ``"differs_from_record"`` (only present when not empty) maps each
    file whose content differs from its ``RECORD`` entry -- or that is
    absent -- to the sha256 ``RECORD`` gives for it.
    ``entry_points``: ``dist.entry_points``, when the caller has read them.

    ``references``: the modules the plan may import for ``dist`` (its
    declarations modules, and the modules of its kernel, fake, autograd, vmap,
    dispatch-rule, predicate and sample references): each is located without
    running it (:func:`opregistry.locate.locate_module`), and every file its
    import runs that the install's own list lacks is hashed on disk and added.
    The record then says which modules added files (``"references"``, so that
    the locked mode hashes the same files before importing anything) and, in
    ``"not_covered"``, every module whose files cannot be hashed (not found,
    inside an archive, found by a finder that names no file).  Both keys are
    only present when not empty.
    """
    record = _read_text(dist, "RECORD") or ""
    kind = install_kind(dist, record)
    wheel = kind == "wheel"
    trust = trust_record and wheel
    files: dict[str, str | None] = {}
    # file -> RECORD's sha256, for each wheel file that is not what RECORD says
    differs: dict[str, str] = {}
    for name, recorded, size in _record(record):
        path = _locate_file(dist, name)
        if trust and recorded is not None and _has_size(path, size):
            files[name] = recorded
            continue
        files[name] = _sha256_file(path)
        if wheel and recorded is not None and files[name] != recorded:
            differs[name] = recorded
    if kind != "wheel":
        info = _folder(dist)
        if info is not None:
            for meta in ("METADATA", "PKG-INFO", "entry_points.txt"):
                path = os.path.join(str(info), meta)
                if os.path.isfile(path):
                    files.setdefault(f"{os.path.basename(str(info))}/{meta}", _sha256_file(path))
        for module in _top_levels(dist, entry_points):
            for path, base in _locate(module):
                for name, full in _walk(path, base):
                    files.setdefault(name, _sha256_file(full))
    else:
        # a file added among the installed ones that an import would run -- a
        # ``k/__init__.py`` beside the locked ``k.py`` shadows it -- is in no RECORD: the
        # package folders are listed for importable files RECORD lacks
        importable = tuple(importlib.machinery.all_suffixes())
        for module in _top_levels(dist, entry_points):
            for path, base in _locate(module):
                for name, full in _walk(path, base):
                    if name not in files and name.endswith(importable):
                        files[name] = _sha256_file(full)
    added, not_covered = _reference_files(references, files)
    ordered = dict(sorted(files.items()))
    record_out: dict[str, Any] = {"install": kind, "digest": digest_of(ordered), "files": ordered}
    if differs:
        record_out["differs_from_record"] = dict(sorted(differs.items()))
    if added:
        record_out["references"] = added
    if not_covered:
        record_out["not_covered"] = not_covered
    return record_out


def _outside(path: str) -> bool:
    """Whether a reference's file is one the lock does not record.

    Python's standard library and torch's package: both are pinned by version
    (the lock records torch's), and a CPU and a CUDA build of one torch
    release must lock the same.  Site-packages folders inside the standard
    library's folder (a Python without a virtualenv) are not the library.
    """
    full = os.path.abspath(path)
    torch_dir = installed_torch_dir()
    if torch_dir and full.startswith(os.path.join(os.path.abspath(torch_dir), "")):
        return True
    if not full.startswith(_STDLIB):
        return False
    import site
    import sysconfig

    sites = {sysconfig.get_paths().get("purelib"), sysconfig.get_paths().get("platlib"),
             *site.getsitepackages(), site.getusersitepackages()}
    return not any(s and full.startswith(os.path.join(os.path.abspath(s), "")) for s in sites)


#: the standard library's folder (where ``os`` lives: the real one, not a virtualenv's)
_STDLIB = os.path.join(os.path.dirname(os.path.abspath(os.__file__)), "")


def _reference_files(references: Iterable[str], files: dict[str, str | None]
                     ) -> tuple[list[str], list[str]]:
    """Add the files of each referenced module that ``files`` lacks; ``(modules, not covered)``."""
    from .locate import locate_module

    wanted = sorted(set(references))
    if not wanted:
        return [], []
    added: list[str] = []
    not_covered: list[str] = []
    for module in wanted:
        if module.startswith(("file:", "path:")):
            _native_file(module, files, added, not_covered)
            continue
        found = locate_module(module)
        if found.found in ("missing", "archive", "other"):
            not_covered.append(f"module {module}: {found.why}")
        grew = False
        for name, path in zip(found.names, found.files):
            if name in files or _outside(path):
                continue
            files[name] = _sha256_file(path)
            grew = True
        if grew:
            added.append(module)
    return added, not_covered


def file_differences(distribution: str, old: dict[str, Any], new: dict[str, Any],
                     in_a: str, in_b: str) -> list[str]:
    """One sentence per file that differs between two content records of ``distribution``.

    ``in_a`` / ``in_b`` say where each record comes from (``"in the lockfile"``,
    ``"here"``).
    """
    fa, fb = _file_map(old), _file_map(new)
    out = []
    for name in sorted(set(fa) | set(fb)):
        if name not in fb:
            out.append(f"distribution {distribution}: file {name} removed (sha256 "
                       f"{short(fa[name])} {in_a}, no such file {in_b})")
        elif name not in fa:
            out.append(f"distribution {distribution}: file {name} added (no such file {in_a}, "
                       f"sha256 {short(fb[name])} {in_b})")
        elif fa[name] != fb[name]:
            out.append(f"distribution {distribution}: file {name} changed (sha256 "
                       f"{short(fa[name])} {in_a}, {short(fb[name])} {in_b})")
    install_a, install_b = (r.get("install") if isinstance(r, dict) else None for r in (old, new))
    if not out and install_a != install_b:
        out.append(f"distribution {distribution}: installed as {install_a} {in_a}, "
                   f"as {install_b} {in_b}")
    return out


def _file_map(record: Any) -> dict[str, Any]:
    """A content record's ``files``; empty where the record has none, or not as a map.

    :func:`opregistry.lockfile.read_lock` refuses a lockfile of another shape; this is
    the second line, so that a comparison never fails on one.
    """
    files = record.get("files") if isinstance(record, dict) else None
    return files if isinstance(files, dict) else {}


def _native_file(ref: str, files: dict[str, str | None], added: list[str],
                 not_covered: list[str]) -> None:
    """A native library named by path: ``file:<name under a sys.path entry>``, or ``path:<abs>``."""
    import sys

    kind, _, name = ref.partition(":")
    if kind == "path":
        not_covered.append(f"native library {name}: outside every sys.path entry, so no name "
                           f"that holds on another machine")
        return
    if name in files:
        return
    for entry in sys.path:
        full = os.path.join(os.path.abspath(entry or os.curdir), *name.split("/"))
        if os.path.isfile(full):
            files[name] = _sha256_file(full)
            added.append(ref)
            return
    files[name] = None  # recorded as missing: the lock says it was expected
    added.append(ref)
