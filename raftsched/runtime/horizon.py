"""The call horizon: a time no run this data folder's node called was due after.

A run fired ahead of its second (runtime/armed.py) is held, and counted as
started, from its fire. If its node stops before the second and the whole
cluster is down past it, nothing in the replicated state says whether the
call was made: the run reads `running`, as one cut short mid-call would.
Without more, the node calls every such run when it is back, late, each
one, whatever the job's misfire policy says.

So before a call the node makes sure that a small file in its data folder
holds a time at or after the run's due time, pushing it call_horizon_step_ms
past that due time when it does not (one write and fdatasync each step, on a
thread, shared by the calls that wait on it). At its next start the node
reads the file first: no run due after that time was called by this folder
before the start, so the runs it still holds that were due after it, and
whose second passed while it was down, are judged by their jobs' misfire
policies (the `miss_uncalled` command, runtime/dispatcher.py), as occurrences
that fired late would be.

No file (a new folder, or one from a release before this one) says nothing,
and no run is judged. A write that fails leaves no file (it is removed), so
the claim is never more than what holds; if even the removal fails, the call
is not made (the attempt fails, retryable), since a wrong claim could end a
run that was called as missed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import struct

from raftsched import limits

log = logging.getLogger("raftsched.horizon")

_VALUE = struct.Struct(">q")
FILE_NAME = "call-horizon"


class HorizonUnwritable(Exception):
    """The horizon could not be pushed, nor its file removed: no call may
    start past it."""


class CallHorizon:
    def __init__(self, data_dir: str) -> None:
        self.path = os.path.join(data_dir, FILE_NAME)
        # What the file said at start: no run due after it was called by this
        # folder before this start (None: it says nothing).
        self.previous_ms: int | None = self._read()
        # What the file says now (calls due up to it need no write).
        self.covered_ms: int | None = self.previous_ms
        self._lock = asyncio.Lock()
        self.writes_total = 0

    def _read(self) -> int | None:
        try:
            with open(self.path, "rb") as f:
                raw = f.read(_VALUE.size + 1)
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("call horizon %s unreadable (%s): runs held since before this "
                        "start are called as they are, not judged by their misfire "
                        "policies", self.path, exc)
            return None
        if len(raw) != _VALUE.size:
            log.warning("call horizon %s holds %d bytes, not %d: it is not used",
                        self.path, len(raw), _VALUE.size)
            return None
        return _VALUE.unpack(raw)[0]

    def covers(self, due_ms: int) -> bool:
        return self.covered_ms is not None and due_ms <= self.covered_ms

    async def cover(self, due_ms: int) -> None:
        """Return once the file holds a time at or after `due_ms`. Raises
        HorizonUnwritable when it can neither be written nor removed."""
        async with self._lock:
            if self.covers(due_ms):
                return   # pushed by a call that waited before this one
            until = due_ms + limits.call_horizon_step_ms
            await asyncio.to_thread(self._write, until)
            self.covered_ms = until

    def _write(self, until_ms: int) -> None:
        """In place: eight bytes at the start of the file, then fdatasync (a
        write within one sector is whole or absent after a crash; a rename
        would need the folder synced too). A new file's folder is synced."""
        try:
            created = not os.path.exists(self.path)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                os.pwrite(fd, _VALUE.pack(until_ms), 0)
                os.fdatasync(fd)
            finally:
                os.close(fd)
            if created:
                _sync_folder(os.path.dirname(self.path))
            self.writes_total += 1
        except OSError as exc:
            try:
                if os.path.exists(self.path):
                    os.unlink(self.path)
                    _sync_folder(os.path.dirname(self.path))
            except OSError as again:
                raise HorizonUnwritable(
                    f"the call horizon {self.path} could not be written ({exc}) nor "
                    f"removed ({again})") from None
            self.covered_ms = None
            log.error("call horizon %s not written (%s): removed, so the next start "
                      "judges no held run uncalled", self.path, exc)
            # Removed: the file claims nothing, so the call may go ahead; the
            # next call tries to write it again.
            raise _Removed() from None


def _sync_folder(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _Removed(Exception):
    pass


async def cover_or_drop(horizon: CallHorizon | None, due_ms: int) -> None:
    """Before a call of a run due at `due_ms`: push the horizon past it, or
    leave no horizon at all (then the call may go ahead). Raises
    HorizonUnwritable when neither can be done."""
    if horizon is None or horizon.covers(due_ms):
        return
    try:
        await horizon.cover(due_ms)
    except _Removed:
        pass
