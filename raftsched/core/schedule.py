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

The rules hold for shifts of any size: Australia/Lord_Howe moves by 30 minutes
and Antarctica/Troll by two hours, and the second copy of a repeated period is
found from the size of the shift, not assumed to be an hour.

Jenkins' hashed spread: `H` in a cron field stands for a value picked by a
stable hash of the job id (`H`, `H(0-29)`, `H/15`, `H(0-29)/10`), so jobs that
all say "hourly" spread over the hour. It is resolved once, when the job is
created or changed, into a plain expression (`cron`); the text as given is
kept as `text`. A cron or every schedule may carry `not_before_ms` and
`not_after_ms`: no occurrence falls outside them.

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
from raftsched.core.keys import stable_hash
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

def parse_schedule(schedule: object, run_at: object, field_prefix: str = "",
                   hash_key: str = "") -> dict:
    """Validate the `schedule` / `run_at` members of a job body into a stored spec.
    `hash_key` (the job id) is what `H` in a cron field is hashed from."""
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
    text = normalise_cron(schedule["cron"], f"{field_prefix}schedule.cron")
    cron = resolve_hashed(text, hash_key, f"{field_prefix}schedule.cron")
    if next_fire_cron(cron, tz, 0) is None:
        raise InvalidInput(f"cron expression {schedule['cron']!r} never fires",
                           field=f"{field_prefix}schedule.cron")
    spec = {"kind": "cron", "cron": cron, "timezone": tz}
    if cron != text:
        spec["text"] = text
    return spec


def bound_schedule(schedule: dict, not_before_ms: int | None,
                   not_after_ms: int | None) -> dict:
    """The schedule with its bounds (inclusive); a bound that is None is dropped."""
    out = {k: v for k, v in schedule.items() if k not in ("not_before_ms", "not_after_ms")}
    if not_before_ms is not None:
        out["not_before_ms"] = not_before_ms
    if not_after_ms is not None:
        out["not_after_ms"] = not_after_ms
    return out


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
    """Return the expression with macros expanded and whitespace collapsed.
    An expression is checked once (parsed by croniter): the answer, valid or
    not, is kept for the next job that gives the same text."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidInput("`cron` must be a cron expression such as \"0 2 * * *\"", field=field)
    if len(value.encode("utf-8", "surrogatepass")) > limits.cron_expression_bytes_max:
        raise InvalidInput(f"`cron` is longer than {limits.cron_expression_bytes_max} bytes; "
                           f"use ranges (1-5) and steps (*/10) rather than long lists",
                           field=field, limit="cron_expression_bytes_max")
    text, problem = _checked_cron(value)
    if problem is not None:
        raise InvalidInput(problem, field=field)
    return text


@functools.lru_cache(maxsize=limits.cron_parse_cache_max)
def _checked_cron(value: str) -> tuple[str, str | None]:
    """(the normalised expression, None) or (value, why it is refused)."""
    text = " ".join(value.split())
    if text.startswith("@"):
        if text.lower() not in MACROS:
            return value, f"unknown cron macro {text!r} (known: {', '.join(MACROS)})"
        text = MACROS[text.lower()]
    fields = text.split(" ")
    if len(fields) not in (5, 6):
        return value, (f"cron needs 5 fields (minute hour day month weekday) or 6 with "
                       f"seconds first; got {len(fields)}")
    # H is checked here and resolved with any key: whether the expression is
    # valid does not depend on the values the hash picks.
    try:
        plain = resolve_hashed(text, "", "")
    except InvalidInput as exc:
        return value, exc.detail
    try:
        croniter(plain, dt.datetime(2026, 1, 1), second_at_beginning=len(fields) == 6)
    except (CroniterError, ValueError, KeyError) as exc:
        return value, f"invalid cron expression {value!r}: {exc}"
    return text, None


# --- hashed spread (H) -----------------------------------------------------------------

_HASH_TERM_RE = re.compile(r"H(?:\((\d{1,2})-(\d{1,2})\))?(?:/(\d{1,2}))?")
_FIELD_NAMES = ("minute", "hour", "day of month", "month", "day of week")
# What a bare `H` (or `H/n`) picks from in each field: Jenkins keeps the day of
# the month to 1-28, which every month has, and the day of the week to 0-6.
_HASH_SPAN = {"second": (0, 59), "minute": (0, 59), "hour": (0, 23),
              "day of month": (1, 28), "month": (1, 12), "day of week": (0, 6)}
# What `H(a-b)` may name.
_FIELD_SPAN = dict(_HASH_SPAN, **{"day of month": (1, 31)})


def resolve_hashed(cron: str, hash_key: str, field: str = "schedule.cron") -> str:
    """The expression with every `H` term replaced by the values a stable hash of
    (hash_key, field, term) picks, Jenkins' way:

      H          one value of the field (day of month 1-28, day of week 0-6)
      H(a-b)     one value in a..b
      H/n        every n from a hashed start in 0..n-1 (from 1 for days, months)
      H(a-b)/n   every n within a..b, from a hashed start in a..a+n-1

    A stepped term that yields two values or more becomes `start-b/n`, so it
    stays a stepped field for the DST rules; one value becomes that value.
    Terms without H, and expressions without H, are returned unchanged."""
    if "H" not in cron:
        return cron
    fields = cron.split(" ")
    names = (("second",) if len(fields) == 6 else ()) + _FIELD_NAMES
    out = []
    for index, (name, text) in enumerate(zip(names, fields)):
        if "H" not in text:
            out.append(text)
            continue
        # Day and month names hold an H too (THU); an H term starts with it.
        out.append(",".join(_resolve_term(term, name, f"{hash_key}|{index}|{n}", field)
                            if term.startswith("H") else term
                            for n, term in enumerate(text.split(","))))
    return " ".join(out)


def _resolve_term(term: str, name: str, seed: str, field: str) -> str:
    match = _HASH_TERM_RE.fullmatch(term)
    if match is None:
        raise InvalidInput(f"cannot read {term!r} in the {name} field: write H, H(a-b), H/n "
                           "or H(a-b)/n", field=field)
    low, high = _HASH_SPAN[name]
    if match.group(1) is not None:
        low, high = int(match.group(1)), int(match.group(2))
        least, most = _FIELD_SPAN[name]
        if not least <= low <= high <= most:
            raise InvalidInput(f"{term!r}: the {name} range must lie within {least}-{most}, "
                               "low to high", field=field)
    step = int(match.group(3)) if match.group(3) is not None else 1
    if not 1 <= step <= high - low + 1:
        raise InvalidInput(f"{term!r}: the step must be from 1 to {high - low + 1}", field=field)
    picked = stable_hash(seed)
    if step == 1:
        return str(low + picked % (high - low + 1))
    start = low + picked % step
    return f"{start}-{high}/{step}" if start + step <= high else str(start)


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
    if kind == "none":
        return None   # a DAG job without a schedule runs when triggered
    if kind == "once":
        return spec["run_at_ms"]
    floor_ms = spec.get("not_before_ms")
    if floor_ms is not None and after_ms < floor_ms:
        after_ms = floor_ms - 1
    if kind == "cron":
        found = next_fire_cron(spec["cron"], spec["timezone"], after_ms)
    else:
        assert kind == "every", kind
        every_ms = spec["every_ms"]
        found = (after_ms // every_ms + 1) * every_ms
    ceiling_ms = spec.get("not_after_ms")
    if found is not None and ceiling_ms is not None and found > ceiling_ms:
        return None
    return found


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


def covered_occurrences(spec: dict, due_ms: int, now_ms: int, limit: int,
                        window_start_ms: int | None = None
                        ) -> tuple[list[int], bool, int | None]:
    """The occurrences a fire at `now_ms` covers, for a job due at `due_ms`.

    Returns (occurrences, omitted, next_ms): the occurrences at or before now,
    ascending, starting with `due_ms`: at most `limit` from the start, plus the
    latest one at or before now (then `omitted` is True if any in between were
    left out); and the first occurrence after now (None if there is none).
    With `window_start_ms` (a catch-up window), the ones after due_ms and
    before it are left out too (and `omitted` says so).
    On time, this is ([due_ms], False, next) for the cost of one memoised call.
    """
    if spec["kind"] == "once":
        return [due_ms], False, None
    occurrences = [due_ms]
    cursor = due_ms
    skipped = False
    if window_start_ms is not None:
        first = next_fire_ms(spec, due_ms)
        if first is not None and first < window_start_ms and first <= now_ms:
            cursor, skipped = window_start_ms - 1, True   # go on from the window's start
    while True:
        nxt = next_fire_ms(spec, cursor)
        if nxt is None or nxt > now_ms:
            return occurrences, skipped, nxt
        if len(occurrences) >= limit:
            break
        occurrences.append(nxt)
        cursor = nxt
    latest = latest_at_or_before(spec, now_ms, cursor)
    omitted = skipped or (latest != occurrences[-1]
                          and next_fire_ms(spec, occurrences[-1]) != latest)
    if latest != occurrences[-1]:
        occurrences.append(latest)
    return occurrences, omitted, next_fire_ms(spec, now_ms)


# Look-back windows for finding the latest occurrence before an instant: a
# short window first, so a frequent schedule walks only a few steps forward.
_LOOKBACK_MS = (60_000, 3_600_000, 86_400_000, 32 * 86_400_000, 366 * 86_400_000)


def latest_at_or_before(spec: dict, now_ms: int, floor_ms: int) -> int:
    """The latest occurrence in [floor_ms, now_ms]; floor_ms if there is none later."""
    now_ms = min(now_ms, spec.get("not_after_ms", now_ms))
    if now_ms <= floor_ms:
        return floor_ms
    if spec["kind"] == "every":
        every_ms = spec["every_ms"]
        return max(floor_ms, now_ms // every_ms * every_ms)
    for window in _LOOKBACK_MS:
        start = max(floor_ms, now_ms - window)
        found = next_fire_ms(spec, start)
        if found is not None and found <= now_ms:
            for _ in range(limits.schedule_walk_steps_max):
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
    """When `after` lies in the first copy of a repeated period, a wildcard
    schedule's next run may be a second-copy time whose wall clock is at or
    before `after`'s: one in (wall - shift, wall], where shift is the size of
    the change (an hour, 30 minutes at Lord Howe, two hours at Troll). The
    period's wall clock starts where the offset changes, so the search starts
    there at the earliest: a candidate before it is not repeated."""
    wall = after.replace(tzinfo=None)
    first = wall.replace(tzinfo=tz, fold=0).utcoffset()
    second = wall.replace(tzinfo=tz, fold=1).utcoffset()
    if after.fold != 0 or first is None or second is None or first <= second:
        return None
    shift = first - second
    change_ms = _transition_ms(after_ms, after_ms + shift // dt.timedelta(milliseconds=1), tz)
    period_start = ms_to_datetime(change_ms, tz).replace(tzinfo=None)
    try:
        cand = _iter(cron, max(wall - shift, period_start - _SECOND)).get_next(dt.datetime)
    except CroniterBadDateError:
        return None
    if cand > wall:
        return None   # a later wall clock: its first copy comes sooner (_next_forward)
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


# --- jitter ------------------------------------------------------------------------------

def fire_delay_ms(job_id: str, occurrence_ms: int, jitter_ms: int) -> int:
    """A job's delay for one occurrence: 0 to `jitter_ms`, picked by a stable hash
    of (job id, occurrence). It is a hash rather than a random draw so that the
    proposer, every replica and every later fire of the same occurrence agree
    on it without carrying it."""
    if not jitter_ms:
        return 0
    return stable_hash(f"{job_id}|{occurrence_ms}|jitter") % (jitter_ms + 1)


__all__ = ["CroniterBadCronError", "bound_schedule", "covered_occurrences", "fire_delay_ms",
           "resolve_hashed", "is_wildcard", "latest_at_or_before", "next_fire_cron", "next_fire_ms",
           "normalise_cron", "parse_instant", "parse_schedule", "parse_timezone", "preview_ms"]
