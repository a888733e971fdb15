"""Distributions that register with torch by themselves, written as pip installs them.

:func:`write` makes a ``*.dist-info`` with ``METADATA`` (``Requires-Dist``),
``RECORD`` (every file with its sha256, as pip writes it: what the lock
records and the locked mode re-hashes), ``top_level.txt`` and, for a package
that declares its own adoption, ``entry_points.txt``.  The folder is put on
``sys.path`` by the caller: importlib-metadata and the scan then find it as
any installed distribution.
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import textwrap
from pathlib import Path


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def write(site: Path, name: str, files: dict[str, str | bytes], *, version: str = "1.0",
          requires: tuple[str, ...] = ("torch",), entry_points: str = "") -> str:
    """Install distribution ``name`` (files: relative path -> source, or the bytes of a
    binary file such as a shared library) into ``site``."""
    info = f"{name.replace('-', '_')}-{version}.dist-info"
    written: dict[str, bytes] = {}
    for rel, source in files.items():
        data = source if isinstance(source, bytes) else \
            textwrap.dedent(source).lstrip("\n").encode()
        path = site / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        written[rel] = data
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    meta += [f"Requires-Dist: {r}" for r in requires]
    written[f"{info}/METADATA"] = ("\n".join(meta) + "\n").encode()
    tops = sorted({rel.split("/")[0].removesuffix(".py") for rel in files})
    written[f"{info}/top_level.txt"] = ("\n".join(tops) + "\n").encode()
    if entry_points:
        written[f"{info}/entry_points.txt"] = textwrap.dedent(entry_points).lstrip().encode()
    for rel, data in written.items():
        if rel.startswith(info):
            (site / rel).parent.mkdir(parents=True, exist_ok=True)
            (site / rel).write_bytes(data)
    lines = [f"{rel},{_record_hash(data)},{len(data)}" for rel, data in sorted(written.items())]
    (site / info / "RECORD").write_text("\n".join(lines + [f"{info}/RECORD,,"]) + "\n")
    importlib.invalidate_caches()
    return name
