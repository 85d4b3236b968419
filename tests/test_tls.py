"""A cluster serving its API over TLS (--tls-cert, --tls-key, --tls-ca) works end to end: the nodes call each other over https verified by the CA (status, clocks, run output), a scheduled job fires, and plain HTTP or an unverified client gets nothing; bad TLS flags stop a node at start."""

from __future__ import annotations

import datetime as dt
import http.client
import ssl
import subprocess
import sys
import urllib.error

import pytest

from raftsched.cli import _tls_error, build_parser
from raftsched.cli import main as cli_main
from raftsched.client import CannotConnect, Client
from raftsched.testing.cluster import LocalCluster
from raftsched.testing.http import ADMIN_TOKEN, call, wait_until
from raftsched.testing.tls import make_tls_files


def soon(seconds: float) -> str:
    at = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=seconds)
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory):
    base = tmp_path_factory.mktemp("tls")
    cluster = LocalCluster(base / "cluster", tls=make_tls_files(base / "pki"))
    with cluster:
        cluster.wait_ready()
        yield cluster


@pytest.mark.integration
def test_the_nodes_measure_each_other_over_https(tls_cluster):
    def all_measured(nid: str) -> dict | None:
        nodes = tls_cluster.api(nid, "GET", "/v1/cluster", timeout_s=5).body["nodes"]
        seen = all(n["role"] != "unreachable" and n["clock_offset_ms"] is not None
                   for n in nodes.values())
        return nodes if seen and len(nodes) == 3 else None

    for nid in tls_cluster.ids:
        nodes = wait_until(lambda: all_measured(nid), 30,
                           f"{nid} to read every node's status and clock over https")
        assert all(n["http"].startswith("https://127.0.0.1:") for n in nodes.values()), nodes
    assert tls_cluster.api("n1", "GET", "/v1/node").body["clock"]["synced"] is True


@pytest.mark.integration
def test_a_scheduled_job_fires_and_its_output_is_read_from_another_node(tls_cluster):
    created = tls_cluster.api("n1", "POST", "/v1/jobs", {
        "name": "tls", "run_at": soon(1.5),
        "target": {"type": "command", "argv": ["echo", "hello-tls"]},
        "retry": {"max_attempts": 1}})
    assert created.status == 201, created
    job_id = created.body["job_id"]

    def succeeded() -> dict | None:
        runs = tls_cluster.api("n2", "GET", f"/v1/jobs/{job_id}/runs").body["runs"]
        return runs[0] if runs and runs[0]["state"] == "succeeded" else None

    run = wait_until(succeeded, 30, "the job's run to succeed")
    holder = run["attempts"][0]["holder"]
    other = next(nid for nid in tls_cluster.ids if nid != holder)
    logs = tls_cluster.api(other, "GET", f"/v1/runs/{run['run_id']}/logs")
    assert logs.status == 200, logs
    assert logs.body["unavailable"] == [], logs
    assert "hello-tls" in logs.body["attempts"][0]["stdout"]


@pytest.mark.integration
def test_plain_http_and_an_unverified_client_are_refused(tls_cluster):
    port = tls_cluster.http_ports["n1"]
    with pytest.raises((urllib.error.URLError, http.client.HTTPException, ConnectionError)):
        call("GET", f"http://127.0.0.1:{port}/v1/healthz", timeout_s=5)
    # The system's CAs do not know the cluster's: the handshake fails.
    with pytest.raises(urllib.error.URLError) as refused:
        call("GET", f"https://127.0.0.1:{port}/v1/healthz", timeout_s=5,
             context=ssl.create_default_context())
    assert isinstance(refused.value.reason, ssl.SSLCertVerificationError)
    assert tls_cluster.api("n1", "GET", "/v1/healthz").status == 200


@pytest.mark.integration
def test_the_client_and_the_cli_verify_the_nodes_by_the_ca(tls_cluster, monkeypatch, capsys):
    url = tls_cluster.url("n2")
    ca = str(tls_cluster.tls.ca)
    with Client(url, token=ADMIN_TOKEN, ca_file=ca) as api:
        assert api.cluster()["self"] == "n2"
    with pytest.raises(CannotConnect):
        Client(url, token=ADMIN_TOKEN).cluster()   # the system's CAs do not know it
    monkeypatch.setenv("RAFTSCHED_TOKEN", ADMIN_TOKEN)
    monkeypatch.setenv("RAFTSCHED_TLS_CA", ca)
    assert cli_main(["status", "--url", url, "-o", "json"]) == 0
    assert '"self": "n2"' in capsys.readouterr().out
    monkeypatch.delenv("RAFTSCHED_TLS_CA")
    assert cli_main(["status", "--url", url, "-o", "json", "--tls-ca", ca]) == 0
    assert cli_main(["status", "--url", url, "--tls-ca", str(tls_cluster.base / "nope")]) != 0
    assert "--tls-ca" in capsys.readouterr().err


@pytest.mark.integration
def test_a_remote_worker_serves_its_queue_over_https(tls_cluster):
    created = tls_cluster.api("n1", "POST", "/v1/jobs", {
        "name": "tls-worker", "schedule": {"cron": "0 0 1 1 *"},
        "target": {"type": "command", "queue": "tlsq", "argv": ["echo", "from-worker"]},
        "retry": {"max_attempts": 1}})
    assert created.status == 201, created
    job_id = created.body["job_id"]
    urls = ",".join(tls_cluster.url(nid) for nid in tls_cluster.ids)
    with open(tls_cluster.base / "worker-tls.log", "ab") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "raftsched", "worker", "--cluster", urls, "--queue", "tlsq",
             "--id", "w-tls", "--tls-ca", str(tls_cluster.tls.ca)],
            stdout=log, stderr=subprocess.STDOUT, env=tls_cluster.env)
    try:
        run_id = tls_cluster.api("n1", "POST", f"/v1/jobs/{job_id}:trigger").body["run_id"]

        def succeeded() -> dict | None:
            run = tls_cluster.api("n1", "GET", f"/v1/runs/{run_id}").body
            return run if run["state"] == "succeeded" else None

        run = wait_until(succeeded, 30, "the worker to run it over https")
        assert run["attempts"][0]["holder"] == "worker:w-tls"
    finally:
        worker.kill()
        worker.wait(10)


def node_args(*extra: str):
    return build_parser().parse_args(["node", "--id", "n1", "--http", "127.0.0.1:1",
                                      "--raft", "127.0.0.1:2", "--data", "/nonexistent",
                                      *extra])


def test_bad_tls_flags_are_refused_with_the_flag_named(tmp_path):
    files = make_tls_files(tmp_path / "pki")
    assert _tls_error(node_args("--tls-cert", str(files.cert), "--tls-key", str(files.key),
                                "--tls-ca", str(files.ca))) is None
    assert "go together" in _tls_error(node_args("--tls-cert", str(files.cert)))
    assert "go together" in _tls_error(node_args("--tls-key", str(files.key)))
    wrong_key = make_tls_files(tmp_path / "other").key
    assert "--tls-cert / --tls-key" in _tls_error(
        node_args("--tls-cert", str(files.cert), "--tls-key", str(wrong_key)))
    assert "--tls-ca" in _tls_error(node_args("--tls-ca", str(tmp_path / "missing.pem")))
    assert "https://" in _tls_error(
        node_args("--tls-cert", str(files.cert), "--tls-key", str(files.key),
                  "--advertise-http", "http://127.0.0.1:1"))
