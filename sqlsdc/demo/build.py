"""Build the demo database: synthetic tables, the demo policy, record keys, catalog."""

from __future__ import annotations

import os
from contextlib import contextmanager
from importlib import resources
from pathlib import Path

from sqlsdc.catalog.setup import ApplyReport, apply_policy
from sqlsdc.demo import DEFAULT_PERSONS, DEFAULT_SEED
from sqlsdc.demo.data import Progress, build_tables, write_tables
from sqlsdc.engines import duckdb as engine
from sqlsdc.engines import file_lock
from sqlsdc.engines.duckdb_replace import hold_for_replacing
from sqlsdc.errors import NotFoundError
from sqlsdc.files import check_replaceable, check_writable
from sqlsdc.policy import Policy, load_policy


def demo_policy() -> Policy:
    text = resources.files("sqlsdc.demo").joinpath("policy.yaml").read_text("utf-8")
    return load_policy(text, name="demo-policy.yaml")


def build_demo_database(
    path: str | Path,
    *,
    persons: int = DEFAULT_PERSONS,
    seed: int = DEFAULT_SEED,
    progress: Progress | None = None,
    policy: Policy | None = None,
) -> ApplyReport:
    """Create (or replace) the demo database at ``path`` and initialise its catalog with
    ``policy`` (default: the demo policy, :func:`demo_policy`).

    The database is built in a temporary file next to ``path`` and moved into place only when
    complete, so a failure leaves ``path`` as it was and no half-built file behind.

    Example:
        >>> build_demo_database("/tmp/demo.duckdb", persons=2000).version  # doctest: +SKIP
        1
    """
    path = Path(path)
    if not path.parent.is_dir():
        raise NotFoundError(f"cannot create {path}: folder {path.parent} does not exist")
    check_replaceable(path)
    check_writable(path)  # named so: the file built aside was named in the failure
    building = path.with_name(f".{path.name}.{os.getpid()}.building")
    try:
        with _replacing(path):
            report = _build(building, persons, seed, progress, policy)
            path.with_name(path.name + ".wal").unlink(missing_ok=True)  # the old file's
            os.replace(building, path)
    finally:
        for partial in (building, *engine.sidecar_files(building)):
            partial.unlink(missing_ok=True)
    return report


# How long a replacement waits for the processes that have the old database open (as any
# opening of it waits: engine.LOCK_WAIT_SECONDS)
REPLACE_WAIT_SECONDS = engine.LOCK_WAIT_SECONDS


@contextmanager
def _replacing(path: Path):
    """Hold the lock of the database at ``path`` while it is replaced, so that no process has
    the old file open (:func:`engine.open_database` waits for sqlsdc's processes and fails,
    exit code 9, while one outside sqlsdc keeps it). Replaced under a process that had it
    open (a server, a notebook), that process went on writing its commits into the old file
    and its write-ahead log beside the new one, by name: the next opening of the new
    database failed, "WAL does not match database file" (new user s46i)."""
    con = hold_for_replacing(path, REPLACE_WAIT_SECONDS, readers_too=True)
    if con is None:  # nothing DuckDB has open (a text file, an empty file, a damaged
        yield  # database): replaced as it is
        return
    hold = file_lock.try_acquire(path, shared=False)  # this process holds it once more
    con.close()  # DuckDB lets the old file go; the lock stays until it is replaced
    try:
        yield
    finally:
        if hold is not None:
            hold.release()


def _build(path: Path, persons: int, seed: int, progress, policy) -> ApplyReport:
    tables = build_tables(persons, seed, progress)
    con = engine.open_database(path)
    try:
        write_tables(con, tables)
        if progress:
            progress("record keys and catalog", 0)
        policy = policy or demo_policy()  # a database just written: no outputs to check it against
        return apply_policy(con, policy, applied_by="sqlsdc demo", checks=())
    finally:
        con.close()
