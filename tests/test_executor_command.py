"""The command executor: environment, exit codes, output bounds, and that
timeout, cancel and the death of the process that started it kill the whole
process group."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import pytest

from raftsched.executors.base import Attempt
from raftsched.executors.command import CommandExecutor

ATTEMPT = Attempt(run_id="run_1", job_id="job_1", execution_id="exe_abc",
                  scheduled_ms=1_796_000_000_000, attempt=2, fencing_token=7)


def target(*argv: str, shell: bool = False, **over) -> dict:
    t = {"type": "command", "argv": list(argv), "env": {}, "cwd": None, "timeout_s": 10.0,
         "queue": "default", "shell": shell, "non_retryable_exit_codes": []}
    t.update(over)
    return t


def far() -> int:
    return int(time.time() * 1000) + 60_000


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


async def wait_for_file(path, timeout_s: float = 5.0) -> str:
    deadline = time.monotonic() + timeout_s
    while not (path.exists() and path.read_text().strip()):
        assert time.monotonic() < deadline, f"{path} never written"
        await asyncio.sleep(0.01)
    return path.read_text()


async def until_gone(pid: int, what: str) -> None:
    deadline = time.monotonic() + 5
    while not gone(pid):
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)


async def test_success_captures_stdout_and_names_the_run_in_the_environment():
    out = await CommandExecutor().run(
        ATTEMPT, target("sh", "-c", "env | grep -E '^(RAFTSCHED_|JOBVAR)' | sort",
                        env={"JOBVAR": "x", "PATH": os.environ["PATH"]}), far())
    assert out.ok
    assert out.exit_code == 0
    env = dict(line.split("=", 1) for line in out.output["stdout"].splitlines())
    assert env == {"JOBVAR": "x", "RAFTSCHED_ATTEMPT": "2", "RAFTSCHED_EXECUTION_ID": "exe_abc",
                   "RAFTSCHED_FENCING_TOKEN": "7", "RAFTSCHED_JOB_ID": "job_1",
                   "RAFTSCHED_RUN_ID": "run_1",
                   "RAFTSCHED_SCHEDULED_FOR": env["RAFTSCHED_SCHEDULED_FOR"]}
    assert env["RAFTSCHED_SCHEDULED_FOR"].startswith("2026-")


async def test_no_shell_unless_asked():
    literal = await CommandExecutor().run(ATTEMPT, target("echo", "$HOME"), far())
    assert literal.output["stdout"] == "$HOME\n"
    expanded = await CommandExecutor(base_env={"HOME": "/h", "PATH": os.environ["PATH"]}).run(
        ATTEMPT, target("echo $HOME", shell=True), far())
    assert expanded.output["stdout"] == "/h\n"


async def test_cwd_and_exit_codes(tmp_path):
    out = await CommandExecutor().run(ATTEMPT, target("pwd", cwd=str(tmp_path)), far())
    assert out.output["stdout"].strip() == str(tmp_path)
    failed = await CommandExecutor().run(ATTEMPT, target("echo bad >&2; exit 3", shell=True),
                                         far())
    assert (failed.ok, failed.exit_code, failed.retryable) == (False, 3, True)
    assert failed.error == "exit code 3: bad"
    listed = await CommandExecutor().run(
        ATTEMPT, target("exit 3", shell=True, non_retryable_exit_codes=[3]), far())
    assert listed.retryable is False


async def test_a_command_that_cannot_start_is_not_retryable(tmp_path):
    missing = await CommandExecutor().run(ATTEMPT, target("/no/such/binary"), far())
    assert (missing.ok, missing.retryable) == (False, False)
    assert "cannot start" in missing.error
    bad_cwd = await CommandExecutor().run(ATTEMPT, target("true", cwd=str(tmp_path / "x")),
                                          far())
    assert bad_cwd.retryable is False


async def test_timeout_kills_the_process_group_with_its_grandchildren(tmp_path):
    pid_file = tmp_path / "pid"
    out = await CommandExecutor(kill_grace_s=0.5).run(
        ATTEMPT, target(f"sleep 60 & echo $! > {pid_file}; wait", shell=True, timeout_s=0.5),
        far())
    assert out.ok is False
    assert out.retryable is True
    assert "timed out after 0.5 s" in out.error
    await until_gone(int(pid_file.read_text()), "the grandchild outlived the timeout")


async def test_a_group_ignoring_sigterm_is_killed_after_the_grace():
    started = time.monotonic()
    out = await CommandExecutor(kill_grace_s=0.3).run(
        ATTEMPT, target("trap '' TERM; sleep 60 & wait", shell=True, timeout_s=0.3), far())
    assert "timed out" in out.error
    assert time.monotonic() - started < 5


async def test_cancel_kills_the_group_and_reraises(tmp_path):
    pid_file = tmp_path / "pid"
    task = asyncio.ensure_future(CommandExecutor(kill_grace_s=0.5).run(
        ATTEMPT, target(f"sleep 60 & echo $! > {pid_file}; wait", shell=True), far()))
    grandchild = int(await wait_for_file(pid_file))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await until_gone(grandchild, "the grandchild outlived the cancel")


async def test_output_over_the_limit_is_cut_and_says_so():
    out = await CommandExecutor(output_bytes_max=1000).run(
        ATTEMPT, target("head -c 5000 /dev/zero | tr '\\0' a; head -c 10 /dev/zero >&2",
                        shell=True), far())
    assert out.ok
    assert out.output["stdout"].startswith("a" * 1000 + "\n[raftsched: 4000 bytes of stdout "
                                           "dropped over output_bytes_max=1000]")
    assert out.output["truncated"] == {"stdout": 4000, "stderr": 0}


async def test_megabytes_of_output_do_not_block_the_child():
    out = await CommandExecutor(output_bytes_max=100).run(
        ATTEMPT, target("head -c 20000000 /dev/zero", shell=True, timeout_s=20), far())
    assert out.ok
    assert out.output["truncated"]["stdout"] == 20_000_000 - 100


async def test_the_environment_is_exactly_the_one_chosen():
    # The shim is a Python process; Python sets LC_CTYPE under a C locale
    # (PEP 538), which must not reach the command.
    out = await CommandExecutor(base_env={"PATH": os.environ["PATH"]}).run(
        ATTEMPT, target("env"), far())
    names = {line.split("=", 1)[0] for line in out.output["stdout"].splitlines()}
    assert names == {"PATH", "RAFTSCHED_ATTEMPT", "RAFTSCHED_EXECUTION_ID",
                     "RAFTSCHED_FENCING_TOKEN", "RAFTSCHED_JOB_ID", "RAFTSCHED_RUN_ID",
                     "RAFTSCHED_SCHEDULED_FOR"}


async def test_a_command_killed_by_a_signal_says_which():
    out = await CommandExecutor().run(ATTEMPT, target("kill -KILL $$", shell=True), far())
    assert (out.ok, out.exit_code, out.error) == (False, -9, "killed by SIGKILL")


async def test_a_command_gets_default_signal_handling():
    # Python ignores SIGPIPE and SIGXFSZ; a command must not inherit that.
    out = await CommandExecutor().run(ATTEMPT, target("grep", "SigIgn", "/proc/self/status"),
                                      far())
    ignored = int(out.output["stdout"].split()[1], 16)
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        assert not ignored & (1 << (sig - 1)), sig.name


# A process that starts one command and waits; the test SIGKILLs it.
STARTER = """
import asyncio, sys, time
from raftsched.executors.base import Attempt
from raftsched.executors.command import CommandExecutor

script = sys.argv[1]
attempt = Attempt(run_id="run_1", job_id="job_1", execution_id="exe_1", scheduled_ms=0,
                  attempt=1, fencing_token=1)
target = {"type": "command", "argv": [script], "env": {}, "cwd": None, "timeout_s": 120.0,
          "queue": "default", "shell": True, "non_retryable_exit_codes": []}

async def main():
    await CommandExecutor().run(attempt, target, int(time.time() * 1000) + 120_000)

if sys.argv[2] == "uvloop":
    import uvloop
    uvloop.run(main())
else:
    asyncio.run(main())
"""


def wait_pids(path, count: int, timeout_s: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while True:
        lines = path.read_text().split() if path.exists() else []
        if len(lines) >= count:
            return [int(p) for p in lines[:count]]
        assert time.monotonic() < deadline, f"{path} never got {count} pids"
        time.sleep(0.01)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_killing_the_starter_kills_a_shell_commands_grandchild(tmp_path, loop):
    pids = tmp_path / "pids"
    # The shell records its parent (the shim), itself, and its child `sleep`.
    script = f"sleep 60 & echo $PPID $$ $! > {pids}.tmp; mv {pids}.tmp {pids}; wait"
    starter = subprocess.Popen([sys.executable, "-c", STARTER, script, loop])
    try:
        shim, shell, grandchild = wait_pids(pids, 3)
        assert not any(gone(pid) for pid in (shim, shell, grandchild))
        starter.kill()
        starter.wait(10)
        deadline = time.monotonic() + 1.0
        while not all(gone(pid) for pid in (shim, shell, grandchild)):
            assert time.monotonic() < deadline, "the command outlived its starter by 1 s"
            time.sleep(0.01)
    finally:
        starter.kill()
        starter.wait(10)
        for pid in wait_pids(pids, 3, timeout_s=0) if pids.exists() else ():
            try:
                os.kill(pid, signal.SIGKILL)   # never leave one behind, even on failure
            except ProcessLookupError:
                pass
