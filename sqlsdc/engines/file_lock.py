"""An operating-system lock on a database file, held from before it is opened until after it
is closed, so that processes taking turns on one DuckDB file never lose a commit.

DuckDB lets one process write a file and keeps others out with its own lock, but that lock is
released before the closing process has finished with the file: with 16 processes taking turns
(open, commit, close), DuckDB 2.0 lost 5-10 of 960 acknowledged commits per run and handed
their sequence ids out again, and once left a damaged block (``benchmarks/duckdb_handover.py``).
A ``flock`` on a sidecar file ``<db>.lock``, taken before ``connect`` and let go after ``close``
returns, lost none in every run. Writers take it exclusively, read-only openings shared.

The lock belongs to the process: connections of one process to one file share it (DuckDB
shares their database instance too), and it is let go when the last of them closes. The
kernel lets it go if the process dies, so a killed process never blocks the others.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: DuckDB's own lock only
    fcntl = None

__all__ = ["FileLock", "held", "try_acquire"]

# Told once, with the database's path and the longest wait, when an opening has waited
# LONG_WAIT_SECONDS for another process to let the file go: the command line says so on stderr,
# so that a command silent for up to a minute is not taken for a hung one. A library caller is
# told nothing.
on_long_wait = None  # Callable[[Path, float], None] | None
LONG_WAIT_SECONDS = 2.0


class FileLock:
    """This process's hold on one database file's lock: :meth:`release` once per acquire."""

    def __init__(self, key: str, handle):
        self.key, self.handle, self.holders = key, handle, 1

    def release(self) -> None:
        """Let go of one hold; the lock itself goes with the last. Never waits: a release may
        run in a finaliser, while this very thread is inside :func:`try_acquire`, so it is
        queued and applied by whichever thread holds the registry next (or now)."""
        _releases.append(self)
        _apply_releases()


_registry_lock = threading.Lock()
_held: dict[str, FileLock] = {}
_releases: list[FileLock] = []  # queued by release(), applied under the registry lock


def _apply_releases() -> None:
    while _releases and _registry_lock.acquire(blocking=False):
        try:
            while _releases:
                _let_go(_releases.pop())
        finally:
            _registry_lock.release()


def _let_go(hold: FileLock) -> None:
    hold.holders -= 1
    if hold.holders or _held.get(hold.key) is not hold:
        return
    del _held[hold.key]
    if hold.handle is not None:
        fcntl.flock(hold.handle, fcntl.LOCK_UN)
        hold.handle.close()


def held(path: str | Path) -> bool:
    """Whether this process holds the file's lock (a connection of it has the file open).
    Releases queued meanwhile are applied on the way out, as every user of the registry does:
    left queued, the process kept the lock with no connection open."""
    key = str(Path(path).resolve())
    try:
        with _registry_lock:
            return key in _held
    finally:
        _apply_releases()


def lock_path(path: Path) -> Path:
    """``<db>.lock``, beside the database file."""
    return path.with_name(path.name + ".lock")


def try_acquire(path: str | Path, *, shared: bool) -> FileLock | None:
    """Take the file's lock without waiting, or None while another process holds it in a
    conflicting mode. A process that already holds it (in either mode) holds it once more.

    A reader in a folder where the lock file cannot be made (a read-only folder) holds
    nothing: no process can write the database there. Anything else that keeps the lock from
    being taken (something else at ``<db>.lock``, no permission to open it) is an
    :class:`OSError` with the reason, never an open without the lock."""
    path = Path(path).resolve()
    key = str(path)
    try:
        with _registry_lock:
            while _releases:
                _let_go(_releases.pop())
            held = _held.get(key)
            if held is not None:
                held.holders += 1
                return held
            handle = _open(lock_path(path), path, shared=shared)
            if handle is not None:
                try:
                    mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
                    fcntl.flock(handle, mode | fcntl.LOCK_NB)
                except BlockingIOError:
                    handle.close()
                    return None
            held = _held[key] = FileLock(key, handle)
            return held
    finally:
        _apply_releases()  # those queued while this thread held the registry


def _open(lock: Path, database: Path, *, shared: bool):
    """The lock file, opened (and made, with the database file's permissions: it is no more
    reachable than the database itself), or None for a reader that cannot make it."""
    if fcntl is None:
        return None
    if lock.is_symlink() or (lock.exists() and not lock.is_file()):
        raise OSError(f"{lock} is not a lock file sqlsdc made; remove it")
    try:
        if database.exists():
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            os.fchmod(fd, os.stat(database).st_mode & 0o666)
        else:  # made with the database, as DuckDB makes it (the umask applies to both)
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    except FileExistsError:
        fd = _open_existing(lock)
    except OSError as failure:
        if shared and not lock.exists():
            return None  # a read-only folder: nobody writes the database here
        raise OSError(f"cannot make the lock file {lock}: {failure.strerror}") from None
    return os.fdopen(fd, "rb")


def _open_existing(lock: Path) -> int:
    for flags in (os.O_RDWR, os.O_RDONLY):  # read-only: a lock file another user made
        try:
            return os.open(lock, flags | os.O_CLOEXEC | os.O_NOFOLLOW)
        except PermissionError:
            continue
    raise OSError(f"cannot open the lock file {lock} (no permission to read it)")


def _forget_after_fork() -> None:
    """A forked child does not hold its parent's locks (their descriptions stay the parent's:
    unlocking them here would unlock them for the parent)."""
    global _registry_lock, _held, _releases
    _registry_lock, _held, _releases = threading.Lock(), {}, []


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
