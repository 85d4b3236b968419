"""`raftsched worker`: run the command targets of one queue, for the cluster.

    raftsched worker --cluster http://a:8701,http://b:8701 --queue batch --concurrency 4

The worker long-polls a node for runs of its queue (claim), executes each with
the command executor, heartbeats every run it holds (the node answers which
leases are gone: those runs were cancelled or expired, and the worker kills
them), and reports each completion with its output until a node has accepted
it. Any node will do: on a connection error, a timeout or a 503 the worker
moves to the next URL. A worker killed mid-run loses its leases; the reaper
then retries those runs elsewhere, with the same execution id. Its commands
die with it, even on SIGKILL (executors/command.py), so the retry is the only
copy running.

Stopped with SIGTERM, a worker drains first (`drain`): it claims no more runs
(a claim waiting for runs is withdrawn), lets the commands it runs end while
it heartbeats their leases, and reports them, for at most --drain-s seconds;
then it stops, killing what is still running. SIGINT, or a second signal,
stops it at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import ssl
import sys
import time
from typing import Any

import aiohttp

from raftsched import limits
from raftsched.executors.base import Attempt, Outcome
from raftsched.executors.command import CommandExecutor, resolve_command_user
from raftsched.runtime.peer import client_ssl_context
from raftsched.runtime.procguard import deny_same_user_inspection
from raftsched.runtime.supervise import Supervisor

log = logging.getLogger("raftsched.worker")


class NoNodeAnswered(Exception):
    pass


class Throttled(Exception):
    """A node answered 429 (a bound it names): ask again after `retry_after_s`."""

    def __init__(self, problem: dict, retry_after_s: float) -> None:
        super().__init__(problem.get("detail"))
        self.problem, self.retry_after_s = problem, retry_after_s


def _retry_after_s(headers: Any) -> float:
    try:
        return min(max(float(headers.get("Retry-After", 1)), 0.1),
                   limits.worker_unreachable_pause_s * 10)
    except ValueError:
        return 1.0


class Refused(Exception):
    """A node answered 409: the problem+json it sent."""

    def __init__(self, problem: dict) -> None:
        super().__init__(problem.get("detail"))
        self.problem = problem


class RemoteWorker:
    def __init__(self, urls: list[str], queue: str, concurrency: int, worker_id: str,
                 executor: CommandExecutor | None = None,
                 supervisor: Supervisor | None = None, token: str | None = None,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        """`ssl_context`: what verifies https nodes (None: the system's CAs)."""
        assert urls
        assert concurrency >= 1
        self._urls = [u.rstrip("/") for u in urls]
        self._current = 0
        self.queue = queue
        self.worker_id = worker_id
        self._concurrency = concurrency
        self._executor = executor or CommandExecutor()
        self._running: dict[str, tuple[dict, asyncio.Task]] = {}
        self._results: list[dict] = []
        self._results_ready = asyncio.Event()
        self._heartbeat_s = limits.run_heartbeat_ms_default / 1000
        self._session: aiohttp.ClientSession | None = None
        # A worker token of the queue's tenant (or an admin's): sent on every call.
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._ssl = ssl_context
        self.completed_total = 0
        self.supervisor = supervisor or Supervisor(f"worker {worker_id}")
        # Draining (drain()): no claim is sent, and the one waiting is withdrawn.
        self._draining = False
        self._claiming = True           # the claim loop has not ended
        self._claim: asyncio.Future | None = None   # the claim request under way
        self._drained = asyncio.Event()

    async def _post(self, path: str, body: dict, timeout_s: float) -> Any:
        """POST to the current node, failing over through the others."""
        assert self._session is not None
        for _ in range(len(self._urls)):
            url = self._urls[self._current] + path
            try:
                async with self._session.post(
                        url, json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                    if resp.status < 500:
                        data = await resp.json()
                        if resp.status == 409:
                            raise Refused(data)
                        if resp.status == 429:
                            raise Throttled(data, _retry_after_s(resp.headers))
                        if resp.status >= 400:
                            raise RuntimeError(f"{url}: {resp.status} {data}")
                        return data
                    log.warning("%s answered %d; trying the next node", url, resp.status)
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                log.warning("%s: %s; trying the next node", url, type(exc).__name__)
            self._current = (self._current + 1) % len(self._urls)
        raise NoNodeAnswered(f"no node of {', '.join(self._urls)} answered")

    async def run(self) -> None:
        """Serve until cancelled. Each loop restarts when it fails, and the
        process exits when one cannot go on (runtime/supervise.py); stopping
        cancels the loops and the running commands (their groups are killed)."""
        connector = aiohttp.TCPConnector(ssl=self._ssl if self._ssl is not None else True)
        async with aiohttp.ClientSession(headers=self._headers, connector=connector) as session:
            self._session = session
            self.supervisor.start("claim", self._claim_loop, finite=True)
            self.supervisor.start("heartbeat", self._heartbeat_loop)
            self.supervisor.start("report", self._report_loop)
            try:
                await asyncio.get_running_loop().create_future()   # until cancelled
            finally:
                await self.supervisor.stop()

    async def drain(self, timeout_s: float) -> bool:
        """Claim no more runs (withdrawing a claim that waits for some), let
        the commands running end and their results be reported, for at most
        `timeout_s`: whether all of that was done. Heartbeats go on meanwhile,
        so the runs' leases hold. The caller then stops the worker (run()
        cancelled), which kills what still runs."""
        self._draining = True
        log.info("worker %s draining: no more claims; %d commands running, for at most "
                 "%g s", self.worker_id, len(self._running), timeout_s)
        if self._claim is not None:
            # Its connection closes: the node grants it nothing after that
            # (runtime/workers.py, `gone`). A run granted in that very
            # instant is held by no one: its lease expires and it is retried.
            self._claim.cancel()
        self._note_drained()
        try:
            await asyncio.wait_for(self._drained.wait(), timeout_s)
        except asyncio.TimeoutError:
            log.warning("worker %s: drain not done within %g s: %d commands still running "
                        "(they are killed and their runs retried), %d results not reported",
                        self.worker_id, timeout_s, len(self._running), len(self._results))
            return False
        log.info("worker %s drained", self.worker_id)
        return True

    def _note_drained(self) -> None:
        """Set _drained once a drain has nothing left: no claim, no command,
        no result to report."""
        if self._draining and not self._claiming and not self._running \
                and not self._results:
            self._drained.set()

    async def _claim_loop(self) -> None:
        self._claiming = True   # (again, when the supervisor restarts it)
        try:
            await self._claim_until_drained()
        finally:
            self._claiming = False
            self._note_drained()

    async def _claim_until_drained(self) -> None:
        base = f"/v1/workers/{self.worker_id}"
        while not self._draining:
            free = self._concurrency - len(self._running)
            if free <= 0:
                await asyncio.sleep(limits.worker_slot_poll_s)
                continue
            self._claim = asyncio.ensure_future(self._post(
                base + "/claim", {"queue": self.queue, "max": free,
                                  "wait_s": limits.worker_claim_wait_s},
                limits.worker_claim_wait_s + limits.propose_timeout_s
                + limits.worker_request_slack_s))
            try:
                data = await self._claim
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise   # this loop is stopped
                return      # the claim withdrawn by drain()
            except NoNodeAnswered as exc:
                log.warning("%s", exc)
                await asyncio.sleep(limits.worker_unreachable_pause_s)
                continue
            except Throttled as exc:
                log.warning("claim refused for now: %s", exc)
                await asyncio.sleep(exc.retry_after_s)
                continue
            finally:
                self._claim = None
            # Runs a claim brought are this worker's to run, draining or not.
            for assignment in data["runs"]:
                self._heartbeat_s = assignment["heartbeat_ms"] / 1000
                task = self.supervisor.spawn("execute", self._execute(assignment))
                self._running[assignment["run_id"]] = (assignment, task)

    async def _execute(self, assignment: dict) -> None:
        attempt = Attempt(run_id=assignment["run_id"], job_id=assignment["job_id"],
                          execution_id=assignment["execution_id"],
                          scheduled_ms=assignment["scheduled_ms"],
                          attempt=assignment["attempt"],
                          fencing_token=assignment["fencing_token"])
        target = assignment["target"]
        log.info("run %s attempt %d: starting %s", attempt.run_id, attempt.attempt,
                 target["argv"][0])
        try:
            deadline_ms = _now_ms() + int(target["timeout_s"] * 1000)
            outcome = await self._executor.run(attempt, target, deadline_ms)
        except asyncio.CancelledError:
            log.warning("run %s attempt %d: stopped (lease gone or cancelled)", attempt.run_id,
                        attempt.attempt)
            return
        finally:
            self._running.pop(attempt.run_id, None)
            self._note_drained()   # (a command stopped leaves no result to report)
        self._results.append(_result(attempt, outcome))
        self._results_ready.set()

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self._heartbeat_s)
            beats = [{"run_id": rid, "attempt": a["attempt"]}
                     for rid, (a, _) in self._running.items()]
            if not beats:
                continue
            try:
                data = await self._post(f"/v1/workers/{self.worker_id}/heartbeat",
                                        {"runs": beats}, self._heartbeat_s * 2)
            except NoNodeAnswered as exc:
                log.warning("heartbeat: %s", exc)
                continue
            for run_id in data["lost"]:
                entry = self._running.get(run_id)
                if entry is not None:
                    entry[1].cancel()

    async def _report_loop(self) -> None:
        while True:
            await self._results_ready.wait()
            batch = completion_batch(self._results)
            try:
                data = await self._post(f"/v1/workers/{self.worker_id}/complete",
                                        {"results": batch},
                                        limits.propose_timeout_s + limits.worker_request_slack_s)
            except NoNodeAnswered as exc:
                log.warning("completion of %d runs: %s; retrying", len(batch), exc)
                await asyncio.sleep(limits.worker_unreachable_pause_s)
                continue
            except Refused as exc:
                self._drop_refused(batch, exc.problem)
                continue
            del self._results[:len(batch)]
            if not self._results:
                self._results_ready.clear()
                self._note_drained()
            for result, accepted in zip(batch, data["accepted"]):
                self.completed_total += 1
                if not accepted:
                    log.warning("run %s attempt %d: completion refused (lease was gone)",
                                result["run_id"], result["attempt"])

    def _drop_refused(self, batch: list[dict], problem: dict) -> None:
        """A completion refused because this worker no longer holds one of its
        runs (the node names it as `results[i].run_id`): drop that result, and
        send the others again. Its attempt is the cluster's to retry."""
        index = _result_index(problem.get("field"))
        if index is None or index >= len(batch):
            # Not the refusal this worker knows how to act on: drop the batch
            # rather than send it for ever.
            log.error("completion of %d runs refused: %s; dropping them", len(batch),
                      problem.get("detail"))
            del self._results[:len(batch)]
        else:
            dropped = self._results.pop(index)
            log.warning("run %s attempt %d: completion refused, not held by this worker (%s)",
                        dropped["run_id"], dropped["attempt"], problem.get("detail"))
        if not self._results:
            self._results_ready.clear()
            self._note_drained()


def _result_index(field: object) -> int | None:
    """i of a problem's field `results[i].run_id`, else None."""
    if not isinstance(field, str) or not field.startswith("results[") \
            or not field.endswith("].run_id"):
        return None
    digits = field[len("results["):-len("].run_id")]
    return int(digits) if digits.isdigit() else None


def completion_batch(results: list[dict]) -> list[dict]:
    """The first results that fit one completion request: at most
    worker_claim_max of them, and within worker_complete_body_bytes_max once
    encoded (each carries its output), but always at least one."""
    budget = limits.worker_complete_body_bytes_max - 1024   # room for the envelope
    batch: list[dict] = []
    for result in results[:limits.worker_claim_max]:
        budget -= len(json.dumps(result)) + 2
        if batch and budget < 0:
            break
        batch.append(result)
    return batch


def _result(attempt: Attempt, outcome: Outcome) -> dict:
    return {"run_id": attempt.run_id, "attempt": attempt.attempt, "ok": outcome.ok,
            "exit_code": outcome.exit_code, "error": outcome.error,
            "retryable": outcome.retryable, "output": outcome.output,
            "duration_ms": outcome.duration_ms}


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def run_worker_cli(args: Any) -> int:
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s worker %(levelname)s %(name)s: %(message)s")
    # The commands run as this user: keep them out of this process's
    # /proc/PID/environ (its token) and memory (runtime/procguard.py).
    deny_same_user_inspection()
    cluster = args.cluster or os.environ.get("RAFTSCHED_URL") or ""
    urls = [u.strip() for u in cluster.split(",") if u.strip()]
    if not urls:
        print("raftsched worker: --cluster (or env RAFTSCHED_URL) needs at least one node URL",
              file=sys.stderr)
        return 2
    if args.queue == "default":
        print("raftsched worker: the default queue is served by the nodes' embedded workers; "
              "give command targets a queue name and run workers for that", file=sys.stderr)
        return 2
    if args.concurrency < 1:
        print("raftsched worker: --concurrency must be at least 1", file=sys.stderr)
        return 2
    if not 0 <= args.drain_s <= limits.worker_drain_s_max:
        print(f"raftsched worker: --drain-s must be from 0 to {limits.worker_drain_s_max:g} "
              f"(worker_drain_s_max)", file=sys.stderr)
        return 2
    worker_id = args.id or f"{socket.gethostname()}-{os.getpid()}"
    # Read once and removed, so no command this worker runs could inherit it.
    token = args.token or os.environ.pop("RAFTSCHED_TOKEN", None) or None
    if token is None:
        log.warning("no token (--token or RAFTSCHED_TOKEN): the nodes will refuse this "
                    "worker unless they run with --insecure-no-auth")
    try:
        ssl_context = client_ssl_context(args.tls_ca)
    except OSError as exc:   # ssl.SSLError is one
        print(f"raftsched worker: --tls-ca: cannot load it: {exc}", file=sys.stderr)
        return 2
    try:
        run_as = resolve_command_user(args.command_user) if args.command_user else None
    except ValueError as exc:
        print(f"raftsched worker: --command-user: {exc}", file=sys.stderr)
        return 2
    worker = RemoteWorker(urls, args.queue, args.concurrency, worker_id, token=token,
                          ssl_context=ssl_context, executor=CommandExecutor(run_as=run_as))

    async def main() -> None:
        task = asyncio.ensure_future(worker.run())
        loop = asyncio.get_running_loop()
        signals: list[int] = []
        signalled = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda sig=sig: (signals.append(sig), signalled.set()))
        # Said once a signal is handled as below, so a stop that follows it drains.
        log.info("worker %s serving queue %s with %d slots for %s; commands run as %s",
                 worker_id, args.queue, args.concurrency, ", ".join(urls),
                 f"user {run_as.name}" if run_as else "this worker's own user")
        waiting = asyncio.ensure_future(signalled.wait())
        await asyncio.wait({task, waiting}, return_when=asyncio.FIRST_COMPLETED)
        if signals and signals[0] == signal.SIGTERM and not task.done():
            signalled.clear()
            drain = asyncio.ensure_future(worker.drain(args.drain_s))
            again = asyncio.ensure_future(signalled.wait())
            await asyncio.wait({drain, again, task}, return_when=asyncio.FIRST_COMPLETED)
            if again.done() and not drain.done():
                log.warning("worker %s: a second signal; stopping without draining", worker_id)
            for pending in (drain, again):
                pending.cancel()
            await asyncio.gather(drain, again, return_exceptions=True)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        log.info("worker %s stopping", worker_id)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass

    asyncio.run(main())
    return 0
