"""The HTTP API in this process over one in-memory replica, for fast tests of
the handlers: no node process, no Raft. ReplicaPort is a node port
(raftsched/nodeport.py) whose proposals go through encode, apply and commit
at once (testing/replica.py), and are counted; api_client serves make_app
over it with aiohttp's test client on 127.0.0.1.

    async with api_client(ReplicaPort()) as client:
        response = await client.post("/v1/jobs", json={...})
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import Any, ContextManager

from aiohttp.test_utils import TestClient, TestServer

from raftsched import limits
from raftsched.api.app import make_app
from raftsched.core import keys
from raftsched.runtime.admission import ClientProposals
from raftsched.runtime.port import StoreQueries
from raftsched.testing.replica import Replica

# Late 2026, the cluster's time every proposal of a ReplicaPort is dated by.
NOW_MS = 1_796_000_000_000


class ReplicaPort(StoreQueries):
    """A node port over a replica, for the API's handlers: the one node of a
    cluster that is always caught up and never refuses for room."""

    def __init__(self, replica: Replica | None = None, *, quota: dict | None = None,
                 **config: object) -> None:
        """`config`: node settings in place of the defaults below (e.g.
        insecure_no_auth=False with an admin_token_sha256)."""
        self.replica = replica or Replica()
        super().__init__(self.replica.store)
        self.proposed: list[dict] = []
        self.node_id, self.shard_count = "n1", 16
        self.quota = quota or {"jobs_max": limits.tenant_jobs_max_default,
                               "creates_per_s": limits.tenant_creates_per_s_default,
                               "runs_concurrent_max": limits.tenant_runs_concurrent_max_default,
                               "weight": limits.tenant_weight_default}
        # Admitted and grouped as a node does (runtime/admission.py).
        self.client_proposals = ClientProposals(self.propose_entry)
        self.config = SimpleNamespace(**{
            "insecure_no_auth": True, "admin_token_sha256": None,
            "node_credential_sha256": None, "allow_target_cidrs": (), "allow_commands": False,
            "http_url": "http://127.0.0.1:1",
            "idempotency_ttl_s": limits.idempotency_ttl_s_default, **config})

    def now_ms(self) -> int:
        return NOW_MS

    def check_room(self) -> None:
        return None

    def draining(self) -> bool:
        return False

    def raft_position(self) -> tuple[str, int]:
        return "leader", self.applied_index()   # one replica: its own leader

    def shard_of(self, job_id: str) -> int:
        return keys.shard_of(job_id, self.shard_count)

    def quota_of(self, tenant: str) -> dict:
        return dict(self.quota)

    def forget_quota(self, tenant: str) -> None:
        return None

    def applied_index(self) -> int:
        return self.replica.index

    async def wait_caught_up(self, timeout_s: float = 0) -> None:
        return None

    async def propose(self, command: dict) -> dict:
        return await self.client_proposals.write(command)

    def admit(self, jobs: int, tenant: str) -> ContextManager[None]:
        return self.client_proposals.admit(jobs, tenant)

    async def propose_create(self, command: Any, body_bytes: int) -> dict:
        return await self.client_proposals.create(command, body_bytes)

    async def propose_batch(self, entries: list) -> list:
        return await self.client_proposals.batch(entries)

    async def propose_entry(self, command: Any) -> dict:
        """One entry, as a node's Raft would take it: encoded, applied, counted."""
        self.proposed.append(command)
        return self.replica.run(command)


@asynccontextmanager
async def api_client(port: ReplicaPort) -> AsyncIterator[TestClient]:
    async with TestClient(TestServer(make_app(port), host="127.0.0.1")) as client:
        yield client
