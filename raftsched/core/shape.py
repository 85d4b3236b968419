"""The check of free-form JSON values in replicated commands (a job's
metadata, a target's body, a published message): what msgspec's typed decode
of core/commands.py cannot bound (depth, finite numbers, JSON types only).

json_value returns a checker that returns None when a value has the shape, or
raises ShapeError saying what is wrong and where (`path`, dotted, with [i] for
list items). It is pure and deterministic: it reads nothing but the value, so
every replica accepts or refuses a command alike. commands.py calls it only
once its own fast judgement has refused a value, to name the offending member.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from raftsched import limits


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


def json_value(depth_max: int = limits.command_nesting_max) -> Callable[[Any], None]:
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
