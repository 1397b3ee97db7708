"""Files the commands write (perturbation tables, plots, releases): written atomically, and a
folder that takes no new file (read-only, no permission, ``/proc``) is one clear failure.

A file is written to a temporary file beside it and renamed into place, so readers see the old
file or the whole new one and a failure leaves nothing half-written. A folder that refuses the
temporary file was reported with the temporary file's name, and as "not found" when the folder
exists (``/proc``)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from sqlsdc.errors import OperationalError


def write_atomically(path: str | Path, content: str | bytes) -> None:
    """Write ``content`` (text as UTF-8) to ``path`` through a temporary file and a rename."""
    path = Path(path)
    handle, temporary = _temporary(path)
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(content.encode("utf-8") if isinstance(content, str) else content)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def check_writable(path: str | Path) -> None:
    """Make and delete a file beside ``path``: whether its folder takes new files, asked before
    work that would be lost (a publication's queries are charged before it writes)."""
    handle, temporary = _temporary(Path(path))
    os.close(handle)
    os.unlink(temporary)


def _temporary(path: Path) -> tuple[int, str]:
    try:
        return tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as failure:
        reason = (failure.strerror or type(failure).__name__).lower()
        raise OperationalError(
            f"cannot write {path}: folder {path.parent} takes no new file ({reason}); "
            "choose another folder"
        ) from None
