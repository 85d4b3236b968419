"""Validate job bodies from the API into the stored job spec.

Every error names the offending member (dotted path) so a caller can fix it
without guessing. Nothing here touches state: validation happens before any
command is proposed, so a bad request writes nothing.
"""

from __future__ import annotations

import re
from typing import Callable, TypeVar
from urllib.parse import urlsplit

from raftsched import limits
from raftsched.core import codec, dag, redact
from raftsched.core.bounded import bounded_float, bounded_int
from raftsched.core.retry import DEFAULT_POLICY
from raftsched.core.schedule import bound_schedule, parse_instant, parse_schedule
from raftsched.errors import InvalidInput

CREATE_FIELDS = {"name", "schedule", "run_at", "target", "dag", "retry", "concurrency",
                 "misfire", "alert", "idempotency_key", "metadata", "history", "secret_keys",
                 "priority", "labels", "jitter_s", "not_before", "not_after"}
PATCH_FIELDS = {"name", "schedule", "run_at", "target", "dag", "retry", "concurrency",
                "misfire", "alert", "history", "secret_keys", "priority", "labels", "jitter_s",
                "not_before", "not_after"}
# A job's rank among its tenant's runs where a backlog forms (firing, dispatch,
# worker claims); tenants share by weight first, whatever their jobs' priority.
PRIORITIES = ("high", "normal", "low")
MISFIRE_POLICIES = ("fire_once", "skip", "fire_all")
MISFIRE_FIELDS = {"policy", "misfire_tolerance_s", "catchup_max", "catchup_window_s"}
TARGET_TYPES = ("http", "command", "publish")
HTTP_TARGET_FIELDS = {"type", "url", "method", "headers", "body", "timeout_s"}
COMMAND_TARGET_FIELDS = {"type", "argv", "env", "cwd", "timeout_s", "queue", "shell"}
PUBLISH_TARGET_FIELDS = {"type", "topic", "message", "key"}
RETRY_FIELDS = {"max_attempts", "backoff", "base_s", "max_s", "non_retryable_exit_codes"}
# Earlier names of base_s and max_s, still accepted (and stored under the new names).
RETRY_ALIASES = {"initial_delay_s": "base_s", "max_delay_s": "max_s"}
BACKOFFS = ("exponential", "fixed")
# Names of queues and topics: they appear in URLs and keys.
NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
CONCURRENCY_POLICIES = ("allow", "skip_if_running", "queue", "replace")
HTTP_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
# The shapes of the ids raftsched makes: what a URL, a cursor or a worker's
# report may name. Anything else cannot exist, so it is refused unread.
JOB_ID_PATTERN = "job_[0-9a-f]{20}"
RUN_ID_PATTERN = "run_[0-9a-f]{24}"
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


def _reject_unknown(body: dict, allowed: set[str], prefix: str) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise InvalidInput(f"unknown field {unknown[0]!r}", field=prefix + unknown[0])


def _int_from_1(value: object, field: str, limit: str) -> int:
    """An integer from 1 to the named limit (a bool is not an integer here)."""
    return bounded_int(value, field, 1, getattr(limits, limit), limit=limit)


def validate_create(body: object, job_id: str = "") -> dict:
    """Return {spec, idempotency_key}. `job_id`, the id the job will have, is
    what `H` in a cron schedule is hashed from."""
    if not isinstance(body, dict):
        raise InvalidInput("the request body must be a JSON object", field="body")
    _reject_unknown(body, CREATE_FIELDS, "")
    secret_keys = validate_secret_keys(body.get("secret_keys"))
    # A create has no stored secret for "***" to stand for: it is refused.
    work = validate_work(body, secret_keys)
    name = body.get("name")
    spec = {
        "name": default_work_name(work) if name is None else validate_name(name),
        "schedule": NO_SCHEDULE if unscheduled_dag(body, work)
        else _bounded(parse_schedule(body.get("schedule"), body.get("run_at"),
                                     hash_key=job_id), body, {}),
        **work,
        "retry": validate_retry(body.get("retry")),
        "concurrency": validate_concurrency(body.get("concurrency")),
        "misfire": validate_misfire(body.get("misfire")),
        "alert": validate_alert(body.get("alert")),
        "metadata": validate_metadata(body.get("metadata")),
        "history": validate_history(body.get("history")),
        "secret_keys": secret_keys,
        "priority": validate_priority(body.get("priority")),
        "labels": validate_labels(body.get("labels")),
    }
    jitter_ms = validate_jitter(body.get("jitter_s"))
    if jitter_ms:
        spec["jitter_ms"] = jitter_ms
    key = body.get("idempotency_key")
    if key is not None:
        key = validate_key_text(key, "idempotency_key", limits.idempotency_key_bytes_max,
                                "idempotency_key_bytes_max")
    return {"spec": spec, "idempotency_key": key}


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


def validate_job_id(value: object, field: str = "job_id") -> str:
    if not isinstance(value, str) or not _JOB_ID_RE.fullmatch(value):
        raise InvalidInput(f"`{field}` is not a job id ({JOB_ID_PATTERN})", field=field)
    return value


def validate_run_id(value: object, field: str = "run_id") -> str:
    if not isinstance(value, str) or not _RUN_ID_RE.fullmatch(value):
        raise InvalidInput(f"`{field}` is not a run id ({RUN_ID_PATTERN})", field=field)
    return value


def validate_patch(body: object, current: dict, job_id: str = "") -> dict:
    """Merge a PATCH body into the current spec; return the new spec. `job_id`
    is what `H` in a new cron schedule is hashed from."""
    if not isinstance(body, dict):
        raise InvalidInput("the request body must be a JSON object", field="body")
    _reject_unknown(body, PATCH_FIELDS, "")
    if not body:
        raise InvalidInput("nothing to change: give one of "
                           f"{', '.join(sorted(PATCH_FIELDS))}", field="body")
    spec = dict(current)
    if "name" in body:
        spec["name"] = validate_name(body["name"])
    if "schedule" in body or "run_at" in body:
        spec["schedule"] = NO_SCHEDULE if unscheduled_dag(body, current) \
            else parse_schedule(body.get("schedule"), body.get("run_at"), hash_key=job_id)
    if {"schedule", "run_at", "not_before", "not_after"} & set(body):
        spec["schedule"] = _bounded(spec["schedule"], body, current["schedule"])
    if "labels" in body:
        spec["labels"] = validate_labels(body["labels"])
    if "jitter_s" in body:
        spec.pop("jitter_ms", None)
        jitter_ms = validate_jitter(body["jitter_s"])
        if jitter_ms:
            spec["jitter_ms"] = jitter_ms
    if "secret_keys" in body:
        spec["secret_keys"] = validate_secret_keys(body["secret_keys"])
    if "target" in body or "dag" in body:
        # "***" keeps the stored value of a name that is secret after this
        # change, and is refused for one it un-lists (core/redact.py).
        spec.update(validate_work(body, spec.get("secret_keys") or [], current))
    else:
        _refuse_unlisting(current, spec.get("secret_keys") or [])
    validators = {"misfire": validate_misfire, "retry": validate_retry,
                  "concurrency": validate_concurrency, "alert": validate_alert,
                  "history": validate_history, "priority": validate_priority}
    for name, validate in validators.items():
        if name in body:
            spec[name] = validate(body[name])
    return spec


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
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInput("`labels` must be an object of strings such as "
                           "{\"team\": \"payments\"}", field="labels")
    if len(value) > limits.job_labels_max:
        raise InvalidInput(f"`labels` holds {len(value)} labels; at most "
                           f"{limits.job_labels_max}", field="labels", limit="job_labels_max")
    for key, text in value.items():
        field = f"labels.{key}"
        if not _LABEL_KEY_RE.fullmatch(key):
            raise InvalidInput("a label key is letters, digits, '.', '_', '/' or '-'",
                               field=field)
        if len(key) > limits.label_key_bytes_max:
            raise InvalidInput(f"a label key is at most {limits.label_key_bytes_max} bytes",
                               field=field, limit="label_key_bytes_max")
        if not isinstance(text, str) or any(ord(c) < 32 or ord(c) == 127 for c in text):
            raise InvalidInput("a label value is a string without control characters",
                               field=field)
        _check_storable(text, field)
        if len(text.encode("utf-8")) > limits.label_value_bytes_max:
            raise InvalidInput(f"a label value is at most {limits.label_value_bytes_max} bytes "
                               "of UTF-8", field=field, limit="label_value_bytes_max")
    return dict(value)


def validate_jitter(value: object) -> int:
    """`jitter_s`: 0 to jitter_s_max seconds (null is 0), stored in ms."""
    if value is None:
        return 0
    seconds = bounded_float(value, "jitter_s", 0, limits.jitter_s_max, limit="jitter_s_max",
                            unit="seconds")
    return int(seconds * 1000)


def validate_priority(value: object) -> str:
    """high, normal or low; null (or left out) is normal."""
    if value is None:
        return "normal"
    if value not in PRIORITIES:
        raise InvalidInput(f"`priority` must be one of {', '.join(PRIORITIES)}",
                           field="priority")
    return value  # type: ignore[return-value]


def validate_secret_keys(value: object) -> list[str]:
    """Names of headers or env variables whose values are secret (core/redact.py):
    at most secret_keys_max names of 1 to secret_key_bytes_max bytes of UTF-8,
    without "=", line breaks or NUL (no header or env name holds them). A name
    the target does not use is kept: it applies once the target uses it.
    Duplicates are dropped; null is no names."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidInput("`secret_keys` must be a list of header or env variable names",
                           field="secret_keys")
    if len(value) > limits.secret_keys_max:
        raise InvalidInput(f"`secret_keys` holds {len(value)} names; at most "
                           f"{limits.secret_keys_max}", field="secret_keys",
                           limit="secret_keys_max")
    names: list[str] = []
    for i, name in enumerate(value):
        field = f"secret_keys[{i}]"
        if not isinstance(name, str) or not name or any(c in name for c in "=\r\n\x00"):
            raise InvalidInput(f"`{field}` must be a header or env variable name: a non-empty "
                               "string without '=' or line breaks", field=field)
        _check_storable(name, field)
        if len(name.encode("utf-8")) > limits.secret_key_bytes_max:
            raise InvalidInput(f"`{field}` is longer than {limits.secret_key_bytes_max} bytes",
                               field=field, limit="secret_key_bytes_max")
        if name not in names:
            names.append(name)
    return names


def validate_name(value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidInput("`name` must be a non-empty string (or left out, for a "
                           "name made from the target)", field="name")
    _check_storable(value, "name")
    if len(value) > limits.job_name_chars_max:
        raise InvalidInput(f"`name` is longer than {limits.job_name_chars_max} characters",
                           field="name", limit="job_name_chars_max")
    return value


def validate_target(value: object) -> dict:
    if not isinstance(value, dict):
        raise InvalidInput("`target` is required: {type: \"http\", url, ...}", field="target")
    kind = value.get("type")
    if kind not in TARGET_TYPES:
        raise InvalidInput(f"`target.type` must be one of {', '.join(TARGET_TYPES)}",
                           field="target.type")
    if kind == "command":
        return validate_command_target(value)
    if kind == "publish":
        return validate_publish_target(value)
    return validate_http_target(value)


def validate_http_target(value: dict) -> dict:
    _reject_unknown(value, HTTP_TARGET_FIELDS, "target.")
    url = value.get("url")
    if not isinstance(url, str):
        raise InvalidInput("`target.url` must be an http(s) URL", field="target.url")
    validate_http_url(url, "target.url")
    method = value.get("method", "POST")
    if not isinstance(method, str) or method.upper() not in HTTP_METHODS:
        raise InvalidInput(f"`target.method` must be one of {', '.join(HTTP_METHODS)}",
                           field="target.method")
    return {"type": "http", "url": url, "method": method.upper(),
            "headers": _validate_headers(value.get("headers")),
            "body": _validate_body(value.get("body")),
            "timeout_s": _validate_timeout(value.get("timeout_s"))}


def validate_http_url(url: str, field: str) -> None:
    """An http or https URL with a host, of at most target_url_bytes_max bytes."""
    _check_storable(url, field)
    if len(url.encode("utf-8")) > limits.target_url_bytes_max:
        raise InvalidInput(f"`{field}` is longer than {limits.target_url_bytes_max} bytes",
                           field=field, limit="target_url_bytes_max")
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


def _validate_timeout(timeout_s: object) -> float:
    if timeout_s is None:
        timeout_s = limits.target_timeout_s_default
    return bounded_float(timeout_s, "target.timeout_s", limits.target_timeout_s_min,
                         limits.target_timeout_s_max, limit="target_timeout_s_max")


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


def validate_command_target(value: dict) -> dict:
    """{type: command, argv: [...], env, cwd, timeout_s, queue, shell}. No shell
    unless `shell: true`; then argv is one script for /bin/sh -c."""
    _reject_unknown(value, COMMAND_TARGET_FIELDS, "target.")
    argv = value.get("argv")
    if not isinstance(argv, list) or not argv or len(argv) > limits.command_argv_max \
            or not all(isinstance(a, str) and a for a in argv):
        raise InvalidInput(f"`target.argv` must be a list of 1 to {limits.command_argv_max} "
                           "non-empty strings", field="target.argv", limit="command_argv_max")
    shell = value.get("shell", False)
    if not isinstance(shell, bool):
        raise InvalidInput("`target.shell` must be true or false", field="target.shell")
    if shell and len(argv) != 1:
        raise InvalidInput("with `shell: true`, `target.argv` is one script string",
                           field="target.argv")
    env = value.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(k, str) and k and "=" not in k
                                            and isinstance(v, str) for k, v in env.items()):
        raise InvalidInput("`target.env` must be an object of string values", field="target.env")
    reserved = sorted(k for k in env if k.upper().startswith("RAFTSCHED_"))
    if reserved:
        raise InvalidInput(f"`{reserved[0]}` is set by raftsched on every run",
                           field=f"target.env.{reserved[0]}")
    cwd = value.get("cwd")
    if cwd is not None and (not isinstance(cwd, str) or not cwd.startswith("/")):
        raise InvalidInput("`target.cwd` must be an absolute path", field="target.cwd")
    if cwd is not None and len(cwd.encode("utf-8", "surrogatepass")) > \
            limits.command_text_bytes_max:
        raise InvalidInput(f"`target.cwd` is longer than {limits.command_text_bytes_max} bytes",
                           field="target.cwd", limit="command_text_bytes_max")
    spec = {"type": "command", "argv": list(argv), "env": dict(env), "cwd": cwd,
            "timeout_s": _validate_timeout(value.get("timeout_s")),
            "queue": validate_name_token(value.get("queue"), "target.queue", "default",
                                         max_bytes=limits.queue_bytes_max,
                                         limit="queue_bytes_max"),
            "shell": shell}
    if len(codec.pack(spec)) > limits.target_body_bytes_max:
        raise InvalidInput(f"the command target is larger than {limits.target_body_bytes_max} "
                           "bytes", field="target", status=413, type_="too-large",
                           limit="target_body_bytes_max")
    return spec


def validate_publish_target(value: dict) -> dict:
    """{type: publish, topic, message, key}: appended to a built-in topic."""
    _reject_unknown(value, PUBLISH_TARGET_FIELDS, "target.")
    key = value.get("key")
    if key is not None and (not isinstance(key, str) or len(key) > limits.topic_name_chars_max):
        raise InvalidInput(f"`target.key` must be a string of at most "
                           f"{limits.topic_name_chars_max} characters", field="target.key")
    if "message" not in value:
        raise InvalidInput("`target.message` is required (any JSON value)",
                           field="target.message")
    message = value["message"]
    if len(codec.pack(message)) > limits.target_body_bytes_max:
        raise InvalidInput(f"`target.message` is larger than {limits.target_body_bytes_max} "
                           "bytes", field="target.message", status=413, type_="too-large",
                           limit="target_body_bytes_max")
    return {"type": "publish", "topic": validate_name_token(value.get("topic"), "target.topic"),
            "message": message, "key": key}


def _validate_headers(value: object) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInput("`target.headers` must be an object of strings", field="target.headers")
    if len(value) > limits.target_headers_max:
        raise InvalidInput(f"more than {limits.target_headers_max} headers",
                           field="target.headers", limit="target_headers_max")
    for name, header in value.items():
        field = f"target.headers.{name}"
        if not isinstance(header, str) or len(header) > limits.target_header_value_chars_max:
            raise InvalidInput("header values must be strings of at most "
                               f"{limits.target_header_value_chars_max} characters", field=field)
        if name.lower() in RESERVED_HEADERS:
            raise InvalidInput(f"header {name!r} is set by raftsched on every call", field=field)
        if not _HEADER_NAME_RE.fullmatch(name) or any(c in header for c in "\r\n\x00"):
            raise InvalidInput("header names are tokens (letters, digits and !#$%&'*+.^_`|~-); "
                               "values may not contain line breaks", field=field)
    return dict(value)


def _validate_body(value: object) -> object:
    if value is None:
        return None
    if not isinstance(value, (str, dict, list)):
        raise InvalidInput("`target.body` must be a string or a JSON object/array",
                           field="target.body")
    if len(codec.pack(value)) > limits.target_body_bytes_max:
        raise InvalidInput(f"`target.body` is larger than {limits.target_body_bytes_max} bytes",
                           field="target.body", status=413, type_="too-large",
                           limit="target_body_bytes_max")
    return value


def validate_retry(value: object) -> dict:
    """{max_attempts, backoff: exponential|fixed, base_s, max_s,
    non_retryable_exit_codes}; missing members take retry.DEFAULT_POLICY's."""
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise InvalidInput("`retry` must be an object such as {\"max_attempts\": 3}",
                           field="retry")
    _reject_unknown(value, RETRY_FIELDS | set(RETRY_ALIASES), "retry.")
    for old, new in RETRY_ALIASES.items():
        if old in value:
            if new in value:
                raise InvalidInput(f"give `retry.{new}` or its older name `{old}`, not both",
                                   field=f"retry.{old}")
            value = {**{k: v for k, v in value.items() if k != old}, new: value[old]}
    out = dict(DEFAULT_POLICY)
    out["max_attempts"] = _int_from_1(value.get("max_attempts", out["max_attempts"]),
                                      "retry.max_attempts", "retry_max_attempts_max")
    for name in ("base_s", "max_s"):
        out[name] = bounded_float(value.get(name, out[name]), f"retry.{name}", 0,
                                  limits.retry_delay_s_max, limit="retry_delay_s_max",
                                  unit="seconds")
    if out["max_s"] < out["base_s"]:
        raise InvalidInput("`retry.max_s` must be at least `retry.base_s`", field="retry.max_s")
    backoff = value.get("backoff", out["backoff"])
    if backoff not in BACKOFFS:
        raise InvalidInput(f"`retry.backoff` must be one of {', '.join(BACKOFFS)}",
                           field="retry.backoff")
    out["backoff"] = backoff
    codes = value.get("non_retryable_exit_codes", [])
    if not isinstance(codes, list) or len(codes) > limits.non_retryable_exit_codes_max:
        raise InvalidInput(f"`retry.non_retryable_exit_codes` must be a list of at most "
                           f"{limits.non_retryable_exit_codes_max} exit codes (0-255)",
                           field="retry.non_retryable_exit_codes",
                           limit="non_retryable_exit_codes_max")
    for i, code in enumerate(codes):
        # A process's exit status is one byte.
        bounded_int(code, f"retry.non_retryable_exit_codes[{i}]", 0, 255)
    out["non_retryable_exit_codes"] = sorted(set(codes))
    return out


def validate_concurrency(value: object) -> dict:
    """Accepts "skip_if_running" or {"policy": "queue", "queue_max": 10}."""
    if value is None:
        return {"policy": "allow"}
    policy = value.get("policy") if isinstance(value, dict) else value
    if isinstance(value, dict):
        _reject_unknown(value, {"policy", "queue_max"}, "concurrency.")
    if policy not in CONCURRENCY_POLICIES:
        raise InvalidInput(f"`concurrency` must be one of {', '.join(CONCURRENCY_POLICIES)}",
                           field="concurrency")
    out = {"policy": policy}
    if isinstance(value, dict) and "queue_max" in value:
        bound = value["queue_max"]
        if policy != "queue":
            raise InvalidInput("`queue_max` applies to the queue policy only",
                               field="concurrency.queue_max")
        out["queue_max"] = _int_from_1(bound, "concurrency.queue_max",
                                       "concurrency_queue_max_max")
    elif policy == "queue":
        out["queue_max"] = limits.concurrency_queue_max_default
    return out


def validate_alert(value: object) -> dict:
    """{webhook_url}: where a run that failed for good is reported (else the
    cluster default, `--alert-webhook-url`)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInput("`alert` must be an object such as {\"webhook_url\": \"https://...\"}",
                           field="alert")
    _reject_unknown(value, {"webhook_url"}, "alert.")
    url = value.get("webhook_url")
    if url is None:
        return {}
    if not isinstance(url, str):
        raise InvalidInput("`alert.webhook_url` must be an http(s) URL",
                           field="alert.webhook_url")
    validate_http_url(url, "alert.webhook_url")
    return {"webhook_url": url}


def validate_misfire(value: object) -> dict:
    """What a fire does with occurrences it is late for (see docs/schedules.md).

    Accepts "skip" or {"policy": "skip", "misfire_tolerance_s": 30, "catchup_max": 100,
    "catchup_window_s": 3600}. Stored as {"policy", "tolerance_ms", "catchup_max"}
    and, when given, "catchup_window_ms".
    """
    if value is None:
        value = {}
    if isinstance(value, str):
        value = {"policy": value}
    if not isinstance(value, dict):
        raise InvalidInput("`misfire` must be a policy name or an object", field="misfire")
    _reject_unknown(value, MISFIRE_FIELDS, "misfire.")
    policy = value.get("policy", "fire_once")
    if policy not in MISFIRE_POLICIES:
        raise InvalidInput(f"`misfire.policy` must be one of {', '.join(MISFIRE_POLICIES)}",
                           field="misfire.policy")
    tolerance = value.get("misfire_tolerance_s", limits.misfire_tolerance_s_default)
    tolerance = bounded_float(tolerance, "misfire.misfire_tolerance_s", 0,
                              limits.misfire_tolerance_s_max, limit="misfire_tolerance_s_max")
    if "misfire_tolerance_s" in value and policy != "skip":
        raise InvalidInput("`misfire_tolerance_s` applies to the skip policy only",
                           field="misfire.misfire_tolerance_s")
    catchup = _int_from_1(value.get("catchup_max", limits.catchup_max_default),
                          "misfire.catchup_max", "catchup_max_max")
    out = {"policy": policy, "tolerance_ms": int(tolerance * 1000), "catchup_max": catchup}
    window = value.get("catchup_window_s")
    if window is not None:
        window = bounded_float(window, "misfire.catchup_window_s", 1,
                               limits.catchup_window_s_max, limit="catchup_window_s_max",
                               unit="seconds")
        out["catchup_window_ms"] = int(window * 1000)
    return out


def validate_history(value: object) -> dict:
    """{max_runs, max_age_s}: the finished runs kept (the newest max_runs, none
    older than max_age_s); a member left out takes the cluster's default
    (--history-max-runs, --history-max-age-s). Stored as {max_runs, max_age_ms}."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInput("`history` must be an object such as {\"max_runs\": 100}",
                           field="history")
    _reject_unknown(value, {"max_runs", "max_age_s"}, "history.")
    out = {}
    max_runs = value.get("max_runs")
    if max_runs is not None:
        out["max_runs"] = _int_from_1(max_runs, "history.max_runs", "history_max_runs_max")
    max_age_s = value.get("max_age_s")
    if max_age_s is not None:
        max_age_s = bounded_float(max_age_s, "history.max_age_s", 1,
                                  limits.history_max_age_s_max, limit="history_max_age_s_max",
                                  unit="seconds")
        out["max_age_ms"] = int(max_age_s * 1000)
    return out


def validate_metadata(value: object) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInput("`metadata` must be an object", field="metadata")
    if len(codec.pack(value)) > limits.metadata_bytes_max:
        raise InvalidInput(f"`metadata` is larger than {limits.metadata_bytes_max} bytes",
                           field="metadata", status=413, type_="too-large",
                           limit="metadata_bytes_max")
    return value


# --- DAG jobs --------------------------------------------------------------------------

DAG_FIELDS = {"tasks"}
DAG_TASK_FIELDS = {"id", "target", "depends_on", "trigger_rule", "retry", "timeout_s"}
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
    has_target, has_dag = "target" in body, "dag" in body
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
        return {"dag": validate_dag(body["dag"], secret_keys,
                                    current.get("dag") if current else None, before)}
    stored = current.get("target") if current else None
    return {"target": validate_target(redact.restore_secrets(body.get("target"), stored,
                                                             secret_keys, before))}


def default_work_name(work: dict) -> str:
    """The name of a job created without one: default_name of its target, or
    for a DAG, its task ids ("dag ingest, fx, reconcile")."""
    if "target" in work:
        return default_name(work["target"])
    text = "dag " + ", ".join(task["id"] for task in work["dag"]["tasks"])
    return text if len(text) <= limits.job_name_chars_max \
        else text[:limits.job_name_chars_max - 1] + "…"


def validate_dag(value: object, secret_keys: list[str], current: dict | None = None,
                 keys_before: list[str] | None = None) -> dict:
    """{"tasks": [task, ...]}: 1 to dag_tasks_max tasks whose graph is acyclic,
    with unique ids and known dependencies (core/dag.py). A cycle is refused
    naming its tasks. `current`: the stored DAG of a PATCH, whose task targets
    "***" keeps (by task id); `keys_before`: the stored job's secret_keys."""
    if not isinstance(value, dict):
        raise InvalidInput('`dag` must be an object: {"tasks": [{"id", "target", '
                           '"depends_on"}, ...]}', field="dag")
    _reject_unknown(value, DAG_FIELDS, "dag.")
    tasks = value.get("tasks")
    if not isinstance(tasks, list) or not tasks:
        raise InvalidInput("`dag.tasks` must be a non-empty list of tasks", field="dag.tasks")
    if len(tasks) > limits.dag_tasks_max:
        raise InvalidInput(f"`dag.tasks` holds {len(tasks)} tasks; at most "
                           f"{limits.dag_tasks_max}", field="dag.tasks", limit="dag_tasks_max")
    stored = {task["id"]: task["target"] for task in (current or {}).get("tasks", ())}
    out = [_validate_task(task, f"dag.tasks[{i}]", (secret_keys, keys_before or []), stored)
           for i, task in enumerate(tasks)]
    problem = dag.graph_problem(out)
    if problem is not None:
        raise InvalidInput(problem.detail, field=f"dag.tasks[{problem.index}].{problem.member}",
                           limit=problem.limit)
    return {"tasks": out}


def _validate_task(task: object, field: str, secret_keys: tuple[list[str], list[str]],
                   stored: dict) -> dict:
    """`secret_keys`: the job's after the change and before it."""
    if not isinstance(task, dict):
        raise InvalidInput(f'`{field}` must be an object: {{"id", "target", "depends_on", '
                           '"trigger_rule", "retry", "timeout_s"}', field=field)
    _reject_unknown(task, DAG_TASK_FIELDS, field + ".")
    task_id = _task_id(task.get("id"), f"{field}.id")
    depends_on = task.get("depends_on")
    if depends_on is None:
        depends_on = []
    if not isinstance(depends_on, list) or len(depends_on) > limits.dag_tasks_max:
        raise InvalidInput(f"`{field}.depends_on` must be a list of at most "
                           f"{limits.dag_tasks_max} task ids", field=f"{field}.depends_on",
                           limit="dag_tasks_max")
    upstream = [_task_id(dep, f"{field}.depends_on[{j}]") for j, dep in enumerate(depends_on)]
    rule = task.get("trigger_rule")
    if rule is None:
        rule = dag.ALL_SUCCESS
    if rule not in dag.RULES:
        raise InvalidInput(f"`{field}.trigger_rule` must be one of {', '.join(dag.RULES)}",
                           field=f"{field}.trigger_rule")
    target = _within(field, lambda: validate_target(redact.restore_secrets(
        task.get("target"), stored.get(task_id), *secret_keys)))
    if task.get("timeout_s") is not None:
        # The task's timeout is its target's: each attempt is abandoned after it.
        target["timeout_s"] = _task_timeout(task["timeout_s"], f"{field}.timeout_s")
    retry = None
    if task.get("retry") is not None:
        retry = _within(field, lambda: validate_retry(task["retry"]))
    return {"id": task_id, "target": target, "depends_on": upstream, "trigger_rule": rule,
            "retry": retry, "timeout_s": target.get("timeout_s")}


def _task_id(value: object, field: str) -> str:
    return validate_name_token(value, field, max_bytes=limits.dag_task_id_bytes_max,
                               limit="dag_task_id_bytes_max")


def _task_timeout(value: object, field: str) -> float:
    return bounded_float(value, field, limits.target_timeout_s_min, limits.target_timeout_s_max,
                         limit="target_timeout_s_max")


_T = TypeVar("_T")


def _within(prefix: str, check: Callable[[], _T]) -> _T:
    """`check()`, with the field of an InvalidInput it raises named from `prefix`:
    a task's target and retry are checked as a job's are, and named as the task's."""
    try:
        return check()
    except InvalidInput as exc:
        exc.field = f"{prefix}.{exc.field}" if exc.field else prefix
        exc.detail = f"{prefix}: {exc.detail}"
        raise
