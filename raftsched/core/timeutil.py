"""Milliseconds since the epoch <-> RFC 3339, with zone offsets. Pure: no clock."""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

UTC = dt.timezone.utc


def ms_to_datetime(ms: int, tz: dt.tzinfo = UTC) -> dt.datetime:
    value = dt.datetime.fromtimestamp(ms / 1000, tz=UTC)
    return value if tz is UTC else value.astimezone(tz)


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)
_MS = dt.timedelta(milliseconds=1)


def datetime_to_ms(value: dt.datetime) -> int:
    assert value.tzinfo is not None, "naive datetimes have no instant"
    return (value - _EPOCH) // _MS


def format_ms(ms: int | None, tz: dt.tzinfo | str | None = None) -> str | None:
    """RFC 3339 with the zone's offset at that instant (`Z` for UTC)."""
    if ms is None:
        return None
    if isinstance(tz, str):
        tz = ZoneInfo(tz) if tz not in ("UTC", "Z") else UTC
    value = ms_to_datetime(ms, tz or UTC)
    spec = "milliseconds" if ms % 1000 else "seconds"
    text = value.isoformat(timespec=spec)
    return text[:-6] + "Z" if text.endswith("+00:00") and (tz in (None, UTC)) else text


def format_ms_offset(ms: int | None, offset_min: int) -> str | None:
    if ms is None:
        return None
    if offset_min == 0:
        return format_ms(ms)
    return format_ms(ms, dt.timezone(dt.timedelta(minutes=offset_min)))


def parse_rfc3339(text: str) -> tuple[int, int]:
    """Parse an RFC 3339 timestamp; return (ms since epoch, UTC offset in minutes).

    Raises ValueError for anything without an explicit offset: a naive time has
    no instant, and guessing a zone is how jobs end up firing an hour off.
    """
    if not isinstance(text, str) or "T" not in text.upper():
        raise ValueError("expected an RFC 3339 timestamp such as 2026-10-11T02:00:00+05:30")
    value = dt.datetime.fromisoformat(text.strip().replace("z", "Z"))
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError("the timestamp has no UTC offset (add Z or +HH:MM)")
    offset = value.utcoffset()
    assert offset is not None
    return datetime_to_ms(value), int(offset.total_seconds() // 60)
