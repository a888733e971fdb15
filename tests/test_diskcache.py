"""The on-disk cache: where it lives, the switch, atomic writes, and every bad entry ignored."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from opregistry import ConfigError
from opregistry.config import Settings
from opregistry.diskcache import DiskCache, cache_root


def _cache(tmp_path: Path, stamp: str = "v1") -> DiskCache:
    return DiskCache.open("things", stamp=stamp, environ={"OPREGISTRY_CACHE_DIR": str(tmp_path)})


@pytest.mark.parametrize("platform,environ,expected", [
    ("linux", {"HOME": "/home/u"}, "/home/u/.cache/opregistry"),
    ("linux", {"HOME": "/home/u", "XDG_CACHE_HOME": "/xdg"}, "/xdg/opregistry"),
    ("linux", {"HOME": "/home/u", "XDG_CACHE_HOME": "relative"}, "/home/u/.cache/opregistry"),
    ("darwin", {"HOME": "/Users/u"}, "/Users/u/Library/Caches/opregistry"),
    ("win32", {"HOME": "C:/Users/u", "LOCALAPPDATA": "C:/Users/u/AppData/Local"},
     os.path.join("C:/Users/u/AppData/Local", "opregistry", "Cache")),
    ("linux", {"HOME": "/home/u", "OPREGISTRY_CACHE_DIR": "/elsewhere"}, "/elsewhere"),
    ("linux", {"HOME": "/home/u", "OPREGISTRY_CACHE": "0"}, None),
    ("darwin", {"HOME": "/Users/u", "OPREGISTRY_CACHE": "off",
                "OPREGISTRY_CACHE_DIR": "/elsewhere"}, None),
])
def test_where_the_cache_lives(platform: str, environ: dict[str, str],
                               expected: str | None) -> None:
    """The platform's cache directory, OPREGISTRY_CACHE_DIR over it, OPREGISTRY_CACHE=0 off."""
    assert cache_root(environ, platform) == expected


def test_a_switch_that_is_not_a_boolean() -> None:
    with pytest.raises(ConfigError, match="OPREGISTRY_CACHE='maybe' is not a boolean"):
        cache_root({"OPREGISTRY_CACHE": "maybe"})
    with pytest.raises(ConfigError, match="OPREGISTRY_CACHE"):
        Settings.from_env({"OPREGISTRY_CACHE": "maybe"})
    # both variables are known: no "opregistry reads no such variable" warning
    settings = Settings.from_env({"OPREGISTRY_CACHE": "1", "OPREGISTRY_CACHE_DIR": "/x"})
    assert settings.unknown_variables == ()


def test_round_trip_and_keys(tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    assert cache.load("a") is None
    assert cache.store("a", {"x": [1, 2]}) and cache.store("b", "text")
    assert cache.load("a") == {"x": [1, 2]} and cache.load("b") == "text"
    assert cache.store("a", {"x": 3}) and cache.load("a") == {"x": 3}
    assert not [p for p in (tmp_path / "things").iterdir() if p.name.startswith(".tmp-")]
    assert cache.clear() == 2 and cache.load("a") is None


def _broken(tmp_path: Path, how: str) -> DiskCache:
    cache = _cache(tmp_path)
    cache.store("k", {"value": 1})
    path = Path(cache.path("k") or "")
    if how == "truncated":
        path.write_bytes(path.read_bytes()[:-7])
    elif how == "not json":
        path.write_bytes(b"\x00\xff garbage")
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "other version":
        return _cache(tmp_path, stamp="v2")
    elif how == "other key":  # a hash collision: the file names another key
        path.write_text(json.dumps({"stamp": "v1", "key": "not-k", "value": 2}))
    elif how == "not a dict":
        path.write_text("[1, 2, 3]")
    elif how == "unreadable":  # a directory where the file should be: open() fails even as root
        path.unlink()
        path.mkdir()
    return cache


def test_prune_and_clear_remove_the_cache_files_alone(tmp_path: Path) -> None:
    """OPREGISTRY_CACHE_DIR may name a folder of the user's own: their files survive."""
    cache = _cache(tmp_path)
    folder = tmp_path / "things"
    folder.mkdir()
    theirs = ["notes.json", "data.JSON", "results-2026.json", "a" * 40 + ".txt", ".tmp-x.json"]
    for name in theirs:
        (folder / name).write_text("{}")
    for when, key in enumerate("abc"):
        assert cache.store(key, key)
        os.utime(cache.path(key), ns=(when * 10**9, when * 10**9))  # c is the newest
    (folder / ".tmp-abcd_123.json").write_text("{")  # left by an interrupted write
    assert cache.prune(1) == 2 and cache.load("c") == "c"
    assert cache.clear() == 2
    assert sorted(p.name for p in folder.iterdir() if not p.name.endswith(".lock")) == \
        sorted(theirs)


@pytest.mark.parametrize("how", ["truncated", "not json", "empty", "other version", "other key",
                                 "not a dict", "unreadable"])
def test_a_bad_entry_is_ignored(tmp_path: Path, how: str) -> None:
    """Never an error: the entry reads as missing, with a debug log saying why."""
    cache = _broken(tmp_path, how)
    with capture_logs() as logs:
        assert cache.load("k") is None
    assert logs and logs[0]["log_level"] == "debug" and "ignored" in logs[0]["event"]
    if how != "unreadable":
        assert cache.store("k", {"value": 3}) and cache.load("k") == {"value": 3}


def test_sections_are_parsed_when_first_read(tmp_path: Path) -> None:
    """A value's sections come back as the value's parts, each parsed on first access."""
    cache = _cache(tmp_path)
    assert cache.store("k", {"small": 1}, {"big": {"rows": [[1, "a\nb"]] * 3}, "other": [2]})
    entry = cache.load("k")
    assert entry == {"small": 1} and entry.sections == {"big", "other"}
    assert entry["big"] == {"rows": [[1, "a\nb"]] * 3} and entry["other"] == [2]
    assert "big" in entry and "nothing" not in entry
    with pytest.raises(KeyError):
        entry["nothing"]
    assert cache.store("k", {"small": 2}) and cache.load("k") == {"small": 2}


def test_a_bytes_section_is_kept_as_it_is_and_read_whole(tmp_path: Path) -> None:
    """A part given as bytes is written unchanged and read back unparsed (``Entry.raw``),
    still checked by its CRC; once parsed, its bytes are let go."""
    cache = _cache(tmp_path)
    text = b'{"a": [1, 2],\n "b": "\\u00e9"}\n'
    assert cache.store("k", {"n": 1}, {"text": text, "other": [3]})
    entry = cache.load("k")
    assert entry.raw("text") == text and entry.raw("nothing") is None
    assert entry["text"] == {"a": [1, 2], "b": "\u00e9"} and entry.raw("text") is None
    path = Path(cache.path("k") or "")
    data = path.read_bytes()
    path.write_bytes(data.replace(b'"a": [1, 2]', b'"a": [1, 3]'))  # same length: the CRC sees it
    assert cache.load("k") is None


def test_restamp_changes_the_header_and_keeps_the_sections(tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    cache.store("k", {"small": 1, "other": "x"}, {"big": [1, 2, 3]})
    found = cache.read("k")
    assert found is not None
    assert cache.restamp("k", found[1], small=2)
    entry = cache.load("k")
    assert entry == {"small": 2, "other": "x"} and entry["big"] == [1, 2, 3]
    cache.store("plain", {"a": 1})
    found = cache.read("plain")
    assert found is not None and cache.restamp("plain", found[1], a=3)
    assert cache.load("plain") == {"a": 3}
    assert not cache.restamp("k", b"not json", small=3) and cache.load("k")["small"] == 2


@pytest.mark.parametrize("how", ["truncated", "a byte changed", "longer", "no sections"])
def test_a_bad_section_makes_the_entry_ignored(tmp_path: Path, how: str) -> None:
    """What a truncated or damaged file of sections reads as: no entry, with a debug log."""
    cache = _cache(tmp_path)
    cache.store("k", {"small": 1}, {"big": list(range(100)), "last": "x" * 50})
    path = Path(cache.path("k") or "")
    data = path.read_bytes()
    if how == "truncated":
        data = data[:-7]
    elif how == "a byte changed":  # still JSON: only the CRC sees it
        at = data.index(b",97,")
        data = data[:at] + b",96," + data[at + 4:]
    elif how == "longer":
        data += b"[]"
    else:
        data = data[:data.index(b"\n") + 1]
    path.write_bytes(data)
    with capture_logs() as logs:
        assert cache.load("k") is None
    assert logs and logs[0]["log_level"] == "debug" and "ignored" in logs[0]["event"]


def _read_only_folder(tmp_path: Path) -> Path:
    """A folder nobody can create files in: ``/proc`` for root (who ignores permissions)."""
    if os.geteuid() == 0:
        return Path(f"/proc/{os.getpid()}/opregistry-cache")
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    return folder


def test_read_only_or_missing_directory_means_no_cache(tmp_path: Path) -> None:
    for folder in (_read_only_folder(tmp_path), tmp_path / "a-file" / "below"):
        (tmp_path / "a-file").touch()
        cache = DiskCache.open("things", stamp="v1", environ={"OPREGISTRY_CACHE_DIR": str(folder)})
        with capture_logs() as logs:
            assert cache.store("k", 1) is False
        assert cache.load("k") is None and cache.clear() == 0
        assert logs[0]["event"] == "cache entry not written"


def test_off_means_nothing_written(tmp_path: Path) -> None:
    cache = DiskCache.open("things", stamp="v1", environ={"OPREGISTRY_CACHE": "0",
                                                          "OPREGISTRY_CACHE_DIR": str(tmp_path)})
    assert not cache.enabled and cache.store("k", 1) is False and cache.load("k") is None
    assert list(tmp_path.iterdir()) == []


WRITER = """
import sys
from opregistry.diskcache import DiskCache
cache = DiskCache.open("things", stamp="v1", environ={"OPREGISTRY_CACHE_DIR": sys.argv[1]})
me = int(sys.argv[2])
payload = {"blob": "x" * 20000}
seen_bad = 0
for round in range(40):
    for key in range(10):
        cache.store(f"key{key}", {"key": key, **payload})
        found = cache.load(f"key{(key + me) % 10}")
        if found is not None and (found["key"] != (key + me) % 10 or found["blob"] != payload["blob"]):
            seen_bad += 1
print(seen_bad)
"""


def test_concurrent_writers_never_corrupt(tmp_path: Path) -> None:
    """Eight processes write and read the same ten entries at once: every read is whole."""
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), str(i)],
                              stdout=subprocess.PIPE, text=True) for i in range(8)]
    results = [p.communicate(timeout=300)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0] * 8
    assert results == ["0"] * 8
    cache = _cache(tmp_path)
    assert all(cache.load(f"key{k}")["key"] == k for k in range(10))  # type: ignore[index]
    assert sorted(p.name for p in (tmp_path / "things").iterdir() if p.name.startswith(".tmp-")) == []
