"""What `raftsched dev` prints for a user to paste works as printed: each
`curl` line of its banner that sends a body, run by bash against an
in-process node (the banner's port is that node's), is answered 2xx, and the
grant of commands takes effect. The grant line once sent its JSON without a
Content-Type, which the API refuses (415)."""

from __future__ import annotations

import asyncio
import os
import re
import shutil

import pytest

from raftsched.runtime.dev import banner
from raftsched.testing.inprocess import ReplicaPort, api_client

pytestmark = pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")


def curl_lines(lines: list[str]) -> list[str]:
    """The curl command of each banner line that offers one, as a user copies it."""
    found = []
    for line in lines:
        match = re.search(r"curl .*?(?=\s{2,}\(|$)", line)
        if match:
            found.append(match.group(0).strip())
    return found


async def run_bash(command: str, env: dict[str, str]) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        "bash", "-c", command + " -s -o /dev/stderr -w '%{http_code}'",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, env=env)
    out, _ = await process.communicate()
    return process.returncode or 0, out.decode()


async def test_each_curl_line_of_the_banner_that_sends_a_body_works_as_printed():
    port = ReplicaPort()
    async with api_client(port) as client:
        http_base = client.port
        lines = banner(3, "/tmp/x/.raftsched", http_base, "the-token")
        commands_ = [c for c in curl_lines(lines) if " -d " in c]
        assert len(commands_) == 1   # the grant of commands
        assert not (await (await client.get("/v1/tenants/default")).json()).get("commands")
        env = dict(os.environ, RAFTSCHED_TOKEN="the-token")
        for command in commands_:
            code, status = await run_bash(command, env)
            assert code == 0 and status.startswith("2"), (command, status)
        tenant = await (await client.get("/v1/tenants/default")).json()
        assert tenant["commands"] is True
