"""Request bodies are parsed strictly: every refusal is a 400 naming the member or the limit, and no body makes the parser recurse or convert a huge integer."""

from __future__ import annotations

import time

import pytest

from raftsched import limits
from raftsched.api.strictjson import decode, nesting_depth
from raftsched.errors import InvalidInput


@pytest.mark.parametrize("raw, depth", [
    (b"{}", 1),
    (b'{"a": [1, {"b": []}]}', 4),
    (b'{"a": "[[[[{{{{"}', 1),
    (b'["\\"[[[", ["\\\\"]]', 2),
    (b"[" * 100_000, 100_000),
    (b"1", 0),
])
def test_nesting_depth_ignores_brackets_inside_strings(raw, depth):
    assert nesting_depth(raw) == depth


def test_nesting_scan_is_linear_in_the_body_size():
    # Unterminated strings full of escaped quotes are the regex's worst case:
    # a backtracking scan would take minutes on this.
    raw = b"[" * 40 + b'"\\"' * 300_000
    started = time.monotonic()
    assert nesting_depth(raw) == 40
    assert time.monotonic() - started < 2.0


@pytest.mark.parametrize("raw, field, limit", [
    (b"[" * 100_000 + b"]" * 100_000, "body", "json_depth_max"),
    (b'{"a": ' * (limits.json_depth_max + 1) + b"1" + b"}" * (limits.json_depth_max + 1),
     "body", "json_depth_max"),
    (b'{"metadata": {"n": 18446744073709551616}}', "metadata.n", "json_int_max"),
    (b'{"n": 9223372036854775808}', "n", "json_int_max"),
    (b'{"n": -9223372036854775809}', "n", "json_int_min"),
    (b'{"n": 1' + b"0" * 5000 + b"}", "n", "json_int_max"),
    (b'{"a": [0, NaN]}', "a[1]", None),
    (b'{"a": Infinity}', "a", None),
    (b'{"a": -Infinity}', "a", None),
    (b'{"a": 1e400}', "a", None),
    (b'{"name": "x\\ud800y"}', "name", None),
    (b'{"target": {"argv": ["ok", "\\udfff"]}}', "target.argv[1]", None),
    (b'{"name": "a\\u0000b"}', "name", None),
    (b'{"metadata": {"k\\u0000": 1}}', "metadata", None),
    (b'{"\\ud800": 1}', "body", None),
    (b"\xef\xbb\xbf{}", "body", None),
    (b'{"name": "\xff"}', "body", None),
    (b'\xff\xfe{\x00}\x00', "body", None),
    (b"", "body", None),
    (b"{", "body", None),
])
def test_hostile_bodies_are_400_naming_the_field_or_limit(raw, field, limit):
    with pytest.raises(InvalidInput) as exc:
        decode(raw)
    assert exc.value.status == 400
    assert exc.value.field == field
    assert exc.value.limit == limit
    assert exc.value.detail


def test_what_fits_is_kept_exactly():
    raw = ('{"a": [9223372036854775807, -9223372036854775808, 1.5, -0.0, true, null], '
           '"\u00e9": "\U0001f600 \\u00e9", "nest": ' + "[" * (limits.json_depth_max - 1)
           + "]" * (limits.json_depth_max - 1) + "}").encode()
    value = decode(raw)
    assert value["a"] == [2 ** 63 - 1, -(2 ** 63), 1.5, -0.0, True, None]
    assert value["\u00e9"] == "\U0001f600 \u00e9"
    assert nesting_depth(raw) == limits.json_depth_max
