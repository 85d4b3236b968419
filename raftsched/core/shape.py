"""Shape checks for replicated commands: small combinators from which
core/commands.py builds one checker per command tag (`SCHEMAS`).

A checker is a callable `check(value)` that returns None when `value` has the
shape, or raises ShapeError saying what is wrong and where (`path`, dotted,
with [i] for list items). Checkers are pure and deterministic: they read
nothing but the value, so every replica accepts or refuses a command alike.
They run on every replica for every entry, so the path of a member is built
only on the way out of a failure, never on the way in.

msgpack has no tuples: a fixed-length sequence arrives as a list, and
`tuple_of` checks a list of that length.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

from raftsched import limits
from raftsched.core.bounded import refusal

Check = Callable[[Any], None]

# What msgpack can carry as an integer: signed or unsigned 64-bit.
_MSGPACK_INT_MIN = -(2 ** 63)
_MSGPACK_INT_MAX = 2 ** 64 - 1


class ShapeError(Exception):
    """A member is not what the command needs: `why`, at `path`."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why
        self._segments: list[str | int] = []   # innermost first

    def within(self, segment: str | int) -> "ShapeError":
        """Record that the failure is inside member `segment` (a name or an index)."""
        self._segments.append(segment)
        return self

    @property
    def path(self) -> str:
        path = ""
        for segment in reversed(self._segments):
            if isinstance(segment, int):
                path += f"[{segment}]"
            else:
                path += f".{segment}" if path else segment
        return path

    def __str__(self) -> str:
        return f"{self.path or 'command'}: {self.why}"


def _utf8_bytes(value: str) -> int:
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise ShapeError("is not valid UTF-8 (it holds a lone surrogate)") from None


def text(max_bytes: int, *, key: bool = False) -> Check:
    """A string of at most `max_bytes` UTF-8 bytes. `key=True`: a part of a
    storage key, so also non-empty and free of NUL (the key separator)."""
    def check(value: Any) -> None:
        if value.__class__ is not str and not isinstance(value, str):
            raise ShapeError(f"must be a string, not {type(value).__name__}")
        # ASCII (ids, names) is as many bytes as characters: no encoding needed.
        size = len(value) if value.isascii() else _utf8_bytes(value)
        if size > max_bytes:
            raise ShapeError(f"is {size} bytes of UTF-8, over {max_bytes}")
        if key and not value:
            raise ShapeError("must not be empty")
        if key and "\x00" in value:
            raise ShapeError("must not contain NUL")
    return check


def integer(lo: int, hi: int) -> Check:
    """An integer in [lo, hi] (a boolean is not an integer here)."""
    def check(value: Any) -> None:
        # The common case first, fast (bool's class is not int); any other
        # value is judged as every bounded number is (core/bounded.py).
        if value.__class__ is int and lo <= value <= hi:
            return
        reason = refusal(value, lo, hi, integral=True)
        if reason is not None:
            raise ShapeError(reason)
    return check


def number(lo: float, hi: float) -> Check:
    """An integer or a finite float in [lo, hi]."""
    def check(value: Any) -> None:
        reason = refusal(value, lo, hi, integral=False)
        if reason is not None:
            raise ShapeError(reason)
    return check


def boolean() -> Check:
    def check(value: Any) -> None:
        if not isinstance(value, bool):
            raise ShapeError(f"must be true or false, not {type(value).__name__}")
    return check


def one_of(*choices: str) -> Check:
    """One of the given strings."""
    allowed = frozenset(choices)

    def check(value: Any) -> None:
        if not isinstance(value, str) or value not in allowed:
            raise ShapeError(f"must be one of {', '.join(sorted(allowed))}")
    return check


def optional(inner: Check) -> Check:
    """None, or what `inner` accepts."""
    def check(value: Any) -> None:
        if value is not None:
            inner(value)
    return check


class _MayBeAbsent:
    """Marks a record member that may be left out (see `record`)."""

    def __init__(self, inner: Check) -> None:
        self.inner = inner

    def __call__(self, value: Any) -> None:
        self.inner(value)


def may_be_absent(inner: Check) -> Check:
    """A record member that may be missing; when present, `inner` checks it."""
    return _MayBeAbsent(inner)


def list_of(item: Check, max_len: int, *, min_len: int = 0) -> Check:
    def check(value: Any) -> None:
        if not isinstance(value, list):
            raise ShapeError(f"must be a list, not {type(value).__name__}")
        if not min_len <= len(value) <= max_len:
            raise ShapeError(f"must hold {min_len} to {max_len} items, not {len(value)}")
        i = 0
        try:
            for i, member in enumerate(value):
                item(member)
        except ShapeError as exc:
            raise exc.within(i)
    return check


def tuple_of(*items: Check, where: Callable[[list], bool] | None = None,
             why: str = "") -> Check:
    """A list of exactly len(items) members, each checked by its own checker;
    then `where(value)` must hold (a rule across members, said by `why`)."""
    def check(value: Any) -> None:
        if not isinstance(value, list) or len(value) != len(items):
            raise ShapeError(f"must be a list of {len(items)} members")
        i = 0
        try:
            for i, item in enumerate(items):
                item(value[i])
        except ShapeError as exc:
            raise exc.within(i)
        if where is not None and not where(value):
            raise ShapeError(why)
    return check


def record(members: Mapping[str, Check], *, extra: Check | None = None,
           where: Callable[[dict], bool] | None = None, why: str = "") -> Check:
    """A map with string keys. Every member in `members` must be present
    unless wrapped in `may_be_absent`. Members not listed are refused, unless
    `extra` is given, which then checks their values. `where(value)` is a rule
    across members, said by `why`."""
    required = [name for name, c in members.items() if not isinstance(c, _MayBeAbsent)]

    lookup = dict(members)

    def check(value: Any) -> None:
        if value.__class__ is not dict and not isinstance(value, dict):
            raise ShapeError(f"must be a map, not {type(value).__name__}")
        for name in required:
            if name not in value:
                raise ShapeError("is required").within(name)
        get = lookup.get
        for name, member in value.items():
            if name.__class__ is not str and not isinstance(name, str):
                raise ShapeError(f"has a member named by a {type(name).__name__}")
            inner = get(name, extra)
            if inner is None:
                raise ShapeError("is not a member of this map").within(name)
            try:
                inner(member)
            except ShapeError as exc:
                raise exc.within(name)
        if where is not None and not where(value):
            raise ShapeError(why)
    return check


def map_of(key: Check, item: Check, max_len: int) -> Check:
    """A map of at most `max_len` members, each name checked by `key` and each
    value by `item` (a map whose names are data, such as a job's labels)."""
    def check(value: Any) -> None:
        if not isinstance(value, dict):
            raise ShapeError(f"must be a map, not {type(value).__name__}")
        if len(value) > max_len:
            raise ShapeError(f"must hold at most {max_len} members, not {len(value)}")
        for name, member in value.items():
            try:
                key(name)
            except ShapeError as exc:
                raise ShapeError(f"has a member name that {exc.why}") from None
            try:
                item(member)
            except ShapeError as exc:
                raise exc.within(name)
    return check


def by_member(member: str, cases: Mapping[str, Check]) -> Check:
    """A map whose shape depends on its `member` (a tag such as kind or event):
    cases[value[member]] checks it."""
    tag = one_of(*cases)

    def check(value: Any) -> None:
        if not isinstance(value, dict):
            raise ShapeError(f"must be a map, not {type(value).__name__}")
        if member not in value:
            raise ShapeError("is required").within(member)
        try:
            tag(value[member])
        except ShapeError as exc:
            raise exc.within(member)
        cases[value[member]](value)
    return check


def json_value(depth_max: int = limits.command_nesting_max) -> Check:
    """What a JSON document can hold, as msgpack carries it: null, booleans,
    64-bit integers, finite floats, strings, lists and maps with string keys,
    nested at most `depth_max` deep. No bytes and no msgpack extension types:
    the API renders these values as JSON."""
    def check(value: Any, depth: int = 0) -> None:
        if value is None or isinstance(value, bool):
            return
        if isinstance(value, int):
            if not _MSGPACK_INT_MIN <= value <= _MSGPACK_INT_MAX:
                raise ShapeError("is an integer outside 64 bits")
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise ShapeError("must be a finite number")
        elif isinstance(value, str):
            _utf8_bytes(value)
        elif isinstance(value, (list, dict)):
            if depth >= depth_max:
                raise ShapeError(f"is nested deeper than {depth_max} levels")
            _check_members(value, depth)
        else:
            raise ShapeError(f"must be a JSON value, not {type(value).__name__}")

    def _check_members(value: list | dict, depth: int) -> None:
        pairs = enumerate(value) if isinstance(value, list) else value.items()
        for name, member in pairs:
            if isinstance(value, dict):
                if not isinstance(name, str):
                    raise ShapeError(f"has a member named by a {type(name).__name__}")
                _utf8_bytes(name)
            try:
                check(member, depth + 1)
            except ShapeError as exc:
                raise exc.within(name)

    return lambda value: check(value)
