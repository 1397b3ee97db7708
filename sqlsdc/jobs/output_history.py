"""Every version of a job output ever stored, for the differencing check.

``sqlsdc.outputs`` holds the current version of each output only: a job or a file stored
``--replace`` (or a table an admin dropped) is gone from it, but its readers — analysts who
queried it, a release database written by ``sqlsdc publish`` — keep it. A new release must be
compared with what they hold (red team s38b: incomes of everyone aged 85 or over, replaced by
the same less a region, then by the same less one municipality's person, put that person's
income between the first and third versions; red team s38e: the README's seniors file replaced
by one without age, then a job of everyone aged 84 or over, gave the person aged 84 of a cell
of the first file).

The catalog keeps each version's definition as it was stored:
:func:`sqlsdc.catalog.store.record_output` appends the request and report of every output
to ``sqlsdc.output_versions``, and :func:`keep_records` copies the records of an anonymised
file that a local suppression blanked before a replacement overwrites them (the check counts
the cells its blanked values leave short on its records as shown). :func:`earlier_versions`
lists the versions stored once and no longer current, from the jobs' ``accepted`` audit
entries (every job has one, in catalogs older than this history too); each with its request
(the job's SQL, a file's source and steps), its report (a file's step log and columns) when
the catalog kept it, and its kept records.

What an earlier version is compared as: its definition as stored (SQL, steps, the step log's
blanked columns, the columns stored) under the policy in force now (roles, privacy unit,
minimum frequency) and on the data as it is now, as a current output is. A version whose
table or columns the policy no longer declares confidential is left out, as a current one.
An anonymised file stored before the catalog kept versions has no report here: its columns
and blanked values are unknown, so it counts as a file the check cannot compare
(:func:`sqlsdc.jobs.record_files.opaque_files`: an exact table of its table is refused next
to it; fail closed).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from sqlglot import exp

from sqlsdc.jobs.session import OUTPUT_SCHEMA

S = "sqlsdc"  # the catalog schema, as sqlsdc.catalog.schema's


@dataclass(frozen=True)
class Version:
    """A version of an output, stored once and replaced or dropped since.

    Attributes:
        query_id: the job's audit entry.
        name: the output's name (``protected.<into>``).
        method: the job's method (``suppress``, ``anonymize``, ...).
        sql: the job's request as audited (a tabular job's SQL, a file's JSON request).
        report: the report stored with it (a file's step log and columns), or None when it
            was stored before the catalog kept versions.
        records: a copy of an anonymised file's records kept when a local suppression had
            blanked some of its values, or None.
        released: whether it reached readers while it was current: a policy in force then
            listed it under ``releases:``, or a publication then named it with ``--include``
            (:func:`_released`).
    """

    query_id: int
    name: str
    method: str
    sql: str
    report: str | None
    records: exp.Table | None
    released: bool

    @property
    def label(self) -> str:
        """How messages name it: the output as that job stored it."""
        return f"{self.name} as job {self.query_id} stored it"


def records_table(query_id: int) -> str:
    """The name (in the catalog schema) of the kept records of a file's version."""
    return f"file_records_{int(query_id)}"


def keep_records(con, into: str) -> None:
    """Before ``protected.<into>`` is overwritten: keep a copy of its records in the catalog
    schema when it is an anonymised file whose step log blanked a value (the check reads
    them: :func:`sqlsdc.jobs.blanked_cells.blanked_difference`). Other files need only their
    definition, which ``sqlsdc.output_versions`` keeps; run inside the storing transaction."""
    name = f"{OUTPUT_SCHEMA}.{into}"
    row = con.execute(
        f"SELECT query_id, report FROM {S}.outputs WHERE lower(name) = lower(?) "
        "AND method = 'anonymize'",
        [name],
    ).fetchall()
    if not row or row[0][0] is None or not _blanked(row[0][1]):
        return
    target = exp.table_(records_table(row[0][0]), db=S, quoted=True).sql("duckdb")
    source = exp.table_(into, db=OUTPUT_SCHEMA, quoted=True).sql("duckdb")
    con.execute(f"CREATE OR REPLACE TABLE {target} AS SELECT * FROM {source}")


def _blanked(report: str | None) -> bool:
    """Whether a file's report logs a local suppression that blanked a value (unreadable:
    yes, keep it)."""
    try:
        return blanks(json.loads(report)["steps"])
    except (ValueError, TypeError, KeyError, AttributeError):
        return True


def blanks(log: list[dict]) -> bool:
    """Whether a local suppression of a file's step log blanked a value."""
    return any(count for record in log if record["step"].startswith("suppress:")
               for count in record.get("suppressed", {}).values())  # fmt: skip


def stored_output_tables(con) -> set[str]:
    """``protected.<table>`` of every table stored in the output schema, lower-cased (DuckDB's
    names are case-insensitive): the outputs whose table is still there."""
    return {
        f"{schema}.{name}".lower()
        for schema, name in con.execute(
            "SELECT schema_name, table_name FROM duckdb_tables() WHERE schema_name = ?",
            [OUTPUT_SCHEMA],
        ).fetchall()
    }


def earlier_versions(con) -> list[Version]:
    """The versions of outputs stored by an accepted job and no longer current (replaced,
    or their table dropped), oldest first."""
    existing = stored_output_tables(con)
    current = {
        query_id
        for name, query_id in con.execute(f"SELECT name, query_id FROM {S}.outputs").fetchall()
        if name.lower() in existing
    }
    kept = {
        name.lower()
        for (name,) in con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE schema_name = ?", [S]
        ).fetchall()
    }
    reports = dict(
        con.execute(
            f"SELECT query_id, report FROM {S}.output_versions WHERE query_id IS NOT NULL"
        ).fetchall()
        if "output_versions" in kept  # a catalog no job has stored into since it kept them
        else []
    )
    stored = [
        (query_id, logged_at, sql, *_stored_by(reason))
        for query_id, logged_at, sql, reason in con.execute(
            f"SELECT query_id, logged_at, sql_text, reason FROM {S}.audit WHERE decision = "
            "'accepted' AND (reason LIKE '% job stored protected.%' "
            "OR reason LIKE '% job (%) stored protected.%') ORDER BY query_id"
        ).fetchall()
    ]
    life = _lives(stored)
    listed, published = _policies(con), _publications(con)
    found = []
    for query_id, _at, sql, method, name in stored:
        if query_id in current:
            continue
        table = records_table(query_id)
        records = exp.table_(table, db=S, quoted=True) if table in kept else None
        released = _released(name, life[query_id], listed, published)
        found.append(Version(query_id, name, method, sql, reports.get(query_id), records, released))
    return found


_STORED = re.compile(r"(\S+) job(?: \([^)]*\))? stored (protected\.[^\s;]+)(?:; .*)?", re.DOTALL)


def _stored_by(reason: str) -> tuple[str, str]:
    """``(method, name)`` of an accepted job's audit reason: ``<method> job stored <name>``, or
    ``<method> job (<mechanism>) stored <name>`` (a synthesis: ``synthesize job (cart) stored
    protected.syn``, so that syntheses' versions are in this history too), either
    followed by ``; <note>`` (:func:`sqlsdc.jobs.anonymize.store_file`)."""
    found = _STORED.fullmatch(reason)
    return (found[1], found[2]) if found else reason.partition(" job stored ")[::2]


Moment = tuple  # (audit query id, its time)


def _lives(stored: list) -> dict[int, tuple[Moment, Moment | None]]:
    """Query id -> (when it was stored, when the next job stored the same name, or None)."""
    life, last = {}, {}
    for query_id, at, _sql, _method, name in stored:
        key = name.lower()
        if key in last:
            life[last[key][0]] = (life[last[key][0]][0], (query_id, at))
        life[query_id] = ((query_id, at), None)
        last[key] = (query_id, at)
    return life


def _policies(con) -> list[tuple[object, frozenset[str]]]:
    """``(applied at, names its releases: lists)`` of every policy version, oldest first."""
    found = []
    for applied_at, document in con.execute(
        f"SELECT applied_at, document FROM {S}.policy_versions ORDER BY version"
    ).fetchall():
        try:
            names = json.loads(document).get("releases") or []
            found.append((applied_at, frozenset(str(n).lower() for n in names)))
        except (ValueError, AttributeError):
            found.append((applied_at, frozenset({"*"})))  # unreadable: listed everything
    return found


def _publications(con) -> list[tuple[int, frozenset[str]]]:
    """``(audit query id, names it included)`` of every accepted publication with
    ``--include``."""
    found = []
    for query_id, request in con.execute(
        f"SELECT query_id, sql_text FROM {S}.audit WHERE decision = 'accepted' "
        """AND sql_text LIKE '{"publish": %' AND sql_text LIKE '%"include": %'"""
    ).fetchall():
        try:
            included = json.loads(request).get("include") or []
        except (ValueError, AttributeError):
            continue
        found.append((query_id, frozenset(str(n).lower() for n in included)))
    return found


def _released(name: str, life, policies: list, publications: list) -> bool:
    """Whether the version of ``name`` stored and replaced at ``life`` reached readers: a
    policy in force at some time of its life listed it (the one in force when it was stored,
    or one applied before it was replaced), or a publication of its life included it."""
    short = name.lower().removeprefix(f"{OUTPUT_SCHEMA}.")
    (start_id, start), end = life
    in_force = [names for at, names in policies if at <= start][-1:]
    applied = [names for at, names in policies if at > start and (end is None or at < end[1])]
    if any(short in names or "*" in names for names in in_force + applied):
        return True
    return any(start_id < query_id and (end is None or query_id < end[0]) and short in names
               for query_id, names in publications)  # fmt: skip
