"""A small ELF reader: section headers, symbol names, section contents. Pure Python, no dependency.

Enough of the ELF format (32- and 64-bit, either byte order) to list the
names in ``.symtab`` and ``.dynsym`` and to read a section's bytes, without
reading the whole file: the file is memory-mapped, so a 100 MB CUDA library
costs the pages of its headers, symbol tables and ``.rodata`` only.  A file
that is not ELF, or whose headers are inconsistent, gives ``None`` -- never
an exception.
"""

from __future__ import annotations

import mmap
import struct
from typing import Iterator

from attrs import frozen

from ..regular import open_regular

__all__ = ["Section", "Symbol", "ElfFile", "open_elf"]

SHT_SYMTAB = 2
SHT_DYNSYM = 11
_SHN_XINDEX = 0xFFFF


@frozen
class Section:
    name: str
    type: int
    offset: int
    size: int
    link: int
    entsize: int


@frozen
class Symbol:
    name: str
    #: defined in this file (``False``: imported from another library)
    defined: bool
    #: from ``.dynsym`` (exported or imported) rather than ``.symtab``
    dynamic: bool


class ElfFile:
    """An open ELF file: :attr:`sections`, :meth:`symbols`, :meth:`data`; close it after use."""

    def __init__(self, data: mmap.mmap | bytes) -> None:
        self._data = data
        ident = data[:16]
        self.bits = 64 if ident[4] == 2 else 32
        self.endian = "<" if ident[5] == 1 else ">"
        self.sections = self._sections()

    def close(self) -> None:
        if isinstance(self._data, mmap.mmap):
            self._data.close()

    def __enter__(self) -> ElfFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _unpack(self, fmt: str, offset: int) -> tuple[int, ...]:
        return struct.unpack_from(self.endian + fmt, self._data, offset)

    def _sections(self) -> list[Section]:
        if self.bits == 64:
            shoff, = self._unpack("Q", 0x28)
            shentsize, shnum, shstrndx = self._unpack("HHH", 0x3A)
            fmt = "IIQQQQIIQQ"
        else:
            shoff, = self._unpack("I", 0x20)
            shentsize, shnum, shstrndx = self._unpack("HHH", 0x2E)
            fmt = "IIIIIIIIII"
        if not shoff or shentsize < struct.calcsize(fmt):
            return []
        raw = []
        first = self._unpack(fmt, shoff)
        if shnum == 0:  # more sections than fit the header: the count is in section 0
            shnum = first[5]
        if shstrndx == _SHN_XINDEX:
            shstrndx = first[6]
        if shoff + shnum * shentsize > len(self._data) or shstrndx >= shnum:
            return []
        for i in range(shnum):
            name, typ, _, _, offset, size, link, _, _, entsize = self._unpack(
                fmt, shoff + i * shentsize)
            raw.append((name, typ, offset, size, link, entsize))
        names = raw[shstrndx]
        return [Section(self._string(names[2], names[3], n), typ, off, size, link, ent)
                for n, typ, off, size, link, ent in raw]

    def _string(self, table: int, size: int, offset: int) -> str:
        if offset >= size:
            return ""
        start = table + offset
        end = self._data.find(b"\0", start, table + size)
        if end < 0:
            end = table + size
        return self._data[start:end].decode("utf-8", "replace")

    def data(self, section: Section) -> bytes:
        """The bytes of ``section`` (empty for a section with no data in the file)."""
        if section.type == 8:  # SHT_NOBITS (.bss)
            return b""
        return bytes(self._data[section.offset: section.offset + section.size])

    def symbol_names(self, dynamic: bool) -> bytes:
        """The string table of ``.dynsym`` (``dynamic``) or ``.symtab``: symbol names, NUL-separated.

        Searching these with a regular expression is how a caller finds names
        in a large library without building one object per symbol; the
        dynamic table alone is small even where ``.symtab`` is not.
        """
        wanted = SHT_DYNSYM if dynamic else SHT_SYMTAB
        return b"".join(self.data(self.sections[s.link]) for s in self.sections
                        if s.type == wanted and s.link < len(self.sections))

    def symbols(self) -> Iterator[Symbol]:
        """Every named symbol of ``.symtab`` and ``.dynsym``."""
        fmt, size = ("IBBHQQ", 24) if self.bits == 64 else ("IIIBBH", 16)
        for section in self.sections:
            if section.type not in (SHT_SYMTAB, SHT_DYNSYM) or section.link >= len(self.sections):
                continue
            strtab = self.sections[section.link]
            step = section.entsize or size
            end = min(section.offset + section.size, len(self._data))
            for offset in range(section.offset + step, end - size + 1, step):  # entry 0 is null
                fields = self._unpack(fmt, offset)
                name, shndx = fields[0], fields[3] if self.bits == 64 else fields[5]
                if name:
                    yield Symbol(self._string(strtab.offset, strtab.size, name), shndx != 0,
                                 section.type == SHT_DYNSYM)


def open_elf(path: str) -> ElfFile | None:
    """The ELF file at ``path``, or ``None`` (not ELF, unreadable, or malformed)."""
    try:
        with open_regular(path) as f:
            if f.read(4) != b"\x7fELF":
                return None
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        return None
    try:
        if len(data) < 64 or data[4] not in (1, 2) or data[5] not in (1, 2):
            data.close()
            return None
        return ElfFile(data)
    except (struct.error, IndexError, ValueError):
        data.close()
        return None
