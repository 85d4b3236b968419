"""Keep a node's or worker's secrets from the commands it runs.

A command runs as the user of the process that starts it, with its own small
environment (executors/command.py). But a process of the same user may read
another's initial environment in /proc/PID/environ, its memory, or attach a
debugger to it, and a node's or worker's environment holds its Raft secret
and tokens. On Linux, a process that is not "dumpable" (prctl
PR_SET_DUMPABLE 0) is out of reach of other processes of its user in those
ways: only a process with CAP_SYS_PTRACE (root) may still look. It also
writes no core file. A command is dumpable again (execve resets it), which is
what its own tools expect.

Files: keep_files_private() sets a umask under which what the process
creates is readable by its own user only.
"""

from __future__ import annotations

import ctypes
import os
import sys

PR_SET_DUMPABLE = 4
PR_GET_DUMPABLE = 3


# What a node (and `raftsched dev`, backup, restore) creates is for its own
# user only: the state, the Raft journal and snapshots, run outputs and the
# secret files hold every tenant's jobs and secrets. Set as the process's
# umask, it holds for files libraries create too (pysyncobj's journal), and
# whatever umask the operator's shell had. Commands inherit it.
PRIVATE_UMASK = 0o077


def keep_files_private() -> int:
    """Make every file and folder this process creates from now on private to
    its user (0600 files, 0700 folders); the umask it had before."""
    return os.umask(PRIVATE_UMASK)


def deny_same_user_inspection() -> bool:
    """Make this process not dumpable; whether that was done (Linux only)."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0


def dumpable() -> bool | None:
    """This process's flag, or None where it cannot be read."""
    if not sys.platform.startswith("linux"):
        return None
    return ctypes.CDLL(None, use_errno=True).prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) == 1
