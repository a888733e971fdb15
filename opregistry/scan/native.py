"""The registrations a shared library (.so, .pyd, .dylib) makes when it is loaded, from its symbols.

``TORCH_LIBRARY(ns, m)``, ``TORCH_LIBRARY_FRAGMENT(ns, m)`` and
``TORCH_LIBRARY_IMPL(ns, key, m)`` -- and the ``STABLE_`` forms of torch's
stable ABI -- each define a static initializer whose name spells the
macro's arguments: ``TORCH_LIBRARY_init_<ns>``,
``TORCH_LIBRARY_FRAGMENT_init_<ns>_<uid>``,
``TORCH_LIBRARY_IMPL_init_<ns>_<key>_<uid>`` (and ``..._static_init_...``
for the object that runs it).  These are local symbols: an ELF library
keeps them in ``.symtab`` unless it was stripped.  They are read with
:mod:`opregistry.scan.elf`; a library in another format (Mach-O, PE) is
searched for the same names byte by byte.

Op schemas are string literals (``m.def("name(Tensor x) -> Tensor")``):
read from ``.rodata``, and kept only for the namespaces the library DEFs or
FRAGMENTs (a schema elsewhere in the binary says nothing).  An op defined
without a schema string (``m.def("name", &fn)``) is not seen.  A library
whose symbols were stripped but that calls torch's ``Library`` (its
imported symbols say so) is reported with its namespaces ``unresolved``,
plus the qualified schemas its strings hold -- unless its strings hold, as a
whole string, a namespace the distribution's own Python code registers in
(``named``): ``TORCH_LIBRARY(fbgemm, m)`` passes ``"fbgemm"`` to torch, and
fbgemm-gpu's Python registers fake kernels for ``fbgemm::`` ops; that
namespace is the library's (kind ``library``, api
:data:`~opregistry.foreign.STRIPPED_API`: which macro is not known, and
another distribution's claim read from symbols or source wins).

A library that registers with torch's older API,
``c10::RegisterOperators().op("image::decode_png(Tensor data) -> Tensor")``
(torchvision's ``image`` library up to 0.28), has no macro block: every
schema string it passes is qualified, and each namespace they name is
recorded as a ``FRAGMENT`` of api :data:`LEGACY_API` (the API defines ops,
never a namespace whole), with its ops.
"""

from __future__ import annotations

import re
from typing import Iterable

from ..foreign import STRIPPED_API, Registration
from ..keys import RESERVED_NAMESPACES
from ..regular import open_regular
from .elf import open_elf

__all__ = ["scan_library", "is_extension_module"]

#: a macro's identifier, from ``TORCH_LIBRARY`` on (``STABLE_`` and a mangled name's length
#: digits come before it: ``rb"(\d*)((?:STABLE_)?TORCH_LIBRARY...)"`` as one pattern)
_MACRO_TAIL = re.compile(rb"TORCH_LIBRARY(?:_FRAGMENT|_IMPL)?_(?:static_)?init_\w+")
_PARTS = re.compile(r"(STABLE_)?TORCH_LIBRARY(_FRAGMENT|_IMPL)?_(?:static_)?init_(\w+)\Z")
_UID = re.compile(r"_\d+\Z")
#: imported symbols that mean "this library registers with torch's dispatcher"
_REGISTERS = (b"5torch7Library", b"TorchLibraryInit", b"aoti_torch_library_init_",
              b"torch_library_impl", b"TORCH_LIBRARY")
#: torch's older registration API (``c10::RegisterOperators().op("ns::name(...) -> ...")``,
#: torchvision's ``image`` library up to 0.28): no macro block, every schema qualified
_LEGACY = b"17RegisterOperators"
#: the ``api`` of a namespace read from the qualified schemas of a library that registers
#: with :data:`_LEGACY`
LEGACY_API = "c10::RegisterOperators"
_SCHEMA = re.compile(r"(?:([A-Za-z_]\w*)::)?([A-Za-z_]\w*)(?:\.([A-Za-z_]\w*))?(\(.*\)\s*->\s*.+)\Z")


def _registers(blob: bytes) -> bool:
    """Whether the names in ``blob`` include one of torch's registration API (``in``: fast;
    each of them holds "orch" or "ORCH", which most libraries' names never do: two reads
    of a large symbol table rather than five)."""
    return ((b"orch" in blob or b"ORCH" in blob) and any(word in blob for word in _REGISTERS)
            or _LEGACY in blob)


def _identifiers(blob: bytes) -> set[str]:
    """The macro identifiers in a blob of symbol names (mangled or not).

    Each is found from the literal ``TORCH_LIBRARY``, its ``STABLE_``, a
    wrapper macro's prefix and the length digits read backwards: one pattern
    that may start with digits is tried at every byte (1.3 s for vllm 0.33's
    libraries, 100 times this).  A wrapper macro that pastes a prefix on
    torch's identifier (IPEX's ``IPEX_TORCH_LIBRARY_FRAGMENT(torch_ipex, m)``
    defines ``IPEX_TORCH_LIBRARY_FRAGMENT_init_torch_ipex_2``) names the same
    block: the prefix is dropped, after the length read from the digits
    before it has said where the identifier ends.
    """
    out = set()
    for m in _MACRO_TAIL.finditer(blob):
        start = m.start()
        if blob[max(start - 7, 0):start] == b"STABLE_":
            start -= 7
        head = start
        while head > 0 and blob[head - 1] in _PREFIX_BYTES:  # a wrapper's prefix: IPEX_
            head -= 1
        first = head
        while first > 0 and 48 <= blob[first - 1] <= 57:  # the digits before it
            first -= 1
        digits, rest = blob[first:head], blob[head:m.end()]
        ident = rest
        while digits:  # a mangled name: the length prefix says where the identifier ends
            length = int(digits)
            if 0 < length <= len(rest):
                ident = rest[:length]
                break
            digits = digits[1:]
        out.add(ident[start - head:].decode("ascii", "replace"))
    return out


_PREFIX_BYTES = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")


def _blocks(identifiers: set[str]) -> set[tuple[str, str, str | None, str]]:
    """``(kind, namespace, key, macro)`` of each macro block the identifiers name."""
    out = set()
    for ident in identifiers:
        m = _PARTS.match(ident)
        if m is None:
            continue
        stable, variant, rest = m.group(1) or "", m.group(2) or "", m.group(3)
        macro = f"{stable}TORCH_LIBRARY{variant}"
        if not variant:
            out.add(("DEF", rest, None, macro))
            continue
        rest = _UID.sub("", rest)  # the C10_UID counter
        if variant == "_FRAGMENT":
            out.add(("FRAGMENT", rest, None, macro))
        elif "_" in rest:  # dispatch keys have no underscore; namespaces may
            ns, _, key = rest.rpartition("_")
            out.add(("IMPL", ns, key, macro))
    return out


def _read(path: str) -> tuple[set[str], bool, bytes, bool, bool]:
    """``(identifiers, registers with torch, strings to search for schemas, stripped,
    registers with the older API)``."""
    elf = open_elf(path)
    if elf is None:
        try:
            with open_regular(path) as f:
                data = f.read()
        except OSError:
            return set(), False, b"", False, False
        idents = _identifiers(data)
        return idents, bool(idents) or _registers(data), data, not idents, _LEGACY in data
    with elf:
        dynamic = elf.symbol_names(dynamic=True)
        if not _registers(dynamic):
            return set(), False, b"", False, False  # it imports nothing of torch's Library
        static = elf.symbol_names(dynamic=False)
        idents = _identifiers(static) | _identifiers(dynamic)
        rodata = b"".join(elf.data(s) for s in elf.sections if s.name.startswith(".rodata"))
        return idents, True, rodata, not static, _LEGACY in dynamic


def is_extension_module(path: str) -> bool:
    """Whether the library is a Python extension module (it exports ``PyInit_<name>``)."""
    elf = open_elf(path)
    if elf is None:
        return path.endswith(".pyd")
    with elf:
        return b"\0PyInit_" in b"\0" + elf.symbol_names(dynamic=True)


def _schemas(strings: bytes) -> list[tuple[str | None, str, str, str]]:
    """``(namespace or None, name, overload, "(args) -> returns")`` of every schema string."""
    out = []
    start = strings.find(b"->")
    seen = -1
    while start >= 0:  # each "->", widened to the NUL-terminated string holding it
        begin = strings.rfind(b"\0", 0, start) + 1
        end = strings.find(b"\0", start)
        end = len(strings) if end < 0 else end
        if begin > seen:
            seen = begin
            text = strings[begin:end]
            m = _SCHEMA.match(text.decode("ascii", "replace").strip()) if text.isascii() else None
            if m:
                out.append((m.group(1), m.group(2), m.group(3) or "", m.group(4)))
        start = strings.find(b"->", end)
    return out


def scan_library(path: str, named: Iterable[str] = ()) -> list[Registration]:
    """What the library at ``path`` registers when it is loaded (``module`` left for the caller).

    ``named``: the namespaces the distribution's Python code registers in, looked for
    among the strings of a stripped library (see the module's description).
    """
    idents, registers, strings, stripped, legacy = _read(path)
    if not registers:
        return []
    found = []
    owned = set()
    for kind, ns, key, macro in sorted(_blocks(idents), key=lambda b: (b[0], b[1], b[2] or "")):
        found.append(Registration(kind=kind, namespace=ns, key=key, api=macro, file=path,
                                  line=None))
        if kind in ("DEF", "FRAGMENT"):
            owned.add(ns)
    schemas = _schemas(strings)
    if not found and legacy:
        # each op is defined by its qualified schema, as a FRAGMENT would (no namespace is
        # claimed whole): the namespaces are those the schema strings name
        owned = {ns for ns, *_ in schemas if ns is not None} - RESERVED_NAMESPACES
        found = [Registration(kind="FRAGMENT", namespace=ns, api=LEGACY_API, file=path,
                              line=None) for ns in sorted(owned)]
        # an op registered by name alone, its schema inferred from the function:
        # ``.op("image::decode_gif", &decode_gif)``
        named_only = {(ns, name) for ns, name, *_ in schemas}
        for ns in sorted(owned):
            for m in re.finditer(rb"\0" + re.escape(ns.encode()) + rb"::([A-Za-z_]\w*)\0",
                                 strings):
                name = m.group(1).decode("ascii")
                if (ns, name) not in named_only:
                    named_only.add((ns, name))
                    found.append(Registration(kind="op", namespace=ns, name=name,
                                              api="c10::RegisterOperators.op", file=path,
                                              line=None))
    if not found and stripped:
        found = [Registration(kind="library", namespace=ns, api=STRIPPED_API, file=path,
                              line=None)
                 for ns in sorted(set(named) - RESERVED_NAMESPACES)
                 if b"\0" + ns.encode() + b"\0" in strings]
    if not found:
        why = ("the library calls torch's Library but its symbols are stripped: its "
               "TORCH_LIBRARY namespaces cannot be read" if stripped else
               "the library calls torch's Library, but no TORCH_LIBRARY block was found")
        found.append(Registration(kind="library", api="TORCH_LIBRARY", file=path, line=None,
                                  unresolved=why))
    return found + _ops(path, schemas, owned)


def _ops(path: str, schemas: list[tuple[str | None, str, str, str]], owned: set[str]
         ) -> list[Registration]:
    """The op definitions of the schema strings, for the namespaces the library DEFs/FRAGMENTs.

    An unqualified schema belongs to the library's one namespace; with
    several, it is reported with its namespace unresolved (the string does
    not say which).  In a stripped library only qualified schemas count.
    """
    out = []
    seen = set()
    for ns, name, overload, schema in schemas:
        if (ns, name, overload) in seen:
            continue
        seen.add((ns, name, overload))
        unresolved = "" if owned else "read from the strings of a stripped library"
        if ns is None and len(owned) == 1:
            ns = next(iter(owned))
        elif ns is None and owned:
            unresolved = (f"the schema string does not say which of the library's namespaces "
                          f"({', '.join(sorted(owned))}) it belongs to")
        elif ns is None or (owned and ns not in owned):
            continue  # a schema of another library, or no namespace to give it
        out.append(Registration(kind="op", namespace=ns, name=name, overload=overload,
                                schema=schema, api="m.def", file=path, line=None,
                                unresolved=unresolved))
    return out
