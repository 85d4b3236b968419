"""Schemathesis against a live 3-node cluster: no 5xx, no answer outside the OpenAPI document, and every node alive and in agreement afterwards."""

from __future__ import annotations

import copy
import itertools
import re

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import (content_type_conformance, not_a_server_error,
                                 response_schema_conformance, status_code_conformance)

from raftsched.api import openapi
from raftsched.core import jobspec
from raftsched.testing.http import auth_headers

pytestmark = pytest.mark.integration

# Examples per operation and mode (schema-valid, then schema-invalid): about
# 500 requests over 29 operations. Generating the cases costs more than
# sending them; this keeps the file under a minute on a busy two-core machine.
EXAMPLES_PER_OPERATION = 10
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance]
# Generate and shrink; no example database (a run does not depend on earlier ones).
PHASES = (Phase.explicit, Phase.generate, Phase.shrink)
# Jobs the fuzzer creates really run. Their targets are rewritten so that
# nothing leaves 127.0.0.1 (port 9, closed: the call fails at once) and no
# generated command runs (each argv item becomes `true`, keeping the list's
# length and the items' types, so validation still sees what was generated).
HARMLESS_URL = "http://127.0.0.1:9/fuzz"
# Long polls are kept short rather than excluded: a generated wait of up to the
# documented 30 s would spend the whole time budget on a few cases.
WAIT_S_MAX = 0.2
# Cases go to every node in turn (each serves every route), and every other
# case that names a job or run by a well-formed id names one that exists.
_TURN = itertools.count()


@pytest.fixture(scope="module")
def api_schema(shared_cluster):
    # The document as a node serves it. Loaded from the fetched JSON rather than
    # from its URL: from_url leaves out the operation that serves the document.
    served = shared_cluster.api("n1", "GET", "/v1/openapi.json")
    assert served.status == 200
    return schemathesis.openapi.from_dict(served.body)


@pytest.fixture(scope="module")
def existing(shared_cluster) -> dict[str, list[str]]:
    """Jobs and a run that cases aim at, so that generated requests reach past
    the lookup: patches, pauses and triggers of real jobs, cancels of a real run."""
    job_ids = []
    for example in openapi.JOB_EXAMPLES:
        body = dict(copy.deepcopy(example), idempotency_key=None)
        _harmless_job(body)
        created = shared_cluster.api("n1", "POST", "/v1/jobs", body)
        assert created.status == 201, created
        job_ids.append(created.body["job_id"])
    run = shared_cluster.api("n2", "POST", f"/v1/jobs/{job_ids[0]}:trigger")
    assert run.status == 201, run
    return {"job_id": job_ids, "run_id": [run.body["run_id"]]}


def test_every_operation_keeps_the_contract(shared_cluster, api_schema, existing, subtests):
    operations = [result.ok() for result in api_schema.get_all_operations()]
    documented = sum(len(item) for item in openapi.document()["paths"].values())
    assert len(operations) == documented, "schemathesis did not load every operation"
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            # An operation that takes nothing has no invalid input to generate.
            if mode is GenerationMode.NEGATIVE and not has_inputs(operation):
                continue
            with subtests.test(msg=f"{mode.value} {operation.method.upper()} {operation.path}"):
                fuzz(shared_cluster, operation, mode, existing)
    # After every case: each node still runs, answers, and holds the same
    # replicated state as the others.
    assert sorted(shared_cluster.alive()) == shared_cluster.ids
    for nid in shared_cluster.ids:
        assert shared_cluster.api(nid, "GET", "/v1/node").status == 200
    shared_cluster.ensure_same()


def has_inputs(operation) -> bool:
    return any(len(inputs) for inputs in (operation.path_parameters, operation.query,
                                          operation.body))


def fuzz(cluster, operation, mode: GenerationMode, existing: dict[str, list[str]]) -> None:
    @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, database=None,
              suppress_health_check=list(HealthCheck), phases=PHASES)
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case) -> None:
        turn = next(_TURN)
        make_harmless(case)
        aim(case, existing, turn)
        nid = cluster.ids[turn % len(cluster.ids)]
        # As the bootstrap admin: without a token every case would stop at the 401.
        case.call_and_validate(base_url=cluster.url(nid), checks=CHECKS, timeout=15,
                               headers=auth_headers())
        assert sorted(cluster.alive()) == cluster.ids

    run()


def aim(case, existing: dict[str, list[str]], turn: int) -> None:
    """On every other turn, swap a well-formed generated id for an existing one.
    Not for DELETE: it would remove the jobs that later operations aim at."""
    params = case.path_parameters if isinstance(case.path_parameters, dict) else {}
    if turn % 2 or case.method.upper() == "DELETE":
        return
    for name, pattern in (("job_id", jobspec.JOB_ID_PATTERN),
                          ("run_id", jobspec.RUN_ID_PATTERN)):
        value = params.get(name)
        if isinstance(value, str) and re.fullmatch(pattern, value):
            params[name] = existing[name][turn // 2 % len(existing[name])]


def make_harmless(case) -> None:
    body = case.body if isinstance(case.body, dict) else None
    if body is not None:
        jobs = body.get("jobs") if isinstance(body.get("jobs"), list) else []
        for job in [body, *jobs]:
            _harmless_job(job)
        if _is_number(body.get("wait_s")) and body["wait_s"] > WAIT_S_MAX:
            body["wait_s"] = WAIT_S_MAX
    query = case.query if isinstance(case.query, dict) else {}
    if _as_float(query.get("wait_s")) > WAIT_S_MAX:
        query["wait_s"] = WAIT_S_MAX
    # A digest at an index not reached yet is waited for (up to 5 s); a small
    # index answers at once, found or not.
    if _as_float(query.get("index")) > 1:
        query["index"] = 1


def _harmless_job(job: object) -> None:
    if not isinstance(job, dict):
        return
    _harmless_target(job.get("target"))
    tasks = job["dag"].get("tasks") if isinstance(job.get("dag"), dict) else None
    for task in tasks if isinstance(tasks, list) else ():
        if isinstance(task, dict):
            _harmless_target(task.get("target"))
    alert = job.get("alert")
    if isinstance(alert, dict) and isinstance(alert.get("webhook_url"), str):
        alert["webhook_url"] = HARMLESS_URL


def _harmless_target(target: object) -> None:
    if not isinstance(target, dict):
        return
    if isinstance(target.get("url"), str):
        target["url"] = HARMLESS_URL
    if isinstance(target.get("argv"), list):
        target["argv"] = ["true" if isinstance(a, str) and a else a for a in target["argv"]]


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _as_float(value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return 0.0
