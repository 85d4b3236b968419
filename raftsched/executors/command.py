"""The command target executor: run argv in its own process group.

    await CommandExecutor().run(attempt, target, deadline_ms) -> Outcome

`target` is a validated command target (core/jobspec.py) plus
`non_retryable_exit_codes` (from the job's retry policy). No shell unless
`target["shell"]`; then argv is one script for `/bin/sh -c`. The child gets a
small environment (BASE_ENV_NAMES, with this process's values), the job's
env, and RAFTSCHED_* variables naming the run, which the job cannot override.
Nothing else of this process's environment reaches it: a node's or worker's
secrets and tokens (RAFTSCHED_RAFT_SECRET, RAFTSCHED_ADMIN_TOKEN,
RAFTSCHED_TOKEN, or whatever the operator set) stay out of commands. stdout
and stderr are read to the end (a child never blocks on a full pipe) and kept
up to `output_bytes_max` each; the kept text says how much was dropped.

On timeout, and when the awaiting task is cancelled, the whole process group
gets SIGTERM, then SIGKILL after `kill_grace_s`: grandchildren die too. A job
failure (exit code, timeout, a command that cannot start) is an Outcome;
cancellation re-raises CancelledError after the group is dead.

The command dies with the process that started it (a node or a worker), even
one killed by SIGKILL, so a retry elsewhere never runs beside a leftover copy.
Its group is led by a small shim (command_shim.py) that the kernel signals
when this process dies (Linux PR_SET_PDEATHSIG) and that then SIGKILLs the
group, grandchildren included, within milliseconds. The shim costs a Python
start-up per command (20 to 40 ms) and 4 MB of private memory while it runs.

Identity: with a `RunAs` (a node's or worker's --command-user NAME), the
command runs as that user, its groups and its home (HOME); the shim takes
that identity in the forked child just before exec, so the shim itself stays
this process's user; a command without `cwd` starts in the user's home (or
/). Without one the command runs as this process's user, in its folder.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import os
import pwd
import signal
import sys
import time
from typing import Callable

from raftsched import limits
from raftsched.core.timeutil import format_ms
from raftsched.executors.base import Attempt, Outcome, short_error, since_ms, wall_ms

# Run by path with `python -I -S`: it imports nothing of raftsched.
SHIM_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "command_shim.py")
# What a command inherits from the node or worker that starts it: where to
# find programs (PATH), a home and a temporary directory most programs expect
# (HOME, TMPDIR), and the locale and time zone it should print in (LANG,
# LC_ALL, TZ). None of these holds a secret; a job sets anything else in `env`.
BASE_ENV_NAMES = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "TZ")


# --command-user's value that runs commands as the node's or worker's own user.
SELF_USER = "self"


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunAs:
    """The identity commands run with: a user, its primary group, its
    supplementary groups, and its home directory (the command's HOME)."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str

    def shim_arg(self) -> str:
        return f"{self.uid}:{self.gid}:{','.join(str(g) for g in self.groups)}"


def resolve_command_user(name: str) -> RunAs | None:
    """The identity --command-user NAME asks for: None for `self` (this
    process's user). Raise ValueError, saying why, for a user that does not
    exist, for root, and for another user when this process cannot switch to
    it (it is not root)."""
    if name == SELF_USER:
        return None
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise ValueError(f"no user {name!r} on this machine (create an unprivileged user "
                         f"for commands, or pass --command-user={SELF_USER})") from None
    if entry.pw_uid == 0:
        raise ValueError(f"user {name!r} is root: commands would hold every power of the "
                         f"machine; name an unprivileged user")
    if entry.pw_uid == os.geteuid():
        return None   # this process's own user: nothing to switch (as `self`)
    if os.geteuid() != 0:
        raise ValueError(f"this process runs as uid {os.geteuid()}, not root, so it cannot "
                         f"start commands as {name!r} (uid {entry.pw_uid}); start it as root "
                         f"(it runs commands as {name!r}), or pass --command-user={SELF_USER}")
    groups = tuple(sorted(set(os.getgrouplist(name, entry.pw_gid))))
    return RunAs(name=name, uid=entry.pw_uid, gid=entry.pw_gid, groups=groups,
                 home=entry.pw_dir)


class _Capture:
    """Read a stream to its end, keeping the first `limit` bytes."""

    def __init__(self, name: str, limit: int) -> None:
        self.name = name
        self.limit = limit
        self.kept = bytearray()
        self.dropped = 0

    async def read(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(65536):
            room = self.limit - len(self.kept)
            self.kept += chunk[:max(room, 0)]
            self.dropped += max(len(chunk) - max(room, 0), 0)

    def text(self) -> str:
        text = self.kept.decode("utf-8", "replace")
        if self.dropped:
            text += (f"\n[raftsched: {self.dropped} bytes of {self.name} dropped over "
                     f"output_bytes_max={self.limit}]")
        return text


class CommandExecutor:
    def __init__(self, *, output_bytes_max: int = limits.output_bytes_max,
                 kill_grace_s: float = limits.command_kill_grace_s,
                 base_env: dict[str, str] | None = None,
                 now_ms: Callable[[], int] = wall_ms, run_as: RunAs | None = None) -> None:
        self._output_bytes_max = output_bytes_max
        self.run_as = run_as
        # Deadlines are instants on this clock: its node's (the cluster's time).
        self._now_ms = now_ms
        self._kill_grace_s = kill_grace_s
        self._base_env = base_env if base_env is not None else {
            name: os.environ[name] for name in BASE_ENV_NAMES if name in os.environ}
        if run_as is not None:
            self._base_env["HOME"] = run_as.home   # its own home, not this process's

    def environment(self, attempt: Attempt, target: dict) -> dict[str, str]:
        env = dict(self._base_env)
        env.update(target.get("env") or {})
        env.update({
            "RAFTSCHED_EXECUTION_ID": attempt.execution_id,
            "RAFTSCHED_JOB_ID": attempt.job_id,
            "RAFTSCHED_RUN_ID": attempt.run_id,
            "RAFTSCHED_SCHEDULED_FOR": format_ms(attempt.scheduled_ms) or "",
            "RAFTSCHED_ATTEMPT": str(attempt.attempt),
            "RAFTSCHED_FENCING_TOKEN": str(attempt.fencing_token),
        })
        return env

    async def run(self, attempt: Attempt, target: dict, deadline_ms: int) -> Outcome:
        started = time.monotonic()
        timeout_s = max(0.001, min(target["timeout_s"], (deadline_ms - self._now_ms()) / 1000))
        status_read, status_write = os.pipe()
        try:
            proc = await self._spawn(attempt, target, status_write)
        except (FileNotFoundError, PermissionError, NotADirectoryError) as exc:
            os.close(status_read)
            return _cannot_start(exc, started)
        finally:
            os.close(status_write)
        with open(status_read, "rb", buffering=0) as status:
            timed_out, out, err = await self._wait(proc, timeout_s)
            exec_error = _exec_error(status)
        if exec_error is not None:
            return _cannot_start(exec_error, started)
        return self._outcome(proc.returncode, timed_out, timeout_s, out, err, target,
                             since_ms(started))

    async def _spawn(self, attempt: Attempt, target: dict,
                     status_fd: int) -> asyncio.subprocess.Process:
        """Start the command under the shim (command_shim.py), as the leader of
        a new process group: the shim kills that group if this process dies,
        even by SIGKILL. The fork happens on this thread, the event loop's, which
        lives as long as the process (the kernel's death signal follows the
        forking thread; the shim checks that the whole process is gone)."""
        argv = ["/bin/sh", "-c", target["argv"][0]] if target.get("shell") else target["argv"]
        env = self.environment(attempt, target)
        shim = [sys.executable, "-I", "-S", SHIM_PATH, str(status_fd), str(os.getpid()),
                "1" if "LC_CTYPE" in env else "0",
                self.run_as.shim_arg() if self.run_as is not None else "-"]
        return await asyncio.create_subprocess_exec(
            *shim, *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, cwd=target.get("cwd") or self._default_cwd(), env=env,
            start_new_session=True, pass_fds=(status_fd,))

    def _default_cwd(self) -> str | None:
        """Where a command without `cwd` starts: this process's own folder, or,
        as another user, that user's home (/ when it has none), rather than a
        folder of this process's it may not enter."""
        if self.run_as is None:
            return None
        return self.run_as.home if os.path.isdir(self.run_as.home) else "/"

    async def _wait(self, proc: asyncio.subprocess.Process,
                    timeout_s: float) -> tuple[bool, "_Capture", "_Capture"]:
        """Read the output and wait for the group's leader; on timeout or cancel
        kill the group. Return (timed out, stdout, stderr)."""
        out = _Capture("stdout", self._output_bytes_max)
        err = _Capture("stderr", self._output_bytes_max)
        readers = asyncio.gather(out.read(proc.stdout), err.read(proc.stderr))  # type: ignore
        timed_out = False
        try:
            await asyncio.wait_for(asyncio.shield(self._finish(proc, readers)), timeout_s)
        except asyncio.TimeoutError:
            timed_out = True
            await self._kill_group(proc, readers)
        except asyncio.CancelledError:
            await self._kill_group(proc, readers)
            raise
        finally:
            if proc.returncode is None:   # an unexpected error: leave nothing behind
                await self._kill_group(proc, readers)
        return timed_out, out, err

    @staticmethod
    async def _finish(proc: asyncio.subprocess.Process, readers: asyncio.Future) -> None:
        await readers
        await proc.wait()

    async def _kill_group(self, proc: asyncio.subprocess.Process,
                          readers: asyncio.Future) -> None:
        self._signal_group(proc, signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.shield(proc.wait()), self._kill_grace_s)
        except asyncio.TimeoutError:
            pass
        # The leader may have exited on TERM while its children ignored it.
        self._signal_group(proc, signal.SIGKILL)
        await proc.wait()
        try:
            await asyncio.wait_for(asyncio.shield(readers), limits.pipe_drain_after_kill_s)
        except asyncio.TimeoutError:
            readers.cancel()

    @staticmethod
    def _signal_group(proc: asyncio.subprocess.Process, sig: int) -> None:
        try:
            os.killpg(proc.pid, sig)   # start_new_session: the group id is the pid
        except (ProcessLookupError, PermissionError):
            pass

    @staticmethod
    def _outcome(code: int | None, timed_out: bool, timeout_s: float, out: _Capture,
                 err: _Capture, target: dict, duration_ms: int) -> Outcome:
        output = {"stdout": out.text(), "stderr": err.text(),
                  "truncated": {"stdout": out.dropped, "stderr": err.dropped}}
        if timed_out:
            return Outcome(ok=False, retryable=True, output=output, duration_ms=duration_ms,
                           error=f"timed out after {timeout_s:g} s; process group killed")
        assert code is not None
        if code == 0:
            return Outcome(ok=True, exit_code=0, output=output, duration_ms=duration_ms)
        if code < 0:
            return Outcome(ok=False, exit_code=code, output=output, duration_ms=duration_ms,
                           error=f"killed by {signal.Signals(-code).name}")
        last = err.kept.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
        return Outcome(ok=False, exit_code=code, output=output, duration_ms=duration_ms,
                       retryable=code not in (target.get("non_retryable_exit_codes") or ()),
                       error=short_error(f"exit code {code}" + (f": {last[0]}" if last[0] else "")))


def _exec_error(status: io.FileIO) -> OSError | None:
    """What the shim reported on its status pipe, read once the shim has exited:
    nothing when the command was exec'd (its copy closed at exec), else why
    the exec failed."""
    os.set_blocking(status.fileno(), False)
    report = status.read(4096)   # None if still held open (a shim killed early)
    if not report:
        return None
    code, strerror, filename = report.decode("utf-8", "replace").split("\0", 2)
    return OSError(int(code), strerror, filename)   # FileNotFoundError for ENOENT, ...


def _cannot_start(exc: OSError, started: float) -> Outcome:
    """A missing executable, working directory or permission will be missing on
    the next attempt too; another exec error (e.g. too many processes) may not."""
    permanent = isinstance(exc, (FileNotFoundError, PermissionError, NotADirectoryError))
    return Outcome(ok=False, retryable=not permanent, duration_ms=since_ms(started),
                   error=short_error(f"cannot start command: {exc}"))
