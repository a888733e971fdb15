"""The installed distributions, the files each installed, and which one owns a file.

Read without importing any of them (importlib-metadata's distributions, their
``METADATA`` header, ``RECORD`` and ``entry_points.txt``):

* :func:`distributions`: every installed distribution, the first copy on
  ``sys.path`` of each (the one Python imports from), with what its
  metadata says about torch;
* :func:`files_of`: the files a distribution installed: ``RECORD``'s
  entries, or -- for an editable install (PEP 660: ``RECORD`` lists a
  ``.pth`` file or an import finder) and for one without ``RECORD`` -- the
  files of the top-level packages that ``top_level.txt`` and the entry
  points name, located with :func:`importlib.util.find_spec` (which runs no
  code of the package);
* :func:`owner_of`: which distribution owns a file (``/.../bitsandbytes/_ops.py``,
  ``/.../_C.so``), from the same file lists: the file itself, or else the
  nearest folder that only one distribution installed files in (a file
  written after install, such as a JIT-built library in the package's
  folder).  The index is built once per process and ``sys.path``.
"""

from __future__ import annotations

import csv
import functools
import json
import os
import re
import sys
from typing import Any, Iterable

from attrs import field, frozen

from .variables import canonical_name
from .foreign import InstalledDistribution
from .regular import read_regular, walk

__all__ = ["NATIVE_SUFFIXES", "DistInfo", "distributions", "files_of",
           "is_editable", "module_name", "owner_of", "Owners", "owners"]

#: shared libraries: what ``TORCH_LIBRARY`` code ships as
NATIVE_SUFFIXES = (".so", ".pyd", ".dylib")
_REQUIREMENT_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_GROUP = re.compile(r"^\s*\[([^\]]+)\]\s*$", re.M)
_IDENT = re.compile(r"[A-Za-z_]\w*\Z")
#: a module's path: identifiers joined by "/"
_DOTTED = re.compile(r"[A-Za-z_]\w*(?:/[A-Za-z_]\w*)*\Z")
#: a Python extension module's file name: ``_C.cpython-311-x86_64-linux-gnu.so``, ``_C.abi3.so``,
#: ``_C.pyd``, ``_C.cp311-win_amd64.pyd``
_EXTENSION = re.compile(r"([A-Za-z_]\w*)(\.[\w-]+)*\.(so|pyd)\Z")


@frozen
class DistInfo:
    """One installed distribution as its metadata describes it."""

    installed: InstalledDistribution
    #: ``Requires-Dist`` values, markers included
    requires: tuple[str, ...]
    #: the groups of its entry points
    groups: tuple[str, ...]
    #: importlib-metadata's distribution object
    dist: Any = field(eq=False, repr=False)

    def requires_any(self, names: Iterable[str]) -> bool:
        """Whether ``Requires-Dist`` names one of ``names`` (canonical), under any marker."""
        wanted = set(names)
        for req in self.requires:
            m = _REQUIREMENT_NAME.match(req)
            if m and canonical_name(m.group(1)) in wanted:
                return True
        return False


def _folder(dist: Any) -> str | None:
    path = getattr(dist, "_path", None)
    return None if path is None else str(path)


def _read(dist: Any, name: str) -> str | None:
    folder = _folder(dist)
    if folder is None:
        try:
            return dist.read_text(name)
        except Exception:  # noqa: BLE001 - a custom provider's failure is "no such file"
            return None
    try:  # no text layer for a file read whole, once
        data, _ = read_regular(os.path.join(folder, name))
        # as open(..., encoding="utf-8") reads it: universal newlines
        return data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
    except (OSError, UnicodeDecodeError):
        return None


def _header(dist: Any) -> tuple[str, str, tuple[str, ...]] | None:
    """``(Name, Version, Requires-Dist values)`` from METADATA's header, without the email parser.

    ``None`` when the header has a folded line or lacks a field: the caller
    then asks ``dist.metadata``.
    """
    text = _read(dist, "METADATA") or _read(dist, "PKG-INFO")
    if not text:
        return None
    found: dict[str, str] = {}
    requires: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            break
        if line[0] in " \t":
            return None
        key, sep, value = line.partition(":")
        key = key.lower()
        if not sep:
            continue
        if key == "requires-dist":
            requires.append(value.strip())
        elif key in ("name", "version") and key not in found:
            found[key] = value.strip()
    if "name" not in found or "version" not in found:
        return None
    return found["name"], found["version"], tuple(requires)


def _info(dist: Any) -> DistInfo | None:
    head = _header(dist)
    if head is None:
        try:
            meta = dist.metadata
            head = (meta["Name"], meta["Version"], tuple(meta.get_all("Requires-Dist") or ()))
        except Exception:  # noqa: BLE001 - unreadable metadata: not a distribution we can scan
            return None
        if not head[0] or not head[1]:
            return None
    groups = tuple(sorted(set(_GROUP.findall(_read(dist, "entry_points.txt") or ""))))
    installed = InstalledDistribution(name=canonical_name(head[0]), version=head[1],
                                      location=_folder(dist) or "")
    return DistInfo(installed, head[2], groups, dist)


def distributions() -> list[DistInfo]:
    """Every installed distribution, once (the first copy on ``sys.path``), in ``sys.path`` order."""
    import importlib_metadata

    seen: set[str] = set()
    out = []
    for dist in importlib_metadata.distributions():
        info = _info(dist)
        if info is None or info.installed.name in seen:
            continue
        seen.add(info.installed.name)
        out.append(info)
    return out


def is_editable(info: DistInfo) -> bool:
    """Whether ``info`` is an editable install (``direct_url.json`` says ``dir_info.editable``)."""
    return _editable(info.dist)


def _editable(dist: Any) -> bool:
    text = _read(dist, "direct_url.json")
    if not text:
        return False
    try:
        data = json.loads(text)
    except ValueError:
        return False
    return isinstance(data, dict) and bool((data.get("dir_info") or {}).get("editable"))


def _record(dist: Any, site: str) -> list[tuple[str, str]]:
    text = _read(dist, "RECORD") or ""
    out = []
    # os.path.join(site, rel), spelled out where the separator is "/" (thousands of rows)
    posix = os.sep == "/"
    prefix = site if not site or site.endswith("/") else site + "/"
    # a row's first field is what comes before its first comma, unless the file quotes
    # one (a path holding a comma or a quote): then the csv module reads it
    lines = text.splitlines()
    firsts = ([row[0] for row in csv.reader(lines) if row] if '"' in text
              else [line.partition(",")[0] for line in lines])
    for first in firsts:
        if first:
            rel = first.replace("\\", "/")
            if not posix:
                path = os.path.join(site, rel)
            else:
                path = rel if rel.startswith("/") else prefix + rel
            out.append((os.path.normpath(path) if ".." in rel or "/./" in rel else path, rel))
    return out


def _top_levels(info: DistInfo) -> list[str]:
    names = {line.strip() for line in (_read(info.dist, "top_level.txt") or "").splitlines()
             if line.strip()}
    try:
        for ep in info.dist.entry_points:
            names.add(ep.value.partition(":")[0].strip().split(".")[0])
    except Exception:  # noqa: BLE001 - malformed entry_points.txt: the other names still count
        pass
    return sorted(n for n in names if _IDENT.match(n))


def _top_locations(info: DistInfo, site: str) -> list[tuple[str, str]]:
    """``(path, base)`` of each top-level module or package of ``info``
    (:func:`_top_levels`); with none named (no ``top_level.txt`` -- hatchling
    and flit write none -- and no entry points), the one named after the
    distribution (``my-ext`` -> ``my_ext``) beside its ``.dist-info`` in ``site``."""
    names = _top_levels(info)
    if names:
        return [found for top in names for found in _locate(top)]
    guess = re.sub(r"[-.]+", "_", info.installed.name).lower()
    return [(path, base) for path, base in _locate(guess) if _IDENT.match(guess)
            and os.path.normcase(os.path.normpath(base)) == os.path.normcase(os.path.normpath(site))]


def _locate(name: str) -> list[tuple[str, str]]:
    """``(path, base)`` of top-level module or package ``name``; nothing of it runs."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError, AttributeError):
        return []
    if spec is None:
        return []
    if spec.origin not in (None, "namespace") and spec.has_location:
        if spec.submodule_search_locations:  # a regular package: its folder
            folder = os.path.dirname(spec.origin)
            return [(folder, os.path.dirname(folder))]
        return [(spec.origin, os.path.dirname(spec.origin))]
    return [(loc, os.path.dirname(loc)) for loc in spec.submodule_search_locations or ()]


def _folders(path: str) -> Iterable[tuple[str, list[str]]]:
    """``(folder, its file names)`` of the tree at ``path`` (``__pycache__`` and hidden
    folders aside), sorted."""
    for folder, _, names in walk(path, lambda d: d == "__pycache__" or d.startswith(".")):
        yield folder, names


def _walk(path: str, base: str, folders: list[str]) -> Iterable[tuple[str, str]]:
    """The files of the tree at ``path``; each folder walked is added to ``folders``."""
    if os.path.isfile(path):
        yield os.path.normpath(path), os.path.relpath(path, base).replace(os.sep, "/")
        return
    for folder, names in _folders(path):
        folders.append(os.path.normpath(folder))
        for name in names:
            full = os.path.join(folder, name)
            yield os.path.normpath(full), os.path.relpath(full, base).replace(os.sep, "/")


def files_of(info: DistInfo, folders: list[str] | None = None) -> list[tuple[str, str]]:
    """``(absolute path, name relative to its import root)`` of every file ``info`` installed.

    The relative name is what :func:`module_name` reads a module name from
    (``bitsandbytes/_ops.py``); for ``RECORD`` entries it is ``RECORD``'s
    own (relative to ``site-packages``, possibly ``../../bin/tool``).  The
    files of an editable install, or of one without ``RECORD``, are found by
    walking its top-level packages; ``folders``, when given, gets every
    folder walked (a module added to one is a new file that no file's stamp
    shows: the folder's does), none for the others.
    """
    folder = _folder(info.dist)
    if folder is None:
        return []
    site = os.path.dirname(folder)
    files = _record(info.dist, site)
    if files and not _editable(info.dist):
        return files
    seen = {path for path, _ in files}
    walked = [] if folders is None else folders
    for path, base in _top_locations(info, site):
        for full, rel in _walk(path, base, walked):
            if full not in seen:
                seen.add(full)
                files.append((full, rel))
    return files


def module_name(rel: str) -> str | None:
    """The dotted module a file's relative name imports as, or ``None`` (not importable).

    ``pkg/sub/mod.py`` -> ``pkg.sub.mod``; ``pkg/__init__.py`` -> ``pkg``;
    ``pkg/_C.cpython-311-x86_64-linux-gnu.so`` -> ``pkg._C``.
    """
    head, slash, last = rel.rpartition("/")
    if last.endswith(".py"):
        stem = last[:-3]
    else:
        m = _EXTENSION.match(last)
        if m is None:
            return None
        stem = m.group(1)
    path = head if stem == "__init__" else head + slash + stem
    if not _DOTTED.match(path):
        return None
    return path.replace("/", ".")


class Owners:
    """Which installed distribution owns each file: exact files, then unshared folders."""

    def __init__(self, infos: Iterable[DistInfo]) -> None:
        self.files: dict[str, InstalledDistribution] = {}
        #: folder -> its one distribution, or ``None`` when several installed files in it
        self.folders: dict[str, InstalledDistribution | None] = {}
        for info in infos:
            for path, rel in files_of(info):
                self.files.setdefault(path, info.installed)
                if not rel.startswith("../"):
                    self._claim(path, rel.count("/"), info.installed)

    def _claim(self, path: str, depth: int, owner: InstalledDistribution) -> None:
        folder = path
        for _ in range(depth):  # the folders between the file and its import root
            folder = os.path.dirname(folder)
            if folder not in self.folders:
                self.folders[folder] = owner
                continue
            held = self.folders[folder]
            if held is None or held == owner:
                return  # its parents were marked with it
            self.folders[folder] = None  # shared from here up

    def owner_of(self, path: str) -> InstalledDistribution | None:
        """The distribution that installed ``path`` (or the folder holding it), or ``None``."""
        for candidate in dict.fromkeys((os.path.normpath(os.path.abspath(path)),
                                        os.path.realpath(path))):
            found = self.files.get(candidate)
            if found is not None:
                return found
            folder = os.path.dirname(candidate)
            while folder and folder != os.path.dirname(folder):
                if folder in self.folders:
                    held = self.folders[folder]
                    if held is not None:
                        return held
                    break
                folder = os.path.dirname(folder)
        return None


@functools.lru_cache(maxsize=1)
def _owners(path: tuple[str, ...]) -> Owners:
    return Owners(distributions())


def owners() -> Owners:
    """The file index of the installed distributions, built once per process and ``sys.path``.

    ``owners.cache_clear()`` forgets it (after installing into this process' ``sys.path``).
    """
    return _owners(tuple(sys.path))


owners.cache_clear = _owners.cache_clear  # type: ignore[attr-defined]


def owner_of(path: str) -> InstalledDistribution | None:
    """Which installed distribution owns the file ``path`` (see :class:`Owners`)."""
    return owners().owner_of(path)
