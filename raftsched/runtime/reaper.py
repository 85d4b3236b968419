"""Leader-only housekeeping of runs: the reaper and the alerter.

The reaper, every `reaper_period_ms`:
  - ends every attempt whose lease expired before now (its holder, a node or
    a worker, died, froze or was cut off) as a retryable failure: the run is
    retried after a backoff drawn here, or failed when attempts are spent;
  (a remote worker's: a node-executed run has no lease of its own, it is held
  under its node's shard lease, and a new owner of the shard takes it over,
  runtime/dispatcher.py).

The alerter delivers each pending failure alert (a run failed for good) to the
job's `alert.webhook_url`, or the cluster default `--alert-webhook-url`, with
`Idempotency-Key: alert_<run_id>`, retrying `alert_attempts_max` times with a
doubling wait, then records the outcome. A leader change mid-delivery may send
an alert twice; the key lets the receiver drop the repeat. A job's webhook is
held to the node's address policy as HTTP targets are; redirects are never
followed.

Lease expiry is judged by the leader's clock against the holder's: nodes
must keep their clocks in step (NTP), well inside the lease.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from typing import Awaitable, Callable

import aiohttp

from raftsched import limits
from raftsched.core import commands, cost, dag, queries, retry
from raftsched.core.redact import redact_text, secret_values
from raftsched.core.timeutil import format_ms
from raftsched.errors import Unavailable
from raftsched.executors.http import CALL_ERRORS, Reply, describe_failure, status_error
from raftsched.runtime.context import Replicated, Spawn

log = logging.getLogger("raftsched.reaper")


def _log_refusal(result: dict, what: str) -> None:
    """A command refused whole (the node logged why): the next pass tries again."""
    if not result.get("ok"):
        log.error("%s refused (%s): %s", what, result.get("error"), result.get("detail"))


async def _send_trusted(method: str, url: str, headers: dict, body: bytes | None,
                        timeout_s: float) -> Reply:
    """A call to the operator's own webhook: any address, no redirects."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout, trust_env=False) as session:
        async with session.request(method, url, headers=headers, data=body,
                                   allow_redirects=False) as response:
            return Reply(response.status, b"", response.headers.get("Location"))


Send = Callable[[str, str, dict, "bytes | None", float], Awaitable[Reply]]


class Reaper:
    def __init__(self, replicated: Replicated, *, spawn: Spawn, send: Send,
                 alert_webhook_url: str | None = None) -> None:
        """`send`: how a job's own alert webhook is called (the node's HTTP
        executor, under its address policy); `alert_webhook_url`: the
        cluster default (--alert-webhook-url), called as trusted."""
        self._replicated = replicated
        self._spawn = spawn
        self._send = send
        self._alert_webhook_url = alert_webhook_url
        self._delivering: set[str] = set()
        self.expired_total = 0
        self.alerts_sent_total = 0
        self.alerts_failed_total = 0

    async def run(self) -> None:
        """Any other failure is the node's supervisor's: it logs it and starts
        the loop again (runtime/supervise.py)."""
        while True:
            await asyncio.sleep(limits.reaper_period_ms / 1000)
            if not self._replicated.is_leader():
                continue
            try:
                await self.maybe_expire_leases()
                self.maybe_deliver_alerts()
            except Unavailable as exc:
                log.warning("reaper pass not committed: %s", exc.detail)

    async def maybe_expire_leases(self) -> bool:
        state = self._replicated
        now = state.now_ms()
        items = []
        total = 0
        for run_id, holder in queries.leases_expired(state.store, now, limits.reaper_batch_max):
            run = queries.run(state.store, run_id)
            if run is None or run["state"] != "running":
                continue
            job = queries.job(state.store, run["job_id"])
            # Ending a DAG task's attempt may release what is downstream of
            # it: an entry holds at most apply_entry_cost_max (core/cost.py);
            # the rest waits for the next pass.
            item_cost = cost.run_update_cost(job["spec"] if job else None, run.get("task_id"),
                                             "finish")
            if items and total + item_cost > limits.apply_entry_cost_max:
                break
            total += item_cost
            policy = dag.retry_policy(job["spec"] if job else None, run.get("task_id"))
            items.append((run_id, run["attempt"],
                          retry.draw_delay_ms(policy, run["attempt"], random.random)))
            log.warning("run %s attempt %d: lease held by %s expired %d ms ago; ending the "
                        "attempt", run_id, run["attempt"], holder, now - run["lease_ms"])
        if not items:
            return False
        result = await state.propose(commands.expire_leases(items=items, at_ms=now))
        _log_refusal(result, "lease expiry")
        self.expired_total += result.get("expired", 0)
        return True

    # --- alerts -----------------------------------------------------------------------

    def maybe_deliver_alerts(self) -> None:
        for alert in queries.pending_alerts(self._replicated.store, limits.reaper_batch_max):
            if alert["run_id"] not in self._delivering:
                self._delivering.add(alert["run_id"])
                task = self._spawn("reaper.alert", self._deliver(alert))
                task.add_done_callback(lambda _, r=alert["run_id"]: self._delivering.discard(r))

    async def _deliver(self, alert: dict) -> None:
        url = alert["url"] or self._alert_webhook_url
        if url is None:
            log.warning("run %s of job %s failed for good; no alert webhook (neither the job's "
                        "alert.webhook_url nor --alert-webhook-url)", alert["run_id"],
                        alert["job_id"])
            await self._done(alert, "no_webhook", None)
            return
        body = self._payload(alert)
        wait_s = limits.alert_retry_base_s
        error = None
        for attempt in range(1, limits.alert_attempts_max + 1):
            if not self._replicated.is_leader():
                return   # the next leader delivers it
            error, final = await self._post(url, alert, body)
            if error is None:
                self.alerts_sent_total += 1
                log.info("alert for run %s delivered to %s", alert["run_id"], url)
                await self._done(alert, "sent", None)
                return
            log.warning("alert for run %s to %s failed (attempt %d of %d): %s",
                        alert["run_id"], url, attempt, limits.alert_attempts_max, error)
            if final:
                break
            await asyncio.sleep(wait_s)
            wait_s *= 2
        self.alerts_failed_total += 1
        await self._done(alert, "undeliverable", error)

    def _payload(self, alert: dict) -> dict:
        """What the webhook receives: names, times and the last error, never the
        target. The error was masked of the job's secrets when it was recorded;
        it is masked again for a name listed in secret_keys since."""
        store = self._replicated.store
        run = queries.run(store, alert["run_id"])
        job = queries.job(store, alert["job_id"])
        last = run["attempts"][-1] if run["attempts"] else {}
        error = run["error"] and redact_text(run["error"], secret_values(job["spec"]))
        # A re-driven run that fails again raises a new alert, with an id of its own.
        alert_id = "alert_" + run["id"] + (f"_{run['redrives']}" if run.get("redrives") else "")
        return {"type": "run_failed", "alert_id": alert_id, "run_id": run["id"],
                "job_id": job["id"], "job_name": job["spec"]["name"],
                "execution_id": run["execution_id"],
                "scheduled_for": format_ms(run["scheduled_ms"]),
                "attempts": len(run["attempts"]), "last_error": error,
                "http_status": last.get("http_status"), "exit_code": last.get("exit_code")}

    async def _post(self, url: str, alert: dict, body: dict) -> tuple[str | None, bool]:
        """(the error, None once delivered; whether another try is pointless).

        The job's own webhook is called as its HTTP targets are, under the
        node's address policy (executors/netguard.py); the operator's
        --alert-webhook-url is trusted and may be internal. Neither follows
        redirects. A refused address or a redirect is final: another try
        would end the same way."""
        headers = {"Idempotency-Key": body["alert_id"],
                   "Content-Type": "application/json"}
        data = json.dumps(body, separators=(",", ":")).encode()
        send = self._send if alert["url"] else _send_trusted
        try:
            reply = await send("POST", url, headers, data, limits.alert_timeout_s)
        except CALL_ERRORS as exc:
            error, retryable = describe_failure(exc, limits.alert_timeout_s)
            return error, not retryable
        if 200 <= reply.status < 300:
            return None, False
        return status_error(reply), 300 <= reply.status < 400

    async def _done(self, alert: dict, outcome: str, error: str | None) -> None:
        try:
            await self._replicated.propose(commands.alert_done(
                run_id=alert["run_id"], outcome=outcome, error=error,
                at_ms=self._replicated.now_ms()))
        except Unavailable as exc:
            # The alert stays pending; a later pass (here or on the next leader)
            # sends it again, under the same Idempotency-Key.
            log.warning("alert outcome for run %s not committed: %s", alert["run_id"],
                        exc.detail)
