"""Job body validation: what is accepted, and that every refusal names its field."""

from __future__ import annotations

import pytest

from raftsched import limits
from raftsched.core import jobspec
from raftsched.errors import InvalidInput

SEED_BODY = {
    "name": "nightly-settlement",
    "schedule": {"cron": "0 2 * * *", "timezone": "Asia/Kolkata"},
    "target": {"type": "http", "url": "https://payments.internal/settle", "method": "POST",
               "headers": {"Authorization": "Bearer x"}, "body": {"region": "in"},
               "timeout_s": 30},
    "retry": {"max_attempts": 5, "backoff": "exponential"},
    "concurrency": "skip_if_running",
    "idempotency_key": "settlement-v1",
    "metadata": {"team": "payments"},
}


def test_seed_body_is_accepted_whole():
    out = jobspec.validate_create(SEED_BODY)
    spec = out["spec"]
    assert out["idempotency_key"] == "settlement-v1"
    assert spec["name"] == "nightly-settlement"
    assert spec["schedule"] == {"kind": "cron", "cron": "0 2 * * *", "timezone": "Asia/Kolkata"}
    assert spec["target"] == {"type": "http", "url": "https://payments.internal/settle",
                              "method": "POST", "headers": {"Authorization": "Bearer x"},
                              "body": {"region": "in"}, "timeout_s": 30.0}
    assert spec["retry"] == {"max_attempts": 5, "backoff": "exponential", "base_s": 1.0,
                             "max_s": 60.0, "non_retryable_exit_codes": []}
    assert spec["concurrency"] == {"policy": "skip_if_running"}
    assert spec["misfire"] == {"policy": "fire_once",
                               "tolerance_ms": int(limits.misfire_tolerance_s_default * 1000),
                               "catchup_max": limits.catchup_max_default}
    assert spec["metadata"] == {"team": "payments"}


def test_defaults_of_a_minimal_body():
    spec = jobspec.validate_create({"name": "m", "run_at": "2030-01-01T00:00:00Z",
                                    "target": {"type": "http", "url": "http://h/x"}})["spec"]
    assert spec["target"]["method"] == "POST"
    assert spec["target"]["timeout_s"] == limits.target_timeout_s_default
    assert spec["target"]["headers"] == {} and spec["target"]["body"] is None
    assert spec["retry"] == {"max_attempts": 3, "backoff": "exponential", "base_s": 1.0,
                             "max_s": 60.0, "non_retryable_exit_codes": []}
    assert spec["concurrency"] == {"policy": "allow"}
    assert spec["alert"] == {}
    assert spec["metadata"] == {}


@pytest.mark.parametrize("target, name", [
    ({"type": "http", "url": "https://hooks.example.com/settle?token=secret"},
     "POST hooks.example.com/settle"),
    ({"type": "http", "url": "http://h:8080", "method": "get"}, "GET h"),
    ({"type": "command", "argv": ["/usr/local/bin/backup.sh", "--full"]}, "command backup.sh"),
    ({"type": "command", "argv": ["pg_dump db > /tmp/x"], "shell": True}, "command pg_dump"),
    ({"type": "publish", "topic": "orders", "message": {}}, "publish orders"),
])
def test_a_job_without_a_name_is_named_after_its_target(target, name):
    for body in ({"run_at": "2030-01-01T00:00:00Z", "target": target},
                 {"name": None, "run_at": "2030-01-01T00:00:00Z", "target": target}):
        assert jobspec.validate_create(body)["spec"]["name"] == name


def test_a_default_name_is_cut_to_the_name_limit():
    url = "https://h/" + "p" * limits.target_url_bytes_max
    url = url[:limits.target_url_bytes_max]
    spec = jobspec.validate_create({"run_at": "2030-01-01T00:00:00Z",
                                    "target": {"type": "http", "url": url}})["spec"]
    assert len(spec["name"]) == limits.job_name_chars_max


def test_an_idempotency_key_is_bounded_in_bytes_not_characters():
    ok = "\u00e9" * (limits.idempotency_key_bytes_max // 2)
    assert jobspec.validate_create(dict(SEED_BODY, idempotency_key=ok))["idempotency_key"] == ok
    with pytest.raises(InvalidInput) as exc:
        jobspec.validate_create(dict(SEED_BODY, idempotency_key=ok + "\u00e9"))
    assert exc.value.limit == "idempotency_key_bytes_max"


@pytest.mark.parametrize("path, value, limit", [
    # Few enough characters, too many bytes: URLs are bounded in UTF-8 bytes.
    ("target.url", "https://h/" + "\u00e9" * (limits.target_url_bytes_max // 2),
     "target_url_bytes_max"),
    ("alert", {"webhook_url": "https://h/" + "x" * limits.target_url_bytes_max},
     "target_url_bytes_max"),
    ("target", {"type": "command", "argv": ["a"],
                "cwd": "/" + "d" * limits.command_text_bytes_max}, "command_text_bytes_max"),
    ("schedule.cron", "0 " + "1," * limits.command_text_bytes_max + "1 * * *",
     "cron_expression_bytes_max"),
])
def test_free_text_a_command_carries_is_bounded_in_bytes(path, value, limit):
    with pytest.raises(InvalidInput) as exc:
        jobspec.validate_create(with_(path, value))
    assert exc.value.limit == limit


def with_(path: str, value: object) -> dict:
    """SEED_BODY with the member at dotted `path` set (or removed, for DELETE)."""
    body = {k: (dict(v) if isinstance(v, dict) else v) for k, v in SEED_BODY.items()}
    *parents, last = path.split(".")
    node = body
    for p in parents:
        node[p] = dict(node[p])
        node = node[p]
    if value is DELETE:
        node.pop(last, None)
    else:
        node[last] = value
    return body


DELETE = object()


@pytest.mark.parametrize("path, value, field", [
    ("name", "  ", "name"),
    ("name", "a\x00b", "name"),
    ("name", "\ud800", "name"),
    ("name", "n" * (limits.job_name_chars_max + 1), "name"),
    ("colour", "blue", "colour"),
    ("schedule", DELETE, "schedule"),
    ("run_at", "2030-01-01T00:00:00Z", "schedule"),
    ("schedule.cron", "0 25 * * *", "schedule.cron"),
    ("schedule.timezone", "Asia/Atlantis", "schedule.timezone"),
    ("target", DELETE, "target"),
    ("target.type", "ftp", "target.type"),
    ("target.url", "ftp://h/x", "target.url"),
    ("target.url", "http:///nohost", "target.url"),
    ("target.url", "http://[::1/x", "target.url"),
    ("target.url", "http://h:99999/x", "target.url"),
    ("target.headers", {"Bad Name": "v"}, "target.headers.Bad Name"),
    ("target.headers", {"X-Ok": "a\x00b"}, "target.headers.X-Ok"),
    ("target.url", "https://h/" + "x" * limits.target_url_bytes_max, "target.url"),
    ("target.method", "BREW", "target.method"),
    ("target.timeout_s", 0, "target.timeout_s"),
    ("target.timeout_s", True, "target.timeout_s"),
    ("target.timeout_s", limits.target_timeout_s_max + 1, "target.timeout_s"),
    ("target.verb", "GET", "target.verb"),
    ("target.headers", "x", "target.headers"),
    ("target.headers", {"Idempotency-Key": "mine"}, "target.headers.Idempotency-Key"),
    ("target.headers", {"X-Raftsched-Fencing-Token": "1"}, "target.headers.X-Raftsched-Fencing-Token"),
    ("target.headers", {"X-A": "line\r\nbreak"}, "target.headers.X-A"),
    ("target.headers", {"Bad Name": "v"}, "target.headers.Bad Name"),
    ("target.body", 42, "target.body"),
    ("retry", 3, "retry"),
    ("retry.max_attempts", 0, "retry.max_attempts"),
    ("retry.max_attempts", limits.retry_max_attempts_max + 1, "retry.max_attempts"),
    ("retry.backoff", "random", "retry.backoff"),
    ("retry.backoff", "linear", "retry.backoff"),
    ("retry.base_s", -1, "retry.base_s"),
    ("retry.max_s", limits.retry_delay_s_max + 1, "retry.max_s"),
    ("retry", {"base_s": 10, "max_s": 5}, "retry.max_s"),
    ("retry.non_retryable_exit_codes", [256], "retry.non_retryable_exit_codes[0]"),
    ("retry.non_retryable_exit_codes", "2", "retry.non_retryable_exit_codes"),
    ("retry", {"initial_delay_s": 1, "base_s": 2}, "retry.initial_delay_s"),
    ("retry.multiplier", 2, "retry.multiplier"),
    ("concurrency", "sometimes", "concurrency"),
    ("concurrency", {"policy": "queue", "depth": 3}, "concurrency.depth"),
    ("concurrency", {"policy": "queue", "queue_max": 0}, "concurrency.queue_max"),
    ("concurrency", {"policy": "allow", "queue_max": 5}, "concurrency.queue_max"),
    ("alert", "http://a/", "alert"),
    ("alert", {"webhook_url": "ftp://a/"}, "alert.webhook_url"),
    ("alert", {"email": "x@y"}, "alert.email"),
    ("target", {"type": "command", "argv": []}, "target.argv"),
    ("target", {"type": "command", "argv": ["a", 1]}, "target.argv[1]"),
    ("target", {"type": "command", "argv": ["a", "b"], "shell": True}, "target.argv"),
    ("target", {"type": "command", "argv": ["a"], "shell": "yes"}, "target.shell"),
    ("target", {"type": "command", "argv": ["a"], "env": {"RAFTSCHED_ATTEMPT": "9"}},
     "target.env.RAFTSCHED_ATTEMPT"),
    ("target", {"type": "command", "argv": ["a"], "env": {"A": 1}}, "target.env"),
    ("target", {"type": "command", "argv": ["a"], "cwd": "relative"}, "target.cwd"),
    ("target", {"type": "command", "argv": ["a"], "queue": "no spaces"}, "target.queue"),
    ("target", {"type": "command", "argv": ["a"], "url": "http://h/"}, "target.url"),
    ("target", {"type": "publish", "message": 1}, "target.topic"),
    ("target", {"type": "publish", "topic": "t"}, "target.message"),
    ("target", {"type": "publish", "topic": "a/b", "message": 1}, "target.topic"),
    ("target", {"type": "smoke-signal"}, "target.type"),
    ("misfire", 7, "misfire"),
    ("misfire", {"policy": "later"}, "misfire.policy"),
    ("misfire", {"policy": "skip", "misfire_tolerance_s": -1}, "misfire.misfire_tolerance_s"),
    ("misfire", {"policy": "fire_once", "misfire_tolerance_s": 5}, "misfire.misfire_tolerance_s"),
    ("misfire", {"policy": "fire_all", "catchup_max": 0}, "misfire.catchup_max"),
    ("misfire", {"policy": "fire_all", "catchup_max": limits.catchup_max_max + 1},
     "misfire.catchup_max"),
    ("misfire", {"policy": "skip", "grace": 1}, "misfire.grace"),
    ("idempotency_key", "", "idempotency_key"),
    ("idempotency_key", "k" * (limits.idempotency_key_bytes_max + 1), "idempotency_key"),
    # Few enough characters, too many bytes: LMDB bounds keys in bytes.
    ("idempotency_key", "\u00e9" * 200, "idempotency_key"),
    ("idempotency_key", "a\x00b", "idempotency_key"),
    ("metadata", ["a"], "metadata"),
])
def test_bad_member_is_named(path, value, field):
    with pytest.raises(InvalidInput) as exc:
        jobspec.validate_create(with_(path, value))
    assert exc.value.field == field
    assert exc.value.status == 400


def test_body_must_be_an_object():
    with pytest.raises(InvalidInput) as exc:
        jobspec.validate_create(["not", "a", "map"])
    assert exc.value.field == "body"


@pytest.mark.parametrize("path, value, field, limit", [
    ("target.body", "x" * (limits.target_body_bytes_max + 10), "target.body",
     "target_body_bytes_max"),
    ("metadata", {"blob": "x" * (limits.metadata_bytes_max + 10)}, "metadata",
     "metadata_bytes_max"),
])
def test_oversized_members_are_413_with_the_limit_named(path, value, field, limit):
    with pytest.raises(InvalidInput) as exc:
        jobspec.validate_create(with_(path, value))
    assert (exc.value.status, exc.value.field, exc.value.limit) == (413, field, limit)


def test_misfire_policies_and_bounds():
    ok = jobspec.validate_misfire
    assert ok("skip") == {"policy": "skip",
                          "tolerance_ms": int(limits.misfire_tolerance_s_default * 1000),
                          "catchup_max": limits.catchup_max_default}
    assert ok({"policy": "skip", "misfire_tolerance_s": 0.5})["tolerance_ms"] == 500
    assert ok({"policy": "skip", "misfire_tolerance_s": limits.misfire_tolerance_s_max})
    assert ok({"policy": "fire_all", "catchup_max": 1})["catchup_max"] == 1
    assert ok({"policy": "fire_all", "catchup_max": limits.catchup_max_max})


def test_command_and_publish_targets():
    command = jobspec.validate_target({"type": "command", "argv": ["/bin/echo", "$HOME"],
                                       "env": {"A": "1"}, "cwd": "/tmp", "queue": "batch"})
    assert command == {"type": "command", "argv": ["/bin/echo", "$HOME"], "env": {"A": "1"},
                       "cwd": "/tmp", "timeout_s": limits.target_timeout_s_default,
                       "queue": "batch", "shell": False}
    assert jobspec.validate_target({"type": "command", "argv": ["x"]})["queue"] == "default"
    assert jobspec.validate_target({"type": "publish", "topic": "orders.v1",
                                    "message": {"id": 1}}) == \
        {"type": "publish", "topic": "orders.v1", "message": {"id": 1}, "key": None}


def test_older_retry_names_are_stored_under_the_new_ones():
    spec = jobspec.validate_retry({"initial_delay_s": 10, "max_delay_s": 100})
    assert (spec["base_s"], spec["max_s"]) == (10.0, 100.0)
    assert "initial_delay_s" not in spec


def test_retry_and_concurrency_are_patchable():
    spec = jobspec.validate_patch({"retry": {"max_attempts": 7, "backoff": "fixed"},
                                   "concurrency": {"policy": "queue"}}, CURRENT)
    assert spec["retry"]["max_attempts"] == 7
    assert spec["retry"]["backoff"] == "fixed"
    assert spec["concurrency"] == {"policy": "queue",
                                   "queue_max": limits.concurrency_queue_max_default}


def test_method_is_upper_cased():
    target = jobspec.validate_target({"type": "http", "url": "http://h/", "method": "put"})
    assert target["method"] == "PUT"


CURRENT = jobspec.validate_create(SEED_BODY)["spec"]


def test_patch_changes_only_what_it_names():
    spec = jobspec.validate_patch({"name": "renamed"}, CURRENT)
    assert spec == dict(CURRENT, name="renamed")
    spec = jobspec.validate_patch({"schedule": {"every": "10s"}}, CURRENT)
    assert spec["schedule"] == {"kind": "every", "every_ms": 10_000, "text": "10s"}
    assert spec["target"] == CURRENT["target"]
    spec = jobspec.validate_patch({"run_at": "2030-01-01T00:00:00+01:00"}, CURRENT)
    assert spec["schedule"]["kind"] == "once"
    assert CURRENT["name"] == "nightly-settlement"   # the current spec is not mutated


@pytest.mark.parametrize("body, field", [
    ({}, "body"),
    ("x", "body"),
    ({"retry": {"max_attempts": 0}}, "retry.max_attempts"),
    ({"tenant": "other"}, "tenant"),
    ({"name": ""}, "name"),
    ({"schedule": {"cron": "nope"}}, "schedule.cron"),
    ({"schedule": {"cron": "0 1 * * *"}, "run_at": "2030-01-01T00:00:00Z"}, "schedule"),
    ({"target": {"type": "http", "url": "mailto:x@y"}}, "target.url"),
    ({"misfire": {"policy": "never"}}, "misfire.policy"),
])
def test_bad_patch_is_named(body, field):
    with pytest.raises(InvalidInput) as exc:
        jobspec.validate_patch(body, CURRENT)
    assert exc.value.field == field


def test_priority_defaults_to_normal_and_is_patchable():
    assert CURRENT["priority"] == "normal"
    for value in jobspec.PRIORITIES:
        spec = jobspec.validate_create(dict(SEED_BODY, priority=value))["spec"]
        assert spec["priority"] == value
        assert jobspec.validate_patch({"priority": value}, CURRENT)["priority"] == value
    patched = jobspec.validate_patch({"priority": None}, dict(CURRENT, priority="high"))
    assert patched["priority"] == "normal"


@pytest.mark.parametrize("value", ["urgent", "HIGH", 1, ["high"], ""])
def test_another_priority_is_refused_naming_it(value):
    with pytest.raises(InvalidInput) as exc:
        jobspec.validate_create(dict(SEED_BODY, priority=value))
    assert exc.value.field == "priority"
    with pytest.raises(InvalidInput) as exc:
        jobspec.validate_patch({"priority": value}, CURRENT)
    assert exc.value.field == "priority"
