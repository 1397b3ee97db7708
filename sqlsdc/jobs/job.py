"""The steps every protection job runs: open, tabulate, protect, store.

Every job runs the same steps (:class:`Job`): :func:`open_job` checks the acting admin, the
output name and the SQL (:func:`~sqlsdc.jobs.tabulation.parse_job`: one aggregation of one
confidential table; the checks against the policy and the stored outputs are
:func:`~sqlsdc.jobs.refusals.refuse_job`); :meth:`Job.tabulate` computes the inner cells in
SQL (:func:`~sqlsdc.jobs.tabulation.cells_sql`) and builds the table; the method runs on those
aggregated cells (suppression in :mod:`sqlsdc.jobs.protect`; controlled rounding, controlled
tabular adjustment and raking in :mod:`sqlsdc.jobs.adjust`); :meth:`Job.store` writes
``protected.<into>``, its record in ``sqlsdc.outputs`` (what, by whom, how, the report), a
ledger row per released cell and value column, and the job's ``accepted`` audit entry in one
transaction, only after the method succeeded. A refused job is audited ``refused``, a failed
one ``failed``; neither leaves a table or ledger rows.

Ledger rows are per cell, not per table: the rows are written by one INSERT … SELECT over the
stored cells (a 10^6-cell table takes about a second), and only per-cell rows let the ledger
answer "was this cell released, to whom, how". The cell identity is the one guarded queries
use (:func:`sqlsdc.catalog.store.ledger_insert`: the confidential table, the key values by
column name) plus the job's WHERE as the population, so cells of different populations never
share an identity.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow as pa

from sqlsdc.catalog import store
from sqlsdc.catalog.store import require_admin
from sqlsdc.engines import duckdb as engine
from sqlsdc.errors import Error, TabularError, VerificationError
from sqlsdc.jobs.output_store import storing_output
from sqlsdc.jobs.refusals import refuse_job
from sqlsdc.jobs.session import OUTPUT_SCHEMA, job_catalog, job_fingerprint, json_safe
from sqlsdc.jobs.tabulation import (
    JobSpec,
    cells_sql,
    cells_table,
    parse_job,
    population_where,
    rules_of,
)
from sqlsdc.policy import Policy, load_policy
from sqlsdc.tabular.model import Table
from sqlsdc.tabular.rules import required_top_k

Progress = Callable[[str], None]  # called with the name of each step as it starts


@dataclass(eq=False)
class Job:
    """An opened job: the writable connection, the acting admin, the policy and the parsed SQL.

    Every method's job runs the same steps: :func:`open_job` (admin check, SQL check, name
    check), :meth:`tabulate` (inner cells in SQL, a :class:`Table` in Python), the method on
    the table, and :meth:`store`, which writes the output table, its ``sqlsdc.outputs`` record,
    the ledger rows of its cells and the audit entry in one transaction, so a failed job
    leaves nothing behind but its audit entry.
    """

    con: object
    user: str
    policy_version: int
    policy: Policy
    spec: JobSpec
    sql: str
    into: str
    method: str
    query_id: int
    progress: Progress | None = None
    live_total: bool = False  # its grand total is a cell the live pattern publishes

    @property
    def name(self) -> str:
        return f"{OUTPUT_SCHEMA}.{self.into}"

    @property
    def fingerprint(self) -> str:
        """The job's identity in the audit log and the ledger: method, output and SQL."""
        return job_fingerprint(self.method, self.into, self.sql)

    def step(self, what: str) -> None:
        """Report the step that starts now (the CLI shows it on stderr)."""
        if self.progress is not None:
            self.progress(what)

    def tabulate(self, rules: Sequence = ()) -> Table:
        """The table with the top contributions ``rules`` need, from inner cells computed in
        SQL (:func:`cells_sql`)."""
        self.step("computing the cells in SQL")
        top_k = required_top_k(rules) if rules else 0
        frame = self.con.sql(cells_sql(self.spec, top_k)).df()
        if frame.empty:
            raise TabularError("no row matched; the job has no cell to protect")
        if (frame["spread"] > 1).any():
            raise TabularError(
                "some units lie in several inner cells (their rows differ in the dimensions); "
                "the job needs each unit in one inner cell, as the margins' counts and largest "
                "contributions are built from the inner cells"
            )
        if self.spec.rows and (frame["rows"] > 1).any():
            raise TabularError(
                f"COUNT(*) counts rows, and some units of {self.spec.table} have several: the "
                "job counts and protects units; write "
                f"COUNT(DISTINCT {self.spec.unit}) to count them"
            )
        return cells_table(frame, self.spec, self.policy, top_k)

    def store(
        self,
        out: pd.DataFrame,
        report: dict,
        released: pd.DataFrame,
        *,
        values: Sequence[str] = ("value",),
        status: str | None = None,
        extra: Sequence[tuple[pd.DataFrame, Sequence[str]]] = (),
        kept: Callable[[], None] | None = None,
    ) -> None:
        """Write ``protected.<into>``, its ``sqlsdc.outputs`` record, the ledger rows of the
        released cells and the job's audit entry: all or nothing.

        ``released`` holds every cell of the table (cells published as 0 included, although
        ``out`` may leave them out): its dimensions, the ``values`` columns and optionally a
        ``status`` column (``published``/``suppressed``). ``extra`` adds ledger rows for other
        released columns of some cells (e.g. the intervals of sensitive cells). ``kept`` runs in
        the same transaction: a CTA, IPF or rounding job keeps its published values there
        (:func:`sqlsdc.jobs.kept_cells.record`).
        """
        self.step(f"storing {self.name}")
        con = self.con
        with storing_output(con, self.into, out):
            store.record_output(con, self.name, self.method, self.sql, self.user,
                                self.policy_version, json.dumps(json_safe(report)),
                                self.query_id)  # fmt: skip
            for cells, columns, state in [(released, values, status)] + [
                (frame, columns, None) for frame, columns in extra
            ]:
                self._record_cells(cells, columns, state)
            if kept is not None:
                kept()
            store.record_query(con, self.query_id, self.user, self.policy_version, "accepted",
                               self.sql, reason=f"{self.method} job stored {self.name}",
                               fingerprint=self.fingerprint, rows=len(out))  # fmt: skip

    def _record_cells(self, cells: pd.DataFrame, values: Sequence[str], status) -> None:
        """Ledger rows: the cell identity of a guarded query over the job's table and WHERE."""
        keys = [c for c in cells.columns if c not in (*values, status)]
        frame = cells.astype({k: str for k in keys}).reset_index(drop=True)
        frame.attrs = {}  # the method's reports stay out of the Arrow metadata
        where = population_where(self.spec)  # as the SQL writes it, not the x·m it computes
        store.record_cells(self.con, pa.Table.from_pandas(frame, preserve_index=False),
                           tables=(self.spec.table,), keys=keys, values=values,
                           mechanism=self.method, status=status,
                           population=None if where is None else where.sql("duckdb"),
                           query_id=self.query_id, user=self.user,
                           fingerprint=self.fingerprint)  # fmt: skip


MAX_TIME_LIMIT = 24 * 3600.0  # a day, as the policy schema allows; OR-Tools counts int64 ms


def check_time_limit(seconds) -> None:
    """A solver's time limit is a positive number of seconds up to :data:`MAX_TIME_LIMIT`
    (NaN and infinity reach OR-Tools and HiGHS as errors of their own, and red team s37c's
    ``--time-limit 1e300`` overflowed GLOP's int64 milliseconds: "internal error")."""
    if not isinstance(seconds, int | float) or not 0 < seconds <= MAX_TIME_LIMIT:
        raise TabularError(
            f"time_limit must be a positive number of seconds up to {MAX_TIME_LIMIT:,.0f} "
            f"(a day), not {seconds!r}"
        )


@contextmanager
def open_job(
    db: str | Path,
    user: str,
    sql: str,
    into: str,
    *,
    method: str,
    replace: bool = False,
    progress: Progress | None = None,
    base: int | None = None,
    rules: Sequence | None = None,
) -> Iterator[Job]:
    """Open ``db`` for a ``method`` job by ``user`` (an admin) on ``sql``, storing
    ``protected.<into>`` (``base``: a rounding job's; ``rules``: the primary rules it was
    given, None for the defaults, :func:`job_rules`, which the checks apply to its differences
    from other exact releases of a sum).

    Every job is audited under a query id of its own: ``accepted`` by :meth:`Job.store`
    together with the output and its ledger rows, ``refused`` when a check below fails,
    ``failed`` when the method or the store fails (the reason starts with
    ``verification_failed:`` when the method's result failed its independent check,
    :mod:`sqlsdc.tabular.verify`); nothing is stored then.

    Raises:
        AccessDenied: ``user`` is not an admin of the policy in force.
        TabularError: ``into`` is not a plain name or exists (without ``replace``), or the SQL
            is not one aggregation of a confidential table (:func:`parse_job`).
    """
    with job_catalog(db, user, method, into, sql) as (con, query_id, _fingerprint, audit):
        try:
            job = _checked_job(con, user, sql, into, method, query_id, replace, base, rules,
                               progress)  # fmt: skip
        except Error as refusal:
            audit("refused", reason=store.audit_reason(refusal))
            raise
        except engine.EngineError as failure:  # the checks run the job's WHERE (red team s39b:
            audit("failed", reason=store.audit_reason(failure))  # such jobs left no entry)
            raise
        except BaseException as failure:  # Ctrl-C in the checks, which read the data (seconds
            audit("failed", reason=store.audit_reason(failure))  # on a large table): no entry
            raise  # was left (new user s46i, tests/jobs/test_protect_job.py)
        job.progress = progress
        try:
            yield job
        except BaseException as failure:
            reason = store.audit_reason(failure)
            if isinstance(failure, VerificationError):  # the result was wrong, not the input
                reason = f"{VerificationError.status}: {reason}"
            audit("failed", reason=reason)
            raise


def _checked_job(con, user, sql, into, method, query_id, replace, base=None, rules=None,
                 progress: Progress | None = None) -> Job:
    """The job, once the admin, the SQL and the output name are checked (``rules``: the
    job's primary rules, None for the defaults). The checks against the stored outputs and
    the live tables read the data: their step is reported (``progress``), as they took 90 s
    of a job on the demo's million persons on a busy machine, in which it said nothing at all
    (new user s47f)."""
    if not into.isidentifier():
        raise TabularError(f"--into {into!r} must be a plain name (letters, digits, _)")
    version, document, source = require_admin(con, user)
    policy = load_policy(document, name=source)
    spec = parse_job(sql, policy)
    if progress is not None:
        progress("checking it against the earlier releases")
    total = refuse_job(con, policy, spec, sql, into, method, replace=replace, base=base,
                       version=version, rules=rules_of(policy, spec, rules))  # fmt: skip
    return Job(con, user, version, policy, spec, sql, into, method, query_id, live_total=total)


def job_rules(job: Job, rules: Sequence | None) -> list:
    """``rules``, or the defaults: the frequency rule with the policy's minimum frequency for
    the job's table, plus the p%-rule (p = 10) for magnitudes."""
    return rules_of(job.policy, job.spec, rules)
