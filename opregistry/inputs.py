"""What a resolved plan depends on: the stamps of its inputs, and the slot that names them.

The plan cache (:mod:`opregistry.plancache`) keeps a plan while none of its
inputs changed, and tells by the inputs' *stamps*, the way CPython tells a
stale ``.pyc`` (PEP 552):

* **the slot** -- what is known without reading a file: Python's version
  and executable (the file it links to, and its prefix), the platform, ``sys.path`` in
  order but its first entry
  (the script's folder or the working directory: the manifest checks it),
  every ``OPREGISTRY_*`` variable (and the working directory when one names
  a file relative to it), the settings (allow- and block-lists, policy and
  adoption switches, strict, lock), whether torch is imported, the check
  mode.  One cache
  entry per slot.
* **the manifest** -- a stamp per file or directory: every ``sys.path``
  entry; every distribution's metadata folder on it (``*.dist-info``,
  ``*.egg-info``) with its ``entry_points.txt`` and ``METADATA``; the
  ``.pth`` files and editable-install finders; every file and folder of the
  packages of the op and backend distributions (what their declaration code
  can read); every other module imported while the declarations were
  collected (outside torch and the standard library); opregistry's own
  package; the configuration file and the lockfile; torch's ``version.py``.

A file's stamp is its size and modification time (nanoseconds); a folder's,
its modification time, which changes when an entry is added, removed or
renamed -- so a new distribution, a new ``.pth`` or a module that would
shadow one is seen without listing anything.  With ``content=True`` (locked
mode, ``OPREGISTRY_CACHE_CHECK=content``) every stamp also holds a digest of
the content (a folder's: of its sorted listing).  A file modified less than
:data:`RACY_NS` before it was stamped gets the digest anyway: a
modification time is only as fine as the file system's clock tick, and an
edit that keeps the size within the same tick would otherwise go unseen
(git's "racily clean" entries, treated the same way).  Once such a file has
been checked by its digest well after its modification time, the digest is
dropped (:func:`settle`): an edit from then on changes the time, as git
refreshes its index.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
import sysconfig
import time
from typing import Any, Iterable, Mapping

from .regular import open_regular, walk

__all__ = ["FIRST", "RACY_NS", "Stamper", "absolute", "first_folder", "plain_first", "settle", "slot",
           "environment_slot", "check_manifest", "sys_path_files", "module_files",
           "package_files"]

#: a file modified less than this before it is stamped is also stamped by content
RACY_NS = 2_000_000_000
#: how far a file's modification time may lag the clock that wrote it (the kernel stamps
#: files from a coarser clock than ``time.time_ns``)
_CLOCK_SLACK_NS = 20_000_000

_META_SUFFIXES = (".dist-info", ".egg-info")
_META_FILES = ("entry_points.txt", "METADATA", "PKG-INFO")


def _digest_file(path: str) -> str:
    h = hashlib.sha256()
    with open_regular(path) as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:32]


def _digest_dir(path: str) -> str:
    return hashlib.sha256("\0".join(sorted(os.listdir(path))).encode(
        "utf-8", "surrogateescape")).hexdigest()[:32]


def _stamp(path: str, content: bool, racy_after: int | None) -> list[Any] | None:
    """``[size, mtime_ns]`` (``-1`` for a folder), with a digest when asked or racy."""
    try:
        st = os.stat(path)
        folder = stat.S_ISDIR(st.st_mode)
        found: list[Any] = [-1 if folder else st.st_size, st.st_mtime_ns]
        if content or (racy_after is not None and st.st_mtime_ns >= racy_after):
            found.append(_digest_dir(path) if folder else _digest_file(path))
    except OSError:
        return None
    return found


def _relevant(name: str, tops: frozenset[str]) -> bool:
    """Whether a ``sys.path`` folder's entry ``name`` can change what is installed or imported."""
    return (name.endswith(_META_SUFFIXES) or name.endswith((".pth", ".egg-link"))
            or name.startswith("__editable__") or name.split(".", 1)[0] in tops)


def _listing(folder: str, tops: frozenset[str]) -> str | None:
    names = _names(folder)
    return None if names is None else _digest(names, tops)


class Stamper:
    """Stamps paths for a new manifest: ``content`` asks for digests of every one.

    The folders on ``sys.path`` are stamped apart (:meth:`watch`): a
    folder such as the working directory changes all the time, and only an
    entry that is a distribution's metadata, a ``.pth`` file, an editable
    finder, or a module or package named like one imported to declare the
    ops (``tops``) can change the plan.  Such a folder's stamp is its
    modification time and the digest of those entries' names; when the time
    differs, the names are compared.
    """

    def __init__(self, content: bool) -> None:
        self.content = content
        #: when the build began (the declarations are read after): a file stamped with a
        #: later time changed while it was built, perhaps after it was read
        self.started = time.time_ns()
        self.racy_after = self.started - RACY_NS
        self.stamps: dict[str, list[Any] | None] = {}
        self.before: dict[str, list[str] | None] = {}
        #: ``sys.path[0]`` when the folders were listed
        self.first: str | None = None

    def add(self, paths: Iterable[str]) -> None:
        for path in paths:
            if path not in self.stamps:
                self.stamps[path] = _stamp(path, self.content, self.racy_after)

    def watch(self, folders: Iterable[str]) -> None:
        """List the folders before the declarations are read (see :meth:`manifest`)."""
        self.first = first_folder()
        for folder in folders:
            self.before[folder] = _names(folder)

    def manifest(self, tops: Iterable[str]) -> dict[str, Any] | None:
        """The manifest; ``None`` when a relevant entry of a folder changed meanwhile, or a
        file was written after the build began: the plan may hold what it said before, and
        its stamp (with the digest of what it says now) would vouch for the plan."""
        since = self.started - _CLOCK_SLACK_NS
        if any(found is not None and found[0] != -1 and found[1] >= since
               for found in self.stamps.values()):
            return None
        wanted = frozenset(tops)
        folders: dict[str, Any] = {}
        for folder, before in self.before.items():
            now = _mtime(folder)
            after = _names(folder)
            if (before is None) != (after is None) or (before is not None and after is not None
                                                       and _digest(before, wanted)
                                                       != _digest(after, wanted)):
                return None
            folders[folder] = None if now is None or after is None else [
                now, _digest(after, wanted), now >= self.racy_after]
        return {"files": self.stamps, "folders": folders, "tops": sorted(wanted),
                "first": self.first}


def _names(folder: str) -> list[str] | None:
    """The entries of ``folder`` that an import or an installation can find: all but a plain
    file without a suffix, which no import finds (the console script ``bin/opregistry`` of
    a process started from it, with ``bin`` as its ``sys.path[0]``)."""
    try:
        with os.scandir(folder) as entries:
            return [e.name for e in entries if "." in e.name or _is_folder(e)]
    except OSError:
        return None


def _is_folder(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()  # a package, a namespace package (through a link too)
    except OSError:
        return True  # unknown: kept


def _digest(names: Iterable[str], tops: frozenset[str]) -> str:
    relevant = sorted(n for n in names if _relevant(n, tops))
    return hashlib.sha256("\0".join(relevant).encode("utf-8", "surrogateescape")).hexdigest()[:32]


#: the digest of a folder's listing with no entry that can change the plan
_NOTHING = _digest((), frozenset())


def _mtime(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def plain_first(manifest: Mapping[str, Any]) -> bool:
    """Whether the manifest's ``sys.path[0]`` held nothing that can change the plan: its
    entry is stored in the shared slot, else in the slot of that folder (see :func:`_process`)."""
    recorded = manifest["folders"].get(manifest.get("first"))
    return recorded is not None and recorded[1] == _NOTHING


def check_manifest(manifest: Mapping[str, Any]) -> str | None:
    """``None`` when every stamp still holds; else the first path that changed.

    ``sys.path[0]`` may be another folder than the manifest's (``first``)
    when neither holds an entry that can change the plan (see
    :class:`Stamper`): the manifest's own is then not checked, unless it is
    on ``sys.path`` further down.
    """
    tops = frozenset(manifest["tops"])
    folders = manifest["folders"]
    first, recorded_first = first_folder(), manifest.get("first")
    skip = None
    if first != recorded_first:
        if first is None or not plain_first(manifest) or _listing(first, tops) != _NOTHING:
            return first or "sys.path"
        rest = set(map(absolute, sys.path[1:]))
        skip = None if recorded_first in rest else recorded_first
    for folder, recorded in folders.items():
        if folder == skip:
            continue
        now = _mtime(folder)
        if recorded is None or now is None:
            if recorded is not None or now is not None:
                return folder
            continue
        if (now != recorded[0] or recorded[2]) and _listing(folder, tops) != recorded[1]:
            return folder
    return _check_files(manifest["files"])


def settle(manifest: Mapping[str, Any], now: int | None = None) -> dict[str, Any] | None:
    """``manifest`` without the digests it holds of files racy when stamped and settled since;
    ``None`` when there are none.  For a manifest :func:`check_manifest` just found to hold,
    stamped by size and time (a racy file's digest was then compared): a file modified more
    than :data:`RACY_NS` ago changes its time when it is edited again.
    """
    settled_before = (time.time_ns() if now is None else now) - RACY_NS
    files = {path: stamp[:2] for path, stamp in manifest["files"].items()
             if stamp is not None and len(stamp) > 2 and stamp[1] < settled_before}
    folders = {folder: [*stamp[:2], False] for folder, stamp in manifest["folders"].items()
               if stamp is not None and stamp[2] and stamp[0] < settled_before}
    if not files and not folders:
        return None
    return {**manifest, "files": {**manifest["files"], **files},
            "folders": {**manifest["folders"], **folders}}


def _check_files(files: Mapping[str, Any]) -> str | None:
    for path, recorded in files.items():
        if recorded is None:
            if os.path.lexists(path):
                return path
            continue
        try:
            st = os.stat(path)
        except OSError:
            return path
        folder = stat.S_ISDIR(st.st_mode)
        if (-1 if folder else st.st_size) != recorded[0] or st.st_mtime_ns != recorded[1]:
            return path
        if len(recorded) > 2:
            try:
                if (_digest_dir(path) if folder else _digest_file(path)) != recorded[2]:
                    return path
            except OSError:
                return path
    return None


def sys_path_files(paths: Iterable[str]) -> tuple[list[str], list[str]]:
    """The folders on ``sys.path``, and the files there that say what is installed.

    The second list: the ``sys.path`` entries that are files (zip archives),
    and in each folder the metadata folders of distributions with their
    ``entry_points.txt`` and ``METADATA`` (or ``PKG-INFO``), ``.pth`` files,
    ``.egg-link`` files and the finders of editable installs (``__editable__*``).
    """
    folders: list[str] = []
    files: list[str] = []
    for entry in map(absolute, paths):
        if entry.startswith("__editable__"):
            continue  # its finder is stamped in the folder that holds it
        try:
            with os.scandir(entry) as listing:
                names = [e.name for e in listing]
        except NotADirectoryError:
            files.append(entry)
            continue
        except OSError:
            folders.append(entry)  # missing: stamped as missing
            continue
        folders.append(entry)
        for name in sorted(names):
            full = os.path.join(entry, name)
            if name.endswith(_META_SUFFIXES):
                files.append(full)
                files.extend(os.path.join(full, f) for f in _META_FILES)
            elif name.endswith((".pth", ".egg-link")) or name.startswith("__editable__"):
                files.append(full)
    return folders, files


def _excluded_roots() -> tuple[str, ...]:
    """Folders whose modules are stamped by a version instead: the standard library, torch."""
    roots = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib")}
    torch = sys.modules.get("torch")
    torch_file = getattr(torch, "__file__", None)
    if torch_file:
        roots.add(os.path.dirname(torch_file))
    return tuple(os.path.join(os.path.abspath(r), "") for r in roots if r)


def module_files(names: Iterable[str]) -> list[str]:
    """The files of the modules ``names`` (imported), less the standard library's and torch's."""
    skip = _excluded_roots()
    found = []
    for name in names:
        path = getattr(sys.modules.get(name), "__file__", None)
        if isinstance(path, str) and os.path.isabs(path) and not path.startswith(skip):
            found.append(path)
    return found


def package_files(modules: Iterable[str]) -> list[str]:
    """Every file and folder of the top-level packages of ``modules`` (``__pycache__`` aside).

    What a plugin's declaration code can read from its own package: its
    modules, and data files such as a native library's build information.
    A top-level module that is not a package is its own file.
    """
    found: list[str] = []
    for top in sorted({m.split(".", 1)[0] for m in modules}):
        module = sys.modules.get(top)
        roots = list(getattr(module, "__path__", None) or ())
        if not roots:
            path = getattr(module, "__file__", None)
            if isinstance(path, str):
                found.append(os.path.abspath(path))
            continue
        for root in roots:  # a linked folder's files too (their edits change the plan)
            for folder, _, files in walk(root, lambda d: d == "__pycache__"):
                found.append(folder)
                found.extend(os.path.join(folder, f) for f in files
                             if not f.endswith((".pyc", ".pyo")))
    return found


#: the slot's name for ``sys.path[0]``, which the manifest checks (:func:`check_manifest`)
FIRST = "<sys.path[0]>"
#: the variables that name a file, read relative to the working directory
_PATH_VARIABLES = ("OPREGISTRY_CONFIG", "OPREGISTRY_LOCK")


def first_folder() -> str | None:
    """``sys.path[0]``, absolute: the script's folder, or the working directory (``-c``, ``-m``)."""
    return absolute(sys.path[0]) if sys.path else None


def absolute(entry: str) -> str:
    """A ``sys.path`` entry as an absolute path; an editable install's path hook as it is
    (``__editable__.NAME.finder.__path_hook__``: a name its finder claims, not a folder)."""
    return entry if entry.startswith("__editable__") else os.path.abspath(entry or os.curdir)


def _process(environ: Mapping[str, str], own: bool) -> list[Any]:
    """What names a slot before any setting: the interpreter, ``sys.path``, the variables.

    ``sys.path[0]`` is named :data:`FIRST` in the shared slot (``own=False``):
    a script run from a new folder reuses its entry when that folder holds
    nothing that can change the plan (:func:`check_manifest`).  A folder that
    does (a checkout with the package being developed in it) has a slot of its
    own, named by its path (``own=True``; see :func:`plain_first`).  The
    working directory counts only when a variable names a file relative to it.
    """
    variables = sorted((k, v) for k, v in environ.items()
                       if k.startswith("OPREGISTRY_") and k != "OPREGISTRY_CACHE_DIR")
    relative = any(environ.get(k) and not os.path.isabs(environ[k]) for k in _PATH_VARIABLES)
    return [
        # the interpreter by what it is: `python`, `python3` and a console script's
        # `python3.11` of one environment (links to one file, one prefix) share their slots
        sys.version, os.path.realpath(sys.executable), sys.prefix, sys.platform,
        sys.implementation.cache_tag,
        [FIRST if not own else first_folder(), *map(absolute, sys.path[1:])]
        if sys.path else [],
        variables, os.getcwd() if relative else None,
    ]


def environment_slot(*, torch_imported: bool, content: bool,
                     environ: Mapping[str, str] | None = None, own: bool = False) -> str:
    """:func:`slot` before the settings are parsed: the same inputs, the ``OPREGISTRY_*``
    variables as they are set (the settings are a function of them and of the
    configuration file, which the manifest stamps)."""
    data = [*_process(os.environ if environ is None else environ, own), torch_imported,
            content]
    return json.dumps(data, separators=(",", ":"))


def slot(settings: Any, *, torch_imported: bool, content: bool,
         environ: Mapping[str, str] | None = None, own: bool = False) -> str:
    """What names a cache entry: every input known without reading a file, as one string."""
    policy = settings.policy
    data = [
        *_process(os.environ if environ is None else environ, own),
        None if settings.allow is None else sorted(settings.allow), sorted(settings.block),
        settings.strict, settings.lock, sorted(settings.sources.items()),
        list(settings.unknown_variables), sorted(policy.allow_override),
        sorted(policy.backends), sorted(policy.backend_sources.items()),
        [[s.text, s.source] for s in policy.kernels], policy.adopt, sorted(policy.adopt_block),
        sorted(policy.adopt_sources.items()), torch_imported, content,
    ]
    return json.dumps(data, separators=(",", ":"))
