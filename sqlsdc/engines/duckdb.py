"""The DuckDB engine: opening hardened connections, generating DuckDB SQL, running it.

This is the only module of the core that imports duckdb. Hardening follows the verified notes in
``shared/reference/ecosystem.md`` §2: extension installs and autoloading off, Python replacement
scans off, persistent secrets off at connect time; then, after connect (DuckDB refuses it before),
``allowed_directories`` emptied, external access disabled and the configuration locked, so no
statement can re-enable files, network or extensions.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import random
import re
import threading
import time
import warnings
from functools import cache, lru_cache
from pathlib import Path

import duckdb
import pyarrow as pa
from sqlglot import exp
from sqlglot.dialects.duckdb import DuckDB

from sqlsdc.engines import ctrl_c, file_lock, watchdog
from sqlsdc.engines.trees import copy_tree, release
from sqlsdc.errors import (
    AnswerTooLarge,
    Error,
    InterfaceError,
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
or its binding of constants alone while listing the tables read (:func:`tables_read_by`)."""
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
    if _foreign_file(path):  # before the lock: no <file>.lock is left beside a text file
        raise _open_failure(path, "not a valid duckdb database", wait)
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
                    text = _without_path(str(e), path).lower()
                    if "lock" not in text:
                        break
            if time.monotonic() + pause > deadline:
                break
            if not first and marker is not None and time.monotonic() > started + FIRST_SECONDS:
                first = True  # waited long: it goes first now, as an admin command does
                marker.unlink(missing_ok=True)
                marker = None
            marker = marker or _mark_waiting(path, first)
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
    raise _open_failure(path, text, wait) from None


def _without_path(text: str, path: Path) -> str:
    """The engine's message without the file's path, whose words ("lock", "sqlite") are not
    the engine's reason."""
    for spelling in sorted({str(path.resolve()), str(path)}, key=len, reverse=True):
        text = text.replace(spelling, "<database>")
    return text


SQLITE_HEADER = b"SQLite format 3\x00"
DUCKDB_MAGIC = (8, b"DUCK")  # where every DuckDB file says what it is: after an 8-byte checksum


def _foreign_file(path: Path) -> bool:
    """Whether ``path`` is a file that is no DuckDB database by its first bytes (a policy
    YAML, a CSV or a SQLite file named by mistake), known without opening it: opening it took
    the lock first and left ``<file>.lock`` beside it. An empty file is left to
    DuckDB: a database another process is creating is empty for a moment (its first write is a
    whole header block)."""
    offset, magic = DUCKDB_MAGIC
    try:
        with open(path, "rb") as file:
            head = file.read(offset + len(magic))
    except OSError:  # absent, a folder, unreadable: the open says what it is
        return False
    return bool(head) and head[offset:] != magic


def _open_failure(path: Path, text: str, wait: float) -> Error:
    """sqlsdc's error for a database file DuckDB would not open (``text``: the engine's last
    message, lower case, which is not shown: it is not sqlsdc's to word). A file that is not a
    DuckDB database (a text file, a SQLite database, an empty file) is a database not found
    at that path (:class:`NotFoundError`, the CLI's exit code 8): the remedy is the right
    path, as for a missing file. A lock held too long, no permission, a read-only file system
    or another DuckDB version are the engine's or the file system's (:class:`OperationalError`)."""
    if "not a valid duckdb database" in text or "sqlite" in text:
        data = _data_file(path)
        if data:  # microdata named where the database belongs: say how to load it
            table = re.sub(r"\W", "_", path.stem) or "data"
            return NotFoundError(
                f"{path} is a {data} file, not a database; load it into a DuckDB database "
                f"first (in DuckDB: CREATE TABLE {table} AS FROM '{path.name}'; README, \"Your "
                'own data") and name that database'
            )
        return NotFoundError(
            f"{path} {_what_file(path)}; name the database file made by `sqlsdc init` or "
            "`sqlsdc demo`"
        )
    if "lock" in text:
        why = (
            f"another process has held a lock on it for {wait:g} s (a guarded connection "
            "running statements, or an admin command); try again, or close that process"
        )
    elif "permission denied" in text or "read-only file system" in text:
        why = (
            "it cannot be written here (a read-only file system or no permission); "
            "choose another place or ask for write access"
        )
    elif "version" in text:
        why = "it was written by another DuckDB version than this one"
    elif "configuration" in text:
        return Error(f"cannot open database {path}: it is open in this process with other "
                     "settings")  # fmt: skip
    else:
        why = "the engine refused to open it"
    return OperationalError(f"cannot open database {path}: {why}", detail=text)


_DATA_SUFFIXES = {".csv": "CSV", ".tsv": "CSV", ".parquet": "Parquet", ".json": "JSON",
                  ".jsonl": "JSON", ".ndjson": "JSON", ".xlsx": "Excel"}  # fmt: skip


def _data_file(path: Path) -> str | None:
    """The kind of data file ``path`` is by its name (or a Parquet file by its first bytes),
    or None: a new user's ``sqlsdc init businesses.csv`` was told to name the database made
    by `sqlsdc init` (new user s38)."""
    try:
        with open(path, "rb") as file:
            if file.read(4) == b"PAR1":
                return "Parquet"
    except OSError:
        return None
    return _DATA_SUFFIXES.get(path.suffix.lower())


def _what_file(path: Path) -> str:
    """What a file that DuckDB does not open is, in words, from its first bytes."""
    try:
        with open(path, "rb") as file:
            head = file.read(len(SQLITE_HEADER))
    except OSError:
        head = b"?"
    if not head:
        return "is an empty file, not a DuckDB database"
    if head == SQLITE_HEADER:
        return "is a SQLite database, not a DuckDB one (sqlsdc works on DuckDB files)"
    return "is not a DuckDB database file"


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


_WAITING = ".waiting"  # the folder of the processes waiting for a database file: <db>.waiting


def _waiting_folder(path: Path) -> Path:
    return path.with_name(path.name + _WAITING)


def _mark_waiting(path: Path, first: bool = False) -> Path | None:
    """A file named by this process's id in ``<db>.waiting/`` (``<pid>.first`` for an opening
    that goes first), while it waits for the file."""
    folder = _waiting_folder(path)
    try:
        folder.mkdir(exist_ok=True)
        marker = folder / f"{os.getpid()}{_FIRST if first else ''}"
        marker.touch()
        return marker
    except OSError:  # a read-only folder: holders then never hear of this waiter
        return None


_FIRST = ".first"


def others_waiting(path: str | Path, *, first: bool = False) -> bool:
    """Whether another live process waits to open the database file (:func:`open_database`
    marks itself): a busy holder then releases the file for a turn, and otherwise keeps it.
    ``first``: only an opening that goes first (an admin command, a job) counts; a holder
    lets the file go after its statement for it, and guarded connections let it in first."""
    try:  # a string, not pathlib: asked after every guarded statement (0.02 ms against 0.005)
        waiters = os.listdir(os.fspath(path) + _WAITING)
    except OSError:
        return False
    for name in waiters:
        pid, _, kind = name.partition(".")
        if first and f".{kind}" != _FIRST:
            continue
        if pid.isdigit() and int(pid) != os.getpid() and _alive(int(pid)):
            return True
    return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


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
    cursor = getattr(_SCRATCH_CURSORS, "cursor", None)
    if cursor is None:
        with _OPEN_LOCK:
            cursor = _SCRATCH_CURSORS.cursor = _scratch().cursor()
    try:
        return type_names(run(cursor, sql, timeout=timeout).schema)[0]
    except (duckdb.InternalException, duckdb.FatalException):
        # DuckDB may have invalidated the instance: later constants get a fresh one
        _SCRATCH_CURSORS.cursor = None
        with _OPEN_LOCK:
            _scratch.cache_clear()
        raise


_SCRATCH_CURSORS = threading.local()


@cache
def _scratch() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(":memory:", config=dict(_CONNECT_CONFIG))
    _harden(con)  # under _OPEN_LOCK (evaluate_constant)
    return con


def system_functions(con: duckdb.DuckDBPyConnection) -> frozenset[str]:
    """Names of built-in scalar and aggregate functions that can be called as system.main.f()."""
    rows = con.execute(
        "SELECT DISTINCT lower(function_name) FROM duckdb_functions() "
        "WHERE internal AND function_type IN ('scalar', 'aggregate') AND schema_name = 'main'"
    ).fetchall()
    return frozenset(r[0] for r in rows)


@cache
def builtin_functions() -> frozenset[str]:
    """Built-in functions of this DuckDB version, read once from a private in-memory database."""
    con = duckdb.connect(":memory:", config=dict(_CONNECT_CONFIG))
    try:
        return system_functions(con)
    finally:
        con.close()


class _QualifiedGenerator(DuckDB.Generator):
    """DuckDB SQL in which every call of a built-in function reads ``system.main.f(...)``.

    A user macro named like a built-in (``CREATE MACRO round(a, b) AS a``) would otherwise win
    over it and silently undo a protection (``shared/reference/ecosystem.md`` §2.1); a
    schema-qualified call always reaches the built-in. Qualifying in the generator covers every
    call, nested ones and those sqlglot writes under another name, whatever AST built them.
    """

    def func(
        self, name: str, *args, prefix: str = "(", suffix: str = ")", normalize: bool = True
    ) -> str:
        call = super().func(name, *args, prefix=prefix, suffix=suffix, normalize=normalize)
        if prefix == "(" and name.lower() in builtin_functions():
            return f"system.main.{call}"
        return call

    def datetrunc_sql(self, expression: exp.DateTrunc) -> str:
        return self._total_truncation(expression, super().datetrunc_sql(expression))

    def timestamptrunc_sql(self, expression: exp.TimestampTrunc) -> str:
        return self._total_truncation(expression, super().timestamptrunc_sql(expression))

    def _total_truncation(self, expression: exp.Expr, truncated: str) -> str:
        """DATE_TRUNC to the year, quarter, month or ISO year raises for a timestamp of the
        type's first year (-290308: its 1 January is out of range), so whether a query that
        truncates stored values fails would tell whether a row of its cells holds one. Stored
        values of that year truncate to NULL, whatever the part (``epoch_us`` is total on
        every TIMESTAMP type and, with UTC sessions, compares instants alike; it is NULL for
        ±infinity, which truncate to themselves); constants are evaluated before the query
        and keep DuckDB's error."""
        if not any(isinstance(n, exp.Column) for n in expression.this.walk()):
            return truncated
        instant = self.func("epoch_us", expression.this)
        return f"CASE WHEN {instant} < {TRUNCATABLE_EPOCH_US} THEN NULL ELSE {truncated} END"


TRUNCATABLE_EPOCH_US = -9223371158400000000
"""``epoch_us(TIMESTAMP '-290307-01-01')``: DuckDB truncates every timestamp from there on."""


class QualifiedDuckDB(DuckDB):
    Generator = _QualifiedGenerator


def require_extensible_sqlglot() -> None:
    """Refuse to work with sqlglot's compiled build (the ``sqlglotc`` package, which
    ``sqlglot[c]`` or another tool may install): its classes cannot be subclassed from Python,
    so the generator above, and with it every check, would fail. The guard fails closed
    either way; this says why and what to do, before any query."""
    try:
        QualifiedDuckDB().generator()
    except TypeError as e:  # "interpreted classes cannot inherit from compiled"
        raise InterfaceError(
            f"sqlglot's compiled build is installed ({e}); sqlsdc extends sqlglot's SQL "
            "generator, which that build does not allow: run `pip uninstall sqlglotc`"
        ) from None


def to_sql(tree: exp.Expr) -> str:
    """DuckDB SQL for a protected tree, with built-in functions schema-qualified.

    The generator changes some trees it prints, so it prints a copy (sharing the type
    annotations, :func:`~sqlsdc.engines.trees.copy_tree`), released right after; the copy
    refers to the WHERE conditions, output expressions and group keys that the generator only
    reads instead of copying them (:func:`_read_only_parts`: a long condition or group key is
    most of a large statement)."""
    copy = copy_tree(tree, shared=_read_only_parts(tree))
    try:
        return QualifiedDuckDB().generate(copy, copy=False)
    finally:
        release([copy])


PRINTED_AS_READ = frozenset({
    exp.And, exp.Or, exp.Paren, exp.Not, exp.Between, exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT,
    exp.LTE, exp.Is, exp.In, exp.Column, exp.Identifier, exp.Literal, exp.Null, exp.Boolean,
    exp.Neg, exp.Case,
})  # fmt: skip
"""Classes whose SQL the generator writes by reading the node and its subtree only: it changes
neither (sqlglot 30.30: the base generator's connectors, comparisons, BETWEEN, IS, NOT, column,
identifier, literal, parenthesis and CASE, and DuckDB's IN, which builds a new tree only for an
IN UNNEST, whose UNNEST is no class of this set; its IS of a boolean prints a copy). A CASE's
WHEN branches (``If`` nodes in its ``ifs``) are read by the CASE's handler itself; an ``If``
anywhere else is printed by a handler that makes it the child of a new CASE, so it is not in
the set. The generator reaches a WHERE's condition through its SELECT and WHERE, an output's
expression through its SELECT and alias, and a group key through its SELECT and GROUP BY,
which read them too (DuckDB's SELECT transforms change only CONNECT BY and GENERATOR
queries), and prepares only the root it is given (DuckDB moves no CTE and adds no boolean
comparison). ``tests/test_guard_size.py`` pins the generator's handler of each class, so that
a sqlglot that prints one otherwise fails there first."""


def _printed_as_read(node: exp.Expr) -> bool:
    """Whether every node of ``node``'s subtree is of a :data:`PRINTED_AS_READ` class, or a WHEN
    branch of a CASE (its handler reads the branch); the walk stops at the first that is not."""
    Expr, If, Case = exp.Expr, exp.If, exp.Case
    stack = [node]
    push, pop = stack.append, stack.pop
    while stack:
        current = pop()
        if current.__class__ not in PRINTED_AS_READ and not (
            current.__class__ is If
            and current.parent.__class__ is Case
            and current.arg_key == "ifs"
        ):
            return False
        for value in current.args.values():
            if isinstance(value, Expr):
                push(value)
            elif type(value) is list:
                for item in value:
                    if isinstance(item, Expr):
                        push(item)
    return True


def _read_only_parts(tree: exp.Expr) -> set[int]:
    """The ids of the WHERE conditions, aliased output expressions and GROUP BY keys of
    ``tree`` that the generator prints without changing them (:func:`_printed_as_read`). The
    walk does not enter them."""
    found = set()
    Expr, Where, Select, Group, Alias = exp.Expr, exp.Where, exp.Select, exp.Group, exp.Alias
    stack = [tree]
    push, pop = stack.append, stack.pop
    while stack:
        node = pop()
        cls = node.__class__
        if cls is Where:
            parts = [node.args.get("this")]
        elif cls is Select:
            parts = [p.args.get("this") for p in node.expressions if p.__class__ is Alias]
        elif cls is Group:
            parts = list(node.expressions)
        else:
            parts = []
        for part in parts:
            if isinstance(part, Expr) and _printed_as_read(part):
                found.add(id(part))
        for value in node.args.values():
            if isinstance(value, Expr):
                if id(value) not in found:
                    push(value)
            elif type(value) is list:
                for item in value:
                    if isinstance(item, Expr) and id(item) not in found:
                        push(item)
    return found


def table_schemas(
    con: duckdb.DuckDBPyConnection, schema: str = "main"
) -> dict[str, dict[str, str]]:
    """``{table: {column: type}}`` of the user tables and views in ``schema``."""
    rows = con.execute(
        "SELECT lower(table_name), lower(column_name), data_type FROM information_schema.columns "
        "WHERE table_catalog = current_database() AND table_schema = ? "
        "ORDER BY table_name, ordinal_position",
        [schema],
    ).fetchall()
    schemas: dict[str, dict[str, str]] = {}
    for table, column, dtype in rows:
        schemas.setdefault(table, {})[column] = dtype
    return schemas


def described(
    con: duckdb.DuckDBPyConnection, tables: list[str], schema: str = "main"
) -> dict[str, list[tuple[str, str, str | None]]]:
    """``{table: [(column, type, key), ...]}`` of the named tables or views of ``schema`` in
    the connection's database (``DESCRIBE``: types as ``table_schemas`` spells them; key
    ``PRI`` or ``UNI`` on a column of a primary key or unique constraint, single-column or
    not); a table that does not exist is left out.

    Unlike the listings of the engine's catalog (``duckdb_tables()``, ``duckdb_columns()``,
    ``information_schema``), which build and bind every system view of a newly opened
    database first, 7-13 ms apiece, a description reads the named table alone (0.3 ms). Only
    outside a transaction: a table that does not exist fails the statement, and a failed
    statement aborts the transaction it is in.
    """
    (database,) = one(con, "SELECT current_database()")
    found = {}
    for table in tables:
        name = ".".join(f'"{_quoted(part)}"' for part in (database, schema, table))
        try:
            rows = con.execute(f"DESCRIBE {name}").fetchall()
        except duckdb.CatalogException:
            continue
        found[table] = [(column, dtype, key) for column, dtype, _null, key, *_ in rows]
    return found


def table_columns(con: duckdb.DuckDBPyConnection, schema: str, table: str) -> list[str]:
    """Column names of ``schema.table`` in order (empty when it does not exist)."""
    rows = con.execute(
        "SELECT column_name FROM duckdb_columns() WHERE database_name = current_database() "
        "AND schema_name = ? AND table_name = ? ORDER BY column_index",
        [schema, table],
    ).fetchall()
    return [r[0] for r in rows]


def base_tables(con: duckdb.DuckDBPyConnection) -> set[str]:
    """Names of real tables (not views) in the main schema."""
    rows = con.execute(
        "SELECT lower(table_name) FROM duckdb_tables() "
        "WHERE database_name = current_database() AND schema_name = 'main'"
    ).fetchall()
    return {r[0] for r in rows}


def data_version(con: duckdb.DuckDBPyConnection, table: str) -> str:
    """A fingerprint of a table's rows: their count, and the XOR and the sum of their hashes.
    DP cells are named by it, so changed data gets fresh noise, never the old noise over a new
    exact value. The sum keeps what the XOR alone loses: two equal rows cancel in an XOR, so
    a pair of duplicates replaced by another pair would keep the version.

    DuckDB hashes values that compare equal alike, but some of them are told apart by
    functions an analyst may call: ``-0.0`` and ``0.0`` (``1 / x``, ``CAST(x AS VARCHAR)``),
    the NaNs of either sign, ``INTERVAL '1 month'`` and ``'30 days'`` (``date_part``). A
    column of such a type is hashed again by what tells them apart (:func:`_distinguishing`):
    a row changed from one to the other changes the version. Tables without such a column
    keep the fingerprint of their rows alone.

    The row is read by the table's name, unless a column has that name (``hash("visits")``
    of a table with a column ``visits`` hashed that column alone, and an update of any other
    kept the version): then by that name with underscores before it, one that no column has
    (a row's hash does not depend on the name it is read by)."""
    columns = [
        (d[0], str(d[1])) for d in con.execute(f'SELECT * FROM "{table}" LIMIT 0').description
    ]
    names = {name.lower() for name, _kind in columns}
    row = table
    while row.lower() in names:
        row = "_" + row
    texts = "".join(
        f", {text}"
        for name, kind in columns
        if (text := _distinguishing(f'"{row}"."{_quoted(name)}"', kind)) is not None
    )
    rows, xor, total = one(
        con,
        f'SELECT count(*), bit_xor(hash("{row}"{texts})), sum(hash("{row}"{texts})) '
        f'FROM "{table}" AS "{row}"',
    )
    return f"{rows}:{xor}:{total or 0}"


_EQUAL_BUT_DISTINCT = ("FLOAT", "DOUBLE", "REAL", "INTERVAL")
"""Types with values that DuckDB hashes alike and functions tell apart (:func:`data_version`)."""


def _distinguishing(column: str, kind: str) -> str | None:
    """What :func:`data_version` hashes besides the row for a column of type ``kind``: the
    sign bit of a plain float (the zeros and the NaNs that are hashed alike differ by it
    alone; formatting every float as text made the version of a table of doubles eight times
    slower), the text of an interval or of a nested value holding either; None for other
    types."""
    kind = kind.upper()
    if kind in ("FLOAT", "DOUBLE", "REAL"):
        return f"signbit({column})"
    if any(t in kind for t in _EQUAL_BUT_DISTINCT):
        return f"CAST({column} AS VARCHAR)"
    return None


def _quoted(name: str) -> str:
    return name.replace('"', '""')


def tables_read_by(con: duckdb.DuckDBPyConnection, sql: str) -> set[str]:
    """The tables DuckDB's own parser says a statement reads (defence in depth). It reads no
    data, but binds constants: ``x BETWEEN '3' AND 5`` raises a :data:`TextRefusal` ("Cannot
    mix values of type VARCHAR and INTEGER_LITERAL"), though running the statement binds it."""
    return {name.split(".")[-1].lower() for name in con.get_table_names(sql, qualified=False)}


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


_TYPE_READER = threading.local()  # an in-memory connection per thread, to name Arrow types


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
    """This thread's private in-memory connection, for reading types and parsing."""
    con = getattr(_TYPE_READER, "con", None)
    if con is None:
        con = _TYPE_READER.con = duckdb.connect(":memory:", config=dict(_CONNECT_CONFIG))
    return con


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
