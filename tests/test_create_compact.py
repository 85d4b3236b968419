"""create_jobs_compact and create_jobs_stored: creates whose specs leave out
the members equal to their defaults, or come in the very form the stores keep
them, store and answer exactly what the create_jobs of the whole specs does,
refuse what it refuses, and are what a node proposes once every node applies
them (levels 5 and 6)."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftsched.core import codec, commands, compact, jobspec, keys
from raftsched.errors import CommandRefused
from raftsched.runtime.admission import (COMPACT_CREATE_LEVEL, STORED_CREATE_LEVEL,
                                         ClientProposals, create_form)
from raftsched.storage.base import digest
from raftsched.testing.proptest import examples
from raftsched.testing.replica import Replica
from tests.test_compact import bodies

AT_MS = 1_796_000_000_000
HTTP = {"type": "http", "url": "https://hooks.example.com/a"}
BODIES = [
    {"schedule": {"cron": "*/5 * * * *", "timezone": "Europe/Paris"}, "target": HTTP},
    {"name": "nightly", "run_at": "2030-01-01T00:00:00+02:00",
     "target": dict(HTTP, method="PUT", headers={"X-Team": "a"}, body={"n": 1},
                    timeout_s=5)},
    {"schedule": {"every": "30s"}, "target": HTTP, "metadata": {"owner": "b", "n": [1, 2.5]},
     "retry": {"max_attempts": 5}, "concurrency": {"policy": "skip_if_running"},
     "misfire": {"policy": "skip", "misfire_tolerance_s": 2}, "priority": "high",
     "labels": {"team": "a"}, "secret_keys": ["token"], "jitter_s": 3},
    {"run_at": "2030-01-01T00:00:00Z",
     "target": {"type": "publish", "topic": "orders", "message": {"id": 7}}},
    {"run_at": "2030-01-01T00:00:00Z",
     "target": {"type": "command", "argv": ["echo", "hi"], "queue": "batch"}},
    {"run_at": "2030-01-01T00:00:00Z", "dag": {"tasks": [
        {"id": "a", "target": HTTP},
        {"id": "b", "depends_on": ["a"], "target": dict(HTTP, method="GET")}]}},
]


def _items(bodies: list[dict], prefix: str = "job_c") -> list[commands.CreateJobItem]:
    items = []
    for i, body in enumerate(bodies):
        job_id = f"{prefix}{i:04d}"
        items.append(commands.create_job_item(
            job_id=job_id, spec=jobspec.validate_create(body)["spec"],
            idempotency_key=f"k{i}" if i % 2 else None, shard=keys.shard_of(job_id, 16),
            next_ms=AT_MS + 60_000))
    return items


def _replica() -> Replica:
    log = Replica()
    assert log.run(commands.put_tenant(tenant="t", quota={}, commands=True, actor="bootstrap",
                                       at_ms=AT_MS))["ok"]
    return log


@pytest.mark.parametrize("form", ["compact", "stored"])
def test_a_lean_create_stores_and_answers_what_the_whole_specs_do(form):
    whole, lean = _replica(), _replica()
    items = _items(BODIES)
    shape = {"compact": commands.CreateJobsCompact, "stored": commands.CreateJobsStored}[form]
    # Twice: the second time every item is an idempotent repeat or a conflict.
    for _ in range(2):
        full = commands.create_jobs(tenant="t", at_ms=AT_MS, items=items)
        entry = commands.create_jobs(tenant="t", at_ms=AT_MS, items=items, **{form: True})
        assert type(entry) is shape
        assert whole.run(full) == lean.run(entry)
        assert digest(whole.store) == digest(lean.store)
    results = lean.run(commands.create_jobs(tenant="t", at_ms=AT_MS, **{form: True},
                                            items=_items(BODIES, "job_d")))["results"]
    assert [r["ok"] for r in results] == [True] * len(BODIES)
    for result, item in zip(results, _items(BODIES, "job_d")):
        job = compact.created_job(result["job"])   # (as the API reads it)
        assert job["spec"] == item.spec   # every default restored
        assert lean.job(job["id"])["spec"] == item.spec   # and so does a read


def test_a_stored_spec_is_written_as_it_came():
    """What a create_jobs_stored carries is what the store writes: the
    stored bytes are those of the entry's spec."""
    replica = _replica()
    items = _items(BODIES[:2])
    entry = commands.create_jobs(tenant="t", at_ms=AT_MS, items=items, stored=True)
    assert replica.run(entry)["ok"]
    _, rows = replica.store.raw_items()
    raws = {key: raw for table, key, raw in rows if table == "jobs"}
    for item in entry.items:
        record = codec.unpack_record(raws[keys.job_key(item.job_id)])
        assert codec.pack(record[compact._SPEC_AT]) == codec.pack(item.spec)


def test_a_spec_changed_after_it_was_read_from_its_stored_form_is_caught():
    """The check the suite runs with (tests/conftest.py): a StoredSpec whose
    map no longer reads back from its stored form fails the write."""
    spec = jobspec.validate_create(BODIES[0])["spec"]
    entry = commands.create_jobs(tenant="t", at_ms=AT_MS, items=_items([BODIES[0]]),
                                 stored=True)
    decoded = commands.decode(commands.encode(entry))
    whole = decoded.items[0].spec
    assert type(whole) is compact.StoredSpec and whole == spec
    job = {"v": 1, "id": "job_x", "tenant": "t", "spec": whole, "status": "active",
           "version": 1, "shard": 1, "next_ms": None, "created_ms": AT_MS,
           "updated_ms": AT_MS, "idempotency_key": None, "last_run_id": None}
    compact.compact("jobs", job, b"job_x")
    whole["retry"] = dict(whole["retry"], max_attempts=9)
    with pytest.raises(AssertionError):
        compact.compact("jobs", job, b"job_x")


def test_the_compact_entry_carries_less_than_half_the_bytes():
    items = _items([BODIES[0]] * 50)
    full = commands.encode(commands.create_jobs(tenant="t", at_ms=AT_MS, items=items))
    lean = commands.encode(commands.create_jobs(tenant="t", at_ms=AT_MS, items=items,
                                                compact=True))
    assert len(lean) < len(full) / 2, (len(lean), len(full))
    stored = codec.unpack(lean)["items"][0]["spec"]
    assert set(stored) == {"name", "schedule", "target"}
    assert stored["target"] == HTTP
    leaner = commands.encode(commands.create_jobs(tenant="t", at_ms=AT_MS, items=items,
                                                  stored=True))
    assert len(leaner) < len(lean), (len(leaner), len(lean))


def _entry(spec: dict) -> bytes:
    return codec.pack({"v": commands.VERSION, "t": "create_jobs_compact", "tenant": "t",
                       "at_ms": AT_MS, "items": [{"job_id": "job_x", "spec": spec,
                                                  "idempotency_key": None, "shard": 1,
                                                  "next_ms": None}]})


@pytest.mark.parametrize("change, field", [
    (lambda s: s.pop("schedule"), "items[0].spec.schedule"),
    (lambda s: s.update(retry={"max_attempts": "3"}), "items[0].spec.retry.max_attempts"),
    (lambda s: s.update(metadata={"x": float("nan")}), "items[0].spec.metadata.x"),
    (lambda s: s.update(metadata=b""), "items[0].spec.metadata"),   # bytes: not JSON
    (lambda s: s["target"].update(body=b""), "items[0].spec.target.body"),
    (lambda s: s["target"].update(method=7), "items[0].spec.target.method"),
    (lambda s: s["target"].pop("url"), "items[0].spec.target.url"),
    (lambda s: s.update(later=float("inf")), "items[0].spec.later"),
    (lambda s: s["target"].update(body=[float("nan")]), "items[0].spec.target.body[0]"),
    (lambda s: s["schedule"].update(later={"x": float("-inf")}),
     "items[0].spec.schedule.later.x"),
])
def test_a_compact_spec_is_refused_as_a_whole_one_is(change, field):
    spec = jobspec.validate_create(BODIES[0])["spec"]
    lean = {"name": spec["name"], "schedule": dict(spec["schedule"]), "target": dict(HTTP)}
    assert commands.decode(_entry(lean)).items[0].spec == lean
    change(lean)
    with pytest.raises(CommandRefused) as refused:
        commands.decode(_entry(lean))
    assert refused.value.field == field
    log = _replica()
    result = log.run_entry(_entry(lean))
    assert (result["ok"], result["error"]) == (False, "invalid_command")


def _stored_entry(spec: object) -> bytes:
    return codec.pack({"v": commands.VERSION, "t": "create_jobs_stored", "tenant": "t",
                       "at_ms": AT_MS, "items": [{"job_id": "job_x", "spec": spec,
                                                  "idempotency_key": None, "shard": 1,
                                                  "next_ms": None}]})


def _stored_form(body: dict) -> list:
    return compact.stored_spec(jobspec.validate_create(body)["spec"])


@pytest.mark.parametrize("change, field", [
    (lambda s: 5, "items[0].spec"),
    (lambda s: [7, *s[1:]], "items[0].spec"),   # its other members: no map
    (lambda s: [{"retry": {"max_attempts": "3"}}, *s[1:]], "items[0].spec.retry.max_attempts"),
    (lambda s: [{"metadata": {"x": float("nan")}}, *s[1:]], "items[0].spec.metadata.x"),
    (lambda s: s[:2], "items[0].spec.schedule"),
    (lambda s: [*s, "more"], "items[0].spec"),   # past the form's end: refused, not stored
    (lambda s: [], "items[0].spec"),
    (lambda s: [s[0], s[1], [*s[2], 1], s[3]], "items[0].spec"),
    (lambda s: [s[0], s[1], s[2], [5, *s[3][1:]]], "items[0].spec"),
    (lambda s: [*s[:3], [None, "http", "http://[::1/x"]], "items[0].spec.name"),
    (lambda s: [*s[:3], {"type": "publish", "topic": "t", "message": 1}], "items[0].spec.name"),
])
def test_a_stored_spec_is_refused_as_a_whole_one_is(change, field):
    """A spec in its stored form is read back and checked as a compact spec
    is; a name left out must be one an HTTP target makes."""
    stored = _stored_form(BODIES[0])
    assert stored[1] is None   # named by its target, so left out
    assert commands.decode(_stored_entry(stored)).items[0].spec == \
        jobspec.validate_create(BODIES[0])["spec"]
    with pytest.raises(CommandRefused) as refused:
        commands.decode(_stored_entry(change(stored)))
    assert refused.value.field == field
    result = _replica().run_entry(_stored_entry(change(stored)))
    assert (result["ok"], result["error"]) == (False, "invalid_command")


class _Proposed:
    def __init__(self) -> None:
        self.commands: list = []

    async def __call__(self, command: commands.Command) -> dict:
        self.commands.append(command)
        if isinstance(command, commands.CreateJobs):
            return {"ok": True, "results": [{"ok": True}] * len(command.items)}
        return {"ok": True}


@pytest.mark.parametrize("level", [COMPACT_CREATE_LEVEL - 1, COMPACT_CREATE_LEVEL,
                                   STORED_CREATE_LEVEL])
async def test_a_node_proposes_lean_creates_once_every_node_applies_them(level):
    proposed = _Proposed()
    proposals = ClientProposals(proposed, create_form=lambda: create_form(level))
    items = _items(BODIES[:2])
    await proposals.batch([commands.create_jobs(tenant="t", at_ms=AT_MS, items=items)])
    singles = [commands.create_job(job_id=i.job_id, tenant="t", spec=i.spec,
                                   idempotency_key=None, shard=i.shard, next_ms=i.next_ms,
                                   at_ms=AT_MS) for i in _items(BODIES[:2], "job_g")]
    await asyncio.gather(*(proposals.create(c, 100) for c in singles))
    shape = {COMPACT_CREATE_LEVEL - 1: "CreateJobs", COMPACT_CREATE_LEVEL: "CreateJobsCompact",
             STORED_CREATE_LEVEL: "CreateJobsStored"}[level]
    assert [type(c).__name__ for c in proposed.commands] == [shape] * 2   # batch, then group
    for entry, body_items in zip(proposed.commands, (items, _items(BODIES[:2], "job_g"))):
        for item, whole in zip(entry.items, body_items):
            if level >= STORED_CREATE_LEVEL:
                assert item.spec == compact.stored_spec(whole.spec)
            elif level >= COMPACT_CREATE_LEVEL:
                assert item.spec == compact.compact_spec(whole.spec)
            else:
                assert item.spec == whole.spec


@settings(max_examples=examples(300), deadline=None)
@given(body=bodies, name=st.sampled_from([None, "nightly"]))
def test_any_spec_stored_as_it_came_reads_back_as_apply_used_it(body, name):
    """Over varied specs: a create_jobs_stored stores the same bytes as a
    create_jobs of the whole spec, and the job reads back as applied."""
    if name is not None:
        body = dict(body, name=name)
    items = _items([body], "job_p")
    whole, lean = _replica(), _replica()
    answered = lean.run(commands.create_jobs(tenant="t", at_ms=AT_MS, items=items, stored=True))
    assert whole.run(commands.create_jobs(tenant="t", at_ms=AT_MS, items=items)) == answered
    assert digest(whole.store) == digest(lean.store)
    answered_job = compact.created_job(answered["results"][0]["job"])   # (as the API reads it)
    assert lean.job(items[0].job_id)["spec"] == answered_job["spec"] == items[0].spec
