"""A small on-disk cache of JSON entries: one file per key, atomic writes, never an error.

Used by the scan of foreign distributions (:mod:`opregistry.scan`) and meant
for any other result opregistry can reuse between processes.  A cache is
named (``DiskCache.open("foreign-scan", stamp=...)``) and lives in its own
folder of the cache directory:

* ``OPREGISTRY_CACHE_DIR`` when set;
* else the platform's convention: ``$XDG_CACHE_HOME/opregistry`` (default
  ``~/.cache/opregistry``) on Linux and other Unixes,
  ``~/Library/Caches/opregistry`` on macOS, ``%LOCALAPPDATA%\\opregistry\\Cache``
  on Windows.

``OPREGISTRY_CACHE=0`` (any of config's false spellings) turns every cache
off.  An entry is a JSON document holding its key and the cache's ``stamp``
(the caller's version: opregistry's version and a format number); a reader
ignores -- with a debug log, never an error -- an entry that is truncated,
not JSON, of another stamp, of another key (a hash collision), or
unreadable.  A writer writes a temporary file in the same folder and
renames it over the entry (``os.replace``, atomic on POSIX and Windows), so
that a reader sees the old entry or the new one, never half of one, and
processes writing the same entry at once each leave a whole file.  A
missing or read-only directory means no cache: :meth:`DiskCache.store`
returns ``False``, nothing raises.  JSON, not pickle: an entry is data, and
loading one never runs code.

An entry may keep parts of its value as *sections*, parsed only when first
read (:class:`Entry`): the plan cache's declarations and plan are megabytes
of JSON a warm ``import torch`` does not need.  Such a file is the JSON
header (stamp, key, the value's other parts, and each section's name,
length and CRC-32), a newline, then the sections' JSON one after another;
a file whose sections are not all there, or do not match their CRC, is
ignored as a truncated one is.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import sys
import time
import zlib
from typing import Any, Iterator, Mapping

from .logs import get_logger
from .variables import parse_flag

__all__ = ["CACHE_VAR", "CACHE_DIR_VAR", "DiskCache", "Entry", "cache_root"]

#: ``OPREGISTRY_CACHE=0`` turns every on-disk cache off
CACHE_VAR = "OPREGISTRY_CACHE"
#: where the caches live, instead of the platform's cache directory
CACHE_DIR_VAR = "OPREGISTRY_CACHE_DIR"

log = get_logger()

#: the files a cache writes in its folder: entries (:meth:`DiskCache.path`) and the temporary
#: files of writes (``tempfile.mkstemp``); :meth:`DiskCache.prune` and
#: :meth:`DiskCache.clear` remove these and nothing else -- ``OPREGISTRY_CACHE_DIR`` may
#: name a folder that holds the user's own files
_DIGEST = 40  # hex digits of the key's sha256 that name its entry
_ENTRY = re.compile(rf"[0-9a-f]{{{_DIGEST}}}\.json")
_TEMPORARY = re.compile(r"\.tmp-[A-Za-z0-9_]{8}\.json")


def cache_root(environ: Mapping[str, str] | None = None, platform: str | None = None
               ) -> str | None:
    """The cache directory, or ``None`` when caching is off or no home directory is known.

    :raises ConfigError: ``OPREGISTRY_CACHE`` is set to something not a boolean.
    """
    env = os.environ if environ is None else environ
    if not parse_flag(env.get(CACHE_VAR), True, CACHE_VAR):
        return None
    explicit = (env.get(CACHE_DIR_VAR) or "").strip()
    if explicit:
        return os.path.abspath(os.path.expanduser(explicit))
    platform = sys.platform if platform is None else platform
    home = env.get("HOME") or os.path.expanduser("~")
    if platform == "win32":
        base = env.get("LOCALAPPDATA") or os.path.join(home, "AppData", "Local")
        return os.path.join(base, "opregistry", "Cache")
    if platform == "darwin":
        return os.path.join(home, "Library", "Caches", "opregistry")
    xdg = (env.get("XDG_CACHE_HOME") or "").strip()
    if xdg and os.path.isabs(xdg):  # the XDG spec: a relative path is to be ignored
        return os.path.join(xdg, "opregistry")
    if not home or home == "~":
        return None
    return os.path.join(home, ".cache", "opregistry")


class Entry(dict):  # type: ignore[type-arg]
    """An entry's value whose sections are parsed from JSON when first read (``entry[name]``).

    ``in``, ``get`` and iteration see the sections already read and the
    header's parts; :attr:`sections` names all of them.
    """

    __slots__ = ("_raw", "sections")

    def __init__(self, value: Mapping[str, Any], raw: dict[str, bytes]) -> None:
        super().__init__(value)
        self._raw = raw
        self.sections = frozenset(raw)

    def raw(self, name: str) -> bytes | None:
        """Section ``name``'s bytes as they were stored (checked, not parsed); ``None`` when
        there is no such section or it was parsed already."""
        return self._raw.get(name)

    def __missing__(self, name: str) -> Any:
        raw = self._raw.get(name)
        if raw is None:
            raise KeyError(name)
        value = self[name] = json.loads(raw)
        self._raw.pop(name, None)
        return value


def _sections(data: bytes, header: Any, path: str) -> dict[str, bytes] | None:
    """The sections after ``header`` (``data``: what follows its newline), checked; ``None``
    when they are not what the header says (truncated, or bytes changed)."""
    found, at = {}, 0
    try:
        for name, length, crc in header:
            raw = data[at:at + length]
            at += length
            if len(raw) != length or zlib.crc32(raw) != crc:
                break
            found[name] = raw
        else:
            if at == len(data):
                return found
    except (TypeError, ValueError):
        pass
    log.debug("cache entry's sections corrupt, ignored", path=path)
    return None


class DiskCache:
    """One named cache: ``folder`` is ``None`` when caching is off.

    A handle, not a record: a plain class, so that reading an entry at
    ``import torch`` (:mod:`opregistry.idle`) builds no attrs class.
    """

    __slots__ = ("folder", "stamp")

    def __init__(self, folder: str | None, stamp: str) -> None:
        self.folder = folder
        self.stamp = stamp

    def __repr__(self) -> str:
        return f"DiskCache(folder={self.folder!r}, stamp={self.stamp!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DiskCache) and (self.folder, self.stamp) == (other.folder,
                                                                              other.stamp)

    def __hash__(self) -> int:
        return hash((self.folder, self.stamp))

    @classmethod
    def open(cls, name: str, *, stamp: str, environ: Mapping[str, str] | None = None,
             ) -> DiskCache:
        """The cache ``name`` (a folder of the cache directory) for entries of ``stamp``."""
        root = cache_root(environ)
        return cls(None if root is None else os.path.join(root, name), stamp)

    @property
    def enabled(self) -> bool:
        return self.folder is not None

    def path(self, key: str) -> str | None:
        """The file that holds ``key``'s entry (``None`` when caching is off)."""
        if self.folder is None:
            return None
        digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:_DIGEST]
        return os.path.join(self.folder, digest + ".json")

    def load(self, key: str) -> Any | None:
        """The value stored under ``key``, or ``None`` (no entry, or one to ignore)."""
        found = self.read(key)
        return None if found is None else found[0]

    def read(self, key: str) -> tuple[Any, bytes] | None:
        """The value stored under ``key`` and the bytes it was read from, or ``None``."""
        path = self.path(key)
        if path is None:
            return None
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.debug("cache entry unreadable, ignored", path=path, error=str(exc))
            return None
        entry = self.parse(data, key, path)
        return None if entry is None else (entry, data)

    def parse(self, data: bytes, key: str, path: str = "") -> Any | None:
        """The value of an entry's bytes (read from ``path``), when they are ``key``'s entry:
        an :class:`Entry` when it was stored with sections."""
        end = data.find(b"\n")
        try:
            entry = json.loads(data if end < 0 else data[:end])
        except ValueError as exc:  # truncated, or not JSON at all
            log.debug("cache entry corrupt, ignored", path=path, error=str(exc))
            return None
        if not isinstance(entry, dict) or entry.get("stamp") != self.stamp:
            log.debug("cache entry of another version, ignored", path=path,
                      stamp=entry.get("stamp") if isinstance(entry, dict) else None)
            return None
        if entry.get("key") != key:
            log.debug("cache entry of another key, ignored", path=path)
            return None
        value = entry.get("value")
        if end < 0 and "sections" not in entry:
            return value
        raw = _sections(data[end + 1:] if end >= 0 else b"", entry.get("sections"), path)
        if raw is None or not isinstance(value, dict):
            return None
        return Entry(value, raw)

    def restamp(self, key: str, data: bytes, **changes: Any) -> bool:
        """Write again the entry ``data`` (what :meth:`read` read of ``key``) with ``changes``
        to its value's header parts; its sections are kept as they are, not encoded again."""
        path = self.path(key)
        end = data.find(b"\n")
        try:
            header = json.loads(data if end < 0 else data[:end])
            header["value"].update(changes)
        except (ValueError, TypeError, AttributeError, KeyError):
            return False
        body = _dumps(header) + (data[end:] if end >= 0 else b"")
        return path is not None and _write(path, body)

    def store(self, key: str, value: Any, sections: Mapping[str, Any] | None = None) -> bool:
        """Write ``value`` (JSON data) under ``key``; ``False`` when it could not be written.

        ``sections``: more parts of ``value`` (a dict), each written as its own
        JSON document after the header and parsed only when read (:class:`Entry`);
        a part given as ``bytes`` is written as it is, for a reader that takes
        it whole (:meth:`Entry.raw`).
        """
        path = self.path(key)
        if path is None:
            return False
        header: dict[str, Any] = {"stamp": self.stamp, "key": key, "value": value}
        blobs = [(name, part if isinstance(part, bytes) else _dumps(part))
                 for name, part in (sections or {}).items()]
        if blobs:
            header["sections"] = [[name, len(b), zlib.crc32(b)] for name, b in blobs]
        body = b"\n".join([_dumps(header), b"".join(b for _, b in blobs)]) if blobs \
            else _dumps(header)
        return _write(path, body)

    def discard(self, key: str) -> None:
        """Remove ``key``'s entry, if there is one (never an error)."""
        path = self.path(key)
        if path is not None:
            with contextlib.suppress(OSError):
                os.unlink(path)

    @contextlib.contextmanager
    def lock(self, key: str, timeout: float) -> Iterator[bool]:
        """Hold the lock of ``key``'s entry while the block runs; yields whether it is held.

        A ``.lock`` file beside the entry, locked with ``flock`` (``msvcrt`` on
        Windows): the operating system releases it when its holder exits,
        however it exits.  Waits up to ``timeout`` seconds for another
        process's lock; then, or where no lock file can be made (caching off,
        a read-only folder), yields ``False`` and the caller goes on without.
        """
        path = self.path(key)
        fd = None
        if path is not None:
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                fd = os.open(path[:-len(".json")] + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                log.debug("cache lock not made", path=path, error=str(exc))
        held = fd is not None and _acquire(fd, timeout)
        try:
            yield held
        finally:
            if fd is not None:
                if held:
                    _release(fd)
                os.close(fd)

    def prune(self, keep: int) -> int:
        """Remove all but the ``keep`` most recently written entries; how many were removed."""
        if self.folder is None:
            return 0
        found = []
        try:
            with os.scandir(self.folder) as listing:
                for e in listing:
                    if _ENTRY.fullmatch(e.name):
                        with contextlib.suppress(OSError):
                            found.append((e.stat().st_mtime_ns, e.path))
        except OSError:
            return 0
        removed = 0
        for _, path in sorted(found, reverse=True)[keep:]:
            with contextlib.suppress(OSError):
                os.unlink(path)
                removed += 1
        return removed

    def clear(self, failed: list[str] | None = None) -> int:
        """Remove every entry of this cache (and what interrupted writes left); how many.

        ``failed`` gets a line for each entry that could not be removed (a read-only folder)
        and for a folder that cannot be listed (not a folder, no permission); a folder that
        does not exist holds nothing to remove.
        """
        if self.folder is None:
            return 0
        removed = 0
        try:
            names = os.listdir(self.folder)
        except FileNotFoundError:
            return 0
        except OSError as exc:
            if failed is not None:
                failed.append(f"{self.folder}: {exc.strerror or exc}")
            return 0
        for name in names:
            if _ENTRY.fullmatch(name) or _TEMPORARY.fullmatch(name):
                try:
                    os.unlink(os.path.join(self.folder, name))
                    removed += 1
                except OSError as exc:
                    if failed is not None:
                        failed.append(f"{os.path.join(self.folder, name)}: {exc.strerror or exc}")
        return removed


def _write(path: str, body: bytes) -> bool:
    """Write ``body`` to ``path`` atomically (a temporary file renamed over it); never raises."""
    folder = os.path.dirname(path)
    tmp = None
    try:
        os.makedirs(folder, exist_ok=True)
        import tempfile  # here: with shutil and random, ~7 ms a reading command never needs

        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=folder)
        with os.fdopen(fd, "wb") as f:
            f.write(body)
        os.replace(tmp, path)
        return True
    except OSError as exc:  # read-only, full, or gone: no cache, no error
        log.debug("cache entry not written", path=path, error=str(exc))
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        return False


def _dumps(value: Any) -> bytes:
    # one line: JSON's own output has no newline but the escaped ones; data, never a cycle
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False,
                      check_circular=False).encode("utf-8")


def _try_lock(fd: int) -> bool:
    try:
        if sys.platform == "win32":
            import msvcrt

            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        else:
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False


def _acquire(fd: int, timeout: float) -> bool:
    """Lock ``fd``, polling until ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    pause = 0.005
    while not _try_lock(fd):
        if time.monotonic() >= deadline:
            log.debug("cache lock not acquired in time", timeout=timeout)
            return False
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
    return True


def _release(fd: int) -> None:
    try:
        if sys.platform == "win32":
            import msvcrt

            os.lseek(fd, 0, os.SEEK_SET)
            msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
        else:
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_UN)
    except OSError:
        pass

