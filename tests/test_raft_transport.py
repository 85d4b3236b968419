"""The Raft port never buffers what an unauthenticated sender declares (a 1 GB length header, an HTTP request: closed at once, memory flat) nor obeys one, and the secret comes from a file or the environment, never silently from argv."""

from __future__ import annotations

import argparse
import os
import pickle
import socket
import struct
import time
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftsched import limits
from raftsched.cli import build_parser, raft_secret
from raftsched.replication import raft
from raftsched.testing.cluster import LocalCluster

# A connection the node closes must be seen closed within this (it is closed
# as soon as the header is read: well under a millisecond on an idle machine).
closed_within_s = 2.0
# What a node's memory may grow by while a sender streams 64 MB after a
# 1 GB header (pysyncobj alone buffers all of it: +62 MB measured).
rss_growth_bytes_max = 16 * 1024 ** 2
# A job whose create commits through Raft and calls nothing.
PROBE_JOB = {"name": "probe", "schedule": {"cron": "0 0 1 1 *"},
             "target": {"type": "publish", "topic": "probe", "message": 1}}


def raft_endpoint(cluster: LocalCluster, nid: str) -> tuple[str, int]:
    host, _, port = cluster.raft_addrs[nid].rpartition(":")
    return host, int(port)


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def seconds_until_closed(sock: socket.socket) -> float:
    """How long until the peer closes `sock` (EOF or reset); fails at closed_within_s."""
    started = time.monotonic()
    sock.settimeout(closed_within_s)
    try:
        data = sock.recv(1)
    except ConnectionResetError:
        data = b""
    except socket.timeout:
        raise AssertionError(f"the node kept the connection open for {closed_within_s} s")
    assert data == b"", f"the node answered {data!r}"
    return time.monotonic() - started


def pysyncobj_frame(message: object) -> bytes:
    """A frame as pysyncobj writes it without a secret: length, zlib(pickle)."""
    data = zlib.compress(pickle.dumps(message), 3)
    return struct.pack("i", len(data)) + data


# --- a real cluster's Raft port ----------------------------------------------------------

@pytest.mark.integration
def test_a_1gb_length_header_is_closed_at_once_and_buffers_nothing(shared_cluster):
    cluster = shared_cluster
    pid = cluster.procs["n2"].pid
    before = rss_bytes(pid)
    with socket.create_connection(raft_endpoint(cluster, "n2"), timeout=5) as sock:
        sock.sendall(struct.pack("i", 1 << 30))
        took_s = seconds_until_closed(sock)
    print(f"closed {took_s * 1000:.2f} ms after the 1 GB header")
    # The same header followed by 64 MB: the node must not read them.
    sent = 0
    with socket.create_connection(raft_endpoint(cluster, "n2"), timeout=5) as sock:
        try:
            sock.sendall(struct.pack("i", 1 << 30))
            chunk = b"x" * 1024 ** 2
            for _ in range(64):
                sock.sendall(chunk)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
    grown = rss_bytes(pid) - before
    print(f"accepted {sent} bytes after the header; VmRSS grew by {grown} bytes")
    assert sent < 64 * 1024 ** 2, "the node went on reading after the header"
    assert grown < rss_growth_bytes_max
    assert "declared a frame of 1073741824 bytes" in cluster.logs("n2", 100_000)
    assert cluster.api("n2", "GET", "/v1/node").body["raft_frames_refused_total"] >= 2
    still_commits(cluster, "n2")


@pytest.mark.integration
def test_an_http_request_to_the_raft_port_is_closed(shared_cluster):
    with socket.create_connection(raft_endpoint(shared_cluster, "n3"), timeout=5) as sock:
        # "GET " read as a length is 542 MB.
        sock.sendall(b"GET / HTTP/1.1\r\nHost: raft\r\n\r\n")
        seconds_until_closed(sock)
    with socket.create_connection(raft_endpoint(shared_cluster, "n3"), timeout=5):
        pass   # a port scan's connect and close
    still_commits(shared_cluster, "n3")


@pytest.mark.integration
def test_an_unencrypted_frame_gets_no_answer(shared_cluster):
    """pysyncobj answers ['status'] with the node's status when it has no secret."""
    with socket.create_connection(raft_endpoint(shared_cluster, "n1"), timeout=5) as sock:
        sock.sendall(pysyncobj_frame(["status"]))
        seconds_until_closed(sock)


@pytest.mark.integration
def test_a_connection_that_does_not_authenticate_in_time_is_closed(shared_cluster):
    """pysyncobj alone keeps a silent connection, or one that trickles a byte
    now and then, open for good."""
    timeout_s = limits.raft_handshake_timeout_s
    endpoint = raft_endpoint(shared_cluster, "n2")
    before = shared_cluster.api("n2", "GET", "/v1/node").body["raft_handshakes_refused_total"]
    with socket.create_connection(endpoint, timeout=5) as silent, \
            socket.create_connection(endpoint, timeout=5) as trickle:
        started = time.monotonic()
        trickle.sendall(struct.pack("i", 1000))   # a frame of 1000 bytes, within the cap
        trickle.settimeout(0.5)
        closed = False
        while not closed and time.monotonic() - started < timeout_s + closed_within_s:
            try:   # one byte of its body every half second
                trickle.sendall(b"x")
                closed = trickle.recv(1) == b""
            except socket.timeout:
                continue
            except (BrokenPipeError, ConnectionResetError):
                closed = True
        trickled_s = time.monotonic() - started
        assert closed, f"a trickling connection was still open after {trickled_s:.1f} s"
        assert trickled_s >= timeout_s - 1.0, f"closed after {trickled_s:.1f} s, before its time"
        silent_s = time.monotonic() - started + seconds_until_closed(silent)
        assert timeout_s - 1.0 <= silent_s <= timeout_s + closed_within_s
    after = shared_cluster.api("n2", "GET", "/v1/node").body["raft_handshakes_refused_total"]
    assert after >= before + 2
    assert "no handshake within raft_handshake_timeout_s" in shared_cluster.logs("n2", 100_000)
    still_commits(shared_cluster, "n2")


@pytest.mark.integration
def test_connections_in_handshake_over_the_per_source_cap_are_closed_at_once(shared_cluster):
    cap = limits.raft_preauth_connections_per_source_max
    endpoint = raft_endpoint(shared_cluster, "n3")
    held = [socket.create_connection(endpoint, timeout=5) for _ in range(cap)]
    try:
        with socket.create_connection(endpoint, timeout=5) as extra:
            took_s = seconds_until_closed(extra)
        assert took_s < limits.raft_handshake_timeout_s / 2, took_s
        for sock in held:   # the first `cap` wait for their handshake
            sock.settimeout(0.2)
            with pytest.raises(socket.timeout):
                sock.recv(1)
    finally:
        for sock in held:
            sock.close()
    assert "raft_preauth_connections_per_source_max" in shared_cluster.logs("n3", 100_000)
    # Its peers' links (authenticated, also from 127.0.0.1) were never at risk.
    still_commits(shared_cluster, "n3")


def still_commits(cluster: LocalCluster, nid: str) -> None:
    created = cluster.api(nid, "POST", "/v1/jobs", PROBE_JOB)
    assert created.status == 201, created
    assert cluster.leader() is not None


# --- a single node ------------------------------------------------------------------------

@pytest.mark.integration
def test_a_single_node_without_a_secret_opens_no_raft_port(tmp_path):
    cluster = LocalCluster(tmp_path, nodes=1)
    cluster.env.pop("RAFTSCHED_RAFT_SECRET")
    with cluster:
        cluster.wait_ready()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(raft_endpoint(cluster, "n1"), timeout=5).close()
        still_commits(cluster, "n1")
        assert "no Raft port is opened" in cluster.logs("n1", 100_000)


@pytest.mark.integration
def test_a_single_node_with_a_secret_file_listens_but_refuses_unencrypted_frames(tmp_path):
    secret_file = tmp_path / "raft-secret"
    secret_file.write_text("s3cret-" + os.urandom(16).hex() + "\n")
    secret_file.chmod(0o600)
    cluster = LocalCluster(tmp_path / "c", nodes=1,
                           node_args=["--raft-secret-file", str(secret_file)])
    cluster.env.pop("RAFTSCHED_RAFT_SECRET")
    with cluster:
        cluster.wait_ready()
        # It listens (so the file's secret was taken), and it refuses what
        # is not encrypted with that secret.
        with socket.create_connection(raft_endpoint(cluster, "n1"), timeout=5) as sock:
            sock.sendall(pysyncobj_frame(["status"]))
            seconds_until_closed(sock)
        still_commits(cluster, "n1")
        assert "raftsched node: warning" not in cluster.logs("n1", 100_000)


# --- the cap on one connection, in process --------------------------------------------------

class _Poller:
    """The one call pysyncobj's connection makes on its poller, recorded."""

    def __init__(self) -> None:
        self.callbacks: dict[int, object] = {}

    def subscribe(self, fd: int, callback: object, mask: int) -> None:
        self.callbacks[fd] = callback

    def unsubscribe(self, fd: int) -> None:
        self.callbacks.pop(fd, None)


class _Link:
    """A capped connection (as _Transport makes them) over a socket pair:
    `sender` writes, `pump()` is one readable event on the connection."""

    def __init__(self) -> None:
        ours, self.sender = socket.socketpair()
        ours.setblocking(False)
        self._fd = ours.fileno()
        self._poller = _Poller()
        self.conn = raft.TcpConnection(self._poller, socket=ours, timeout=10.0)
        raft._cap_frames(self.conn, trusted=False)
        self.received: list[object] = []
        self.conn.setOnMessageReceivedCallback(self.received.append)

    def pump(self, turns: int = 1) -> None:
        for _ in range(turns):
            callback = self._poller.callbacks.get(self._fd)
            if callback is not None:
                callback(self._fd, 1)   # POLL_EVENT_TYPE.READ

    @property
    def open(self) -> bool:
        return self.conn.state != 0   # CONNECTION_STATE.DISCONNECTED

    def close(self) -> None:
        self.sender.close()
        self.conn.disconnect()


@pytest.fixture
def link():
    made = _Link()
    yield made
    made.close()


def test_a_first_frame_over_the_preauth_cap_closes_the_connection(link):
    big = os.urandom(limits.raft_frame_preauth_bytes_max)   # incompressible
    link.sender.sendall(pysyncobj_frame(big))
    link.pump()
    assert not link.open
    assert link.received == []


def test_after_the_first_frame_the_larger_cap_applies(link):
    big = os.urandom(4 * limits.raft_frame_preauth_bytes_max)
    link.sender.sendall(pysyncobj_frame("node-address") + pysyncobj_frame(big))
    link.pump(turns=10)
    assert link.received == ["node-address", big]
    assert link.open
    link.sender.sendall(struct.pack("i", limits.raft_frame_bytes_max + 1))
    link.pump()
    assert not link.open


@pytest.mark.parametrize("declared", [1 << 30, -1])
def test_a_bad_header_behind_a_good_frame_in_one_read_is_caught(link, declared):
    link.sender.sendall(pysyncobj_frame("node-address") + struct.pack("i", declared) + b"x" * 64)
    link.pump()
    assert link.received == ["node-address"]
    assert not link.open


# --- frames this node sends -------------------------------------------------------------------

@given(st.binary(max_size=3 * limits.raft_frame_stored_bytes_max))
def test_a_frame_body_is_a_zlib_stream_of_the_payload(payload):
    body = raft.zlib_frame(payload)
    assert zlib.decompress(body) == payload
    if len(payload) <= limits.raft_frame_stored_bytes_max:
        assert len(body) == len(payload) + 11   # stored: 7 bytes ahead, the checksum after
    else:
        assert body == zlib.compress(payload, 3)


@pytest.mark.parametrize("message", [
    {"type": "append_entries", "term": 3, "entries": []},         # a heartbeat: stored
    {"type": "append_entries", "entries": [b"create" * 1000]},    # compressed
])
def test_what_a_capped_connection_sends_a_stock_pysyncobj_connection_reads(message):
    ours, theirs = socket.socketpair()
    for sock in (ours, theirs):
        sock.setblocking(False)
    sender = raft.TcpConnection(_Poller(), socket=ours, timeout=10.0)
    raft._cap_frames(sender, trusted=True)
    poller = _Poller()
    receiver = raft.TcpConnection(poller, socket=theirs, timeout=10.0)
    received: list[object] = []
    receiver.setOnMessageReceivedCallback(received.append)
    try:
        sender.send(message)
        poller.callbacks[theirs.fileno()](theirs.fileno(), 1)   # readable
        assert received == [message]
    finally:
        sender.disconnect()
        receiver.disconnect()


# --- where the secret comes from --------------------------------------------------------------

# Secrets of raft_secret_chars_min characters, the shortest a node takes.
ON_ARGV, FROM_FILE, FROM_ENV = (name.ljust(limits.raft_secret_chars_min, "-")
                                for name in ("on-argv", "from-file", "from-env"))


def node_args(*extra: str) -> argparse.Namespace:
    return build_parser().parse_args(["node", "--id", "n1", "--http", "127.0.0.1:1",
                                      "--raft", "127.0.0.1:2", "--data", "/nonexistent",
                                      *extra])


def test_the_secret_on_argv_works_with_a_warning_naming_the_file_option(capsys):
    secret, error = raft_secret(node_args("--raft-secret", ON_ARGV), {})
    assert (secret, error) == (ON_ARGV, None)
    assert "--raft-secret-file" in capsys.readouterr().err


def test_the_secret_from_a_file_or_the_environment_without_warning(tmp_path, capsys):
    path = tmp_path / "secret"
    path.write_text(FROM_FILE + "\n")
    path.chmod(0o600)
    environ = {"RAFTSCHED_RAFT_SECRET": FROM_ENV, "OTHER": "1"}
    assert raft_secret(node_args("--raft-secret-file", str(path)), environ) == (FROM_FILE, None)
    assert environ == {"OTHER": "1"}, "the variable must leave the node's environment"
    assert raft_secret(node_args(), {"RAFTSCHED_RAFT_SECRET": FROM_ENV}) == (FROM_ENV, None)
    assert raft_secret(node_args(), {}) == (None, None)
    assert capsys.readouterr().err == ""


def test_unusable_secret_sources_are_refused(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.write_text("\n")
    assert "is empty" in raft_secret(node_args("--raft-secret-file", str(empty)), {})[1]
    missing = str(tmp_path / "missing")
    assert "cannot read" in raft_secret(node_args("--raft-secret-file", missing), {})[1]
    both = node_args("--raft-secret-file", str(empty), "--raft-secret", "x")
    assert "once" in raft_secret(both, {})[1]
    shared = tmp_path / "shared"
    shared.write_text(FROM_FILE)
    shared.chmod(0o644)
    assert raft_secret(node_args("--raft-secret-file", str(shared)), {}) == (FROM_FILE, None)
    assert "chmod 600" in capsys.readouterr().err


def test_a_secret_shorter_than_the_admin_tokens_minimum_is_refused(tmp_path):
    assert limits.raft_secret_chars_min == limits.admin_token_chars_min
    short = "x" * (limits.raft_secret_chars_min - 1)
    for args, environ in [(node_args("--raft-secret", short), {}),
                          (node_args(), {"RAFTSCHED_RAFT_SECRET": short})]:
        secret, error = raft_secret(args, environ)
        assert secret is None
        assert f"{limits.raft_secret_chars_min} raft_secret_chars_min" in error
    path = tmp_path / "secret"
    path.write_text(short + "\n")
    path.chmod(0o600)
    assert "refusing to start" in raft_secret(node_args("--raft-secret-file", str(path)), {})[1]


@pytest.mark.integration
def test_a_node_given_a_short_secret_exits_with_the_reason(tmp_path):
    cluster = LocalCluster(tmp_path, nodes=3)
    cluster.env["RAFTSCHED_RAFT_SECRET"] = "too-short"
    with cluster:
        assert cluster.procs["n1"].wait(30) == 2
        assert "the Raft secret is 9 characters" in cluster.logs("n1")
