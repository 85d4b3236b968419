"""raftsched.client has exactly one method per OpenAPI operation, sync and async; it sends what the API takes, raises 4xx as user errors and 5xx or silence as cluster errors, and the examples of docs/client.md run against a live cluster."""

from __future__ import annotations

import asyncio
import datetime as dt
import inspect
import re
from pathlib import Path

import pytest

from raftsched.api.openapi import document
from raftsched.client import (OPERATIONS, AsyncClient, BadRequest, CannotConnect, Client,
                              ClusterError, NotFound, Unavailable, UserError, operations, wire)
from raftsched.testing.cluster import free_ports
from raftsched.testing.http import ADMIN_TOKEN, wait_until

# Public members of the clients that are not operations.
NOT_OPERATIONS = {"send", "close", "settings"}
DOC = Path(__file__).resolve().parent.parent / "docs" / "client.md"


def document_operations() -> dict[tuple[str, str], dict]:
    return {(method.upper(), path): op for path, item in document()["paths"].items()
            for method, op in item.items()}


def public_methods(cls: type) -> set[str]:
    return {name for name, _ in inspect.getmembers(cls) if not name.startswith("_")}


def test_every_operation_of_the_document_has_exactly_one_method():
    table = {(op.method, op.path): name for name, op in OPERATIONS.items()}
    assert len(table) == len(OPERATIONS), "two methods share an operation"
    assert set(table) == set(document_operations())
    for cls in (Client, AsyncClient):
        assert public_methods(cls) - NOT_OPERATIONS == set(OPERATIONS), cls
    for name in OPERATIONS:
        assert inspect.iscoroutinefunction(getattr(AsyncClient, name)), name
        assert not inspect.iscoroutinefunction(getattr(Client, name)), name


def test_each_method_takes_the_path_and_tenant_parameters_of_its_operation():
    for (method, path), op in document_operations().items():
        mine = next(o for o in OPERATIONS.values() if (o.method, o.path) == (method, path))
        params = op.get("parameters", [])
        in_path = [p["name"] for p in params if p["in"] == "path"]
        signature = inspect.signature(getattr(operations, mine.name))
        assert list(signature.parameters)[:len(in_path)] == in_path, mine.name
        takes_tenant = any(p["name"] == "tenant" and p["in"] == "query" for p in params)
        assert mine.tenant == takes_tenant, mine.name


def test_keyword_arguments_are_query_parameters_the_document_names():
    """A GET's keyword arguments become its query: each must be a parameter of
    the operation (labels is sent as the repeated `label`)."""
    for (method, path), op in document_operations().items():
        if method != "GET":
            continue
        mine = next(o for o in OPERATIONS.values() if (o.method, o.path) == (method, path))
        names = {p["name"] for p in op.get("parameters", []) if p["in"] == "query"}
        keywords = {name for name, p in inspect.signature(getattr(operations, mine.name))
                    .parameters.items() if p.kind is p.KEYWORD_ONLY}
        assert {("label" if k == "labels" else k) for k in keywords} <= names, mine.name


def test_keyword_arguments_of_a_write_are_members_of_its_body():
    """A write's keyword arguments become its JSON body: each must be a member
    of the operation's request schema."""
    schemas = document()["components"]["schemas"]
    for (method, path), op in document_operations().items():
        if method == "GET" or "requestBody" not in op:
            continue
        schema = op["requestBody"]["content"]["application/json"]["schema"]
        schema = schemas[schema["$ref"].rsplit("/", 1)[1]] if "$ref" in schema else schema
        mine = next(o for o in OPERATIONS.values() if (o.method, o.path) == (method, path))
        keywords = {name for name, p in inspect.signature(getattr(operations, mine.name))
                    .parameters.items() if p.kind is p.KEYWORD_ONLY}
        assert keywords <= set(schema.get("properties", {})), mine.name


def test_a_call_is_encoded_with_token_tenant_query_and_body():
    settings = wire.Settings.resolve("http://127.0.0.1:8701/", "tok", "team-a", 5.0, {})
    request = wire.encode(operations.list_jobs(labels=["a:1", "b:2"], status="active"), settings)
    assert request.url == ("http://127.0.0.1:8701/v1/jobs?status=active&label=a%3A1"
                           "&label=b%3A2&tenant=team-a")
    assert request.headers["Authorization"] == "Bearer tok"
    assert request.body is None
    when = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    backfill = wire.encode(operations.backfill_job("job_1", start=when, end="2026-02-01T00:00:00Z",
                                                   dry_run=True), settings)
    assert backfill.url.endswith("/v1/jobs/job_1:backfill?tenant=team-a")
    assert backfill.body == (b'{"start": "2026-01-01T00:00:00+00:00", '
                             b'"end": "2026-02-01T00:00:00Z", "dry_run": true}')
    # Operations outside a tenant do not carry it.
    assert "tenant" not in wire.encode(operations.cluster(), settings).url


def test_settings_come_from_arguments_then_environment_then_defaults():
    env = {"RAFTSCHED_URL": "http://127.0.0.1:9999", "RAFTSCHED_TOKEN": "from-env"}
    assert wire.Settings.resolve(None, None, None, None, env).url == "http://127.0.0.1:9999"
    assert wire.Settings.resolve(None, None, None, None, env).token == "from-env"
    assert wire.Settings.resolve("http://127.0.0.1:1", "arg", None, None, env).token == "arg"
    default = wire.Settings.resolve(None, None, None, None, {})
    assert (default.url, default.token) == ("http://127.0.0.1:8701", None)
    with pytest.raises(ValueError):
        wire.Settings.resolve(None, None, None, 0, {})


def test_a_naive_datetime_is_refused_before_sending():
    with pytest.raises(ValueError, match="time zone"):
        operations.list_runs(scheduled_after=dt.datetime(2026, 1, 1))


def test_error_answers_become_typed_errors_with_the_problem():
    call = operations.get_job("job_00000000000000000000")
    problem = b'{"type": "/problems/not-found", "title": "Not found", "status": 404, ' \
              b'"detail": "job job_0 not found", "field": "job_id"}'
    with pytest.raises(NotFound) as caught:
        wire.decode(call, 404, {}, problem)
    assert isinstance(caught.value, UserError)
    assert (caught.value.status, caught.value.field, caught.value.title) == \
        (404, "job_id", "Not found")
    with pytest.raises(Unavailable) as down:
        wire.decode(call, 503, {"Retry-After": "1"},
                    b'{"status": 503, "title": "Cluster unavailable", "detail": "x", '
                    b'"reason": "no_quorum"}')
    assert isinstance(down.value, ClusterError)
    assert (down.value.reason, down.value.retry_after_s) == ("no_quorum", 1.0)
    with pytest.raises(ClusterError) as proxy:
        wire.decode(call, 502, {}, b"<html>bad gateway</html>")
    assert "bad gateway" in proxy.value.detail


def test_no_node_at_the_url_is_a_cluster_error():
    url = f"http://127.0.0.1:{free_ports(1)[0]}"
    with pytest.raises(CannotConnect) as caught:
        Client(url, token="x", timeout_s=5).cluster()
    assert isinstance(caught.value, ClusterError)

    async def call() -> None:
        async with AsyncClient(url, token="x", timeout_s=5) as api:
            await api.cluster()
    with pytest.raises(CannotConnect):
        asyncio.run(call())


# --- against a live cluster ---------------------------------------------------------------

def failing_one_off(sink_url: str) -> dict:
    """A one-off due now whose target answers 500 and which is never retried."""
    return {"run_at": dt.datetime.now(dt.timezone.utc),
            "target": {"type": "http", "url": sink_url + "/fail", "timeout_s": 5},
            "retry": {"max_attempts": 1}}


@pytest.fixture(scope="module")
def failing_sink():
    from raftsched.testing.sink import Sink
    with Sink(status_for=lambda call: 500) as sink:
        yield sink


def wait_failed(api: Client, job_id: str) -> list[dict]:
    return wait_until(lambda: api.list_runs(job_id=job_id, state="failed")["runs"],
                      60, f"a failed run of {job_id}")


@pytest.mark.integration
def test_sync_client_against_a_cluster(shared_cluster, failing_sink):
    api = Client(shared_cluster.url("n2"), token=ADMIN_TOKEN)
    assert api.healthz()["ok"] is True
    assert set(api.cluster()["nodes"]) == {"n1", "n2", "n3"}
    job = api.create_job(dict(failing_one_off(failing_sink.url), name="sync-one-off",
                              labels={"suite": "client"}))
    assert api.get_job(job["job_id"])["name"] == "sync-one-off"
    listed = api.list_jobs(labels=["suite:client"], name_prefix="sync-")["jobs"]
    assert [j["job_id"] for j in listed] == [job["job_id"]]
    [failed] = wait_failed(api, job["job_id"])
    assert failed["state"] == "failed"
    redriven = api.retry_run(failed["run_id"])
    assert (redriven["run_id"], redriven["trigger"]) == (failed["run_id"], "retry")
    wait_until(lambda: api.get_run(failed["run_id"])["state"] == "failed"
               and api.get_run(failed["run_id"])["attempt"] == 2, 60, "the re-driven attempt")
    assert len(api.run_logs(failed["run_id"])["attempts"]) == 2
    preview = api.preview_schedule(schedule={"cron": "0 2 * * *", "timezone": "Asia/Kolkata"},
                                   count=3)
    assert [t[-6:] for t in preview["fire_times"]] == ["+05:30"] * 3
    assert api.delete_job(job["job_id"]) is None
    with pytest.raises(NotFound) as missing:
        api.get_job(job["job_id"])
    assert missing.value.field == "job_id"
    with pytest.raises(BadRequest) as bad:
        api.create_job({"schedule": {"cron": "61 * * * *"},
                        "target": {"type": "http", "url": failing_sink.url}})
    assert bad.value.field is not None
    assert bad.value.field.startswith("schedule")


@pytest.mark.integration
async def test_async_client_against_a_cluster(shared_cluster, failing_sink):
    async with AsyncClient(shared_cluster.url("n3"), token=ADMIN_TOKEN) as api:
        job = await api.create_job(dict(failing_one_off(failing_sink.url), name="async-one-off"))
        assert (await api.get_job(job["job_id"]))["job_id"] == job["job_id"]
        deadline = asyncio.get_running_loop().time() + 60
        while not (failed := (await api.list_runs(job_id=job["job_id"], state="failed"))["runs"]):
            assert asyncio.get_running_loop().time() < deadline, "no failed run"
            await asyncio.sleep(0.1)
        redriven = await api.retry_run(failed[0]["run_id"])
        assert redriven["trigger"] == "retry"
        hourly = await api.create_job({"schedule": {"every": "1h"},
                                       "target": {"type": "http", "url": failing_sink.url}})
        paused = await api.pause_job(hourly["job_id"], note="checking")
        assert (paused["status"], paused["pause_note"]) == ("paused", "checking")
        assert (await api.resume_job(hourly["job_id"]))["status"] == "active"
        with pytest.raises(NotFound):
            await api.get_run("run_" + "0" * 24)
        assert (await api.cluster())["leader"] in {"n1", "n2", "n3"}


@pytest.mark.integration
def test_the_examples_of_the_client_doc_run(shared_cluster, failing_sink, monkeypatch):
    monkeypatch.setenv("RAFTSCHED_URL", shared_cluster.url("n1"))
    monkeypatch.setenv("RAFTSCHED_TOKEN", ADMIN_TOKEN)
    setup = Client()
    job_id = setup.create_job(failing_one_off(failing_sink.url))["job_id"]
    wait_failed(setup, job_id)
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) >= 6
    scope: dict = {"job_id": job_id}
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), scope)
    assert scope["reminder"]["next_run_at"] is not None
    assert len(scope["results"]) == 1500 and all(r["created"] for r in scope["results"])
    assert [r["run_id"] for r in scope["dead"]] == [r["run_id"] for r in scope["page"]["runs"]]
    assert scope["redriven"]["trigger"] == "retry"
