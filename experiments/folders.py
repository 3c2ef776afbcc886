"""Output folders of long commands (a tune study, a pipeline run): checked before any work, held by one
process at a time, and aged when a resumed run reuses a measurement from them.

``hold(folder)`` takes an exclusive ``fcntl.flock`` on ``folder/.lock`` (opened with ``O_CREAT``, so its
creation is atomic) and records the holder's PID, host and start time in it; the OS drops the lock when
the process ends, crash included, so a lock file left behind by a killed process never blocks anyone.
A second writer fails at once with ``InputError`` naming the holder. ``check_writable`` refuses an
``--out`` that is a file, lies under a file, or sits in a folder this process cannot write in.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from core.cost_profile import profile_measurement
from core.errors import InputError

LOCK = ".lock"
"""The lock file inside a held folder (removed when the holder lets go)."""
PROFILE_MAX_AGE_HOURS = 6.0
"""Oldest cost profile a resumed pipeline run reuses: the machine's load and clocks drift, so an older
profile is measured again (with every step that reads it)."""


def check_writable(folder: str | Path, flag: str = "--out") -> None:
    """InputError unless ``folder`` is, or can be created as, a folder this process can write in."""
    path = Path(folder)
    try:
        if path.exists() and not path.is_dir():
            raise InputError(f"{flag} {path} is a file, not a folder: choose a folder path")
        existing = next(p for p in (path, *path.parents) if p.exists())
    except OSError as err:
        raise InputError(f"{flag} {path} cannot be checked ({err.strerror}): choose another folder") from None
    if not existing.is_dir():
        raise InputError(f"{flag} {path} lies under the file {existing}: choose a folder path")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise InputError(f"{flag} {path}: {existing} is not writable by this user: "
                         "choose a folder you can write in")


@contextmanager
def hold(folder: str | Path, flag: str = "--out") -> Iterator[Path]:
    """Hold ``folder`` (created if missing) for this process alone; on an error, a folder created here that
    holds nothing else is removed again."""
    path = Path(folder)
    created = not path.exists()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise InputError(f"{flag} {path} cannot be created ({err.strerror}): choose another folder") from None
    fd = _acquire(path / LOCK, flag)
    failed = False
    try:
        yield path
    except BaseException:
        failed = True
        raise
    finally:
        (path / LOCK).unlink(missing_ok=True)  # while still held: a waiter then finds the file gone
        os.close(fd)
        if failed and created and not any(path.iterdir()):
            path.rmdir()


def _acquire(path: Path, flag: str) -> int:
    """An open descriptor of ``path`` holding its exclusive lock, the holder's details written in it."""
    for _ in range(5):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise InputError(f"{path} cannot be created ({err.strerror}): choose another {flag}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise InputError(f"{path.parent} is in use by {holder}: wait for it to end, "
                             f"or choose another {flag}") from None
        if _same_file(fd, path):
            _record(fd)
            return fd
        os.close(fd)  # the last holder removed the file after we opened it: take the new one
    raise InputError(f"{path} keeps changing under this process: wait for the other writer, "
                     f"or choose another {flag}")


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _record(fd: int) -> None:
    """Write this process's PID, host and start time into the held lock file."""
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    text = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": started})
    os.ftruncate(fd, 0)
    os.pwrite(fd, text.encode(), 0)


def _holder(fd: int) -> str:
    """Who holds the lock, as its file records it."""
    try:
        info: Any = json.loads(os.pread(fd, 4096, 0) or b"null")
    except (OSError, ValueError):
        info = None
    if not isinstance(info, dict) or "pid" not in info:
        return "another process (it has not recorded its PID yet)"
    return f"process {info['pid']} on {info.get('host', '?')} (started {info.get('started', '?')})"


def measurement_age(path: str | Path) -> float | None:
    """Seconds since the cost profile at ``path`` was measured: its ``measurement.date`` when it records
    one, else the file's modification time; None when the file is missing."""
    path = Path(path)
    try:
        modified = path.stat().st_mtime
    except OSError:
        return None
    try:
        date = profile_measurement(path)["date"]
        taken = datetime.fromisoformat(date)
        taken = taken if taken.tzinfo else taken.replace(tzinfo=timezone.utc)
        return max(0.0, datetime.now(timezone.utc).timestamp() - taken.timestamp())
    except (OSError, ValueError, KeyError, TypeError):
        return max(0.0, datetime.now(timezone.utc).timestamp() - modified)


def fresh(path: Path) -> Path:
    """A study folder that holds no earlier run (the studies always start over)."""
    if path.exists():
        shutil.rmtree(path)
    return path
