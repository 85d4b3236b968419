"""Many jobs at once with the blocking Client: `create_jobs(api, jobs)` takes a
list of job bodies of any length and sends it as batchCreates of at most
batch_create_jobs_max jobs and batch_request_body_bytes_max bytes, in order.

A batch a node refused busy (nothing was proposed) is sent again after its
Retry-After, for up to batch_resend_s. Across more than one batch every
job carries an idempotency key (its own, else a new `client-` one), so a batch
whose answer was lost, or whose outcome is unknown, is sent again too without
creating a job twice. If a batch cannot be sent, `BatchNotSent` carries the
results so far and the error. `raftsched jobs create -f` is built on it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from raftsched import limits
from raftsched.client.errors import ApiError, ClusterError, RaftschedError, Unavailable
from raftsched.client.wire import json_bytes, with_key

if TYPE_CHECKING:
    from raftsched.client.sync import Client

Progress = Callable[[int, int], None]


class BatchNotSent(RaftschedError):
    """Jobs from `start` on have no result: `results` holds those before
    them (in order, one per job), `cause` the error of the batch at `start`."""

    def __init__(self, results: list[dict[str, Any]], start: int, total: int,
                 cause: RaftschedError) -> None:
        self.results, self.start, self.total, self.cause = results, start, total, cause
        super().__init__(f"jobs {start}-{total - 1} of {total} have no result: {cause}")


def create_jobs(api: Client, jobs: Sequence[Mapping[str, Any]],
                progress: Progress | None = None) -> list[dict[str, Any]]:
    """One result per job, in order, as batchCreate answers them (`job_id`
    and `created`, or `error`). `progress(done, total)` is called after each
    batch. Raises BatchNotSent."""
    bodies = [dict(job) for job in jobs]
    spans = batches_of(bodies)
    keyed = len(spans) > 1
    if keyed:
        bodies = [with_key(job) for job in bodies]
        spans = batches_of(bodies)   # the keys take room
    results: list[dict[str, Any]] = []
    for start, end in spans:
        try:
            answer = _send_batch(api, bodies[start:end], keyed=keyed)
        except RaftschedError as exc:
            raise BatchNotSent(results, start, len(bodies), exc) from exc
        results += answer["results"]
        if progress is not None:
            progress(len(results), len(bodies))
    return results


def batches_of(jobs: Sequence[Any]) -> list[tuple[int, int]]:
    """Where a list of job bodies is cut into batchCreates, in order: [start,
    end) of each, at most batch_create_jobs_max jobs and, as the client
    encodes the body (wire.json_bytes), at most batch_request_body_bytes_max bytes."""
    budget = limits.batch_request_body_bytes_max - len(b'{"jobs": []}')
    spans: list[tuple[int, int]] = []
    start, size = 0, 0
    for i, job in enumerate(jobs):
        job_bytes = len(json_bytes(job)) + len(b", ")
        if i > start and (i - start >= limits.batch_create_jobs_max or size + job_bytes > budget):
            spans.append((start, i))
            start, size = i, 0
        size += job_bytes
    if jobs:
        spans.append((start, len(jobs)))
    return spans


def _send_batch(api: Client, jobs: list[dict[str, Any]], *, keyed: bool) -> dict[str, Any]:
    """One batchCreate, sent again for up to batch_resend_s while a node
    refuses it busy (nothing was proposed) or, when every job carries a key
    (`keyed`), while no answer or an unknown outcome comes back."""
    deadline = time.monotonic() + limits.batch_resend_s
    while True:
        try:
            return api.batch_create_jobs(jobs)
        except ClusterError as exc:
            busy = isinstance(exc, Unavailable) and exc.reason == "busy"
            if not (busy or keyed) or time.monotonic() >= deadline:
                raise
            after = exc.retry_after_s if isinstance(exc, ApiError) else None
            wait_s = 1.0 if after is None else float(after)
        time.sleep(max(0.0, min(wait_s, limits.batch_resend_wait_max_s,
                                deadline - time.monotonic())))
