"""Schedules: parse and validate them, and compute the next fire time.

Three kinds, stored in a job as a plain map:
  {"kind": "cron", "cron": "0 2 * * *", "timezone": "Asia/Kolkata"}
  {"kind": "every", "every_ms": 10000}                 aligned to the Unix epoch
  {"kind": "once", "run_at_ms": ..., "offset_min": 330}

Cron is evaluated on local wall-clock time with croniter on naive datetimes (no
zone, so no DST logic of croniter's own), then mapped to instants here, which
is where the DST rules live (they match Debian cron):
  - a local time inside a spring-forward gap does not exist: a fixed-time
    schedule fires at the first instant after the gap; a wildcard schedule
    (minute, hour or seconds field with `*` or `/`) just skips it;
  - a local time inside an autumn fold happens twice: a fixed-time schedule
    fires once, in the first copy; a wildcard schedule fires in both copies.

Next-fire results are memoised per (expression, timezone, after): a burst of
jobs that share an expression costs one evaluation, not one per job. Pure: the
caller passes `after_ms`; nothing here reads a clock.
"""

from __future__ import annotations

import datetime as dt
import functools
import re
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from croniter.croniter import CroniterBadCronError, CroniterBadDateError, CroniterError

from raftsched import limits
from raftsched.core.timeutil import datetime_to_ms, ms_to_datetime, parse_rfc3339
from raftsched.errors import InvalidInput

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

# Nine digits a unit are more than every_ms_max in any unit; more are refused
# unread (Python will not convert more than 4300 digits at all).
_EVERY_RE = re.compile(r"^(?:(\d{1,9})d)?(?:(\d{1,9})h)?(?:(\d{1,9})m)?(?:(\d{1,9})s)?$")
_SECOND = dt.timedelta(seconds=1)


# --- parsing --------------------------------------------------------------------------

def parse_schedule(schedule: object, run_at: object, field_prefix: str = "") -> dict:
    """Validate the `schedule` / `run_at` members of a job body into a stored spec."""
    has_schedule = schedule is not None
    has_run_at = run_at is not None
    if has_schedule == has_run_at:
        raise InvalidInput("give exactly one of `schedule` and `run_at`",
                           field=f"{field_prefix}schedule")
    if has_run_at:
        return parse_run_at(run_at, f"{field_prefix}run_at")
    if not isinstance(schedule, dict):
        raise InvalidInput("`schedule` must be an object: {cron, timezone} or {every}",
                           field=f"{field_prefix}schedule")
    unknown = set(schedule) - {"cron", "timezone", "every"}
    if unknown:
        name = sorted(unknown)[0]
        raise InvalidInput(f"unknown field {name!r}", field=f"{field_prefix}schedule.{name}")
    if ("cron" in schedule) == ("every" in schedule):
        raise InvalidInput("`schedule` needs exactly one of `cron` and `every`",
                           field=f"{field_prefix}schedule")
    if "every" in schedule:
        if "timezone" in schedule:
            raise InvalidInput("`every` schedules are zone-free; drop `timezone`",
                               field=f"{field_prefix}schedule.timezone")
        every_ms = parse_every(schedule["every"], f"{field_prefix}schedule.every")
        return {"kind": "every", "every_ms": every_ms, "text": schedule["every"].strip()}
    tz = parse_timezone(schedule.get("timezone", "UTC"), f"{field_prefix}schedule.timezone")
    cron = normalise_cron(schedule["cron"], f"{field_prefix}schedule.cron")
    if next_fire_cron(cron, tz, 0) is None:
        raise InvalidInput(f"cron expression {schedule['cron']!r} never fires",
                           field=f"{field_prefix}schedule.cron")
    return {"kind": "cron", "cron": cron, "timezone": tz}


def parse_run_at(value: object, field: str) -> dict:
    run_at_ms, offset_min = parse_instant(value, field)
    return {"kind": "once", "run_at_ms": run_at_ms, "offset_min": offset_min}


def parse_instant(value: object, field: str) -> tuple[int, int]:
    """An RFC 3339 timestamp from 1970 to timestamp_ms_max: (ms, offset in minutes)."""
    name = field.rsplit(".", 1)[-1]
    try:
        ms, offset_min = parse_rfc3339(value)  # type: ignore[arg-type]
    except (ValueError, TypeError) as exc:
        raise InvalidInput(f"`{name}` is not an RFC 3339 timestamp: {exc}", field=field) from None
    if ms < 0:
        raise InvalidInput(f"`{name}` is before 1970", field=field)
    if ms > limits.timestamp_ms_max:
        raise InvalidInput(f"`{name}` is after 9999-12-30T00:00:00Z", field=field,
                           limit="timestamp_ms_max")
    return ms, offset_min


def parse_timezone(value: object, field: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidInput("`timezone` must be an IANA zone name such as Europe/Berlin",
                           field=field)
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidInput(f"unknown time zone {value!r} (use an IANA name such as "
                           "America/New_York)", field=field) from None
    return value


def parse_every(value: object, field: str) -> int:
    if not isinstance(value, str):
        raise InvalidInput("`every` is a duration string such as \"10s\", \"5m\", \"1h30m\"",
                           field=field)
    match = _EVERY_RE.match(value.strip())
    if not match or not any(match.groups()):
        raise InvalidInput(f"cannot read duration {value!r}; use d/h/m/s units such as "
                           "\"90s\" or \"1h30m\"", field=field)
    days, hours, minutes, seconds = (int(g or 0) for g in match.groups())
    every_ms = ((days * 24 + hours) * 60 + minutes) * 60_000 + seconds * 1000
    if not limits.every_ms_min <= every_ms <= limits.every_ms_max:
        raise InvalidInput(f"`every` must be between 1s and 366d, not {value!r}",
                           field=field, limit="every_ms_min" if every_ms < limits.every_ms_min
                           else "every_ms_max")
    return every_ms


def normalise_cron(value: object, field: str) -> str:
    """Return the expression with macros expanded and whitespace collapsed."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidInput("`cron` must be a cron expression such as \"0 2 * * *\"", field=field)
    if len(value.encode("utf-8", "surrogatepass")) > limits.command_text_bytes_max:
        raise InvalidInput(f"`cron` is longer than {limits.command_text_bytes_max} bytes",
                           field=field, limit="command_text_bytes_max")
    text = " ".join(value.split())
    if text.startswith("@"):
        if text.lower() not in MACROS:
            raise InvalidInput(f"unknown cron macro {text!r} (known: {', '.join(MACROS)})",
                               field=field)
        text = MACROS[text.lower()]
    fields = text.split(" ")
    if len(fields) not in (5, 6):
        raise InvalidInput(f"cron needs 5 fields (minute hour day month weekday) or 6 with "
                           f"seconds first; got {len(fields)}", field=field)
    try:
        croniter(text, dt.datetime(2026, 1, 1), second_at_beginning=len(fields) == 6)
    except (CroniterError, ValueError, KeyError) as exc:
        raise InvalidInput(f"invalid cron expression {value!r}: {exc}", field=field) from None
    return text


def is_wildcard(cron: str) -> bool:
    """Debian cron's rule: a schedule is wildcard when its seconds, minute or hour
    field has `*` or a step; those fire in both copies of a repeated hour."""
    fields = cron.split(" ")
    clock_fields = fields[:3] if len(fields) == 6 else fields[:2]
    return any("*" in f or "/" in f for f in clock_fields)


# --- next fire ------------------------------------------------------------------------

def next_fire_ms(spec: dict, after_ms: int) -> int | None:
    """The first fire instant strictly after `after_ms`, or None if there is none.

    A one-off job's single instant is returned whatever `after_ms` is: a run_at
    in the past fires once, at once (the fire_once misfire rule).
    """
    kind = spec["kind"]
    if kind == "cron":
        return next_fire_cron(spec["cron"], spec["timezone"], after_ms)
    if kind == "every":
        every_ms = spec["every_ms"]
        return (after_ms // every_ms + 1) * every_ms
    assert kind == "once", kind
    return spec["run_at_ms"]


def preview_ms(spec: dict, after_ms: int, count: int) -> list[int]:
    """Up to `count` fire times after `after_ms`; fewer if the schedule ends or
    reaches timestamp_ms_max (the end of the time that can be written)."""
    out: list[int] = []
    cursor = after_ms
    while len(out) < count:
        nxt = next_fire_ms(spec, cursor)
        if nxt is None or (out and nxt <= out[-1]) or nxt > limits.timestamp_ms_max:
            break
        out.append(nxt)
        cursor = nxt
    return out


def covered_occurrences(spec: dict, due_ms: int, now_ms: int,
                        limit: int) -> tuple[list[int], bool, int | None]:
    """The occurrences a fire at `now_ms` covers, for a job due at `due_ms`.

    Returns (occurrences, omitted, next_ms): the occurrences at or before now,
    ascending, starting with `due_ms`: at most `limit` from the start, plus the
    latest one at or before now (then `omitted` is True if any in between were
    left out); and the first occurrence after now (None if there is none).
    On time, this is ([due_ms], False, next) for the cost of one memoised call.
    """
    if spec["kind"] == "once":
        return [due_ms], False, None
    occurrences = [due_ms]
    cursor = due_ms
    while True:
        nxt = next_fire_ms(spec, cursor)
        if nxt is None or nxt > now_ms:
            return occurrences, False, nxt
        if len(occurrences) >= limit:
            break
        occurrences.append(nxt)
        cursor = nxt
    latest = latest_at_or_before(spec, now_ms, cursor)
    omitted = latest != occurrences[-1] and next_fire_ms(spec, occurrences[-1]) != latest
    if latest != occurrences[-1]:
        occurrences.append(latest)
    return occurrences, omitted, next_fire_ms(spec, now_ms)


# Look-back windows for finding the latest occurrence before an instant: a
# short window first, so a frequent schedule walks only a few steps forward.
_LOOKBACK_MS = (60_000, 3_600_000, 86_400_000, 32 * 86_400_000, 366 * 86_400_000)
_WALK_STEPS_MAX = 100_000


def latest_at_or_before(spec: dict, now_ms: int, floor_ms: int) -> int:
    """The latest occurrence in [floor_ms, now_ms]; floor_ms if there is none later."""
    if spec["kind"] == "every":
        every_ms = spec["every_ms"]
        return max(floor_ms, now_ms // every_ms * every_ms)
    for window in _LOOKBACK_MS:
        start = max(floor_ms, now_ms - window)
        found = next_fire_ms(spec, start)
        if found is not None and found <= now_ms:
            for _ in range(_WALK_STEPS_MAX):
                nxt = next_fire_ms(spec, found)
                if nxt is None or nxt > now_ms:
                    break
                found = nxt
            return found
        if start == floor_ms:
            break
    return floor_ms


@functools.lru_cache(maxsize=limits.schedule_cache_max)
def next_fire_cron(cron: str, timezone: str, after_ms: int) -> int | None:
    try:
        return _next_fire_cron(cron, timezone, after_ms)
    except (OverflowError, ValueError):
        # Near the end of datetime's range (the year 9999) croniter and local
        # times overflow: there is no next time to give.
        return None


def _next_fire_cron(cron: str, timezone: str, after_ms: int) -> int | None:
    tz = ZoneInfo(timezone)
    wildcard = is_wildcard(cron)
    after = ms_to_datetime(after_ms, tz)
    wall = after.replace(tzinfo=None)
    best = _next_forward(cron, tz, wildcard, wall, after_ms)
    if wildcard:
        second = _next_in_second_copy(cron, tz, after, after_ms)
        if second is not None and (best is None or second < best):
            best = second
    return best


def _iter(cron: str, start: dt.datetime) -> croniter:
    return croniter(cron, start, ret_type=dt.datetime, day_or=True,
                    second_at_beginning=len(cron.split(" ")) == 6,
                    max_years_between_matches=limits.cron_search_years_max)


def _next_forward(cron: str, tz: ZoneInfo, wildcard: bool, wall: dt.datetime,
                  after_ms: int) -> int | None:
    """Walk naive local candidates after `wall`; the first one that maps to an
    instant after `after_ms` gives the earliest first-copy or normal instant."""
    it = _iter(cron, wall)
    for _ in range(64):  # a few gap jumps and fold skips at most; bounded regardless
        try:
            cand = it.get_next(dt.datetime)
        except CroniterBadDateError:
            return None
        a_ms, b_ms = _both_ms(cand, tz)
        if a_ms == b_ms:
            if a_ms > after_ms:
                return a_ms
            continue  # `after_ms` had a sub-second part inside this very second
        if _is_gap(cand, tz, a_ms):
            gap_end_ms = _transition_ms(b_ms, a_ms, tz)
            if not wildcard and gap_end_ms > after_ms:
                return gap_end_ms
            # Jump past the gap instead of stepping through it second by second.
            it = _iter(cron, ms_to_datetime(gap_end_ms, tz).replace(tzinfo=None) - _SECOND)
            continue
        if a_ms > after_ms:
            return a_ms
        if wildcard and b_ms > after_ms:
            return b_ms
    return None


def _next_in_second_copy(cron: str, tz: ZoneInfo, after: dt.datetime,
                         after_ms: int) -> int | None:
    """When `after` lies in the first copy of a repeated hour, a wildcard schedule's
    next run may be a second-copy time whose wall clock is before `after`'s."""
    wall = after.replace(tzinfo=None)
    first = wall.replace(tzinfo=tz, fold=0).utcoffset()
    second = wall.replace(tzinfo=tz, fold=1).utcoffset()
    if after.fold != 0 or first is None or second is None or first <= second:
        return None
    try:
        cand = _iter(cron, wall - (first - second)).get_next(dt.datetime)
    except CroniterBadDateError:
        return None
    a_ms, b_ms = _both_ms(cand, tz)
    if a_ms == b_ms or _is_gap(cand, tz, a_ms):
        return None
    return b_ms if b_ms > after_ms else None


def _both_ms(naive: dt.datetime, tz: ZoneInfo) -> tuple[int, int]:
    return (datetime_to_ms(naive.replace(tzinfo=tz, fold=0)),
            datetime_to_ms(naive.replace(tzinfo=tz, fold=1)))


def _is_gap(naive: dt.datetime, tz: ZoneInfo, a_ms: int) -> bool:
    return ms_to_datetime(a_ms, tz).replace(tzinfo=None) != naive


def _transition_ms(lo_ms: int, hi_ms: int, tz: ZoneInfo) -> int:
    """The first whole second in (lo, hi] whose UTC offset is that of hi."""
    target = ms_to_datetime(hi_ms, tz).utcoffset()
    lo, hi = lo_ms // 1000, hi_ms // 1000
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ms_to_datetime(mid * 1000, tz).utcoffset() == target:
            hi = mid
        else:
            lo = mid
    return hi * 1000


__all__ = ["CroniterBadCronError", "covered_occurrences", "is_wildcard", "latest_at_or_before", "next_fire_cron", "next_fire_ms",
           "normalise_cron", "parse_instant", "parse_schedule", "parse_timezone", "preview_ms"]
