"""The `raftsched` command: node, dev (local cluster), jobs, runs, worker, status."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import MutableMapping
from typing import TYPE_CHECKING

from raftsched import cli_ops, limits

if TYPE_CHECKING:
    from raftsched.executors.command import RunAs


def _hostport(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, not {text!r}")
    return host, int(port)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="raftsched", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    node = sub.add_parser("node", help="run one node")
    node.add_argument("--id", required=True, help="this node's id, e.g. n1")
    node.add_argument("--http", required=True, type=_hostport, help="HOST:PORT to serve the API on")
    node.add_argument("--raft", required=True, help="HOST:PORT of this node's Raft port")
    node.add_argument("--peers", default="",
                      help="the other nodes' Raft HOST:PORT, comma-separated; HOST:PORT@VIA_HOST:PORT "
                           "reaches that peer through a relay (see docs/operations.md)")
    node.add_argument("--data", required=True, help="data directory (LMDB state, Raft journal)")
    node.add_argument("--raft-secret-file", default=None, metavar="PATH",
                      help="file holding the shared Raft secret (default: env "
                           "RAFTSCHED_RAFT_SECRET); required with peers")
    node.add_argument("--raft-secret", default=None,
                      help="the shared Raft secret itself: discouraged, as the command line "
                           "is visible to every local user; use --raft-secret-file")
    node.add_argument("--insecure", action="store_true",
                      help="allow peers without a Raft secret (anyone reaching the Raft port "
                           "could then run code in this process)")
    node.add_argument("--allow-commands", action="store_true",
                      help="run command targets of the default queue on this node (needs "
                           "--command-user); without it a command job must name a "
                           "target.queue served by `raftsched worker` (see docs/execution.md)")
    node.add_argument("--command-user", default=None, metavar="NAME",
                      help="with --allow-commands: the unprivileged user commands run as "
                           "(the node must run as root to switch to it), or `self` to run "
                           "them knowingly as the node's own user, which can read the data "
                           "folder, every tenant's secrets and the secret files "
                           "(see docs/security.md)")
    node.add_argument("--advertise-http", default=None,
                      help="URL other nodes use to reach this node's API (default from --http)")
    node.add_argument("--tls-cert", default=None, metavar="PATH",
                      help="serve the API over TLS with this certificate chain (PEM); needs "
                           "--tls-key. Other nodes then call this one over https")
    node.add_argument("--tls-key", default=None, metavar="PATH",
                      help="the private key (PEM) of --tls-cert")
    node.add_argument("--tls-ca", default=None, metavar="PATH",
                      help="CA certificates (PEM) this node verifies the other nodes' "
                           "certificates by when it calls them (default: the system's); "
                           "give every node the same")
    node.add_argument("--shard-count", type=int, default=limits.shard_count_default,
                      help="shards; fixed when the cluster is created (default %(default)s)")
    node.add_argument("--raft-snapshot-entries", type=int,
                      default=limits.log_compaction_entries_default,
                      help="Raft log entries between state snapshots (default %(default)s)")
    node.add_argument("--fsync", choices=("periodic", "always"), default="periodic",
                      help="periodic: flush the Raft journal and the state to disk once a "
                           "second; always: flush the journal before a write counts as "
                           "committed, and sync each state commit (slower; see "
                           "docs/operations.md) (default %(default)s)")
    node.add_argument("--run-lease-s", type=float, default=limits.run_lease_ms_default / 1000,
                      help="a running attempt's lease; an attempt whose holder stops "
                           "heartbeating for this long is retried (default %(default)s)")
    node.add_argument("--run-heartbeat-s", type=float,
                      default=limits.run_heartbeat_ms_default / 1000,
                      help="how often holders extend their leases (default %(default)s)")
    node.add_argument("--max-clock-skew-ms", type=int, default=limits.max_clock_skew_ms_default,
                      help="a node whose wall clock is further than this from the median of "
                           "the nodes' clocks owns no shards until it is back within it; give "
                           "every node the same (default %(default)s)")
    node.add_argument("--arm-ahead-s", type=float,
                      # (argparse converts a string default, the env's, by `type`)
                      default=os.environ.get("RAFTSCHED_ARM_AHEAD_S")
                      or limits.arm_ahead_s_default,
                      help="fire a one-off or an `allow` cron job's occurrence up to this many "
                           "seconds before it is due and call it at its second, so a burst's "
                           "replicated work is done before it; 0 fires at the second "
                           f"(at most {limits.arm_ahead_s_max:g}; default: env "
                           "RAFTSCHED_ARM_AHEAD_S, else %(default)s)")
    node.add_argument("--alert-webhook-url",
                      default=os.environ.get("RAFTSCHED_ALERT_WEBHOOK_URL") or None,
                      help="where failure alerts of jobs without alert.webhook_url go; give "
                           "every node the same (default: env RAFTSCHED_ALERT_WEBHOOK_URL)")
    node.add_argument("--allow-target-cidr", action="append", default=[], metavar="CIDR",
                      help="a range HTTP targets and job alert webhooks may reach although it "
                           "is not public (loopback, private, link-local...: refused by "
                           "default); repeatable, e.g. 10.20.0.0/16 (see docs/execution.md)")
    _add_storage_flags(node)
    _add_auth_flags(node)
    node.add_argument("--log-level", default=os.environ.get("RAFTSCHED_LOG_LEVEL", "INFO"))

    worker = sub.add_parser("worker", help="run command targets of one queue for the cluster")
    worker.add_argument("--cluster", default=None,
                        help="node API URLs, comma-separated; the worker fails over between "
                             "them (default: env RAFTSCHED_URL, as the other commands read it)")
    worker.add_argument("--queue", required=True, help="the queue to serve (target.queue)")
    worker.add_argument("--concurrency", type=int, default=limits.worker_concurrency_default,
                        help="runs executed at once (default %(default)s)")
    worker.add_argument("--id", default=None,
                        help="this worker's id (default: hostname-pid); it names the lease holder")
    worker.add_argument("--token", default=None,
                        help="a worker token of the queue's tenant (default: env RAFTSCHED_TOKEN)")
    worker.add_argument("--tls-ca", default=os.environ.get("RAFTSCHED_TLS_CA") or None,
                        metavar="PATH",
                        help="CA certificates (PEM) https nodes are verified by (default: env "
                             "RAFTSCHED_TLS_CA, else the system's)")
    worker.add_argument("--command-user", default=None, metavar="NAME",
                        help="the user commands run as (this worker must run as root to "
                             "switch to it); default: this worker's own user")
    worker.add_argument("--drain-s", type=float, default=limits.worker_drain_s_default,
                        help="on SIGTERM, how long the commands running may go on (no more "
                             "claims) before the worker kills them and stops (default "
                             f"{limits.worker_drain_s_default:g}); SIGINT or a second signal "
                             "stops at once")
    worker.add_argument("--log-level", default=os.environ.get("RAFTSCHED_LOG_LEVEL", "INFO"))

    dev = sub.add_parser("dev", help="start and supervise a local cluster on 127.0.0.1")
    dev.add_argument("--nodes", type=int, default=3)
    dev.add_argument("--data", default=".raftsched")
    dev.add_argument("--http-port-base", type=int, default=8701)
    dev.add_argument("--raft-port-base", type=int, default=9701)
    dev.add_argument("--allow-commands", action="store_true",
                     help="start the nodes with --allow-commands --command-user=self "
                          "(command targets on the default queue run on the nodes, as your "
                          "own user; for development only)")

    # jobs, runs, tokens and status (raftsched/cli_ops.py).
    cli_ops.add_commands(sub, argparse.ArgumentParser)

    chaos = sub.add_parser("chaos", help="break a local cluster under load and check the "
                                         "promises (see raftsched/testing/chaos.py)")
    chaos.add_argument("--scenario", default="kill-leader,freeze-owner,partition,kill-all",
                       help="comma-separated, in order, from: kill-leader, kill-random, "
                            "kill-owner, freeze-owner, partition, kill-all, restart, "
                            "restart-leader (default %(default)s)")
    chaos.add_argument("--seed", type=int, default=None, help="replay a run's random choices")
    chaos.add_argument("--jobs", type=int, default=100, help="every-second jobs (default 100)")
    chaos.add_argument("--create-rate", type=float, default=5.0,
                       help="one-off creates per second during the run (default 5)")
    chaos.add_argument("--phase-s", type=float, default=10.0,
                       help="seconds each fault lasts before healing (default 10)")
    chaos.add_argument("--freeze-s", type=float, default=20.0,
                       help="seconds a frozen node stays stopped (default 20)")
    chaos.add_argument("--keep", default=None, help="keep node data and logs in this folder")

    backup = sub.add_parser("backup", help="write a node's state to a file (running or "
                                           "stopped; see docs/operations.md)")
    backup.add_argument("--data", required=True, help="the node's data directory")
    backup.add_argument("--out", required=True, help="the backup file to create")
    restore = sub.add_parser("restore", help="make an empty data directory start from a backup")
    restore.add_argument("--backup", required=True, help="a file `raftsched backup` wrote")
    restore.add_argument("--data", required=True, help="the new node's data directory")

    sub.add_parser("bench", help="benchmark a local cluster (raftsched bench burst N; see "
                                 "raftsched/testing/bench.py)", add_help=False)
    return parser


def _add_auth_flags(node: argparse.ArgumentParser) -> None:
    """Tokens and tenant quotas (docs/security.md); give every node the same."""
    node.add_argument("--admin-token-file", default=None, metavar="PATH",
                      help="file holding the bootstrap admin token (default: env "
                           "RAFTSCHED_ADMIN_TOKEN); required with peers")
    node.add_argument("--insecure-no-auth", action="store_true",
                      help="serve the API without tokens: every caller is an admin")
    node.add_argument("--tenant-jobs-max", type=int, default=limits.tenant_jobs_max_default,
                      help="jobs a tenant without its own quota may keep (default %(default)s)")
    node.add_argument("--tenant-creates-per-s", type=int,
                      default=limits.tenant_creates_per_s_default,
                      help="creates a second a tenant without its own quota may make, "
                           "cluster-wide (default %(default)s)")
    node.add_argument("--tenant-runs-concurrent-max", type=int,
                      default=limits.tenant_runs_concurrent_max_default,
                      help="runs of one tenant a node executes at once (default %(default)s)")
    node.add_argument("--tenant-weight", type=int, default=limits.tenant_weight_default,
                      help="a tenant's share where a backlog forms (default %(default)s)")


def _add_storage_flags(node: argparse.ArgumentParser) -> None:
    """Storage and retention settings (docs/operations.md); give every node the same."""
    node.add_argument("--max-data-bytes", type=int, default=limits.max_data_bytes_default,
                      help="the most state this node holds (the LMDB map; a sparse file). "
                           "Writes that add state answer 507 past "
                           f"{limits.data_bytes_high_water_ratio * 100:.0f}%% of it "
                           "(default %(default)s)")
    node.add_argument("--min-free-disk-bytes", type=int,
                      default=limits.min_free_disk_bytes_default,
                      help="writes that add state answer 507 while the data disk has less "
                           "free (default %(default)s)")
    node.add_argument("--history-max-runs", type=int, default=limits.history_max_runs_default,
                      help="finished runs kept per job without history.max_runs "
                           "(default %(default)s)")
    node.add_argument("--history-max-age-s", type=float,
                      default=limits.history_max_age_s_default,
                      help="finished runs older than this go, for jobs without "
                           "history.max_age_s (default %(default)s: 30 days)")
    node.add_argument("--finished-job-retention-s", type=float,
                      default=limits.finished_job_retention_s_default,
                      help="deleted and completed jobs are removed with their runs this long "
                           "after (default %(default)s: 7 days)")
    node.add_argument("--idempotency-ttl-s", type=float, default=limits.idempotency_ttl_s_default,
                      help="an idempotency key stays reserved this long after its create "
                           "(default %(default)s: 24 h)")


def _bounds_error(args: argparse.Namespace,
                  *checks: tuple[str, float, float, bool]) -> str | None:
    """The first of (flag, lo, hi, integral) whose value is out of bounds, judged
    as every bounded number is (core/bounded.py: NaN and infinities refused)."""
    from raftsched.core.bounded import refusal
    for flag, lo, hi, integral in checks:
        reason = refusal(getattr(args, flag), lo, hi, integral=integral)
        if reason is not None:
            return f"--{flag.replace('_', '-')} {reason}"
    return None


def _storage_flags_error(args: argparse.Namespace) -> str | None:
    # Seconds flags are kept in ms (and in commands, as integers).
    seconds = (limits.flag_duration_s_min, limits.command_int_max / 1000, False)
    return _bounds_error(
        args, ("max_data_bytes", limits.max_data_bytes_min, limits.command_int_max, True),
        ("min_free_disk_bytes", 0, limits.command_int_max, True),
        ("history_max_runs", 1, limits.history_max_runs_max, True),
        ("history_max_age_s", *seconds), ("finished_job_retention_s", *seconds),
        ("idempotency_ttl_s", *seconds))


def _tls_error(args: argparse.Namespace) -> str | None:
    """Why the TLS flags cannot work, or None: each file is loaded once here, so
    a bad one stops the node at start with its name, not at the first call."""
    import ssl

    from raftsched.runtime.peer import client_ssl_context, server_ssl_context
    if (args.tls_cert is None) != (args.tls_key is None):
        return "--tls-cert and --tls-key go together: give both, or neither"
    if args.tls_cert is not None:
        if args.advertise_http is not None and not args.advertise_http.startswith("https://"):
            return ("--advertise-http must be an https:// URL when the node serves TLS "
                    "(--tls-cert)")
        try:
            server_ssl_context(args.tls_cert, args.tls_key)
        except (OSError, ssl.SSLError) as exc:
            return f"--tls-cert / --tls-key: cannot load them: {exc}"
    if args.tls_ca is not None:
        try:
            client_ssl_context(args.tls_ca)
        except (OSError, ssl.SSLError) as exc:
            return f"--tls-ca: cannot load it: {exc}"
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] and argv[0] in cli_ops.COMMANDS:
        return cli_ops.main(argv)   # its usage errors exit 1, as user errors
    if argv[:1] == ["bench"]:
        from raftsched.testing.bench import main as bench_main
        return bench_main(argv[1:])
    args = build_parser().parse_args(argv)
    if args.command == "node":
        return run_node(args)
    if args.command == "dev":
        from raftsched.runtime.dev import run_dev
        return run_dev(args.nodes, args.data, args.http_port_base, args.raft_port_base,
                       allow_commands=args.allow_commands)
    if args.command == "worker":
        from raftsched.runtime.remote_worker import run_worker_cli
        return run_worker_cli(args)
    if args.command in ("backup", "restore"):
        from raftsched.runtime.backup import run_backup_cli, run_restore_cli
        from raftsched.runtime.procguard import keep_files_private
        keep_files_private()   # a backup holds every tenant's jobs and secrets
        if args.command == "backup":
            return run_backup_cli(args.data, args.out)
        return run_restore_cli(args.backup, args.data)
    if args.command == "chaos":
        from raftsched.testing.chaos import run_chaos
        report = run_chaos(scenarios=[s for s in args.scenario.split(",") if s],
                           seed=args.seed, jobs=args.jobs, create_rate=args.create_rate,
                           phase_s=args.phase_s, freeze_s=args.freeze_s, base_dir=args.keep)
        print(report.render())
        return 0 if report.ok else 1
    return cli_ops.run(args)


def read_secret_file(path: str, flag: str) -> tuple[str | None, str | None]:
    """(the secret in `path`, trailing whitespace cut, or None; error or None).
    A file other users may read works, with a warning."""
    try:
        with open(path, encoding="utf-8") as fh:
            secret = fh.read().strip()
        mode = os.stat(path).st_mode
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"{flag}: cannot read it: {exc}"
    if not secret:
        return None, f"{flag}: {path} is empty"
    if mode & 0o077:
        print(f"raftsched node: warning: {path} is readable by other users (mode "
              f"{mode & 0o777:o}); chmod 600 it", file=sys.stderr)
    return secret, None


def raft_secret(args: argparse.Namespace,
                environ: MutableMapping[str, str]) -> tuple[str | None, str | None]:
    """(secret or None, error or None) from --raft-secret-file, --raft-secret
    or RAFTSCHED_RAFT_SECRET, in that order, at least raft_secret_chars_min
    long. The variable is removed from this process's environment once read,
    so no process it starts inherits it. A secret on the command line is
    visible to every local user (ps, /proc/PID/cmdline): it still works, with
    a warning."""
    secret, error = _raft_secret_given(args, environ)
    if secret is not None and len(secret) < limits.raft_secret_chars_min:
        return None, (f"refusing to start: the Raft secret is {len(secret)} characters, under "
                      f"the {limits.raft_secret_chars_min} raft_secret_chars_min asks (a random "
                      f"one: python -c 'import secrets; print(secrets.token_urlsafe(32))'); "
                      f"give every node the same")
    return secret, error


def _raft_secret_given(args: argparse.Namespace,
                       environ: MutableMapping[str, str]) -> tuple[str | None, str | None]:
    from_env = environ.pop("RAFTSCHED_RAFT_SECRET", None) or None
    if args.raft_secret_file is not None and args.raft_secret is not None:
        return None, "give the Raft secret once: --raft-secret-file or --raft-secret"
    if args.raft_secret_file is not None:
        return read_secret_file(args.raft_secret_file, "--raft-secret-file")
    if args.raft_secret is not None:
        print("raftsched node: warning: --raft-secret puts the secret on the command line, "
              "where every local user can read it; use --raft-secret-file PATH or the "
              "RAFTSCHED_RAFT_SECRET environment variable", file=sys.stderr)
        return args.raft_secret or None, None
    return from_env, None


def admin_token(args: argparse.Namespace, peers: tuple[str, ...],
                environ: MutableMapping[str, str]) -> tuple[str | None, str | None]:
    """(token or None, error or None): the bootstrap admin token from
    --admin-token-file or RAFTSCHED_ADMIN_TOKEN (removed from the environment
    once read, so no process this node starts inherits it). A node with peers
    needs one, unless --insecure-no-auth; a single node without one makes one
    and keeps it in its data folder (admin-token, mode 600)."""
    from_env = environ.pop("RAFTSCHED_ADMIN_TOKEN", None) or None
    if args.insecure_no_auth:
        return None, None
    if args.admin_token_file is not None:
        from_env, error = read_secret_file(args.admin_token_file, "--admin-token-file")
        if error is not None:
            return None, error
    if from_env is not None:
        if len(from_env) < limits.admin_token_chars_min:
            return None, (f"the admin token must be at least {limits.admin_token_chars_min} "
                          f"characters (a random one: python -c 'import secrets; "
                          f"print(secrets.token_urlsafe(32))')")
        return from_env, None
    if peers:
        return None, ("refusing to start: peers are given but no admin token "
                      "(--admin-token-file or RAFTSCHED_ADMIN_TOKEN); give every node the same "
                      "one, or pass --insecure-no-auth to serve the API to anyone")
    from raftsched.runtime.dev import load_or_create_token
    path = os.path.join(os.path.abspath(args.data), "admin-token")
    token = load_or_create_token(path)
    print(f"raftsched node: no admin token given; using the one in {path}", file=sys.stderr)
    return token, None


def command_identity(args: argparse.Namespace) -> tuple["RunAs | None", str | None]:
    """(the identity commands run with, None for the node's own; error or None).
    A node that runs commands must be told as whom: an unprivileged user
    (--command-user NAME), or knowingly its own (--command-user=self), since
    its own user reads the data folder (every tenant's jobs and secrets), the
    secret files, and may signal the node."""
    from raftsched.executors.command import SELF_USER, resolve_command_user
    if args.command_user is None:
        if args.allow_commands:
            return None, ("refusing to start: --allow-commands needs --command-user NAME, an "
                          "unprivileged user commands run as (the node runs as root to switch "
                          f"to it), or --command-user={SELF_USER} to run them as this node's "
                          "own user, which can read every tenant's secrets in the data folder "
                          "and the secret files; remote workers (`raftsched worker`, a "
                          "target.queue) are the recommended way to run commands")
        return None, None
    if not args.allow_commands:
        return None, "--command-user is given without --allow-commands: this node runs no command"
    try:
        return resolve_command_user(args.command_user), None
    except ValueError as exc:
        return None, f"--command-user: {exc}"


def run_node(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(),
                        format=f"%(asctime)s {args.id} %(levelname)s %(name)s: %(message)s")
    from raftsched.runtime.procguard import deny_same_user_inspection, keep_files_private
    deny_same_user_inspection()   # commands run as this user: keep them out of /proc/PID
    keep_files_private()   # the data folder and the secret files: 0700 and 0600
    peers = tuple(p.strip() for p in args.peers.split(",") if p.strip())
    secret, secret_error = raft_secret(args, os.environ)
    if secret_error is not None:
        print(f"raftsched node: {secret_error}", file=sys.stderr)
        return 2
    if peers and not secret and not args.insecure:
        print("raftsched node: refusing to start: peers are given but no Raft secret "
              "(--raft-secret-file or RAFTSCHED_RAFT_SECRET). pysyncobj speaks pickle, so an "
              "unauthenticated Raft port lets anyone who reaches it run code here. "
              "Pass --insecure only on an isolated network.", file=sys.stderr)
        return 2
    from raftsched.replication.raft import parse_peer
    try:
        for peer in peers:
            parse_peer(peer, args.raft)
    except ValueError as exc:
        print(f"raftsched node: --peers: {exc}", file=sys.stderr)
        return 2
    raft_error = _bounds_error(
        args, ("raft_snapshot_entries", 2, limits.command_int_max, True),
        ("shard_count", 1, limits.shard_count_max, True))
    if raft_error is not None:
        print(f"raftsched node: {raft_error}", file=sys.stderr)
        return 2
    from raftsched.executors.netguard import AddressPolicy
    try:
        AddressPolicy.parse(args.allow_target_cidr)
    except ValueError as exc:
        print(f"raftsched node: --allow-target-cidr: {exc}", file=sys.stderr)
        return 2
    tls_error = _tls_error(args)
    if tls_error is not None:
        print(f"raftsched node: {tls_error}", file=sys.stderr)
        return 2
    run_as, commands_error = command_identity(args)
    if commands_error is not None:
        print(f"raftsched node: {commands_error}", file=sys.stderr)
        return 2
    if args.allow_commands and run_as is None:
        logging.getLogger("raftsched.node").warning(
            "commands run as this node's own user (--command-user=self): a command can read "
            "the data folder, every tenant's secrets and the secret files")
    elif run_as is not None:
        logging.getLogger("raftsched.node").info("commands run as user %s (uid %d)",
                                                 run_as.name, run_as.uid)
    token, token_error = admin_token(args, peers, os.environ)
    if token_error is not None:
        print(f"raftsched node: {token_error}", file=sys.stderr)
        return 2
    flags_error = _bounds_error(
        args, ("tenant_jobs_max", 1, limits.quota_jobs_max_max, True),
        ("tenant_creates_per_s", 1, limits.quota_creates_per_s_max, True),
        ("tenant_runs_concurrent_max", 1, limits.quota_jobs_max_max, True),
        ("tenant_weight", 1, limits.tenant_weight_max, True)) \
        or _storage_flags_error(args) \
        or _bounds_error(args, ("max_clock_skew_ms", 1, limits.max_clock_skew_ms_max, True),
                         ("arm_ahead_s", 0, limits.arm_ahead_s_max, False))
    if flags_error is not None:
        print(f"raftsched node: {flags_error}", file=sys.stderr)
        return 2
    if not 0 < args.run_heartbeat_s * 2 <= args.run_lease_s:
        print("raftsched node: --run-heartbeat-s must be positive and at most half of "
              "--run-lease-s (a lease must survive one lost heartbeat)", file=sys.stderr)
        return 2
    import uvloop

    from raftsched.runtime.node import NodeConfig
    from raftsched.server import serve

    host, port = args.http
    config = NodeConfig(node_id=args.id, http_host=host, http_port=port, raft_addr=args.raft,
                        peers=peers, data_dir=os.path.abspath(args.data), raft_secret=secret,
                        shard_count=args.shard_count, advertise_http=args.advertise_http,
                        raft_snapshot_entries=args.raft_snapshot_entries,
                        run_lease_ms=int(args.run_lease_s * 1000),
                        run_heartbeat_ms=int(args.run_heartbeat_s * 1000),
                        max_clock_skew_ms=args.max_clock_skew_ms,
                        arm_ahead_ms=int(args.arm_ahead_s * 1000),
                        alert_webhook_url=args.alert_webhook_url, fsync=args.fsync,
                        max_data_bytes=args.max_data_bytes,
                        min_free_disk_bytes=args.min_free_disk_bytes,
                        history_max_runs=args.history_max_runs,
                        history_max_age_s=args.history_max_age_s,
                        finished_job_retention_s=args.finished_job_retention_s,
                        idempotency_ttl_s=args.idempotency_ttl_s,
                        allow_commands=args.allow_commands, command_run_as=run_as,
                        allow_target_cidrs=tuple(args.allow_target_cidr),
                        admin_token=token, insecure_no_auth=args.insecure_no_auth,
                        tenant_jobs_max=args.tenant_jobs_max,
                        tenant_creates_per_s=args.tenant_creates_per_s,
                        tenant_runs_concurrent_max=args.tenant_runs_concurrent_max,
                        tenant_weight=args.tenant_weight,
                        tls_cert=args.tls_cert, tls_key=args.tls_key, tls_ca=args.tls_ca)
    from raftsched.errors import InvariantBroken
    from raftsched.runtime.apply_bridge import EXIT_INVARIANT
    try:
        uvloop.run(serve(config))
    except InvariantBroken as exc:
        # A state this build cannot use (an earlier release's data folder, say):
        # the node does not start, and says why in one line.
        logging.getLogger("raftsched.node").critical("stopping node %s: %s", args.id, exc)
        return EXIT_INVARIANT
    return 0
