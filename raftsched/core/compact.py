"""How job and run records are stored: without what a reader can restore.

A job's spec as validated holds every member with its default (retry,
misfire, concurrency, an HTTP target's method and headers...), and a run
record holds a dozen members that are None until the run gets that far.
Stored as they are, a pending one-off took about 1.1 KB a node and a finished
run about 1.4 KB. So the stores keep jobs and runs *compacted*: a member
equal to its default (same type, same value) is left out, and so are members
that are None, or that are derived from others (a run's execution id). Every
read restores them (`expand`), so no caller ever sees a compacted record.

`expand(compact(r)) == r` for every record (tests/test_compact.py); what is
left out is only a matter of size. A record stored before compaction reads
back unchanged. Both functions are pure and the same on every replica, so
the stored bytes, and the state digests, agree.
"""

from __future__ import annotations

from typing import Any

from raftsched.core import keys

JOBS_TABLE, RUNS_TABLE = "jobs", "runs"

# Spec members and their defaults, as core/jobspec.py fills them in.
_SPEC_DEFAULTS: dict[str, Any] = {
    "retry": {"max_attempts": 3, "backoff": "exponential", "base_s": 1.0, "max_s": 60.0,
              "non_retryable_exit_codes": []},
    "concurrency": {"policy": "allow"},
    "misfire": {"policy": "fire_once", "tolerance_ms": 60_000, "catchup_max": 100},
    "alert": {}, "metadata": {}, "history": {}, "secret_keys": [], "priority": "normal",
    "labels": {},
}
_SCHEDULE_DEFAULTS = {"once": {"offset_min": 0}}
_TARGET_DEFAULTS = {"http": {"method": "POST", "headers": {}, "body": None, "timeout_s": 30.0}}
# Job members that are None until set.
_JOB_NONE = ("idempotency_key", "last_run_id", "next_ms")
# Run and attempt members that are None until the run gets that far.
_RUN_NONE = ("queued_ms", "started_ms", "finished_ms", "holder", "lease_ms", "retry_due_ms",
             "http_status", "exit_code", "error", "reason", "alert", "node", "queue")
_ATTEMPT_NONE = ("finished_ms", "http_status", "exit_code", "error", "output_node",
                 "retry_delay_ms")


class _Default:
    """A default value. A stored member equals it when it is equal and of the
    same types (1 and 1.0 differ: the value restored must be the very one
    stored); a restore gives a fresh copy a caller may change. A default is
    a scalar, or a list or map of scalars and empty lists and maps, so
    equality and the member types decide, and a copy is one level deep."""

    __slots__ = ("value", "names", "types", "nested")

    def __init__(self, value: Any) -> None:
        self.value = value
        members = value.values() if isinstance(value, dict) else \
            value if isinstance(value, list) else ()
        assert all(not isinstance(v, (dict, list)) or not v for v in members), value
        self.names = list(value) if isinstance(value, dict) else None
        self.types = [type(v) for v in members]
        self.nested = [k for k, v in value.items() if isinstance(v, (dict, list))] \
            if isinstance(value, dict) else []

    def fresh(self) -> Any:
        value = self.value
        if isinstance(value, dict):
            copy = dict(value)
            for name in self.nested:
                copy[name] = copy[name].copy()
            return copy
        return value.copy() if isinstance(value, list) else value

    def same(self, value: Any) -> bool:
        # Equality first (in C); the types are compared only when it holds.
        if type(value) is not type(self.value) or value != self.value:
            return False
        if self.names is not None:
            return [type(value[k]) for k in self.names] == self.types
        return [type(v) for v in value] == self.types if self.types else True


def _encoded(defaults: dict) -> dict[str, _Default]:
    return {name: _Default(value) for name, value in defaults.items()}


_SPEC = _encoded(_SPEC_DEFAULTS)
_SCHEDULE = {kind: _encoded(d) for kind, d in _SCHEDULE_DEFAULTS.items()}
_TARGET = {kind: _encoded(d) for kind, d in _TARGET_DEFAULTS.items()}
_NONE: dict[str, _Default] = {}


def _without(member: dict, defaults: dict[str, _Default]) -> dict:
    return {k: v for k, v in member.items() if not (k in defaults and defaults[k].same(v))}


def _with(member: dict, defaults: dict[str, _Default]) -> None:
    for k, default in defaults.items():
        if k not in member:
            member[k] = default.fresh()


def compact_spec(spec: dict) -> dict:
    out = {}
    for name, value in spec.items():
        default = _SPEC.get(name)
        if default is not None and default.same(value):
            continue
        if name == "schedule" and isinstance(value, dict):
            value = _without(value, _SCHEDULE.get(value.get("kind"), _NONE))
        elif name == "target" and isinstance(value, dict):
            value = _without(value, _TARGET.get(value.get("type"), _NONE))
        out[name] = value
    return out


def expand_spec(spec: dict) -> dict:
    _with(spec, _SPEC)
    schedule, target = spec.get("schedule"), spec.get("target")
    if isinstance(schedule, dict):
        _with(schedule, _SCHEDULE.get(schedule.get("kind"), _NONE))
    if isinstance(target, dict):
        _with(target, _TARGET.get(target.get("type"), _NONE))
    return spec


def compact(table: str, value: Any) -> Any:
    """The record as stored."""
    if table == JOBS_TABLE and isinstance(value, dict) and isinstance(value.get("spec"), dict):
        out = _without_none(value, _JOB_NONE)
        out["spec"] = compact_spec(value["spec"])
        return out
    if table == RUNS_TABLE and isinstance(value, dict) and "scheduled_ms" in value:
        out = _without_none(value, _RUN_NONE)
        if out.get("execution_id") == _execution_id(value):
            del out["execution_id"]
        attempts = value.get("attempts")
        if isinstance(attempts, list):
            out["attempts"] = [_without_none(a, _ATTEMPT_NONE) if isinstance(a, dict) else a
                               for a in attempts]
        return out
    return value


def _without_none(record: dict, names: tuple[str, ...]) -> dict:
    return {k: v for k, v in record.items() if not (v is None and k in names)}


def expand(table: str, value: Any) -> Any:
    """The record as read: what `compact` left out, restored. `value` is
    fresh from the decoder, so it is completed in place."""
    if table == JOBS_TABLE and isinstance(value, dict) and isinstance(value.get("spec"), dict):
        for name in _JOB_NONE:
            value.setdefault(name, None)
        expand_spec(value["spec"])
    elif table == RUNS_TABLE and isinstance(value, dict) and "scheduled_ms" in value:
        for name in _RUN_NONE:
            value.setdefault(name, None)
        if "execution_id" not in value:
            value["execution_id"] = _execution_id(value)
        for attempt in value.get("attempts") or ():
            if isinstance(attempt, dict):
                for name in _ATTEMPT_NONE:
                    attempt.setdefault(name, None)
    return value


def _execution_id(run: dict) -> str | None:
    job_id, scheduled_ms = run.get("job_id"), run.get("scheduled_ms")
    if not isinstance(job_id, str) or not isinstance(scheduled_ms, int):
        return None
    return keys.execution_id(job_id, scheduled_ms)
