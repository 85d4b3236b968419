"""Turn job bodies from the API into the stored job spec.

A body's shape (types, members, bounds) is declared once in core/spec.py and
checked there in one call; the hooks here check what a shape cannot say (a
cron expression, a zone, a URL, header names, secrets, a DAG's graph, byte
lengths of UTF-8) and build the stored form. Every error names the offending
member (dotted path) so a caller can fix it without guessing. Nothing here
touches state: validation happens before any command is proposed, so a bad
request writes nothing.
"""

from __future__ import annotations

import re
from typing import Any, Callable, TypeVar, Union
from urllib.parse import urlsplit

from raftsched import limits
from raftsched.core import codec, dag, redact, spec as shapes
from raftsched.core.retry import DEFAULT_POLICY
from raftsched.core.schedule import bound_schedule, parse_instant, parse_schedule
from raftsched.core.spec import (BACKOFFS, CONCURRENCY_POLICIES, HTTP_METHODS,  # noqa: F401
                                 JOB_ID_PATTERN, MISFIRE_POLICIES, PRIORITIES, RUN_ID_PATTERN,
                                 TARGET_TYPES, check_shape)
from raftsched.errors import InvalidInput

CREATE_FIELDS = shapes.members(shapes.JobCreate)
PATCH_FIELDS = shapes.members(shapes.JobPatch)
# Names of queues and topics: they appear in URLs and keys.
NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
_JOB_ID_RE = re.compile(JOB_ID_PATTERN)
_RUN_ID_RE = re.compile(RUN_ID_PATTERN)
# Label keys: what a filter `label=key:value` can name before its colon.
_LABEL_KEY_RE = re.compile(r"[A-Za-z0-9._/-]+")
# Header names are RFC 9110 tokens.
_HEADER_NAME_RE = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# Headers raftsched sets itself on every call; a job may not override them.
RESERVED_HEADERS = ("idempotency-key", "x-raftsched-job-id", "x-raftsched-scheduled-for",
                    "x-raftsched-attempt", "x-raftsched-execution-id",
                    "x-raftsched-fencing-token", "content-length", "host")
_S = TypeVar("_S")


def _shaped(value: Any, shape: Any, field: str) -> Any:
    """`value` itself, once checked to be null or of `shape`: what a hook
    called alone (not through validate_create) checks first."""
    check_shape(value, Union[shape, None], field)
    return value


def validate_create(body: object, job_id: str = "") -> dict:
    """Return {spec, idempotency_key}. `job_id`, the id the job will have, is
    what `H` in a cron schedule is hashed from."""
    check_shape(body, shapes.JobCreate)
    assert isinstance(body, dict)
    secret_keys = _secret_keys(body.get("secret_keys"))
    # A create has no stored secret for "***" to stand for: it is refused.
    work = validate_work(body, secret_keys)
    name = body.get("name")
    spec = {
        "name": default_work_name(work) if name is None else _name(name),
        "schedule": NO_SCHEDULE if unscheduled_dag(body, work)
        else _bounded(parse_schedule(body.get("schedule"), body.get("run_at"),
                                     hash_key=job_id), body, {}),
        **work,
        "retry": _retry(body.get("retry")),
        "concurrency": _concurrency(body.get("concurrency")),
        "misfire": _misfire(body.get("misfire")),
        "alert": _alert(body.get("alert")),
        "metadata": _metadata(body.get("metadata")),
        "history": _history(body.get("history")),
        "secret_keys": secret_keys,
        "priority": body.get("priority") or "normal",
        "labels": _labels(body.get("labels")),
    }
    jitter_s = body.get("jitter_s")
    if jitter_s:
        spec["jitter_ms"] = int(jitter_s * 1000)
    key = body.get("idempotency_key")
    if key is not None:
        key = validate_key_text(key, "idempotency_key", limits.idempotency_key_bytes_max,
                                "idempotency_key_bytes_max")
    return {"spec": spec, "idempotency_key": key}


def validate_patch(body: object, current: dict, job_id: str = "") -> dict:
    """Merge a PATCH body into the current spec; return the new spec. `job_id`
    is what `H` in a new cron schedule is hashed from."""
    check_shape(body, shapes.JobPatch)
    assert isinstance(body, dict)
    if not body:
        raise InvalidInput("nothing to change: give one of "
                           f"{', '.join(sorted(PATCH_FIELDS))}", field="body")
    spec = dict(current)
    if "name" in body:
        spec["name"] = _name(body["name"])
    if "schedule" in body or "run_at" in body:
        spec["schedule"] = NO_SCHEDULE if unscheduled_dag(body, current) \
            else parse_schedule(body.get("schedule"), body.get("run_at"), hash_key=job_id)
    if {"schedule", "run_at", "not_before", "not_after"} & set(body):
        spec["schedule"] = _bounded(spec["schedule"], body, current["schedule"])
    if "jitter_s" in body:
        spec.pop("jitter_ms", None)
        if body["jitter_s"]:
            spec["jitter_ms"] = int(body["jitter_s"] * 1000)
    if "secret_keys" in body:
        spec["secret_keys"] = _secret_keys(body["secret_keys"])
    if "target" in body or "dag" in body:
        # "***" keeps the stored value of a name that is secret after this
        # change, and is refused for one it un-lists (core/redact.py).
        spec.update(validate_work(body, spec.get("secret_keys") or [], current))
    else:
        _refuse_unlisting(current, spec.get("secret_keys") or [])
    hooks = {"misfire": _misfire, "retry": _retry, "concurrency": _concurrency,
             "alert": _alert, "history": _history, "labels": _labels,
             "priority": lambda value: value or "normal"}
    for name, hook in hooks.items():
        if name in body:
            spec[name] = hook(body[name])
    return spec


def default_name(target: dict) -> str:
    """The name of a job created without one: what it calls, in a few words
    ("POST example.com/hook", "command backup.sh", "publish orders")."""
    if target["type"] == "http":
        parts = urlsplit(target["url"])
        text = f"{target['method']} {parts.hostname}{parts.path}"
    elif target["type"] == "command":
        text = "command " + target["argv"][0].strip().split(" ")[0].rsplit("/", 1)[-1]
    else:
        text = "publish " + target["topic"]
    return text[:limits.job_name_chars_max]


def validate_key_text(value: object, field: str, max_bytes: int, limit: str) -> str:
    """A string that becomes part of a storage key: 1 to `max_bytes` bytes of
    UTF-8 (LMDB bounds keys in bytes, not characters), without NUL (the
    separator of composed keys)."""
    if not isinstance(value, str) or not value:
        raise InvalidInput(f"`{field}` must be a non-empty string", field=field)
    _check_storable(value, field)
    size = len(value.encode("utf-8"))
    if size > max_bytes:
        raise InvalidInput(f"`{field}` is {size} bytes of UTF-8, over {max_bytes}",
                           field=field, limit=limit)
    return value


def _check_storable(value: str, field: str) -> None:
    if "\x00" in value:
        raise InvalidInput(f"`{field}` may not contain NUL", field=field)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(f"`{field}` holds a lone surrogate (not valid UTF-8)",
                           field=field) from None


def _check_bytes(value: str, field: str, max_bytes: int, limit: str) -> None:
    """`value` is storable and at most `max_bytes` bytes of UTF-8 (the shape
    bounded its characters)."""
    _check_storable(value, field)
    if not value.isascii() and len(value.encode("utf-8")) > max_bytes:
        raise InvalidInput(f"`{field}` is longer than {max_bytes} bytes of UTF-8",
                           field=field, limit=limit)


def validate_job_id(value: object, field: str = "job_id") -> str:
    if not isinstance(value, str) or not _JOB_ID_RE.fullmatch(value):
        raise InvalidInput(f"`{field}` is not a job id ({JOB_ID_PATTERN})", field=field)
    return value


def validate_run_id(value: object, field: str = "run_id") -> str:
    if not isinstance(value, str) or not _RUN_ID_RE.fullmatch(value):
        raise InvalidInput(f"`{field}` is not a run id ({RUN_ID_PATTERN})", field=field)
    return value


def _refuse_unlisting(current: dict, secret_keys: list[str]) -> None:
    """A stored secret stays write-only: a change that takes its name out of
    secret_keys and keeps its value would show that value in reads."""
    unlisted = redact.unlisted_secrets(current, secret_keys)
    if unlisted:
        raise InvalidInput(f"`secret_keys` leaves out {unlisted[0]!r}, whose stored value is "
                           "secret: a secret stays write-only, so give the target with a new "
                           "value for it (or without it) in the same change",
                           field="secret_keys")


def _bounded(schedule: dict, body: dict, previous: dict) -> dict:
    """The schedule with the bounds the body gives (`not_before`, `not_after`,
    RFC 3339; null clears one), else those it had. Bounds apply to recurring
    schedules: a one-off refuses them, and drops those of the schedule it replaces."""
    bounds = {}
    for name in ("not_before", "not_after"):
        if name in body:
            given = body[name]
            bounds[name] = None if given is None else parse_instant(given, name)[0]
        else:
            bounds[name] = previous.get(f"{name}_ms")
    if schedule["kind"] not in ("cron", "every"):
        given = [name for name in ("not_before", "not_after") if body.get(name) is not None]
        if given:
            raise InvalidInput(f"`{given[0]}` bounds a recurring schedule (cron or every); "
                               "this job has none", field=given[0])
        return bound_schedule(schedule, None, None)
    if None not in bounds.values() and bounds["not_before"] > bounds["not_after"]:
        raise InvalidInput("`not_after` must not come before `not_before`", field="not_after")
    return bound_schedule(schedule, bounds["not_before"], bounds["not_after"])


def validate_labels(value: object) -> dict:
    """{key: value}: at most job_labels_max labels; a key is 1 to
    label_key_bytes_max bytes of [A-Za-z0-9._/-], a value a string of at most
    label_value_bytes_max bytes of UTF-8 without control characters. Null is none."""
    return _labels(_shaped(value, shapes.Labels, "labels"))


def _labels(value: dict | None) -> dict:
    if value is None:
        return {}
    for key, text in value.items():
        field = f"labels.{key}"
        if not _LABEL_KEY_RE.fullmatch(key):
            raise InvalidInput("a label key is letters, digits, '.', '_', '/' or '-'",
                               field=field)
        if len(key) > limits.label_key_bytes_max:
            raise InvalidInput(f"a label key is at most {limits.label_key_bytes_max} bytes",
                               field=field, limit="label_key_bytes_max")
        if any(ord(c) < 32 or ord(c) == 127 for c in text):
            raise InvalidInput("a label value is a string without control characters",
                               field=field)
        _check_bytes(text, field, limits.label_value_bytes_max, "label_value_bytes_max")
    return dict(value)


def _secret_keys(value: list | None) -> list[str]:
    """Names of headers or env variables whose values are secret (core/redact.py),
    without "=", line breaks or NUL (no header or env name holds them). A name
    the target does not use is kept: it applies once the target uses it.
    Duplicates are dropped; null is no names."""
    names: list[str] = []
    for i, name in enumerate(value or ()):
        field = f"secret_keys[{i}]"
        if any(c in name for c in "=\r\n\x00"):
            raise InvalidInput(f"`{field}` must be a header or env variable name: a non-empty "
                               "string without '=' or line breaks", field=field)
        _check_bytes(name, field, limits.secret_key_bytes_max, "secret_key_bytes_max")
        if name not in names:
            names.append(name)
    return names


def _name(value: str | None) -> str:
    if value is None or not value.strip():
        raise InvalidInput("`name` must be a non-empty string (or left out, for a "
                           "name made from the target)", field="name")
    _check_storable(value, "name")
    return value


def validate_target(value: object, field: str = "target") -> dict:
    """A target body ({type: http|command|publish, ...}) as stored."""
    if value is None:
        raise InvalidInput(f"`{field}` is required: {{type: \"http\", url, ...}}", field=field)
    return _target(_shaped(value, shapes.Target, field), field)


def _target(value: dict, field: str) -> dict:
    kind = value["type"]
    if kind == "command":
        return _command_target(value, field)
    if kind == "publish":
        return {"type": "publish", "topic": value["topic"], "key": value.get("key"),
                "message": _packed(value["message"], f"{field}.message")}
    method = value.get("method") or "POST"
    if method.upper() not in HTTP_METHODS:
        raise InvalidInput(f"`{field}.method` must be one of {', '.join(HTTP_METHODS)}",
                           field=f"{field}.method")
    validate_http_url(value["url"], f"{field}.url")
    body = value.get("body")
    return {"type": "http", "url": value["url"], "method": method.upper(),
            "headers": _headers(value.get("headers") or {}, field),
            "body": None if body is None else _packed(body, f"{field}.body"),
            "timeout_s": _timeout(value.get("timeout_s"))}


def validate_http_url(url: str, field: str) -> None:
    """An http or https URL with a host, of at most target_url_bytes_max bytes."""
    _check_bytes(url, field, limits.target_url_bytes_max, "target_url_bytes_max")
    try:
        parts = urlsplit(url)
        host, _ = parts.hostname, parts.port
    except ValueError as exc:   # a bad port or IPv6 literal
        raise InvalidInput(f"`{field}` is not a URL: {exc}", field=field) from None
    if parts.scheme not in ("http", "https") or not host:
        # Not the URL itself: it may hold a secret a "***" in it stood for.
        scheme = f" (its scheme is {parts.scheme!r})" if parts.scheme else ""
        raise InvalidInput(f"`{field}` must be an http or https URL with a host{scheme}",
                           field=field)


def _timeout(timeout_s: float | None) -> float:
    return limits.target_timeout_s_default if timeout_s is None else float(timeout_s)


def validate_name_token(value: object, field: str, default: str | None = None, *,
                        max_bytes: int = limits.topic_bytes_max,
                        limit: str = "topic_bytes_max") -> str:
    """A queue, topic, group or worker name: 1 to `max_bytes` of [A-Za-z0-9._-]
    (ASCII, so characters are bytes). It becomes part of storage keys."""
    if value is None and default is not None:
        return default
    if not isinstance(value, str) or not value or not set(value) <= NAME_CHARS:
        raise InvalidInput(f"`{field}` must be 1 to {max_bytes} letters, digits, '.', '_' "
                           "or '-'", field=field)
    if len(value) > max_bytes:
        raise InvalidInput(f"`{field}` is {len(value)} characters long, over {max_bytes}",
                           field=field, limit=limit)
    return value


def _command_target(value: dict, field: str) -> dict:
    """No shell unless `shell: true`; then argv is one script for /bin/sh -c."""
    argv, shell, env = value["argv"], value.get("shell", False), value.get("env") or {}
    if shell and len(argv) != 1:
        raise InvalidInput("with `shell: true`, `target.argv` is one script string",
                           field=f"{field}.argv")
    if not all(name and "=" not in name for name in env):
        raise InvalidInput("`target.env` names are non-empty and without '='",
                           field=f"{field}.env")
    reserved = sorted(k for k in env if k.upper().startswith("RAFTSCHED_"))
    if reserved:
        raise InvalidInput(f"`{reserved[0]}` is set by raftsched on every run",
                           field=f"{field}.env.{reserved[0]}")
    cwd = value.get("cwd")
    if cwd is not None:
        _check_bytes(cwd, f"{field}.cwd", limits.command_text_bytes_max,
                     "command_text_bytes_max")
    spec = {"type": "command", "argv": list(argv), "env": dict(env), "cwd": cwd,
            "timeout_s": _timeout(value.get("timeout_s")),
            "queue": value.get("queue") or "default", "shell": shell}
    if len(codec.pack(spec)) > limits.target_body_bytes_max:
        raise InvalidInput(f"the command target is larger than {limits.target_body_bytes_max} "
                           "bytes", field=field, status=413, type_="too-large",
                           limit="target_body_bytes_max")
    return spec


def _headers(value: dict, target: str) -> dict:
    for name, header in value.items():
        field = f"{target}.headers.{name}"
        if name.lower() in RESERVED_HEADERS:
            raise InvalidInput(f"header {name!r} is set by raftsched on every call", field=field)
        if not _HEADER_NAME_RE.fullmatch(name) or any(c in header for c in "\r\n\x00"):
            raise InvalidInput("header names are tokens (letters, digits and !#$%&'*+.^_`|~-); "
                               "values may not contain line breaks", field=field)
    return dict(value)


def _packed(value: object, field: str, max_bytes: int = limits.target_body_bytes_max,
            limit: str = "target_body_bytes_max") -> Any:
    """A free-form JSON member, at most `max_bytes` bytes once encoded (413 past it)."""
    if len(codec.pack(value)) > max_bytes:
        raise InvalidInput(f"`{field}` is larger than {max_bytes} bytes", field=field,
                           status=413, type_="too-large", limit=limit)
    return value


def validate_retry(value: object) -> dict:
    """{max_attempts, backoff: exponential|fixed, base_s, max_s,
    non_retryable_exit_codes}; missing members take retry.DEFAULT_POLICY's."""
    return _retry(_shaped(value, shapes.Retry, "retry"))


def _retry(value: dict | None, field: str = "retry") -> dict:
    if not value:
        return {**DEFAULT_POLICY, "non_retryable_exit_codes": []}
    for old, new in (("initial_delay_s", "base_s"), ("max_delay_s", "max_s")):
        if value.get(old) is not None:
            if value.get(new) is not None:
                raise InvalidInput(f"give `{field}.{new}` or its older name `{old}`, not both",
                                   field=f"{field}.{old}")
            value = {**value, new: value[old]}
    out = dict(DEFAULT_POLICY)
    for name in ("max_attempts", "backoff"):
        if value.get(name) is not None:
            out[name] = value[name]
    for name in ("base_s", "max_s"):
        if value.get(name) is not None:
            out[name] = float(value[name])
    if out["max_s"] < out["base_s"]:
        raise InvalidInput(f"`{field}.max_s` must be at least `{field}.base_s`",
                           field=f"{field}.max_s")
    out["non_retryable_exit_codes"] = sorted(set(value.get("non_retryable_exit_codes") or ()))
    return out


def validate_concurrency(value: object) -> dict:
    """Accepts "skip_if_running" or {"policy": "queue", "queue_max": 10}."""
    return _concurrency(_shaped(value, Union[shapes.ConcurrencyPolicy, shapes.Concurrency],
                                "concurrency"))


def _concurrency(value: str | dict | None) -> dict:
    if value is None:
        return {"policy": "allow"}
    if isinstance(value, str):
        value = {"policy": value}
    out = {"policy": value["policy"]}
    if value.get("queue_max") is not None:
        if value["policy"] != "queue":
            raise InvalidInput("`queue_max` applies to the queue policy only",
                               field="concurrency.queue_max")
        out["queue_max"] = value["queue_max"]
    elif value["policy"] == "queue":
        out["queue_max"] = limits.concurrency_queue_max_default
    return out


def validate_alert(value: object) -> dict:
    """{webhook_url}: where a run that failed for good is reported (else the
    cluster default, `--alert-webhook-url`)."""
    return _alert(_shaped(value, shapes.Alert, "alert"))


def _alert(value: dict | None) -> dict:
    url = (value or {}).get("webhook_url")
    if url is None:
        return {}
    validate_http_url(url, "alert.webhook_url")
    return {"webhook_url": url}


def validate_misfire(value: object) -> dict:
    """What a fire does with occurrences it is late for (see docs/schedules.md).

    Accepts "skip" or {"policy": "skip", "misfire_tolerance_s": 30, "catchup_max": 100,
    "catchup_window_s": 3600}. Stored as {"policy", "tolerance_ms", "catchup_max"}
    and, when given, "catchup_window_ms".
    """
    return _misfire(_shaped(value, Union[shapes.MisfirePolicy, shapes.Misfire], "misfire"))


def _misfire(value: str | dict | None) -> dict:
    if value is None:
        return {"policy": "fire_once",
                "tolerance_ms": int(limits.misfire_tolerance_s_default * 1000),
                "catchup_max": limits.catchup_max_default}
    if isinstance(value, str):
        value = {"policy": value}
    value = value or {}
    policy = value.get("policy", "fire_once")
    tolerance = value.get("misfire_tolerance_s")
    if tolerance is not None and policy != "skip":
        raise InvalidInput("`misfire_tolerance_s` applies to the skip policy only",
                           field="misfire.misfire_tolerance_s")
    if tolerance is None:
        tolerance = limits.misfire_tolerance_s_default
    catchup = value.get("catchup_max")
    out = {"policy": policy, "tolerance_ms": int(tolerance * 1000),
           "catchup_max": limits.catchup_max_default if catchup is None else catchup}
    if value.get("catchup_window_s") is not None:
        out["catchup_window_ms"] = int(value["catchup_window_s"] * 1000)
    return out


def validate_history(value: object) -> dict:
    """{max_runs, max_age_s}: the finished runs kept (the newest max_runs, none
    older than max_age_s); a member left out takes the cluster's default
    (--history-max-runs, --history-max-age-s). Stored as {max_runs, max_age_ms}."""
    return _history(_shaped(value, shapes.History, "history"))


def _history(value: dict | None) -> dict:
    value, out = value or {}, {}
    if value.get("max_runs") is not None:
        out["max_runs"] = value["max_runs"]
    if value.get("max_age_s") is not None:
        out["max_age_ms"] = int(value["max_age_s"] * 1000)
    return out


def _metadata(value: dict | None) -> dict:
    if value is None:
        return {}
    return _packed(value, "metadata", limits.metadata_bytes_max, "metadata_bytes_max")


# --- DAG jobs --------------------------------------------------------------------------

# The schedule of a DAG job created without `schedule` and `run_at`: it runs
# when triggered (POST /v1/jobs/{id}:trigger), and never on its own.
NO_SCHEDULE = {"kind": "none"}


def unscheduled_dag(body: dict, spec: dict) -> bool:
    """A DAG job whose body gives no schedule (neither `schedule` nor `run_at`).
    `spec` is what the job will run: the new one's work, or a stored spec."""
    return "dag" in spec and body.get("schedule") is None and body.get("run_at") is None


def validate_work(body: dict, secret_keys: list[str], current: dict | None = None) -> dict:
    """What a job runs: {"target": ...} (one call) or {"dag": ...} (tasks that
    each make one), exactly one. `current` is the stored spec of a PATCH, whose
    secrets "***" keeps; a PATCH may not turn one kind of job into the other."""
    has_target, has_dag = body.get("target") is not None, body.get("dag") is not None
    if has_target and has_dag:
        raise InvalidInput("give `target` (one call) or `dag` (a workflow of tasks), not both",
                           field="dag")
    if current is not None and has_target and "dag" in current:
        raise InvalidInput("this job runs a DAG: change its `dag`, or create a job for one "
                           "target", field="target")
    if current is not None and has_dag and "target" in current:
        raise InvalidInput("this job calls one target: change its `target`, or create a job "
                           "for a DAG", field="dag")
    before = (current.get("secret_keys") or []) if current else []
    if has_dag:
        return {"dag": _dag(body["dag"], secret_keys,
                            current.get("dag") if current else None, before)}
    if not has_target:
        raise InvalidInput("`target` is required: {type: \"http\", url, ...}", field="target")
    stored = current.get("target") if current else None
    return {"target": _target(redact.restore_secrets(body["target"], stored, secret_keys,
                                                     before), "target")}


def default_work_name(work: dict) -> str:
    """The name of a job created without one: default_name of its target, or
    for a DAG, its task ids ("dag ingest, fx, reconcile")."""
    if "target" in work:
        return default_name(work["target"])
    text = "dag " + ", ".join(task["id"] for task in work["dag"]["tasks"])
    return text if len(text) <= limits.job_name_chars_max \
        else text[:limits.job_name_chars_max - 1] + "…"


def _dag(value: dict, secret_keys: list[str], current: dict | None,
         keys_before: list[str]) -> dict:
    """{"tasks": [task, ...]} whose graph is acyclic, with unique ids and known
    dependencies (core/dag.py). A cycle is refused naming its tasks. `current`:
    the stored DAG of a PATCH, whose task targets "***" keeps (by task id);
    `keys_before`: the stored job's secret_keys."""
    stored = {task["id"]: task["target"] for task in (current or {}).get("tasks", ())}
    out = [_task(task, f"dag.tasks[{i}]", (secret_keys, keys_before), stored)
           for i, task in enumerate(value["tasks"])]
    problem = dag.graph_problem(out)
    if problem is not None:
        raise InvalidInput(problem.detail, field=f"dag.tasks[{problem.index}].{problem.member}",
                           limit=problem.limit)
    return {"tasks": out}


def _task(task: dict, field: str, secret_keys: tuple[list[str], list[str]],
          stored: dict) -> dict:
    """`secret_keys`: the job's after the change and before it."""
    target = _within(field, lambda: _target(redact.restore_secrets(
        task["target"], stored.get(task["id"]), *secret_keys), "target"))
    if task.get("timeout_s") is not None:
        # The task's timeout is its target's: each attempt is abandoned after it.
        target["timeout_s"] = float(task["timeout_s"])
    retry = None
    if task.get("retry") is not None:
        retry = _within(field, lambda: _retry(task["retry"]))
    return {"id": task["id"], "target": target, "depends_on": list(task.get("depends_on") or ()),
            "trigger_rule": task.get("trigger_rule") or dag.ALL_SUCCESS,
            "retry": retry, "timeout_s": target.get("timeout_s")}


def _within(prefix: str, check: Callable[[], _S]) -> _S:
    """`check()`, with the field of an InvalidInput it raises named from `prefix`:
    a task's target and retry are checked as a job's are, and named as the task's."""
    try:
        return check()
    except InvalidInput as exc:
        exc.field = f"{prefix}.{exc.field}" if exc.field else prefix
        exc.detail = f"{prefix}: {exc.detail}"
        raise
