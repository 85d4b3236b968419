"""How job and run records are stored: without what a reader can restore.

A job's spec as validated holds every member with its default (retry,
misfire, concurrency, an HTTP target's method and headers...), and a run
record holds a dozen members that are None until the run gets that far.
Stored as they are, a pending one-off took about 1.1 KB a node and a finished
run about 1.4 KB. So the stores keep jobs and runs *compacted*: a member
equal to its default (same type, same value) is left out, and so are members
that are None, or that are derived from others (a run's execution id; in the
positional forms below, a job's status "active", update time, one-off next
time and a name made from its target, a run's queue and start times, "normal"
and a lone attempt, a job state's last run, an audit record's runs of job
ids). Every read restores them (`expand`), so no caller ever sees a
compacted record.

Jobs, runs (their attempts too), a job's spec, its `once` schedule and HTTP
target, and due entries' values are then stored *positionally* (`_Form`):
a list of their declared members' values in a fixed order, after a map of
any other members, so a record does not repeat its member names (about half
a pending one-off's job record was names). A record that lacks a member its
form requires is stored as a map, as before.

`expand(compact(r)) == r` for every record (tests/test_compact.py); what is
left out is only a matter of size. A record stored as a map (before
positional forms, or not fitting one) reads back unchanged. Both functions
are pure and the same on every replica, so the stored bytes, and the state
digests, agree.
"""

from __future__ import annotations

import functools
import operator
import re
from typing import Any, Callable

from raftsched.core import codec, jobspec, keys

JOBS_TABLE, RUNS_TABLE, DUE_TABLE = "jobs", "runs", "due"
JOB_STATE_TABLE, AUDIT_TABLE = "job_state", "audit"

# Spec members and their defaults, as core/jobspec.py fills them in today.
# Written out here, not taken from jobspec: they are part of the stored format
# (a member left out reads back as these), so a default jobspec changes for new
# jobs must not change what records already stored read back as. If jobspec's
# default moves, its jobs store the member (bytes, not meaning); changing one
# here needs a form of its own (tests/test_compact.py, records already stored).
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


def _same_test(default: Any, v: str, d: str) -> str:
    """Python source of a test: is the value named `v` the default (named `d`
    in the generated code's namespace)? Equal, and of the same types (1 and
    1.0 differ: the value restored must be the very one stored). A default is
    a scalar, or a list or map of scalars and empty lists and maps, so
    equality and the member types decide: equality in C, then one type test
    per member, with no loop."""
    members = default.values() if isinstance(default, dict) else \
        default if isinstance(default, list) else ()
    assert all(not isinstance(v, (dict, list)) or not v for v in members), default
    assert all(type(x) in _TYPE_NAMES for x in (default, *members)), default
    tests = [f"type({v}) is {_TYPE_NAMES[type(default)]}", f"{v} == {d}"]
    if isinstance(default, dict):
        tests += [f"type({v}[{k!r}]) is {_TYPE_NAMES[type(x)]}" for k, x in default.items()]
    elif isinstance(default, list):
        tests += [f"type({v}[{i}]) is {_TYPE_NAMES[type(x)]}" for i, x in enumerate(default)]
    return " and ".join(tests)


_TYPE_NAMES = {type(None): "NONE", bool: "bool", int: "int", float: "float", str: "str",
               list: "list", dict: "dict"}


def _stripper(defaults: dict[str, Any]) -> Callable[[dict], dict]:
    """A function that copies a map without the members equal to their
    defaults (_same_test), in the map's order. Generated: a create pays it
    for every job."""
    lines = ["def strip(m):", "    out = dict(m)"]
    names: dict[str, Any] = {"NONE": type(None), "MISSING": object()}
    for i, (name, value) in enumerate(defaults.items()):
        names[f"D{i}"] = value
        lines += [f"    v = out.get({name!r}, MISSING)",
                  f"    if {_same_test(value, 'v', f'D{i}')}:",
                  f"        del out[{name!r}]"]
    return _compiled("\n".join(lines + ["    return out"]) + "\n", "strip", **names)


def _literal(value: Any) -> str:
    """`value` as Python source that builds an equal value of the same types
    (a new copy each time it runs). Only what a default may be."""
    if value is None or type(value) in (bool, int, str):
        return repr(value)
    if type(value) is float:
        assert value == value and value not in (float("inf"), float("-inf")), value
        return repr(value)
    if type(value) is list:
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    if type(value) is dict:
        assert all(type(k) is str for k in value), value
        return "{" + ", ".join(f"{k!r}: {_literal(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no literal for a default of type {type(value).__name__}")


def _compiled(source: str, name: str, **names: Any) -> Any:
    namespace: dict[str, Any] = dict(names)
    exec(source, namespace)   # source built here from declared names and literals only
    return namespace[name]


def _filler(defaults: dict[str, Any]) -> Callable[[dict], None]:
    """A function that adds to a map each member of `defaults` it lacks, as
    a fresh copy a caller may change. Generated, so that a restore is a few
    literal builds rather than a copy per member (a read of every job pays it)."""
    lines = ["def fill(m):"] + [f"    if {name!r} not in m: m[{name!r}] = {_literal(value)}"
                                for name, value in defaults.items()]
    return _compiled("\n".join(lines or ["    pass"]) + "\n    return m\n", "fill")


_FILL_SPEC = _filler(_SPEC_DEFAULTS)
_FILL_SCHEDULE = {kind: _filler(d) for kind, d in _SCHEDULE_DEFAULTS.items()}
_FILL_TARGET = {kind: _filler(d) for kind, d in _TARGET_DEFAULTS.items()}


_STRIP_SPEC = _stripper(_SPEC_DEFAULTS)
_STRIP_SCHEDULE = {kind: _stripper(d) for kind, d in _SCHEDULE_DEFAULTS.items()}
_STRIP_TARGET = {kind: _stripper(d) for kind, d in _TARGET_DEFAULTS.items()}


def compact_spec(spec: dict) -> dict:
    out = _STRIP_SPEC(spec)
    schedule, target = out.get("schedule"), out.get("target")
    if isinstance(schedule, dict):
        strip = _STRIP_SCHEDULE.get(schedule.get("kind"))
        out["schedule"] = strip(schedule) if strip is not None else dict(schedule)
    if isinstance(target, dict):
        strip = _STRIP_TARGET.get(target.get("type"))
        out["target"] = strip(target) if strip is not None else dict(target)
    return out


def expand_spec(spec: dict) -> dict:
    _FILL_SPEC(spec)
    schedule, target = spec.get("schedule"), spec.get("target")
    if isinstance(schedule, dict):
        fill = _FILL_SCHEDULE.get(schedule.get("kind"))
        if fill is not None:
            fill(schedule)
    if isinstance(target, dict):
        fill = _FILL_TARGET.get(target.get("type"))
        if fill is not None:
            fill(target)
    return spec


class _Form:
    """A record stored as a list, [others, v1, v2, ...]: the values of the
    declared `fields` in order, trailing None values left out, after a map of
    the record's other members by name (None when it has none).
    `optional` fields may be absent from a record and read back as None (as
    the map form restores them); a record without a required field has no
    positional form (`pack` answers None)."""

    __slots__ = ("fields", "names", "required", "unpack", "_values", "_last_whole")

    def __init__(self, fields: tuple[str, ...], optional: tuple[str, ...] = ()) -> None:
        assert set(optional) <= set(fields), (fields, optional)
        assert all(f.isidentifier() for f in fields) and len(fields) > 1, fields
        self.fields = fields
        self.names = frozenset(fields)
        self.required = self.names - set(optional)
        self.unpack: Callable[[list], dict] = self._unpacker(fields)
        # The declared members' values of a record that has each of them, in
        # order, as a tuple (in C; more than one field, so always a tuple).
        self._values = operator.itemgetter(*fields)
        # (members, others by name) of the last record packed with each
        # declared member and others (an armed run's `armed_ms`): a record
        # with the same members is packed without working them out again.
        # One attribute, replaced whole, so that a reader on another thread
        # sees a matching pair.
        self._last_whole: tuple[frozenset[str] | None, tuple[str, ...]] = (None, ())

    @staticmethod
    def _unpacker(fields: tuple[str, ...]) -> Callable[[list], dict]:
        """unpack(stored) -> the record: the stored list read into a new map
        (values left out at the end read as None), then its other members.
        Generated: one map built from a literal with the names as constants."""
        n = len(fields) + 1
        members = ", ".join(f"{name!r}: s[{i}]" for i, name in enumerate(fields, 1))
        return _compiled(
            f"def unpack(s):\n"
            f"    if len(s) < {n}:\n"
            f"        s = s + [None] * ({n} - len(s))\n"
            f"    r = {{{members}}}\n"
            f"    if s[0]:\n"
            f"        r.update(s[0])\n"
            f"    return r\n", "unpack")

    def pack(self, record: dict) -> list | None:
        keys = record.keys()
        if keys == self.names:   # each declared member and no other: most records
            stored = [None, *self._values(record)]
        elif keys == (last := self._last_whole)[0]:   # each, and the others last seen
            stored = [{k: record[k] for k in last[1]}, *self._values(record)]
        else:
            whole = keys >= self.names   # (an armed run: each declared member, and more)
            if not whole and not self.required <= keys:
                return None
            if keys <= self.names:
                first = None
            else:
                others = keys - self.names
                if not all(type(k) is str for k in others):
                    return None   # a map keeps them: only names sort alike everywhere
                # By name: a set's own order would differ between processes
                # (string hashing), and with it the stored bytes.
                first = {k: record[k] for k in sorted(others)}
                if whole:
                    self._last_whole = (frozenset(keys), tuple(first))
            stored = [first,
                      *(self._values(record) if whole else map(record.get, self.fields))]
        while stored[-1] is None and len(stored) > 1:
            stored.pop()
        return stored

    def position(self, name: str) -> int:
        """Where `name`'s value is in the stored list."""
        return 1 + self.fields.index(name)


# Rarely-None members first, so the trailing None ones cost nothing.
_JOB = _Form(("v", "id", "tenant", "spec", "status", "version", "shard", "created_ms",
              "updated_ms", "next_ms", "last_run_id", "idempotency_key"), optional=_JOB_NONE)
_SPEC_FORM = _Form(("name", "schedule", "target"))
_ONCE = _Form(("kind", "run_at_ms"))          # the one schedule kind with a positional form
_HTTP = _Form(("type", "url"))                # the one target type with a positional form
_RUN = _Form(("v", "id", "job_id", "tenant", "scheduled_ms", "attempt", "state", "trigger",
              "token", "created_ms", "shard", "priority", "attempts", "execution_id", "node",
              "queued_ms", "started_ms", "finished_ms", "holder", "queue", "lease_ms",
              "retry_due_ms", "http_status", "exit_code", "error", "reason", "alert"),
             optional=_RUN_NONE)
_ATTEMPT = _Form(("attempt", "holder", "started_ms", "finished_ms", "http_status", "exit_code",
                  "error", "output_node", "retry_delay_ms"), optional=_ATTEMPT_NONE)
_DUE = _Form(("v", "tn", "p"))
_AUDIT = _Form(("v", "seq", "at_ms", "actor", "action", "tenant", "subject", "detail"))
# The state a fire leaves a job with; a state without one of them (a job not
# fired yet, say) is stored as a map.
_JOB_STATE = _Form(("v", "status", "updated_ms", "runs_count", "next_ms", "last_run_id",
                    "active"))
_EXECUTION_AT, _ATTEMPTS_AT = _RUN.position("execution_id"), _RUN.position("attempts")
_QUEUED_AT, _STARTED_AT = _RUN.position("queued_ms"), _RUN.position("started_ms")
_PRIORITY_AT = _RUN.position("priority")
_LAST_RUN_AT = _JOB_STATE.position("last_run_id")
_SPEC_AT = _JOB.position("spec")
_STATUS_AT, _UPDATED_AT = _JOB.position("status"), _JOB.position("updated_ms")
_NEXT_AT = _JOB.position("next_ms")
_NAME_AT = _SPEC_FORM.position("name")
_SCHEDULE_AT, _TARGET_AT = _SPEC_FORM.position("schedule"), _SPEC_FORM.position("target")
_JOB_ID_AT, _RUN_ID_AT = _JOB.position("id"), _RUN.position("id")
_TENANT_AT, _SHARD_AT = _JOB.position("tenant"), _JOB.position("shard")
_JOB_LAST_RUN_AT = _JOB.position("last_run_id")
_RUN_JOB_AT, _RUN_SCHEDULED_AT = _RUN.position("job_id"), _RUN.position("scheduled_ms")
_STATE_AT, _HOLDER_AT, _NODE_AT = (_RUN.position(name) for name in ("state", "holder", "node"))
_ATTEMPT_AT, _CREATED_AT = _RUN.position("attempt"), _RUN.position("created_ms")
RUN_SHARD_AT = _RUN.position("shard")
_FINISHED_AT = _RUN.position("finished_ms")
_HTTP_STATUS_AT, _EXIT_CODE_AT, _ERROR_AT = (_RUN.position(name) for name in
                                             ("http_status", "exit_code", "error"))
# A run held from its fire has none of these (finished_held).
_UNHELD_AT = tuple(_RUN.position(name) for name in ("queue", "lease_ms", "retry_due_ms",
                                                    "finished_ms"))


def compact(table: str, value: Any, key: bytes | None = None) -> Any:
    """The record as stored under `key`."""
    if not isinstance(value, dict):
        return value
    if table == JOBS_TABLE and isinstance(value.get("spec"), dict):
        whole = value["spec"]
        spec = _written_spec(whole) if type(whole) is StoredSpec else \
            _stored_spec(compact_spec(whole), _named_by_default(whole))
        formed = _JOB.pack(value) if _job_members_derivable(value) else None
        if formed is not None and _id_stored(value, key, formed, _JOB_ID_AT):
            formed[_SPEC_AT] = spec
            _derive_job_members(value, formed)
            return formed
        out = _without_none(value, _JOB_NONE)
        out["spec"] = spec
        return out
    if table == RUNS_TABLE and "scheduled_ms" in value:
        formed = _stored_run(value)
        # (A job id of None could not be told apart from one left out.)
        if formed is not None and value["job_id"] is not None \
                and _id_stored(value, key, formed, _RUN_ID_AT):
            if formed[_RUN_ID_AT] is None and \
                    keys.names_occurrence(value["id"], value["job_id"], value["scheduled_ms"]):
                # Its id names its job and occurrence (keys.run_id): both go.
                formed[_RUN_JOB_AT] = formed[_RUN_SCHEDULED_AT] = None
            return formed
        out = _without_none(value, _RUN_NONE)
        if "execution_id" in out and out["execution_id"] == _execution_id(value):
            del out["execution_id"]
        attempts = value.get("attempts")
        if isinstance(attempts, list):
            out["attempts"] = [_stored_attempt(a) for a in attempts]
        return out
    if table == DUE_TABLE:
        return _DUE.pack(value) or value
    if table == JOB_STATE_TABLE:
        stored = _JOB_STATE.pack(value)
        if stored is None or type(value["last_run_id"]) is int:
            return value   # (an int in the form is a time: see below)
        at_ms = _occurrence_of(value["last_run_id"], _key_text(key))
        if at_ms is not None:
            stored[_LAST_RUN_AT] = at_ms   # an int: the time of the job's run
        return stored
    if table == AUDIT_TABLE:
        return _stored_audit(value) or value
    return value


def _id_stored(record: dict, key: bytes | None, stored: list, at: int) -> bool:
    """Leave the record's id out of its positional form (None) when it is the
    key it is stored under; say whether the form can stand (an id of None
    could not be told apart from one left out)."""
    record_id = record.get("id")
    if record_id is None:
        return False
    if key is not None and type(record_id) is str and record_id.encode() == key:
        stored[at] = None
    return True


def _stored_spec(spec: dict, named_by_default: bool) -> dict | list:
    """A compacted spec (a new map), its schedule and target positional where
    they have a form; in that form, a name made from the target (the name of
    a job created without one) is left out (None) and made again on read."""
    schedule, target = spec.get("schedule"), spec.get("target")
    if isinstance(schedule, dict) and schedule.get("kind") == "once":
        spec["schedule"] = _ONCE.pack(schedule) or schedule
    if isinstance(target, dict) and target.get("type") == "http":
        spec["target"] = _HTTP.pack(target) or target
    if spec.get("name") is None:
        return spec   # None in the form would read back as a name made from the target
    stored = _SPEC_FORM.pack(spec)
    if stored is None:
        return spec
    if named_by_default:
        stored[_NAME_AT] = None
    return stored


def stored_spec(spec: dict) -> dict | list:
    """The form the stores keep a job's whole spec in (as `compact` writes
    it): what a create_jobs_stored entry carries."""
    return _stored_spec(compact_spec(spec), _named_by_default(spec))


def spec_of_stored(stored: Any) -> tuple[Any, bool]:
    """(the spec map a stored form holds, without its defaults; whether its
    name is the one made from its HTTP target). Reads every form `stored_spec`
    makes, and any other value as it is. `stored` itself is left as it is:
    the map answered is a new one where a member had to be read into a map
    (restore_spec then completes only those new maps)."""
    fresh = isinstance(stored, list)
    if fresh:
        stored = _SPEC_FORM.unpack(stored)
    elif not isinstance(stored, dict):
        return stored, False
    default_named = fresh and stored["name"] is None
    schedule, target = stored.get("schedule"), stored.get("target")
    if isinstance(schedule, list) or isinstance(target, list):
        if not fresh:
            stored = dict(stored)
        if isinstance(schedule, list):
            stored["schedule"] = _ONCE.unpack(schedule)
        if isinstance(target, list):
            stored["target"] = _HTTP.unpack(target)
    return stored, default_named


def stored_spec_fits(stored: Any) -> bool:
    """Whether a spec's stored form (a proposer's) has no more than its forms
    hold: a positional spec, schedule or target no longer than its form,
    its first member a map or None. What a read would skip (a member past
    the form's end) is refused rather than stored unchecked."""
    if isinstance(stored, list):
        if not _fits(_SPEC_FORM, stored):
            return False
        size = len(stored)
        schedule = stored[_SCHEDULE_AT] if _SCHEDULE_AT < size else None
        target = stored[_TARGET_AT] if _TARGET_AT < size else None
    elif isinstance(stored, dict):
        schedule, target = stored.get("schedule"), stored.get("target")
    else:
        return True   # (no form: the shape check refuses what it is)
    return (not isinstance(schedule, list) or _fits(_ONCE, schedule)) \
        and (not isinstance(target, list) or _fits(_HTTP, target))


def _fits(form: _Form, stored: list) -> bool:
    return 1 <= len(stored) <= 1 + len(form.fields) \
        and (stored[0] is None or type(stored[0]) is dict)


def restore_spec(spec: dict, default_named: bool) -> dict:
    """A spec map of spec_of_stored made whole again, in place: its defaults
    and its name made from its HTTP target."""
    expand_spec(spec)
    if default_named:
        spec["name"] = _default_name(spec["target"]["method"], spec["target"]["url"])
    return spec


class StoredSpec(dict):
    """A job's whole spec, as apply reads it, that also holds the form the
    stores keep it in (`stored`), as a create_jobs_stored entry carried it:
    `compact` writes that form as it is rather than working it out again.
    Whatever reads the spec back from a store gets this very map (see
    CHECK_STORED_SPEC); a copy is a plain map again."""

    __slots__ = ("stored",)


# Whether compact checks that each StoredSpec's stored form reads back as the
# spec apply used (restored from that form, and changed by nothing since):
# the test suite turns it on (tests/conftest.py); a node does not pay it.
CHECK_STORED_SPEC = False


def _written_spec(spec: StoredSpec) -> Any:
    stored = spec.stored
    if CHECK_STORED_SPEC:
        again, default_named = spec_of_stored(codec.unpack_record(codec.pack(stored)))
        if not isinstance(again, dict) or restore_spec(again, default_named) != spec:
            raise AssertionError(f"a spec changed since it was read from its stored form: "
                                 f"{dict(spec)!r}")
    return stored


def _named_by_default(spec: dict) -> bool:
    """Whether `spec` (whole, as validated) is named as jobspec names a job
    created without a name, from its HTTP target."""
    target, name = spec.get("target"), spec.get("name")
    if type(name) is not str or not isinstance(target, dict) or target.get("type") != "http" \
            or type(target.get("method")) is not str or type(target.get("url")) is not str:
        return False
    try:
        return name == _default_name(target["method"], target["url"])
    except ValueError:   # a URL urlsplit refuses: stored as it is
        return False


def default_http_name(target: dict) -> str:
    """The name a read makes for a job with this HTTP target (as stored,
    its defaults left out) and no name of its own; ValueError for a URL
    it cannot be made from."""
    method = target["method"] if "method" in target else _HTTP_METHOD_DEFAULT
    return _default_name(method, target["url"])


_HTTP_METHOD_DEFAULT = _TARGET_DEFAULTS["http"]["method"]


@functools.lru_cache(maxsize=4096)
def _default_name(method: str, url: str) -> str:
    """The name jobspec gives a job with this HTTP target and no name. A
    stored record depends on it: tests/test_compact.py pins its answers."""
    return jobspec.default_name({"type": "http", "method": method, "url": url})


def _job_members_derivable(job: dict) -> bool:
    """Whether the positional form can mark the members _derive_job_members
    leaves out: a status and an update time that are never None there (None
    marks "active" and "when created"), and a next due time that is no bool
    (False marks "the one-off's own time")."""
    return job.get("status") is not None and job.get("updated_ms") is not None \
        and type(job.get("next_ms")) is not bool


def _derive_job_members(job: dict, stored: list) -> None:
    """Leave out of a job's positional form what its other members say:
    status "active" (the status of nearly every job), an update time equal
    to its creation time (a job never changed), and a next due time equal to
    its one-off schedule's time (a pending one-off)."""
    if job["status"] == "active" and type(job["status"]) is str:
        stored[_STATUS_AT] = None
    if job["updated_ms"] == job.get("created_ms") and type(job["updated_ms"]) is int \
            and type(job.get("created_ms")) is int:
        stored[_UPDATED_AT] = None
    next_ms, schedule = job.get("next_ms"), job["spec"].get("schedule")
    if type(next_ms) is int and isinstance(schedule, dict) and schedule.get("kind") == "once" \
            and type(schedule.get("run_at_ms")) is int and schedule["run_at_ms"] == next_ms:
        stored[_NEXT_AT] = False


def pending_without_history(raw: bytes) -> bool:
    """Whether a job record as stored (read with no state record beside it)
    is of an active job that has never had a run: its positional form marks
    "active" (None in the status place: _derive_job_members) and holds no
    `runs_count` among its other members (runs.create_run sets it at a
    job's first run, and it stays). Decoded, not expanded: what a reader
    that wants nothing of such a job (the purger) can skip it by. False when
    in doubt (a map form, any other status, a count of 0)."""
    stored = codec.unpack_record(raw)
    if type(stored) is not list or len(stored) <= _STATUS_AT or stored[_STATUS_AT] is not None:
        return False
    others = stored[0]
    return others is None or (type(others) is dict and "runs_count" not in others)


# Spec members that change nothing about a one-off's fire (pending_once_facts).
_FIRE_IRRELEVANT = frozenset(("retry", "alert", "metadata", "history", "secret_keys", "labels"))


def _once_spec_run_at(spec: Any) -> int | None:
    """The run_at_ms of a spec as stored whose one-off fires as every
    default says (pending_once_facts), else None."""
    if type(spec) is not list or len(spec) != 1 + len(_SPEC_FORM.fields):
        return None
    others, schedule, target = spec[0], spec[_SCHEDULE_AT], spec[_TARGET_AT]
    if others is not None and (type(others) is not dict or not others.keys() <= _FIRE_IRRELEVANT):
        return None
    if type(schedule) is not list or len(schedule) != 3 or schedule[0] is not None \
            or schedule[1] != "once" or type(schedule[2]) is not int:
        return None
    if type(target) is not list or len(target) < 2 or target[1] != "http":
        return None
    return schedule[2]


class LeanSpec:
    """A create's spec left in the form the entry carried it (the form the
    stores keep): a one-off that pending_once_facts would read from its
    record, whose create reads nothing more of its spec than its time
    (core/apply.py _create_lean). `whole()` is the spec made whole, as a
    create of any other spec has it."""

    __slots__ = ("stored", "run_at_ms", "default_named")

    def __init__(self, stored: list, run_at_ms: int, default_named: bool) -> None:
        self.stored, self.run_at_ms, self.default_named = stored, run_at_ms, default_named

    def whole(self) -> "StoredSpec":
        return whole_stored_spec(spec_of_stored(self.stored)[0], self.stored,
                                 self.default_named)


def whole_stored_spec(spec: dict, stored: Any, default_named: bool) -> "StoredSpec":
    """The spec map spec_of_stored read from `stored`, made whole
    (restore_spec) as a StoredSpec that keeps `stored`, the form it is
    written in. ValueError for a name left to a URL that cannot make one."""
    whole = StoredSpec(spec)
    whole.stored = stored
    return restore_spec(whole, default_named)


def lean_spec(stored: Any, default_named: bool) -> LeanSpec | None:
    """A create's spec as stored (checked whole already), kept as it is when
    its create and its fire read nothing of it but its time: see LeanSpec."""
    run_at_ms = _once_spec_run_at(stored)
    return None if run_at_ms is None else LeanSpec(stored, run_at_ms, default_named)


def check_as_compacted(what: str, table: str, record: dict, key: bytes, stored: Any) -> None:
    """Raise AssertionError unless `stored`, a record written in its stored
    form by a shortcut (`what`), packs to the same bytes as `compact` of the
    record read whole: how the test suite holds each shortcut to the whole
    path (the CHECK_ switches it turns on in tests/conftest.py)."""
    whole = compact(table, record, key)
    if codec.pack(whole) != codec.pack(stored):
        raise AssertionError(f"{what}: {stored!r}, compact: {whole!r}")


def created_pending_once(spec: LeanSpec, version: int, job_id: str, key: bytes, tenant: str,
                         shard: int, next_ms: int | None, at_ms: int,
                         idempotency_key: str | None) -> list:
    """The positional form `compact` writes for the job a create makes, active
    and never changed, whose spec is `spec`: built as _JOB.pack, _id_stored
    and _derive_job_members build it from the whole job (tests/test_create_lean.py
    holds the two to the same bytes)."""
    stored = [None, version, job_id, tenant, spec.stored, "active", 1, shard, at_ms, at_ms,
              next_ms, None, idempotency_key]
    while stored[-1] is None:
        stored.pop()
    if job_id.encode() == key:
        stored[_JOB_ID_AT] = None
    stored[_STATUS_AT] = stored[_UPDATED_AT] = None
    if type(next_ms) is int and next_ms == spec.run_at_ms:
        stored[_NEXT_AT] = False
    if CHECK_STORED_SPEC:   # (the test suite: as `compact` writes the whole job)
        check_as_compacted("created_pending_once", JOBS_TABLE, {
            "v": version, "id": job_id, "tenant": tenant, "spec": spec.whole(),
            "status": "active", "version": 1, "shard": shard, "next_ms": next_ms,
            "created_ms": at_ms, "updated_ms": at_ms, "idempotency_key": idempotency_key,
            "last_run_id": None}, key, stored)
    return stored


class CreatedJob:
    """The job a lean create made, as apply answers it (core/apply.py
    _create_lean): its record as stored, its id and next due time. `whole()`
    reads it as any reader does; the answer compares equal to that job. Its
    schedule is a one-off in UTC (LeanSpec)."""

    __slots__ = ("stored", "key", "job_id", "next_ms")

    def __init__(self, stored: list, key: bytes, job_id: str, next_ms: int | None) -> None:
        self.stored, self.key, self.job_id, self.next_ms = stored, key, job_id, next_ms

    def whole(self) -> dict:
        return expand(JOBS_TABLE, codec.unpack_record(codec.pack(self.stored)), self.key)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, CreatedJob):
            other = other.whole()
        return self.whole() == other

    __hash__ = None   # type: ignore[assignment]


def created_job(job: "dict | CreatedJob") -> dict:
    """A create's answered job, whole."""
    return job.whole() if isinstance(job, CreatedJob) else job


def pending_once_facts(stored: Any) -> tuple[str, int, int] | None:
    """(tenant, shard, run_at_ms) of a job record as stored (decoded, not
    restored, with no state record beside it) that is an active one-off
    never fired, due at its own time, whose fire its spec does not change:
    an HTTP target, every member a fire reads at its default (concurrency
    allow, the default misfire policy, priority normal, no jitter, no DAG,
    no offset), and of the others none but _FIRE_IRRELEVANT. What a fire
    of such a job needs of it (core/apply.py _fire_pending_once), read from
    the places `compact` keeps them, without restoring the job and its spec.
    None for any other record (read it whole)."""
    if type(stored) is not list or len(stored) <= _NEXT_AT or stored[0] is not None \
            or stored[_STATUS_AT] is not None or stored[_NEXT_AT] is not False \
            or stored[_JOB_ID_AT] is not None \
            or (len(stored) > _JOB_LAST_RUN_AT and stored[_JOB_LAST_RUN_AT] is not None):
        return None
    tenant, shard = stored[_TENANT_AT], stored[_SHARD_AT]
    if type(tenant) is not str or type(shard) is not int:
        return None
    run_at_ms = _once_spec_run_at(stored[_SPEC_AT])
    return None if run_at_ms is None else (tenant, shard, run_at_ms)


# Whether held_run_stored checks its form against `compact` of the run it
# stands for: the test suite turns it on (tests/conftest.py); a node does not
# pay it.
CHECK_HELD_RUN = False


def held_run_stored(run: dict, key: bytes) -> list:
    """The positional form `compact` writes under `key` for `run`, the run of
    a pending one-off's occurrence as its fire creates it (runs.create_held):
    its ids, its job and time left to its key, its execution id derived,
    queued and started as created, priority normal, its one attempt the
    run's own members (_derive_run_members), and `armed_ms` its only other
    member, if any."""
    others = {"armed_ms": run["armed_ms"]} if "armed_ms" in run else None
    stored = [others, run["v"], None, None, run["tenant"], None, 1, run["state"], run["trigger"],
              run["token"], run["created_ms"], run["shard"], _PRIORITY_NORMAL, _ONE_ATTEMPT, None,
              run["node"], _AS_CREATED, _AS_CREATED, None, run["holder"]]
    if CHECK_HELD_RUN:
        check_as_compacted("held_run_stored", RUNS_TABLE, run, key, stored)
    return stored


_ACTIVE_AT = _JOB_STATE.position("active")
# Whether state_settled checks each state it makes against what `compact`
# writes for the state read whole and settled: the test suite turns it on
# (tests/conftest.py); a node does not pay it.
CHECK_SETTLED_STATE = False


def state_settled(stored: Any, key: bytes, run_id: str) -> list | None:
    """A job's state record as stored (decoded, not restored) with `run_id`
    out of its open runs, as runs.settle leaves it when no run of the job
    waits (the queue policy's): the positional form `compact` writes for
    that state. None, for settle to be run on the state read whole, where
    the record has no positional form, some run waits, or `run_id` is not
    among its open runs."""
    if type(stored) is not list or len(stored) <= _ACTIVE_AT:
        return None
    others, active = stored[0], stored[_ACTIVE_AT]
    if (others is not None and (type(others) is not dict or "waiting" in others)) \
            or type(active) is not list or run_id not in active:
        return None
    settled = list(stored)
    settled[_ACTIVE_AT] = active = list(active)
    active.remove(run_id)
    if CHECK_SETTLED_STATE:
        state = expand(JOB_STATE_TABLE, codec.unpack_record(codec.pack(stored)), key)
        state["active"].remove(run_id)
        check_as_compacted("state_settled", JOB_STATE_TABLE, state, key, settled)
    return settled


def fired_once_state(run_id: str, due_ms: int, at_ms: int) -> list:
    """The positional form `compact` writes, under the job's key, for the
    state a pending one-off's fire leaves it with when its run is created
    held (apply._fire_pending_once): completed at `at_ms`, no next time, one
    run, that run its last (its time, as `compact` keeps a job's own run)
    and open."""
    return [None, 1, "completed", at_ms, 1, None, due_ms, [run_id]]


# Other members a run held from its fire may have that change nothing about
# its success (finished_held).
_HELD_OTHERS = frozenset(("armed_ms", "jitter_ms"))


def finished_held(stored: Any, key: bytes, holder: str, attempt: int, at_ms: int,
                  called_ms: int | None, summary: tuple[Any, Any, Any, Any]) -> list | None:
    """The positional form `compact` writes for a run, stored as `stored`
    (decoded, not restored), whose attempt `attempt` held by `holder` from
    its fire succeeded at `at_ms` (runs.finish), its call begun at
    `called_ms`; `summary`: the attempt's (http_status, exit_code, error,
    output_node). Only for a run a node executes, with one attempt that
    repeats the run's own members, no lease, its ids derived from its key,
    and no other member but _HELD_OTHERS: None for any other (read it whole).
    The form is patched where `compact` keeps each member, so that a
    success is written without restoring the run (tests/test_finish_held.py
    holds it to the whole read's)."""
    if type(stored) is not list or len(stored) <= _HOLDER_AT or stored[_ATTEMPTS_AT] != 0 \
            or type(stored[_ATTEMPTS_AT]) is not int or stored[_RUN_ID_AT] is not None \
            or stored[_RUN_JOB_AT] is not None or stored[_STATE_AT] != "running" \
            or stored[_HOLDER_AT] != holder or stored[_NODE_AT] != holder \
            or stored[_ATTEMPT_AT] != attempt or type(stored[_ATTEMPT_AT]) is not int:
        return None
    others = stored[0]
    if others is not None and (type(others) is not dict or not others.keys() <= _HELD_OTHERS):
        return None
    patched = stored + [None] * (1 + len(_RUN.fields) - len(stored))
    if any(patched[at] is not None for at in _UNHELD_AT):
        return None
    created, started = patched[_CREATED_AT], patched[_STARTED_AT]
    if type(created) is not int or (started is not _AS_CREATED and type(started) is not int) \
            or type(patched[RUN_SHARD_AT]) is not int:
        return None
    if called_ms is not None:
        patched[_STARTED_AT] = _AS_CREATED if called_ms == created else called_ms
    http_status, exit_code, error, output_node = summary
    patched[_STATE_AT] = "succeeded"
    patched[_FINISHED_AT] = at_ms
    patched[_HOLDER_AT] = None
    patched[_HTTP_STATUS_AT], patched[_EXIT_CODE_AT], patched[_ERROR_AT] = \
        http_status, exit_code, error
    if output_node is not None:   # no longer a lone attempt: stored as itself
        started_ms = patched[_STARTED_AT]
        patched[_ATTEMPTS_AT] = [_stored_attempt({
            "attempt": attempt, "holder": holder,
            "started_ms": created if started_ms is _AS_CREATED else started_ms,
            "finished_ms": at_ms, "http_status": http_status, "exit_code": exit_code,
            "error": error, "output_node": output_node, "retry_delay_ms": None})]
    while patched[-1] is None and len(patched) > 1:
        patched.pop()
    return patched


def _stored_run(run: dict) -> list | None:
    """A run's positional form: its execution id left out (None) when it is
    the one its job and occurrence give (keys.execution_id)."""
    execution_id = run.get("execution_id")
    derived = _execution_id(run)
    if execution_id is None and derived is not None:
        return None   # None could not be told apart from "derived"
    stored = _RUN.pack(run) if _run_members_derivable(run) else None
    if stored is None:
        return None
    if execution_id == derived and _EXECUTION_AT < len(stored):
        stored[_EXECUTION_AT] = None
    _derive_run_members(run, stored)
    attempts = run["attempts"]
    if attempts and type(stored[_ATTEMPTS_AT]) is not int:   # (_ONE_ATTEMPT)
        stored[_ATTEMPTS_AT] = [_stored_attempt(a) for a in attempts] \
            if isinstance(attempts, list) else attempts
    return stored


# Marks in a run's positional form for what its other members say; a member
# whose value is itself a bool keeps the map form (_run_members_derivable).
_AS_CREATED = False      # queued_ms or started_ms: the run's created_ms
_PRIORITY_NORMAL = False  # priority: "normal", every run's but a prioritised job's
_ONE_ATTEMPT = 0          # attempts: one, as the run's own members say it (_lone_attempt)


def _run_members_derivable(run: dict) -> bool:
    get = run.get
    return type(get("queued_ms")) is not bool and type(get("started_ms")) is not bool \
        and type(get("priority")) is not bool and type(get("attempts")) is not int


def _derive_run_members(run: dict, stored: list) -> None:
    """Leave out of a run's positional form what its other members say: a
    queue and a start time equal to its creation time (a run the shard's
    owner holds from its fire), the priority "normal", and a lone attempt
    that repeats the run's own members."""
    created = run.get("created_ms")
    if type(created) is int:
        for name, at in (("queued_ms", _QUEUED_AT), ("started_ms", _STARTED_AT)):
            if run.get(name) == created and type(run.get(name)) is int and at < len(stored):
                stored[at] = _AS_CREATED
    if run.get("priority") == "normal" and type(run["priority"]) is str:
        stored[_PRIORITY_AT] = _PRIORITY_NORMAL
    attempts = run.get("attempts")
    if type(attempts) is list and len(attempts) == 1 and _is_lone_attempt(attempts[0], run):
        stored[_ATTEMPTS_AT] = _ONE_ATTEMPT


# A lone attempt's members and the run's members they repeat, in that order;
# its other members (output_node, retry_delay_ms) are None.
_LONE_NAMES = ("attempt", "holder", "started_ms", "finished_ms", "http_status", "exit_code",
               "error")
_LONE_RUN_NAMES = ("attempt", "node", "started_ms", "finished_ms", "http_status", "exit_code",
                   "error")
_LONE_KEYS = frozenset(_LONE_NAMES + ("output_node", "retry_delay_ms"))


def _lone_builder() -> Callable[[dict], dict]:
    """_lone_attempt: one map literal, from the run's members. Generated: a
    read of every run called once pays it."""
    members = ", ".join(f"{mine!r}: get({theirs!r})"
                        for mine, theirs in zip(_LONE_NAMES, _LONE_RUN_NAMES))
    return _compiled(f"def lone(run):\n    get = run.get\n"
                     f"    return {{{members}, 'output_node': None, 'retry_delay_ms': None}}\n",
                     "lone")


_lone_attempt = _lone_builder()
_lone_attempt.__doc__ = "The attempt a run that was called once by its node holds (runs.finish)."


def _lone_test() -> Callable[[Any, dict], bool]:
    """is_lone(attempt, run): whether `attempt` is _lone_attempt(run), member
    for member and type for type (1 is not 1.0 or True). Generated: a run's
    every write pays it."""
    lines = ["def is_lone(a, run):",
             "    if type(a) is not dict or a.keys() != KEYS or a['output_node'] is not None \\",
             "            or a['retry_delay_ms'] is not None:",
             "        return False",
             "    get = run.get"]
    for mine, theirs in zip(_LONE_NAMES, _LONE_RUN_NAMES):
        lines += [f"    x, y = a[{mine!r}], get({theirs!r})",
                  "    if x != y or type(x) is not type(y):",
                  "        return False"]
    return _compiled("\n".join(lines + ["    return True"]) + "\n", "is_lone", KEYS=_LONE_KEYS)


_is_lone_attempt = _lone_test()


def _read_run_members(run: dict) -> None:
    created = run["created_ms"]
    if run["queued_ms"] is _AS_CREATED:
        run["queued_ms"] = created
    if run["started_ms"] is _AS_CREATED:
        run["started_ms"] = created
    if run["priority"] is _PRIORITY_NORMAL:
        run["priority"] = "normal"
    if type(run["attempts"]) is int and run["attempts"] == _ONE_ATTEMPT:
        run["attempts"] = [_lone_attempt(run)]


def _stored_attempt(attempt: Any) -> Any:
    if not isinstance(attempt, dict):
        return attempt
    return _ATTEMPT.pack(attempt) or _without_none(attempt, _ATTEMPT_NONE)


def _without_none(record: dict, names: tuple[str, ...]) -> dict:
    return {k: v for k, v in record.items() if not (v is None and k in names)}


def expand(table: str, value: Any, key: bytes | None = None) -> Any:
    """The record as read from under `key`: what `compact` left out,
    restored. `value` is fresh from the decoder, so it is completed in place
    (a positional one is read into a new map)."""
    if table == JOBS_TABLE:
        positional = isinstance(value, list)
        if positional:
            value = _JOB.unpack(value)
            if value["id"] is None:
                value["id"] = _key_id(key)
            if value["status"] is None:
                value["status"] = "active"
            if value["updated_ms"] is None:
                value["updated_ms"] = value["created_ms"]
        elif not isinstance(value, dict):
            return value
        spec, default_named = spec_of_stored(value.get("spec"))
        if not isinstance(spec, dict):
            return value
        value["spec"] = spec
        for name in _JOB_NONE:
            value.setdefault(name, None)
        restore_spec(spec, default_named)
        if positional and value["next_ms"] is False:
            value["next_ms"] = spec["schedule"]["run_at_ms"]
    elif table == RUNS_TABLE:
        if isinstance(value, list):   # every member of the form is there
            return _read_run(value, key)
        if not isinstance(value, dict) or "scheduled_ms" not in value:
            return value
        for name in _RUN_NONE:
            value.setdefault(name, None)
        if "execution_id" not in value:
            value["execution_id"] = _execution_id(value)
        attempts = value.get("attempts")
        if attempts:
            value["attempts"] = [_read_attempt(a) for a in attempts]
    elif table == DUE_TABLE and isinstance(value, list):
        value = _DUE.unpack(value)
    elif table == JOB_STATE_TABLE and isinstance(value, list):
        value = _JOB_STATE.unpack(value)
        if type(value["last_run_id"]) is int:
            value["last_run_id"] = keys.run_id(_key_id(key), value["last_run_id"])
    elif table == AUDIT_TABLE and isinstance(value, list):
        value = _read_audit(value)
    return value


_HOLD_AT = tuple(_RUN.position(name) for name in ("state", "attempt", "holder", "token"))
# A positional form this long has state, attempt and token in place; the
# holder, last of the four, may be left out at the end (None).
_HOLD_FORM_LEN = 1 + max(_HOLD_AT[0], _HOLD_AT[1], _HOLD_AT[3])


def run_hold(stored: Any, key: bytes) -> tuple[Any, Any, Any, Any]:
    """(state, attempt, holder, token) of a run record as decoded, not
    restored: what a node checks before each call (runtime/dispatcher.py).
    Read from their places in a positional form, where `compact` keeps them
    as they are (None where left out at the end); any other form is
    restored first."""
    if type(stored) is list and len(stored) >= _HOLD_FORM_LEN:
        return tuple(stored[at] if at < len(stored) else None for at in _HOLD_AT)
    run = expand(RUNS_TABLE, stored, key)
    return run.get("state"), run.get("attempt"), run.get("holder"), run.get("token")


# What a node reads of a job to call one of its runs (runtime/dispatcher.py).
CALL_VIEW = ("id", "tenant", "status", "spec")
_STATE_STATUS_AT = _JOB_STATE.position("status")


def job_to_call(stored: Any, key: bytes, state: Any) -> dict:
    """A job's id, tenant, status and whole spec (CALL_VIEW), from its record
    and its state record (None: it has none) as decoded, not restored: what
    a node reads before each call. The job's other members and its state's
    other than its status are not read into maps. Where either record has
    no positional form (or a spec this cannot read), the whole job is read
    and those four taken from it."""
    if type(stored) is list and len(stored) > _SPEC_AT \
            and (state is None or type(state) is list):
        spec, default_named = spec_of_stored(stored[_SPEC_AT])
        if type(spec) is dict:
            restore_spec(spec, default_named)
            if state is None:
                status = stored[_STATUS_AT] if len(stored) > _STATUS_AT else None
                if status is None:
                    status = "active"
            else:
                status = state[_STATE_STATUS_AT] if len(state) > _STATE_STATUS_AT else None
            job_id = stored[_JOB_ID_AT]
            return {"id": _key_id(key) if job_id is None else job_id,
                    "tenant": stored[_TENANT_AT], "status": status, "spec": spec}
    job = expand(JOBS_TABLE, stored, key)
    if state is not None and isinstance(job, dict):
        job.update((name, value) for name, value
                   in expand(JOB_STATE_TABLE, state, key).items() if name != "v")
    return {name: job.get(name) for name in CALL_VIEW} if isinstance(job, dict) else job


def _read_run(stored: list, key: bytes | None) -> dict:
    """A run's positional form, read into the run as written."""
    run = _RUN.unpack(stored)
    if run["id"] is None:
        run["id"] = _key_id(key)
        if run["job_id"] is None:   # left out with the id: the id names them
            run["job_id"], run["scheduled_ms"] = keys.run_occurrence(run["id"])
    if run["execution_id"] is None:
        run["execution_id"] = _execution_id(run)
    stored_attempts = run["attempts"]
    _read_run_members(run)
    if stored_attempts and type(stored_attempts) is not int:   # (a lone one is made whole)
        run["attempts"] = [_read_attempt(a) for a in stored_attempts]
    return run


def _stored_audit(record: dict) -> list | None:
    """An audit record as [its positional form, the job ids of its detail as
    runs]: a batch create's record names up to a batch of jobs, whose ids
    (api/ids.py) mostly follow one another, so [first id, count] pairs hold
    them in a few bytes where the list took about 26 a job. None: the record
    has no such form (it is stored as it is)."""
    detail = record.get("detail")
    if not isinstance(detail, dict):
        return None
    jobs = detail.get("jobs")
    if jobs is not None and (type(jobs) is not list or
                             not all(type(job) is str for job in jobs)):
        return None
    stored = _AUDIT.pack({**record, "detail": {k: v for k, v in detail.items() if k != "jobs"}})
    if stored is None:
        return None
    return [stored, None if jobs is None else _id_runs(jobs)]


def _read_audit(value: list) -> dict:
    record = _AUDIT.unpack(value[0])
    if value[1] is not None:
        record["detail"]["jobs"] = _ids_of_runs(value[1])
    return record


_COUNTED_ID = re.compile(r"job_[0-9a-f]{16}[0-9a-f]{4}")   # api/ids.py: ... and a count


def _id_runs(ids: list[str]) -> list:
    """[first id, count, first id, count, ...]: each id after a first is the
    one before it with its count (its last four hex digits) one more."""
    runs: list = []
    expected, head, count = None, "", 0
    for an_id in ids:
        if an_id == expected:   # (the next id in the form of _COUNTED_ID)
            runs[-1] += 1
            count += 1
        else:
            runs += [an_id, 1]
            if not _COUNTED_ID.fullmatch(an_id):
                expected = None
                continue
            head, count = an_id[:-4], int(an_id[-4:], 16)
        expected = f"{head}{count + 1:04x}" if count < 0xFFFF else None
    return runs


def _ids_of_runs(runs: list) -> list[str]:
    ids: list[str] = []
    for at in range(0, len(runs), 2):
        first, count = runs[at], runs[at + 1]
        head, base = first[:-4], int(first[-4:], 16) if count > 1 else 0
        ids.append(first)
        ids.extend(f"{head}{base + i:04x}" for i in range(1, count))
    return ids


def _occurrence_of(run_id: Any, job_id: str | None) -> int | None:
    """The time of the job's run `run_id` names (keys.run_id), or None if it
    names no run of `job_id`."""
    if type(run_id) is not str or job_id is None or len(run_id) < 12:
        return None
    digits = run_id[-12:]
    try:
        at_ms = int(digits, 16)
    except ValueError:
        return None
    return at_ms if keys.run_id(job_id, at_ms) == run_id else None


def _key_text(key: bytes | None) -> str | None:
    try:
        return None if key is None else key.decode()
    except UnicodeDecodeError:
        return None


def _key_id(key: bytes | None) -> str:
    if key is None:   # a bug: the id was stored as the key, and only it knows
        raise ValueError("a positional record with its id left out, read without its key")
    return key.decode()


def _read_attempt(attempt: Any) -> Any:
    if isinstance(attempt, list):
        return _ATTEMPT.unpack(attempt)
    if isinstance(attempt, dict):
        for name in _ATTEMPT_NONE:
            attempt.setdefault(name, None)
    return attempt


def _execution_id(run: dict) -> str | None:
    job_id, scheduled_ms = run.get("job_id"), run.get("scheduled_ms")
    if not isinstance(job_id, str) or not isinstance(scheduled_ms, int):
        return None
    return keys.execution_id(job_id, scheduled_ms)
