"""What installed distributions that do not use opregistry register with torch, known without torch.

:func:`scan_installed` reads every installed distribution that uses torch
-- its metadata requires torch (or opregistry), or one of its Python files
mentions torch -- and returns a :class:`~opregistry.foreign.ForeignScan`:
per distribution, every ``Library``, op, kernel and C++ ``TORCH_LIBRARY``
block its files register, the module whose import registers each, and
``file:line``.  Nothing is imported: Python files are read by their syntax
trees (:mod:`opregistry.scan.pysource`), shared libraries by their symbol
tables (:mod:`opregistry.scan.native`).  torch itself (the owner of the
namespaces in :data:`opregistry.keys.RESERVED_NAMESPACES`) and opregistry's
core are not scanned; opregistry's plugins are, and are marked as such.

Which files: a distribution's ``RECORD``, or the files of its top-level
packages for an editable install (:func:`opregistry.distfiles.files_of`);
of those, the importable ``.py`` modules and the shared libraries.

The result is cached on disk (:mod:`opregistry.diskcache`, cache
``foreign-scan``, one entry per folder of distributions) per distribution,
keyed by its name, version and location and checked against a digest of
the files it read: their size
and modification time by default, their sha256 in locked mode
(``OPREGISTRY_LOCK``) or with ``content_digests=True``.  A changed file, a
reinstall or an upgrade means a new scan of that distribution only.  A
distribution found not to use torch is checked again only when its
``METADATA`` or ``RECORD`` changes (every install rewrites them; editable
installs and distributions without ``RECORD`` are always checked file by
file).  :func:`scan_installed` raises :class:`~opregistry.ConfigError` for
an ``OPREGISTRY_CACHE`` that is not a boolean, and nothing else: a
distribution whose scan fails carries the failure in
:attr:`~opregistry.foreign.ForeignDistribution.error`.
"""

from __future__ import annotations

import hashlib
import os
from typing import TYPE_CHECKING, Any, Iterable, Mapping

import attrs

from ..config import canonical_name
from ..diskcache import DiskCache
from ..distfiles import (NATIVE_SUFFIXES, DistInfo, distributions, files_of, is_editable,
                         module_name)
from ..errors import ConfigError
from ..foreign import SCAN_FORMAT, ForeignDistribution, ForeignScan, Registration
from ..logs import get_logger
from ..regular import open_regular, read_regular
from ..state import gc_paused
from ..variables import check_mode

if TYPE_CHECKING:
    from .pyvalues import ModuleSource

__all__ = ["scan_installed", "scan_distribution", "scan_inputs", "NOT_SCANNED", "PLUGIN_GROUPS",
           "CACHE_NAME"]

#: distributions never scanned: torch owns its namespaces, opregistry's core is the registry
NOT_SCANNED = frozenset({"torch", "opregistry"})
#: entry-point groups that make a distribution an opregistry plugin
PLUGIN_GROUPS = ("opregistry.backends", "opregistry.ops")
#: the name of the disk cache
CACHE_NAME = "foreign-scan"

log = get_logger()


def _is_native(rel: str) -> bool:
    """Whether a file (named by its path or its relative name: the same last part) is a
    shared library."""
    name = rel.rpartition("/")[2]
    return name.endswith(NATIVE_SUFFIXES) or ".so." in name


def _scanned_files(info: DistInfo, folders: list[str] | None = None) -> list[tuple[str, str]]:
    """``(path, relative name)`` of the Python files and shared libraries ``info`` installed;
    ``folders``: as :func:`~opregistry.distfiles.files_of`'s."""
    return [(path, rel) for path, rel in files_of(info, folders)
            if rel.endswith(".py") or (_is_native(rel) and not rel.startswith("../"))]


def _split(files: list[tuple[str, str]]) -> tuple[dict[str, str], dict[str, str]]:
    """``({module: .py path}, {shared library path: relative name})``; files that are no
    module are left out."""
    modules: dict[str, str] = {}
    natives: dict[str, str] = {}
    for path, rel in files:
        if rel.endswith(".py"):
            name = module_name(rel)
            if name is not None:
                modules.setdefault(name, path)
        else:
            natives[path] = rel
    return modules, dict(sorted(natives.items()))


def _namespace_packages(modules: Iterable[str]) -> tuple[str, ...]:
    """The folders of ``modules`` (dotted names) above every module of theirs that are no
    module of them: namespace packages (``optimum/`` without ``__init__.py``), or a
    package another distribution installs the ``__init__.py`` of -- either way, not what
    imports these modules.  A folder below a package is left out: the package is what is
    imported (:meth:`~opregistry.foreign.ForeignDistribution.import_root`)."""
    names = set(modules)
    found = set()
    for name in names:
        parts = name.split(".")
        for i in range(1, len(parts)):
            prefix = ".".join(parts[:i])
            if prefix in names:
                break
            found.add(prefix)
    return tuple(sorted(found))


def _digest(info: DistInfo, paths: Iterable[str], content: bool,
            known: Mapping[str, str] | None = None) -> str:
    """A digest of the files a scan reads: size and mtime of each, or its sha256.

    ``known``: ``{path: its stamp line}`` of files already stat-ed
    (:func:`_stat_line`), taken before or as they were read: those are not
    stat-ed again.
    """
    h = hashlib.sha256()
    meta = [os.path.join(info.installed.location, n) for n in ("METADATA", "RECORD")]
    for path in [*meta, *sorted(paths)]:
        h.update(path.encode("utf-8", "surrogateescape") + b"\0")
        if content:
            h.update(_sha256(path).encode())
            continue
        line = known.get(path) if known is not None else None
        h.update((line if line is not None else _stat_line(path)).encode())
    return ("sha256:" if content else "stat:") + h.hexdigest()


def _stat_line(path: str, st: os.stat_result | None = None) -> str:
    """A file's line in a stat digest: its size and mtime (``st``: its stat, when known)."""
    if st is None:
        try:
            st = os.stat(path)
        except OSError:
            return "missing\n"
    return f"{st.st_size} {st.st_mtime_ns}\n"


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    try:
        with open_regular(path) as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    except OSError:
        return "missing"
    return h.hexdigest()


def _read_texts(paths: Iterable[str]) -> tuple[dict[str, bytes], dict[str, str], set[str]]:
    """Each file's bytes (read once), its stamp line for a stat digest (from the open
    file, before its bytes are read: :func:`_stat_line`), and the files that name torch."""
    texts: dict[str, bytes] = {}
    stats: dict[str, str] = {}
    naming: set[str] = set()
    for path in paths:
        try:  # a FIFO or a device is refused: reading it would block or never end
            data, st = read_regular(path)
        except OSError:
            continue
        stats[path] = _stat_line(path, st)
        texts[path] = data
        if b"torch" in data:
            naming.add(path)
    return texts, stats, naming


def _loaders(found: list[Registration], sources: dict[str, ModuleSource],
             texts: Mapping[str, bytes], natives: Mapping[str, str]
             ) -> dict[str, tuple[str, str]]:
    """``{library path: (module, how it was found)}`` for each registering library."""
    from .native import is_extension_module
    from .pysource import importers

    by_path = {os.path.normpath(r.how): r for r in found
               if r.kind == "load_library" and r.how and not r.unresolved}
    computed = sorted((r for r in found if r.kind == "load_library" and r.unresolved),
                      key=lambda r: (r.module, r.line or 0))
    out = {}
    for path, rel in natives.items():
        load = by_path.get(os.path.normpath(path))
        rel_module = module_name(rel)  # pkg/_C.abi3.so -> pkg._C
        if load is not None:
            out[path] = (load.module, f"loaded by {load.api} at {load.source}")
        elif rel_module and is_extension_module(path):
            by = importers(sources, texts, rel_module)
            out[path] = ((by[0], f"imports the extension module {rel_module}")
                         if by else (rel_module, "a Python extension module"))
        elif computed:
            load, why = _computed_loader(path, computed, sources, texts)
            out[path] = (load.module, f"the {load.api} call at {load.source}, whose path is "
                                      f"computed, {why}")
        else:
            top = rel.split("/")[0]
            out[path] = (top if top.isidentifier() else "",
                         "the top-level package holding the library")
    return out


def _computed_loader(path: str, computed: list[Registration], sources: dict[str, ModuleSource],
                     texts: Mapping[str, bytes]) -> tuple[Registration, str]:
    """Which of the ``load_library`` calls with a computed path loads the library at ``path``,
    and why that one.

    The call whose module names the library's file (executorch 1.5:
    ``glob("**/*custom_ops_aot_lib.*")`` beside ``libcustom_ops_aot_lib.so``);
    else one in a module of the library's own folder or above it; a call made
    at import before one inside a function (``load_library(args.so_library)``
    in a command-line script).  Else the first in the distribution.
    """
    name = os.path.basename(path).split(".")[0]  # libfoo_ops.cpython-311-x86_64-linux-gnu.so
    stem = name.encode()[3:] if name.startswith("lib") else name.encode()
    folder = os.path.dirname(os.path.normpath(path))

    def rank(load: Registration) -> tuple[int, int, int]:
        module = sources.get(load.module)
        text = texts.get(module.file, b"") if module is not None else b""
        above = module is not None and folder.startswith(
            os.path.dirname(os.path.normpath(module.file)))
        return (0 if stem and stem in text else 1, 0 if above else 1, 0 if load.at_import else 1)

    best = min(computed, key=rank)  # min keeps the first of equal ranks
    named, above, _ = rank(best)
    if not named:
        return best, f"in a module that names the library's file ({stem.decode(errors='replace')})"
    if best is computed[0]:
        return best, "is the first in the distribution"
    return best, ("in a module of the library's folder" if not above
                  else "the first made at import")


def scan_distribution(info: DistInfo, files: list[tuple[str, str]] | None = None
                      ) -> tuple[ForeignDistribution, bool]:
    """Scan one distribution (no cache): its record, and whether it uses torch at all.

    ``files``: what :func:`_scanned_files` gives, when the caller has it.
    """
    record, uses, _ = _scan_files(info, _scanned_files(info) if files is None else files)
    return record, uses


def _scan_files(info: DistInfo, files: list[tuple[str, str]]
                ) -> tuple[ForeignDistribution, bool, dict[str, str]]:
    """:func:`scan_distribution`, and the stamp line of each file it read, taken before
    the file was read: what a stat digest of the scan is made of (:func:`_digest`'s
    ``known``; the files it did not read are stat-ed there)."""
    modules, natives = _split(files)
    requires = info.requires_any(("torch", "opregistry"))
    texts, stats, naming = _read_texts(modules.values())
    record = ForeignDistribution(
        distribution=info.installed, requires_torch=requires,
        plugin_groups=tuple(g for g in PLUGIN_GROUPS if g in info.groups),
        files=len(modules) + len(natives), namespace_packages=_namespace_packages(modules))
    if not (requires or naming):
        return record, False, stats
    # the parsers are imported here: a scan answered from the cache never needs them
    from .native import scan_library
    from .pysource import scan_modules
    from .pyvalues import ModuleSource

    sources = {name: ModuleSource(name, path, path.endswith("__init__.py"), texts.get(path))
               for name, path in modules.items()}
    found = scan_modules(sources, texts, naming)
    named = {r.namespace for r in found if r.namespace}  # what a stripped library may hold
    stats.update((path, _stat_line(path)) for path in natives)  # before they are read
    native = {path: regs for path in natives if (regs := scan_library(path, named))}
    loaders = _loaders(found, sources, texts, {p: natives[p] for p in native})
    for path, regs in sorted(native.items()):
        module, how = loaders[path]
        found += [attrs.evolve(reg, module=module, how=how) for reg in regs]
    return attrs.evolve(record, registrations=tuple(found)), True, stats


def _stamp(infos: list[DistInfo]) -> str:
    """The cache's version: opregistry's version, the scan format, and the scanner's own files."""
    version = next((i.installed.version for i in infos if i.installed.name == "opregistry"), "?")
    here = os.path.dirname(os.path.abspath(__file__))
    code = [os.path.join(here, n) for n in sorted(os.listdir(here)) if n.endswith(".py")]
    code += [os.path.join(os.path.dirname(here), n) for n in ("foreign.py", "distfiles.py")]
    h = hashlib.sha256()
    for path in code:
        try:
            st = os.stat(path)
            h.update(f"{path} {st.st_size} {st.st_mtime_ns}\n".encode())
        except OSError:
            pass
    return f"opregistry {version} scan-format {SCAN_FORMAT} code {h.hexdigest()[:16]}"


def _metadata_stamp(info: DistInfo) -> str | None:
    """Size and mtime of the files every install, upgrade or reinstall rewrites; ``None`` for
    an editable install or one without ``RECORD`` (its sources change without them)."""
    if is_editable(info):
        return None
    out = []
    for name in ("METADATA", "RECORD"):
        try:
            st = os.stat(os.path.join(info.installed.location, name))
        except OSError:
            return None
        out.append(f"{name} {st.st_size} {st.st_mtime_ns}")
    return "; ".join(out)


def _content_check(env: Mapping[str, Any]) -> bool:
    """Whether cached scans are checked by content: locked mode, or
    ``OPREGISTRY_CACHE_CHECK=content`` (a value not a mode counts as content: the
    stronger check; the settings report it)."""
    if (env.get("OPREGISTRY_LOCK") or "").strip():
        return True
    try:
        return check_mode(env) == "content"
    except ConfigError:
        return True


def _cached(entry: Any, info: DistInfo, content: bool) -> tuple[
        ForeignDistribution | None, bool, bool, dict[str, Any] | None, list[str]]:
    """``(record or None, uses torch, from the cache, entry to store or None, files to stamp)``
    of one distribution, given its cached ``entry`` (``None`` when there is none).  The
    files to stamp are those of its scan that a cache of it must stamp besides
    ``METADATA`` and ``RECORD`` (:func:`scan_inputs`): every file read of a
    registering distribution, or of one checked file by file; none of the others.

    A distribution found not to use torch is checked again only when its
    metadata changes (an install rewrites ``METADATA`` and ``RECORD``):
    listing and ``stat``-ing the files of numpy or sympy at every call would
    cost more than the rest of the scan.  A torch user's entry is checked
    against the digest of every file it read.
    """
    stamp = _metadata_stamp(info)
    if (isinstance(entry, dict) and entry.get("uses_torch") is False and stamp is not None
            and entry.get("metadata") == stamp and not content):
        return None, False, True, None, []
    walked: list[str] = []
    files = _scanned_files(info, walked)
    paths = [path for path, _ in files]
    cached = entry.get("digest") if isinstance(entry, dict) else None
    # made before the scan to compare with the cached one, or by content; else from the
    # files' stats taken as the scan reads them, and only when the entry needs it
    digest = _digest(info, paths, content) if content or cached else None

    def stamped(record: ForeignDistribution | None) -> list[str]:
        if stamp is None:  # its files are found by walking folders: a new one is a change
            return [*paths, *walked]
        registers = record is not None and bool(record.registrations or record.error)
        return paths if registers else []

    if cached is not None and cached == digest:
        try:
            dist = entry.get("dist")
            record = ForeignDistribution.from_dict(dist) if dist else None
            return record, bool(entry.get("uses_torch")), True, None, stamped(record)
        except (KeyError, TypeError, ValueError) as exc:
            log.debug("cached scan malformed, scanning again", distribution=info.installed.text,
                      error=str(exc))
    try:
        record, uses, known = _scan_files(info, files)
    except Exception as exc:  # noqa: BLE001 - one odd distribution never stops the scan
        log.warning("scan of a distribution failed", distribution=info.installed.text,
                    error=f"{type(exc).__name__}: {exc}")
        record = ForeignDistribution(distribution=info.installed, requires_torch=info.requires_any(
            ("torch", "opregistry")), error=f"the scan failed: {type(exc).__name__}: {exc}")
        return record, True, False, None, stamped(record)  # not cached: tried next time
    if digest is None and (uses or stamp is None):  # a non-user with a stamp needs none
        digest = _digest(info, paths, False, known)
    record = attrs.evolve(record, digest=digest or "")
    return (record if uses else None), uses, False, {
        "digest": digest, "uses_torch": uses, "metadata": stamp,
        "dist": record.to_dict() if uses else None}, stamped(record)


class _Folders:
    """The cache's entries, one file per folder of distributions (a ``site-packages``, a
    ``PYTHONPATH`` entry): read once, written once, and only when something changed.

    One file per distribution cost a file creation each on a cold start: with a
    thousand distributions, half of a cold scan on a slow disk (and a round trip
    each on a network home directory).
    """

    def __init__(self, cache: DiskCache) -> None:
        self.cache = cache
        self.read: dict[str, dict[str, Any]] = {}
        self.seen: dict[str, set[str]] = {}
        self.new: dict[str, dict[str, Any]] = {}

    def entry(self, folder: str, key: str) -> Any:
        if folder not in self.read:
            found = self.cache.load(f"distributions in {folder}")
            self.read[folder] = found if isinstance(found, dict) else {}
            self.seen[folder] = set()
        self.seen[folder].add(key)
        return self.read[folder].get(key)

    def put(self, folder: str, key: str, entry: dict[str, Any]) -> None:
        self.new.setdefault(folder, {})[key] = entry
        self.seen.setdefault(folder, set()).add(key)

    def write(self, whole: bool) -> None:
        """Store each folder whose entries changed; ``whole``: every distribution of the
        folders read was seen, so entries of distributions gone are dropped."""
        for folder in {*self.read, *self.new}:
            old = self.read.get(folder, {})
            merged = {**old, **self.new.get(folder, {})}
            if whole:
                merged = {k: v for k, v in merged.items() if k in self.seen[folder]}
            if merged != old:
                self.cache.store(f"distributions in {folder}", merged)


def scan_installed(*, only: Iterable[str] | None = None, cache: bool = True,
                   content_digests: bool | None = None,
                   environ: Mapping[str, str] | None = None) -> ForeignScan:
    """Every installed distribution that uses torch, and what it registers; torch is not imported.

    ``only``: scan these distributions (names as pip spells them) and count
    no other; ``cache=False`` scans every distribution again (and stores nothing);
    ``content_digests``: check cached scans against the sha256 of every file
    read, not their size and mtime (default: in locked mode, when
    ``OPREGISTRY_LOCK`` is set, or with ``OPREGISTRY_CACHE_CHECK=content``, as
    the plan cache does).  ``environ`` (default ``os.environ``) is where
    ``OPREGISTRY_CACHE`` / ``OPREGISTRY_CACHE_DIR`` / ``OPREGISTRY_LOCK`` /
    ``OPREGISTRY_CACHE_CHECK`` are read.
    """
    env: Mapping[str, Any] = os.environ if environ is None else environ
    content = _content_check(env) if content_digests is None else content_digests
    infos = distributions()
    wanted = None if only is None else {canonical_name(n) for n in only}
    store = _Folders(DiskCache.open(CACHE_NAME, stamp=_stamp(infos), environ=env) if cache
                     else DiskCache(None, ""))
    found, skipped, hits = [], 0, 0
    read: list[str] = []  # what a cache of this scan must stamp (scan_inputs)
    # the collector paused: parsing makes hundreds of thousands of syntax-tree objects, and
    # each collection traversed those of the trees in use (vllm 0.33's first scan: 7 s with
    # it, 3 s without); the scan leaves no cycles (pyvalues.Index.release), so nothing waits
    with gc_paused(promote=False):
        for info in infos:
            if wanted is not None and info.installed.name not in wanted:
                continue
            if info.installed.name in NOT_SCANNED or not info.installed.location:
                skipped += 1
                continue
            folder = os.path.dirname(info.installed.location)
            key = f"{info.installed.name}=={info.installed.version} {info.installed.location}"
            record, uses, hit, entry, paths = _cached(store.entry(folder, key), info, content)
            if entry is not None:
                store.put(folder, key, entry)
            read += [os.path.join(info.installed.location, n) for n in ("METADATA", "RECORD")]
            read += paths
            hits += hit
            if record is None or not uses:
                skipped += 1
                continue
            found.append(record)
    store.write(whole=wanted is None)
    found.sort(key=lambda d: d.name)
    return ForeignScan(distributions=tuple(found), skipped=skipped, cached=hits,
                       inputs=None if wanted is not None else tuple(read))


def scan_inputs(scan: ForeignScan) -> list[str]:
    """Every file :func:`scan_installed` read to make ``scan``: what a cache of it must stamp.

    Each installed distribution's ``METADATA`` and ``RECORD`` (a distribution
    is scanned again when they change: pip rewrites them on every install),
    and every file scanned of the editable installs and the distributions
    without a ``RECORD`` (whose sources change without them: a hand-made
    ``dist-info``, a legacy develop install) -- with the folders walked to find
    them, where a new module shows -- and of the distributions found
    registering with torch.  A
    distribution whose sources mention torch but register nothing (numpy,
    sympy: thousands of files) is stamped by its ``METADATA`` and ``RECORD``
    alone, not file by file at every start.  The scan itself records them
    (:attr:`~opregistry.foreign.ForeignScan.inputs`): they are listed again
    only for a scan rebuilt from data.
    """
    if scan.inputs is not None:
        return list(scan.inputs)
    users = {d.name for d in scan.distributions if d.registrations or d.error}
    found = []
    for info in distributions():
        location = info.installed.location
        if not location or info.installed.name in NOT_SCANNED:
            continue
        found += [os.path.join(location, n) for n in ("METADATA", "RECORD")]
        if _metadata_stamp(info) is None:
            walked: list[str] = []
            found += [path for path, _ in _scanned_files(info, walked)] + walked
        elif info.installed.name in users:
            found += [path for path, _ in _scanned_files(info)]
    return found
