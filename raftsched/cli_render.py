"""How the CLI prints: rich tables and progress bars (`--output table`), or the
API's JSON as it came (`--output json`). The only module that imports rich."""

from __future__ import annotations

import contextlib
import json
import sys
from dataclasses import dataclass
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from raftsched.client import ApiError
from raftsched.runtime.threadcpu import rest_of

Advance = Callable[[int, int], None]
# What a column that wraps its values (`fold`) is given at least when a table
# is fitted to the terminal; and what rich puts between two columns.
FOLD_WIDTH = 16
COLUMN_GAP = 3


@dataclass(frozen=True)
class Col:
    """A column of a table: `drop` 0 is always shown; of the others, the
    largest goes first when the table is wider than the terminal."""
    name: str
    drop: int = 0
    fold: bool = False


def _fitting(columns: Sequence[Col], rows: Sequence[Sequence[str]],
             width: int) -> tuple[list[int], list[int]]:
    """The columns shown, in order: all of them, less the largest `drop` one
    at a time while their widths (a folding one's at most FOLD_WIDTH) and the
    gaps between them are more than `width`; and each column's width."""
    def natural(i: int) -> int:
        cells = [columns[i].name, *(row[i] for row in rows)]
        longest = max(len(line) for cell in cells for line in (str(cell).splitlines() or [""]))
        return min(longest, FOLD_WIDTH) if columns[i].fold else longest

    widths = [natural(i) for i in range(len(columns))]
    shown = list(range(len(columns)))
    while sum(widths[i] for i in shown) + COLUMN_GAP * (len(shown) - 1) > width:
        droppable = [i for i in shown if columns[i].drop]
        if not droppable:
            break
        shown.remove(max(droppable, key=lambda i: columns[i].drop))
    return shown, widths


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

    def _print_table(self, columns: Sequence[Col], rows: Sequence[Sequence[str]],
                     title: str | None = None, empty: str | None = None) -> None:
        """A table that fits the terminal: while it is wider, the column with
        the largest `drop` goes (ids never), and a line on stderr names what
        went. Ids stay on one line so that they can be copied; `fold` columns
        wrap long values onto more lines instead of taking the width. With no
        rows, the line `empty` says so in place of a table of headers only."""
        if not rows and empty is not None:
            self.console.print(empty)
            return
        shown, widths = _fitting(columns, rows, self.console.width)
        table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
        for i in shown:
            name, fold = columns[i].name, columns[i].fold
            # What does not fold keeps its width (a time stays on one line);
            # the folding columns take what is left.
            table.add_column(name, no_wrap=name.endswith("ID"), overflow="fold",
                             min_width=None if fold else widths[i])
        for row in rows:
            table.add_row(*(row[i] for i in shown))
        self.console.print(table)
        left_out = [c.name for i, c in enumerate(columns) if i not in shown]
        if left_out:
            self.error(f"left out for the terminal's width ({self.console.width} columns): "
                       f"{', '.join(left_out)}; a wider terminal or --output json shows them")

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
        tasks = (job.get("dag") or {}).get("tasks") or []
        self._pairs([("id", job.get("job_id")), ("name", job.get("name")),
                     ("status", job.get("status")), ("schedule", schedule_text(job)),
                     ("next run", job.get("next_run_at")),
                     ("target", job.get("target") if not tasks else f"a DAG of {len(tasks)} "
                                                                    "tasks (below)"),
                     ("retry", job.get("retry")),
                     ("concurrency", job.get("concurrency")), ("labels", job.get("labels")),
                     ("pause note", job.get("pause_note")),
                     ("last run", job.get("last_run_id")), ("version", job.get("version"))])
        if tasks:
            self._print_table(
                [Col("TASK"), Col("DEPENDS ON", drop=1, fold=True),
                 Col("TRIGGER RULE", drop=3), Col("TARGET", drop=2, fold=True)],
                [(t.get("id", ""), ", ".join(t.get("depends_on") or []) or "-",
                  t.get("trigger_rule") or "-", target_text(t.get("target")))
                 for t in tasks])

    def job_table(self, jobs: Sequence[Mapping[str, Any]], states: Mapping[str, str]) -> None:
        self._print_table(
            [Col("ID"), Col("NAME", drop=3, fold=True), Col("SCHEDULE", drop=4, fold=True),
             Col("NEXT RUN", drop=2), Col("LAST STATE", drop=1)],
            [(job["job_id"], job.get("name", ""), schedule_text(job),
              job.get("next_run_at") or "-", states.get(job["job_id"], "-")) for job in jobs],
            empty="no jobs")

    def batch_results(self, answer: Mapping[str, Any]) -> None:
        if self.json:
            return self.data(answer)
        self._print_table(
            [Col("#"), Col("JOB ID"), Col("RESULT", fold=True)],
            [(str(i), "-", _problem_text(result["error"])) if "error" in result else
             (str(i), result["job_id"], "created" if result.get("created") else "existed")
             for i, result in enumerate(answer["results"])])
        results = answer["results"]
        refused = sum(1 for r in results if "error" in r)
        created = sum(1 for r in results if r.get("created"))
        self.console.print(f"{len(results)} jobs: {created} created, "
                           f"{len(results) - created - refused} existed, {refused} refused")

    def fire_times(self, answer: Mapping[str, Any]) -> None:
        if self.json:
            return self.data(answer)
        self._print_table([Col("#"), Col("FIRE TIME")],
                          [(str(i), when) for i, when in enumerate(answer["fire_times"], 1)])
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
        # armed_at only for a run fired ahead of its second: it reads running
        # from then, and is called at scheduled_for.
        self._pairs([(key, run.get(key)) for key in (
            "run_id", "job_id", "scheduled_for", "armed_at", "state", "attempt", "trigger",
            "redrives", "execution_id", "node", "started_at", "finished_at", "http_status",
            "exit_code", "error", "reason") if key != "armed_at" or run.get(key)])
        tasks = run.get("tasks") or []
        if tasks:
            self._print_table(
                [Col("TASK"), Col("STATE", drop=1), Col("ATTEMPT", drop=4),
                 Col("STARTED", drop=3), Col("FINISHED", drop=5),
                 Col("ERROR", drop=2, fold=True), Col("TASK RUN ID", drop=6)],
                [(t.get("id", ""), t.get("state") or "-", _cell(t.get("attempt")),
                  t.get("started_at") or "-", t.get("finished_at") or "-",
                  t.get("error") or "", t.get("run_id") or "-") for t in tasks])
        attempts = run.get("attempts") or []
        if attempts:
            self._print_table(
                [Col("ATTEMPT"), Col("HOLDER", drop=4), Col("STARTED", drop=2),
                 Col("FINISHED", drop=3), Col("RESULT", drop=1, fold=True)],
                [(str(a.get("attempt")), a.get("holder") or "-", a.get("started_at") or "-",
                  a.get("finished_at") or "-", _outcome(a)) for a in attempts])

    def run_table(self, page: Mapping[str, Any]) -> None:
        if self.json:
            return self.data(page)
        # A run's id names its job (keys.run_id), so the job's id goes before the
        # state; where a run failed, its error stays longer than the time.
        errors = any(run.get("error") for run in page["runs"])
        self._print_table(
            [Col("RUN ID"), Col("JOB ID", drop=5), Col("SCHEDULED FOR", drop=3 if errors else 2),
             Col("STATE", drop=1), Col("ATTEMPT", drop=4), Col("TRIGGER", drop=6),
             Col("ERROR", drop=2 if errors else 3, fold=True)],
            [(run["run_id"], run["job_id"], run.get("scheduled_for", ""), run.get("state", ""),
              str(run.get("attempt", "")), run.get("trigger", ""), run.get("error") or "")
             for run in page["runs"]], empty="no runs")
        self.more(page.get("next_page_token"))

    def logs(self, attempts: Sequence[Mapping[str, Any]]) -> None:
        """Each attempt's heading and output; with --output json, one JSON object a
        line per attempt, so that `runs logs --follow` can stream them."""
        for attempt in attempts:
            if self.json:
                print(json.dumps(attempt, ensure_ascii=False), flush=True)
                continue
            # As the command wrote it: not wrapped to the terminal, tabs kept.
            write = self.console.file.write
            write(f"--- attempt {attempt.get('attempt')} {_where(attempt)}"
                  f" ({attempt.get('started_at')} .. {attempt.get('finished_at')})"
                  f": {_outcome(attempt)}\n")
            for stream in ("stdout", "stderr", "http_body", "published"):
                if attempt.get(stream):
                    write(f"[{stream}]\n")
                    write(attempt[stream].rstrip("\n") + "\n")
            self.console.file.flush()

    # --- cluster and tokens -----------------------------------------------------------------

    def cluster(self, cluster: Mapping[str, Any]) -> None:
        if self.json:
            return self.data(cluster)
        nodes = cluster.get("nodes", {})
        commit = max((n.get("commit_index") or 0 for n in nodes.values()), default=0)
        # With `status --cpu`: each node's threads, in % of one core.
        cpu = any("cpu_percent" in node for node in nodes.values())
        rows = []
        for nid, node in sorted(nodes.items()):
            applied = node.get("applied_index")
            row = (nid, node.get("role") or "-", _cell(node.get("term")), _cell(applied),
                   "-" if applied is None else str(commit - applied),
                   _cell(node.get("shards_owned")), _cell(node.get("clock_offset_ms")),
                   _cell(node.get("breakers_open")))
            if cpu:
                split = node.get("cpu_percent") or {}
                row += (_cell(split.get("event_loop")), _cell(split.get("raft")),
                        _cell(rest_of(split) if split else None))
            rows.append((*row, node.get("http") or "-"))
        cols = [Col("NODE"), Col("ROLE", drop=1), Col("TERM", drop=5), Col("APPLIED", drop=6),
                Col("LAG", drop=2), Col("SHARDS", drop=3), Col("CLOCK MS", drop=7),
                Col("BREAKERS", drop=4)]   # open: runs for a host held there, not called
        if cpu:
            # Asked for: shown whatever else the terminal's width leaves out.
            cols += [Col("LOOP %"), Col("RAFT %"), Col("REST %")]
        self._print_table(
            [*cols, Col("HTTP", drop=8)],   # a URL stays whole, or is left out
            rows, title=f"leader {cluster.get('leader') or 'none'}, "
                        f"{cluster.get('shard_count')} shards")

    def token_table(self, tokens: Sequence[Mapping[str, Any]]) -> None:
        if self.json:
            return self.data({"tokens": list(tokens)})
        self._print_table(
            [Col("TOKEN ID"), Col("TENANT", drop=1), Col("ROLE", drop=2),
             Col("NAME", drop=3, fold=True), Col("CREATED", drop=4)],
            [(t["token_id"], t.get("tenant", ""), t.get("role", ""), t.get("name", ""),
              t.get("created_at", "")) for t in tokens], empty="no tokens")


def schedule_text(job: Mapping[str, Any]) -> str:
    schedule = job.get("schedule")
    if schedule and "cron" in schedule:
        return f"{schedule['cron']} ({schedule.get('timezone', 'UTC')})"
    if schedule and "every" in schedule:
        return f"every {schedule['every']}"
    if job.get("run_at"):
        return f"at {job['run_at']}"
    return "on trigger"


def target_text(target: Mapping[str, Any] | None) -> str:
    """A target in a few words: its method and URL, its command, or its topic."""
    if not target:
        return "-"
    kind = target.get("type")
    if kind == "http":
        return f"{target.get('method', 'POST')} {target.get('url', '')}"
    if kind == "command":
        queue = f" (queue {target['queue']})" if target.get("queue") else ""
        return "command " + " ".join(map(str, target.get("argv") or [])) + queue
    if kind == "publish":
        return f"publish to {target.get('topic', '')}"
    return _cell(target)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def _where(attempt: Mapping[str, Any]) -> str:
    """Who ran an attempt, and which node keeps its output when that is
    another (a remote worker's output is kept by the node it reported to)."""
    holder, kept = attempt.get("holder"), attempt.get("output_node")
    if holder and kept and kept != holder:
        return f"by {holder}, output kept on {kept}"
    return f"by {holder or kept or '?'}"


def _outcome(attempt: Mapping[str, Any]) -> str:
    parts = []
    if attempt.get("http_status") is not None:
        parts.append(f"HTTP {attempt['http_status']}")
    error = str(attempt.get("error") or "")
    if attempt.get("exit_code") is not None and \
            not error.startswith(f"exit code {attempt['exit_code']}"):
        parts.append(f"exit {attempt['exit_code']}")   # (the error says it already)
    if attempt.get("error"):
        parts.append(str(attempt["error"]))
    if not attempt.get("finished_at"):
        parts.append("running")
    return ", ".join(parts) or "ok"


def _problem_text(problem: Mapping[str, Any]) -> str:
    return f"{problem.get('status')} {problem.get('detail', '')}"
