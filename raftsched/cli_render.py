"""How the CLI prints: rich tables and progress bars (`--output table`), or the
API's JSON as it came (`--output json`). The only module that imports rich."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from raftsched.client import ApiError

Advance = Callable[[int, int], None]


class Renderer:
    def __init__(self, output: str) -> None:
        self.json = output == "json"
        # Created here, not at import: the streams may be replaced (tests, pipes).
        # No markup: names, errors and output may hold "[...]" of their own.
        self.console = Console(file=sys.stdout, highlight=False, soft_wrap=False,
                               markup=False)

    # --- generic ----------------------------------------------------------------------------

    def data(self, value: Any) -> None:
        """JSON in either mode, for answers without a table of their own."""
        print(json.dumps(value, indent=2, ensure_ascii=False))

    def done(self, value: Mapping[str, Any], line: str) -> None:
        if self.json:
            self.data(value)
        else:
            self.console.print(line)

    def error(self, message: str) -> None:
        print(f"raftsched: {message}", file=sys.stderr)

    def problem(self, error: ApiError) -> None:
        """An error answer: one line on stderr; the problem document on stdout with
        --output json, for a script to read."""
        self.error(error.describe())
        if self.json:
            self.data(error.problem)

    def more(self, token: str | None) -> None:
        if token:
            print(f"more: --page-token {token}", file=sys.stderr)

    def _table(self, *columns: str, title: str | None = None) -> Table:
        table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
        for name in columns:
            # Ids stay on one line so that they can be copied.
            table.add_column(name, no_wrap=name.endswith("ID"), overflow="fold")
        return table

    def _pairs(self, pairs: Sequence[tuple[str, Any]], title: str | None = None) -> None:
        table = Table(show_header=False, show_edge=False, pad_edge=False, title=title,
                      title_justify="left", box=None)
        table.add_column(style="bold", no_wrap=True)
        table.add_column(overflow="fold")
        for key, value in pairs:
            table.add_row(key, _cell(value))
        self.console.print(table)

    # --- jobs -------------------------------------------------------------------------------

    def job(self, job: Mapping[str, Any]) -> None:
        if self.json:
            return self.data(job)
        self._pairs([("id", job.get("job_id")), ("name", job.get("name")),
                     ("status", job.get("status")), ("schedule", schedule_text(job)),
                     ("next run", job.get("next_run_at")), ("target", job.get("target")),
                     ("dag", job.get("dag")), ("retry", job.get("retry")),
                     ("concurrency", job.get("concurrency")), ("labels", job.get("labels")),
                     ("pause note", job.get("pause_note")),
                     ("last run", job.get("last_run_id")), ("version", job.get("version"))])

    def job_table(self, jobs: Sequence[Mapping[str, Any]], states: Mapping[str, str]) -> None:
        table = self._table("ID", "NAME", "SCHEDULE", "NEXT RUN", "LAST STATE")
        for job in jobs:
            table.add_row(job["job_id"], job.get("name", ""), schedule_text(job),
                          job.get("next_run_at") or "-", states.get(job["job_id"], "-"))
        self.console.print(table)

    def batch_results(self, answer: Mapping[str, Any]) -> None:
        if self.json:
            return self.data(answer)
        table = self._table("#", "JOB ID", "RESULT")
        for i, result in enumerate(answer["results"]):
            if "error" in result:
                table.add_row(str(i), "-", _problem_text(result["error"]))
            else:
                table.add_row(str(i), result["job_id"],
                              "created" if result.get("created") else "existed")
        self.console.print(table)

    def fire_times(self, answer: Mapping[str, Any]) -> None:
        if self.json:
            return self.data(answer)
        table = self._table("#", "FIRE TIME")
        for i, when in enumerate(answer["fire_times"], 1):
            table.add_row(str(i), when)
        self.console.print(table)
        if answer.get("resolved"):
            self.console.print(f"resolved: {answer['resolved']}")

    @contextlib.contextmanager
    def progress(self, what: str, total: int) -> Iterator[Advance]:
        """A progress bar (none with --output json); the caller reports (done, total)."""
        if self.json:
            yield lambda done, total: None
            return
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn())
        with Progress(*columns, console=self.console) as bar:
            task = bar.add_task(what, total=total or None)
            yield lambda done, total: bar.update(task, completed=done, total=total or None)

    def backfill(self, view: Mapping[str, Any]) -> None:
        if self.json:
            return self.data(view)
        self._pairs([(key, view.get(key)) for key in (
            "backfill_id", "job_id", "state", "reason", "total", "succeeded", "failed",
            "skipped", "existing", "finished_at") if view.get(key) is not None])

    # --- runs -------------------------------------------------------------------------------

    def run(self, run: Mapping[str, Any]) -> None:
        if self.json:
            return self.data(run)
        self._pairs([(key, run.get(key)) for key in (
            "run_id", "job_id", "scheduled_for", "state", "attempt", "trigger", "redrives",
            "execution_id", "node", "started_at", "finished_at", "http_status", "exit_code",
            "error", "reason")])
        attempts = run.get("attempts") or []
        if attempts:
            table = self._table("ATTEMPT", "HOLDER", "STARTED", "FINISHED", "RESULT")
            for a in attempts:
                table.add_row(str(a.get("attempt")), a.get("holder") or "-",
                              a.get("started_at") or "-", a.get("finished_at") or "-",
                              _outcome(a))
            self.console.print(table)

    def run_table(self, page: Mapping[str, Any]) -> None:
        if self.json:
            return self.data(page)
        table = self._table("RUN ID", "JOB ID", "SCHEDULED FOR", "STATE", "ATTEMPT", "TRIGGER",
                            "ERROR")
        for run in page["runs"]:
            table.add_row(run["run_id"], run["job_id"], run.get("scheduled_for", ""),
                          run.get("state", ""), str(run.get("attempt", "")),
                          run.get("trigger", ""), run.get("error") or "")
        self.console.print(table)
        self.more(page.get("next_page_token"))

    def logs(self, attempts: Sequence[Mapping[str, Any]]) -> None:
        """Each attempt's heading and output; with --output json, one JSON object a
        line per attempt, so that `runs logs --follow` can stream them."""
        for attempt in attempts:
            if self.json:
                print(json.dumps(attempt, ensure_ascii=False), flush=True)
                continue
            self.console.print(f"--- attempt {attempt.get('attempt')} on "
                               f"{attempt.get('output_node') or attempt.get('holder') or '?'}"
                               f" ({attempt.get('started_at')} .. {attempt.get('finished_at')})"
                               f": {_outcome(attempt)}")
            for stream in ("stdout", "stderr", "http_body", "published"):
                if attempt.get(stream):
                    self.console.print(f"[{stream}]")
                    self.console.print(attempt[stream].rstrip("\n"))
            sys.stdout.flush()

    # --- cluster and tokens -----------------------------------------------------------------

    def cluster(self, cluster: Mapping[str, Any]) -> None:
        if self.json:
            return self.data(cluster)
        nodes = cluster.get("nodes", {})
        commit = max((n.get("commit_index") or 0 for n in nodes.values()), default=0)
        table = self._table("NODE", "ROLE", "TERM", "APPLIED", "LAG", "SHARDS", "CLOCK MS",
                            "HTTP", title=f"leader {cluster.get('leader') or 'none'}, "
                                          f"{cluster.get('shard_count')} shards")
        for nid, node in sorted(nodes.items()):
            applied = node.get("applied_index")
            table.add_row(nid, node.get("role") or "-", _cell(node.get("term")),
                          _cell(applied), "-" if applied is None else str(commit - applied),
                          _cell(node.get("shards_owned")), _cell(node.get("clock_offset_ms")),
                          node.get("http") or "-")
        self.console.print(table)

    def token_table(self, tokens: Sequence[Mapping[str, Any]]) -> None:
        if self.json:
            return self.data({"tokens": list(tokens)})
        table = self._table("TOKEN ID", "TENANT", "ROLE", "NAME", "CREATED")
        for t in tokens:
            table.add_row(t["token_id"], t.get("tenant", ""), t.get("role", ""),
                          t.get("name", ""), t.get("created_at", ""))
        self.console.print(table)


def schedule_text(job: Mapping[str, Any]) -> str:
    schedule = job.get("schedule")
    if schedule and "cron" in schedule:
        return f"{schedule['cron']} ({schedule.get('timezone', 'UTC')})"
    if schedule and "every" in schedule:
        return f"every {schedule['every']}"
    if job.get("run_at"):
        return f"at {job['run_at']}"
    return "on trigger"


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def _outcome(attempt: Mapping[str, Any]) -> str:
    parts = []
    if attempt.get("http_status") is not None:
        parts.append(f"HTTP {attempt['http_status']}")
    if attempt.get("exit_code") is not None:
        parts.append(f"exit {attempt['exit_code']}")
    if attempt.get("error"):
        parts.append(str(attempt["error"]))
    if not attempt.get("finished_at"):
        parts.append("running")
    return ", ".join(parts) or "ok"


def _problem_text(problem: Mapping[str, Any]) -> str:
    return f"{problem.get('status')} {problem.get('detail', '')}"
