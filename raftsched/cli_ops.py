"""The `raftsched jobs | runs | status | tokens` commands: a thin layer over
raftsched.client that reads job files, prints tables (rich) or JSON, and turns
errors into exit codes: 0 done, 1 the request was wrong (a bad job file, a
4xx), 2 the cluster could not answer (5xx, nothing listening, a timeout)."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from raftsched import limits
from raftsched.core.jobspec import JOB_ID_PATTERN
from raftsched.core.lifecycle import TERMINAL
from raftsched.runtime.threadcpu import percent_between

if TYPE_CHECKING:
    # Imported when a command runs, so that `raftsched node` does not load rich.
    from raftsched.cli_render import Renderer
    from raftsched.client import Client

COMMANDS = ("jobs", "runs", "status", "tokens")
EXIT_OK, EXIT_USER, EXIT_CLUSTER = 0, 1, 2
JOB_ID = re.compile(f"^{JOB_ID_PATTERN}$")
# An `every` schedule as the API takes it (1h, 30m, 1d12h...), told from a cron expression.
EVERY = re.compile(r"^(\d+d)?(\d+h)?(\d+m)?(\d+s)?$")


class InputError(Exception):
    """The command's own input is wrong (a job file that does not parse): exit 1."""


class Parser(argparse.ArgumentParser):
    """A usage error is the caller's: exit 1, as for any other user error."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USER, f"{self.prog}: error: {message}\n")


Handler = Callable[["Client", argparse.Namespace, "Renderer"], int]


def main(argv: Sequence[str]) -> int:
    parser = Parser(prog="raftsched")
    add_commands(parser.add_subparsers(dest="command", required=True), Parser)
    args = parser.parse_args(list(argv))
    return run(args)


def run(args: argparse.Namespace) -> int:
    from raftsched.cli_render import Renderer
    from raftsched.client import ApiError, Client, ClusterError, UserError
    out = Renderer(args.output)
    try:
        try:
            api = Client(args.url, token=args.token, tenant=args.act_for,
                         timeout_s=args.timeout_s, ca_file=args.tls_ca)
        except OSError as exc:   # the CA file (ssl.SSLError is an OSError)
            out.error(f"--tls-ca / RAFTSCHED_TLS_CA: cannot load it: {exc}")
            return EXIT_USER
        handler: Handler = args.handler
        return handler(api, args, out)
    except (InputError, ValueError) as exc:
        out.error(str(exc))
        return EXIT_USER
    except ApiError as exc:
        out.problem(exc)
        return EXIT_USER if isinstance(exc, UserError) else EXIT_CLUSTER
    except ClusterError as exc:
        out.error(str(exc))
        return EXIT_CLUSTER
    except KeyboardInterrupt:
        return 130


# --- the parsers ----------------------------------------------------------------------------

def _common(parser: argparse.ArgumentParser, act_for: bool = True) -> argparse.ArgumentParser:
    parser.add_argument("--url", default=None,
                        help="a node's API, or several separated by commas, tried in turn "
                             "when one does not answer (default: env RAFTSCHED_URL, else "
                             "http://127.0.0.1:8701); any node will do")
    parser.add_argument("--token", default=None,
                        help="the API token (default: env RAFTSCHED_TOKEN)")
    parser.add_argument("--tls-ca", default=None, metavar="PATH",
                        help="CA certificates (PEM) an https node is verified by (default: "
                             "env RAFTSCHED_TLS_CA, else the system's)")
    if act_for:
        parser.add_argument("--tenant", dest="act_for", default=None, metavar="TENANT",
                            help="with an admin token: act for this tenant")
    else:
        parser.set_defaults(act_for=None)
    parser.add_argument("--output", "-o", choices=("table", "json"), default="table")
    parser.add_argument("--timeout-s", type=float, default=None,
                        help="per request (default %s)" % limits.client_timeout_s_default)
    return parser


def add_commands(sub: Any, parser_class: type[argparse.ArgumentParser]) -> None:
    """Add jobs, runs, status and tokens to a `add_subparsers()` action."""
    _add_jobs(sub.add_parser("jobs", help="create, list, show and change jobs"), parser_class)
    _add_runs(sub.add_parser("runs", help="list runs, read their logs, re-drive them"),
              parser_class)
    _add_tokens(sub.add_parser("tokens", help="create, list and revoke API tokens (admin)"),
                parser_class)
    status = _common(sub.add_parser("status", help="the cluster's nodes: role, term, lag, "
                                                   "shards"))
    status.add_argument("--cpu", type=_cpu_seconds, metavar="SECONDS",
                        help="also each node's CPU by thread over SECONDS (0.1-60): the "
                             "status is read twice, that far apart")
    status.set_defaults(handler=cmd_status)


def _leaf(sub: Any, name: str, handler: Handler, helptext: str,
          act_for: bool = True) -> argparse.ArgumentParser:
    parser = _common(sub.add_parser(name, help=helptext, description=helptext), act_for)
    parser.set_defaults(handler=handler)
    return parser


def _add_jobs(jobs: argparse.ArgumentParser, parser_class: type) -> None:
    sub: Any = jobs.add_subparsers(dest="action", required=True, parser_class=parser_class)
    _leaf(sub, "create", cmd_job_create, "create a job, or a list of jobs, from a file"
          ).add_argument("-f", "--file", required=True, help="job.json, job.yaml, or - for stdin")
    listing = _leaf(sub, "list", cmd_job_list, "a table of jobs: id, name, schedule, next "
                                              "run, last state")
    listing.add_argument("--status", choices=("active", "paused", "completed"))
    listing.add_argument("--name-prefix")
    listing.add_argument("--label", action="append", default=[], metavar="KEY:VALUE",
                         help="repeat for more (all must match)")
    _paging(listing)
    for name, handler, helptext in (("get", cmd_job_get, "show a job"),
                                    ("resume", cmd_job_resume, "resume a job from now"),
                                    ("delete", cmd_job_delete, "delete a job")):
        _leaf(sub, name, handler, helptext).add_argument("job_id")
    update = _leaf(sub, "update", cmd_job_update, "change the members a file gives")
    update.add_argument("job_id")
    update.add_argument("-f", "--file", required=True, help="patch.json, patch.yaml, or -")
    pause = _leaf(sub, "pause", cmd_job_pause, "pause a job")
    pause.add_argument("job_id")
    pause.add_argument("--note", help="why; shown until the job resumes")
    trigger = _leaf(sub, "trigger", cmd_job_trigger, "run a job now")
    trigger.add_argument("job_id")
    trigger.add_argument("--overlap-allow", action="store_true",
                         help="run it whatever the job's concurrency policy")
    _add_backfill(sub)
    preview = _leaf(sub, "preview", cmd_job_preview,
                    "next fire times of a cron expression, an interval (1h) or a job id")
    preview.add_argument("schedule", help='"0 2 * * *", 1h30m, or job_...')
    preview.add_argument("--tz", default=None, help="an IANA zone for a cron expression")
    preview.add_argument("--count", type=int, default=10)
    preview.add_argument("--after", default=None, help="RFC 3339 (default: now)")


def _add_backfill(sub: Any) -> None:
    backfill = _leaf(sub, "backfill", cmd_job_backfill,
                     "run every occurrence of a job's schedule in [start, end), with progress")
    backfill.add_argument("job_id")
    backfill.add_argument("--start", required=True, help="RFC 3339, included")
    backfill.add_argument("--end", required=True, help="RFC 3339, excluded; not in the future")
    backfill.add_argument("--max-concurrent", type=int, default=None)
    backfill.add_argument("--overlap", choices=("allow", "job"), default=None)
    backfill.add_argument("--dry-run", action="store_true", help="list the occurrences only")
    backfill.add_argument("--no-wait", action="store_true",
                          help="print the backfill's id and return")


def _add_runs(runs: argparse.ArgumentParser, parser_class: type) -> None:
    sub: Any = runs.add_subparsers(dest="action", required=True, parser_class=parser_class)
    listing = _leaf(sub, "list", cmd_run_list, "runs, newest first (--state failed: the "
                                              "dead letters)")
    listing.add_argument("--job", dest="job_id")
    listing.add_argument("--state")
    listing.add_argument("--trigger")
    _paging(listing)
    _leaf(sub, "get", cmd_run_get, "show a run and its attempts").add_argument("run_id")
    logs = _leaf(sub, "logs", cmd_run_logs, "each attempt's output")
    logs.add_argument("run_id")
    logs.add_argument("--follow", "-f", action="store_true",
                      help="print attempts as they finish, until the run ends (with "
                           "--output json: one JSON object a line per attempt)")
    cancel = _leaf(sub, "cancel", cmd_run_cancel, "cancel a run")
    cancel.add_argument("run_id")
    cancel.add_argument("--reason")
    retry = _leaf(sub, "retry", cmd_run_retry, "re-drive a failed run (same execution id)")
    retry.add_argument("run_id")
    retry.add_argument("--overlap-allow", action="store_true")


def _add_tokens(tokens: argparse.ArgumentParser, parser_class: type) -> None:
    sub: Any = tokens.add_subparsers(dest="action", required=True, parser_class=parser_class)
    # Here --tenant names the token's tenant (an admin's token may be made for any).
    create = _leaf(sub, "create", cmd_token_create, "create a token; its text is shown once",
                   act_for=False)
    create.add_argument("--tenant", dest="token_tenant", required=True,
                        help="the tenant the token acts for")
    create.add_argument("--role", required=True, choices=("admin", "writer", "reader", "worker",
                                                            "operator"))
    create.add_argument("--name", default="")
    _leaf(sub, "list", cmd_token_list, "list tokens (never their text)")
    _leaf(sub, "revoke", cmd_token_revoke, "revoke a token").add_argument("token_id")


def _paging(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--limit", type=int, default=limits.cli_list_limit_default)
    parser.add_argument("--page-token", default=None, help="from the previous page")


# --- input files ----------------------------------------------------------------------------

def load_document(path: str) -> Any:
    """A job file: JSON (.json), YAML (.yaml, .yml), or either (stdin, other names)."""
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read it: {exc}") from exc
    if path.endswith(".json"):
        try:
            return json.loads(text)
        except ValueError as exc:
            raise InputError(f"{path}: not JSON: {exc}") from exc
    import yaml  # type: ignore[import-untyped]  # JSON is YAML too, so one parser serves both here
    try:
        return _plain(yaml.safe_load(text), path)
    except yaml.YAMLError as exc:
        raise InputError(f"{path}: not YAML or JSON: {exc}") from exc


def _plain(value: Any, path: str) -> Any:
    """YAML reads an unquoted time as a datetime: give it back as RFC 3339,
    refusing one without an offset (the API would not know its zone)."""
    if isinstance(value, dict):
        return {str(k): _plain(v, path) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v, path) for v in value]
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            raise InputError(f"{path}: the time {value} has no offset (add Z or +05:30...)")
        return value.isoformat()
    if isinstance(value, dt.date):
        raise InputError(f"{path}: {value} is a date; the API takes a time with an offset")
    return value


def _mapping(document: Any, path: str) -> dict[str, Any]:
    if not isinstance(document, dict):
        raise InputError(f"{path}: expected an object of job members")
    return document


# --- jobs -----------------------------------------------------------------------------------

def cmd_job_create(api: Client, args: argparse.Namespace, out: Renderer) -> int:
    document = load_document(args.file)
    if isinstance(document, list):
        return _create_list(api, [_mapping(d, args.file) for d in document], out)
    out.job(api.create_job(_mapping(document, args.file)))
    return EXIT_OK


def _create_list(api: Client, jobs: list[dict[str, Any]], out: Renderer) -> int:
    """A list of any length (raftsched.client.bulk), with a progress bar when
    it takes more than one batch. If a batch cannot be sent, the results so
    far are shown and a line names the jobs without one."""
    from raftsched.client import bulk
    several = len(bulk.batches_of(jobs)) > 1
    try:
        with out.progress("jobs", len(jobs)) if several else _no_progress() as advance:
            results = bulk.create_jobs(api, jobs, progress=advance)
    except bulk.BatchNotSent as exc:
        if exc.results:
            out.batch_results({"results": exc.results})
        out.error(f"jobs 0-{exc.start - 1} of the list have their results above; jobs "
                  f"{exc.start}-{exc.total - 1} have none, for this error:" if exc.results
                  else f"jobs 0-{exc.total - 1} of the list have no result, for this error:")
        raise exc.cause from None
    out.batch_results({"results": results})
    refused = [r for r in results if "error" in r]
    return EXIT_USER if refused else EXIT_OK


@contextlib.contextmanager
def _no_progress() -> Iterator[Callable[[int, int], None]]:
    yield lambda done, total: None


def cmd_job_list(api: Client, args: argparse.Namespace, out: Renderer) -> int:
    page = api.list_jobs(limit=args.limit, page_token=args.page_token, status=args.status,
                         name_prefix=args.name_prefix, labels=args.label)
    if out.json:
        out.data(page)
        return EXIT_OK
    states = {job["job_id"]: _last_state(api, job.get("last_run_id")) for job in page["jobs"]}
    out.job_table(page["jobs"], states)
    out.more(page.get("next_page_token"))
    return EXIT_OK


def _last_state(api: Client, run_id: str | None) -> str:
    from raftsched.client import NotFound
    if not run_id:
        return "-"
    try:
        return api.get_run(run_id).get("state", "-")
    except NotFound:
        return "purged"   # retention removed it; the job keeps its id


def cmd_job_get(api: Client, args: argparse.Namespace, out: Renderer) -> int:
    out.job(api.get_job(args.job_id))
    return EXIT_OK


def cmd_job_update(api: Client, args: argparse.Namespace, out: Renderer) -> int:
    out.job(api.update_job(args.job_id, _mapping(load_document(args.file), args.file)))
    return EXIT_OK


def cmd_job_pause(api: Client, args: argparse.Namespace, out: Renderer) -> int:
    out.job(api.pause_job(args.job_id, note=args.note))
    return EXIT_OK


def cmd_job_resume(api: Client, args: argparse.Namespace, out: Renderer) -> int:
    out.job(api.resume_job(args.job_id))
    return EXIT_OK


def cmd_job_delete(api: Client, args: argparse.Namespace, out: Renderer) -> int:
    api.delete_job(args.job_id)
    out.done({"job_id": args.job_id, "deleted": True}, f"deleted {args.job_id}")
    return EXIT_OK


def cmd_job_trigger(api: Client, args: argparse.Namespace, out: Renderer) -> int:
    out.run(api.trigger_job(args.job_id, overlap="allow" if args.overlap_allow else None))
    return EXIT_OK


def cmd_job_preview(api: Client, args: argparse.Namespace, out: Renderer) -> int:
    text = args.schedule.strip()
    if JOB_ID.match(text):
        answer = api.preview_job(text, count=args.count)
    else:
        schedule = {"every": text} if EVERY.match(text) else {"cron": text}
        if args.tz and "cron" in schedule:
            schedule["timezone"] = args.tz
        answer = api.preview_schedule(schedule=schedule, count=args.count, after=args.after)
    out.fire_times(answer)
    return EXIT_OK


def cmd_job_backfill(api: Client, args: argparse.Namespace, out: Renderer) -> int:
    started = api.backfill_job(args.job_id, start=args.start, end=args.end,
                               overlap=args.overlap, max_concurrent=args.max_concurrent,
                               dry_run=args.dry_run or None)
    backfill_id = started.get("backfill_id")
    if args.dry_run or args.no_wait or not backfill_id:
        out.data(started)
        return EXIT_OK
    with out.progress(f"backfill {backfill_id}", started.get("occurrences", 0)) as advance:
        while True:
            view = api.get_backfill(backfill_id)
            advance(view.get("done", 0), view.get("total", 0))
            if view.get("state") != "running":
                break
            time.sleep(limits.cli_poll_period_s)
    out.backfill(view)
    return EXIT_OK


# --- runs -----------------------------------------------------------------------------------

def cmd_run_list(api: Client, args: argparse.Namespace, out: Renderer) -> int:
    page = api.list_runs(job_id=args.job_id, state=args.state, trigger=args.trigger,
                         limit=args.limit, page_token=args.page_token)
    out.run_table(page)
    return EXIT_OK


def cmd_run_get(api: Client, args: argparse.Namespace, out: Renderer) -> int:
    out.run(api.get_run(args.run_id))
    return EXIT_OK


def cmd_run_cancel(api: Client, args: argparse.Namespace, out: Renderer) -> int:
    out.run(api.cancel_run(args.run_id, reason=args.reason))
    return EXIT_OK


def cmd_run_retry(api: Client, args: argparse.Namespace, out: Renderer) -> int:
    out.run(api.retry_run(args.run_id, overlap="allow" if args.overlap_allow else None))
    return EXIT_OK


def cmd_run_logs(api: Client, args: argparse.Namespace, out: Renderer) -> int:
    if not args.follow:
        answer = api.run_logs(args.run_id)
        if out.json:
            out.data(answer)
        else:
            out.logs(answer["attempts"])
        return EXIT_OK
    printed: set[int] = set()
    while True:
        # The run first: an attempt that finishes between the two reads is
        # printed now, and the loop ends only after a read that follows the end.
        ended = api.get_run(args.run_id).get("state") in TERMINAL
        attempts = api.run_logs(args.run_id)["attempts"]
        fresh = [a for a in attempts if a.get("finished_at") and a["attempt"] not in printed]
        out.logs(fresh)
        printed.update(a["attempt"] for a in fresh)
        if ended:
            return EXIT_OK
        time.sleep(limits.cli_poll_period_s)


# --- cluster and tokens ---------------------------------------------------------------------

def cmd_status(api: Client, args: argparse.Namespace, out: Renderer) -> int:
    cluster = api.cluster()
    if args.cpu is not None:
        # Each node's threads between two readings (runtime/threadcpu.py).
        started = time.monotonic()
        time.sleep(args.cpu)
        first, cluster = cluster, api.cluster()
        elapsed_s = time.monotonic() - started
        for nid, node in cluster.get("nodes", {}).items():
            before = (first.get("nodes", {}).get(nid) or {}).get("threads_cpu_s")
            after = node.get("threads_cpu_s")
            node["cpu_percent"] = percent_between(before, after, elapsed_s) \
                if before and after else None
    out.cluster(cluster)
    return EXIT_OK


def _cpu_seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0.1 <= seconds <= 60:
        raise argparse.ArgumentTypeError(f"{text} s: from 0.1 to 60")
    return seconds


def cmd_token_create(api: Client, args: argparse.Namespace, out: Renderer) -> int:
    out.data(api.create_token(role=args.role, tenant=args.token_tenant, name=args.name))
    return EXIT_OK


def cmd_token_list(api: Client, args: argparse.Namespace, out: Renderer) -> int:
    out.token_table(api.list_tokens()["tokens"])
    return EXIT_OK


def cmd_token_revoke(api: Client, args: argparse.Namespace, out: Renderer) -> int:
    api.revoke_token(args.token_id)
    out.done({"token_id": args.token_id, "revoked": True}, f"revoked {args.token_id}")
    return EXIT_OK
