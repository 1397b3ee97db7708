"""The private folders a publication writes its partial copies in, and the removal of those
that killed publications left.

:func:`sqlsdc.release.publish` writes the release file (and the Parquet folder) inside a
folder beside its target, named by the publication's audit entry (``OUT.<id>.partial/``), mode
0700, and moves the copy into place once the ledger holds it: publications to one OUT at once
never touch each other's files (red team s48g). A publication killed before it removed its
folder (kill -9, power loss) left it there for good, with a release the ledger never held
(readable by its owner, taking room).

So each publication holds an exclusive ``flock`` on its folder from the moment it makes it
until it removes it, and before making its own removes every ``<target>.<id>.partial`` folder
beside the target whose lock it can take: the kernel lets a lock go when its process dies, so
a folder no process holds is a dead publication's. A running publication's folder is held and
left alone, whichever process or thread runs it. Making a folder and locking it are one step
for the others: both are done, as the removal is, under a lock of this process and with the
database's lock held by the caller (:func:`sqlsdc.release._write_release` holds the database
open for writing, which one process at a time can), so no publication finds another's folder
made and not yet locked. Folders of other users (no permission to open them) and anything
that is not a plain folder (a link) are left alone. The id is unique per database only: a folder
of this publication's own name that another publication holds (another database's, writing
beside the same OUT) is not removed either; the publication fails (red team s48q). Without
``flock`` (Windows) no folder is locked and none is removed.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
from pathlib import Path

from sqlsdc.errors import Error

try:
    import fcntl
except ImportError:  # Windows: nothing is locked, nothing left over is removed
    fcntl = None

_MAKING = threading.Lock()  # threads of one process: made and locked before others look


def private_folder(target: Path, query_id: int) -> Path:
    """The folder beside ``target`` that publication ``query_id`` writes its partial copy in."""
    return target.with_name(f"{target.name}.{query_id}.partial")


def claim(targets: list[Path], query_id: int) -> list[int]:
    """Remove the folders dead publications left beside each of ``targets``, then make this
    publication's (mode 0700) and lock it; the locks' descriptors, for :func:`let_go`. The
    caller holds the database's lock (see the module)."""
    handles: list[int] = []
    made: list[Path] = []
    with _MAKING:
        try:
            for target in targets:
                remove_leftovers(target)
                folder = private_folder(target, query_id)
                handle = _make_private(folder)
                made.append(folder)
                if handle is not None:
                    handles.append(handle)
        except BaseException:
            for folder in made:  # its own, locked: no other publication's
                remove_private(folder)
            let_go(handles)
            raise
    return handles


def let_go(handles: list[int]) -> None:
    """Close the locks :func:`claim` took (after the folders were removed)."""
    for handle in handles:
        os.close(handle)
    handles.clear()


def remove_leftovers(target: Path) -> list[Path]:
    """Remove every ``<target>.<id>.partial`` folder beside ``target`` that no process holds
    (:func:`claim`); the folders removed."""
    if fcntl is None or not target.parent.is_dir():
        return []
    pattern = re.compile(re.escape(target.name) + r"\.[0-9]+\.partial")
    removed = []
    for path in target.parent.iterdir():
        if not pattern.fullmatch(path.name) or path.is_symlink() or not path.is_dir():
            continue
        handle = _lock(path)
        if handle is None:  # held by a running publication, or not ours to open
            continue
        try:
            shutil.rmtree(path, ignore_errors=True)
        finally:
            os.close(handle)
        removed.append(path)
    return removed


def remove_private(folder: Path) -> None:
    """Delete a half-written release: the private folder with what is in it (or the partial
    file, a link or its write-ahead log that an earlier version of sqlsdc left at that name)."""
    for path in (folder, folder.with_name(folder.name + ".wal")):
        if path.is_symlink() or path.is_file():
            path.unlink(missing_ok=True)
        elif path.is_dir():
            shutil.rmtree(path, ignore_errors=True)


def _make_private(folder: Path) -> int | None:
    """Create ``folder`` (after removing what a dead attempt of this id left there) with mode
    0700 and lock it; its lock's descriptor (None without ``flock``). What is written inside
    is unreadable to other users until it is moved into place, also when the publication is
    killed before that.

    The id is unique per database only: a publication of another database to the same folder
    can hold a folder of this name. A folder held so is not removed (red team s48q: it was,
    with the other's half-written release in it), nor one this publication cannot lock right
    after making it (another made one there in between): the publication fails and names
    the folder."""
    if folder.is_dir() and not folder.is_symlink() and fcntl is not None:
        handle = _lock(folder)
        if handle is None:
            raise _held(folder)
        try:
            shutil.rmtree(folder, ignore_errors=True)
        finally:
            os.close(handle)
    remove_private(folder)
    folder.mkdir(mode=0o700)
    folder.chmod(0o700)  # mkdir's mode is masked by the umask; this one only narrows it
    if fcntl is None:
        return None
    handle = _lock(folder)
    if handle is None:
        raise _held(folder)
    return handle


def _held(folder: Path) -> Error:
    return Error(
        f"{folder} is held by another publication (one of another database writing beside the "
        "same release, under the same number); publish to another file or folder, or wait "
        "for it to finish"
    )


def _lock(folder: Path) -> int | None:
    """An exclusive ``flock`` on ``folder`` (its descriptor), or None when another holds it,
    it cannot be opened (another user's) or locks are not available."""
    if fcntl is None:
        return None
    try:
        handle = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(handle)
        return None
    return handle
