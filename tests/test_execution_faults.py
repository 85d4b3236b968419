"""Execution survives its executor dying: a worker SIGKILLed mid-run, and a
node SIGKILLed while its runs execute. Either way the run completes on
another executor after the lease, with the same execution id, and a killed
worker's command dies with it, so the retry is the only copy running."""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import time

import pytest

from raftsched import limits
from raftsched.testing.cluster import LocalCluster
from raftsched.testing.http import wait_until
from raftsched.testing.sink import Sink

pytestmark = pytest.mark.integration


def soon(seconds: float = 1.0) -> str:
    at = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=seconds)
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def runs_of(cluster, job_id: str, nid: str) -> list[dict]:
    return cluster.api(nid, "GET", f"/v1/jobs/{job_id}/runs?consistent=true").body["runs"]


class Workers:
    """`raftsched worker` processes; all killed on exit."""

    def __init__(self, cluster: LocalCluster, queue: str) -> None:
        self._cluster = cluster
        self._queue = queue
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, worker_id: str) -> None:
        urls = ",".join(self._cluster.url(n) for n in self._cluster.ids)
        log = open(self._cluster.base / f"worker-{worker_id}.log", "ab")
        self.procs[worker_id] = subprocess.Popen(
            [sys.executable, "-m", "raftsched", "worker", "--cluster", urls, "--queue",
             self._queue, "--concurrency", "1", "--id", worker_id],
            stdout=log, stderr=subprocess.STDOUT, env=self._cluster.env)
        log.close()

    def kill(self, worker_id: str) -> None:
        self.procs[worker_id].send_signal(signal.SIGKILL)
        self.procs[worker_id].wait(10)

    def terminate(self, worker_id: str) -> None:
        """SIGTERM: the worker drains (runtime/remote_worker.py)."""
        self.procs[worker_id].send_signal(signal.SIGTERM)

    def __enter__(self) -> "Workers":
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def batch_job(cluster, name: str, script: str, **target: object) -> str:
    """A one-off due in a second running shell `script` on the `batch` queue's
    workers, retried up to 3 attempts: its id."""
    job = cluster.api("n1", "POST", "/v1/jobs", {
        "name": name, "run_at": soon(1.0),
        "target": {"type": "command", "queue": "batch", "shell": True, "argv": [script],
                   **target},
        "retry": {"max_attempts": 3, "base_s": 0.1}})
    assert job.status == 201, job
    return job.body["job_id"]


def kill_pids_in(path) -> None:
    """A safety net: a killed worker's command must already be gone with it."""
    if not path.exists():
        return
    for line in path.read_text().splitlines():
        try:
            os.killpg(int(line.split()[2]), signal.SIGKILL)
        except (ProcessLookupError, PermissionError, IndexError, ValueError):
            pass


def test_a_worker_killed_mid_run_leaves_the_run_to_another_worker(fresh_cluster, tmp_path):
    cluster = fresh_cluster
    ledger = tmp_path / "ledger"
    script = (f"echo \"$RAFTSCHED_EXECUTION_ID $RAFTSCHED_ATTEMPT $$\" >> {ledger}; sleep 3")
    try:
        with Workers(cluster, "batch") as workers:
            workers.start("wa")
            job_id = batch_job(cluster, "on-workers", script)
            running = wait_until(
                lambda: (r := runs_of(cluster, job_id, "n2")) and r[0]["state"] == "running"
                and r[0], 20, "worker wa to start the run")
            assert running["holder"] == "worker:wa"
            wait_until(lambda: ledger.exists() and ledger.read_text().strip(), 10,
                       "the command to start on wa")
            workers.start("wb")
            workers.kill("wa")
            done = wait_until(
                lambda: (r := runs_of(cluster, job_id, "n3")) and r[0]["state"] == "succeeded"
                and r[0], 30, "the run to finish on worker wb")
    finally:
        kill_pids_in(ledger)
    assert [a["holder"] for a in done["attempts"]] == ["worker:wa", "worker:wb"]
    assert "lease expired" in done["attempts"][0]["error"]
    lines = [line.split() for line in ledger.read_text().splitlines()]
    assert [(eid, attempt) for eid, attempt, _ in lines] == [
        (done["execution_id"], "1"), (done["execution_id"], "2")]
    cluster.ensure_same()


def test_a_worker_stopped_with_sigterm_runs_its_command_to_the_end_first(fresh_cluster,
                                                                          tmp_path):
    """A rolling restart of workers: the run in progress ends on the worker
    that holds it, once, and the worker exits 0 after reporting it."""
    cluster = fresh_cluster
    ledger = tmp_path / "ledger"
    script = f"echo \"$RAFTSCHED_EXECUTION_ID $RAFTSCHED_ATTEMPT\" >> {ledger}; sleep 2"
    with Workers(cluster, "batch") as workers:
        workers.start("wa")
        job_id = batch_job(cluster, "drained", script)
        wait_until(lambda: ledger.exists() and ledger.read_text().strip(), 20,
                   "the command to start on wa")
        workers.terminate("wa")
        assert workers.procs["wa"].wait(30) == 0
        done = wait_until(
            lambda: (r := runs_of(cluster, job_id, "n2")) and r[0]["state"] == "succeeded"
            and r[0], 10, "the run to be reported succeeded")
    assert [(a["attempt"], a["holder"]) for a in done["attempts"]] == [(1, "worker:wa")]
    assert ledger.read_text().split() == [done["execution_id"], "1"]
    log = (cluster.base / "worker-wa.log").read_text()
    assert "drained" in log, log
    cluster.ensure_same()


def command_processes(run_id: str) -> dict[int, tuple[str, str]]:
    """Live processes (not zombies) started for `run_id`: pid -> (attempt, name).
    The shim, the shell and its children all carry the run's environment."""
    marker = f"RAFTSCHED_RUN_ID={run_id}".encode()
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                env = fh.read().split(b"\0")
            with open(f"/proc/{entry}/stat") as fh:
                name, state = fh.read().rsplit(")", 1)
        except OSError:
            continue   # gone meanwhile, or not ours
        if marker in env and state.split()[0] != "Z":
            attempt = next(v for v in env if v.startswith(b"RAFTSCHED_ATTEMPT="))
            found[int(entry)] = (attempt.split(b"=", 1)[1].decode(), name.split("(", 1)[1])
    return found


def test_a_killed_workers_command_dies_with_it_and_only_the_retry_runs(fresh_cluster, tmp_path):
    cluster = fresh_cluster
    # The shell's child `sleep` is the command's grandchild (the shim leads the group).
    script = "sleep 30 & wait"
    run_id = None
    try:
        with Workers(cluster, "batch") as workers:
            workers.start("wa")
            workers.start("wb")
            job_id = batch_job(cluster, "dies-with-its-worker", script, timeout_s=60)
            first = wait_until(
                lambda: (r := runs_of(cluster, job_id, "n2")) and r[0]["state"] == "running"
                and r[0], 20, "a worker to start the run")
            run_id = first["run_id"]
            # The shell forks before its child becomes `sleep`: wait for the exec.
            first_pids = wait_until(
                lambda: (p := command_processes(run_id)) and len(p) == 3
                and {name for _, name in p.values()} >= {"sh", "sleep"} and p, 10,
                "the shim, the shell and sleep of attempt 1")
            holder = first["holder"].split(":", 1)[1]
            workers.kill(holder)
            killed_at = time.monotonic()
            wait_until(lambda: not set(first_pids) & set(command_processes(run_id)), 1.0,
                       "the killed worker's command and its children to die")
            gone_after_s = time.monotonic() - killed_at
            second = wait_until(
                lambda: (r := runs_of(cluster, job_id, "n3")) and r[0]["state"] == "running"
                and r[0]["attempt"] == 2 and r[0], 30, "the retry to start on the other worker")
            assert second["holder"] != first["holder"]
            live = wait_until(lambda: (p := command_processes(run_id)) and len(p) == 3
                              and {name for _, name in p.values()} >= {"sh", "sleep"} and p,
                              10, "the retry's processes")
            assert {attempt for attempt, _ in live.values()} == {"2"}
            assert sorted(name for _, name in live.values()).count("sh") == 1
    finally:
        for pid in command_processes(run_id) if run_id else ():
            try:
                os.kill(pid, signal.SIGKILL)   # a safety net: never leave one behind
            except ProcessLookupError:
                pass
    print(f"the killed worker's command was gone {gone_after_s * 1000:.0f} ms after SIGKILL")


def test_a_node_killed_while_its_runs_execute_has_them_taken_over_by_the_new_owner(
        fresh_cluster):
    cluster = fresh_cluster
    first_calls: set[str] = set()

    def delay(call) -> float:
        # The first attempt of each run hangs (its node will die); later ones answer.
        if call.headers["X-Raftsched-Attempt"] == "1":
            first_calls.add(call.job_id)
            return 30.0
        return 0.0

    with Sink(delay_for=delay) as sink:
        job_ids = []
        for i in range(6):
            job = cluster.api("n1", "POST", "/v1/jobs", {
                "name": f"slow-{i}", "run_at": soon(1.5),
                "target": {"type": "http", "url": sink.url, "timeout_s": 60},
                "retry": {"max_attempts": 3, "base_s": 0.2, "max_s": 1}})
            assert job.status == 201, job
            job_ids.append(job.body["job_id"])
        wait_until(lambda: first_calls >= set(job_ids), 20, "every first attempt to be calling")
        holders = {runs_of(cluster, j, "n1")[0]["holder"] for j in job_ids}
        victim = sorted(holders)[0]
        victims = [j for j in job_ids if runs_of(cluster, j, "n1")[0]["holder"] == victim]
        killed_at = time.monotonic()
        cluster.kill(victim)
        survivor = next(n for n in cluster.ids if n != victim)
        wait_until(lambda: all(runs_of(cluster, j, survivor)[0]["state"] == "succeeded"
                               for j in victims), 40, "the dead node's runs to be retried")
        took_s = time.monotonic() - killed_at
        for job_id in victims:
            run = runs_of(cluster, job_id, survivor)[0]
            assert len(run["attempts"]) == 2
            assert run["attempts"][0]["holder"] == victim
            assert run["attempts"][1]["holder"] != victim
            calls = sink.by_job()[job_id]
            assert {c.headers["Idempotency-Key"] for c in calls} == {run["execution_id"]}
    # Taken over once the victim's shards moved (its Raft connection closed, or
    # its renewals stopped for node_lease_s), not after a per-run lease.
    assert took_s <= 2 * limits.node_lease_s + 5.0, took_s
    cluster.start(victim)
    cluster.ensure_same()
