"""`raftsched worker` finds its nodes as every other command does: `--cluster`,
else the environment's RAFTSCHED_URL (what `raftsched dev` prints); with
neither it says so and exits 2. No node is started: the worker is pointed at
a closed port and stopped once it says which nodes it serves."""

from __future__ import annotations

import asyncio
import os
import sys

from raftsched.testing.cluster import free_ports


async def test_without_nodes_the_worker_says_where_it_looks_and_exits_2():
    env = {k: v for k, v in os.environ.items() if k != "RAFTSCHED_URL"}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "raftsched", "worker", "--queue", "q1", env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 2
    assert "--cluster (or env RAFTSCHED_URL)" in err.decode()


async def test_the_worker_serves_the_nodes_raftsched_url_names():
    urls = ",".join(f"http://127.0.0.1:{port}" for port in free_ports(2))
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "raftsched", "worker", "--queue", "q1",
        env=dict(os.environ, RAFTSCHED_URL=urls, RAFTSCHED_TOKEN="t"),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    try:
        assert process.stderr is not None
        while True:
            line = (await asyncio.wait_for(process.stderr.readline(), 60)).decode()
            assert line, "the worker exited before it said which nodes it serves"
            if "serving queue q1" in line:
                break
        assert urls.replace(",", ", ") in line
    finally:
        process.kill()
        await process.wait()
