"""The tokens and literals of torch's schema language, read as torch's lexer reads them.

torch parses a schema with the TorchScript lexer
(``torch/csrc/jit/frontend/lexer.h``, shipped in every wheel's ``include/``):
blanks and ``#`` comments are skipped, a backslash-newline joins lines, a line
break inside brackets is a blank and outside them ends the schema, numbers are
what C's ``strtod`` reads (hex floats and a ``j`` suffix included), strings
take single or triple quotes of either kind.  Default values are then
converted the way ``function_schema_parser.cpp`` does (``std::stoll`` /
``std::stod``: digits up to the first other character, a double that
overflows or underflows is an error) and strings unescaped as
``parse_string_literal.h`` does.  This module holds those rules; the grammar
is in :mod:`opregistry.schema`.
"""

from __future__ import annotations

import math
import re

__all__ = [
    "KEYWORDS",
    "LexError",
    "tokenize",
    "token_offsets",
    "integer_value",
    "double_value",
    "string_value",
    "device_error",
]

#: Words torch's lexer reads as keywords (``TC_FORALL_TOKEN_KINDS`` in lexer.h), never as
#: identifiers: they cannot name an op, an overload, an argument, a return or an alias set.
KEYWORDS: frozenset[str] = frozenset({
    "Ellipsis", "False", "None", "NoneType", "True", "and", "as", "assert", "break", "class",
    "continue", "def", "del", "elif", "else", "for", "global", "if", "import", "in", "is",
    "not", "or", "pass", "raise", "return", "while", "with",
})

# Skipped before every token: blanks (C's isspace less the newline), a backslash-newline,
# and comments (a "# type:" comment is a token of its own, which no schema accepts).
_SKIP = r"(?:[ \t\r\f\v]+|\\\n|#(?! type:)[^\n]*)*"
_HEX = r"0[xX](?:[0-9a-fA-F]+(?:\.[0-9a-fA-F]*)?|\.[0-9a-fA-F]+)(?:[pP][+-]?\d+)?"
_DEC = r"(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_STRING = (r'"""(?:\\[\s\S]|(?!""")[^\\])*"""' r"|'''(?:\\[\s\S]|(?!''')[^\\])*'''"
           r'|"(?:\\[\s\S]|[^\\"\n])*"' r"|'(?:\\[\s\S]|[^\\'\n])*'")
#: One token after what is skipped: a number, a string, an identifier or keyword, an operator
#: that matters to schemas ("...", "->"), any other character but a blank (a single-character
#: token or, outside torch's set, an invalid one: the grammar refuses both alike)
#: At the end of the text the token is empty: every token list ends with ``""``, the end.
_TOKEN = re.compile(_SKIP + r"((?:" + _HEX + "|" + _DEC + r")j?|" + _STRING
                    + r"|[A-Za-z_][A-Za-z0-9_]*|\.\.\.|->|# type:|[^ \t\r\f\v]|\Z)")
_OPEN = frozenset("([{")
_CLOSE = frozenset(")]}")


class LexError(ValueError):
    """Text torch's lexer refuses; ``offset`` is where, in the schema."""

    def __init__(self, what: str, offset: int) -> None:
        super().__init__(what)
        self.offset = offset


def tokenize(text: str) -> list[str]:
    """The tokens of ``text``, as torch's lexer finds them for one schema.

    Line breaks are resolved here: inside brackets they are blanks; before the
    first token and after the last they are what torch's lexer takes as the
    schema's indentation and its end; anywhere else they end the schema
    early, which torch refuses.  The list ends with ``""``.  torch's lexer
    stops at a NUL character, as C strings do: so does this.
    """
    if "\0" in text:
        text = text.partition("\0")[0]
    tokens = _TOKEN.findall(text)
    if "\n" in tokens:
        tokens = _lines(text, tokens)
    return tokens


def _lines(text: str, tokens: list[str]) -> list[str]:
    kept: list[str] = []
    depth = 0
    pending = -1  # index of a line break at depth 0 after some token, not yet known to be last
    for index, token in enumerate(tokens):
        if token == "\n":
            if depth <= 0 and kept and pending < 0:
                pending = index
            continue
        if pending >= 0 and token:
            raise LexError("a line break outside brackets ends torch's schema before this; "
                           "break lines inside the parentheses only",
                           token_offsets(text, newlines=True)[pending])
        if token in _OPEN:
            depth += 1
        elif token in _CLOSE:
            depth -= 1
        kept.append(token)
    return kept


def token_offsets(text: str, newlines: bool = False) -> list[int]:
    """Where each token of ``text`` starts (for error messages: the slow path), line breaks
    left out unless ``newlines``: the offsets of :func:`tokenize`'s tokens."""
    return [m.start(1) for m in _TOKEN.finditer(text.partition("\0")[0])
            if newlines or m.group(1) != "\n"]


_DIGITS = re.compile(r"-?\d+")
_INT64 = 2**63
_SMALLEST_NORMAL = 2.2250738585072014e-308


def integer_value(number: str) -> int | None:
    """``std::stoll(number)``: the leading decimal digits (``"0x10"`` is 0, ``"1E5"`` is 1);
    ``None`` when out of the range of a 64-bit integer, where ``stoll`` throws."""
    m = _DIGITS.match(number)
    value = int(m.group(0)) if m else 0
    return value if -_INT64 <= value < _INT64 else None


def double_value(number: str) -> float | None:
    """``std::stod(number)``; ``None`` where it throws: the value overflows, or underflows to a
    subnormal or to zero from nonzero digits (glibc's ``strtod`` reports both as ERANGE)."""
    sign = -1.0 if number.startswith("-") else 1.0
    body = number.lstrip("-")
    if not body:
        return None
    if body[:2] in ("0x", "0X"):
        mantissa = body[2:].partition("p")[0].partition("P")[0]
        try:
            value = float.fromhex(body)
        except (OverflowError, ValueError):
            return None
        digits = mantissa.strip("0.")
    else:
        value = float(body)
        digits = re.split("[eE]", body)[0].strip("0.")
    if math.isinf(value) or (value < _SMALLEST_NORMAL and (value != 0.0 or digits)):
        return None
    return sign * value


_ESCAPES = {"\\": "\\", "'": "'", '"': '"', "\n": "\n", "a": "\a", "b": "\b", "f": "\f",
            "n": "\n", "v": "\v", "t": "\t"}


def string_value(token: str) -> str:
    """The value of a string literal token, unescaped as torch's ``parseStringLiteral``.

    :raises ValueError: for the escapes torch refuses (``\\x``, ``\\u``, a bad octal).
    """
    quote = 3 if token[:3] in ('"""', "'''") else 1
    body = token[quote:-quote]
    if "\\" not in body:
        return body
    out: list[str] = []
    i = 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        nxt = body[i + 1]
        if nxt in _ESCAPES:
            out.append(_ESCAPES[nxt])
            i += 2
        elif nxt == "x":
            raise ValueError("torch's schema strings have no hex escape ('\\x')")
        elif nxt in "uU":
            raise ValueError("torch's schema strings have no unicode escape ('\\u')")
        else:
            octal = body[i + 1:i + 4]
            if i + 3 >= len(body) or not re.fullmatch("[0-7]{3}", octal) or int(octal, 8) > 255:
                raise ValueError(f"unknown escape '\\{nxt}' (torch reads it as an ill-formed "
                                 f"octal escape)")
            out.append(chr(int(octal, 8)))
            i += 4
    return "".join(out)


_DEVICE = re.compile(r"([a-zA-Z_]+)(?::([1-9]\d*|0))?\Z")


def device_error(text: str, device_types: frozenset[str]) -> str | None:
    """Why ``c10::Device(text)`` throws, or ``None``: what a ``Device`` default must be."""
    if not text:
        return "a device string must not be empty"
    m = _DEVICE.match(text)
    if m is None:
        return f"{text!r} is not a device string ('cpu', 'cuda', 'cuda:1', ...)"
    if m.group(1) not in device_types:
        return (f"{m.group(1)!r} is not a device type; torch's are "
                + ", ".join(sorted(device_types)))
    if m.group(2) is not None and int(m.group(2)) > 2**31 - 1:
        return f"device index {m.group(2)} does not fit the index torch parses it into"
    return None
