"""Who holds a save's lease, and whether that holder is provably dead
(docs/architecture/save-protocol.md, "Save protocol", Resuming a killed save).

A save records its process in its lease row: host name, pid and the process's start time
(Linux: field 22 of ``/proc/<pid>/stat``, clock ticks after boot; elsewhere None), so that a
pid the kernel handed to another process since is told apart, and the kernel's boot id and
its pid namespace (Linux), so that a process this one cannot see is never taken for dead.  A
holder is provably dead only when it ran on this host (same host name, same boot, same pid
namespace: two containers of one host name, or two machines of one name, do not judge each
other) and its pid runs no more, is a zombie, or runs with another start time.  A holder on
another host, or one whose state cannot be read, is alive.
"""

from __future__ import annotations

import os
import socket
from typing import Any

__all__ = [
    "HOLDER_STATUSES",
    "describe_holder",
    "holder_is_dead",
    "holder_status",
    "process_start_time",
    "this_process",
]

HOLDER_STATUSES = ("alive", "dead", "unknown")
"""What `holder_status` says of a lease's holder."""


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (field 3 first), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode("ascii", "replace")
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces and parentheses.
    end = text.rfind(")")
    return text[end + 1 :].split() if end >= 0 else None


def _other_threads_run(pid: int) -> bool:
    """Whether a thread of process ``pid`` other than its main thread is not a zombie (or
    the threads cannot be listed: then it may be running)."""
    try:
        tids = [int(name) for name in os.listdir(f"/proc/{pid}/task") if name != str(pid)]
    except (OSError, ValueError):
        return True
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                text = f.read().decode("ascii", "replace")
        except OSError:
            continue  # gone meanwhile
        state = text[text.rfind(")") + 1 :].split()[:1]
        if state and state[0] not in ("Z", "X"):
            return True
    return False


def process_start_time(pid: int) -> int | None:
    """When process ``pid`` started (field 22 of ``/proc/<pid>/stat``), or None where there
    is no such file (not Linux, or no such process)."""
    fields = _stat_fields(pid)
    if fields is None or len(fields) < 20:
        return None
    try:
        return int(fields[19])  # field 22; fields[0] is field 3
    except ValueError:
        return None


def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip() or None
    except OSError:
        return None


def _pid_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def this_process() -> dict[str, Any]:
    """This process as a lease's holder: ``{"host", "pid", "start", "boot", "pidns"}``."""
    pid = os.getpid()
    return {
        "host": socket.gethostname(),
        "pid": pid,
        "start": process_start_time(pid),
        "boot": _boot_id(),
        "pidns": _pid_namespace(),
    }


def holder_is_dead(holder: object) -> bool:
    """Whether the process ``holder`` (as `this_process` recorded it) is provably dead: it
    ran on this host and its pid runs no more, is a zombie, or is another process now."""
    if not isinstance(holder, dict) or holder.get("host") != socket.gethostname():
        return False
    # NOTE: another boot (a reboot, or another machine of the same name) or another pid
    # namespace (a container) is a process this one cannot see: never taken for dead.
    if holder.get("boot") != _boot_id() or holder.get("pidns") != _pid_namespace():
        return False
    pid, start = holder.get("pid"), holder.get("start")
    if type(pid) is not int or pid <= 0:
        return False
    if pid == os.getpid():
        return start is not None and start != process_start_time(pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # it exists, under another user
    except OSError:
        return False
    fields = _stat_fields(pid)
    if fields is None:
        return False
    if fields[0] in ("Z", "X"):
        # Killed and not yet reaped, unless only its main thread ended: the process's state
        # is its main thread's, and other threads (one of them the save) may still run.
        return not _other_threads_run(pid)
    now = process_start_time(pid)
    return start is not None and now is not None and now != start


def _same_machine(holder: dict[str, Any]) -> bool:
    """Whether ``holder`` ran where this process can see it: this host name, boot and pid
    namespace."""
    return (
        holder.get("host") == socket.gethostname()
        and holder.get("boot") == _boot_id()
        and holder.get("pidns") == _pid_namespace()
    )


def holder_status(holder: object) -> str:
    """``"dead"`` (`holder_is_dead`), ``"alive"`` (its process runs where this process can see
    it: this host, boot and pid namespace, with the start time recorded, where there is one)
    or ``"unknown"`` (another host, boot or namespace, a lease of an older version that
    recorded no holder, or a process whose state cannot be read): what operators are shown
    beside a pending save (``owners``, ``verify``, the error of a save of a taken name)."""
    if holder_is_dead(holder):
        return "dead"
    if not isinstance(holder, dict) or not _same_machine(holder):
        return "unknown"
    pid, start = holder.get("pid"), holder.get("start")
    if type(pid) is not int or pid <= 0:
        return "unknown"
    if pid != os.getpid():
        try:
            os.kill(pid, 0)
        except PermissionError:
            pass  # it exists, under another user
        except OSError:
            return "unknown"
    now = process_start_time(pid)
    if start is not None and now != start:
        return "unknown"  # not dead (`holder_is_dead` said so), and not provably the holder
    return "alive"


def describe_holder(holder: object) -> str:
    """``pid P on host H`` for messages (an unknown holder: a lease of an older version)."""
    if not isinstance(holder, dict) or "pid" not in holder:
        return "a process that did not record itself (an older version of archive_manager)"
    return f"pid {holder.get('pid')} on host {holder.get('host')!r}"
