"""The DuckDB engine: opening hardened connections, running statements, typing their answers.

With :mod:`.duckdb_schema` (what a database holds), it is the only module of the core that
imports duckdb; :mod:`.duckdb_sql` writes the SQL it runs, :mod:`.duckdb_files` words the files
it will not open, :mod:`.waiters` marks the processes waiting for a file.

Hardening follows the verified notes in ``shared/reference/ecosystem.md`` §2: extension installs
and autoloading off, Python replacement scans off, persistent secrets off at connect time; then,
after connect (DuckDB refuses it before), ``allowed_directories`` emptied, external access
disabled and the configuration locked, so no statement can re-enable files, network or
extensions.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import random
import threading
import time
import warnings
from functools import cache, lru_cache
from pathlib import Path

import duckdb
import pyarrow as pa

from sqlsdc.engines import ctrl_c, file_lock, watchdog
from sqlsdc.engines.duckdb_files import foreign_file, open_failure, without_path
from sqlsdc.engines.waiters import mark_waiting, others_waiting
from sqlsdc.errors import (
    AnswerTooLarge,
    Error,
    NotFoundError,
    OperationalError,
    interrupted_by_user,
)

DIALECT = "duckdb"

_CONNECT_CONFIG = {
    "autoinstall_known_extensions": "false",
    "autoload_known_extensions": "false",
    "allow_community_extensions": "false",
    "allow_unsigned_extensions": "false",
    "python_enable_replacements": "false",
    "allow_persistent_secrets": "false",
}

EngineError = duckdb.Error
TextRefusal = (duckdb.ParserException, duckdb.BinderException)
"""What DuckDB raises when it refuses a statement's text before reading any data: its parser,
or its binding of constants alone while listing the tables read
(:func:`~sqlsdc.engines.duckdb_schema.tables_read_by`)."""
StatementFailure = (duckdb.DataError, duckdb.BinderException, duckdb.CatalogException)
"""What DuckDB raises for a statement that cannot run on the data: a name it cannot bind, a cast
or an expression that fails on some row. An admin's job SQL fails so by its own fault, not by a
bug of sqlsdc; the engine's text may quote a confidential value (``Could not convert string
'R04'``)."""

# Catalog reads take Arrow from an executed statement (``execute(sql, params).to_arrow_table()``):
# DuckDB warns that this copies the rows, but its suggested ``con.sql(...)`` binds the statement
# twice, which costs more than copying a few catalog rows. ``run`` streams (see ``_stream``).
warnings.filterwarnings("ignore", message="Arrow output on a DB-API result", category=UserWarning)

# DuckDB shares one database instance between the connections of a process to the same file;
# opening it and locking its configuration (``harden``: check, then set) must not interleave
# between threads, or a second thread's SET meets a configuration the first just locked.
_OPEN_LOCK = threading.RLock()

_PATHS: dict[tuple[int, int], str] = {}  # (device, inode) -> the path it was first opened by
# (device, inode) -> [connections opened, connections open] by open_database in this process
_OPENINGS: dict[tuple[int, int], list[int]] = {}


def _one_path(path: Path) -> Path:
    """The path this process first opened this file by, while that path still names it: one
    file reached by two paths (a hard link, a bind mount) must not get two DuckDB instances
    in one process (DuckDB shares an instance per path, and its file lock does not keep a
    process from itself): each would write its own state over the other's, and the ledger
    rows of one were lost, so each analyst spent the whole budget."""
    try:
        found = path.stat()
    except OSError:
        return path  # a file yet to be made
    key = (found.st_dev, found.st_ino)
    with _OPEN_LOCK:
        first = _PATHS.get(key)
        with contextlib.suppress(OSError):
            if first is not None and os.path.samefile(first, path):
                return Path(first)
        _PATHS[key] = str(path)
    return path


# How long an open waits while another process holds the file (DuckDB lets one process write a
# file, and a writer excludes every other process): guarded connections release it when idle.
LOCK_WAIT_SECONDS = 60.0
# How long a guarded connection's opening lets an admin command or job that waits for the file
# go first (``open_database``'s ``first``): one stuck waiting delays analysts no longer. An
# opening that has waited this long goes first itself.
FIRST_SECONDS = 10.0


def open_database(
    path: str | Path,
    *,
    read_only: bool = False,
    wait: float = LOCK_WAIT_SECONDS,
    writes_data: bool = True,
    first: bool = True,
) -> LockedConnection:
    """Open a DuckDB file for sqlsdc's own (trusted) work, with extensions and scans locked down.

    The file's operating-system lock (:mod:`sqlsdc.engines.file_lock`) is taken first and held
    until the connection is closed, so no commit is lost when processes take turns. While
    another process holds the file, the open is retried for up to ``wait`` seconds (a guarded
    connection holds it while it runs statements, and releases it when idle). ``writes_data``
    False: the connection writes the catalog at most, never the tables' data (a guarded
    connection); every other opening counts as a possible writer of the data
    (:func:`data_writers`).

    ``first`` (admin commands and jobs, the default) goes before the openings of guarded
    connections (``first=False``): while it waits, those do not take the file (for up to
    :data:`FIRST_SECONDS`, unless their process holds it already), and a connection holding
    it lets it go after its statement (:func:`others_waiting` with ``first``). Among 16
    processes of analysts taking turns, an admin command had waited its turn for about 19 s:
    every turn went to whichever poller took the free lock first. A guarded connection's
    opening that has waited :data:`FIRST_SECONDS` goes first too from then on: in that lottery
    some analysts waited the whole ``wait`` and failed (red team s37)."""
    path = _one_path(Path(path))
    if not read_only and not path.parent.exists():
        raise NotFoundError(f"cannot create database {path}: folder {path.parent} does not exist")
    if read_only and not path.exists():
        raise NotFoundError(
            f"database {path} does not exist; create it with `sqlsdc init` or `sqlsdc demo`"
        )
    if foreign_file(path):  # before the lock: no <file>.lock is left beside a text file
        raise open_failure(path, "not a valid duckdb database", wait)
    started = time.monotonic()
    deadline, pause, marker, text, told = started + wait, 0.002, None, "lock", False
    try:
        while True:
            try:
                hold = (
                    None  # an admin command waits for the file: it goes first
                    if not first
                    and time.monotonic() < started + FIRST_SECONDS
                    and not file_lock.held(path)
                    and others_waiting(path, first=True)
                    else file_lock.try_acquire(path, shared=read_only)
                )
            except OSError as failure:
                raise OperationalError(
                    f"cannot open database {path}: its lock cannot be taken ({failure})"
                ) from None
            if hold is not None:
                try:
                    with _OPEN_LOCK:
                        con = duckdb.connect(str(path), read_only=read_only,
                                             config=dict(_CONNECT_CONFIG))  # fmt: skip
                        return LockedConnection(con, hold, _opened(path) if writes_data else None)
                except duckdb.Error as e:  # held by a process outside sqlsdc, or not DuckDB's
                    hold.release()
                    text = without_path(str(e), path).lower()
                    if "lock" not in text:
                        break
            if time.monotonic() + pause > deadline:
                break
            if not first and marker is not None and time.monotonic() > started + FIRST_SECONDS:
                first = True  # waited long: it goes first now, as an admin command does
                marker.unlink(missing_ok=True)
                marker = None
            marker = marker or mark_waiting(path, first)
            if not told and time.monotonic() > started + file_lock.LONG_WAIT_SECONDS:
                told = True
                if file_lock.on_long_wait is not None:
                    file_lock.on_long_wait(path, wait)
            time.sleep(pause * (0.5 + random.random()))  # jitter: waiting processes take turns
            pause = min(pause * 2, 0.05)
    finally:
        if marker is not None:
            marker.unlink(missing_ok=True)
            with contextlib.suppress(OSError):  # left to another waiter, if any
                marker.parent.rmdir()
    raise open_failure(path, text, wait) from None


class LockedConnection:
    """A DuckDB connection to a file that lets the file's lock go once it is closed (or
    collected); every other attribute is the connection's own."""

    __slots__ = ("__weakref__", "_con", "_hold", "_file")

    def __init__(self, con: duckdb.DuckDBPyConnection, hold: file_lock.FileLock, file=None):
        self._con, self._hold, self._file = con, hold, file

    def __getattr__(self, name: str):
        return getattr(self._con, name)

    def execute(self, *args, **kwargs):
        return self._con.execute(*args, **kwargs)

    def close(self) -> None:
        hold, self._hold = self._hold, None
        try:
            self._con.close()
        finally:
            if hold is not None:
                hold.release()
                if self._file is not None:
                    with _OPEN_LOCK:
                        _OPENINGS[self._file][1] -= 1

    def __enter__(self) -> LockedConnection:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        if self._hold is not None:
            self.close()


def _opened(path: Path) -> tuple[int, int]:
    """Count an opening of the file by a possible writer of its data (under ``_OPEN_LOCK``);
    its (device, inode)."""
    found = path.stat()
    key = (found.st_dev, found.st_ino)
    counts = _OPENINGS.setdefault(key, [0, 0])
    counts[0] += 1
    counts[1] += 1
    return key


def data_writers(path: str | Path) -> int | None:
    """How many connections that may write the file's data (``writes_data``) this process
    has opened, while none of them is open; None while one is. The OS lock keeps other
    processes out, not this one (DuckDB shares one instance per file in a process): what a
    guarded connection read of the data (its data versions) holds while this stays the same."""
    try:
        found = Path(path).stat()
    except OSError:
        return None
    with _OPEN_LOCK:
        opened, open_now = _OPENINGS.get((found.st_dev, found.st_ino), (0, 0))
    return opened if open_now == 0 else None


def sidecar_files(path: str | Path) -> tuple[Path, Path]:
    """The files kept beside a database file: DuckDB's write-ahead log and the file of the OS
    lock (:mod:`~sqlsdc.engines.file_lock`); a private file's creator removes them with it."""
    path = Path(path)
    return path.with_name(path.name + ".wal"), file_lock.lock_path(path)


def memory_database(
    memory_limit: str | None = None, threads: int | None = None
) -> duckdb.DuckDBPyConnection:
    """A private in-memory database, hardened like a file's: no file, network, extension or
    setting can be reached from its statements (the server's shadow catalog runs clients'
    catalog queries in one). ``memory_limit`` (DuckDB's, e.g. ``"256MB"``) and ``threads``
    bound what one statement may take; they are locked with the rest."""
    limits = {"memory_limit": memory_limit, "threads": threads}
    config = dict(_CONNECT_CONFIG, **{k: v for k, v in limits.items() if v is not None})
    con = duckdb.connect(":memory:", config=config)
    harden(con)
    return con


def harden(con: duckdb.DuckDBPyConnection) -> None:
    """Close every channel to files, network, extensions and settings, irreversibly.

    Settings belong to the database instance, which DuckDB shares between connections to the
    same file in one process; an instance locked by an earlier connection stays locked.
    """
    with _OPEN_LOCK:
        _harden(con)


def _harden(con: duckdb.DuckDBPyConnection) -> None:
    locked = one(con, "SELECT current_setting('lock_configuration')")[0]
    external = one(con, "SELECT current_setting('enable_external_access')")[0]
    if locked:
        if external:
            raise Error("the database instance is locked with external access enabled")
        return
    con.execute("SET allowed_directories = []")
    con.execute("SET enable_external_access = false")
    # values of TIMESTAMPTZ (hour, date, truncation) follow the session's time zone, which
    # DuckDB takes from the process (TZ): one question, one identity, one noise must mean one
    # value in every process, or two processes give two exact values under one noise
    con.execute("SET GLOBAL TimeZone = 'UTC'")
    con.execute("SET GLOBAL Calendar = 'gregorian'")
    con.execute("SET lock_configuration = true")


def evaluate_constant(sql: str, timeout: float) -> str:
    """Run ``sql``, a statement that reads no table (a query's constant, evaluated once
    before the query to see whether it raises), and return the engine's type of its first
    column (``DECIMAL(38,3)``, ``HUGEINT``), on a private in-memory instance hardened and
    set like every file's (``harden``: UTC, the Gregorian calendar), so that checking needs
    neither a database file nor its lock. Each thread has its own cursor: checks in several
    threads never wait for one another, and each is interrupted after ``timeout`` alone.

    Raises:
        EngineError: the statement failed (or ran out of time).
    """
    cursor = _scratch_cursor(_SCRATCH_CURSORS)
    cursor_instance = _SCRATCH_CURSORS.held[0]
    try:
        return type_names(run(cursor, sql, timeout=timeout).schema)[0]
    except (duckdb.InternalException, duckdb.FatalException):
        # DuckDB may have invalidated the instance: later work gets a fresh one
        with _OPEN_LOCK:
            if _SCRATCH[0] is cursor_instance:
                _SCRATCH[0] = None
        raise


# per thread: (the scratch instance, this thread's connection to it), one for constants
# (interrupted at their timeout) and one for naming types and parsing (never interrupted)
_SCRATCH_CURSORS = threading.local()
_TYPE_READER = threading.local()
_SCRATCH: list[duckdb.DuckDBPyConnection | None] = [None]  # the instance of :func:`_scratch`


def _scratch() -> duckdb.DuckDBPyConnection:
    """The process's private in-memory instance for sqlsdc's own work beside the files:
    constants, types, parsing, the list of built-in functions. One instance, not one per use
    and thread: an instance's start and end cost ~15-20 ms of CPU (DuckDB fills and frees its
    catalog of ~3,200 functions), paid three times in every ``sqlsdc`` process before.
    Called under ``_OPEN_LOCK``."""
    if _SCRATCH[0] is None:
        con = duckdb.connect(":memory:", config=dict(_CONNECT_CONFIG))
        _harden(con)
        _SCRATCH[0] = con
    return _SCRATCH[0]


def _scratch_cursor(kept: threading.local) -> duckdb.DuckDBPyConnection:
    """This thread's connection to :func:`_scratch` kept in ``kept``, made anew when the
    instance was replaced. DuckDB connections are not shared between threads; connections
    (cursors) to one instance are, at ~10 µs each. The lock is taken only to make one: a
    thread naming types does not wait while another opens a file."""
    held = getattr(kept, "held", None)
    if held is None or held[0] is not _SCRATCH[0]:
        with _OPEN_LOCK:
            instance = _scratch()
        held = kept.held = (instance, instance.cursor())
    return held[1]


def close_scratch() -> None:
    """Close the private in-memory instance (:func:`_scratch`; the next use opens another):
    for a process about to fork, since a DuckDB instance does not survive into the child (its
    threads stay behind). What was read from it (built-in functions, type names) is kept."""
    with _OPEN_LOCK:
        instance, _SCRATCH[0] = _SCRATCH[0], None
        for kept in (_SCRATCH_CURSORS, _TYPE_READER):
            kept.__dict__.pop("held", None)
        parsed.cache_clear()  # statements parsed by the instance
    if instance is not None:
        instance.close()


def system_functions(con: duckdb.DuckDBPyConnection) -> frozenset[str]:
    """Names of built-in scalar and aggregate functions that can be called as system.main.f()."""
    rows = con.execute(
        "SELECT DISTINCT lower(function_name) FROM duckdb_functions() "
        "WHERE internal AND function_type IN ('scalar', 'aggregate') AND schema_name = 'main'"
    ).fetchall()
    return frozenset(r[0] for r in rows)


@cache
def builtin_functions() -> frozenset[str]:
    """Built-in functions of this DuckDB version, read once from the private in-memory
    instance (:func:`_scratch`: no user's macro there)."""
    return system_functions(_scratch_cursor(_TYPE_READER))


def run(
    con: duckdb.DuckDBPyConnection,
    sql: str,
    timeout: float | None = None,
    max_rows: int | None = None,
    max_bytes: int | None = None,
    params: list | None = None,
) -> pa.Table:
    """Run a query (with ``params``, if any) and return its result as an Arrow table;
    interrupt it after ``timeout`` s,
    or on Ctrl-C (:mod:`sqlsdc.engines.ctrl_c`), which raises ``KeyboardInterrupt``.
    The answer streams from the engine batch by batch: with ``max_rows`` (and ``max_bytes``)
    it is abandoned (:class:`AnswerTooLarge`) as soon as it has more rows (bytes), so it never
    sits whole in memory."""
    timer = watchdog.after(timeout, con.interrupt) if timeout else None
    try:
        with ctrl_c.interrupting(con.interrupt) as pressed:
            try:
                answer = _answer(con, sql, max_rows, max_bytes, params)
            except Exception:
                if pressed:
                    raise KeyboardInterrupt from None
                raise
        if pressed:  # the statement ended before the interrupt reached it
            raise KeyboardInterrupt
        return answer
    except RuntimeError as failure:
        if interrupted_by_user(failure):  # Ctrl-C: what Python raises for it everywhere else
            raise KeyboardInterrupt from None
        raise
    finally:
        if timer:
            timer.cancel()


def _answer(con, sql: str, max_rows: int | None, max_bytes: int | None, params) -> pa.Table:
    """:func:`run`'s streaming of the answer under its caps."""
    types, reader = _stream(con, sql, params)
    with contextlib.closing(reader):  # the connection refuses statements while it is open
        batches, rows, size = [], 0, 0
        for batch in _batches(reader):
            rows, size = rows + batch.num_rows, size + batch.nbytes
            if rows > (max_rows or rows) or size > (max_bytes or size):
                limit = (f"{max_rows:,} rows" if max_rows and rows > max_rows
                         else f"{max_bytes // 2**20:,} MiB")  # fmt: skip
                raise AnswerTooLarge(
                    f"the answer has more than {limit}, the most a connection returns: "
                    "aggregate further, filter, or add a LIMIT"
                )
            batches.append(batch)
        return _mark_wide_integers(pa.Table.from_batches(batches, reader.schema), types)


def _stream(con, sql: str, params=None) -> tuple[list[str], pa.RecordBatchReader]:
    """The engine's column types of ``sql``'s answer and a reader streaming it.

    DuckDB 2.0's public streaming path, ``con.sql(sql).to_arrow_reader()``, parses and binds
    the statement once to build a relation and again to run it (0.7 ms of the guard's fixed
    cost on the deep CKM SQL), and an ``execute`` result is copied whole before it can be read.
    The connection's ``_submit`` is the one call under ``to_arrow_reader``: it runs the text
    once and streams. It is private, so the public path stays for a DuckDB without it (the
    package pins the version whose ``_submit`` is tested)."""
    submit = getattr(con, "_submit", None)
    if submit is None:
        relation = con.sql(sql, params=params)
        return [str(t) for t in relation.types], relation.to_arrow_reader()
    result = submit(sql, params, "stream", _BATCH_ROWS)
    return [str(column[1]) for column in result.description], result.arrow_reader()


def _batches(reader: pa.RecordBatchReader):
    """The reader's batches; an engine error raised while they stream (a failed conversion,
    the statement timeout's interrupt) comes out of Arrow as an ``OSError`` carrying the
    engine's text, and is raised as the engine's own error class again, so that every caller
    treats it as it treats the same error raised by the statement."""
    try:
        yield from reader
    except OSError as failure:
        text = str(failure)
        kind = duckdb.InterruptException if text.startswith("INTERRUPT") else duckdb.Error
        raise kind(text) from None


# Rows per streamed batch: a batch is built whole before the answer caps can look at it, so it
# bounds the memory one answer takes (1,024 rows of a 4 KB string: 4 MB; 131,072, DuckDB's
# default: 1 GB), and small batches stream no slower (4.3 against 13.5 ms for 100,000 rows).
_BATCH_ROWS = 1024


# Arrow has no 128-bit integer: DuckDB exports HUGEINT (the type of SUM over integers) as
# decimal128(38, 0), which Arrow turns into ``Decimal`` in Python where DuckDB itself gives
# ``int``. The field keeps the engine's type in its metadata, so results can be converted as
# DuckDB converts them (``is_wide_integer``).
_ENGINE_TYPE = b"sqlsdc.engine_type"
_WIDE_INTEGERS = frozenset({"HUGEINT", "UHUGEINT"})


def _mark_wide_integers(table: pa.Table, types: list[str]) -> pa.Table:
    """``table`` with its HUGEINT/UHUGEINT fields marked (Arrow types and values unchanged)."""
    if not _WIDE_INTEGERS.intersection(types):
        return table
    fields = [
        field.with_metadata({_ENGINE_TYPE: kind.encode()}) if kind in _WIDE_INTEGERS else field
        for field, kind in zip(table.schema, types, strict=True)
    ]
    return pa.Table.from_arrays(table.columns, schema=pa.schema(fields, table.schema.metadata))


def mark_wide_integers(table: pa.Table, names: set[str]) -> pa.Table:
    """``table`` with the named fields (exact integers as decimal128(38, 0)) marked HUGEINT,
    as :func:`run` marks a result's: registered with :func:`register`, DuckDB reads them as
    HUGEINT; an engine that reads Arrow (Spark) sees DECIMAL(38, 0)."""
    kinds = ["HUGEINT" if name in names else "" for name in table.column_names]
    return _mark_wide_integers(table, kinds)


_HUGEINT = pa.opaque(pa.binary(16), "hugeint", "DuckDB")  # DuckDB's own Arrow HUGEINT


def register(con: duckdb.DuckDBPyConnection, name: str, table: pa.Table) -> None:
    """Register ``table`` under ``name``; its fields marked HUGEINT become HUGEINT columns
    (DuckDB reads Arrow's decimal128(38, 0) as DECIMAL(38,0), whose values Python would get as
    ``Decimal``): DuckDB's opaque Arrow type, 16 bytes of two's complement, little-endian."""
    for i, field in enumerate(table.schema):
        if is_wide_integer(field):
            values = [None if v is None else int(v).to_bytes(16, "little", signed=True)
                      for v in table.column(i).to_pylist()]  # fmt: skip
            column = pa.ExtensionArray.from_storage(_HUGEINT, pa.array(values, pa.binary(16)))
            table = table.set_column(i, pa.field(field.name, _HUGEINT), column)
    con.register(name, table)


def without_marks(table: pa.Table) -> pa.Table:
    """``table`` as DuckDB exports it: the fields without the marks of ``run``."""
    if not any(_ENGINE_TYPE in (field.metadata or {}) for field in table.schema):
        return table
    fields = [field.remove_metadata() for field in table.schema]
    return pa.Table.from_arrays(table.columns, schema=pa.schema(fields, table.schema.metadata))


def type_names(schema: pa.Schema) -> list[str]:
    """DuckDB's names of a result's column types, as its own cursor's ``description`` gives
    them (``BIGINT``, ``DOUBLE``, ``VARCHAR``, ``DECIMAL(18,3)``): the types DuckDB reads the
    Arrow ``schema`` as, and HUGEINT/UHUGEINT where :func:`run` marked a field.

    >>> type_names(pa.schema([("n", pa.int64()), ("v", pa.decimal128(18, 3))]))
    ['BIGINT', 'DECIMAL(18,3)']
    """
    return list(_type_names(schema))


@lru_cache(maxsize=256)
def _type_names(schema: pa.Schema) -> tuple[str, ...]:
    read = [str(t) for t in _type_reader().from_arrow(schema.empty_table()).types]
    marks = [(f.metadata or {}).get(_ENGINE_TYPE, b"").decode() for f in schema]
    return tuple(mark or name for mark, name in zip(marks, read, strict=True))


def result_schema(con: duckdb.DuckDBPyConnection, sql: str) -> pa.Schema:
    """The Arrow schema of the result of ``sql`` as DuckDB's cursor exports it (HUGEINT as
    decimal128(38, 0)), from binding ``sql`` on ``con`` only: nothing runs. Another engine's
    answer to the same tree is typed by it (:mod:`sqlsdc.guard.spark`)."""
    relation = con.sql(sql)
    columns = ", ".join(f"CAST(NULL AS {kind}) AS c{i}" for i, kind in enumerate(relation.types))
    empty = _type_reader().sql(f"SELECT {columns} LIMIT 0").to_arrow_table()
    return pa.schema(
        f.with_name(name) for f, name in zip(empty.schema, relation.columns, strict=True)
    )


def _type_reader() -> duckdb.DuckDBPyConnection:
    """This thread's connection to the private in-memory instance (:func:`_scratch`), for
    reading types and parsing: hardened and set as every file's instance (UTC), so a
    TIMESTAMPTZ is named as a file's connection gives it whatever the process's TZ."""
    return _scratch_cursor(_TYPE_READER)


def is_wide_integer(field: pa.Field) -> bool:
    """Whether a result field is a DuckDB HUGEINT/UHUGEINT (an integer shown as a decimal)."""
    return bool(field.metadata) and field.metadata.get(_ENGINE_TYPE, b"").decode() in _WIDE_INTEGERS


_WRITE_FAILURES = (  # what the operating system says, as DuckDB quotes it -> sqlsdc's words
    ("no space left", "the disk is full"),
    ("file too large", "a file would exceed the size this process may write"),
    ("read-only file system", "the file system is read-only"),
    ("permission denied", "no permission to write the file"),
)


def write_failure(error: BaseException) -> BaseException:
    """``error`` as an :class:`OperationalError` when DuckDB could not write a file (a full
    disk, a file size limit, a read-only file system): the command failed for the file
    system, not for a bug of sqlsdc. Any other error is returned as it is. The engine's text
    (it names the file) is kept in ``detail``."""
    text = str(error).lower()
    # a COMMIT whose write-ahead log could not grow is a TransactionException quoting the write
    if not isinstance(error, duckdb.IOException) and not (
        isinstance(error, duckdb.Error) and "could not write file" in text
    ):
        return error
    why = next((words for found, words in _WRITE_FAILURES if found in text),
               "the engine could not write a file")  # fmt: skip
    return OperationalError(
        f"{why}: the command could not write its results (a job stores nothing then, a "
        "publication writes no file); make room (or allow writing) and run it again",
        detail=str(error),
    )


def rollback(con) -> None:
    """Roll back the open transaction, if there is one (DuckDB ends a transaction whose COMMIT
    failed by itself, and then refuses a ROLLBACK)."""
    try:
        con.execute("ROLLBACK")
    except duckdb.Error:
        pass


@lru_cache(maxsize=1024)
def parsed(sql: str) -> duckdb.Statement:
    """``sql`` (one statement of sqlsdc's own) parsed once: ``execute`` of a parsed statement
    skips DuckDB's parser, 0.1-0.2 ms of each catalog write on every guarded query."""
    (statement,) = _type_reader().extract_statements(sql)
    return statement


# Parsed statements are engine objects: let them go before the interpreter tears the engine's
# module down, or nanobind reports them as leaked on stderr at exit.
atexit.register(parsed.cache_clear)


def one(con: duckdb.DuckDBPyConnection, sql, params=None) -> tuple | None:
    """The first row of a statement's result, or None; always consumes the whole result."""
    rows = con.execute(sql, params).fetchall()
    return rows[0] if rows else None
