"""What every back-end job shares with the others: its audited opening of the catalog.

Protection jobs (:mod:`sqlsdc.jobs.job`), anonymisation (:mod:`sqlsdc.jobs.anonymize`) and
synthesis (:mod:`sqlsdc.synth.job`) each open the database once, read-write, under a query id
of their own (:func:`job_catalog`): the job is audited there ``accepted`` with its output,
``refused`` or ``failed`` otherwise, and the jobs of one process on one file take turns, so a
job's checks of the stored outputs and its own store are one step. Their outputs go to the
schema :data:`OUTPUT_SCHEMA`, their reports to ``sqlsdc.outputs`` as strict JSON
(:func:`json_safe`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

import numpy as np

from sqlsdc.catalog import store
from sqlsdc.engines import duckdb as engine
from sqlsdc.errors import TabularError
from sqlsdc.jobs.class_views import classes_of_noised_values
from sqlsdc.policy import load_policy

OUTPUT_SCHEMA = "protected"  # the schema of every job's stored output


def job_fingerprint(method: str, into: str, sql: str) -> str:
    """A short digest of what a job does (as guarded queries are fingerprinted)."""
    text = json.dumps({"job": method, "into": into, "sql": sql}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# one lock per database file: a process's jobs on one file take turns (processes do already)
_JOB_TURNS: dict[Path, threading.RLock] = {}
_JOB_TURNS_LOCK = threading.Lock()


def _job_turn(db: str | Path) -> threading.RLock:
    """This process's turn lock of the database file ``db``.

    A job checks the stored outputs when it starts (a second protection of the same cells, a
    small difference of populations) and stores its own output seconds later. Processes take
    turns on the file (its lock is held from the opening to the closing of the job's
    connection), but threads of one process share that lock: red team s37c stored a
    suppression and a rounding of the same cells from two threads, both checked before either
    had stored. Held for the whole job, this lock makes the checks and the store one step."""
    key = Path(db).resolve()
    with _JOB_TURNS_LOCK:
        return _JOB_TURNS.setdefault(key, threading.RLock())


_HANDED: ContextVar[list | None] = ContextVar("sqlsdc_handed_job_connection", default=None)
"""``[path, connection]`` handed to the next job on that file (:func:`handed_connection`)."""


@contextmanager
def handed_connection(db: str | Path, con) -> Iterator[None]:
    """The first job on ``db`` run within the block writes through ``con`` (read-write, open
    on ``db``; its opener closes it) instead of opening the file again: the CLI opened it to
    find the acting admin (~30 ms of CPU per opening). Once: a later job opens its own, so no
    job inherits the state another left. ``con`` None: nothing is handed."""
    if con is None:
        yield
        return
    token = _HANDED.set([Path(db).resolve(), con])
    try:
        yield
    finally:
        _HANDED.reset(token)


def _handed(db: str | Path):
    """The connection handed for ``db`` (taken: it serves one job), or None."""
    handed = _HANDED.get()
    if handed is None or handed[1] is None or handed[0] != Path(db).resolve():
        return None
    con, handed[1] = handed[1], None
    return con


@contextmanager
def job_catalog(db: str | Path, user: str, method: str, into: str, request: str) -> Iterator:
    """``(connection, query id, fingerprint, audit)`` for one back-end job on ``db``: the
    connection (read-write, closed afterwards), the job's own audit entry id, and
    ``audit(decision, reason=...)`` writing that entry for ``request`` by ``user``. The jobs
    of this process on ``db`` take turns (:func:`_job_turn`). A connection handed over
    (:func:`handed_connection`) is used, not closed."""
    with _job_turn(db):
        yield from _job_connection(db, user, method, into, request)


def _job_connection(db, user: str, method: str, into: str, request: str) -> Iterator:
    """The body of :func:`job_catalog`, run while the job holds its turn."""
    con = handed = _handed(db)
    if con is None:
        con = engine.open_database(db, read_only=False)
    try:
        current = store.current_policy(con)
        if current is None:
            raise store.no_catalog(db, con)
        query_id = store.next_query_id(con)
        fingerprint = job_fingerprint(method, into, request)
        record = functools.partial(store.record_query, con, query_id, user, current[0],
                                   sql=request, fingerprint=fingerprint)  # fmt: skip

        def audit(decision: str, **details) -> None:
            if decision != "accepted" and store.has_outcome(con, query_id):
                return  # stored (accepted) just before an interrupt: that entry stands
            record(decision, **details)

        # a dimension that is the class of a unit-noised measure: the class of x·m (s47d)
        with classes_of_noised_values(con, load_policy(current[1], name=current[2])):
            yield con, query_id, fingerprint, audit
    except engine.EngineError as failure:  # audited by the job; a full disk is no bug
        told = engine.write_failure(failure)
        if told is failure and isinstance(failure, engine.StatementFailure):
            told = TabularError(  # told, without the engine's text (test_redteam_s39b.py)
                "the job's SQL fails in the engine (a column it cannot find, or a cast or an "
                "expression that fails on some row); correct the --sql. The engine's text, "
                "which may quote data, is in the job's audit entry (sqlsdc audit)"
            )
        if told is failure:
            raise
        raise told from None
    finally:
        if handed is None:
            con.close()


def json_safe(value):
    """JSON-safe copy: NaN and infinities become null (strict JSON has neither)."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
