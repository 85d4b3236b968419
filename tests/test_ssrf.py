"""HTTP targets and webhooks reach public addresses only unless allowed, and follow no redirect."""

from __future__ import annotations

import datetime as dt
import os
import socket
import subprocess
import sys
import time

import pytest
from aiohttp.abc import AbstractResolver, ResolveResult

from raftsched import limits
from raftsched.executors.base import Attempt
from raftsched.executors.http import HttpExecutor
from raftsched.executors.netguard import (AddressPolicy, AddressRefused, GuardedResolver,
                                          guarded_socket_factory)
from raftsched.testing.cluster import LocalCluster
from raftsched.testing.http import wait_until
from raftsched.testing.sink import Sink

DEFAULT = AddressPolicy()
LOOPBACK = AddressPolicy.parse(["127.0.0.0/8"])
ATTEMPT = Attempt(run_id="run_1", job_id="job_1", execution_id="exe_1",
                  scheduled_ms=1_796_000_000_000, attempt=1, fencing_token=0)

REFUSED = {
    "0.0.0.0": "unspecified", "0.1.2.3": "unspecified", "127.0.0.1": "loopback",
    "127.255.0.9": "loopback", "10.1.2.3": "private", "172.16.0.1": "private",
    "172.31.255.255": "private", "192.168.1.1": "private", "169.254.169.254": "link-local",
    "100.64.0.1": "shared address space", "100.100.100.200": "shared address space",
    "224.0.0.1": "multicast", "255.255.255.255": "reserved or broadcast",
    "::": "unspecified", "::1": "loopback", "fe80::1": "link-local",
    "fe80::1%eth0": "link-local", "fc00::1": "unique local", "fd12:3456::1": "unique local",
    "ff02::1": "multicast", "fec0::1": "site-local",
}
PUBLIC = ["8.8.8.8", "93.184.216.34", "172.32.0.1", "100.128.0.1", "2606:4700::1111",
          "::ffff:8.8.8.8"]


# --- the policy ------------------------------------------------------------------------

@pytest.mark.parametrize("address", sorted(REFUSED))
def test_internal_addresses_are_refused_by_default(address):
    assert DEFAULT.refusal(address) == REFUSED[address]


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses_are_allowed(address):
    assert DEFAULT.refusal(address) is None


@pytest.mark.parametrize("address,inner", [
    ("::ffff:127.0.0.1", "127.0.0.1"), ("::ffff:169.254.169.254", "169.254.169.254"),
    ("::127.0.0.1", "127.0.0.1"), ("64:ff9b::10.0.0.1", "10.0.0.1")])
def test_ipv6_forms_of_ipv4_are_judged_by_the_ipv4_address(address, inner):
    reason = DEFAULT.refusal(address)
    assert reason is not None and reason.endswith(f"it reaches IPv4 {inner}")


@pytest.mark.parametrize("url", [
    "http://127.0.0.1/", "http://2130706433/", "http://0x7f000001/", "http://0177.0.0.1/",
    "http://127.1:8080/x", "http://0x7f.1/", "http://[::1]:8080/", "http://[::ffff:127.0.0.1]/",
    "http://[::ffff:7f00:1]/", "https://localhost/", "http://LOCALHOST./", "http://a.b.localhost/",
    "http://user@127.0.0.1:80/", "http://%31%32%37.0.0.1/"])
def test_every_spelling_of_loopback_is_refused_and_allowed_by_its_range(url):
    refused = DEFAULT.url_refusal(url)
    assert isinstance(refused, AddressRefused), url
    assert "loopback" in str(refused) and "--allow-target-cidr" in str(refused)
    assert AddressPolicy.parse(["127.0.0.0/8", "::1/128"]).url_refusal(url) is None


def test_a_form_only_the_c_library_reads_is_named_with_its_address():
    assert str(DEFAULT.url_refusal("http://2130706433/")).startswith(
        "2130706433 is another form of the address 127.0.0.1, which is refused (loopback)")
    assert str(DEFAULT.url_refusal("http://localhost./")).startswith(
        "localhost. is a name for 127.0.0.1, which is refused (loopback)")


def test_names_and_public_literals_pass_at_create():
    for url in ("https://example.com/hook", "http://93.184.216.34/", "http://[2606:4700::1111]/",
                "http://localhost.example.com/", "http://127.0.0.1.nip.io/"):
        assert DEFAULT.url_refusal(url) is None, url


def test_an_allowed_range_opens_that_range_only():
    policy = AddressPolicy.parse(["10.20.0.0/16", "fd00::/8"])
    assert policy.refusal("10.20.3.4") is None
    assert policy.refusal("::ffff:10.20.3.4") is None
    assert policy.refusal("fd00::5") is None
    assert policy.refusal("10.21.0.1") == "private"
    assert policy.refusal("127.0.0.1") == "loopback"
    assert LOOPBACK.refusal("::1") == "loopback"   # 127.0.0.0/8 is IPv4 loopback only


@pytest.mark.parametrize("cidr", ["127.0.0.1/8", "10.0.0.0/33", "localhost", ""])
def test_a_cidr_that_is_not_a_network_is_refused_naming_it(cidr):
    with pytest.raises(ValueError, match="not a network in CIDR form"):
        AddressPolicy.parse([cidr])


def test_the_node_refuses_to_start_with_a_bad_cidr(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "raftsched", "node", "--id", "n1", "--http", "127.0.0.1:0",
         "--raft", "127.0.0.1:1", "--data", str(tmp_path), "--allow-target-cidr", "10.0.0.0/8",
         "--allow-target-cidr", "10.0.0.1/8"],
        capture_output=True, text=True, timeout=60,
        env=dict(os.environ, RAFTSCHED_ADMIN_TOKEN="t" * 32))
    assert result.returncode == 2, result.stderr
    assert "--allow-target-cidr: '10.0.0.1/8' is not a network" in result.stderr


# --- resolution and connection ---------------------------------------------------------

class MapResolver(AbstractResolver):
    """Names this test maps, in place of DNS."""

    def __init__(self, names: dict[str, list[str]]) -> None:
        self.names = names

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        return [{"hostname": host, "host": a, "port": port, "family": socket.AF_INET,
                 "proto": 0, "flags": socket.AI_NUMERICHOST} for a in self.names[host]]

    async def close(self) -> None:
        pass


async def test_a_name_resolving_to_refused_addresses_only_is_refused_naming_both():
    resolver = GuardedResolver(DEFAULT, MapResolver({"rebind.test": ["127.0.0.1", "10.0.0.7"]}))
    with pytest.raises(AddressRefused, match=r"^rebind.test resolves to 127.0.0.1, which is "
                                             r"refused \(loopback\)"):
        await resolver.resolve("rebind.test", 80)


async def test_a_name_with_some_refused_addresses_keeps_only_the_others():
    resolver = GuardedResolver(DEFAULT, MapResolver({"mixed.test": ["127.0.0.1", "8.8.8.8"]}))
    kept = await resolver.resolve("mixed.test", 80)
    assert [r["host"] for r in kept] == ["8.8.8.8"]


def test_the_socket_factory_refuses_the_address_being_connected():
    make = guarded_socket_factory(DEFAULT)
    with pytest.raises(AddressRefused, match="address 169.254.169.254 is refused"):
        make((socket.AF_INET, socket.SOCK_STREAM, 6, "", ("169.254.169.254", 80)))
    sock = guarded_socket_factory(LOOPBACK)(
        (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", 80)))
    sock.close()


async def call(policy: AddressPolicy, url: str):
    executor = HttpExecutor(policy)
    await executor.start()
    try:
        return await executor.run(ATTEMPT, {"type": "http", "url": url, "method": "POST",
                                            "headers": {}, "body": None, "timeout_s": 5.0},
                                  int(time.time() * 1000) + 5000)
    finally:
        await executor.close()


async def test_the_executor_refuses_literals_and_names_not_retryably_calling_nothing():
    with Sink() as sink:
        port = sink.url.split(":")[2].split("/")[0]
        literal = await call(DEFAULT, sink.url)
        named = await call(DEFAULT, f"http://localhost:{port}/hook")
        hexed = await call(DEFAULT, f"http://0x7f000001:{port}/hook")
        assert sink.snapshot() == []
        allowed = await call(LOOPBACK, f"http://localhost:{port}/hook")   # the control
        assert len(sink.snapshot()) == 1
    assert allowed.ok
    for outcome in (literal, named, hexed):
        assert not outcome.ok
        assert outcome.retryable is False
        assert outcome.http_status is None
    assert literal.error.startswith("address 127.0.0.1 is refused (loopback)")
    # On hosts where localhost is also ::1, either may be named: both are loopback.
    assert named.error.startswith("localhost resolves to ")
    assert "which is refused (loopback)" in named.error
    assert "127.0.0.1" in hexed.error and "refused (loopback)" in hexed.error


async def test_the_executor_does_not_follow_a_redirect():
    with Sink() as target, Sink(status_for=lambda c: 302,
                                headers_for=lambda c: {"Location": target.url}) as redirector:
        outcome = await call(LOOPBACK, redirector.url)
        assert len(redirector.snapshot()) == 1
        assert target.snapshot() == []
    assert not outcome.ok
    assert outcome.http_status == 302
    assert outcome.retryable is False
    assert outcome.error.startswith(f"HTTP 302, a redirect (not followed) to {target.url}")


# --- through a cluster -----------------------------------------------------------------

def soon(seconds: float) -> str:
    at = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=seconds)
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def job(url: str, **more) -> dict:
    return {"run_at": soon(3600), "target": {"type": "http", "url": url}, **more}


def assert_refused(response, field: str) -> None:
    assert response.status == 400, response
    assert response.body["field"] == field, response.body
    assert "refused" in response.body["detail"], response.body


@pytest.fixture
def one_node(tmp_path):
    """Starts a one-node cluster; its log is printed (shown on failure) and it is killed."""
    clusters: list[LocalCluster] = []

    def start(**options) -> LocalCluster:
        cluster = LocalCluster(tmp_path / f"c{len(clusters)}", nodes=1, **options)
        clusters.append(cluster)
        cluster.start()
        cluster.wait_ready()
        return cluster

    yield start
    for cluster in clusters:
        print(cluster.logs("n1"))
        cluster.close()


@pytest.mark.integration
def test_a_cluster_refuses_internal_literals_and_webhooks_at_create(one_node):
    cluster = one_node(allow_loopback_targets=False)
    for url in ("http://127.0.0.1:8080/", "http://2130706433/", "http://0x7f000001/",
                "http://0177.0.0.1/", "http://[::1]/", "http://[::ffff:127.0.0.1]/",
                "http://localhost:8080/", "http://api.localhost/", "http://10.0.0.8/",
                "http://169.254.169.254/latest/meta-data/"):
        assert_refused(cluster.api("n1", "POST", "/v1/jobs", job(url)), "target.url")
    webhook = job("http://sink.invalid/hook",
                  alert={"webhook_url": "http://169.254.169.254/alert"})
    assert_refused(cluster.api("n1", "POST", "/v1/jobs", webhook), "alert.webhook_url")
    batch = cluster.api("n1", "POST", "/v1/jobs:batchCreate",
                        {"jobs": [job("http://sink.invalid/a"), job("http://[fe80::1]/")]})
    assert "job_id" in batch.body["results"][0], batch.body
    assert batch.body["results"][1]["error"]["field"] == "target.url", batch.body
    # A name is judged when called, so it passes; changing it to a literal does not.
    created = cluster.api("n1", "POST", "/v1/jobs", job("http://sink.invalid/hook"))
    assert created.status == 201, created
    patched = cluster.api("n1", "PATCH", f"/v1/jobs/{created.body['job_id']}",
                          {"target": {"type": "http", "url": "http://192.168.0.1/"}})
    assert_refused(patched, "target.url")


def only_run(cluster, job_id: str, test) -> dict:
    def check() -> dict | None:
        runs = cluster.api("n1", "GET", f"/v1/jobs/{job_id}/runs").body["runs"]
        return runs[0] if len(runs) == 1 and test(runs[0]) else None
    return wait_until(check, 30, f"the run of {job_id} to settle")


@pytest.mark.integration
def test_a_cluster_follows_no_redirect_and_refuses_a_loopback_name_at_call(one_node):
    cluster = one_node()
    with Sink() as target, Sink(status_for=lambda c: 302,
                                headers_for=lambda c: {"Location": target.url}) as redirector:
        retry = {"max_attempts": 3, "base_s": 0.2, "max_s": 0.2}
        redirected = cluster.api("n1", "POST", "/v1/jobs", {
            "run_at": soon(1), "target": {"type": "http", "url": redirector.url},
            "retry": retry, "alert": {"webhook_url": redirector.url + "?alert"}}).body["job_id"]
        run = only_run(cluster, redirected, lambda r: r["alert"] == "undeliverable")
        assert run["state"] == "failed"
        assert len(run["attempts"]) == 1   # a redirect is not retried
        assert run["error"].startswith("HTTP 302, a redirect (not followed) to http://127.0.0.1")
        assert [c.path for c in redirector.snapshot()] == ["/hook", "/hook?alert"]
        # A loopback name allowed when the job was created is refused once the
        # node no longer allows loopback: it is judged at the call.
        port = target.url.split(":")[2].split("/")[0]
        named = cluster.api("n1", "POST", "/v1/jobs", job(f"http://localhost:{port}/hook",
                                                          retry=retry)).body["job_id"]
        cluster.stop("n1")
        cluster.allow_loopback_targets = False
        cluster.start("n1")
        cluster.wait_ready()
        assert cluster.api("n1", "POST", f"/v1/jobs/{named}:trigger").status == 201
        run = only_run(cluster, named, lambda r: r["state"] == "failed")
        assert len(run["attempts"]) == 1   # not retried
        assert run["error"].startswith("localhost resolves to ")
        assert "which is refused (loopback)" in run["error"]
        assert target.snapshot() == []


def test_a_host_judged_callable_is_remembered_and_a_refused_one_is_judged_each_time():
    policy = AddressPolicy.parse(("127.0.0.0/8",))
    policy.check_url("http://127.0.0.1:8080/a")
    policy.check_url("http://127.0.0.1:8080/b")
    assert policy._callable_hosts == {"127.0.0.1"}
    for _ in range(2):   # a new refusal each time, naming the address
        with pytest.raises(AddressRefused, match="10.0.0.1"):
            policy.check_url("http://10.0.0.1/x")
    assert policy._callable_hosts == {"127.0.0.1"}


def test_a_host_is_judged_once_at_create_and_the_memory_is_bounded(monkeypatch):
    """url_refusal remembers each host's answer (the host's text alone decides
    it), at most callable_hosts_known_max of them."""
    policy = AddressPolicy()
    judged: list[str] = []
    judge = policy.host_refusal

    def counting(host: str):
        judged.append(host)
        return judge(host)

    monkeypatch.setattr(policy, "host_refusal", counting)
    for path in ("a", "b", "c"):
        assert policy.url_refusal(f"http://10.0.0.1/{path}") is not None
        assert policy.url_refusal(f"https://hooks.example.com/{path}") is None
    assert judged == ["10.0.0.1", "hooks.example.com"]
    monkeypatch.setattr(limits, "callable_hosts_known_max", 2)
    policy.url_refusal("https://other.example.com/x")
    assert len(policy._host_refusals) <= 2
    assert policy.url_refusal("http://10.0.0.1/d") is not None
