"""Strict JSON for request bodies: every value that comes out can be stored,
replicated and rendered again, or the caller gets a 4xx naming what is wrong.

Refused, with the offending member's dotted path where there is one:
  - anything but UTF-8 (also UTF-16/32, which json.loads would guess), and a BOM;
  - nesting deeper than json_depth_max, found by a linear scan before parsing,
    so no parser recursion ever depends on the caller;
  - integers outside the signed 64-bit range (json_int_min..json_int_max),
    without converting their digits (Python refuses to convert more than 4300
    digits, and 10^5000 must be a 400, not a ValueError);
  - NaN, Infinity and number literals too large for a 64-bit float;
  - lone surrogates (\\ud800 escapes: not encodable as UTF-8, so not storable)
    and NUL (the separator of composed storage keys) in any string or name.
"""

from __future__ import annotations

import itertools
import json
import math
import operator
import re
import threading
from typing import Any

from raftsched import limits
from raftsched.errors import InvalidInput

_BOM = b"\xef\xbb\xbf"
# A JSON string, or an unterminated one up to the end. The closing quote is
# optional so that the scan never backtracks: it is linear in the body size.
_STRING_RE = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"?', re.S)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
# An opening bracket weighs 2 and a closing one 0, so that the running sum of
# weights minus the count of brackets seen is the depth (all in C loops).
_WEIGHTS = bytes.maketrans(b"[{]}", b"\x02\x02\x00\x00")
_BAD_CHAR_RE = re.compile("[\x00\ud800-\udfff]")


class _Refused:
    """Put in the parsed tree by a parse hook, so that the walk after parsing
    can name the member that holds the refused literal."""

    def __init__(self, detail: str, limit: str | None) -> None:
        self.detail = detail
        self.limit = limit


def nesting_depth(raw: bytes) -> int:
    """The deepest nesting of objects and arrays in `raw`, outside strings."""
    weights = _STRING_RE.sub(b"", raw).translate(None, _NOT_BRACKETS).translate(_WEIGHTS)
    if not weights:
        return 0
    return max(map(operator.sub, itertools.accumulate(weights), range(1, len(weights) + 1)))


def decode(raw: bytes) -> Any:
    """Parse a request body; raise InvalidInput (400) naming the field or limit."""
    if not raw:
        raise InvalidInput("the request body is empty; send a JSON value", field="body")
    if raw.startswith(_BOM):
        raise InvalidInput("the request body starts with a byte order mark; send UTF-8 "
                           "JSON without one", field="body")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"the request body is not UTF-8 (byte {exc.start})",
                           field="body") from None
    # Fewer opening brackets than the limit cannot nest past it: skip the scan.
    opening = raw.count(b"[") + raw.count(b"{")
    depth = nesting_depth(raw) if opening > limits.json_depth_max else 0
    if depth > limits.json_depth_max:
        raise InvalidInput(f"the request body is nested {depth} levels deep, over "
                           f"{limits.json_depth_max}", field="body", limit="json_depth_max")
    hooks = _hooks()
    hooks.refused = False
    try:
        value = hooks.decoder.decode(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"the request body is not JSON: {exc}", field="body") from None
    # NUL and lone surrogates come only from escapes: json.loads refuses a raw
    # control character in a string, and a surrogate's bytes are not UTF-8.
    # So a body with no backslash and no refused literal has nothing to find.
    if hooks.refused or b"\\" in raw:
        _check(value, "")
    return value


class _Hooks:
    """A thread's parse hooks and the decoder that calls them, noting
    whether any refused a literal in the decode under way. One per thread
    (bodies are decoded on the event loop and, when large, on worker
    threads), made once: building a JSONDecoder and its scanner for each
    body was a tenth of json's part of a create."""

    __slots__ = ("refused", "decoder")

    def __init__(self) -> None:
        self.refused = False
        self.decoder = json.JSONDecoder(parse_int=self.parse_int, parse_float=self.parse_float,
                                        parse_constant=self.parse_constant)

    def parse_int(self, literal: str) -> int | _Refused:
        value = _parse_int(literal)
        if value.__class__ is _Refused:
            self.refused = True
        return value

    def parse_float(self, literal: str) -> float | _Refused:
        value = _parse_float(literal)
        if value.__class__ is _Refused:
            self.refused = True
        return value

    def parse_constant(self, name: str) -> _Refused:
        self.refused = True
        return _parse_constant(name)


_THREAD = threading.local()


def _hooks() -> _Hooks:
    """This thread's _Hooks."""
    try:
        return _THREAD.hooks
    except AttributeError:
        _THREAD.hooks = _Hooks()
        return _THREAD.hooks


def _parse_int(literal: str) -> int | _Refused:
    digits = len(literal) - literal.startswith("-")
    # 19 digits hold every signed 64-bit integer; more are refused unread.
    if digits <= 19:
        value = int(literal)
        if limits.json_int_min <= value <= limits.json_int_max:
            return value
    bound = "json_int_min" if literal.startswith("-") else "json_int_max"
    return _Refused(f"an integer of {digits} digits is outside the signed 64-bit range "
                    f"({limits.json_int_min} to {limits.json_int_max})", bound)


def _parse_float(literal: str) -> float | _Refused:
    value = float(literal)
    if math.isfinite(value):
        return value
    return _Refused("a number too large for a 64-bit float", None)


def _parse_constant(name: str) -> _Refused:
    return _Refused(f"{name} is not a JSON number; send a finite number", None)


def _check(value: Any, path: str) -> None:
    """Walk the parsed value (at most json_depth_max deep, so recursion is bounded)."""
    if isinstance(value, _Refused):
        raise InvalidInput(value.detail, field=path or "body", limit=value.limit)
    if isinstance(value, str):
        _check_text(value, path)
    elif isinstance(value, dict):
        for name, member in value.items():
            _check_text(name, path, name=True)
            _check(member, f"{path}.{name}" if path else name)
    elif isinstance(value, list):
        for i, member in enumerate(value):
            _check(member, f"{path}[{i}]")


def _check_text(text: str, path: str, *, name: bool = False) -> None:
    found = _BAD_CHAR_RE.search(text)
    if found is None:
        return
    what = "NUL" if found.group() == "\x00" else "a lone surrogate (not valid UTF-8)"
    where = f"a member name in `{path}`" if name and path else (
        "a member name" if name else f"`{path}`" if path else "the body")
    raise InvalidInput(f"{where} holds {what} at character {found.start()}",
                       field=path or "body")
