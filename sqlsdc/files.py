"""Files the commands write (perturbation tables, plots, releases): written atomically, and a
folder that takes no new file (read-only, no permission, ``/proc``) is one clear failure.

A file is written to a temporary file beside it and renamed into place, so readers see the old
file or the whole new one and a failure leaves nothing half-written. A folder that refuses the
temporary file was reported with the temporary file's name, and as "not found" when the folder
exists (``/proc``)."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from sqlsdc.errors import Error, OperationalError


def write_atomically(path: str | Path, content: str | bytes) -> None:
    """Write ``content`` (text as UTF-8) to ``path`` through a temporary file and a rename.

    A link is followed: the file it names is replaced and the link stays. What is
    :func:`written_into` is written as it is, not replaced."""
    data = content.encode("utf-8") if isinstance(content, str) else content
    if written_into(path):
        with open(path, "wb") as stream:
            stream.write(data)
        return
    path = Path(os.path.realpath(path))
    handle, temporary = _temporary(path)
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
        _keep_mode(temporary, path)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def written_into(path: str | Path) -> bool:
    """Whether ``path`` is written into rather than replaced by a new file: something that is
    no regular file (a terminal, a named pipe, a device: the rename replaced ``/dev/full``
    itself with a file), or a file this process has open, named through ``/dev/stdout``,
    ``/dev/fd/N`` or ``/proc`` (``-o /dev/stdout > out.txt``: a new out.txt would leave the
    shell writing to the old one)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return False
    return not stat.S_ISREG(mode) or os.path.abspath(path).startswith(("/dev/", "/proc/"))


def check_replaceable(path: str | Path) -> None:
    """Refuse a database target that exists as something other than a regular file: a file
    built aside and renamed into place would replace the device or pipe itself (``sqlsdc
    demo --db /dev/null --force`` as root)."""
    if written_into(path) and Path(path).exists():
        raise Error(f"{path} is no regular file (a device, a pipe or a process's open file); "
                    "name a database file to write")  # fmt: skip


def check_writable(path: str | Path) -> None:
    """Make and delete a file beside ``path``: whether its folder takes new files, asked before
    work that would be lost (a publication's queries are charged before it writes)."""
    handle, temporary = _temporary(Path(path))
    os.close(handle)
    os.unlink(temporary)


def _keep_mode(temporary: str, path: Path) -> None:
    """Give the temporary file the mode ``path`` has, or for a new file the mode a plain
    ``open`` would give it (0666 less the umask). mkstemp makes it 0600, so every file written
    so was readable by its owner only (`ptable -o` for colleagues: -rw-------) and `--force`
    took a shared file's group and other permissions away (new user s44g)."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        mode = 0o666 & ~_umask()
    os.chmod(temporary, mode)


def _umask() -> int:
    """The process's umask, read where the kernel shows it (Linux), else set and restored."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _temporary(path: Path) -> tuple[int, str]:
    try:
        return tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as failure:
        reason = (failure.strerror or type(failure).__name__).lower()
        raise OperationalError(
            f"cannot write {path}: folder {path.parent} takes no new file ({reason}); "
            "choose another folder"
        ) from None
