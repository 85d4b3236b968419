"""The first process of every command target: it takes the command's whole
process group down with it when the process that started it dies.

    python -I -S command_shim.py STATUS_FD STARTER_PID KEEP_LC_CTYPE RUN_AS ARGV...

executors/command.py starts it in a new session, so it leads the command's
process group, with the command's environment and working directory. It then:

1. asks the kernel (Linux prctl PR_SET_PDEATHSIG) for SIGTERM when its starter
   dies, and checks the starter is still its parent (it may have died before);
   elsewhere it looks at its parent pid every `parent_poll_s` instead;
2. forks the command, which stays in the group, takes the identity RUN_AS
   names ("UID:GID:GROUP,GROUP...", supplementary groups first, then the
   group, then the user; "-" keeps the shim's own), and execs it; an
   identity change or exec that fails writes "errno NUL strerror NUL
   filename" to STATUS_FD, whose other end
   the executor reads, so "cannot start" stays distinct from an exit code;
3. waits for the command and ends with its exit status, or by the signal that
   killed it, so the executor sees what it would see without the shim.

SIGTERM (and the other terminating signals) reach the shim as well as the
command when the executor signals the group on timeout or cancel: the shim
rides them out and waits for the command, so the grace period before SIGKILL
still belongs to the command. A SIGTERM that arrives once the starter is gone
(its parent pid changed: the kernel re-parents the shim before it sends the
death signal) is the death signal: the shim SIGKILLs its group, itself
included. The death signal also fires when only the starter's forking thread
ends; the parent pid is then unchanged and the shim goes on. The starter
forks from its event-loop thread, which lives as long as the process.

Python at start-up coerces a C locale by setting LC_CTYPE in the environment
(PEP 538, not switched off under -I); KEEP_LC_CTYPE "0" removes it again so
the command gets exactly the environment the executor chose.

The shim itself keeps the starter's identity: the command's user need not
be able to read the Python that runs it, and a command cannot signal or
trace the shim that watches over it.

Stdlib only, no raftsched import: it runs isolated (-I -S) to start fast.
"""

import os
import signal
import sys

PR_SET_PDEATHSIG = 1
# Where prctl is missing, how often the shim checks that its starter lives.
parent_poll_s = 0.25
# Exit status of a shim whose command could not be exec'd (as sh uses).
EXIT_CANNOT_EXEC = 127
# Signals the shim outlives so that the command decides how they end it.
RIDDEN_OUT = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM,
              signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM)
# Python ignores these at start-up; the command must get the usual defaults.
PYTHON_IGNORES = (signal.SIGPIPE, signal.SIGXFSZ)


def main(argv: list[str]) -> None:
    status_fd, starter_pid, keep_lc_ctype = int(argv[1]), int(argv[2]), argv[3] == "1"
    run_as, command = parse_run_as(argv[4]), argv[5:]
    if not keep_lc_ctype:
        os.environ.pop("LC_CTYPE", None)
    os.set_inheritable(status_fd, False)   # the exec'd command must not hold it
    signal.pthread_sigmask(signal.SIG_BLOCK, RIDDEN_OUT)

    def on_signal(signum: int, frame: object) -> None:
        if os.getppid() != starter_pid:
            os.killpg(0, signal.SIGKILL)   # the starter died: the whole group goes

    for sig in RIDDEN_OUT:
        signal.signal(sig, on_signal)
    watch_starter(starter_pid)
    pid = os.fork()
    if pid == 0:
        exec_command(command, status_fd, run_as)
    os.close(status_fd)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, RIDDEN_OUT)
    if os.getppid() != starter_pid:
        os.killpg(0, signal.SIGKILL)   # it died before the death signal was armed
    _, status = os.waitpid(pid, 0)
    end_like(os.waitstatus_to_exitcode(status))


def watch_starter(starter_pid: int) -> None:
    if sys.platform.startswith("linux"):
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) == 0:
            return
    # No death signal here: SIGALRM runs the same parent check periodically.
    signal.setitimer(signal.ITIMER_REAL, parent_poll_s, parent_poll_s)


def parse_run_as(text: str) -> tuple[int, int, list[int]] | None:
    """RUN_AS: None for "-", else (uid, gid, supplementary gids)."""
    if text == "-":
        return None
    uid, gid, groups = text.split(":")
    return int(uid), int(gid), [int(g) for g in groups.split(",") if g]


def take_identity(run_as: tuple[int, int, list[int]]) -> None:
    """Groups before the user: once the user is changed, nothing else can be."""
    uid, gid, groups = run_as
    os.setgroups(groups)
    os.setgid(gid)
    os.setuid(uid)   # as root this sets the real, effective and saved ids alike


def exec_command(command: list[str], status_fd: int,
                 run_as: tuple[int, int, list[int]] | None) -> None:
    """The forked child: default signal handling, the command's identity, then
    exec, or report why not."""
    try:
        signal.setitimer(signal.ITIMER_REAL, 0, 0)
        for sig in RIDDEN_OUT + PYTHON_IGNORES:
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, ())
        if run_as is not None:
            take_identity(run_as)
        os.execvp(command[0], command)
    except OSError as exc:
        report = f"{exc.errno}\0{exc.strerror}\0{exc.filename or command[0]}"
        os.write(status_fd, report.encode("utf-8", "surrogateescape"))
    os._exit(EXIT_CANNOT_EXEC)


def end_like(code: int) -> None:
    """Exit with the command's exit code, or die of the signal that killed it."""
    if code >= 0:
        os._exit(code)
    sig = -code
    try:
        import resource   # no core file of the shim next to the command's own
        hard = resource.getrlimit(resource.RLIMIT_CORE)[1]
        resource.setrlimit(resource.RLIMIT_CORE, (0, hard))
        signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, (sig,))
    except (OSError, ValueError):
        pass   # SIGKILL and SIGSTOP cannot be handled: they need no reset
    os.kill(os.getpid(), sig)
    os._exit(128 + sig)   # a signal whose default is to be ignored


if __name__ == "__main__":
    main(sys.argv)
