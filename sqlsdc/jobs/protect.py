"""Table protection as a back-end job: a GROUP BY over confidential microdata, protected, and
stored in the database as a plain table.

Every job runs the same steps (:class:`Job`): :func:`open_job` checks the acting admin, the
output name and the SQL (:func:`parse_job`: one aggregation of one confidential table); the
inner cells are computed in SQL (:func:`cells_sql`: one row per inner cell with units, total
and the largest unit contributions as the list aggregate ``MAX(x, k)``); margins, rules and the
method run on those aggregated cells; :meth:`Job.store` writes ``protected.<into>``, its
record in ``sqlsdc.outputs`` (what, by whom, how, the report), a ledger row per released cell
and value column, and the job's ``accepted`` audit entry in one transaction, only after the
method succeeded. A refused job is audited ``refused``, a failed one ``failed``; neither
leaves a table or ledger rows. One set of cells (a table, an aggregate, the same rows) is
released protected one way: a job over cells another job's output already releases is refused
unless both are suppression jobs, which keep each other's suppressions
(:func:`_refuse_second_protection`).

Ledger rows are per cell, not per table: the rows are written by one INSERT … SELECT over the
stored cells (a 10^6-cell table takes about a second), and only per-cell rows let the ledger
answer "was this cell released, to whom, how". The cell identity is the one guarded queries
use (:func:`sqlsdc.catalog.store.ledger_insert`: the confidential table, the key values by
column name) plus the job's WHERE as the population, so cells of different populations never
share an identity. The methods are one function each: cell suppression here
(:func:`protect_query`, with :func:`sqlsdc.tabular.universe.suppression_pattern`, the
pattern builder the query path uses too); controlled rounding, controlled
tabular adjustment and raking in :mod:`sqlsdc.jobs.adjust`.

A suppression job stores suppressed values as NULL; each row carries its status and the rule
that fired, and the record holds the audit result. Before storing, the pattern is checked
independently (:func:`~sqlsdc.tabular.verify.verify_suppression`: every primary cell of the
job's rules suppressed, the attacker LP run again on the pattern).

Example (admins; the demo database):
    >>> report = protect_query("sqlsdc-demo.duckdb", "admin",  # doctest: +SKIP
    ...     "SELECT nace, region, SUM(turnover) FROM enterprises WHERE employees >= 10 "
    ...     "GROUP BY nace, region", into="turnover_by_nace_region")
    >>> report.secondary, report.audit_passed  # doctest: +SKIP
    (23, True)
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import sqlglot
from sqlglot import exp

from sqlsdc.catalog import store
from sqlsdc.catalog.store import require_admin
from sqlsdc.engines import duckdb as engine
from sqlsdc.errors import Error, PolicyError, SqlSyntaxError, TabularError, VerificationError
from sqlsdc.jobs.differencing import Release, refuse_small_differences
from sqlsdc.jobs.linked_audit import audit_linked
from sqlsdc.jobs.live_cells import refuse_live_cells, refuse_live_file_cells
from sqlsdc.jobs.output_history import earlier_versions, keep_records
from sqlsdc.jobs.record_files import opaque_files, opaque_refusal, stored_files
from sqlsdc.jobs.sum_counts import audit_counts, known_lower
from sqlsdc.policy import ColumnRole, Policy, load_policy
from sqlsdc.tabular.model import TOTAL, Hierarchy, Table
from sqlsdc.tabular.rules import (
    FrequencyRule,
    ManualRule,
    apply_rules,
    default_rules,
    required_top_k,
)
from sqlsdc.tabular.universe import COUNT, exempt_known, suppression_pattern, universe_of
from sqlsdc.tabular.verify import verify_suppression

OUTPUT_SCHEMA = "protected"
LEDGER_STATUS = "__status"  # the ledger status column of a job's released cells
TABULAR_METHODS = ("suppress", "round", "cta", "ipf")  # jobs that store a table of cells
# jobs that publish cells with their exact values (CTA: the cells it did not have to move; IPF:
# its given margins, exact when written from the data); two of them over populations that
# differ by a few units tell those units' values apart (red team s37c: IPF's grand total less a
# suppression job's of the same people but one gave that person's income)
EXACT_METHODS = ("suppress", "cta", "ipf")

Progress = Callable[[str], None]  # called with the name of each step as it starts


@dataclass(frozen=True)
class JobSpec:
    """What a protection job tabulates: ``SELECT dims, SUM(measure)|COUNT(*) FROM table``.

    A frequency table counts units (the rules protect units); ``rows`` is set when the SQL
    counts rows (``COUNT(*)``), which are the units only where each unit has one row (checked
    by :meth:`Job.tabulate`); ``COUNT(DISTINCT unit)`` counts units in any table."""

    table: str
    dims: tuple[str, ...]
    measure: str | None  # None: a frequency table
    unit: str
    where: exp.Expr | None
    rows: bool = False


@dataclass(frozen=True)
class JobReport:
    name: str
    cells: int
    primary: int
    secondary: int
    cost: float
    rules_fired: dict[str, int]
    audit_passed: bool
    audit_exact: bool
    method: str

    def to_dict(self) -> dict:
        return asdict(self)


def parse_job(sql: str, policy: Policy, *, stored: bool = False) -> JobSpec:
    """Check a job's SQL against the policy: one confidential table, dimensions as keys.

    ``stored``: the SQL of an output stored earlier, which its readers hold whatever the policy
    now says of its columns; any column of the table is then taken as a dimension or measure
    (red team s38b: once ``occupation`` was no longer a dimension, a table by occupation was
    left out of the checks of later jobs, and a job of the same people less one was stored)."""
    try:
        tree = sqlglot.parse_one(sql, read="duckdb")
    except sqlglot.errors.ParseError as e:
        raise SqlSyntaxError(f"the job's SQL does not parse: {e}") from None  # exit code 6
    shape = (
        "SELECT dim, ..., SUM(measure) | COUNT(*) | COUNT(DISTINCT unit) FROM table [WHERE ...] "
        "GROUP BY dim, ..."
    )
    if not isinstance(tree, exp.Select) or tree.args.get("joins") or tree.args.get("with_"):
        raise TabularError(f"a protection job is one aggregation of one table: {shape}")
    source = tree.args.get("from_")
    if source is None or not isinstance(source.this, exp.Table):
        raise TabularError(f"a protection job reads one table: {shape}")
    table = policy.table(source.this.name)
    if table is None or table.is_public:
        raise TabularError(f"{source.this.name} is not a confidential table of the policy")
    group = tree.args.get("group")
    keys = [e for e in (group.expressions if group else [])]
    aggregates = [e.unalias() for e in tree.expressions if e.unalias().find(exp.AggFunc)]
    dims = tuple(k.name.lower() for k in keys if isinstance(k, exp.Column))
    if (
        len(dims) != len(keys)
        or not dims
        or any(
            table.column(d) is None
            or (table.column(d).role is not ColumnRole.DIMENSION and not stored)
            for d in dims
        )
    ):
        raise TabularError(f"group by dimension columns of {table.name} only: {shape}")
    if len(aggregates) != 1:
        raise TabularError(f"a protection job has exactly one aggregate: {shape}")
    aggregate = aggregates[0]
    counted = aggregate.this.expressions if isinstance(aggregate.this, exp.Distinct) else []
    rows = isinstance(aggregate, exp.Count) and isinstance(aggregate.this, exp.Star)
    if rows:
        measure = None
    elif (
        isinstance(aggregate, exp.Count)
        and len(counted) == 1
        and isinstance(counted[0], exp.Column)
        and counted[0].name.lower() == table.privacy_unit.lower()
    ):
        measure = None
    elif isinstance(aggregate, exp.Sum) and isinstance(aggregate.this, exp.Column):
        measure = aggregate.this.name.lower()
        declared = table.column(measure)
        if declared is None or (declared.role is not ColumnRole.MEASURE and not stored):
            raise TabularError(f"{measure} is not a measure of {table.name}")
    else:
        raise TabularError(
            f"the aggregate must be SUM(measure) or COUNT(*) (or COUNT(DISTINCT "
            f"{table.privacy_unit})): {shape}"
        )
    where = tree.args.get("where")
    return JobSpec(table.name, dims, measure, table.privacy_unit, where and where.this, rows)


def cells_sql(spec: JobSpec, top_k: int) -> str:
    """Inner cells: units, total and the ``top_k`` largest unit contributions, per unit summed
    first (a unit's rows are one contribution), ``spread``: the most inner cells any unit of
    the cell lies in (1 when every unit is in one cell, which the margins' counts and largest
    contributions assume), and ``rows``: the most rows a unit of the cell has."""
    unit = exp.column(spec.unit)
    contribution = exp.Sum(this=exp.column(spec.measure)) if spec.measure else exp.Literal.number(1)
    per_unit = exp.select(unit, *(exp.column(d) for d in spec.dims)).from_(spec.table)
    cells_of_unit = exp.Window(this=exp.Count(this=exp.Star()), partition_by=[unit.copy()])
    per_unit = per_unit.select(
        exp.alias_(contribution, "x"),
        exp.alias_(cells_of_unit, "k"),
        exp.alias_(exp.Count(this=exp.Star()), "r"),
    )
    if spec.where is not None:
        per_unit = per_unit.where(spec.where.copy())
    per_unit = per_unit.group_by(unit.copy(), *(exp.column(d) for d in spec.dims))
    # each key named as the spec names it (lower case): DuckDB names a result column as the
    # table spells it, and a table's NACE left the cells without a 'nace' (new user s38)
    keys = (exp.alias_(exp.column(d), d, quoted=True) for d in spec.dims)
    cells = exp.select(*keys).from_(per_unit.subquery("u"))
    cells = cells.select(
        exp.alias_(exp.Count(this=exp.Star()), "n"),
        exp.alias_(exp.Max(this=exp.column("k")), "spread"),
        exp.alias_(exp.Max(this=exp.column("r")), "rows"),
        exp.alias_(exp.Sum(this=exp.column("x")), "value"),
    )
    if top_k:
        top = exp.Max(this=exp.column("x"), count=exp.Literal.number(top_k))
        cells = cells.select(exp.alias_(top, "top"))
    return cells.group_by(*(exp.column(d) for d in spec.dims)).sql("duckdb")


def protect_query(
    db: str | Path,
    user: str,
    sql: str,
    *,
    into: str,
    method: str = "gauss",
    rules: Sequence | None = None,
    cost: str = "value",
    time_limit: float = 60.0,
    replace: bool = False,
    progress: Progress | None = None,
) -> JobReport:
    """Protect the table ``sql`` tabulates and store it as ``protected.<into>`` (admins only).

    Hierarchies declared in the policy whose levels are all grouped (``[region,
    municipality]``) become one hierarchical dimension with sub-totals; every other key is a
    flat dimension with a total. Rules default to the frequency rule with the policy's minimum
    frequency, plus the p%-rule (p = 10) for magnitudes (:func:`job_rules`).
    """
    check_time_limit(time_limit)
    with open_job(db, user, sql, into, method="suppress", replace=replace,
                  progress=progress) as job:  # fmt: skip
        rules = job_rules(job, rules)
        table = job.tabulate(rules)
        job.step("primary and secondary suppression, audit")
        known = known_lower(table) if job.spec.measure is None else None
        kept, held, shown = _earlier_suppressions(job, table)
        if shown is not None and shown.any():  # published before with these values: public
            rules = exempt_known(rules, shown)

        def pattern(counted: Sequence = ()) -> pd.DataFrame:
            """The pattern, with ``counted`` rules (a sum's cells its counts hide) too."""
            return suppression_pattern(
                table,
                [*rules, *counted],
                method=method,
                cost=cost,
                time_limit=time_limit,
                apriori=known,
                primary=ManualRule(kept, safety_range=0.0, name="earlier release")
                if kept is not None and kept.any()
                else None,
                held=held if held is not None and held.any() else None,
                forced=shown if shown is not None and shown.any() else None,
            )

        try:
            result = pattern()
            if job.spec.measure is not None:  # its unit counts n are published too
                result = audit_counts(table, rules, result, pattern, method=method,
                                      time_limit=time_limit, forced=shown)  # fmt: skip
        except TabularError as refusal:
            if shown is None or not shown.any():
                raise
            raise TabularError(
                "the cells earlier suppression outputs of the same rows publish (the forced "
                f"cells below) are public, and with this table's cells they reveal: {refusal}. "
                "Protect the finer table first (or in one job), or tabulate another population"
            ) from None
        found = apply_rules(table, rules)  # the job's own primary cells, checked independently
        verify_suppression(table, result["status"].to_numpy() != "published",
                           primary=found.primary, upl=found.upl, lpl=found.lpl,
                           time_limit=time_limit,
                           lower=None if known is None else known[0]).require()  # fmt: skip
        _audit_with_earlier(job, table, result, found, known, time_limit)
        out, report = _suppression_output(table, result, into, method)
        status = np.where(out["status"] == "published", "published", "suppressed")
        released = out[[*table.dims, "n", "value"]].assign(**{LEDGER_STATUS: status})
        counts = ("n", "value") if job.spec.measure is None else ("n",)  # of units: integers
        out = out.astype(dict.fromkeys(counts, "Int64"))  # (were DOUBLE: 829.0 enterprises)
        job.store(out, report.to_dict(), released, values=("n", "value"), status=LEDGER_STATUS)
        return report


# ----------------------------------------------------------------------------- shared job steps


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
        return _table(frame, self.spec, self.policy, top_k)

    def store(
        self,
        out: pd.DataFrame,
        report: dict,
        released: pd.DataFrame,
        *,
        values: Sequence[str] = ("value",),
        status: str | None = None,
        extra: Sequence[tuple[pd.DataFrame, Sequence[str]]] = (),
    ) -> None:
        """Write ``protected.<into>``, its ``sqlsdc.outputs`` record, the ledger rows of the
        released cells and the job's audit entry: all or nothing.

        ``released`` holds every cell of the table (cells published as 0 included, although
        ``out`` may leave them out): its dimensions, the ``values`` columns and optionally a
        ``status`` column (``published``/``suppressed``). ``extra`` adds ledger rows for other
        released columns of some cells (e.g. the intervals of sensitive cells).
        """
        self.step(f"storing {self.name}")
        name = exp.to_identifier(self.into).sql("duckdb")
        con = self.con
        con.register("__job_output", out)
        con.execute("BEGIN TRANSACTION")
        try:
            store.ensure_catalog(con)  # catalogs made before jobs were recorded
            con.execute(f"CREATE SCHEMA IF NOT EXISTS {OUTPUT_SCHEMA}")
            keep_records(con, self.into)  # a replaced file's, when the check needs them
            con.execute(
                f"CREATE OR REPLACE TABLE {OUTPUT_SCHEMA}.{name} AS SELECT * FROM __job_output"
            )
            store.record_output(con, self.name, self.method, self.sql, self.user,
                                self.policy_version, json.dumps(_plain(report)),
                                self.query_id)  # fmt: skip
            for cells, columns, state in [(released, values, status)] + [
                (frame, columns, None) for frame, columns in extra
            ]:
                self._record_cells(cells, columns, state)
            store.record_query(con, self.query_id, self.user, self.policy_version, "accepted",
                               self.sql, reason=f"{self.method} job stored {self.name}",
                               fingerprint=self.fingerprint, rows=len(out))  # fmt: skip
            con.execute("COMMIT")
        except BaseException:
            engine.rollback(con)
            raise
        finally:
            con.unregister("__job_output")

    def _record_cells(self, cells: pd.DataFrame, values: Sequence[str], status) -> None:
        """Ledger rows: the cell identity of a guarded query over the job's table and WHERE."""
        keys = [c for c in cells.columns if c not in (*values, status)]
        frame = cells.astype({k: str for k in keys}).reset_index(drop=True)
        frame.attrs = {}  # the method's reports stay out of the Arrow metadata
        where = self.spec.where
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


def job_fingerprint(method: str, into: str, sql: str) -> str:
    """A short digest of what a job does (as guarded queries are fingerprinted)."""
    text = json.dumps({"job": method, "into": into, "sql": sql}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


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
) -> Iterator[Job]:
    """Open ``db`` for a ``method`` job by ``user`` (an admin) on ``sql``, storing
    ``protected.<into>`` (``base``: a rounding job's).

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
            job = _checked_job(con, user, sql, into, method, query_id, replace, base)
        except Error as refusal:
            audit("refused", reason=store.audit_reason(refusal))
            raise
        except engine.EngineError as failure:  # the checks run the job's WHERE (red team s39b:
            audit("failed", reason=store.audit_reason(failure))  # such jobs left no entry)
            raise
        job.progress = progress
        try:
            yield job
        except BaseException as failure:
            reason = store.audit_reason(failure)
            if isinstance(failure, VerificationError):  # the result was wrong, not the input
                reason = f"{VerificationError.status}: {reason}"
            audit("failed", reason=reason)
            raise


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


@contextmanager
def job_catalog(db: str | Path, user: str, method: str, into: str, request: str) -> Iterator:
    """``(connection, query id, fingerprint, audit)`` for one back-end job on ``db``: the
    connection (read-write, closed afterwards), the job's own audit entry id, and
    ``audit(decision, reason=...)`` writing that entry for ``request`` by ``user``. The jobs
    of this process on ``db`` take turns (:func:`_job_turn`)."""
    with _job_turn(db):
        yield from _job_connection(db, user, method, into, request)


def _job_connection(db, user: str, method: str, into: str, request: str) -> Iterator:
    """The body of :func:`job_catalog`, run while the job holds its turn."""
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

        yield con, query_id, fingerprint, audit
    except engine.EngineError as failure:  # audited by the job; a full disk is no bug
        told = engine.write_failure(failure)
        if told is failure and isinstance(failure, engine.StatementFailure):
            told = TabularError(  # red team s39b: was "internal error", with the engine's text
                "the job's SQL fails in the engine (a column it cannot find, or a cast or an "
                "expression that fails on some row); correct the --sql. The engine's text, "
                "which may quote data, is in the job's audit entry (sqlsdc audit)"
            )
        if told is failure:
            raise
        raise told from None
    finally:
        con.close()


def _checked_job(con, user, sql, into, method, query_id, replace, base=None) -> Job:
    """The job, once the admin, the SQL and the output name are checked."""
    if not into.isidentifier():
        raise TabularError(f"--into {into!r} must be a plain name (letters, digits, _)")
    version, document, source = require_admin(con, user)
    policy = load_policy(document, name=source)
    spec = parse_job(sql, policy)
    _refuse_dp_table(policy, spec, method)
    _refuse_other_tables(policy, sql, spec)
    _refuse_second_protection(con, policy, spec, into, method)
    if method in EXACT_METHODS:
        refuse_small_differences(con, policy, spec, _exact_releases(con, policy, spec))
    if method == "suppress" and spec.measure is not None:  # its units' counts are published too
        counted = dataclasses.replace(spec, measure=None)
        refuse_small_differences(con, policy, counted, _exact_releases(con, policy, counted))
    refuse_live_cells(con, policy, spec, "the job")  # after: a few units off is told as such
    if replace and base is not None:
        _refuse_another_base(con, into, base)
    check_output_name(con, into, replace, TabularError, policy)
    return Job(con, user, version, policy, spec, sql, into, method, query_id)


def check_output_name(con, into: str, replace: bool, error: type[Error], policy: Policy) -> None:
    """Refuse to write ``protected.<into>`` over an existing table without ``replace``, and
    over one whose name differs in case even with it: DuckDB's names are case-insensitive, so
    ``T`` is the table ``t``, and replacing it under another spelling left ``sqlsdc.outputs``
    naming both. Refuse names sqlsdc reserves (``__``) and names of the policy's tables, which
    the release database and analysts' queries would confuse with the confidential table."""
    if into.startswith("__"):
        raise error(f"--into {into!r}: names starting with '__' are reserved for sqlsdc")
    if policy.table(into) is not None:
        raise error(f"--into {into!r} is the name of a table of the policy; choose another name")
    found = con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE schema_name = ? "
        "AND lower(table_name) = lower(?)",
        [OUTPUT_SCHEMA, into],
    ).fetchall()
    if not found:
        return
    (existing,) = found[0]
    if existing != into:
        raise error(
            f"{OUTPUT_SCHEMA}.{existing} exists; names are case-insensitive, so --into {into} "
            f"names it too: write --into {existing} (with --replace to overwrite it) or choose "
            "another name"
        )
    if not replace:
        raise error(f"{OUTPUT_SCHEMA}.{into} exists; pass --replace to overwrite it")


def _refuse_dp_table(policy: Policy, spec: JobSpec, method: str) -> None:
    """Refuse a job over a table the policy protects by differential privacy: its output would
    release the table's cells exactly (or perturbed once, deterministically) outside the
    privacy budget, and the budget's guarantee to every person in it would no longer hold."""
    if policy.table(spec.table).differentially_private:
        raise TabularError(dp_table_refusal(spec.table, f"a {method} job"))


def _refuse_other_tables(policy: Policy, sql: str, spec: JobSpec) -> None:
    """Refuse a job whose SQL reads another table than its own beside public ones (a subquery
    of its WHERE): ``persons WHERE person_id IN (SELECT person_id FROM benefits WHERE amount >
    1500)`` stored exact facts of ``benefits``, which the policy protects by DP, in a table of
    ``persons`` (red team s36d); a confidential table read so is protected by nothing."""
    for table in sqlglot.parse_one(sql, read="duckdb").find_all(exp.Table):
        declared = policy.table(table.name)
        plain = isinstance(table.this, exp.Identifier) and table.db.lower() in ("", "main")
        if (
            plain
            and not table.catalog
            and declared is not None
            and (declared.name == spec.table or declared.is_public)
        ):
            continue
        reason = ("which the policy protects by differential privacy"
                  if plain and declared is not None and declared.differentially_private
                  else "which is not a public table of the policy")  # fmt: skip
        raise TabularError(
            f"a protection job reads {spec.table} and public tables only; its SQL also reads "
            f"{table.sql('duckdb')}, {reason}: what it tells of that table would be stored "
            "unprotected. Filter with conditions on the columns of " + spec.table
        )


def dp_table_refusal(table: str, job: str) -> str:
    """The message of a non-DP job refused over a DP table (shared by every job)."""
    return (
        f"{table} is protected by differential privacy in the policy: {job} would store its "
        "data outside the privacy budget, which voids the budget's guarantee. Release it with "
        "a DP query (`sqlsdc publish --query`) or a DP synthesis (`sqlsdc synthesize --method "
        "dp-ipf`), or change the table's method in the policy"
    )


def _refuse_second_protection(con, policy: Policy, spec: JobSpec, into: str, method: str) -> None:
    """Refuse a job whose cells a stored output of another job already releases, protected
    another way: by another method, or by a rounding, CTA or IPF job under another name.

    Two protections of one cell combine (red team s33b): a rounding to base 3 and one to base
    5 of a count leave only the values both allow; a cell a suppression job hides has a
    rounded or adjusted value in the other table; a suppression job's exact values tell how
    far CTA moved each cell. Suppression jobs of the same rows stay allowed: each keeps what
    the others hid (:func:`_earlier_suppressions`); so does replacing an output by a job of its
    own method (``--replace``). Jobs over other rows that share a cell (a WHERE that picks
    cells of the other's table, ``region = 'R01'``) are refused whatever their methods: their
    cells are matched by their rows, not their keys (red team s33c)."""
    own = f"{OUTPUT_SCHEMA}.{into}"
    for name, theirs, _dims, same_rows in _outputs_of_the_same_cells(con, policy, spec, own):
        if theirs == method and (name == own or (method == "suppress" and same_rows)):
            continue
        raise TabularError(
            f"{name} already releases these cells ({spec.table}, the same aggregate over the "
            f"same units or rows), protected by method {theirs}; this job (method {method}) "
            "would release them protected a second way, and a reader of both tables could "
            "combine the two (two roundings of a cell, or a rounded or adjusted value of a "
            "cell the other hides) to narrow the values they protect. Tabulate another "
            f"population, or protect these cells with {theirs} (`--into "
            f"{name.split('.', 1)[1]} --replace` replaces that table)"
        )


def _refuse_another_base(con, into: str, base: int) -> None:
    """Refuse to replace a rounding by one to another base: the earlier table stays with its
    readers (``sqlsdc publish`` records what it released), and two bases of one cell leave
    only the values both allow, as two tables would (red team s33c)."""
    found = con.execute(
        "SELECT report FROM sqlsdc.outputs WHERE name = ? AND method = 'round'",
        [f"{OUTPUT_SCHEMA}.{into}"],
    ).fetchall()
    if not found:
        return
    before = json.loads(found[0][0]).get("details", {}).get("base")
    if before is not None and before != base:
        raise TabularError(
            f"{OUTPUT_SCHEMA}.{into} holds these cells rounded to base {before}; replacing it "
            f"by a rounding to base {base} would give readers of both a cell's two roundings, "
            f"which leave only the values both allow. Round to base {before} again, or write "
            "another --into for another population"
        )


def job_rules(job: Job, rules: Sequence | None) -> list:
    """``rules``, or the defaults: the frequency rule with the policy's minimum frequency for
    the job's table, plus the p%-rule (p = 10) for magnitudes."""
    if rules is not None:
        return list(rules)
    table_rule = job.policy.table(job.spec.table).protection
    counts = next(iter(table_rule.values())).min_frequency
    found = [FrequencyRule(min_freq=counts)]
    if job.spec.measure is not None:
        found = default_rules(False)[1:] + found
    return found


def _plain(value):
    """JSON-safe copy: NaN and infinities become null (strict JSON has neither)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def table_dims(spec: JobSpec, policy: Policy) -> list[str]:
    """The dimension columns of a job's table: the levels of a declared hierarchy that the job
    groups by from its top (``geography: [region, municipality]``) fold into one dimension
    named after it, the other keys stay as they are."""
    dims, folded = [], set()
    for name, levels in policy.table(spec.table).hierarchies.items():
        present = [level for level in levels if level in spec.dims]
        if len(present) >= 2 and present == list(levels)[: len(present)]:
            folded |= set(present)
            dims.append(name)
    return dims + [d for d in spec.dims if d not in folded]


def _table(frame: pd.DataFrame, spec: JobSpec, policy: Policy, top_k: int) -> Table:
    """A :class:`Table` from inner cells (dimensions: :func:`table_dims`): a hierarchy's
    dimension holds municipality codes in inner cells and region codes in sub-totals."""
    dims, hierarchies = table_dims(spec, policy), {}
    cells = frame[["n", "value"]].copy()
    for name, levels in policy.table(spec.table).hierarchies.items():
        if name in dims:
            present = [level for level in levels if level in spec.dims]
            hierarchies[name] = Hierarchy.from_levels(
                frame.astype({p: str for p in present}), present
            )
            cells[name] = frame[present[-1]].astype(str)
    for d in dims:
        if d not in hierarchies:
            cells[d] = frame[d].astype(str)
    tops = []
    if top_k:
        for j in range(top_k):
            name = f"top{j + 1}"
            cells[name] = [  # no list where every contribution is NULL (pandas NA)
                t[j] if isinstance(t, list | tuple | np.ndarray) and len(t) > j else 0.0
                for t in frame["top"]
            ]
            tops.append(name)
    return Table.from_cells(cells, dims, top=tops, hierarchies=hierarchies or None)


def _earlier_suppressions(
    job: Job, table: Table
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | tuple[None, None, None]:
    """The cells earlier suppression jobs suppressed, as primary and as secondary, and those
    they published with the value the cell has now, in ``table``'s cell order:
    ``protected.<into>`` itself (replaced) and every other suppression output of the same
    table, aggregate and rows (:func:`_same_cells`), on the cells the two tables share
    (:func:`_shared_status`: a table by nace x region x size_class holds the nace x region
    table as its size_class total). The job keeps the first suppressed and the last
    published, as the query path keeps its earlier pattern
    (:func:`sqlsdc.tabular.universe._carried_over`), so it publishes none of the cells they
    hid and hides none they published.

    Red team s30f: re-run after two enterprises were added to a hidden cell of 2, the job
    published it as 4, and with the row and column totals up by 2 the old release's 2 was
    read off; the new secondaries then pinned another primary of the old release exactly.
    Red team s32b: a second job of the same SQL under another name (``--method hitas`` next to
    ``gauss``) hid other secondaries; ``sqlsdc publish`` released both tables, and together
    they pinned eight primaries of the demo's nace x region counts exactly; a job by nace x
    region x size_class published a (nace, region) cell the nace x region job hid, and a
    count of 1 was pinned.

    Red team s36c: cells an earlier job published, the job hid as secondaries and audited as
    hidden; after the nace x region job, the nace x region x size_class job hid nine (nace,
    region) totals the first had published, and the two tables together pinned eleven of its
    primaries, (M, R01, micro) at exactly 1. The job now publishes them (``forced``, the query
    path's ``known`` cells), and a primary they already reveal is no primary of the job.
    """
    primary = secondary = shown = None
    counted = [(name, theirs, "n") for name, theirs in _counted_cells(job)]
    for name, theirs, column in [(n, t, "value") for n, t in _same_cells(job)] + counted:
        before = job.con.sql(f"SELECT * FROM {name}").df()
        if (
            "status" not in before.columns
            or column not in before.columns
            or not set(theirs) <= set(before.columns)
        ):
            continue
        mine = table.cells[list(table.dims)]
        status = _shared_status(mine, before, theirs)
        value = pd.to_numeric(_shared_status(mine, before, theirs, column), errors="coerce")
        # a sum job's counts tell a count job's cells; a count table's counts no sum's
        ours = table.values if job.spec.measure is None or column == "value" else np.nan
        same = np.isclose(value.to_numpy(np.float64), ours, rtol=1e-12, atol=0.0)
        found = (
            (status == "primary").to_numpy(),
            (status == "secondary").to_numpy(),
            (status == "published").to_numpy() & same,
        )
        if primary is None:
            primary, secondary, shown = found
        else:
            primary, secondary, shown = (a | b for a, b in zip((primary, secondary, shown), found,
                                                               strict=True))  # fmt: skip
    if primary is None:
        return None, None, None
    return primary, secondary & ~primary, shown & ~primary & ~secondary


def _counted_cells(job: Job) -> list[tuple[str, list[str]]]:
    """The stored suppression outputs of the job's table and rows that count its units with
    the other aggregate, with their dimension columns: a count job's beside a sum job's, whose
    ``n`` column publishes the same unit counts exactly. Red team s38b: after a count job of
    enterprises with 10 or more employees by nace x region (``freq:10``; R08's total of 9 a
    primary, R01's a secondary), a sum job of their turnover published R01's ``n``, 22, and
    the count table's published totals then gave R08's 9 exactly. A job keeps hidden what
    such an output hid, and a count job publishes the counts a sum job published."""
    own = job.spec
    found = []
    for name, method, theirs in _stored_outputs(job.con, job.policy):
        if (
            method == "suppress"
            and theirs.table == own.table
            and (theirs.measure is None) != (own.measure is None)
            and name != f"{OUTPUT_SCHEMA}.{job.into}"
            and _same_rows(job.con, own.table, theirs.where, own.where)
        ):
            found.append((name, table_dims(theirs, job.policy)))
    return found


def _audit_with_earlier(job: Job, table: Table, result, found, known, time_limit) -> None:
    """The job's pattern audited together with the suppression outputs of the same rows it
    shares cells with (:func:`~sqlsdc.jobs.linked_audit.audit_linked`; red team s36c). An
    output of the job's own dimensions is left out: each of its cells is one of the job's,
    kept suppressed or published by :func:`_earlier_suppressions`, so the job's own audit
    reads it already."""
    earlier = []
    for name, theirs in _same_cells(job):
        if list(theirs) == list(table.dims):
            continue
        before = job.con.sql(f"SELECT * FROM {name}").df()
        if "status" in before.columns and "value" in before.columns:
            earlier.append((name, before))
    if not earlier:
        return
    columns = job.policy.table(job.spec.table).columns
    levels = {c: (c,) for c in columns}
    levels.update({h: tuple(lv) for h, lv in job.policy.table(job.spec.table).hierarchies.items()})
    values = table.values
    lower = np.zeros_like(values) if bool((values >= 0).all()) else np.full_like(values, -np.inf)
    if known is not None:
        lower = known[0]
    audit_linked(job.con, job.spec, levels,
                 table.cells[list(table.dims)].astype(str).reset_index(drop=True), earlier,
                 values=values, suppressed=result["status"].to_numpy() != "published",
                 primary=found.primary, upl=found.upl, lpl=found.lpl, lower=lower,
                 time_limit=time_limit)  # fmt: skip


def _shared_status(
    mine: pd.DataFrame, before: pd.DataFrame, theirs: list[str], column: str = "status"
) -> pd.Series:
    """Per cell of ``mine`` (its dimension columns), the status (or another ``column``) of the
    same cell in ``before`` (a stored output with dimensions ``theirs``), or NaN where it has
    none: a cell is shared when the dimensions of one table only are at their total in both."""
    dims = list(mine.columns)
    common = [d for d in dims if d in theirs]
    left = mine.astype(str).reset_index(drop=True)
    right = before[theirs].astype(str).assign(__before=before[column].to_numpy())
    only_mine = [d for d in dims if d not in common]
    only_theirs = [d for d in theirs if d not in common]
    at_total = (left[only_mine] == TOTAL).all(axis=1) if only_mine else None
    if only_theirs:
        right = right[(right[only_theirs] == TOTAL).all(axis=1)]
    right = right[[*common, "__before"]].assign(__shared=1)
    left = left[common].assign(__shared=1)
    status = left.merge(right, on=[*common, "__shared"], how="left",
                        validate="many_to_one")["__before"]  # fmt: skip
    return status.where(at_total, None) if at_total is not None else status


def _same_cells(job: Job) -> list[tuple[str, list[str]]]:
    """The stored suppression outputs (``protected.<name>``) that share cells with the job, with
    their dimension columns (:func:`_outputs_of_the_same_cells`)."""
    own = f"{OUTPUT_SCHEMA}.{job.into}"
    return [
        (name, dims)
        for name, method, dims, same_rows in _outputs_of_the_same_cells(
            job.con, job.policy, job.spec, own
        )
        if method == "suppress" and (same_rows or name == own)
    ]


def _outputs_of_the_same_cells(
    con, policy: Policy, spec: JobSpec, own: str
) -> list[tuple[str, str, list[str], bool]]:
    """``(name, method, dimension columns, same rows)`` of the stored job outputs that share
    cells with a job of ``spec`` storing ``own``: ``own`` itself (when replaced), and every
    other one that tabulates the same table and aggregate over the same rows
    (:func:`_same_rows`: however its WHERE is written), whatever its dimensions (tables of
    other dimensions share their totals), or over other rows of which some cell is one of the
    job's (:func:`_share_a_cell`)."""
    found = []
    for name, method, theirs in _stored_outputs(con, policy):
        if _shape(theirs) != _shape(spec):
            if name == own:
                found.append((name, method, table_dims(theirs, policy), False))
            continue
        same_rows = _same_rows(con, spec.table, theirs.where, spec.where)
        if name == own or same_rows or _share_a_cell(con, theirs, spec):
            found.append((name, method, table_dims(theirs, policy), same_rows))
    return found


def _exact_releases(con, policy: Policy, spec: JobSpec) -> list[Release]:
    """Every release of the job's table and aggregate that readers hold with exact values
    (:func:`~sqlsdc.jobs.differencing.refuse_small_differences`): the exact tables
    (:func:`exact_tables`) of its aggregate, and the anonymised files of the table that hold
    its measure unperturbed, as the exact tables they imply
    (:func:`~sqlsdc.jobs.record_files.stored_files`; red team s37c: a file of everyone aged
    85 or over, income only top-coded far above any income, less a suppression job's total of
    the same people but one, gave that person's income and so named their record)."""
    if opaque := opaque_files(con, policy, spec.table):
        raise TabularError(opaque_refusal(f"the file {opaque[0]}", spec.table, "the job"))
    found = [
        Release(label, theirs.where, theirs.dims)
        for label, theirs in exact_tables(con, policy, spec.table)
        if theirs.measure == spec.measure
    ]
    files = stored_files(con, policy, spec.table)
    return found + [f for f in files if spec.measure is None or f.holds(spec.measure)]


def refuse_pattern_differences(con, policy: Policy) -> None:
    """Refuse a policy whose suppression pattern of a table (the guard's, which analysts read
    live and ``sqlsdc publish`` releases) differs from an exact table or an anonymised file of
    that table already stored by a few units in a cell both hold: the other order of the
    check a job or a file gets against the pattern in force (red team s38e: a file of every
    person aged 1 or over, then suppression by geography x sex switched on, gave 90 cells of
    1-4 persons aged 0, and their incomes, as the pattern's cell less the file's)."""
    if not con.execute("SELECT count(*) FROM duckdb_tables() WHERE schema_name = 'sqlsdc' AND "
                       "table_name = 'outputs'").fetchone()[0]:  # fmt: skip
        return  # no catalog yet: nothing stored
    for declared in policy.confidential_tables:
        if declared.suppression is None:
            continue
        label = _pattern_label(declared.name)
        if opaque := opaque_files(con, policy, declared.name):
            raise _policy_refusal(opaque_refusal(f"the file {opaque[0]}", declared.name, label))
        found = exact_tables(con, policy, declared.name)
        files = stored_files(con, policy, declared.name)
        for pattern in (spec for name, spec in found if name == label):
            others = [Release(name, theirs.where, theirs.dims) for name, theirs in found
                      if name != label and theirs.measure == pattern.measure]  # fmt: skip
            others += [f for f in files if pattern.measure is None or f.holds(pattern.measure)]
            refuse_small_differences(con, policy, pattern, others, label, error=_policy_refusal)
        for name, spec in found:  # cells of the pattern held by an output stored before it
            if name != label:
                refuse_live_cells(con, policy, spec, name, error=_policy_refusal)
        for release in files:
            refuse_live_file_cells(con, policy, declared.name, release, _policy_refusal)


def _policy_refusal(message: str) -> PolicyError:
    """A policy refused by what it would release next to the outputs stored: a PolicyError
    (``policy apply`` and ``init`` exit 4), as the check of the files its ``releases:`` lists."""
    return PolicyError([message])


def _pattern_label(table: str) -> str:
    return f"the suppression pattern of {table}"


def exact_tables(con, policy: Policy, table: str) -> list[tuple[str, JobSpec]]:
    """``(label, JobSpec)`` of the tables of ``table`` that readers hold with exact values: the
    guard's suppression pattern (the whole table, one per aggregate it suppresses), every
    stored output of a job of :data:`EXACT_METHODS`, and every earlier version of one
    replaced or dropped since (:func:`_earlier_versions`: their readers keep them). A
    suppression job of a sum also releases the counts of its cells' units, in its ``n``
    column, a table of counts of its own (red team s38b: a count job of everyone aged 85 or
    over by sex, and a suppression job of their incomes less the tertiary-educated of one
    municipality, gave that group's count by sex, 1 and 1, from the release database
    alone)."""
    found = []
    declared = policy.table(table)
    if declared.suppression is not None:
        universe = universe_of(policy, declared.name)
        label = _pattern_label(declared.name)
        for aggregate in universe.aggregates:
            measure = None if aggregate == COUNT else aggregate
            pattern = JobSpec(declared.name, universe.columns, measure, universe.unit, None)
            found.append((label, pattern))
    for name, method, theirs in _stored_outputs(con, policy) + _earlier_versions(con, policy):
        if method not in EXACT_METHODS or theirs.table.lower() != declared.name.lower():
            continue
        found.append((name, theirs))
        if method == "suppress" and theirs.measure is not None:
            found.append((f"{name} (its counts n)", dataclasses.replace(theirs, measure=None)))
    return found


def _earlier_versions(con, policy: Policy) -> list[tuple[str, str, JobSpec]]:
    """``(label, method, parsed SQL)`` of the tabular job outputs stored once and replaced or
    dropped since (:func:`~sqlsdc.jobs.output_history.earlier_versions`, from the jobs'
    audit entries): a release file or a reader holds them still. Red team s38b: ``--replace``
    compared a job with the version it replaced only, so incomes by sex of everyone aged 85
    or over, replaced by the same less a region, then by the same less one municipality's
    person (each step hundreds of people from the one before), put that person's income
    between the first and third versions."""
    found = []
    for version in earlier_versions(con):
        if version.method not in TABULAR_METHODS:
            continue
        try:
            spec = parse_job(version.sql, policy, stored=True)
        except (TabularError, SqlSyntaxError):  # a table or column the policy no longer declares
            continue
        found.append((version.label, version.method, spec))
    return found


def _stored_outputs(con, policy: Policy) -> list[tuple[str, str, JobSpec]]:
    """``(name, method, parsed SQL)`` of the stored tabular job outputs whose SQL the policy
    still reads."""
    existing = {
        f"{schema}.{name}"
        for schema, name in con.execute(
            "SELECT schema_name, table_name FROM duckdb_tables() WHERE schema_name = ?",
            [OUTPUT_SCHEMA],
        ).fetchall()
    }
    rows = con.execute(
        "SELECT name, method, sql_text FROM sqlsdc.outputs WHERE method IN (?, ?, ?, ?) "
        "ORDER BY name",
        list(TABULAR_METHODS),
    ).fetchall()
    found = []
    for name, method, sql in rows:
        if name not in existing:
            continue
        try:
            found.append((name, method, parse_job(sql, policy, stored=True)))
        except (TabularError, SqlSyntaxError):  # a table or column the policy no longer declares
            continue
    return found


def _shape(spec: JobSpec) -> tuple:
    """What a job tabulates besides its rows and dimensions: table and aggregate."""
    return spec.table, spec.measure


def _same_rows(con, table: str, first: exp.Expr | None, second: exp.Expr | None) -> bool:
    """Whether two WHERE conditions keep the same rows of ``table`` (in its data now): two
    spellings of one population (``age >= 85``, ``85 <= age``, none and a tautology) are one
    set of cells."""
    if first is None and second is None:
        return True
    differ = exp.select(exp.Count(this=exp.Star())).from_(table)
    differ = differ.where(
        exp.NEQ(this=exp.paren(_kept(first)), expression=exp.paren(_kept(second)))
    )
    return con.execute(differ.sql("duckdb")).fetchall()[0][0] == 0


def _kept(where: exp.Expr | None) -> exp.Expr:
    return exp.true() if where is None else exp.Coalesce(this=where.copy(),
                                                         expressions=[exp.false()])  # fmt: skip


def _share_a_cell(con, first: JobSpec, second: JobSpec) -> bool:
    """Whether a cell of one job's table, inner or margin, holds what a cell of the other's
    holds, in the table's data now: the same units (a count) or the same rows with a non-zero
    measure (a sum), so the same value. Populations that differ in rows may share cells: a
    WHERE on a dimension (``region = 'R01'``, ``region = 'R01' OR age > 100``) keeps whole
    cells of the other table, and rows outside a cell (``income IS NOT NULL`` where a cell has
    none) leave it as it was. Cells are compared by fingerprints (number and sum of hashes of
    their units or rows) over every grouping of the dimensions (red team s33c: a rounding to
    base 5 of ``... AND region = 'R01'`` was stored next to one to base 3 of the whole table)."""
    a = _fingerprints(first).subquery("a")
    b = _fingerprints(second).subquery("b")
    same = exp.and_(
        exp.column("n", "a").eq(exp.column("n", "b")),
        exp.column("h", "a").eq(exp.column("h", "b")),
    )
    shared = exp.select(exp.Count(this=exp.Star())).from_(a).join(b, on=same)
    return con.execute(shared.sql("duckdb")).fetchall()[0][0] > 0


def _fingerprints(spec: JobSpec) -> exp.Select:
    """``(n, h)`` per cell of a job's table (every grouping of its dimensions): the number of
    its units (a count) or of its rows with a non-zero measure (a sum), and the sum of their
    hashes (of the whole row: rows alike in every column are kept or dropped together by any
    WHERE, and the record key tells rows apart)."""
    if spec.measure is None:
        member, kept = exp.column(spec.unit), _kept(spec.where)
    else:
        member = exp.column(spec.table)  # the row as a struct (a view has no rowid)
        nonzero = exp.column(spec.measure).neq(exp.Literal.number(0))
        nonzero = exp.Coalesce(this=nonzero, expressions=[exp.false()])
        kept = exp.and_(exp.paren(_kept(spec.where)), nonzero)
    hashed = exp.Anonymous(this="hash", expressions=[member])
    distinct = exp.Distinct(expressions=[hashed])
    cube = exp.Cube(expressions=[exp.column(d) for d in spec.dims])
    return (
        exp.select(
            exp.Count(this=distinct).as_("n"),
            exp.Sum(this=distinct.copy()).as_("h"),
        )
        .from_(spec.table)
        .where(kept)
        .group_by(cube)
    )


def _suppression_output(table: Table, result: pd.DataFrame, into: str, method: str):
    """The stored rows of a suppression job and its report: the pattern (suppressed values and
    counts NULL), the attacker's interval of each suppressed cell, no protection levels."""
    published = result["status"] == "published"
    out = result[[*[c for c in result.columns if c not in _INTERNAL]]].copy()
    # the attacker's interval of each suppressed cell, derived from the published cells only
    out["lower_bound"] = result["lo"].where(~published)
    out["upper_bound"] = result["hi"].where(~published)
    audit = result.attrs["audit"]
    fired: dict[str, int] = {}
    for rule in result["rule"].dropna():
        for part in str(rule).split(";"):
            if part.strip():
                fired[part.strip()] = fired.get(part.strip(), 0) + 1
    report = JobReport(
        name=f"{OUTPUT_SCHEMA}.{into}",
        cells=len(result),
        primary=audit.n_primary,
        secondary=audit.n_secondary,
        cost=float(np.abs(table.values[(result["status"] == "secondary").to_numpy()]).sum()),
        rules_fired=fired,
        audit_passed=audit.passed,
        audit_exact=audit.exact,
        method=method,
    )
    return out, report


_INTERNAL = ("upl", "lpl", "lo", "hi", "level", "is_inner")  # protection levels reveal values
