"""The shape check of request bodies (core/spec.py): a refusal names the member by its dotted path, says what the member must be, and names the limit of a bound."""

from __future__ import annotations

import pytest

from raftsched import limits
from raftsched.core import spec
from raftsched.errors import InvalidInput

CLAIM = {"queue": "backups"}
RESULT = {"run_id": "run_" + "0a" * 12, "attempt": 1, "ok": True}


@pytest.mark.parametrize("shape, body, field, limit, words", [
    (spec.WorkerClaim, [], "body", None, "JSON object"),
    (spec.WorkerClaim, {}, "queue", None, "missing required field"),
    (spec.WorkerClaim, dict(CLAIM, colour=1), "colour", None, "unknown field"),
    (spec.WorkerClaim, {"queue": "no spaces"}, "queue", None, "letters, digits"),
    # Python's `$` matches before a final newline: a name must end where its pattern does.
    (spec.WorkerClaim, {"queue": "backups\n"}, "queue", None, "letters, digits"),
    (spec.JobPatch, {"dag": {"tasks": [{"id": "a\n", "target": {"type": "http", "url": "u"}}]}},
     "dag.tasks[0].id", None, "letters, digits"),
    (spec.WorkerClaim, dict(CLAIM, max=0), "max", "worker_claim_max",
     f"an integer from 1 to {limits.worker_claim_max}"),
    (spec.WorkerClaim, dict(CLAIM, max=True), "max", "worker_claim_max", "an integer"),
    (spec.WorkerClaim, dict(CLAIM, wait_s=limits.worker_claim_wait_s_max + 1), "wait_s",
     "worker_claim_wait_s_max", "a number from 0 to"),
    (spec.WorkerComplete, {"results": [dict(RESULT, attempt=0)]}, "results[0].attempt",
     "run_attempts_max", "an integer"),
    (spec.WorkerComplete, {"results": [dict(RESULT, output={"stdout": 1})]},
     "results[0].output.stdout", None, "str"),
    (spec.WorkerComplete, {"results": [dict(RESULT, output={"truncated": {"stdout": -1}})]},
     "results[0].output.truncated", "command_int_max", "an integer"),
    (spec.WorkerHeartbeat, {"runs": [RESULT]}, "runs[0].ok", None, "unknown field"),
    (spec.WorkerHeartbeat, {"runs": [{"run_id": "run_x", "attempt": 1}]}, "runs[0].run_id",
     None, "regex"),
    (spec.WorkerHeartbeat, {"runs": [{"run_id": "run_" + "0a" * 12, "attempt": 1}]
                            * (limits.run_update_batch_max + 1)}, "runs",
     "run_update_batch_max", f"at most {limits.run_update_batch_max}"),
    (spec.JobPatch, {"priority": "urgent"}, "priority", None, "one of high, low, normal"),
    (spec.JobPatch, {"dag": {"tasks": []}}, "dag.tasks", None, "non-empty"),
])
def test_a_refusal_names_the_member_and_the_limit(shape, body, field, limit, words):
    with pytest.raises(InvalidInput) as refused:
        spec.check_shape(body, shape)
    assert (refused.value.status, refused.value.field, refused.value.limit) == \
        (400, field, limit)
    assert words in refused.value.detail


def test_a_prefix_names_a_member_checked_alone():
    with pytest.raises(InvalidInput) as refused:
        spec.check_shape({"max_attempts": 0}, spec.Retry, "dag.tasks[2].retry")
    assert refused.value.field == "dag.tasks[2].retry.max_attempts"


def test_the_document_gives_patterns_in_json_schema_form():
    schemas = spec.json_schemas([spec.WorkerClaim], "#/{name}")
    assert schemas["WorkerClaim"]["properties"]["queue"]["pattern"] == spec.NAME_TOKEN_PATTERN


def test_a_body_of_its_shape_is_converted_with_its_defaults():
    claim = spec.check_shape(CLAIM, spec.WorkerClaim)
    assert (claim.queue, claim.max, claim.wait_s) == ("backups", 1, 0.0)
