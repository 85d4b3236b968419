"""create_jobs_compact: creates whose specs leave out the members equal to
their defaults store and answer exactly what the create_jobs of the whole
specs does, refuse what it refuses, and are what a node proposes once every
node applies them (level 5)."""

from __future__ import annotations

import asyncio

import pytest

from raftsched.core import codec, commands, jobspec, keys
from raftsched.errors import CommandRefused
from raftsched.runtime.admission import COMPACT_CREATE_LEVEL, ClientProposals
from raftsched.storage.base import digest
from raftsched.testing.replica import Replica

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


def test_a_compact_create_stores_and_answers_what_the_whole_specs_do():
    whole, lean = _replica(), _replica()
    items = _items(BODIES)
    # Twice: the second time every item is an idempotent repeat or a conflict.
    for _ in range(2):
        full = commands.create_jobs(tenant="t", at_ms=AT_MS, items=items)
        compact = commands.create_jobs(tenant="t", at_ms=AT_MS, items=items, compact=True)
        assert isinstance(compact, commands.CreateJobsCompact)
        assert whole.run(full) == lean.run(compact)
        assert digest(whole.store) == digest(lean.store)
    results = lean.run(commands.create_jobs(tenant="t", at_ms=AT_MS, compact=True,
                                            items=_items(BODIES, "job_d")))["results"]
    assert [r["ok"] for r in results] == [True] * len(BODIES)
    for result, item in zip(results, _items(BODIES, "job_d")):
        assert result["job"]["spec"] == item.spec   # every default restored


def test_the_compact_entry_carries_less_than_half_the_bytes():
    items = _items([BODIES[0]] * 50)
    full = commands.encode(commands.create_jobs(tenant="t", at_ms=AT_MS, items=items))
    lean = commands.encode(commands.create_jobs(tenant="t", at_ms=AT_MS, items=items,
                                                compact=True))
    assert len(lean) < len(full) / 2, (len(lean), len(full))
    stored = codec.unpack(lean)["items"][0]["spec"]
    assert set(stored) == {"name", "schedule", "target"}
    assert stored["target"] == HTTP


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


class _Proposed:
    def __init__(self) -> None:
        self.commands: list = []

    async def __call__(self, command: commands.Command) -> dict:
        self.commands.append(command)
        if isinstance(command, commands.CreateJobs):
            return {"ok": True, "results": [{"ok": True}] * len(command.items)}
        return {"ok": True}


@pytest.mark.parametrize("level", [COMPACT_CREATE_LEVEL - 1, COMPACT_CREATE_LEVEL])
async def test_a_node_proposes_compact_creates_once_every_node_applies_them(level):
    proposed = _Proposed()
    proposals = ClientProposals(proposed,
                                compact_creates=lambda: level >= COMPACT_CREATE_LEVEL)
    items = _items(BODIES[:2])
    await proposals.batch([commands.create_jobs(tenant="t", at_ms=AT_MS, items=items)])
    singles = [commands.create_job(job_id=i.job_id, tenant="t", spec=i.spec,
                                   idempotency_key=None, shard=i.shard, next_ms=i.next_ms,
                                   at_ms=AT_MS) for i in _items(BODIES[:2], "job_g")]
    await asyncio.gather(*(proposals.create(c, 100) for c in singles))
    compact = level >= COMPACT_CREATE_LEVEL
    assert [type(c).__name__ for c in proposed.commands] == \
        ["CreateJobsCompact" if compact else "CreateJobs"] * 2   # the batch, then the group
    for entry in proposed.commands:
        specs = [item.spec for item in entry.items]
        assert all(("retry" in spec) != compact for spec in specs)
