"""Retention and bounds: purge removes only what is past a bound (never an open run, never a
stale item), the purger chooses oldest first within bounded scans, topics and groups are
bounded, a full LMDB map stops the commit, and a live job keeps only max_runs finished runs."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from raftsched import cli, limits
from raftsched.cli import build_parser
from raftsched.core import codec, commands, jobspec, keys, retention
from raftsched.core.apply import (ALERTS, IDEM, JOBS, RUNS, TOPIC_META, TOPICS,
                                  Transition)
from raftsched.core.tx import BACKFILLS, JOB_STATE, JOBS_BY_TENANT, RunsPurged
from raftsched.errors import InvalidInput, StorageFull
from raftsched.runtime.purger import Bounds, Purger, Retention, Touched
from raftsched.storage import base as storage_base
from raftsched.storage.lmdb_store import LmdbStore
from raftsched.storage.output_store import OutputStore
from raftsched.testing.http import wait_until
from raftsched.testing.replica import Replica

SHARDS = 16
SECOND_MS = 1000
HTTP = {"type": "http", "url": "http://127.0.0.1:1/x", "method": "POST", "headers": {},
        "body": None, "timeout_s": 5.0}
DAY_MS = 24 * 3600 * SECOND_MS
# Cluster defaults a purge command carries in these tests.
DEFAULTS = {"history_max_runs": 1000, "history_max_age_ms": 30 * DAY_MS,
            "finished_job_retention_ms": 7 * DAY_MS, "idempotency_ttl_ms": DAY_MS}


@pytest.fixture(params=["memory", "lmdb"])
def log(request: pytest.FixtureRequest, tmp_path: Path):
    replica = Replica()
    if request.param == "lmdb":
        replica.store = LmdbStore(str(tmp_path / "state"), map_size=64 * 1024 ** 2)
    yield replica
    replica.store.close()


def make_job(log: Replica, job_id: str = "job_a1", *, schedule: dict | None = None,
             history: dict | None = None, idem: str | None = None, alert: dict | None = None,
             max_attempts: int = 1) -> dict:
    schedule = schedule or {"kind": "every", "every_ms": SECOND_MS, "text": "1s"}
    spec = {"name": "j", "schedule": schedule, "target": HTTP,
            "retry": {"max_attempts": max_attempts, "backoff": "fixed", "base_s": 1.0,
                      "max_s": 1.0, "non_retryable_exit_codes": []},
            "concurrency": {"policy": "allow"}, "alert": alert or {}, "metadata": {},
            "history": history or {}}
    shard = keys.shard_of(job_id, SHARDS)
    log.run(commands.assign_shards(assignments=[(shard, "n1")], at_ms=1))
    next_ms = schedule.get("run_at_ms", 10_000)
    result = log.run(commands.create_job(job_id=job_id, tenant="default", spec=spec,
                                         idempotency_key=idem, shard=shard, next_ms=next_ms,
                                         at_ms=1_000))
    assert result["ok"], result
    return result["job"]


def fire_next(log: Replica, job_id: str = "job_a1") -> str:
    """Fire the job's next occurrence on n1 (at its due time); return the run id."""
    job = log.store.get(JOBS, keys.job_key(job_id))
    due = job["next_ms"]
    token = log.store.get("shards", keys.shard_key(job["shard"]))["token"]
    once = job["spec"]["schedule"]["kind"] == "once"
    result = log.run(commands.fire(shard=job["shard"], token=token, upto_ms=due, node="n1",
                                   at_ms=due, items=[(job_id, due, None if once else due + 1000,
                                                      [due], False)]))
    assert result["ok"] and result["fired"] == 1, result
    return keys.run_id(job_id, due)


def finish(log: Replica, run_id: str, at_ms: int, ok: bool = True) -> None:
    # The run is n1's from its fire on (the lease is taken at fire): no start.
    end = {"run_id": run_id, "event": "finish", "holder": "n1", "attempt": 1, "at_ms": at_ms,
           "ok": ok, "retryable": False, "retry_delay_ms": None, "http_status": 200,
           "exit_code": None, "error": None, "output_node": "n1"}
    result = log.run(commands.run_updates(updates=[end]))
    assert result["accepted"] == [True], result


def run_history(log: Replica, count: int, job_id: str = "job_a1") -> list[str]:
    """Fire and finish `count` occurrences; return their run ids, oldest first."""
    ids = []
    for _ in range(count):
        run_id = fire_next(log, job_id)
        finish(log, run_id, log.store.get(RUNS, run_id.encode())["scheduled_ms"] + 100)
        ids.append(run_id)
    return ids


def purge(log: Replica, at_ms: int, *, runs=(), jobs=(), idem=(), **bounds: int) -> dict:
    result = log.run(commands.purge(at_ms=at_ms, **{**DEFAULTS, **bounds}, runs=list(runs),
                                    jobs=list(jobs), idem=list(idem)))
    assert result["ok"], result
    return result


def history(log: Replica, job_id: str = "job_a1") -> list[str]:
    return [run["id"] for _, run in log.store.scan(RUNS, start=keys.job_runs_prefix(job_id),
                                                   stop=keys.job_runs_stop(job_id))]


# --- apply: runs ----------------------------------------------------------------------

def test_count_bound_purges_the_oldest_finished_runs_and_keeps_open_ones(log):
    make_job(log, history={"max_runs": 3})
    finished = run_history(log, 6)
    open_run = fire_next(log)
    result = purge(log, 20_000, runs=[(r, "job_a1") for r in finished + [open_run]])
    assert (result["runs"], result["refused"]) == (3, 4)
    assert history(log) == finished[3:] + [open_run]
    for run_id in finished[:3]:
        assert log.store.get(RUNS, run_id.encode()) is None
    assert log.store.get(RUNS, open_run.encode())["state"] == "running"
    assert log.store.get(JOBS, b"job_a1")["runs_count"] == 4


def test_a_purge_tells_the_nodes_which_runs_went(log):
    make_job(log, history={"max_runs": 1})
    old, new = run_history(log, 2)
    log.effects.clear()
    purge(log, 20_000, runs=[(old, "job_a1"), (new, "job_a1")])
    assert log.effects == [RunsPurged(run_ids=(old,))]
    log.effects.clear()
    purge(log, 20_000, runs=[(new, "job_a1")])
    assert log.effects == []


def test_the_output_of_purged_runs_is_dropped(tmp_path: Path):
    outputs = OutputStore(str(tmp_path / "output"))
    for run_id in ("run_a", "run_ab", "run_b"):
        for attempt in (1, 2):
            outputs.put(run_id, attempt, {"stdout": "x" * 100}, now_ms=1_000)
    assert outputs.delete_runs(["run_a", "run_missing"]) == 2
    assert outputs.get("run_a") == []
    assert [r["attempt"] for r in outputs.get("run_ab")] == [1, 2]
    assert outputs.stats()["records"] == 4
    assert outputs.stats()["bytes"] == sum(len(codec.pack(r)) for run in ("run_ab", "run_b")
                                           for r in outputs.get(run))
    outputs.close()


def test_the_count_bound_uses_the_command_default_when_the_job_sets_none(log):
    make_job(log)
    finished = run_history(log, 4)
    result = purge(log, 20_000, runs=[(r, "job_a1") for r in finished], history_max_runs=2)
    assert result["runs"] == 2
    assert history(log) == finished[2:]


def test_age_bound_is_judged_by_the_commands_at_ms(log):
    make_job(log, history={"max_age_ms": 10_000})
    [run_id] = run_history(log, 1)
    finished_ms = log.store.get(RUNS, run_id.encode())["finished_ms"]
    assert purge(log, finished_ms + 9_999, runs=[(run_id, "job_a1")])["refused"] == 1
    assert purge(log, finished_ms + 10_000, runs=[(run_id, "job_a1")])["runs"] == 1
    assert history(log) == []


def test_open_runs_survive_every_bound_even_of_a_deleted_job(log):
    make_job(log, history={"max_runs": 1, "max_age_ms": 1000})
    open_run = fire_next(log)
    log.run(commands.delete_job(job_id="job_a1", at_ms=11_000))
    far = 11_000 + 100 * DAY_MS
    result = purge(log, far, runs=[(open_run, "job_a1")], jobs=["job_a1"])
    assert (result["runs"], result["jobs"], result["refused"]) == (0, 0, 2)
    assert log.store.get(RUNS, open_run.encode())["state"] == "running"
    assert log.store.get(JOBS, b"job_a1")["status"] == "deleted"


def test_a_run_whose_alert_waits_for_delivery_is_kept(log):
    make_job(log, history={"max_runs": 1}, alert={"webhook_url": "http://127.0.0.1:1/a"})
    failed = fire_next(log)
    finish(log, failed, 10_100, ok=False)
    run_history(log, 2)
    assert log.store.get(ALERTS, failed.encode()) is not None
    assert purge(log, 20_000, runs=[(failed, "job_a1")])["refused"] == 1
    log.run(commands.alert_done(run_id=failed, outcome="sent", error=None, at_ms=20_000))
    assert purge(log, 20_000, runs=[(failed, "job_a1")])["runs"] == 1


def test_apply_refuses_stale_items(log):
    make_job(log, history={"max_runs": 1})
    make_job(log, "job_b2", history={"max_runs": 1})
    old, new = run_history(log, 2)
    [other] = run_history(log, 1, "job_b2")
    result = purge(log, 20_000, runs=[(old, "job_b2"),         # not that job's run
                                      ("run_" + "0" * 24, "job_a1"),   # no such run
                                      (other, "job_b2"),       # within its job's bound
                                      (old, "job_a1"), (old, "job_a1"),  # the second is gone
                                      (new, "job_a1")])        # the bound is reached again
    assert (result["runs"], result["refused"]) == (1, 5)
    assert history(log) == [new]
    assert history(log, "job_b2") == [other]


def test_purges_are_deterministic_across_replicas(tmp_path: Path):
    replicas = [Replica(), Replica()]
    replicas[1].store = LmdbStore(str(tmp_path / "b"), map_size=64 * 1024 ** 2)
    for log in replicas:
        make_job(log, history={"max_runs": 2})
        finished = run_history(log, 5)
        purge(log, 20_000, runs=[(r, "job_a1") for r in finished])
    assert replicas[0].store.raw_items() == replicas[1].store.raw_items()
    replicas[1].store.close()


# --- apply: jobs and idempotency keys ---------------------------------------------------

def test_a_deleted_job_goes_after_the_retention_with_its_runs(log):
    make_job(log, idem="k")
    runs = run_history(log, 2)
    log.run(commands.delete_job(job_id="job_a1", at_ms=50_000))
    retention_ms = DEFAULTS["finished_job_retention_ms"]
    early = purge(log, 50_000 + retention_ms - 1, runs=[(r, "job_a1") for r in runs],
                  jobs=["job_a1"])
    assert early["refused"] == 3
    # A job with runs left is refused; in one command runs go first, then the job.
    assert purge(log, 50_000 + retention_ms, jobs=["job_a1"])["refused"] == 1
    done = purge(log, 50_000 + retention_ms, runs=[(r, "job_a1") for r in runs],
                 jobs=["job_a1"])
    assert (done["runs"], done["jobs"]) == (2, 1)
    assert log.store.get(JOBS, b"job_a1") is None
    assert log.store.scan(JOBS_BY_TENANT) == []   # gone from its tenant's listing too
    assert history(log) == []
    assert log.store.get(IDEM, keys.idem_key("default", "k")) is not None


def test_a_completed_one_off_goes_after_the_retention_from_its_completion(log):
    make_job(log, schedule={"kind": "once", "run_at_ms": 40_000, "offset_min": 0})
    run_id = fire_next(log)
    finish(log, run_id, 40_500)
    job = log.store.get(JOBS, b"job_a1")
    assert (job["status"], job["updated_ms"]) == ("completed", 40_000)
    retention_ms = DEFAULTS["finished_job_retention_ms"]
    assert purge(log, 39_999 + retention_ms, runs=[(run_id, "job_a1")],
                 jobs=["job_a1"])["refused"] == 2
    done = purge(log, 40_000 + retention_ms, runs=[(run_id, "job_a1")], jobs=["job_a1"])
    assert (done["runs"], done["jobs"]) == (1, 1)


def test_an_idempotency_key_stays_reserved_until_its_ttl(log):
    make_job(log, idem="k")
    log.run(commands.delete_job(job_id="job_a1", at_ms=2_000))
    again = log.run(commands.create_job(job_id="job_b2", tenant="default",
                                        spec=log.store.get(JOBS, b"job_a1")["spec"],
                                        idempotency_key="k", shard=1, next_ms=None,
                                        at_ms=3_000))
    assert (again["error"], again["reserved_ms"]) == ("idempotency_key_reserved", 1_000)
    item = [("default", "k")]
    assert purge(log, 1_000 + DAY_MS - 1, idem=item)["refused"] == 1
    assert purge(log, 1_000 + DAY_MS, idem=item)["idem"] == 1
    created = log.run(commands.create_job(job_id="job_b2", tenant="default",
                                          spec=log.store.get(JOBS, b"job_a1")["spec"],
                                          idempotency_key="k", shard=1, next_ms=None,
                                          at_ms=1_000 + DAY_MS))
    assert created["ok"] and not created["existing"]


def test_a_key_of_a_live_job_answers_with_the_job(log):
    make_job(log, idem="k")
    value = log.store.get(IDEM, keys.idem_key("default", "k"))
    assert value == {"v": 1, "job_id": "job_a1", "created_ms": 1_000}
    spec = log.store.get(JOBS, b"job_a1")["spec"]
    again = log.run(commands.create_job(job_id="job_b2", tenant="default", spec=spec,
                                        idempotency_key="k", shard=1, next_ms=None, at_ms=2_000))
    assert again["existing"] and again["job"]["id"] == "job_a1"


def test_old_idempotency_values_are_a_bare_job_id_dated_by_their_job(log):
    make_job(log)
    key = keys.idem_key("default", "old")
    log.index += 1
    log.store.commit(Transition(writes=((IDEM, key, "job_a1"),), effects=(), result={}),
                     log.index)
    assert retention.idem_entry("job_a1") == ("job_a1", None)
    assert purge(log, 1_000 + DAY_MS - 1, idem=[("default", "old")])["refused"] == 1
    assert purge(log, 1_000 + DAY_MS, idem=[("default", "old")])["idem"] == 1


# --- the history member of a job body ------------------------------------------------------

def test_history_is_validated_and_stored_in_ms():
    assert jobspec.validate_history(None) == {}
    assert jobspec.validate_history({"max_runs": 5, "max_age_s": 1.5}) == {
        "max_runs": 5, "max_age_ms": 1500}
    for body, field, limit in (
            ({"max_runs": 0}, "history.max_runs", "history_max_runs_max"),
            ({"max_runs": True}, "history.max_runs", "history_max_runs_max"),
            ({"max_runs": limits.history_max_runs_max + 1}, "history.max_runs",
             "history_max_runs_max"),
            ({"max_age_s": float("nan")}, "history.max_age_s", "history_max_age_s_max"),
            ({"max_age_s": limits.history_max_age_s_max + 1}, "history.max_age_s",
             "history_max_age_s_max"),
            ({"max_count": 5}, "history.max_count", None),
            ([5], "history", None)):
        with pytest.raises(InvalidInput) as caught:
            jobspec.validate_history(body)
        assert (caught.value.field, caught.value.limit) == (field, limit), body
    current = jobspec.validate_create({"schedule": {"every": "1s"},
                                       "target": {"type": "http", "url": "http://h/x"}})["spec"]
    assert current["history"] == {}
    patched = jobspec.validate_patch({"history": {"max_runs": 7}}, current)
    assert patched["history"] == {"max_runs": 7}


def test_storage_and_retention_flags_default_to_the_named_limits():
    base = ["node", "--id", "n1", "--http", "127.0.0.1:1", "--raft", "127.0.0.1:2",
            "--data", "/tmp/x"]
    args = build_parser().parse_args(base)
    assert (args.max_data_bytes, args.min_free_disk_bytes) == (
        limits.max_data_bytes_default, limits.min_free_disk_bytes_default)
    assert (args.history_max_runs, args.history_max_age_s) == (1000, 30 * 86400)
    assert (args.finished_job_retention_s, args.idempotency_ttl_s) == (7 * 86400, 86400)
    assert cli._storage_flags_error(args) is None
    for flags, named in ((["--max-data-bytes", "1000"], "--max-data-bytes"),
                         (["--history-max-runs", "0"], "--history-max-runs"),
                         (["--idempotency-ttl-s", "nan"], "--idempotency-ttl-s"),
                         (["--finished-job-retention-s", "-1"], "--finished-job-retention-s")):
        assert named in cli._storage_flags_error(build_parser().parse_args(base + flags))


# --- the purger's choice ---------------------------------------------------------------

def purger_over(log: Replica, **config: float) -> Purger:
    settings = {"history_max_runs": 1000, "history_max_age_s": 30 * 86400.0,
                "finished_job_retention_s": 7 * 86400.0, "idempotency_ttl_s": 86400.0,
                **config}
    return Purger(log.replicated(), Retention(**settings))


def bounds_of(purger: Purger, now_ms: int) -> Bounds:
    return purger.bounds(now_ms)


def test_the_purger_chooses_the_oldest_finished_runs_past_the_count(log):
    make_job(log, history={"max_runs": 2})
    open_first = fire_next(log)           # stays open, oldest in the history
    finished = run_history(log, 5)
    plan = purger_over(log).plan(bounds_of(purger_over(log), 20_000))
    assert plan.runs == [(r, "job_a1") for r in finished[:3]]
    assert open_first not in [r for r, _ in plan.runs]
    assert plan.jobs == [] and plan.idem == []


def test_the_purger_chooses_by_age_and_stops_at_the_first_run_within_bounds(log):
    make_job(log)
    finished = run_history(log, 4)
    ages = [log.store.get(RUNS, r.encode())["finished_ms"] for r in finished]
    purger = purger_over(log, history_max_age_s=10.0)
    plan = purger.plan(purger.bounds(ages[1] + 10_000))
    assert plan.runs == [(r, "job_a1") for r in finished[:2]]


def test_the_purger_chooses_a_retired_jobs_runs_then_the_job(log):
    make_job(log)
    runs = run_history(log, 3)
    log.run(commands.delete_job(job_id="job_a1", at_ms=50_000))
    purger = purger_over(log, finished_job_retention_s=60.0)
    assert purger.plan(purger.bounds(50_000 + 59_999)).empty()
    plan = purger.plan(purger.bounds(50_000 + 60_000))
    assert plan.runs == [(r, "job_a1") for r in runs]
    assert plan.jobs == ["job_a1"]
    purge(log, 110_000, runs=plan.runs, jobs=plan.jobs, finished_job_retention_ms=60_000)
    assert log.store.get(JOBS, b"job_a1") is None


def test_the_purger_fills_at_most_one_batch_and_resumes_at_the_same_job(log, monkeypatch):
    monkeypatch.setattr(limits, "purge_batch_max", 4)
    make_job(log, history={"max_runs": 1})
    finished = run_history(log, 10)
    purger = purger_over(log)
    first = purger.plan(purger.bounds(20_000))
    assert first.runs == [(r, "job_a1") for r in finished[:4]] and first.room() == 0
    purge(log, 20_000, runs=first.runs)
    second = purger.plan(purger.bounds(20_000))
    assert second.runs == [(r, "job_a1") for r in finished[4:8]]


def test_the_purger_bounds_a_batch_of_dag_runs_by_the_task_runs_they_remove(log):
    """A DAG run's purge removes its task runs too: the batch is filled by
    cost (a unit per run removed), not by count alone."""
    make_job(log, history={"max_runs": 1})
    finished = run_history(log, 30)
    job = log.store.get(JOBS, b"job_a1")
    job["spec"] = dict(job["spec"], dag={"tasks": [
        {"id": f"t{i}", "depends_on": [], "target": HTTP} for i in range(limits.dag_tasks_max)]})
    log.index += 1
    log.store.commit(Transition(writes=((JOBS, b"job_a1", job),), effects=(), result={}),
                     log.index)
    purger = purger_over(log)
    plan = purger.plan(purger.bounds(20_000))
    per_run = 1 + limits.dag_tasks_max
    assert plan.runs == [(r, "job_a1") for r in finished[:limits.apply_entry_cost_max // per_run]]
    assert plan.room() > 0   # far from purge_batch_max: the cost filled it


def test_the_purger_visits_a_bounded_number_of_jobs_per_pass(log, monkeypatch):
    monkeypatch.setattr(limits, "purge_scan_jobs_max", 2)
    for job_id in ("job_a1", "job_b2", "job_c3"):
        make_job(log, job_id, history={"max_runs": 1})
        run_history(log, 2, job_id)
    purger = purger_over(log)
    chosen = [purger.plan(purger.bounds(20_000)).runs for _ in range(3)]
    assert [[job for _, job in runs] for runs in chosen] == [
        ["job_a1", "job_b2"], ["job_c3"], ["job_a1", "job_b2"]]


def run_scans(log: Replica, monkeypatch) -> list[tuple[bytes, int]]:
    """Each scan of the runs table from here on: (its start, rows read)."""
    scans: list[tuple[bytes, int]] = []
    scan = log.store.scan

    def counting(table, **kw):
        rows = scan(table, **kw)
        if table == RUNS:
            scans.append((kw.get("start"), len(rows)))
        return rows

    monkeypatch.setattr(log.store, "scan", counting)
    return scans


@pytest.mark.parametrize("open_runs", [0, 3])
def test_the_purger_reads_no_history_of_a_job_with_no_finished_run(log, monkeypatch, open_runs):
    """A job waiting for its first run (most of a large state), or whose runs
    are all open (fired ahead in a spike), costs a pass its record only."""
    make_job(log, "job_a1", history={"max_runs": 1})
    make_job(log, "job_b2", history={"max_runs": 1})
    for _ in range(open_runs):
        fire_next(log, "job_a1")
    finished = run_history(log, 3, "job_b2")
    scans = run_scans(log, monkeypatch)
    purger = purger_over(log)
    plan = purger.plan(purger.bounds(20_000))
    assert plan.runs == [(r, "job_b2") for r in finished[:2]]
    assert scans and all(start.startswith(keys.job_runs_prefix("job_b2"))
                         for start, _ in scans)


def test_the_purger_reads_one_run_of_a_job_whose_oldest_run_is_within_its_bounds(
        log, monkeypatch):
    make_job(log)
    run_history(log, 20)
    scans = run_scans(log, monkeypatch)
    purger = purger_over(log)
    assert purger.plan(purger.bounds(30_000)).empty()
    assert [rows for _, rows in scans] == [1]


def test_the_purger_chooses_expired_idempotency_keys(log):
    make_job(log, idem="k1")
    make_job(log, "job_b2", idem="k2")
    purger = purger_over(log, idempotency_ttl_s=60.0)
    assert purger.plan(purger.bounds(1_000 + 59_999)).idem == []
    assert purger.plan(purger.bounds(1_000 + 60_000)).idem == [("default", "k1"),
                                                               ("default", "k2")]


# --- the purger's rest after a round that found nothing -------------------------------------

def resting_purger(log: Replica, clock: list[int], monotonic: list[float] | None = None,
                   **config: float) -> Purger:
    """A purger whose node's apply notes what entries write (log.touched),
    as a leader's does."""
    settings = {"history_max_runs": 1000, "history_max_age_s": 30 * 86400.0,
                "finished_job_retention_s": 7 * 86400.0, "idempotency_ttl_s": 86400.0,
                **config}
    mono = monotonic if monotonic is not None else [0.0]
    return Purger(log.replicated(now_ms=lambda: clock[0]), Retention(**settings),
                  watch=lambda touched: setattr(log, "touched", touched),
                  monotonic=lambda: mono[0])


def test_after_a_round_that_found_nothing_the_purger_rests_until_a_run_passes_its_age(log):
    make_job(log)
    finished = run_history(log, 3)
    oldest_ms = log.store.get(RUNS, finished[0].encode())["finished_ms"]
    clock = [oldest_ms + 1_000]
    purger = resting_purger(log, clock, history_max_age_s=10.0)
    assert purger.plan(purger.bounds(clock[0])).empty()
    assert purger.resting() and purger.rests_total == 1
    clock[0] = oldest_ms + 10_000 - 1
    assert purger.resting()
    clock[0] = oldest_ms + 10_000   # the oldest run is past its age now
    assert not purger.resting()
    assert purger.plan(purger.bounds(clock[0])).runs == [(finished[0], "job_a1")]


def test_the_rest_is_bounded_and_ends_when_an_idempotency_key_expires(log):
    make_job(log, idem="k1")
    clock = [2_000]
    purger = resting_purger(log, clock, idempotency_ttl_s=3600.0)
    assert purger.plan(purger.bounds(clock[0])).empty() and purger.resting()
    clock[0] = 2_000 + int(limits.purge_rest_max_s * 1000)   # the rest's bound
    assert not purger.resting()
    assert purger.plan(purger.bounds(clock[0])).empty() and purger.resting()
    clock[0] = 1_000 + 3_600_000   # the key was reserved at 1_000
    assert not purger.resting()
    assert purger.plan(purger.bounds(clock[0])).idem == [("default", "k1")]


def test_a_rest_ends_by_this_process_s_clock_if_the_cluster_s_time_goes_back(log):
    make_job(log)
    run_history(log, 1)
    clock, mono = [20_000], [100.0]
    purger = resting_purger(log, clock, mono)
    assert purger.plan(purger.bounds(clock[0])).empty() and purger.resting()
    clock[0] = 10_000   # the cluster's time stepped back
    mono[0] = 100.0 + limits.purge_rest_max_s - 0.001
    assert purger.resting()
    mono[0] = 100.0 + limits.purge_rest_max_s
    assert not purger.resting()


def test_a_resting_purger_reads_the_jobs_written_since_and_only_them(log, monkeypatch):
    make_job(log)
    make_job(log, "job_b2")
    runs = run_history(log, 2)
    run_history(log, 2, "job_b2")
    clock = [20_000]
    purger = resting_purger(log, clock, finished_job_retention_s=5.0)
    assert purger.plan(purger.bounds(clock[0])).empty() and purger.resting()
    read: list[bytes] = []
    get, scan = log.store.get, log.store.scan_jobs_with_history

    def reading(table, key):
        if table == JOBS:
            read.append(key)
        return get(table, key)

    def scanning(*, start=b"", limit):
        read.append(start)
        return scan(start=start, limit=limit)

    monkeypatch.setattr(log.store, "get", reading)
    monkeypatch.setattr(log.store, "scan_jobs_with_history", scanning)
    assert purger.plan(purger.bounds(clock[0])).empty() and read == []   # nothing written
    log.run(commands.delete_job(job_id="job_a1", at_ms=20_000))
    read.clear()   # (apply's own read of it)
    clock[0] = 21_000
    assert purger.plan(purger.bounds(clock[0])).empty() and purger.resting()
    assert read == [b"job_a1"]
    clock[0] = 25_000   # the deleted job's retention has passed: the rest ends
    assert not purger.resting()
    plan = purger.plan(purger.bounds(clock[0]))
    assert plan.runs == [(r, "job_a1") for r in runs] and plan.jobs == ["job_a1"]


def test_a_resting_purger_skips_a_job_created_meanwhile_without_decoding_it(log, monkeypatch):
    make_job(log, history={"max_runs": 1})
    run_history(log, 1)
    clock = [20_000]
    purger = resting_purger(log, clock)
    assert purger.plan(purger.bounds(clock[0])).empty() and purger.resting()
    decoded: list[bytes] = []
    job_row = storage_base.job_row

    def decoding(key, raw, state):
        decoded.append(key)
        return job_row(key, raw, state)

    monkeypatch.setattr(storage_base, "job_row", decoding)
    make_job(log, "job_b2")   # a create: a job with no history
    run_history(log, 1)   # and one past its max_runs now
    assert purger.resting()
    assert purger.plan(purger.bounds(clock[0])).runs == [(history(log)[0], "job_a1")]
    assert b"job_b2" not in decoded and b"job_a1" in decoded


def test_a_job_written_while_the_round_goes_round_is_read_in_the_rest(log, monkeypatch):
    monkeypatch.setattr(limits, "purge_scan_jobs_max", 1)
    for job_id in ("job_a1", "job_b2"):
        make_job(log, job_id, history={"max_runs": 1})
        run_history(log, 1, job_id)
    clock = [20_000]
    purger = resting_purger(log, clock)
    assert purger.plan(purger.bounds(clock[0])).empty()   # job_a1 read: nothing to remove
    oldest = history(log)[0]
    run_history(log, 1)   # job_a1 has a finished run past its max_runs now
    # The round goes on (job_b2, then the table's end) and rests...
    for _ in range(2):
        assert purger.plan(purger.bounds(clock[0])).empty()
    assert purger.resting()
    # ...and its next pass reads job_a1, written meanwhile.
    assert purger.plan(purger.bounds(clock[0])).runs == [(oldest, "job_a1")]
    assert purger.resting()


def test_more_jobs_written_than_a_rest_keeps_end_it(log, monkeypatch):
    monkeypatch.setattr(limits, "purge_touched_jobs_max", 1)
    for job_id in ("job_a1", "job_b2"):
        make_job(log, job_id)
        run_history(log, 1, job_id)
    clock = [20_000]
    purger = resting_purger(log, clock)
    assert purger.plan(purger.bounds(clock[0])).empty() and purger.resting()
    run_history(log, 1, "job_a1")
    assert purger.resting()
    run_history(log, 1, "job_b2")
    assert not purger.resting()


def test_what_a_rest_cannot_judge_by_the_jobs_written_ends_it():
    for table, idem_matters, ends in (
            (JOB_STATE, False, False), (JOBS, False, False), (RUNS, False, False),
            (ALERTS, False, True), (BACKFILLS, False, True),
            (IDEM, False, False), (IDEM, True, True)):
        touched = Touched(idem_matters=idem_matters)
        touched.note("cancel_run", ((JOBS, b"job_b2", None), (table, b"job_a1", None)))
        assert touched.overflow is ends, (table, idem_matters)
        # Past overflow it keeps nothing: the purger goes round every job.
        kept = set() if ends else {b"job_b2"} | ({b"job_a1"} if table in (JOBS, JOB_STATE)
                                               else set())
        assert touched.take() == kept
        touched.note("cancel_run", ((JOBS, b"job_c3", None),))
        assert touched.take() == (set() if ends else {b"job_c3"})
    renewal = Touched(idem_matters=True)
    renewal.note("renew", ((IDEM, b"k", None), (JOBS, b"job_a1", None)))
    assert not renewal.overflow and renewal.take() == set()


def test_a_history_walk_stopped_at_its_bound_leaves_no_rest(log, monkeypatch):
    """Runs past the walk's bound cannot be dated: the purger does not rest."""
    monkeypatch.setattr(limits, "purge_scan_runs_per_job_max", 2)
    make_job(log)
    for _ in range(2 * limits.purge_page_runs_first + 1):
        fire_next(log)   # open runs, two pages of them: the walk goes past them
    run_history(log, 1)   # and a finished one after them
    clock = [20_000]
    purger = resting_purger(log, clock)
    assert purger.plan(purger.bounds(clock[0])).empty() and not purger.resting()


def test_a_purger_given_no_watch_never_rests(log):
    make_job(log)
    run_history(log, 1)
    purger = purger_over(log)
    for _ in range(3):
        assert purger.plan(purger.bounds(20_000)).empty() and not purger.resting()


# --- topics and groups -------------------------------------------------------------------

def publish(log: Replica, topic: str, n: int, message: object = "m") -> dict:
    return log.run(commands.publish(topic=topic, key=None, message=message,
                                    execution_id=f"exe_{topic}_{n}", job_id="job_a1",
                                    at_ms=1_000 + n))


def test_a_publish_to_a_new_topic_past_topics_max_is_refused(log, monkeypatch):
    monkeypatch.setattr(limits, "topics_max", 2)
    assert publish(log, "a", 1)["ok"] and publish(log, "b", 1)["ok"]
    refused = publish(log, "c", 1)
    assert (refused["ok"], refused["limit"]) == (False, "topics_max")
    assert log.store.get(TOPIC_META, b"c") is None
    assert publish(log, "a", 2)["ok"]


def test_a_commit_to_a_new_group_past_groups_per_topic_max_is_refused(log, monkeypatch):
    monkeypatch.setattr(limits, "groups_per_topic_max", 2)
    publish(log, "t", 1)

    def commit(group: str) -> dict:
        return log.run(commands.commit_offset(topic="t", group=group, offset=1, at_ms=2_000))

    assert commit("g1")["ok"] and commit("g2")["ok"] and commit("g1")["ok"]
    refused = commit("g3")
    assert (refused["ok"], refused["limit"]) == (False, "groups_per_topic_max")
    # Offset 0 of a topic with no messages stores nothing.
    empty = log.run(commands.commit_offset(topic="none", group="g", offset=0, at_ms=2_000))
    assert empty["ok"] and log.store.get(TOPIC_META, b"none") is None


def test_a_topic_keeps_at_most_its_bytes_bound(log, monkeypatch):
    monkeypatch.setattr(limits, "topic_messages_bytes_max", 2000)
    for n in range(1, 21):
        assert publish(log, "t", n, message="x" * 300)["ok"]
    state = log.store.get(TOPIC_META, b"t")
    kept = log.store.scan(TOPICS, start=keys.topic_prefix("t"),
                          stop=keys.prefix_end(keys.topic_prefix("t")))
    assert 0 < state["bytes"] <= 2000
    assert [m["offset"] for _, m in kept] == list(range(state["first"], 21))
    assert state["bytes"] == sum(len(codec.pack(m)) for _, m in kept)


# --- storage -------------------------------------------------------------------------------

def test_a_full_lmdb_map_stops_the_commit_and_names_max_data_bytes(tmp_path: Path):
    store = LmdbStore(str(tmp_path / "state"), map_size=1024 ** 2)
    used_before = store.used_bytes()
    index = 0
    with pytest.raises(StorageFull, match="max_data_bytes"):
        for index in range(1, 1000):
            writes = ((RUNS, f"run_{index:024d}".encode(), {"pad": "x" * 8000}),)
            store.commit(Transition(writes=writes, effects=(), result={}), index)
    assert store.applied_index() == index - 1   # the entry that did not fit wrote nothing
    assert store.used_bytes() > used_before
    store.close()


def test_used_bytes_falls_when_records_are_deleted(tmp_path: Path):
    store = LmdbStore(str(tmp_path / "state"), map_size=64 * 1024 ** 2)
    keys_ = [f"run_{i:024d}".encode() for i in range(500)]
    store.commit(Transition(writes=tuple((RUNS, k, {"pad": "x" * 500}) for k in keys_),
                            effects=(), result={}), 1)
    full = store.used_bytes()
    store.commit(Transition(writes=tuple((RUNS, k, None) for k in keys_), effects=(),
                            result={}), 2)
    assert store.used_bytes() < full / 10
    assert store.file_bytes() >= full   # the file keeps its size; the pages are reused
    store.close()


# --- a live cluster ----------------------------------------------------------------------------

def _instant_s(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@pytest.mark.integration
def test_an_every_second_job_keeps_max_runs_finished_runs(shared_cluster, sink):
    created = shared_cluster.api("n1", "POST", "/v1/jobs", {
        "name": "history", "schedule": {"every": "1s"}, "history": {"max_runs": 3},
        "target": {"type": "http", "url": sink.url}})
    assert created.status == 201, created
    assert created.body["history"] == {"max_runs": 3}
    job_id = created.body["job_id"]

    def bounded_after_eight_runs() -> list | None:
        if len(sink.by_job().get(job_id, [])) < 8:
            return None
        runs = shared_cluster.api("n2", "GET", f"/v1/jobs/{job_id}/runs?limit=100").body["runs"]
        finished = [r for r in runs if r["state"] in ("succeeded", "failed", "skipped",
                                                      "missed", "cancelled")]
        return runs if len(finished) <= 3 else None

    try:
        runs = wait_until(bounded_after_eight_runs, 30, "at most 3 finished runs listed")
        calls = sorted(c.scheduled_s for c in sink.by_job()[job_id])
        # Runs fired ahead of their second (armed) are listed too: count the
        # ones up to the last call, which the purge bounds.
        listed = sorted(r["scheduled_for"] for r in runs
                        if _instant_s(r["scheduled_for"]) <= calls[-1])
        assert len(calls) >= 8 and len(listed) < len(calls)
    finally:
        shared_cluster.api("n1", "DELETE", f"/v1/jobs/{job_id}")


@pytest.mark.integration
def test_a_reserved_key_of_a_deleted_job_answers_409_until_its_ttl(shared_cluster, sink):
    body = {"schedule": {"every": "1h"}, "target": {"type": "http", "url": sink.url},
            "idempotency_key": "retention-reserved"}
    created = shared_cluster.api("n1", "POST", "/v1/jobs", body)
    assert created.status == 201, created
    assert shared_cluster.api("n1", "POST", "/v1/jobs", body).status == 200
    assert shared_cluster.api("n2", "DELETE", f"/v1/jobs/{created.body['job_id']}").status == 204
    again = shared_cluster.api("n3", "POST", "/v1/jobs", body)
    assert again.status == 409, again
    assert again.body["field"] == "idempotency_key"
    assert "'retention-reserved'" in again.body["detail"]
    assert created.body["job_id"] in again.body["detail"]
    assert "until 20" in again.body["detail"]   # the instant the key is free again
