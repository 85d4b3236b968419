"""`raftsched dev`: start and supervise a local cluster of `raftsched node`
processes on 127.0.0.1, with a generated Raft secret and bootstrap admin token
kept in the data folder (raft-secret, admin-token; mode 600).
Its nodes may call targets on loopback (--allow-target-cidr 127.0.0.0/8).

A node that exits unexpectedly is restarted (with a growing delay); Ctrl-C or
SIGTERM stops every node with SIGINT (at once: with every node stopping there
is no one to drain to), then SIGKILL after a grace period.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time

from raftsched import limits
from raftsched.runtime.procguard import keep_files_private

# Loopback targets (a service under development, a test sink) are what a
# local cluster is for; nodes refuse them unless allowed (executors/netguard.py).
dev_allowed_target_cidr = "127.0.0.0/8"


def load_or_create_token(path: str) -> str:
    """The random secret kept in `path`, made (256 bits, mode 600) on first use."""
    if os.path.exists(path):
        with open(path) as fh:
            return fh.read().strip()
    os.makedirs(os.path.dirname(path), mode=limits.private_dir_mode, exist_ok=True)
    secret = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(secret + "\n")
    return secret


def load_or_create_secret(data_dir: str) -> str:
    return load_or_create_token(os.path.join(data_dir, "raft-secret"))


def node_argv(i: int, nodes: int, data_dir: str, http_base: int, raft_base: int,
              allow_commands: bool = False) -> list[str]:
    raft = [f"127.0.0.1:{raft_base + k}" for k in range(nodes)]
    return [sys.executable, "-m", "raftsched", "node", "--id", f"n{i + 1}",
            "--http", f"127.0.0.1:{http_base + i}", "--raft", raft[i],
            "--peers", ",".join(r for k, r in enumerate(raft) if k != i),
            "--data", os.path.join(data_dir, f"n{i + 1}"),
            "--allow-target-cidr", dev_allowed_target_cidr,
            # A development cluster runs commands as the developer who started it.
            *(["--allow-commands", "--command-user=self"] if allow_commands else [])]


def banner(nodes: int, data_dir: str, http_base: int, token: str,
           allow_commands: bool = False) -> list[str]:
    """What `raftsched dev` prints once its nodes are started: where they
    serve, what they may call, and commands a user can paste as they are."""
    lines = [f"raftsched: local cluster of {nodes} nodes, data in {data_dir}"]
    for i in range(nodes):
        url = f"http://127.0.0.1:{http_base + i}"
        lines.append(f"  n{i + 1}: API {url}/v1/  UI {url}/")
    lines.append(f"  HTTP targets and alert webhooks may call {dev_allowed_target_cidr} "
                 f"(loopback), which nodes refuse unless allowed (--allow-target-cidr)")
    lines.append("  commands on the default queue run on the nodes, as your own user "
                 "(--allow-commands --command-user=self)" if allow_commands
                 else "  commands need a target.queue served by `raftsched worker` (pass "
                      "--allow-commands to run them on the nodes)")
    lines.append(f"  a tenant runs commands once an admin grants it: curl -X PUT -H "
                 f"\"Authorization: Bearer $RAFTSCHED_TOKEN\" -H 'Content-Type: "
                 f"application/json' -d '{{\"commands\": true}}' "
                 f"http://127.0.0.1:{http_base}/v1/tenants/default")
    lines.append(f"  the admin token is kept in {os.path.join(data_dir, 'admin-token')}; "
                 f"every API call needs it (the CLI reads RAFTSCHED_TOKEN):")
    lines.append(f"RAFTSCHED_TOKEN={token}")
    urls = ",".join(f"http://127.0.0.1:{http_base + i}" for i in range(nodes))
    lines.append(f"  the CLI and the Python client take every node, and move to the next when "
                 f"one does not answer: RAFTSCHED_URL={urls}")
    lines.append(f'  try: curl -s -H "Authorization: Bearer $RAFTSCHED_TOKEN" '
                 f'http://127.0.0.1:{http_base}/v1/cluster   (Ctrl-C stops every node)')
    return lines


def run_dev(nodes: int, data_dir: str, http_base: int, raft_base: int, *,
            allow_commands: bool = False) -> int:
    keep_files_private()   # the nodes' data folders and the secret files (they inherit it)
    data_dir = os.path.abspath(data_dir)
    os.makedirs(data_dir, mode=limits.private_dir_mode, exist_ok=True)
    token = load_or_create_token(os.path.join(data_dir, "admin-token"))
    env = dict(os.environ, RAFTSCHED_RAFT_SECRET=load_or_create_secret(data_dir),
               RAFTSCHED_ADMIN_TOKEN=token)
    argvs = [node_argv(i, nodes, data_dir, http_base, raft_base, allow_commands)
             for i in range(nodes)]
    procs: list[subprocess.Popen | None] = [None] * nodes
    restarts = [0] * nodes
    next_start = [0.0] * nodes
    stopping = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    for i in range(nodes):
        procs[i] = subprocess.Popen(argvs[i], env=env)
    for line in banner(nodes, data_dir, http_base, token, allow_commands):
        print(line, flush=True)
    while not stopping:
        for i, proc in enumerate(procs):
            if proc is not None and proc.poll() is not None:
                delay = min(limits.dev_restart_delay_s_max, 0.5 * 2 ** restarts[i])
                print(f"raftsched: n{i + 1} exited with {proc.returncode}; restarting in "
                      f"{delay:g} s", file=sys.stderr, flush=True)
                restarts[i] += 1
                next_start[i] = time.monotonic() + delay
                procs[i] = None
            if procs[i] is None and time.monotonic() >= next_start[i] and not stopping:
                procs[i] = subprocess.Popen(argvs[i], env=env)
        time.sleep(limits.dev_supervise_poll_s)
    print("raftsched: stopping the cluster", flush=True)
    live = [p for p in procs if p is not None and p.poll() is None]
    for proc in live:
        proc.send_signal(signal.SIGINT)
    deadline = time.monotonic() + limits.dev_stop_grace_s
    for proc in live:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return 0
