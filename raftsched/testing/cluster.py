"""Start real raftsched node processes on free loopback ports, and break them.

    with LocalCluster(tmp_path, nodes=3) as cluster:
        cluster.wait_ready()
        cluster.kill("n1"); cluster.start("n1")
        cluster.ensure_same()      # state digests equal on every node

With `partitionable=True` every Raft link runs through a LinkProxy
(testing/netproxy.py) and `cut(nid)` / `heal(nid)` isolate a node from its peers.

Every process started here is killed by close() (also on error), and each
node's output goes to <base>/<id>.log for post-mortems.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

from raftsched.runtime.clock import TEST_SHIFT_ENV
from raftsched.testing.http import ADMIN_TOKEN, call, wait_until
from raftsched.testing.netproxy import LinkProxy
from raftsched.testing.tls import TlsFiles


def free_ports(count: int) -> list[int]:
    """Ports the kernel considers free on 127.0.0.1 right now."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class LocalCluster:
    def __init__(self, base_dir: str | Path, nodes: int = 3, *,
                 extra_env: dict[str, str] | None = None,
                 node_args: list[str] | None = None, partitionable: bool = False,
                 allow_loopback_targets: bool = True, allow_commands: bool = True,
                 args_of: dict[str, list[str]] | None = None,
                 tls: TlsFiles | None = None,
                 command_tenants: tuple[str, ...] = ("default",),
                 command_user: str = "self") -> None:
        """`node_args`: flags every node gets; `args_of`: flags of one node, by id.
        `tls`: the nodes serve their API over TLS with these files (--tls-cert,
        --tls-key, --tls-ca), and api() verifies them by its CA.
        `allow_loopback_targets`: give every node --allow-target-cidr
        127.0.0.0/8, as tests call their sinks on 127.0.0.1 (nodes refuse
        loopback targets by default); False to test that refusal.
        `allow_commands`: give every node --allow-commands, as tests run
        commands on the default queue; False (or setting the attribute before
        a restart) to test the nodes' refusal. They run as `command_user`
        (--command-user; by default `self`, the nodes' own user).
        `command_tenants`: the tenants an admin grants command targets the
        first time the cluster is ready (the admin token's own, `default`,
        as tests run commands with it); () to test the refusal."""
        self.base = Path(base_dir)
        self.base.mkdir(parents=True, exist_ok=True)
        self.ids = [f"n{i + 1}" for i in range(nodes)]
        pairs = [(a, b) for i, a in enumerate(self.ids) for b in self.ids[i + 1:]]
        # Sorted, so that every relay port sorts below every Raft port: the
        # relay must sit on the side that opens the link (see raft.parse_peer).
        ports = sorted(free_ports(2 * nodes + (len(pairs) if partitionable else 0)),
                       key=lambda p: f"127.0.0.1:{p}")
        relay_ports, ports = ports[:len(ports) - 2 * nodes], ports[len(ports) - 2 * nodes:]
        self.http_ports = dict(zip(self.ids, ports[:nodes]))
        self.raft_addrs = {nid: f"127.0.0.1:{p}" for nid, p in zip(self.ids, ports[nodes:])}
        self.links: dict[frozenset, LinkProxy] = {}
        for (a, b), port in zip(pairs if partitionable else [], relay_ports):
            low = min(a, b, key=lambda n: self.raft_addrs[n])
            host, _, rport = self.raft_addrs[low].rpartition(":")
            self.links[frozenset((a, b))] = LinkProxy(port, (host, int(rport)), f"{a}-{b}")
        # Every node gets the same bootstrap admin token, the one
        # testing.http.call() sends by default.
        self.env = dict(os.environ, RAFTSCHED_RAFT_SECRET=secrets.token_urlsafe(24),
                        RAFTSCHED_ADMIN_TOKEN=ADMIN_TOKEN, RAFTSCHED_TOKEN=ADMIN_TOKEN,
                        **(extra_env or {}))
        self.node_args = list(node_args or [])
        self.args_of = {nid: list(args) for nid, args in (args_of or {}).items()}
        self.tls = tls
        self.client_ssl = ssl.create_default_context(cafile=str(tls.ca)) if tls else None
        if tls is not None:
            self.node_args += ["--tls-cert", str(tls.cert), "--tls-key", str(tls.key),
                               "--tls-ca", str(tls.ca)]
        self.allow_loopback_targets = allow_loopback_targets
        self.allow_commands = allow_commands
        self.command_tenants = tuple(command_tenants)
        self.command_user = command_user
        self._commands_granted = False
        self.paused: set[str] = set()
        self.kills: list[tuple[str, float]] = []   # (node, time.time()) of every SIGKILL
        self.procs: dict[str, subprocess.Popen] = {}
        self._logs: dict[str, Any] = {}

    # --- processes -------------------------------------------------------------------

    def argv(self, nid: str) -> list[str]:
        own = self.raft_addrs[nid]
        peers = ",".join(
            f"{addr}@{self.links[frozenset((nid, other))].address}"
            if frozenset((nid, other)) in self.links and own > addr else addr
            for other, addr in self.raft_addrs.items() if other != nid)
        return [sys.executable, "-m", "raftsched", "node", "--id", nid,
                "--http", f"127.0.0.1:{self.http_ports[nid]}", "--raft", self.raft_addrs[nid],
                "--peers", peers, "--data", str(self.base / nid),
                *(["--allow-target-cidr", "127.0.0.0/8"] if self.allow_loopback_targets else []),
                *(["--allow-commands", f"--command-user={self.command_user}"]
                  if self.allow_commands else []),
                *self.node_args, *self.args_of.get(nid, [])]

    def start(self, nid: str | None = None) -> None:
        for node in [nid] if nid else self.ids:
            assert node not in self.procs or self.procs[node].poll() is not None, node
            if node in self._logs:
                self._logs[node].close()
            log = open(self.base / f"{node}.log", "ab")
            self._logs[node] = log
            self.procs[node] = subprocess.Popen(self.argv(node), env=self.env, stdout=log,
                                                stderr=subprocess.STDOUT)

    def kill(self, nid: str) -> None:
        """SIGKILL: no shutdown code runs."""
        proc = self.procs[nid]
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)   # a stopped process must not stay stopped
            proc.kill()
            self.kills.append((nid, time.time()))
        self.paused.discard(nid)
        proc.wait(10)

    def kill_all(self) -> None:
        for nid in self.ids:
            if nid in self.procs:
                self.kill(nid)

    def stop(self, nid: str, timeout_s: float = 30.0) -> int:
        """SIGTERM: the node drains (at most stop_drain_max_s), then stops."""
        proc = self.procs[nid]
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        return proc.returncode

    def pause(self, nid: str) -> None:
        self.procs[nid].send_signal(signal.SIGSTOP)
        self.paused.add(nid)

    def resume(self, nid: str) -> None:
        self.procs[nid].send_signal(signal.SIGCONT)
        self.paused.discard(nid)

    def cut(self, nid: str) -> None:
        """Cut every Raft link of `nid` (its HTTP API stays reachable)."""
        assert self.links, "cut() needs LocalCluster(partitionable=True)"
        for pair, link in self.links.items():
            if nid in pair:
                link.cut()

    def heal(self, nid: str | None = None) -> None:
        for pair, link in self.links.items():
            if nid is None or nid in pair:
                link.heal()

    def alive(self) -> list[str]:
        """Running processes (a paused one counts: it holds its ports)."""
        return [nid for nid, p in self.procs.items() if p.poll() is None]

    def responsive(self) -> list[str]:
        """Running and not paused: the nodes that can answer."""
        return [nid for nid in self.alive() if nid not in self.paused]

    def close(self) -> None:
        for nid in list(self.procs):
            try:
                self.kill(nid)
            except Exception:  # keep killing the others
                pass
        for log in self._logs.values():
            log.close()
        for link in self.links.values():
            link.close()

    def __enter__(self) -> "LocalCluster":
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def logs(self, nid: str, tail_chars: int = 4000) -> str:
        path = self.base / f"{nid}.log"
        return path.read_text(errors="replace")[-tail_chars:] if path.exists() else ""

    # --- HTTP ------------------------------------------------------------------------

    def url(self, nid: str) -> str:
        scheme = "https" if self.tls else "http"
        return f"{scheme}://127.0.0.1:{self.http_ports[nid]}"

    def api(self, nid: str, method: str, path: str, body: Any = None, **kw: Any):
        kw.setdefault("context", self.client_ssl)
        return call(method, self.url(nid) + path, body, **kw)

    def leader(self, among: list[str] | None = None) -> str | None:
        """The leader as every live node (of `among`) reports it, or None."""
        seen = set()
        for nid in among or self.responsive():
            seen.add(self.api(nid, "GET", "/v1/cluster", timeout_s=2).body["leader"])
        return seen.pop() if len(seen) == 1 and None not in seen else None

    def wait_ready(self, timeout_s: float = 30.0, among: list[str] | None = None) -> str:
        """Wait until the live nodes agree on a leader and every one is registered."""
        nodes = among or self.responsive()

        def ready() -> str | None:
            leader = self.leader(nodes)
            if leader is None:
                return None
            registered = self.api(leader, "GET", "/v1/cluster", timeout_s=2).body["nodes"]
            return leader if all(n in registered for n in self.ids) else None

        leader = wait_until(ready, timeout_s, "a leader agreed on by " + ",".join(nodes))
        if not self._commands_granted:
            for tenant in self.command_tenants:
                wait_until(lambda t=tenant: self.api(leader, "PUT", f"/v1/tenants/{t}",
                                            {"commands": True}, timeout_s=5).status == 200,
                           timeout_s, f"tenant {tenant} granted commands")
            self._commands_granted = True
        return leader

    def wait_placed(self, timeout_s: float = 30.0) -> None:
        """Wait until every responsive node owns shards, as the leader's state
        says. A node that registered after the leader first placed the shards
        gets its share by a rebalance a coordinator period later; a run fired
        meanwhile on a shard that then moves waits take_over_grace_s and runs
        as a next attempt, which a test counting attempts would misread."""
        nodes = self.responsive()

        def placed() -> bool:
            leader = self.leader(nodes)
            if leader is None:
                return False
            shards = self.api(leader, "GET", "/v1/cluster/shards", timeout_s=2).body["shards"]
            return {s["owner"] for s in shards} >= set(nodes)

        wait_until(placed, timeout_s, "every node to own shards")

    def digests(self, among: list[str] | None = None) -> dict[str, dict]:
        return {nid: self.api(nid, "GET", "/v1/state/digest", timeout_s=5).body
                for nid in among or self.alive()}

    def ensure_same(self, timeout_s: float = 20.0, among: list[str] | None = None) -> dict:
        """Commit a digest check and wait until every node (of `among`) has
        recorded its digest at that index; raise AssertionError if they differ.
        The log never stands still (renewals), so replicas are compared at one
        index rather than "now"."""
        nodes = among or self.alive()
        pending: list[int] = []   # a check still being computed: waited for, not made again

        def checked() -> dict | None:
            index = pending[-1] if pending else None
            for nid in ([] if index is not None else nodes):
                answer = self.api(nid, "POST", "/v1/state/digest:check", timeout_s=6)
                if answer.status == 200:
                    index = answer.body["index"]
                    break
                if answer.status == 503 and isinstance(answer.body, dict) \
                        and answer.body.get("reason") == "digest_pending":
                    pending.append(answer.body["index"])
                    return None
            if index is None:
                return None
            found = {nid: self.api(nid, "GET", f"/v1/state/digest?index={index}",
                                   timeout_s=7) for nid in nodes}
            if any(r.status == 503 for r in found.values()):
                return None   # still being computed there: ask again
            pending.clear()
            if any(r.status != 200 for r in found.values()):
                return None   # a node lags or skipped the index on a snapshot: check again
            return {nid: r.body for nid, r in found.items()}

        found = wait_until(checked, timeout_s, "a digest check recorded on every node", 0.1)
        if len({d["digest"] for d in found.values()}) != 1:
            raise AssertionError(f"replica state digests differ at one index: {found}")
        return found


# The file, in each node's folder, whose number of milliseconds that node adds
# to its wall clock (runtime/clock.py's test seam), once a cluster is started
# by shiftable_cluster.
SHIFT_FILE = "clock-shift-ms"


@contextlib.contextmanager
def shiftable_cluster(base: Path, log_tail: int = 4000) -> Iterator[LocalCluster]:
    """A ready 3-node cluster whose nodes honour the clock-shift test seam
    (`shift_clock`); each node's log tail is printed when it stops, for the
    post-mortem of a failed test."""
    for nid in ("n1", "n2", "n3"):
        (base / nid).mkdir(exist_ok=True)
    local = LocalCluster(base, extra_env={TEST_SHIFT_ENV: SHIFT_FILE})
    with local:
        local.wait_ready()
        yield local
        for nid in local.ids:
            print(f"----- {nid} log (tail) -----")
            print(local.logs(nid, log_tail))


def shift_clock(cluster: LocalCluster, nid: str, ms: int) -> None:
    """Move node `nid`'s wall clock `ms` from true time (0: back to it)."""
    (cluster.base / nid / SHIFT_FILE).write_text(str(ms))
