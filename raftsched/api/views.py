"""JSON renderings of stored records (times as RFC 3339)."""

from __future__ import annotations

import re

from raftsched.core import runs
from raftsched.core.redact import redact_spec_dag, redact_spec_target, redact_text
from raftsched.core.timeutil import format_ms, format_ms_offset


def schedule_view(spec: dict) -> dict:
    schedule = spec["schedule"]
    if schedule["kind"] == "none":
        return {"schedule": None}   # a DAG job that runs when triggered
    if schedule["kind"] == "cron":
        view = {"cron": schedule.get("text", schedule["cron"]), "timezone": schedule["timezone"]}
        if "text" in schedule:
            view["resolved"] = schedule["cron"]   # its H terms, hashed from the job id
        return {"schedule": view}
    if schedule["kind"] == "every":
        return {"schedule": {"every": schedule.get("text") or f"{schedule['every_ms'] // 1000}s"}}
    return {"run_at": format_ms_offset(schedule["run_at_ms"], schedule["offset_min"])}


def format_in_job_zone(spec: dict, ms: int | None) -> str | None:
    schedule = spec["schedule"]
    if schedule["kind"] == "cron":
        return format_ms(ms, schedule["timezone"])
    if schedule["kind"] == "once":
        return format_ms_offset(ms, schedule["offset_min"])
    return format_ms(ms)


def job_view(job: dict) -> dict:
    """The job as every read shows it: secret values masked (core/redact.py)."""
    spec = job["spec"]
    return {
        "job_id": job["id"],
        "name": spec["name"],
        "status": job["status"],
        **schedule_view(spec),
        "next_run_at": format_in_job_zone(spec, job["next_ms"]),
        "target": redact_spec_target(spec),
        **({"dag": redact_spec_dag(spec)} if "dag" in spec else {}),
        "secret_keys": list(spec.get("secret_keys") or ()),
        # Jobs stored before priorities existed rank as normal.
        "priority": spec.get("priority", "normal"),
        "retry": spec["retry"],
        "alert": spec.get("alert", {}),
        "concurrency": spec["concurrency"],
        "misfire": _misfire_view(spec.get("misfire")),
        "misfires_omitted": job.get("misfires_omitted", 0),
        "metadata": spec["metadata"],
        "history": _history_view(spec.get("history")),
        "labels": spec.get("labels") or {},
        "jitter_s": spec.get("jitter_ms", 0) / 1000,
        "not_before": format_in_job_zone(spec, spec["schedule"].get("not_before_ms")),
        "not_after": format_in_job_zone(spec, spec["schedule"].get("not_after_ms")),
        "pause_note": job.get("pause_note"),
        "paused_at": format_ms(job.get("paused_ms")),
        "idempotency_key": job["idempotency_key"],
        "shard": job["shard"],
        "version": job["version"],
        "last_run_id": job["last_run_id"],
        "created_at": format_ms(job["created_ms"]),
        "updated_at": format_ms(job["updated_ms"]),
    }


def run_view(run: dict, secrets: tuple[str, ...] = (), now_ms: int | None = None) -> dict:
    """`secrets`: the job's secret_values, masked in the errors. They were
    masked before the errors were recorded; this masks them again for a name
    listed in secret_keys since. `now_ms`: the cluster's time, by which a run
    fired ahead of its second reads `armed` until then (runs.presented_state);
    None shows the state as stored.

    A run fired ahead with its first attempt open (runs.armed_open) shows no
    `started_at`, nor does that attempt: the record holds its fire's time
    there (`armed_at`), and its call's start is recorded by its finish."""
    armed = runs.armed_open(run)
    return {
        "run_id": run["id"],
        "job_id": run["job_id"],
        "scheduled_for": format_ms(run["scheduled_ms"]),
        "attempt": run["attempt"],
        "state": run["state"] if now_ms is None else runs.presented_state(run, now_ms),
        "trigger": run["trigger"],
        # How a re-driven run first started, and how often it was re-driven.
        "first_trigger": run.get("first_trigger", run["trigger"]),
        "redrives": run.get("redrives", 0),
        "execution_id": run["execution_id"],
        "node": run["node"],
        "queue": run.get("queue"),
        "holder": run.get("holder"),
        "lease_expires_at": format_ms(run.get("lease_ms")),
        "next_attempt_at": format_ms(run.get("retry_due_ms")),
        "created_at": format_ms(run["created_ms"]),
        "started_at": None if armed else format_ms(run["started_ms"]),
        "finished_at": format_ms(run["finished_ms"]),
        "http_status": run["http_status"],
        "exit_code": run.get("exit_code"),
        "error": _masked(run["error"], secrets),
        "reason": presented_reason(run.get("reason")),
        "fencing_token": run.get("token", 0),
        # The delay a job's jitter_s added to this occurrence's fire.
        "jitter_ms": run.get("jitter_ms", 0),
        # Fired ahead of its second (docs/schedules.md): its call starts at
        # scheduled_for plus jitter_ms.
        "armed_at": format_ms(run.get("armed_ms")),
        "attempts": [_attempt_view(a, secrets, armed and a is run["attempts"][-1])
                     for a in run.get("attempts", [])],
        "alert": run.get("alert"),
        **_dag_members(run, secrets),
    }


def _dag_members(run: dict, secrets: tuple[str, ...]) -> dict:
    """A DAG run's tasks, or the DAG run and task a task run executes."""
    if "tasks" in run:
        return {"tasks": [{"id": t["id"], "state": t["state"], "attempt": t["attempt"],
                           "started_at": format_ms(t["started_ms"]),
                           "finished_at": format_ms(t["finished_ms"]),
                           "error": _masked(t["error"], secrets), "run_id": t["run_id"],
                           "depends_on": t["upstream"], "trigger_rule": t["rule"]}
                          for t in run["tasks"]]}
    if "dag_run" in run:
        return {"dag_run_id": run["dag_run"], "task_id": run["task_id"]}
    return {}


def _masked(error: str | None, secrets: tuple[str, ...]) -> str | None:
    return error if error is None else redact_text(error, secrets)


def _attempt_view(attempt: dict, secrets: tuple[str, ...], armed: bool = False) -> dict:
    return {"attempt": attempt["attempt"], "holder": attempt["holder"],
            "started_at": None if armed else format_ms(attempt["started_ms"]),
            "finished_at": format_ms(attempt["finished_ms"]),
            "http_status": attempt["http_status"], "exit_code": attempt["exit_code"],
            "error": _masked(attempt["error"], secrets),
            "retry_delay_ms": attempt.get("retry_delay_ms")}


def _history_view(history: dict | None) -> dict:
    """The members the job set; a member left out follows the cluster default."""
    history = history or {}
    view: dict = {}
    if "max_runs" in history:
        view["max_runs"] = history["max_runs"]
    if "max_age_ms" in history:
        view["max_age_s"] = history["max_age_ms"] / 1000
    return view


def _misfire_view(misfire: dict | None) -> dict:
    misfire = misfire or {"policy": "fire_once", "tolerance_ms": 60_000, "catchup_max": 100}
    view = {"policy": misfire["policy"], "catchup_max": misfire["catchup_max"]}
    if misfire["policy"] == "skip":
        view["misfire_tolerance_s"] = misfire["tolerance_ms"] / 1000
    if "catchup_window_ms" in misfire:
        view["catchup_window_s"] = misfire["catchup_window_ms"] / 1000
    return view


# Two reasons stored an occurrence as epoch ms: a fire_once decision's one
# late run (core/apply._policy_decisions) and the run a replace policy
# cancelled for (core/runs._admit). Every replica keeps that text as it is,
# so an answer names the time as every other time is named.
_RUN_FOR_MS = re.compile(r"(one late run for |replaced by the run for )(\d{1,16})\b")


def presented_reason(reason: str | None) -> str | None:
    """A run's reason as an answer gives it: a time stored as epoch ms, in RFC 3339."""
    if reason is None or " run for " not in reason:
        return reason
    return _RUN_FOR_MS.sub(lambda m: f"{m[1]}{format_ms(int(m[2]))}", reason)
