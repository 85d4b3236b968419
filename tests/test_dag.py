"""DAG jobs in the pure core: validation (cycles named), trigger rules, Kahn's incremental release and its propagation, and DAG runs through apply (task runs, retries, concurrency, cancel, purge)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings, strategies as st

from raftsched import limits
from raftsched.core import commands, dag, dagrun, jobspec, keys
from raftsched.core.apply import ALERTS, JOBS, LEASES, RUNS, RUNS_OPEN, RunCancelled
from raftsched.errors import InvalidInput
from raftsched.testing.proptest import examples
from raftsched.testing.replica import Replica

SHARDS = 16
JOB = "job_dag1"


def task(tid: str, deps: tuple = (), **extra) -> dict:
    return {"id": tid, "target": {"type": "http", "url": f"https://hooks.example/{tid}"},
            "depends_on": list(deps), **extra}


# The seed's workflow, with a cleanup that runs whatever happens and an alert
# task that runs only when something failed.
SEED = [task("ingest"), task("fx"), task("reconcile", ("ingest", "fx")),
        task("settle", ("reconcile",)), task("report", ("settle",)),
        task("cleanup", ("report",), trigger_rule="all_done"),
        task("alert", ("ingest", "fx", "reconcile", "settle", "report"),
             trigger_rule="one_failed")]


def refusal(body: dict) -> InvalidInput:
    with pytest.raises(InvalidInput) as caught:
        jobspec.validate_create(body)
    return caught.value


# --- validation ------------------------------------------------------------------------

def test_the_seed_workflow_is_accepted_and_runs_when_triggered():
    spec = jobspec.validate_create({"dag": {"tasks": SEED}})["spec"]
    assert spec["schedule"] == {"kind": "none"}
    assert "target" not in spec
    assert [t["id"] for t in spec["dag"]["tasks"]] == [t["id"] for t in SEED]
    assert spec["dag"]["tasks"][0]["trigger_rule"] == "all_success"
    assert spec["dag"]["tasks"][5]["trigger_rule"] == "all_done"
    assert spec["name"].startswith("dag ingest, fx, reconcile")
    commands.check(commands.create_job(job_id=JOB, tenant="default", spec=spec,
                                       idempotency_key=None, shard=1, next_ms=None, at_ms=1))


def test_a_cycle_is_refused_naming_its_tasks():
    tasks = [task("a"), task("b", ("a", "d")), task("c", ("b",)), task("d", ("c",))]
    problem = refusal({"dag": {"tasks": tasks}})
    assert (problem.status, problem.field) == (400, "dag.tasks[1].depends_on")
    assert problem.detail.startswith("the tasks b, d, c form a cycle (b -> d -> c -> b, each "
                                     "depending on the next)")


def test_a_task_that_depends_on_itself_is_a_cycle():
    problem = refusal({"dag": {"tasks": [task("a"), task("b", ("b",))]}})
    assert (problem.field, "'b' depends on itself" in problem.detail) == \
        ("dag.tasks[1].depends_on", True)


@pytest.mark.parametrize("tasks, field, words, limit", [
    ([], "dag.tasks", "non-empty", None),
    ([task("a"), task("a")], "dag.tasks[1].id", "used twice", None),
    ([task("a"), task("b", ("nope",))], "dag.tasks[1].depends_on", "not a task", None),
    ([task("a"), task("b", ("a", "a"))], "dag.tasks[1].depends_on", "twice", None),
    ([task("a", trigger_rule="some_success")], "dag.tasks[0].trigger_rule", "one of", None),
    ([task("a b")], "dag.tasks[0].id", "letters", None),
    ([task("x" * (limits.dag_task_id_bytes_max + 1))], "dag.tasks[0].id", "over",
     "dag_task_id_bytes_max"),
    ([task(f"t{i}") for i in range(limits.dag_tasks_max + 1)], "dag.tasks", "at most",
     "dag_tasks_max"),
    ([dict(task("a"), target={"type": "http", "url": "ftp://x"})], "dag.tasks[0].target.url",
     "http", None),
    ([dict(task("a"), retry={"max_attempts": 0})], "dag.tasks[0].retry.max_attempts", "1",
     "retry_max_attempts_max"),
    ([task("a", timeout_s=0)], "dag.tasks[0].timeout_s", "number", "target_timeout_s_max"),
    ([dict(task("a"), when="now")], "dag.tasks[0].when", "unknown", None),
])
def test_a_bad_dag_is_refused_naming_the_member(tasks, field, words, limit):
    problem = refusal({"dag": {"tasks": tasks}})
    assert (problem.field, problem.limit) == (field, limit)
    assert words in problem.detail


def test_the_edge_bound_is_named():
    width = limits.dag_edges_max // 50 + 1
    tasks = [task(f"up{i}") for i in range(50)] + [
        task(f"down{j}", tuple(f"up{i}" for i in range(50))) for j in range(width)]
    assert len(tasks) <= limits.dag_tasks_max
    problem = refusal({"dag": {"tasks": tasks}})
    assert (problem.limit, "dependencies" in problem.detail) == ("dag_edges_max", True)


def test_a_job_has_a_target_or_a_dag():
    both = {"dag": {"tasks": [task("a")]}, "target": task("a")["target"]}
    assert refusal(both).field == "dag"
    assert refusal({"schedule": {"every": "1m"}}).field == "target"
    # Only a DAG job may go without a schedule.
    assert refusal({"target": task("a")["target"]}).field == "schedule"


def test_a_patch_keeps_the_kind_of_job_and_the_tasks_secrets():
    spec = jobspec.validate_create({
        "schedule": {"every": "1h"}, "secret_keys": ["X-Key"],
        "dag": {"tasks": [dict(task("a"), target={
            "type": "http", "url": "https://h.example/a", "headers": {"X-Key": "s3cret-value"}})]},
    })["spec"]
    with pytest.raises(InvalidInput) as caught:
        jobspec.validate_patch({"target": task("a")["target"]}, spec)
    assert caught.value.field == "target"
    masked = {"dag": {"tasks": [dict(task("a"), target={
        "type": "http", "url": "https://h.example/a2", "headers": {"X-Key": "***"}})]}}
    patched = jobspec.validate_patch(masked, spec)
    assert patched["dag"]["tasks"][0]["target"]["headers"] == {"X-Key": "s3cret-value"}
    assert patched["dag"]["tasks"][0]["target"]["url"] == "https://h.example/a2"
    # A task added by the patch has no stored secret for "***" to keep.
    added = {"dag": {"tasks": [*masked["dag"]["tasks"], dict(masked["dag"]["tasks"][0],
                                                              id="b")]}}
    with pytest.raises(InvalidInput) as caught:
        jobspec.validate_patch(added, spec)
    assert caught.value.field == "dag.tasks[1].target.headers.X-Key"


# --- the graph -------------------------------------------------------------------------

@st.composite
def dags(draw, size_max: int = 12) -> list[dict]:
    """A random DAG: each task depends on a random subset of the tasks before
    it in a random order, listed in a shuffled order, with random rules."""
    n = draw(st.integers(1, size_max))
    ids = [f"t{i}" for i in range(n)]
    tasks = []
    for i, tid in enumerate(ids):
        deps = draw(st.lists(st.sampled_from(ids[:i]), unique=True, max_size=3)) if i else []
        tasks.append({"id": tid, "depends_on": deps,
                      "trigger_rule": draw(st.sampled_from(dag.RULES))})
    order = draw(st.permutations(range(n)))
    return [tasks[i] for i in order]


@settings(max_examples=examples(200), deadline=None)
@given(dags(), st.data())
def test_acyclic_graphs_pass_and_a_back_edge_is_found_as_a_cycle(tasks, data):
    assert dag.graph_problem(tasks) is None
    order = dag.topological_order(tasks)
    position = {tid: i for i, tid in enumerate(order)}
    assert sorted(order) == sorted(t["id"] for t in tasks)
    assert all(position[dep] < position[t["id"]] for t in tasks for dep in t["depends_on"])
    # An edge from a task to one of its descendants closes a cycle.
    edges = [(t["id"], dep) for t in tasks for dep in t["depends_on"]]
    if not edges:
        return
    child, parent = data.draw(st.sampled_from(edges))
    for t in tasks:
        if t["id"] == parent:
            t["depends_on"] = [*t["depends_on"], child]
    cycle = dag.find_cycle(tasks)
    assert cycle is not None and child in cycle and parent in cycle
    upstream = {t["id"]: set(t["depends_on"]) for t in tasks}
    for a, b in zip(cycle, cycle[1:] + cycle[:1]):
        assert b in upstream[a], (cycle, a, b)   # each depends on the next
    problem = dag.graph_problem(tasks)
    assert problem is not None and set(problem.cycle) == set(cycle)


# --- trigger rules ---------------------------------------------------------------------

# (rule, succeeded, failed, skipped) of three upstream tasks -> decision.
RULE_TABLE = [
    ("all_success", 3, 0, 0, dag.RUN), ("all_success", 2, 1, 0, dag.UPSTREAM_FAILED),
    ("all_success", 2, 0, 1, dag.SKIPPED), ("all_success", 1, 1, 1, dag.UPSTREAM_FAILED),
    ("all_failed", 0, 3, 0, dag.RUN), ("all_failed", 1, 2, 0, dag.SKIPPED),
    ("all_failed", 0, 2, 1, dag.SKIPPED),
    ("all_done", 1, 1, 1, dag.RUN), ("all_done", 0, 0, 3, dag.RUN),
    ("one_success", 1, 2, 0, dag.RUN), ("one_success", 0, 2, 1, dag.UPSTREAM_FAILED),
    ("one_success", 0, 0, 3, dag.SKIPPED),
    ("one_failed", 2, 1, 0, dag.RUN), ("one_failed", 2, 0, 1, dag.SKIPPED),
    ("none_failed", 2, 0, 1, dag.RUN), ("none_failed", 2, 1, 0, dag.UPSTREAM_FAILED),
    ("none_failed", 0, 0, 3, dag.RUN),
    ("none_failed_min_one_success", 1, 0, 2, dag.RUN),
    ("none_failed_min_one_success", 0, 0, 3, dag.SKIPPED),
    ("none_failed_min_one_success", 2, 1, 0, dag.UPSTREAM_FAILED),
    ("always", 0, 3, 0, dag.RUN),
]


@pytest.mark.parametrize("rule, succeeded, failed, skipped, decision", RULE_TABLE)
def test_trigger_rules_decide_as_airflow_does(rule, succeeded, failed, skipped, decision):
    assert dag.decide(rule, 3, succeeded, failed, skipped) == decision


def test_only_one_success_and_one_failed_decide_before_every_upstream_task_ended():
    early = {rule: dag.decide(rule, 3, 1, 1, 0) for rule in dag.RULES}
    assert early == {"all_success": None, "all_failed": None, "all_done": None,
                     "one_success": dag.RUN, "one_failed": dag.RUN, "none_failed": None,
                     "none_failed_min_one_success": None, "always": dag.RUN}


def reference_states(tasks: list[dict], ran: dict[str, str],
                     kept: dict[str, str] | None = None) -> dict[str, str]:
    """Each task's final state by the trigger rules, decided in topological
    order from its upstream tasks' final states: what incremental release must
    end with, whatever the order tasks end in. `ran`: the state each task ends
    in if it runs; `kept`: tasks whose state is not decided again."""
    by_id = {t["id"]: t for t in tasks}
    final: dict[str, str] = dict(kept or {})
    for tid in dag.topological_order(tasks):
        if tid in final:
            continue
        states = [final[d] for d in by_id[tid]["depends_on"]]
        decision = dag.decide(by_id[tid]["trigger_rule"], len(states),
                              states.count(dag.SUCCEEDED),
                              sum(s in (dag.FAILED, dag.UPSTREAM_FAILED) for s in states),
                              states.count(dag.SKIPPED))
        final[tid] = ran[tid] if decision == dag.RUN else decision
    return final


@settings(max_examples=examples(300), deadline=None)
@given(dags(), st.data())
def test_incremental_release_ends_as_the_rules_say_in_any_order(tasks, data):
    ran = {t["id"]: data.draw(st.sampled_from([dag.SUCCEEDED, dag.FAILED])) for t in tasks}
    rng = random.Random(data.draw(st.integers(0, 2 ** 32)))
    instances = dag.new_instances(tasks)
    released = dag.begin(instances)
    running = list(released)
    by_id = {inst["id"]: inst for inst in instances}
    while running:
        tid = running.pop(rng.randrange(len(running)))
        rule = by_id[tid]["rule"]
        ended = [by_id[d]["state"] for d in by_id[tid]["upstream"]]
        if rule not in ("always", "one_success", "one_failed"):
            assert all(s in dag.TERMINAL for s in ended), (tid, rule, ended)
        now = dag.task_ended(instances, tid, ran[tid])
        assert not set(now) & set(released), "a task was released twice"
        released += now
        running += now
    assert all(inst["pending"] == 0 for inst in instances)
    assert {inst["id"]: inst["state"] for inst in instances} == reference_states(tasks, ran)
    failed = any(inst["state"] in (dag.FAILED, dag.UPSTREAM_FAILED) for inst in instances)
    assert dag.outcome(instances) == (dag.FAILED if failed else dag.SUCCEEDED)


def run_to_the_end(instances: list[dict], released: list[str], ran: dict[str, str],
                   rng: random.Random) -> list[str]:
    """End the released tasks in a random order (each in its `ran` state),
    and those they release, until none is left; every task released."""
    running, done = list(released), list(released)
    while running:
        tid = running.pop(rng.randrange(len(running)))
        now = dag.task_ended(instances, tid, ran[tid])
        assert not set(now) & set(done), "a task was released twice"
        done += now
        running += now
    return done


@settings(max_examples=examples(200), deadline=None)
@given(dags(), st.data())
def test_a_redrive_runs_only_what_did_not_succeed_and_ends_as_the_rules_say(tasks, data):
    ran = {t["id"]: data.draw(st.sampled_from([dag.SUCCEEDED, dag.FAILED])) for t in tasks}
    rng = random.Random(data.draw(st.integers(0, 2 ** 32)))
    instances = dag.new_instances(tasks)
    run_to_the_end(instances, dag.begin(instances), ran, rng)
    before = {inst["id"]: inst["state"] for inst in instances}
    again = set(dag.reset(instances))
    assert {tid for tid, s in before.items() if s in (dag.FAILED, dag.UPSTREAM_FAILED)} <= again
    assert not {tid for tid, s in before.items() if s == dag.SUCCEEDED} & again
    released = run_to_the_end(instances, dag.begin(instances), dict.fromkeys(ran, dag.SUCCEEDED),
                              rng)
    assert set(released) <= again, "a task that was kept ran again"
    assert all(inst["pending"] == 0 for inst in instances)
    # Each kept task keeps its state; each reset one is decided again by its
    # rule from its upstream tasks' final states, and runs to success.
    kept = {tid: state for tid, state in before.items() if tid not in again}
    assert {inst["id"]: inst["state"] for inst in instances} == \
        reference_states(tasks, dict.fromkeys(ran, dag.SUCCEEDED), kept)
    assert dag.outcome(instances) == dag.SUCCEEDED


# --- DAG runs in apply -----------------------------------------------------------------

class Log(Replica):
    def make(self, tasks: list[dict], job_id: str = JOB, concurrency: object = None,
             retry_policy: dict | None = None) -> None:
        body = {"schedule": {"every": "2s"}, "dag": {"tasks": tasks},
                "concurrency": concurrency, "retry": retry_policy,
                "alert": {"webhook_url": "https://alerts.example/hook"}}
        spec = jobspec.validate_create(body)["spec"]
        self.shard = keys.shard_of(job_id, SHARDS)
        self.run(commands.assign_shards(assignments=[(self.shard, "n1")], at_ms=1))
        self.run(commands.create_job(job_id=job_id, tenant="default", spec=spec,
                                     idempotency_key=None, shard=self.shard, next_ms=10_000,
                                     at_ms=1_000))

    def fire(self, due: int = 10_000, job_id: str = JOB) -> str:
        token = self.store.get("shards", keys.shard_key(self.shard))["token"]
        self.run(commands.fire(shard=self.shard, token=token, upto_ms=due, node="n1",
                               at_ms=due, items=[(job_id, due, due + 2000, [due], False)]))
        return keys.run_id(job_id, due)

    def get(self, run_id: str) -> dict | None:
        return self.store.get(RUNS, run_id.encode())

    def task_run(self, dag_run: str, tid: str) -> dict | None:
        return self.get(keys.task_run_id(dag_run, tid))

    def states(self, dag_run: str) -> dict[str, str]:
        return {t["id"]: t["state"] for t in self.get(dag_run)["tasks"]}

    def report(self, *updates: dict) -> list[bool]:
        return self.run(commands.run_updates(updates=list(updates)))["accepted"]

    def start(self, dag_run: str, tid: str, at_ms: int = 10_100) -> dict:
        child = self.task_run(dag_run, tid)
        holder = "worker:w1" if child["queue"] else child["node"]
        return {"run_id": child["id"], "event": "start", "holder": holder,
                "attempt": child["attempt"], "at_ms": at_ms, "lease_ms": at_ms + 5000}

    def finish(self, dag_run: str, tid: str, ok: bool, at_ms: int = 10_200) -> dict:
        child = self.task_run(dag_run, tid)
        return {"run_id": child["id"], "event": "finish", "holder": child["holder"],
                "attempt": child["attempt"], "at_ms": at_ms, "ok": ok, "retryable": True,
                "retry_delay_ms": 100, "http_status": 200 if ok else 500, "exit_code": None,
                "error": None if ok else f"HTTP 500 from {tid}", "output_node": "n1"}

    def run_task(self, dag_run: str, tid: str, ok: bool) -> None:
        if self.task_run(dag_run, tid)["queue"]:   # a node's task run is held at release
            assert self.report(self.start(dag_run, tid)) == [True]
        assert self.report(self.finish(dag_run, tid, ok)) == [True]

    def fire_retry(self, run_id: str) -> None:
        run = self.get(run_id)
        token = self.store.get("shards", keys.shard_key(self.shard))["token"]
        due = run["retry_due_ms"]
        self.run(commands.fire(shard=self.shard, token=token, upto_ms=due, node="n1",
                               at_ms=due, items=[], retries=[(run_id, due)]))


def test_the_seed_workflow_runs_in_order_with_fx_retried_once():
    log = Log()
    log.make(SEED, retry_policy={"max_attempts": 3})
    dag_run = log.fire()
    assert log.states(dag_run) == {"ingest": "running", "fx": "running",
                                   "reconcile": "pending", "settle": "pending",
                                   "report": "pending", "cleanup": "pending", "alert": "pending"}
    assert log.get(dag_run)["state"] == "running"   # its first tasks are held at release
    # Only the roots have runs, held by the shard's owner, not in the job's history.
    assert log.task_run(dag_run, "reconcile") is None
    ingest = log.task_run(dag_run, "ingest")
    assert (ingest["state"], ingest["holder"], ingest["dag_run"]) == ("running", "n1", dag_run)
    assert log.store.get(RUNS_OPEN, keys.open_run_key(log.shard, ingest["id"])) is not None
    assert log.store.get(RUNS_OPEN, keys.open_run_key(log.shard, dag_run)) is None
    assert log.report(log.start(dag_run, "ingest"), log.start(dag_run, "fx")) == [False, False]
    log.report(log.finish(dag_run, "ingest", True), log.finish(dag_run, "fx", False))
    assert log.states(dag_run)["fx"] == "retry_wait"
    assert log.task_run(dag_run, "reconcile") is None   # fx has not ended
    log.fire_retry(log.task_run(dag_run, "fx")["id"])
    log.run_task(dag_run, "fx", True)
    assert log.task_run(dag_run, "fx")["attempt"] == 2
    for tid in ("reconcile", "settle", "report", "cleanup"):
        assert log.states(dag_run)[tid] == "running"
        log.run_task(dag_run, tid, True)
    run = log.get(dag_run)
    assert run["state"] == "succeeded"
    assert log.states(dag_run)["alert"] == "skipped"
    assert log.store.get(JOBS, JOB.encode())["active"] == []
    assert log.store.get(ALERTS, dag_run.encode()) is None
    executions = {log.task_run(dag_run, t["id"])["execution_id"] for t in SEED[:6]}
    assert len(executions) == 6
    assert keys.task_execution_id(JOB, 10_000, "fx") in executions
    # The job's history is its DAG run alone: its task runs are not under it.
    prefix = keys.job_runs_prefix(JOB)
    history = log.store.scan(RUNS, start=prefix, stop=keys.job_runs_stop(JOB))
    assert [key for key, _ in history] == [dag_run.encode()]
    assert len(log.store.scan(RUNS)) == 1 + 6


def test_two_upstream_tasks_ending_in_one_batch_release_their_child_once():
    log = Log()
    log.make(SEED)
    dag_run = log.fire()
    log.report(log.finish(dag_run, "ingest", True), log.finish(dag_run, "fx", True))
    reconcile = log.get(dag_run)["tasks"][2]
    assert (reconcile["state"], reconcile["pending"]) == ("running", 0)
    assert log.task_run(dag_run, "reconcile")["state"] == "running"
    queued = [e.run["id"] for e in log.effects if getattr(e, "run", None)
              and e.run.get("task_id") == "reconcile"]
    assert queued == [keys.task_run_id(dag_run, "reconcile")]


def test_a_failure_fails_the_run_runs_cleanup_and_the_alert_task_and_raises_one_alert():
    log = Log()
    log.make(SEED, retry_policy={"max_attempts": 1})
    dag_run = log.fire()
    log.run_task(dag_run, "ingest", True)
    log.run_task(dag_run, "fx", False)
    assert log.states(dag_run) == {"ingest": "succeeded", "fx": "failed",
                                   "reconcile": "upstream_failed", "settle": "upstream_failed",
                                   "report": "upstream_failed", "cleanup": "running",
                                   "alert": "running"}
    assert log.store.get(ALERTS, log.task_run(dag_run, "fx")["id"].encode()) is None
    log.run_task(dag_run, "alert", True)
    assert log.get(dag_run)["state"] == "running"
    log.run_task(dag_run, "cleanup", True)
    run = log.get(dag_run)
    assert run["state"] == "failed"
    assert "task fx failed: HTTP 500 from fx" in run["error"]
    assert "3 tasks upstream_failed" in run["error"]
    assert run["alert"] == "pending"
    assert log.store.get(ALERTS, dag_run.encode())["url"] == "https://alerts.example/hook"


def test_a_redriven_dag_run_runs_its_failed_task_again_and_what_it_held_back():
    log = Log()
    log.make(SEED, retry_policy={"max_attempts": 1})
    dag_run = log.fire()
    log.run_task(dag_run, "ingest", True)
    log.run_task(dag_run, "fx", False)
    log.run_task(dag_run, "alert", True)
    log.run_task(dag_run, "cleanup", True)
    assert log.get(dag_run)["state"] == "failed"
    # A task run is re-driven with its DAG run, never alone.
    fx_id = log.task_run(dag_run, "fx")["id"]
    alone = log.run(commands.retry_run(run_id=fx_id, node="n1", at_ms=20_000))
    assert (alone["error"], dag_run in alone["detail"]) == ("conflict", True)
    assert log.run(commands.retry_run(run_id=dag_run, node="n1", at_ms=20_000))["ok"]
    run = log.get(dag_run)
    assert (run["state"], run["attempt"], run["trigger"]) == ("running", 2, "retry")
    # fx runs again as the next attempt of the same task run, under the same
    # execution id; what succeeded is kept; what fx held back waits for it.
    assert log.states(dag_run) == {"ingest": "succeeded", "fx": "running",
                                   "reconcile": "pending", "settle": "pending",
                                   "report": "pending", "cleanup": "succeeded",
                                   "alert": "succeeded"}
    fx = log.task_run(dag_run, "fx")
    assert (fx["id"], fx["attempt"], fx["state"], fx["execution_id"]) == \
        (fx_id, 2, "running", keys.task_execution_id(JOB, 10_000, "fx"))
    assert log.store.get(RUNS_OPEN, keys.open_run_key(log.shard, fx_id)) is not None
    log.run_task(dag_run, "fx", True)
    assert log.get(dag_run)["state"] == "running"
    for tid in ("reconcile", "settle", "report"):
        assert log.states(dag_run)[tid] == "running"
        log.run_task(dag_run, tid, True)
    run = log.get(dag_run)
    assert run["state"] == "succeeded"
    assert [t["pending"] for t in run["tasks"]] == [0] * len(SEED)
    assert (log.task_run(dag_run, "ingest")["attempt"],
            log.task_run(dag_run, "cleanup")["attempt"]) == (1, 1)
    assert log.store.get(JOBS, JOB.encode())["active"] == []


def test_a_redriven_dag_run_decides_the_held_back_tasks_by_their_rules_again():
    # b failed; c (all_success on a and b) was upstream_failed and d
    # (none_failed_min_one_success on c) skipped behind it: both are decided
    # again. e (all_failed on a) was skipped for a reason the re-drive does
    # not change, and stays skipped.
    tasks = [task("a"), task("b"), task("c", ("a", "b")),
             task("d", ("c",), trigger_rule="none_failed_min_one_success"),
             task("e", ("a",), trigger_rule="all_failed")]
    instances = dag.new_instances(tasks)
    assert dag.begin(instances) == ["a", "b"]
    dag.task_ended(instances, "a", dag.SUCCEEDED)
    dag.task_ended(instances, "b", dag.FAILED)
    states = {i["id"]: i["state"] for i in instances}
    assert states == {"a": "succeeded", "b": "failed", "c": "upstream_failed",
                      "d": "upstream_failed", "e": "skipped"}
    assert dag.reset(instances) == ["b", "c", "d"]
    assert dag.begin(instances) == ["b"]
    assert dag.task_ended(instances, "b", dag.SUCCEEDED) == ["c"]
    assert dag.task_ended(instances, "c", dag.SUCCEEDED) == ["d"]
    assert dag.outcome(instances) is None
    assert dag.task_ended(instances, "d", dag.SUCCEEDED) == []
    assert dag.outcome(instances) == dag.SUCCEEDED
    assert {i["id"]: i["state"] for i in instances}["e"] == "skipped"


def test_cancelling_a_dag_run_cancels_its_unfinished_tasks():
    log = Log()
    log.make(SEED)
    dag_run = log.fire()
    log.run_task(dag_run, "ingest", True)
    log.report(log.start(dag_run, "fx"))
    fx = log.task_run(dag_run, "fx")
    child = log.run(commands.cancel_run(run_id=fx["id"], reason="no", at_ms=10_300))
    assert (child["ok"], child["error"]) == (False, "conflict")
    assert dag_run in child["detail"]
    result = log.run(commands.cancel_run(run_id=dag_run, reason="stop", at_ms=10_300))
    assert result["ok"]
    assert log.get(dag_run)["state"] == "cancelled"
    assert set(log.states(dag_run).values()) == {"succeeded", "cancelled"}
    assert log.states(dag_run)["ingest"] == "succeeded"
    assert log.task_run(dag_run, "fx")["state"] == "cancelled"
    assert RunCancelled(run_id=fx["id"], holder="n1", attempt=1) in log.effects
    assert log.store.scan(LEASES) == []
    assert log.store.get(JOBS, JOB.encode())["active"] == []
    # The cancelled task's late report changes nothing.
    late = dict(log.finish(dag_run, "fx", True), holder="n1")
    assert log.report(late) == [False]


def test_concurrency_policies_apply_to_dag_runs():
    log = Log()
    log.make([task("a"), task("b", ("a",))], concurrency={"policy": "queue"})
    first = log.fire(10_000)
    second = log.fire(12_000)
    assert log.get(second)["state"] == "scheduled"
    assert log.task_run(second, "a") is None
    log.run_task(first, "a", True)
    log.run_task(first, "b", True)
    assert log.get(first)["state"] == "succeeded"
    assert log.get(second)["state"] == "running"
    assert log.task_run(second, "a")["state"] == "running"

    skipping = Log()
    skipping.make([task("a")], concurrency="skip_if_running")
    skipping.fire(10_000)
    skipped = skipping.fire(12_000)
    assert skipping.get(skipped)["state"] == "skipped"
    assert skipping.states(skipped) == {"a": "skipped"}

    replacing = Log()
    replacing.make([task("a"), task("b", ("a",))], concurrency="replace")
    old = replacing.fire(10_000)
    new = replacing.fire(12_000)
    assert replacing.get(old)["state"] == "cancelled"
    assert replacing.task_run(old, "a")["state"] == "cancelled"
    assert replacing.get(new)["state"] == "running"


def test_a_task_whose_holder_died_is_taken_over_and_no_succeeded_task_runs_again():
    log = Log()
    log.make([task("a"), task("b", ("a",)), task("c", ("b",))],
             retry_policy={"max_attempts": 3})
    dag_run = log.fire()
    log.run_task(dag_run, "a", True)
    b = log.task_run(dag_run, "b")
    assert b["holder"] == "n1"
    # n1 dies: its shard moves to n2, which takes the open task run over.
    log.run(commands.assign_shards(assignments=[(log.shard, "n2")], at_ms=10_300))
    assert log.run(commands.take_over_runs(node="n2", shard=log.shard, token=2,
                                           run_ids=[b["id"]], at_ms=10_400))["taken"] == 1
    assert (log.task_run(dag_run, "b")["holder"], log.get(dag_run)["tasks"][1]["attempt"]) == \
        ("n2", 2)
    assert log.task_run(dag_run, "a")["attempt"] == 1
    log.run_task(dag_run, "b", True)
    log.run_task(dag_run, "c", True)
    assert log.get(dag_run)["state"] == "succeeded"
    assert [log.task_run(dag_run, t)["attempt"] for t in "abc"] == [1, 2, 1]


def test_a_task_handed_over_uncalled_by_its_live_holder_keeps_its_attempt():
    """Its shard moved off a live holder before the call: the holder's
    hand-over moves the same attempt, and the DAG run's task follows."""
    log = Log()
    log.make([task("a"), task("b", ("a",))], retry_policy={"max_attempts": 3})
    dag_run = log.fire()
    a = log.task_run(dag_run, "a")
    log.run(commands.assign_shards(assignments=[(log.shard, "n2")], at_ms=10_300))
    assert log.run(commands.hand_over_runs(node="n2", holder="n1", shard=log.shard, token=2,
                                           run_ids=[a["id"]], at_ms=10_400))["taken"] == 1
    moved = log.task_run(dag_run, "a")
    assert (moved["holder"], moved["attempt"], moved.get("redeliveries", 0)) == ("n2", 1, 0)
    assert (log.get(dag_run)["tasks"][0]["state"], log.get(dag_run)["tasks"][0]["attempt"]) \
        == ("running", 1)
    log.run_task(dag_run, "a", True)   # n2 reports: it holds the run now
    log.run_task(dag_run, "b", True)
    assert log.get(dag_run)["state"] == "succeeded"
    assert [log.task_run(dag_run, t)["attempt"] for t in "ab"] == [1, 1]


def test_a_dag_run_is_never_executed_itself():
    log = Log()
    log.make([task("a")])
    dag_run = log.fire()
    start = {"run_id": dag_run, "event": "start", "holder": "n1", "attempt": 1,
             "at_ms": 10_100, "lease_ms": 15_000}
    assert log.report(start) == [False]
    assert log.run(commands.reassign_runs(items=[(dag_run, "n1", "n2")],
                                          at_ms=10_100))["moved"] == 0
    log.report(log.start(dag_run, "a"))
    assert log.run(commands.expire_leases(items=[(dag_run, 1, 10)],
                                          at_ms=99_000))["expired"] == 0
    assert log.get(dag_run)["state"] == "running"


def test_a_finished_dag_run_is_purged_with_its_task_runs():
    log = Log()
    log.make([task("a"), task("b", ("a",))])
    dag_run = log.fire()
    log.run_task(dag_run, "a", True)
    log.run_task(dag_run, "b", True)
    children = dagrun.task_run_ids(log.get(dag_run))
    assert len(children) == 2
    result = log.run(commands.purge(at_ms=10 ** 9, history_max_runs=1,
                                    history_max_age_ms=1, finished_job_retention_ms=10 ** 9,
                                    idempotency_ttl_ms=10 ** 9, runs=[(dag_run, JOB)], jobs=[],
                                    idem=[]))
    assert result["runs"] == 1
    assert all(log.get(r) is None for r in [dag_run, *children])


def test_a_dag_job_without_a_schedule_runs_when_triggered_and_never_completes():
    log = Log()
    spec = jobspec.validate_create({"dag": {"tasks": [task("a")]}})["spec"]
    shard = keys.shard_of(JOB, SHARDS)
    log.run(commands.create_job(job_id=JOB, tenant="default", spec=spec, idempotency_key=None,
                                shard=shard, next_ms=None, at_ms=1_000))
    run = log.run(commands.trigger_job(job_id=JOB, scheduled_ms=5_000, node="n2",
                                       at_ms=5_000))["run"]
    # No node owns the shard yet: the task run waits, held by nobody, for its first owner.
    assert run["tasks"][0]["state"] == "queued"
    assert log.task_run(run["id"], "a")["node"] is None
    log.run(commands.pause_job(job_id=JOB, at_ms=6_000))
    log.run(commands.resume_job(job_id=JOB, next_ms=None, at_ms=7_000))
    assert log.store.get(JOBS, JOB.encode())["status"] == "active"


@settings(max_examples=examples(60), deadline=None)
@given(dags(size_max=8), st.data())
def test_dag_runs_through_apply_end_as_the_rules_say(tasks, data):
    """Reports of random outcomes, in random batches: every task ends as the
    rules decide, each task run is created once, and the DAG run ends with
    the outcome its tasks give."""
    tasks = [dict(task(t["id"], tuple(t["depends_on"])), trigger_rule=t["trigger_rule"])
             for t in tasks]
    ran = {t["id"]: data.draw(st.sampled_from([dag.SUCCEEDED, dag.FAILED])) for t in tasks}
    log = Log()
    log.make(tasks, retry_policy={"max_attempts": 1})
    dag_run = log.fire()
    rng = random.Random(data.draw(st.integers(0, 2 ** 32)))
    for _ in range(4 * len(tasks)):
        queued = [t for t, s in log.states(dag_run).items() if s == "queued"]
        if queued:
            log.report(*(log.start(dag_run, t) for t in queued))
        running = [t for t, s in log.states(dag_run).items() if s == "running"]
        if not running:
            break
        batch = rng.sample(running, rng.randint(1, len(running)))
        log.report(*(log.finish(dag_run, t, ran[t] == dag.SUCCEEDED) for t in batch))
    states = log.states(dag_run)
    assert states == reference_states(
        [{"id": t["id"], "depends_on": t["depends_on"], "trigger_rule": t["trigger_rule"]}
         for t in tasks], ran)
    # One attempt each: a task run was queued once for each task that ran, and
    # for no other.
    queued = [e.run["task_id"] for e in log.effects if getattr(e, "run", None)]
    assert sorted(queued) == sorted(t for t, s in states.items()
                                    if s in (dag.SUCCEEDED, dag.FAILED))
    failed = any(s in (dag.FAILED, dag.UPSTREAM_FAILED) for s in states.values())
    assert log.get(dag_run)["state"] == ("failed" if failed else "succeeded")
