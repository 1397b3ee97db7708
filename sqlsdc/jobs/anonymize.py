"""Microdata anonymisation as a back-end job: records of a confidential table (or of a query),
protected by a sequence of steps, stored as ``protected.<into>`` (issue 20).

The job (:func:`anonymize`, ``sqlsdc anonymize``) checks the acting admin, reads the records in
a fixed order (``ORDER BY ALL``, so keyed draws land on the same records every run), leaves out
direct identifiers and internal columns (record keys), applies the steps of
:mod:`sqlsdc.microdata.steps` with draws keyed by the database's PRF secret and ``seed``, and
stores the table, its ``sqlsdc.outputs`` record (method ``anonymize``; the steps, parameters,
seed, risk before and after, information loss) and its ``accepted`` audit entry in one
transaction. ``sqlsdc publish`` then releases it like any job output; ``sqlsdc
microdata-report`` prints the stored report (:func:`stored_report`). A refused job is audited
``refused``, a failed one ``failed``; neither leaves a table.

Risk is measured on the key variables (quasi-identifiers: by default the policy's dimension
columns of the table) with the sampling weight column if the policy declares one:
:func:`sqlsdc.microdata.risk.risk_summary`. Information loss: IL = 100·SSE/SST and IL1s over the
numeric columns the steps changed.

Example (admins; the demo database):
    >>> report = anonymize("sqlsdc-demo.duckdb", user="admin", source="persons",  # doctest: +SKIP
    ...     into="persons_sdc", steps=["recode:age:breaks=15/30/45/65",
    ...     "suppress:region,sex,age,education:k=3", "microaggregate:income:k=5"])
    >>> report.after["violations"]["3"]  # doctest: +SKIP
    0
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import sqlglot
from sqlglot import exp

from sqlsdc.catalog import store
from sqlsdc.catalog.store import require_admin
from sqlsdc.engines import duckdb as engine
from sqlsdc.engines import duckdb_schema
from sqlsdc.errors import Error, MicrodataError, NotFoundError, SqlSyntaxError
from sqlsdc.jobs.differencing import refuse_file_differences
from sqlsdc.jobs.file_pairs import refuse_file_pairs
from sqlsdc.jobs.live_cells import refuse_live_file_cells
from sqlsdc.jobs.output_store import date_columns, storing_output
from sqlsdc.jobs.record_files import (
    all_files,
    file_release,
    opaque_files,
    opaque_refusal,
    opaque_tables,
    reaching_readers,
    stored_files,
)
from sqlsdc.jobs.refusals import check_output_name, dp_table_refusal
from sqlsdc.jobs.risk_keys import refuse_coarse_keys, source_columns
from sqlsdc.jobs.session import OUTPUT_SCHEMA, job_catalog, json_safe
from sqlsdc.jobs.shown_classes import (
    read_classes_of_shown_values,
    refuse_perturbed_measures,
    shown_pairs,
)
from sqlsdc.jobs.stored_tables import exact_tables
from sqlsdc.microdata.microaggregation import il1s
from sqlsdc.microdata.risk import interval_disclosure, linkage_rate, risk_summary
from sqlsdc.microdata.steps import Step, apply_steps, parse_step, spelt_as
from sqlsdc.microdata.suda import MAX_KEYS, suda
from sqlsdc.policy import ColumnRole, load_policy

METHOD = "anonymize"
STEPS = 6  # the progress messages of a job: read, apply, risk before, after, loss, store

Progress = Callable[[str], None]


@dataclass(frozen=True)
class AnonymizeReport:
    """What an anonymisation job did and what it achieved.

    Attributes:
        name: the stored table, ``protected.<into>``.
        source: the table or query read.
        records: rows stored.
        columns: columns stored.
        dropped: direct identifiers and internal columns left out.
        steps: one record per step (its text and details: IL, suppressions, PRAM matrix, ...).
        seed: the seed of the keyed draws.
        keys: key variables the risk is measured on.
        weights: the sampling-weight column, if any.
        before: risk of the original records (:class:`sqlsdc.microdata.risk.RiskSummary`).
        after: risk of the stored records.
        information_loss: IL (100·SSE/SST, standardised) and IL1s per changed numeric column
            and over all of them.
        linkage: distance-based record linkage of the changed numeric columns back to the
            originals (share of records linked to their own original, Euclidean on z-scores
            and Mahalanobis; :func:`sqlsdc.microdata.risk.linkage_rate`) and their interval
            disclosure by rank (:func:`sqlsdc.microdata.risk.interval_disclosure`).
        household: the household identifier column, if given: ``before``/``after`` then
            carry household risk too.

    ``before``/``after`` also hold the SUDA summary of special uniques on the keys
    (:func:`sqlsdc.microdata.suda.suda`) when there are at most 16 of them.
    """

    name: str
    source: str
    records: int
    columns: list[str]
    dropped: list[str]
    steps: list[dict]
    seed: int
    keys: list[str]
    weights: str | None
    before: dict
    after: dict
    information_loss: dict
    linkage: dict
    household: str | None = None

    def to_dict(self) -> dict:
        return json_safe(asdict(self))


def anonymize(
    db: str | Path,
    *,
    user: str,
    into: str,
    steps: Sequence[str | Step],
    source: str | None = None,
    sql: str | None = None,
    keys: Sequence[str] | None = None,
    weights: str | None = None,
    household: str | None = None,
    seed: int = 0,
    replace: bool = False,
    progress: Progress | None = None,
) -> AnonymizeReport:
    """Anonymise the records of table ``source`` (or of query ``sql``) and store them as
    ``protected.<into>`` (admins only).

    Args:
        db: the DuckDB file with the sqlsdc catalog.
        user: the acting admin.
        into: the output name (a plain name).
        steps: step texts (``"microaggregate:income:k=5"``) or parsed :class:`Step` s.
        source: a confidential table of the policy; or
        sql: a SELECT over the database (run as the admin, read only).
        keys: key variables for the risk report; default: the dimension columns of ``source``
            that are in the data.
        weights: sampling-weight column; default: the policy's weight column, if stored.
        household: household identifier column, for household risk (kept out of the stored
            table if it is a direct identifier, but read for the risk).
        seed: seed of the keyed draws (with the database secret: same seed, same output).
        replace: overwrite an existing ``protected.<into>``.
        progress: called with the name of each step as it starts (:data:`STEPS` of them).

    Raises:
        AccessDenied: ``user`` is not an admin.
        MicrodataError: bad name, source, SQL, step or column.
    """
    say = progress or (lambda _message: None)
    parsed = [s if isinstance(s, Step) else parse_step(s) for s in steps]
    if not parsed:
        raise MicrodataError("give at least one step, e.g. --step microaggregate:income:k=5")
    if (source is None) == (sql is None):
        raise MicrodataError("read either a table (--from TABLE) or a query (--sql QUERY)")
    request = json.dumps({"job": METHOD, "into": into, "from": source or sql,
                          "steps": [s.text() for s in parsed], "seed": seed})  # fmt: skip
    with job_catalog(db, user, METHOD, into, request) as (con, query_id, fingerprint, audit):
        try:
            version, policy = check_records_job(con, user, into, replace)
            definition = records_definition(source, sql)
            roots: dict = {}  # each column's lineage, for the risk keys
            original, dropped = read_records(con, policy, source, definition, household, roots)
            held = [c for c in original.columns if c not in dropped]
            pairs = shown_pairs(policy, _tables_read(source, definition),
                                source_columns(roots, held))  # fmt: skip
            refuse_perturbed_measures(pairs, parsed)
            if pairs:  # the class of the shown x, not of x·m (red team s47n)
                read_classes_of_shown_values(con, policy, list(pairs))
                original, dropped = read_records(con, policy, source, definition, household)
        except Error as refusal:
            audit("refused", reason=store.audit_reason(refusal))
            raise
        except BaseException as failure:  # Ctrl-C while the records are read: audited too
            audit("failed", reason=store.audit_reason(failure))
            raise
        try:
            say(f"read {len(original)} records from {source or 'the query'}")
            keys, weights = _risk_columns(policy, source, original, keys, weights)
            parsed = spelt_as(parsed, original.columns)
            if household is not None:  # read_records kept it under the table's spelling
                household = {c.lower(): c for c in original.columns}[household.lower()]
            try:
                sources = None if sql is None else source_columns(roots, held)
                refuse_coarse_keys(policy, source, held, keys, sources)
            except Error as refusal:
                audit("refused", reason=store.audit_reason(refusal))
                raise
            store.ensure_secret(con)
            ((secret,),) = con.execute(
                f"SELECT material FROM {store.S}.secrets WHERE name = 'prf'"
            ).fetchall()
            say("applying " + ", ".join(s.text() for s in parsed))
            result, log = apply_steps(original, parsed, secret=bytes(secret), seed=seed)
            stored = result.drop(columns=[c for c in dropped if c in result.columns])
            try:
                _refuse_differences(con, policy, into, source or sql, log, stored)
            except Error as refusal:
                audit("refused", reason=store.audit_reason(refusal))
                raise
            # the risk step, in parts between which Ctrl-C stops the job (in one piece, the
            # report of 1,000,000 records took 69 s that Ctrl-C could not cut short)
            say("measuring the risk of the records")
            before = _risk(original, keys, weights, household)
            say("measuring the risk of the anonymised records")
            after = _risk(result, keys, weights, household)
            say("measuring information loss and record linkage")
            report = AnonymizeReport(
                name=f"{OUTPUT_SCHEMA}.{into}",
                source=source or sql,
                records=len(stored),
                columns=list(stored.columns),
                dropped=dropped,
                steps=log,
                seed=int(seed),
                keys=list(keys),
                weights=weights,
                before=before,
                after=after,
                information_loss=_loss(original, result),
                linkage=_linkage(original, result),
                household=household,
            )
            say(f"storing {report.name}")
            store_file(con, stored, report, user, version, request, query_id, fingerprint, into,
                       dates=date_columns(con, definition))  # fmt: skip
        except BaseException as failure:
            audit("failed", reason=store.audit_reason(failure))
            raise
        return report


def _tables_read(source: str | None, definition: str) -> list[str]:
    """The tables the job's records are read from (by name; CTEs too, which no policy table
    is named like: :func:`_without_internal` refuses that)."""
    if source is not None:
        return [source]
    return [t.name for t in sqlglot.parse_one(definition, read="duckdb").find_all(exp.Table)]


def records_definition(source: str | None, sql: str | None) -> str:
    """The SELECT the job reads, in a fixed row order."""
    if source is not None:
        if not source.isidentifier():
            raise MicrodataError(f"--from {source!r} must be a table name")
        inner = exp.select("*").from_(exp.to_identifier(source))
    else:
        try:
            inner = sqlglot.parse_one(sql, read="duckdb")
        except sqlglot.errors.ParseError:
            raise SqlSyntaxError("the --sql query does not parse", "write one SELECT") from None
        if not isinstance(inner, exp.Query):
            raise MicrodataError("--sql must be one SELECT query")
    return exp.select("*").from_(inner.subquery("src")).order_by(exp.var("ALL")).sql("duckdb")


def _refuse_differences(con, policy, into: str, source: str, log, stored: pd.DataFrame) -> None:
    """Refuse a file that, next to an exact table of its source stored before it (the
    suppression pattern, a suppression, CTA or IPF job), tells what a few units add up to:
    the file is the exact tables of its unperturbed columns
    (:func:`sqlsdc.jobs.record_files.file_release`), checked as a job's table is
    (:func:`sqlsdc.jobs.differencing.refuse_file_differences`). It runs once the steps have
    run: which columns a local suppression blanked is in their log, and the cells its blanked
    values leave short are counted on its records (``stored``, registered for the check). A
    file whose population is no WHERE on one table cannot be compared: next to an exact
    table of a table it reads, it is refused."""
    label = f"the file {OUTPUT_SCHEMA}.{into}"
    records = "__sqlsdc_new_file"
    found = file_release(con, policy, label, source, log, list(stored.columns),
                         exp.table_(records, quoted=True))  # fmt: skip
    if found is not None:
        table, release = found
        con.register(records, stored)
        try:
            tables = exact_tables(con, policy, table, rounded_counts=True)
            refuse_file_differences(con, policy, release, tables)
            refuse_live_file_cells(con, policy, table, release, MicrodataError)
            _refuse_other_files(con, policy, into, table, release)
        finally:
            con.unregister(records)
    for table in opaque_tables(policy, source):  # no WHERE on one table: nothing to compare
        if others := exact_tables(con, policy, table, rounded_counts=True):
            raise MicrodataError(opaque_refusal(label, table, others[0][0]))
        files = [f.label for t, f in all_files(con, policy) if t.lower() == table.lower()]
        if others := _released_with(con, policy, into, files + opaque_files(con, policy, table)):
            raise MicrodataError(_opaque_pair(label, table, others[0], opaque=label))


def _refuse_other_files(con, policy, into: str, table: str, release) -> None:
    """Refuse a file next to an anonymised file of its table that is released (listed under
    the policy's ``releases:``, or an earlier version of a file released while it was
    current: its readers keep it) when the two differ by a few units in a cell (red team
    s38e: after the README's seniors file, band ``>=85``, a file of everyone aged 84+ banded
    at 84 gave the one person aged 84 of a cell); a file itself listed is compared with every
    file of its table stored, the one it replaces too. Candidates withheld are stored side
    by side, to be compared; they are compared with each other once released together
    (:mod:`sqlsdc.jobs.file_pairs`)."""
    others = stored_files(con, policy, table)
    held = _released_with(con, policy, into, [other.label for other in others])
    others = [other for other in others if other.label in held]
    if opaque := _released_with(con, policy, into, opaque_files(con, policy, table)):
        raise MicrodataError(_opaque_pair(release.label, table, opaque[0], opaque=opaque[0]))
    refuse_file_pairs(con, policy, [(table, other) for other in others], new=(table, release))


def _released_with(con, policy, into: str, names: list[str]) -> list[str]:
    """Of the stored files ``names`` (labels), those a new file ``into`` would be released
    with (:func:`~sqlsdc.jobs.record_files.reaching_readers`): those the policy's
    ``releases:`` lists, or all of them when it lists ``into`` (the one it replaces too: its
    readers keep it), and the earlier versions released while current."""
    listed = None if into.lower() in policy.releases else policy.releases
    held = reaching_readers(con, listed)
    return [name for name in names if name.lower() in held]


def _opaque_pair(label: str, table: str, other: str, opaque: str) -> str:
    """A new file ``label`` refused next to ``other``, another released file of ``table``,
    when one of them (``opaque``) is no WHERE on it (red team s38f)."""
    return (
        f"{opaque} reads {table} by a query whose population is no WHERE on it, so the "
        f"differencing check cannot compare {label} with {other}, another file of {table} "
        "that would be released with it: the two could differ by a few units in a cell. "
        f"Write the file's query as SELECT columns FROM {table} WHERE condition, or release "
        "only one of them"
    )


def check_records_job(con, user: str, into: str, replace: bool):
    """``(policy version, policy)`` once the acting admin and the output name are checked (a
    records job's first step: anonymisation and synthesis)."""
    if not into.isidentifier():
        raise MicrodataError(f"--into {into!r} must be a plain name (letters, digits, _)")
    version, document, source = require_admin(con, user)
    policy = load_policy(document, name=source)
    check_output_name(con, into, replace, MicrodataError, policy)
    return version, policy


def read_records(
    con, policy, source: str | None, definition: str, keep: str | None, lineage: dict | None = None
) -> tuple[pd.DataFrame, list[str]]:
    """The records without direct identifiers (policy role ``identifier``) and internal
    columns (``__…``, e.g. the record keys), but with ``keep`` (the household identifier,
    which the job needs and leaves out of the stored table), and the columns left out. The
    query may read tables of the policy only: no catalog (secrets, ledger), no earlier
    outputs, no table functions (files). ``lineage``, when given, receives each output
    column's sqlglot lineage (the identifier check's one trace, for the job's other checks)."""
    if source is not None:
        if policy.declared(source).is_public:
            raise MicrodataError(f"{source} is not a confidential table of the policy")
    _check_tables(con, policy, definition)
    identifiers = {
        c.name.lower()
        for t in policy.confidential_tables
        for c in t.columns.values()
        if c.role is ColumnRole.IDENTIFIER
    }
    internal, reading = _without_internal(con, policy, definition)
    try:
        asked = set(con.sql(definition).columns)  # bound, not run: the columns it selects
        records = con.sql(reading)
        nested = [n for n, t in zip(records.columns, records.types, strict=True)
                  if t.id in NESTED]  # fmt: skip
        frame = None if nested else records.df()
    except Exception:  # the engine's text is not shown (it may quote data)
        raise MicrodataError(
            "the records could not be read: check the table name or the --sql query"
        ) from None
    if nested:
        raise MicrodataError(
            f"columns {nested} are nested values (a whole row, a list or a map), which could "
            "carry direct identifiers; select plain columns"
        )
    derived = _identifier_derived(con, policy, reading, list(frame.columns), lineage)
    dropped = [c for c in frame.columns
               if c.lower() in identifiers or c.startswith("__") or c in derived]  # fmt: skip
    dropped += [c for c in internal if c in asked and c not in dropped]  # left out before
    if keep is not None:  # as the policy names it, whatever the case (new user s48e)
        keep = {str(c).lower(): c for c in frame.columns}.get(keep.lower(), keep)
        if keep not in frame.columns:
            raise MicrodataError(f"household column {keep!r} is not in the data")
    return frame.drop(columns=[c for c in dropped if c != keep and c in frame]), dropped


NESTED = {"struct", "map", "union", "list", "array", "variant"}  # DuckDB type ids


def _identifier_derived(
    con, policy, sql: str, columns: list[str], out: dict | None = None
) -> set[str]:
    """The output columns of ``sql`` computed from a direct identifier under another name
    (``person_id + 0 AS pid``), traced through CTEs and subqueries with sqlglot's column
    lineage; they are left out like the identifiers themselves. A column whose lineage
    cannot be traced is refused (fail closed).

    One lineage call traces every output column (``column=None``): the query is qualified
    once, not once per column (``SELECT *`` of the demo's persons, 11 columns: 22 ms of CPU
    before, 9 ms; session 44)."""
    from sqlglot.lineage import lineage
    from sqlglot.optimizer.normalize_identifiers import normalize_identifiers

    schema = {t: cols for t, cols in duckdb_schema.table_schemas(con).items() if policy.table(t)}
    ids = {(t.name.lower(), c.name.lower()) for t in policy.confidential_tables
           for c in t.columns.values() if c.role is ColumnRole.IDENTIFIER}  # fmt: skip
    try:
        roots = lineage(None, sql, schema=schema, dialect="duckdb")
    except Exception:  # noqa: BLE001 - sqlglot cannot trace it: refuse, do not guess
        roots = {}
    if out is not None:
        out.update(roots)
    derived = set()
    for column in columns:  # the name the per-column lineage looked up, normalised alike
        root = roots.get(normalize_identifiers(exp.to_identifier(column), dialect="duckdb").name)
        if root is None:
            raise MicrodataError(
                f"the source of column {column!r} of --sql could not be traced; select plain "
                "columns of the policy's tables (or compute them in a simpler query)"
            )
        for node in root.walk():
            if isinstance(node.source, exp.Table) and isinstance(node.expression, exp.Table):
                source = (node.source.name.lower(), node.name.split(".")[-1].lower())
                if source in ids:
                    derived.add(column)
    return derived


def _without_internal(con, policy, definition: str) -> tuple[list[str], str]:
    """``definition`` with each table of the policy read through ``(SELECT * EXCLUDE (<internal
    columns>) FROM t)`` under the same alias, so that no spelling (an alias of ``__rkey``,
    ``COLUMNS('.*key')``, the row as a struct, a column list on the alias) carries the secret
    record keys or other internal columns into the records; and the columns so left out."""
    tree = sqlglot.parse_one(definition, read="duckdb")
    ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
    if ctes & set(policy.tables):
        raise MicrodataError("a CTE of --sql may not have the name of a table of the policy")
    left_out: list[str] = []
    for table in list(tree.find_all(exp.Table)):
        if table.name.lower() in ctes:
            continue
        internal = [
            name
            for (name,) in con.execute(
                "SELECT column_name FROM duckdb_columns() WHERE database_name = "
                "current_database() AND schema_name = 'main' AND lower(table_name) = ? AND "
                "starts_with(column_name, '__')",
                [table.name.lower()],
            ).fetchall()
        ]
        if not internal:
            continue
        left_out += [c for c in internal if c not in left_out]
        excluded = ", ".join(exp.to_identifier(c, quoted=True).sql("duckdb") for c in internal)
        inner = sqlglot.parse_one(
            f"SELECT * EXCLUDE ({excluded}) FROM {exp.to_identifier(table.name).sql('duckdb')}",
            read="duckdb",
        )
        alias = table.args.get("alias") or exp.TableAlias(this=exp.to_identifier(table.name))
        table.replace(exp.Subquery(this=inner, alias=alias.copy()))
    return left_out, tree.sql("duckdb")


def _check_tables(con, policy, definition: str) -> None:
    """Refuse a query that reads anything but the policy's tables (checked on the syntax tree
    and again by DuckDB's own list of the tables the statement reads), or a table the policy
    protects by differential privacy (records stored without DP would void its budget)."""
    tree = sqlglot.parse_one(definition, read="duckdb")
    ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
    allowed = ", ".join(sorted(policy.tables))
    for table in tree.find_all(exp.Table):
        name = table.name.lower()
        plain = isinstance(table.this, exp.Identifier) and table.db in ("", "main")
        if plain and not table.catalog and name not in ctes:
            policy.declared(name)  # not declared: not found, as --from's (exit code 8)
        elif not plain or table.catalog:
            raise MicrodataError(
                f"--sql may read the policy's tables only ({allowed}), not {table.sql('duckdb')}"
            )
    try:
        read = duckdb_schema.tables_read_by(con, definition)
    except Exception:  # the engine's text is not shown
        raise MicrodataError(
            "the --sql query could not be checked: DuckDB could not list the tables it reads. "
            "Write one SELECT; DuckDB 2.0 cannot list the tables of a JOIN ... USING (...), so "
            "write JOIN ... ON a.key = b.key instead"
        ) from None
    unknown = sorted(read - set(policy.tables) - ctes)
    if unknown:
        raise MicrodataError(f"--sql may read the policy's tables only ({allowed}), not {unknown}")
    private = sorted(t for t in read - ctes if policy.table(t).differentially_private)
    if private:
        raise MicrodataError(dp_table_refusal(private[0], "a job storing its records without DP"))


def _risk_columns(policy, source, frame, keys, weights):
    """The key and weight columns of the risk measures, spelt as the records spell them. The
    policy spells names in lower case and the records as the table does (``NACE_Section``):
    matched exactly, a user's own mixed-case table lost every declared key without a word,
    and the file was stored with no risk report at all (new user s48e), so names are matched
    as DuckDB matches them, whatever their case."""
    table = policy.table(source) if source else None
    spelt = {str(c).lower(): c for c in frame.columns}
    if keys is None:
        declared = (
            [c.name for c in table.columns.values() if c.role is ColumnRole.DIMENSION]
            if table
            else []
        )
        keys = [spelt[c] for c in declared if c in spelt]
    missing = [k for k in keys or [] if k.lower() not in spelt]
    if missing:  # dropped without a word, a misspelt key made the risk look lower
        raise MicrodataError(
            f"key column(s) {missing} are not in the data; the records have "
            f"{', '.join(map(str, frame.columns))}"
        )
    keys = [spelt[k.lower()] for k in keys or []]
    if weights is None and table is not None:
        weights = next(
            (
                spelt[c.name]
                for c in table.columns.values()
                if c.role is ColumnRole.WEIGHT and c.name in spelt
            ),
            None,
        )
    if weights is not None and weights.lower() not in spelt:
        raise MicrodataError(f"weight column {weights!r} is not in the data")
    return keys, None if weights is None else spelt[weights.lower()]


def _risk(frame: pd.DataFrame, keys, weights, household) -> dict:
    if not keys:
        return {}
    out = risk_summary(frame, keys, weights=weights, ks=(2, 3, 5), household=household).to_dict()
    if len(keys) <= MAX_KEYS:
        out["suda"] = suda(frame, keys).summary()
    return out


def _changed_numeric(original: pd.DataFrame, result: pd.DataFrame) -> list[str]:
    return [
        c
        for c in original.columns
        if pd.api.types.is_numeric_dtype(original[c])
        and pd.api.types.is_numeric_dtype(result[c])
        and not original[c].equals(result[c])
    ]


def _linkage(original: pd.DataFrame, result: pd.DataFrame) -> dict:
    """DBRL rates over the changed numeric columns, on rows complete in both files."""
    changed = _changed_numeric(original, result)
    if not changed:
        return {}
    both = original[changed].notna().all(axis=1) & result[changed].notna().all(axis=1)
    x, y = original.loc[both, changed].to_numpy(float), result.loc[both, changed].to_numpy(float)
    if len(x) < 2:
        return {}
    return {
        "columns": changed,
        "records": int(len(x)),
        "euclidean": linkage_rate(x, y),
        "mahalanobis": linkage_rate(x, y, metric="mahalanobis"),
        "interval_disclosure": interval_disclosure(original.loc[both, changed],
                                                   result.loc[both, changed])["overall"],
    }  # fmt: skip


def _loss(original: pd.DataFrame, result: pd.DataFrame) -> dict:
    """IL and IL1s of the numeric columns whose values changed (missing values left out)."""
    changed = _changed_numeric(original, result)
    out: dict = {}
    for c in changed:
        both = original[c].notna() & result[c].notna()
        x, y = original.loc[both, c].to_numpy(float), result.loc[both, c].to_numpy(float)
        out[c] = {"il": _il(x, y), "il1s": il1s(x, y)}
    if len(changed) > 1:
        both = original[changed].notna().all(axis=1) & result[changed].notna().all(axis=1)
        x, y = (
            original.loc[both, changed].to_numpy(float),
            result.loc[both, changed].to_numpy(float),
        )
        out["all"] = {"il": _il(x, y), "il1s": il1s(x, y)}
    return out


def _il(x: np.ndarray, y: np.ndarray) -> float:
    """100·Σ‖x − y‖²/SST on standardised columns; for microaggregated data this is
    100·SSE/SST (Castro et al. 2022), for other masks the same normalised squared error."""
    x, y = x.reshape(len(x), -1), y.reshape(len(y), -1)
    sd = x.std(axis=0, ddof=1)
    sd = np.where(sd > 0, sd, 1.0)
    total = (((x - x.mean(axis=0)) / sd) ** 2).sum()
    return 0.0 if total == 0 else float(100 * (((x - y) / sd) ** 2).sum() / total)


def store_file(con, frame, report, user, version, request, query_id, fingerprint, into, *,
               method: str = METHOD, mechanism: str = METHOD, view: str | None = None,
               note: str | None = None, dates: Sequence[str] = ()):  # fmt: skip
    """Store a file of records as ``protected.<into>`` (and a view ``<view>.<into>`` over it)
    with its ``sqlsdc.outputs`` record (``method``), ledger rows (``mechanism``) and audit
    entry, in one transaction (used by the synthesis job too); ``note`` follows the audit
    reason after ``; `` (a DP synthesis's weak noise, :mod:`sqlsdc.synth.weak_noise`);
    ``dates``: the columns that were DATE in the source (stored as DATE again).

    The records are stored sorted by their own values: in the source's order (the job's
    ``SELECT``, persons by identifier) row ``i`` of two files made from one source was one
    person, and a household's members sat next to each other (red team s30f: two PRAM files
    of one source, aligned by position, told where PRAM had changed a value). Sorted, the
    order is a function of the released values and tells nothing they do not.
    """
    frame = frame.sort_values(list(frame.columns), kind="mergesort", na_position="last",
                              ignore_index=True)  # fmt: skip
    with storing_output(con, into, frame, dates) as name:
        if view is not None:
            con.execute(f"CREATE SCHEMA IF NOT EXISTS {view}")
            con.execute(f"CREATE OR REPLACE VIEW {view}.{name} AS "
                        f"SELECT * FROM {OUTPUT_SCHEMA}.{name}")  # fmt: skip
        store.record_output(con, report.name, method, request, user, version,
                            json.dumps(report.to_dict()), query_id)  # fmt: skip
        # the ledger names what was released: the file (from its source) per column; a row per
        # record and column would add up to millions of rows for one census file
        released, cell = store.now(), f"{report.name} <- {report.source}"
        con.executemany(
            f"INSERT INTO {store.S}.ledger VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [(query_id, released, user, fingerprint, cell, column, mechanism, "published")
             for column in frame.columns],
        )  # fmt: skip
        reason = (f"{method} job stored {report.name}" if mechanism == method
                  else f"{method} job ({mechanism}) stored {report.name}")  # fmt: skip
        store.record_query(con, query_id, user, version, "accepted", request,
                           reason=reason if note is None else f"{reason}; {note}",
                           fingerprint=fingerprint, rows=len(frame))  # fmt: skip


def stored_report(db: str | Path, name: str, *, user: str) -> dict:
    """The report an anonymisation job stored for ``protected.<name>`` (admins only)."""
    con = engine.open_database(db, read_only=True)
    try:
        require_admin(con, user)
        full = name if name.startswith(f"{OUTPUT_SCHEMA}.") else f"{OUTPUT_SCHEMA}.{name}"
        row = engine.one(
            con,
            f"SELECT name, method, report FROM {store.S}.outputs WHERE lower(name) = lower(?)",
            [full],
        )  # names are case-insensitive, as DuckDB's
    finally:
        con.close()
    if row is None:
        raise NotFoundError(f"{full} does not exist; run `sqlsdc anonymize` first")
    full, row = row[0], row[1:]
    if row[0] != METHOD:
        raise MicrodataError(f"{full} is not the output of an anonymize job; list them with "
                             "`sqlsdc publish` or run `sqlsdc anonymize` first")  # fmt: skip
    return json.loads(row[1])
