"""Validate job bodies from the API into the stored job spec.

Every error names the offending member (dotted path) so a caller can fix it
without guessing. Nothing here touches state: validation happens before any
command is proposed, so a bad request writes nothing.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from raftsched import limits
from raftsched.core import codec
from raftsched.core.schedule import parse_schedule
from raftsched.errors import InvalidInput

CREATE_FIELDS = {"name", "schedule", "run_at", "target", "retry", "concurrency", "misfire",
                 "idempotency_key", "metadata"}
PATCH_FIELDS = {"name", "schedule", "run_at", "target", "misfire"}
MISFIRE_POLICIES = ("fire_once", "skip", "fire_all")
MISFIRE_FIELDS = {"policy", "misfire_tolerance_s", "catchup_max"}
TARGET_FIELDS = {"type", "url", "method", "headers", "body", "timeout_s"}
RETRY_FIELDS = {"max_attempts", "backoff", "initial_delay_s", "max_delay_s", "multiplier",
                "jitter"}
CONCURRENCY_POLICIES = ("allow", "skip_if_running", "queue", "replace")
HTTP_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
# Headers raftsched sets itself on every call; a job may not override them.
RESERVED_HEADERS = ("idempotency-key", "x-raftsched-job-id", "x-raftsched-scheduled-for",
                    "x-raftsched-attempt", "x-raftsched-execution-id",
                    "x-raftsched-fencing-token", "content-length", "host")


def _reject_unknown(body: dict, allowed: set[str], prefix: str) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise InvalidInput(f"unknown field {unknown[0]!r}", field=prefix + unknown[0])


def validate_create(body: object) -> dict:
    """Return {name, schedule, target, retry, concurrency, metadata, idempotency_key}."""
    if not isinstance(body, dict):
        raise InvalidInput("the request body must be a JSON object", field="body")
    _reject_unknown(body, CREATE_FIELDS, "")
    spec = {
        "name": validate_name(body.get("name")),
        "schedule": parse_schedule(body.get("schedule"), body.get("run_at")),
        "target": validate_target(body.get("target")),
        "retry": validate_retry(body.get("retry")),
        "concurrency": validate_concurrency(body.get("concurrency")),
        "misfire": validate_misfire(body.get("misfire")),
        "metadata": validate_metadata(body.get("metadata")),
    }
    key = body.get("idempotency_key")
    if key is not None:
        if not isinstance(key, str) or not 0 < len(key) <= limits.idempotency_key_chars_max:
            raise InvalidInput("`idempotency_key` must be a string of 1 to "
                               f"{limits.idempotency_key_chars_max} characters",
                               field="idempotency_key", limit="idempotency_key_chars_max")
    return {"spec": spec, "idempotency_key": key}


def validate_patch(body: object, current: dict) -> dict:
    """Merge a PATCH body into the current spec; return the new spec."""
    if not isinstance(body, dict):
        raise InvalidInput("the request body must be a JSON object", field="body")
    _reject_unknown(body, PATCH_FIELDS, "")
    if not body:
        raise InvalidInput("nothing to change: give name, schedule, run_at or target",
                           field="body")
    spec = dict(current)
    if "name" in body:
        spec["name"] = validate_name(body["name"])
    if "schedule" in body or "run_at" in body:
        spec["schedule"] = parse_schedule(body.get("schedule"), body.get("run_at"))
    if "target" in body:
        spec["target"] = validate_target(body["target"])
    if "misfire" in body:
        spec["misfire"] = validate_misfire(body["misfire"])
    return spec


def validate_name(value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidInput("`name` is required: a non-empty string", field="name")
    if len(value) > limits.job_name_chars_max:
        raise InvalidInput(f"`name` is longer than {limits.job_name_chars_max} characters",
                           field="name", limit="job_name_chars_max")
    return value


def validate_target(value: object) -> dict:
    if not isinstance(value, dict):
        raise InvalidInput("`target` is required: {type: \"http\", url, ...}", field="target")
    _reject_unknown(value, TARGET_FIELDS, "target.")
    if value.get("type") != "http":
        raise InvalidInput("`target.type` must be \"http\" (command and publish targets "
                           "are not available yet)", field="target.type")
    url = value.get("url")
    if not isinstance(url, str) or len(url) > limits.target_url_chars_max:
        raise InvalidInput("`target.url` must be an http(s) URL", field="target.url",
                           limit="target_url_chars_max" if isinstance(url, str) else None)
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidInput(f"`target.url` must be an http or https URL with a host, not {url!r}",
                           field="target.url")
    method = value.get("method", "POST")
    if not isinstance(method, str) or method.upper() not in HTTP_METHODS:
        raise InvalidInput(f"`target.method` must be one of {', '.join(HTTP_METHODS)}",
                           field="target.method")
    timeout_s = value.get("timeout_s", limits.target_timeout_s_default)
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) \
            or not limits.target_timeout_s_min <= timeout_s <= limits.target_timeout_s_max:
        raise InvalidInput(f"`target.timeout_s` must be a number from "
                           f"{limits.target_timeout_s_min} to {limits.target_timeout_s_max}",
                           field="target.timeout_s", limit="target_timeout_s_max")
    return {"type": "http", "url": url, "method": method.upper(),
            "headers": _validate_headers(value.get("headers")),
            "body": _validate_body(value.get("body")), "timeout_s": float(timeout_s)}


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
        if not name or any(c in name for c in " :\r\n") or any(c in header for c in "\r\n"):
            raise InvalidInput("header names and values may not contain spaces, colons or "
                               "line breaks", field=field)
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
    """Stored now; the retry policy takes effect with durable retries."""
    if value is None:
        return {"max_attempts": 1}
    if not isinstance(value, dict):
        raise InvalidInput("`retry` must be an object such as {\"max_attempts\": 3}",
                           field="retry")
    _reject_unknown(value, RETRY_FIELDS, "retry.")
    attempts = value.get("max_attempts", 1)
    if isinstance(attempts, bool) or not isinstance(attempts, int) \
            or not 1 <= attempts <= limits.retry_max_attempts_max:
        raise InvalidInput(f"`retry.max_attempts` must be an integer from 1 to "
                           f"{limits.retry_max_attempts_max}", field="retry.max_attempts",
                           limit="retry_max_attempts_max")
    out: dict = {"max_attempts": attempts}
    for name in ("initial_delay_s", "max_delay_s", "multiplier"):
        if name in value:
            number = value[name]
            if isinstance(number, bool) or not isinstance(number, (int, float)) or number < 0:
                raise InvalidInput(f"`retry.{name}` must be a non-negative number",
                                   field=f"retry.{name}")
            out[name] = number
    if "backoff" in value:
        if value["backoff"] not in ("exponential", "fixed", "linear"):
            raise InvalidInput("`retry.backoff` must be exponential, fixed or linear",
                               field="retry.backoff")
        out["backoff"] = value["backoff"]
    if "jitter" in value:
        if value["jitter"] not in ("full", "none", True, False):
            raise InvalidInput("`retry.jitter` must be \"full\" or \"none\"", field="retry.jitter")
        out["jitter"] = value["jitter"]
    return out


def validate_concurrency(value: object) -> dict:
    """Accepts "skip_if_running" or {"policy": "skip_if_running"}; stored now."""
    if value is None:
        return {"policy": "allow"}
    policy = value.get("policy") if isinstance(value, dict) else value
    if isinstance(value, dict):
        _reject_unknown(value, {"policy"}, "concurrency.")
    if policy not in CONCURRENCY_POLICIES:
        raise InvalidInput(f"`concurrency` must be one of {', '.join(CONCURRENCY_POLICIES)}",
                           field="concurrency")
    return {"policy": policy}


def validate_misfire(value: object) -> dict:
    """What a fire does with occurrences it is late for (see docs/schedules.md).

    Accepts "skip" or {"policy": "skip", "misfire_tolerance_s": 30, "catchup_max": 100}.
    Stored as {"policy", "tolerance_ms", "catchup_max"}.
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
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) \
            or not 0 <= tolerance <= limits.misfire_tolerance_s_max:
        raise InvalidInput(f"`misfire.misfire_tolerance_s` must be a number from 0 to "
                           f"{limits.misfire_tolerance_s_max}", field="misfire.misfire_tolerance_s",
                           limit="misfire_tolerance_s_max")
    if "misfire_tolerance_s" in value and policy != "skip":
        raise InvalidInput("`misfire_tolerance_s` applies to the skip policy only",
                           field="misfire.misfire_tolerance_s")
    catchup = value.get("catchup_max", limits.catchup_max_default)
    if isinstance(catchup, bool) or not isinstance(catchup, int) \
            or not 1 <= catchup <= limits.catchup_max_max:
        raise InvalidInput(f"`misfire.catchup_max` must be an integer from 1 to "
                           f"{limits.catchup_max_max}", field="misfire.catchup_max",
                           limit="catchup_max_max")
    return {"policy": policy, "tolerance_ms": int(tolerance * 1000), "catchup_max": catchup}


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
