"""The release as Parquet files with a manifest, for readers that open no DuckDB file.

``sqlsdc publish DB OUT --parquet DIR`` writes, next to the release database, one Parquet file
per released table and ``manifest.json``: what the release is (its id — the publication's audit
entry, under which the ledger holds every released cell —, the policy version, when), and per
table its file, rows, columns with their Arrow types, the SHA-256 of the file, where it came
from and how it was protected. Arrow, pandas, polars, Spark, R's arrow, DuckDB of any version
and most BI tools read Parquet.

The folder is written beside ``DIR`` and renamed into place when complete (:func:`put_in_place`).
``--replace`` replaces an earlier release folder only (:func:`check_replaceable`): the old
folder is deleted as a whole, so a folder holding anything else — the confidential database,
its audit log, the release file, a home directory — is refused (red team s36c).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import shutil
from pathlib import Path

import pyarrow.parquet as pq

from sqlsdc.errors import Error

MANIFEST = "manifest.json"
FORMAT = "sqlsdc-release/1"


def write_parquet(folder: Path, tables: dict, *, release_id: int, policy_version: int) -> dict:
    """Write ``tables`` (``name -> (data, Published, ...)``) into ``folder`` (new) as Parquet
    files and ``manifest.json``; returns the manifest."""
    folder.mkdir(parents=True)
    entries = []
    for name, (data, entry, *_rest) in tables.items():
        file = folder / f"{name}.parquet"
        pq.write_table(data, file)
        entries.append(
            {
                "name": name,
                "file": file.name,
                "rows": data.num_rows,
                "columns": [{"name": f.name, "type": str(f.type)} for f in data.schema],
                "sha256": _sha256(file),
                "source": entry.source,
                "method": entry.method,
                "definition": entry.definition,
            }
        )
    manifest = {
        "format": FORMAT,
        "release_id": release_id,
        "policy_version": policy_version,
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "tables": entries,
    }
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def check_replaceable(folder: Path) -> None:
    """Refuse to replace ``folder`` unless it is an earlier release: a folder holding only
    ``manifest.json`` of this format and the files it lists.

    :func:`put_in_place` deletes the old folder with everything in it. Red team s36c: ``sqlsdc
    publish conf.duckdb release.duckdb --parquet . --replace`` (or a parent folder of the
    database) deleted the confidential database, its catalog and the audit entry of the very
    publication, and any other file there.
    """
    refused = (
        f"--parquet {folder} exists and is not an earlier release folder (manifest.json and "
        "the Parquet files it lists, nothing else); --replace would delete it with everything "
        "in it. Name a new folder"
    )
    if folder.is_symlink() or not folder.is_dir():
        raise Error(refused)
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        listed = {MANIFEST, *(entry["file"] for entry in manifest["tables"])}
        ok = manifest["format"] == FORMAT and all(isinstance(f, str) for f in listed)
    except (OSError, ValueError, KeyError, TypeError):
        raise Error(refused) from None
    entries = list(folder.iterdir())
    if not ok or any(e.name not in listed or e.is_symlink() or not e.is_file() for e in entries):
        raise Error(refused)


def put_in_place(partial: Path, folder: Path) -> None:
    """Rename the complete ``partial`` folder to ``folder``, replacing an older release there.

    The old folder is renamed aside first and deleted after, so that ``folder`` is at every
    moment either the old release or the new one, never a mix.
    """
    old = folder.with_name(f"{folder.name}.old-{os.getpid()}")
    if folder.exists():
        folder.rename(old)
    partial.rename(folder)
    shutil.rmtree(old, ignore_errors=True)


def remove(partial: Path) -> None:
    """Delete a half-written folder."""
    shutil.rmtree(partial, ignore_errors=True)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
